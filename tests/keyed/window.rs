//! `KeyedWindow` semantics: go-zero `PeriodLimit` per key (windows from a key's first
//! request or aligned on UTC boundaries, all-or-nothing checks and their retry times, the
//! status a response header carries), per-key independence, quotas, a proptest differential
//! against `Keyed<u64, FixedWindow>` on random (key, time, n) sequences on the tick grid
//! (with and without sweeps: both date and judge keys alike), off the grid windows that end
//! at most a tick late, and eviction plus revival never granting more, a stale reading
//! across a sweep included.
#![cfg(feature = "keyed")]

use std::collections::hash_map::RandomState;
use std::time::Duration;

use proptest::prelude::*;
use turnstile::keyed::fixed_window::{KeyedWindow, MAX_QUOTAS};
use turnstile::{ConfigError, FixedWindow, Keyed, ManualClock, Nanos, QuotaStatus};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// The clock's reading at construction (the map's base): on every tick grid below.
const T0: u64 = 1_000 * SEC;
/// A grid every tick below divides: quotas under 1024 with periods of days at most tick in
/// at most 512 ns.
const GRID: u64 = 512;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

type Map = KeyedWindow<u64, RandomState, ManualClock>;

/// `quota` per `period`, windows from each key's first request, on a manual clock at
/// [`T0`], swept only by hand.
fn map(quota: u32, period: Duration) -> Map {
    KeyedWindow::builder(quota, period)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap()
}

#[test]
fn a_window_opens_at_a_keys_first_request_and_lasts_a_period() {
    let k = map(3, Duration::from_secs(1));
    let t = T0 + 250 * MS;
    assert!(k.check_n_at(&1, at(t), 2).is_ok());
    assert!(k.check_n_at(&1, at(t + 500 * MS), 1).is_ok()); // the 3rd of 3: HitQuota
    assert_eq!(k.status_at(&1, at(t + 500 * MS)).remaining, 0);
    let d = k.check_n_at(&1, at(t + 600 * MS), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(t + SEC)));
    assert!(k.check_n_at(&1, at(t + SEC - 1), 1).is_err());
    // A new window at the end of the last one, opened by the request there.
    assert!(k.check_n_at(&1, at(t + SEC), 3).is_ok());
    assert_eq!(k.status_at(&1, at(t + SEC)).resets_at, at(t + 2 * SEC));
    // Other keys are independent.
    assert!(k.check_n_at(&2, at(t + 600 * MS), 3).is_ok());
    assert_eq!(k.len(), 2);
}

#[test]
fn checks_are_all_or_nothing_and_zero_always_passes() {
    let k = map(5, Duration::from_secs(60));
    assert!(k.check_n_at(&1, at(T0), 3).is_ok());
    assert!(k.check_n_at(&1, at(T0), 3).is_err()); // 2 left: nothing counted
    assert!(k.check_n_at(&1, at(T0), 2).is_ok());
    assert_eq!(k.check_n_at(&1, at(T0), 6).unwrap_err().retry_at(), None);
    assert!(k.check_n_at(&1, at(T0), 0).is_ok());
    assert!(k.check_n_at(&3, at(T0), 0).is_ok());
    // A stale reading counts in the current window, as FixedWindow's.
    assert!(k.check_n_at(&2, at(T0 + SEC), 5).is_ok());
    let d = k.check_n_at(&2, at(T0), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(T0 + 61 * SEC)));
}

#[test]
fn aligned_windows_end_on_utc_boundaries() {
    // Daily windows in UTC+8, the clock reading 0 at 2024-01-01 00:00 UTC (08:00 in UTC+8).
    let k: Map = KeyedWindow::builder(2, Duration::from_secs(86_400))
        .align(8 * 3600)
        .unix_origin(Duration::from_secs(1_704_067_200))
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let t = 3600 * SEC; // 09:00 in UTC+8: the window ends 15 h later
    assert!(k.check_n_at(&1, at(t), 2).is_ok());
    let d = k.check_n_at(&1, at(t), 1).unwrap_err();
    assert_eq!(d.retry_after(), Some(Duration::from_secs(15 * 3600)));
    let midnight = 16 * 3600 * SEC;
    assert!(k.check_n_at(&1, at(midnight - 1), 1).is_err());
    assert!(k.check_n_at(&1, at(midnight), 2).is_ok());
    assert_eq!(
        k.quota_at(&1, at(midnight)).unwrap(),
        QuotaStatus {
            quota: 2,
            window: Duration::from_secs(86_400),
            remaining: 0,
            reset: Duration::from_secs(86_400),
        }
    );
    // A key with no window: the whole quota, resetting where a request would end it.
    let s = k.status_at(&9, at(midnight + 3600 * SEC));
    assert_eq!((s.remaining, s.resets_at), (2, at(midnight + 86_400 * SEC)));
}

