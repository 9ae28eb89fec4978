//! Bad input to both sliding windows gets a typed error or a sane answer, never a panic or an
//! overflow: quota 0, period 0, periods up to `Duration::MAX`, `u32::MAX` quotas and `n`, and
//! times at the ends of `Nanos`. The test profile keeps debug assertions (and so overflow
//! checks) on, in the library too.

use crate::common;

use std::time::Duration;

use turnstile::{reference, ConfigError, Idle, Limiter, ManualClock, Nanos, SlidingWindow};

#[test]
fn zero_quota_and_zero_period_are_typed_errors_that_say_what_was_wrong() {
    let one = Duration::from_secs(1);
    assert_eq!(
        SlidingWindow::new(0, one).unwrap_err(),
        ConfigError::ZeroQuota
    );
    assert_eq!(
        reference::SlidingWindow::new(0, one).unwrap_err(),
        ConfigError::ZeroQuota
    );
    assert_eq!(
        SlidingWindow::new(1, Duration::ZERO).unwrap_err(),
        ConfigError::ZeroPeriod
    );
    assert_eq!(
        reference::SlidingWindow::new(1, Duration::ZERO).unwrap_err(),
        ConfigError::ZeroPeriod
    );
    assert!(ConfigError::ZeroQuota.to_string().contains("quota is 0"));
    assert!(ConfigError::ZeroPeriod.to_string().contains("period is 0"));
}

const QUOTAS: [u32; 5] = [1, 2, 1_000_000_000, u32::MAX - 1, u32::MAX];
/// 1 ns; 1 s; just under, at and just over `u64::MAX` ns (the longest window any `Nanos` can
/// leave); and far beyond, up to `Duration::MAX`.
fn periods() -> Vec<Duration> {
    vec![
        Duration::from_nanos(1),
        Duration::from_nanos(3),
        Duration::from_secs(1),
        Duration::from_nanos(u64::MAX / 2),
        Duration::from_nanos(u64::MAX - 1),
        Duration::from_nanos(u64::MAX),
        Duration::from_nanos(u64::MAX) + Duration::from_nanos(1),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ]
}

/// Every operation at every extreme time, in increasing and then decreasing order, with every
/// extreme `n`, on both limiters. Nothing may panic, the two must agree, and the answers must
/// be sane: retry times after the check, `remaining <= quota`, `resets_at >= now`.
#[test]
fn every_operation_at_every_extreme_is_safe_and_both_agree() {
    for quota in QUOTAS {
        for period in periods() {
            let ours = SlidingWindow::builder(quota, period)
                .clock(ManualClock::new(Nanos::MAX))
                .build()
                .unwrap();
            let twin = reference::SlidingWindow::try_from(
                turnstile::SlidingWindow::builder(quota, period)
                    .clock(ManualClock::new(Nanos::MAX)),
            )
            .unwrap();
            let what = format!("{quota}/{period:?}");
            let mut ts = common::extreme_times();
            ts.extend(common::extreme_times().into_iter().rev());
            for now in ts {
                for n in [
                    0,
                    1,
                    2,
                    quota / 2,
                    quota - 1,
                    quota,
                    quota.saturating_add(1),
                ]
                .into_iter()
                .chain([u32::MAX])
                {
                    let (a, b) = (ours.check_n_at(now, n), twin.check_n_at(now, n));
                    assert_eq!(a, b, "{what}: check {n} at {now:?}");
                    if let Err(d) = a {
                        assert!(d.retry_at().is_none_or(|r| r > now), "{what}: {d:?}");
                        if n > quota {
                            assert_eq!(d.retry_at(), None, "{what}: {n} can never pass");
                        }
                    }
                    let (a, b) = (ours.status_at(now), twin.status_at(now));
                    assert_eq!(a, b, "{what}: status at {now:?}");
                    assert!(a.remaining <= quota && a.resets_at >= now, "{what}: {a:?}");
                    assert_eq!(ours.is_idle_at(now), twin.is_idle_at(now));
                }
            }
            // The plain forms read the clock (here Nanos::MAX).
            let _ = (ours.allow(), ours.allow_n(u32::MAX), ours.status());
            let _ = (twin.allow(), twin.allow_n(u32::MAX), twin.status());
            let _ = format!("{ours:?} {twin:?}");
        }
    }
}

