//! `KeyedSmoothBursty` semantics: Guava's `SmoothBursty` per key (pay later, the store
//! banked while idle and spent first at no cost, retry times when the debt clears), per-key
//! independence, quotas, bad input, a proptest differential against
//! `Keyed<u64, SmoothBursty>` on random (key, time, n) sequences (with and without sweeps:
//! both date and judge keys alike), and eviction plus revival never granting more, stale
//! readings included (where the map deviates from `SmoothBursty`, within the stated budget).
#![cfg(feature = "keyed")]

use crate::common;

use std::collections::hash_map::RandomState;
use std::time::Duration;

use proptest::prelude::*;
use turnstile::keyed::smooth_bursty::{KeyedSmoothBursty, MAX_QUOTAS};
use turnstile::{ConfigError, Keyed, ManualClock, Nanos, SmoothBursty};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// The clock's reading at construction (the map's base).
const T0: u64 = 1_000 * SEC;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

type Map = KeyedSmoothBursty<u64, RandomState, ManualClock>;

/// `rate` per second storing `b` seconds of permits, on a manual clock at [`T0`], swept only
/// by hand.
fn map(rate: f64, b: f64) -> Map {
    KeyedSmoothBursty::builder(rate)
        .max_burst_seconds(b)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap()
}

/// Guava's `RateLimiter.create(2.0)`: 500 ms apart, two stored at most.
#[test]
fn guava_bursty_vectors() {
    let k = map(2.0, 1.0);
    let t = T0 + SEC;
    // A new key: nothing stored, no debt; the first permit is granted at once.
    assert!(k.check_n_at(&1, at(t), 1).is_ok());
    let d = k.check_n_at(&1, at(t), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t + 500 * MS)));
    assert!(k.check_n_at(&1, at(t + 500 * MS - 1), 1).is_err());
    assert!(k.check_n_at(&1, at(t + 500 * MS), 1).is_ok());
    // Idle for 10 s: two stored (max_permits), spent first at no cost, then a third on
    // credit; the fourth waits for that credit's 500 ms.
    let t1 = t + 10 * SEC;
    for _ in 0..3 {
        assert!(k.check_n_at(&1, at(t1), 1).is_ok());
    }
    let d = k.check_n_at(&1, at(t1), 1).unwrap_err();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
    // Pay later: after idling, 5 at once (2 stored, 3 fresh) leave 1.5 s of debt.
    let t2 = t1 + 10 * SEC;
    assert!(k.check_n_at(&1, at(t2), 5).is_ok());
    let d = k.check_n_at(&1, at(t2), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t2 + 1500 * MS)));
    // A partial store: the debt clears at t3, 750 ms later 1.5 are stored; 2 spend them and
    // half a fresh one (250 ms).
    let t3 = t2 + 1500 * MS;
    let t4 = t3 + 750 * MS;
    assert!(k.check_n_at(&1, at(t4), 2).is_ok());
    let d = k.check_n_at(&1, at(t4), 0).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t4 + 250 * MS)));
    // Other keys are independent.
    assert!(k.check_n_at(&2, at(t), 1).is_ok());
    assert_eq!(k.len(), 2);
}

#[test]
fn zero_permits_pass_iff_no_debt_and_take_nothing() {
    let k = map(10.0, 1.0);
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 0).is_ok()); // inserted, nothing taken
    assert!(k.check_n_at(&1, at(t), 0).is_ok());
    assert!(k.check_n_at(&1, at(t), 3).is_ok()); // 300 ms of debt
    let d = k.check_n_at(&1, at(t + 100 * MS), 0).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t + 300 * MS)));
    assert!(k.check_n_at(&1, at(t + 300 * MS), 0).is_ok());
    assert!(k.check_n_at(&1, at(t + 300 * MS), 1).is_ok());
}

#[test]
fn a_zero_burst_stores_nothing_and_an_infinite_rate_never_limits() {
    let k = map(10.0, 0.0);
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 1).is_ok());
    let t1 = t + 60 * SEC;
    assert!(k.check_n_at(&1, at(t1), 1).is_ok());
    let d = k.check_n_at(&1, at(t1), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t1 + 100 * MS)));
    let inf = map(f64::INFINITY, 1.0);
    for i in 0..100 {
        assert!(inf.check_n_at(&1, at(T0 + i), u32::MAX).is_ok());
    }
    assert_eq!(inf.evict_idle_at(at(T0)), 1);
}

