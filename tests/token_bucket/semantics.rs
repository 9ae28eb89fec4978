//! The rules of x/time/rate (seed-semantics §1) on the lock-free `TokenBucket`, one test per
//! rule, plus the deviations D1–D5 and the cancel formula. Times are explicit (`_at` forms).

use std::time::Duration;

use turnstile::{Deadline, Limit, Limiter, ManualClock, Nanos, TokenBucket, WaitError};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn tb(limit: f64, burst: u32) -> TokenBucket<ManualClock> {
    TokenBucket::builder(Limit::per_second(limit).unwrap(), burst)
        .clock(ManualClock::default())
        .build()
}

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn starts_full_and_refills_at_the_limit() {
    let l = tb(10.0, 5);
    assert_eq!(l.tokens_at(at(0)), 5.0);
    assert!(l.allow_n_at(at(0), 5));
    assert!(!l.allow_at(at(0)));
    assert!(!l.allow_at(at(99 * MS)));
    assert!(l.allow_at(at(100 * MS)));
    assert!(close(l.tokens_at(at(300 * MS)), 2.0));
    assert_eq!(l.tokens_at(at(10 * SEC)), 5.0, "capped at the burst");
}

#[test]
fn burst_zero_denies_every_positive_n_and_allows_zero() {
    let l = tb(10.0, 0);
    assert!(!l.allow_at(at(SEC)));
    assert!(!l.reserve_n_at(at(SEC), 1).ok());
    assert_eq!(
        l.wait_n_blocking(1, None),
        Err(WaitError::ExceedsBurst { n: 1, burst: 0 })
    );
    assert!(l.allow_n_at(at(SEC), 0));
    let r = l.reserve_n_at(at(SEC), 0);
    assert!(r.ok());
    assert_eq!(r.time_to_act(), Some(at(SEC)));
}

#[test]
fn infinite_limit_allows_everything_and_touches_nothing() {
    let l = TokenBucket::builder(Limit::INF, 0)
        .clock(ManualClock::default())
        .build();
    for _ in 0..100 {
        assert!(l.allow_n_at(at(SEC), 1_000_000));
    }
    let r = l.reserve_n_at(at(SEC), 7);
    assert!(r.ok());
    assert_eq!(r.delay_from(at(SEC)), Duration::ZERO);
    r.cancel_at(at(SEC));
    assert!(
        l.wait_n_blocking(1_000, None).is_ok(),
        "Inf skips the burst check"
    );
    assert_eq!(l.tokens_at(at(SEC)), 0.0);
}

#[test]
fn set_limit_from_infinite_fills_the_bucket_when_time_has_passed() {
    // seed §1.4: NewLimiter(Inf,5), three AllowN(t0,5), SetLimitAt(t0,10) -> tokens 5.
    let l = TokenBucket::builder(Limit::INF, 5)
        .clock(ManualClock::default())
        .build();
    let t0 = at(SEC);
    for _ in 0..3 {
        assert!(l.allow_n_at(t0, 5));
    }
    l.set_limit_at(t0, Limit::per_second(10.0).unwrap());
    assert_eq!(l.tokens_at(t0), 5.0);
    assert!(l.allow_n_at(t0, 5));
    assert!(!l.allow_n_at(t0, 1));
}

#[test]
fn infinite_limit_keeps_raw_tokens_at_its_own_instant() {
    // With last = t0: TokensAt(t0) = stored, TokensAt(t0 + 1ns) = burst.
    let l = tb(10.0, 5);
    let t0 = at(SEC);
    assert!(l.allow_n_at(t0, 3));
    l.set_limit_at(t0, Limit::INF);
    assert!(close(l.tokens_at(t0), 2.0));
    assert_eq!(l.tokens_at(at(SEC + 1)), 5.0);
    l.set_limit_at(t0, Limit::per_second(10.0).unwrap());
    assert!(close(l.tokens_at(t0), 2.0));
}

#[test]
fn zero_limit_spends_the_burst_then_never_refills() {
    let l = tb(0.0, 2);
    assert!(l.allow_at(at(0)));
    assert!(l.allow_at(at(SEC)));
    assert!(!l.allow_at(at(1_000 * SEC)));
    // D4: rate.go returns ok with InfDuration; turnstile says not OK, and wait fails at once.
    let r = l.reserve_n_at(at(1_000 * SEC), 1);
    assert!(!r.ok());
    assert_eq!(r.delay_from(at(0)), Duration::MAX);
    assert!(matches!(
        l.wait_n_blocking(1, None),
        Err(WaitError::Never { n: 1, .. })
    ));
}

