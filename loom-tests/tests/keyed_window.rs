//! loom models of `KeyedWindow` (`src/keyed/fixed_window/mod.rs`) on the word map's protocol
//! (`src/keyed/word_map.rs`): a grant is one CAS on the key's word, an eviction a CAS of the same
//! word to `DEAD`, a revival a CAS from `DEAD` to a word born at the sweep's time or later,
//! and a resize copies each live word before it freezes it. The window's rule differs from
//! the buckets' in what a word means (a window's end and count), in how a key is born (a
//! spent window ending at its birth) and in when it is idle (its window is over); each model
//! races a grant with one of the moves that depend on them and checks that no grant is lost
//! or counted twice and that a stale reading never finds a revived key more generous than
//! the evicted one. The growth models are the inline maps' shared ones
//! (`loom_tests::inline_growth_models`).
//!
//! Under loom the map's smallest table has 4 slots (so the fourth key grows it); retired
//! tables are leaked instead of epoch-reclaimed.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed_window
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::thread;
use turnstile::keyed::fixed_window::KeyedWindow;
use turnstile::{ManualClock, Nanos};

/// A fixed hasher: a model must run the same way every time.
type Fixed = BuildHasherDefault<DefaultHasher>;
type K = KeyedWindow<u8, Fixed, ManualClock>;

/// `quota` per `period` ns (ticks of a nanosecond or two: on the readings below), on a
/// manual clock at 0 (the base), swept only by hand; leaked because loom threads must be
/// 'static.
fn map(quota: u32, period: u64) -> &'static K {
    Box::leak(Box::new(
        KeyedWindow::builder(quota, Duration::from_nanos(period))
            .hasher(Fixed::default())
            .sweep_every(Duration::MAX)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

const T: Nanos = Nanos::new(6);

/// Inserts `key` at 0 without counting a request: born as a spent window ending at 0, idle
/// from 0 on.
fn insert(k: &K, key: u8) {
    assert!(k.check_n_at(&key, Nanos::ZERO, 0).is_ok());
}

/// check ‖ evict: key 1 is idle at 6, so the sweep may evict it at any point of the check.
/// Either the grant lands (a window `[6, 262)`) and the eviction's CAS fails, or the
/// eviction lands, the grant's CAS fails on `DEAD`, and the check revives the key (born
/// spent at 6) and opens the same window on it. One request either way: the next one at 6
/// is refused until the window ends.
#[test]
fn check_vs_evict_keeps_the_grant() {
    loom::model(|| {
        let k = map(1, 256);
        insert(k, 1);
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let evicted = k.evict_idle_at(T);
        assert!(a.join().unwrap());
        let d = k.check_n_at(&1, T, 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(Nanos::new(262)), "{evicted} evicted");
        assert_eq!(k.len(), 1);
    });
}

/// evict ‖ check on a busy key: key 1's window `[6, 262)` is spent, so a sweep at 6 racing
/// a second check must leave it alone: the check is refused and the key keeps its word. A
/// rule that judged it idle would revive it as born at 6 and open a second window at once.
#[test]
fn a_busy_key_is_not_evicted_under_a_check() {
    loom::model(|| {
        let k = map(1, 256);
        insert(k, 1);
        assert!(k.check_n_at(&1, T, 1).is_ok());
        let sweep = thread::spawn(move || k.evict_idle_at(T));
        assert!(k.check_n_at(&1, T, 1).is_err(), "a second request at 6");
        assert_eq!(sweep.join().unwrap(), 0);
        assert_eq!(k.len(), 1);
    });
}

/// A stale reading across an eviction: key 1's window `[0, 256)` is spent; a check reads 4,
/// then the sweep judges at 300 and evicts it. The check must not find a key born at 4 (it
/// would open a window there: two requests in `[0, 256)`): the reviver reads the sweep's
/// time after seeing `DEAD`, and a key born spent at 300 refuses 4.
#[test]
fn a_stale_reading_across_an_eviction_gains_nothing() {
    loom::model(|| {
        let k = map(1, 256);
        assert!(k.check_n_at(&1, Nanos::ZERO, 1).is_ok());
        let stale = thread::spawn(move || k.check_n_at(&1, Nanos::new(4), 1).is_ok());
        k.evict_idle_at(Nanos::new(300));
        assert!(!stale.join().unwrap(), "two requests in one window");
    });
}

loom_tests::inline_growth_models!();
