//! Many threads on one `MultiTokenBucket`, and on a `KeyedMultiTokenBucket` racing a sweeper:
//! no span of readings `[a, b]` ever admits more than any single limit's budget,
//! `burst_i + limit_i × (b - a)` plus one grid unit of that limit (`precision()`), checked
//! over every pair of grant readings (`common::stale_race::token_bucket_excess`).
//!
//! * `lockstep_drains_hand_out_exactly_what_the_limits_allow`: a manual clock set per phase,
//!   every worker draining until refused one token. With the clock standing still, what a
//!   phase grants is fixed by the rules alone (all limits lose the same tokens, so a drain
//!   ends when the emptiest has under one): the total after every phase equals a
//!   single-threaded drain's, whichever limit binds (each does, in turn).
//! * `moving_clock_and_stale_readings_keep_every_limit`: free-running (`common::hammer`), a
//!   side thread moving the clock, workers checking at readings up to 50 ms stale and, every
//!   few checks, reading the clock, stalling until it has moved on, then checking with the
//!   old reading.
//! * `concurrent_set_limits_keeps_the_laxest_budget`: the same with the workers switching
//!   the limits between two configurations; every limit is checked against the laxest burst
//!   and rate it had (set_limits keeps each limit's tokens, capped at the new burst).
//! * The keyed map: `keyed_stale_readings_racing_a_tight_sweeper` (`common::stale_race` on a
//!   few keys) and `keyed_lockstep_drains_racing_a_sweeper` (`common::stale_race::
//!   drained_race`: a key drained at the last phase must not be evicted and revived full).

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::hammer::{Hammer, Side};
use common::stale_race::token_bucket_excess;

