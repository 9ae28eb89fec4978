//! loom models of `Keyed`'s table (`src/keyed/table.rs`): an open-addressing table of
//! `(word, key)` entries whose word points to the key's slot, read without a lock and written
//! under one mutex; a resize copies slot pointers, a removal stores a tombstone and retires
//! the slot. Each model races a lookup against one writer: a resize (grow) caused by another
//! key's insert, the removal of the lookup's own key by a sweep, the insert of the same new
//! key. They check that the lookup finds the key's one slot (its grant is not lost and not
//! counted twice) and, through loom's `UnsafeCell`, that no key is read before its write
//! happens-before the read, and no slot or table is freed while a lookup may hold it.
//!
//! Under loom the table starts with 2 entries (the second key grows it), hashes with a fixed
//! hasher, and keeps what it retires until the map is dropped (the table's "Under loom"):
//! so each model drops its map at the end, where every free of a slot or a table must
//! happen-after each lookup that found it, or loom reports it.
//!
//! Mutations each model catches (tried and reverted):
//! * the table pointer's `Acquire` load, or the resize's `Release` swap, made `Relaxed`:
//!   `check_vs_resize_by_another_keys_insert_keeps_the_grant` (loom: the new table's entries
//!   read without their creation happening-before).
//! * the old table freed at the resize instead of retired: that model (the lookup reads the
//!   freed table: the process dies with SIGSEGV, as any use after free may).
//! * a removed slot freed at once instead of retired: `check_vs_evict_never_reads_a_freed_slot`
//!   and `check_vs_resize_vs_evict_keeps_both_grants` (loom: the slot's drop races the
//!   lookup's read of it).
//! * the word published before the key is written (`claim`), or a lookup's word load made
//!   `Relaxed`: `insert_vs_insert_of_a_new_key_builds_one_limiter` (loom: a key read its write
//!   does not happen-before).
//! * an insert that does not look for the key again under the writer lock: that model (a
//!   second entry for the key: `len` 2).
//!
//! The three-thread model catches every mutation above too, and those of the eviction
//! protocol listed in `keyed.rs` but the stale check's three; it runs at a bound of its own
//! (see it).
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed_table
#![cfg(loom)]

use std::sync::Arc;
use std::time::Duration;

use loom::thread;
use loom_tests::model_at_bound;
use turnstile::{Keyed, LeakyBucket, ManualClock, Nanos};

type K = Keyed<u8, LeakyBucket<ManualClock>, ManualClock>;

/// A keyed map of leaky buckets, 1 permit per 10 ns without slack (a budget of one permit at
/// `T`; the limiter's own atomics are `Relaxed`), swept only by hand. In an `Arc` rather than
/// leaked: the map's drop, after the threads are joined, runs the deferred frees.
fn map() -> Arc<K> {
    Arc::new(
        Keyed::builder(|_: &u8| {
            LeakyBucket::builder(1)
                .per(Duration::from_nanos(10))
                .without_slack()
                .clock(ManualClock::default())
                .build()
                .unwrap()
        })
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap(),
    )
}

const T: Nanos = Nanos::new(5);

/// A check of key `key` at `T` on another thread.
fn check(k: &Arc<K>, key: u8) -> thread::JoinHandle<bool> {
    let k = k.clone();
    thread::spawn(move || k.check_n_at(&key, T, 1).is_ok())
}

/// lookup ‖ resize: key 1 fills the smallest table; a check of key 1 races the insert of key
/// 2, which grows the table (copies key 1's slot pointer into a new table, publishes it,
/// retires the old one). Whichever table the check probes, it finds key 1's one slot: its
/// grant is there after the resize, and the old table is freed only after the check is done.
#[test]
fn check_vs_resize_by_another_keys_insert_keeps_the_grant() {
    loom::model(|| {
        let k = map();
        assert!(k.with(&1, |_| ()).is_some());
        let a = check(&k, 1);
        assert!(k.check_n_at(&2, T, 1).is_ok());
        assert!(a.join().unwrap());
        assert!(k.check_n_at(&1, T, 1).is_err(), "the grant was lost");
        assert!(k.check_n_at(&2, T, 1).is_err(), "key 2's grant was lost");
        assert_eq!(k.len(), 2);
    });
}

/// lookup ‖ removal: key 1 exists and is idle; a check of it races a sweep that may evict it
/// (tombstone its entry, retire its slot). The check finds the live slot, or absent (then
/// inserts a new one), or a `DEAD` one (then retries): never a freed slot, and its grant is
/// on the key's live slot in the end.
#[test]
fn check_vs_evict_never_reads_a_freed_slot() {
    loom::model(|| {
        let k = map();
        assert!(k.with(&1, |_| ()).is_some());
        let a = check(&k, 1);
        k.evict_idle_at(T);
        assert!(a.join().unwrap());
        assert!(k.check_n_at(&1, T, 1).is_err(), "the grant was lost");
        assert_eq!(k.len(), 1);
    });
}

/// lookup ‖ resize ‖ removal: as the two models above at once. Key 1 is held and idle; a
/// check of it races the insert of key 2 (which grows the table) and a sweep (which may evict
/// key 1 from the old table or the new, or key 2 while it is still idle). Both grants are on
/// their keys' live slots in the end, and nothing is freed under a lookup.
///
/// Bound 3. Each mutation it catches (the header's, and the eviction protocol's) fails at a
/// bound of 2, all but one at 1 (the others' operations run as the main thread blocks on
/// `join`, and loom lets loads return stale values at any bound); the deepest, a veto CAS
/// that finds `LIVE` replaying the check, needs 2. 3 is one more: 22 370 executions, against
/// 69 032 at 4.
#[test]
fn check_vs_resize_vs_evict_keeps_both_grants() {
    model_at_bound(3, || {
        let k = map();
        assert!(k.with(&1, |_| ()).is_some());
        let a = check(&k, 1);
        let b = check(&k, 2);
        k.evict_idle_at(T);
        assert!(a.join().unwrap());
        assert!(b.join().unwrap());
        assert!(k.check_n_at(&1, T, 1).is_err(), "key 1's grant was lost");
        assert!(k.check_n_at(&2, T, 1).is_err(), "key 2's grant was lost");
        assert_eq!(k.len(), 2);
    });
}

/// insert ‖ insert: two checks of a new key 1, each finding it absent; both end on one slot,
/// so the budget of one permit is granted exactly once.
#[test]
fn insert_vs_insert_of_a_new_key_builds_one_limiter() {
    loom::model(|| {
        let k = map();
        let a = check(&k, 1);
        let b = k.check_n_at(&1, T, 1).is_ok();
        let a = a.join().unwrap();
        assert!(a != b, "granted {a} {b}: one permit");
        assert_eq!(k.len(), 1);
    });
}