#[test]
fn quotas_are_per_key_and_bounded() {
    let k = KeyedSmoothBursty::builder(1.0)
        .quota(10.0, 0.4)
        .classify(|key: &u64| usize::from(*key >= 100))
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap();
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 1).is_ok());
    assert_eq!(
        k.check_n_at(&1, at(t), 1).unwrap_err().retry_at(),
        Some(at(t + SEC))
    );
    assert!(k.check_n_at(&100, at(t), 1).is_ok());
    assert_eq!(
        k.check_n_at(&100, at(t), 1).unwrap_err().retry_at(),
        Some(at(t + 100 * MS))
    );
    // Quota 1 stores 4: after idling, 5 single permits at once.
    let t1 = t + 10 * SEC;
    for _ in 0..5 {
        assert!(k.check_n_at(&100, at(t1), 1).is_ok());
    }
    assert!(k.check_n_at(&100, at(t1), 1).is_err());
    let mut b = KeyedSmoothBursty::<u8>::builder(1.0);
    for _ in 0..MAX_QUOTAS {
        b = b.quota(1.0, 1.0);
    }
    assert_eq!(
        b.build().unwrap_err(),
        ConfigError::TooManyQuotas(MAX_QUOTAS + 1)
    );
}

/// Every invalid configuration is a typed error, whichever quota it is in; nothing panics.
#[test]
fn bad_configurations_are_typed_errors() {
    let build = |rate: f64, b: f64| {
        KeyedSmoothBursty::<u8>::builder(rate)
            .max_burst_seconds(b)
            .build()
    };
    let quota1 = |rate: f64, b: f64| KeyedSmoothBursty::<u8>::builder(1.0).quota(rate, b).build();
    for make in [build, quota1] {
        for rate in [0.0, -0.0, -1.0, f64::NEG_INFINITY] {
            assert_eq!(
                make(rate, 1.0).unwrap_err(),
                ConfigError::RateNotPositive(rate)
            );
        }
        assert!(matches!(make(f64::NAN, 1.0), Err(ConfigError::RateNotPositive(r)) if r.is_nan()));
        let sub = f64::MIN_POSITIVE / 4.0;
        assert_eq!(
            make(sub, 1.0).unwrap_err(),
            ConfigError::SubnormalLimit(sub)
        );
        for b in [-1.0, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(
                make(1.0, b).unwrap_err(),
                ConfigError::InvalidBurstSeconds(b)
            );
        }
        assert!(
            matches!(make(1.0, f64::NAN), Err(ConfigError::InvalidBurstSeconds(b)) if b.is_nan())
        );
        // More than 2^32 - 1 max permits (twice); one interval of 3171 years; a store of
        // 200 years.
        let year = 365.25 * 86_400.0;
        for (rate, b) in [
            (1e9, 10.0),
            (1.0, 300.0 * year),
            (1e-11, 0.0),
            (0.01, 200.0 * year),
        ] {
            assert_eq!(
                make(rate, b).unwrap_err(),
                ConfigError::SmoothOutOfRange {
                    rate,
                    max_burst_seconds: b
                },
                "{rate}/s {b} s"
            );
        }
    }
    // At the edges that fit: a store of 2^32 - 1 permits, an interval of 100 years.
    assert!(build(f64::from(u32::MAX), 1.0).is_ok());
    assert!(build(1.0 / (100.0 * 365.25 * 86_400.0), 1.0).is_ok());
    assert!(build(f64::MAX, 0.0).is_ok());
    let e = KeyedSmoothBursty::<u8>::builder(1.0).max_keys(0).build();
    assert_eq!(e.unwrap_err(), ConfigError::ZeroMaxKeys);
}

