//! Differential test: random sequences of reserve / try_acquire / check / set_rate, at
//! non-decreasing times, on the lock-free `SmoothBursty` and `SmoothWarmingUp` and on their
//! mutex twins (the literal Guava ports). Decisions must be equal and waits, `next_free` and
//! stored permits close, except where a documented deviation applies: then the sequence stops
//! there and the reason is counted; the test checks that most sequences ran to the end.
//!
//! **Tolerance.** Times are whole microseconds, so the twin's clock reading is exact. Guava
//! truncates every cost to whole microseconds (`(long)` casts), turnstile rounds to the
//! nearest nanosecond (D8), so each reservation may move the two `next_free` up to 1 µs apart.
//! That difference then propagates, and the test tracks two bounds rather than a fixed
//! allowance per reservation:
//! - `t`, on the distance between the two `next_free`: each reservation adds 1 µs plus the
//!   stored-permit bound times the dearest interval a stored permit can change the cost by
//!   (`d cost / d stored` is at most the cold interval for `SmoothWarmingUp`, the stable
//!   interval for `SmoothBursty`); when both limiters' `next_free` are in the past, both are
//!   `now` and `t` returns to 1 µs;
//! - `s`, on the distance between the stored permits: a resync adds at most `t / cool_down`
//!   (idle time becomes permits), and `set_rate` scales it with `max_permits`.
//!
//! On `SmoothWarmingUp` with a steep trapezoid this compounds: a time difference becomes
//! `δ / cool_down` permits at the next resync, which cost up to `cold / cool_down` times as
//! much when spent at the top (7× at cold factor 10.5). A fixed per-reservation allowance was
//! too tight for two such refill-and-spend cycles in a row (found in CI:
//! `twice_amplified_truncation_stays_within_the_propagated_bound`). Decisions that differ while
//! both limiters' `next_free` sit within the bound of the boundary are a tie, not a bug
//! ("Borderline").

