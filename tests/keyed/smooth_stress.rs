//! `KeyedSmoothBursty` under races: grants on live keys, evictions, revivals of evicted keys,
//! table growth and purges, and arbitrarily stale clock readings. The module docs of
//! `src/keyed/smooth_bursty.rs` state the budget: over readings in any span `d`, a key's grants
//! but the last to take effect total at most `max_permits + d / I` (pay later: the last may
//! be of any size), as if one limiter had served it all along, stale readings and evictions
//! included; this file checks it on every key after each race, with checks of 1 or 2
//! permits, so at most `max_permits + 2 + d / I` in all.
//!
//! * `stale_readings_racing_a_tight_sweeper`: workers check random keys at readings up to
//!   1.5 s stale while a sweeper thread evicts idle keys in a loop and the table grows from
//!   16 slots under them; every worker also forces the stale-after-eviction interleaving
//!   itself every few checks (read, advance, evict, use).
//! * `purges_then_stale_readings_and_growth_in_lockstep`: before each phase every key is
//!   idle and evicted, which forces a purge (the table is rebuilt empty); then the workers
//!   race checks with readings older than that sweep, inserting the keys again, which forces
//!   the table to grow under them while they check.
//! * `sweeps_half_an_interval_apart_racing_drained_keys`: sweeps at the readings of checks
//!   that drain a few keys, half an interval apart: a key whose debt has not cleared must
//!   not be evicted.
#![cfg(feature = "keyed")]

use crate::common;

use std::time::Duration;

use common::stale_race::{
    drained_race, inline_stale_race, per_key, purge_race, token_bucket_excess, PHASES,
};

use turnstile::keyed::smooth_bursty::KeyedSmoothBursty;
use turnstile::{ManualClock, Nanos};

const SEC: u64 = 1_000_000_000;
const KEYS: u32 = 64;
/// One per 10 s: `I` is a whole number of nanoseconds, so the budget's `d / I` has no
/// rounding, and longer than a key waits between checks in the stale race (the clock moves
/// about 60 ms a check there, 64 keys: about 4 s), so that keys are drained to their budget
/// and evicted the moment their debt clears.
const RATE: f64 = 0.1;
const I: u64 = 10 * SEC;
/// 30 s stored at most: 3 permits.
const MAX_PERMITS: u64 = 3;
/// The largest check the races make.
const N_MAX: u64 = 2;

type Map = KeyedSmoothBursty<u32, std::collections::hash_map::RandomState, ManualClock>;

fn map(clock: &ManualClock) -> Map {
    KeyedSmoothBursty::builder(RATE)
        .max_burst_seconds(MAX_PERMITS as f64 / RATE)
        .sweep_every(Duration::MAX)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The budget on every key: over every span between two grant readings, as a token bucket
/// of `max_permits + N_MAX` refilled one per `I` (linear in the grants), and exactly, with
/// `floor(d / I)`, over the spans of up to 8 intervals, less the span's largest grant
/// (at least the last to take effect, which the budget leaves out).
fn assert_budget(grants: &[(u32, u64, u32)]) {
    for (key, g) in per_key(grants, KEYS).iter().enumerate() {
        let burst = (MAX_PERMITS + N_MAX) as f64;
        let excess = token_bucket_excess(g, RATE, burst);
        assert!(
            excess <= 1e-6,
            "key {key}: {excess} permits over max_permits + {N_MAX} + d / I ({} grants)",
            g.len()
        );
        for (i, &(a, _)) in g.iter().enumerate() {
            let (mut count, mut largest) = (0u64, 0u64);
            for &(b, n) in &g[i..] {
                if b - a > 8 * I {
                    break;
                }
                count += u64::from(n);
                largest = largest.max(u64::from(n));
                let allowed = MAX_PERMITS + (b - a) / I;
                assert!(
                    count - largest <= allowed,
                    "key {key}: {count} permits in [{a}, {b}], the largest {largest}"
                );
            }
        }
    }
}

#[test]
fn stale_readings_racing_a_tight_sweeper() {
    let clock = ManualClock::new(Nanos::new(10 * SEC));
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
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    // A grant needs z <= its reading <= the phase's clock and adds at most N_MAX
    // intervals: 30 s later every key's debt has cleared, all are idle.
    let r = purge_race(
        &clock,
        KEYS,
        3 * I,
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
/// reading: a key drained at the last phase owes a debt of up to `N_MAX` intervals, so a
/// sweep half an interval later may not evict it; one that did would hand it a newborn's
/// permit early, phase after phase, and break the budget.
#[test]
fn sweeps_half_an_interval_apart_racing_drained_keys() {
    const FEW: u32 = 4;
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    let grants = drained_race(
        &clock,
        I / 2,
        FEW,
        // Two permits at a time every other phase: a debt of two intervals.
        |w, i| 1 + ((i + w) % 2) as u32,
        |key, now, n| k.check_n_at(&key, now, n).is_ok(),
        |now| k.evict_idle_at(now),
    );
    // Every phase drains every key, so each gets its whole budget: about one permit per
    // interval over PHASES * 2 intervals.
    let total: u64 = grants.iter().map(|&(_, _, n)| u64::from(n)).sum();
    assert!(total >= u64::from(FEW) * (PHASES as u64 * 2 - 1), "{total}");
    assert_budget(&grants);
}
