//! `Sometimes`: the upstream Output examples (x/time/rate `sometimes_test.go`), edge cases,
//! a differential test against a literal port of Go's `Do`, and concurrency tests.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use proptest::prelude::*;
use turnstile::{ManualClock, Nanos, Sometimes};

const SEC: Duration = Duration::from_secs(1);

/// Makes the calls at `times` (1-based call numbers in the result) and returns the call
/// numbers that ran `f`, checking that `run_at`'s return value agrees with `f` running.
fn runs<C: turnstile::Clock>(s: &Sometimes<C>, times: &[Nanos]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, &t) in times.iter().enumerate() {
        let mut ran = false;
        let returned = s.run_at(t, || ran = true);
        assert_eq!(
            returned, ran,
            "run_at's return value must say whether f ran"
        );
        if ran {
            out.push(i + 1);
        }
    }
    out
}

fn at(secs: u64) -> Nanos {
    Nanos::new(secs * 1_000_000_000)
}

// ---- the upstream Output examples ----

#[test]
fn example_zero_value_runs_once() {
    let s = Sometimes::new();
    assert_eq!(runs(&s, &[at(0); 3]), [1]);
    assert_eq!(s.count(), 3);
}

#[test]
fn example_first_2() {
    let s = Sometimes::new().first(2);
    assert_eq!(runs(&s, &[at(0); 3]), [1, 2]);
}

#[test]
fn example_every_2() {
    let s = Sometimes::new().every(2);
    assert_eq!(runs(&s, &[at(0); 3]), [1, 3]);
}

#[test]
fn example_interval_1s() {
    // Calls 1 and 2, sleep 1s, call 3.
    let s = Sometimes::new().interval(SEC);
    let t0 = at(10);
    assert_eq!(runs(&s, &[t0, t0, t0 + SEC]), [1, 3]);
}

#[test]
fn example_first_every_interval() {
    // {First:2, Every:2, Interval:2s}: calls 1, 2, 3, sleep 2s, calls 4, 5, 6.
    let s = Sometimes::new().first(2).every(2).interval(2 * SEC);
    let t0 = at(10);
    let t1 = t0 + 2 * SEC;
    // 1, 2 by First; 3 by Every; 4 by Interval (2s since run 3); 5 by Every; 6 by none.
    assert_eq!(runs(&s, &[t0, t0, t0, t1, t1, t1]), [1, 2, 3, 4, 5]);
    assert_eq!(s.count(), 6);
}

// ---- clocks, filters and edges ----

#[test]
fn run_reads_the_clock_for_interval() {
    let clock = ManualClock::new(at(5));
    let s = Sometimes::with_clock(clock.clone()).interval(SEC);
    assert!(s.run(|| ()));
    assert!(!s.run(|| ()));
    clock.advance(SEC - Duration::from_nanos(1));
    assert!(!s.run(|| ()));
    clock.advance(Duration::from_nanos(1));
    assert!(s.run(|| ()));
    assert!(!s.run(|| ()));
    assert_eq!(s.count(), 5);
}

#[test]
fn interval_is_measured_from_the_latest_run_by_any_filter() {
    let ms = |m: u64| Nanos::new(m * 1_000_000);
    // Every:3 runs call 4 at 1.5s, so call 5 at 2s is not 2s after the latest run (it would
    // be if the interval counted from call 1); call 7 runs by Every.
    let s = Sometimes::new().every(3).interval(2 * SEC);
    let got = runs(
        &s,
        &[
            ms(0),
            ms(500),
            ms(1000),
            ms(1500),
            ms(2000),
            ms(3400),
            ms(3500),
        ],
    );
    assert_eq!(got, [1, 4, 7]);
    // Every:4 runs call 5 at 2s; call 7 runs by Interval exactly 2s later, call 6 not.
    let s = Sometimes::new().every(4).interval(2 * SEC);
    let got = runs(
        &s,
        &[
            ms(0),
            ms(500),
            ms(1000),
            ms(1500),
            ms(2000),
            ms(3999),
            ms(4000),
        ],
    );
    assert_eq!(got, [1, 5, 7]);
}

#[test]
fn zero_interval_is_off_and_does_not_panic() {
    let s = Sometimes::new().interval(Duration::ZERO);
    assert_eq!(
        runs(&s, &[Nanos::ZERO, Nanos::MAX, Nanos::ZERO, Nanos::MAX]),
        [1]
    );
    let s = Sometimes::new().every(2).interval(Duration::ZERO);
    assert_eq!(runs(&s, &[Nanos::MAX, Nanos::ZERO, Nanos::MAX]), [1, 3]);
}

