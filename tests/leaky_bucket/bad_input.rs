//! Bad input to both leaky buckets gets a typed error, never a panic or an overflow: rate 0,
//! `per` 0, `Duration::MAX`, `u32::MAX` rates and slacks, `n` up to `u32::MAX`, and times at
//! the ends of `Nanos`. The test profile keeps debug assertions (and so overflow checks) on.

use crate::common;

use std::time::Duration;

use turnstile::{reference, Clock, ConfigError, LeakyBucket, Limiter, ManualClock, Nanos};

#[test]
fn zero_rate_and_zero_period_are_typed_errors_that_say_what_was_wrong() {
    assert_eq!(LeakyBucket::new(0).unwrap_err(), ConfigError::ZeroRate);
    assert_eq!(
        reference::LeakyBucket::new(0).unwrap_err(),
        ConfigError::ZeroRate
    );
    assert_eq!(
        LeakyBucket::builder(5)
            .per(Duration::ZERO)
            .build()
            .unwrap_err(),
        ConfigError::ZeroPeriod
    );
    assert_eq!(
        reference::LeakyBucket::try_from(turnstile::LeakyBucket::builder(5).per(Duration::ZERO))
            .unwrap_err(),
        ConfigError::ZeroPeriod
    );
    assert!(ConfigError::ZeroRate.to_string().contains("rate is 0"));
    assert!(ConfigError::ZeroPeriod.to_string().contains("per"));
}

const RATES: [u32; 5] = [1, 2, 1_000_000_000, u32::MAX - 1, u32::MAX];
const PERS: [Duration; 6] = [
    Duration::from_nanos(1),
    Duration::from_secs(1),
    Duration::from_secs(u64::MAX / 1_000_000_000),
    Duration::from_secs(u64::MAX / 1_000_000_000 + 1),
    Duration::from_secs(u64::MAX),
    Duration::MAX,
];
const SLACKS: [u32; 4] = [0, 1, 10, u32::MAX];
const NS: [u32; 5] = [0, 1, 2, 11, u32::MAX];

/// Every operation at every extreme time, in increasing and then decreasing order, on both
/// buckets. Nothing may panic; turnstile's permits are never before the time asked and never
/// at the end of time unless refused.
#[test]
fn every_operation_at_every_extreme_is_safe() {
    for rate in RATES {
        for per in PERS {
            for slack in SLACKS {
                let ours = LeakyBucket::builder(rate)
                    .per(per)
                    .slack(slack)
                    .clock(ManualClock::new(Nanos::MAX))
                    .build()
                    .unwrap();
                let twin = reference::LeakyBucket::try_from(
                    turnstile::LeakyBucket::builder(rate)
                        .per(per)
                        .slack(slack)
                        .clock(ManualClock::new(Nanos::MAX)),
                )
                .unwrap();
                let mut ts = common::extreme_times();
                ts.extend(common::extreme_times().into_iter().rev());
                for now in ts {
                    let p = ours.take_at(now);
                    assert!(
                        p >= now,
                        "{rate}/{per:?}/{slack}: permit {p:?} before {now:?}"
                    );
                    let _ = twin.take_at(now);
                    let _ = ours.try_take_at(now);
                    let _ = twin.try_take_at(now);
                    for n in NS {
                        if let Err(d) = ours.check_n_at(now, n) {
                            assert!(d.retry_at().is_none_or(|r| r > now && r < Nanos::MAX));
                        }
                        let _ = twin.check_n_at(now, n);
                    }
                }
                // The plain forms read the clock (here Nanos::MAX) and must not sleep.
                assert_eq!(ours.take(), Nanos::MAX);
                assert!(!ours.try_take());
                let _ = format!("{ours:?} {twin:?} {:?}", ours.per_request());
                let _ = twin.per_request();
            }
        }
    }
}

