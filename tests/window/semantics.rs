//! `FixedWindow` against go-zero `PeriodLimit`'s documented behaviour (seed-semantics §4.2),
//! on the lock-free limiter and on its mutex twin alike.

use std::time::Duration;

use turnstile::{reference, FixedWindow, Idle, Limiter, ManualClock, Nanos, Outcome};

const SEC: u64 = 1_000_000_000;

fn t(secs: f64) -> Nanos {
    Nanos::new((secs * SEC as f64).round() as u64)
}

/// Both implementations, built from the same options, as `(name, take_n_at, status)` closures
/// would be awkward: a tiny enum does it.
enum W {
    LockFree(FixedWindow<ManualClock>),
    Twin(reference::FixedWindow<ManualClock>),
}

impl W {
    fn both(quota: u32, period: Duration, align: Option<(i64, Duration)>) -> [W; 2] {
        let lf = FixedWindow::builder(quota, period).clock(ManualClock::default());
        let tw = FixedWindow::builder(quota, period).clock(ManualClock::default());
        let (lf, tw) = match align {
            None => (lf, tw),
            Some((offset, origin)) => (
                lf.align(offset).unix_origin(origin),
                tw.align(offset).unix_origin(origin),
            ),
        };
        [
            W::LockFree(lf.build().unwrap()),
            W::Twin(reference::FixedWindow::try_from(tw).unwrap()),
        ]
    }
    fn take_n_at(&self, now: Nanos, n: u32) -> Outcome {
        match self {
            W::LockFree(w) => w.take_n_at(now, n),
            W::Twin(w) => w.take_n_at(now, n),
        }
    }
    fn take_at(&self, now: Nanos) -> Outcome {
        self.take_n_at(now, 1)
    }
    fn status_at(&self, now: Nanos) -> turnstile::WindowStatus {
        match self {
            W::LockFree(w) => w.status_at(now),
            W::Twin(w) => w.status_at(now),
        }
    }
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), turnstile::Denied> {
        match self {
            W::LockFree(w) => w.check_n_at(now, n),
            W::Twin(w) => w.check_n_at(now, n),
        }
    }
    fn name(&self) -> &'static str {
        match self {
            W::LockFree(_) => "lock-free",
            W::Twin(_) => "twin",
        }
    }
}

#[test]
fn quota_5_over_100_calls_in_one_window() {
    for w in W::both(5, Duration::from_secs(100), None) {
        let outcomes: Vec<Outcome> = (0..100).map(|i| w.take_at(t(i as f64 * 0.5))).collect();
        let count = |o| outcomes.iter().filter(|x| **x == o).count();
        assert_eq!(count(Outcome::Allowed), 4, "{}", w.name());
        assert_eq!(count(Outcome::HitQuota), 1, "{}", w.name());
        assert_eq!(count(Outcome::OverQuota), 95, "{}", w.name());
        // go-zero's observed replies for calls 1..7: 1 1 1 1 2 0 0.
        assert_eq!(
            outcomes[..7],
            [
                Outcome::Allowed,
                Outcome::Allowed,
                Outcome::Allowed,
                Outcome::Allowed,
                Outcome::HitQuota,
                Outcome::OverQuota,
                Outcome::OverQuota
            ],
            "{}",
            w.name()
        );
    }
}

#[test]
fn quota_1_hits_quota_first() {
    // go-zero#1581: the first call with quota 1 is HitQuota, not Allowed.
    for w in W::both(1, Duration::from_secs(100), None) {
        assert_eq!(w.take_at(t(0.0)), Outcome::HitQuota, "{}", w.name());
        assert_eq!(w.take_at(t(0.0)), Outcome::OverQuota, "{}", w.name());
        assert_eq!(w.take_at(t(100.0)), Outcome::HitQuota, "{}", w.name());
    }
}

#[test]
fn window_starts_at_the_first_hit_and_lasts_one_period() {
    for w in W::both(2, Duration::from_secs(100), None) {
        assert_eq!(w.take_at(t(7.0)), Outcome::Allowed);
        assert_eq!(w.take_at(t(50.0)), Outcome::HitQuota);
        assert_eq!(
            w.take_at(t(106.999_999_999)),
            Outcome::OverQuota,
            "{}",
            w.name()
        );
        assert_eq!(w.status_at(t(60.0)).resets_at, t(107.0), "{}", w.name());
        // The key expires at 107 s: the next request opens a window of its own.
        assert_eq!(w.take_at(t(107.0)), Outcome::Allowed, "{}", w.name());
        assert_eq!(w.status_at(t(107.0)).resets_at, t(207.0), "{}", w.name());
        // Idle through several periods: the next window starts at the next hit, not on a grid.
        assert_eq!(w.take_at(t(1000.5)), Outcome::Allowed, "{}", w.name());
        assert_eq!(w.status_at(t(1000.5)).resets_at, t(1100.5), "{}", w.name());
    }
}

