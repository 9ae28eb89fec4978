//! loom models live in tests/; see the crate description. This library holds what they share.

/// The smallest preemption bound at which a model with three threads runs: with fewer, a
/// reader cannot be stopped between the two checks of a configuration slot while two
/// reconfigurations run (the seqlock's retry path), and a wrong retry would go unseen.
pub const MIN_PREEMPTIONS_3_THREADS: usize = 4;

/// Runs a loom model of three threads at a preemption bound of at least
/// [`MIN_PREEMPTIONS_3_THREADS`], whatever `LOOM_MAX_PREEMPTIONS` says (`scripts/test` sets 3);
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
    builder.check(f);
}
