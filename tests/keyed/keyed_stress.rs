//! `Keyed` under arbitrarily stale clock readings: a check whose time was read before a sweep
//! evicted its key's limiter must not gain from the eviction. The module docs of `src/keyed/mod.rs`
//! state the guarantee (each key keeps its limiter type's bound over every span, as if one
//! limiter had served it all along) and prove it; this file checks it.
//!
//! * `a_stale_reading_after_an_eviction_*`: the interleaving forced step by step on a manual
//!   clock, for every limiter type: grants at time 0, a reading taken, the clock moved on, the
//!   key evicted, then the reading used.
//! * `stale_readings_racing_a_tight_sweeper_*`: worker threads check random keys at readings
//!   up to 1.5 s stale while a sweeper evicts idle keys in a loop; every worker also forces the
//!   interleaving above itself every few checks (read, advance, evict, use), so the case is
//!   exercised whatever the scheduler does. Afterwards every key's grants are checked against
//!   its limiter's bound over every span of check times.
#![cfg(feature = "keyed")]

use crate::common;

use std::time::Duration;

use common::stale_race::{
    per_key, stale_race, token_bucket_excess, Race, CHECKS, FORCE_EVERY, WORKERS,
};

use turnstile::{
    FixedWindow, Idle, Keyed, LeakyBucket, LeakyMeter, Limit, Limiter, ManualClock, Nanos,
    SlidingWindow, SmoothBursty, SmoothWarmingUp, TokenBucket,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

/// A map of `factory`'s limiters on `clock`, swept only when the test says so.
fn map<L: Limiter + Idle + 'static>(
    clock: &ManualClock,
    factory: impl Fn(&u32) -> L + Send + Sync + 'static,
) -> Keyed<u32, L, ManualClock> {
    Keyed::builder(factory)
        .sweep_every(Duration::MAX)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The forced interleaving: `busy` grants at 0 (it asserts them), a thread reads `stale`,
/// the clock moves to `idle` where a sweep evicts the key, and the stale reading is used.
/// Returns that check's result.
fn stale_after_eviction<L: Limiter + Idle + 'static>(
    factory: impl Fn(&u32) -> L + Send + Sync + 'static,
    busy: &[(u64, u32)],
    stale: u64,
    idle: u64,
    n: u32,
) -> (Keyed<u32, L, ManualClock>, Result<(), turnstile::Denied>) {
    let clock = ManualClock::default();
    let k = map(&clock, factory);
    for &(t, m) in busy {
        clock.set(at(t));
        assert!(k.check_n_at(&7, at(t), m).is_ok(), "the busy grant at {t}");
    }
    let reading = at(stale); // the thread reads the clock, then stalls
    clock.set(at(idle));
    assert_eq!(k.evict_idle(), 1, "the key must be idle at {idle} ns");
    let r = k.check_n_at(&7, reading, n);
    (k, r)
}

/// The review's repro: 1 token per second, burst 1. A grant at 0, a reading at 0.3 s used
/// after the key was evicted at 1.1 s: a fresh bucket granted it, 2 tokens in [0, 0.3 s]
/// against a budget of 1.3 (0.8 token too many with the reading 0.8 s older than the
/// sweep). Born at 1.1 s, the new bucket holds 0.2 tokens at 0.3 s.
#[test]
fn a_stale_reading_after_an_eviction_token_bucket() {
    let factory = |_: &u32| {
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(ManualClock::default())
            .build_compact()
    };
    let (k, r) = stale_after_eviction(factory, &[(0, 1)], 300 * MS, 1_100 * MS, 1);
    let d = r.expect_err("2 tokens in [0, 0.3 s] > burst + limit * 0.3 s");
    assert_eq!(d.retry_at(), Some(at(1_100 * MS)));
    let tokens = k.with(&7, |tb| tb.tokens_at(at(300 * MS))).unwrap();
    assert!((tokens - 0.2).abs() < 1e-9, "{tokens}");
    // A check at the present is not affected.
    assert!(k.check_n_at(&7, at(1_100 * MS), 1).is_ok());
}

