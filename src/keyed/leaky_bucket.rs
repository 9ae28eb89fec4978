//! Per-key leaky buckets with the state **inline**, uber-go `ratelimit` semantics: each key is
//! its key and one 64-bit word in an open-addressing table shared by all keys, the same table
//! and protocol as [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s (lookup, insert, eviction,
//! revival, resizes, sweeps, key bound; its module docs describe them). The general
//! [`Keyed`](crate::Keyed)`<K, LeakyBucket>` holds a whole bucket per key behind a pointer
//! (two cache misses per random-key check); this map shares the configuration between keys,
//! so a `u64` key costs a 16-byte slot and a check one miss.
//!
//! # The state word
//! Each key is a [`LeakyBucket`](crate::LeakyBucket): one number, `next`, the time of the
//! next permission issue (upstream's `state`), with `T = per / rate` truncated to whole
//! nanoseconds (`perRequest`) and `M = slack * T` (`maxSlack`). A take at `now` from `prev` is
//! upstream's switch, in nanoseconds:
//!
//! ```text
//! now - prev > M + T  -> next = now - M
//! otherwise           -> next = prev + T
//! ```
//!
//! and a check of `n` is `n` consecutive takes at one `now`, granted iff the last `next` is
//! `<= now` (every one of them immediate), exactly as the [`Limiter`](crate::Limiter) check of
//! `LeakyBucket`; a refusal writes nothing and retries at `prev + n * T` (never, `None`, if
//! `n > slack + 1` with `T > 0`).
//!
//! The word keeps `next` shifted so that it counts from the map's **base** (the clock reading
//! at construction) and is never negative:
//!
//! ```text
//!  63      62..59       58..0
//! [FROZEN][ tag (4) ][   x (59 bits)   ]     x = next - base + M + T
//!   tag 1..=15: a live key of quota `tag - 1`
//!   tag 0, FROZEN: the engine's (EMPTY, DEAD, a resize's copy)
//! ```
//!
//! With `w = now - base` (the reading's offset), upstream's cap condition `now - prev > M + T`
//! is `w > x`, and a grant needs the last `x <= w + M + T`. Readings before the base count as
//! the base. Every `next` a bucket reaches is at least `base - max(M, T)` (a birth's `B - T`,
//! a cap branch's `now - M`, or more), so `x >= 0`.
//!
//! **Range.** A granted `x` is at most `w + M + T`, so the word holds readings up to
//! `R = 2^59 - 1 - (M + T)` ns past the base: **at least 8.5 years** for every quota the
//! builder accepts; a quota whose `slack + 1` paces `(slack + 1) * T` exceed about 9.76 years
//! (`2^59 - 1` ns less 8.5 years) is [`ConfigError::PacesTooLong`]. Past the range time stands
//! still for the map: each key gets at most its `slack + 1` more and is then refused (it
//! fails closed).
//!
//! **Budget.** `next` never decreases while a key lives, each granted permit moves it by at
//! least `T`, and a grant at `now` leaves it in `[now - M, now]`
//! ([`LeakyBucket`](crate::LeakyBucket)'s invariant, which the shift leaves as it is): at
//! most `slack + 1 + d / T` permits in any span `d` of readings, whatever their order.
//!
//! **Orderings.** The rule has no atomics of its own: it computes the next word from the one
//! the map loaded, and the map's CASes (and why their orderings are enough) are the whole
//! protocol (`src/keyed/word_map.rs`). All the rule needs from them is that a grant is applied
//! with one CAS from the word it was computed from, which every ordering gives.
//!
//! # A key's birth, and eviction
//! A key is **born** at `B` when it is inserted, or revived after a sweep at `J <= B` evicted
//! it (`B` is the later of the check's reading and the last sweep's time): `next = B - T`,
//! as [`Keyed`](crate::Keyed) dates a new [`LeakyBucket`](crate::LeakyBucket)
//! ([`Idle::born_at`](crate::Idle::born_at)). A take at `B` then commits `next = B`, exactly
//! as upstream's first take; a reading older than `B` is refused until `B`; credit banks from
//! `B` on, up to the slack. A key is **idle** at `J` when `J - next > M + T` (every take from
//! `J` on runs the cap branch: the bucket remembers nothing but its full credit); then
//! `next < J - M - T < B - T`, and since upstream's step is monotone in `next`
//! (`next' = max(prev + T, now - M)`), the newborn is at least as strict as the evicted bucket
//! at every reading, stale ones included: eviction never hands a key more than it had.
//!
//! # Deviations
//! From uber-go/ratelimit, besides [`LeakyBucket`](crate::LeakyBucket)'s own (D6, D7):
//! * a new key is born with `next = B - T`, not upstream's "first take ever: `next = now`":
//!   the first check of one permit is granted at once as upstream's, but a first check of
//!   `n >= 2` is refused with a retry time (`B + (n - 1) * T`) rather than never, credit
//!   banks from the birth even if the first checks were refused, and an evicted key comes
//!   back with no credit. The map cannot tell a new key from one it evicted (or purged in a
//!   resize) and inserts again, so every birth is the one a revival needs;
//! * readings before the base count as the base, and past the range time stands still;
//! * no blocking `take` and no `take_at`: a take always consumes, so its `next` could run
//!   without bound into the future, past the word's range, and the engine answers only grant
//!   or refusal. [`KeyedLeakyBucket::check_n_at`] is `try_take` for `n` permits.
//!
//! From [`Keyed`](crate::Keyed)`<K, LeakyBucket>`: the same answers, refusals' retry times
//! included, except where its bucket stays unset (a birth at a clock reading `B < T`: it then
//! keeps upstream's "first take" state, which refuses `n >= 2` for good, where this map's is
//! `B - T` as for every other birth), for readings before the base, and past the range.
//!
//! # Quotas, memory, HashDoS, sweeps
//! As [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s: up to [`MAX_QUOTAS`] configurations
//! picked per new key by `classify`, a slot of `8 + size_of::<K>()` bytes, at most `max_keys`
//! keys (a new key finding the map full is refused, [`WhenFull::Deny`], or let through
//! untracked, [`WhenFull::Allow`]), std's `RandomState` by default, and sweeps every
//! `sweep_every` inline, by hand ([`KeyedLeakyBucket::evict_idle`]) or on a thread of their
//! own ([`KeyedLeakyBucket::spawn_sweeper`]). A key is evicted by the first sweep more than
//! `(slack + 1) * T` after its `next`.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

