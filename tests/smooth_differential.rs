//! Differential test: random sequences of reserve / try_acquire / check / set_rate, at
//! non-decreasing times, on the lock-free `SmoothBursty` and `SmoothWarmingUp` and on their
//! mutex twins (the literal Guava ports). Decisions must be equal and waits, `next_free` and
//! stored permits close, except where a documented deviation applies: then the sequence stops
//! there and the reason is counted; the test checks that most sequences ran to the end.
//!
//! **Tolerance.** Times are whole microseconds, so the twin's clock reading is exact. Guava
//! truncates every cost to whole microseconds (`(long)` casts), turnstile rounds to the
//! nearest nanosecond (D8), so the two `next_free` drift apart by up to 1 µs per reservation
//! along a chain of debt: the tolerance is 1 µs plus 1 µs per reservation so far. For
//! `SmoothWarmingUp`, a time difference becomes a stored-permit difference at the next resync
//! (`δ / cool_down`), which costs up to `cold_interval / cool_down` (< 1.5 × cold factor) times
//! as much when spent, so each reservation's allowance is multiplied by `1 + cold_factor`.
//! Decisions that differ while both limiters' `next_free` sit within that tolerance of the
//! boundary are a tie, not a bug ("Borderline").

mod common;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use turnstile::{reference, Limiter, ManualClock, Nanos, SmoothBursty, SmoothWarmingUp};

#[derive(Clone, Copy, Debug)]
enum Kind {
    Bursty { burst_s: f64, initial: f64 },
    Warming { warmup_ms: u64, cold_factor: f64 },
}

#[derive(Clone, Debug)]
enum Op {
    Reserve {
        n: u32,
    },
    /// Timeout in units of the current stable interval (whole microseconds).
    TryAcquire {
        n: u32,
        timeout: f64,
    },
    Check {
        n: u32,
    },
    SetRate {
        rate: f64,
    },
}

/// How far to move the clock before an op, always a whole number of microseconds.
#[derive(Clone, Debug)]
enum Step {
    Same,
    Micros(u64),
    Intervals(f64),
    Seconds(f64),
}

fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        10 => (-1.0f64..4.0).prop_map(|e| 10f64.powf(e)),
        3 => (1u32..100).prop_map(f64::from),
        1 => Just(f64::INFINITY),
        // Guava's microseconds truncate costs to nothing here (D8); the tolerance covers it.
        1 => (5.0f64..7.0).prop_map(|e| 10f64.powf(e)),
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (
            prop_oneof![1 => Just(0.0), 4 => Just(1.0), 2 => 0.1f64..5.0],
            prop_oneof![4 => Just(0.0), 1 => 0.0f64..20.0],
        )
            .prop_map(|(burst_s, initial)| Kind::Bursty { burst_s, initial }),
        (
            1u64..20_000,
            prop_oneof![2 => Just(3.0), 1 => Just(1.0), 2 => 1.0f64..20.0],
        )
            .prop_map(|(warmup_ms, cold_factor)| Kind::Warming {
                warmup_ms,
                cold_factor
            }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Same),
        1 => (1u64..2_000).prop_map(Step::Micros),
        6 => (0.0f64..4.0).prop_map(Step::Intervals),
        1 => (0.0f64..10.0).prop_map(Step::Seconds),
    ]
}

fn n() -> impl Strategy<Value = u32> {
    prop_oneof![6 => 1u32..4, 2 => 1u32..20, 1 => 1u32..1000]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => n().prop_map(|n| Op::Reserve { n }),
        5 => (n(), 0.0f64..4.0).prop_map(|(n, timeout)| Op::TryAcquire { n, timeout }),
        3 => n().prop_map(|n| Op::Check { n }),
        1 => rate().prop_map(|rate| Op::SetRate { rate }),
    ]
}

/// Why a sequence stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Stop {
    Completed,
    /// A decision sat on the boundary within tolerance: both answers are right.
    Borderline,
    /// D9: the twin stored NaN permits (Guava after `setRate(+inf)` with none stored, or a
    /// zero `maxBurstSeconds` at `+inf`, whose `maxPermits` is `0 * inf`); from there Guava's
    /// arithmetic is NaN and stops limiting, turnstile's is not.
    D9NaN,
}

