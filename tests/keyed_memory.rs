//! Memory: one million distinct keys (a tenth of that in debug builds, see `KEYS`), then idle;
//! after eviction the memory comes back. Prints the bytes per key while held. Its own test
//! binary, because it counts every allocation of the process with a global allocator.
//!
//! The figures the docs quote come from a release run:
//! `cargo test --release --all-features --test keyed_memory -- --nocapture`.
#![cfg(feature = "keyed")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use governor::{Quota, RateLimiter};
use turnstile::{FixedWindow, Keyed, KeyedTokenBucket, Limit, ManualClock, Nanos, TokenBucket};

/// Bytes currently allocated by the process.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
            System.alloc(layout)
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
            System.dealloc(ptr, layout)
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        unsafe {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
            System.realloc(ptr, layout, new_size)
        }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// A million keys in release builds; a tenth in debug builds (what `scripts/test` runs), where
/// a million take two minutes. The point survives the smaller map: the bytes per key held are
/// the same, and what must come back after eviction is bounded in proportion to the keys.
const KEYS: u64 = if cfg!(debug_assertions) {
    100_000
} else {
    1_000_000
};
/// What may stay allocated after evicting every key: 4 MiB per million keys (seen: < 3 KB).
const LEFT_MAX: isize = ((4u64 << 20) * KEYS / 1_000_000) as isize;
const SEC: u64 = 1_000_000_000;

/// Fills a keyed map with `KEYS` keys at time 0, evicts at `idle_at`, and returns (bytes
/// per key while full, bytes left above the empty map's after eviction).
fn fill_then_evict<L: turnstile::Limiter + turnstile::Idle + 'static>(
    k: Keyed<u64, L, ManualClock>,
    idle_at: Nanos,
) -> (f64, isize) {
    let base = live();
    for key in 0..KEYS {
        assert!(k.check_n_at(&key, Nanos::ZERO, 1).is_ok());
    }
    assert_eq!(k.len() as u64, KEYS);
    let full = live() - base;
    let sweep = std::time::Instant::now();
    assert_eq!(k.evict_idle_at(Nanos::ZERO), 0, "nothing is idle yet");
    eprintln!("  a sweep of {KEYS} busy keys took {:?}", sweep.elapsed());
    let sweep = std::time::Instant::now();
    assert_eq!(k.evict_idle_at(idle_at) as u64, KEYS);
    eprintln!("  a sweep evicting {KEYS} keys took {:?}", sweep.elapsed());
    assert!(k.is_empty());
    // Removed entries are freed once no thread can still hold them: a few more operations
    // let the epoch advance.
    for i in 0..10_000u64 {
        let _ = k.check_n_at(&(KEYS + (i % 2)), idle_at, 1);
        if i % 1000 == 0 {
            std::thread::yield_now();
        }
    }
    let left = live() - base;
    drop(k);
    (full as f64 / KEYS as f64, left)
}

/// Runs `fill_then_evict` on per-key limiters from `factory`, prints the figures and checks that the
/// memory came back.
fn held_then_freed<L: turnstile::Limiter + turnstile::Idle + 'static>(
    name: &str,
    factory: impl Fn(&u64) -> L + Send + Sync + 'static,
) {
    let k = Keyed::builder(factory)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let (per_key, left) = fill_then_evict(k, Nanos::new(2 * SEC));
    eprintln!(
        "{name}: {per_key:.0} bytes per key held ({} bytes the limiter itself); \
         {left} bytes left after evicting all",
        std::mem::size_of::<L>()
    );
    assert!(
        left < LEFT_MAX,
        "{left} bytes left after evicting {KEYS} keys"
    );
}

#[test]
fn many_keys_then_idle_give_memory_back() {
    held_then_freed("FixedWindow", |_| {
        FixedWindow::builder(10, Duration::from_secs(1))
            .clock(ManualClock::default())
            .build()
            .unwrap()
    });
    held_then_freed("FixedWindow (Compact)", |_| {
        FixedWindow::builder(10, Duration::from_secs(1))
            .clock(ManualClock::default())
            .build_compact()
            .unwrap()
    });
    held_then_freed("SlidingWindow (Compact)", |_| {
        turnstile::SlidingWindow::builder(10, Duration::from_secs(1))
            .clock(ManualClock::default())
            .build_compact()
            .unwrap()
    });
    held_then_freed("TokenBucket", |_| {
        TokenBucket::builder(Limit::per_second(10.0).unwrap(), 5)
            .clock(ManualClock::default())
            .build()
    });
    held_then_freed("TokenBucket (Compact)", |_| {
        TokenBucket::builder(Limit::per_second(10.0).unwrap(), 5)
            .clock(ManualClock::default())
            .build_compact()
    });
    inline_keyed_token_bucket_against_governor();
}

/// The inline map (one word per key) against governor's keyed limiter (dashmap + GCRA), the
/// same keys: bytes per key held, and the inline map's memory back after eviction. Called
/// from the one test (the allocation counter is the whole process's: two tests running at
/// once would count each other's).
fn inline_keyed_token_bucket_against_governor() {
    let base = live();
    let gov = RateLimiter::keyed(Quota::per_second(std::num::NonZeroU32::new(10).unwrap()));
    for key in 0..KEYS {
        assert!(gov.check_key(&key).is_ok());
    }
    assert_eq!(gov.len() as u64, KEYS);
    let gov_per_key = (live() - base) as f64 / KEYS as f64;
    drop(gov);

    let base = live();
    let k: KeyedTokenBucket<u64, _, _> =
        KeyedTokenBucket::builder(Limit::per_second(10.0).unwrap(), 1)
            .sweep_every(Duration::MAX)
            .clock(ManualClock::default())
            .build()
            .unwrap();
    let empty = live() - base;
    for key in 0..KEYS {
        assert!(k.check_n_at(&key, Nanos::ZERO, 1).is_ok());
    }
    assert_eq!(k.len() as u64, KEYS);
    // Let the epoch collector free the tables replaced while growing.
    for i in 0..10_000u64 {
        let _ = k.check_n_at(&(i % KEYS), Nanos::ZERO, 1);
    }
    let per_key = (live() - base) as f64 / KEYS as f64;
    let slots = k.capacity();
    let sweep = std::time::Instant::now();
    assert_eq!(k.evict_idle_at(Nanos::ZERO), 0, "nothing is idle yet");
    eprintln!("  a sweep of {KEYS} busy keys took {:?}", sweep.elapsed());
    let sweep = std::time::Instant::now();
    assert_eq!(k.evict_idle_at(Nanos::new(SEC)) as u64, KEYS);
    eprintln!(
        "  a sweep evicting {KEYS} keys (and rebuilding the table) took {:?}",
        sweep.elapsed()
    );
    assert!(k.is_empty());
    for i in 0..10_000u64 {
        let _ = k.check_n_at(&(KEYS + (i % 2)), Nanos::new(SEC), 1);
        if i % 1000 == 0 {
            std::thread::yield_now();
        }
    }
    let left = live() - base - empty;
    eprintln!(
        "KeyedTokenBucket: {per_key:.1} bytes per key held ({slots} slots), {left} bytes left \
         after evicting all; governor: {gov_per_key:.1} bytes per key"
    );
    assert!(
        per_key <= gov_per_key,
        "{per_key:.1} bytes per key against governor's {gov_per_key:.1}"
    );
    assert!(
        left < LEFT_MAX,
        "{left} bytes left after evicting {KEYS} keys"
    );
}
