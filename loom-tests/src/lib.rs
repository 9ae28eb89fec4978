//! loom models live in tests/; see the crate description. This library holds what they share.
//!
//! # What the models catch
//! Each line is a mutation of the crate that was tried (and reverted) and the models that
//! failed on it; run with `LOOM_MAX_PREEMPTIONS=3` as `scripts/test` does. "None" lines say
//! why the ordering is not needed rather than inventing a failure.
//!
//! **`TokenBucket`'s word-validated slots** (`src/token_bucket.rs`: the 64-bit state word's
//! generation is the sequence number of two plain-word configuration slots)
//! * drop a denial's validating reload, its `Acquire` fence, or the writer's `Release` fence
//!   before it rewrites a slot:
//!   `token_bucket::set_burst_twice_vs_allow_never_denies_what_every_configuration_grants`.
//! * fast-path state load `Acquire -> Relaxed`: that model and
//!   `set_limit_twice_vs_allow_on_a_full_bucket_grants`.
//! * reconfiguring CAS `AcqRel -> Relaxed`: those two, `set_limit_vs_reserve_is_linearizable`
//!   and `set_limit_vs_set_limit_vs_allow_on_a_full_bucket_grants`.
//! * grant CAS `AcqRel -> Relaxed`: none. Its `Release` orders the grant's slot reads before a
//!   later writer's slot writes only against load buffering (a read returning a store that
//!   follows, in the other thread, a read of this thread's later CAS), which loom does not
//!   model; it costs nothing on x86 and is kept.
//!
//! **`TokenBucket`'s refund** (`Limiter::refund_n_at`, a CAS on the whole state word)
//! * a blind `store` of the refunded word instead of the CAS:
//!   `token_bucket::refund_vs_refund_both_land_within_the_burst` and
//!   `token_bucket::refund_vs_set_burst_is_linearizable` (and, outside loom, 5 of 5 runs of
//!   `tests/quota_and_refund.rs::token_bucket_refund_stress`).
//!
//! **Configuration slots** (`src/config_slots.rs`, under the smooth limiters)
//! * drop the reader's re-check (second `seq` load), its `Acquire` fence, or the writer's
//!   `Release` fence: `smooth::set_rate_twice_vs_acquire_is_linearizable`.
//! * The configuration of epoch `e` reaches a reader by **two** publications, each enough on
//!   its own: the state word (`Acquire` load, `Release` on the reconfiguring CAS, written after
//!   the slot) and the slot's `seq` (`Release` store after the words, `Acquire` first load).
//!   So weakening any one of those four is caught by no model, and needs none: the other
//!   publication still orders the words before the read. Weakening one of each is caught by
//!   `smooth::acquire_vs_set_rate_is_charged_at_one_rate`.
//!
//!   With the old `Mutex` stand-in for `AtomicU128`, state load and first `seq` load both
//!   `Relaxed` survived every model.
//!
//! **`MultiTokenBucket`** (`src/multi_token_bucket/engine.rs`: the 128-bit word's epoch is the
//! sequence of the two slots of a `ConfigSlots`, each with the epoch it holds; models in
//! `tests/multi_token_bucket.rs`)
//! * drop a refusal's validation (`ConfigSlots::holds`' `seq` read), its `Acquire` fence, the
//!   writer's `Release` fence or its `seq = WRITING` store (`ConfigSlots::write`):
//!   `set_limits_twice_vs_check_on_a_full_bucket_grants`.
//! * the check's state load `Acquire -> Relaxed`, or the reconfiguring CAS `AcqRel ->
//!   Relaxed`: `check_vs_set_limits_is_linearizable`,
//!   `check_vs_set_limits_never_grants_what_neither_configuration_grants`,
//!   `refusal_vs_set_limits_reports_one_configurations_retry` and
//!   `set_limits_twice_vs_check_on_a_full_bucket_grants`. (A grant has one publication of its
//!   configuration, the state word; a refusal has two, the word and the slot's `seq`.)
//! * the grant CAS made a store: `check_vs_check_both_land`,
//!   `check_vs_check_grants_exactly_what_the_budget_allows`,
//!   `check_vs_check_at_different_readings_is_linearizable` and
//!   `set_limits_twice_vs_check_on_a_full_bucket_grants` (and, outside loom, the
//!   `tests/multi_token_bucket/stress.rs` binary: its lockstep totals and its moving-clock
//!   budget). `set_limits`' CAS made a store: `set_limits_twice_vs_check_on_a_full_bucket_
//!   grants`.
//! * the grant CAS `AcqRel -> Relaxed`: none, as for `TokenBucket`'s grant CAS.
//! * `KeyedMultiTokenBucket`'s grant CAS (`src/keyed/word_map.rs`) made a load and a store:
//!   `keyed_check_vs_check_on_one_key_both_land`, `keyed_check_vs_evict_keeps_the_grant`
//!   (and, outside loom, the stress binary's hot-key lockstep totals, 3 of 3 runs).
//! * one limit's test dropped from the verdict (`over` for limit 0 only, `word.rs`):
//!   `check_vs_check_grants_exactly_what_the_budget_allows` (and every test of
//!   `tests/multi_token_bucket/stress.rs`).
//!
//! **Hot-path CASes** of `TokenBucket`'s cancel and the smooth limiters,
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
//! * `SketchTokenBucket`'s grant CAS (`src/keyed/sketch_token_bucket/cells.rs`) made a store:
//!   both `keyed_sketch` models (and, outside loom, `tests/keyed/sketch_stress.rs`'s one-key
//!   total, 3 of 3 runs). Its load `Acquire -> Relaxed` and CAS `AcqRel -> Relaxed`: none, and
//!   not needed: the word publishes nothing but itself. A penalty's refusal answering without
//!   retrying a failed CAS: `a_penalty_and_a_grant_on_one_word_both_land`.
//!
//! **`Keyed`'s eviction protocol** (`src/keyed/slot.rs`, `src/keyed.rs`; its models are in
//! `tests/keyed.rs`, whose header lists the mutations with the models that catch each)
//! * either `SeqCst` fence, the post-grant state check, the `RETIRING` veto, the replay after
//!   `DEAD`, the evictor's second idleness check, its `RETIRING -> DEAD` CAS (made a store):
//!   every `keyed` model but the stale one, and `keyed_table`'s two eviction models. A veto
//!   that replays the check (the grant counted twice): some of those (`keyed.rs`' header).
//! * the newborn's `born_at` dropped or dated before the writer lock, or the sweep's
//!   publication of the time it judged at dropped:
//!   `keyed::stale_check_vs_check_vs_evict_never_grants_twice`.
//!
//! **`Keyed`'s table** (`src/keyed/table.rs`; its models are in `tests/keyed_table.rs`, whose
//! header lists the mutations with the loom report each gives)
//! * table pointer load `Acquire -> Relaxed`, or the resize's swap `Release -> Relaxed`:
//!   `keyed_table::check_vs_resize_by_another_keys_insert_keeps_the_grant`.
//! * a lookup's word load `Acquire -> Relaxed`, or the word stored before the key:
//!   `keyed_table::insert_vs_insert_of_a_new_key_builds_one_limiter`.
//! * a swept slot freed at once instead of retired: `keyed_table::check_vs_evict_never_reads_a_freed_slot`
//!   and `keyed_table::check_vs_resize_vs_evict_keeps_both_grants`.
//!
//! **`Lease`** (`src/lease.rs`, under `redis::Leased`; models in `tests/lease.rs`, whose header
//! lists the mutations)
//! * the spend's CAS, or `take_all`'s `fetch_and`, replaced by a load and a store: the
//!   conservation models.
//! * `end_renewal`'s CAS, or the spender's first word load, made `Relaxed`:
//!   `lease::a_refusal_is_seen_with_the_end_of_its_renewal`.
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