/// The two implementations of one kind, behind one interface.
trait Pair {
    fn reserve(&self, now: Nanos, n: u32) -> (Duration, Duration);
    fn try_acquire(&self, now: Nanos, n: u32, t: Duration) -> (Option<Duration>, Option<Duration>);
    fn check(&self, now: Nanos, n: u32) -> (bool, bool);
    fn set_rate(&self, now: Nanos, rate: f64);
    fn stored(&self, now: Nanos) -> (f64, f64);
    fn rates(&self) -> (f64, f64);
    fn cool_down_ns(&self) -> f64;
    /// `next_free` of each, if later than `now` (else `now`): a denied zero-permit check
    /// reports it and changes nothing.
    fn next_free(&self, now: Nanos) -> (Nanos, Nanos);
}

macro_rules! pair {
    ($name:ident, $ours:ty, $twin:ty) => {
        struct $name($ours, $twin);
        impl Pair for $name {
            fn reserve(&self, now: Nanos, n: u32) -> (Duration, Duration) {
                (
                    self.0.reserve_n_at(now, n).unwrap(),
                    self.1.reserve_n_at(now, n).unwrap(),
                )
            }
            fn try_acquire(
                &self,
                now: Nanos,
                n: u32,
                t: Duration,
            ) -> (Option<Duration>, Option<Duration>) {
                (
                    self.0.try_acquire_at(now, n, t).unwrap(),
                    self.1.try_acquire_at(now, n, t).unwrap(),
                )
            }
            fn check(&self, now: Nanos, n: u32) -> (bool, bool) {
                (
                    self.0.check_n_at(now, n).is_ok(),
                    self.1.check_n_at(now, n).is_ok(),
                )
            }
            fn set_rate(&self, now: Nanos, rate: f64) {
                self.0.set_rate_at(now, rate).unwrap();
                self.1.set_rate_at(now, rate).unwrap();
            }
            fn stored(&self, now: Nanos) -> (f64, f64) {
                (self.0.stored_permits_at(now), self.1.stored_permits_at(now))
            }
            fn rates(&self) -> (f64, f64) {
                (self.0.rate(), self.1.rate())
            }
            fn cool_down_ns(&self) -> f64 {
                self.0.params().cool_down_interval_ns
            }
            fn next_free(&self, now: Nanos) -> (Nanos, Nanos) {
                let nf = |r: Result<(), turnstile::Denied>| {
                    r.err().and_then(|d| d.retry_at()).unwrap_or(now)
                };
                (nf(self.0.check_n_at(now, 0)), nf(self.1.check_n_at(now, 0)))
            }
        }
    };
}

pair!(
    Bursty,
    SmoothBursty<ManualClock>,
    reference::SmoothBursty<ManualClock>
);
pair!(
    Warming,
    SmoothWarmingUp<ManualClock>,
    reference::SmoothWarmingUp<ManualClock>
);

fn make(kind: Kind, rate: f64, start: Nanos) -> Box<dyn Pair> {
    match kind {
        Kind::Bursty { burst_s, initial } => Box::new(Bursty(
            SmoothBursty::builder(rate)
                .max_burst_seconds(burst_s)
                .initial_stored_permits(initial)
                .clock(ManualClock::new(start))
                .build()
                .unwrap(),
            reference::SmoothBursty::builder(rate)
                .max_burst_seconds(burst_s)
                .initial_stored_permits(initial)
                .clock(ManualClock::new(start))
                .build()
                .unwrap(),
        )),
        Kind::Warming {
            warmup_ms,
            cold_factor,
        } => {
            let w = Duration::from_millis(warmup_ms);
            Box::new(Warming(
                SmoothWarmingUp::builder(rate, w)
                    .cold_factor(cold_factor)
                    .clock(ManualClock::new(start))
                    .build()
                    .unwrap(),
                reference::SmoothWarmingUp::builder(rate, w)
                    .cold_factor(cold_factor)
                    .clock(ManualClock::new(start))
                    .build()
                    .unwrap(),
            ))
        }
    }
}