#[test]
fn tiny_limit_reservation_past_the_end_of_time_is_not_ok() {
    // 1e-10/s: the next token is 1e10 s away, past i64::MAX ns (D4, generalised).
    let l = tb(1e-10, 1);
    assert!(l.allow_at(at(0)));
    assert!(!l.reserve_n_at(at(0), 1).ok());
    assert_eq!(l.peek_n_at(at(0), 1).available_at, None);
    // But a 1e-3/s limit reserves normally, 1000 s ahead.
    let l = tb(1e-3, 1);
    assert!(l.allow_at(at(0)));
    let r = l.reserve_n_at(at(0), 1);
    assert_eq!(r.time_to_act(), Some(at(1_000 * SEC)));
}

#[test]
fn zero_tokens_in_deficit() {
    // seed §1.4: (10,2) at tokens -1, AllowN(t0,0) = false; ReserveN(t0,0) ok at t1.
    let l = tb(10.0, 2);
    let t0 = at(SEC);
    assert!(l.allow_n_at(t0, 2));
    let debt = l.reserve_n_at(t0, 1);
    assert!(close(l.tokens_at(t0), -1.0));
    assert!(!l.allow_n_at(t0, 0));
    let r = l.reserve_n_at(t0, 0);
    assert!(r.ok());
    assert_eq!(r.time_to_act(), Some(at(SEC + 100 * MS)));
    assert_eq!(debt.time_to_act(), Some(at(SEC + 100 * MS)));
}

#[test]
fn more_than_burst_is_never_ok_and_changes_nothing() {
    let l = tb(10.0, 3);
    assert!(!l.reserve_n_at(at(0), 4).ok());
    assert!(!l.allow_n_at(at(0), 4));
    assert_eq!(l.tokens_at(at(0)), 3.0);
}

#[test]
fn failed_reservation_changes_nothing() {
    let l = tb(1.0, 1);
    assert!(l.allow_at(at(0)));
    let r = l.try_reserve_n_at(at(0), 1, Duration::from_millis(999));
    assert!(!r.ok());
    assert_eq!(l.tokens_at(at(0)), 0.0);
    assert!(l.allow_at(at(SEC)));
}

#[test]
fn reserve_pays_now_and_acts_later() {
    let l = tb(2.0, 1);
    let a = l.reserve_at(at(0));
    let b = l.reserve_at(at(0));
    let c = l.reserve_n_at(at(0), 1);
    assert_eq!(a.delay_from(at(0)), Duration::ZERO);
    assert_eq!(b.delay_from(at(0)), Duration::from_millis(500));
    assert_eq!(c.delay_from(at(0)), Duration::from_millis(1000));
    assert_eq!(c.delay_from(at(400 * MS)), Duration::from_millis(600));
    assert!(close(l.tokens_at(at(0)), -2.0));
}

#[test]
fn set_limit_between_reservations_keeps_accrued_tokens() {
    let l = tb(10.0, 10);
    assert!(l.allow_n_at(at(0), 10));
    // 500 ms at 10/s = 5 tokens, then 100/s.
    l.set_limit_at(at(500 * MS), Limit::per_second(100.0).unwrap());
    assert!(close(l.tokens_at(at(500 * MS)), 5.0));
    assert!(close(l.tokens_at(at(520 * MS)), 7.0));
    let r = l.reserve_n_at(at(520 * MS), 10);
    assert_eq!(r.time_to_act(), Some(at(550 * MS)));
    assert_eq!(l.limit(), Limit::per_second(100.0).unwrap());
}

#[test]
fn set_burst_smaller_clamps_on_read() {
    // seed §1.4: NewLimiter(10,5), SetBurstAt(t0,2) -> TokensAt(t0) = 2.
    let l = tb(10.0, 5);
    l.set_burst_at(at(SEC), 2);
    assert_eq!(l.tokens_at(at(SEC)), 2.0);
    assert_eq!(l.burst(), 2);
    assert!(l.allow_n_at(at(SEC), 2));
    assert!(!l.allow_at(at(SEC)));
    l.set_burst_at(at(SEC), 5);
    assert_eq!(l.tokens_at(at(SEC)), 0.0);
    assert_eq!(l.tokens_at(at(SEC + 500 * MS)), 5.0);
}

