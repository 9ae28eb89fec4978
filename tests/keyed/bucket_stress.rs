//! `KeyedTokenBucket` under races: grants on live keys, evictions, revivals of evicted keys,
//! table growth and purges, and arbitrarily stale clock readings. The module docs of
//! `src/keyed/token_bucket.rs` and `src/keyed/word_map.rs` state the guarantee (every key keeps `burst + limit * span` over
//! every span of its readings, as if one bucket had served it all along); this file checks
//! it on every key after each race.
//!
//! * `stale_readings_racing_a_tight_sweeper`: workers check random keys at readings up to
//!   1.5 s stale while a sweeper evicts idle keys in a loop; every worker also forces the
//!   stale-after-eviction interleaving itself every few checks (read, advance, evict, use).
//! * `purges_then_stale_readings_and_growth_in_lockstep`: before each phase every key is
//!   idle and evicted, which forces a purge (the table is rebuilt empty); then the workers
//!   race checks with readings older than that sweep, inserting the keys again, which forces
//!   the table to grow under them while they check.
//! * `a_meter_keeps_its_budget_racing_a_tight_sweeper`: the first race on a
//!   `KeyedLeakyMeter`, the same word and table with the meter's quota (`capacity + leak *
//!   span` units over every span).
#![cfg(feature = "keyed")]

use crate::common;

use std::time::Duration;

use common::stale_race::{inline_stale_race, per_key, purge_race, token_bucket_excess, PHASES};

use turnstile::keyed::leaky_meter::KeyedLeakyMeter;
use turnstile::keyed::token_bucket::KeyedTokenBucket;
use turnstile::{Limit, ManualClock, Nanos};

const SEC: u64 = 1_000_000_000;
const KEYS: u32 = 64;
const LIMIT: f64 = 20.0;
const BURST: u32 = 3;

type Map = KeyedTokenBucket<u32, std::collections::hash_map::RandomState, ManualClock>;

fn map(clock: &ManualClock) -> Map {
    KeyedTokenBucket::builder(Limit::per_second(LIMIT).unwrap(), BURST)
        .sweep_every(Duration::MAX)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn assert_budget(grants: &[(u32, u64, u32)]) {
    for (key, g) in per_key(grants, KEYS).iter().enumerate() {
        let excess = token_bucket_excess(g, LIMIT, f64::from(BURST));
        assert!(
            excess <= 1e-6,
            "key {key}: {excess} tokens over burst + limit * span ({} grants)",
            g.len()
        );
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
fn a_meter_keeps_its_budget_racing_a_tight_sweeper() {
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = KeyedLeakyMeter::<u32, _, _>::builder(BURST, Limit::per_second(LIMIT).unwrap())
        .sweep_every(Duration::MAX)
        .clock(clock.clone())
        .build()
        .unwrap();
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
    // Every key was last granted at a reading of the previous phase, at most at its clock:
    // 5 s later all are full again.
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
    assert_budget(&r.grants);
    eprintln!(
        "{} grants over {PHASES} phases, {} forced purges, {} table replacements",
        r.grants.len(),
        r.purged,
        k.resizes()
    );
}
