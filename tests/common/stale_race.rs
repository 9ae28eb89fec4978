//! The keyed maps' race of stale readings against a tight sweeper, shared by
//! `tests/keyed_stress.rs` (`Keyed` over every limiter) and `tests/keyed_bucket_stress.rs`
//! (`KeyedTokenBucket`), and the token bucket's budget over a key's grants.
#![allow(dead_code)] // not every test binary uses every helper

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use turnstile::{Clock, ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
pub const WORKERS: u64 = 3;
/// Fewer under Miri, an interpreter: the race is the same, only shorter.
pub const CHECKS: u64 = if cfg!(miri) { 96 } else { 12_000 };
/// Every this many checks a worker forces the stale-after-eviction interleaving itself.
pub const FORCE_EVERY: u64 = 16;
/// Readings are up to this stale.
pub const MAX_STALE: u64 = 1_500 * MS;

/// Grants `(key, reading, n)` of a race of stale checks against a sweeper, how many of them
/// were forced stale-after-eviction checks, and how many keys the sweeper evicted.
pub struct Race {
    pub grants: Vec<(u32, u64, u32)>,
    pub forced: u64,
    pub swept: u64,
}

/// `WORKERS` threads make `CHECKS` checks each (`check(key, reading, n)`, true if granted) on
/// `keys` random keys at readings up to `MAX_STALE` old, moving `clock` on, while a sweeper
/// calls `evict` in a loop. Every `FORCE_EVERY` checks a worker forces the interleaving
/// itself: it reads the clock, lets the key go idle, evicts, then uses the reading.
pub fn stale_race(
    clock: &ManualClock,
    keys: u32,
    check: impl Fn(u32, Nanos, u32) -> bool + Sync,
    evict: impl Fn() -> usize + Sync,
) -> Race {
    let stop = AtomicBool::new(false);
    let (forced, swept) = (AtomicU64::new(0), AtomicU64::new(0));
    let all = Mutex::new(Vec::new());
    let start = Barrier::new(WORKERS as usize + 1);
    let (check, evict) = (&check, &evict);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|id| {
                let (forced, all, start) = (&forced, &all, &start);
                s.spawn(move || {
                    let mut x = super::rng_seed(id + 1);
                    let mut rand = move || super::xorshift(&mut x);
                    let mut mine = Vec::new();
                    start.wait();
                    for i in 0..CHECKS {
                        clock.advance(Duration::from_nanos(rand() % (3 * MS)));
                        let key = (rand() % u64::from(keys)) as u32;
                        let n = 1 + (rand() % 2) as u32;
                        let reading = if i % FORCE_EVERY == 0 {
                            let reading = clock.now();
                            clock.advance(Duration::from_nanos(200 * MS + rand() % MAX_STALE));
                            evict();
                            forced.fetch_add(1, Ordering::Relaxed);
                            reading
                        } else if rand() % 2 == 0 {
                            clock.now()
                        } else {
                            clock
                                .now()
                                .saturating_sub(Duration::from_nanos(rand() % MAX_STALE))
                        };
                        if check(key, reading, n) {
                            mine.push((key, reading.as_u64(), n));
                        }
                    }
                    all.lock().unwrap().extend(mine);
                })
            })
            .collect();
        let (stop, swept, start) = (&stop, &swept, &start);
        let sweeper = s.spawn(move || {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                swept.fetch_add(evict() as u64, Ordering::Relaxed);
            }
        });
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        sweeper.join().unwrap();
    });
    Race {
        grants: all.into_inner().unwrap(),
        forced: forced.into_inner(),
        swept: swept.into_inner(),
    }
}

/// Each of `keys` keys' grants, `(reading, n)` sorted by reading.
pub fn per_key(grants: &[(u32, u64, u32)], keys: u32) -> Vec<Vec<(u64, u32)>> {
    let mut per = vec![Vec::new(); keys as usize];
    for &(key, t, n) in grants {
        per[key as usize].push((t, n));
    }
    for g in &mut per {
        g.sort_unstable();
    }
    per
}

