//! The deadlines of `TokenBucket`'s waits (`Deadline`: a timeout from the start of the wait, a
//! std or tokio `Instant`, a reading of the limiter's clock, or none) and the owned
//! reservation (`OwnedReservation`, through an `Arc`). No outcome here depends on how fast
//! the machine runs: limiters run on a `ManualClock` that starts well past its origin (so that
//! a timeout mistaken for a time since the origin is already over), async waits run on tokio's
//! paused clock, and real `Instant` deadlines are hours away from the waits they bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile::{
    reference, Compact, Deadline, Limit, ManualClock, Nanos, OwnedReservation, QuantaClock,
    TokenBucket, WaitError,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const HOUR: Duration = Duration::from_secs(3600);

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

/// A bucket of one token a second (`per_second`), burst `burst`, on a manual clock reading
/// 10 s, drained there: its next token comes at 10 s + 1 / `per_second`.
fn drained(per_second: f64, burst: u32) -> (TokenBucket<ManualClock>, ManualClock) {
    let clock = ManualClock::new(at(10 * SEC));
    let l = TokenBucket::builder(Limit::per_second(per_second).unwrap(), burst)
        .clock(clock.clone())
        .build();
    assert!(l.allow_n_at(at(10 * SEC), burst));
    (l, clock)
}

