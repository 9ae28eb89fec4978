//! loom models of `KeyedTokenBucket`'s table protocol (`src/keyed/word_map.rs`, the engine of every
//! inline map): a grant is one CAS on the key's word, an eviction a CAS of the same word to
//! `DEAD`, a revival a CAS from `DEAD`, a resize freezes the dead words, then copies each live
//! word into the new table before it freezes it (again if the word changed), so a check that
//! finds its word frozen goes on in the new table without waiting; keys are written once under
//! the writer lock and published by the word's `Release` store. Each model races two or three
//! of those and checks that no grant is lost or counted twice, that a stale reading never finds
//! a revived or re-inserted key more generous than the evicted one, and (through loom's
//! `UnsafeCell`) that no key is read while it is written.
//!
//! Under loom the map's smallest table has 4 slots (so the fourth key grows it) and a sweep
//! purges from 2 dead slots; retired tables are leaked instead of epoch-reclaimed (the
//! reclamation is crossbeam-epoch's own, model-checked in that crate).
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed_bucket
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::thread;
use turnstile::keyed::token_bucket::KeyedTokenBucket;
use turnstile::{Limit, ManualClock, Nanos};

/// A fixed hasher: a model must run the same way every time (std's `RandomState` would put
/// the keys in other slots on each run).
type Fixed = BuildHasherDefault<DefaultHasher>;
type K = KeyedTokenBucket<u8, Fixed, ManualClock>;

/// One token per 10 ns, burst 1, swept only by hand; leaked because loom threads must be
/// 'static.
fn map() -> &'static K {
    map_with_burst(1)
}

