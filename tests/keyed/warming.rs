//! `KeyedSmoothWarmingUp` semantics: Guava's `SmoothWarmingUp` per key (a new key starts
//! cold, stored permits cost the warm-up integral, pay later, retry times when the debt
//! clears, cold again after idling), per-key independence, quotas, bad input, a proptest
//! differential against `Keyed<u64, SmoothWarmingUp>` on random (key, time, n) sequences,
//! stale readings included (with and without sweeps: both date and judge keys alike), and
//! eviction plus revival keeping the budget.
#![cfg(feature = "keyed")]

use crate::common;

use std::collections::hash_map::RandomState;
use std::time::Duration;

use common::stale_race::token_bucket_excess;
use proptest::prelude::*;
use turnstile::keyed::smooth_warming_up::{KeyedSmoothWarmingUp, MAX_QUOTAS};
use turnstile::{ConfigError, Keyed, ManualClock, Nanos, SmoothWarmingUp};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// The clock's reading at construction (the map's base).
const T0: u64 = 1_000 * SEC;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

type Map = KeyedSmoothWarmingUp<u64, RandomState, ManualClock>;

/// `rate` per second after `warmup_ms` with `cold_factor`, on a manual clock at [`T0`],
/// swept only by hand.
fn map(rate: f64, warmup_ms: u64, cold_factor: f64) -> Map {
    KeyedSmoothWarmingUp::builder(rate, Duration::from_millis(warmup_ms))
        .cold_factor(cold_factor)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap()
}

/// Guava's `acquire` loop as checks: grant at `now`, then the refusal's retry time is the
/// wait the next acquire would have had; returns the `count` waits (the first is 0 if the
/// key owes nothing at `now`) and the reading after the last grant.
fn acquires(k: &Map, key: u64, mut now: u64, count: usize) -> (Vec<u64>, u64) {
    let mut waits = Vec::new();
    for _ in 0..count {
        let wait = match k.check_n_at(&key, at(now), 0) {
            Ok(()) => 0,
            Err(d) => d.retry_at().unwrap().as_u64() - now,
        };
        now += wait;
        assert!(k.check_n_at(&key, at(now), 1).is_ok(), "granted at {now}");
        waits.push(wait);
    }
    (waits, now)
}

fn ms(v: &[u64]) -> Vec<u64> {
    v.iter().map(|m| m * MS).collect()
}

/// Guava's `testWarmUp`: 2 permits per second after a 4 s warm-up, cold factor 3.
#[test]
fn guava_warm_up_vectors() {
    let k = map(2.0, 4000, 3.0);
    let cold = ms(&[0, 1375, 1125, 875, 625, 500, 500, 500]);
    let (waits, now) = acquires(&k, 1, T0 + SEC, 8);
    assert_eq!(waits, cold, "#1 from cold");
    // Repay the last acquire, then idle for the warm-up period: cold again.
    let now = now + 500 * MS + 4000 * MS;
    let (waits, now) = acquires(&k, 1, now, 8);
    assert_eq!(waits, cold, "#4");
    // Idle for half the warm-up only: not cold yet.
    let (waits, _) = acquires(&k, 1, now + 500 * MS + 2000 * MS, 8);
    assert_eq!(waits, ms(&[0, 500, 500, 500, 500, 500, 500, 500]), "#7");
    // Another key is independent: cold.
    let (waits, _) = acquires(&k, 2, T0 + 2 * SEC, 8);
    assert_eq!(waits, cold);
    assert_eq!(k.len(), 2);
}

