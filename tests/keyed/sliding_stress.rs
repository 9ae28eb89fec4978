//! `KeyedSlidingWindow` under races: grants on live keys, evictions, revivals of evicted
//! keys, table growth and purges, and arbitrarily stale clock readings. The module docs of
//! `src/keyed/sliding_window.rs` state the budget in **judged times** (a grant's reading, or the
//! start of the state's window if later), over a key's whole history across evictions: each
//! aligned window holds at most `QUOTA` grants, and any span of one period fewer than
//! `2 * QUOTA`. The test knows only a grant's reading `r` and a clock reading `after` taken
//! once its check returned; its judged time lies in `[r, after]` (the state's window was set
//! by a grant judged at a reading taken earlier, a newborn's by a reading or a sweep's time
//! taken earlier). So:
//!
//! * the grants with `r` and `after` in one window `j` were judged in `j`: at most `QUOTA`;
//! * the grants with `[r, after]` inside a span `[s, s + P)` were judged in it: at most
//!   `2 * QUOTA - 1` (checked at every grant's `r` as `s`).
//!
//! The windows are counted from the map's base, 10 s on the clock: whole seconds.
//!
//! * `stale_readings_racing_a_tight_sweeper`: workers check random keys at readings up to
//!   1.7 s stale while a sweeper thread evicts idle keys in a loop and the table grows from
//!   16 slots under them; every worker also forces the stale-after-eviction interleaving
//!   itself every few checks (read, advance, evict, use).
//! * `purges_then_stale_readings_and_growth_in_lockstep`: before each phase every key is
//!   idle and evicted, which forces a purge (the table is rebuilt empty); then the workers
//!   race checks with readings older than that sweep, inserting the keys again, which forces
//!   the table to grow under them while they check.
//! * `sweeps_half_a_window_apart_racing_drained_keys`: exact: a drained key always weighs
//!   half a window later, so no sweep may evict it, and what each phase grants is what one
//!   `SlidingWindow` drained at the same readings grants.
#![cfg(feature = "keyed")]

use crate::common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use common::stale_race::{
    drained_race, inline_stale_race, per_key, purge_race, record_timed, PHASES, WORKERS,
};

use turnstile::keyed::sliding_window::KeyedSlidingWindow;
use turnstile::{ManualClock, Nanos, SlidingWindow};

const SEC: u64 = 1_000_000_000;
const KEYS: u32 = 64;
const QUOTA: u32 = 3;
/// The period: windows `[j s, (j + 1) s)` of the clock (the base, 10 s, is one).
const P: u64 = SEC;

type Map = KeyedSlidingWindow<u32, std::collections::hash_map::RandomState, ManualClock>;

fn map(clock: &ManualClock) -> Map {
    KeyedSlidingWindow::builder(QUOTA, Duration::from_nanos(P))
        .sweep_every(Duration::MAX)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The budget over grants `(key, reading, n, after)` (module docs).
fn assert_budget(grants: &[(u32, u64, u32, u64)]) {
    let mut windows: BTreeMap<(u32, u64), u32> = BTreeMap::new();
    let mut per: BTreeMap<u32, Vec<(u64, u64, u32)>> = BTreeMap::new();
    for &(key, r, n, after) in grants {
        assert!(r <= after, "key {key}: read at {r}, returned at {after}");
        if r / P == after / P {
            *windows.entry((key, r / P)).or_default() += n;
        }
        per.entry(key).or_default().push((r, after, n));
    }
    for (&(key, j), &c) in &windows {
        assert!(c <= QUOTA, "key {key}: {c} grants judged in window {j}");
    }
    let mut spans = 0;
    for (key, g) in &mut per {
        g.sort_unstable();
        for (i, &(s, _, _)) in g.iter().enumerate() {
            let c: u32 = g[i..]
                .iter()
                .take_while(|&&(r, _, _)| r < s + P)
                .filter(|&&(_, after, _)| after < s + P)
                .map(|&(_, _, n)| n)
                .sum();
            assert!(
                c < 2 * QUOTA,
                "key {key}: {c} grants judged in [{s}, {s} + P)"
            );
            spans += 1;
        }
    }
    eprintln!("{} windows and {spans} spans checked", windows.len());
}

#[test]
fn stale_readings_racing_a_tight_sweeper() {
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    let timed = Mutex::new(Vec::new());
    inline_stale_race(
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
    assert_budget(&timed.into_inner().unwrap());
}

#[test]
fn purges_then_stale_readings_and_growth_in_lockstep() {
    let clock = ManualClock::new(Nanos::new(10 * SEC));
    let k = map(&clock);
    // Every grant of the last phase has stopped weighing 5 s later: all keys are idle.
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
    assert_budget(&timed.into_inner().unwrap());
    eprintln!(
        "{} grants over {PHASES} phases, {} forced purges, {} table replacements",
        r.grants.len(),
        r.purged,
        k.resizes()
    );
}

/// Sweeps half a window apart racing checks that drain a few keys at the sweep's reading: a
/// key drained at one phase still weighs at the next, so no sweep may evict it; one that did
/// would hand it a newborn's empty windows, and more grants than one limiter gives.
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
    // One limiter drained at each phase's reading, one permit at a time.
    let one = SlidingWindow::builder(QUOTA, Duration::from_nanos(P))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let phases = PHASES * 4;
    let mut want = vec![0u32; phases];
    for (i, w) in want.iter_mut().enumerate() {
        let now = Nanos::new(10 * SEC + P / 2 * i as u64);
        while one.allow_at(now) {
            *w += 1;
        }
    }
    // Some phases grant nothing (the window is full), most grant something.
    assert!(
        want.iter().filter(|&&w| w > 0).count() >= phases / 2,
        "{want:?}"
    );
    for (key, g) in per_key(&grants, FEW).iter().enumerate() {
        let mut got = vec![0u32; phases];
        for &(r, n) in g {
            got[((r - 10 * SEC) / (P / 2)) as usize] += n;
        }
        assert_eq!(got, want, "key {key} ({WORKERS} workers)");
    }
}
