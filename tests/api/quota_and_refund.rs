//! `Limiter::quota_at` (the IETF RateLimit fields) and `Limiter::refund_n_at` (give back a
//! grant that a second, layered limit refused): exact values at chosen times, on each limiter
//! and its mutex twin; a differential property test (random check / refund / time steps on the
//! lock-free limiter and its twin agree, and a check refunded at once leaves `quota_at` as it
//! was); and a forced-interleaving stress test of the token bucket's refund CAS.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use turnstile::{
    reference, Clock, FixedWindow, LeakyBucket, LeakyMeter, Limit, Limiter, ManualClock, Nanos,
    QuotaStatus, SlidingWindow, SmoothBursty, TokenBucket,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn ms(m: u64) -> Nanos {
    Nanos::new(m * MS)
}

fn qs(quota: u64, window: Duration, remaining: u64, reset: Duration) -> QuotaStatus {
    QuotaStatus {
        quota,
        window,
        remaining,
        reset,
    }
}

fn per_second(r: f64) -> Limit {
    Limit::per_second(r).unwrap()
}

/// The lock-free bucket and its twin, on manual clocks.
fn buckets(
    limit: Limit,
    burst: u32,
) -> (
    TokenBucket<ManualClock>,
    reference::TokenBucket<ManualClock>,
) {
    (
        TokenBucket::builder(limit, burst)
            .clock(ManualClock::default())
            .build(),
        reference::TokenBucket::from(
            turnstile::TokenBucket::builder(limit, burst).clock(ManualClock::default()),
        ),
    )
}

/// Runs `f` on the lock-free limiter and on the twin and asserts the two agree.
macro_rules! both {
    ($a:expr, $b:expr, |$l:ident| $body:expr) => {{
        let x = {
            let $l = &$a;
            $body
        };
        let y = {
            let $l = &$b;
            $body
        };
        assert_eq!(x, y, "lock-free vs twin: {}", stringify!($body));
        x
    }};
}

// ---- TokenBucket -----------------------------------------------------------------------------

#[test]
fn token_bucket_quota_fields() {
    let (a, b) = buckets(per_second(10.0), 5);
    let full = qs(5, Duration::from_millis(500), 5, Duration::ZERO);
    assert_eq!(both!(a, b, |l| l.quota_at(Nanos::ZERO)), Some(full));
    assert!(both!(a, b, |l| l.check_n_at(Nanos::ZERO, 5).is_ok()));
    // 2.5 tokens at 250 ms: 2 whole ones remain, full again at 500 ms.
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(250))),
        Some(qs(
            5,
            Duration::from_millis(500),
            2,
            Duration::from_millis(250)
        ))
    );
    assert_eq!(both!(a, b, |l| l.quota_at(ms(500))), Some(full));
    assert_eq!(both!(a, b, |l| l.quota_at(ms(9_000))), Some(full));
}

#[test]
fn token_bucket_reset_and_window_round_up() {
    // 3 tokens a second: one token is 333 333 333.3 ns, so 333 333 334 ns is the first whole
    // nanosecond at which the bucket is full again; 333 333 333 would send a client back early.
    let (a, b) = buckets(per_second(3.0), 1);
    assert!(both!(a, b, |l| l.check_n_at(Nanos::ZERO, 1).is_ok()));
    let s = both!(a, b, |l| l.quota_at(Nanos::ZERO)).unwrap();
    assert_eq!(s.reset, Duration::from_nanos(333_333_334));
    assert_eq!(s.window, Duration::from_nanos(333_333_334));
    assert_eq!(s.remaining, 0);
    assert_eq!((s.reset_secs(), s.window_secs()), (1, 1));
    // And the reset is right: full at that nanosecond, not one before.
    assert!(!a.is_full_at(Nanos::new(333_333_333)));
    assert!(a.is_full_at(Nanos::new(333_333_334)));
}

trait Full {
    fn is_full_at(&self, now: Nanos) -> bool;
}

impl Full for TokenBucket<ManualClock> {
    fn is_full_at(&self, now: Nanos) -> bool {
        self.tokens_at(now) == f64::from(self.burst())
    }
}

