//! `LeakyMeter`, the water-level leaky bucket: its semantics (one test per rule), a
//! differential test against the literal float water model of the go-zero article, a
//! two-thread stress test on the real clock, and bad input.
//!
//! The model is the article's algorithm, written here in floats:
//! `water = max(0, water - (now - last) * leak); last = now; fits = water + n <= capacity`.
//! The meter is GCRA in 2^-32 ns ticks, so the two agree on every decision except where the
//! float model lands within 1e-9 (relative to the capacity) of the brim, a float tie that
//! either side may break either way; a sequence stops at a tie decided differently, and the
//! tally counts those (`Stop::TieDisagreed`).

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use turnstile::{Clock, ConfigError, Idle, LeakyMeter, Limit, Limiter, ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

fn meter(capacity: u32, leak: f64) -> LeakyMeter<ManualClock> {
    LeakyMeter::builder(capacity, Limit::per_second(leak).unwrap())
        .clock(ManualClock::default())
        .build()
        .unwrap()
}

// ---- semantics ---------------------------------------------------------------------------

#[test]
fn capacity_three_leaking_one_per_second() {
    let m = meter(3, 1.0);
    assert_eq!(m.capacity(), 3);
    assert_eq!(m.leak_rate(), Limit::per_second(1.0).unwrap());
    assert_eq!(m.level_at(at(0)), 0.0); // starts empty
    assert!(m.allow_at(at(0)));
    assert!(m.allow_at(at(0)));
    assert!(m.allow_at(at(0)));
    assert!(!m.allow_at(at(0))); // the 4th overflows
    assert_eq!(m.level_at(at(0)), 3.0);
    assert!(!m.allow_at(at(SEC - 1))); // not quite one unit leaked
    assert!(m.allow_at(at(SEC))); // one unit leaked: one more fits
    assert!(!m.allow_at(at(SEC)));
    assert_eq!(m.level_at(at(SEC)), 3.0);
    // Nothing more for a while, then the bucket drains at 1/s and stays empty.
    assert_eq!(m.level_at(at(SEC + 500 * MS)), 2.5);
    assert_eq!(m.level_at(at(3 * SEC)), 1.0);
    assert_eq!(m.level_at(at(4 * SEC)), 0.0);
    assert_eq!(m.level_at(at(100 * SEC)), 0.0);
    assert!(m.allow_n_at(at(100 * SEC), 3));
}

#[test]
fn level_follows_the_water() {
    let m = meter(10, 4.0);
    assert!(m.allow_n_at(at(0), 7));
    assert_eq!(m.level_at(at(0)), 7.0);
    assert_eq!(m.level_at(at(250 * MS)), 6.0);
    assert_eq!(m.level_at(at(1_125 * MS)), 2.5);
    assert_eq!(m.level_at(at(2 * SEC)), 0.0);
    // Reading the level changes nothing.
    assert_eq!(m.level_at(at(250 * MS)), 6.0);
    assert!(m.allow_n_at(at(SEC), 7)); // 3 + 7 = 10: exactly to the brim
    assert_eq!(m.level_at(at(SEC)), 10.0);
    // The plain forms read the meter's clock.
    let clock = ManualClock::new(at(0));
    let m = LeakyMeter::builder(2, Limit::per_second(2.0).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(m.allow_n(2));
    assert!(!m.allow());
    clock.advance(Duration::from_millis(250));
    assert_eq!(m.level(), 1.5);
    assert!(!m.allow());
    clock.advance(Duration::from_millis(250));
    assert!(m.allow());
    assert_eq!(m.clock().now(), at(500 * MS));
}

#[test]
fn allow_n_is_all_or_nothing() {
    let m = meter(5, 1.0);
    assert!(m.allow_n_at(at(0), 3));
    assert!(!m.allow_n_at(at(0), 3)); // 3 + 3 > 5: nothing added
    assert_eq!(m.level_at(at(0)), 3.0);
    assert!(m.allow_n_at(at(0), 2));
    assert!(!m.allow_n_at(at(0), 1));
    assert!(m.allow_n_at(at(0), 0)); // zero units always fit
    assert!(!m.allow_n_at(at(0), 6)); // more than the capacity never fits
    assert!(!m.allow_n_at(at(1000 * SEC), 6));
    assert_eq!(m.level_at(at(0)), 5.0);
    assert!(m.allow_n_at(at(1000 * SEC), 5));
}

#[test]
fn retry_after_is_when_enough_water_has_leaked() {
    let m = meter(3, 1.0);
    assert!(m.check_n_at(at(0), 3).is_ok());
    for n in 1..=3u64 {
        let d = m.check_n_at(at(0), n as u32).unwrap_err();
        assert_eq!(d.checked_at(), at(0));
        assert_eq!(d.retry_at(), Some(at(n * SEC)));
        assert_eq!(d.retry_after(), Some(Duration::from_secs(n)));
    }
    let d = m.check_n_at(at(250 * MS), 1).unwrap_err();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(750)));
    assert_eq!(m.check_n_at(at(0), 4).unwrap_err().retry_at(), None);
    // The retry time is exact: a nanosecond earlier is refused, at it the request fits.
    let retry = m.check_n_at(at(0), 2).unwrap_err().retry_at().unwrap();
    assert!(m.check_n_at(at(retry.as_u64() - 1), 2).is_err());
    assert!(m.check_n_at(retry, 2).is_ok());
    // A leak that does not divide a second evenly rounds the retry time up to the first
    // nanosecond at which the request fits.
    let m = meter(1, 3.0);
    assert!(m.allow_at(at(0)));
    let retry = m.check_n_at(at(0), 1).unwrap_err().retry_at().unwrap();
    assert_eq!(retry, at(333_333_334));
    assert!(!m.allow_at(at(333_333_333)));
    assert!(m.allow_at(retry));
}

