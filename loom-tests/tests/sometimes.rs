//! loom models of `Sometimes`'s protocol: the `fetch_add` ticket, the `fetch_max` publication
//! of count-triggered runs, and the CAS that claims an interval slot.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test sometimes`.
#![cfg(loom)]

use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use loom_tests::model_3_threads;
use turnstile::{ManualClock, Nanos, Sometimes};

/// A `Sometimes` on a manual clock (no real clock under loom; the calls use `run_at`).
fn sometimes() -> Sometimes<ManualClock> {
    Sometimes::with_clock(ManualClock::default())
}

/// Two concurrent calls at the same time with only Interval set: the ticket-0 call runs `f`,
/// and the other must not claim an interval slot, whether or not it sees the first run's
/// publication (`NEVER` means "the first run is in progress").
#[test]
fn interval_two_threads_same_time_run_once() {
    loom::model(|| {
        let s = Arc::new(sometimes().interval(Duration::from_secs(1)));
        let runs = Arc::new(AtomicUsize::new(0));
        // Later than one interval after the origin, so that reading `NEVER` as a time
        // (rather than as "in progress") would let the second call run.
        let t = Nanos::new(10_000_000_000);
        let handle = {
            let (s, runs) = (s.clone(), runs.clone());
            thread::spawn(move || {
                s.run_at(t, || {
                    runs.fetch_add(1, Ordering::Relaxed);
                })
            })
        };
        let mine = s.run_at(t, || {
            runs.fetch_add(1, Ordering::Relaxed);
        });
        let theirs = handle.join().unwrap();
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert!(mine ^ theirs);
        assert_eq!(s.count(), 2);
    });
}

/// After a first run at 0, two concurrent calls at 10 with Interval 5 are both due: the CAS
/// lets exactly one of them claim the slot.
#[test]
fn interval_slot_claimed_once() {
    model_3_threads(|| {
        let s = Arc::new(sometimes().interval(Duration::from_nanos(5)));
        assert!(s.run_at(Nanos::ZERO, || ()));
        let runs = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (s, runs) = (s.clone(), runs.clone());
                thread::spawn(move || {
                    s.run_at(Nanos::new(10), || {
                        runs.fetch_add(1, Ordering::Relaxed);
                    });
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert_eq!(s.count(), 3);
    });
}

/// Three calls at times 0, 4 and 8 with Interval 5, on three threads: whatever the order, the
/// times of the runs are pairwise at least 5 apart (the only possible run sets are one call,
/// or the calls at 0 and 8), and the ticket-0 call always runs.
#[test]
fn interval_runs_are_spaced() {
    model_3_threads(|| {
        let s = Arc::new(sometimes().interval(Duration::from_nanos(5)));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = [0u64, 4]
            .into_iter()
            .map(|t| {
                let (s, ran) = (s.clone(), ran.clone());
                thread::spawn(move || {
                    if s.run_at(Nanos::new(t), || ()) {
                        ran.lock().unwrap().push(t);
                    }
                })
            })
            .collect();
        if s.run_at(Nanos::new(8), || ()) {
            ran.lock().unwrap().push(8);
        }
        for h in handles {
            h.join().unwrap();
        }
        let mut ran = ran.lock().unwrap().clone();
        ran.sort();
        assert!(!ran.is_empty());
        for w in ran.windows(2) {
            assert!(w[1] - w[0] >= 5, "runs at {ran:?}");
        }
        assert_eq!(s.count(), 3);
    });
}

/// Every:2, three calls over two threads: tickets 0 and 2 run, ticket 1 does not.
#[test]
fn every_two_threads_three_calls_run_twice() {
    loom::model(|| {
        let s = Arc::new(sometimes().every(2));
        let runs = Arc::new(AtomicUsize::new(0));
        let handle = {
            let (s, runs) = (s.clone(), runs.clone());
            thread::spawn(move || {
                for _ in 0..2 {
                    s.run_at(Nanos::ZERO, || {
                        runs.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        };
        s.run_at(Nanos::ZERO, || {
            runs.fetch_add(1, Ordering::Relaxed);
        });
        handle.join().unwrap();
        assert_eq!(runs.load(Ordering::Relaxed), 2);
        assert_eq!(s.count(), 3);
    });
}

/// Every:2, three calls on three threads: exactly two runs.
#[test]
fn every_three_threads_run_twice() {
    model_3_threads(|| {
        let s = Arc::new(sometimes().every(2));
        let runs = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (s, runs) = (s.clone(), runs.clone());
                thread::spawn(move || {
                    s.run_at(Nanos::ZERO, || {
                        runs.fetch_add(1, Ordering::Relaxed);
                    });
                })
            })
            .collect();
        s.run_at(Nanos::ZERO, || {
            runs.fetch_add(1, Ordering::Relaxed);
        });
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(runs.load(Ordering::Relaxed), 2);
        assert_eq!(s.count(), 3);
    });
}

/// Every:2 with Interval, all at one time: three calls on three threads run `f` exactly twice
/// (tickets 0 and 2). Ticket 1 must not claim an interval slot: the only earlier run is
/// ticket 0's at the same time, which it either sees or sees as in progress.
#[test]
fn every_and_interval_same_time_run_twice() {
    model_3_threads(|| {
        let s = Arc::new(sometimes().every(2).interval(Duration::from_nanos(10)));
        let runs = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (s, runs) = (s.clone(), runs.clone());
                thread::spawn(move || {
                    s.run_at(Nanos::new(100), || {
                        runs.fetch_add(1, Ordering::Relaxed);
                    });
                })
            })
            .collect();
        s.run_at(Nanos::new(100), || {
            runs.fetch_add(1, Ordering::Relaxed);
        });
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(runs.load(Ordering::Relaxed), 2);
        assert_eq!(s.count(), 3);
    });
}

/// Every:2 with Interval 5: after runs at 0 (ticket 0) and 10 (an interval claim), a call at
/// 2 and one at 12 race for tickets 2 and 3. Ticket 2 runs by count whatever its time; ticket 3
/// is 2 ns after the run at 10 (or before it) and must not claim. A count run at the earlier
/// time must not move `last` back (it is published with `fetch_max`): from `last` = 2 the call
/// at 12 would claim a slot 2 ns after the run at 10.
#[test]
fn count_run_at_an_earlier_time_never_moves_the_interval_back() {
    loom::model(|| {
        let s = Arc::new(sometimes().every(2).interval(Duration::from_nanos(5)));
        assert!(s.run_at(Nanos::new(0), || ()));
        assert!(s.run_at(Nanos::new(10), || ()));
        let runs = Arc::new(AtomicUsize::new(0));
        let handle = {
            let (s, runs) = (s.clone(), runs.clone());
            thread::spawn(move || {
                s.run_at(Nanos::new(2), || {
                    runs.fetch_add(1, Ordering::Relaxed);
                })
            })
        };
        let mine = s.run_at(Nanos::new(12), || {
            runs.fetch_add(1, Ordering::Relaxed);
        });
        let theirs = handle.join().unwrap();
        assert!(mine ^ theirs, "only ticket 2 runs");
        assert_eq!(runs.load(Ordering::Relaxed), 1);
        assert_eq!(s.count(), 4);
    });
}
