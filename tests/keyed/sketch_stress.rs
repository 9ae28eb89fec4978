//! `SketchTokenBucket` under threads: checks of one key, and of keys that share words, at one
//! fixed reading, so that what the limiter may grant is fixed by its rules alone (each key its
//! burst) however the threads interleave; every worker drains until refused
//! (`common::lockstep`), so a loaded machine that runs them one after the other changes
//! nothing that is checked.
#![cfg(feature = "keyed")]

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use turnstile::Nanos;

const THREADS: usize = 4;
const PHASES: usize = if cfg!(miri) { 1 } else { 20 };

use crate::sketch::Sketch;

/// One token a second, two cells a key (the default), on a manual clock at 0.
fn sketch(burst: u32, bytes: usize) -> Sketch {
    crate::sketch::sketch(1.0, burst, bytes, 2)
}

/// Four threads drain one key: together they take exactly its burst, no more (a grant
/// counted twice) and no less (a grant lost to a race).
#[test]
fn threads_on_one_key_take_exactly_its_burst() {
    // The largest burst a sketch holds: each worker runs thousands of checks of one word, so
    // the workers overlap on any machine that runs two at once.
    let burst = if cfg!(miri) { 20 } else { 1 << 15 };
    let sketches: Vec<Sketch> = (0..PHASES).map(|_| sketch(burst, 1 << 20)).collect();
    let taken = common::lockstep(
        THREADS,
        PHASES,
        |_| {},
        |_, phase| {
            // Bounded, so that a limiter granting forever fails the count below rather than
            // hanging the test.
            let mut mine = 0u32;
            while mine <= burst && sketches[phase].check_n_at(&7, Nanos::ZERO, 1).is_ok() {
                mine += 1;
            }
            mine
        },
    );
    for phase in 0..PHASES {
        let total: u32 = taken.iter().map(|w| w[phase]).sum();
        assert_eq!(total, burst, "phase {phase}");
    }
}

/// Sixty-four keys in one line (four words of four cells, two cells a key), every thread
/// draining every key in its own order: no key gets more than its burst, and a key is
/// refused only once its own cells, or all of them shared, are full.
#[test]
fn keys_sharing_words_never_exceed_their_own_bursts() {
    keys_sharing_words(Duration::ZERO);
}

/// The same with a penalty: every refusal of a key whose cells are at most full raises them
/// by one more CAS on the shared words, racing the other keys' grants; still no key gets more
/// than its burst, and a penalty raises only cells within a token of full, so the cells
/// still fill with at least eight keys' bursts but for that token.
#[test]
fn keys_sharing_words_with_a_penalty_never_exceed_their_own_bursts() {
    keys_sharing_words(Duration::from_secs(10));
}

fn keys_sharing_words(penalty: Duration) {
    let burst = if cfg!(miri) { 3 } else { 1_000 };
    const KEYS: u64 = 64;
    let sketches: Vec<Sketch> = (0..PHASES)
        .map(|_| crate::sketch::penalized(1.0, burst, 64, 2, penalty))
        .collect();
    let grants: Vec<Vec<AtomicU32>> = (0..PHASES)
        .map(|_| (0..KEYS).map(|_| AtomicU32::new(0)).collect())
        .collect();
    common::lockstep(
        THREADS,
        PHASES,
        |_| {},
        |worker, phase| {
            let mut rng = common::rng_seed((worker * 1000 + phase) as u64);
            let mut open: Vec<u64> = (0..KEYS).collect();
            while !open.is_empty() {
                let i = (common::xorshift(&mut rng) % open.len() as u64) as usize;
                let key = open[i];
                let granted = sketches[phase].check_n_at(&key, Nanos::ZERO, 1).is_ok();
                // Past its burst the count below fails; stop there rather than loop forever.
                if !granted || grants[phase][key as usize].fetch_add(1, Ordering::Relaxed) >= burst
                {
                    open.swap_remove(i);
                }
            }
        },
    );
    for (phase, g) in grants.iter().enumerate() {
        let per_key: Vec<u32> = g.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert!(
            per_key.iter().all(|&n| n <= burst),
            "phase {phase}: {per_key:?}"
        );
        // Sixteen cells, two a key: the cells fill with at least eight keys' bursts.
        let total: u32 = per_key.iter().sum();
        let at_least = if penalty.is_zero() { burst } else { burst - 1 };
        assert!(total >= 8 * at_least, "phase {phase}: {total} granted");
    }
}