pub use crate::keyed::word_map::MAX_QUOTAS;
pub use crate::keyed::WhenFull;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::word_rule::{WordRule, RANGE_MIN, X_MASK};
use crate::keyed::{InlineMap, InlineMapBuilder};
use crate::leaky_bucket::{DEFAULT_PER, DEFAULT_SLACK};
use crate::limiter::Denied;

/// The longest `M + T` (ns) that leaves [`RANGE_MIN`] of readings in the word.
const CAP_MAX: u64 = X_MASK - RANGE_MIN;

/// One quota of a [`KeyedLeakyBucket`]: the rule its keys follow, its configuration
/// precomputed. The map's builder makes it (`builder`, `quota`); it is the map's type
/// parameter (`KeyedLeakyBucket<K>` is `InlineMap<K, LeakyBucketQuota>`), named only to name
/// the map's builder, `InlineMapBuilder<K, LeakyBucketQuota>`.
#[derive(Clone, Copy, Debug)]
pub struct LeakyBucketQuota {
    pub(crate) rate: u32,
    pub(crate) per: Duration,
    pub(crate) slack: u32,
    /// `T = per / rate`, truncated (upstream's `perRequest`).
    pub(crate) t: u64,
    /// `M = slack * T` (`maxSlack`).
    pub(crate) m: u64,
    /// `M + T`: the shift of `x`, and upstream's cap condition.
    pub(crate) cap: u64,
    /// The last reading offset (ns past the base) the word counts: `X_MASK - cap`.
    pub(crate) range: u64,
}