use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::{Clock, Limit, ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn bw(per_sec: f64, burst: u32) -> Bandwidth {
    Bandwidth::new(Limit::per_second(per_sec).unwrap(), burst)
}

/// Asserts that `grants` (`(reading, n)`, any order) keep every limit of `limits` over every
/// span of their readings, each within one of its grid units (`units`). `what` names the run.
fn assert_budget(what: &str, grants: &[(u64, u32)], limits: &[Bandwidth], units: &[Duration]) {
    let mut g = grants.to_vec();
    g.sort_unstable();
    for (i, (b, unit)) in limits.iter().zip(units).enumerate() {
        let rate = b.limit().as_f64();
        let excess = token_bucket_excess(&g, rate, f64::from(b.burst()));
        let slack = rate * unit.as_secs_f64() + 1e-6;
        assert!(
            excess <= slack,
            "{what}: limit {i} ({b:?}) granted {excess} over burst + limit × span \
             ({} grants)",
            g.len()
        );
    }
}

/// Limit 0 binds first (the burst), limit 1 later (the rate): 200 000/s with a burst of
/// 4 000, and 40 000/s with a burst of 40 000. Rates high enough that many checks are granted
/// (and so race on the word), not just refused.
fn two_limits() -> [Bandwidth; 2] {
    [bw(200_000.0, 4_000), bw(40_000.0, 40_000)]
}

#[test]
fn lockstep_drains_hand_out_exactly_what_the_limits_allow() {
    const PHASES: usize = 100;
    const MAX_N: u64 = 3;
    // Phases long enough (5 000 and 1 000 tokens of refill) that the workers, woken one by
    // one, still overlap in each: limit 1 binds from phase 50 on.
    let step = 25 * MS;
    let t0 = SEC;
    let at = |i: usize| Nanos::new(t0 + i as u64 * step);
    let limits = [bw(200_000.0, 40_000), bw(40_000.0, 200_000)];
    for threads in [2, 6] {
        let clock = ManualClock::new(at(0));
        let l = MultiTokenBucket::builder(&limits)
            .clock(clock.clone())
            .build()
            .unwrap();
        let per_worker = common::lockstep(
            threads,
            PHASES,
            |i| clock.set(at(i)),
            |w, i| {
                let mut x = common::rng_seed((w as u64 + 1) << 32 | i as u64);
                let now = clock.now();
                let mut mine = Vec::new();
                loop {
                    let n = 1 + (common::xorshift(&mut x) % MAX_N) as u32;
                    let ok = if x >> 60 == 0 {
                        // A peek now and then: it takes nothing.
                        let _ = l.peek_n_at(now, n);
                        continue;
                    } else {
                        l.check_n_at(now, n).is_ok()
                    };
                    if ok {
                        mine.push((now.as_u64(), n));
                    } else if n == 1 {
                        return mine;
                    }
                }
            },
        );
        // The same drains by one thread: what the rules grant at each phase.
        let oracle = MultiTokenBucket::builder(&limits)
            .clock(ManualClock::new(at(0)))
            .build()
            .unwrap();
        let (mut granted, mut expected) = (0u64, 0u64);
        let mut binding = [0usize; 2];
        for i in 0..PHASES {
            while oracle.check_at(at(i)).is_ok() {
                expected += 1;
            }
            binding[oracle.check_at(at(i)).unwrap_err().limit()] += 1;
            granted += per_worker
                .iter()
                .flat_map(|p| &p[i])
                .map(|&(_, n)| u64::from(n))
                .sum::<u64>();
            assert_eq!(granted, expected, "{threads} threads, phase {i}");
        }
        assert!(
            binding[0] > 10 && binding[1] > 10,
            "each limit binds in turn: {binding:?}"
        );
        let all: Vec<_> = per_worker.into_iter().flatten().flatten().collect();
        assert_budget("lockstep", &all, &limits, &l.precision());
        eprintln!("lockstep, {threads} threads: {granted} granted, binding {binding:?}");
    }
}

/// Workers check `l` (through `check(reading, n)`) for `run_for` while a side thread moves
/// `clock` by 2 µs a turn; every worker also runs `also(x)` on each operation's random
/// number `x` (a reconfiguration, now and then): half the checks at the clock's reading, the
/// rest up to 50 ms stale, and every 8th one at a reading taken before the worker stalls
/// while the clock moves at least 200 µs on. Returns the grants `(reading, n)`.
fn stale_hammer(
    clock: &ManualClock,
    check: impl Fn(Nanos, u32) -> bool + Sync,
    also: impl Fn(u64) + Sync,
) -> Vec<(u64, u32)> {
    let h = Hammer {
        threads: 4,
        run_for: Duration::from_millis(400),
        min_ops: 2_000,
    };
    let stalls = AtomicU64::new(0);
    let move_clock = |_: Side<'_>| {
        clock.advance(Duration::from_nanos(2_000));
        std::thread::yield_now();
    };
    let run = h.run(
        |o, kept: &mut Vec<(u64, u32)>| {
            let x = common::xorshift(o.rng);
            also(x);
            let n = 1 + (x % 3) as u32;
            let now = clock.now();
            let reading = match (x >> 8) % 8 {
                0 => {
                    // Read, stall while the clock moves on (pushing it on too, so the
                    // stall ends once the side thread has stopped), then use the old
                    // reading.
                    clock.advance(Duration::from_micros(200));
                    std::thread::yield_now();
                    stalls.fetch_add(1, Ordering::Relaxed);
                    now
                }
                1..=3 => now.saturating_sub(Duration::from_nanos((x >> 16) % (50 * MS))),
                _ => now,
            };
            if check(reading, n) {
                kept.push((reading.as_u64(), n));
            }
        },
        Some(&move_clock),
    );
    let stalls = stalls.into_inner();
    assert!(stalls >= 100, "only {stalls} stale checks forced");
    let grants: Vec<_> = run.kept.into_iter().flatten().collect();
    eprintln!(
        "{} ops, {} grants, {stalls} forced stale",
        run.ops,
        grants.len()
    );
    grants
}

#[test]
fn moving_clock_and_stale_readings_keep_every_limit() {
    let limits = two_limits();
    let clock = ManualClock::new(Nanos::new(SEC));
    let l = MultiTokenBucket::builder(&limits)
        .clock(clock.clone())
        .build()
        .unwrap();
    let grants = stale_hammer(&clock, |t, n| l.check_n_at(t, n).is_ok(), |_| {});
    assert!(!grants.is_empty());
    assert_budget("moving clock", &grants, &limits, &l.precision());
}

