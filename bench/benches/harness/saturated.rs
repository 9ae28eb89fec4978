//! The saturated workload, shared by the criterion benches (`bench/benches/harness/mod.rs` declares
//! it) and by `bench/examples/instructions.rs` (which includes this file with `#[path]`), so that
//! the wall-clock cells and the instruction counts measure one configuration.
//!
//! **Saturated** is the state a limiter spends its life in: the bucket refills continuously
//! and most checks are refused, each refusal with the time a retry could succeed. Every
//! limiter is configured as the shootout configures it (`examples/shootout/harness.rs`), at
//! its phase-1 rate of 1,000,000 per second:
//!
//! | limiter | configuration (shootout phase) |
//! |---|---|
//! | `TokenBucket` and twin | 1e6/s, burst 1000 (phase 1) |
//! | governor, direct | the same quota: a 1 µs period, burst 1000 (phase 1's adapter) |
//! | `LeakyBucket` and twin | 1e6/s, slack 1000 (phase 3) |
//! | `SmoothBursty` and twin | 1e6/s, 1 s of burst (phase 3) |
//! | `SmoothWarmingUp` and twin | 1e6/s, 100 ms of warm-up (phase 3) |
//! | `FixedWindow`, `SlidingWindow` and twins | 10,000 per 10 ms window (phase 3) |
//! | `LeakyMeter` | capacity 1000, leaking 1e6/s (phase 3; no twin) |
//! | `Sometimes` | an interval of 1 µs (not in the shootout; no twin) |
//! | `Keyed<u64, TokenBucket>` (compact), `KeyedTokenBucket`, governor keyed, hot key | 1e6/s, burst 1000 (phase 4's hot client) |
//! | the same over random keys | 10,000 keys, each 100/s with a burst of 10 (phase 4) |
//!
//! The random-key rate is the total rate (1e6/s) spread over the keys, so that a key is as
//! saturated as the hot one. Keyed maps are built with `sweep_every(Duration::MAX)` (the
//! shootout keeps the default, a sweep every 10 s that evicts nothing here), so that no sweep
//! lands in a measurement.
//!
//! Two operations: **check**, `Limiter::check` (or `check_n_at(now, 1)`), whose refusal's
//! `Denied::retry_at` is black-boxed ([`check`]); governor's `check` with its retry time taken
//! from `NotUntil::earliest_possible()` ([`gov_check`]), as the shootout's adapter takes it:
//! the same work, a decision and a retry time. **allow**, each limiter's plain yes/no
//! (`allow`, `try_take`, `take().is_permitted()`, `try_acquire(1, 0)`, `run`); governor's
//! `check().is_ok()`.
//!
//! With the real clock, saturation comes from the checks arriving faster than 1e6/s (a check
//! costs well under 1 µs). **Clock-free**, the times are passed in (`_at`) from a [`Schedule`]:
//! [`Schedule::saturated`] advances 50 ns per check, so that one check in 20 is granted at
//! 1e6/s (the sliding window's estimate grants one in 40); governor runs on its
//! `FakeRelativeClock`, advanced by the same step (its clock read is then one relaxed load; the
//! advance, a load and a CAS on the fake clock's word, is in its criterion figures, and
//! `scripts/instructions` measures it apart and subtracts it). [`Schedule::burst`] is the
//! **burst** workload: a burst of twice the limiter's capacity at one instant, then a jump past
//! two full refills, over and over (a `SmoothBursty` there holds 1 ms of permits, 1000, so that
//! the burst is larger than its bucket). A smooth limiter's saturated schedule starts once the
//! stored permits it is built with are paid for ([`drained_at`]).
//!
//! The keyed limiters hash with `RandomState` (SipHash-1-3 with per-process random keys, what
//! users run; governor's default too).
//!
//! The floors ([`Floor`], [`KeyedFloor`]) are the physical floor of a refused check: a clock
//! read (or the time passed in) plus one load of the limiter's word and, for a keyed check,
//! one hash of the key and one probe of a table.
#![allow(dead_code)] // each bench and the instructions binary use a subset

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use governor::clock::{Clock as GovClock, FakeRelativeClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::{DashMapStateStore, KeyedStateStore};
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::{
    reference, Clock, Compact, FixedWindow, Keyed, KeyedTokenBucket, LeakyBucket, LeakyMeter,
    Limit, Limiter, Nanos, SlidingWindow, SmoothBursty, SmoothWarmingUp, Sometimes, TokenBucket,
};

/// The phase-1 rate, per second.
pub const RATE: u32 = 1_000_000;
/// The phase-1 burst (the token bucket's, the leaky bucket's slack, the meter's capacity).
pub const BURST: u32 = 1000;
/// The windows' period and quota: the phase-1 rate over 10 ms windows (phase 3).
pub const WINDOW: Duration = Duration::from_millis(10);
pub const QUOTA: u32 = RATE / 100;
/// `SmoothWarmingUp`'s warm-up (phase 3).
pub const WARMUP: Duration = Duration::from_millis(100);
/// `Sometimes`'s interval: one run per microsecond, the phase-1 rate.
pub const INTERVAL: Duration = Duration::from_micros(1);
/// The random-key workload: `KEYS` keys at `KEY_RATE`/s, burst `KEY_BURST` (phase 4).
pub const KEYS: u64 = 10_000;
pub const KEY_RATE: u32 = RATE / KEYS as u32;
pub const KEY_BURST: u32 = 10;
/// The hot key.
pub const HOT: u64 = 7;

/// The keyed workloads' rate and burst per key: the phase-1 quota for the hot key, the
/// random-key one otherwise.
pub fn keyed_quota(hot: bool) -> (u32, u32) {
    if hot {
        (RATE, BURST)
    } else {
        (KEY_RATE, KEY_BURST)
    }
}
/// The clock-free step: 50 ns a check, one check in 20 granted at 1e6/s.
pub const STEP: u64 = 50;
/// Where every clock-free schedule starts (1 s after the clock's origin).
pub const START: Nanos = Nanos::new(1_000_000_000);

fn limit(per_second: u32) -> Limit {
    Limit::per_second(f64::from(per_second)).expect("valid limit")
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

// ---- the limiters, on any clock --------------------------------------------------------------

pub fn token_bucket<C: Clock>(clock: C) -> TokenBucket<C> {
    TokenBucket::builder(limit(RATE), BURST)
        .clock(clock)
        .build()
}

pub fn twin_token_bucket<C: Clock>(clock: C) -> reference::TokenBucket<C> {
    reference::TokenBucket::from(turnstile::TokenBucket::builder(limit(RATE), BURST).clock(clock))
}

/// The multi-limit workloads' limits (issue #23): the phase-1 quota first, then `k - 1`
/// laxer ones (10x, 100x and 2x its rate and burst), so that the first binds and a saturated
/// multi-limit bucket grants exactly what the single token bucket does.
pub fn multi_limits(k: usize) -> Vec<Bandwidth> {
    [(1, 1), (10, 10), (100, 100), (2, 2)][..k]
        .iter()
        .map(|&(r, b)| Bandwidth::new(limit(RATE * r), BURST * b))
        .collect()
}

pub fn multi<C: Clock>(clock: C, k: usize) -> MultiTokenBucket<C> {
    MultiTokenBucket::builder(&multi_limits(k))
        .clock(clock)
        .build()
        .expect("valid limits")
}

pub fn twin_multi<C: Clock>(clock: C, k: usize) -> reference::MultiTokenBucket<C> {
    reference::MultiTokenBucket::with_clock(&multi_limits(k), clock).expect("valid limits")
}

/// governor's two direct limiters of [`multi_limits`]`(2)`, checked in turn by
/// [`gov_check_pair`], on its default clock.
pub fn governor_pair() -> (
    governor::DefaultDirectRateLimiter,
    governor::DefaultDirectRateLimiter,
) {
    (
        RateLimiter::direct(gov_quota(RATE, BURST)),
        RateLimiter::direct(gov_quota(RATE * 10, BURST * 10)),
    )
}

/// The same on one `FakeRelativeClock` (a handle to it is returned as well).
pub fn governor_pair_fake() -> (
    (GovDirect<FakeRelativeClock>, GovDirect<FakeRelativeClock>),
    FakeRelativeClock,
) {
    let clock = FakeRelativeClock::default();
    let a = RateLimiter::direct_with_clock(gov_quota(RATE, BURST), clock.clone());
    let b = RateLimiter::direct_with_clock(gov_quota(RATE * 10, BURST * 10), clock.clone());
    ((a, b), clock)
}

/// Two governor limiters checked in turn, the binding one first (so a refusal costs one
/// check, governor's cheapest order), each with its retry time as [`gov_check`]: what a user
/// writes without an atomic multi-limit check (a grant by the first is lost when the second
/// refuses).
#[inline(always)]
pub fn gov_check_pair<C: GovClock>(g: &(GovDirect<C>, GovDirect<C>)) -> bool {
    gov_check(&g.0) && gov_check(&g.1)
}

pub fn leaky_bucket<C: Clock>(clock: C) -> LeakyBucket<C> {
    LeakyBucket::builder(RATE)
        .slack(BURST)
        .clock(clock)
        .build()
        .expect("valid leaky bucket")
}

pub fn twin_leaky_bucket<C: Clock>(clock: C) -> reference::LeakyBucket<C> {
    reference::LeakyBucket::try_from(
        turnstile::LeakyBucket::builder(RATE)
            .slack(BURST)
            .clock(clock),
    )
    .expect("valid leaky bucket")
}

/// `SmoothBursty` at 1e6/s with `burst_seconds` of burst (the shootout's: 1 s).
pub fn smooth_bursty<C: Clock>(clock: C, burst_seconds: f64) -> SmoothBursty<C> {
    SmoothBursty::builder(f64::from(RATE))
        .max_burst_seconds(burst_seconds)
        .clock(clock)
        .build()
        .expect("valid smooth limiter")
}

pub fn twin_smooth_bursty<C: Clock>(clock: C, burst_seconds: f64) -> reference::SmoothBursty<C> {
    reference::SmoothBursty::try_from(
        turnstile::SmoothBursty::builder(f64::from(RATE))
            .max_burst_seconds(burst_seconds)
            .clock(clock),
    )
    .expect("valid smooth limiter")
}

pub fn smooth_warming_up<C: Clock>(clock: C) -> SmoothWarmingUp<C> {
    SmoothWarmingUp::builder(f64::from(RATE), WARMUP)
        .clock(clock)
        .build()
        .expect("valid smooth limiter")
}

pub fn twin_smooth_warming_up<C: Clock>(clock: C) -> reference::SmoothWarmingUp<C> {
    reference::SmoothWarmingUp::try_from(
        turnstile::SmoothWarmingUp::builder(f64::from(RATE), WARMUP).clock(clock),
    )
    .expect("valid smooth limiter")
}

pub fn fixed_window<C: Clock>(clock: C) -> FixedWindow<C> {
    FixedWindow::builder(QUOTA, WINDOW)
        .clock(clock)
        .build()
        .expect("valid window")
}

pub fn twin_fixed_window<C: Clock>(clock: C) -> reference::FixedWindow<C> {
    reference::FixedWindow::try_from(turnstile::FixedWindow::builder(QUOTA, WINDOW).clock(clock))
        .expect("valid window")
}

pub fn sliding_window<C: Clock>(clock: C) -> SlidingWindow<C> {
    SlidingWindow::builder(QUOTA, WINDOW)
        .clock(clock)
        .build()
        .expect("valid window")
}

pub fn twin_sliding_window<C: Clock>(clock: C) -> reference::SlidingWindow<C> {
    reference::SlidingWindow::try_from(
        turnstile::SlidingWindow::builder(QUOTA, WINDOW).clock(clock),
    )
    .expect("valid window")
}

pub fn leaky_meter<C: Clock>(clock: C) -> LeakyMeter<C> {
    LeakyMeter::builder(BURST, limit(RATE))
        .clock(clock)
        .build()
        .expect("valid meter")
}

pub fn sometimes<C: Clock>(clock: C) -> Sometimes<C> {
    Sometimes::with_clock(clock).interval(INTERVAL)
}

/// `Keyed` of compact token buckets at `rate`/s with `burst` (the shootout's phase 4).
pub fn keyed<C: Clock + Clone>(
    clock: C,
    rate: u32,
    burst: u32,
) -> Keyed<u64, TokenBucket<C, Compact>, C> {
    let per_key = clock.clone();
    let limit = limit(rate);
    Keyed::builder(move |_: &u64| {
        TokenBucket::builder(limit, burst)
            .clock(per_key.clone())
            .build_compact()
    })
    .clock(clock)
    .sweep_every(Duration::MAX)
    .build()
    .expect("valid keyed limiter")
}

/// `KeyedTokenBucket` at `rate`/s with `burst`, hashing with `hasher` (its default:
/// `RandomState`, SipHash as governor's).
pub fn keyed_bucket<C: Clock, S: BuildHasher>(
    clock: C,
    rate: u32,
    burst: u32,
    hasher: S,
) -> KeyedTokenBucket<u64, S, C> {
    KeyedTokenBucket::builder(limit(rate), burst)
        .hasher(hasher)
        .clock(clock)
        .sweep_every(Duration::MAX)
        .build()
        .expect("valid keyed limiter")
}

// ---- every limiter per key, over many keys ---------------------------------------------------

/// The many-keys workload (issue #21's `Keyed<u64, L>` goal): [`MANY_KEYS`] keys, each
/// limiter at [`MANY_RATE`]/s (the phase-1 total rate spread over the keys) with a capacity
/// of one (burst, slack, quota, stored permits: one request a [`MANY_PERIOD`]), so that a key
/// checked every 5 ms on average (100 000 keys, one check every 50 ns clock-free) is at its
/// limit: about one check in 20 granted, the rest refused with their retry time.
pub const MANY_KEYS: u64 = 100_000;
pub const MANY_RATE: u32 = 10;
/// One request's worth of refill at [`MANY_RATE`]: the windows' period.
pub const MANY_PERIOD: Duration = Duration::from_millis(100);
/// The per-key rate of the many-keys workload on the real clock, 10 times lower than
/// [`MANY_RATE`]: a thread checks 100 000 random keys some 10 times slower than the
/// clock-free schedule's one check every 50 ns (each check misses the cache), so at 1/s a key
/// is about as saturated as at 10/s clock-free, and still is on a loaded machine.
pub const MANY_RATE_CLOCK: u32 = 1;

/// The limiters of the many-keys workload, by the name their cells carry: `tb`
/// (`TokenBucket`, compact), `leaky` (`LeakyBucket`, compact, no slack), `fixed` and `sliding`
/// (`FixedWindow`, `SlidingWindow`, compact, one request a [`MANY_PERIOD`]), `bursty`
/// (`SmoothBursty`, compact, 0.1 s of burst: one stored permit), `warming`
/// (`SmoothWarmingUp`, compact, [`MANY_PERIOD`] of warm-up), `meter` (`LeakyMeter`, compact,
/// capacity 1).
pub const MANY_LIMITERS: [&str; 7] = [
    "tb", "leaky", "fixed", "sliding", "bursty", "warming", "meter",
];

/// How long after its emptying grant a key of limiter `lim` (a name of [`MANY_LIMITERS`],
/// `inline` or `governor`) grants again: [`MANY_PERIOD`], twice that for the sliding window,
/// in `Keyed` or inline (its estimate weighs the previous window's grant until that window
/// has slid past) and
/// three times for the warming-up limiter, in `Keyed` or inline (cold, a permit costs its
/// cold factor, 3, times the stable interval).
pub fn many_due(lim: &str) -> Duration {
    match lim {
        "sliding" | "inline-sliding" => 2 * MANY_PERIOD,
        "warming" | "inline-warming" => 3 * MANY_PERIOD,
        _ => MANY_PERIOD,
    }
}

/// `Keyed<u64, L>` over the map's `clock`, each key's limiter from `make` on a clone of it,
/// never swept (so that no sweep lands in a measurement).
pub fn keyed_of<L, C>(clock: C, make: impl Fn(C) -> L + Send + Sync + 'static) -> Keyed<u64, L, C>
where
    L: Limiter + turnstile::Idle + 'static,
    C: Clock + Clone + Send + Sync + 'static,
{
    let per_key = clock.clone();
    Keyed::builder(move |_: &u64| make(per_key.clone()))
        .clock(clock)
        .sweep_every(Duration::MAX)
        .build()
        .expect("valid keyed limiter")
}

/// Calls `$body` with `$k` bound to the many-keys map of limiter `$lim` (a name of
/// [`MANY_LIMITERS`]) on `$clock`, each key at `$rate`/s ([`MANY_RATE`] unless given; the
/// windows' period and the smooth limiters' burst and warm-up are one request's worth of it);
/// each arm's map has its own type.
#[macro_export]
macro_rules! with_many_keyed {
    ($sat:ident, $lim:expr, $clock:expr, |$k:ident| $body:expr) => {
        $crate::with_many_keyed!($sat, $lim, $clock, $sat::MANY_RATE, |$k| $body)
    };
    ($sat:ident, $lim:expr, $clock:expr, $rate:expr, |$k:ident| $body:expr) => {{
        use turnstile::{
            FixedWindow, LeakyBucket, LeakyMeter, SlidingWindow, SmoothBursty, SmoothWarmingUp,
            TokenBucket,
        };
        let clock = $clock;
        let rate: u32 = $rate;
        let limit = turnstile::Limit::per_second(f64::from(rate)).expect("valid limit");
        // One request's worth of refill: the windows' period.
        let period = std::time::Duration::from_secs(1) / rate;
        match $lim {
            "tb" => {
                let $k = $sat::keyed_of(clock, move |c| {
                    TokenBucket::builder(limit, 1).clock(c).build_compact()
                });
                $body
            }
            "leaky" => {
                let $k = $sat::keyed_of(clock, move |c| {
                    LeakyBucket::builder(rate)
                        .without_slack()
                        .clock(c)
                        .build_compact()
                        .expect("valid")
                });
                $body
            }
            "fixed" => {
                let $k = $sat::keyed_of(clock, move |c| {
                    FixedWindow::builder(1, period)
                        .clock(c)
                        .build_compact()
                        .expect("valid")
                });
                $body
            }
            "sliding" => {
                let $k = $sat::keyed_of(clock, move |c| {
                    SlidingWindow::builder(1, period)
                        .clock(c)
                        .build_compact()
                        .expect("valid")
                });
                $body
            }
            "bursty" => {
                let $k = $sat::keyed_of(clock, move |c| {
                    SmoothBursty::builder(f64::from(rate))
                        .max_burst_seconds(period.as_secs_f64())
                        .clock(c)
                        .build_compact()
                        .expect("valid")
                });
                $body
            }
            "warming" => {
                let $k = $sat::keyed_of(clock, move |c| {
                    SmoothWarmingUp::builder(f64::from(rate), period)
                        .clock(c)
                        .build_compact()
                        .expect("valid")
                });
                $body
            }
            "meter" => {
                let $k = $sat::keyed_of(clock, move |c| {
                    LeakyMeter::builder(1, limit)
                        .clock(c)
                        .build_compact()
                        .expect("valid")
                });
                $body
            }
            other => panic!(
                "no many-keys limiter {other:?} (they are {:?})",
                $sat::MANY_LIMITERS
            ),
        }
    }};
}

// ---- governor ----------------------------------------------------------------------------

/// governor's direct limiter on clock `C` (no middleware).
pub type GovDirect<C> =
    RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as GovClock>::Instant>>;

/// governor's keyed limiter on clock `C` over the store `S`.
pub type GovKeyed<S, C> = RateLimiter<u64, S, C, NoOpMiddleware<<C as GovClock>::Instant>>;

/// governor's quota at `rate`/s with `burst`.
pub fn gov_quota(rate: u32, burst: u32) -> Quota {
    Quota::per_second(nz(rate)).allow_burst(nz(burst))
}

/// governor's direct limiter at the phase-1 quota on its default (quanta) clock, as the
/// shootout's adapter builds it.
pub fn governor() -> governor::DefaultDirectRateLimiter {
    RateLimiter::direct(gov_quota(RATE, BURST))
}

/// The same on a `FakeRelativeClock` (a handle to it is returned as well).
pub fn governor_fake() -> (GovDirect<FakeRelativeClock>, FakeRelativeClock) {
    let clock = FakeRelativeClock::default();
    let g = RateLimiter::direct_with_clock(gov_quota(RATE, BURST), clock.clone());
    (g, clock)
}

/// governor's keyed limiter (dashmap, SipHash) at `rate`/s with `burst` on its default clock,
/// as the shootout builds it.
pub fn governor_keyed(rate: u32, burst: u32) -> governor::DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(gov_quota(rate, burst))
}

/// The same on a `FakeRelativeClock`, hashing with `hasher` (its default: `RandomState`).
pub fn governor_keyed_fake<S: BuildHasher + Default + Clone>(
    rate: u32,
    burst: u32,
    hasher: S,
) -> (
    GovKeyed<DashMapStateStore<u64, S>, FakeRelativeClock>,
    FakeRelativeClock,
) {
    let clock = FakeRelativeClock::default();
    let quota = gov_quota(rate, burst);
    let g = RateLimiter::dashmap_with_clock_and_hasher(quota, clock.clone(), hasher);
    (g, clock)
}

// ---- the operations ----------------------------------------------------------------------

/// `Limiter::check`: true if granted; a refusal's retry time is black-boxed.
#[inline(always)]
pub fn check<L: Limiter + ?Sized>(l: &L) -> bool {
    match black_box(l).check() {
        Ok(()) => true,
        Err(d) => {
            black_box(d.retry_at());
            false
        }
    }
}

/// `Limiter::check_n_at(now, 1)`, as [`check`].
#[inline(always)]
pub fn check_at<L: Limiter + ?Sized>(l: &L, now: Nanos) -> bool {
    match black_box(l).check_n_at(black_box(now), 1) {
        Ok(()) => true,
        Err(d) => {
            black_box(d.retry_at());
            false
        }
    }
}

/// A keyed check's result, as [`check`]: a refusal's retry time is black-boxed.
#[inline(always)]
pub fn retry(r: Result<(), turnstile::Denied>) -> bool {
    match r {
        Ok(()) => true,
        Err(d) => {
            black_box(d.retry_at());
            false
        }
    }
}

/// governor's `check` with its retry time: `NotUntil::earliest_possible()`, black-boxed.
#[inline(always)]
pub fn gov_check<C: GovClock>(g: &GovDirect<C>) -> bool {
    match black_box(g).check() {
        Ok(()) => true,
        Err(not_until) => {
            black_box(not_until.earliest_possible());
            false
        }
    }
}

/// governor's `check_key` with its retry time, as [`gov_check`].
#[inline(always)]
pub fn gov_check_key<S: KeyedStateStore<u64>, C: GovClock>(g: &GovKeyed<S, C>, key: u64) -> bool {
    match black_box(g).check_key(&black_box(key)) {
        Ok(()) => true,
        Err(not_until) => {
            black_box(not_until.earliest_possible());
            false
        }
    }
}

/// Advances governor's fake clock by `ns` (nothing if 0).
#[inline(always)]
pub fn advance(clock: &FakeRelativeClock, ns: u64) {
    if ns != 0 {
        clock.advance(Duration::from_nanos(ns));
    }
}

// ---- clock-free schedules ----------------------------------------------------------------

/// The times of a clock-free cell's checks: `per_instant` checks at each instant, the instants
/// `jump` ns apart, the first `jump` after the start.
#[derive(Clone, Debug)]
pub struct Schedule {
    now: u64,
    left: u64,
    per_instant: u64,
    jump: u64,
}

impl Schedule {
    /// The saturated schedule from [`START`]: each check [`STEP`] (50 ns) after the last.
    pub fn saturated() -> Schedule {
        Schedule::new(START, 1, STEP)
    }

    /// The burst schedule from [`START`]: `2 * capacity` checks at one instant, then a jump of
    /// `2 * refill` (the time the limiter takes to refill from empty): the limiter is full at
    /// each burst, grants its capacity and refuses as many checks again.
    pub fn burst(capacity: u64, refill: Duration) -> Schedule {
        let refill = u64::try_from(refill.as_nanos()).expect("a short refill");
        Schedule::new(START, 2 * capacity, 2 * refill)
    }

    /// `per_instant` checks an instant from `start`, the instants `jump` ns apart.
    pub fn new(start: Nanos, per_instant: u64, jump: u64) -> Schedule {
        assert!(per_instant > 0 && jump > 0, "a schedule that moves");
        Schedule {
            now: start.as_u64(),
            left: 0,
            per_instant,
            jump,
        }
    }

    /// The same schedule from `start` instead.
    pub fn from(self, start: Nanos) -> Schedule {
        Schedule::new(start, self.per_instant, self.jump)
    }

    /// The time of the next check and how far it is after the previous one (0 within a
    /// burst): what a fake clock is advanced by.
    #[inline(always)]
    pub fn next(&mut self) -> (Nanos, u64) {
        let mut moved = 0;
        if self.left == 0 {
            self.left = self.per_instant;
            self.now += self.jump;
            moved = self.jump;
        }
        self.left -= 1;
        (Nanos::new(self.now), moved)
    }

    /// The time of the latest check.
    pub fn now(&self) -> Nanos {
        Nanos::new(self.now)
    }
}

/// When a smooth limiter that holds `stored` permits at `at` has paid for them: it reserves
/// them (`reserve(n)`, one `reserve_n_at`) and a check at `at` reads the debt's end from its
/// refusal. A clock-free schedule from there starts saturated: a `SmoothWarmingUp` starts
/// cold, with its maximum of stored permits, and would otherwise spend the first 100 ms of a
/// schedule (more than a measurement's) warming up.
pub fn drained_at<L: Limiter>(
    l: &L,
    stored: f64,
    reserve: impl FnOnce(u32) -> Duration,
    at: Nanos,
) -> Nanos {
    if stored >= 1.0 {
        reserve(stored.ceil() as u32);
    }
    match l.check_n_at(at, 1) {
        Ok(()) => at,
        Err(d) => d.retry_at().expect("a debt that ends"),
    }
}

// ---- floors --------------------------------------------------------------------------------

/// The CAS of a `floor` cell: one load and a CAS loop on `word`, adding `v | 1` (the value a
/// limiter's grant would compute from the time it read).
#[inline(always)]
pub fn floor_cas(word: &AtomicU64, v: u64) {
    let mut cur = word.load(Ordering::Acquire);
    while let Err(actual) = word.compare_exchange_weak(
        cur,
        cur.wrapping_add(v | 1),
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        cur = actual;
    }
}

/// The floor of a check on one shared 128-bit word (the multi-limit bucket's): a clock read
/// plus one load of the word, and for a grant one CAS on it, each in its cheapest form. On
/// x86_64 that is one `vmovdqa` and one `lock cmpxchg16b` inline, with no test of the
/// processor's features (checked once, at construction); elsewhere, or on a processor
/// without them, portable-atomic's operations.
pub struct Floor128<C> {
    clock: C,
    word: CachePadded<portable_atomic::AtomicU128>,
    #[cfg(target_arch = "x86_64")]
    inline: bool,
}

impl<C: Clock> Floor128<C> {
    pub fn new(clock: C) -> Floor128<C> {
        Floor128 {
            clock,
            word: CachePadded::new(portable_atomic::AtomicU128::new(u128::MAX)),
            #[cfg(target_arch = "x86_64")]
            inline: std::is_x86_feature_detected!("cmpxchg16b")
                && std::is_x86_feature_detected!("avx"),
        }
    }

    /// A refused check: the clock and one load (the word holds a time no check reaches).
    #[inline(always)]
    pub fn check(&self) -> bool {
        let now = black_box(&self.clock).now();
        let word = black_box(&self.word);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `inline` says the processor has them (`load_inline`).
        let w = if self.inline {
            unsafe { load_inline(word) }
        } else {
            word.load(Ordering::Acquire)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let w = word.load(Ordering::Acquire);
        let ok = u128::from(black_box(now).as_u64()) >= w;
        if !ok {
            black_box(w);
        }
        ok
    }

    /// A grant: the clock, one load and one CAS that adds to the word.
    #[inline(always)]
    pub fn grant(&self) {
        self.grant_at(black_box(&self.clock).now());
    }

    /// A grant at `now`: one load and one CAS that adds to the word.
    #[inline(always)]
    pub fn grant_at(&self, now: Nanos) {
        let word = black_box(&self.word);
        let add = u128::from(now.as_u64() | 1);
        #[cfg(target_arch = "x86_64")]
        if self.inline {
            // SAFETY: `inline` says the processor has them (`load_inline`, `cas_inline`).
            let mut cur = unsafe { load_inline(word) };
            while let Err(found) = unsafe { cas_inline(word, cur, cur.wrapping_add(add)) } {
                cur = found;
            }
            return;
        }
        let mut cur = word.load(Ordering::Acquire);
        while let Err(found) = word.compare_exchange_weak(
            cur,
            cur.wrapping_add(add),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            cur = found;
        }
    }
}

/// One `vmovdqa` of `word`.
///
/// # Safety
/// The processor has AVX (which makes the load atomic) and `cmpxchg16b` (so every write to
/// `word` is atomic too).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_inline(word: &portable_atomic::AtomicU128) -> u128 {
    let (lo, hi): (u64, u64);
    // SAFETY: the word is 16-byte aligned and only accessed atomically; the caller's contract.
    unsafe {
        std::arch::asm!(
            "vmovdqa {x}, xmmword ptr [{src}]",
            "vmovq {lo}, {x}",
            "vpextrq {hi}, {x}, 1",
            src = in(reg) word.as_ptr(),
            x = out(xmm_reg) _,
            lo = out(reg) lo,
            hi = out(reg) hi,
            options(nostack, preserves_flags, readonly),
        );
    }
    u128::from(hi) << 64 | u128::from(lo)
}

/// One `lock cmpxchg16b` on `word`.
///
/// # Safety
/// As [`load_inline`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn cas_inline(
    word: &portable_atomic::AtomicU128,
    cur: u128,
    new: u128,
) -> Result<u128, u128> {
    let (lo, hi): (u64, u64);
    let failed: u8;
    // SAFETY: as `load_inline`'s; `rbx`, which LLVM may reserve, is restored from `r8`.
    unsafe {
        std::arch::asm!(
            "xchg r8, rbx",
            "lock cmpxchg16b xmmword ptr [r11]",
            "setne cl",
            "mov rbx, r8",
            in("r11") word.as_ptr(),
            inout("r8") new as u64 => _,
            in("rcx") (new >> 64) as u64,
            inout("rax") cur as u64 => lo,
            inout("rdx") (cur >> 64) as u64 => hi,
            lateout("cl") failed,
            options(nostack),
        );
    }
    let found = u128::from(hi) << 64 | u128::from(lo);
    if failed == 0 {
        Ok(found)
    } else {
        Err(found)
    }
}

/// The floor of a refused check on one shared word: a clock read plus one load. The word holds
/// a time no check reaches, as a saturated limiter's word holds a time ahead of the clock.
pub struct Floor<C> {
    clock: C,
    word: CachePadded<AtomicU64>,
}

impl<C: Clock> Floor<C> {
    pub fn new(clock: C) -> Floor<C> {
        Floor {
            clock,
            word: CachePadded::new(AtomicU64::new(u64::MAX)),
        }
    }

    /// Reads the clock and decides as [`Floor::check_at`].
    #[inline(always)]
    pub fn check(&self) -> bool {
        self.check_at(black_box(&self.clock).now())
    }

    /// One load; a refusal's retry time (the word) is black-boxed.
    #[inline(always)]
    pub fn check_at(&self, now: Nanos) -> bool {
        let w = black_box(&self.word).load(Ordering::Acquire);
        let ok = black_box(now).as_u64() >= w;
        if !ok {
            black_box(w);
        }
        ok
    }
}

/// A table slot of [`KeyedFloor`]: a key and its limiter's word (`W`), 16 bytes.
struct Slot<W> {
    key: AtomicU64,
    word: W,
}

/// Where a [`KeyedFloor`]'s words live: in its table slots ([`AtomicU64`], as
/// `KeyedTokenBucket`'s), or each on a cache line of its own behind a pointer in the slot
/// ([`Indirect`], as `Keyed`'s limiters: a second, dependent miss for a key out of cache).
pub trait FloorWord {
    fn new() -> Self;
    fn word(&self) -> &AtomicU64;
}

impl FloorWord for AtomicU64 {
    fn new() -> Self {
        AtomicU64::new(u64::MAX)
    }

    #[inline(always)]
    fn word(&self) -> &AtomicU64 {
        self
    }
}

/// A word alone on its heap-allocated cache line: [`FloorWord`].
pub struct Indirect(Box<Line>);

#[repr(align(64))]
struct Line(AtomicU64);

impl FloorWord for Indirect {
    fn new() -> Self {
        Indirect(Box::new(Line(AtomicU64::new(u64::MAX))))
    }

    #[inline(always)]
    fn word(&self) -> &AtomicU64 {
        &self.0 .0
    }
}

const EMPTY: u64 = u64::MAX;

/// The floor of a refused keyed check: a clock read, one hash of the key (SipHash, as both
/// maps use by default), one probe of an open-addressing table of 16-byte slots (half full,
/// linear probing), and one load of the slot's word (`W`: in the slot, or behind a pointer
/// in it, [`FloorWord`]).
pub struct KeyedFloor<C, S = RandomState, W = AtomicU64> {
    clock: C,
    hasher: S,
    mask: usize,
    slots: Box<[Slot<W>]>,
}

impl<C: Clock> KeyedFloor<C> {
    /// A table holding `keys`, hashing with `RandomState`.
    pub fn new(clock: C, keys: impl IntoIterator<Item = u64>) -> KeyedFloor<C> {
        KeyedFloor::with_hasher(clock, keys, RandomState::new())
    }
}

impl<C: Clock> KeyedFloor<C, RandomState, Indirect> {
    /// A table holding `keys`, each word on a line of its own behind a pointer, allocated in
    /// the order of `keys` (as a map allocates its keys' limiters as they arrive).
    pub fn indirect(clock: C, keys: impl IntoIterator<Item = u64>) -> Self {
        KeyedFloor::build(clock, keys, RandomState::new())
    }
}

impl<C: Clock, S: BuildHasher> KeyedFloor<C, S> {
    /// A table holding `keys`, hashing with `hasher`.
    pub fn with_hasher(clock: C, keys: impl IntoIterator<Item = u64>, hasher: S) -> Self {
        KeyedFloor::build(clock, keys, hasher)
    }
}

impl<C: Clock, S: BuildHasher, W: FloorWord> KeyedFloor<C, S, W> {
    fn build(clock: C, keys: impl IntoIterator<Item = u64>, hasher: S) -> KeyedFloor<C, S, W> {
        let keys: Vec<u64> = keys.into_iter().collect();
        let cap = (2 * keys.len()).next_power_of_two().max(2);
        let mut slots: Box<[Slot<Option<W>>]> = (0..cap)
            .map(|_| Slot {
                key: AtomicU64::new(EMPTY),
                word: None,
            })
            .collect();
        let mask = cap - 1;
        for k in keys {
            assert_ne!(k, EMPTY, "the empty key");
            let mut i = hasher.hash_one(k) as usize & mask;
            while slots[i].key.load(Ordering::Relaxed) != EMPTY {
                i = (i + 1) & mask;
            }
            slots[i].key.store(k, Ordering::Relaxed);
            slots[i].word = Some(W::new());
        }
        let slots = Vec::from(slots)
            .into_iter()
            .map(|s| Slot {
                key: s.key,
                word: s.word.unwrap_or_else(W::new),
            })
            .collect();
        KeyedFloor {
            clock,
            hasher,
            mask,
            slots,
        }
    }

    /// Reads the clock and decides as [`KeyedFloor::check_at`].
    #[inline(always)]
    pub fn check(&self, key: u64) -> bool {
        self.check_at(key, black_box(&self.clock).now())
    }

    /// Hash, probe, one load; a refusal's retry time (the word) is black-boxed. A key not in
    /// the table is refused.
    #[inline(always)]
    pub fn check_at(&self, key: u64, now: Nanos) -> bool {
        let mut i = black_box(&self.hasher).hash_one(key) as usize & self.mask;
        loop {
            let s = &self.slots[i];
            let k = s.key.load(Ordering::Relaxed);
            if k == key {
                let w = s.word.word().load(Ordering::Acquire);
                let ok = black_box(now).as_u64() >= w;
                if !ok {
                    black_box(w);
                }
                return ok;
            }
            if k == EMPTY {
                return false;
            }
            i = (i + 1) & self.mask;
        }
    }
}

// ---- sanity ----------------------------------------------------------------------------------

/// What a clock-free cell's checks look like once it has been measured.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// About one check in 20 granted: at least one, at most one in 10.
    Saturated,
    /// Some granted and some refused (a burst grants about the capacity a cycle).
    Burst,
    /// None granted (a floor, whose word no time reaches, or a bare loop).
    Refused,
}