/// Guava's `testWarmUpWithColdFactor` (10) and a cold factor of 1 (no premium: flat).
#[test]
fn guava_cold_factor_vectors() {
    let k = map(5.0, 4000, 10.0);
    let (waits, now) = acquires(&k, 1, T0, 8);
    let cents: Vec<u64> = waits.iter().map(|w| (w + 5 * MS) / (10 * MS)).collect();
    assert_eq!(cents, [0, 175, 126, 76, 30, 20, 20, 20]);
    let (waits, _) = acquires(&k, 1, now + 200 * MS + 1000 * MS, 8);
    assert_eq!(
        waits,
        ms(&[0, 200, 200, 200, 200, 200, 200, 200]),
        "still warm"
    );
    let k = map(5.0, 4000, 1.0);
    let (waits, _) = acquires(&k, 1, T0, 8);
    assert_eq!(waits, ms(&[0, 200, 200, 200, 200, 200, 200, 200]));
}

/// `a_warm_up_spend_leaves_a_debt_and_a_store` of `tests/smooth/semantics.rs`, per key: the
/// two states the bursty map's single number cannot tell apart answer differently here,
/// as `SmoothWarmingUp` does.
#[test]
fn a_warm_up_spend_leaves_a_debt_and_a_store() {
    let k = map(2.0, 4000, 3.0);
    assert!(k.check_n_at(&1, at(T0 + 8_625 * MS), 1).is_ok()); // 1.375 s, 7 stored
    assert!(k.check_n_at(&2, at(T0), 9).is_ok()); // 8 stored and 1 fresh: 6.5 s
    let t = at(T0 + 9 * SEC);
    let d = k.check_n_at(&1, t, 1).unwrap_err();
    assert_eq!(
        d.retry_at(),
        Some(at(T0 + 10 * SEC)),
        "a debt with permits stored"
    );
    assert!(k.check_n_at(&2, t, 1).is_ok(), "key 2 owes nothing at 9 s");
}

#[test]
fn zero_permits_pass_iff_no_debt_and_take_nothing() {
    let k = map(10.0, 1000, 3.0);
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 0).is_ok()); // inserted, nothing taken
    assert!(k.check_n_at(&1, at(t), 0).is_ok());
    assert!(k.check_n_at(&1, at(t), 3).is_ok());
    let d = k.check_n_at(&1, at(t), 0).unwrap_err();
    let clears = d.retry_at().unwrap();
    assert!(
        clears > at(t + 300 * MS),
        "cold permits cost more than 100 ms: {d:?}"
    );
    assert!(k.check_n_at(&1, clears, 0).is_ok());
    assert!(k.check_n_at(&1, clears, 1).is_ok());
}

#[test]
fn an_infinite_rate_never_limits() {
    let inf = map(f64::INFINITY, 1000, 3.0);
    for i in 0..100 {
        assert!(inf.check_n_at(&1, at(T0 + i), u32::MAX).is_ok());
    }
    assert_eq!(inf.evict_idle_at(at(T0)), 1);
}

/// A key is evicted only once it is exactly a fresh one: no debt and cold again.
#[test]
fn a_key_is_idle_only_when_cold_again() {
    let k = map(2.0, 4000, 3.0);
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 1).is_ok()); // 1.375 s of debt, 7 stored
    assert_eq!(
        k.evict_idle_at(at(t + 1375 * MS)),
        0,
        "no debt, but warmer than new"
    );
    // One permit comes back every 500 ms of idling: full 500 ms after the debt clears.
    assert_eq!(k.evict_idle_at(at(t + 1875 * MS - 1)), 0);
    assert_eq!(k.evict_idle_at(at(t + 1875 * MS)), 1);
    // Revived at a later reading: cold, the same schedule.
    let (waits, _) = acquires(&k, 1, t + 10 * SEC, 3);
    assert_eq!(waits, ms(&[0, 1375, 1125]));
}

#[test]
fn quotas_are_per_key_and_bounded() {
    let k = KeyedSmoothWarmingUp::builder(2.0, Duration::from_secs(4))
        .quota(5.0, Duration::from_secs(4), 1.0)
        .classify(|key: &u64| usize::from(*key >= 100))
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap();
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 1).is_ok());
    assert_eq!(
        k.check_n_at(&1, at(t), 1).unwrap_err().retry_at(),
        Some(at(t + 1375 * MS))
    );
    assert!(k.check_n_at(&100, at(t), 1).is_ok());
    assert_eq!(
        k.check_n_at(&100, at(t), 1).unwrap_err().retry_at(),
        Some(at(t + 200 * MS))
    );
    let mut b = KeyedSmoothWarmingUp::<u8>::builder(1.0, Duration::from_secs(1));
    for _ in 0..MAX_QUOTAS {
        b = b.quota(1.0, Duration::from_secs(1), 3.0);
    }
    assert_eq!(
        b.build().unwrap_err(),
        ConfigError::TooManyQuotas(MAX_QUOTAS + 1)
    );
}

