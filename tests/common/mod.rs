//! What the differential tests share: run random operation sequences through proptest and
//! count how each one ended (ran to the end, or stopped where a named deviation applies).

use std::collections::BTreeMap;
use std::fmt::Debug;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Runs `case` on `TURNSTILE_DIFF_CASES` (default 3000) values of `strategy`, failing on the
/// first case that fails (shrunk, as proptest does), and returns how many cases ended each
/// way. `label` names the run in the printed tally.
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
