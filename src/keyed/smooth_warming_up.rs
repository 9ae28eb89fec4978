//! Per-key Guava `SmoothWarmingUp` limiters with the state **inline**: each key is its key and
//! one 128-bit word in an open-addressing table shared by all keys, the same table and
//! protocol as [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s (lookup, insert, eviction,
//! revival, resizes, sweeps, key bound; its module docs describe them), at the word map's
//! 128-bit width. The general [`Keyed`](crate::Keyed)`<K, SmoothWarmingUp>` holds a whole
//! limiter per key behind a pointer (two dependent cache misses per random-key check); this
//! map shares the configuration between keys, so a check costs one miss.
//!
//! # Two numbers in one word
//! Guava's warming-up state is `(stored, next_free)`, and unlike the bursty limiter's the two
//! are independent: every stored permit costs at least the stable interval `I` of
//! `next_free` (the trapezoid above `threshold_permits`, `I` below it), so a spend from the
//! store leaves a debt with permits still stored, and no single number answers every reading
//! as the pair does ([`KeyedSmoothBursty`](crate::KeyedSmoothBursty)'s module docs). So the
//! word holds both, exactly as [`SmoothWarmingUp`](crate::SmoothWarmingUp)'s own 128-bit word
//! does, without its configuration epoch (the configuration is the quota's, fixed):
//!
//! ```text
//!  127     126..123     122..104   103..40                      39..0
//! [FROZEN][ tag (4) ][ 0 ...... ][ next_free - base (64, ns) ][ stored (40) ]
//!   tag 1..=15: a live key of quota `tag - 1`
//!   tag 0, FROZEN: the engine's (EMPTY, DEAD, a resize's copy)
//! ```
//!
//! * `next_free` is counted in **nanoseconds past the map's base** (the clock reading at
//!   construction). The word has room for the nanosecond itself, so there is no unit to
//!   convert to (the 64-bit maps count in `src/scale.rs`'s units to fit 59 bits): a reading
//!   converts with one subtraction, and the whole clock is in range.
//! * `stored` is [`SmoothWarmingUp`](crate::SmoothWarmingUp)'s fixed point: a fraction of
//!   `max_permits` in `2^-39` steps (`2^39` is a full store, hence 40 bits).
//!
//! A check runs [`SmoothWarmingUp`](crate::SmoothWarmingUp)'s own arithmetic on that pair (the
//! same functions: Guava's resync, the warm-up integral for stored permits, the stable
//! interval for fresh ones, each cost rounded to the nearest nanosecond), so the two agree
//! **bit for bit**: a check of `n` at `now` is granted iff `next_free <= now` (Guava's
//! `tryAcquire(n, 0)`; pay later, whatever `n`), and then resyncs and pushes `next_free` by
//! the request's cost; a refusal writes nothing and retries at `next_free`, when the debt
//! clears.
//!
//! **Range.** Readings before the base count as the base. `next_free` saturates at
//! 2^64 - 1 ns (584 years) past the base: a refusal whose retry time lies there (or past the end of the
//! clock) says "never" (`retry_at() == None`), as the single limiter's at the end of time,
//! and a key in such a debt is never idle. No configuration is out of range: every rate,
//! warm-up and cold factor [`SmoothWarmingUp`](crate::SmoothWarmingUp) accepts is accepted.
//!
//! **Budget.** Every permit costs at least `I` of `next_free` (a stored one the integral,
//! which is at least `I` a permit; a fresh one `I`), up to each cost's rounding to the
//! nanosecond, `next_free` never decreases over a key's history (nor across an eviction,
//! below), and a grant at `t` needs `next_free <= t`. So for any readings in `[a, b]`,
//! whatever the order in which they arrive, a key's grants, **all but the last to take
//! effect**, total at most `rate * (b - a)` permits (plus a nanosecond of rounding per
//! grant), and the last may be of any size (pay later). With checks of one permit: at most
//! `1 + rate * (b - a)` in any span `b - a` of readings. (A warming-up limiter never bursts:
//! its stored permits only make grants dearer.)
//!
//! **Orderings.** The rule has no atomics of its own: it computes the next word from the one
//! the map loaded, and the map's CASes (one `cmpxchg16b` each on x86_64) are the whole
//! protocol (`src/keyed/word_map.rs`, which states why its orderings hold at either width). A
//! refusal is decided from that one load and writes nothing.
//!
//! # A key's birth, and eviction
//! A key is **born** at `B` when it is inserted, or revived after a sweep at `J <= B` evicted
//! it (`B` is the later of the check's reading and the last sweep's time): cold, the store
//! full, `next_free = B`, as Guava's warming-up limiter starts and as
//! [`Keyed`](crate::Keyed) dates a new [`SmoothWarmingUp`](crate::SmoothWarmingUp)
//! ([`Idle::born_at`](crate::Idle::born_at)). A key is **idle** at `J` when it is exactly a
//! fresh one: no debt (`next_free <= J`) and the store full at `J` (cold again), as
//! `SmoothWarmingUp`'s [`Idle`](crate::Idle). Advanced to `B` such a key is `born(B)`
//! itself, and before `B` the newborn grants nothing (`next_free = B`): evicting it hands
//! the key nothing (the word rule's contract 3), and `next_free` never decreases across it.
//!
//! # Deviations
//! From Guava's `SmoothWarmingUp`, [`SmoothWarmingUp`](crate::SmoothWarmingUp)'s own
//! (nanosecond costs, typed errors, "never" at the end of time), and:
//! * a debt ending more than 584 years past the map's base is "never" (above);
//! * only the non-blocking check ([`KeyedSmoothWarmingUp::check_n_at`] is
//!   `tryAcquire(n, 0)`): no `acquire`, `reserve` or `set_rate`. A check of `n = 0` takes
//!   nothing and is granted iff there is no debt, as `SmoothWarmingUp`'s.
//!
//! From [`Keyed`](crate::Keyed)`<K, SmoothWarmingUp>`: none for readings from the base on,
//! stale ones included (the state is the single limiter's, to the bit), sweeps included (both
//! judge idleness and date revived keys alike); readings before the base count as the base.
//!
//! # Quotas, memory, HashDoS, sweeps
//! As [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s: up to [`MAX_QUOTAS`] configurations
//! picked per new key by `classify`, at most `max_keys` keys (a new key finding the map full
//! is refused, [`WhenFull::Deny`], or let through untracked, [`WhenFull::Allow`]), std's
//! `RandomState` by default, and sweeps every `sweep_every` inline, by hand
//! ([`KeyedSmoothWarmingUp::evict_idle`]) or on a thread of their own
//! ([`KeyedSmoothWarmingUp::spawn_sweeper`]). A slot is the 16-byte word and the key,
//! aligned to 32 bytes so that none straddles a cache line: 32 bytes for a key of up to 16
//! bytes (a `u64`, an IPv6 address), 64 for a larger one. A key is evicted by the first
//! sweep at or after it is cold again: its debt cleared and its store refilled (at most a
//! warm-up period of idling after the debt clears).

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

