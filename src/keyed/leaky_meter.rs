//! Per-key water-level meters ([`LeakyMeter`](crate::LeakyMeter), go-zero's article's leaky
//! bucket) with the state **inline**: each key is its key and one 64-bit word in the table
//! [`KeyedTokenBucket`](crate::KeyedTokenBucket) uses, nothing else. The general
//! [`Keyed`](crate::Keyed)`<K, LeakyMeter>` holds a whole meter per key behind a pointer
//! (two cache misses per random-key check); this map shares the configuration between keys,
//! so a `u64` key costs a 16-byte slot and a check one miss.
//!
//! # Why there is no new protocol here
//! A meter of `capacity` units leaking at `leak` is a token bucket with `burst = capacity`
//! and `limit = leak` seen from the other side (`water = capacity - tokens`; the
//! [`leaky_meter`](crate::leaky_meter) module docs say why). So this map *is* the keyed token
//! bucket's: the same word (a GCRA arrival time), the same rule and table, the same
//! eviction (a key is idle once its water has all leaked away), the same budget
//! (`capacity + leak * span` units over any span of a key's readings, stale ones and
//! evictions included), model-checked under loom in `loom-tests/tests/keyed_bucket.rs`.
//! The one difference is the meter's: a request of more than `capacity` units never fits,
//! under [`Limit::INF`] too (where a token bucket grants any size), and is refused with no
//! retry time. The quota carries that as a flag read only under an infinite leak, so a
//! check costs what a [`KeyedTokenBucket`](crate::KeyedTokenBucket) check costs.
//!
//! Memory, the key bound, floods, the hasher (HashDoS), sweeps and quotas are the keyed token
//! bucket's: see [`keyed_bucket`](crate::keyed::token_bucket).

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};

pub use crate::keyed::word_map::MAX_QUOTAS;
pub use crate::keyed::WhenFull;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::token_bucket::{held, TokenBucketQuota};
use crate::keyed::word_rule::WordRule;
use crate::keyed::{InlineMap, InlineMapBuilder};
use crate::limit::Limit;
use crate::limiter::Denied;

/// One quota of a [`KeyedLeakyMeter`]: the rule its keys follow, its configuration
/// precomputed. The map's builder makes it (`builder`, `quota`); it is the map's type
/// parameter (`KeyedLeakyMeter<K>` is `InlineMap<K, LeakyMeterQuota>`), named only to name
/// the map's builder, `InlineMapBuilder<K, LeakyMeterQuota>`.
#[derive(Clone, Copy, Debug)]
// The token bucket's rule of `leak` and `burst = capacity`, capped (more than the capacity
// is refused under an infinite leak too): a type of its own so that the meter's map is one.
pub struct LeakyMeterQuota(pub(crate) TokenBucketQuota);

impl AsRef<TokenBucketQuota> for LeakyMeterQuota {
    fn as_ref(&self) -> &TokenBucketQuota {
        &self.0
    }
}

/// The keyed token bucket's rule (module docs), with the meter's cap.
impl WordRule for LeakyMeterQuota {
    type Word = u64;
    /// `(capacity, leak)` of each quota.
    type Quotas = Vec<(u32, Limit)>;
    const NAME: &'static str = "KeyedLeakyMeter";

    fn rules(
        quotas: &Self::Quotas,
        _: impl FnOnce() -> Nanos,
    ) -> Result<Vec<LeakyMeterQuota>, ConfigError> {
        if quotas.iter().any(|&(capacity, _)| capacity == 0) {
            return Err(ConfigError::ZeroCapacity);
        }
        Ok(quotas
            .iter()
            .map(|&(capacity, leak)| LeakyMeterQuota(TokenBucketQuota::meter(capacity, leak)))
            .collect())
    }

    fn debug_quotas(rules: &[LeakyMeterQuota], d: &mut fmt::DebugStruct<'_, '_>) {
        let quotas: Vec<_> = rules.iter().map(|q| (q.0.burst, q.0.limit)).collect();
        d.field("quotas", &quotas);
    }

    #[inline(always)]
    fn born(&self, base: u64, now: Nanos) -> u64 {
        self.0.born(base, now)
    }

    #[inline(always)]
    fn check(&self, x: u64, base: u64, now: Nanos, n: u32) -> Result<Option<u64>, Denied> {
        self.0.check(x, base, now, n)
    }

    #[inline]
    fn idle(&self, x: u64, base: u64, now: Nanos) -> bool {
        self.0.idle(x, base, now)
    }
}

