//! The rules of the sliding-window counter (src/sliding_window.rs module docs) on the
//! lock-free `SlidingWindow` and on its mutex twin, one test per rule, with vectors computed
//! by hand (written once, in `tests/common/sliding_rules.rs`, and run on one key of a
//! `KeyedSlidingWindow` too). Times are explicit (`_at` forms) unless the test is about the
//! clock.
//!
//! Most tests use quota 5 and period 1 s, starting at `T0` = 1000 s, the start of window 1000.

use std::time::Duration;

use turnstile::{Clock, ConfigError, Idle, Limiter, ManualClock, Nanos, WindowStatus};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// The start of window 1000 (period 1 s).
const T0: u64 = 1_000 * SEC;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

#[macro_use]
#[path = "../common/sliding_rules.rs"]
mod sliding_rules;

shared_rules!(lock_free, turnstile::SlidingWindow);
shared_rules!(twin, turnstile::reference::SlidingWindow);

/// `Debug` shows the counts, on the lock-free limiter and its twin.
#[test]
fn debug_shows_the_counts() {
    let five = Duration::from_secs(1);
    let a = turnstile::SlidingWindow::builder(5, five)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap();
    let b = turnstile::reference::SlidingWindow::try_from(
        turnstile::SlidingWindow::builder(5, five).clock(ManualClock::new(at(T0))),
    )
    .unwrap();
    assert!(a.allow_n_at(at(T0 + 10), 3) && b.allow_n_at(at(T0 + 10), 3));
    for s in [format!("{a:?}"), format!("{b:?}")] {
        assert!(
            s.contains("quota: 5") && s.contains("current: 3") && s.contains("remaining: 2"),
            "{s}"
        );
    }
}

/// The doc examples' guarantee, on the lock-free limiter: the worst case of "any span of one
/// period" is `2 * quota - 1`, reached with the previous window's grants at its very end.
#[test]
fn the_worst_span_of_one_period_holds_two_quotas_minus_one() {
    let q = 10u32;
    let p = 1_000u64; // ns
    let l = turnstile::SlidingWindow::builder(q, Duration::from_nanos(p))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let start = T0; // a window start (T0 is a multiple of 1000 ns)
                    // All 10 of window k at its last nanosecond.
    assert!(l.allow_n_at(at(start + p - 1), q));
    // Then window k + 1 greedily, every nanosecond: count what the span [p - 1, 2p - 1)
    // (one period) gets.
    let mut in_span = u64::from(q);
    for e in 0..p - 1 {
        while l.allow_at(at(start + p + e)) {
            in_span += 1;
        }
    }
    // 10 (P - e) + c P <= 10 P: at e = P - 2 = 998, c <= 10 * 998 / 1000 = 9.98 -> 9.
    assert_eq!(in_span, u64::from(2 * q - 1));
    // Not even the window's last nanosecond has room: 10 * 1 + 9 * 1000 > 9 * 1000.
    assert_eq!(l.status_at(at(start + 2 * p - 1)).remaining, 0);
}

#[test]
fn the_compact_layout_is_the_same_limiter_unpadded() {
    let build = || turnstile::SlidingWindow::builder(5, Duration::from_secs(1));
    let padded = build().clock(ManualClock::new(at(T0))).build().unwrap();
    let compact = build()
        .clock(ManualClock::new(at(T0)))
        .build_compact()
        .unwrap();
    assert!(std::mem::size_of_val(&compact) <= 80);
    for i in 0..400u64 {
        let now = at(T0 + i * 37 * MS);
        let n = (i % 4) as u32;
        assert_eq!(
            padded.check_n_at(now, n),
            compact.check_n_at(now, n),
            "call {i}"
        );
        assert_eq!(padded.status_at(now), compact.status_at(now));
        assert_eq!(padded.is_idle_at(now), compact.is_idle_at(now));
    }
}