pub use crate::keyed::word_map::MAX_QUOTAS;
pub use crate::keyed::WhenFull;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::word_rule::WordRule;
use crate::keyed::{InlineMap, InlineMapBuilder};
use crate::limiter::Denied;
use crate::smooth::{self, Config as SmoothConfig, EPOCH_BITS, FRAC_ONE};

/// Guava's default cold factor for `RateLimiter.create(rate, warmup)`: a cold key's first
/// permits cost up to three stable intervals each.
pub(crate) const DEFAULT_COLD_FACTOR: f64 = 3.0;

/// One quota of a [`KeyedSmoothWarmingUp`]: the rule its keys follow, its configuration
/// precomputed. The map's builder makes it (`builder`, `quota`); it is the map's type
/// parameter (`KeyedSmoothWarmingUp<K>` is `InlineMap<K, SmoothWarmingUpQuota>`), named only
/// to name the map's builder, `InlineMapBuilder<K, SmoothWarmingUpQuota>`.
#[derive(Clone, Copy, Debug)]
pub struct SmoothWarmingUpQuota {
    pub(crate) rate: f64,
    pub(crate) warmup: Duration,
    pub(crate) cold_factor: f64,
    /// [`SmoothWarmingUp`](crate::SmoothWarmingUp)'s derived constants for this quota.
    pub(crate) cfg: SmoothConfig,
}

