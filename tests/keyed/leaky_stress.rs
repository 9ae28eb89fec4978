//! `KeyedLeakyBucket` under races: grants on live keys, evictions, revivals of evicted keys,
//! table growth and purges, and arbitrarily stale clock readings. The module docs of
//! `src/keyed/leaky_bucket.rs` state the guarantee: every key keeps upstream's bound, at most
//! `slack + 1 + d / T` permits with readings in any span `d`, as if one bucket had served it
//! all along; this file checks it on every key after each race.
//!
//! * `stale_readings_racing_a_tight_sweeper`: workers check random keys at readings up to
//!   1.5 s stale while a sweeper thread evicts idle keys in a loop and the table grows from
//!   16 slots under them; every worker also forces the stale-after-eviction interleaving
//!   itself every few checks (read, advance, evict, use).
//! * `purges_then_stale_readings_and_growth_in_lockstep`: before each phase every key is
//!   idle and evicted, which forces a purge (the table is rebuilt empty); then the workers
//!   race checks with readings older than that sweep, inserting the keys again, which forces
//!   the table to grow under them while they check.
#![cfg(feature = "keyed")]

use crate::common;

use std::time::Duration;

use common::stale_race::{
    drained_race, inline_stale_race, per_key, purge_race, token_bucket_excess, PHASES,
};

use turnstile::keyed::leaky_bucket::KeyedLeakyBucket;
use turnstile::{ManualClock, Nanos};

const SEC: u64 = 1_000_000_000;
const KEYS: u32 = 64;
/// 20 per second: `T` = 50 ms exactly, so the bound's `d / T` has no rounding.
const RATE: u32 = 20;
const T: u64 = SEC / RATE as u64;
const SLACK: u32 = 3;

type Map = KeyedLeakyBucket<u32, std::collections::hash_map::RandomState, ManualClock>;

fn map(clock: &ManualClock) -> Map {
    KeyedLeakyBucket::builder(RATE)
        .slack(SLACK)
        .sweep_every(Duration::MAX)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Upstream's bound on every key: over every span between two grant readings, as a token
/// bucket of `slack + 1` refilled one per `T` (linear in the grants), and exactly, with
/// `floor(d / T)`, over the spans of up to 8 paces.
fn assert_bound(grants: &[(u32, u64, u32)]) {
    for (key, g) in per_key(grants, KEYS).iter().enumerate() {
        let excess = token_bucket_excess(g, f64::from(RATE), f64::from(SLACK + 1));
        assert!(
            excess <= 1e-6,
            "key {key}: {excess} permits over slack + 1 + d / T ({} grants)",
            g.len()
        );
        for (i, &(a, _)) in g.iter().enumerate() {
            let mut count = 0u64;
            for &(b, n) in &g[i..] {
                if b - a > 8 * T {
                    break;
                }
                count += u64::from(n);
                let allowed = u64::from(SLACK) + 1 + (b - a) / T;
                assert!(count <= allowed, "key {key}: {count} permits in [{a}, {b}]");
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
    assert_bound(&r.grants);
}

#[test]
fn purges_then_stale_readings_and_growth_in_lockstep() {
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    // Every key's `next` is at most the previous phase's clock: 5 s later, far more than
    // (slack + 1) * T, all are idle.
    let r = purge_race(
        &clock,
        KEYS,
        5 * SEC,
        2,
        |key, reading, n| k.check_n_at(&key, reading, n).is_ok(),
        || k.evict_idle(),
        || k.resizes(),
        || k.capacity(),
    );
    assert!(k.len() <= KEYS as usize);
    assert_bound(&r.grants);
    eprintln!(
        "{} grants over {PHASES} phases, {} forced purges, {} table replacements",
        r.grants.len(),
        r.purged,
        k.resizes()
    );
}

/// Sweeps half a pace apart racing checks that drain a few keys at the sweep's reading: a
/// key drained at the last phase is not idle yet (half a pace is less than `(slack + 1) *
/// T`), so no sweep may evict it; one that did would hand it a newborn's permit a pace
/// early, once a phase, and break the bound.
#[test]
fn sweeps_half_a_pace_apart_racing_drained_keys() {
    const FEW: u32 = 4;
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    let grants = drained_race(
        &clock,
        T / 2,
        FEW,
        |_, _| 1,
        |key, now, n| k.check_n_at(&key, now, n).is_ok(),
        |now| k.evict_idle_at(now),
    );
    // Every phase drains every key, so each gets its whole bound: not fewer, not more.
    assert!(grants.len() as u64 >= u64::from(FEW) * (PHASES as u64 * 2 - 1));
    assert_bound(&grants);
}
