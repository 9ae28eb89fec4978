//! `KeyedLeakyMeter` semantics: the water-level meter per key (empty at first, filled to the
//! brim, refused until enough water leaks, with the exact retry time), a request larger than
//! the capacity never fitting under any leak (`Limit::INF` included, where a token bucket
//! grants it), typed errors for bad configurations, eviction of drained keys only, and a
//! proptest differential against `Keyed<u64, LeakyMeter>` on random (key, time, n)
//! sequences, with two quotas and sweeps.
#![cfg(feature = "keyed")]

use crate::common;

use std::time::Duration;

use proptest::prelude::*;
use turnstile::keyed::leaky_meter::{KeyedLeakyMeter, MAX_QUOTAS};
use turnstile::{ConfigError, Keyed, LeakyMeter, Limit, ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

fn per_second(l: f64) -> Limit {
    Limit::per_second(l).unwrap()
}

type Map = KeyedLeakyMeter<u64, std::collections::hash_map::RandomState, ManualClock>;

/// `capacity` units leaking at `leak`, on a manual clock at 0 (the base), swept by hand.
fn map(capacity: u32, leak: Limit) -> Map {
    KeyedLeakyMeter::builder(capacity, leak)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap()
}

#[test]
fn fills_to_the_brim_then_refuses_until_the_water_leaks() {
    // go-zero's article's bucket: 4 units, leaking 2 a second.
    let k = map(4, per_second(2.0));
    assert_eq!(k.level_at(&1, at(0)), 0.0);
    assert!(k.check_n_at(&1, at(0), 3).is_ok());
    assert!(k.check_n_at(&1, at(0), 1).is_ok()); // to the brim exactly
    assert_eq!(k.level_at(&1, at(0)), 4.0);
    let d = k.check_n_at(&1, at(100 * MS), 2).unwrap_err();
    // Two units must leak: 1 s after the last addition.
    assert_eq!(d.retry_at(), Some(at(SEC)));
    assert!(k.check_n_at(&1, at(SEC - 1), 2).is_err());
    assert!(k.check_n_at(&1, at(SEC), 2).is_ok());
    assert_eq!(k.level_at(&1, at(SEC)), 4.0);
    assert_eq!(k.level_at(&1, at(SEC + 750 * MS)), 2.5);
    assert_eq!(k.level_at(&1, at(10 * SEC)), 0.0);
    // A reading older than the last addition counts all the water, capped at the capacity.
    assert_eq!(k.level_at(&1, at(0)), 4.0);
    // Another key has its own bucket.
    assert!(k.check_n_at(&2, at(SEC), 4).is_ok());
}

#[test]
fn more_than_the_capacity_never_fits_under_any_leak() {
    for leak in [Limit::INF, Limit::ZERO, per_second(1.0), per_second(1e9)] {
        let k = map(3, leak);
        let d = k.check_n_at(&1, at(SEC), 4).unwrap_err();
        assert_eq!(d.retry_at(), None, "leak {leak:?}");
        assert!(k.check_n_at(&1, at(SEC), 3).is_ok(), "leak {leak:?}");
    }
    // An infinite leak never fills: every request up to the capacity fits.
    let k = map(3, Limit::INF);
    for _ in 0..100 {
        assert!(k.check_n_at(&1, at(0), 3).is_ok());
    }
    assert_eq!(k.level_at(&1, at(0)), 0.0);
    // A zero leak never drains.
    let k = map(2, Limit::ZERO);
    assert!(k.check_n_at(&1, at(0), 2).is_ok());
    assert_eq!(
        k.check_n_at(&1, Nanos::MAX, 1).unwrap_err().retry_at(),
        None
    );
}

#[test]
fn bad_configurations_are_typed_errors() {
    assert_eq!(
        KeyedLeakyMeter::<u64>::new(0, per_second(1.0)).unwrap_err(),
        ConfigError::ZeroCapacity
    );
    let b = KeyedLeakyMeter::<u64>::builder(1, Limit::INF).quota(0, Limit::INF);
    assert_eq!(b.build().unwrap_err(), ConfigError::ZeroCapacity);
    let b = KeyedLeakyMeter::<u64>::builder(1, Limit::INF).max_keys(0);
    assert_eq!(b.build().unwrap_err(), ConfigError::ZeroMaxKeys);
    let mut b = KeyedLeakyMeter::<u64>::builder(1, Limit::INF);
    for _ in 0..MAX_QUOTAS {
        b = b.quota(1, Limit::INF);
    }
    assert_eq!(
        b.build().unwrap_err(),
        ConfigError::TooManyQuotas(MAX_QUOTAS + 1)
    );
}

#[test]
fn extreme_times_and_sizes_neither_panic_nor_overfill() {
    let k = map(2, per_second(10.0));
    for t in common::extreme_times() {
        for n in [0, 1, 2, 3, u32::MAX] {
            let _ = k.check_n_at(&1, t, n);
        }
        let level = k.level_at(&1, t);
        assert!((0.0..=2.0).contains(&level), "{level} at {t:?}");
        let _ = k.evict_idle_at(t);
    }
    // Past the map's range time stands still: a key fills up once, then nothing more fits.
    let k = map(2, per_second(10.0));
    assert!(k.check_n_at(&1, Nanos::MAX, 2).is_ok());
    assert!(k.check_n_at(&1, Nanos::MAX, 1).is_err());
}

#[test]
fn only_drained_keys_are_evicted_and_they_come_back_empty() {
    let k = map(2, per_second(2.0));
    assert!(k.check_n_at(&1, at(0), 2).is_ok());
    assert!(k.check_n_at(&2, at(400 * MS), 1).is_ok());
    // At 900 ms key 1 still holds 0.2 units, key 2 0.0 (drained at 900 ms).
    assert_eq!(k.evict_idle_at(at(900 * MS)), 1);
    assert!(k.contains(&1) && !k.contains(&2));
    assert_eq!(k.evict_idle_at(at(SEC)), 1);
    assert_eq!(k.len(), 0);
    // A stale reading from before the sweep finds the newborn's water: nothing gained.
    assert!(k.check_n_at(&1, at(0), 2).is_err());
    assert!(k.check_n_at(&1, at(SEC), 2).is_ok());
}

// ---- differential ------------------------------------------------------------------------

/// `(capacity, leak)`.
type Config = (u32, Limit);

/// `Keyed<u64, LeakyMeter>` on a manual clock at 0, swept by hand: even keys get `c0`,
/// odd ones `c1`.
fn keyed(c0: Config, c1: Config) -> Keyed<u64, LeakyMeter<ManualClock>, ManualClock> {
    let clock = ManualClock::default();
    let c = clock.clone();
    Keyed::builder(move |key: &u64| {
        let (capacity, leak) = if key.is_multiple_of(2) { c0 } else { c1 };
        LeakyMeter::builder(capacity, leak)
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
    KeyedLeakyMeter::builder(c0.0, c0.1)
        .quota(c1.0, c1.1)
        .classify(|key: &u64| (key % 2) as usize)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap()
}

/// Leaks whose interval is a whole number of nanoseconds (where both sides are exact), and
/// the two unbounded ones.
fn config() -> impl Strategy<Value = Config> {
    let leak = prop_oneof![
        prop::sample::select(vec![1u64, 3, 1000, 7 * MS, 100 * MS, 250 * MS])
            .prop_map(|t_ns| per_second(SEC as f64 / t_ns as f64)),
        Just(Limit::INF),
        Just(Limit::ZERO),
    ];
    (1u32..5, leak)
}

#[derive(Debug, Clone)]
enum Op {
    Check { key: u64, dt: u64, n: u32 },
    Sweep { dt: u64 },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    // Steps of a millisecond's fractions and of whole leak intervals hit the boundaries.
    let dt = prop_oneof![0..400u64, (0..40u64).prop_map(|k| k * 25 * MS), Just(0)];
    let check = (0..6u64, dt.clone(), 0..=5u32).prop_map(|(key, dt, n)| Op::Check { key, dt, n });
    let sweep = dt.prop_map(|dt| Op::Sweep { dt });
    prop::collection::vec(prop_oneof![12 => check, 1 => sweep], 1..200)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Per key, `Keyed<u64, LeakyMeter>`'s answers exactly, retry times included, with
    /// sweeps between the checks (both evict drained keys only, and both date a revived
    /// key at the sweep).
    #[test]
    fn agrees_with_keyed_leaky_meters(c0 in config(), c1 in config(), ops in ops()) {
        let (ours, theirs) = (two_quotas(c0, c1), keyed(c0, c1));
        let mut now = 0u64;
        for o in ops {
            match o {
                Op::Check { key, dt, n } => {
                    now += dt;
                    let (a, b) = (
                        ours.check_n_at(&key, at(now), n),
                        theirs.check_n_at(&key, at(now), n),
                    );
                    prop_assert_eq!(a, b, "key {} n {} at {}", key, n, now);
                }
                Op::Sweep { dt } => {
                    now += dt;
                    let (a, b) = (ours.evict_idle_at(at(now)), theirs.evict_idle_at(at(now)));
                    prop_assert_eq!(a, b, "sweep at {}", now);
                    prop_assert_eq!(ours.len(), theirs.len());
                }
            }
        }
    }
}
