//! [`InlineMap`]: the one public front of every keyed map that keeps its limiter's state
//! **inline**, one word per key, over the shared word-map engine (`src/keyed/word_map.rs`).
//! A map's algorithm is its rule type `R` (`src/keyed/word_rule.rs`), which users never
//! name: they name the map by its alias ([`KeyedTokenBucket`](crate::KeyedTokenBucket),
//! [`KeyedLeakyBucket`](crate::KeyedLeakyBucket), ...), whose module documents the
//! algorithm, its word and its budget. What every map does alike (the table, the key bound,
//! sweeps, the hasher, the clock) is written here once; each algorithm adds its constructors,
//! its quotas' options and its own readings as methods of its instantiation.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::word_map::{Settings, WordMap};
use crate::keyed::word_rule::WordRule;
use crate::keyed::WhenFull;
use crate::limiter::Denied;

/// A keyed map with each key's limiter state inline: a key is its key and one word in an
/// open-addressing table, and the quotas' configurations are shared by all keys. Named
/// through its algorithm's alias: [`KeyedTokenBucket`](crate::KeyedTokenBucket),
/// [`KeyedLeakyBucket`](crate::KeyedLeakyBucket),
/// [`KeyedLeakyMeter`](crate::KeyedLeakyMeter), [`KeyedWindow`](crate::KeyedWindow),
/// [`KeyedSlidingWindow`](crate::KeyedSlidingWindow),
/// [`KeyedSmoothBursty`](crate::KeyedSmoothBursty) and
/// [`KeyedSmoothWarmingUp`](crate::KeyedSmoothWarmingUp); each alias's module states what a
/// check decides and what a key may be granted over any span of its readings.
///
/// The general [`Keyed`](crate::Keyed) holds any limiter per key behind a pointer, with its
/// own configuration; this map holds a word, so a `u64` key costs a 16-byte slot and a check
/// of a random key one cache miss.
///
/// ```
/// use std::net::IpAddr;
/// use turnstile::{KeyedTokenBucket, Limit};
///
/// // 10 requests per second per client IP, bursts of 20.
/// let per_ip = KeyedTokenBucket::new(Limit::per_second(10.0).unwrap(), 20);
/// let client: IpAddr = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.check(&client).is_ok());
/// assert_eq!(per_ip.len(), 1);
/// ```
pub struct InlineMap<K, R, S = RandomState, C: Clock = QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: WordRule,
    S: BuildHasher,
{
    pub(super) map: WordMap<K, R, S, C>,
}