/// Every invalid configuration is a typed error, whichever quota it is in; nothing panics.
#[test]
fn bad_configurations_are_typed_errors() {
    let sec = Duration::from_secs(1);
    let build = |rate: f64, w: Duration, cf: f64| {
        KeyedSmoothWarmingUp::<u8>::builder(rate, w)
            .cold_factor(cf)
            .build()
    };
    let quota1 = |rate: f64, w: Duration, cf: f64| {
        KeyedSmoothWarmingUp::<u8>::builder(1.0, Duration::from_secs(1))
            .quota(rate, w, cf)
            .build()
    };
    let makers: [fn(f64, Duration, f64) -> _; 2] = [build, quota1];
    for make in makers {
        for rate in [0.0, -0.0, -1.0, f64::NEG_INFINITY] {
            assert_eq!(
                make(rate, sec, 3.0).unwrap_err(),
                ConfigError::RateNotPositive(rate)
            );
        }
        assert!(
            matches!(make(f64::NAN, sec, 3.0), Err(ConfigError::RateNotPositive(r)) if r.is_nan())
        );
        let sub = f64::MIN_POSITIVE / 4.0;
        assert_eq!(
            make(sub, sec, 3.0).unwrap_err(),
            ConfigError::SubnormalLimit(sub)
        );
        assert_eq!(
            make(1.0, Duration::ZERO, 3.0).unwrap_err(),
            ConfigError::ZeroWarmup(Duration::ZERO)
        );
        for cf in [0.5, 0.0, -1.0, f64::INFINITY] {
            assert_eq!(
                make(1.0, sec, cf).unwrap_err(),
                ConfigError::InvalidColdFactor(cf)
            );
        }
        assert!(
            matches!(make(1.0, sec, f64::NAN), Err(ConfigError::InvalidColdFactor(c)) if c.is_nan())
        );
        // The widest configurations are accepted and checked without a panic.
        for (rate, w, cf) in [
            (f64::MAX, Duration::MAX, 1e300),
            (1e-300, Duration::from_nanos(1), 1.0),
            (f64::INFINITY, Duration::MAX, 3.0),
        ] {
            let k = make(rate, w, cf).unwrap();
            for t in common::extreme_times() {
                for n in [0, 1, u32::MAX] {
                    let _ = k.check_n_at(&1, t, n);
                }
                let _ = k.evict_idle_at(t);
            }
        }
    }
    let e = KeyedSmoothWarmingUp::<u8>::builder(1.0, sec)
        .max_keys(0)
        .build();
    assert_eq!(e.unwrap_err(), ConfigError::ZeroMaxKeys);
}

/// Extreme readings and sizes: no panic; a debt past the word's range is "never".
#[test]
fn extreme_times_and_sizes_do_not_panic() {
    let k = map(3.0, 2000, 3.0);
    for t in common::extreme_times() {
        for n in [0, 1, 2, u32::MAX] {
            let _ = k.check_n_at(&7, t, n);
            let _ = k.check_n_at(&t.as_u64(), t, n);
        }
        let _ = k.evict_idle_at(t);
    }
    // u32::MAX permits at 1e-9/s: a debt saturated at the word's end, never.
    let k = map(1e-9, 1000, 3.0);
    assert!(k.check_n_at(&1, at(T0), u32::MAX).is_ok());
    assert_eq!(
        k.check_n_at(&1, at(T0 + SEC), 1).unwrap_err().retry_at(),
        None
    );
    assert_eq!(
        k.evict_idle_at(at(u64::MAX)),
        0,
        "a key in debt is not idle"
    );
}

