//! loom models of `Keyed`'s eviction protocol: a sweep racing checks of the same key never
//! loses a grant (which would let the key's next limiter grant it again) and never counts one
//! twice, whether the key exists already or is being inserted; and a check whose clock reading
//! is older than a sweep never finds the key's next limiter more generous than the evicted
//! one (its newborn is dated, `Idle::born_at`).
//!
//! Every keyed race is modelled on a limiter whose own atomics are all `Relaxed` (the leaky
//! bucket), so that loom explores stale reads of the limiter word on both sides of the
//! protocol: check ‖ evict, insert ‖ evict, check ‖ check ‖ evict. The window models (on the
//! 128-bit word) check the counting. Mutations each model catches (see the closing note of
//! issue 8 for the table): dropping the user's or the evictor's `SeqCst` fence, the post-grant
//! state check, the `RETIRING` veto, the replay after `DEAD`, the evictor's second idleness
//! check, the newborn's `born_at`, the birth time read under the bucket lock, the sweep's
//! publication of the time it judged at.
//!
//! The models run on `Keyed`'s real table (`src/keyed/table.rs`, "Under loom"); its own races
//! are modelled in `keyed_table.rs`. The three-thread models run at `model_3_threads`' bound
//! (4 at least, whatever `LOOM_MAX_PREEMPTIONS` says): unbounded, the fixed-window ones do not
//! finish in minutes; bounded, all six take about 90 s.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test keyed
#![cfg(loom)]

use std::time::Duration;

use loom::thread;
use loom_tests::model_3_threads;
use turnstile::{FixedWindow, Idle, Keyed, LeakyBucket, Limiter, ManualClock, Nanos};

type K = Keyed<u8, FixedWindow<ManualClock>, ManualClock>;
type Relaxed = Keyed<u8, LeakyBucket<ManualClock>, ManualClock>;

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
    model_3_threads(|| {
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
    model_3_threads(|| {
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

/// A keyed map of leaky buckets, 1 permit per 10 ns without slack: the limiter word is a
/// plain `AtomicU64` accessed only with `Relaxed`, so whatever orders the grant before the
/// evictor's idleness check is the keyed protocol's own fences.
fn relaxed() -> &'static Relaxed {
    leaked(|_| {
        LeakyBucket::builder(1)
            .per(Duration::from_nanos(10))
            .without_slack()
            .clock(ManualClock::default())
            .build()
            .unwrap()
    })
}

/// check ‖ evict: key 1 exists and has never issued a permit (idle); a check at T races the
/// sweep. Whether the sweep retired the old limiter or not, the grant is on the key's live
/// one: a second permit at T is refused. This is the case the two `SeqCst` fences exist for.
#[test]
fn check_vs_evict_on_a_relaxed_limiter_keeps_the_grant() {
    loom::model(|| {
        let k = relaxed();
        assert!(k.with(&1, |_| ()).is_some());
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        k.evict_idle_at(T);
        assert!(a.join().unwrap());
        assert!(k.check_n_at(&1, T, 1).is_err(), "the grant was lost");
        assert_eq!(k.len(), 1);
    });
}

/// insert ‖ evict: key 1 does not exist; the check builds and inserts its limiter, whose
/// fresh state is idle, while the sweep runs. The grant is on the key's live limiter.
#[test]
fn insert_vs_evict_on_a_relaxed_limiter_keeps_the_grant() {
    loom::model(|| {
        let k = relaxed();
        let a = thread::spawn(move || k.check_n_at(&1, T, 1).is_ok());
        k.evict_idle_at(T);
        assert!(a.join().unwrap());
        assert!(k.check_n_at(&1, T, 1).is_err(), "the grant was lost");
        assert_eq!(k.len(), 1);
    });
}

/// check ‖ check ‖ evict with a stale reading: one thread checks key 1 at 0, another at 5
/// (a reading older than the sweep's), the sweep judges at 20, where a bucket with a permit
/// at 0 is idle. The key may be built by either check, evicted, and built again; a bucket
/// grants one permit per 10 ns, so never both (two permits in 5 ns would exceed
/// `slack + 1 + 5 / 10`). The stale check can find the key absent, then lose the insertion
/// to the other check, whose bucket grants and is evicted before the stale check inserts
/// its own: that one must be born at 20, not at the time it was built.
#[test]
fn stale_check_vs_check_vs_evict_never_grants_twice() {
    // The interleaving above takes 2 preemptions; the three-thread bound has room to spare.
    model_3_threads(|| {
        let k = relaxed();
        let stale = thread::spawn(move || k.check_n_at(&1, Nanos::new(5), 1).is_ok());
        let fresh = thread::spawn(move || k.check_n_at(&1, Nanos::ZERO, 1).is_ok());
        k.evict_idle_at(Nanos::new(20));
        let (s, f) = (stale.join().unwrap(), fresh.join().unwrap());
        assert!(!(s && f), "two permits in [0, 5 ns]");
    });
}
