//! `KeyedSmoothWarmingUp` under races: grants on live keys, evictions, revivals of evicted
//! keys, table growth and purges, and arbitrarily stale clock readings, on the word map's
//! 128-bit words. The module docs of `src/keyed/smooth_warming_up.rs` state the budget: over readings
//! in any span `d`, a key's grants but the last to take effect total at most `d * rate` (a
//! warming-up limiter never bursts; pay later: the last may be of any size), as if one
//! limiter had served it all along, stale readings and evictions included; this file checks
//! it on every key after each race, with checks of 1 or 2 permits, so at most
//! `2 + d * rate` in all.
//!
//! * `stale_readings_racing_a_tight_sweeper`: workers check random keys at readings up to
//!   1.5 s stale while a sweeper thread evicts idle keys in a loop and the table grows from
//!   16 slots under them; every worker also forces the stale-after-eviction interleaving
//!   itself every few checks (read, advance, evict, use).
//! * `purges_then_stale_readings_and_growth_in_lockstep`: before each phase every key is
//!   cold and evicted, which forces a purge (the table is rebuilt empty); then the workers
//!   race checks with readings older than that sweep, inserting the keys again, which
//!   forces the table to grow under them while they check.
//! * `sweeps_half_an_interval_apart_racing_drained_keys`: sweeps at the readings of checks
//!   that drain a few keys, half an interval apart: a key in debt, or not yet cold, must
//!   not be evicted.
#![cfg(feature = "keyed")]

use crate::common;

use std::time::Duration;

use common::stale_race::{
    drained_race, inline_stale_race, per_key, purge_race, token_bucket_excess, PHASES,
};

use turnstile::keyed::smooth_warming_up::KeyedSmoothWarmingUp;
use turnstile::{ManualClock, Nanos};

const MS: u64 = 1_000_000;
const KEYS: u32 = 64;
/// Ten per second: `I` is a whole number of nanoseconds, shorter than the stale race's
/// forced interleaving (it moves the clock 200 ms to 1.7 s between a reading and its use),
/// so that a key granted just before a reading can be cold and evicted before the reading
/// is used: the revival must not date the key from that reading.
const RATE: f64 = 10.0;
const I: u64 = 100 * MS;
/// Cold after 200 ms of idling (threshold 1, 2 permits stored at most, cold interval 300 ms:
/// a cold key's first permit costs 200 ms, its second 100 ms).
const WARMUP: Duration = Duration::from_millis(200);
/// The largest check the races make.
const N_MAX: u64 = 2;

type Map = KeyedSmoothWarmingUp<u32, std::collections::hash_map::RandomState, ManualClock>;

fn map(clock: &ManualClock) -> Map {
    KeyedSmoothWarmingUp::builder(RATE, WARMUP)
        .sweep_every(Duration::MAX)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The budget on every key: over every span between two grant readings, as a token bucket
/// of `N_MAX` refilled one per `I` (each cost rounded to the nanosecond: a nanosecond's
/// worth a grant at most, far below the tolerance).
fn assert_budget(grants: &[(u32, u64, u32)]) {
    for (key, g) in per_key(grants, KEYS).iter().enumerate() {
        let excess = token_bucket_excess(g, RATE, N_MAX as f64);
        assert!(
            excess <= 1e-6,
            "key {key}: {excess} permits over {N_MAX} + d / I ({} grants)",
            g.len()
        );
    }
}

#[test]
fn stale_readings_racing_a_tight_sweeper() {
    let clock = ManualClock::new(Nanos::new(10_000 * MS));
    let k = map(&clock);
    let r = inline_stale_race(
        &clock,
        KEYS,
        |key, reading, n| k.check_n_at(&key, reading, n).is_ok(),
        || k.evict_idle(),
        || k.resizes(),
    );
    assert_budget(&r.grants);
}

#[test]
fn purges_then_stale_readings_and_growth_in_lockstep() {
    let clock = ManualClock::new(Nanos::new(10_000 * MS));
    let k = map(&clock);
    // A grant needs next_free <= its reading <= the phase's clock and costs at most N_MAX
    // cold intervals (600 ms); 200 ms of idling after that the key is cold: 1 s later every
    // key is idle.
    let r = purge_race(
        &clock,
        KEYS,
        10 * I,
        N_MAX,
        |key, reading, n| k.check_n_at(&key, reading, n).is_ok(),
        || k.evict_idle(),
        || k.resizes(),
        || k.capacity(),
    );
    assert!(k.len() <= KEYS as usize);
    assert_budget(&r.grants);
    eprintln!(
        "{} grants over {PHASES} phases, {} forced purges, {} table replacements",
        r.grants.len(),
        r.purged,
        k.resizes()
    );
}

/// Sweeps half an interval apart racing checks that drain a few keys at the sweep's
/// reading: a key drained at the last phase owes a debt of at least an interval, and is
/// cold only a warm-up later, so a sweep half an interval later may not evict it; one that
/// did would hand it a newborn's permit early, phase after phase, and break the budget.
#[test]
fn sweeps_half_an_interval_apart_racing_drained_keys() {
    const FEW: u32 = 4;
    let clock = ManualClock::new(Nanos::new(10_000 * MS));
    let k = map(&clock);
    let grants = drained_race(
        &clock,
        I / 2,
        FEW,
        // Two permits at a time every other phase: a debt of two intervals or more.
        |w, i| 1 + ((i + w) % 2) as u32,
        |key, now, n| k.check_n_at(&key, now, n).is_ok(),
        |now| k.evict_idle_at(now),
    );
    // Every phase whose key owes nothing grants it: the keys get permits phase after phase.
    let total: u64 = grants.iter().map(|&(_, _, n)| u64::from(n)).sum();
    assert!(total >= u64::from(FEW) * PHASES as u64, "{total}");
    assert_budget(&grants);
}
