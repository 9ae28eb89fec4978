//! Per-key Guava `SmoothBursty` limiters with the state **inline**: each key is its key and
//! one 64-bit word in an open-addressing table shared by all keys, the same table and
//! protocol as [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s (lookup, insert, eviction,
//! revival, resizes, sweeps, key bound; its module docs describe them). The general
//! [`Keyed`](crate::Keyed)`<K, SmoothBursty>` holds a whole limiter per key behind a pointer
//! (two cache misses per random-key check, and a 128-bit word); this map shares the
//! configuration between keys, so a `u64` key costs a 16-byte slot and a check one miss.
//!
//! # One number for Guava's two
//! Guava's bursty state is `(stored, next_free)`, with the stable interval `I = 1 / rate`
//! as its cool-down interval and `max_permits = rate * max_burst_seconds`
//! ([`SmoothBursty`](crate::SmoothBursty)'s module docs). Write `M = max_permits * I` (that
//! is `max_burst_seconds`) and `z = next_free - stored * I`, a GCRA theoretical arrival
//! time. Then Guava's steps are:
//!
//! ```text
//! resync at now:       z = max(z, now - M)      (stored = min(max, stored + idle / I))
//! spend n (pay later): z = z + n * I            (stored first, free; the rest pushes next_free)
//! grant iff            z <= now                 (next_free <= now: tryAcquire(n, 0))
//! ```
//!
//! `next_free <= now` is `z <= now` because stored permits are left only by a spend that
//! did not empty the store, which leaves `next_free` at the resync's reading: with readings
//! that never go back, `stored > 0` implies `next_free <= now`, and `stored = 0` is
//! `z = next_free`. So a check of `n` at `now` is granted iff `z <= now` (whatever `n`: Guava
//! pays later), and then writes `z' = max(z, now - M) + n * I`; a refusal writes nothing and
//! retries at `z` (when the debt clears).
//!
//! This does not carry over to Guava's `SmoothWarmingUp`: there every stored permit costs at
//! least `I` of `next_free`, so a spend from the store leaves a debt with permits still
//! stored, and `stored` and `next_free` are two independent numbers (two warming-up states
//! with one `z` answer a reading differently: `a_warm_up_spend_leaves_a_debt_and_a_store` in
//! `tests/smooth_semantics.rs`). Both to the nanosecond over the range below do not fit one
//! 64-bit word (`next_free` alone takes 58 bits), so the per-key warming-up limiter,
//! [`KeyedSmoothWarmingUp`](crate::KeyedSmoothWarmingUp), keeps the pair in a 128-bit word
//! of the same table (a 32-byte slot for a `u64` key).
//!
//! # The state word
//! `z` is counted in the **units** of `src/scale.rs`, as
//! [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s arrival time: one permit is exactly
//! `one` units, so grants never drift, and a reading converts with one multiplication. It is
//! shifted by `M` past the map's **base** (the clock reading at construction) so that it is
//! never negative:
//!
//! ```text
//!  63      62..59       58..0
//! [FROZEN][ tag (4) ][   x (59 bits)   ]     x = z - base + M   (units)
//!   tag 1..=15: a live key of quota `tag - 1`
//!   tag 0, FROZEN: the engine's (EMPTY, DEAD, a resize's copy)
//! ```
//!
//! With `u = units(now - base)`, a check is **granted iff `x <= u + M`** and writes
//! `x' = max(x, u) + n * one`. Every `z` is at least `base - M` (a birth's `z = B`, a
//! resync's `now - M`, or more), so `x >= 0`.
//!
//! **Precision.** Units are the token bucket's with `fine = 0`: for a rate up to 1e9/s a
//! unit is at most 1 ns, and exactly 1 ns when `I` is a whole number of nanoseconds below
//! 2^31 (2.1 s) and the store, rounded up to whole permits, spans at most 2^55 ns: then every
//! step above is exact to the nanosecond. Otherwise a reading is rounded down to a unit, a
//! retry time up to the next whole nanosecond, and `M` to the nearest unit. [`SmoothBursty`](crate::SmoothBursty) instead rounds each cost to the
//! nearest nanosecond and holds the store in `2^-39` fractions of `max_permits`, so the two
//! agree exactly where both are exact, and within about a nanosecond per check elsewhere.
//!
//! **Range.** `u` is kept at most `U_MAX = 2^59 - 2^55 - 1` units and `M` at most 2^55
//! (`src/scale.rs` keeps a burst within 2^55 units), so a granted `x'` fits its 59 bits
//! (saturated below): for a rate up to 1e9/s the map runs for **at least 8.5 years from its
//! base**; above it a unit is one permit and the range is `U_MAX` permits' worth of time
//! (1.7 years at 1e10/s). Readings before the base count as the base, and past the range
//! time stands still for the map: each key gets at most `max_permits + 1` more grants and
//! is then refused for good (it fails closed). A quota whose `max_permits` exceeds `2^32 - 1`,
//! or whose `max(1, max_permits)` intervals exceed 146 years, is
//! [`ConfigError::SmoothOutOfRange`].
//!
//! **A debt past the range.** Pay later: one grant of `n` pushes `x` by `n * one` however
//! far that is (`u32::MAX` permits at 1/s is 136 years). `x'` saturates at `2^59 - 1`, which
//! no reading in the range reaches: a refusal whose retry time lies past the range says
//! "never" (`retry_at() == None`), and a key in debt is not idle, so it stays refused until
//! its debt clears, however long that is.
//!
//! **Budget.** `x` never decreases while a key lives (nor across an eviction, below), each
//! grant of `n` raises it by `n * one` from at least `u`, and a grant at `t` needs
//! `x <= u(t) + M` before its own cost. So for any readings in `[a, b]`, whatever the order in
//! which they arrive, the grants of a key, **all but the last to take effect**, total at
//! most `max_permits + rate * (b - a)` permits (plus a unit's rounding of each end), and the
//! last may be of any size (pay later). With checks of one permit: at most
//! `max_permits + 1 + rate * (b - a)` in any span `b - a` of readings.
//!
//! **Orderings.** The rule has no atomics of its own: it computes the next word from the one
//! the map loaded, and the map's CASes (and why their orderings are enough) are the whole
//! protocol (`src/keyed/word_map.rs`). A refusal is decided from that one load and writes nothing.
//!
//! # A key's birth, and eviction
//! A key is **born** at `B` when it is inserted, or revived after a sweep at `J <= B` evicted
//! it (`B` is the later of the check's reading and the last sweep's time): `z = B`, nothing
//! stored and no debt, as Guava's bursty limiter starts and as [`Keyed`](crate::Keyed) dates
//! a new [`SmoothBursty`](crate::SmoothBursty) ([`Idle::born_at`](crate::Idle::born_at)). A
//! key is **idle** at `J` when its debt has cleared, `z <= J` (`x <= u(J) + M`), as
//! `SmoothBursty`'s [`Idle`](crate::Idle) with no initial stored permits. Then
//! `z <= J <= B`, and since the step `z' = max(z, t - M) + n * I` is monotone in `z` and a
//! grant needs `z <= t`, the newborn is at least as strict as the evicted key at every
//! reading, stale ones included: eviction never hands a key more than it had (the word
//! rule's contract 3).
//!
//! # Deviations
//! From Guava's `SmoothBursty`, besides [`SmoothBursty`](crate::SmoothBursty)'s own:
//! * **stale readings**: a reading older than the key's last resync is judged by `z`, so it
//!   may be granted from stored permits where Guava (and `SmoothBursty`, whose `next_free`
//!   is the resync's reading) refuses; the budget above holds all the same;
//! * no stored permits at birth (Guava's default: `SmoothBursty`'s
//!   `initial_stored_permits` is not offered), and a key revived after an eviction starts
//!   so too, forgetting the credit it had banked;
//! * a debt whose end lies past the range is "never" (above), where Guava waits;
//! * only the non-blocking check ([`KeyedSmoothBursty::check_n_at`] is
//!   `tryAcquire(n, 0)`): no `acquire`, `reserve` or `set_rate`. A check of `n = 0` takes
//!   nothing and is granted iff there is no debt, as `SmoothBursty`'s.
//!
//! From [`Keyed`](crate::Keyed)`<K, SmoothBursty>` with readings that never go back: the same
//! answers, refusals' retry times included, up to the rounding above; for stale readings,
//! before the base, and past the range, as above.
//!
//! # Quotas, memory, HashDoS, sweeps
//! As [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s: up to [`MAX_QUOTAS`] configurations
//! picked per new key by `classify`, a slot of `8 + size_of::<K>()` bytes, at most `max_keys`
//! keys (a new key finding the map full is refused, [`WhenFull::Deny`], or let through
//! untracked, [`WhenFull::Allow`]), std's `RandomState` by default, and sweeps every
//! `sweep_every` inline, by hand ([`KeyedSmoothBursty::evict_idle`]) or on a thread of their
//! own ([`KeyedSmoothBursty::spawn_sweeper`]). A key is evicted by the first sweep at or
//! after its debt clears.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};

