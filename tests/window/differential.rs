//! Differential test: random operation sequences (take_n_at / check_n_at / status_at) run on
//! the lock-free `FixedWindow` and on its mutex twin, which runs go-zero's `PeriodLimit`
//! script literally (an `INCRBY` on every call, over-quota ones included, and a TTL set on
//! the first hit). Both are integer arithmetic, so every outcome, denial retry time and status
//! must be identical. This is also the check that not counting over-quota takes (turnstile)
//! cannot be told apart from counting them (go-zero).

use crate::common;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use turnstile::{reference, FixedWindow, Limiter, ManualClock, Nanos};

#[derive(Clone, Debug)]
enum Op {
    Take { n: u32 },
    Check { n: u32 },
    Status,
}

/// How far to move the clock before an op, in periods (fractions too) or nanoseconds.
#[derive(Clone, Debug)]
enum Step {
    Same,
    Nanos(u64),
    Periods(f64),
}

#[derive(Clone, Debug)]
struct Setup {
    quota: u32,
    period: Duration,
    align: Option<(i64, Duration)>,
    start: u64,
}

fn setup() -> impl Strategy<Value = Setup> {
    let quota = prop_oneof![4 => 1u32..6, 3 => 1u32..100, 1 => Just(u32::MAX), 1 => any::<u32>().prop_map(|q| q.max(1))];
    let period = prop_oneof![
        3 => (1u64..120).prop_map(Duration::from_secs),
        2 => (1u64..10_000).prop_map(Duration::from_nanos),
        1 => Just(Duration::from_secs(86_400)),
        1 => (1u64..1_000_000_000_000_000).prop_map(Duration::from_nanos),
    ];
    let align = prop_oneof![
        2 => Just(None),
        2 => (-86_399i64..86_400, 0u64..4_000_000_000_000_000_000)
            .prop_map(|(o, u)| Some((o, Duration::from_nanos(u)))),
    ];
    let start = prop_oneof![1 => Just(0u64), 4 => 0u64..1_000_000_000_000_000];
    (quota, period, align, start).prop_map(|(quota, period, align, start)| Setup {
        quota,
        period,
        align,
        start,
    })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Same),
        1 => (1u64..2_000).prop_map(Step::Nanos),
        4 => (0.0f64..1.2).prop_map(Step::Periods),
        1 => (0.0f64..5.0).prop_map(Step::Periods),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let n = prop_oneof![6 => Just(1u32), 2 => 0u32..4, 1 => 0u32..120, 1 => any::<u32>()];
    prop_oneof![
        6 => n.clone().prop_map(|n| Op::Take { n }),
        2 => n.prop_map(|n| Op::Check { n }),
        1 => Just(Op::Status),
    ]
}

fn run(s: &Setup, ops: &[(Step, Op)]) -> Result<&'static str, TestCaseError> {
    let ours = FixedWindow::builder(s.quota, s.period).clock(ManualClock::default());
    let twin = FixedWindow::builder(s.quota, s.period).clock(ManualClock::default());
    let (ours, twin) = match s.align {
        None => (
            ours.build().unwrap(),
            reference::FixedWindow::try_from(twin).unwrap(),
        ),
        Some((offset, origin)) => (
            ours.align(offset).unix_origin(origin).build().unwrap(),
            reference::FixedWindow::try_from(twin.align(offset).unix_origin(origin)).unwrap(),
        ),
    };
    let period = s.period.as_nanos() as f64;
    let mut now = s.start;
    for (i, (step, op)) in ops.iter().enumerate() {
        now = match *step {
            Step::Same => now,
            Step::Nanos(ns) => now.saturating_add(ns),
            Step::Periods(k) => now.saturating_add((k * period).min(1e18) as u64),
        };
        let at = Nanos::new(now);
        let (a, b) = match op {
            Op::Take { n } => (
                format!("{:?}", ours.take_n_at(at, *n)),
                format!("{:?}", twin.take_n_at(at, *n)),
            ),
            Op::Check { n } => (
                format!("{:?}", ours.check_n_at(at, *n)),
                format!("{:?}", twin.check_n_at(at, *n)),
            ),
            Op::Status => (
                format!("{:?}", ours.status_at(at)),
                format!("{:?}", twin.status_at(at)),
            ),
        };
        prop_assert_eq!(&a, &b, "op {} {:?} at {} ({:?})", i, op, now, s);
    }
    Ok("completed")
}

#[test]
fn lock_free_window_agrees_with_go_zero_script_twin() {
    let strategy = (setup(), prop::collection::vec((step(), op()), 1..120));
    let stats = common::tally("window differential", strategy, |(s, ops)| run(&s, &ops));
    assert_eq!(stats.len(), 1, "{stats:?}");
}

/// Many over-quota takes (the twin's counter runs far past the quota) and then a window
/// boundary: still identical.
#[test]
fn over_quota_counting_is_invisible() {
    let s = Setup {
        quota: 3,
        period: Duration::from_secs(10),
        align: None,
        start: 5,
    };
    let mut ops: Vec<(Step, Op)> = (0..50).map(|_| (Step::Same, Op::Take { n: 1 })).collect();
    ops.push((Step::Same, Op::Status));
    ops.push((Step::Same, Op::Take { n: 2 }));
    ops.push((Step::Periods(0.999), Op::Check { n: 1 }));
    ops.push((Step::Periods(0.001), Op::Take { n: 3 }));
    ops.push((Step::Same, Op::Status));
    run(&s, &ops).unwrap();
}
