//! `KeyedLeakyBucket` semantics: uber-go `ratelimit` per key (spacing, slack credit after
//! idling, the n-at-once check and its retry times), per-key independence, quotas, a
//! proptest differential against `Keyed<u64, LeakyBucket>` on random (key, time, n)
//! sequences (with and without sweeps: both date and judge keys alike), and eviction plus
//! revival never granting more, a stale reading across a sweep included.
#![cfg(feature = "keyed")]

use std::collections::hash_map::RandomState;
use std::time::Duration;

use proptest::prelude::*;
use turnstile::keyed::leaky_bucket::{KeyedLeakyBucket, MAX_QUOTAS};
use turnstile::{ConfigError, Keyed, LeakyBucket, ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// The clock's reading at construction (the map's base): past every pace below.
const T0: u64 = 1_000 * SEC;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

type Map = KeyedLeakyBucket<u64, RandomState, ManualClock>;

/// `rate` per `per`, `slack`, on a manual clock at [`T0`], swept only by hand.
fn map(rate: u32, per: Duration, slack: u32) -> Map {
    KeyedLeakyBucket::builder(rate)
        .per(per)
        .slack(slack)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap()
}

#[test]
fn permits_are_spaced_per_over_rate_and_slack_banks_while_idle() {
    let k = map(10, Duration::from_secs(1), 2); // 100 ms apart, 2 of credit
    let t = T0;
    assert!(k.check_n_at(&1, at(t), 1).is_ok()); // the first take is immediate
    let d = k.check_n_at(&1, at(t), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t + 100 * MS)));
    assert!(k.check_n_at(&1, at(t + 100 * MS - 1), 1).is_err());
    assert!(k.check_n_at(&1, at(t + 100 * MS), 1).is_ok());
    // Idle for 5 s: slack + 1 = 3 immediate, then 100 ms spacing again.
    let t1 = t + 5 * SEC;
    for _ in 0..3 {
        assert!(k.check_n_at(&1, at(t1), 1).is_ok());
    }
    let d = k.check_n_at(&1, at(t1), 1).unwrap_err();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
    // Partial credit: 250 ms idle past `next` banks 1 more, not the slack.
    // 250 ms after next (t1): within M + T, so no cap; the idle time less a pace is banked.
    let t2 = t1 + 250 * MS;
    assert!(k.check_n_at(&1, at(t2), 2).is_ok());
    assert!(k.check_n_at(&1, at(t2), 1).is_err());
    // Other keys are independent.
    assert!(k.check_n_at(&2, at(t), 1).is_ok());
    assert_eq!(k.len(), 2);
}

#[test]
fn n_at_once_needs_all_n_immediate_and_says_when() {
    let k = map(10, Duration::from_secs(1), 3);
    let t = T0;
    assert!(k.check_n_at(&1, at(t), 1).is_ok());
    let t1 = t + 10 * SEC; // idle: 3 of credit
    assert!(k.check_n_at(&1, at(t1), 4).is_ok()); // slack + 1 at once
                                                  // More than slack + 1 can never pass.
    assert_eq!(
        k.check_n_at(&1, at(t1 + 100 * SEC), 5)
            .unwrap_err()
            .retry_at(),
        None
    );
    // Two now: next is t1 (the last one landed there); both immediate at t1 + 200 ms.
    let d = k.check_n_at(&1, at(t1), 2).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t1 + 200 * MS)));
    assert!(k.check_n_at(&1, at(t1 + 200 * MS - 1), 2).is_err());
    assert!(k.check_n_at(&1, at(t1 + 200 * MS), 2).is_ok());
    // Zero permits always pass, and write nothing.
    assert!(k.check_n_at(&1, at(t1), 0).is_ok());
    assert!(k.check_n_at(&1, at(t1 + 300 * MS), 1).is_ok());
}

#[test]
fn without_slack_is_strict_spacing_and_a_pace_of_zero_never_limits_forward() {
    let k = map(4, Duration::from_secs(1), 0);
    let t = T0;
    assert!(k.check_n_at(&1, at(t), 1).is_ok());
    assert!(k.check_n_at(&1, at(t + 10 * SEC), 1).is_ok());
    assert!(k.check_n_at(&1, at(t + 10 * SEC), 1).is_err()); // no credit banked
    assert_eq!(
        k.check_n_at(&1, at(t + 20 * SEC), 2)
            .unwrap_err()
            .retry_at(),
        None
    );
    // T = per / rate truncates to 0: every forward reading passes, any n.
    let z = map(1000, Duration::from_nanos(999), 0);
    for i in 0..100 {
        assert!(z.check_n_at(&1, at(T0 + i), 1000).is_ok());
    }
}