#[test]
fn token_bucket_in_debt() {
    let (a, b) = buckets(per_second(10.0), 2);
    assert!(both!(a, b, |l| l.check_n_at(Nanos::ZERO, 2).is_ok()));
    // Reserve one more: the bucket owes a token until 100 ms.
    assert!(a.reserve_n_at(Nanos::ZERO, 1).ok());
    assert!(b.reserve_n_at(Nanos::ZERO, 1).ok());
    // -1 token: nothing remains, full at 300 ms.
    assert_eq!(
        both!(a, b, |l| l.quota_at(Nanos::ZERO)),
        Some(qs(
            2,
            Duration::from_millis(200),
            0,
            Duration::from_millis(300)
        ))
    );
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(150))),
        Some(qs(
            2,
            Duration::from_millis(200),
            0,
            Duration::from_millis(150)
        ))
    );
}

#[test]
fn token_bucket_infinite_and_zero_limits() {
    let (a, b) = buckets(Limit::INF, 3);
    assert!(both!(a, b, |l| l.check_n_at(Nanos::ZERO, 100).is_ok()));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(1))),
        Some(qs(3, Duration::ZERO, 3, Duration::ZERO))
    );
    assert!(both!(a, b, |l| l.refund_n_at(ms(1), 100)));
    assert_eq!(a.tokens_at(ms(1)), 3.0);

    let (a, b) = buckets(Limit::ZERO, 3);
    assert_eq!(
        both!(a, b, |l| l.quota_at(Nanos::ZERO)),
        Some(qs(3, Duration::MAX, 3, Duration::ZERO))
    );
    assert!(both!(a, b, |l| l.check_n_at(Nanos::ZERO, 1).is_ok()));
    let never = qs(3, Duration::MAX, 2, Duration::MAX);
    assert_eq!(both!(a, b, |l| l.quota_at(ms(5_000))), Some(never));
    assert_eq!(
        (never.window_secs(), never.reset_secs()),
        (u64::MAX, u64::MAX)
    );
    assert!(both!(a, b, |l| l.refund_n_at(ms(5_000), 1)));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(5_000))),
        Some(qs(3, Duration::MAX, 3, Duration::ZERO))
    );
}

#[test]
fn token_bucket_refund_never_exceeds_burst() {
    let (a, b) = buckets(per_second(1.0), 3);
    assert!(both!(a, b, |l| l.check_n_at(Nanos::ZERO, 2).is_ok()));
    // 1.5 s later the bucket holds 2.5; giving 2 back fills it, no further.
    assert!(both!(a, b, |l| l.refund_n_at(ms(1_500), 2)));
    assert_eq!(a.tokens_at(ms(1_500)), 3.0);
    assert_eq!(b.tokens_at(ms(1_500)), 3.0);
    // Capped at the burst *at the refund's reading*: a reading older than the refund finds
    // the bucket as it was then plus nothing, 2.5 tokens at 1 s, not the 3 an uncapped refund
    // (one that only relied on later reads capping) would show it (deviation D2: an earlier
    // time never creates tokens; the twin keeps rate.go's `last` moving back, so not it).
    assert_eq!(a.tokens_at(ms(1_000)), 2.5);
    assert_eq!(a.quota_at(ms(1_000)).unwrap().remaining, 2);
    // A refund into a full bucket does nothing.
    assert!(both!(a, b, |l| l.refund_n_at(ms(1_500), 3)));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(1_500))),
        Some(qs(3, Duration::from_secs(3), 3, Duration::ZERO))
    );
    assert!(both!(a, b, |l| l.check_n_at(ms(1_500), 3).is_ok()));
    assert!(both!(a, b, |l| l.check_n_at(ms(1_500), 1).is_err()));
}

#[test]
fn token_bucket_check_then_refund_is_as_if_not_made() {
    let (a, b) = buckets(per_second(4.0), 4);
    assert!(both!(a, b, |l| l.check_n_at(Nanos::ZERO, 3).is_ok()));
    let t = ms(100); // 1.4 tokens
    let before = both!(a, b, |l| l.quota_at(t));
    assert!(both!(a, b, |l| l.check_n_at(t, 1).is_ok()));
    assert_ne!(both!(a, b, |l| l.quota_at(t)), before);
    assert!(both!(a, b, |l| l.refund_n_at(t, 1)));
    assert_eq!(both!(a, b, |l| l.quota_at(t)), before);
    // A refund at a later reading than the grant: the refill since is kept.
    assert!(both!(a, b, |l| l.check_n_at(t, 1).is_ok())); // 0.4 left
    assert!(both!(a, b, |l| l.refund_n_at(ms(350), 1))); // 0.4 + 1 + 1 = 2.4
    assert!((a.tokens_at(ms(350)) - 2.4).abs() < 1e-6);
    assert!((b.tokens_at(ms(350)) - 2.4).abs() < 1e-6);
}