#[test]
fn quotas_are_per_key_and_bounded() {
    let k = KeyedWindow::builder(1, Duration::from_secs(1))
        .quota(10, Duration::from_secs(60))
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
    assert!(k.check_n_at(&100, at(t), 10).is_ok());
    assert_eq!(
        k.check_n_at(&100, at(t), 1).unwrap_err().retry_at(),
        Some(at(t + 60 * SEC))
    );
    assert_eq!(k.status_at(&200, at(t)).quota, 10); // an absent key: its quota's status
    let mut b = KeyedWindow::<u8>::builder(1, Duration::from_secs(1));
    for _ in 0..MAX_QUOTAS {
        b = b.quota(1, Duration::from_secs(1));
    }
    assert_eq!(
        b.build().unwrap_err(),
        ConfigError::TooManyQuotas(MAX_QUOTAS + 1)
    );
    let one = Duration::from_secs(1);
    let bad = |b: turnstile::keyed::InlineMapBuilder<
        u8,
        turnstile::keyed::fixed_window::FixedWindowQuota,
    >| { b.build().unwrap_err() };
    assert_eq!(
        bad(KeyedWindow::builder(1, one).quota(0, one)),
        ConfigError::ZeroQuota
    );
    assert_eq!(
        bad(KeyedWindow::builder(1, Duration::ZERO)),
        ConfigError::ZeroPeriod
    );
    assert_eq!(
        bad(KeyedWindow::builder(1, one).align(-86_400)),
        ConfigError::InvalidUtcOffset(-86_400)
    );
    // 2^31 and more count in 32 bits: ticks of 2^31 ns, periods from 2^39 ns (~550 s).
    assert_eq!(
        bad(KeyedWindow::builder(u32::MAX, Duration::from_secs(60))),
        ConfigError::WindowTooShort {
            period: Duration::from_secs(60),
            min: Duration::from_nanos(1 << 39)
        }
    );
    assert!(
        KeyedWindow::<u8>::builder(u32::MAX, Duration::from_secs(600))
            .build()
            .is_ok()
    );
}

/// Off the tick grid a window ends on the next tick: a quota of 1000 ticks in 512 ns.
#[test]
fn off_the_grid_a_window_ends_at_most_a_tick_late() {
    let k = map(1000, Duration::from_nanos(SEC + 1));
    let t = T0 + 3; // opens a window that ends at t + 1 s + 1 ns, rounded up to T0 + 1 s + 512
    assert!(k.check_n_at(&1, at(t), 1000).is_ok());
    let d = k.check_n_at(&1, at(t), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(T0 + SEC + GRID)));
    assert!(k.check_n_at(&1, at(T0 + SEC + GRID - 1), 1).is_err());
    assert!(k.check_n_at(&1, at(T0 + SEC + GRID), 1).is_ok());
}

type Theirs = Keyed<u64, FixedWindow<ManualClock>, ManualClock>;

/// `(quota, period in ns, aligned)`.
type Config = (u32, u64, bool);

/// The unix origin of the aligned windows: on the grid, off every boundary.
const ORIGIN: Duration = Duration::from_nanos(1_704_067_200 * SEC + 777 * GRID);
/// Their offset from UTC.
const OFFSET: i64 = -5 * 3600;

/// A `Keyed<u64, FixedWindow>` on the same clock, swept only by hand: even keys get `c0`, odd
/// ones `c1`.
fn keyed(c0: Config, c1: Config) -> Theirs {
    let clock = ManualClock::new(at(T0));
    let c = clock.clone();
    Keyed::builder(move |key: &u64| {
        let (quota, period, aligned) = if key.is_multiple_of(2) { c0 } else { c1 };
        let mut b = FixedWindow::builder(quota, Duration::from_nanos(period)).unix_origin(ORIGIN);
        if aligned {
            b = b.align(OFFSET);
        }
        b.clock(c.clone()).build().unwrap()
    })
    .sweep_every(Duration::MAX)
    .clock(clock)
    .build()
    .unwrap()
}

