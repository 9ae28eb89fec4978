//! Differential test: random operation sequences (allow_n_at / check_n_at / status_at /
//! is_idle_at) run on the lock-free `SlidingWindow` and on its mutex twin (the textbook
//! counter). Both are exact integer arithmetic, so every result must be identical: decisions,
//! denials with their retry times, statuses and idleness. No deviation applies, so every
//! sequence must run to its end.
//!
//! Times step forward by nothing, by a few nanoseconds, by a fraction of a period, across one
//! boundary (1 to 2 periods) and across many (2 to 50 periods); the second property also steps
//! backwards (stale readings, which both judge at the start of the stored window). Quotas run
//! from 1 to 1000 and up to `u32::MAX`; periods from 1 ns to days.

use crate::common;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use turnstile::{reference, Idle, Limiter, ManualClock, Nanos, SlidingWindow};

/// How many permits to ask for, relative to the quota so that every quota meets the
/// interesting region (a partly full window).
#[derive(Clone, Debug)]
enum N {
    Small(u32),
    /// A fraction of the quota, `0.0..1.02`.
    Frac(f64),
    /// `quota + d - 2`, `d` in `0..=4`: just under, at and just over the quota.
    Edge(u32),
}

#[derive(Clone, Debug)]
enum Op {
    Allow(N),
    Check(N),
    Status,
    Idle,
}

/// How far to move the clock before an op.
#[derive(Clone, Debug)]
enum Step {
    Same,
    Nanos(u64),
    /// In periods.
    Periods(f64),
    /// Backwards, in periods (only in the "stale readings" property).
    Back(f64),
}

#[derive(Clone, Debug)]
struct Setup {
    quota: u32,
    period: Duration,
    start: u64,
}

fn setup() -> impl Strategy<Value = Setup> {
    let quota = prop_oneof![
        4 => 1u32..=10,
        4 => 1u32..=1_000,
        1 => Just(u32::MAX),
        1 => any::<u32>().prop_map(|q| q.max(1)),
    ];
    let period = prop_oneof![
        2 => (1u64..=10).prop_map(Duration::from_nanos),
        2 => (1u64..=10_000_000).prop_map(Duration::from_nanos),
        2 => Just(Duration::from_secs(1)),
        1 => Just(Duration::from_nanos(999_999_937)),
        2 => (1u64..=3 * 86_400).prop_map(Duration::from_secs),
    ];
    let start = prop_oneof![1 => Just(0u64), 9 => 0u64..1_000_000_000_000_000];
    (quota, period, start).prop_map(|(quota, period, start)| Setup {
        quota,
        period,
        start,
    })
}

fn n() -> impl Strategy<Value = N> {
    prop_oneof![
        2 => (0u32..4).prop_map(N::Small),
        3 => (0.0f64..1.02).prop_map(N::Frac),
        1 => (0u32..=4).prop_map(N::Edge),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => n().prop_map(Op::Allow),
        3 => n().prop_map(Op::Check),
        1 => Just(Op::Status),
        1 => Just(Op::Idle),
    ]
}

fn step(backwards: bool) -> BoxedStrategy<Step> {
    let forward = prop_oneof![
        3 => Just(Step::Same),
        1 => (1u64..2_000).prop_map(Step::Nanos),
        4 => (0.0f64..1.0).prop_map(Step::Periods),
        2 => (1.0f64..2.0).prop_map(Step::Periods),
        1 => (2.0f64..50.0).prop_map(Step::Periods),
    ];
    if backwards {
        prop_oneof![5 => forward, 1 => (0.0f64..2.5).prop_map(Step::Back)].boxed()
    } else {
        forward.boxed()
    }
}

fn permits(quota: u32, n: &N) -> u32 {
    match *n {
        N::Small(k) => k,
        N::Frac(f) => ((f * f64::from(quota)) as u32).min(quota.saturating_add(2)),
        N::Edge(d) => (quota.saturating_add(d)).saturating_sub(2),
    }
}

/// What a sequence showed, so the tally proves the interesting branches were reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    granted: bool,
    /// A denial whose retry time is in the window of the check.
    retry_same_window: bool,
    /// A denial whose retry time is in a later window.
    retry_later_window: bool,
    denied_for_good: bool,
}