#[test]
fn cancel_restores_a_lone_reservation() {
    // seed §1.6 sequence: limit 10, burst 1; reserve act t0, r = reserve act t1; cancel -> 0.
    let l = tb(10.0, 1);
    let t0 = at(SEC);
    let first = l.reserve_at(t0);
    assert_eq!(first.time_to_act(), Some(t0));
    let r = l.reserve_at(t0);
    assert_eq!(r.time_to_act(), Some(at(SEC + 100 * MS)));
    r.cancel_at(t0);
    assert!(close(l.tokens_at(t0), 0.0));
    // D1: `r` is gone; a second cancel does not compile. The next token is due at t1 again.
    assert!(!l.allow_at(t0));
    assert!(l.allow_at(at(SEC + 100 * MS)));
}

#[test]
fn cancel_restores_only_what_later_reservations_did_not_take() {
    let l = tb(1.0, 10);
    let r1 = l.reserve_n_at(at(0), 10); // tokens 0
    let r2 = l.reserve_n_at(at(0), 5); // tokens -5, act 5 s
    let r3 = l.reserve_n_at(at(0), 1); // tokens -6, act 6 s
    assert_eq!(r3.time_to_act(), Some(at(6 * SEC)));
    // r3 holds 1 token of r2's stretch: restore 5 - 1 = 4 (rate.go agrees).
    r2.cancel_at(at(0));
    assert!(close(l.tokens_at(at(0)), -2.0));
    // r1 (act 0) is cancellable at 0. Later reservations still hold 2 tokens: 8 come back.
    // rate.go would restore 10 - (lastEvent 6 s - 0) = 4 here, leaving r2's freed tokens
    // unreturned (golang/go#56924): the documented cancel deviation.
    r1.cancel_at(at(0));
    assert!(close(l.tokens_at(at(0)), 6.0));
    r3.cancel_at(at(0));
    assert!(close(l.tokens_at(at(0)), 7.0));
}

#[test]
fn cancel_too_late_does_nothing_and_exactly_on_time_still_works() {
    let l = tb(10.0, 1);
    assert!(l.allow_at(at(0)));
    let r = l.reserve_at(at(0)); // act 100 ms
    r.cancel_at(at(100 * MS + 1));
    assert!(close(l.tokens_at(at(100 * MS)), 0.0));

    let l = tb(10.0, 1);
    assert!(l.allow_at(at(0)));
    let r = l.reserve_at(at(0));
    r.cancel_at(at(100 * MS)); // exactly at time_to_act: still allowed
    assert!(close(l.tokens_at(at(100 * MS)), 1.0));
}

#[test]
fn cancel_of_an_infinite_era_reservation_restores_nothing() {
    let l = TokenBucket::builder(Limit::INF, 3)
        .clock(ManualClock::default())
        .build();
    let r = l.reserve_n_at(at(SEC), 3);
    l.set_limit_at(at(SEC), Limit::per_second(1.0).unwrap());
    assert!(l.allow_n_at(at(SEC), 3));
    r.cancel_at(at(SEC));
    assert_eq!(
        l.tokens_at(at(SEC)),
        0.0,
        "it took nothing, it gives nothing"
    );
}

