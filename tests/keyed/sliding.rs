//! `KeyedSlidingWindow` semantics: the sliding-window rules of `SlidingWindow` on one key
//! (the shared rule tests of `tests/common/sliding_rules.rs`, through an adapter), per-key
//! independence and quotas, eviction, bad input, and a proptest differential against
//! `Keyed<u64, SlidingWindow>` on random (key, time, n) sequences (with and without sweeps,
//! two quotas, the largest quotas the word holds, a base that is no window boundary):
//! decisions, retry times, statuses and evictions agree.
#![cfg(feature = "keyed")]

use std::collections::hash_map::RandomState;
use std::time::Duration;

use proptest::prelude::*;
use turnstile::keyed::sliding_window::{KeyedSlidingWindow, SlidingWindowQuota, MAX_QUOTAS};
use turnstile::keyed::InlineMapBuilder;
use turnstile::sliding_window::SlidingWindowBuilder;
use turnstile::{
    Clock, ConfigError, Denied, Keyed, Limiter, ManualClock, Nanos, QuantaClock, SlidingWindow,
    WindowStatus,
};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// The start of window 1000 (period 1 s): the clock's reading at construction.
const T0: u64 = 1_000 * SEC;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

/// Key 0 of a [`KeyedSlidingWindow`] with [`SlidingWindow`]'s methods, for the shared rule
/// tests. Idle is read from the status (`resets_at == now`: the weighted count is 0), which
/// writes nothing.
#[derive(Debug)]
pub struct OneKey<C: Clock = QuantaClock>(KeyedSlidingWindow<u64, RandomState, C>);

impl OneKey {
    pub fn new(quota: u32, period: Duration) -> Result<OneKey, ConfigError> {
        OneKey::try_from(SlidingWindow::builder(quota, period))
    }
}

/// From a sliding window's options, as the shared rules build every window: the window
/// validates them, and the map (swept only by hand) takes its quota, period and clock.
impl<C: Clock + Clone> TryFrom<SlidingWindowBuilder<C>> for OneKey<C> {
    type Error = ConfigError;

    fn try_from(options: SlidingWindowBuilder<C>) -> Result<OneKey<C>, ConfigError> {
        let w = options.build()?;
        KeyedSlidingWindow::builder(w.quota(), w.period())
            .sweep_every(Duration::MAX)
            .clock(w.clock().clone())
            .build()
            .map(OneKey)
    }
}

impl<C: Clock> OneKey<C> {
    pub fn quota(&self) -> u32 {
        self.0.status_at(&0, Nanos::ZERO).quota
    }
    pub fn period(&self) -> Duration {
        self.0.quota_at(&0, Nanos::ZERO).unwrap().window
    }
    pub fn clock(&self) -> &C {
        self.0.clock()
    }
    pub fn allow(&self) -> bool {
        self.0.check(&0).is_ok()
    }
    pub fn allow_n(&self, n: u32) -> bool {
        self.0.check_n(&0, n).is_ok()
    }
    pub fn allow_at(&self, now: Nanos) -> bool {
        self.allow_n_at(now, 1)
    }
    pub fn allow_n_at(&self, now: Nanos, n: u32) -> bool {
        self.0.check_n_at(&0, now, n).is_ok()
    }
    pub fn status(&self) -> WindowStatus {
        self.0.status(&0)
    }
    pub fn status_at(&self, now: Nanos) -> WindowStatus {
        self.0.status_at(&0, now)
    }
    pub fn is_idle_at(&self, now: Nanos) -> bool {
        self.status_at(now).resets_at == now
    }
}

impl<C: Clock> Limiter for OneKey<C> {
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.0.check_n_at(&0, now, n)
    }
    fn now(&self) -> Nanos {
        self.0.clock().now()
    }
}

#[macro_use]
#[path = "../common/sliding_rules.rs"]
mod sliding_rules;

shared_rules!(one_key, super::OneKey);

type Map = KeyedSlidingWindow<u64, RandomState, ManualClock>;

/// `quota` per `period` on a manual clock at [`T0`], swept only by hand.
fn map(quota: u32, period: Duration) -> Map {
    KeyedSlidingWindow::builder(quota, period)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap()
}