#[test]
fn max_interval_does_not_panic() {
    let s = Sometimes::new().interval(Duration::MAX);
    let times = [
        Nanos::ZERO,
        Nanos::MAX,
        Nanos::ZERO,
        Nanos::MAX,
        Nanos::new(1),
    ];
    assert_eq!(runs(&s, &times), [1]);
    // Started at the end of time, too.
    let s = Sometimes::new().first(2).interval(Duration::MAX);
    assert_eq!(
        runs(&s, &[Nanos::MAX, Nanos::MAX, Nanos::ZERO, Nanos::MAX]),
        [1, 2]
    );
    // Longer than u64::MAX ns (by 0.29 s): saturates rather than wrapping to 0.29 s.
    let s = Sometimes::new().interval(Duration::from_secs(18_446_744_074));
    assert_eq!(runs(&s, &[Nanos::ZERO, at(1), at(1_000)]), [1]);
    // The longest representable interval still fires across the whole time range.
    let s = Sometimes::new().interval(Duration::from_nanos(u64::MAX - 1));
    assert_eq!(
        runs(&s, &[Nanos::ZERO, Nanos::new(u64::MAX - 2), Nanos::MAX]),
        [1, 3]
    );
}

#[test]
fn earlier_times_never_rewind_the_interval() {
    // Upstream would set last = 1s after call 3 and run call 4 at 2.5s; here the interval
    // keeps counting from the latest run (10s).
    let s = Sometimes::new().every(3).interval(SEC);
    let ms = |m: u64| Nanos::new(m * 1_000_000);
    assert_eq!(
        runs(
            &s,
            &[ms(10_000), ms(10_000), ms(10_000), ms(1_000), ms(2_500)]
        ),
        [1, 4]
    );
    // And a time before the last run is never "an interval later".
    let s = Sometimes::new().interval(SEC);
    assert_eq!(runs(&s, &[at(100), at(0), at(50), at(101)]), [1, 4]);
}

#[test]
fn run_is_reentrant() {
    let s = Sometimes::new().every(2);
    let mut inner = None;
    assert!(s.run(|| {
        // Upstream deadlocks here; ticket 1 is not a multiple of 2.
        inner = Some(s.run(|| panic!("ticket 1 must not run")));
    }));
    assert_eq!(inner, Some(false));
    assert!(s.run(|| ())); // ticket 2
    assert_eq!(s.count(), 3);
}

#[test]
fn first_and_every_combine() {
    let s = Sometimes::new().first(3).every(5);
    let got = runs(&s, &[Nanos::ZERO; 12]);
    assert_eq!(got, [1, 2, 3, 6, 11]);
    let s = Sometimes::new().first(1);
    assert_eq!(runs(&s, &[Nanos::ZERO; 3]), [1]);
    let s = Sometimes::new().every(1);
    assert_eq!(runs(&s, &[Nanos::ZERO; 3]), [1, 2, 3]);
}

#[test]
fn debug_shows_state() {
    let s = Sometimes::with_clock(ManualClock::default()).interval(SEC);
    assert!(format!("{s:?}").contains("last: None"));
    s.run_at(Nanos::new(42), || ());
    let d = format!("{s:?}");
    assert!(
        d.contains("count: 1") && d.contains("last: Some(42ns)"),
        "{d}"
    );
}

#[test]
fn sometimes_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Sometimes>();
    check::<Sometimes<ManualClock>>();
}

// ---- differential: a literal port of Go's Do ----

/// x/time/rate `Sometimes.Do`, serialised by `&mut self`, with `time.Now` replaced by the
/// call's time (so the time after `f` is the same as before it).
struct GoSometimes {
    first: u64,
    every: u64,
    interval: u64,
    count: u64,
    last: Option<u64>, // the zero time.Time: time.Since(zero) is huge
}

impl GoSometimes {
    fn run(&mut self, now: u64) -> bool {
        let ran = self.count == 0
            || (self.first > 0 && self.count < self.first)
            || (self.every > 0 && self.count.is_multiple_of(self.every))
            || (self.interval > 0
                && self
                    .last
                    .is_none_or(|l| now as i128 - l as i128 >= self.interval as i128));
        if ran && self.interval > 0 {
            self.last = Some(now);
        }
        self.count += 1;
        ran
    }
}