#[test]
fn a_new_keys_first_checks() {
    let k = map(10, Duration::from_secs(1), 10);
    let t = T0 + 5 * SEC;
    // Born at its first check with next = B - T: n >= 2 waits for its credit.
    let d = k.check_n_at(&1, at(t), 3).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t + 200 * MS)));
    assert!(k.check_n_at(&1, at(t + 200 * MS), 3).is_ok());
    // A stale reading after a grant is refused until the next pace.
    assert!(k.check_n_at(&2, at(t), 1).is_ok());
    let d = k.check_n_at(&2, at(t - SEC), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t + 100 * MS)));
}

#[test]
fn quotas_are_per_key_and_bounded() {
    let k = KeyedLeakyBucket::builder(1)
        .without_slack()
        .quota(10, Duration::from_secs(1), 4)
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
    assert!(k.check_n_at(&100, at(t + 10 * SEC), 5).is_ok());
    let mut b = KeyedLeakyBucket::<u8>::builder(1);
    for _ in 0..MAX_QUOTAS {
        b = b.quota(1, Duration::from_secs(1), 0);
    }
    assert_eq!(
        b.build().unwrap_err(),
        ConfigError::TooManyQuotas(MAX_QUOTAS + 1)
    );
    let b = KeyedLeakyBucket::<u8>::builder(1).quota(0, Duration::from_secs(1), 0);
    assert_eq!(b.build().unwrap_err(), ConfigError::ZeroRate);
    let b = KeyedLeakyBucket::<u8>::builder(1).per(Duration::ZERO);
    assert_eq!(b.build().unwrap_err(), ConfigError::ZeroPeriod);
}

type Theirs = Keyed<u64, LeakyBucket<ManualClock>, ManualClock>;

/// `(rate, per in ns, slack)`.
type Config = (u32, u64, u32);