#[test]
fn align_matches_go_zero_calc_expire_seconds() {
    let utc8 = 8 * 3600;
    // 2024-01-01 23:59:59 in UTC+8 (unix 1704124799): 1 s to local midnight.
    for w in W::both(
        10,
        Duration::from_secs(86_400),
        Some((utc8, Duration::from_secs(1_704_124_799))),
    ) {
        let _ = w.take_at(t(0.0));
        assert_eq!(w.status_at(t(0.0)).resets_at, t(1.0), "{}", w.name());
        // One second later, a new day: a full day's window.
        let _ = w.take_at(t(1.0));
        assert_eq!(w.status_at(t(1.0)).resets_at, t(86_401.0), "{}", w.name());
        assert_eq!(w.status_at(t(1.0)).remaining, 9, "{}", w.name());
    }
    // unix 1704110400 is 20:00 local in UTC+8: 14400 s to midnight; with period 60, 60 s.
    for (period, expect) in [(86_400, 14_400.0), (60, 60.0)] {
        for w in W::both(
            10,
            Duration::from_secs(period),
            Some((utc8, Duration::from_secs(1_704_110_400))),
        ) {
            assert_eq!(w.status_at(t(0.0)).resets_at, t(expect), "{}", w.name());
            let _ = w.take_at(t(0.0));
            assert_eq!(w.status_at(t(0.0)).resets_at, t(expect), "{}", w.name());
        }
    }
}

#[test]
fn aligned_windows_end_on_boundaries_with_negative_and_positive_offsets() {
    // Hourly windows; the clock's zero is 10:59:30 UTC.
    let origin = Duration::from_secs(1_704_106_800 + 10 * 3600 + 59 * 60 + 30);
    for offset in [0i64, -5 * 3600, 5 * 3600 + 1800, 86_399, -86_399] {
        for w in W::both(3, Duration::from_secs(3600), Some((offset, origin))) {
            // Where the next boundary falls: (unix + offset) % 3600 == 0.
            let unix0 = origin.as_secs() as i64 + offset;
            let to_boundary = 3600 - unix0.rem_euclid(3600);
            let b = to_boundary as f64;
            assert_eq!(w.take_n_at(t(0.0), 3), Outcome::HitQuota, "{}", w.name());
            assert_eq!(
                w.take_at(t(b - 1e-9)),
                Outcome::OverQuota,
                "{offset} {}",
                w.name()
            );
            assert_eq!(w.take_at(t(b)), Outcome::Allowed, "{offset} {}", w.name());
            assert_eq!(
                w.status_at(t(b)).resets_at,
                t(b + 3600.0),
                "{offset} {}",
                w.name()
            );
            // A first hit late in a window gets only the rest of it.
            assert_eq!(w.take_at(t(b + 3600.0 + 3599.0)), Outcome::Allowed);
            assert_eq!(
                w.status_at(t(b + 7199.0)).resets_at,
                t(b + 7200.0),
                "{offset}"
            );
        }
    }
}

#[test]
fn take_n_is_all_or_nothing() {
    for w in W::both(5, Duration::from_secs(10), None) {
        assert_eq!(w.take_n_at(t(0.0), 0), Outcome::Allowed, "{}", w.name());
        assert_eq!(
            w.status_at(t(0.0)).remaining,
            5,
            "zero takes nothing: {}",
            w.name()
        );
        assert_eq!(w.take_n_at(t(0.0), 3), Outcome::Allowed, "{}", w.name());
        assert_eq!(w.take_n_at(t(1.0), 3), Outcome::OverQuota, "{}", w.name());
        // The refused 3 counted nothing (an `INCRBY 3` would have: the documented difference
        // from go-zero's counting, src/fixed_window.rs).
        assert_eq!(w.status_at(t(1.0)).remaining, 2, "{}", w.name());
        assert_eq!(w.take_n_at(t(1.0), 2), Outcome::HitQuota, "{}", w.name());
        assert_eq!(w.take_n_at(t(1.0), 6), Outcome::OverQuota, "{}", w.name());
        assert_eq!(
            w.take_n_at(t(20.0), 6),
            Outcome::OverQuota,
            "more than the quota, ever"
        );
        assert_eq!(w.status_at(t(20.0)).remaining, 5, "{}", w.name());
    }
}