proptest! {
    /// Serialised calls with non-decreasing times run `f` exactly when Go would.
    #[test]
    fn matches_upstream_serially(
        first in 0u64..5,
        every in 0u64..5,
        interval in prop_oneof![Just(0u64), 1u64..50],
        start in 0u64..1_000,
        steps in proptest::collection::vec(0u64..30, 1..60),
    ) {
        let s = Sometimes::with_clock(ManualClock::default())
            .first(first)
            .every(every)
            .interval(Duration::from_nanos(interval));
        let mut go = GoSometimes { first, every, interval, count: 0, last: None };
        let mut now = start;
        for (i, step) in steps.into_iter().enumerate() {
            now += step;
            prop_assert_eq!(s.run_at(Nanos::new(now), || ()), go.run(now), "call {}", i + 1);
        }
        prop_assert_eq!(s.count(), go.count);
    }
}

// ---- concurrency ----

const THREADS: usize = 8;
const CALLS: usize = 10_000;

/// Runs `CALLS` calls on each of `THREADS` threads, all released together; each call's time
/// comes from `time`. Returns the times of the runs.
fn hammer<C: turnstile::Clock + 'static>(
    s: Arc<Sometimes<C>>,
    time: impl Fn() -> Nanos + Send + Sync + 'static,
) -> Vec<Nanos> {
    let time = Arc::new(time);
    let ran = Arc::new(Mutex::new(Vec::new()));
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (s, time, ran, barrier) = (s.clone(), time.clone(), ran.clone(), barrier.clone());
            thread::spawn(move || {
                let mut mine = Vec::new();
                barrier.wait();
                for _ in 0..CALLS {
                    let t = time();
                    if s.run_at(t, || ()) {
                        mine.push(t);
                    }
                }
                ran.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(s.count(), (THREADS * CALLS) as u64);
    Arc::try_unwrap(ran).unwrap().into_inner().unwrap()
}

#[test]
fn concurrent_every_is_exact() {
    let n = (THREADS * CALLS) as u64;
    for k in [1u64, 2, 3, 7, 1_000, n, n + 1] {
        let s = Arc::new(Sometimes::with_clock(ManualClock::default()).every(k));
        let got = hammer(s, || Nanos::ZERO).len() as u64;
        assert_eq!(got, n.div_ceil(k), "every({k})");
    }
}

#[test]
fn concurrent_first_and_every_are_exact() {
    let n = (THREADS * CALLS) as u64;
    let s = Arc::new(
        Sometimes::with_clock(ManualClock::default())
            .first(10)
            .every(7),
    );
    let got = hammer(s, || Nanos::ZERO).len() as u64;
    // Tickets 0..10, plus the multiples of 7 from 14 on.
    let expected = 10 + (0..n).filter(|t| t % 7 == 0 && *t >= 10).count() as u64;
    assert_eq!(got, expected);
}

/// A frozen clock whose first read is slow. That read is almost always ticket 0's, which is
/// then still between taking its ticket and publishing its time while the other threads make
/// their calls (the window the `NEVER` sentinel covers).
struct SlowFirstRead {
    now: Nanos,
    first: std::sync::atomic::AtomicBool,
}

impl turnstile::Clock for SlowFirstRead {
    fn now(&self) -> Nanos {
        if !self.first.swap(true, Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(50));
        }
        self.now
    }
}

#[test]
fn concurrent_interval_with_a_frozen_clock_runs_once() {
    let clock = SlowFirstRead {
        now: at(3),
        first: Default::default(),
    };
    let s = Arc::new(Sometimes::with_clock(clock).interval(Duration::from_nanos(1)));
    let calls = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (s, calls, runs, barrier) =
                (s.clone(), calls.clone(), runs.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for _ in 0..CALLS {
                    calls.fetch_add(1, Ordering::Relaxed);
                    // Through the clock, which never advances.
                    s.run(|| {
                        runs.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(runs.load(Ordering::Relaxed), 1);
    assert_eq!(s.count(), (THREADS * CALLS) as u64);
}

#[test]
fn concurrent_interval_runs_are_spaced() {
    // Time advances 1µs on every read; interval runs must be >= 50µs apart (by the times the
    // runs were decided at), however the threads interleave.
    let interval = Duration::from_micros(50);
    let s = Arc::new(Sometimes::with_clock(ManualClock::default()).interval(interval));
    let tick = Arc::new(AtomicU64::new(0));
    let mut times = hammer(s, move || {
        Nanos::new(tick.fetch_add(1_000, Ordering::Relaxed))
    });
    times.sort();
    let total = (THREADS * CALLS) as u64 * 1_000; // the span of time in ns
    assert!(
        times.len() >= 2,
        "the interval must fire: {} runs",
        times.len()
    );
    assert!(
        times.len() as u64 <= total / 50_000 + 1,
        "{} runs",
        times.len()
    );
    for w in times.windows(2) {
        assert!(w[1] - w[0] >= interval, "runs at {:?} and {:?}", w[0], w[1]);
    }
}