#[test]
fn leaky_meter_forwards_to_its_bucket() {
    let m = LeakyMeter::builder(4, per_second(2.0))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(m.check_n_at(Nanos::ZERO, 3).is_ok());
    assert_eq!(
        m.quota_at(ms(500)),
        Some(qs(4, Duration::from_secs(2), 2, Duration::from_secs(1)))
    );
    assert!(m.refund_n_at(ms(500), 3));
    assert_eq!(
        m.quota_at(ms(500)),
        Some(qs(4, Duration::from_secs(2), 4, Duration::ZERO))
    );
}

#[test]
fn limiters_that_cannot_say_keep_the_defaults() {
    let lb = LeakyBucket::builder(10)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(lb.check_n_at(Nanos::ZERO, 1).is_ok());
    assert_eq!(lb.quota_at(Nanos::ZERO), None);
    assert!(!lb.refund_n_at(Nanos::ZERO, 1));
    let sb = SmoothBursty::builder(10.0)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(sb.check_n_at(Nanos::ZERO, 1).is_ok());
    assert_eq!(sb.quota_at(Nanos::ZERO), None);
    assert!(!sb.refund_n_at(Nanos::ZERO, 1));
}

// ---- FixedWindow -----------------------------------------------------------------------------

fn windows(
    quota: u32,
    period: Duration,
    aligned: bool,
) -> (
    FixedWindow<ManualClock>,
    reference::FixedWindow<ManualClock>,
) {
    let a = FixedWindow::builder(quota, period).clock(ManualClock::default());
    let b = FixedWindow::builder(quota, period).clock(ManualClock::default());
    if aligned {
        (
            a.align_utc().unix_origin(Duration::ZERO).build().unwrap(),
            reference::FixedWindow::try_from(b.align_utc().unix_origin(Duration::ZERO)).unwrap(),
        )
    } else {
        (
            a.build().unwrap(),
            reference::FixedWindow::try_from(b).unwrap(),
        )
    }
}

#[test]
fn fixed_window_quota_fields() {
    let (a, b) = windows(5, Duration::from_secs(60), false);
    let p = Duration::from_secs(60);
    // No window open: the whole quota, reset a period from now (the window a request opens).
    assert_eq!(both!(a, b, |l| l.quota_at(ms(7))), Some(qs(5, p, 5, p)));
    assert!(both!(a, b, |l| l.check_n_at(ms(1_000), 2).is_ok()));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(16_000))),
        Some(qs(5, p, 3, Duration::from_secs(45)))
    );
    // Over the quota (the twin counts the refused call; remaining is 0 either way).
    assert!(both!(a, b, |l| l.check_n_at(ms(2_000), 3).is_ok()));
    assert!(both!(a, b, |l| l.check_n_at(ms(2_000), 1).is_err()));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(2_000))),
        Some(qs(5, p, 0, Duration::from_secs(59)))
    );
    // The window ends at 61 s.
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(61_000))),
        Some(qs(5, p, 5, p))
    );
}

#[test]
fn fixed_window_refund_in_the_same_window() {
    let (a, b) = windows(3, Duration::from_secs(1), false);
    assert!(both!(a, b, |l| l.check_n_at(ms(100), 1).is_ok())); // opens [100, 1100)
    assert!(both!(a, b, |l| l.check_n_at(ms(200), 2).is_ok()));
    assert!(both!(a, b, |l| l.check_n_at(ms(300), 1).is_err())); // twin counter 4
    let before = both!(a, b, |l| l.quota_at(ms(300)));
    assert!(both!(a, b, |l| l.refund_n_at(ms(200), 2)));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(300))),
        Some(qs(3, Duration::from_secs(1), 2, Duration::from_millis(800)))
    );
    assert_ne!(both!(a, b, |l| l.quota_at(ms(300))), before);
    // Never more than was counted.
    assert!(!both!(a, b, |l| l.refund_n_at(ms(200), 2)));
}