impl SmoothWarmingUpQuota {
    /// Guava's `SmoothWarmingUp` for `rate`, `warmup` and `cold_factor`, validated as
    /// [`SmoothWarmingUp`](crate::SmoothWarmingUp)'s builder validates them.
    fn new(
        rate: f64,
        warmup: Duration,
        cold_factor: f64,
    ) -> Result<SmoothWarmingUpQuota, ConfigError> {
        let (rate, cfg) = smooth::warming_config(rate, warmup, cold_factor)?;
        Ok(SmoothWarmingUpQuota {
            rate,
            warmup,
            cold_factor,
            cfg,
        })
    }
}

/// The single limiter's state word (epoch 0) for `x`, and back: `x` is that word without
/// its (always zero) epoch bits.
#[inline(always)]
fn word(x: u128) -> u128 {
    x << EPOCH_BITS
}

#[inline(always)]
fn x_of(word: u128) -> u128 {
    word >> EPOCH_BITS
}

/// A reading in nanoseconds past `base` (before it: the base).
#[inline(always)]
fn since(base: u64, now: Nanos) -> u64 {
    now.as_u64().saturating_sub(base)
}

/// The map's rule: `x` is the key's `(next_free - base, stored)` (module docs, "Two numbers
/// in one word").
impl WordRule for SmoothWarmingUpQuota {
    type Word = u128;
    /// `(rate, warmup, cold_factor)` of each quota.
    type Quotas = Vec<(f64, Duration, f64)>;
    const NAME: &'static str = "KeyedSmoothWarmingUp";

    fn rules(
        quotas: &Self::Quotas,
        _: impl FnOnce() -> Nanos,
    ) -> Result<Vec<SmoothWarmingUpQuota>, ConfigError> {
        quotas
            .iter()
            .map(|&(rate, warmup, cf)| SmoothWarmingUpQuota::new(rate, warmup, cf))
            .collect()
    }

    fn debug_quotas(rules: &[SmoothWarmingUpQuota], d: &mut fmt::DebugStruct<'_, '_>) {
        let quotas: Vec<_> = rules
            .iter()
            .map(|q| (q.rate, q.warmup, q.cold_factor))
            .collect();
        d.field("quotas", &quotas);
    }

    /// Cold: the store full, `next_free = B`.
    #[inline(always)]
    fn born(&self, base: u64, now: Nanos) -> u128 {
        x_of(smooth::pack(since(base, now), FRAC_ONE, 0))
    }

    #[inline(always)]
    fn check(&self, x: u128, base: u64, now: Nanos, n: u32) -> Result<Option<u128>, Denied> {
        let w = word(x);
        let t = since(base, now);
        let next = smooth::next_free(w);
        if next > t {
            // A debt owed at `now`, whatever `n`; its end saturated at the word's: never.
            let at = (next != u64::MAX)
                .then(|| base.checked_add(next))
                .flatten()
                .map(Nanos::new);
            return Err(Denied::new(now, at));
        }
        if n == 0 || self.cfg.inf {
            // Nothing taken, or every cost zero: not written (the rule's contract 2).
            return Ok(None);
        }
        let x2 = x_of(self.cfg.reserve(w, t, n).1);
        // A grant whose cost rounds to nothing and spends no representable store (rates
        // past 2e9/s with a store of more than 2^40 permits) consumed nothing the word can
        // hold: not written (contract 2).
        Ok((x2 != x).then_some(x2))
    }

