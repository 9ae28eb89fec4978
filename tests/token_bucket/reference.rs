//! The mutex twin `turnstile::reference::TokenBucket` against upstream x/time/rate: the test
//! vectors of `rate_test.go` and the verified edge cases of the seed-semantics doc (§1). Every
//! test uses the `_at` forms with explicit times; the async waits run on tokio's paused clock.

use std::time::Duration;

use turnstile::reference::TokenBucket;
use turnstile::{Deadline, Limit, Limiter, ManualClock, Nanos, Peek, WaitError};

/// Upstream's `d`.
const D: u64 = 100_000_000;
/// Upstream's `t0` is `time.Now()`, long after the zero time where `last` starts.
const T0: u64 = 1_000 * 1_000_000_000;
/// Go's `InfDuration`.
const INF_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// Upstream's `t0`, `t1`, ...: `t0 + i·d`.
fn t(i: u64) -> Nanos {
    Nanos::new(T0 + i * D)
}

fn limit(l: f64) -> Limit {
    Limit::per_second(l).unwrap()
}

/// Upstream's `NewLimiter(l, b)`, on a manual clock that reads `t0`.
fn new_limiter(l: f64, b: u32) -> TokenBucket<ManualClock> {
    TokenBucket::from(turnstile::TokenBucket::builder(limit(l), b).clock(ManualClock::new(t(0))))
}

/// Upstream's `dSince`: multiples of d since t0, rounded to the nearest.
fn d_since(x: Nanos) -> i128 {
    let dur = i128::from(x.as_u64()) - i128::from(T0);
    let d = i128::from(D);
    (dur + d / 2) / d
}

/// Upstream's `run`.
fn run(tb: &TokenBucket<ManualClock>, allows: &[(Nanos, u32, bool)]) {
    for (i, &(at, n, ok)) in allows.iter().enumerate() {
        assert_eq!(
            tb.allow_n_at(at, n),
            ok,
            "step {i}: allow_n_at(t{}, {n})",
            d_since(at)
        );
    }
}

/// Upstream's `runReserveMax`: checks `ok`, and the time to act to the nearest d.
fn run_reserve_max(
    tb: &TokenBucket<ManualClock>,
    at: Nanos,
    n: u32,
    act: Nanos,
    ok: bool,
    max: Duration,
) -> turnstile::reference::token_bucket::Reservation<'_, ManualClock> {
    let r = tb.try_reserve_n_at(at, n, max);
    assert_eq!(r.ok(), ok, "reserve(t{}, {n}, {max:?}).ok", d_since(at));
    if ok {
        assert_eq!(
            d_since(r.time_to_act().unwrap()),
            d_since(act),
            "reserve(t{}, {n}, {max:?}) acts at",
            d_since(at)
        );
    } else {
        assert_eq!(r.time_to_act(), None);
    }
    r
}

/// Upstream's `runReserve`: `ReserveN`, i.e. max wait `InfDuration`.
fn run_reserve(
    tb: &TokenBucket<ManualClock>,
    at: Nanos,
    n: u32,
    act: Nanos,
    ok: bool,
) -> turnstile::reference::token_bucket::Reservation<'_, ManualClock> {
    // reserve_n_at is the same call as try_reserve_n_at(.., Duration::MAX); see
    // `reserve_n_at_is_reserve_with_infinite_max_wait`.
    run_reserve_max(tb, at, n, act, ok, Duration::MAX)
}

// ---------------------------------------------------------------------------------------
// Conversions and Every

#[test]
fn every_values() {
    // TestEvery, with its relative tolerance.
    let close = |a: Limit, b: f64| ((a.as_f64() / b).abs() - 1.0) < 1e-9;
    assert!(Limit::every(Duration::ZERO).is_inf());
    let cases: &[(Duration, f64)] = &[
        (Duration::from_nanos(1), 1e9),
        (Duration::from_micros(1), 1e6),
        (Duration::from_millis(1), 1e3),
        (Duration::from_millis(10), 100.0),
        (Duration::from_millis(100), 10.0),
        (Duration::from_secs(1), 1.0),
        (Duration::from_secs(2), 0.5),
        (Duration::from_millis(2500), 0.4),
        (Duration::from_secs(4), 0.25),
        (Duration::from_secs(10), 0.1),
        (INF_DURATION, 1e9 / i64::MAX as f64),
    ];
    for &(interval, want) in cases {
        assert!(close(Limit::every(interval), want), "Every({interval:?})");
    }
    // Exact float64 bits, as the seed doc records them.
    assert_eq!(
        Limit::every(Duration::from_nanos(1)).as_f64(),
        9.999999999999999e8
    );
    assert_eq!(
        Limit::every(Duration::from_millis(2500)).as_f64().to_bits(),
        0x3fd999999999999a
    );
    assert_eq!(Limit::every(INF_DURATION).as_f64(), 1.0842021724855043e-10);
}

#[test]
fn no_truncation_errors() {
    // TestLimiter_noTruncationErrors, on the real clock.
    assert!(TokenBucket::new(limit(0.7692307692307693), 1).allow());
}

// ---------------------------------------------------------------------------------------
// Allow vectors

#[test]
fn limiter_burst_1() {
    run(
        &new_limiter(10.0, 1),
        &[
            (t(0), 1, true),
            (t(0), 1, false),
            (t(0), 1, false),
            (t(1), 1, true),
            (t(1), 1, false),
            (t(1), 1, false),
            (t(2), 2, false), // burst size is 1, so n=2 always fails
            (t(2), 1, true),
            (t(2), 1, false),
        ],
    );
}

