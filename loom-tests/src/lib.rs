//! loom models live in tests/; see the crate description. This library holds what they share.
//!
//! # What the models catch
//! Each line is a mutation of the crate that was tried (and reverted) and the models that
//! failed on it; run with `LOOM_MAX_PREEMPTIONS=3` as `scripts/test` does. "None" lines say
//! why the ordering is not needed rather than inventing a failure.
//!
//! **Configuration slots** (`src/config_slots.rs`, under `TokenBucket` and the smooth limiters)
//! * drop the reader's re-check (second `seq` load), its `Acquire` fence, or the writer's
//!   `Release` fence: `token_bucket::set_limit_twice_vs_allow_on_a_full_bucket_grants`,
//!   `smooth::set_rate_twice_vs_acquire_is_linearizable`.
//! * The configuration of epoch `e` reaches a reader by **two** publications, each enough on
//!   its own: the state word (`Acquire` load, `Release` on the reconfiguring CAS, written after
//!   the slot) and the slot's `seq` (`Release` store after the words, `Acquire` first load).
//!   So weakening any one of those four is caught by no model, and needs none: the other
//!   publication still orders the words before the read. Weakening one of each is caught:
//!   - state load `Acquire -> Relaxed` with first `seq` load `Acquire -> Relaxed`, or with the
//!     `seq` store `Release -> Relaxed`: in `token_bucket`,
//!     `set_limit_twice_vs_allow_on_a_full_bucket_grants` and
//!     `set_limit_vs_set_limit_vs_allow_on_a_full_bucket_grants`; in `smooth`,
//!     `acquire_vs_set_rate_is_charged_at_one_rate`.
//!   - reconfiguring CAS `AcqRel -> Acquire` with first `seq` load `Acquire -> Relaxed`:
//!     `token_bucket::set_limit_vs_reserve_is_linearizable` (and the two above);
//!     `smooth::acquire_vs_set_rate_is_charged_at_one_rate`.
//!
//!   With the old `Mutex` stand-in for `AtomicU128`, state load and first `seq` load both
//!   `Relaxed` survived every model.
//!
//! **Hot-path CASes** of `TokenBucket` (take, cancel) and the smooth limiters,
//! `AcqRel`/`Acquire -> Relaxed`: none, and not needed. They publish nothing (the
//! configuration is published by the reconfiguration), and a reader of a value they wrote
//! still synchronizes with the reconfiguring CAS through its release sequence, which any
//! read-modify-write continues whatever its ordering (loom models that too).
//!
//! **CAS -> blind store** (the lost update):
//! * `TokenBucket` take: `allow_vs_allow_grants_the_last_token_once`,
//!   `reserve_vs_reserve_queues_both` and five more; cancel:
//!   `cancel_vs_cancel_both_restorations_land`, `reserve_vs_cancel_is_linearizable`.
//! * smooth take: every smooth model then present (all seven;
//!   `acquire_vs_set_rate_is_charged_at_one_rate` was added later); `set_rate`'s CAS:
//!   `set_rate_vs_acquire_is_linearizable` and three more.
//! * `FixedWindow`: `take_vs_take_at_the_last_unit_exactly_one_wins` and two more;
//!   `SlidingWindow`: all five; `LeakyBucket` take: five, check: three.
//! * `Sometimes` interval claim: `interval_slot_claimed_once`; `fetch_max -> store`:
//!   `count_run_at_an_earlier_time_never_moves_the_interval_back`; `fetch_add -> load + store`:
//!   all six others.
//!
//! `FixedWindow`, `SlidingWindow`, `LeakyBucket` and `Sometimes` use `Relaxed` throughout: each
//! word is its limiter's whole state and publishes no other memory, so there is no ordering to
//! weaken; their protocols rest on the RMWs, which the blind-store lines check.

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