/// A `Keyed<u64, LeakyBucket>` on the same clock, swept only by hand: even keys get `c0`,
/// odd ones `c1`.
fn keyed(c0: Config, c1: Config) -> Theirs {
    let clock = ManualClock::new(at(T0));
    let c = clock.clone();
    Keyed::builder(move |key: &u64| {
        let (rate, per, slack) = if key.is_multiple_of(2) { c0 } else { c1 };
        LeakyBucket::builder(rate)
            .per(Duration::from_nanos(per))
            .slack(slack)
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
    KeyedLeakyBucket::builder(c0.0)
        .per(Duration::from_nanos(c0.1))
        .slack(c0.2)
        .quota(c1.0, Duration::from_nanos(c1.1), c1.2)
        .classify(|key: &u64| (key % 2) as usize)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// A check of `n` on `key` at the current reading moved by `dt` (back if `back`).
    Check {
        key: u64,
        dt: u64,
        back: bool,
        n: u32,
    },
    /// A sweep at the current reading moved forward by `dt`.
    Sweep { dt: u64 },
}

fn op(pace: u64, slack: u32, sweeps: bool) -> impl Strategy<Value = Op> {
    let check = (
        0..6u64,
        0..pace * 3 + 2,
        prop::bool::weighted(0.2),
        0..slack + 3,
    )
        .prop_map(|(key, dt, back, n)| Op::Check { key, dt, back, n });
    let sweep = (0..pace * (u64::from(slack) + 2) * 2 + 2).prop_map(|dt| Op::Sweep { dt });
    let w = if sweeps { 1 } else { 0 };
    prop_oneof![20 => check, w => sweep]
}

fn config() -> impl Strategy<Value = Config> {
    prop_oneof![
        Just((10, SEC, 10)),
        Just((3, SEC, 2)),
        Just((7, 60 * SEC, 1)),
        Just((4, SEC, 0)),
        (1..1000u32, 1..10 * SEC, 0..6u32),
        (1000..5000u32, 1..5000u64, 0..3u32), // T of 0..=4 ns
    ]
}

/// Runs `ops` on both maps (even keys of quota `c0`, odd of `c1`); every answer agrees,
/// refusals' retry times included.
fn differential(c0: Config, c1: Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let (ours, theirs) = (two_quotas(c0, c1), keyed(c0, c1));
    let mut now = T0;
    for o in ops {
        match *o {
            Op::Check { key, dt, back, n } => {
                now = if back {
                    now.saturating_sub(dt).max(T0)
                } else {
                    now + dt
                };
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
        let pace = (c0.1 / u64::from(c0.0)).max(1);
        let ops = prop::collection::vec(op(pace, c0.2, sweeps), 1..300);
        (Just(c0), Just(c1), ops)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Without eviction: per key, `Keyed<u64, LeakyBucket>`'s answers exactly.
    #[test]
    fn agrees_with_keyed_leaky_buckets((c0, c1, ops) in case(false, false)) {
        differential(c0, c1, &ops)?;
    }

    /// With sweeps between the checks: both judge idleness and date revived keys alike.
    #[test]
    fn agrees_with_keyed_leaky_buckets_across_sweeps((c0, c1, ops) in case(true, false)) {
        differential(c0, c1, &ops)?;
    }

    /// Two quotas, classified by key, with sweeps: each key answers as its own quota's
    /// bucket, and keeps its quota across an eviction.
    #[test]
    fn agrees_with_keyed_leaky_buckets_per_quota((c0, c1, ops) in case(true, true)) {
        differential(c0, c1, &ops)?;
    }
}

/// A key spent at `t`, evicted by a sweep long after and revived: a reading from before the
/// sweep (a thread that read the clock at `t` and stalled) gets nothing more than the
/// evicted bucket would have given it, and the revived key starts with no credit.
#[test]
fn a_stale_reading_across_a_sweep_gains_nothing() {
    let k = map(10, Duration::from_secs(1), 3);
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 1).is_ok()); // next = t
    assert!(k.check_n_at(&1, at(t), 1).is_err());
    // Idle once more than 400 ms past next: a sweep at t + 10 s evicts it.
    let j = t + 10 * SEC;
    assert_eq!(k.evict_idle_at(at(j)), 1);
    assert!(!k.contains(&1));
    // The stale reading at t: refused (the newborn's next is j - T), as the evicted state did.
    let d = k.check_n_at(&1, at(t), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(j)));
    assert!(k.contains(&1));
    // From j on: one at once, then spacing (the evicted bucket would have had 3 of credit).
    assert!(k.check_n_at(&1, at(j), 1).is_ok());
    assert!(k.check_n_at(&1, at(j), 1).is_err());
    assert!(k.check_n_at(&1, at(j + 100 * MS), 1).is_ok());
}

/// Over random sweeps and stale readings, a key's grants obey upstream's bound
/// `slack + 1 + d / T` over every span of readings, as one bucket's would.
#[test]
fn eviction_and_revival_keep_the_bound() {
    let (rate, slack) = (10u32, 2u32);
    let pace = SEC / u64::from(rate);
    let k = map(rate, Duration::from_secs(1), slack);
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let mut now = T0;
    let mut grants: Vec<u64> = Vec::new();
    let mut evictions = 0;
    for _ in 0..20_000 {
        now += rnd(pace);
        if rnd(50) == 0 {
            now += rnd(5 * pace * u64::from(slack + 1));
            evictions += k.evict_idle_at(at(now));
        }
        let reading = now.saturating_sub(rnd(3) * rnd(4 * pace)).max(T0);
        let n = 1 + rnd(2) as u32;
        if k.check_n_at(&7, at(reading), n).is_ok() {
            grants.extend(std::iter::repeat_n(reading, n as usize));
        }
    }
    assert!(evictions > 20, "only {evictions} evictions");
    grants.sort_unstable();
    for (i, &a) in grants.iter().enumerate() {
        for (j, &b) in grants.iter().enumerate().skip(i) {
            if b - a > 4 * pace {
                break;
            }
            let allowed = u64::from(slack) + 1 + (b - a) / pace;
            assert!(
                (j - i + 1) as u64 <= allowed,
                "{} grants in [{a}, {b}]",
                j - i + 1
            );
        }
    }
}

/// The one place the map and `Keyed<u64, LeakyBucket>` part (module docs, "Deviations"): a
/// key born at a clock reading below one pace. `Keyed` leaves its bucket unset there
/// (upstream's "first take": `n >= 2` never passes before a first permit); this map dates it
/// `B - T` as every other birth, so the same check waits for its credit instead.
#[test]
fn a_birth_below_one_pace_is_dated_unlike_keyed() {
    let ours: Map = KeyedLeakyBucket::builder(10)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let clock = ManualClock::default();
    let c = clock.clone();
    let theirs =
        Keyed::builder(move |_: &u64| LeakyBucket::builder(10).clock(c.clone()).build().unwrap())
            .sweep_every(Duration::MAX)
            .clock(clock)
            .build()
            .unwrap();
    let b = at(50 * MS); // below T = 100 ms
    assert_eq!(theirs.check_n_at(&1, b, 2).unwrap_err().retry_at(), None);
    assert_eq!(
        ours.check_n_at(&1, b, 2).unwrap_err().retry_at(),
        Some(at(150 * MS))
    );
    assert!(ours.check_n_at(&1, at(150 * MS), 2).is_ok());
    // One permit at the birth: the same answer from both.
    assert_eq!(ours.check_n_at(&2, b, 1), theirs.check_n_at(&2, b, 1));
}