impl<K, R, S, C> InlineMap<K, R, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: WordRule,
    S: BuildHasher,
    C: Clock,
{
    /// A check of one for `key` at the map's clock reading:
    /// [`check_n_at`](Self::check_n_at) says what it decides.
    ///
    /// ```
    /// use turnstile::{KeyedLeakyBucket};
    /// let k = KeyedLeakyBucket::new(1).unwrap();
    /// assert!(k.check("alice").is_ok());
    /// assert!(k.contains("alice"));
    /// # let _: &KeyedLeakyBucket<String> = &k;
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n_at(key, self.map.clock().now(), 1)
    }

    /// A check of `n` for `key` at the map's clock reading:
    /// [`check_n_at`](Self::check_n_at) says what it decides.
    ///
    /// ```
    /// use turnstile::{KeyedWindow};
    /// use std::time::Duration;
    /// let k = KeyedWindow::new(5, Duration::from_secs(1)).unwrap();
    /// assert!(k.check_n(&7u32, 5).is_ok());
    /// assert!(k.check_n(&7u32, 1).is_err());
    /// assert_eq!(k.len(), 1);
    /// ```
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n_at(key, self.map.clock().now(), n)
    }

    /// Checks `n` for `key` at `now` by the key's quota, as one atomic step, inserting the key
    /// if it is new (or reviving it if a sweep evicted it): granted, the key's word moves
    /// with one CAS; refused, nothing is written, and the denial says when the same check
    /// would pass if nobody else takes from the key (`None`: never, e.g. more than the
    /// quota holds at once). What a quota grants is its algorithm's, as the single limiter's
    /// [`Limiter`](crate::Limiter) check: the alias's module docs state it. A new key that
    /// finds the map full is refused ([`WhenFull::Deny`], retry when the next early sweep may
    /// make room) or granted untracked ([`WhenFull::Allow`]). `n == 0` takes nothing.
    ///
    /// `now` may be any reading, earlier ones included: no key is ever granted more for a
    /// stale reading than its quota's budget over the readings it saw.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedTokenBucket, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(1.0).unwrap(), 2)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n_at(&1, Nanos::ZERO, 2).is_ok());
    /// let d = k.check_n_at(&1, Nanos::ZERO, 1).unwrap_err();
    /// assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
    /// assert!(k.check_n_at(&1, Nanos::ZERO, 3).unwrap_err().retry_at().is_none());
    /// ```
    #[inline]
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.map.check_n_at(key, now, n)
    }

    /// Evicts every key idle at the map's clock reading; returns how many went.
    /// [`evict_idle_at`](Self::evict_idle_at) says which keys are idle.
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// let _ = k.check(&1u8);
    /// assert_eq!(k.evict_idle(), 0); // just checked: not idle yet
    /// ```
    pub fn evict_idle(&self) -> usize {
        self.evict_idle_at(self.map.clock().now())
    }

    /// Evicts every key idle at `now`, that is whose every check from `now` on would be
    /// judged as a new key's (a full bucket, an empty meter or window, no debt): evicting
    /// it hands it nothing. Returns how many went; afterwards, if the table holds more
    /// evicted slots than live keys, rebuilds it without them.
    ///
    /// `now` may be any time and no key ever grants more for it (keys revived or inserted
    /// after this call are born at `now` or later).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedLeakyBucket, ManualClock, Nanos};
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
    pub fn evict_idle_at(&self, now: Nanos) -> usize {
        self.map.evict_idle_at(now)
    }

    /// The clock every check reads.
    ///
    /// ```
    /// use turnstile::{Clock, KeyedTokenBucket, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .clock(ManualClock::new(Nanos::new(5)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.clock().now(), Nanos::new(5));
    /// ```
    pub fn clock(&self) -> &C {
        self.map.clock()
    }

    /// Keys currently held (evicted keys no longer count).
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// for ip in 0..5u32 {
    ///     let _ = k.check(&ip);
    /// }
    /// assert_eq!(k.len(), 5);
    /// ```
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if no key is held.
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// assert!(k.is_empty());
    /// let _ = k.check(&1u32);
    /// assert!(!k.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys held, the bound, keys evicted and new keys that found the map full.
    ///
    /// ```
    /// use turnstile::keyed::WhenFull;
    /// use turnstile::{KeyedTokenBucket, Limit, Nanos};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .max_keys(2)
    ///     .when_full(WhenFull::Deny)
    ///     .build()
    ///     .unwrap();
    /// for ip in 0..3u32 {
    ///     let _ = k.check_n_at(&ip, Nanos::ZERO, 1);
    /// }
    /// let s = k.stats();
    /// assert_eq!((s.keys, s.max_keys, s.evicted, s.full), (2, 2, 0, 1));
    /// ```
    pub fn stats(&self) -> crate::keyed::MapStats {
        self.map.stats()
    }

    /// The key bound (2^20, 1 048 576, unless the builder set one; `u64::MAX`: none).
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// # let _ = k.check(&1u32);
    /// assert_eq!(k.max_keys(), 1 << 20);
    /// ```
    pub fn max_keys(&self) -> u64 {
        self.map.max_keys()
    }

    /// The table's slots (a power of two; each holds a key and its word): the memory the map
    /// holds is about `capacity()` slots of `size_of::<(W, K)>()` bytes, `W` the map's state
    /// word (`u64`; `u128` for [`KeyedSmoothWarmingUp`](crate::KeyedSmoothWarmingUp)).
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// # let _ = k.check(&1u64);
    /// assert!(k.capacity().is_power_of_two());
    /// ```
    pub fn capacity(&self) -> usize {
        self.map.capacity()
    }

    /// How many times the table has been replaced (grown by inserts, or rebuilt without its
    /// evicted keys); a metric.
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// for key in 0..100u32 {
    ///     let _ = k.check(&key);
    /// }
    /// assert!(k.resizes() >= 3); // 16 slots at first, at most 7/8 used
    /// ```
    pub fn resizes(&self) -> u64 {
        self.map.resizes()
    }

    /// True if `key` is held (live).
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// assert!(!k.contains(&1u8));
    /// let _ = k.check(&1u8);
    /// assert!(k.contains(&1u8));
    /// ```
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.contains(key)
    }

    /// Moves sweeping off the request path, as
    /// [`Keyed::spawn_sweeper`](crate::Keyed::spawn_sweeper): a thread sweeps every half
    /// `sweep_every`, and early when a new key finds the map full (a check wakes it rather
    /// than sweeping); no check sweeps any more. The thread holds only a weak reference and
    /// ends when the map is dropped. With a `sweep_every` of `Duration::MAX` it ends at once
    /// and nothing changes. The tower `per_key` policy starts one for its map.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{KeyedTokenBucket, Limit};
    ///
    /// let k = Arc::new(
    ///     KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///         .sweep_every(Duration::from_millis(20))
    ///         .build()
    ///         .unwrap(),
    /// );
    /// let sweeper = k.spawn_sweeper();
    /// assert!(k.check(&1u32).is_ok());
    /// drop(k);
    /// sweeper.join().unwrap(); // ends once the map is gone
    /// ```
    #[cfg(not(loom))]
    pub fn spawn_sweeper(self: &std::sync::Arc<Self>) -> std::thread::JoinHandle<()>
    where
        S: Send + Sync + 'static,
        C: 'static,
    {
        crate::keyed::sweeper::Sweeper::spawn(
            self,
            self.map.sweep_every(),
            |k| k.map.sweeper(),
            |k| k.map.sweep_now(),
        )
    }
}