#[test]
fn denials_say_when_the_window_ends() {
    for w in W::both(2, Duration::from_secs(10), None) {
        assert!(w.check_n_at(t(3.0), 2).is_ok());
        let d = w.check_n_at(t(5.0), 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(t(13.0)), "{}", w.name());
        assert_eq!(
            d.retry_after(),
            Some(Duration::from_secs(8)),
            "{}",
            w.name()
        );
        assert_eq!(
            w.check_n_at(t(5.0), 3).unwrap_err().retry_at(),
            None,
            "{}",
            w.name()
        );
        assert!(w.check_n_at(t(13.0), 1).is_ok(), "{}", w.name());
    }
}

#[test]
fn status_reports_remaining_and_reset() {
    for w in W::both(4, Duration::from_secs(60), None) {
        let fresh = w.status_at(t(5.0));
        assert_eq!(
            (fresh.quota, fresh.remaining, fresh.resets_at),
            (4, 4, t(65.0))
        );
        let _ = w.take_at(t(10.0));
        let _ = w.take_at(t(11.0));
        let s = w.status_at(t(30.0));
        assert_eq!((s.remaining, s.resets_at), (2, t(70.0)), "{}", w.name());
        assert_eq!(s.resets_after(t(30.0)), Duration::from_secs(40));
        for _ in 0..5 {
            let _ = w.take_at(t(31.0));
        }
        assert_eq!(w.status_at(t(31.0)).remaining, 0, "{}", w.name());
        assert_eq!(w.status_at(t(70.0)).remaining, 4, "{}", w.name());
    }
}

#[test]
fn a_stale_time_never_opens_a_new_window() {
    let w = FixedWindow::builder(3, Duration::from_secs(10))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert_eq!(w.take_at(t(10.0)), Outcome::Allowed); // window [10, 20)
    assert_eq!(w.take_n_at(t(25.0), 2), Outcome::Allowed); // window [25, 35)
                                                           // A thread that read 12 s before the window at 25 s opened: counted in the current one.
    assert_eq!(w.take_at(t(12.0)), Outcome::HitQuota);
    assert_eq!(w.take_at(t(12.0)), Outcome::OverQuota);
    assert_eq!(w.status_at(t(26.0)).remaining, 0);
}

#[test]
fn idle_once_the_window_is_over() {
    let w = FixedWindow::builder(3, Duration::from_secs(10))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(w.is_idle_at(t(0.0)));
    let _ = w.take_at(t(1.0));
    assert!(!w.is_idle_at(t(10.999)));
    assert!(w.is_idle_at(t(11.0)));
}

#[test]
fn plain_forms_read_the_limiters_clock() {
    let clock = ManualClock::new(t(5.0));
    let w = FixedWindow::builder(2, Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(w.take(), Outcome::Allowed);
    assert_eq!(w.status().resets_at, t(15.0));
    clock.advance(Duration::from_secs(3));
    assert_eq!(w.take_n(1), Outcome::HitQuota);
    assert_eq!(
        w.check().unwrap_err().retry_after(),
        Some(Duration::from_secs(7))
    );
    clock.advance(Duration::from_secs(7));
    assert!(w.check().is_ok());
    assert_eq!(w.status().remaining, 1);
}

#[test]
fn the_compact_layout_is_the_same_limiter_in_64_bytes() {
    let padded = FixedWindow::builder(5, Duration::from_secs(100))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let compact = FixedWindow::builder(5, Duration::from_secs(100))
        .clock(ManualClock::default())
        .build_compact()
        .unwrap();
    assert_eq!(std::mem::size_of_val(&compact), 64);
    for i in 0..300u32 {
        let now = t(f64::from(i) * 0.7);
        let n = i % 3;
        assert_eq!(
            padded.take_n_at(now, n),
            compact.take_n_at(now, n),
            "call {i}"
        );
        assert_eq!(padded.status_at(now), compact.status_at(now));
        assert_eq!(padded.is_idle_at(now), compact.is_idle_at(now));
    }
}