/// The map with the same two quotas, picked alike (the map aligns all its quotas or none:
/// `c1` takes `c0`'s alignment).
fn two_quotas(c0: Config, c1: Config) -> Map {
    let mut b = KeyedWindow::builder(c0.0, Duration::from_nanos(c0.1))
        .quota(c1.0, Duration::from_nanos(c1.1))
        .classify(|key: &u64| (key % 2) as usize)
        .unix_origin(ORIGIN)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)));
    if c0.2 {
        b = b.align(OFFSET);
    }
    b.build().unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// A check of `n` on `key` at the current reading moved by `dt` grid steps (back if
    /// `back`).
    Check {
        key: u64,
        dt: u64,
        back: bool,
        n: u32,
    },
    /// A sweep at the current reading moved forward by `dt` grid steps.
    Sweep { dt: u64 },
}

fn op(period: u64, quota: u32, sweeps: bool) -> impl Strategy<Value = Op> {
    let steps = period / GRID;
    let check = (
        0..6u64,
        prop_oneof![0..steps / u64::from(quota) + 2, 0..steps * 2 + 2],
        prop::bool::weighted(0.2),
        0..quota + 2,
    )
        .prop_map(|(key, dt, back, n)| Op::Check { key, dt, back, n });
    let sweep = (0..steps * 3 + 2).prop_map(|dt| Op::Sweep { dt });
    let w = if sweeps { 1 } else { 0 };
    prop_oneof![20 => check, w => sweep]
}

fn config() -> impl Strategy<Value = Config> {
    let aligned = prop::bool::ANY;
    prop_oneof![
        (Just(3), Just(SEC), aligned),
        (Just(1), Just(60 * SEC), aligned),
        (Just(1000), Just(SEC), aligned),
        (
            1..1024u32,
            (1..20_000u64).prop_map(|p| p * 256 * GRID),
            aligned
        ),
    ]
}

/// Runs `ops` on both maps (even keys of quota `c0`, odd of `c1`); every answer agrees,
/// refusals' retry times included, and so does every status.
fn differential(c0: Config, c1: Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let c1 = (c1.0, c1.1, c0.2);
    let (ours, theirs) = (two_quotas(c0, c1), keyed(c0, c1));
    let mut now = T0;
    for o in ops {
        match *o {
            Op::Check { key, dt, back, n } => {
                now = if back {
                    now.saturating_sub(dt * GRID).max(T0)
                } else {
                    now + dt * GRID
                };
                let (a, b) = (
                    ours.check_n_at(&key, at(now), n),
                    theirs.check_n_at(&key, at(now), n),
                );
                prop_assert_eq!(a, b, "key {} n {} at {}", key, n, now);
                prop_assert_eq!(
                    ours.quota_at(&key, at(now)),
                    theirs.quota_at(&key, at(now)),
                    "status of {} at {}",
                    key,
                    now
                );
            }
            Op::Sweep { dt } => {
                now += dt * GRID;
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
        let ops = prop::collection::vec(op(c0.1, c0.0, sweeps), 1..300);
        (Just(c0), Just(c1), ops)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Without eviction: per key, `Keyed<u64, FixedWindow>`'s answers exactly.
    #[test]
    fn agrees_with_keyed_fixed_windows((c0, c1, ops) in case(false, false)) {
        differential(c0, c1, &ops)?;
    }

    /// With sweeps between the checks: both judge idleness and date revived keys alike.
    #[test]
    fn agrees_with_keyed_fixed_windows_across_sweeps((c0, c1, ops) in case(true, false)) {
        differential(c0, c1, &ops)?;
    }

    /// Two quotas, classified by key, with sweeps: each key answers as its own quota's
    /// window, and keeps its quota across an eviction.
    #[test]
    fn agrees_with_keyed_fixed_windows_per_quota((c0, c1, ops) in case(true, true)) {
        differential(c0, c1, &ops)?;
    }
}

/// A key spent at `t`, evicted by a sweep after its window ended and revived: a reading from
/// before the sweep (a thread that read the clock in the spent window and stalled) gets
/// nothing: counted in a fresh window it would be a second quota in that window.
#[test]
fn a_stale_reading_across_a_sweep_gains_nothing() {
    let k = map(2, Duration::from_secs(1));
    let t = T0 + SEC;
    assert!(k.check_n_at(&1, at(t), 2).is_ok()); // the window [t, t + 1 s), spent
    let j = t + SEC + 100 * MS;
    assert_eq!(k.evict_idle_at(at(j)), 1);
    assert!(!k.contains(&1));
    // The stale reading in the spent window: refused until the sweep's time.
    let d = k.check_n_at(&1, at(t + 500 * MS), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(j)));
    assert!(k.contains(&1));
    // From j on, a new window as on a fresh limiter.
    assert!(k.check_n_at(&1, at(j), 2).is_ok());
    assert!(k.check_n_at(&1, at(j), 1).is_err());
}
