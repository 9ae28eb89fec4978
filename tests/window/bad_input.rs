//! `FixedWindow` and its twin on bad input: configurations go-zero accepts or panics on
//! (deviation D14) are typed errors, and every method at the extremes of its arguments
//! saturates instead of overflowing (tests run with overflow checks on).

use std::time::Duration;

use turnstile::{reference, ConfigError, FixedWindow, Limiter, ManualClock, Nanos, Outcome};

#[test]
fn bad_configurations_are_typed_errors() {
    let day = Duration::from_secs(86_400);
    assert_eq!(
        FixedWindow::new(0, day).unwrap_err(),
        ConfigError::ZeroQuota
    );
    assert_eq!(
        reference::FixedWindow::new(0, day).unwrap_err(),
        ConfigError::ZeroQuota
    );
    assert_eq!(
        FixedWindow::new(1, Duration::ZERO).unwrap_err(),
        ConfigError::ZeroPeriod
    );
    assert_eq!(
        reference::FixedWindow::new(1, Duration::ZERO).unwrap_err(),
        ConfigError::ZeroPeriod
    );
    for offset in [86_400, -86_400, i64::MAX, i64::MIN] {
        assert_eq!(
            FixedWindow::builder(1, day)
                .align(offset)
                .build()
                .unwrap_err(),
            ConfigError::InvalidUtcOffset(offset)
        );
        assert_eq!(
            FixedWindow::builder(1, day)
                .align(offset)
                .build_compact()
                .unwrap_err(),
            ConfigError::InvalidUtcOffset(offset)
        );
        assert_eq!(
            reference::FixedWindow::try_from(turnstile::FixedWindow::builder(1, day).align(offset))
                .unwrap_err(),
            ConfigError::InvalidUtcOffset(offset)
        );
    }
    assert_eq!(
        FixedWindow::builder(1, Duration::ZERO)
            .align(0)
            .build()
            .unwrap_err(),
        ConfigError::ZeroPeriod,
        "go-zero divides by zero here"
    );
    assert!(FixedWindow::builder(1, day).align(86_399).build().is_ok());
    assert!(FixedWindow::builder(1, day).align(-86_399).build().is_ok());
}

/// Runs every method of `w` at the extremes of time and `n`.
macro_rules! exercise {
    ($w:expr) => {{
        let w = $w;
        for now in [Nanos::ZERO, Nanos::new(1), Nanos::MAX] {
            let _ = w.take_n_at(now, u32::MAX);
            let _ = w.take_n_at(now, 1);
            let _ = w.take_n_at(now, 0);
            let _ = w.check_n_at(now, u32::MAX);
            let s = w.status_at(now);
            assert!(s.remaining <= s.quota);
        }
    }};
}

#[test]
fn extremes_saturate_instead_of_overflowing() {
    let periods = [
        Duration::MAX,
        Duration::from_nanos(1),
        Duration::from_secs(u64::MAX),
    ];
    let aligns = [
        None,
        Some((0i64, Duration::MAX)),
        Some((-86_399, Duration::ZERO)),
    ];
    for period in periods {
        for align in aligns {
            let lf = FixedWindow::builder(u32::MAX, period).clock(ManualClock::default());
            let tw = FixedWindow::builder(u32::MAX, period).clock(ManualClock::default());
            let (lf, tw) = match align {
                None => (lf, tw),
                Some((o, origin)) => (
                    lf.align(o).unix_origin(origin),
                    tw.align(o).unix_origin(origin),
                ),
            };
            exercise!(lf.clone().build().unwrap());
            exercise!(lf.build_compact().unwrap());
            exercise!(reference::FixedWindow::try_from(tw).unwrap());
        }
    }
    // A window that would end past the end of time never ends: OverQuota stays.
    let w = FixedWindow::builder(1, Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert_eq!(w.take_at(Nanos::new(1_000_000_000)), Outcome::HitQuota);
    assert_eq!(w.take_at(Nanos::MAX), Outcome::OverQuota);
}