#[test]
fn limiter_burst_3() {
    run(
        &new_limiter(10.0, 3),
        &[
            (t(0), 2, true),
            (t(0), 2, false),
            (t(0), 1, true),
            (t(0), 1, false),
            (t(1), 4, false),
            (t(2), 1, true),
            (t(3), 1, true),
            (t(4), 1, true),
            (t(4), 1, true),
            (t(4), 1, false),
            (t(4), 1, false),
            (t(9), 3, true),
            (t(9), 0, true),
        ],
    );
}

#[test]
fn limiter_jump_backwards() {
    run(
        &new_limiter(10.0, 3),
        &[
            (t(1), 1, true), // start at t1
            (t(0), 1, true), // jump back to t0, two tokens remain
            (t(0), 1, true),
            (t(0), 1, false),
            (t(0), 1, false),
            (t(1), 1, true), // got a token
            (t(1), 1, false),
            (t(1), 1, false),
            (t(2), 1, true), // got another token
            (t(2), 1, false),
            (t(2), 1, false),
        ],
    );
}

#[test]
fn zero_limit() {
    // TestZeroLimit.
    let tb = new_limiter(0.0, 1);
    assert!(tb.allow_at(t(0)), "Limit(0, 1) want true when first used");
    assert!(
        !tb.allow_at(t(0)),
        "Limit(0, 1) want false when already used"
    );
}

// ---------------------------------------------------------------------------------------
// Reserve and cancel vectors

#[test]
fn simple_reserve() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let _ = run_reserve(&tb, t(0), 2, t(2), true);
    let _ = run_reserve(&tb, t(3), 2, t(4), true);
}

#[test]
fn mix() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 3, t(1), false); // n > burst
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    run(&tb, &[(t(1), 2, false)]); // not enough tokens
    let _ = run_reserve(&tb, t(1), 2, t(2), true);
    run(&tb, &[(t(1), 1, false)]); // negative tokens
    run(&tb, &[(t(3), 1, true)]);
}

#[test]
fn cancel_invalid() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 3, t(3), false);
    r.cancel_at(t(0)); // should have no effect
    let _ = run_reserve(&tb, t(0), 2, t(2), true); // did not get extra tokens
}

#[test]
fn cancel_last() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 2, t(2), true);
    r.cancel_at(t(1)); // got 2 tokens back
    let _ = run_reserve(&tb, t(1), 2, t(2), true);
}

#[test]
fn cancel_too_late() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 2, t(2), true);
    r.cancel_at(t(3)); // too late to cancel: no effect
    let _ = run_reserve(&tb, t(3), 2, t(4), true);
}

#[test]
fn cancel_exactly_at_time_to_act_restores() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 2, t(2), true);
    assert_eq!(r.time_to_act(), Some(t(2)));
    assert_eq!(tb.tokens_at(t(2)), 0.0);
    r.cancel_at(t(2)); // `timeToAct.Before(t)` is false: still allowed
    assert_eq!(tb.tokens_at(t(2)), 2.0);

    // One nanosecond later is too late.
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 2, t(2), true);
    r.cancel_at(t(2) + Duration::from_nanos(1));
    assert_eq!(tb.tokens_at(t(2)), 0.0);
}

#[test]
fn cancel_0_tokens() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 1, t(1), true);
    let _ = run_reserve(&tb, t(0), 1, t(2), true);
    r.cancel_at(t(0)); // got 0 tokens back
    let _ = run_reserve(&tb, t(0), 1, t(3), true);
}

#[test]
fn cancel_1_token() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 2, t(2), true);
    let _ = run_reserve(&tb, t(0), 1, t(3), true);
    r.cancel_at(t(2)); // got 1 token back
    let _ = run_reserve(&tb, t(2), 2, t(4), true);
}

#[test]
fn cancel_multi() {
    let tb = new_limiter(10.0, 4);
    let _ = run_reserve(&tb, t(0), 4, t(0), true);
    let r_a = run_reserve(&tb, t(0), 3, t(3), true);
    let _ = run_reserve(&tb, t(0), 1, t(4), true);
    let r_c = run_reserve(&tb, t(0), 1, t(5), true);
    r_c.cancel_at(t(1)); // get 1 token back
    r_a.cancel_at(t(1)); // get 2 tokens back, as if C was never reserved
    let _ = run_reserve(&tb, t(1), 3, t(5), true);
}

#[test]
fn cancel_sequence_single_cancel() {
    // §1.6: limit 10, burst 1. Upstream's second CancelAt would leave tokens = 1; here a
    // reservation is cancelled by value (D1), so the state after one cancel is final.
    let tb = new_limiter(10.0, 1);
    let _ = run_reserve(&tb, t(0), 1, t(0), true);
    let r = tb.reserve_at(t(0));
    assert_eq!(r.time_to_act(), Some(t(1)));
    assert_eq!(tb.tokens_at(t(0)), -1.0);
    r.cancel_at(t(0));
    assert_eq!(tb.tokens_at(t(0)), 0.0);
    // lastEvent is back at t0, tokens 0: the next reservation acts at t1 (after a double
    // cancel upstream it would act at t0).
    assert!(!tb.allow_at(t(0)));
    let r2 = tb.reserve_at(t(0));
    assert_eq!(r2.time_to_act(), Some(t(1)));
    // And cancelling that one finds lastEvent == its time to act again.
    r2.cancel_at(t(0));
    assert_eq!(tb.tokens_at(t(0)), 0.0);
    assert_eq!(tb.reserve_at(t(0)).time_to_act(), Some(t(1)));
}