pub use crate::keyed::word_map::MAX_QUOTAS;
pub use crate::keyed::WhenFull;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::word_rule::{WordRule, X_MASK};
use crate::keyed::{InlineMap, InlineMapBuilder};
use crate::limit::Limit;
use crate::limiter::Denied;
use crate::scale::{nanos_ceil_pos, Scale, D_MAX, TAU_MAX};

/// The largest `u`: a grant needs `x <= u + M <= U_MAX + TAU_MAX < X_MASK`, so a word
/// saturated at [`X_MASK`] is never granted within the range.
const U_MAX: u64 = X_MASK - TAU_MAX - 1;
const _: () = assert!(U_MAX + TAU_MAX < X_MASK);

/// Guava's default `maxBurstSeconds` for `RateLimiter.create(rate)`.
pub(crate) const DEFAULT_MAX_BURST_SECONDS: f64 = 1.0;

/// One quota of a [`KeyedSmoothBursty`]: the rule its keys follow, its configuration
/// precomputed. The map's builder makes it (`builder`, `quota`); it is the map's type
/// parameter (`KeyedSmoothBursty<K>` is `InlineMap<K, SmoothBurstyQuota>`), named only to name
/// the map's builder, `InlineMapBuilder<K, SmoothBurstyQuota>`.
#[derive(Clone, Copy, Debug)]
pub struct SmoothBurstyQuota {
    pub(crate) rate: f64,
    pub(crate) max_burst_seconds: f64,
    pub(crate) scale: Scale,
    /// `M = max_permits * one`, rounded: the store's capacity in units, at most `TAU_MAX`.
    pub(crate) m: u64,
    /// `+inf` rate: every check passes and nothing is written.
    pub(crate) inf: bool,
}

