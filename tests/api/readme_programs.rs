//! The programs a new user writes from the README alone: each test is one of them,
//! written against the crate root's names as the README shows them, with the asserts a user
//! would check by eye. Each of these once failed to compile or did the wrong thing:
//!
//! - a one-second timeout given to a wait failed at once with `DeadlinePassed`;
//! - a reservation could not move into `tokio::spawn`;
//! - a `Keyed` map could not mix limiter types, and a failing per-key configuration could
//!   only panic;
//! - `Retry-After` needed rounding by hand; `Debug` showed internal words.

use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile::{
    Clock, Deadline, FixedWindow, Keyed, Limit, Limiter, ManualClock, Nanos, OwnedReservation,
    PerKeyLimiter, TokenBucket, WaitError,
};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

#[test]
fn the_quickstart() -> Result {
    let limiter = Arc::new(TokenBucket::new(Limit::per_second(100.0)?, 20));
    assert!(limiter.allow());
    assert!(limiter.check_n(5).is_ok());
    let r = limiter.reserve_n(5);
    assert!(r.ok());
    std::thread::sleep(r.delay());
    limiter.wait_n_blocking(1, Duration::from_secs(1))?;
    // An owned reservation holds an `Arc` of its bucket, so it can move into a thread or task.
    let owned = OwnedReservation::reserve_n(&limiter, 2);
    let acted = std::thread::spawn(move || {
        std::thread::sleep(owned.delay());
        owned.ok()
    });
    assert!(acted.join().unwrap());
    assert!(format!("{limiter:?}").starts_with("TokenBucket { limit: 100/s, burst: 20, tokens: "));
    Ok(())
}

#[test]
fn a_wait_with_a_timeout_an_instant_or_none() -> Result {
    let tb = TokenBucket::new(Limit::per_second(1.0)?, 2);
    // The issue's own call: a one-second timeout, not "one second after the clock's origin".
    tb.wait_n_blocking(1, Some(Duration::from_secs(1).into()))?;
    tb.wait_n_blocking(1, Instant::now() + Duration::from_secs(1))?;
    // The next token is a second away: too far for 10 ms, and nothing is taken.
    assert_eq!(
        tb.wait_n_blocking(1, Duration::from_millis(10)),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    // An instant already past.
    let past = Instant::now() - Duration::from_millis(1);
    assert_eq!(
        tb.wait_n_blocking(1, past),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_owned_reservation_moves_into_a_task() -> Result {
    let tb = Arc::new(
        TokenBucket::builder(Limit::per_second(1.0)?, 5)
            .clock(ManualClock::default())
            .build(),
    );
    let r = OwnedReservation::reserve_n(&tb, 3);
    assert!(r.ok());
    assert_eq!(tb.tokens(), 2.0);
    tokio::spawn(async move { r.cancel() }).await?;
    assert_eq!(tb.tokens(), 5.0, "the task's cancel gave the 3 tokens back");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_async_wait_until_a_tokio_instant() -> Result {
    let tb = TokenBucket::new(Limit::per_second(10.0)?, 1);
    assert!(tb.allow());
    // The next token is 100 ms away; tokio's paused clock jumps there.
    tb.wait_n(1, tokio::time::Instant::now() + Duration::from_secs(1))
        .await?;
    assert_eq!(
        tb.wait_n(1, tokio::time::Instant::now() + Duration::from_millis(1))
            .await,
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    Ok(())
}

#[test]
fn a_window_status() -> Result {
    let daily = FixedWindow::builder(1000, Duration::from_secs(86_400))
        .align(8 * 3600)
        .build()?;
    let _ = daily.take();
    let s = daily.status();
    assert_eq!((s.quota, s.remaining), (1000, 999));
    assert!(s.resets_after(daily.clock().now()) <= Duration::from_secs(86_400));
    Ok(())
}

#[derive(Debug)]
struct UnknownTier(String);

#[test]
fn a_keyed_map_of_mixed_limiters_with_a_fallible_factory() -> Result {
    let per_tier = Keyed::try_new(
        |tier: &String| -> std::result::Result<Box<dyn PerKeyLimiter>, UnknownTier> {
            match tier.as_str() {
                "free" => Ok(Box::new(
                    FixedWindow::new(1, Duration::from_secs(3600)).unwrap(),
                )),
                "paid" => Ok(Box::new(TokenBucket::new(
                    Limit::per_second(50.0).unwrap(),
                    100,
                ))),
                other => Err(UnknownTier(other.to_owned())),
            }
        },
    );
    assert!(per_tier.try_check("free").unwrap().is_ok());
    let denied = per_tier.try_check("free").unwrap().unwrap_err();
    assert!(denied.retry_after_secs().unwrap() <= 3600);
    for _ in 0..100 {
        assert!(per_tier.try_check("paid").unwrap().is_ok());
    }
    match per_tier.try_check("gold") {
        Err(UnknownTier(t)) => assert_eq!(t, "gold"),
        other => panic!("expected the factory's error, got {other:?}"),
    }
    assert_eq!(
        per_tier.len(),
        2,
        "a key whose factory failed takes no room"
    );
    Ok(())
}

#[test]
fn a_retry_after_header_and_readable_debug() -> Result {
    let clock = ManualClock::default();
    let tb = TokenBucket::builder(Limit::per_second(0.4)?, 2)
        .clock(clock.clone())
        .build();
    assert!(tb.check().is_ok());
    assert_eq!(
        format!("{tb:?}"),
        "TokenBucket { limit: 0.4/s, burst: 2, tokens: 1.0 }"
    );
    assert!(tb.check().is_ok());
    let denied = tb.check().unwrap_err();
    // 2.5 s to the next token: `Retry-After` must not say 2.
    assert_eq!(denied.retry_after(), Some(Duration::from_millis(2500)));
    assert_eq!(denied.retry_after_secs(), Some(3));
    clock.advance(Duration::from_secs(1));
    assert_eq!(format!("{}", Limit::per_second(1e300)?), "1e300/s");
    assert_eq!(tb.clock().now(), Nanos::new(1_000_000_000));
    // A reading of the limiter's own clock is a deadline too (the token is 1.5 s away).
    assert_eq!(
        tb.wait_n_blocking(1, Deadline::at(Nanos::new(2_000_000_000))),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    Ok(())
}