impl LeakyBucketQuota {
    /// Upstream's `perRequest` and `maxSlack`; rate 0 or `per` 0 ([`ConfigError::ZeroRate`],
    /// [`ConfigError::ZeroPeriod`], [`LeakyBucket`](crate::LeakyBucket)'s D6), or
    /// `(slack + 1) * T` past [`CAP_MAX`] ([`ConfigError::PacesTooLong`]).
    fn new(rate: u32, per: Duration, slack: u32) -> Result<LeakyBucketQuota, ConfigError> {
        crate::leaky_bucket::validate(rate, per)?;
        let t = per.as_nanos() / u128::from(rate);
        // Exact: t < 2^96 and slack + 1 <= 2^32.
        let cap = t * (u128::from(slack) + 1);
        if cap > u128::from(CAP_MAX) {
            let secs = u64::try_from(cap / 1_000_000_000).unwrap_or(u64::MAX);
            let long = Duration::new(secs, (cap % 1_000_000_000) as u32);
            return Err(ConfigError::PacesTooLong(long));
        }
        // cap <= CAP_MAX < 2^59: every product below fits.
        let (t, cap) = (t as u64, cap as u64);
        Ok(LeakyBucketQuota {
            rate,
            per,
            slack,
            t,
            m: cap - t,
            cap,
            range: X_MASK - cap,
        })
    }

    /// `w`: the reading's offset past `base`, in `[0, range]`.
    #[inline(always)]
    fn w(&self, base: u64, now: Nanos) -> u64 {
        now.as_u64().saturating_sub(base).min(self.range)
    }

    /// The refusal of `n` takes from `x` (their last `next` came out past `now`): upstream's
    /// `prev + n * T`, the time at which the same check passes if nobody else takes; `None`
    /// for `n > slack + 1`. A refusal with `n <= slack + 1` came from the default branch
    /// (from the cap branch the last `next` is `now - M + (n - 1) * T <= now`), whose last
    /// `x` is `x + n * T > w + cap`, so the time is after `now`.
    #[inline(always)]
    fn refused(&self, x: u64, base: u64, now: Nanos, n: u32) -> Denied {
        if n - 1 > self.slack {
            return Denied::new(now, None);
        }
        // x + n * T - cap = the retry time's offset past base (n * T <= cap: no overflow).
        let at = u128::from(base) + u128::from(x + u64::from(n) * self.t - self.cap);
        // u64::MAX is never a time anything is granted at (LeakyBucket's end of time).
        let at = u64::try_from(at).ok().filter(|&t| t < u64::MAX);
        Denied::new(now, at.map(Nanos::new))
    }
}

/// The map's rule: `x` is the key's `next` shifted by `M + T - base` (module docs, "The state
/// word").
impl WordRule for LeakyBucketQuota {
    type Word = u64;
    /// `(rate, per, slack)` of each quota.
    type Quotas = Vec<(u32, Duration, u32)>;
    const NAME: &'static str = "KeyedLeakyBucket";

    fn rules(
        quotas: &Self::Quotas,
        _: impl FnOnce() -> Nanos,
    ) -> Result<Vec<LeakyBucketQuota>, ConfigError> {
        quotas
            .iter()
            .map(|&(rate, per, slack)| LeakyBucketQuota::new(rate, per, slack))
            .collect()
    }

    fn debug_quotas(rules: &[LeakyBucketQuota], d: &mut fmt::DebugStruct<'_, '_>) {
        let quotas: Vec<_> = rules.iter().map(|q| (q.rate, q.per, q.slack)).collect();
        d.field("quotas", &quotas);
    }

    /// `next = B - T`: `x = w(B) + M`.
    #[inline(always)]
    fn born(&self, base: u64, now: Nanos) -> u64 {
        self.w(base, now) + self.m
    }

    #[inline(always)]
    fn check(&self, x: u64, base: u64, now: Nanos, n: u32) -> Result<Option<u64>, Denied> {
        if n == 0 {
            return Ok(None);
        }
        if n - 1 > self.slack && self.t > 0 {
            // After the first take next >= now - M, so the last is past now.
            return Err(Denied::new(now, None));
        }
        let w = self.w(base, now);
        // Upstream's switch: `now - prev > M + T` is `w > x`.
        let first = if w > x { w + self.t } else { x + self.t };
        // The other n - 1 are the default branch (n - 1 <= slack, or T = 0): at most
        // x + cap + M <= 2^60, no overflow.
        let last = first + u64::from(n - 1) * self.t;
        if last <= w + self.cap {
            // T = 0 and a reading no later than `next`: nothing moves, nothing is written.
            return Ok((last != x).then_some(last));
        }
        Err(self.refused(x, base, now, n))
    }

