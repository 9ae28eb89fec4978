//! Per-key multi-limit token buckets with the state **inline**: "per client, 20 per second
//! and 10 000 per day" is one lookup and one 128-bit word per key.
//!
//! Each key holds the word of a [`MultiTokenBucket`](crate::MultiTokenBucket) (its layout,
//! range and precision are stated in `src/multi_token_bucket/word.rs`): one to four GCRA
//! limits, checked all-or-nothing with one CAS, every grid counted from one **base** for the
//! whole map (the clock reading at construction). Readings before the base count as the base.
//! The table, its lock-free lookups, inserts, eviction, resizes, the key bound and the hasher
//! are [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s (its module docs state them), with a
//! 128-bit word: a slot is 32 bytes for keys of up to 16 bytes (a `u64`, an `IpAddr`).
//!
//! **Budget.** Each limit keeps the bound of the single-limit map, for every key and across
//! evictions: over any readings `[a, b]` a key's grants total at most `burst_i + limit_i *
//! (b - a)` for every limit `i` (plus one unit of that limit's grid). A key is **idle** when
//! every limit is full; a key born again after an eviction is full at its birth, which is
//! no earlier than the sweep that judged it idle, so it never holds more than the evicted
//! state would have.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};

pub use crate::keyed::word_map::MAX_QUOTAS;
pub use crate::keyed::WhenFull;
pub use crate::multi_token_bucket::{Bandwidth, Statuses};

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::word_rule::WordRule;
use crate::keyed::{InlineMap, InlineMapBuilder};
use crate::limiter::{Denied, QuotaStatus};
use crate::multi_token_bucket::word::{reading, Verdict};
use crate::multi_token_bucket::{limits_of, Limits};

/// One quota of a [`KeyedMultiTokenBucket`]: its limits, precomputed. The map's builder makes
/// it (`builder`, `quota`); it is the map's type parameter, named only to name the map's
/// builder, `InlineMapBuilder<K, MultiTokenBucketQuota>`.
#[derive(Clone, Copy, Debug)]
pub struct MultiTokenBucketQuota {
    limits: Limits,
}

impl MultiTokenBucketQuota {
    /// `now` as ns past the base.
    #[inline(always)]
    fn t(base: u64, now: Nanos) -> u64 {
        now.as_u64().saturating_sub(base)
    }
}

/// The map's rule: `x` is the multi-limit word's low 123 bits (module docs).
impl WordRule for MultiTokenBucketQuota {
    type Word = u128;
    /// The limits of each quota.
    type Quotas = Vec<Vec<Bandwidth>>;
    const NAME: &'static str = "KeyedMultiTokenBucket";

    fn rules(
        quotas: &Self::Quotas,
        _: impl FnOnce() -> Nanos,
    ) -> Result<Vec<MultiTokenBucketQuota>, ConfigError> {
        quotas
            .iter()
            .map(|q| limits_of(q).map(|limits| MultiTokenBucketQuota { limits }))
            .collect()
    }

    fn debug_quotas(rules: &[MultiTokenBucketQuota], d: &mut fmt::DebugStruct<'_, '_>) {
        let quotas: Vec<Vec<Bandwidth>> = rules.iter().map(|q| q.limits.bandwidths()).collect();
        d.field("quotas", &quotas);
    }

    /// Every limit full at `now`.
    #[inline(always)]
    fn born(&self, base: u64, now: Nanos) -> u128 {
        self.limits.born(Self::t(base, now))
    }

    #[inline(always)]
    fn check(&self, x: u128, base: u64, now: Nanos, n: u32) -> Result<Option<u128>, Denied> {
        let t = reading(now.as_u64(), base);
        match self.limits.check(x, t, n) {
            Verdict::Grant(x2) => Ok(Some(x2)),
            Verdict::Free => Ok(None),
            Verdict::Deny { retry, .. } => Err(Denied::new(now, Limits::at(base, retry, now))),
        }
    }