/// As [`map`], with bursts of `burst`.
fn map_with_burst(burst: u32) -> &'static K {
    Box::leak(Box::new(
        KeyedTokenBucket::builder(Limit::per_second(1e8).unwrap(), burst)
            .hasher(Fixed::default())
            .sweep_every(Duration::MAX)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

const T: Nanos = Nanos::new(5);

/// Runs `f` under loom with at most `bound` preemptions (or the caller's
/// `LOOM_MAX_PREEMPTIONS` if higher): the models with a resize or three threads are too big
/// to explore unbounded.
fn bounded(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(model.preemption_bound.unwrap_or(bound).max(bound));
    model.check(f);
}

/// Inserts `key` without taking a token (idle: full at its birth, 0).
fn insert(k: &K, key: u8) {
    assert!(k.check_n_at(&key, Nanos::ZERO, 0).is_ok());
}

/// check ‖ evict: key 1 exists and is idle, so the sweep may evict it at any point of the
/// check. Either the grant lands first and the eviction's CAS fails, or the eviction lands,
/// the grant's CAS fails on `DEAD`, and the check revives the key and grants on it.
#[test]
fn check_vs_evict_keeps_the_grant() {
    loom::model(|| {
        let k = map();
        insert(k, 1);
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let evicted = k.evict_idle_at(T);
        assert!(a.join().unwrap());
        assert!(
            k.check_n_at(&1, T, 1).is_err(),
            "the grant was lost ({evicted} evicted)"
        );
        assert_eq!(k.len(), 1);
    });
}

/// evict ‖ check on a busy key: key 1 took its token at 5 (full again only at 15), so a
/// sweep at 5 racing a second check must leave it alone: the check is refused and the key
/// keeps its word. A rule that judged it idle would revive it born at 5, full, and grant a
/// second token at once; `check_vs_evict_keeps_the_grant` alone cannot tell, as its key is
/// idle either way.
#[test]
fn a_busy_key_is_not_evicted_under_a_check() {
    loom::model(|| {
        let k = map();
        insert(k, 1);
        assert!(k.check_n_at(&1, T, 1).is_ok());
        let sweep = thread::spawn(move || k.evict_idle_at(T));
        assert!(k.check_n_at(&1, T, 1).is_err(), "a second token at 5");
        assert_eq!(sweep.join().unwrap(), 0);
        assert_eq!(k.len(), 1);
    });
}

/// insert ‖ insert ‖ evict: key 1 is new; two checks race to insert it (under the writer
/// lock, one finds it there) while a sweep may evict the idle newborn. One token in all.
#[test]
fn insert_vs_insert_vs_evict_grants_once() {
    bounded(2, || {
        let k = map();
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let b = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        k.evict_idle_at(T);
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(a != b, "{a} {b}");
        assert!(k.check_n_at(&1, T, 1).is_err());
        assert_eq!(k.len(), 1);
    });
}

/// revive ‖ revive: key 1 is dead; two checks race to bring it back. One token, and the
/// key counted once (the loser gives its room back).
#[test]
fn revive_vs_revive_grants_once_and_counts_once() {
    loom::model(|| {
        let k = map();
        insert(k, 1);
        assert_eq!(k.evict_idle_at(T), 1);
        assert_eq!(k.len(), 0);
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let b = k.check_n_at(&1, T, 1).is_ok();
        let a = a.join().unwrap();
        assert!(a != b, "{a} {b}");
        assert_eq!(k.len(), 1);
    });
}

/// A stale reading across an eviction: key 1 spent its token at 0 (full again at 10); a
/// check reads 3, then the sweep judges at 10 and evicts it. The check must not find a
/// bucket born at 3 (it would grant a second token within 3 ns): the reviver reads the
/// sweep's time after seeing `DEAD`, through the eviction CAS's `Release`.
#[test]
fn a_stale_reading_across_an_eviction_gains_nothing() {
    loom::model(|| {
        let k = map();
        assert!(k.check_n_at(&1, Nanos::ZERO, 1).is_ok());
        let stale = thread::spawn(move || k.check_n_at(&1, Nanos::new(3), 1).is_ok());
        k.evict_idle_at(Nanos::new(10));
        assert!(!stale.join().unwrap(), "two tokens in [0, 3 ns]");
    });
}

/// check ‖ growth: keys 1-3 fill the 4-slot table to its bound; inserting key 4 grows it
/// (freeze, copy, publish) while a check takes key 1's token. The grant lands in the old
/// table before the freeze (and is copied), or waits for the new table; never lost.
#[test]
fn check_vs_growth_keeps_the_grant() {
    bounded(2, || {
        let k = map();
        for key in 1..=3 {
            insert(k, key);
        }
        assert_eq!(k.resizes(), 0);
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        assert!(k.check_n_at(&4, T, 1).is_ok());
        assert!(a.join().unwrap());
        assert_eq!(k.resizes(), 1);
        assert!(k.check_n_at(&1, T, 1).is_err(), "the grant was lost");
        assert!(k.check_n_at(&4, T, 1).is_err(), "key 4's grant was lost");
        assert_eq!(k.len(), 4);
    });
}

/// check ‖ purge: keys 1-3 are idle; a sweep evicts them and, with more dead slots than
/// live, rebuilds the table, while a check takes key 1's token (before the eviction: key 1
/// stays and is copied; after: it is revived in the old table before the freeze, or
/// inserted again in the new one).
#[test]
fn check_vs_purge_keeps_the_grant() {
    bounded(2, || {
        let k = map();
        for key in 1..=3 {
            insert(k, key);
        }
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        k.evict_idle_at(T);
        assert!(a.join().unwrap());
        assert!(k.check_n_at(&1, T, 1).is_err(), "the grant was lost");
        assert!(k.contains(&1));
        assert_eq!(k.len(), 1);
    });
}

/// check, check ‖ growth: key 1 (burst 2) takes both its tokens while a fourth key grows
/// the table. A grant between the copy and the freeze makes the freeze fail and the copy
/// retried; a grant after the freeze lands in the new table (the check follows the old
/// table's `next`). Both count once, and a third check is refused.
#[test]
fn two_grants_vs_growth_count_once_each() {
    bounded(2, || {
        let k = map_with_burst(2);
        for key in 1..=3 {
            insert(k, key);
        }
        let a =
            thread::spawn(move || k.check_n_at(&1, T, 1).is_ok() && k.check_n_at(&1, T, 1).is_ok());
        assert!(k.check_n_at(&4, T, 1).is_ok());
        assert!(a.join().unwrap());
        assert_eq!(k.resizes(), 1);
        assert!(k.check_n_at(&1, T, 1).is_err(), "a grant was lost");
    });
}

/// refund ‖ growth: key 1's token was taken; its refund races the table's growth and lands
/// in the old table before the freeze (and is copied) or in the new one after it.
#[test]
fn refund_vs_growth_keeps_the_refund() {
    bounded(2, || {
        let k = map();
        for key in 1..=3 {
            insert(k, key);
        }
        assert!(k.check_n_at(&1, T, 1).is_ok());
        let a = thread::spawn(move || k.refund_n_at(&1, T, 1));
        assert!(k.check_n_at(&4, T, 1).is_ok());
        assert!(a.join().unwrap());
        assert!(k.check_n_at(&1, T, 1).is_ok(), "the refund was lost");
    });
}