const US: u64 = 1_000;

/// Whole microseconds.
fn micros(ns: f64) -> u64 {
    (ns.min(1e16) / 1e3) as u64 * US
}

struct Tol {
    /// Per-reservation allowance, in ns.
    per_charge: f64,
    charges: u64,
}

impl Tol {
    fn ns(&self) -> f64 {
        US as f64 + self.per_charge * self.charges as f64
    }
    fn time_close(&self, a: Duration, b: Duration) -> bool {
        (a.as_nanos() as f64 - b.as_nanos() as f64).abs() <= self.ns()
    }
    fn nanos_close(&self, a: Nanos, b: Nanos) -> bool {
        (a.as_u64() as f64 - b.as_u64() as f64).abs() <= self.ns()
    }
}

fn run(
    kind: Kind,
    init_rate: f64,
    start_us: u64,
    ops: &[(Step, Op)],
) -> Result<Stop, TestCaseError> {
    let mut now = Nanos::new(start_us * US);
    let l = make(kind, init_rate, now);
    let mut tol = Tol {
        per_charge: match kind {
            Kind::Bursty { .. } => US as f64,
            Kind::Warming { cold_factor, .. } => (1.0 + cold_factor) * US as f64,
        },
        charges: 0,
    };
    let mut rate = init_rate;
    for (i, (step, op)) in ops.iter().enumerate() {
        let stable_ns = 1e9 / rate;
        let dt = match *step {
            Step::Same => 0,
            Step::Micros(us) => us * US,
            Step::Intervals(k) if rate.is_finite() => micros(k * stable_ns),
            Step::Intervals(k) => micros(k * 1e6),
            Step::Seconds(s) => micros(s * 1e9),
        };
        now = now + Duration::from_nanos(dt);
        let (tol_ns, rate_now) = (tol.ns(), rate);
        let ctx = move || {
            format!("op {i} {op:?} at {now:?} ({kind:?}, rate {rate_now}, tol {tol_ns} ns)")
        };
        let (_, twin_stored) = l.stored(now);
        if twin_stored.is_nan() {
            return Ok(Stop::D9NaN);
        }
        let (next_o, next_t) = l.next_free(now);
        prop_assert!(
            tol.nanos_close(next_o, next_t),
            "{}: next_free ours {next_o:?} twin {next_t:?}",
            ctx()
        );
        // A decision both limiters may legitimately take either way.
        let tie = |edge: Nanos| {
            let lo = next_o.min(next_t).as_u64() as f64;
            let hi = next_o.max(next_t).as_u64() as f64;
            let e = edge.as_u64() as f64;
            e >= lo - tol.ns() && e <= hi + tol.ns()
        };
        match *op {
            Op::Reserve { n } => {
                let (a, b) = l.reserve(now, n);
                prop_assert!(
                    tol.time_close(a, b),
                    "{}: wait ours {a:?} twin {b:?}",
                    ctx()
                );
                tol.charges += 1;
            }
            Op::TryAcquire { n, timeout } => {
                let t = if rate.is_finite() {
                    Duration::from_nanos(micros(timeout * stable_ns))
                } else {
                    Duration::from_nanos(micros(timeout * 1e6))
                };
                match l.try_acquire(now, n, t) {
                    (Some(a), Some(b)) => {
                        prop_assert!(
                            tol.time_close(a, b),
                            "{}: wait ours {a:?} twin {b:?}",
                            ctx()
                        );
                        tol.charges += 1;
                    }
                    (None, None) => {}
                    (a, b) if tie(now + t) => {
                        let _ = (a, b);
                        return Ok(Stop::Borderline);
                    }
                    (a, b) => {
                        return Err(TestCaseError::fail(format!(
                            "{}: try_acquire ours {a:?} twin {b:?} (next {next_o:?}, {next_t:?})",
                            ctx()
                        )))
                    }
                }
            }
            Op::Check { n } => match l.check(now, n) {
                (true, true) => tol.charges += 1,
                (false, false) => {}
                _ if tie(now) => return Ok(Stop::Borderline),
                (a, b) => {
                    return Err(TestCaseError::fail(format!(
                        "{}: check ours {a} twin {b} (next ours {next_o:?} twin {next_t:?})",
                        ctx()
                    )))
                }
            },
            Op::SetRate { rate: r } => {
                l.set_rate(now, r);
                rate = r;
                let (a, b) = l.rates();
                prop_assert!(
                    a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs()),
                    "{}: rate ours {a} twin {b}",
                    ctx()
                );
            }
        }
        let (x, y) = l.stored(now);
        if y.is_nan() {
            return Ok(Stop::D9NaN);
        }
        if rate.is_finite() {
            // A time difference of tol becomes tol / cool_down stored permits.
            let slack = 1e-9 * x.abs().max(y.abs()).max(1.0) + tol.ns() / l.cool_down_ns();
            prop_assert!(
                (x - y).abs() <= slack,
                "{}: stored ours {x} twin {y}",
                ctx()
            );
        }
    }
    Ok(Stop::Completed)
}

