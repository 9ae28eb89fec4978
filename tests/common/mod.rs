//! What the tests share: the differential tests' runner (random operation sequences through
//! proptest, counting how each one ended: ran to the end, or stopped where a named deviation
//! applies) and the bad-input tests' extreme times.

use std::collections::BTreeMap;
use std::fmt::Debug;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use turnstile::Nanos;

/// Runs `case` on `TURNSTILE_DIFF_CASES` (default 3000) values of `strategy`, failing on the
/// first case that fails (shrunk, as proptest does), and returns how many cases ended each
/// way. `label` names the run in the printed tally.
#[allow(dead_code)] // not every test binary uses every helper
pub fn tally<S, K>(
    label: &str,
    strategy: S,
    case: impl Fn(S::Value) -> Result<K, TestCaseError>,
) -> BTreeMap<K, u32>
where
    S: Strategy,
    K: Ord + Debug,
{
    let cases = std::env::var("TURNSTILE_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let stats = std::cell::RefCell::new(BTreeMap::<K, u32>::new());
    runner
        .run(&strategy, |value| {
            let end = case(value)?;
            *stats.borrow_mut().entry(end).or_default() += 1;
            Ok(())
        })
        .unwrap();
    let stats = stats.into_inner();
    eprintln!("{label} outcomes: {stats:?}");
    stats
}

/// The extreme times the bad-input tests try every operation at: the start of time, one
/// second in, the middle, and the last nanoseconds before and at `Nanos::MAX`.
#[allow(dead_code)] // not every test binary uses every helper
pub fn extreme_times() -> Vec<Nanos> {
    [
        0,
        1,
        1_000_000_000,
        u64::MAX / 2,
        u64::MAX - 1_000_000_000,
        u64::MAX - 2,
        u64::MAX - 1,
        u64::MAX,
    ]
    .into_iter()
    .map(Nanos::new)
    .collect()
}
