//! Differential test: random sequences of checks, peeks, status reads and `set_limits` run on
//! the lock-free `MultiTokenBucket` and on its twin (one rate.go bucket per limit, all-or-
//! nothing under one mutex) must agree: decisions equal, the refusing limit equal, retry times
//! within the limits' precision (a grid unit, `precision()`) and whole tokens left within one.
//!
//! A reading counts as up to its precision earlier on the lock-free side (a grid unit, two
//! for three or four limits), and its arrival times may lag the twin's exact ones as much: a decision whose margin, on
//! some limit, is within two units of the boundary may go either way. Such a step is
//! *ambiguous*: if the two then differ, the sequence stops there (counted), since their states
//! part; the test checks that most sequences run to the end. Readings never go back (rate.go
//! moves `last` backwards on a stale reading, deviation D2: the stress tests cover stale
//! readings against the budget instead).

use std::time::Duration;

use proptest::prelude::*;
use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::{reference, ManualClock, Nanos};

#[derive(Clone, Debug)]
enum Op {
    Check(u32),
    Peek(u32),
    Status,
    SetLimits(Vec<Bandwidth>),
}

/// How far the clock moves before an op, in units of one limit's token interval.
#[derive(Clone, Debug)]
enum Step {
    Same,
    Tokens { limit: usize, tokens: f64 },
    Nanos(u64),
}

fn bandwidth() -> impl Strategy<Value = Bandwidth> {
    (
        -2.0f64..6.0,
        prop_oneof![3 => 1u32..10, 2 => 1u32..1000, 1 => 1u32..100_000],
    )
        .prop_map(|(e, burst)| {
            Bandwidth::new(turnstile::Limit::per_second(10f64.powf(e)).unwrap(), burst)
        })
}

fn limits() -> impl Strategy<Value = Vec<Bandwidth>> {
    prop::collection::vec(bandwidth(), 1..=4).prop_filter("fits the word", |l| {
        MultiTokenBucket::builder(l)
            .clock(ManualClock::default())
            .build()
            .is_ok()
    })
}

fn op() -> impl Strategy<Value = (Step, Op)> {
    let step = prop_oneof![
        2 => Just(Step::Same),
        6 => (0usize..4, 0.0f64..3.0).prop_map(|(limit, tokens)| Step::Tokens { limit, tokens }),
        1 => (0u64..2_000_000).prop_map(Step::Nanos),
    ];
    let n = prop_oneof![6 => 0u32..4, 2 => 0u32..50, 1 => 0u32..2000];
    let op = prop_oneof![
        10 => n.clone().prop_map(Op::Check),
        2 => n.prop_map(Op::Peek),
        1 => Just(Op::Status),
        1 => limits().prop_map(Op::SetLimits),
    ];
    (step, op)
}

/// Why a sequence stopped before its end.
#[derive(Debug, PartialEq)]
enum Stop {
    End,
    Ambiguous,
}

struct Pair {
    lf: MultiTokenBucket<ManualClock>,
    twin: reference::MultiTokenBucket<ManualClock>,
    limits: Vec<Bandwidth>,
    /// Per limit, the rounding carried over from earlier configurations, in tokens.
    carried: Vec<f64>,
}

impl Pair {
    /// Each limit's precision in tokens, doubled (a reading's rounding, and the state's lag
    /// behind the twin's exact arrival times, by as much).
    fn units(&self) -> Vec<f64> {
        self.lf
            .precision()
            .iter()
            .zip(&self.limits)
            .map(|(unit, b)| 2.0 * unit.as_secs_f64() * b.limit().as_f64())
            .collect()
    }

    /// Each limit's precision in tokens: its own grid's, plus what each `set_limits` that
    /// carried its tokens over added (the old grid's rounding, in tokens), plus float noise.
    fn slack(&self) -> Vec<f64> {
        self.carried
            .iter()
            .zip(self.units())
            .map(|(c, u)| c + u + 1e-6)
            .collect()
    }