/// The header's example of `SlidingWindow` on keys of their own.
#[test]
fn keys_are_independent_sliding_windows() {
    let k = map(5, Duration::from_secs(1));
    let t0 = T0 + SEC;
    for key in 1..=3 {
        for _ in 0..5 {
            assert!(k.check_n_at(&key, at(t0), 1).is_ok());
        }
        assert!(k.check_n_at(&key, at(t0), 1).is_err());
    }
    // Half-way through the next window the 5 weigh 2.5: 2 more fit (4.5), 3 do not.
    let t1 = t0 + 1_500 * MS;
    assert!(k.check_n_at(&1, at(t1), 3).is_err());
    assert!(k.check_n_at(&1, at(t1), 2).is_ok());
    assert!(k.check_n_at(&1, at(t1), 1).is_err());
    assert_eq!(k.status_at(&2, at(t1)).remaining, 2); // untouched by key 1
    assert_eq!(k.status_at(&9, at(t1)).remaining, 5); // a new key
    assert_eq!(k.len(), 3);
}

#[test]
fn the_worst_span_of_one_period_holds_two_quotas_minus_one() {
    let (q, p) = (10u32, 1_000u64);
    let k = map(q, Duration::from_nanos(p));
    assert!(k.check_n_at(&1, at(T0 + p - 1), q).is_ok());
    let mut in_span = u64::from(q);
    for e in 0..p - 1 {
        while k.check_n_at(&1, at(T0 + p + e), 1).is_ok() {
            in_span += 1;
        }
    }
    assert_eq!(in_span, u64::from(2 * q - 1));
}

#[test]
fn quotas_are_per_key_and_bad_input_is_a_typed_error() {
    let k = KeyedSlidingWindow::builder(1, Duration::from_secs(1))
        .quota(10, Duration::from_secs(60))
        .classify(|key: &u64| usize::from(*key >= 100))
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(T0)))
        .build()
        .unwrap();
    assert!(k.check_n_at(&1, at(T0), 1).is_ok());
    // Window 1000's grant weighs fully at 1001 s, gone at 1002 s.
    let d = k.check_n_at(&1, at(T0), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(T0 + 2 * SEC)));
    assert!(k.check_n_at(&100, at(T0), 10).is_ok());
    let d = k.check_n_at(&100, at(T0), 1).unwrap_err();
    // 10 (P - e) + P <= 10 P at e = P / 10, in the next minute.
    assert_eq!(d.retry_at(), Some(at(T0 + 66 * SEC)));
    assert_eq!(k.status_at(&200, at(T0)).quota, 10); // an absent key: its quota's status

    let one = Duration::from_secs(1);
    let bad = |b: InlineMapBuilder<u8, SlidingWindowQuota>| b.build().unwrap_err();
    let mut b = KeyedSlidingWindow::builder(1, one);
    for _ in 0..MAX_QUOTAS {
        b = b.quota(1, one);
    }
    assert_eq!(bad(b), ConfigError::TooManyQuotas(MAX_QUOTAS + 1));
    assert_eq!(
        bad(KeyedSlidingWindow::builder(0, one)),
        ConfigError::ZeroQuota
    );
    assert_eq!(
        bad(KeyedSlidingWindow::builder(0, Duration::ZERO)),
        ConfigError::ZeroQuota
    );
    assert_eq!(
        bad(KeyedSlidingWindow::builder(1, one).quota(1, Duration::ZERO)),
        ConfigError::ZeroPeriod
    );
    assert_eq!(
        bad(KeyedSlidingWindow::builder(1, one).max_keys(0)),
        ConfigError::ZeroMaxKeys
    );
    // The largest quotas that keep 8.5 years of windows, and one more.
    for (period, max) in [
        (Duration::from_millis(1), 1023),
        (one, 32_767),
        (Duration::from_secs(60), 262_143),
        (Duration::MAX, (1 << 29) - 1),
    ] {
        assert!(KeyedSlidingWindow::<u8>::builder(max, period)
            .build()
            .is_ok());
        assert_eq!(
            bad(KeyedSlidingWindow::builder(1, one).quota(max + 1, period)),
            ConfigError::SlidingQuotaTooLarge {
                quota: max + 1,
                period,
                max
            }
        );
    }
    assert_eq!(
        bad(KeyedSlidingWindow::builder(u32::MAX, Duration::MAX)),
        ConfigError::SlidingQuotaTooLarge {
            quota: u32::MAX,
            period: Duration::MAX,
            max: (1 << 29) - 1
        }
    );
    let ns = Duration::from_nanos(1);
    assert_eq!(
        bad(KeyedSlidingWindow::builder(1, ns)),
        ConfigError::SlidingQuotaTooLarge {
            quota: 1,
            period: ns,
            max: 0
        }
    );
    // Extreme readings saturate: before the base, at the end of time.
    let k = map(2, one);
    assert!(k.check_n_at(&1, Nanos::ZERO, 2).is_ok()); // counts as the base
    assert!(k.check_n_at(&1, Nanos::ZERO, 1).is_err());
    assert!(k.check_n_at(&1, Nanos::MAX, 2).is_ok());
    assert_eq!(
        k.check_n_at(&1, Nanos::MAX, 1).unwrap_err().retry_at(),
        None
    );
}