#[test]
fn concurrent_set_limits_keeps_the_laxest_budget() {
    // Two configurations of two limits; each index is checked against its laxest burst and
    // rate. Limit 0 trades burst for rate, limit 1 is tighter in the second throughout.
    let a = two_limits();
    let b = [bw(400_000.0, 1_000), bw(20_000.0, 10_000)];
    let laxest: Vec<Bandwidth> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| {
            let rate = x.limit().as_f64().max(y.limit().as_f64());
            bw(rate, x.burst().max(y.burst()))
        })
        .collect();
    let clock = ManualClock::new(Nanos::new(SEC));
    let l = MultiTokenBucket::builder(&a)
        .clock(clock.clone())
        .build()
        .unwrap();
    let units_a = l.precision();
    l.set_limits_at(clock.now(), &b).unwrap();
    let units: Vec<Duration> = units_a
        .iter()
        .zip(l.precision())
        .map(|(x, y)| (*x).max(y))
        .collect();
    let sets = AtomicU64::new(0);
    let grants = stale_hammer(
        &clock,
        |t, n| l.check_n_at(t, n).is_ok(),
        |x| {
            // One operation in 32 (of every worker's, so a loaded machine that starves a side
            // thread still reconfigures), at the clock's reading or a stale one.
            if (x >> 40) % 32 == 0 {
                let c = if (x >> 45) % 2 == 0 { &a } else { &b };
                let now = clock.now();
                let at = if (x >> 46) % 4 == 0 {
                    now.saturating_sub(Duration::from_micros(300))
                } else {
                    now
                };
                l.set_limits_at(at, c).unwrap();
                sets.fetch_add(1, Ordering::Relaxed);
            }
        },
    );
    let sets = sets.into_inner();
    assert!(sets >= 100, "only {sets} reconfigurations");
    assert!(!grants.is_empty());
    assert_budget("set_limits", &grants, &laxest, &units);
    eprintln!("{sets} reconfigurations");
}

/// The keyed map: a few keys, a sweeper evicting concurrently.
#[cfg(feature = "keyed")]
mod keyed {
    use super::*;

    use std::sync::Mutex;

    use common::stale_race::{drained_race, per_key, stale_race};
    use turnstile::keyed::multi_token_bucket::KeyedMultiTokenBucket;

    type Keyed = KeyedMultiTokenBucket<u32, std::collections::hash_map::RandomState, ManualClock>;

    fn keyed(limits: &[Bandwidth], clock: &ManualClock) -> Keyed {
        KeyedMultiTokenBucket::builder(limits)
            .sweep_every(Duration::MAX)
            .clock(clock.clone())
            .build()
            .unwrap()
    }

    /// The precision of `limits` as a `MultiTokenBucket` of them reports it: the keyed map's
    /// words are the same.
    fn units_of(limits: &[Bandwidth]) -> Vec<Duration> {
        MultiTokenBucket::builder(limits)
            .clock(ManualClock::default())
            .build()
            .unwrap()
            .precision()
    }

    /// Per key: 20/s with a burst of 3, and 2/s with a burst of 4 (full 2 s after it is
    /// spent, so the race's keys go idle and are evicted).
    fn keyed_limits() -> [Bandwidth; 2] {
        [bw(20.0, 3), bw(2.0, 4)]
    }

    #[test]
    fn keyed_stale_readings_racing_a_tight_sweeper() {
        const KEYS: u32 = 4;
        let limits = keyed_limits();
        let clock = ManualClock::new(Nanos::new(10 * SEC));
        let k = keyed(&limits, &clock);
        let evicted = AtomicU64::new(0);
        let r = stale_race(
            &clock,
            KEYS,
            |key, reading, n| k.check_n_at(&key, reading, n).is_ok(),
            || {
                let e = k.evict_idle();
                evicted.fetch_add(e as u64, Ordering::Relaxed);
                e
            },
        );
        let evicted = evicted.into_inner();
        assert!(evicted >= 100, "only {evicted} evictions");
        let units = units_of(&limits);
        for (key, g) in per_key(&r.grants, KEYS).iter().enumerate() {
            assert_budget(&format!("key {key}"), g, &limits, &units);
        }
        eprintln!(
            "{} grants, {} forced stale after eviction, {evicted} evicted ({} by the sweeper)",
            r.grants.len(),
            r.forced,
            r.swept
        );
    }