    /// `now - next > M + T`: `w > x`.
    #[inline(always)]
    fn idle(&self, x: u64, base: u64, now: Nanos) -> bool {
        x < self.w(base, now)
    }
}

/// Per-key leaky buckets (uber-go `ratelimit` semantics), one 64-bit word per key in a table
/// shared by all keys. See the [module docs](self) for the word, a key's birth and the
/// deviations.
///
/// ```
/// use std::net::IpAddr;
/// use turnstile::keyed::leaky_bucket::KeyedLeakyBucket;
///
/// // 10 requests per second per client IP, 100 ms apart, 10 of credit after idling.
/// let per_ip = KeyedLeakyBucket::new(10).unwrap();
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
/// use turnstile::{keyed::leaky_bucket::KeyedLeakyBucket, ManualClock, Nanos};
///
/// let per_user = KeyedLeakyBucket::builder(1) // quota 0: 1 per second, no slack
///     .without_slack()
///     .quota(100, Duration::from_secs(1), 10) // quota 1
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
/// `check_n_at(key, now, n)` takes `n` permits for `key` at `now` if `n` consecutive takes would
/// all be immediate, as one atomic step, inserting the key if it is new; otherwise changes nothing,
/// as [`LeakyBucket`](crate::LeakyBucket)'s [`Limiter`](crate::Limiter) check. A denial says when
/// the same check would pass if nobody else takes (`prev + n * T`); never (`None`) if `n > slack +
/// 1`. A refusal because the map is full ([`WhenFull::Deny`]) says when the next early sweep may
/// make room. `n == 0` always passes.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::leaky_bucket::KeyedLeakyBucket, ManualClock, Nanos};
/// let k = KeyedLeakyBucket::<u8, _, _>::builder(10)
///     .slack(3)
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t0 = Nanos::new(1_000_000_000);
/// assert!(k.check_n_at(&1, t0, 1).is_ok());           // a new key: one at once
/// let t1 = t0 + Duration::from_secs(10);              // idle: 3 permits of credit
/// assert!(k.check_n_at(&1, t1, 4).is_ok());           // slack + 1 at once
/// let d = k.check_n_at(&1, t1, 1).unwrap_err();
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
/// ```
///
/// # Idle keys
/// `evict_idle_at(now)` evicts every key idle at `now`: more than `(slack + 1) * T` past its
/// `next`, so that every take from `now` on finds its credit full. Returns how many went;
/// afterwards, if the table holds more evicted slots than live keys, rebuilds it without them.
///
/// `now` may be any time and no key ever grants more for it (keys revived or inserted
/// after this call are born at `now` or later, module docs).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::leaky_bucket::KeyedLeakyBucket, ManualClock, Nanos};
/// let k = KeyedLeakyBucket::<u8, _, _>::builder(10) // 100 ms apart
///     .slack(1)
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t = Nanos::new(1_000_000_000);
/// let _ = k.check_n_at(&1, t, 1);
/// let _ = k.check_n_at(&2, t + Duration::from_millis(150), 1);
/// // Key 1 is idle once more than 200 ms have passed since its `next` (t).
/// assert_eq!(k.evict_idle_at(t + Duration::from_millis(201)), 1);
/// assert_eq!(k.len(), 1);
/// ```
pub type KeyedLeakyBucket<K, S = RandomState, C = QuantaClock> =
    InlineMap<K, LeakyBucketQuota, S, C>;

