//! loom models of `KeyedSmoothBursty` (`src/keyed/smooth_bursty.rs`) on the word map's protocol
//! (`src/keyed/word_map.rs`): a grant is one CAS on the key's word, an eviction a CAS of the same
//! word to `DEAD`, a revival a CAS from `DEAD` to a word born at the sweep's time or later,
//! and a resize copies each live word before it freezes it. The bursty rule differs from
//! the other inline rules in what a word means (`z = next_free - stored * I`, shifted), in
//! how a key is born (`z = B`: nothing stored, no debt), in when it is idle (its debt has
//! cleared, `z <= now`) and in paying later (a grant needs only `z <= now`); each model
//! races a grant with one of the moves that depend on them and checks that no grant is lost
//! or counted twice and that a stale reading never finds a revived key more generous than
//! the evicted one.
//!
//! Under loom the map's smallest table has 4 slots (so the fourth key grows it); retired
//! tables are leaked instead of epoch-reclaimed.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed_smooth
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::thread;
use turnstile::keyed::smooth_bursty::KeyedSmoothBursty;
use turnstile::{ManualClock, Nanos};

/// A fixed hasher: a model must run the same way every time.
type Fixed = BuildHasherDefault<DefaultHasher>;
type K = KeyedSmoothBursty<u8, Fixed, ManualClock>;

/// Permits 10 ns apart (1e8 per second) storing up to `stored` of them, on a manual clock
/// at 0 (the base), swept only by hand; leaked because loom threads must be 'static.
fn map(stored: u32) -> &'static K {
    Box::leak(Box::new(
        KeyedSmoothBursty::builder(1e8)
            .max_burst_seconds(f64::from(stored) * 1e-8)
            .hasher(Fixed::default())
            .sweep_every(Duration::MAX)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

const T: Nanos = Nanos::new(5);

/// Runs `f` under loom with at most `bound` preemptions (or the caller's
/// `LOOM_MAX_PREEMPTIONS` if higher).
fn bounded(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(model.preemption_bound.unwrap_or(bound).max(bound));
    model.check(f);
}

/// Inserts `key` at 0 without taking a permit: born with `z = 0`, idle from 0 on.
fn insert(k: &K, key: u8) {
    assert!(k.check_n_at(&key, Nanos::ZERO, 0).is_ok());
}

/// check ‖ evict: key 1 is idle at 5, so the sweep may evict it at any point of the check.
/// Either the grant lands (`z = 15`) and the eviction's CAS fails, or the eviction lands,
/// the grant's CAS fails on `DEAD`, and the check revives the key (born at 5) and grants on
/// it (`z = 15` again). One permit either way: the next check at 5 owes 10 ns.
#[test]
fn check_vs_evict_keeps_the_grant() {
    loom::model(|| {
        let k = map(0);
        insert(k, 1);
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let evicted = k.evict_idle_at(T);
        assert!(a.join().unwrap());
        let d = k.check_n_at(&1, T, 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(Nanos::new(15)), "{evicted} evicted");
        assert_eq!(k.len(), 1);
    });
}

/// evict ‖ check on a busy key: key 1 took its permit at 5 (`z = 15`, a debt until 15), so
/// a sweep at 5 racing a second check must leave it alone: the check is refused and the
/// key keeps its word. A rule that judged it idle would revive it as born at 5 and grant a
/// second permit at once.
#[test]
fn a_busy_key_is_not_evicted_under_a_check() {
    loom::model(|| {
        let k = map(0);
        insert(k, 1);
        assert!(k.check_n_at(&1, T, 1).is_ok());
        let sweep = thread::spawn(move || k.evict_idle_at(T));
        assert!(k.check_n_at(&1, T, 1).is_err(), "a second permit at 5");
        assert_eq!(sweep.join().unwrap(), 0);
        assert_eq!(k.len(), 1);
    });
}

/// A stale reading across an eviction: with one permit stored at most, key 1 took two at
/// 10 (born at 0, one stored at 10, one fresh: `z = 20`); a check reads 12, then the sweep
/// judges at 20 and evicts it. The check must not find a key born at 12 (`z = 12`: it would
/// grant a third permit within 12 ns): the reviver reads the sweep's time after seeing
/// `DEAD`, and a key born at 20 refuses 12.
#[test]
fn a_stale_reading_across_an_eviction_gains_nothing() {
    loom::model(|| {
        let k = map(1);
        insert(k, 1);
        assert!(k.check_n_at(&1, Nanos::new(10), 2).is_ok());
        let stale = thread::spawn(move || k.check_n_at(&1, Nanos::new(12), 1).is_ok());
        k.evict_idle_at(Nanos::new(20));
        assert!(!stale.join().unwrap(), "three permits in [10, 12 ns]");
    });
}

/// check ‖ growth: keys 1-3 fill the 4-slot table; inserting key 4 grows it while a check
/// takes key 1's permit. The grant lands in the old table before the freeze (and is
/// copied), or in the new table; never lost.
#[test]
fn check_vs_growth_keeps_the_grant() {
    bounded(2, || {
        let k = map(0);
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

/// check, check ‖ growth: with one permit stored at most, key 1 (born at 0) has two permits
/// at 15 (the stored one, then one fresh: `z` goes 5, 15, 25); both are taken while a
/// fourth key grows the table. A grant between the copy and the freeze makes the freeze
/// fail and the copy retried; a grant after the freeze lands in the new table. Both count
/// once: a third is refused.
#[test]
fn two_grants_vs_growth_count_once_each() {
    bounded(2, || {
        let k = map(1);
        for key in 1..=3 {
            insert(k, key);
        }
        let t = Nanos::new(15);
        let a =
            thread::spawn(move || k.check_n_at(&1, t, 1).is_ok() && k.check_n_at(&1, t, 1).is_ok());
        assert!(k.check_n_at(&4, t, 1).is_ok());
        assert!(a.join().unwrap());
        assert_eq!(k.resizes(), 1);
        assert!(k.check_n_at(&1, t, 1).is_err(), "a grant was lost");
    });
}