    /// Every limit full at `now`: the state a key born at `now` or later starts from, or one
    /// with more tokens.
    #[inline]
    fn idle(&self, x: u128, base: u64, now: Nanos) -> bool {
        self.limits.idle(x, Self::t(base, now))
    }
}

/// Per-key multi-limit token buckets, one 128-bit word per key in a table shared by all keys.
/// See the [module docs](self).
///
/// ```
/// use std::net::IpAddr;
/// use std::time::Duration;
/// use turnstile::keyed::multi_token_bucket::{Bandwidth, KeyedMultiTokenBucket};
///
/// // Per client IP: 20 per second (bursts of 40) and 10 000 per day.
/// let per_ip = KeyedMultiTokenBucket::new(&[
///     Bandwidth::per(20, Duration::from_secs(1)).burst_of(40),
///     Bandwidth::per(10_000, Duration::from_secs(86_400)),
/// ])
/// .unwrap();
/// let client: IpAddr = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.check(&client).is_ok());
/// assert_eq!(per_ip.len(), 1);
/// ```
///
/// # A check
/// `check_n_at(key, now, n)` takes `n` tokens from every limit of `key`'s quota if each holds
/// them, and nothing otherwise, inserting the key if it is new. A refusal writes nothing
/// and says when every limit admits the same check (`None`: never, `n` is past a burst);
/// so does a refusal because the map is full ([`WhenFull::Deny`]). `n == 0` passes.
///
/// ```
/// use std::time::Duration;
/// use turnstile::keyed::multi_token_bucket::{Bandwidth, KeyedMultiTokenBucket};
/// use turnstile::{ManualClock, Nanos};
///
/// let limits = [Bandwidth::per(2, Duration::from_secs(1)), Bandwidth::per(3, Duration::from_secs(60))];
/// let k = KeyedMultiTokenBucket::<u8, _, _>::builder(&limits)
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert!(k.check_n_at(&1, Nanos::ZERO, 2).is_ok());
/// // The per-second limit admits 2 more in a second, the per-minute one not for 20 s.
/// let d = k.check_n_at(&1, Nanos::ZERO, 2).unwrap_err();
/// assert_eq!(d.retry_after(), Some(Duration::from_secs(20)));
/// assert!(k.check_n_at(&2, Nanos::ZERO, 2).is_ok()); // another key
/// ```
///
/// # Idle keys
/// `evict_idle_at(now)` evicts every key whose limits are all full at `now`; returns how many
/// went. Afterwards, if the table holds more evicted slots than live keys, rebuilds it without
/// them.
///
/// ```
/// use std::time::Duration;
/// use turnstile::keyed::multi_token_bucket::{Bandwidth, KeyedMultiTokenBucket};
/// use turnstile::{ManualClock, Nanos};
///
/// let limits = [Bandwidth::per(2, Duration::from_secs(1)), Bandwidth::per(10, Duration::from_secs(10))];
/// let k = KeyedMultiTokenBucket::<u8, _, _>::builder(&limits)
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// k.check_n_at(&1, Nanos::ZERO, 1).unwrap();
/// assert_eq!(k.evict_idle_at(Nanos::new(500_000_000)), 0); // the 10 s limit is not full
/// assert_eq!(k.evict_idle_at(Nanos::new(1_000_000_000)), 1);
/// assert!(k.is_empty());
/// ```
pub type KeyedMultiTokenBucket<K, S = RandomState, C = QuantaClock> =
    InlineMap<K, MultiTokenBucketQuota, S, C>;