type Theirs = Keyed<u64, SmoothWarmingUp<ManualClock>, ManualClock>;

/// `(rate, warm-up ns, cold_factor)`.
type Config = (f64, u64, f64);

/// A `Keyed<u64, SmoothWarmingUp>` on the same clock, swept only by hand: even keys get
/// `c0`, odd ones `c1`.
fn keyed(c0: Config, c1: Config) -> Theirs {
    let clock = ManualClock::new(at(T0));
    let c = clock.clone();
    Keyed::builder(move |key: &u64| {
        let (rate, w, cf) = if key.is_multiple_of(2) { c0 } else { c1 };
        SmoothWarmingUp::builder(rate, Duration::from_nanos(w))
            .cold_factor(cf)
            .clock(c.clone())
            .build()
            .unwrap()
    })
    .sweep_every(Duration::MAX)
    .clock(clock)
    .build()
    .unwrap()
}

/// The map with the same two quotas, picked alike.
fn two_quotas(c0: Config, c1: Config) -> Map {
    KeyedSmoothWarmingUp::builder(c0.0, Duration::from_nanos(c0.1))
        .cold_factor(c0.2)
        .quota(c1.0, Duration::from_nanos(c1.1), c1.2)
        .classify(|key: &u64| (key % 2) as usize)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// A check of `n` on `key` at the current reading moved forward by `dt`, made at a
    /// reading `stale` older (not before the base).
    Check {
        key: u64,
        dt: u64,
        stale: u64,
        n: u32,
    },
    /// A sweep at the current reading moved forward by `dt`.
    Sweep { dt: u64 },
}

fn op(interval: u64, warmup: u64, sweeps: bool) -> impl Strategy<Value = Op> {
    // Steps of whole intervals and warm-ups too, so that readings land on the boundaries.
    let dt = prop_oneof![
        0..interval * 3 + 2,
        (0..4u64).prop_map(move |k| k * interval),
        (0..3u64).prop_map(move |k| k * warmup),
    ];
    let stale = prop_oneof![4 => Just(0u64), 1 => 0..interval * 2 + 2];
    let check = (0..6u64, dt, stale, 0..=3u32).prop_map(|(key, dt, stale, n)| Op::Check {
        key,
        dt,
        stale,
        n,
    });
    let sweep = (0..(interval + warmup) * 3 + 2).prop_map(|dt| Op::Sweep { dt });
    let w = if sweeps { 1 } else { 0 };
    prop_oneof![20 => check, w => sweep]
}

fn config() -> impl Strategy<Value = Config> {
    let any = (1..2000u32, 1..20_000u64, 1.0..12.0f64)
        .prop_map(|(r, w, cf)| (f64::from(r) / 8.0, w * MS / 4, cf));
    prop_oneof![
        Just((2.0, 4000 * MS, 3.0)),
        Just((5.0, 4000 * MS, 10.0)),
        Just((5.0, 4000 * MS, 1.0)),
        Just((1000.0, 7 * MS, 3.0)),
        Just((f64::INFINITY, SEC, 3.0)),
        any,
    ]
}

/// Runs `ops` on both maps (even keys of quota `c0`, odd of `c1`); every answer agrees,
/// refusals' retry times included, stale readings too.
fn differential(c0: Config, c1: Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let (ours, theirs) = (two_quotas(c0, c1), keyed(c0, c1));
    let mut now = T0;
    for o in ops {
        match *o {
            Op::Check { key, dt, stale, n } => {
                now += dt;
                let t = at(now.saturating_sub(stale).max(T0));
                let (a, b) = (ours.check_n_at(&key, t, n), theirs.check_n_at(&key, t, n));
                prop_assert_eq!(a, b, "key {} n {} at {:?}", key, n, t);
            }
            Op::Sweep { dt } => {
                now += dt;
                let (a, b) = (ours.evict_idle_at(at(now)), theirs.evict_idle_at(at(now)));
                prop_assert_eq!(a, b, "sweep at {}", now);
                prop_assert_eq!(ours.len(), theirs.len());
            }
        }
    }
    Ok(())
}

