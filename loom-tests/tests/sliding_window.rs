//! loom models of the sliding window's CAS loop: every interleaving of two checks on one
//! limiter ends in the state of some sequential order of them (read back exactly through
//! `loom_state`: `window`, `prev`, `curr`), with the decisions of that order: no grant lost, none
//! counted twice, the quota never exceeded, across a window boundary too.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test sliding_window
#![cfg(loom)]

use std::time::Duration;

use loom::thread;
use turnstile::{ManualClock, Nanos, SlidingWindow};

const SEC: u64 = 1_000_000_000;

/// loom threads must be 'static: leak one small limiter per explored execution. `quota` per
/// second.
fn limiter(quota: u32) -> &'static SlidingWindow<ManualClock> {
    Box::leak(Box::new(
        SlidingWindow::builder(quota, Duration::from_secs(1))
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

/// `s` seconds plus `ms` milliseconds.
fn t(s: u64, ms: u64) -> Nanos {
    Nanos::new(s * SEC + ms * 1_000_000)
}

/// The state word (`SlidingWindow::loom_state`, compiled under `--cfg loom` only).
fn state(l: &SlidingWindow<ManualClock>) -> String {
    let (window, prev, curr) = l.loom_state();
    counts(window, prev, curr)
}

fn counts(window: u64, prev: u32, curr: u32) -> String {
    format!("window: {window}, prev: {prev}, curr: {curr}")
}

#[test]
fn allow_vs_allow_at_the_last_unit_of_quota_exactly_one_wins() {
    loom::model(|| {
        let l = limiter(3);
        assert!(l.allow_n_at(t(10, 100), 2));
        let a = thread::spawn(move || l.allow_at(t(10, 500)));
        let b = l.allow_at(t(10, 600));
        let a = a.join().unwrap();
        assert!(a ^ b, "exactly one of two racing checks gets the last unit");
        assert_eq!(state(l), counts(10, 0, 3));
        assert!(!l.allow_at(t(10, 900)));
    });
}

#[test]
fn allow_vs_allow_across_a_window_boundary_is_some_sequential_order() {
    loom::model(|| {
        // Quota 2, one granted in window 10: curr = quota - 1.
        let l = limiter(2);
        assert!(l.allow_at(t(10, 500)));
        // A reads a time in window 10, B one in window 11 (e = 0.5 s).
        let a = thread::spawn(move || l.allow_at(t(10, 900)));
        let b = l.allow_at(t(11, 500));
        let a = a.join().unwrap();
        match (a, b) {
            // A first: window 10 fills (2), then B in window 11: 2 * 0.5 + 1 = 2 <= 2.
            (true, true) => assert_eq!(state(l), counts(11, 2, 1)),
            // B first: (11, 1, 1); then A's stale time is judged at 11.0 s: 1 + 1 + 1 > 2.
            (false, true) => assert_eq!(state(l), counts(11, 1, 1)),
            other => panic!("no sequential order gives {other:?}: {}", state(l)),
        }
    });
}

#[test]
fn two_checks_rolling_the_same_boundary_count_both() {
    loom::model(|| {
        let l = limiter(2);
        assert!(l.allow_n_at(t(10, 0), 2));
        // Both roll (10, 0, 2) to window 11 at e = 0.5 s: 2 * 0.5 = 1 weighs; one more fits.
        let a = thread::spawn(move || l.allow_at(t(11, 500)));
        let b = l.allow_at(t(11, 500));
        let a = a.join().unwrap();
        assert!(a ^ b, "one fits after the roll, not two");
        assert_eq!(state(l), counts(11, 2, 1));
    });
}

#[test]
fn two_checks_jumping_windows_both_count() {
    loom::model(|| {
        let l = limiter(2);
        assert!(l.allow_n_at(t(10, 0), 2));
        // Both jump two windows on (both counts forgotten): both fit, and both are counted.
        let a = thread::spawn(move || l.allow_at(t(12, 100)));
        let b = l.allow_at(t(12, 200));
        let a = a.join().unwrap();
        assert!(a && b);
        assert_eq!(state(l), counts(12, 0, 2));
        assert!(!l.allow_at(t(12, 300)));
    });
}

#[test]
fn allow_n_vs_allow_is_all_or_nothing() {
    loom::model(|| {
        let l = limiter(3);
        assert!(l.allow_at(t(10, 0)));
        let a = thread::spawn(move || l.allow_n_at(t(10, 400), 2));
        let b = l.allow_at(t(10, 400));
        let a = a.join().unwrap();
        match (a, b) {
            // allow_n first: 1 + 2 = 3; the allow is denied and wrote nothing.
            (true, false) => assert_eq!(state(l), counts(10, 0, 3)),
            // allow first: 2; then 2 + 2 > 3: denied, nothing written.
            (false, true) => assert_eq!(state(l), counts(10, 0, 2)),
            other => panic!("no sequential order gives {other:?}: {}", state(l)),
        }
    });
}