/// Runs a loom model with at most `bound` preemptions (or the environment's
/// `LOOM_MAX_PREEMPTIONS` if higher).
pub fn model_at_least<F>(bound: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(bound).max(bound));
    check(builder, f);
}

/// The growth models of an inline map whose quota `q` per `p` ns is `map(q, p)` (the
/// caller's, on a manual clock at 0, swept by hand), with `insert(k, key)` adding a key
/// without counting a request and `T` a reading at which a first request is granted and a
/// second of a quota of 1 refused:
///
/// * `check_vs_growth_keeps_the_grant`: keys 1-3 fill the 4-slot table; inserting key 4
///   grows it while a check counts key 1's request. The grant lands in the old table before
///   the freeze (and is copied), or in the new table; never lost.
/// * `two_grants_vs_growth_count_once_each`: with a quota of 2, key 1 takes both while a
///   fourth key grows the table. A grant between the copy and the freeze makes the freeze
///   fail and the copy retried; a grant after the freeze lands in the new table. Both count
///   once: a third is refused.
#[macro_export]
macro_rules! inline_growth_models {
    () => {
        #[test]
        fn check_vs_growth_keeps_the_grant() {
            $crate::model_at_least(2, || {
                let k = map(1, 256);
                for key in 1..=3 {
                    insert(k, key);
                }
                assert_eq!(k.resizes(), 0);
                let a = loom::thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
                assert!(k.check_n_at(&4, T, 1).is_ok());
                assert!(a.join().unwrap());
                assert_eq!(k.resizes(), 1);
                assert!(k.check_n_at(&1, T, 1).is_err(), "the grant was lost");
                assert!(k.check_n_at(&4, T, 1).is_err(), "key 4's grant was lost");
                assert_eq!(k.len(), 4);
            });
        }

        #[test]
        fn two_grants_vs_growth_count_once_each() {
            $crate::model_at_least(2, || {
                let k = map(2, 512);
                for key in 1..=3 {
                    insert(k, key);
                }
                let a = loom::thread::spawn(move || {
                    k.check_n_at(&1, T, 1).is_ok() && k.check_n_at(&1, T, 1).is_ok()
                });
                assert!(k.check_n_at(&4, T, 1).is_ok());
                assert!(a.join().unwrap());
                assert_eq!(k.resizes(), 1);
                assert!(k.check_n_at(&1, T, 1).is_err(), "a grant was lost");
            });
        }
    };
}