/// A stale reading that comes back after another thread already rebuilt the key at the
/// present meets that newborn too.
#[test]
fn a_stale_reading_meets_a_newborn_built_by_another_thread() {
    let clock = ManualClock::default();
    let k = map(&clock, |_: &u32| {
        TokenBucket::builder(Limit::per_second(10.0).unwrap(), 5)
            .clock(ManualClock::default())
            .build_compact()
    });
    assert!(k.check_n_at(&7, at(0), 5).is_ok());
    let reading = at(10 * MS);
    clock.set(at(2 * SEC));
    assert_eq!(k.evict_idle(), 1);
    // Another thread, up to date, builds the key's new bucket (and asks too much of it:
    // denied, so it stays full).
    assert!(k.check_n_at(&7, at(2 * SEC), 6).is_err());
    assert!(k.contains(&7));
    // Budget in [0, 10 ms]: 5 + 0.1 tokens, all spent at 0. The newborn, born at 2 s, is
    // full at 2 s and has no token at 10 ms.
    assert!(k.check_n_at(&7, reading, 5).is_err());
    assert!(k.check_n_at(&7, reading, 1).is_err());
}

/// An explicit eviction at a time ahead of the map's clock: the key's next limiter is born at
/// that time, not at the clock's (which would make it full where the evicted one was not).
#[test]
fn an_eviction_judged_ahead_of_the_clock_dates_the_newborn() {
    let clock = ManualClock::default();
    let k = map(&clock, |_: &u32| {
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(ManualClock::default())
            .build_compact()
    });
    assert!(k.check_n_at(&7, at(0), 1).is_ok());
    assert_eq!(k.evict_idle_at(at(1_100 * MS)), 1); // the clock is still at 0
    assert_eq!(
        k.check_n_at(&7, at(300 * MS), 1).unwrap_err().retry_at(),
        Some(at(1_100 * MS))
    );
}

#[test]
fn a_stale_reading_after_an_eviction_leaky_meter() {
    let factory = |_: &u32| {
        LeakyMeter::builder(1, Limit::per_second(1.0).unwrap())
            .clock(ManualClock::default())
            .build()
            .unwrap()
    };
    let (_, r) = stale_after_eviction(factory, &[(0, 1)], 300 * MS, 1_100 * MS, 1);
    assert_eq!(r.unwrap_err().retry_at(), Some(at(1_100 * MS)));
}

/// 10 per second, no slack (T = 100 ms): a permit at 0, a reading at 50 ms used after the
/// eviction at 200 ms. A fresh bucket's first take grants it: 2 permits in a 50 ms span,
/// against `slack + 1 + 0.5`. Born at 200 ms, `next + T` is 200 ms.
#[test]
fn a_stale_reading_after_an_eviction_leaky_bucket() {
    let factory = |_: &u32| {
        LeakyBucket::builder(10)
            .without_slack()
            .clock(ManualClock::default())
            .build()
            .unwrap()
    };
    let (_, r) = stale_after_eviction(factory, &[(0, 1)], 50 * MS, 200 * MS, 1);
    assert_eq!(r.unwrap_err().retry_at(), Some(at(200 * MS)));
}

/// Quota 1 per second: a window [0, 1 s) spent, a reading at 0.5 s used after the eviction
/// at 1.1 s. A fresh limiter opened the window [0.5 s, 1.5 s), overlapping the spent one.
#[test]
fn a_stale_reading_after_an_eviction_fixed_window() {
    let factory = |_: &u32| {
        FixedWindow::builder(1, Duration::from_secs(1))
            .clock(ManualClock::default())
            .build()
            .unwrap()
    };
    let (_, r) = stale_after_eviction(factory, &[(0, 1)], 500 * MS, 1_100 * MS, 1);
    assert_eq!(r.unwrap_err().retry_at(), Some(at(1_100 * MS)));
}

/// Quota 1 per second: a grant at 0.9 s in window 0, a reading at 0.95 s used after the
/// eviction at 2 s (window 2). A fresh limiter counted it in window 0: two grants in one
/// window. Born at 2 s it is judged at the start of window 2 and counted there, so window 2
/// has nothing left.
#[test]
fn a_stale_reading_after_an_eviction_sliding_window() {
    let factory = |_: &u32| {
        SlidingWindow::builder(1, Duration::from_secs(1))
            .clock(ManualClock::default())
            .build()
            .unwrap()
    };
    let (k, r) = stale_after_eviction(factory, &[(900 * MS, 1)], 950 * MS, 2 * SEC, 1);
    assert!(r.is_ok(), "judged at 2 s, where nothing weighs");
    assert!(
        k.check_n_at(&7, at(2 * SEC), 1).is_err(),
        "the stale grant was not counted in window 2"
    );
}