/// A key is evicted once nothing weighs, born again in the sweep's window; a stale reading
/// from its spent window is then judged at the start of the newborn's window, as
/// `Keyed<u64, SlidingWindow>` judges it (module docs: the budget, in judged times, is
/// what holds across an eviction).
#[test]
fn eviction_and_a_stale_reading_across_it_as_keyed_sliding_windows() {
    let c = (2, SEC);
    let (k, theirs) = (two_quotas(c, c), keyed(c, c));
    let t = BASE + 500 * MS;
    for n in [2, 1] {
        assert_eq!(
            k.check_n_at(&1, at(t), n).map_err(|d| d.retry_at()),
            shifted(theirs.check_n_at(&1, at(t - BASE), n))
        );
    }
    assert_eq!(k.evict_idle_at(at(BASE + 2 * SEC - 1)), 0); // the 2 still weigh
    assert_eq!(k.evict_idle_at(at(BASE + 2 * SEC)), 1);
    assert_eq!(theirs.evict_idle_at(at(2 * SEC)), 1);
    assert!(!k.contains(&1));
    // The stale reading from window 0, which the evicted word would refuse: judged at the
    // start of window 2, by both.
    assert!(k.check_n_at(&1, at(t), 2).is_ok());
    assert!(theirs.check_n_at(&1, at(t - BASE), 2).is_ok());
    // Counted in window 2: at its start 2 (P - e) + P <= 2P at e = P / 2 of window 3.
    let d = k.check_n_at(&1, at(BASE + 2 * SEC), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(BASE + 3_500 * MS)));
}

type Theirs = Keyed<u64, SlidingWindow<ManualClock>, ManualClock>;

/// `(quota, period in ns)`.
type Config = (u32, u64);

/// A `Keyed<u64, SlidingWindow>` on a clock that reads 0 at our [`BASE`] (it is given our
/// readings less the base), swept only by hand: even keys get `c0`, odd ones `c1`.
fn keyed(c0: Config, c1: Config) -> Theirs {
    let clock = ManualClock::default();
    let c = clock.clone();
    Keyed::builder(move |key: &u64| {
        let (quota, period) = if key.is_multiple_of(2) { c0 } else { c1 };
        SlidingWindow::builder(quota, Duration::from_nanos(period))
            .clock(c.clone())
            .build()
            .unwrap()
    })
    .sweep_every(Duration::MAX)
    .clock(clock)
    .build()
    .unwrap()
}

/// Their answer with its retry time moved to our clock (theirs reads 0 at our base).
fn shifted(r: Result<(), Denied>) -> Result<(), Option<Nanos>> {
    r.map_err(|d| d.retry_at().map(|t| at(t.as_u64() + BASE)))
}

/// Our clock at construction, the map's base: on no window boundary of the periods below,
/// so that windows counted from it differ from the clock's.
const BASE: u64 = 1_000 * SEC + 123_457;

/// The map with the same two quotas, picked alike.
fn two_quotas(c0: Config, c1: Config) -> Map {
    KeyedSlidingWindow::builder(c0.0, Duration::from_nanos(c0.1))
        .quota(c1.0, Duration::from_nanos(c1.1))
        .classify(|key: &u64| (key % 2) as usize)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::new(at(BASE)))
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    /// A check of `n` on `key` at the current reading moved by `dt` ns (back if `back`).
    Check {
        key: u64,
        dt: u64,
        back: bool,
        n: u32,
    },
    /// A sweep at the current reading moved forward by `dt` ns.
    Sweep { dt: u64 },
}