impl<K, R, S, C> fmt::Debug for InlineMap<K, R, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: WordRule,
    S: BuildHasher,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct(R::NAME);
        d.field("len", &self.len());
        R::debug_quotas(self.map.rules(), &mut d);
        self.map.debug_fields(&mut d);
        d.finish()
    }
}

/// Options for an [`InlineMap`]: its quotas (quota 0 from the alias's `builder`, more from
/// its `quota`, with the algorithm's options as the single limiter's builder), how a new key
/// picks one, and the map's settings.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::WhenFull, KeyedLeakyBucket};
/// let k = KeyedLeakyBucket::<u32>::builder(5)
///     .per(Duration::from_secs(60))
///     .slack(2)
///     .max_keys(100_000)
///     .when_full(WhenFull::Deny)
///     .build()
///     .unwrap();
/// assert_eq!(k.max_keys(), 100_000);
/// ```
#[must_use = "a builder does nothing until `build` is called"]
pub struct InlineMapBuilder<K, R: WordRule, S = RandomState, C: Clock = QuantaClock> {
    /// What the builder has recorded of each quota, quota 0 first.
    pub(super) quotas: R::Quotas,
    pub(super) settings: Settings<K, S, C>,
}

impl<K, R: WordRule> InlineMapBuilder<K, R> {
    /// A builder with quota 0 as `quotas` records it and the map's default settings.
    pub(super) fn with_quotas(quotas: R::Quotas) -> Self {
        InlineMapBuilder {
            quotas,
            settings: Settings::new(),
        }
    }
}