use crate::common;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use turnstile::{
    reference, smooth::SmoothParams, Limiter, ManualClock, Nanos, SmoothBursty, SmoothWarmingUp,
};

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
    fn params(&self) -> SmoothParams;
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
            fn params(&self) -> SmoothParams {
                self.0.params()
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
            reference::SmoothBursty::try_from(
                turnstile::SmoothBursty::builder(rate)
                    .max_burst_seconds(burst_s)
                    .initial_stored_permits(initial)
                    .clock(ManualClock::new(start)),
            )
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
                reference::SmoothWarmingUp::try_from(
                    turnstile::SmoothWarmingUp::builder(rate, w)
                        .cold_factor(cold_factor)
                        .clock(ManualClock::new(start)),
                )
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

/// Propagated bounds on how far the two limiters may be apart (see the module comment).
struct Tol {
    /// On `next_free`, in ns.
    t: f64,
    /// On stored permits.
    s: f64,
}

impl Tol {
    fn ns(&self) -> f64 {
        US as f64 + self.t
    }
    fn time_close(&self, a: Duration, b: Duration) -> bool {
        (a.as_nanos() as f64 - b.as_nanos() as f64).abs() <= self.ns()
    }
    fn nanos_close(&self, a: Nanos, b: Nanos) -> bool {
        (a.as_u64() as f64 - b.as_u64() as f64).abs() <= self.ns()
    }
    /// Before an op at `now`, given both `next_free`: idle time the two limiters may have
    /// counted differently becomes stored permits.
    fn resync(&mut self, now: Nanos, next: (Nanos, Nanos), cool_down_ns: f64) {
        let (lo, hi) = (next.0.min(next.1), next.0.max(next.1));
        // `next_free` reads `now` once it is past, so `lo == now` may hide any idle time.
        if now >= lo && cool_down_ns > 0.0 && cool_down_ns.is_finite() {
            self.s += self.ns() / cool_down_ns;
        }
        if now >= hi {
            self.t = 0.0;
        }
    }
    /// A reservation: Guava's truncation, plus what a stored-permit difference costs.
    fn charge(&mut self, p: &SmoothParams, stored: f64) {
        let dearest = p.cold_interval_ns.max(p.stable_interval_ns);
        // Our stored permits are fixed-point, the twin's are f64: the 1e-9 relative slack of
        // the stored check, priced like any other stored difference.
        let s = self.s + 1e-9 * stored.abs().max(1.0);
        self.t += US as f64;
        // Under `+inf` no permit costs anything (and stored permits may be infinite).
        if dearest > 0.0 && dearest.is_finite() && s.is_finite() {
            self.t += s * dearest;
        }
    }
    /// `set_rate` rescales stored permits by `new max / old max` (Guava's `doSetRate`), or
    /// resets both to the same value when the old maximum was 0 or infinite.
    fn rescale(&mut self, old_max: f64, new_max: f64) {
        if old_max == 0.0 || !old_max.is_finite() {
            self.s = 0.0;
        } else if new_max.is_finite() {
            self.s *= (new_max / old_max).max(1.0);
        }
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
    let mut tol = Tol { t: 0.0, s: 0.0 };
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
        let (tol_ns, tol_s, rate_now) = (tol.ns(), tol.s, rate);
        let ctx = move || {
            format!(
                "op {i} {op:?} at {now:?} ({kind:?}, rate {rate_now}, tol {tol_ns} ns, {tol_s} permits)"
            )
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
        let p = l.params();
        tol.resync(now, (next_o, next_t), p.cool_down_interval_ns);
        let (stored_before, _) = l.stored(now);
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
                tol.charge(&p, stored_before);
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
                        tol.charge(&p, stored_before);
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
                (true, true) => tol.charge(&p, stored_before),
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
                tol.rescale(p.max_permits, l.params().max_permits);
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
            let slack = 1e-9 * x.abs().max(y.abs()).max(1.0) + tol.s;
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

/// Found in CI (clean clone of 251e616): Guava's µs truncations, 6.6 µs after a dozen
/// reservations, are amplified twice by refill-and-spend cycles at the top of a steep trapezoid
/// (cold factor 10.5, `cold / cool_down` = 7.1): 6.6 µs → 41 µs → 252 µs. Both limiters are
/// right; the old fixed allowance of `(1 + cold factor)` µs per reservation was 139 µs here.
#[test]
fn twice_amplified_truncation_stays_within_the_propagated_bound() {
    use Op::*;
    use Step::*;
    let kind = Kind::Warming {
        warmup_ms: 17793,
        cold_factor: 10.482827153600699,
    };
    let t = |n| TryAcquire { n, timeout: 0.0 };
    let ops = vec![
        (Same, Reserve { n: 1 }),
        (Intervals(3.190745783633619), t(1)),
        (Intervals(0.6176827541976497), t(1)),
        (Intervals(3.0258193381277394), Reserve { n: 3 }),
        (Intervals(2.157807709222903), t(1)),
        (Same, Reserve { n: 2 }),
        (Same, Reserve { n: 2 }),
        (Same, Reserve { n: 2 }),
        (Intervals(3.466862249260097), t(1)),
        (Intervals(0.597044456231199), Reserve { n: 3 }),
        (Intervals(2.611162982788927), t(1)),
        (Intervals(3.4369073060058706), t(1)),
        (Intervals(1.7455025466683793), Reserve { n: 2 }),
        (
            Intervals(3.857469309889528),
            SetRate {
                rate: 2.6203494345368763,
            },
        ),
        (Same, Reserve { n: 2 }),
        (Intervals(0.45221513349883835), Reserve { n: 1 }),
        (Intervals(0.11243564714103674), t(1)),
        (Intervals(2.881095645705985), t(1)),
        (Same, Reserve { n: 2 }),
        (
            Intervals(3.643377230337442),
            SetRate {
                rate: 0.11354773655739027,
            },
        ),
        (Intervals(1.9863915695986478), Reserve { n: 2 }),
        (Intervals(2.4337449371080098), t(1)),
        (Intervals(3.2118251453985374), Reserve { n: 1 }),
        (Same, Reserve { n: 1 }),
        (Same, Check { n: 0 }),
    ];
    assert_eq!(
        run(kind, 14.805153201863064, 0, &ops).unwrap(),
        Stop::Completed
    );
}
