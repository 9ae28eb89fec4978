//! loom models of `KeyedSmoothWarmingUp` (`src/keyed/smooth_warming_up.rs`) on the word map's protocol
//! (`src/keyed/word_map.rs`) at its **128-bit** width: a grant is one CAS on the key's word, an
//! eviction a CAS of the same word to `DEAD`, a revival a CAS from `DEAD` to a word born at
//! the sweep's time or later, and a resize copies each live word before it freezes it. The
//! word is loom's `AtomicU128` stand-in (`src/sync.rs`), which checks the orderings as
//! written. The warming-up rule differs from the 64-bit rules in what a word holds (two
//! numbers, `next_free` and the store), in how a key is born (cold: the store full,
//! `next_free = B`) and in when it is idle (no debt, and cold again); each model races a
//! grant with one of the moves that depend on them and checks that no grant is lost or
//! counted twice and that a stale reading never finds a revived key more generous than the
//! evicted one.
//!
//! The configuration: permits 10 ns apart (1e8 per second) after a 20 ns warm-up, cold
//! factor 3: threshold 1 permit, 2 stored at most, one stored per 10 ns of idling. From
//! cold the first permit costs 20 ns (the trapezoid above the threshold), the second 10 ns.
//!
//! Under loom the map's smallest table has 4 slots (so the fourth key grows it); retired
//! tables are leaked instead of epoch-reclaimed.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed_warming
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::thread;
use turnstile::keyed::smooth_warming_up::KeyedSmoothWarmingUp;
use turnstile::{ManualClock, Nanos};

/// A fixed hasher: a model must run the same way every time.
type Fixed = BuildHasherDefault<DefaultHasher>;
type K = KeyedSmoothWarmingUp<u8, Fixed, ManualClock>;

/// The configuration above, on a manual clock at 0 (the base), swept only by hand; leaked
/// because loom threads must be 'static.
fn map() -> &'static K {
    Box::leak(Box::new(
        KeyedSmoothWarmingUp::builder(1e8, Duration::from_nanos(20))
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

/// Inserts `key` at 0 without taking a permit: born cold with `next_free = 0`, idle from 0
/// on.
fn insert(k: &K, key: u8) {
    assert!(k.check_n_at(&key, Nanos::ZERO, 0).is_ok());
}

/// check ‖ evict: key 1 is idle at 5, so the sweep may evict it at any point of the check.
/// Either the grant lands (a cold permit: `next_free = 25`, one stored) and the eviction's
/// CAS fails, or the eviction lands, the grant's CAS fails on `DEAD`, and the check revives
/// the key (born cold at 5) and grants on it (`next_free = 25` again). One permit either
/// way: the next check at 5 owes 20 ns.
#[test]
fn check_vs_evict_keeps_the_grant() {
    loom::model(|| {
        let k = map();
        insert(k, 1);
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let evicted = k.evict_idle_at(T);
        assert!(a.join().unwrap());
        let d = k.check_n_at(&1, T, 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(Nanos::new(25)), "{evicted} evicted");
        assert_eq!(k.len(), 1);
    });
}

/// evict ‖ check on a busy key: key 1 took its permit at 5 (`next_free = 25`), so a sweep
/// at 5 racing a second check must leave it alone: the check is refused and the key keeps
/// its word. A rule that judged it idle would revive it as born at 5 and grant a second
/// permit at once.
#[test]
fn a_busy_key_is_not_evicted_under_a_check() {
    loom::model(|| {
        let k = map();
        insert(k, 1);
        assert!(k.check_n_at(&1, T, 1).is_ok());
        let sweep = thread::spawn(move || k.evict_idle_at(T));
        assert!(k.check_n_at(&1, T, 1).is_err(), "a second permit at 5");
        assert_eq!(sweep.join().unwrap(), 0);
        assert_eq!(k.len(), 1);
    });
}

/// A stale reading across an eviction: key 1 took a cold permit at 0 (`next_free = 20`, one
/// stored, full again at 30); a check reads 12, then the sweep judges at 30 and evicts it.
/// The check must not find a key born at 12 (`next_free = 12`: it would grant a second
/// permit within 12 ns): the reviver reads the sweep's time after seeing `DEAD`, and a key
/// born at 30 refuses 12.
#[test]
fn a_stale_reading_across_an_eviction_gains_nothing() {
    loom::model(|| {
        let k = map();
        insert(k, 1);
        assert!(k.check_n_at(&1, Nanos::ZERO, 1).is_ok());
        let stale = thread::spawn(move || k.check_n_at(&1, Nanos::new(12), 1).is_ok());
        k.evict_idle_at(Nanos::new(30));
        assert!(!stale.join().unwrap(), "two permits in [0, 12 ns]");
    });
}

/// check ‖ growth: keys 1-3 fill the 4-slot table; inserting key 4 grows it while a check
/// takes key 1's permit. The grant lands in the old table before the freeze (and is
/// copied), or in the new table; never lost.
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
        let d = k.check_n_at(&1, T, 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(Nanos::new(25)), "the grant was lost");
        assert!(k.check_n_at(&4, T, 1).is_err(), "key 4's grant was lost");
        assert_eq!(k.len(), 4);
    });
}

/// check, check ‖ growth: key 1 takes a cold permit at 5 (`next_free = 25`, one stored) and
/// a warmer one at 25 (10 ns: `next_free = 35`) while a fourth key grows the table. A grant
/// between the copy and the freeze makes the freeze fail and the copy retried; a grant
/// after the freeze lands in the new table. Both count once, in order: the debt ends at 35
/// (a lost second grant would grant at 25; a lost first would make the second a cold
/// permit, ending at 45).
#[test]
fn two_grants_vs_growth_count_once_each() {
    bounded(2, || {
        let k = map();
        for key in 1..=3 {
            insert(k, key);
        }
        let a = thread::spawn(move || {
            k.check_n_at(&1, T, 1).is_ok() && k.check_n_at(&1, Nanos::new(25), 1).is_ok()
        });
        assert!(k.check_n_at(&4, T, 1).is_ok());
        assert!(a.join().unwrap());
        assert_eq!(k.resizes(), 1);
        let d = k.check_n_at(&1, Nanos::new(25), 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(Nanos::new(35)), "a grant was lost");
    });
}