impl<K, R, S, C> InlineMapBuilder<K, R, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: WordRule,
    S: BuildHasher,
    C: Clock,
{
    /// Picks each new key's quota: an index into the quotas in the order they were added (0
    /// is the builder's own; one past them means quota 0). Called once per key insertion, not
    /// per check: a key keeps its quota until it is evicted.
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .quota(Limit::per_second(100.0).unwrap(), 100)
    ///     .classify(|user: &u32| usize::from(*user >= 100)) // quota 1 from user 100 on
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&7).is_ok());
    /// assert!(k.check(&7).is_err());
    /// assert!(k.check_n(&700, 100).is_ok());
    /// ```
    pub fn classify(mut self, classify: impl Fn(&K) -> usize + Send + Sync + 'static) -> Self {
        self.settings.classify = Box::new(classify);
        self
    }

    /// Sizes the table for `keys` keys from the start, and never shrinks it below that: up to
    /// `keys` keys, no insert grows the table, so new keys never pay for copying it (checks of
    /// held keys never wait for a resize either way), at the price of holding the memory
    /// (`~16 * 8/7 * keys` bytes for `u64` keys and a 64-bit word, twice that for a 128-bit
    /// one, rounded up to a power of two) while empty. Default 0: the table starts at 16
    /// slots and follows the keys, up to what `max_keys` needs.
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .capacity(1000)
    ///     .build()
    ///     .unwrap();
    /// for key in 0..1000u32 {
    ///     let _ = k.check(&key);
    /// }
    /// assert_eq!(k.resizes(), 0);
    /// ```
    pub fn capacity(mut self, keys: usize) -> Self {
        self.settings.capacity = keys;
        self
    }

    /// Holds at most `max_keys` keys (default 2^20, 1 048 576; `u64::MAX`: no bound; 0 is
    /// [`ConfigError::ZeroMaxKeys`]). Keys usually come from clients, so a map without a bound
    /// is memory a client flood can fill; the default is well above the keys one process sees
    /// active within a sweep period. The table never grows past what `max_keys` keys need
    /// (the alias's module docs, "Memory and the key bound").
    ///
    /// ```
    /// use turnstile::{ConfigError, KeyedTokenBucket, Limit};
    /// let limit = Limit::per_second(1.0).unwrap();
    /// let k = KeyedTokenBucket::builder(limit, 1).max_keys(1).build().unwrap();
    /// assert!(k.check(&1u8).is_ok());
    /// assert!(k.check(&2u8).is_err()); // full, and key 1 is busy
    /// let err = KeyedTokenBucket::<u8>::builder(limit, 1).max_keys(0).build();
    /// assert_eq!(err.unwrap_err(), ConfigError::ZeroMaxKeys);
    /// ```
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.settings.max_keys = max_keys;
        self
    }

    /// What a new key gets when the map is full: [`WhenFull::Deny`] (default) or
    /// [`WhenFull::Allow`].
    ///
    /// ```
    /// use turnstile::{keyed::WhenFull, KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .max_keys(1)
    ///     .when_full(WhenFull::Allow)
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1u8).is_ok());
    /// assert!(k.check(&2u8).is_ok()); // untracked
    /// assert_eq!(k.len(), 1);
    /// ```
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.settings.when_full = policy;
        self
    }

    /// How often idle keys are swept (default 10 s); `Duration::MAX` leaves sweeping to the
    /// map's [`evict_idle`](InlineMap::evict_idle).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .sweep_every(Duration::from_secs(1))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.is_empty());
    /// # let _ = k.check(&1u8);
    /// ```
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.settings.sweep_every = Nanos::from_duration(every).as_u64();
        self
    }

    /// Hashes keys with `hasher` instead of std's `RandomState`, a keyed SipHash: keys
    /// usually come from clients, and a hasher they can predict lets them build long probe
    /// chains (the alias's module docs, "HashDoS").
    ///
    /// ```
    /// use std::collections::hash_map::DefaultHasher;
    /// use std::hash::BuildHasherDefault;
    /// use turnstile::{KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .hasher(BuildHasherDefault::<DefaultHasher>::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1u64).is_ok());
    /// ```
    pub fn hasher<T: BuildHasher>(self, hasher: T) -> InlineMapBuilder<K, R, T, C> {
        InlineMapBuilder {
            quotas: self.quotas,
            settings: self.settings.hasher(hasher),
        }
    }

    /// Reads time from `clock`; the map's base is its reading at `build`.
    ///
    /// ```
    /// use turnstile::{Clock, KeyedTokenBucket, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .clock(ManualClock::new(Nanos::new(2)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.clock().now(), Nanos::new(2));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> InlineMapBuilder<K, R, S, D> {
        InlineMapBuilder {
            quotas: self.quotas,
            settings: self.settings.clock(clock),
        }
    }

    /// The map, or the first [`ConfigError`] among its quotas (each as the single limiter's
    /// builder would report it), its key bound ([`ConfigError::ZeroMaxKeys`]) and the number
    /// of quotas ([`ConfigError::TooManyQuotas`] past
    /// [`MAX_QUOTAS`](crate::keyed::token_bucket::MAX_QUOTAS)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, KeyedLeakyBucket};
    /// assert!(KeyedLeakyBucket::<u32>::builder(5).build().is_ok());
    /// let b = KeyedLeakyBucket::<u32>::builder(5).quota(0, Duration::from_secs(1), 0);
    /// assert_eq!(b.build().unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn build(self) -> Result<InlineMap<K, R, S, C>, ConfigError> {
        // The clock is read only by a rule that needs it (the fixed window's alignment) and
        // otherwise after every check in `Settings::build`, so that a bad configuration is
        // refused without reading it (Miri, which the keyed table's tests run under, cannot
        // run quanta's TSC read).
        let rules = R::rules(&self.quotas, || self.settings.clock.now())?;
        Ok(InlineMap {
            map: self.settings.build(&rules)?,
        })
    }
}

impl<K, R: WordRule, S, C: Clock> fmt::Debug for InlineMapBuilder<K, R, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("InlineMapBuilder");
        d.field("map", &R::NAME).field("quotas", &self.quotas);
        self.settings.debug_fields(&mut d);
        d.finish()
    }
}