#[test]
fn limiter_trait_delegates_to_the_bucket() {
    fn admit<L: Limiter>(l: &L, n: u32) -> bool {
        l.check_n(n).is_ok()
    }
    let clock = ManualClock::new(at(5 * SEC));
    let m = LeakyMeter::builder(2, Limit::per_second(1.0).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(Limiter::now(&m), at(5 * SEC));
    assert!(admit(&m, 2));
    assert!(!admit(&m, 1));
    assert_eq!(m.check().unwrap_err().retry_at(), Some(at(6 * SEC)));
    clock.advance(Duration::from_secs(1));
    assert!(admit(&m, 1));
}

#[test]
fn zero_leak_never_drains_and_inf_never_fills() {
    let m = LeakyMeter::builder(3, Limit::ZERO)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(m.allow_n_at(at(0), 2));
    assert!(m.allow_at(at(SEC)));
    assert!(!m.allow_at(at(1_000_000 * SEC)));
    assert_eq!(m.level_at(at(1_000_000 * SEC)), 3.0);
    assert_eq!(m.check_n_at(at(SEC), 1).unwrap_err().retry_at(), None);

    let m = LeakyMeter::builder(3, Limit::INF)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    for i in 0..10_000 {
        assert!(m.allow_n_at(at(i), 3));
    }
    assert_eq!(m.level_at(at(0)), 0.0);
    assert_eq!(m.level_at(at(SEC)), 0.0);
    // More than the capacity never fits, even when nothing ever fills the bucket.
    assert!(!m.allow_n_at(at(SEC), 4));
    assert_eq!(m.check_n_at(at(SEC), 4).unwrap_err().retry_at(), None);
}

/// D2: an earlier time never drains water; the level seen at an earlier time counts all the
/// water added so far, and `last` does not move back.
#[test]
fn an_earlier_time_never_drains_water() {
    let m = meter(3, 1.0);
    assert!(m.allow_n_at(at(10 * SEC), 3));
    // At 9 s the 3 units added at 10 s would have leaked only from 9 s: the bucket counts
    // them all (capped at the capacity) and admits nothing.
    assert_eq!(m.level_at(at(9 * SEC)), 3.0);
    assert!(!m.allow_at(at(9 * SEC)));
    assert!(!m.allow_at(at(SEC)));
    assert!(!m.allow_n_at(at(SEC), 0)); // the counted water exceeds the capacity
    assert!(m.allow_n_at(at(10 * SEC), 0));
    assert_eq!(m.level_at(at(11 * SEC)), 2.0);
    assert!(m.allow_at(at(11 * SEC)));
    // Jumping back and forth mints nothing: at most capacity + leak * span units.
    let m = meter(3, 1.0);
    let mut granted = 0;
    for i in 0..1_000u64 {
        let t = if i % 2 == 0 { 20 * SEC } else { (i % 19) * SEC };
        granted += u32::from(m.allow_at(at(t)));
    }
    assert!(granted <= 3 + 20 + 1, "{granted}");
}

#[test]
fn idle_when_empty_of_water() {
    let m = meter(2, 1.0);
    assert!(m.is_idle_at(at(0)));
    assert!(m.allow_at(at(0)));
    assert!(!m.is_idle_at(at(0)));
    assert!(!m.is_idle_at(at(SEC - 1)));
    assert!(m.is_idle_at(at(SEC)));
    assert!(m.allow_n_at(at(SEC), 2));
    assert!(!m.is_idle_at(at(2 * SEC)));
    assert!(m.is_idle_at(at(3 * SEC)));
}

#[test]
fn debug_shows_capacity_leak_and_level() {
    let m = meter(3, 1.0);
    let s = format!("{m:?}");
    assert!(
        s.starts_with("LeakyMeter { capacity: 3, leak: 1/s, level: "),
        "{s}"
    );
}

// ---- bad input ---------------------------------------------------------------------------

#[test]
fn zero_capacity_is_an_error() {
    assert_eq!(
        LeakyMeter::new(0, Limit::per_second(1.0).unwrap()).unwrap_err(),
        ConfigError::ZeroCapacity
    );
    assert_eq!(
        LeakyMeter::builder(0, Limit::INF)
            .clock(ManualClock::default())
            .build()
            .unwrap_err(),
        ConfigError::ZeroCapacity
    );
    assert_eq!(
        LeakyMeter::builder(0, Limit::ZERO)
            .clock(ManualClock::default())
            .build()
            .unwrap_err(),
        ConfigError::ZeroCapacity
    );
}

#[test]
fn n_u32_max_is_refused_for_good_unless_it_fits() {
    for leak in [Limit::ZERO, Limit::per_second(1e6).unwrap(), Limit::INF] {
        let m = LeakyMeter::builder(10, leak)
            .clock(ManualClock::default())
            .build()
            .unwrap();
        assert!(!m.allow_n_at(at(SEC), u32::MAX), "{leak:?}");
        assert_eq!(
            m.check_n_at(at(SEC), u32::MAX).unwrap_err().retry_at(),
            None
        );
        assert_eq!(m.level_at(at(SEC)), 0.0); // nothing was added
        assert!(m.allow_n_at(at(SEC), 10));
    }
    // The largest bucket holds u32::MAX units, all at once.
    let m = LeakyMeter::builder(u32::MAX, Limit::per_second(1e6).unwrap())
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(m.allow_n_at(at(SEC), u32::MAX));
    assert!(!m.allow_at(at(SEC)));
    assert_eq!(m.level_at(at(SEC)), f64::from(u32::MAX));
    assert_eq!(m.level_at(at(SEC + SEC)), f64::from(u32::MAX) - 1e6);
    let d = m.check_n_at(at(SEC), u32::MAX).unwrap_err();
    // u32::MAX units leak in u32::MAX microseconds.
    assert_eq!(d.retry_at(), Some(at(SEC + u64::from(u32::MAX) * 1_000)));
}

#[test]
fn the_end_of_time_works_without_panicking() {
    let m = meter(3, 1.0);
    assert!(m.is_idle_at(Nanos::MAX));
    // The state word rebases to reach the reading; the meter fills as at any other time.
    assert!(m.allow_n_at(Nanos::MAX, 3));
    assert!(!m.allow_at(Nanos::MAX));
    assert!(m.allow_n_at(Nanos::MAX, 0));
    // The water would leak after the end of time: a retry never succeeds.
    assert_eq!(m.check_n_at(Nanos::MAX, 1).unwrap_err().retry_at(), None);
    assert_eq!(m.level_at(Nanos::MAX), 3.0);
    assert!(!m.is_idle_at(Nanos::MAX));
    // D2: an earlier reading finds no more room than the latest one left.
    assert!(!m.allow_at(at(SEC)));
    // Zero and infinite leaks do not depend on time at all.
    let m = LeakyMeter::builder(1, Limit::ZERO)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(m.allow_at(Nanos::MAX));
    assert!(!m.allow_at(Nanos::MAX));
    let m = LeakyMeter::builder(1, Limit::INF)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(m.allow_at(Nanos::MAX));
    assert!(m.allow_at(Nanos::MAX));
    // A leak so slow that draining would take past the end of time never drains.
    let m = LeakyMeter::builder(2, Limit::every(Duration::MAX))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(m.allow_n_at(at(0), 2));
    assert!(!m.allow_at(at(u64::MAX / 2)));
}

// ---- differential against the literal float model ---------------------------------------

/// The go-zero article's water-level bucket, literally, in floats.
struct Model {
    capacity: f64,
    leak: f64,
    water: f64,
    last: u64,
}

impl Model {
    /// Leaks up to `now` and reports the water then.
    fn leak_to(&mut self, now: u64) -> f64 {
        let dt = (now - self.last) as f64 / 1e9;
        self.water = (self.water - dt * self.leak).max(0.0);
        self.last = now;
        self.water
    }

    /// `(fits, tie)`: whether `n` units fit at `now` (and are added if so), and whether the
    /// comparison was within 1e-9 of the capacity (relative), i.e. a float tie, or within
    /// what the token bucket underneath rounds: each reading to a unit of at most 1/16 ns
    /// (see "Precision and range" in src/token_bucket.rs), which a full bucket can carry
    /// into its state, so two units' leak.
    fn allow_n(&mut self, now: u64, n: u32) -> (bool, bool) {
        let water = self.leak_to(now);
        let after = water + f64::from(n);
        let fits = after <= self.capacity;
        let tie = (after - self.capacity).abs() <= 1e-9 * self.capacity + self.leak / 8e9;
        if fits {
            self.water = after;
        }
        (fits, tie)
    }
}

#[derive(Clone, Debug)]
struct Setup {
    capacity: u32,
    leak: f64,
    start: u64,
}

/// How far to move the clock before an op, in units of the time one unit of water takes to
/// leak, so that every leak rate visits the interesting region; `Units` moves by a whole
/// number of units (to the nanosecond), which makes exact ties likely.
#[derive(Clone, Debug)]
enum Step {
    Same,
    Nanos(u64),
    Units(u32),
    Fraction(f64),
}

fn setup() -> impl Strategy<Value = Setup> {
    let capacity = prop_oneof![3 => 1u32..=10, 2 => 1u32..=1000];
    let leak = prop_oneof![
        1 => prop::sample::select(vec![1e-3, 0.5, 1.0, 3.0, 10.0, 1000.0, 1e6]),
        3 => (-3.0f64..6.0).prop_map(|e| 10f64.powf(e)),
    ];
    let start = prop_oneof![1 => Just(0u64), 3 => 0u64..1_000_000 * SEC];
    (capacity, leak, start).prop_map(|(capacity, leak, start)| Setup {
        capacity,
        leak,
        start,
    })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Same),
        1 => (1u64..2_000).prop_map(Step::Nanos),
        2 => (0u32..4).prop_map(Step::Units),
        4 => (0.0f64..3.0).prop_map(Step::Fraction),
        1 => (0.0f64..1500.0).prop_map(Step::Fraction),
    ]
}