/// A cancel after `set_limit` counts what later reservations took in tokens,
/// not as a stretch of `tat` (which the new limit rescaled). rate.go's numbers.
#[test]
fn cancel_after_set_limit_restores_what_rate_go_restores() {
    let t = at(10 * SEC);
    // Limit down: 100/s -> 1/s.
    let l = tb(100.0, 3);
    let a = l.reserve_n_at(t, 2); // acts at t
    let b = l.reserve_n_at(t, 2); // acts at t + 10 ms; tokens -1
    assert_eq!(b.time_to_act(), Some(at(10 * SEC + 10 * MS)));
    l.set_limit_at(t, Limit::per_second(1.0).unwrap());
    a.cancel_at(t); // b took 1 token of a's stretch: 1 comes back
    assert!(close(l.tokens_at(t), 0.0), "{}", l.tokens_at(t));
    assert!(l.allow_n_at(at(11 * SEC), 1));

    // Limit up: 1/s -> 100/s, burst 2.
    let l = tb(1.0, 2);
    let a = l.reserve_n_at(t, 2);
    let _b = l.reserve_n_at(t, 2); // tokens -2: b took all of a's stretch
    l.set_limit_at(t, Limit::per_second(100.0).unwrap());
    a.cancel_at(t);
    assert!(close(l.tokens_at(t), -2.0), "{}", l.tokens_at(t));

    // Twice reconfigured, and the latest reservation: everything comes back.
    let l = tb(10.0, 1);
    assert!(l.allow_at(t));
    let r = l.reserve_n_at(t, 1); // act t + 100 ms, tokens -1
    l.set_limit_at(t, Limit::per_second(2.0).unwrap());
    l.set_burst_at(t, 4);
    l.set_limit_at(t, Limit::per_second(1000.0).unwrap());
    r.cancel_at(t);
    assert!(close(l.tokens_at(t), 0.0), "{}", l.tokens_at(t));
}

/// Cancelling the latest reservation gives back all of it at any limit; the
/// reservation keeps its exact tick time, not a time floored to whole nanoseconds.
#[test]
fn cancel_of_the_latest_reservation_is_exact_at_high_limits() {
    for limit in [3e6, 3e8, 1.5e9, 4e9] {
        let l = tb(limit, 1);
        assert!(l.allow_n_at(at(0), 1));
        let r = l.reserve_n_at(at(0), 1);
        r.cancel_at(at(0));
        assert!(
            close(l.tokens_at(at(0)), 0.0),
            "{limit}: {}",
            l.tokens_at(at(0))
        );
        // A non-latest one: its follower took its one token of r's stretch, none comes back.
        let l = tb(limit, 2);
        assert!(l.allow_n_at(at(0), 2));
        let r = l.reserve_n_at(at(0), 1);
        let later = l.reserve_n_at(at(0), 1);
        r.cancel_at(at(0));
        assert!(
            close(l.tokens_at(at(0)), -2.0),
            "{limit}: {}",
            l.tokens_at(at(0))
        );
        later.cancel_at(at(0)); // now the latest: all of it
        assert!(
            close(l.tokens_at(at(0)), -1.0),
            "{limit}: {}",
            l.tokens_at(at(0))
        );
    }
}

/// An infinite limit in between fills the bucket, which already gave back what an older
/// reservation took: cancelling it afterwards restores nothing (rate.go would add it on top).
#[test]
fn cancel_after_an_infinite_refill_restores_nothing() {
    let l = tb(1.0, 1);
    assert!(l.allow_at(at(0)));
    let r = l.reserve_at(at(0)); // act 1 s
    l.set_limit_at(at(0), Limit::INF);
    l.set_limit_at(at(1), Limit::per_second(1.0).unwrap()); // full again
    assert!(l.allow_at(at(1)));
    r.cancel_at(at(1));
    assert!(close(l.tokens_at(at(1)), 0.0), "{}", l.tokens_at(at(1)));
    // Without time passing under the infinite limit nothing was refilled: r's token comes
    // back as rate.go gives it.
    let l = tb(1.0, 1);
    assert!(l.allow_at(at(0)));
    let r = l.reserve_at(at(0));
    l.set_limit_at(at(0), Limit::INF);
    l.set_limit_at(at(0), Limit::per_second(1.0).unwrap());
    r.cancel_at(at(0));
    assert!(close(l.tokens_at(at(0)), 0.0), "{}", l.tokens_at(at(0)));
}

/// A switch to a zero limit keeps the count: later reservations' tokens stay taken.
#[test]
fn cancel_after_a_switch_to_zero_restores_what_later_reservations_left() {
    let l = tb(10.0, 2);
    let a = l.reserve_n_at(at(0), 2); // act 0
    let _b = l.reserve_n_at(at(0), 1); // act 100 ms, tokens -1
    l.set_limit_at(at(0), Limit::ZERO);
    a.cancel_at(at(0)); // rate.go: 2 - 10 * 0.1 = 1
    assert!(close(l.tokens_at(at(0)), 0.0), "{}", l.tokens_at(at(0)));
}