impl SmoothBurstyQuota {
    /// Guava's `doSetRate` for `rate` and `max_burst_seconds`, validated:
    /// [`ConfigError::RateNotPositive`], [`ConfigError::SubnormalLimit`] and
    /// [`ConfigError::InvalidBurstSeconds`] as [`SmoothBursty`](crate::SmoothBursty)'s, and
    /// [`ConfigError::SmoothOutOfRange`] for a quota the word cannot hold.
    fn new(rate: f64, max_burst_seconds: f64) -> Result<SmoothBurstyQuota, ConfigError> {
        let rate = crate::smooth::check_rate(rate)?;
        let b = max_burst_seconds;
        if !(b >= 0.0 && b.is_finite()) {
            return Err(ConfigError::InvalidBurstSeconds(b));
        }
        let out = ConfigError::SmoothOutOfRange {
            rate,
            max_burst_seconds,
        };
        let inf = rate == f64::INFINITY;
        let max_permits = b * rate;
        let scale = if inf {
            Some(Scale {
                one: 1,
                mul: 0,
                per: 0,
                per_shift: 0,
            })
        } else if max_permits > f64::from(u32::MAX) {
            None
        } else {
            // Units that keep the whole store, rounded up to whole permits, within TAU_MAX.
            let burst = (max_permits.ceil() as u32).max(1);
            Scale::new(Limit::per_second(rate)?, burst, 0)
        };
        let scale = scale.ok_or(out)?;
        let m = if inf {
            0
        } else {
            // <= ceil(max_permits) * one <= TAU_MAX.
            (max_permits * scale.one as f64).round() as u64
        };
        debug_assert!(m <= TAU_MAX);
        Ok(SmoothBurstyQuota {
            rate,
            max_burst_seconds,
            scale,
            m,
            inf,
        })
    }