/// Extreme readings and sizes: no panic, and answers that keep the budget.
#[test]
fn extreme_times_and_sizes_do_not_panic() {
    let k = map(3.0, 2.0);
    for t in common::extreme_times() {
        for n in [0, 1, 2, u32::MAX] {
            let _ = k.check_n_at(&7, t, n);
            let _ = k.check_n_at(&t.as_u64(), t, n);
        }
        let _ = k.evict_idle_at(t);
    }
    // A debt of u32::MAX permits at 1/s (136 years) runs past the range: never.
    let k = map(1.0, 1.0);
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

type Theirs = Keyed<u64, SmoothBursty<ManualClock>, ManualClock>;

/// `(rate, max_burst_seconds)`.
type Config = (f64, f64);

/// A `Keyed<u64, SmoothBursty>` on the same clock, swept only by hand: even keys get `c0`,
/// odd ones `c1`.
fn keyed(c0: Config, c1: Config) -> Theirs {
    let clock = ManualClock::new(at(T0));
    let c = clock.clone();
    Keyed::builder(move |key: &u64| {
        let (rate, b) = if key.is_multiple_of(2) { c0 } else { c1 };
        SmoothBursty::builder(rate)
            .max_burst_seconds(b)
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
    KeyedSmoothBursty::builder(c0.0)
        .max_burst_seconds(c0.1)
        .quota(c1.0, c1.1)
        .classify(|key: &u64| (key % 2) as usize)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// A check of `n` on `key` at the current reading moved forward by `dt`.
    Check { key: u64, dt: u64, n: u32 },
    /// A sweep at the current reading moved forward by `dt`.
    Sweep { dt: u64 },
}

fn op(interval: u64, store: u64, sweeps: bool) -> impl Strategy<Value = Op> {
    // Steps of whole intervals and stores too, so that readings land on the boundaries.
    let dt = prop_oneof![
        0..interval * 3 + 2,
        (0..4u64).prop_map(move |k| k * interval),
        (0..3u64).prop_map(move |k| k * store),
    ];
    let check = (0..6u64, dt, 0..=3u32).prop_map(|(key, dt, n)| Op::Check { key, dt, n });
    let sweep = (0..(interval + store) * 3 + 2).prop_map(|dt| Op::Sweep { dt });
    let w = if sweeps { 1 } else { 0 };
    prop_oneof![20 => check, w => sweep]
}

/// Configurations where both sides compute exactly: `SmoothBursty` holds its store in
/// `2^-39` fractions of `max_permits` and rounds each cost to the nanosecond, this map
/// counts whole nanoseconds when the interval is one (module docs, "Precision"). Intervals
/// and stores of powers of two nanoseconds are exact on both sides; whole-nanosecond
/// intervals with small stores are within a thousandth of a nanosecond of it there.
fn config() -> impl Strategy<Value = Config> {
    let pow2 = (10..31u32, 0..6u32).prop_map(|(k, j)| {
        let i = (1u64 << k) as f64; // ns per permit
        (1e9 / i, (1u64 << j) as f64 * i / 1e9)
    });
    prop_oneof![
        Just((2.0, 1.0)),
        Just((10.0, 0.5)),
        Just((4.0, 0.75)),
        Just((1000.0, 0.0)),
        Just((5.0, 2.0)),
        pow2,
    ]
}

/// Runs `ops` on both maps (even keys of quota `c0`, odd of `c1`) with readings that never
/// go back; every answer agrees, refusals' retry times included.
fn differential(c0: Config, c1: Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let (ours, theirs) = (two_quotas(c0, c1), keyed(c0, c1));
    let mut now = T0;
    for o in ops {
        match *o {
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
    Ok(())
}

/// Two configurations (the second `None`: the same as the first) and `ops` on them, paced
/// by the first; with `sweeps`, sweeps between the checks.
fn case(sweeps: bool, two: bool) -> impl Strategy<Value = (Config, Config, Vec<Op>)> {
    (config(), config()).prop_flat_map(move |(c0, c1)| {
        let c1 = if two { c1 } else { c0 };
        let interval = (1e9 / c0.0) as u64;
        let store = (c0.1 * 1e9) as u64;
        let ops = prop::collection::vec(op(interval, store, sweeps), 1..300);
        (Just(c0), Just(c1), ops)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Without eviction: per key, `Keyed<u64, SmoothBursty>`'s answers exactly.
    #[test]
    fn agrees_with_keyed_smooth_bursty((c0, c1, ops) in case(false, false)) {
        differential(c0, c1, &ops)?;
    }

    /// With sweeps between the checks: both judge idleness and date revived keys alike.
    #[test]
    fn agrees_with_keyed_smooth_bursty_across_sweeps((c0, c1, ops) in case(true, false)) {
        differential(c0, c1, &ops)?;
    }

    /// Two quotas, classified by key, with sweeps: each key answers as its own quota's
    /// limiter, and keeps its quota across an eviction.
    #[test]
    fn agrees_with_keyed_smooth_bursty_per_quota((c0, c1, ops) in case(true, true)) {
        differential(c0, c1, &ops)?;
    }
}

/// A key in debt at `t`, evicted by a sweep long after and revived: a reading from before
/// the sweep (a thread that read the clock at `t` and stalled) gets nothing more than the
/// evicted key would have given it, and the revived key starts with nothing stored.
#[test]
fn a_stale_reading_across_a_sweep_gains_nothing() {
    let k = map(10.0, 1.0);
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 1).is_ok()); // z = t + 100 ms
    assert!(k.check_n_at(&1, at(t), 1).is_err());
    let j = t + 10 * SEC;
    assert_eq!(k.evict_idle_at(at(j)), 1);
    assert!(!k.contains(&1));
    // The stale reading at t: refused (the newborn's debt clears at j), as the evicted
    // key refused it.
    let d = k.check_n_at(&1, at(t), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(j)));
    assert!(k.contains(&1));
    // From j on: one at once (nothing stored: the evicted key had 10), then 100 ms apart.
    assert!(k.check_n_at(&1, at(j), 1).is_ok());
    assert!(k.check_n_at(&1, at(j), 1).is_err());
    assert!(k.check_n_at(&1, at(j + 100 * MS), 1).is_ok());
}

/// The deviation (module docs): a reading older than the key's last resync is judged by
/// `z = next_free - stored * I`, so it may spend stored permits that `SmoothBursty` (whose
/// `next_free` is the resync's reading) refuses it; the map's answers stay within the
/// budget all the same.
#[test]
fn a_stale_reading_may_spend_the_store_unlike_keyed() {
    let ours = map(2.0, 1.0);
    let theirs = keyed((2.0, 1.0), (2.0, 1.0));
    let t = T0 + 10 * SEC;
    // Idle since T0: two stored. One spent at t leaves one, next_free = t.
    assert_eq!(
        ours.check_n_at(&0, at(T0), 0),
        theirs.check_n_at(&0, at(T0), 0)
    );
    assert!(ours.check_n_at(&0, at(t), 1).is_ok());
    assert!(theirs.check_n_at(&0, at(t), 1).is_ok());
    // A reading 100 ms stale: SmoothBursty owes it the 100 ms to next_free; this map spends
    // the stored permit (z = t - 500 ms).
    let stale = at(t - 100 * MS);
    assert_eq!(
        theirs.check_n_at(&0, stale, 1).unwrap_err().retry_at(),
        Some(at(t))
    );
    assert!(ours.check_n_at(&0, stale, 1).is_ok());
    // At t each gives max_permits + 1 = 3 in all (the last on credit), then refuses.
    assert!(ours.check_n_at(&0, at(t), 1).is_ok());
    assert!(theirs.check_n_at(&0, at(t), 1).is_ok());
    assert!(theirs.check_n_at(&0, at(t), 1).is_ok());
    let (a, b) = (
        ours.check_n_at(&0, at(t), 1),
        theirs.check_n_at(&0, at(t), 1),
    );
    assert_eq!(a.unwrap_err().retry_at(), Some(at(t + 500 * MS)));
    assert_eq!(b.unwrap_err().retry_at(), Some(at(t + 500 * MS)));
}

/// Over random sweeps and stale readings, a key's grants keep the module docs' budget: over
/// every span `d` of readings, all but the last grant to take effect total at most
/// `max_permits + d / I` (checks here are single-threaded: the last to take effect is the
/// last made).
#[test]
fn eviction_and_revival_keep_the_budget() {
    let (rate, b) = (10.0, 0.3); // I = 100 ms, 3 stored at most
    let interval = 100 * MS;
    let max_permits = 3u64;
    let k = map(rate, b);
    let mut x = common::rng_seed(7);
    let mut rnd = move |n: u64| common::xorshift(&mut x) % n;
    let mut now = T0;
    // (reading, n, order)
    let mut grants: Vec<(u64, u64, usize)> = Vec::new();
    let mut evictions = 0;
    for i in 0..20_000 {
        now += rnd(interval);
        if rnd(50) == 0 {
            now += rnd(5 * interval * (max_permits + 1));
            evictions += k.evict_idle_at(at(now));
        }
        let reading = now.saturating_sub(rnd(3) * rnd(4 * interval)).max(T0);
        let n = 1 + rnd(2) as u32;
        if k.check_n_at(&7, at(reading), n).is_ok() {
            grants.push((reading, u64::from(n), i));
        }
    }
    assert!(evictions > 20, "only {evictions} evictions");
    grants.sort_unstable();
    for i in 0..grants.len() {
        let (a, _, _) = grants[i];
        let (mut sum, mut last) = (0u64, (0usize, 0u64));
        for &(r, n, order) in &grants[i..] {
            if r - a > 6 * interval {
                break;
            }
            sum += n;
            if order >= last.0 {
                last = (order, n);
            }
            let allowed = max_permits + (r - a) / interval;
            assert!(
                sum - last.1 <= allowed,
                "{sum} permits in [{a}, {r}], the last to take effect {}",
                last.1
            );
        }
    }
}