    /// Whether a check of `n` at `t` sits within the precision of some limit's boundary.
    fn ambiguous(&self, t: Nanos, n: u32) -> bool {
        let tokens = self.twin.tokens_at(t);
        let slack = self.slack();
        tokens
            .iter()
            .zip(&slack)
            .zip(&self.limits)
            .any(|((&have, &s), b)| n <= b.burst() && (have - f64::from(n)).abs() <= s)
    }

    /// The twin's per-limit wait for `n` at `t` (s), for limits that refuse.
    fn waits(&self, t: Nanos, n: u32) -> Vec<f64> {
        self.twin
            .tokens_at(t)
            .iter()
            .zip(&self.limits)
            .map(|(&have, b)| ((f64::from(n) - have) / b.limit().as_f64()).max(0.0))
            .collect()
    }

    fn compare(&self, t: Nanos, n: u32, take: bool) -> Result<Stop, TestCaseError> {
        let ambiguous = self.ambiguous(t, n);
        let (mine, twin) = if take {
            (self.lf.check_n_at(t, n), self.twin.check_n_at(t, n))
        } else {
            (self.lf.peek_n_at(t, n), self.twin.peek_n_at(t, n))
        };
        if mine.is_ok() != twin.is_ok() {
            prop_assert!(ambiguous, "n {n} at {t:?}: {mine:?} vs twin {twin:?}");
            return Ok(Stop::Ambiguous);
        }
        if let (Err(m), Err(w)) = (mine, twin) {
            match (m.retry_at(), w.retry_at()) {
                (None, None) => prop_assert_eq!(m.limit(), w.limit()),
                (Some(a), Some(b)) => {
                    let tol = self
                        .slack()
                        .iter()
                        .zip(&self.limits)
                        .map(|(s, l)| s / l.limit().as_f64() * 1e9)
                        .fold(0.0, f64::max)
                        + 2.0
                        + 1e-9 * b.as_u64() as f64;
                    let diff = a.as_u64() as f64 - b.as_u64() as f64;
                    prop_assert!(diff.abs() <= tol, "n {n} at {t:?}: retry {a:?} vs {b:?}");
                    // The limit admitting last, unless two admit within the precision.
                    let mut waits = self.waits(t, n);
                    waits.sort_by(f64::total_cmp);
                    let tie = waits.len() > 1
                        && (waits[waits.len() - 1] - waits[waits.len() - 2]) * 1e9 <= tol;
                    if !tie {
                        prop_assert_eq!(m.limit(), w.limit(), "n {} at {:?}", n, t);
                    }
                }
                other => prop_assert!(false, "n {n} at {t:?}: retry {other:?}"),
            }
        }
        Ok(Stop::End)
    }

    fn status(&self, t: Nanos) -> Result<(), TestCaseError> {
        let mine = self.lf.status_at(t);
        let tokens = self.twin.tokens_at(t);
        let slack = self.slack();
        prop_assert_eq!(mine.len(), self.limits.len());
        for (i, s) in mine.iter().enumerate() {
            let lo = (tokens[i] - slack[i]).floor().max(0.0) as u64;
            let hi = (tokens[i] + slack[i]).floor().max(0.0) as u64;
            prop_assert!(
                (lo..=hi).contains(&s.remaining),
                "limit {i} at {t:?}: {} vs {}",
                s.remaining,
                tokens[i]
            );
            prop_assert_eq!(s.quota, u64::from(self.limits[i].burst()));
        }
        Ok(())
    }
}

fn run(limits: Vec<Bandwidth>, ops: Vec<(Step, Op)>) -> Result<Stop, TestCaseError> {
    let mut pair = Pair {
        lf: MultiTokenBucket::builder(&limits)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
        twin: reference::MultiTokenBucket::with_clock(&limits, ManualClock::default()).unwrap(),
        carried: vec![0.0; limits.len()],
        limits,
    };
    let mut t = 0u64;
    for (step, op) in ops {
        t += match step {
            Step::Same => 0,
            Step::Nanos(d) => d,
            Step::Tokens { limit, tokens } => {
                let b = pair.limits[limit % pair.limits.len()];
                (tokens / b.limit().as_f64() * 1e9) as u64
            }
        };
        let at = Nanos::new(t);
        match op {
            Op::Check(n) => {
                if pair.compare(at, n, true)? == Stop::Ambiguous {
                    return Ok(Stop::Ambiguous);
                }
            }
            Op::Peek(n) => {
                if pair.compare(at, n, false)? == Stop::Ambiguous {
                    return Ok(Stop::Ambiguous);
                }
            }
            Op::Status => pair.status(at)?,
            Op::SetLimits(l) => {
                let kept = pair.slack();
                pair.lf.set_limits_at(at, &l).unwrap();
                pair.carried = (0..l.len())
                    .map(|i| kept.get(i).copied().unwrap_or(0.0))
                    .collect();
                pair.twin.set_limits_at(at, &l).unwrap();
                prop_assert_eq!(pair.lf.limits(), l.clone());
                pair.limits = l;
            }
        }
    }
    Ok(Stop::End)
}