fn run(s: &Setup, ops: &[(Step, Op)]) -> Result<Seen, TestCaseError> {
    let ours = SlidingWindow::builder(s.quota, s.period)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let twin = reference::SlidingWindow::try_from(
        turnstile::SlidingWindow::builder(s.quota, s.period).clock(ManualClock::default()),
    )
    .unwrap();
    let p = s.period.as_nanos().min(1 << 62) as f64;
    let mut now = s.start;
    let mut seen = Seen {
        granted: false,
        retry_same_window: false,
        retry_later_window: false,
        denied_for_good: false,
    };
    let window = |t: Nanos| u128::from(t.as_u64()) / s.period.as_nanos();
    for (i, (step, op)) in ops.iter().enumerate() {
        let periods = |k: f64| (k * p).min(1e17) as u64;
        now = match *step {
            Step::Same => now,
            Step::Nanos(ns) => now.saturating_add(ns),
            Step::Periods(k) => now.saturating_add(periods(k)),
            Step::Back(k) => now.saturating_sub(periods(k)),
        };
        let at = Nanos::new(now);
        let (a, b) = match op {
            Op::Allow(n) => {
                let n = permits(s.quota, n);
                let (a, b) = (ours.allow_n_at(at, n), twin.allow_n_at(at, n));
                seen.granted |= a && n > 0;
                (format!("{a:?}"), format!("{b:?}"))
            }
            Op::Check(n) => {
                let n = permits(s.quota, n);
                let (a, b) = (ours.check_n_at(at, n), twin.check_n_at(at, n));
                match a {
                    Ok(()) => seen.granted |= n > 0,
                    Err(d) if d.retry_at().is_some() => {
                        // The retry time is never before the check.
                        let retry = d.retry_at().unwrap();
                        prop_assert!(retry > at);
                        if window(retry) == window(at) {
                            seen.retry_same_window = true;
                        } else {
                            seen.retry_later_window = true;
                        }
                    }
                    Err(_) => seen.denied_for_good = true,
                }
                (format!("{a:?}"), format!("{b:?}"))
            }
            Op::Status => (
                format!("{:?}", ours.status_at(at)),
                format!("{:?}", twin.status_at(at)),
            ),
            Op::Idle => (
                format!("{:?}", ours.is_idle_at(at)),
                format!("{:?}", twin.is_idle_at(at)),
            ),
        };
        if a != b {
            return Err(TestCaseError::fail(format!(
                "op {i} {op:?} at {now} ({s:?}): ours {a}, twin {b}\nours {ours:?}\ntwin {twin:?}"
            )));
        }
    }
    Ok(seen)
}

fn check(backwards: bool) {
    let strategy = (
        setup(),
        prop::collection::vec((step(backwards), op()), 1..100),
    );
    let label = format!("sliding window differential (backwards steps: {backwards})");
    let stats = common::tally(&label, strategy, |(s, ops)| run(&s, &ops));
    let total: u32 = stats.values().sum();
    let with =
        |f: fn(&Seen) -> bool| -> u32 { stats.iter().filter(|(k, _)| f(k)).map(|(_, v)| v).sum() };
    // Not vacuous: most sequences both grant and deny with a retry time, and each kind of
    // retry time is common.
    let both = with(|s| s.granted && (s.retry_same_window || s.retry_later_window));
    assert!(both * 2 >= total, "{stats:?}");
    assert!(with(|s| s.retry_same_window) * 5 >= total, "{stats:?}");
    assert!(with(|s| s.retry_later_window) * 5 >= total, "{stats:?}");
    assert!(with(|s| s.denied_for_good) * 10 >= total, "{stats:?}");
}

#[test]
fn lock_free_window_agrees_with_its_mutex_twin() {
    check(false);
}

/// The same with stale readings: both judge a time before the stored window at its start.
#[test]
fn they_agree_on_stale_readings_too() {
    check(true);
}

/// A scripted sequence through every branch (same window, next window, two windows on, a
/// stale reading, in-window and next-window and two-windows-on retries, n = 0, n > quota).
#[test]
fn twin_and_lock_free_agree_on_a_scripted_sequence() {
    let s = Setup {
        quota: 5,
        period: Duration::from_secs(1),
        start: 1_000_000_000_000,
    };
    let ops = vec![
        (Step::Same, Op::Allow(N::Edge(2))),
        (Step::Same, Op::Check(N::Small(1))),
        (Step::Periods(1.0), Op::Check(N::Small(1))),
        (Step::Periods(0.5), Op::Allow(N::Small(2))),
        (Step::Same, Op::Check(N::Small(3))),
        (Step::Same, Op::Status),
        (Step::Back(0.9), Op::Check(N::Small(1))),
        (Step::Same, Op::Idle),
        (Step::Periods(0.9), Op::Check(N::Edge(2))),
        (Step::Same, Op::Check(N::Edge(3))),
        (Step::Same, Op::Allow(N::Small(0))),
        (Step::Periods(3.0), Op::Idle),
        (Step::Same, Op::Status),
    ];
    let seen = run(&s, &ops).unwrap();
    assert_eq!(
        seen,
        Seen {
            granted: true,
            retry_same_window: true,
            retry_later_window: true,
            denied_for_good: true
        }
    );
}