    #[test]
    fn keyed_lockstep_drains_racing_a_sweeper() {
        const FEW: u32 = 3;
        let limits = keyed_limits();
        let clock = ManualClock::new(Nanos::new(10 * SEC));
        let k = keyed(&limits, &clock);
        // 250 ms a phase: limit 0 is full again (3 at 20/s), limit 1 refills half a token,
        // so no key drained at the last phase is idle (every limit full) at this one.
        let swept = Mutex::new(0usize);
        let grants = drained_race(
            &clock,
            250 * MS,
            FEW,
            |w, i| 1 + ((w + i) % 2) as u32,
            |key, reading, n| k.check_n_at(&key, reading, n).is_ok(),
            |now| {
                let e = k.evict_idle_at(now);
                *swept.lock().unwrap() += e;
                e
            },
        );
        let swept = swept.into_inner().unwrap();
        assert_eq!(swept, 0, "busy keys evicted");
        let units = units_of(&limits);
        for (key, g) in per_key(&grants, FEW).iter().enumerate() {
            assert_budget(&format!("key {key}"), g, &limits, &units);
        }
        eprintln!("{} grants, {swept} evicted", grants.len());
    }

    /// Lockstep drains of a few hot keys, with a sweep at each phase's reading racing them:
    /// with the clock standing still each key's total is fixed by the rules (as in
    /// `lockstep_drains_hand_out_exactly_what_the_limits_allow`), so a grant lost or counted
    /// twice in a key's word shows; no drained key is idle, so none may be evicted.
    #[test]
    fn keyed_lockstep_drains_of_hot_keys_hand_out_exactly_what_the_limits_allow() {
        const KEYS: u32 = 3;
        const PHASES: usize = 60;
        let step = 50 * MS;
        let at = |i: usize| Nanos::new(SEC + i as u64 * step);
        let limits = [bw(200_000.0, 40_000), bw(40_000.0, 200_000)];
        let clock = ManualClock::new(at(0));
        let k = keyed(&limits, &clock);
        let evicted = AtomicU64::new(0);
        let per_worker = common::lockstep(
            4,
            PHASES,
            |i| clock.set(at(i)),
            |w, i| {
                let mut x = common::rng_seed((w as u64 + 1) << 32 | i as u64);
                let now = clock.now();
                let mut mine = [0u64; KEYS as usize];
                let mut open = [true; KEYS as usize];
                let mut round = 0u64;
                while open.iter().any(|&o| o) {
                    round += 1;
                    if w == 0 && round.is_multiple_of(64) {
                        evicted.fetch_add(k.evict_idle_at(now) as u64, Ordering::Relaxed);
                    }
                    for key in 0..KEYS {
                        if !open[key as usize] {
                            continue;
                        }
                        let n = 1 + (common::xorshift(&mut x) % 3) as u32;
                        if k.check_n_at(&key, now, n).is_ok() {
                            mine[key as usize] += u64::from(n);
                        } else if n == 1 {
                            open[key as usize] = false;
                        }
                    }
                }
                mine
            },
        );
        assert_eq!(evicted.into_inner(), 0, "a drained key was evicted");
        let oracle = MultiTokenBucket::builder(&limits)
            .clock(ManualClock::new(at(0)))
            .build()
            .unwrap();
        let (mut expected, mut granted) = (0u64, [0u64; KEYS as usize]);
        for i in 0..PHASES {
            while oracle.check_at(at(i)).is_ok() {
                expected += 1;
            }
            for (key, g) in granted.iter_mut().enumerate() {
                *g += per_worker.iter().map(|p| p[i][key]).sum::<u64>();
                assert_eq!(*g, expected, "key {key}, phase {i}");
            }
        }
        eprintln!("{KEYS} keys, {expected} granted each");
    }
}