/// 1 per second, no stored permits: a grant at 0 leaves a debt until 1 s. A reading at 0.5 s
/// used after the eviction at 1 s found a fresh limiter with no debt (its `next_free` is its
/// construction time, 0).
#[test]
fn a_stale_reading_after_an_eviction_smooth_bursty() {
    let factory = |_: &u32| {
        SmoothBursty::builder(1.0)
            .clock(ManualClock::default())
            .build()
            .unwrap()
    };
    let (_, r) = stale_after_eviction(factory, &[(0, 1)], 500 * MS, SEC, 1);
    assert_eq!(r.unwrap_err().retry_at(), Some(at(SEC)));
}

/// Warming up (1 per second, 2 s warm-up): the cold first permit leaves a debt of more than
/// a second; idle again once cold, which the test finds by stepping the clock.
#[test]
fn a_stale_reading_after_an_eviction_smooth_warming_up() {
    let factory = |_: &u32| {
        SmoothWarmingUp::builder(1.0, Duration::from_secs(2))
            .clock(ManualClock::default())
            .build()
            .unwrap()
    };
    let clock = ManualClock::default();
    let k = map(&clock, factory);
    assert!(k.check_n_at(&7, at(0), 1).is_ok());
    let reading = at(500 * MS);
    let mut idle = SEC;
    while !k.with(&7, |l| l.is_idle_at(at(idle))).unwrap() {
        idle += 100 * MS;
        assert!(idle < 60 * SEC);
    }
    clock.set(at(idle));
    assert_eq!(k.evict_idle(), 1);
    assert_eq!(
        k.check_n_at(&7, reading, 1).unwrap_err().retry_at(),
        Some(at(idle))
    );
}

// ---- the race (tests/common/stale_race.rs) -------------------------------------------

const KEYS: u32 = 4;

/// The race on a `Keyed` map of `factory`'s limiters.
fn race<L: Limiter + Idle + 'static>(factory: impl Fn(&u32) -> L + Send + Sync + 'static) -> Race {
    let clock = ManualClock::new(at(10 * SEC));
    let k = map(&clock, factory);
    stale_race(
        &clock,
        KEYS,
        |key, reading, n| k.check_n_at(&key, reading, n).is_ok(),
        || k.evict_idle(),
    )
}

#[test]
fn stale_readings_racing_a_tight_sweeper_token_bucket() {
    let (limit, burst) = (20.0, 3);
    let r = race(move |_: &u32| {
        TokenBucket::builder(Limit::per_second(limit).unwrap(), burst)
            .clock(ManualClock::default())
            .build_compact()
    });
    assert_eq!(r.forced, WORKERS * CHECKS.div_ceil(FORCE_EVERY));
    for (key, grants) in per_key(&r.grants, KEYS).iter().enumerate() {
        let excess = token_bucket_excess(grants, limit, f64::from(burst));
        assert!(
            excess <= 1e-6,
            "key {key}: {excess} tokens over burst + limit * span ({} grants)",
            grants.len()
        );
    }
    eprintln!(
        "token bucket: {} grants, {} forced stale checks, {} evictions by the sweeper",
        r.grants.len(),
        r.forced,
        r.swept
    );
}

/// Leaky bucket: at most `slack + 1 + d / T` permits with readings in any span `d` (a
/// granted check's permit time is its reading). With `u_i = t_i - i * T` over the sorted
/// permits, that is `u_i - u_j <= slack * T` for every `i < j`.
#[test]
fn stale_readings_racing_a_tight_sweeper_leaky_bucket() {
    let (rate, slack) = (20u32, 2u32);
    let r = race(move |_: &u32| {
        LeakyBucket::builder(rate)
            .slack(slack)
            .clock(ManualClock::default())
            .build()
            .unwrap()
    });
    let t = i128::from(SEC / u64::from(rate));
    let m = i128::from(slack) * t;
    for (key, grants) in per_key(&r.grants, KEYS).iter().enumerate() {
        let permits: Vec<u64> = grants
            .iter()
            .flat_map(|&(t, n)| std::iter::repeat_n(t, n as usize))
            .collect();
        let mut max_u = i128::MIN;
        for (j, &tj) in permits.iter().enumerate() {
            let u = i128::from(tj) - j as i128 * t;
            max_u = max_u.max(u);
            assert!(
                max_u - u <= m,
                "key {key}: more than slack + 1 + d / T permits in a span ending at {tj}"
            );
        }
    }
    eprintln!(
        "leaky bucket: {} grants, {} forced stale checks, {} evictions by the sweeper",
        r.grants.len(),
        r.forced,
        r.swept
    );
}