#[test]
fn agrees_with_n_twin_buckets_all_or_nothing() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 400,
        ..ProptestConfig::default()
    });
    let ended = std::cell::Cell::new(0u32);
    let stopped = std::cell::Cell::new(0u32);
    runner
        .run(
            &(limits(), prop::collection::vec(op(), 1..120)),
            |(limits, ops)| {
                match run(limits, ops)? {
                    Stop::End => ended.set(ended.get() + 1),
                    Stop::Ambiguous => stopped.set(stopped.get() + 1),
                }
                Ok(())
            },
        )
        .unwrap();
    let (ended, stopped) = (ended.get(), stopped.get());
    assert!(
        ended >= 4 * stopped,
        "{ended} sequences ran to the end, {stopped} stopped at an ambiguous step"
    );
}

/// The same on limits whose grids are exact: every reading a whole number of units, so no
/// step is ambiguous and every sequence runs to its end, decisions and refusing limits equal,
/// retry times equal (two limits) or at most a unit later (four: past the anchor's grain a
/// retry waits a unit more, `word.rs`).
#[test]
fn agrees_exactly_on_exact_grids() {
    // Token intervals of 2^k ns: 2^20 ns (about 954/s) and 2^30 ns (about 0.93/s).
    let every = |log2: u32, burst| {
        Bandwidth::new(
            turnstile::Limit::every(Duration::from_nanos(1 << log2)),
            burst,
        )
    };
    agrees_on(&[every(20, 8), every(30, 50)]);
    // Four limits with units of about 8 ns to 2^18 ns, a power-of-two fraction of the
    // anchor's grain of 2^20 ns.
    agrees_on(&[every(20, 8), every(30, 50), every(24, 3), every(35, 10)]);
}

/// Random checks on `limits` and their twin: equal decisions and refusing limits, retry times
/// equal, or for three or four limits at most a unit (half the precision) later.
fn agrees_on(limits: &[Bandwidth]) {
    let lf = MultiTokenBucket::builder(limits)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let late = match limits.len() {
        1 | 2 => 0,
        _ => lf.precision().iter().max().unwrap().as_nanos() as u64 / 2 + 1,
    };
    let twin = reference::MultiTokenBucket::with_clock(limits, ManualClock::default()).unwrap();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut t = 0u64;
    let (mut grants, mut refusals) = (0, 0);
    for _ in 0..20_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        t += (rng % 5) << 19; // half a fast token at a time
        let n = (rng >> 8) as u32 % 4;
        let (a, b) = (
            lf.check_n_at(Nanos::new(t), n),
            twin.check_n_at(Nanos::new(t), n),
        );
        assert_eq!(
            a.map_err(|d| d.limit()),
            b.map_err(|d| d.limit()),
            "n {n} at {t}"
        );
        if let (Err(a), Err(b)) = (a, b) {
            match (a.retry_at(), b.retry_at()) {
                (Some(a), Some(b)) => assert!(
                    a >= b && a.as_u64() - b.as_u64() <= late,
                    "n {n} at {t}: {a:?} vs {b:?}"
                ),
                (a, b) => assert_eq!(a, b, "n {n} at {t}"),
            }
            refusals += 1;
        } else {
            grants += 1;
        }
    }
    assert!(
        grants > 5_000 && refusals > 5_000,
        "{grants} grants, {refusals} refusals"
    );
}