#[test]
fn reserve_jump_back() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(1), 2, t(1), true); // start at t1
    let _ = run_reserve(&tb, t(0), 1, t(1), true); // should violate Limit,Burst
    let _ = run_reserve(&tb, t(2), 2, t(3), true);
}

#[test]
fn reserve_jump_back_cancel() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(1), 2, t(1), true); // start at t1
    let r = run_reserve(&tb, t(1), 2, t(3), true);
    let _ = run_reserve(&tb, t(1), 1, t(4), true);
    r.cancel_at(t(0)); // cancel at t0, get 1 token back
    let _ = run_reserve(&tb, t(1), 2, t(4), true); // should violate Limit,Burst
}

#[test]
fn reserve_set_limit() {
    let tb = new_limiter(5.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let _ = run_reserve(&tb, t(0), 2, t(4), true);
    tb.set_limit_at(t(2), limit(10.0));
    let _ = run_reserve(&tb, t(2), 1, t(4), true); // violates Limit and Burst
}

#[test]
fn reserve_set_burst() {
    let tb = new_limiter(5.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let _ = run_reserve(&tb, t(0), 2, t(4), true);
    tb.set_burst_at(t(3), 4);
    let _ = run_reserve(&tb, t(0), 4, t(9), true); // violates Limit and Burst
}

#[test]
fn reserve_set_limit_cancel() {
    let tb = new_limiter(5.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 2, t(4), true);
    tb.set_limit_at(t(2), limit(10.0));
    r.cancel_at(t(2)); // 2 tokens back
    let _ = run_reserve(&tb, t(2), 2, t(3), true);
}

#[test]
fn reserve_max() {
    let tb = new_limiter(10.0, 2);
    let max = Duration::from_nanos(D);
    let _ = run_reserve_max(&tb, t(0), 2, t(0), true, max);
    let _ = run_reserve_max(&tb, t(0), 1, t(1), true, max); // reserve for close future
    let _ = run_reserve_max(&tb, t(0), 1, t(2), false, max); // time to act too far in the future
}

#[test]
fn reserve_n_at_is_reserve_with_infinite_max_wait() {
    let tb = new_limiter(10.0, 2);
    let r = tb.reserve_n_at(t(0), 2);
    assert_eq!((r.ok(), r.time_to_act()), (true, Some(t(0))));
    let r = tb.reserve_n_at(t(0), 2);
    assert_eq!((r.ok(), r.time_to_act()), (true, Some(t(2))));
    let r = tb.reserve_n_at(t(0), 3);
    assert!(!r.ok());
}

#[test]
fn failed_reservation_changes_nothing_and_holds_nothing() {
    let tb = new_limiter(10.0, 2);
    assert!(tb.allow_n_at(t(1), 1));
    // Fails on the burst and on the max wait, at an earlier time: nothing moves (2c09566).
    let r = tb.reserve_n_at(t(0), 3);
    assert!(!r.ok());
    assert_eq!(r.tokens(), 0); // Go sets tokens only on success
    assert_eq!(r.time_to_act(), None);
    assert_eq!(r.delay_from(t(0)), Duration::MAX);
    assert_eq!(r.limit(), limit(10.0));
    let r = tb.try_reserve_n_at(t(0), 2, Duration::from_nanos(D - 1));
    assert!(!r.ok());
    // If `last` had moved back to t0, t1 would now see one more token.
    assert_eq!(tb.tokens_at(t(1)), 1.0);
    assert!(tb.allow_n_at(t(1), 1));
    assert!(!tb.allow_n_at(t(1), 1));
}

#[test]
fn reservation_accessors() {
    let tb = new_limiter(4.0, 1);
    let r = tb.reserve_n_at(t(0), 1);
    assert_eq!((r.ok(), r.tokens(), r.limit()), (true, 1, limit(4.0)));
    assert_eq!(r.delay_from(t(0)), Duration::ZERO);
    let r = tb.reserve_n_at(t(0), 1);
    let act = t(0) + Duration::from_millis(250);
    assert_eq!(r.time_to_act(), Some(act));
    assert_eq!(r.delay_from(t(0)), Duration::from_millis(250));
    assert_eq!(r.delay_from(t(1)), Duration::from_millis(150));
    assert_eq!(r.delay_from(act), Duration::ZERO);
    assert_eq!(r.delay_from(Nanos::MAX), Duration::ZERO);
    // delay() reads the bucket's clock (t0).
    assert_eq!(r.delay(), Duration::from_millis(250));
    tb.clock().set(t(1));
    assert_eq!(r.delay(), Duration::from_millis(150));
    // The limit kept by a reservation is the one at reservation time.
    tb.set_limit_at(t(1), limit(8.0));
    assert_eq!(r.limit(), limit(4.0));
    assert_eq!(tb.limit(), limit(8.0));
}

// ---------------------------------------------------------------------------------------
// Edge cases of §1.4

#[test]
fn burst_zero_finite_limit() {
    let tb = new_limiter(10.0, 0);
    assert!(!tb.allow_n_at(t(0), 1));
    assert!(!tb.reserve_n_at(t(5), 1).ok());
    assert_eq!(
        tb.wait_n_blocking(1, None),
        Err(WaitError::ExceedsBurst { n: 1, burst: 0 })
    );
    // n = 0 is fine and acts at once.
    assert!(tb.allow_n_at(t(0), 0));
    let r = tb.reserve_n_at(t(1), 0);
    assert_eq!((r.ok(), r.time_to_act()), (true, Some(t(1))));
    assert_eq!(tb.tokens_at(t(9)), 0.0);
}

#[test]
fn inf_limit_allows_everything_and_touches_nothing() {
    let tb = TokenBucket::from(
        turnstile::TokenBucket::builder(Limit::INF, 0).clock(ManualClock::new(t(0))),
    );
    assert!(tb.allow_n_at(t(0), 5));
    assert!(tb.allow_n_at(t(0), u32::MAX));
    let r = tb.reserve_n_at(t(3), u32::MAX);
    assert_eq!((r.ok(), r.tokens()), (true, u32::MAX));
    assert_eq!(r.time_to_act(), Some(t(3)));
    assert_eq!(r.delay_from(t(0)), Duration::from_nanos(3 * D));
    assert_eq!(r.limit(), Limit::INF);
    r.cancel_at(t(0)); // no-op
                       // TestWaitInf: exceeding the burst is no error with an Inf limit.
    assert_eq!(tb.wait_n_blocking(3, None), Ok(()));
    assert_eq!(tb.tokens_at(t(0)), 0.0);

    // No state touched: a finite limit afterwards sees the original bucket at t0.
    let tb = new_limiter(10.0, 2);
    assert!(tb.allow_n_at(t(0), 2));
    tb.set_limit_at(t(0), Limit::INF);
    for i in 0..5 {
        assert!(tb.allow_n_at(t(0), 7));
        let _ = tb.reserve_n_at(t(i), 9);
    }
    tb.set_limit_at(t(0), limit(10.0));
    assert_eq!(tb.tokens_at(t(0)), 0.0);
    assert_eq!(tb.reserve_at(t(0)).time_to_act(), Some(t(1)));
}

#[test]
fn inf_limit_tokens_at() {
    // (Inf, 5) with 2 stored and last at the zero time: burst whenever t > last.
    let tb = new_limiter(10.0, 5);
    assert!(tb.allow_n_at(Nanos::ZERO, 3));
    tb.set_limit_at(Nanos::ZERO, Limit::INF);
    assert_eq!(tb.tokens_at(t(0)), 5.0);
    assert_eq!(tb.tokens_at(Nanos::new(1)), 5.0);
    assert_eq!(tb.tokens_at(Nanos::ZERO), 2.0);

    // With last = t0: the raw 2 at t0, 5 one nanosecond later.
    let tb = new_limiter(10.0, 5);
    assert!(tb.allow_n_at(t(0), 3));
    tb.set_limit_at(t(0), Limit::INF);
    assert_eq!(tb.tokens_at(t(0)), 2.0);
    assert_eq!(tb.tokens_at(t(0) + Duration::from_nanos(1)), 5.0);
    assert_eq!(tb.tokens_at(Nanos::MAX), 5.0);
}

#[test]
fn set_limit_inf_to_finite() {
    let tb = TokenBucket::from(
        turnstile::TokenBucket::builder(Limit::INF, 5).clock(ManualClock::new(t(0))),
    );
    for _ in 0..3 {
        assert!(tb.allow_n_at(t(0), 5));
    }
    tb.set_limit_at(t(0), limit(10.0));
    assert_eq!(tb.tokens_at(t(0)), 5.0);
    assert!(tb.allow_n_at(t(0), 5));
    assert!(!tb.allow_n_at(t(0), 1));
}

#[test]
fn zero_limit_spends_burst_then_reserves_with_infinite_delay() {
    let tb = new_limiter(0.0, 2);
    assert!(tb.allow_n_at(t(0), 2));
    assert!(!tb.allow_at(t(0)));
    assert!(!tb.allow_at(Nanos::MAX)); // no refill, ever
    assert_eq!(tb.tokens_at(Nanos::MAX), 0.0);

    // Not D4: the twin keeps upstream's OK reservation with an InfDuration delay.
    let r = tb.reserve_at(t(1));
    assert!(r.ok());
    assert_eq!(r.time_to_act(), Some(t(1) + INF_DURATION));
    assert_eq!(r.delay_from(t(1)), INF_DURATION);
    assert_eq!(tb.tokens_at(t(1)), -1.0);

    // Waits with a deadline fail without reserving.
    assert_eq!(
        tb.wait_n_blocking(1, Deadline::at(t(0) + Duration::from_secs(3600))),
        Err(WaitError::WouldExceedDeadline { n: 1 })
    );
    assert_eq!(tb.tokens_at(t(1)), -1.0);
    // Peek and the Limiter trait say "never".
    assert_eq!(tb.peek_n_at(t(1), 1).available_at, None);
    assert_eq!(tb.check_n_at(t(1), 1).unwrap_err().retry_at(), None);
}

#[test]
fn tiny_limit_reserves_with_infinite_delay() {
    // 2c6c5a2 / golang/go#71154: (1/1e-10)·1e9 overflows i64, capped to InfDuration.
    let tb = new_limiter(1e-10, 1);
    assert!(tb.allow_at(t(0)));
    let r = tb.reserve_at(t(0));
    assert!(r.ok());
    assert_eq!(r.delay_from(t(0)), INF_DURATION);
    assert_eq!(r.time_to_act(), Some(t(0) + INF_DURATION));
    assert_eq!(tb.peek_n_at(t(0), 1).available_at, None);
}

#[test]
fn n_zero_in_deficit() {
    // (10, 2) at tokens -1, last t0.
    let tb = new_limiter(10.0, 2);
    assert!(tb.allow_n_at(t(0), 2));
    let _ = run_reserve(&tb, t(0), 1, t(1), true);
    assert_eq!(tb.tokens_at(t(0)), -1.0);
    assert!(!tb.allow_n_at(t(0), 0));
    let r = tb.reserve_n_at(t(0), 0);
    assert!(r.ok());
    assert_eq!(r.time_to_act(), Some(t(1)));
    assert_eq!(r.tokens(), 0);
    // A reservation of 0 tokens cancels to nothing.
    r.cancel_at(t(0));
    assert_eq!(tb.tokens_at(t(0)), -1.0);
    // Out of deficit, n = 0 is allowed at once.
    assert!(tb.allow_n_at(t(1), 0));
    assert_eq!(tb.reserve_n_at(t(1), 0).time_to_act(), Some(t(1)));
}

#[test]
fn cancel_of_zero_token_reservation_is_a_no_op_even_with_last_event_earlier() {
    // `r.tokens == 0` returns early: here the formula alone would restore a token, because
    // cancelling r1 moved lastEvent back before r0's time to act.
    let tb = new_limiter(10.0, 2);
    assert!(tb.allow_n_at(t(0), 2));
    let r1 = run_reserve(&tb, t(0), 1, t(1), true);
    let r0 = run_reserve(&tb, t(0), 0, t(1), true);
    r1.cancel_at(t(0)); // restores 1; lastEvent back to t0
    assert_eq!(tb.tokens_at(t(0)), 0.0);
    r0.cancel_at(t(0));
    assert_eq!(tb.tokens_at(t(0)), 0.0);
}

#[test]
fn cancel_is_a_no_op_while_the_current_limit_is_inf() {
    let tb = new_limiter(10.0, 2);
    let _ = run_reserve(&tb, t(0), 2, t(0), true);
    let r = run_reserve(&tb, t(0), 2, t(2), true);
    tb.set_limit_at(t(0), Limit::INF);
    r.cancel_at(t(0)); // `lim.limit == Inf`: nothing
    tb.set_limit_at(t(0), limit(10.0));
    assert_eq!(tb.tokens_at(t(0)), -2.0);
}

#[test]
fn cancel_moves_last_event_back_only_if_not_before_now() {
    // prevEvent == now: lastEvent moves back, so an older reservation restores fully.
    let tb = new_limiter(10.0, 3);
    assert!(tb.allow_n_at(t(0), 3));
    let r_a = run_reserve(&tb, t(0), 1, t(1), true);
    let r_b = run_reserve(&tb, t(0), 1, t(2), true);
    r_b.cancel_at(t(1)); // prevEvent = t1 = now: lastEvent = t1
    assert_eq!(tb.tokens_at(t(1)), 0.0);
    r_a.cancel_at(t(1)); // restoreTokens = 1 - 10·(t1 - t1) = 1
    assert_eq!(tb.tokens_at(t(1)), 1.0);

    // prevEvent < now: lastEvent stays, so the older reservation restores nothing.
    let tb = new_limiter(10.0, 3);
    assert!(tb.allow_n_at(t(0), 3));
    let r_a = run_reserve(&tb, t(0), 2, t(2), true);
    let r_b = run_reserve(&tb, t(0), 2, t(4), true);
    r_b.cancel_at(t(3)); // -4 + 3 + 2 = 1; prevEvent = t2 < t3: lastEvent stays t4
    assert_eq!(tb.tokens_at(t(3)), 1.0);
    r_a.cancel_at(t(1)); // restoreTokens = 2 - 10·(t4 - t2) = 0: nothing
    assert_eq!(tb.tokens_at(t(1)), 1.0);
}

#[test]
fn fractional_tokens() {
    let tb = new_limiter(10.0, 1);
    assert!(tb.allow_at(t(0)));
    let at = t(0) + Duration::from_millis(60);
    assert!((tb.tokens_at(at) - 0.6).abs() < 1e-12);
    // A deficit of 0.4 tokens is a 40 ms wait: not allowed now.
    assert!(!tb.allow_at(at));
    let p = tb.peek_n_at(at, 1).available_at.unwrap();
    assert!(p.as_u64().abs_diff(t(1).as_u64()) <= 1, "{p:?}");
    let r = tb.reserve_at(at);
    assert_eq!(r.time_to_act(), Some(p));
}

#[test]
fn set_burst_smaller_keeps_stored_tokens_until_read() {
    let tb = new_limiter(10.0, 5);
    tb.set_burst_at(t(0), 2);
    assert_eq!(tb.burst(), 2);
    assert_eq!(tb.tokens_at(t(0)), 2.0);
    assert!(tb.allow_n_at(t(0), 2));
    assert!(!tb.allow_n_at(t(0), 1));

    // SetBurstAt advances at the old burst: with burst 2 -> 5 at t(9), the tokens are
    // capped at 2 first, then grow to 5 from t(9).
    let tb = new_limiter(10.0, 2);
    tb.set_burst_at(t(9), 5);
    assert_eq!(tb.tokens_at(t(9)), 2.0);
    assert_eq!(tb.tokens_at(t(12)), 5.0);
}

#[test]
fn set_limit_advances_at_old_limit() {
    let tb = new_limiter(10.0, 10);
    assert!(tb.allow_n_at(t(0), 10));
    // One token at 10/s by t1, then 1/s.
    tb.set_limit_at(t(1), limit(1.0));
    assert_eq!(tb.tokens_at(t(1)), 1.0);
    assert_eq!(tb.tokens_at(t(11)), 2.0);
    // Backwards: SetLimitAt counts no elapsed time and moves `last` back to t0 with the 1
    // token, so t10 (one second after t0) already sees 2.
    tb.set_limit_at(t(0), limit(1.0));
    assert_eq!(tb.tokens_at(t(0)), 1.0);
    assert_eq!(tb.tokens_at(t(10)), 2.0);
}

#[test]
fn backwards_time_mints_tokens_like_go() {
    // Not D2: a successful call before `last` moves `last` back, so the refill from t0 to t1
    // is counted again on every round (golang/go#56287).
    let tb = new_limiter(10.0, 1);
    let mut granted = 0;
    for _ in 0..10 {
        granted += u32::from(tb.allow_at(t(1)));
        assert!(tb.allow_n_at(t(0), 0));
    }
    // D2 would cap grants at burst + limit·(t1 - t0) = 2.
    assert_eq!(granted, 10);
}

#[test]
fn cancel_of_inf_reservation_uses_go_zero_limit() {
    // Upstream builds the Reservation of an Inf limiter without its `limit`, so a cancel after
    // the limit becomes finite sees Limit(0): restores all its tokens, and moves lastEvent to
    // timeToAct + InfDuration, which blocks restoring any older reservation.
    let tb = new_limiter(10.0, 3);
    let r_b = tb.reserve_n_at(t(0), 2);
    assert_eq!(r_b.time_to_act(), Some(t(0)));
    tb.set_limit_at(t(0), Limit::INF);
    let r = tb.reserve_n_at(t(0), 1);
    assert_eq!(r.limit(), Limit::INF);
    tb.set_limit_at(t(0), limit(10.0));
    assert_eq!(tb.tokens_at(t(0)), 1.0);
    r.cancel_at(t(0));
    assert_eq!(tb.tokens_at(t(0)), 2.0);
    r_b.cancel_at(t(0)); // restoreTokens = 2 - 10·(InfDuration) <= 0
    assert_eq!(tb.tokens_at(t(0)), 2.0);
}

// ---------------------------------------------------------------------------------------
// Peek and the Limiter trait

#[test]
fn peek() {
    let tb = new_limiter(10.0, 2);
    assert_eq!(
        tb.peek_n_at(t(0), 2),
        Peek {
            tokens: 2.0,
            available_at: Some(t(0))
        }
    );
    assert!(tb.allow_n_at(t(0), 2));
    let p = tb.peek_n_at(t(0), 1);
    assert_eq!(p.tokens, 0.0);
    assert_eq!(p.available_at, Some(t(1)));
    assert_eq!(tb.peek_n_at(t(0), 2).available_at, Some(t(2)));
    assert_eq!(tb.peek_n_at(t(0), 3).available_at, None); // n > burst
                                                          // Peeking takes nothing.
    assert_eq!(tb.peek_n_at(t(0), 1).available_at, Some(t(1)));
    assert_eq!(tb.tokens_at(t(0)), 0.0);
    // In deficit: tokens are negative.
    let _ = tb.reserve_at(t(0));
    assert_eq!(tb.peek_n_at(t(0), 1).tokens, -1.0);
    assert_eq!(tb.peek_n_at(t(0), 1).available_at, Some(t(2)));
    assert_eq!(tb.peek_n_at(t(0), 0).available_at, Some(t(1)));
    // Later, enough: now.
    assert_eq!(tb.peek_n_at(t(5), 2).available_at, Some(t(5)));

    // Inf: now, whatever n and burst.
    let tb = TokenBucket::from(
        turnstile::TokenBucket::builder(Limit::INF, 0).clock(ManualClock::new(t(0))),
    );
    assert_eq!(tb.peek_n_at(t(3), u32::MAX).available_at, Some(t(3)));
    // The plain form reads the clock.
    assert_eq!(tb.peek_n(1).available_at, Some(t(0)));
}

#[test]
fn limiter_trait() {
    let tb = new_limiter(10.0, 1);
    assert_eq!(tb.check_n_at(t(0), 1), Ok(()));
    let denied = tb.check_n_at(t(0), 1).unwrap_err();
    assert_eq!(denied.checked_at(), t(0));
    assert_eq!(denied.retry_at(), Some(t(1)));
    assert_eq!(denied.retry_after(), Some(Duration::from_nanos(D)));
    // Denial changed nothing.
    assert_eq!(tb.tokens_at(t(0)), 0.0);
    assert_eq!(tb.check_n_at(t(0), 2).unwrap_err().retry_at(), None);
    assert_eq!(tb.check_n_at(t(1), 1), Ok(()));
    // A wait of a single nanosecond is still a denial (AllowN uses maxFutureReserve 0).
    let fast = new_limiter(1e9, 1);
    assert_eq!(fast.check_n_at(t(0), 1), Ok(()));
    let denied = fast.check_n_at(t(0), 1).unwrap_err();
    assert_eq!(denied.retry_after(), Some(Duration::from_nanos(1)));
    // The plain forms read the clock (t0 on the manual clock).
    assert_eq!(Limiter::now(&tb), t(0));
    tb.clock().set(t(2));
    assert_eq!(tb.check(), Ok(()));
    assert!(tb.check().is_err());
}

#[test]
fn plain_forms_read_the_clock() {
    let tb = new_limiter(10.0, 2);
    assert!(tb.allow());
    assert!(tb.allow_n(1));
    assert!(!tb.allow());
    assert_eq!(tb.tokens(), 0.0);
    tb.clock().set(t(1));
    assert_eq!(tb.tokens(), 1.0);
    let r = tb.reserve_n(2);
    assert_eq!(r.time_to_act(), Some(t(2)));
    assert_eq!(r.delay(), Duration::from_nanos(D));
    r.cancel(); // at t1
    assert_eq!(tb.tokens(), 1.0);
    assert!(!tb.try_reserve_n(2, Duration::from_nanos(D - 1)).ok());
    assert_eq!(tb.reserve().time_to_act(), Some(t(1)));
    tb.set_limit(limit(20.0));
    tb.set_burst(4);
    assert_eq!((tb.limit(), tb.burst()), (limit(20.0), 4));
    assert_eq!(tb.tokens(), 0.0);
}

// ---------------------------------------------------------------------------------------
// Waits (§1.7): the blocking form on paths that do not sleep

#[test]
fn wait_simple_blocking() {
    // TestWaitSimple, minus "act-later" (which sleeps; see the async tests).
    let tb = new_limiter(10.0, 3);
    // already-cancelled: a deadline that has passed (deadline <= now).
    assert_eq!(
        tb.wait_n_blocking(1, Deadline::at(t(0))),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    assert_eq!(
        tb.wait_n_blocking(1, Deadline::at(Nanos::ZERO)),
        Err(WaitError::DeadlinePassed { n: 1 })
    );
    assert_eq!(tb.tokens_at(t(0)), 3.0);
    // exceed-burst-error
    assert_eq!(
        tb.wait_n_blocking(4, None),
        Err(WaitError::ExceedsBurst { n: 4, burst: 3 })
    );
    // act-now
    assert_eq!(tb.wait_n_blocking(2, None), Ok(()));
    assert_eq!(tb.tokens_at(t(0)), 1.0);
}

#[test]
fn wait_checks_in_upstream_order() {
    let tb = new_limiter(10.0, 3);
    // The burst check comes before the deadline check.
    assert_eq!(
        tb.wait_n_blocking(4, Deadline::at(t(0))),
        Err(WaitError::ExceedsBurst { n: 4, burst: 3 })
    );
    // With an Inf limit the burst check is skipped, and the deadline is checked.
    let tb = TokenBucket::from(
        turnstile::TokenBucket::builder(Limit::INF, 3).clock(ManualClock::new(t(0))),
    );
    assert_eq!(
        tb.wait_n_blocking(4, Deadline::at(t(0))),
        Err(WaitError::DeadlinePassed { n: 4 })
    );
    assert_eq!(tb.wait_n_blocking(4, Deadline::at(t(1))), Ok(()));
}

#[test]
fn wait_timeout_blocking() {
    // TestWaitTimeout: deadline d from now.
    let tb = new_limiter(10.0, 3);
    assert_eq!(tb.wait_n_blocking(2, Deadline::at(t(1))), Ok(()));
    assert_eq!(
        tb.wait_n_blocking(3, Deadline::at(t(1))),
        Err(WaitError::WouldExceedDeadline { n: 3 })
    );
    // Nothing was reserved.
    assert_eq!(tb.tokens_at(t(0)), 1.0);
    // A max wait exactly equal to the wait is enough (`waitDuration <= maxFutureReserve`).
    assert!(!tb
        .try_reserve_n_at(t(0), 3, Duration::from_nanos(2 * D - 1))
        .ok());
    let r = tb.try_reserve_n_at(t(0), 3, Duration::from_nanos(2 * D));
    assert_eq!(r.time_to_act(), Some(t(2)));
}

#[test]
fn wait_blocking_reserves_then_sleeps() {
    // The sleeping path, with a delay of 1 ns: the tokens stay reserved afterwards.
    let tb = TokenBucket::from(
        turnstile::TokenBucket::builder(limit(1e9), 1).clock(ManualClock::new(t(0))),
    );
    assert_eq!(tb.wait_n_blocking(1, None), Ok(()));
    assert!(!tb.try_reserve_n_at(t(0), 1, Duration::ZERO).ok());
    assert_eq!(tb.wait_n_blocking(1, None), Ok(()));
    assert_eq!(tb.tokens_at(t(0)), -1.0);
}

// ---------------------------------------------------------------------------------------
// No panics at the extremes (debug assertions are on in tests)

#[test]
fn extremes_do_not_panic() {
    let limits = [
        Limit::ZERO,
        limit(1e-300),
        limit(1e-10),
        limit(1.0),
        limit(1e300),
        limit(f64::MAX / 2.0),
        Limit::INF,
    ];
    let times = [
        Nanos::ZERO,
        Nanos::new(1),
        t(0),
        Nanos::new(i64::MAX as u64),
        Nanos::new(u64::MAX - 1),
        Nanos::MAX,
    ];
    let ns = [0, 1, u32::MAX - 1, u32::MAX];
    let waits = [Duration::ZERO, INF_DURATION, Duration::MAX];
    for &l in &limits {
        for &burst in &[0, 1, u32::MAX] {
            let tb = TokenBucket::from(
                turnstile::TokenBucket::builder(l, burst).clock(ManualClock::new(Nanos::MAX)),
            );
            let mut held = Vec::new();
            for (i, &now) in times.iter().chain(times.iter().rev()).enumerate() {
                for &n in &ns {
                    let _ = tb.allow_n_at(now, n);
                    let _ = tb.tokens_at(now);
                    let p = tb.peek_n_at(now, n);
                    assert!(!p.tokens.is_nan());
                    let _ = tb.check_n_at(now, n);
                    for &w in &waits {
                        let r = tb.try_reserve_n_at(now, n, w);
                        let _ = (r.delay_from(now), r.delay_from(Nanos::ZERO), r.delay());
                        held.push(r);
                    }
                    let r = tb.reserve_n_at(now, n);
                    let _ = r.time_to_act();
                    held.push(r);
                }
                if i % 3 == 0 {
                    tb.set_limit_at(now, limits[i % limits.len()]);
                    tb.set_limit_at(now, l);
                }
                if i % 4 == 1 {
                    tb.set_burst_at(now, u32::MAX);
                    tb.set_burst_at(now, burst);
                }
                // Cancel some of them, at a spread of times.
                while held.len() > 8 {
                    let r = held.swap_remove(0);
                    r.cancel_at(times[held.len() % times.len()]);
                }
                assert!(!tb.tokens_at(now).is_nan());
            }
            for r in held.drain(..) {
                r.cancel_at(Nanos::ZERO);
            }
            // Waits that do not sleep: the clock reads Nanos::MAX, so every deadline passed.
            let _ = tb.wait_n_blocking(u32::MAX, Deadline::at(Nanos::ZERO));
            let _ = tb.wait_n_blocking(0, Deadline::at(Nanos::MAX));
            let _ = format!("{tb:?}");
        }
    }
}

#[test]
fn debug_output() {
    let tb = new_limiter(10.0, 2);
    let s = format!("{tb:?}");
    assert!(s.contains("TokenBucket") && s.contains("burst: 2"), "{s}");
    let r = tb.reserve_at(t(0));
    assert!(format!("{r:?}").contains("ok: true"));
}

// ---------------------------------------------------------------------------------------
// Async waits (feature "tokio"), on tokio's paused clock: no real sleeping.

#[cfg(feature = "tokio")]
mod wait_async {
    use super::*;
    use turnstile::Clock;

    #[tokio::test(start_paused = true)]
    async fn wait_simple() {
        // TestWaitSimple.
        let tb = new_limiter(10.0, 3);
        assert_eq!(
            tb.wait_n(1, Deadline::at(t(0))).await,
            Err(WaitError::DeadlinePassed { n: 1 })
        );
        assert_eq!(
            tb.wait_n(4, None).await,
            Err(WaitError::ExceedsBurst { n: 4, burst: 3 })
        );
        let start = tokio::time::Instant::now();
        assert_eq!(tb.wait_n(2, None).await, Ok(())); // act-now
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(tb.wait_n(3, None).await, Ok(())); // act-later: 2 d
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_nanos(2 * D) && waited < Duration::from_nanos(3 * D),
            "{waited:?}"
        );
        // The tokens stay spent.
        assert_eq!(tb.tokens_at(t(2)), 0.0);
    }

    /// Polls a future once with a waker that does nothing, outside any runtime.
    fn poll_once<F: std::future::Future>(f: F) -> std::task::Poll<F::Output> {
        use std::task::{Context, RawWaker, RawWakerVTable, Waker};
        fn clone(_: *const ()) -> RawWaker {
            RawWaker::new(std::ptr::null(), &VTABLE)
        }
        fn noop(_: *const ()) {}
        static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
        // SAFETY: the vtable's functions ignore the data pointer.
        let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
        let mut f = std::pin::pin!(f);
        f.as_mut().poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn no_timer_when_there_is_no_delay() {
        // fbb02b2: a zero delay returns at once, with no timer, so it completes even
        // outside a tokio runtime (where creating a timer would panic).
        let tb = new_limiter(10.0, 3);
        assert_eq!(
            poll_once(tb.wait_n(2, None)),
            std::task::Poll::Ready(Ok(()))
        );
        assert_eq!(
            poll_once(tb.wait_n(4, None)),
            std::task::Poll::Ready(Err(WaitError::ExceedsBurst { n: 4, burst: 3 }))
        );
        assert_eq!(tb.tokens_at(t(0)), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_cancel() {
        // TestWaitCancel: the wait is abandoned after d; the reservation is cancelled at the
        // clock's time then and its 3 tokens come back, leaving 2.
        let tb = new_limiter(10.0, 3);
        assert_eq!(tb.wait_n(2, None).await, Ok(())); // tokens = 1
        let clock = tb.clock().clone();
        tokio::select! {
            _ = tb.wait_n(3, None) => panic!("the wait should have been abandoned"),
            _ = async {
                tokio::time::sleep(Duration::from_nanos(D)).await;
                clock.advance(Duration::from_nanos(D));
            } => {}
        }
        assert_eq!(tb.tokens_at(t(1)), 2.0);
        let start = tokio::time::Instant::now();
        assert_eq!(tb.wait_n(2, None).await, Ok(())); // act-now-after-cancel
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_to_the_end_keeps_the_tokens() {
        let tb = new_limiter(10.0, 1);
        assert!(tb.allow_at(t(0)));
        let clock = tb.clock().clone();
        assert_eq!(tb.wait_n(1, None).await, Ok(()));
        // No cancel on completion: the deficit stays.
        assert_eq!(clock.now(), t(0));
        assert_eq!(tb.tokens_at(t(0)), -1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_timeout() {
        // TestWaitTimeout.
        let tb = new_limiter(10.0, 3);
        assert_eq!(tb.wait_n(2, Deadline::at(t(1))).await, Ok(()));
        assert_eq!(
            tb.wait_n(3, Deadline::at(t(1))).await,
            Err(WaitError::WouldExceedDeadline { n: 3 })
        );
        assert_eq!(tb.tokens_at(t(0)), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_inf() {
        // TestWaitInf.
        let tb = TokenBucket::from(
            turnstile::TokenBucket::builder(Limit::INF, 0).clock(ManualClock::new(t(0))),
        );
        assert_eq!(tb.wait_n(3, None).await, Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_limit_wait_blocks_until_dropped() {
        // Not D4: with limit 0 and no deadline the wait never ends; dropping it cancels.
        let tb = new_limiter(0.0, 1);
        assert!(tb.allow_at(t(0)));
        let res = tokio::time::timeout(Duration::from_secs(3600), tb.wait_n(1, None)).await;
        assert!(res.is_err(), "the wait should still be pending");
        assert_eq!(tb.tokens_at(t(0)), 0.0);
        // And with a deadline it fails at once.
        assert_eq!(
            tb.wait_n(1, Deadline::at(t(1))).await,
            Err(WaitError::WouldExceedDeadline { n: 1 })
        );
    }
}