#[test]
fn a_timeout_counts_from_the_start_of_the_wait() {
    // The next token is 1 ms away (at 10.001 s on the limiter's clock).
    let (l, _clock) = drained(1000.0, 1);
    let now = at(10 * SEC);
    assert_eq!(
        l.wait_n_blocking(1, Duration::from_micros(999)),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    assert_eq!(l.tokens_at(now), 0.0, "a failed wait takes nothing");
    // Long enough: 2 ms from the start of the wait, not 2 ms after the clock's origin (long
    // past at 10 s). The wait sleeps about 1 ms of real time (the manual clock stays put).
    assert_eq!(l.wait_n_blocking(1, Duration::from_millis(2)), Ok(()));
    assert_eq!(l.tokens_at(now), -1.0, "the wait took its token");
    // Deadline::timeout is the same as the Duration.
    assert_eq!(
        l.wait_n_blocking(1, Deadline::timeout(Duration::from_micros(1_999))),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    // A zero timeout has passed as soon as the wait starts.
    assert_eq!(
        l.wait_n_blocking(1, Duration::ZERO),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    // A timeout past the end of the clock's range saturates: no overflow, and it is enough.
    assert_eq!(l.wait_n_blocking(1, Duration::MAX), Ok(()));
}

/// `Some(d.into())` for a `Duration` is a timeout, not an instant counted from the clock's
/// origin (as an instant, one second would have passed long ago: `DeadlinePassed` at once).
#[test]
fn some_duration_into_is_a_one_second_timeout() {
    let (l, clock) = drained(1.0, 1);
    assert_eq!(
        l.wait_n_blocking(1, Some(Duration::from_millis(999).into())),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    clock.set(at(11 * SEC));
    assert_eq!(
        l.wait_n_blocking(1, Some(Duration::from_secs(1).into())),
        Ok(())
    );
}

#[test]
fn a_timeout_keeps_rate_go_error_order() {
    let (l, _clock) = drained(1.0, 2);
    // Exceeds burst comes before a deadline that has passed.
    assert_eq!(
        l.wait_n_blocking(3, Duration::ZERO),
        Err(WaitError::ExceedsBurst { n: 3, burst: 2 })
    );
    assert_eq!(
        l.wait_n_blocking(1, Duration::ZERO),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    // The next token is 1 s away.
    assert_eq!(
        l.wait_n_blocking(1, Duration::from_millis(999)),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    // A zero limit never refills: Never, whatever the timeout.
    let zero = TokenBucket::builder(Limit::ZERO, 1)
        .clock(ManualClock::new(at(10 * SEC)))
        .build();
    assert_eq!(zero.wait_n_blocking(1, HOUR), Ok(()));
    assert!(matches!(
        zero.wait_n_blocking(1, HOUR),
        Err(WaitError::Never { n: 1, .. })
    ));
}

#[test]
fn a_std_instant_in_the_past_has_passed() {
    let (l, _clock) = drained(1.0, 2);
    let past = Instant::now()
        .checked_sub(HOUR)
        .unwrap_or_else(Instant::now);
    assert_eq!(
        l.wait_n_blocking(1, past),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    assert_eq!(
        l.wait_n_blocking(1, Deadline::until(past)),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    // Exceeds burst is still checked first.
    assert_eq!(
        l.wait_n_blocking(3, past),
        Err(WaitError::ExceedsBurst { n: 3, burst: 2 })
    );
    // Even when nothing would need a wait (the bucket of a fresh limiter is full).
    let full = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
        .clock(ManualClock::default())
        .build();
    assert_eq!(
        full.wait_n_blocking(1, past),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    assert_eq!(
        full.tokens_at(Nanos::ZERO),
        1.0,
        "a failed wait takes nothing"
    );
}

/// Runs `f`, a blocking wait that should end at once, on a thread of its own, and gives up on
/// it after a minute: a deadline that was ignored would make the wait sleep for hours, and
/// this turns that into a failure instead of a hung test. A correct wait here never sleeps.
fn at_once<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the wait slept: its deadline was not applied")
}

#[test]
fn a_std_instant_counts_from_now_on_the_limiters_clock() {
    // One token every 2 hours: the next is 2 h away, past a deadline 1 h from now.
    let (l, _clock) = drained(1.0 / 7200.0, 1);
    let l = Arc::new(l);
    let deadline = Instant::now() + HOUR;
    assert_eq!(
        at_once(move || l.wait_n_blocking(1, deadline)),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    // A fresh bucket has a token now, within a deadline an hour away. Its clock reads 10
    // hours: the hour counts from that reading, not from the clock's origin.
    let fresh = TokenBucket::builder(Limit::per_second(1.0 / 7200.0).unwrap(), 1)
        .clock(ManualClock::new(Nanos::from_duration(10 * HOUR)))
        .build();
    assert_eq!(fresh.wait_n_blocking(1, Instant::now() + HOUR), Ok(()));
    // The quanta clock's origin is the process's first use of it, the Instant's is not: the
    // conversion goes through the two clocks' present, not their origins.
    let quanta = Arc::new(TokenBucket::new(
        Limit::per_second(1.0 / 7200.0).unwrap(),
        1,
    ));
    assert_eq!(quanta.wait_n_blocking(1, Instant::now() + HOUR), Ok(()));
    let deadline = Instant::now() + HOUR;
    assert_eq!(
        at_once(move || quanta.wait_n_blocking(1, deadline)),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
}

#[test]
fn deadline_at_is_a_reading_of_the_limiters_clock() {
    let (l, clock) = drained(1.0, 1);
    assert_eq!(
        l.wait_n_blocking(1, Deadline::at(at(10 * SEC))),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    assert_eq!(
        l.wait_n_blocking(1, Deadline::at(at(11 * SEC - 1))),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    // At exactly the token's time: granted. The clock moves there so the wait does not sleep.
    clock.set(at(11 * SEC));
    assert_eq!(l.wait_n_blocking(1, Deadline::at(at(11 * SEC + 1))), Ok(()));
    assert_eq!(l.tokens_at(at(11 * SEC)), 0.0);
}

#[test]
fn no_deadline_and_optional_deadlines() {
    let (l, clock) = drained(1.0, 1);
    clock.set(at(11 * SEC));
    assert_eq!(l.wait_n_blocking(1, None), Ok(()));
    clock.set(at(12 * SEC));
    assert_eq!(l.wait_n_blocking(1, Deadline::NONE), Ok(()));
    let timeout: Option<Duration> = Some(Duration::from_millis(999));
    assert_eq!(
        l.wait_n_blocking(1, timeout.map(Deadline::timeout)),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    clock.set(at(13 * SEC));
    let none: Option<Deadline> = None;
    assert_eq!(l.wait_n_blocking(1, none), Ok(()));
}

/// The twin takes the same deadlines and agrees.
#[test]
fn the_twin_takes_the_same_deadlines() {
    let clock = ManualClock::new(at(10 * SEC));
    let twin = reference::TokenBucket::from(
        turnstile::TokenBucket::builder(Limit::per_second(1.0).unwrap(), 2).clock(clock),
    );
    assert!(twin.allow_n_at(at(10 * SEC), 2));
    assert_eq!(
        twin.wait_n_blocking(3, Duration::ZERO),
        Err(WaitError::ExceedsBurst { n: 3, burst: 2 })
    );
    assert_eq!(
        twin.wait_n_blocking(1, Duration::ZERO),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    assert_eq!(
        twin.wait_n_blocking(1, Duration::from_millis(999)),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    let past = Instant::now()
        .checked_sub(HOUR)
        .unwrap_or_else(Instant::now);
    assert_eq!(
        twin.wait_n_blocking(1, past),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    assert_eq!(
        twin.wait_n_blocking(1, Deadline::at(at(11 * SEC - 1))),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
}

#[cfg(feature = "tokio")]
mod asynchronous {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_timeout_long_enough_succeeds_and_one_too_short_fails() {
        let (l, _clock) = drained(1.0, 1);
        assert_eq!(
            l.wait_n(1, Duration::from_millis(999)).await,
            Err(WaitError::WouldExceedDeadline { n: 1 })
        );
        assert_eq!(
            l.tokens_at(at(10 * SEC)),
            0.0,
            "a failed wait takes nothing"
        );
        // Tokio's paused clock jumps the 1 s sleep.
        assert_eq!(l.wait_n(1, Duration::from_secs(2)).await, Ok(()));
        assert_eq!(l.tokens_at(at(10 * SEC)), -1.0);
        assert_eq!(
            l.wait_n(1, Duration::ZERO).await,
            Err(WaitError::DeadlinePassed { n: 1 })
        );
    }

    /// The timeout starts when the future is first polled (when the wait starts), not when it
    /// is created.
    #[tokio::test(start_paused = true)]
    async fn a_timeout_starts_at_the_first_poll() {
        let (l, clock) = drained(1.0, 1);
        // Created at 10 s, the next token at 11 s: 500 ms from creation would be too short.
        let wait = l.wait_n(1, Duration::from_millis(500));
        clock.set(at(10 * SEC + 800 * MS));
        assert_eq!(wait.await, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokio_instant_is_measured_on_tokios_clock() {
        let (l, _clock) = drained(1.0, 1);
        // Tokio's time runs an hour ahead of std's from here on.
        tokio::time::advance(HOUR).await;
        let t = tokio::time::Instant::now();
        assert_eq!(
            l.wait_n(1, t + Duration::from_millis(500)).await,
            Err(WaitError::WouldExceedDeadline { n: 1 })
        );
        assert_eq!(
            l.wait_n(1, t - Duration::from_millis(1)).await,
            Err(WaitError::DeadlinePassed { n: 1 })
        );
        assert_eq!(
            l.wait_n(1, Deadline::from(t)).await,
            Err(WaitError::DeadlinePassed { n: 1 })
        );
        assert_eq!(l.wait_n(1, t + Duration::from_secs(2)).await, Ok(()));
        // The blocking wait takes a tokio instant too.
        assert_eq!(
            l.wait_n_blocking(1, tokio::time::Instant::now() + Duration::from_millis(500)),
            Err(WaitError::WouldExceedDeadline { n: 1 })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_std_instant_bounds_an_async_wait() {
        let (l, _clock) = drained(1.0, 1);
        assert_eq!(
            l.wait_n(1, Instant::now() + Duration::from_millis(500))
                .await,
            Err(WaitError::WouldExceedDeadline { n: 1 })
        );
        // The 1 s sleep is on tokio's paused clock; the deadline is an hour of real time away.
        assert_eq!(l.wait_n(1, Instant::now() + HOUR).await, Ok(()));
        let past = Instant::now()
            .checked_sub(HOUR)
            .unwrap_or_else(Instant::now);
        assert_eq!(
            l.wait_n(1, past).await,
            Err(WaitError::DeadlinePassed { n: 1 })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_twins_async_wait_takes_the_same_deadlines() {
        let clock = ManualClock::new(at(10 * SEC));
        let twin = reference::TokenBucket::from(
            turnstile::TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1).clock(clock),
        );
        assert!(twin.allow_at(at(10 * SEC)));
        assert_eq!(
            twin.wait_n(1, Duration::from_millis(999)).await,
            Err(WaitError::WouldExceedDeadline { n: 1 })
        );
        assert_eq!(twin.wait_n(1, Duration::from_secs(2)).await, Ok(()));
    }

    /// An owned reservation moves into a spawned task and is cancelled there; the tokens come
    /// back exactly as a borrowed reservation's do, on a twin bucket given the same history.
    #[tokio::test(start_paused = true)]
    async fn an_owned_reservation_cancelled_in_a_task_restores_like_a_borrowed_one() {
        let (borrowed, _c1) = drained(10.0, 3);
        let (owned, _c2) = drained(10.0, 3);
        let owned = Arc::new(owned);
        let now = at(10 * SEC);
        // A reservation of 2 (acting at 10.2 s), then a later one of 1 (at 10.3 s) that keeps
        // its token: cancelling the first restores its 2 minus the 1 reserved after it
        // (rate.go's `n - limit * (lastEvent - timeToAct)`).
        let a = borrowed.reserve_n_at(now, 2);
        let _a_later = borrowed.reserve_n_at(now, 1);
        let b = OwnedReservation::reserve_n_at(&owned, now, 2);
        let _b_later = OwnedReservation::reserve_n_at(&owned, now, 1);
        assert_eq!(a.time_to_act(), b.time_to_act());
        assert_eq!(a.delay_from(now), b.delay_from(now));
        assert_eq!(borrowed.tokens_at(now), owned.tokens_at(now));
        a.cancel_at(now);
        let task = tokio::spawn(async move {
            assert!(b.ok());
            assert_eq!(b.tokens(), 2);
            b.cancel_at(now);
        });
        task.await.unwrap();
        assert_eq!(owned.tokens_at(now), borrowed.tokens_at(now));
        assert_eq!(
            owned.tokens_at(now),
            -2.0,
            "one of the two tokens came back"
        );
    }
}

/// The same across a thread, for each reserving method and a denied reservation.
#[test]
fn an_owned_reservation_cancelled_on_a_thread_restores_like_a_borrowed_one() {
    let (borrowed, _c1) = drained(10.0, 4);
    let (owned, _c2) = drained(10.0, 4);
    let owned = Arc::new(owned);
    let now = at(10 * SEC);
    let max = Duration::from_millis(250);
    let pairs: Vec<(
        turnstile::Reservation<'_, ManualClock>,
        OwnedReservation<ManualClock>,
    )> = vec![
        (
            borrowed.reserve_at(now),
            OwnedReservation::reserve_n_at(&owned, now, 1),
        ),
        (
            borrowed.reserve_n_at(now, 2),
            OwnedReservation::reserve_n_at(&owned, now, 2),
        ),
        // Within 250 ms: the fourth token would come at 10.4 s, so not OK, nothing taken.
        (
            borrowed.try_reserve_n_at(now, 1, max),
            OwnedReservation::try_reserve_n_at(&owned, now, 1, max),
        ),
    ];
    assert!(!pairs[2].0.ok() && !pairs[2].1.ok());
    assert_eq!(owned.tokens_at(now), -3.0);
    for (a, b) in pairs.into_iter().rev() {
        assert_eq!(a.ok(), b.ok());
        assert_eq!(a.tokens(), b.tokens());
        assert_eq!(a.limit(), b.limit());
        assert_eq!(a.time_to_act(), b.time_to_act());
        a.cancel_at(now);
        std::thread::spawn(move || b.cancel_at(now)).join().unwrap();
        assert_eq!(owned.tokens_at(now), borrowed.tokens_at(now));
    }
    assert_eq!(owned.tokens_at(now), 0.0, "every token came back");
    // The plain forms read the bucket's clock, and `cancel` cancels at its reading.
    let r = OwnedReservation::reserve_n(&owned, 2);
    assert_eq!(r.time_to_act(), Some(at(10 * SEC + 200 * MS)));
    assert_eq!(r.delay(), Duration::from_millis(200));
    std::thread::spawn(move || r.cancel()).join().unwrap();
    assert_eq!(owned.tokens_at(now), 0.0);
    let r = OwnedReservation::reserve_n(&owned, 1);
    let w = OwnedReservation::try_reserve_n(&owned, 1, Duration::from_millis(99));
    assert!(r.ok() && !w.ok());
    drop(w);
    std::thread::spawn(move || r.cancel()).join().unwrap();
    assert_eq!(owned.tokens_at(now), 0.0);
    assert_eq!(
        Arc::strong_count(&owned),
        1,
        "dropped reservations let the Arc go"
    );
}

/// An owned reservation is `Send + 'static` (it can move into `tokio::spawn` or a thread),
/// whatever the layout, and cancelling consumes it: at most once, by its type.
#[test]
fn an_owned_reservation_is_send_static_and_cancels_by_value() {
    fn send_static<T: Send + 'static>() {}
    send_static::<OwnedReservation>();
    send_static::<OwnedReservation<ManualClock>>();
    send_static::<OwnedReservation<QuantaClock, Compact>>();
    // `cancel` and `cancel_at` take the reservation by value (a `&self` method would not
    // coerce to these types): the type allows one cancel.
    let _: fn(OwnedReservation<ManualClock>) = OwnedReservation::cancel;
    let _: fn(OwnedReservation<ManualClock>, Nanos) = OwnedReservation::cancel_at;
}