#[test]
fn fixed_window_refund_of_the_opening_grant() {
    let p = Duration::from_secs(1);
    // Alone in its window: the window goes, as if never opened.
    let (a, b) = windows(1, p, false);
    assert!(both!(a, b, |l| l.check_n_at(ms(100), 1).is_ok()));
    assert!(both!(a, b, |l| l.refund_n_at(ms(100), 1)));
    // Without the grant a request at 900 ms opens [900, 1900): the one at 1000 ms is refused.
    assert!(both!(a, b, |l| l.check_n_at(ms(900), 1).is_ok()));
    assert!(both!(a, b, |l| l.check_n_at(ms(1_000), 1).is_err()));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(1_000))),
        Some(qs(1, p, 0, Duration::from_millis(900)))
    );

    // With another grant in it, opened at the refund's reading: which one opened it is
    // unknown, so nothing is given back.
    let (a, b) = windows(2, p, false);
    assert!(both!(a, b, |l| l.check_n_at(ms(100), 1).is_ok()));
    assert!(both!(a, b, |l| l.check_n_at(ms(100), 1).is_ok()));
    assert!(!both!(a, b, |l| l.refund_n_at(ms(100), 1)));
    assert_eq!(both!(a, b, |l| l.quota_at(ms(100))).unwrap().remaining, 0);

    // Aligned windows end on boundaries whoever opens them: the count is all there is.
    let (a, b) = windows(2, p, true);
    assert!(both!(a, b, |l| l.check_n_at(ms(100), 1).is_ok()));
    assert!(both!(a, b, |l| l.check_n_at(ms(100), 1).is_ok()));
    assert!(both!(a, b, |l| l.refund_n_at(ms(100), 1)));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(100))),
        Some(qs(2, p, 1, Duration::from_millis(900)))
    );
}

#[test]
fn fixed_window_refund_after_the_window_rolled_over() {
    let p = Duration::from_secs(1);
    // Aligned: the grant's window [0, 1 s) is over and left nothing: true, nothing to do.
    let (a, b) = windows(2, p, true);
    assert!(both!(a, b, |l| l.check_n_at(ms(100), 2).is_ok()));
    assert!(both!(a, b, |l| l.refund_n_at(ms(1_200), 2)));
    assert_eq!(both!(a, b, |l| l.quota_at(ms(1_200))).unwrap().remaining, 2);
    // A newer window is open at a later reading; the grant's reading finds it started after:
    // which window holds the grant is unknown.
    assert!(both!(a, b, |l| l.check_n_at(ms(1_300), 1).is_ok()));
    assert!(!both!(a, b, |l| l.refund_n_at(ms(100), 1)));
    assert_eq!(both!(a, b, |l| l.quota_at(ms(1_300))).unwrap().remaining, 1);

    // Unaligned: without the grant a later request's window might still be open: false.
    let (a, b) = windows(2, p, false);
    assert!(both!(a, b, |l| l.check_n_at(ms(100), 1).is_ok())); // [100, 1100)
    assert!(both!(a, b, |l| l.check_n_at(ms(600), 1).is_ok()));
    assert!(!both!(a, b, |l| l.refund_n_at(ms(1_200), 1)));
}

// ---- SlidingWindow ---------------------------------------------------------------------------

fn sliding(
    quota: u32,
    period: Duration,
) -> (
    SlidingWindow<ManualClock>,
    reference::SlidingWindow<ManualClock>,
) {
    (
        SlidingWindow::builder(quota, period)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
        reference::SlidingWindow::try_from(
            turnstile::SlidingWindow::builder(quota, period).clock(ManualClock::default()),
        )
        .unwrap(),
    )
}