impl<K> InlineMap<K, MultiTokenBucketQuota, RandomState, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// Every key limited by `limits` (one to four), on the shared quanta clock, with at most
    /// 2^20 (1 048 576) keys and sweeps every 10 s. The same errors as
    /// [`MultiTokenBucket::new`](crate::MultiTokenBucket::new).
    pub fn new(limits: &[Bandwidth]) -> Result<Self, ConfigError> {
        Self::builder(limits).build()
    }

    /// A builder whose quota 0 is `limits`: add quotas with
    /// [`quota`](InlineMapBuilder::quota) and pick one per key with
    /// [`classify`](InlineMapBuilder::classify).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::multi_token_bucket::{Bandwidth, KeyedMultiTokenBucket};
    /// use turnstile::ConfigError;
    ///
    /// let err = KeyedMultiTokenBucket::<u32>::builder(&[]).build().unwrap_err();
    /// assert_eq!(err, ConfigError::LimitCount(0));
    /// ```
    pub fn builder(limits: &[Bandwidth]) -> InlineMapBuilder<K, MultiTokenBucketQuota> {
        InlineMapBuilder::with_quotas(vec![limits.to_vec()])
    }
}

impl<K, S, C> InlineMapBuilder<K, MultiTokenBucketQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Adds a quota of `limits`: the first call adds quota 1 (quota 0 is the builder's), and
    /// so on, up to [`MAX_QUOTAS`] in all (more is [`ConfigError::TooManyQuotas`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::multi_token_bucket::{Bandwidth, KeyedMultiTokenBucket};
    ///
    /// let sec = Duration::from_secs(1);
    /// let day = Duration::from_secs(86_400);
    /// let per_user = KeyedMultiTokenBucket::builder(&[Bandwidth::per(5, sec), Bandwidth::per(1_000, day)])
    ///     .quota(&[Bandwidth::per(50, sec), Bandwidth::per(100_000, day)]) // quota 1: paid
    ///     .classify(|user: &String| usize::from(user.starts_with("paid:")))
    ///     .build()
    ///     .unwrap();
    /// assert!(per_user.check_n("paid:carol", 50).is_ok());
    /// assert!(per_user.check_n("alice", 50).is_err());
    /// ```
    pub fn quota(mut self, limits: &[Bandwidth]) -> Self {
        self.quotas.push(limits.to_vec());
        self
    }
}

impl<K, S, C> InlineMap<K, MultiTokenBucketQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Every limit's status for `key` at `now`, as
    /// [`MultiTokenBucket::status_at`](crate::MultiTokenBucket::status_at) gives it. A key the
    /// map does not hold (new, or evicted as idle) gets a fresh key's, full, of the quota
    /// `classify` picks for it (an evicted key keeps its quota).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::multi_token_bucket::{Bandwidth, KeyedMultiTokenBucket};
    /// use turnstile::{ManualClock, Nanos};
    ///
    /// let limits = [Bandwidth::per(10, Duration::from_secs(1)), Bandwidth::per(100, Duration::from_secs(3600))];
    /// let k = KeyedMultiTokenBucket::<u8, _, _>::builder(&limits)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 4).unwrap();
    /// let s = k.status_at(&1, Nanos::ZERO);
    /// assert_eq!((s[0].remaining, s[1].remaining), (6, 96));
    /// assert_eq!(k.status_at(&2, Nanos::ZERO)[1].remaining, 100); // a new key: full
    /// ```
    pub fn status_at<Q>(&self, key: &Q, now: Nanos) -> Statuses
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let base = self.map.base();
        let t = now.as_u64().saturating_sub(base);
        let (quota, x) = match self.map.read(key) {
            Some((quota, x)) => (quota, x),
            None => (self.map.classify(&key.to_owned()), None),
        };
        let x = x.unwrap_or_else(|| quota.limits.born(t));
        Statuses::of(&quota.limits, x, t)
    }

    /// The binding limit's status for `key` at `now` ([`Statuses::binding`]): the one a
    /// single-limit header shows. Always `Some`, as `Keyed::quota_at` has the shape.
    pub fn quota_at<Q>(&self, key: &Q, now: Nanos) -> Option<QuotaStatus>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        Some(self.status_at(key, now).binding())
    }
}