#[test]
fn wait_errors_come_in_rate_go_order() {
    let clock = ManualClock::new(at(10 * SEC));
    let l = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 2)
        .clock(clock.clone())
        .build();
    // Exceeds burst is checked before the deadline.
    assert_eq!(
        l.wait_n_blocking(3, Deadline::at(at(0))),
        Err(WaitError::ExceedsBurst { n: 3, burst: 2 })
    );
    assert_eq!(
        l.wait_n_blocking(1, Deadline::at(at(10 * SEC))),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    assert!(l.wait_n_blocking(2, Deadline::at(at(11 * SEC))).is_ok());
    assert_eq!(
        l.wait_n_blocking(1, Deadline::at(at(10 * SEC + 999 * MS))),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    assert_eq!(
        l.tokens_at(at(10 * SEC)),
        0.0,
        "a failed wait reserves nothing"
    );
    let zero = TokenBucket::builder(Limit::ZERO, 1).clock(clock).build();
    assert!(zero.wait_n_blocking(1, None).is_ok());
    assert!(matches!(
        zero.wait_n_blocking(1, Deadline::at(at(20 * SEC))),
        Err(WaitError::Never { .. })
    ));
}

#[test]
fn blocking_wait_sleeps_for_the_delay() {
    let l = TokenBucket::new(Limit::per_second(200.0).unwrap(), 1);
    // Timed from before the first wait: the second token comes 5 ms after the first is taken,
    // however long this thread is descheduled in between.
    let start = std::time::Instant::now();
    l.wait_n_blocking(1, None).unwrap();
    l.wait_n_blocking(1, None).unwrap();
    // Lower bound only: the machine may be slow, never fast.
    assert!(
        start.elapsed() >= Duration::from_millis(4),
        "{:?}",
        start.elapsed()
    );
}

#[cfg(feature = "tokio")]
#[tokio::test(start_paused = true)]
async fn dropping_an_async_wait_cancels_its_reservation() {
    let clock = ManualClock::new(at(SEC));
    let l = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
        .clock(clock.clone())
        .build();
    assert!(l.allow_at(at(SEC)));
    {
        let fut = l.wait_n(1, None);
        tokio::pin!(fut);
        // Poll once so the reservation is made, then drop the future.
        assert!(futures_poll_once(fut.as_mut()).await.is_none());
        assert!(close(l.tokens_at(at(SEC)), -1.0));
    }
    assert!(
        close(l.tokens_at(at(SEC)), 0.0),
        "the drop gave the token back"
    );
    // A completed wait keeps its tokens.
    let done = l.wait_n(1, None).await;
    assert!(done.is_ok());
    assert!(close(l.tokens_at(at(SEC)), -1.0));
}

#[cfg(feature = "tokio")]
async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[test]
fn peek_reports_without_taking() {
    let l = tb(4.0, 4);
    assert!(l.allow_n_at(at(0), 3));
    let p = l.peek_n_at(at(0), 3);
    assert!(close(p.tokens, 1.0));
    assert_eq!(p.available_at, Some(at(500 * MS)));
    assert_eq!(l.peek_n_at(at(0), 1).available_at, Some(at(0)));
    assert!(close(l.tokens_at(at(0)), 1.0), "peek took nothing");
    assert_eq!(l.peek_n_at(at(0), 5).available_at, None);
}

#[test]
fn denial_says_when_to_retry() {
    let l = tb(5.0, 1);
    assert!(l.check_n_at(at(0), 1).is_ok());
    let d = l.check_n_at(at(0), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(200 * MS)));
    assert_eq!(d.retry_after(), Some(Duration::from_millis(200)));
    assert!(
        l.check_n_at(at(200 * MS), 1).is_ok(),
        "retrying then succeeds"
    );
    assert_eq!(l.check_n_at(at(0), 2).unwrap_err().retry_at(), None);
}

#[test]
fn earlier_times_never_create_tokens() {
    // D2 / golang/go#56287: alternating calls before and after `last` mint tokens in rate.go.
    let l = tb(1.0, 1);
    let mut granted = 0;
    for _ in 0..10 {
        granted += u32::from(l.allow_n_at(at(10 * SEC), 1));
        granted += u32::from(l.allow_n_at(at(9 * SEC), 0));
        granted += u32::from(l.allow_n_at(at(9 * SEC), 1));
    }
    // Budget over [9 s, 10 s]: burst 1 + 1 token/s * 1 s; zero-token calls count as grants
    // here (10 of them), so at most 2 real tokens were handed out.
    assert!(granted <= 2 + 10, "{granted}");
    assert!(!l.allow_at(at(10 * SEC)));
}