#[test]
fn sliding_window_quota_and_refund() {
    let p = Duration::from_secs(1);
    let (a, b) = sliding(5, p);
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(100))),
        Some(qs(5, p, 5, Duration::ZERO))
    );
    assert!(both!(a, b, |l| l.check_n_at(ms(200), 5).is_ok()));
    // In window 0 the 5 weigh until the end of window 1.
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(200))),
        Some(qs(5, p, 0, Duration::from_millis(1_800)))
    );
    // At 1.5 s they weigh 2.5: 2 remain; gone at 2 s.
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(1_500))),
        Some(qs(5, p, 2, Duration::from_millis(500)))
    );
    // A grant in window 1, refunded at its reading: as if not made.
    let before = both!(a, b, |l| l.quota_at(ms(1_500)));
    assert!(both!(a, b, |l| l.check_n_at(ms(1_500), 2).is_ok()));
    assert!(both!(a, b, |l| l.refund_n_at(ms(1_500), 2)));
    assert_eq!(both!(a, b, |l| l.quota_at(ms(1_500))), before);
    // The 5 of window 0, refunded at their reading after window 1 opened: they are `prev`
    // now, or were a stale reading counted in window 1: unknown.
    assert!(!both!(a, b, |l| l.refund_n_at(ms(200), 5)));
    // More than window 1 holds: never.
    assert!(both!(a, b, |l| l.check_n_at(ms(1_600), 1).is_ok()));
    assert!(!both!(a, b, |l| l.refund_n_at(ms(1_600), 2)));
    // Two windows on, window 1's grant weighs nothing: true, nothing to do.
    assert!(both!(a, b, |l| l.refund_n_at(ms(3_000), 1)));
    assert_eq!(
        both!(a, b, |l| l.quota_at(ms(3_000))),
        Some(qs(5, p, 5, Duration::ZERO))
    );
}

// ---- Keyed and KeyedTokenBucket --------------------------------------------------------------

#[cfg(feature = "keyed")]
#[test]
fn keyed_forwards_and_builds_fresh_status() {
    use turnstile::Keyed;
    let k = Keyed::builder(|_: &u8| {
        TokenBucket::builder(per_second(10.0), 4)
            .clock(ManualClock::default())
            .build()
    })
    .clock(ManualClock::default())
    .build()
    .unwrap();
    let fresh = qs(4, Duration::from_millis(400), 4, Duration::ZERO);
    assert_eq!(k.quota_at(&1, ms(10)), Some(fresh));
    assert!(!k.contains(&1));
    assert!(!k.refund_n_at(&1, ms(10), 1)); // no limiter: nothing to refund into
    assert!(k.check_n_at(&1, ms(10), 4).is_ok());
    assert_eq!(
        k.quota_at(&1, ms(60)),
        Some(qs(
            4,
            Duration::from_millis(400),
            0,
            Duration::from_millis(350)
        ))
    );
    assert!(k.refund_n_at(&1, ms(60), 4));
    assert_eq!(k.quota_at(&1, ms(60)), Some(fresh));
}

#[cfg(feature = "keyed")]
#[test]
fn keyed_bucket_matches_token_bucket() {
    use turnstile::keyed::token_bucket::KeyedTokenBucket;
    let k = KeyedTokenBucket::<u8, _, _>::builder(per_second(3.0), 2)
        .quota(Limit::ZERO, 2)
        .quota(Limit::INF, 2)
        .classify(|key: &u8| usize::from(*key % 3))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let tb = TokenBucket::builder(per_second(3.0), 2)
        .clock(ManualClock::default())
        .build();
    for t in [0, 100, 333, 400, 700, 2_000] {
        let now = ms(t);
        assert_eq!(k.quota_at(&0, now), tb.quota_at(now), "at {t} ms");
        let (a, b) = (
            k.check_n_at(&0, now, 1).is_ok(),
            tb.check_n_at(now, 1).is_ok(),
        );
        assert_eq!(a, b, "check at {t} ms");
        assert_eq!(
            k.quota_at(&0, now),
            tb.quota_at(now),
            "after the check at {t} ms"
        );
    }
    assert!(k.refund_n_at(&0, ms(2_000), 2) && tb.refund_n_at(ms(2_000), 2));
    assert_eq!(k.quota_at(&0, ms(2_000)), tb.quota_at(ms(2_000)));
    assert_eq!(k.quota_at(&0, ms(2_000)).unwrap().remaining, 2); // never past the burst
                                                                 // Capped at the refund's reading: an older reading does not see the refund fill past it.
    assert!(k.check_n_at(&3, ms(3_000), 2).is_ok() && tb.check_n_at(ms(3_000), 2).is_ok());
    assert!(k.refund_n_at(&3, ms(3_500), 2) && tb.refund_n_at(ms(3_500), 2));
    assert_eq!(k.quota_at(&3, ms(3_400)), tb.quota_at(ms(3_400)));
    assert_eq!(k.quota_at(&3, ms(3_400)).unwrap().remaining, 1);
    // Zero limit (key 1) and infinite limit (key 2).
    assert!(k.check_n_at(&1, Nanos::ZERO, 1).is_ok());
    assert_eq!(
        k.quota_at(&1, ms(9)),
        Some(qs(2, Duration::MAX, 1, Duration::MAX))
    );
    assert!(k.refund_n_at(&1, ms(9), 1));
    assert_eq!(
        k.quota_at(&1, ms(9)),
        Some(qs(2, Duration::MAX, 2, Duration::ZERO))
    );
    assert_eq!(
        k.quota_at(&2, ms(9)),
        Some(qs(2, Duration::ZERO, 2, Duration::ZERO))
    );
    // A key the map does not hold: a fresh bucket of its class.
    assert_eq!(
        k.quota_at(&4, ms(9)),
        Some(qs(2, Duration::MAX, 2, Duration::ZERO))
    );
}