    /// Exactly a fresh key's state: no debt and the store full at `now`.
    #[inline(always)]
    fn idle(&self, x: u128, base: u64, now: Nanos) -> bool {
        let w = word(x);
        let t = since(base, now);
        if smooth::next_free(w) > t {
            return false;
        }
        self.cfg.inf || self.cfg.stored(self.cfg.resync(w, t).1) >= self.cfg.max_permits
    }
}

/// Per-key Guava `SmoothWarmingUp` limiters, one 128-bit word per key in a table shared by
/// all keys. See the [module docs](self) for the word, a key's birth and the deviations.
///
/// ```
/// use std::net::IpAddr;
/// use std::time::Duration;
/// use turnstile::keyed::smooth_warming_up::KeyedSmoothWarmingUp;
///
/// // 10 permits per second per client IP, reached over a 2 s warm-up from cold.
/// let per_ip = KeyedSmoothWarmingUp::new(10.0, Duration::from_secs(2)).unwrap();
/// let client: IpAddr = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.check(&client).is_ok());
/// assert_eq!(per_ip.len(), 1);
/// ```
///
/// Quotas per key: a small table of configurations, and a function that picks one for each
/// new key.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::smooth_warming_up::KeyedSmoothWarmingUp, ManualClock, Nanos};
///
/// let per_user = KeyedSmoothWarmingUp::builder(2.0, Duration::from_secs(4)) // quota 0
///     .quota(100.0, Duration::from_secs(1), 3.0) // quota 1
///     .classify(|user: &String| usize::from(user.starts_with("staff:")))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t = Nanos::new(1_000_000_000);
/// assert!(per_user.check_n_at("alice", t, 1).is_ok());
/// let denied = per_user.check_n_at("alice", t, 1).unwrap_err();
/// // Cold: the first permit costs 1.375 s (Guava's warm-up example).
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(1375)));
/// assert!(per_user.check_n_at("staff:bob", t, 1).is_ok());
/// ```
///
/// # A check
/// `check_n_at(key, now, n)` takes `n` permits for `key` at `now` if no debt is owed at `now`, as
/// one atomic step, inserting the key (cold) if it is new; otherwise changes nothing, as
/// [`SmoothWarmingUp`](crate::SmoothWarmingUp)'s [`Limiter`](crate::Limiter) check (Guava's
/// `tryAcquire(n, 0)`). Stored permits are spent first, at the warm-up's price (up to `cold_factor
/// / rate` each, down to `1 / rate` at the threshold); the rest cost `1 / rate` each; the cost
/// pushes the debt. A denial says when the debt clears (never, `None`, past the map's range). A
/// refusal because the map is full ([`WhenFull::Deny`]) says when the next early sweep may make
/// room. `n == 0` takes nothing and passes iff no debt is owed.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::smooth_warming_up::KeyedSmoothWarmingUp, ManualClock, Nanos};
/// // Guava's example: 2 per second after a 4 s warm-up, cold factor 3.
/// let k = KeyedSmoothWarmingUp::<u8, _, _>::builder(2.0, Duration::from_secs(4))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let mut now = Nanos::new(1_000_000_000);
/// let mut waits = Vec::new();
/// for _ in 0..8 {
///     assert!(k.check_n_at(&1, now, 1).is_ok());
///     let d = k.check_n_at(&1, now, 1).unwrap_err();
///     waits.push(d.retry_after().unwrap().as_millis());
///     now = d.retry_at().unwrap();
/// }
/// assert_eq!(waits, [1375, 1125, 875, 625, 500, 500, 500, 500]);
/// ```
///
/// # Idle keys
/// `evict_idle_at(now)` evicts every key idle at `now`: no debt, and its store full again (cold),
/// exactly the state of a key born at `now`. Returns how many went; afterwards, if the table holds
/// more evicted slots than live keys, rebuilds it without them.
///
/// `now` may be any time and no key ever grants more for it (keys revived or inserted
/// after this call are born at `now` or later, module docs).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::smooth_warming_up::KeyedSmoothWarmingUp, ManualClock, Nanos};
/// let k = KeyedSmoothWarmingUp::<u8, _, _>::builder(2.0, Duration::from_secs(4))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t = Nanos::new(1_000_000_000);
/// let _ = k.check_n_at(&1, t, 1); // 1.375 s of debt, one permit spent from the store
/// assert_eq!(k.evict_idle_at(t + Duration::from_millis(1500)), 0); // 7.25 stored of 8
/// assert_eq!(k.evict_idle_at(t + Duration::from_secs(60)), 1);
/// assert!(k.is_empty());
/// ```
pub type KeyedSmoothWarmingUp<K, S = RandomState, C = QuantaClock> =
    InlineMap<K, SmoothWarmingUpQuota, S, C>;