impl<K> InlineMap<K, LeakyBucketQuota, RandomState, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// `rate` permits per second per key with the default slack of 10 (upstream's
    /// `New(rate)`), on the shared quanta clock, with at most 2^20 (1 048 576) keys and
    /// sweeps every 10 s. A rate of 0 is [`ConfigError::ZeroRate`].
    ///
    /// ```
    /// use turnstile::{keyed::leaky_bucket::KeyedLeakyBucket, ConfigError};
    /// let k = KeyedLeakyBucket::new(5).unwrap();
    /// assert!(k.check(&42u64).is_ok());
    /// assert_eq!(KeyedLeakyBucket::<u64>::new(0).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(rate: u32) -> Result<Self, ConfigError> {
        Self::builder(rate).build()
    }

    /// A builder whose quota 0 is `rate` permits per second with slack 10: change them with
    /// [`per`](InlineMapBuilder::per), [`slack`](InlineMapBuilder::slack) and
    /// [`without_slack`](InlineMapBuilder::without_slack), add quotas with
    /// `quota` and pick one per key with
    /// [`classify`](InlineMapBuilder::classify).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::leaky_bucket::{KeyedLeakyBucket, WhenFull};
    /// let k = KeyedLeakyBucket::<u32>::builder(5)
    ///     .per(Duration::from_secs(60))
    ///     .slack(2)
    ///     .max_keys(100_000)
    ///     .when_full(WhenFull::Deny)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(rate: u32) -> InlineMapBuilder<K, LeakyBucketQuota> {
        InlineMapBuilder::with_quotas(vec![(rate, DEFAULT_PER, DEFAULT_SLACK)])
    }
}