// ---- differential property test ---------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    /// Check `n`; if granted, keep it (it may be refunded later).
    Check {
        n: u32,
    },
    /// Check `n` and, if granted, refund it at once: `quota_at` must be as before when the
    /// refund says it was exact.
    CheckRefund {
        n: u32,
    },
    /// Refund a kept grant at the current reading.
    Refund {
        idx: usize,
    },
    Quota,
}

fn op() -> impl Strategy<Value = Op> {
    let n = prop_oneof![6 => 0u32..4, 2 => 0u32..12];
    prop_oneof![
        4 => n.clone().prop_map(|n| Op::Check { n }),
        4 => n.prop_map(|n| Op::CheckRefund { n }),
        2 => any::<usize>().prop_map(|idx| Op::Refund { idx }),
        1 => Just(Op::Quota),
    ]
}

/// A step forward of the clock, in ns or in fractions of `unit` (a token, a period).
fn step() -> impl Strategy<Value = (u64, f64)> {
    prop_oneof![3 => Just((0, 0.0)), 1 => (1u64..5_000).prop_map(|n| (n, 0.0)), 4 => (0.0f64..3.0).prop_map(|f| (0, f))]
}

fn ops() -> impl Strategy<Value = Vec<((u64, f64), Op)>> {
    prop::collection::vec((step(), op()), 1..60)
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Ran,
    /// The twin's `f64` tokens sat within a hair of a whole token where the lock-free
    /// limiter's exact count fell on the other side (the token bucket only).
    Borderline,
}

/// Whether two token bucket statuses agree, allowing the twin's float rounding: the remaining
/// count may differ only on a borderline (the twin's tokens within 1e-6 of a whole token),
/// the times by a microsecond.
/// `slack`: how far from a whole token the twin's tokens may be for a difference to count as
/// borderline (float rounding, and rate.go truncating a wait below a nanosecond to none).
fn tb_close(
    a: QuotaStatus,
    b: QuotaStatus,
    twin_tokens: f64,
    slack: f64,
) -> Result<bool, TestCaseError> {
    let near = |x: Duration, y: Duration| x.as_nanos().abs_diff(y.as_nanos()) <= 1_000;
    prop_assert_eq!(a.quota, b.quota);
    prop_assert!(
        near(a.window, b.window),
        "window {:?} vs {:?}",
        a.window,
        b.window
    );
    if a.remaining == b.remaining && near(a.reset, b.reset) {
        return Ok(true);
    }
    let off = (twin_tokens - twin_tokens.round()).abs();
    prop_assert!(
        off < slack,
        "lock-free {:?} vs twin {:?} (twin tokens {})",
        a,
        b,
        twin_tokens
    );
    Ok(false)
}