#[test]
fn every_matches_rate_go_floats() {
    let e = Limit::every(Duration::from_nanos(1)).as_f64();
    assert!(((e - 1e9) / 1e9).abs() < 1e-9);
    assert_eq!(
        Limit::every(Duration::from_millis(2500)).as_f64().to_bits(),
        0x3fd999999999999a
    );
    assert_eq!(
        Limit::every(Duration::from_nanos(i64::MAX as u64)).as_f64(),
        1.0842021724855043e-10
    );
    assert!(Limit::every(Duration::ZERO).is_inf());
}

#[test]
fn no_truncation_errors() {
    // TestLimiter_noTruncationErrors.
    let l = TokenBucket::new(Limit::per_second(0.7692307692307693).unwrap(), 1);
    assert!(l.allow());
}

#[test]
fn high_rates_do_not_drift() {
    // 3e8/s: 3.33.. ns a token. Whole-nanosecond state would round each reservation. (A burst
    // above 1 keeps the cap from discarding fractions between whole-nanosecond attempts.)
    let l = tb(3e8, 10);
    let mut granted = 0u64;
    for i in 0..3_000_000u64 {
        // one attempt per nanosecond for 3 ms (twice as fast as the limit)
        if l.allow_at(at(SEC + i)) {
            granted += 1;
        }
    }
    // 3 ms at 3e8/s = 900_000 tokens, plus the burst of 10.
    assert!((900_009..=900_010).contains(&granted), "{granted}");
}

#[test]
fn tiny_limits_keep_their_initial_burst() {
    // One token per 317 years: refilling 3 would pass the end of time, so the limit acts as
    // zero, but the bucket still starts full.
    let l = tb(1e-10, 3);
    assert_eq!(l.tokens_at(at(SEC)), 3.0);
    assert!(l.allow_n_at(at(SEC), 3));
    assert!(!l.allow_at(at(SEC)));
    let l = TokenBucket::builder(Limit::every(Duration::MAX), 5)
        .clock(ManualClock::default())
        .build();
    assert!(l.allow_n_at(at(SEC), 5));
    assert!(!l.reserve_at(at(SEC)).ok());
}

/// `Idle`: idle exactly when full at `now` (a fresh bucket is then identical), for finite,
/// zero and infinite limits, with reservations outstanding, and after reconfiguration (the
/// comparison is with a fresh bucket of the current configuration).
#[test]
fn idle_exactly_when_full() {
    use turnstile::Idle;
    let l = tb(10.0, 2);
    assert!(l.is_idle_at(at(0)));
    assert!(l.allow_at(at(0)));
    assert!(!l.is_idle_at(at(0)));
    assert!(!l.is_idle_at(at(100 * MS - 1)));
    assert!(l.is_idle_at(at(100 * MS)));
    // An outstanding reservation (negative tokens) keeps it busy until refilled past it.
    let r = l.reserve_n_at(at(SEC), 2);
    let r2 = l.reserve_n_at(at(SEC), 1);
    assert!(r.ok() && r2.ok());
    assert!(!l.is_idle_at(at(SEC + 299 * MS)));
    assert!(l.is_idle_at(at(SEC + 300 * MS)));
    // Checked idle at `now`, a fresh bucket decides every later request the same way.
    let fresh = tb(10.0, 2);
    let mut t = SEC + 300 * MS;
    for i in 0..200u64 {
        t += (i * 37) % 90 * MS;
        let n = (i % 3) as u32;
        assert_eq!(l.allow_n_at(at(t), n), fresh.allow_n_at(at(t), n), "op {i}");
    }
    // A larger burst: idle only when full of the new burst.
    let l = tb(10.0, 2);
    l.set_burst_at(at(0), 4);
    assert_eq!(l.tokens_at(at(0)), 2.0);
    assert!(!l.is_idle_at(at(0)));
    assert!(l.is_idle_at(at(200 * MS)));
    // A new limit refills at the new rate.
    assert!(l.allow_n_at(at(SEC), 4));
    l.set_limit_at(at(SEC), Limit::per_second(1.0).unwrap());
    assert!(!l.is_idle_at(at(SEC + 3 * SEC + 999 * MS)));
    assert!(l.is_idle_at(at(5 * SEC)));
    // A zero limit never refills: idle until the first token is taken, never after.
    let z = TokenBucket::builder(Limit::ZERO, 2)
        .clock(ManualClock::default())
        .build();
    assert!(z.is_idle_at(at(u64::MAX / 2)));
    assert!(z.allow_at(at(0)));
    assert!(!z.is_idle_at(at(u64::MAX / 2)));
    // Infinite: full once any time has passed since the switch; at the switch, only if the
    // stored tokens were full.
    let i = tb(1.0, 2);
    assert!(i.allow_n_at(at(0), 2));
    i.set_limit_at(at(SEC), Limit::INF);
    assert!(!i.is_idle_at(at(SEC)));
    assert!(i.is_idle_at(at(SEC + 1)));
    let i = TokenBucket::builder(Limit::INF, 3)
        .clock(ManualClock::default())
        .build();
    assert!(i.is_idle_at(at(0)));
    assert!(i.allow_n_at(at(0), 100));
    assert!(i.is_idle_at(at(0)));
}

