//! loom models live in tests/; see the crate description. This library holds what they share.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The smallest preemption bound at which a model with three threads runs (see
/// [`model_3_threads`]).
pub const MIN_PREEMPTIONS_3_THREADS: usize = 4;

/// Runs a loom model of three threads at a preemption bound of at least
/// [`MIN_PREEMPTIONS_3_THREADS`], whatever `LOOM_MAX_PREEMPTIONS` says (`scripts/test` sets 3,
/// which leaves too few switches to stop one thread inside another's pair of operations);
/// a higher bound from the environment is kept. Other settings come from the environment as
/// with `loom::model`.
pub fn model_3_threads<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(
        builder
            .preemption_bound
            .map_or(MIN_PREEMPTIONS_3_THREADS, |b| {
                b.max(MIN_PREEMPTIONS_3_THREADS)
            }),
    );
    check(builder, f);
}

/// Runs a loom model at exactly `bound` preemptions, whatever `LOOM_MAX_PREEMPTIONS` says. For
/// models whose point is reached through the values loads may return (loom explores every
/// store a load may read at any bound) and whose thread schedules multiply by ~10 per extra
/// preemption: the bound keeps them to seconds. Each use says why its bound suffices.
pub fn model_at_bound<F>(bound: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(bound);
    check(builder, f);
}

fn check<F>(builder: loom::model::Builder, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    // What loom::model prints under LOOM_LOG (the executions explored), which
    // Builder::check alone does not.
    let executions = Arc::new(AtomicUsize::new(0));
    let count = executions.clone();
    builder.check(move || {
        count.fetch_add(1, Ordering::Relaxed);
        f();
    });
    if std::env::var_os("LOOM_LOG").is_some() {
        eprintln!(
            "loom: {} executions at preemption bound {:?}",
            executions.load(Ordering::Relaxed),
            builder.preemption_bound
        );
    }
}