#[test]
fn token_bucket_differential() {
    let limit = prop_oneof![
        1 => Just(Limit::ZERO),
        1 => Just(Limit::INF),
        6 => (-1.0f64..7.0).prop_map(|e| per_second(10f64.powf(e))),
        3 => (1u32..100).prop_map(|r| per_second(f64::from(r))),
    ];
    let burst = prop_oneof![1 => Just(0u32), 4 => 1u32..6, 2 => 1u32..200];
    let stats = common::tally(
        "token bucket quota/refund",
        (limit, burst, ops()),
        |(limit, burst, ops)| {
            let (a, b) = buckets(limit, burst);
            let unit = if limit.is_inf() || limit.as_f64() == 0.0 {
                1e6
            } else {
                1e9 / limit.as_f64()
            };
            let mut now = SEC;
            let mut kept: Vec<(Nanos, u32)> = Vec::new();
            // 1e-6 of a token, or what two nanoseconds refill (rate.go truncates a wait of
            // less than a nanosecond to none and grants it).
            let slack = if limit.is_inf() {
                1e-6
            } else {
                1e-6 + limit.as_f64() * 2e-9
            };
            for ((ns, frac), op) in ops {
                now += ns + (frac * unit) as u64;
                let t = Nanos::new(now);
                let (qa, qb) = (a.quota_at(t).unwrap(), b.quota_at(t).unwrap());
                if !tb_close(qa, qb, b.tokens_at(t), slack)? {
                    return Ok(End::Borderline);
                }
                match op {
                    Op::Check { n } | Op::CheckRefund { n } => {
                        let tokens = b.tokens_at(t);
                        let (ga, gb) = (a.check_n_at(t, n).is_ok(), b.check_n_at(t, n).is_ok());
                        if ga != gb {
                            let off = (tokens - f64::from(n)).abs();
                            prop_assert!(
                                off < slack,
                                "check {} at {}: {} vs {}, twin tokens {}",
                                n,
                                now,
                                ga,
                                gb,
                                tokens
                            );
                            return Ok(End::Borderline);
                        }
                        if !ga {
                            continue;
                        }
                        if matches!(op, Op::CheckRefund { .. }) {
                            prop_assert!(a.refund_n_at(t, n) && b.refund_n_at(t, n));
                            // The lock-free limiter is exact: as before the check, to the unit.
                            prop_assert_eq!(
                                a.quota_at(t).unwrap(),
                                qa,
                                "check {} then refund at {}",
                                n,
                                now
                            );
                        } else {
                            kept.push((t, n));
                        }
                    }
                    Op::Refund { idx } => {
                        if !kept.is_empty() {
                            let (_, n) = kept.swap_remove(idx % kept.len());
                            prop_assert!(a.refund_n_at(t, n) && b.refund_n_at(t, n));
                            prop_assert!(a.tokens_at(t) <= f64::from(burst));
                        }
                    }
                    Op::Quota => {}
                }
            }
            Ok(End::Ran)
        },
    );
    let ran = stats.get(&End::Ran).copied().unwrap_or(0);
    let all: u32 = stats.values().sum();
    assert!(ran * 10 >= all * 9, "too many borderline cases: {stats:?}");
}

/// Window limiters are integer arithmetic on both sides: everything must be identical.
fn window_case<A: Limiter, B: Limiter>(
    a: &A,
    b: &B,
    period: u64,
    ops: Vec<((u64, f64), Op)>,
) -> Result<End, TestCaseError> {
    let mut now = 3 * period;
    let mut kept: Vec<(Nanos, u32)> = Vec::new();
    for ((ns, frac), op) in ops {
        now += ns + (frac * period as f64) as u64;
        let t = Nanos::new(now);
        let q = a.quota_at(t);
        prop_assert_eq!(q, b.quota_at(t), "quota at {}", now);
        match op {
            Op::Check { n } | Op::CheckRefund { n } => {
                let (ga, gb) = (a.check_n_at(t, n), b.check_n_at(t, n));
                prop_assert_eq!(ga, gb, "check {} at {}", n, now);
                if ga.is_err() {
                    continue;
                }
                if matches!(op, Op::CheckRefund { .. }) {
                    let (ra, rb) = (a.refund_n_at(t, n), b.refund_n_at(t, n));
                    prop_assert_eq!(ra, rb, "refund {} at {}", n, now);
                    if ra {
                        prop_assert_eq!(a.quota_at(t), q, "check {} then refund at {}", n, now);
                    }
                } else {
                    kept.push((t, n));
                }
            }
            Op::Refund { idx } => {
                if !kept.is_empty() {
                    // At the grant's own reading (the windows' contract), now or later.
                    let (at, n) = kept.swap_remove(idx % kept.len());
                    let (ra, rb) = (a.refund_n_at(at, n), b.refund_n_at(at, n));
                    prop_assert_eq!(ra, rb, "refund {} of {:?} at {}", n, at, now);
                }
            }
            Op::Quota => {}
        }
    }
    Ok(End::Ran)
}