#[test]
fn lock_free_smooth_limiters_agree_with_their_guava_twins() {
    let strategy = (
        kind(),
        rate(),
        0u64..1_000_000_000,
        prop::collection::vec((step(), op()), 1..80),
    );
    let stats = common::tally("differential", strategy, |(k, r, start, ops)| {
        run(k, r, start, &ops)
    });
    let total: u32 = stats.values().sum();
    let completed = stats.get(&Stop::Completed).copied().unwrap_or(0);
    let borderline = stats.get(&Stop::Borderline).copied().unwrap_or(0);
    assert!(completed * 10 >= total * 8, "{stats:?}");
    assert!(borderline * 20 <= total, "{stats:?}");
}

/// Guava's vectors where the two must agree exactly, scripted through the same harness.
#[test]
fn scripted_sequences_complete() {
    let warm = Kind::Warming {
        warmup_ms: 4000,
        cold_factor: 3.0,
    };
    let ops: Vec<(Step, Op)> = vec![
        (Step::Same, Op::Reserve { n: 1 }),
        (Step::Same, Op::Reserve { n: 1 }),
        (Step::Seconds(1.375), Op::Reserve { n: 1 }),
        (Step::Seconds(1.125), Op::SetRate { rate: 4.0 }),
        (Step::Same, Op::TryAcquire { n: 3, timeout: 4.0 }),
        (Step::Seconds(5.0), Op::Check { n: 2 }),
        (Step::Same, Op::Check { n: 1 }),
        (
            Step::Seconds(30.0),
            Op::SetRate {
                rate: f64::INFINITY,
            },
        ),
        (Step::Same, Op::Reserve { n: 1000 }),
        (Step::Same, Op::SetRate { rate: 2.0 }),
        (Step::Same, Op::Reserve { n: 1 }),
    ];
    assert_eq!(run(warm, 2.0, 0, &ops).unwrap(), Stop::Completed);
    let bursty = Kind::Bursty {
        burst_s: 1.0,
        initial: 0.0,
    };
    let ops: Vec<(Step, Op)> = vec![
        (Step::Same, Op::Reserve { n: 1 }),
        (Step::Same, Op::Reserve { n: 1 }),
        (Step::Same, Op::SetRate { rate: 2.0 }),
        (Step::Seconds(1.0), Op::Reserve { n: 1 }),
        (Step::Seconds(1.0), Op::Reserve { n: 2 }),
        (Step::Seconds(0.5), Op::Reserve { n: 4 }),
        (Step::Seconds(1.0), Op::Reserve { n: 1 }),
        (Step::Seconds(9.0), Op::Check { n: 3 }),
        (Step::Same, Op::TryAcquire { n: 1, timeout: 1.0 }),
    ];
    assert_eq!(run(bursty, 1.0, 7, &ops).unwrap(), Stop::Completed);
}
