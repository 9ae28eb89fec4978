//! loom models of `KeyedSlidingWindow` (`src/keyed/sliding_window.rs`) on the word map's protocol
//! (`src/keyed/word_map.rs`): a grant is one CAS on the key's word, an eviction a CAS of the same
//! word to `DEAD`, a revival a CAS from `DEAD` to a word born at the sweep's time or later,
//! and a resize copies each live word before it freezes it. The sliding rule differs from
//! the others in what a word means (`(k, prev, curr)`), in how a key is born (`(B / P, 0,
//! 0)`: empty windows in `B`'s) and in when it is idle (its weighted count is 0, two windows
//! after its last grant's at the latest); each model races a grant with one of the moves
//! that depend on them and checks that no grant is lost or counted twice and that a stale
//! reading across an eviction is judged in the newborn's window. The growth models are the
//! inline maps' shared ones (`loom_tests::inline_growth_models`).
//!
//! Under loom the map's smallest table has 4 slots (so the fourth key grows it); retired
//! tables are leaked instead of epoch-reclaimed.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed_sliding
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::thread;
use turnstile::keyed::sliding_window::KeyedSlidingWindow;
use turnstile::{ManualClock, Nanos};

/// A fixed hasher: a model must run the same way every time.
type Fixed = BuildHasherDefault<DefaultHasher>;
type K = KeyedSlidingWindow<u8, Fixed, ManualClock>;

/// `quota` per `period` ns, on a manual clock at 0 (the base: windows `[kP, (k + 1)P)`),
/// swept only by hand; leaked because loom threads must be 'static.
fn map(quota: u32, period: u64) -> &'static K {
    Box::leak(Box::new(
        KeyedSlidingWindow::builder(quota, Duration::from_nanos(period))
            .hasher(Fixed::default())
            .sweep_every(Duration::MAX)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

const T: Nanos = Nanos::new(6);

/// Inserts `key` at 0 without counting a request: born `(0, 0, 0)`, idle from 0 on.
fn insert(k: &K, key: u8) {
    assert!(k.check_n_at(&key, Nanos::ZERO, 0).is_ok());
}

/// check ‖ evict: key 1 is idle at 6, so the sweep may evict it at any point of the check.
/// Either the grant lands (`(0, 0, 1)`) and the eviction's CAS fails, or the eviction lands,
/// the grant's CAS fails on `DEAD`, and the check revives the key (born at 6: `(0, 0, 0)`)
/// and grants on it. One request either way: the next one at 6 is refused, until window 2
/// (in window 1 the grant weighs `P - e > 0`, quota 1).
#[test]
fn check_vs_evict_keeps_the_grant() {
    loom::model(|| {
        let k = map(1, 256);
        insert(k, 1);
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let evicted = k.evict_idle_at(T);
        assert!(a.join().unwrap());
        let d = k.check_n_at(&1, T, 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(Nanos::new(512)), "{evicted} evicted");
        assert_eq!(k.len(), 1);
    });
}

/// evict ‖ check on a busy key: key 1's window 0 is spent, so a sweep at 6 racing a second
/// check must leave it alone: the check is refused and the key keeps its word. A rule that
/// judged it idle would revive it empty at 6 and grant again at once.
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

/// A stale reading across an eviction: key 1 took its quota at 0 (window 0); a check reads
/// 300 (window 1, where that grant still weighs), then the sweep judges at 512 (window 2:
/// idle) and evicts it; then a check at 512. Before the eviction the stale check is refused
/// and the one at 512 granted; after it the reviver reads the sweep's time after seeing
/// `DEAD`, the newborn is `(2, 0, 0)`, the stale check is judged at 512 and granted, and the
/// one at 512 refused. Either way one grant, counted in window 2, which weighs until the
/// end of window 3. A newborn dated at the stale reading (window 1, `prev` lost) would put
/// the grant in window 1, beside window 0's: two in the span `[300, 556)`.
#[test]
fn a_stale_reading_across_an_eviction_is_judged_in_the_newborns_window() {
    loom::model(|| {
        let k = map(1, 256);
        assert!(k.check_n_at(&1, Nanos::ZERO, 1).is_ok());
        let stale = thread::spawn(move || k.check_n_at(&1, Nanos::new(300), 1).is_ok());
        k.evict_idle_at(Nanos::new(512));
        let a = stale.join().unwrap();
        let b = k.check_n_at(&1, Nanos::new(512), 1).is_ok();
        assert!(a != b, "stale {a}, at 512 {b}: one grant");
        assert_eq!(k.status_at(&1, Nanos::new(512)).resets_at, Nanos::new(1024));
    });
}

loom_tests::inline_growth_models!();