    /// Units at `now` past `base`, saturating at both ends: `[0, U_MAX]`.
    #[inline(always)]
    fn units(&self, base: u64, now: Nanos) -> u64 {
        let d = now.as_u64().saturating_sub(base).min(D_MAX);
        self.scale.units(d).min(U_MAX)
    }

    /// The refusal of a check on `x > u + M`: it retries when the debt clears, at `z`, the
    /// first nanosecond whose reading converts to `x - M` units; never if that lies past
    /// the range (or past the end of time).
    #[inline(always)]
    fn denied(&self, x: u64, base: u64, now: Nanos) -> Denied {
        // x - M > u >= 0, and a finite rate refills (`per >= 2^63`): `nanos_ceil_pos` applies.
        let z = x - self.m;
        let at = if z > U_MAX {
            None
        } else {
            nanos_ceil_pos(z, self.scale.per, self.scale.per_shift)
                .and_then(|ns| ns.checked_add(base))
                .map(Nanos::new)
        };
        Denied::new(now, at)
    }
}

/// The map's rule: `x` is the key's `z` in its quota's units, shifted by `M - base` (module
/// docs, "The state word").
impl WordRule for SmoothBurstyQuota {
    type Word = u64;
    /// `(rate, max_burst_seconds)` of each quota.
    type Quotas = Vec<(f64, f64)>;
    const NAME: &'static str = "KeyedSmoothBursty";

    fn rules(
        quotas: &Self::Quotas,
        _: impl FnOnce() -> Nanos,
    ) -> Result<Vec<SmoothBurstyQuota>, ConfigError> {
        quotas
            .iter()
            .map(|&(rate, b)| SmoothBurstyQuota::new(rate, b))
            .collect()
    }

    fn debug_quotas(rules: &[SmoothBurstyQuota], d: &mut fmt::DebugStruct<'_, '_>) {
        let quotas: Vec<_> = rules
            .iter()
            .map(|q| (q.rate, q.max_burst_seconds))
            .collect();
        d.field("quotas", &quotas);
    }

    /// `z = B`: `x = u(B) + M`.
    #[inline(always)]
    fn born(&self, base: u64, now: Nanos) -> u64 {
        self.units(base, now) + self.m
    }

    #[inline(always)]
    fn check(&self, x: u64, base: u64, now: Nanos, n: u32) -> Result<Option<u64>, Denied> {
        if self.inf {
            return Ok(None);
        }
        let u = self.units(base, now);
        if x > u + self.m {
            // A debt owed at `now` (`next_free > now`), whatever `n`.
            return Err(self.denied(x, base, now));
        }
        if n == 0 {
            // Nothing taken: not written (the rule's contract 2).
            return Ok(None);
        }
        // max(x, u) <= U_MAX + TAU_MAX < 2^59 and n * one < 2^63: no overflow; saturated
        // where the debt runs past the word (a grant raises x: x < X_MASK here).
        Ok(Some((x.max(u) + u64::from(n) * self.scale.one).min(X_MASK)))
    }

    /// No debt at `now`: `z <= now`, `x <= u + M`.
    #[inline(always)]
    fn idle(&self, x: u64, base: u64, now: Nanos) -> bool {
        self.inf || x <= self.units(base, now) + self.m
    }
}