impl<K> InlineMap<K, SmoothWarmingUpQuota, RandomState, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// `rate` permits per second per key reached after `warmup` from cold, with cold factor
    /// 3 (Guava's `RateLimiter.create(rate, warmup)`), on the shared quanta clock, with at
    /// most 2^20 (1 048 576) keys and sweeps every 10 s. The same errors as
    /// [`build`](InlineMapBuilder::build).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::smooth_warming_up::KeyedSmoothWarmingUp, ConfigError};
    /// let k = KeyedSmoothWarmingUp::new(5.0, Duration::from_secs(1)).unwrap();
    /// assert!(k.check(&42u64).is_ok());
    /// let err = KeyedSmoothWarmingUp::<u64>::new(5.0, Duration::ZERO).unwrap_err();
    /// assert_eq!(err, ConfigError::ZeroWarmup(Duration::ZERO));
    /// ```
    pub fn new(rate: f64, warmup: Duration) -> Result<Self, ConfigError> {
        Self::builder(rate, warmup).build()
    }

    /// A builder whose quota 0 is `rate` permits per second reached after `warmup`, cold
    /// factor 3: change that with [`cold_factor`](InlineMapBuilder::cold_factor), add quotas
    /// with `quota` and pick one per key with
    /// [`classify`](InlineMapBuilder::classify).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::smooth_warming_up::{KeyedSmoothWarmingUp, WhenFull};
    /// let k = KeyedSmoothWarmingUp::<u32>::builder(5.0, Duration::from_secs(2))
    ///     .cold_factor(4.0)
    ///     .max_keys(100_000)
    ///     .when_full(WhenFull::Deny)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(rate: f64, warmup: Duration) -> InlineMapBuilder<K, SmoothWarmingUpQuota> {
        InlineMapBuilder::with_quotas(vec![(rate, warmup, DEFAULT_COLD_FACTOR)])
    }
}