#[test]
fn per_request_saturates_beyond_u64_nanoseconds() {
    let l = LeakyBucket::builder(1).per(Duration::MAX).build().unwrap();
    assert_eq!(l.per_request(), Duration::from_nanos(u64::MAX));
    let twin =
        reference::LeakyBucket::try_from(turnstile::LeakyBucket::builder(1).per(Duration::MAX))
            .unwrap();
    assert_eq!(twin.per_request(), Duration::from_nanos(u64::MAX));
    // perRequest truncates to 0 when the rate exceeds per in nanoseconds, as upstream.
    let l = LeakyBucket::builder(u32::MAX)
        .per(Duration::from_secs(1))
        .build()
        .unwrap();
    assert_eq!(l.per_request(), Duration::ZERO);
}

#[test]
fn the_end_of_time_is_refused_not_granted() {
    // A permit that would be at or after Nanos::MAX is "never": take_at returns Nanos::MAX and
    // consumes nothing; checks are denied for good.
    let l = LeakyBucket::builder(1)
        .without_slack()
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let late = Nanos::new(u64::MAX - 1);
    assert_eq!(l.take_at(late), late);
    for _ in 0..3 {
        assert_eq!(l.take_at(late), Nanos::MAX);
    }
    let d = l.check_n_at(late, 1).unwrap_err();
    assert_eq!(d.retry_at(), None);
    // Nothing was consumed by the refusals: the state is still `late`.
    let l2 = LeakyBucket::builder(1)
        .without_slack()
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert_eq!(
        l2.take_at(Nanos::new(u64::MAX - 5_000_000_000)),
        Nanos::new(u64::MAX - 5_000_000_000)
    );
    assert_eq!(
        l2.take_at(Nanos::new(u64::MAX - 5_000_000_000)),
        Nanos::new(u64::MAX - 4_000_000_000)
    );
    // Nanos::MAX itself is not a time anything is granted at.
    let l3 = LeakyBucket::new(10).unwrap();
    assert_eq!(l3.take_at(Nanos::MAX), Nanos::MAX);
    assert!(!l3.try_take_at(Nanos::MAX));
    assert_eq!(l3.check_n_at(Nanos::MAX, 1).unwrap_err().retry_at(), None);
    assert!(l3.check_n_at(Nanos::MAX, 0).is_ok());
    // ... and refusing it left the bucket unused: a first take at another time is immediate.
    assert_eq!(l3.take_at(Nanos::new(7)), Nanos::new(7));
}

#[test]
fn a_refused_take_does_not_sleep_until_the_end_of_time() {
    let clock = ManualClock::new(Nanos::new(u64::MAX - 10_000_000_000));
    let l = LeakyBucket::builder(1)
        .per(Duration::from_secs(3_600))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(l.take(), clock.now());
    let start = std::time::Instant::now();
    assert_eq!(
        l.take(),
        Nanos::MAX,
        "an hour later is past the end of time"
    );
    // Returned, rather than slept towards the end of time: a minute tells them apart on any
    // loaded machine.
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn huge_n_and_huge_slack_are_counted_not_looped() {
    // u32::MAX slack at 1 ns apart: ~4.3 s of credit, and a check of u32::MAX permits.
    fn run<L: Limiter>(l: &L) {
        let (t0, t1) = (Nanos::new(1_000_000_000), Nanos::new(100_000_000_000));
        assert!(l.check_n_at(t0, 1).is_ok());
        assert!(
            l.check_n_at(t1, u32::MAX).is_ok(),
            "2^32 - 1 of the 2^32 banked"
        );
        assert!(l.check_n_at(t1, 1).is_ok(), "and the last one");
        let d = l.check_n_at(t1, 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(Nanos::new(100_000_000_001)));
        assert_eq!(
            l.check_n_at(t1, u32::MAX).unwrap_err().retry_at(),
            Some(Nanos::new(100_000_000_000 + u64::from(u32::MAX)))
        );
    }
    run(&LeakyBucket::builder(1_000_000_000)
        .slack(u32::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap());
    run(&reference::LeakyBucket::try_from(
        turnstile::LeakyBucket::builder(1_000_000_000)
            .slack(u32::MAX)
            .clock(ManualClock::default()),
    )
    .unwrap());
}