/// How a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    /// Every decision agreed and no float tie came up.
    Completed,
    /// Every decision agreed, some of them at a float tie.
    CompletedThroughTies,
    /// A float tie was decided differently; the sequence stopped there.
    TieDisagreed,
}

fn run(
    s: &Setup,
    ops: &[(Step, u32)],
    worst_level_error: &AtomicU64,
) -> Result<Stop, TestCaseError> {
    let m = LeakyMeter::builder(s.capacity, Limit::per_second(s.leak).unwrap())
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let mut model = Model {
        capacity: f64::from(s.capacity),
        leak: s.leak,
        water: 0.0,
        last: s.start,
    };
    let unit_ns = 1e9 / s.leak;
    let mut now = s.start;
    let mut ties = false;
    for (i, (step, n)) in ops.iter().enumerate() {
        now += match *step {
            Step::Same => 0,
            Step::Nanos(ns) => ns,
            Step::Units(k) => (f64::from(k) * unit_ns).round() as u64,
            Step::Fraction(k) => (k * unit_ns) as u64,
        };
        let n = (*n).min(s.capacity + 1);
        let ours = m.allow_n_at(at(now), n);
        let (theirs, tie) = model.allow_n(now, n);
        if ours != theirs {
            if tie {
                return Ok(Stop::TieDisagreed);
            }
            return Err(TestCaseError::fail(format!(
                "op {i}: allow_n({n}) at {now} ({s:?}): meter {ours}, model {theirs} \
                 (model water before {})",
                model.water - if theirs { f64::from(n) } else { 0.0 }
            )));
        }
        ties |= tie;
        let level = m.level_at(at(now));
        let want = model.water;
        // 1e-6 relative, plus the token bucket's rounding of a reading to a unit (at most
        // 1/16 ns of leak; see "Precision and range" in src/token_bucket.rs).
        let err = (level - want).abs() / want.abs().max(1.0);
        worst_level_error.fetch_max(err.to_bits(), Ordering::Relaxed);
        prop_assert!(
            err <= 1e-6 + s.leak / 16e9,
            "op {}: level at {} ({:?}): meter {}, model {}",
            i,
            now,
            s,
            level,
            want
        );
        prop_assert!((0.0..=f64::from(s.capacity)).contains(&level));
    }
    Ok(if ties {
        Stop::CompletedThroughTies
    } else {
        Stop::Completed
    })
}