#[test]
fn the_compact_layout_is_the_same_bucket_unpadded() {
    use turnstile::{Compact, ManualClock, Nanos, TokenBucket};
    let limit = Limit::per_second(7.0).unwrap();
    let padded = TokenBucket::builder(limit, 4)
        .clock(ManualClock::default())
        .build();
    let compact: TokenBucket<_, Compact> = TokenBucket::builder(limit, 4)
        .clock(ManualClock::default())
        .build_compact();
    // The state word's cache line of padding is gone.
    assert!(std::mem::size_of_val(&compact) + 100 < std::mem::size_of_val(&padded));
    for i in 0..300u64 {
        let now = Nanos::new(i * 61_000_000);
        let n = (i % 5) as u32;
        match i % 7 {
            0 => {
                let (a, b) = (padded.reserve_n_at(now, n), compact.reserve_n_at(now, n));
                assert_eq!(
                    (a.ok(), a.time_to_act()),
                    (b.ok(), b.time_to_act()),
                    "op {i}"
                );
                if i % 2 == 0 {
                    a.cancel_at(now);
                    b.cancel_at(now);
                }
            }
            1 => {
                let l = Limit::per_second((i % 13) as f64).unwrap();
                padded.set_limit_at(now, l);
                compact.set_limit_at(now, l);
            }
            _ => assert_eq!(
                padded.allow_n_at(now, n),
                compact.allow_n_at(now, n),
                "op {i}"
            ),
        }
        assert_eq!(padded.tokens_at(now), compact.tokens_at(now), "op {i}");
    }
}

#[test]
fn a_refusal_under_a_zero_limit_never_comes_due() {
    // Nothing refills: once the stored tokens are gone, `check`'s refusal says "never", built
    // fresh and after a switch to zero alike, within the burst and beyond it.
    let z = TokenBucket::builder(Limit::ZERO, 2)
        .clock(ManualClock::default())
        .build();
    assert!(z.check_n_at(at(0), 2).is_ok());
    for n in [1, 2, 3] {
        assert_eq!(
            z.check_n_at(at(SEC), n).unwrap_err().retry_at(),
            None,
            "{n}"
        );
    }
    let l = tb(10.0, 2);
    assert!(l.check_n_at(at(0), 2).is_ok());
    l.set_limit_at(at(0), Limit::ZERO);
    assert_eq!(l.check_n_at(at(SEC), 1).unwrap_err().retry_at(), None);
}

/// Under a zero limit nothing refills, so a refund is the only way tokens come back: it gives
/// them back as under any finite limit (only an infinite limit, where a check took nothing,
/// refunds nothing), every operation on such a bucket taking the slow path.
#[test]
fn a_refund_under_a_zero_limit_gives_the_tokens_back() {
    let l = tb(0.0, 3);
    assert!(l.allow_n_at(at(0), 2));
    assert!(!l.allow_n_at(at(SEC), 2));
    assert!(l.refund_n_at(at(SEC), 1));
    assert_eq!(l.tokens_at(at(SEC)), 2.0);
    assert!(l.allow_n_at(at(2 * SEC), 2));
    let denied = l.check_n_at(at(2 * SEC), 1).unwrap_err();
    assert_eq!(denied.retry_at(), None);
}
