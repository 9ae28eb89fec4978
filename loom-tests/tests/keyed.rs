//! loom models of `Keyed`'s eviction protocol: a sweep racing checks of the same key never
//! loses a grant (which would let the key's next limiter grant it again) and never counts one
//! twice, whether the key exists already or is being inserted.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed
#![cfg(loom)]

use std::time::Duration;

use loom::thread;
use turnstile::{FixedWindow, Idle, Keyed, LeakyBucket, Limiter, ManualClock, Nanos};

type K = Keyed<u8, FixedWindow<ManualClock>, ManualClock>;

/// A keyed map of limiters from `factory`, swept only by hand; leaked because loom threads
/// must be 'static.
fn leaked<L: Limiter + Idle + 'static>(
    factory: impl Fn(&u8) -> L + Send + Sync + 'static,
) -> &'static Keyed<u8, L, ManualClock> {
    Box::leak(Box::new(
        Keyed::builder(factory)
            .sweep_every(Duration::MAX)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

/// A keyed map of 3-per-10-ns windows.
fn keyed() -> &'static K {
    leaked(|_| {
        FixedWindow::builder(3, Duration::from_nanos(10))
            .clock(ManualClock::default())
            .build()
            .unwrap()
    })
}

const T: Nanos = Nanos::new(5);

fn remaining(k: &K, key: u8) -> u32 {
    k.with(&key, |w| w.status_at(T).remaining).unwrap()
}

#[test]
fn check_vs_evict_of_an_idle_key_keeps_the_grant() {
    loom::model(|| {
        let k = keyed();
        // Key 1 exists and is idle (fresh): the sweep may retire it at any point.
        assert_eq!(remaining(k, 1), 3);
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let evicted = k.evict_idle_at(T);
        assert!(a.join().unwrap());
        // Whether or not the sweep got the old limiter, the key's live limiter has the grant.
        assert_eq!(remaining(k, 1), 2, "evicted {evicted}");
        assert_eq!(k.len(), 1);
    });
}

#[test]
fn insert_vs_insert_vs_evict_counts_each_grant_once() {
    loom::model(|| {
        let k = keyed();
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        let b = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        k.evict_idle_at(T);
        assert!(a.join().unwrap());
        assert!(b.join().unwrap());
        assert_eq!(remaining(k, 1), 1);
        assert_eq!(k.len(), 1);
    });
}

#[test]
fn check_vs_evict_at_the_last_unit_grants_exactly_once() {
    loom::model(|| {
        let k = keyed();
        assert!(k.check_n_at(&1, T, 2).is_ok());
        // Time has moved on: the window is over and the key idle. A check at the new time
        // races the sweep.
        let later = Nanos::new(20);
        let a = thread::spawn(move || k.check_n_at(&1, later, 3).is_ok());
        let b = thread::spawn(move || k.check_n_at(&1, later, 1).is_ok());
        k.evict_idle_at(later);
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        // 3 + 1 > 3 in the new window: exactly one of them.
        assert!(a != b, "{a} {b}");
        let left = k.with(&1, |w| w.status_at(later).remaining).unwrap();
        assert_eq!(left, if a { 0 } else { 2 });
    });
}

/// The same race on a limiter whose word is a plain relaxed `AtomicU64` (the leaky bucket),
/// so that loom explores stale reads on both sides: this is the case the two `SeqCst` fences
/// exist for.
#[test]
fn check_vs_evict_on_a_relaxed_limiter_keeps_the_grant() {
    loom::model(|| {
        let k = leaked(|_| {
            LeakyBucket::builder(1)
                .per(Duration::from_nanos(10))
                .without_slack()
                .clock(ManualClock::default())
                .build()
                .unwrap()
        });
        // Key 1 exists and has never issued a permit: idle.
        assert!(k.with(&1, |_| ()).is_some());
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        k.evict_idle_at(T);
        assert!(a.join().unwrap());
        // The live limiter for key 1 has issued the permit: a second one at T is refused.
        assert!(k.check_n_at(&1, T, 1).is_err());
    });
}