fn op(c: Config, sweeps: bool, stale: bool) -> impl Strategy<Value = Op> {
    let (quota, p) = c;
    let check = (
        0..6u64,
        prop_oneof![0..p / u64::from(quota) + 2, 0..p * 2 + 2, Just(p)],
        prop::bool::weighted(if stale { 0.2 } else { 0.0 }),
        prop_oneof![0..quota.saturating_add(2), 1..3u32, Just(quota)],
    )
        .prop_map(|(key, dt, back, n)| Op::Check { key, dt, back, n });
    let sweep = (0..p * 3 + 2).prop_map(|dt| Op::Sweep { dt });
    prop_oneof![20 => check, u32::from(sweeps) => sweep]
}

/// The largest quota a period holds (the builder says it).
fn largest(p: u64) -> u32 {
    match KeyedSlidingWindow::<u8>::builder(u32::MAX, Duration::from_nanos(p)).build() {
        Err(ConfigError::SlidingQuotaTooLarge { max, .. }) => max,
        other => panic!("{other:?}"),
    }
}

fn config() -> impl Strategy<Value = Config> {
    let period = 500_000..5 * SEC;
    prop_oneof![
        Just((3, SEC)),
        Just((1, 60 * SEC)),
        Just((1023, MS)),
        Just((32_767, SEC)),
        (1..1024u32, period.clone()),
        period.prop_map(|p| (largest(p), p)),
    ]
}

/// Runs `ops` on both maps (even keys of quota `c0`, odd of `c1`); every answer agrees,
/// refusals' retry times included, and so do every status and sweep.
fn differential(c0: Config, c1: Config, ops: &[Op]) -> Result<(), TestCaseError> {
    let (ours, theirs) = (two_quotas(c0, c1), keyed(c0, c1));
    let mut now = BASE;
    for o in ops {
        match *o {
            Op::Check { key, dt, back, n } => {
                now = if back {
                    now.saturating_sub(dt).max(BASE)
                } else {
                    now + dt
                };
                let (a, b) = (
                    ours.check_n_at(&key, at(now), n),
                    theirs.check_n_at(&key, at(now - BASE), n),
                );
                prop_assert_eq!(
                    a.map_err(|d| d.retry_at()),
                    shifted(b),
                    "key {} n {} at {}",
                    key,
                    n,
                    now
                );
                prop_assert_eq!(
                    ours.quota_at(&key, at(now)),
                    theirs.quota_at(&key, at(now - BASE)),
                    "status of {} at {}",
                    key,
                    now
                );
            }
            Op::Sweep { dt } => {
                now += dt;
                let (a, b) = (
                    ours.evict_idle_at(at(now)),
                    theirs.evict_idle_at(at(now - BASE)),
                );
                prop_assert_eq!(a, b, "sweep at {}", now);
                prop_assert_eq!(ours.len(), theirs.len());
            }
        }
    }
    Ok(())
}

/// Two configurations (with `two` false the second is the first) and `ops` on them, paced
/// by the first; with `sweeps`, sweeps between the checks; with `stale`, readings that go
/// back.
fn case(sweeps: bool, two: bool, stale: bool) -> impl Strategy<Value = (Config, Config, Vec<Op>)> {
    (config(), config()).prop_flat_map(move |(c0, c1)| {
        let c1 = if two { c1 } else { c0 };
        let ops = prop::collection::vec(op(c0, sweeps, stale), 1..300);
        (Just(c0), Just(c1), ops)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Without eviction, monotone readings: per key, `Keyed<u64, SlidingWindow>`'s answers.
    #[test]
    fn agrees_with_keyed_sliding_windows((c0, c1, ops) in case(false, false, false)) {
        differential(c0, c1, &ops)?;
    }

    /// With sweeps between the checks: both judge idleness and date revived keys alike.
    #[test]
    fn agrees_with_keyed_sliding_windows_across_sweeps((c0, c1, ops) in case(true, false, false)) {
        differential(c0, c1, &ops)?;
    }

    /// Two quotas, classified by key, with sweeps: each key answers as its own quota's
    /// window, and keeps its quota across an eviction.
    #[test]
    fn agrees_with_keyed_sliding_windows_per_quota((c0, c1, ops) in case(true, true, false)) {
        differential(c0, c1, &ops)?;
    }

    /// Readings that go back (stale), across sweeps: still the same answers.
    #[test]
    fn agrees_with_keyed_sliding_windows_on_stale_readings((c0, c1, ops) in case(true, true, true)) {
        differential(c0, c1, &ops)?;
    }
}
