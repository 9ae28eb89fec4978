//! loom models of the fixed window's CAS loop: every interleaving of two takes on one limiter
//! ends as some sequential order of them would, across a window boundary too, with no grant
//! lost or counted twice.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test window
#![cfg(loom)]

use std::time::Duration;

use loom::thread;
use turnstile::{FixedWindow, Limiter, ManualClock, Nanos, Outcome};

/// loom threads must be 'static: leak one small limiter per explored execution. Windows of
/// 10 ns from the first hit.
fn window(quota: u32) -> &'static FixedWindow<ManualClock> {
    Box::leak(Box::new(
        FixedWindow::builder(quota, Duration::from_nanos(10))
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

fn t(ns: u64) -> Nanos {
    Nanos::new(ns)
}

#[test]
fn take_vs_take_at_the_last_unit_exactly_one_wins() {
    loom::model(|| {
        let w = window(3);
        assert_eq!(w.take_n_at(t(0), 2), Outcome::Allowed);
        let a = thread::spawn(move || w.take_at(t(1)));
        let b = w.take_at(t(2));
        let a = a.join().unwrap();
        let mut got = [a, b];
        got.sort_by_key(|o| *o as u8);
        assert_eq!(got, [Outcome::HitQuota, Outcome::OverQuota]);
        assert_eq!(w.status_at(t(3)).remaining, 0);
    });
}

#[test]
fn take_vs_take_across_a_window_boundary() {
    loom::model(|| {
        let w = window(2);
        // Window [0, 10) is full.
        assert_eq!(w.take_n_at(t(0), 2), Outcome::HitQuota);
        // One thread still reads time 5 (old window), the other 10 (the next one).
        let a = thread::spawn(move || w.take_at(t(5)));
        let b = w.take_at(t(10));
        let a = a.join().unwrap();
        // b always opens [10, 20) with one grant.
        let s = w.status_at(t(11));
        assert_eq!(s.resets_at, t(20));
        match a {
            // a ran first, in the full old window.
            Outcome::OverQuota => {
                assert_eq!(b, Outcome::Allowed);
                assert_eq!(s.remaining, 1);
            }
            // a ran second: its stale time is counted in the new window, never a third.
            Outcome::HitQuota => {
                assert_eq!(b, Outcome::Allowed);
                assert_eq!(s.remaining, 0);
            }
            Outcome::Allowed => panic!("a stale take cannot open a window"),
        }
    });
}

#[test]
fn two_takes_opening_the_next_window_open_it_once() {
    loom::model(|| {
        let w = window(2);
        assert_eq!(w.take_at(t(0)), Outcome::Allowed);
        let a = thread::spawn(move || w.take_at(t(12)));
        let b = w.take_at(t(15));
        let a = a.join().unwrap();
        let mut got = [a, b];
        got.sort_by_key(|o| *o as u8);
        assert_eq!(got, [Outcome::Allowed, Outcome::HitQuota]);
        let s = w.status_at(t(16));
        assert_eq!(s.remaining, 0);
        // Whoever came first opened the window at its own time.
        let end = s.resets_at.as_u64();
        assert!(end == 22 || end == 25, "{end}");
    });
}

#[test]
fn take_n_vs_check_no_lost_or_double_counted_grant() {
    loom::model(|| {
        let w = window(4);
        assert_eq!(w.take_at(t(0)), Outcome::Allowed);
        let a = thread::spawn(move || w.take_n_at(t(1), 2));
        let b = w.check_n_at(t(1), 2);
        let a = a.join().unwrap();
        // 1 + 2 + 2 > 4: exactly one of the two gets its 2.
        assert!(a.is_permitted() != b.is_ok(), "{a:?} {b:?}");
        assert_eq!(w.status_at(t(2)).remaining, 1);
        if let Err(d) = b {
            assert_eq!(d.retry_at(), Some(t(10)));
        }
    });
}
