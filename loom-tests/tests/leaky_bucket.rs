//! loom models of the leaky bucket's CAS loop: every interleaving of two operations on one
//! limiter ends in the state of some sequential order of them, and never over-grants.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test leaky_bucket
#![cfg(loom)]

use std::time::Duration;

use loom::thread;
use turnstile::{LeakyBucket, Limiter, ManualClock, Nanos};

const SEC: u64 = 1_000_000_000;

/// loom threads must be 'static: leak one small limiter per explored execution. One permit
/// per second (T = 1 s).
fn limiter(slack: u32) -> &'static LeakyBucket<ManualClock> {
    Box::leak(Box::new(
        LeakyBucket::builder(1)
            .per(Duration::from_secs(1))
            .slack(slack)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

fn t(ns: u64) -> Nanos {
    Nanos::new(ns)
}

#[test]
fn take_vs_take_gets_distinct_consecutive_permits() {
    loom::model(|| {
        let l = limiter(0);
        assert_eq!(l.take_at(t(0)), t(0));
        let a = thread::spawn(move || l.take_at(t(0)));
        let b = l.take_at(t(0));
        let a = a.join().unwrap();
        let mut permits = [a, b];
        permits.sort();
        assert_eq!(permits, [t(SEC), t(2 * SEC)]);
        assert_eq!(l.take_at(t(0)), t(3 * SEC), "both were recorded");
    });
}

#[test]
fn first_take_vs_first_take_only_one_is_first() {
    loom::model(|| {
        let l = limiter(3);
        let a = thread::spawn(move || l.take_at(t(5)));
        let b = l.take_at(t(5));
        let a = a.join().unwrap();
        let mut permits = [a, b];
        permits.sort();
        assert_eq!(permits, [t(5), t(5 + SEC)]);
    });
}

#[test]
fn take_vs_take_after_idling_share_the_slack() {
    loom::model(|| {
        let l = limiter(1);
        assert_eq!(l.take_at(t(0)), t(0));
        let now = t(100 * SEC);
        // Both take from one bank of slack + 1 = 2 immediate permits; a third waits.
        let a = thread::spawn(move || l.take_at(now));
        let b = l.take_at(now);
        let a = a.join().unwrap();
        assert_eq!((a, b), (now, now));
        assert_eq!(l.take_at(now), t(101 * SEC));
    });
}

#[test]
fn try_take_vs_take_with_one_permit_available() {
    loom::model(|| {
        let l = limiter(0);
        assert_eq!(l.take_at(t(0)), t(0));
        let a = thread::spawn(move || l.try_take_at(t(SEC)));
        let b = l.take_at(t(SEC));
        let a = a.join().unwrap();
        if a {
            // try_take first: the take queues behind it.
            assert_eq!(b, t(2 * SEC));
            assert_eq!(l.take_at(t(SEC)), t(3 * SEC));
        } else {
            // take first: it got the permit due now; try_take wrote nothing.
            assert_eq!(b, t(SEC));
            assert_eq!(l.take_at(t(SEC)), t(2 * SEC));
        }
    });
}

#[test]
fn try_take_vs_try_take_with_one_permit_available_exactly_one_wins() {
    loom::model(|| {
        let l = limiter(0);
        assert_eq!(l.take_at(t(0)), t(0));
        let a = thread::spawn(move || l.try_take_at(t(SEC)));
        let b = l.try_take_at(t(SEC));
        let a = a.join().unwrap();
        assert!(
            a ^ b,
            "exactly one of two racing try_takes gets the one permit"
        );
        assert_eq!(l.take_at(t(SEC)), t(2 * SEC));
    });
}

#[test]
fn check_n_vs_take_is_all_or_nothing() {
    loom::model(|| {
        let l = limiter(2);
        assert_eq!(l.take_at(t(0)), t(0));
        let now = t(100 * SEC); // 3 permits banked
        let a = thread::spawn(move || l.check_n_at(now, 3).is_ok());
        let b = l.take_at(now);
        let a = a.join().unwrap();
        if a {
            // check first took all three; the take waits one perRequest.
            assert_eq!(b, t(101 * SEC));
            assert_eq!(l.take_at(now), t(102 * SEC));
        } else {
            // take first left two: the check of three is denied and wrote nothing.
            assert_eq!(b, now);
            assert!(l.check_n_at(now, 2).is_ok());
            assert!(!l.try_take_at(now));
        }
    });
}

#[test]
fn earlier_clock_reading_vs_later_one_never_over_grants() {
    loom::model(|| {
        let l = limiter(0);
        assert_eq!(l.take_at(t(10 * SEC)), t(10 * SEC));
        // One thread reads a time long before the other's: its take lands after the other's
        // permit whatever the order, and only one permit is due at 11 s.
        let a = thread::spawn(move || l.try_take_at(t(11 * SEC)));
        let b = l.try_take_at(t(SEC));
        let a = a.join().unwrap();
        assert!(!b, "a reading before the last permit is never granted");
        assert!(a);
        assert_eq!(l.take_at(t(11 * SEC)), t(12 * SEC));
    });
}
