//! loom models of `SketchTokenBucket`'s conservative update
//! (`src/keyed/sketch_token_bucket/cells.rs`: one CAS on the key's 128-bit word raises all
//! its cells): concurrent checks of one key, and of keys that share a cell, never grant a key
//! beyond its own bucket, and never refuse a key whose own cell is free; a penalty and a
//! grant on one word both land.
//!
//! The table is one line, two cells per key, and keys are placed by an identity hash, so the
//! models choose who shares what: key `A` (hash 0) holds cells 0 and 1 of word 0, key `B`
//! (hash 2^28) cells 0 and 2 of word 0 (the second of the 24 choices of a line, words first,
//! then pairs in order of their bit sets). `B`'s grant moving cell 0 between two checks of
//! `A` changes which of `A`'s cells is the smallest.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed_sketch
#![cfg(loom)]

use std::hash::{BuildHasherDefault, Hasher};

use loom::thread;
use loom_tests::model_at_bound;
use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
use turnstile::{Limit, ManualClock, Nanos};

/// A hash that is the key itself.
#[derive(Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only u64 keys")
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = k;
    }
}

type Sketch = SketchTokenBucket<u64, BuildHasherDefault<Identity>, ManualClock>;

const A: u64 = 0;
const B: u64 = 1 << 28;

/// One line, two cells a key, one token a second with a burst of one, on a manual clock at 0;
/// leaked because loom threads must be 'static.
fn sketch() -> &'static Sketch {
    Box::leak(Box::new(
        SketchTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .memory(64)
            .cells_per_key(2)
            .hasher(BuildHasherDefault::<Identity>::default())
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

fn check(s: &Sketch, key: u64) -> bool {
    s.check_n_at(&key, Nanos::ZERO, 1).is_ok()
}

/// Two checks of one key with one token between them: exactly one is granted.
#[test]
fn two_checks_of_one_key_grant_its_one_token() {
    model_at_bound(3, || {
        let s = sketch();
        let t = thread::spawn(move || check(s, A));
        let here = check(s, A);
        let there = t.join().unwrap();
        assert!(here ^ there, "granted here {here}, there {there}");
    });
}

/// Two checks of `A` while `B`, sharing cell 0, is granted: `A` gets its one token and no
/// more, and `B`, whose cell 2 nobody else touches, gets its own.
#[test]
fn a_shared_cell_moving_between_two_checks_grants_no_key_twice() {
    model_at_bound(3, || {
        let s = sketch();
        let t1 = thread::spawn(move || check(s, A));
        let t2 = thread::spawn(move || check(s, B));
        let a = check(s, A);
        let a2 = t1.join().unwrap();
        let b = t2.join().unwrap();
        assert!(a ^ a2, "A granted here {a}, there {a2}");
        assert!(b, "B refused: its cell 2 is its own");
    });
}

/// A penalty (10 s) raising `A`'s cells on its refusal while `B`, sharing cell 0, is granted:
/// both writes land, whichever CAS goes first. `A` is shut out until the penalty's end, and
/// `B` keeps its own bucket (its cell 2).
#[test]
fn a_penalty_and_a_grant_on_one_word_both_land() {
    model_at_bound(3, || {
        let s: &'static Sketch = Box::leak(Box::new(
            SketchTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
                .memory(64)
                .cells_per_key(2)
                .penalty(std::time::Duration::from_secs(10))
                .hasher(BuildHasherDefault::<Identity>::default())
                .clock(ManualClock::default())
                .build()
                .unwrap(),
        ));
        assert!(check(s, A), "A's one token");
        let t = thread::spawn(move || check(s, B));
        let denied = s.check_n_at(&A, Nanos::ZERO, 1).unwrap_err();
        assert!(t.join().unwrap(), "B refused: its cell 2 is its own");
        assert_eq!(denied.retry_at(), Some(Nanos::new(11_000_000_000)));
        let (a, b) = (
            s.tokens_at(&A, Nanos::new(9_000_000_000)),
            s.tokens_at(&B, Nanos::new(1_000_000_000)),
        );
        assert!(a < 0.0, "A's penalty lost: {a} tokens at 9 s");
        assert_eq!(b, 1.0, "B's own bucket");
    });
}