/// Per-key Guava `SmoothBursty` limiters, one 64-bit word per key in a table shared by all
/// keys. See the [module docs](self) for the word, a key's birth and the deviations.
///
/// ```
/// use std::net::IpAddr;
/// use turnstile::keyed::smooth_bursty::KeyedSmoothBursty;
///
/// // 10 permits per second per client IP, up to 1 s of them stored while idle.
/// let per_ip = KeyedSmoothBursty::new(10.0).unwrap();
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
/// use turnstile::{keyed::smooth_bursty::KeyedSmoothBursty, ManualClock, Nanos};
///
/// let per_user = KeyedSmoothBursty::builder(1.0) // quota 0: 1 per second
///     .quota(100.0, 0.5) // quota 1: 100 per second, 50 stored at most
///     .classify(|user: &String| usize::from(user.starts_with("staff:")))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t = Nanos::new(1_000_000_000);
/// assert!(per_user.check_n_at("alice", t, 1).is_ok());
/// let denied = per_user.check_n_at("alice", t, 1).unwrap_err();
/// assert_eq!(denied.retry_after(), Some(Duration::from_secs(1)));
/// assert!(per_user.check_n_at("staff:bob", t, 1).is_ok());
/// ```
///
/// # A check
/// `check_n_at(key, now, n)` takes `n` permits for `key` at `now` if no debt is owed at `now`, as
/// one atomic step, inserting the key if it is new; otherwise changes nothing, as
/// [`SmoothBursty`](crate::SmoothBursty)'s [`Limiter`](crate::Limiter) check (Guava's
/// `tryAcquire(n, 0)`). Stored permits are spent first, at no cost; the rest push the debt by `1 /
/// rate` each. A denial says when the debt clears (never, `None`, past the map's range). A refusal
/// because the map is full ([`WhenFull::Deny`]) says when the next early sweep may make room. `n ==
/// 0` takes nothing and passes iff no debt is owed.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::smooth_bursty::KeyedSmoothBursty, ManualClock, Nanos};
/// let k = KeyedSmoothBursty::<u8, _, _>::builder(2.0) // 500 ms apart, 2 stored at most
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t0 = Nanos::new(1_000_000_000);
/// assert!(k.check_n_at(&1, t0, 1).is_ok());            // a new key: granted
/// let d = k.check_n_at(&1, t0, 1).unwrap_err();        // 500 ms of debt
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
/// let t1 = t0 + Duration::from_secs(10);               // idle: 2 stored
/// assert!(k.check_n_at(&1, t1, 3).is_ok());            // 2 stored + 1 on credit
/// let d = k.check_n_at(&1, t1, 1).unwrap_err();
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
/// ```
///
/// # Idle keys
/// `evict_idle_at(now)` evicts every key idle at `now`: its debt cleared, as a key born at `now`
/// (no stored permits, no debt) or more generous. Returns how many went; afterwards, if the table
/// holds more evicted slots than live keys, rebuilds it without them.
///
/// `now` may be any time and no key ever grants more for it (keys revived or inserted
/// after this call are born at `now` or later, module docs).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::smooth_bursty::KeyedSmoothBursty, ManualClock, Nanos};
/// let k = KeyedSmoothBursty::<u8, _, _>::builder(10.0) // 100 ms apart
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t = Nanos::new(1_000_000_000);
/// let _ = k.check_n_at(&1, t, 1);
/// let _ = k.check_n_at(&2, t, 3);
/// // Key 1's debt clears at t + 100 ms, key 2's at t + 300 ms.
/// assert_eq!(k.evict_idle_at(t + Duration::from_millis(100)), 1);
/// assert_eq!(k.len(), 1);
/// ```
pub type KeyedSmoothBursty<K, S = RandomState, C = QuantaClock> =
    InlineMap<K, SmoothBurstyQuota, S, C>;