impl<K, S, C> InlineMapBuilder<K, SmoothWarmingUpQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Quota 0's cold interval as a multiple of its stable one (Guava's `coldFactor`,
    /// default 3.0, at least 1): a cold key's first permits cost up to `cold_factor / rate`
    /// each. Below 1, infinite or NaN is [`ConfigError::InvalidColdFactor`] at
    /// [`build`](InlineMapBuilder::build).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::smooth_warming_up::KeyedSmoothWarmingUp, ConfigError, ManualClock, Nanos};
    /// let k = KeyedSmoothWarmingUp::builder(1.0, Duration::from_secs(2))
    ///     .cold_factor(1.0) // no warm-up premium: every permit costs 1 s
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let t = Nanos::new(1_000_000_000);
    /// assert!(k.check_n_at(&1u8, t, 1).is_ok());
    /// let d = k.check_n_at(&1u8, t, 1).unwrap_err();
    /// assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    /// let err = KeyedSmoothWarmingUp::<u8>::builder(1.0, Duration::from_secs(2))
    ///     .cold_factor(0.5)
    ///     .build();
    /// assert_eq!(err.unwrap_err(), ConfigError::InvalidColdFactor(0.5));
    /// ```
    pub fn cold_factor(mut self, cold_factor: f64) -> Self {
        self.quotas[0].2 = cold_factor;
        self
    }

    /// Adds a quota of `rate` permits per second reached after `warmup` with `cold_factor`:
    /// the first call adds quota 1 (quota 0 is the builder's), and so on, up to
    /// [`MAX_QUOTAS`] in all (more is [`ConfigError::TooManyQuotas`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::smooth_warming_up::KeyedSmoothWarmingUp;
    /// let k = KeyedSmoothWarmingUp::builder(1.0, Duration::from_secs(1))
    ///     .quota(1000.0, Duration::from_millis(100), 3.0) // quota 1
    ///     .classify(|ip: &[u8; 4]| usize::from(ip[0] == 10))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&[10, 0, 0, 1]).is_ok());
    /// ```
    pub fn quota(mut self, rate: f64, warmup: Duration, cold_factor: f64) -> Self {
        self.quotas.push((rate, warmup, cold_factor));
        self
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::keyed::word_rule::Word;
    use crate::{Idle, Limiter, ManualClock, SmoothWarmingUp};

    /// `(rate, warm-up ms, cold factor)`: Guava's test configurations, and others.
    const CONFIGS: [(f64, u64, f64); 8] = [
        (2.0, 4000, 3.0),
        (5.0, 4000, 10.0),
        (5.0, 4000, 1.0),
        (0.5, 100, 3.0),
        (1e6, 1, 3.0),
        (1000.0, 2500, 7.5),
        (3.0, 1, 2.0),
        (f64::INFINITY, 10, 3.0),
    ];

    fn quota(rate: f64, ms: u64, cf: f64) -> SmoothWarmingUpQuota {
        SmoothWarmingUpQuota::new(rate, Duration::from_millis(ms), cf).unwrap()
    }

    fn warming(rate: f64, ms: u64, cf: f64, born: Nanos) -> SmoothWarmingUp<ManualClock> {
        let mut l = SmoothWarmingUp::builder(rate, Duration::from_millis(ms))
            .cold_factor(cf)
            .clock(ManualClock::default())
            .build()
            .unwrap();
        l.born_at(born);
        l
    }

    /// The rule answers as a `SmoothWarmingUp` born at the same time, bit for bit: grant or
    /// refusal, the refusal's retry time and idleness, check by check, on readings that
    /// mostly move on and sometimes go back (stale ones, from the base on).
    #[test]
    fn the_rule_agrees_with_a_born_smooth_warming_up() {
        let mut below = crate::clock::random_below();
        for &(rate, ms, cf) in &CONFIGS {
            let q = quota(rate, ms, cf);
            let i = if rate.is_finite() {
                (1e9 / rate) as u64
            } else {
                1000
            };
            let warmup = ms * 1_000_000;
            for _ in 0..100 {
                let base = below(1 << 40);
                let born = base + below(1 << 36);
                let l = warming(rate, ms, cf, Nanos::new(born));
                let mut x = q.born(base, Nanos::new(born));
                let mut now = born;
                for _ in 0..300 {
                    now += match below(6) {
                        0 => below(i * 3 + 1),
                        1 => warmup + below(3),
                        2 => i,
                        3 => 0,
                        _ => below(i / 2 + 2),
                    };
                    let t = if below(8) == 0 {
                        now.saturating_sub(below(i * 2 + 2)).max(base)
                    } else {
                        now
                    };
                    let t = Nanos::new(t);
                    let n = below(4) as u32;
                    assert_eq!(q.idle(x, base, t), l.is_idle_at(t), "idle at {t:?}");
                    let got = q.check(x, base, t, n);
                    let want = l.check_n_at(t, n);
                    assert_eq!(
                        got.map(|_| ()),
                        want,
                        "{rate}/s {ms} ms {cf}: n {n} at {t:?}"
                    );
                    if let Ok(Some(x2)) = got {
                        assert_ne!(x2, x, "contract 2: a grant that writes changes x");
                        assert!(x2 <= <u128 as Word>::X_MASK);
                        x = x2;
                    }
                }
            }
        }
    }

    /// Contract 3: a key idle at `J`, evicted and born again at `B >= J`, grants nothing its
    /// old state would have refused, stale readings included; and where the newborn grants,
    /// the two states are the same afterwards (advanced to `B`, the idle key is the newborn).
    #[test]
    fn an_idle_key_born_again_never_grants_more() {
        let mut below = crate::clock::random_below();
        let mut evictions = 0u32;
        for &(rate, ms, cf) in &CONFIGS {
            let q = quota(rate, ms, cf);
            let i = if rate.is_finite() {
                (1e9 / rate) as u64
            } else {
                1000
            };
            let warmup = ms * 1_000_000;
            for _ in 0..300 {
                let base = below(1 << 40);
                // A history of a few grants from birth, then a sweep at J.
                let mut x = q.born(base, Nanos::new(base + below(warmup)));
                let mut now = base + below(warmup + 1);
                for _ in 0..below(6) {
                    now += below(i * 2 + 1);
                    if let Ok(w) = q.check(x, base, Nanos::new(now), 1 + below(3) as u32) {
                        x = w.unwrap_or(x);
                    }
                }
                let j =
                    now + [0, warmup / 2, warmup + i * 4, below(warmup * 3 + 1)][below(4) as usize];
                if !q.idle(x, base, Nanos::new(j)) {
                    continue;
                }
                evictions += 1;
                let bb = j + [0, 1, below(warmup + 3)][below(3) as usize];
                let mut born = q.born(base, Nanos::new(bb));
                let mut old = x;
                for _ in 0..40 {
                    let at = (bb + below(warmup + i * 2 + 2))
                        .saturating_sub(below(warmup + i * 2 + 2))
                        .max(base);
                    let at = Nanos::new(at);
                    let n = below(4) as u32;
                    if let Ok(w) = q.check(born, base, at, n) {
                        let o = q.check(old, base, at, n);
                        assert!(
                            o.is_ok(),
                            "born {born} granted n {n} at {at:?}, old {old} refused"
                        );
                        if let Some(w) = w {
                            // A write from the newborn: the old state, resynced at the same
                            // reading, is the same word.
                            assert_eq!(o.unwrap(), Some(w), "at {at:?}");
                            (born, old) = (w, w);
                        }
                    }
                }
            }
        }
        assert!(evictions > 500, "only {evictions} idle states tried");
    }

    /// A debt that saturates the word is "never", and such a key is never idle; the widest
    /// configurations build and check without a panic.
    #[test]
    fn a_debt_past_the_word_is_never() {
        let q = SmoothWarmingUpQuota::new(1e-9, Duration::from_secs(1), 3.0).unwrap();
        let base = 5;
        let t = Nanos::new(base + 1_000);
        let x = q
            .check(q.born(base, t), base, t, u32::MAX)
            .unwrap()
            .unwrap();
        let d = q.check(x, base, t, 1).unwrap_err();
        assert_eq!(d.retry_at(), None);
        assert!(!q.idle(x, base, Nanos::MAX));
        for (rate, warmup, cf) in [
            (f64::MAX, Duration::MAX, f64::MAX / 2.0),
            (1e-300, Duration::from_nanos(1), 1.0),
            (1e300, Duration::MAX, 1.0),
        ] {
            let q = SmoothWarmingUpQuota::new(rate, warmup, cf).unwrap();
            for now in [0, 1, base, u64::MAX / 2, u64::MAX] {
                let now = Nanos::new(now);
                let mut x = q.born(base, now);
                for n in [0, 1, u32::MAX] {
                    if let Ok(w) = q.check(x, base, now, n) {
                        x = w.unwrap_or(x);
                    }
                    let _ = q.idle(x, base, now);
                    assert!(x <= <u128 as Word>::X_MASK);
                }
            }
        }
    }
}