impl<K, S, C> InlineMapBuilder<K, LeakyBucketQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Counts quota 0's rate per `per` instead of per second (upstream's `Per`; default one
    /// second). Zero is [`ConfigError::ZeroPeriod`] at [`build`](InlineMapBuilder::build).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::leaky_bucket::KeyedLeakyBucket, ManualClock, Nanos};
    /// let k = KeyedLeakyBucket::builder(2)
    ///     .per(Duration::from_millis(10)) // 5 ms apart
    ///     .without_slack()
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let t = Nanos::new(1_000_000_000);
    /// assert!(k.check_n_at(&1u8, t, 1).is_ok());
    /// let d = k.check_n_at(&1u8, t, 1).unwrap_err();
    /// assert_eq!(d.retry_after(), Some(Duration::from_millis(5)));
    /// ```
    pub fn per(mut self, per: Duration) -> Self {
        self.quotas[0].1 = per;
        self
    }

    /// Lets idling bank up to `slack` permits of credit in quota 0 (upstream's `WithSlack`;
    /// default 10); after an idle stretch `slack + 1` checks are immediate.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::leaky_bucket::KeyedLeakyBucket, ManualClock, Nanos};
    /// let k = KeyedLeakyBucket::builder(10).slack(4).clock(ManualClock::default()).build().unwrap();
    /// let t = Nanos::new(1_000_000_000);
    /// assert!(k.check_n_at(&1u8, t, 1).is_ok());
    /// assert!(k.check_n_at(&1u8, t + Duration::from_secs(9), 5).is_ok());
    /// ```
    pub fn slack(mut self, slack: u32) -> Self {
        self.quotas[0].2 = slack;
        self
    }

    /// No credit at all in quota 0 (upstream's `WithoutSlack`, i.e. slack 0).
    ///
    /// ```
    /// use turnstile::keyed::leaky_bucket::KeyedLeakyBucket;
    /// let k = KeyedLeakyBucket::builder(1).without_slack().build().unwrap();
    /// assert!(k.check(&1u8).is_ok());
    /// assert_eq!(k.check_n(&2u8, 2).unwrap_err().retry_at(), None);
    /// ```
    pub fn without_slack(self) -> Self {
        self.slack(0)
    }

    /// Adds a quota of `rate` permits per `per` with `slack` of credit: the first call adds
    /// quota 1 (quota 0 is the builder's), and so on, up to [`MAX_QUOTAS`] in all (more is
    /// [`ConfigError::TooManyQuotas`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::leaky_bucket::KeyedLeakyBucket;
    /// let k = KeyedLeakyBucket::builder(1)
    ///     .quota(1000, Duration::from_secs(1), 100) // quota 1
    ///     .classify(|ip: &[u8; 4]| usize::from(ip[0] == 10))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&[10, 0, 0, 1]).is_ok());
    /// ```
    pub fn quota(mut self, rate: u32, per: Duration, slack: u32) -> Self {
        self.quotas.push((rate, per, slack));
        self
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{Idle, LeakyBucket, Limiter, ManualClock};

    /// Configurations with T = 0, T = 1, small and large T, slack 0 and more.
    const CONFIGS: [(u32, u64, u32); 8] = [
        (10, 1_000_000_000, 10),
        (10, 1_000_000_000, 0),
        (3, 1_000_000_000, 2),
        (1_000_000, 1_000_000_000, 5),
        (7, 60_000_000_000, 1),
        (1_000, 999, 3),             // T = 0
        (1, 1, 4),                   // T = 1
        (1, 86_400_000_000_000, 30), // a day apart, 31 days of credit
    ];

    fn quota(rate: u32, per: u64, slack: u32) -> LeakyBucketQuota {
        LeakyBucketQuota::new(rate, Duration::from_nanos(per), slack).unwrap()
    }

    fn bucket(rate: u32, per: u64, slack: u32, b: Nanos) -> LeakyBucket<ManualClock> {
        let mut lb = LeakyBucket::builder(rate)
            .per(Duration::from_nanos(per))
            .slack(slack)
            .clock(ManualClock::default())
            .build()
            .unwrap();
        lb.born_at(b);
        lb
    }

    /// The rule answers as a `LeakyBucket` born at the same time (its `Idle::born_at`), check
    /// by check: grant or refusal, the refusal's retry time, and idleness; readings go
    /// forwards and backwards (stale), and land on the branches' edges.
    #[test]
    fn the_rule_agrees_with_a_born_leaky_bucket() {
        let mut below = crate::clock::random_below();
        for &(rate, per, slack) in &CONFIGS {
            let q = quota(rate, per, slack);
            for _ in 0..200 {
                let base = below(1 << 40);
                // A birth at or after T (below it, LeakyBucket stays unset: a deviation).
                let b = base + q.t + below(1 << 36);
                let lb = bucket(rate, per, slack, Nanos::new(b));
                let mut x = q.born(base, Nanos::new(b));
                let mut now = b;
                for _ in 0..300 {
                    let step = match below(6) {
                        0 => below(q.t.max(1) * 3),
                        1 => q.cap + below(3),
                        2 => q.t,
                        3 => 0,
                        _ => below(q.t.max(1) / 2 + 2),
                    };
                    now = if below(5) == 0 {
                        now.saturating_sub(step).max(base)
                    } else {
                        now + step
                    };
                    let t = Nanos::new(now);
                    let n = match below(4) {
                        0 => below(u64::from(slack) + 3) as u32,
                        1 => u32::MAX - below(2) as u32,
                        _ => 1,
                    };
                    assert_eq!(q.idle(x, base, t), lb.is_idle_at(t), "idle at {now}");
                    let want = lb.check_n_at(t, n);
                    let got = q.check(x, base, t, n);
                    assert_eq!(
                        got.map(|_| ()),
                        want,
                        "{rate}/{per}ns slack {slack}: n {n} at {now}"
                    );
                    if let Ok(Some(x2)) = got {
                        assert_ne!(x2, x, "contract 2: a grant that writes changes x");
                        assert!(x2 <= X_MASK);
                        x = x2;
                    }
                }
            }
        }
    }

    /// Contract 3: a key idle at `J`, evicted and born again at `B >= J`, grants nothing its
    /// old state would have refused, stale readings (before `B`, before `J`) included. The
    /// old state shadows the newborn: it takes exactly the newborn's grants, and each must be
    /// one it grants too. Every idle state near the boundary is tried, with readings on the
    /// edges (`B`, `B - T`, `J - M - T`, ...).
    #[test]
    fn an_idle_key_born_again_never_grants_more() {
        let mut below = crate::clock::random_below();
        let mut evictions = 0u32;
        for &(rate, per, slack) in &CONFIGS {
            let q = quota(rate, per, slack);
            for _ in 0..300 {
                let base = below(1 << 40);
                let j = base + below(q.cap * 4 + 1000);
                let wj = q.w(base, Nanos::new(j));
                // States around the idle boundary and the newborn's x.
                let x_old = match below(3) {
                    0 => wj.saturating_sub(below(q.cap + 3)),
                    1 => wj + q.m + below(3),
                    _ => wj + below(q.cap + 3),
                };
                if !q.idle(x_old, base, Nanos::new(j)) {
                    continue;
                }
                evictions += 1;
                let b = j + [0, 1, below(q.cap + 3)][below(3) as usize];
                let mut born = q.born(base, Nanos::new(b));
                let mut old = x_old;
                for _ in 0..40 {
                    let edges = [
                        b,
                        b.saturating_sub(q.t),
                        j.saturating_sub(q.cap),
                        j,
                        b + q.t,
                    ];
                    let at = if below(2) == 0 {
                        edges[below(5) as usize] + below(2)
                    } else {
                        (b + below(q.cap * 2 + 2)).saturating_sub(below(q.cap * 2 + 2))
                    };
                    let at = Nanos::new(at.max(base));
                    let n = 1 + below(u64::from(slack) + 1) as u32;
                    if let Ok(w) = q.check(born, base, at, n) {
                        let o = q.check(old, base, at, n);
                        assert!(
                            o.is_ok(),
                            "born {born} granted n {n} at {at:?}, old {old} refused"
                        );
                        born = w.unwrap_or(born);
                        old = o.unwrap().unwrap_or(old);
                    }
                }
            }
        }
        assert!(evictions > 500, "only {evictions} idle states tried");
    }

    #[test]
    fn the_range_is_at_least_eight_and_a_half_years() {
        const YEAR: f64 = 365.25 * 86_400e9;
        let d = Duration::from_nanos;
        for (rate, per, slack) in [(1, 1, 0), (10, 1_000_000_000, 10), (1, CAP_MAX, 0)] {
            let q = LeakyBucketQuota::new(rate, d(per), slack).unwrap();
            assert!(q.range as f64 >= 8.5 * YEAR, "{rate}/{per} slack {slack}");
            // The last reading of the range: a granted word still fits.
            let top = Nanos::new(q.range);
            let x = q.born(0, top);
            assert!(x <= X_MASK);
            if let Ok(Some(x2)) = q.check(x, 0, top, 1) {
                assert!(x2 <= X_MASK);
            }
        }
        assert_eq!(
            LeakyBucketQuota::new(1, d(CAP_MAX + 1), 0).unwrap_err(),
            ConfigError::PacesTooLong(d(CAP_MAX + 1))
        );
        // (slack + 1) * T counts: half the longest pace, twice, fits; plus one does not.
        assert!(LeakyBucketQuota::new(1, d(CAP_MAX / 2), 1).is_ok());
        assert!(LeakyBucketQuota::new(1, d(CAP_MAX / 2 + 1), 1).is_err());
        assert!(LeakyBucketQuota::new(1, Duration::MAX, u32::MAX).is_err());
        assert_eq!(
            LeakyBucketQuota::new(0, d(1), 0).unwrap_err(),
            ConfigError::ZeroRate
        );
        assert_eq!(
            LeakyBucketQuota::new(1, Duration::ZERO, 0).unwrap_err(),
            ConfigError::ZeroPeriod
        );
    }

    /// Past the range time stands still: a key gets at most its slack + 1 more, then is
    /// refused for good (it fails closed), and nothing overflows.
    #[test]
    fn past_the_range_a_key_fails_closed() {
        let q = quota(10, 1_000_000_000, 2);
        let base = 5;
        let mut x = q.born(base, Nanos::new(base));
        let mut grants = 0;
        for i in 0..10u64 {
            let t = Nanos::new(base + q.range + i * 1_000_000_000_000);
            if let Ok(w) = q.check(x, base, t, 1) {
                grants += 1;
                x = w.unwrap_or(x);
            }
        }
        assert_eq!(grants, 3);
        assert!(q.check(x, base, Nanos::MAX, 1).is_err());
    }
}