/// Two configurations (the second `None`: the same as the first) and `ops` on them, paced
/// by the first; with `sweeps`, sweeps between the checks.
fn case(sweeps: bool, two: bool) -> impl Strategy<Value = (Config, Config, Vec<Op>)> {
    (config(), config()).prop_flat_map(move |(c0, c1)| {
        let c1 = if two { c1 } else { c0 };
        let interval = if c0.0.is_finite() {
            (1e9 / c0.0) as u64
        } else {
            MS
        };
        let ops = prop::collection::vec(op(interval, c0.1, sweeps), 1..300);
        (Just(c0), Just(c1), ops)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Without eviction: per key, `Keyed<u64, SmoothWarmingUp>`'s answers exactly.
    #[test]
    fn agrees_with_keyed_smooth_warming_up((c0, c1, ops) in case(false, false)) {
        differential(c0, c1, &ops)?;
    }

    /// With sweeps between the checks: both judge idleness and date revived keys alike.
    #[test]
    fn agrees_with_keyed_smooth_warming_up_across_sweeps((c0, c1, ops) in case(true, false)) {
        differential(c0, c1, &ops)?;
    }

    /// Two quotas, classified by key, with sweeps: each key answers as its own quota's
    /// limiter, and keeps its quota across an eviction.
    #[test]
    fn agrees_with_keyed_smooth_warming_up_per_quota((c0, c1, ops) in case(true, true)) {
        differential(c0, c1, &ops)?;
    }
}

/// A key cold at `j`, evicted by a sweep there and revived: a reading from before the sweep
/// (a thread that read the clock early and stalled) is refused until `j`, as the newborn's
/// `next_free` is `j`, and from `j` on the key is cold.
#[test]
fn a_stale_reading_across_a_sweep_gains_nothing() {
    let k = map(2.0, 4000, 3.0);
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 1).is_ok());
    let j = t + 10 * SEC;
    assert_eq!(k.evict_idle_at(at(j)), 1);
    assert!(!k.contains(&1));
    let d = k.check_n_at(&1, at(t + 5 * SEC), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(j)));
    assert!(k.contains(&1));
    let (waits, _) = acquires(&k, 1, j, 3);
    assert_eq!(waits, ms(&[0, 1375, 1125]));
}

/// Over random sweeps and stale readings, a key's grants keep the module docs' budget: over
/// every span `d` of readings, all but the last grant to take effect total at most
/// `d * rate` (checks here are single-threaded: the last to take effect is the last made;
/// with checks of at most 2 permits, all of them at most `2 + d * rate`).
#[test]
fn eviction_and_revival_keep_the_budget() {
    let interval = 100 * MS;
    let k = map(10.0, 300, 3.0); // I = 100 ms; cold after 300 ms of idling
    let mut x = common::rng_seed(7);
    let mut rnd = move |n: u64| common::xorshift(&mut x) % n;
    let mut now = T0;
    let mut grants: Vec<(u64, u32)> = Vec::new();
    let mut evictions = 0;
    for _ in 0..20_000 {
        now += rnd(interval);
        if rnd(50) == 0 {
            now += rnd(10 * interval);
            evictions += k.evict_idle_at(at(now));
        }
        let reading = now.saturating_sub(rnd(3) * rnd(4 * interval)).max(T0);
        let n = 1 + rnd(2) as u32;
        if k.check_n_at(&7, at(reading), n).is_ok() {
            grants.push((reading, n));
        }
    }
    assert!(evictions > 20, "only {evictions} evictions");
    grants.sort_unstable();
    // Each cost is rounded to the nanosecond: a nanosecond a grant at most.
    let excess = token_bucket_excess(&grants, 10.0, 2.0);
    assert!(excess <= 1e-4, "{excess} permits over 2 + d * rate");
}