impl<K> InlineMap<K, SmoothBurstyQuota, RandomState, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// `rate` permits per second per key with a 1-second burst (Guava's
    /// `RateLimiter.create(rate)`), on the shared quanta clock, with at most 2^20
    /// (1 048 576) keys and sweeps every 10 s. The same errors as
    /// [`build`](InlineMapBuilder::build).
    ///
    /// ```
    /// use turnstile::{keyed::smooth_bursty::KeyedSmoothBursty, ConfigError};
    /// let k = KeyedSmoothBursty::new(5.0).unwrap();
    /// assert!(k.check(&42u64).is_ok());
    /// let err = KeyedSmoothBursty::<u64>::new(0.0).unwrap_err();
    /// assert_eq!(err, ConfigError::RateNotPositive(0.0));
    /// ```
    pub fn new(rate: f64) -> Result<Self, ConfigError> {
        Self::builder(rate).build()
    }

    /// A builder whose quota 0 is `rate` permits per second with a 1-second burst: change it
    /// with [`max_burst_seconds`](InlineMapBuilder::max_burst_seconds), add quotas with
    /// `quota` and pick one per key with
    /// [`classify`](InlineMapBuilder::classify).
    ///
    /// ```
    /// use turnstile::keyed::smooth_bursty::{KeyedSmoothBursty, WhenFull};
    /// let k = KeyedSmoothBursty::<u32>::builder(5.0)
    ///     .max_burst_seconds(2.0)
    ///     .max_keys(100_000)
    ///     .when_full(WhenFull::Deny)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(rate: f64) -> InlineMapBuilder<K, SmoothBurstyQuota> {
        InlineMapBuilder::with_quotas(vec![(rate, DEFAULT_MAX_BURST_SECONDS)])
    }
}

