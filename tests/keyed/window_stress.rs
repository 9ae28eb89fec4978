//! `KeyedWindow` under races: grants on live keys, evictions, revivals of evicted keys, table
//! growth and purges, and arbitrarily stale clock readings. The module docs of
//! `src/keyed/fixed_window/mod.rs` state the guarantee: windows never overlap and each counts at most
//! its quota, as if one `FixedWindow` had served the key all along. The windows here are
//! aligned on whole seconds of the clock, so the test knows them: a grant at reading `r` is
//! counted in the window open at its check, which ends after `r` and started no later than
//! the clock then, at most [`STALE_MAX`] after `r`. So the grants with readings in windows
//! `k..=l` lie in windows `k..=l + SPILL`: at most `QUOTA * (l - k + 1 + SPILL)`.
//!
//! * `stale_readings_racing_a_tight_sweeper`: workers check random keys at readings up to
//!   1.7 s stale while a sweeper thread evicts idle keys in a loop and the table grows from
//!   16 slots under them; every worker also forces the stale-after-eviction interleaving
//!   itself every few checks (read, advance, evict, use).
//! * `purges_then_stale_readings_and_growth_in_lockstep`: before each phase every key is
//!   idle and evicted, which forces a purge (the table is rebuilt empty); then the workers
//!   race checks with readings older than that sweep, inserting the keys again, which forces
//!   the table to grow under them while they check.
//! * `sweeps_half_a_window_apart_racing_drained_keys`: exact: every window of every key
//!   grants its quota, no less and no more, while sweeps run inside the windows.
#![cfg(feature = "keyed")]

use crate::common;

use std::sync::Mutex;
use std::time::Duration;

use common::stale_race::{
    drained_race, inline_stale_race, per_key, purge_race, record_timed, MAX_STALE, PHASES,
};

use turnstile::keyed::fixed_window::KeyedWindow;
use turnstile::{ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const KEYS: u32 = 64;
const QUOTA: u32 = 3;
/// The period: windows `[j s, (j + 1) s)` of the clock.
const P: u64 = SEC;
/// The stalest reading the races use: `stale_race`'s forced ones are up to 200 ms plus
/// [`MAX_STALE`] old.
const STALE_MAX: u64 = 200 * MS + MAX_STALE;
/// How many windows after its reading's a grant may be counted in.
const SPILL: u64 = STALE_MAX.div_ceil(P);

type Map = KeyedWindow<u32, std::collections::hash_map::RandomState, ManualClock>;

fn map(clock: &ManualClock) -> Map {
    KeyedWindow::builder(QUOTA, Duration::from_nanos(P))
        .align_utc()
        .unix_origin(Duration::ZERO)
        .sweep_every(Duration::MAX)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Per key, the grants per window of their readings: for every run of windows `k..=l`,
/// at most `QUOTA * (l - k + 1 + SPILL)`.
fn assert_bound(grants: &[(u32, u64, u32)]) {
    for (key, g) in per_key(grants, KEYS).iter().enumerate() {
        let Some(&(last, _)) = g.last() else { continue };
        let mut per_window = vec![0u64; (last / P + 1) as usize];
        for &(r, n) in g {
            per_window[(r / P) as usize] += u64::from(n);
        }
        for k in 0..per_window.len() {
            let mut sum = 0;
            for (l, &c) in per_window.iter().enumerate().skip(k) {
                sum += c;
                let allowed = u64::from(QUOTA) * ((l - k) as u64 + 1 + SPILL);
                assert!(
                    sum <= allowed,
                    "key {key}: {sum} grants read in windows {k}..={l}"
                );
            }
        }
    }
}

/// Per key, with each grant's reading `r` and a clock reading taken after its check
/// returned: the window that counted it lies between `r`'s and the later reading's. So the
/// grants with both in window `j` were all counted in `j`, at most `QUOTA`; those with both
/// in `j` or `j + 1` were counted in one of the two, at most `2 * QUOTA`.
fn assert_windows(grants: &[(u32, u64, u32, u64)]) {
    use std::collections::BTreeMap;
    let mut one: BTreeMap<(u32, u64), u32> = BTreeMap::new();
    let mut two: BTreeMap<(u32, u64), u32> = BTreeMap::new();
    for &(key, r, n, after) in grants {
        let (a, b) = (r / P, after / P);
        assert!(a <= b, "key {key}: read at {r}, returned at {after}");
        if a == b {
            *one.entry((key, a)).or_default() += n;
        }
        if b - a <= 1 {
            *two.entry((key, a)).or_default() += n;
            if a > 0 && a == b {
                *two.entry((key, a - 1)).or_default() += n;
            }
        }
    }
    for (&(key, j), &c) in &one {
        assert!(c <= QUOTA, "key {key}: {c} grants in window {j}");
    }
    for (&(key, j), &c) in &two {
        assert!(
            c <= 2 * QUOTA,
            "key {key}: {c} grants in windows {j} and {}",
            j + 1
        );
    }
}

#[test]
fn stale_readings_racing_a_tight_sweeper() {
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    let timed = Mutex::new(Vec::new());
    let r = inline_stale_race(
        &clock,
        KEYS,
        |key, reading, n| {
            record_timed(
                &clock,
                &timed,
                k.check_n_at(&key, reading, n).is_ok(),
                key,
                reading,
                n,
            )
        },
        || k.evict_idle(),
        || k.resizes(),
    );
    assert_windows(&timed.into_inner().unwrap());
    assert_bound(&r.grants);
}

#[test]
fn purges_then_stale_readings_and_growth_in_lockstep() {
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    // Every window opened in the last phase has ended 5 s later (and a newborn's spent
    // window ends at its birth): all keys are idle.
    let timed = Mutex::new(Vec::new());
    let r = purge_race(
        &clock,
        KEYS,
        5 * SEC,
        2,
        |key, reading, n| {
            record_timed(
                &clock,
                &timed,
                k.check_n_at(&key, reading, n).is_ok(),
                key,
                reading,
                n,
            )
        },
        || k.evict_idle(),
        || k.resizes(),
        || k.capacity(),
    );
    assert!(k.len() <= KEYS as usize);
    assert_windows(&timed.into_inner().unwrap());
    assert_bound(&r.grants);
    eprintln!(
        "{} grants over {PHASES} phases, {} forced purges, {} table replacements",
        r.grants.len(),
        r.purged,
        k.resizes()
    );
}

/// Sweeps half a window apart racing checks that drain a few keys at the sweep's reading: a
/// key drained at a window's first phase is not idle at its second (its window is open), so
/// no sweep may evict it; one that did would hand it a newborn's window, and a second quota,
/// in the same window.
#[test]
fn sweeps_half_a_window_apart_racing_drained_keys() {
    const FEW: u32 = 4;
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    let grants = drained_race(
        &clock,
        P / 2,
        FEW,
        |_, _| 1,
        |key, now, n| k.check_n_at(&key, now, n).is_ok(),
        |now| k.evict_idle_at(now),
    );
    // Every phase drains every key: each window of each key grants exactly its quota.
    for (key, g) in per_key(&grants, FEW).iter().enumerate() {
        let windows = (PHASES * 4).div_ceil(2);
        let mut per_window = vec![0u32; windows];
        for &(r, n) in g {
            per_window[((r - 10 * SEC) / P) as usize] += n;
        }
        assert_eq!(per_window, vec![QUOTA; windows], "key {key}");
    }
}