/// Per-key water-level meters, one 64-bit word per key in a table shared by all keys: each
/// key's bucket holds `capacity` units of water leaking at `leak` per second, starts empty,
/// and a check adds `n` units if they fit. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::leaky_meter::KeyedLeakyMeter, Limit, ManualClock, Nanos};
///
/// // 3 units of water per client, leaking one a second.
/// let per_ip = KeyedLeakyMeter::<u32, _, _>::builder(3, Limit::per_second(1.0).unwrap())
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert!(per_ip.check_n_at(&7, Nanos::ZERO, 3).is_ok()); // to the brim
/// let overflow = per_ip.check_n_at(&7, Nanos::ZERO, 1).unwrap_err();
/// assert_eq!(overflow.retry_after(), Some(Duration::from_secs(1))); // once a unit leaked
/// assert!(per_ip.check_n_at(&8, Nanos::ZERO, 1).is_ok()); // another client's own bucket
/// assert_eq!(per_ip.level_at(&7, Nanos::new(1_500_000_000)), 1.5);
/// ```
///
/// # A check
/// `check_n_at(key, now, n)` adds `n` units of water to `key`'s bucket at `now` if they fit,
/// inserting the key (empty) if it is new; exactly [`LeakyMeter`](crate::LeakyMeter)'s check. A
/// denial writes nothing and says when enough water will have leaked for the same check to pass
/// (`None`: never, `n` is above the key's capacity or its leak is zero); so does a refusal because
/// the map is full ([`WhenFull::Deny`]).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::leaky_meter::KeyedLeakyMeter, Limit, ManualClock, Nanos};
/// let k = KeyedLeakyMeter::<u8, _, _>::builder(2, Limit::per_second(4.0).unwrap())
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert!(k.check_n_at(&1, Nanos::ZERO, 2).is_ok());
/// let d = k.check_n_at(&1, Nanos::new(100_000_000), 1).unwrap_err();
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(150)));
/// ```
///
/// # Idle keys
/// `evict_idle_at(now)` evicts every key whose bucket is empty of water at `now`; returns how many
/// went, as [`KeyedTokenBucket::evict_idle_at`](crate::KeyedTokenBucket::evict_idle_at) (no key
/// ever fits more for it, whatever `now`).
///
/// ```
/// use turnstile::{keyed::leaky_meter::KeyedLeakyMeter, Limit, ManualClock, Nanos};
/// let k = KeyedLeakyMeter::<u8, _, _>::builder(1, Limit::per_second(2.0).unwrap())
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let _ = k.check_n_at(&1, Nanos::ZERO, 1);
/// let _ = k.check_n_at(&2, Nanos::new(400_000_000), 1);
/// assert_eq!(k.evict_idle_at(Nanos::new(500_000_000)), 1); // key 1 has drained
/// assert_eq!(k.len(), 1);
/// ```
pub type KeyedLeakyMeter<K, S = RandomState, C = QuantaClock> = InlineMap<K, LeakyMeterQuota, S, C>;

impl<K> InlineMap<K, LeakyMeterQuota, RandomState, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// `capacity` units of water per key leaking at `leak` units per second, on the shared
    /// quanta clock, with at most 2^20 (1 048 576) keys and sweeps every 10 s.
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] if `capacity` is 0 (no unit could ever fit).
    ///
    /// ```
    /// use turnstile::{keyed::leaky_meter::KeyedLeakyMeter, ConfigError, Limit};
    /// let k = KeyedLeakyMeter::new(1, Limit::per_second(5.0).unwrap()).unwrap();
    /// assert!(k.check(&42u64).is_ok());
    /// assert!(k.check(&42u64).is_err());
    /// let zero = KeyedLeakyMeter::<u64>::new(0, Limit::INF);
    /// assert_eq!(zero.unwrap_err(), ConfigError::ZeroCapacity);
    /// ```
    pub fn new(capacity: u32, leak: Limit) -> Result<Self, ConfigError> {
        Self::builder(capacity, leak).build()
    }

    /// A builder whose quota 0 is `capacity` units leaking at `leak`: add quotas with
    /// `quota` and pick one per key with
    /// [`classify`](InlineMapBuilder::classify).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::leaky_meter::{KeyedLeakyMeter, WhenFull};
    /// use turnstile::Limit;
    /// let k = KeyedLeakyMeter::<u32>::builder(10, Limit::per_second(5.0).unwrap())
    ///     .max_keys(100_000)
    ///     .when_full(WhenFull::Deny)
    ///     .sweep_every(Duration::from_secs(30))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(capacity: u32, leak: Limit) -> InlineMapBuilder<K, LeakyMeterQuota> {
        InlineMapBuilder::with_quotas(vec![(capacity, leak)])
    }
}

impl<K, S, C> InlineMap<K, LeakyMeterQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// The water in `key`'s bucket at `now`, in `[0, capacity]`, as
    /// [`LeakyMeter::level_at`](crate::LeakyMeter::level_at) reads it (a reading older than
    /// the key's last addition counts all its water, capped at the capacity). 0 for a key the
    /// map does not hold (new, or evicted once empty). Nothing changes.
    ///
    /// ```
    /// use turnstile::{keyed::leaky_meter::KeyedLeakyMeter, Limit, ManualClock, Nanos};
    /// let k = KeyedLeakyMeter::<u8, _, _>::builder(10, Limit::per_second(4.0).unwrap())
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 10).unwrap();
    /// assert_eq!(k.level_at(&1, Nanos::new(1_125_000_000)), 5.5);
    /// assert_eq!(k.level_at(&2, Nanos::ZERO), 0.0);
    /// ```
    pub fn level_at<Q>(&self, key: &Q, now: Nanos) -> f64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        held(&self.map, key, now).map_or(0.0, |(q, tokens)| {
            let capacity = f64::from(q.burst);
            (capacity - tokens).clamp(0.0, capacity)
        })
    }
}

impl<K, S, C> InlineMapBuilder<K, LeakyMeterQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Adds a quota of `capacity` units leaking at `leak`: the first call adds quota 1
    /// (quota 0 is the builder's), and so on, up to [`MAX_QUOTAS`] in all.
    ///
    /// ```
    /// use turnstile::{keyed::leaky_meter::KeyedLeakyMeter, Limit};
    /// let k = KeyedLeakyMeter::builder(1, Limit::per_second(1.0).unwrap())
    ///     .quota(100, Limit::per_second(100.0).unwrap()) // quota 1
    ///     .classify(|ip: &[u8; 4]| usize::from(ip[0] == 10))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n(&[10, 0, 0, 1], 100).is_ok());
    /// assert!(k.check_n(&[192, 0, 2, 1], 2).is_err());
    /// ```
    pub fn quota(mut self, capacity: u32, leak: Limit) -> Self {
        self.quotas.push((capacity, leak));
        self
    }
}