#[test]
fn u32_max_quota_and_n_are_counted_exactly() {
    fn run<L: Limiter + Idle>(l: &L, status: impl Fn(Nanos) -> (u32, Nanos)) {
        let sec = 1_000_000_000u64;
        let t0 = Nanos::new(1_000 * sec);
        assert!(l.check_n_at(t0, u32::MAX).is_ok());
        let d = l.check_n_at(t0, 1).unwrap_err();
        // Next window: u32::MAX (P - e) + P <= u32::MAX P  <=>  e >= P / u32::MAX = 0.23 ns,
        // rounded up to 1 ns.
        assert_eq!(d.retry_at(), Some(Nanos::new(1_001 * sec + 1)));
        // u32::MAX again: only when both windows are empty, two windows on.
        let d = l.check_n_at(t0, u32::MAX).unwrap_err();
        assert_eq!(d.retry_at(), Some(Nanos::new(1_002 * sec)));
        assert_eq!(status(t0), (0, Nanos::new(1_002 * sec)));
        // Half-way through the next window half of u32::MAX weighs: floor(u32::MAX / 2)
        // remain.
        assert_eq!(status(Nanos::new(1_001 * sec + sec / 2)).0, u32::MAX / 2);
        assert!(l.check_n_at(Nanos::new(1_002 * sec), u32::MAX).is_ok());
        assert!(!l.is_idle_at(Nanos::new(1_002 * sec)));
    }
    let quota = u32::MAX;
    let ours = SlidingWindow::builder(quota, Duration::from_secs(1))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    run(&ours, |t| {
        let s = ours.status_at(t);
        (s.remaining, s.resets_at)
    });
    let twin = reference::SlidingWindow::try_from(
        turnstile::SlidingWindow::builder(quota, Duration::from_secs(1))
            .clock(ManualClock::default()),
    )
    .unwrap();
    run(&twin, |t| {
        let s = twin.status_at(t);
        (s.remaining, s.resets_at)
    });
}

#[test]
fn the_end_of_time_is_never_a_retry_time() {
    // Period 1 ns: the window of Nanos::MAX is u64::MAX, and the next one starts at 2^64 ns,
    // which no Nanos can hold. A denial there has no retry time; status saturates.
    let l = SlidingWindow::builder(1, Duration::from_nanos(1))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(l.allow_at(Nanos::MAX));
    let d = l.check_n_at(Nanos::MAX, 1).unwrap_err();
    assert_eq!(d.retry_at(), None);
    let s = l.status_at(Nanos::MAX);
    assert_eq!((s.remaining, s.resets_at), (0, Nanos::MAX));
    // Every earlier time is stale now: judged at Nanos::MAX, denied.
    assert!(!l.allow_at(Nanos::ZERO));

    // A period of Duration::MAX: every Nanos is in window 0, so the quota is for all time.
    let l = SlidingWindow::builder(3, Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert_eq!(l.period(), Duration::MAX);
    assert!(l.allow_n_at(Nanos::ZERO, 2));
    assert!(l.allow_at(Nanos::MAX));
    assert_eq!(l.check_n_at(Nanos::MAX, 1).unwrap_err().retry_at(), None);
    assert_eq!(l.status_at(Nanos::new(5)).resets_at, Nanos::MAX);
    assert!(!l.is_idle_at(Nanos::MAX));

    // A period of u64::MAX ns: Nanos::MAX is the first instant of window 1, where window 0's
    // grants weigh fully.
    let l = SlidingWindow::builder(2, Duration::from_nanos(u64::MAX))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(l.allow_at(Nanos::new(u64::MAX - 1)));
    let d = l.check_n_at(Nanos::MAX, 2).unwrap_err();
    assert_eq!(d.retry_at(), None, "window 1 ends past the end of time");
    assert!(l.allow_at(Nanos::MAX));
    assert!(!l.allow_at(Nanos::MAX));
}