impl<K, S, C> InlineMapBuilder<K, SmoothBurstyQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// How many seconds of permits quota 0 stores while idle (Guava's `maxBurstSeconds`,
    /// default 1.0): `max_permits = max_burst_seconds * rate`. Negative, infinite or NaN is
    /// [`ConfigError::InvalidBurstSeconds`] at [`build`](InlineMapBuilder::build).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::smooth_bursty::KeyedSmoothBursty, ManualClock, Nanos};
    /// let k = KeyedSmoothBursty::builder(10.0)
    ///     .max_burst_seconds(0.5) // 5 stored at most
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let t = Nanos::new(1_000_000_000);
    /// assert!(k.check_n_at(&1u8, t, 1).is_ok());
    /// let later = t + Duration::from_secs(60);
    /// for _ in 0..6 {
    ///     assert!(k.check_n_at(&1u8, later, 1).is_ok()); // 5 stored, then 1 on credit
    /// }
    /// assert!(k.check_n_at(&1u8, later, 1).is_err());
    /// ```
    pub fn max_burst_seconds(mut self, seconds: f64) -> Self {
        self.quotas[0].1 = seconds;
        self
    }

    /// Adds a quota of `rate` permits per second storing up to `max_burst_seconds` of them:
    /// the first call adds quota 1 (quota 0 is the builder's), and so on, up to
    /// [`MAX_QUOTAS`] in all (more is [`ConfigError::TooManyQuotas`]).
    ///
    /// ```
    /// use turnstile::keyed::smooth_bursty::KeyedSmoothBursty;
    /// let k = KeyedSmoothBursty::builder(1.0)
    ///     .quota(1000.0, 0.1) // quota 1
    ///     .classify(|ip: &[u8; 4]| usize::from(ip[0] == 10))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&[10, 0, 0, 1]).is_ok());
    /// ```
    pub fn quota(mut self, rate: f64, max_burst_seconds: f64) -> Self {
        self.quotas.push((rate, max_burst_seconds));
        self
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::keyed::word_rule::RANGE_MIN;
    use crate::{Idle, Limiter, ManualClock, SmoothBursty};
    use std::time::Duration;

    /// `(rate, max_burst_seconds)`: exact whole-nanosecond intervals (the units are
    /// nanoseconds), and ones that are not.
    const CONFIGS: [(f64, f64); 8] = [
        (2.0, 1.0),
        (10.0, 2.5),
        (1e9 / (1u64 << 28) as f64, 4.0 * (1u64 << 28) as f64 / 1e9),
        (1000.0, 0.0),
        (3.0, 1.0),
        (7.0, 60.0),
        (0.25, 8.0),
        (1e6, 0.001),
    ];

    fn quota(rate: f64, b: f64) -> SmoothBurstyQuota {
        SmoothBurstyQuota::new(rate, b).unwrap()
    }

    fn bursty(rate: f64, b: f64, born: Nanos) -> SmoothBursty<ManualClock> {
        let mut l = SmoothBursty::builder(rate)
            .max_burst_seconds(b)
            .clock(ManualClock::default())
            .build()
            .unwrap();
        l.born_at(born);
        l
    }

    /// Whether `I` is a whole number of nanoseconds that `SmoothBursty`'s store holds
    /// exactly too (a power of two, and `max_permits` one): there the two agree bit for bit.
    fn exact(rate: f64, b: f64) -> bool {
        let i = 1e9 / rate;
        let max = rate * b;
        i.fract() == 0.0 && (i as u64).is_power_of_two() && max.fract() == 0.0 && {
            let m = max as u64;
            m == 0 || m.is_power_of_two()
        }
    }

    /// The rule answers as a `SmoothBursty` born at the same time, check by check on readings
    /// that never go back: grant or refusal, the refusal's retry time (exactly where both
    /// are exact, else within a nanosecond and a unit per check), and idleness.
    #[test]
    fn the_rule_agrees_with_a_born_smooth_bursty() {
        let mut below = crate::clock::random_below();
        for &(rate, b) in &CONFIGS {
            let q = quota(rate, b);
            let i = (1e9 / rate) as u64;
            // Elsewhere a reading's unit, a nanosecond of rounding and one of the ceiling.
            let tol = if exact(rate, b) {
                0
            } else {
                2 + q.scale.nanos_ceil(1) as u64
            };
            let mut parted = 0u32;
            for _ in 0..100 {
                let base = below(1 << 40);
                let born = base + below(1 << 36);
                let l = bursty(rate, b, Nanos::new(born));
                let mut x = q.born(base, Nanos::new(born));
                let mut now = born;
                for _ in 0..300 {
                    now += match below(6) {
                        0 => below(i * 3 + 1),
                        1 => q.scale.nanos_ceil(q.m) as u64 + below(3),
                        2 => i,
                        3 => 0,
                        _ => below(i / 2 + 2),
                    };
                    let t = Nanos::new(now);
                    let n = below(4) as u32;
                    let idle = (q.idle(x, base, t), l.is_idle_at(t));
                    let want = l.check_n_at(t, n);
                    let got = q.check(x, base, t, n);
                    if tol == 0 {
                        assert_eq!(idle.0, idle.1, "idle at {now}");
                        assert_eq!(got.map(|_| ()), want, "{rate}/s {b} s: n {n} at {now}");
                    } else {
                        // Apart only within the rounding: retry times close, and a
                        // decision apart only for a reading that close to the boundary
                        // (the two states part there: on to the next sequence).
                        let close =
                            |d: &Denied| d.retry_at().unwrap().as_u64().abs_diff(now) <= tol;
                        match (&got, &want) {
                            (Ok(_), Ok(())) => {}
                            (Err(a), Err(w)) => {
                                let (a, w) = (a.retry_at().unwrap(), w.retry_at().unwrap());
                                let diff = a.as_u64().abs_diff(w.as_u64());
                                assert!(diff <= tol, "{rate}/s {b} s: {a:?} vs {w:?}");
                            }
                            (Err(d), Ok(())) | (Ok(_), Err(d)) => {
                                assert!(close(d), "{rate}/s {b} s: n {n} at {now}: {d:?}");
                                parted += 1;
                                break;
                            }
                        }
                    }
                    if let Ok(Some(x2)) = got {
                        assert_ne!(x2, x, "contract 2: a grant that writes changes x");
                        assert!(x2 <= X_MASK);
                        x = x2;
                    }
                }
            }
            // Readings land on the boundaries on purpose (whole intervals, whole stores).
            assert!(
                parted <= 50,
                "{rate}/s {b} s: {parted} of 100 sequences parted"
            );
        }
    }

    /// Contract 3: a key idle at `J`, evicted and born again at `B >= J`, grants nothing its
    /// old state would have refused, stale readings (before `B`, before `J`) included.
    #[test]
    fn an_idle_key_born_again_never_grants_more() {
        let mut below = crate::clock::random_below();
        let mut evictions = 0u32;
        for &(rate, b) in &CONFIGS {
            let q = quota(rate, b);
            let i = (1e9 / rate) as u64;
            let m_ns = q.scale.nanos_ceil(q.m) as u64;
            for _ in 0..300 {
                let base = below(1 << 40);
                let j = base + below(m_ns * 4 + i * 4 + 1000);
                let uj = q.units(base, Nanos::new(j));
                let x_old = match below(3) {
                    0 => uj.saturating_sub(below(q.m + 3)),
                    1 => uj + q.m - below(3).min(uj + q.m),
                    _ => uj + below(q.m + 3),
                };
                if !q.idle(x_old, base, Nanos::new(j)) {
                    continue;
                }
                evictions += 1;
                let bb = j + [0, 1, below(m_ns + 3)][below(3) as usize];
                let mut born = q.born(base, Nanos::new(bb));
                let mut old = x_old;
                for _ in 0..40 {
                    let edges = [
                        bb,
                        bb.saturating_sub(m_ns),
                        j.saturating_sub(m_ns),
                        j,
                        bb + i,
                    ];
                    let at = if below(2) == 0 {
                        edges[below(5) as usize] + below(2)
                    } else {
                        (bb + below(m_ns * 2 + i + 2)).saturating_sub(below(m_ns * 2 + i + 2))
                    };
                    let at = Nanos::new(at.max(base));
                    let n = below(4) as u32;
                    if let Ok(w) = q.check(born, base, at, n) {
                        let o = q.check(old, base, at, n);
                        assert!(
                            o.is_ok(),
                            "born {born} granted n {n} at {at:?}, old {old} refused"
                        );
                        born = w.unwrap_or(born);
                        old = o.unwrap().unwrap_or(old);
                        assert!(old <= born);
                    }
                }
            }
        }
        assert!(evictions > 500, "only {evictions} idle states tried");
    }

    #[test]
    fn the_range_is_at_least_eight_and_a_half_years_up_to_1e9() {
        for rate in [1e-3, 0.3, 1.0, 3.0, 1e3, 3e7, 1e9] {
            for b in [0.0, 1.0, 1e3] {
                let Ok(q) = SmoothBurstyQuota::new(rate, b) else {
                    continue;
                };
                let range = q.scale.nanos_floor(U_MAX);
                assert!(range >= u128::from(RANGE_MIN), "{rate}/s {b} s: {range}");
                // The last reading of the range: a granted word still fits, and saturates.
                let top = Nanos::new(range as u64);
                let x = q.born(0, top);
                let x2 = q.check(x, 0, top, u32::MAX).unwrap().unwrap();
                assert!(x2 <= X_MASK);
            }
        }
    }

    /// A debt past the range saturates and is "never"; past the range time stands still,
    /// so a key gets at most `max_permits + 1` more checks and then fails closed.
    #[test]
    fn past_the_range_a_key_fails_closed() {
        let q = quota(1.0, 2.0);
        let base = 5;
        let t = Nanos::new(base + 1_000);
        // A debt within the range: its end, to the nanosecond.
        let x = q.check(q.born(base, t), base, t, 1_000).unwrap().unwrap();
        let d = q.check(x, base, t, 1).unwrap_err();
        assert_eq!(d.retry_at(), Some(t + Duration::from_secs(1_000)));
        // 136 years of debt: past the range, never.
        let x = q
            .check(q.born(base, t), base, t, u32::MAX)
            .unwrap()
            .unwrap();
        assert_eq!(q.check(x, base, t, 1).unwrap_err().retry_at(), None);
        assert!(!q.idle(x, base, Nanos::MAX));
        let mut x = q.born(base, Nanos::new(base));
        let mut grants = 0;
        for k in 0..10u64 {
            let t = Nanos::MAX.as_u64() - 1_000_000 + k;
            if let Ok(w) = q.check(x, base, Nanos::new(t), 1) {
                grants += 1;
                x = w.unwrap_or(x);
            }
        }
        assert_eq!(grants, 3);
        let again = q.check(x, base, Nanos::MAX, u32::MAX);
        assert!(again.is_err());
        let saturated = q.check(q.born(base, Nanos::MAX), base, Nanos::MAX, u32::MAX);
        let saturated = saturated.unwrap().unwrap();
        assert_eq!(saturated, X_MASK);
        assert_eq!(
            q.check(saturated, base, Nanos::MAX, 0)
                .unwrap_err()
                .retry_at(),
            None
        );
    }
}