/// Checks made after a clock-free cell to verify the state it measured: 10 ms of the saturated
/// schedule (a whole window), 10 cycles of a window's burst.
pub const VERIFY: u64 = 200_000;

/// `n` checks through `op(t, moved)` (true if granted) at the times of `s`; returns how many
/// were granted. Every clock-free cell measures and verifies through this one function, never
/// inlined, so that `op` has a single call site, is inlined into it, and is compiled the same
/// way for every limiter: with a second call site, LLVM outlines a large closure (and its
/// prologue, epilogue and call cost about 17 instructions a check) but inlines a small one, which
/// measured the inliner instead of the limiters.
#[inline(never)]
pub fn run_checks(s: &mut Schedule, op: &mut impl FnMut(Nanos, u64) -> bool, n: u64) -> u64 {
    let mut granted = 0;
    for _ in 0..n {
        let (t, moved) = s.next();
        granted += u64::from(black_box(op(t, moved)));
    }
    granted
}

/// Asserts that `what` was measured in the state `expect` says: of [`VERIFY`] more checks
/// through `op(t, moved)` (true if granted) at the times of `s`, the share `expect` allows
/// is granted. Returns how many were.
pub fn verify(
    s: &mut Schedule,
    expect: Expect,
    what: &str,
    mut op: impl FnMut(Nanos, u64) -> bool,
) -> u64 {
    let granted = run_checks(s, &mut op, VERIFY);
    let ok = match expect {
        Expect::Saturated => granted > 0 && granted <= VERIFY / 10,
        Expect::Burst => granted > 0 && granted < VERIFY * 3 / 4,
        Expect::Refused => granted == 0,
    };
    assert!(
        ok,
        "{what}: {granted} of {VERIFY} checks granted after the cell, not {expect:?}"
    );
    granted
}

/// Asserts that `what` was measured saturated on the real clock: that checking through `op`
/// (true if granted) as fast as it goes brings the limiter to a state where fewer than half of
/// `n` checks in a row are granted, within 5 s. The limiter idles while criterion analyses a
/// cell, and fills up (a smooth limiter with its 1 s of burst, every key of a map with its
/// own), so the rounds of `n` checks go on until one shows saturation. A cell whose checks
/// cannot saturate the limiter (or that stopped checking) fails here rather than printing a
/// figure for the wrong state.
pub fn assert_saturated(what: &str, n: u32, mut op: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    loop {
        let granted = (0..n).filter(|_| op()).count();
        if granted < n as usize / 2 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what}: {granted} of {n} checks granted after 5 s of checks: not saturated"
        );
    }
}