/// Token bucket: grants with readings in `[a, b]` at most `burst + limit * (b - a)`, for every
/// pair of grant readings, in O(n): with prefix sums `S`, `S_j - S_(i-1) - limit * (t_j - t_i)`
/// is at most `burst` for every `i <= j`. Returns the worst excess over the burst (<= 0).
pub fn token_bucket_excess(grants: &[(u64, u32)], limit_per_sec: f64, burst: f64) -> f64 {
    let per_ns = limit_per_sec / SEC as f64;
    let (mut before, mut min_start, mut worst) = (0.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for &(t, n) in grants {
        // Start a span at this grant: what came before it, less the refill up to it.
        min_start = min_start.min(before - per_ns * t as f64);
        before += f64::from(n);
        let end = before - per_ns * t as f64;
        worst = worst.max(end - min_start - burst);
    }
    worst
}

/// Phases of [`purge_race`]; fewer under Miri, an interpreter: each phase still purges the
/// table and grows it again.
pub const PHASES: usize = if cfg!(miri) { 3 } else { 40 };
/// Checks per worker per phase of [`purge_race`].
pub const PHASE_CHECKS: u64 = if cfg!(miri) { 120 } else { 600 };

/// Grants `(key, reading, n)` of a [`purge_race`], and how many of its sweeps purged the
/// table.
pub struct Purges {
    pub grants: Vec<(u32, u64, u32)>,
    pub purged: usize,
}

/// `PHASES` phases in lockstep ([`super::lockstep`]). Before phase `i` the clock is set to
/// `10 s + i * gap` (`gap` long enough that every key the previous phase used is idle) and
/// `evict` sweeps at it: every key is evicted, which leaves only dead slots, so the sweep
/// must rebuild the table empty (asserted from phase 1 on: at least 60 keys evicted, one
/// more table replacement by `resizes`, 16 slots by `capacity`). Then `WORKERS` threads
/// make `PHASE_CHECKS` checks each (`check(key, reading, n)`, true if granted) on random
/// keys below `keys` of 1 to `n_max` permits, half at readings up to `MAX_STALE` older than
/// that sweep, inserting the keys again, which forces the table to grow under them while
/// they check.
#[allow(clippy::too_many_arguments)]
pub fn purge_race(
    clock: &ManualClock,
    keys: u32,
    gap: u64,
    n_max: u64,
    check: impl Fn(u32, Nanos, u32) -> bool + Sync,
    evict: impl Fn() -> usize,
    resizes: impl Fn() -> u64,
    capacity: impl Fn() -> usize,
) -> Purges {
    // What each phase's setup saw: (keys evicted, table replacements before, after, slots).
    let mut setups = Vec::new();
    let results = super::lockstep(
        WORKERS as usize,
        PHASES,
        |i| {
            clock.set(Nanos::new(10 * SEC + gap * i as u64));
            let before = resizes();
            let evicted = evict();
            setups.push((evicted, before, resizes(), capacity()));
        },
        |w, i| {
            let mut x = super::rng_seed((w as u64 + 1) * 1000 + i as u64);
            let mut rand = move || super::xorshift(&mut x);
            let now = clock.now();
            let mut mine = Vec::new();
            for _ in 0..PHASE_CHECKS {
                let key = (rand() % u64::from(keys)) as u32;
                let n = 1 + (rand() % n_max) as u32;
                // Half the readings are older than the sweep that just evicted every key.
                let reading = if rand() % 2 == 0 {
                    now.saturating_sub(Duration::from_nanos(1 + rand() % MAX_STALE))
                } else {
                    now
                };
                if check(key, reading, n) {
                    mine.push((key, reading.as_u64(), n));
                }
            }
            mine
        },
    );
    let mut purged = 0;
    for (i, &(evicted, before, after, slots)) in setups.iter().enumerate().skip(1) {
        assert!(
            evicted >= 60,
            "phase {i}: every key used is idle, {evicted} evicted"
        );
        assert_eq!(after, before + 1, "phase {i}: the sweep purged the table");
        assert_eq!(slots, 16, "phase {i}: rebuilt empty");
        purged += 1;
    }
    Purges {
        grants: results.into_iter().flatten().flatten().collect(),
        purged,
    }
}

/// [`stale_race`] on an inline map (`KeyedTokenBucket` and its siblings) over `keys` keys
/// (64 or more), asserting what every such race must have done: each worker forced the stale interleaving
/// every `FORCE_EVERY` checks, and the keys grew the 16-slot table at least 3 times
/// (`resizes`). Prints the race's counts; the caller checks its grants against the map's
/// budget.
pub fn inline_stale_race(
    clock: &ManualClock,
    keys: u32,
    check: impl Fn(u32, Nanos, u32) -> bool + Sync,
    evict: impl Fn() -> usize + Sync,
    resizes: impl Fn() -> u64,
) -> Race {
    let r = stale_race(clock, keys, check, evict);
    assert_eq!(r.forced, WORKERS * CHECKS.div_ceil(FORCE_EVERY));
    assert!(
        resizes() >= 3,
        "{keys} keys grow a 16-slot table at least 3 times"
    );
    eprintln!(
        "{} grants, {} evictions by the sweeper, {} table replacements",
        r.grants.len(),
        r.swept,
        resizes()
    );
    r
}

/// `4 * PHASES` phases in lockstep ([`super::lockstep`]), the clock `gap` further at each
/// (from 10 s), in which every worker drains keys `0..few` at the phase's reading: 50
/// rounds, each checking every key for `n(worker, phase)` permits (`check(key, reading, n)`,
/// true if granted), while worker 0 sweeps at the reading (`evict_at`) every 5 rounds. A key
/// drained at the last phase is not idle yet when `gap` is shorter than its debt or window,
/// so no sweep may evict it; one that did would hand it a newborn's grants early, once a
/// phase. Returns the grants `(key, reading, n)`.
pub fn drained_race(
    clock: &ManualClock,
    gap: u64,
    few: u32,
    n: impl Fn(usize, usize) -> u32 + Sync,
    check: impl Fn(u32, Nanos, u32) -> bool + Sync,
    evict_at: impl Fn(Nanos) -> usize + Sync,
) -> Vec<(u32, u64, u32)> {
    let results = super::lockstep(
        WORKERS as usize,
        PHASES * 4,
        |i| clock.set(Nanos::new(10 * SEC + gap * i as u64)),
        |w, i| {
            let now = clock.now();
            let mut mine = Vec::new();
            for round in 0..50 {
                if w == 0 && round % 5 == 0 {
                    evict_at(now);
                }
                for key in 0..few {
                    let n = n(w, i);
                    if check(key, now, n) {
                        mine.push((key, now.as_u64(), n));
                    }
                }
            }
            mine
        },
    );
    results.into_iter().flatten().flatten().collect()
}

/// A grant's record for the budget checks of the windows' stress tests: `(key, reading, n,
/// after)`, with `after` the clock's reading once the check returned (a grant's window lies
/// between its reading's and `after`'s). Pushes it to `timed` if `granted`; returns
/// `granted`.
pub fn record_timed(
    clock: &ManualClock,
    timed: &Mutex<Vec<(u32, u64, u32, u64)>>,
    granted: bool,
    key: u32,
    reading: Nanos,
    n: u32,
) -> bool {
    if granted {
        let after = clock.now().as_u64();
        timed
            .lock()
            .unwrap()
            .push((key, reading.as_u64(), n, after));
    }
    granted
}