#[test]
fn meter_agrees_with_the_literal_water_model() {
    // n in 0..=capacity + 1, small requests weighted up (capped to capacity + 1 in `run`).
    let n = prop_oneof![3 => 0u32..=3, 1 => 0u32..=1001];
    let strategy = (setup(), prop::collection::vec((step(), n), 1..80));
    let worst = AtomicU64::new(0);
    let stats = common::tally("leaky meter vs water model", strategy, |(s, ops)| {
        run(&s, &ops, &worst)
    });
    let worst = f64::from_bits(worst.into_inner());
    eprintln!("worst level error (relative, floor 1 unit): {worst:e}");
    let total: u32 = stats.values().sum();
    let disagreed = stats.get(&Stop::TieDisagreed).copied().unwrap_or(0);
    assert!(
        disagreed * 20 <= total,
        "too many ties decided apart: {stats:?}"
    );
}

/// Scripted: fills to the brim, exact leaks of whole units (ties by construction), requests of
/// 0 and of capacity + 1, all agreeing with the model.
#[test]
fn meter_agrees_with_the_model_on_a_scripted_sequence() {
    let s = Setup {
        capacity: 3,
        leak: 1.0,
        start: 0,
    };
    let ops = vec![
        (Step::Same, 3),
        (Step::Same, 1),
        (Step::Units(1), 1),
        (Step::Fraction(0.5), 1),
        (Step::Fraction(0.5), 1),
        (Step::Same, 0),
        (Step::Same, 4),
        (Step::Units(3), 3),
        (Step::Nanos(1), 1),
    ];
    let worst = AtomicU64::new(0);
    assert_ne!(run(&s, &ops, &worst).unwrap(), Stop::TieDisagreed);
}