#[test]
fn fixed_window_differential() {
    let quota = prop_oneof![3 => 1u32..6, 1 => 1u32..40];
    let period = prop_oneof![2 => (1u64..60).prop_map(|s| s * SEC), 1 => 1u64..10_000];
    common::tally(
        "fixed window quota/refund",
        (quota, period, any::<bool>(), ops()),
        |(quota, period, aligned, ops)| {
            let (a, b) = windows(quota, Duration::from_nanos(period), aligned);
            window_case(&a, &b, period, ops)
        },
    );
}

#[test]
fn sliding_window_differential() {
    let quota = prop_oneof![3 => 1u32..6, 1 => 1u32..40];
    let period = prop_oneof![2 => (1u64..60).prop_map(|s| s * SEC), 1 => 1u64..10_000];
    common::tally(
        "sliding window quota/refund",
        (quota, period, ops()),
        |(quota, period, ops)| {
            let (a, b) = sliding(quota, Duration::from_nanos(period));
            window_case(&a, &b, period, ops)
        },
    );
}

// ---- stress: refunds racing checks -----------------------------------------------------------

/// Threads that check and refund (net zero) beside threads that only check, on a bucket whose
/// clock stands still, so the budget of the checkers is exactly the burst: every token a
/// refund gives back must reach them, and no more. Each round is forced through the
/// interleaving that matters with barriers: the refunders take their tokens first; then the
/// checkers drain the bucket **while** the refunders give theirs back, one at a time (refund
/// CASes racing check CASes on the one word); then the checkers drain what is left. A refund
/// lost to a race (a blind store instead of a CAS) leaves the checkers short; one that
/// overwrote a take, or filled past the burst, lets them past it.
#[test]
fn token_bucket_refund_stress() {
    const BURST: u32 = 200;
    const REFUNDERS: usize = 2;
    const CHECKERS: usize = 2;
    const HELD: u32 = 90; // per refunder, taken in ones
    let rounds: u64 = std::env::var("TURNSTILE_REFUND_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for round in 0..rounds {
        let clock = ManualClock::new(Nanos::new(round * SEC));
        let tb = TokenBucket::builder(per_second(1.0), BURST)
            .clock(clock)
            .build();
        let now = tb.clock().now();
        let checked = AtomicU64::new(0);
        let refunding = AtomicU64::new(REFUNDERS as u64);
        let barrier = Barrier::new(REFUNDERS + CHECKERS);
        std::thread::scope(|s| {
            for _ in 0..REFUNDERS {
                s.spawn(|| {
                    let mut held = 0;
                    for _ in 0..HELD {
                        if tb.check_n_at(now, 1).is_ok() {
                            held += 1;
                        }
                    }
                    assert_eq!(held, HELD, "the refunders go first: the bucket has room");
                    barrier.wait(); // 1: every refunder holds its tokens
                    barrier.wait(); // 2: the checkers start draining now
                    for _ in 0..held {
                        assert!(tb.refund_n_at(now, 1));
                        std::hint::spin_loop();
                    }
                    refunding.fetch_sub(1, Ordering::Release);
                    barrier.wait(); // 3: every refund is in
                });
            }
            for _ in 0..CHECKERS {
                s.spawn(|| {
                    barrier.wait(); // 1
                    barrier.wait(); // 2
                    let mut mine = 0;
                    // Drain while the refunds land: spin on refusals until every refunder is
                    // done, so that each refunded token is raced for by a check's CAS.
                    while refunding.load(Ordering::Acquire) > 0 {
                        if tb.check_n_at(now, 1).is_ok() {
                            mine += 1;
                        }
                    }
                    barrier.wait(); // 3
                    while tb.check_n_at(now, 1).is_ok() {
                        mine += 1;
                    }
                    checked.fetch_add(mine, Ordering::Relaxed);
                });
            }
        });
        let got = checked.load(Ordering::Relaxed);
        assert_eq!(
            got,
            u64::from(BURST),
            "round {round}: the checkers got {got} tokens of a frozen bucket of {BURST}, \
             with {} refunded to them",
            REFUNDERS as u32 * HELD
        );
        assert_eq!(tb.tokens_at(now), 0.0);
    }
}