// ---- stress on the real clock ------------------------------------------------------------

/// Two threads hammer one meter on the quanta clock, with requests of 1 to 3 units, far
/// faster than it leaks (so the bound is tight): the water admitted never exceeds
/// `capacity + leak * (last - first)` plus one request, where `first` is a clock reading taken
/// before any request and `last` one taken after every request (so every grant is stamped in
/// between); and it is at least the capacity (the bucket starts empty).
#[test]
fn two_threads_never_overfill_the_meter() {
    const CAPACITY: u32 = 50;
    const LEAK: f64 = 20_000.0;
    const RUN: Duration = Duration::from_millis(150);
    let m = LeakyMeter::new(CAPACITY, Limit::per_second(LEAK).unwrap()).unwrap();
    let barrier = Barrier::new(2);
    let runs: Vec<(u64, Nanos, Nanos)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2u32)
            .map(|t| {
                let (m, barrier) = (&m, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let first = m.clock().now();
                    let mut units = 0u64;
                    let mut i = t;
                    let mut requests = 0u32;
                    loop {
                        let now = m.clock().now();
                        // At least 100 requests each, however late the thread is scheduled:
                        // the meter starts empty, so together they fill it.
                        if requests >= 100 && now.saturating_duration_since(first) >= RUN {
                            // Read after this thread's last request.
                            return (units, first, now);
                        }
                        let n = 1 + i % 3;
                        requests += 1;
                        if m.allow_n(n) {
                            units += u64::from(n);
                        }
                        let level = m.level();
                        assert!((0.0..=f64::from(CAPACITY)).contains(&level), "{level}");
                        i = i.wrapping_add(7);
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let admitted: u64 = runs.iter().map(|r| r.0).sum();
    let first = runs.iter().map(|r| r.1).min().unwrap();
    let last = runs.iter().map(|r| r.2).max().unwrap();
    let elapsed = last.saturating_duration_since(first);
    let bound = f64::from(CAPACITY) + LEAK * elapsed.as_secs_f64() + 3.0;
    eprintln!("admitted {admitted} units in {elapsed:?}; bound {bound:.1}");
    assert!((admitted as f64) <= bound, "{admitted} > {bound}");
    assert!(admitted >= u64::from(CAPACITY), "{admitted}");
}
