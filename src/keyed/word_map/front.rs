//! The part of an inline map's public front that is the same for every algorithm: the
//! methods that delegate to its [`WordMap`](super::WordMap) (the front's field `map`) and
//! its builder's shared settings (the builder's fields `quotas` and `settings`), with their
//! docs. Written once here so that [`KeyedTokenBucket`] and its
//! siblings cannot drift apart; each front keeps the methods whose meaning is its
//! algorithm's (checks, eviction, its own readings) and its constructors.
//!
//! Each macro takes the front's (or builder's) type, the `use` list of its doc examples, an
//! expression building a front with the defaults (`new`), and a builder for quota 0
//! (`builder`) whose key type the examples' checks infer.

/// The delegating methods of an inline map's front `$front`.
macro_rules! front_methods {
    ($front:ident, $module:literal, extra $extra:literal, new $new:literal, builder $builder:literal) => {
        impl<K, S, C> $front<K, S, C>
        where
            K: Eq + Hash + Clone + Send + Sync + 'static,
            S: BuildHasher,
            C: Clock,
        {
            /// A check of one for `key` at the map's clock reading:
            /// [`check_n_at`](Self::check_n_at) says what it decides.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
            /// assert!(k.check("alice").is_ok());
            /// assert!(k.contains("alice"));
            #[doc = concat!("# let _: &", stringify!($front), "<String> = &k;")]
            /// ```
            #[inline]
            pub fn check<Q>(&self, key: &Q) -> Result<(), crate::Denied>
            where
                K: std::borrow::Borrow<Q>,
                Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
            {
                self.check_n_at(key, self.map.clock().now(), 1)
            }

            /// A check of `n` for `key` at the map's clock reading:
            /// [`check_n_at`](Self::check_n_at) says what it decides.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
            /// assert!(k.check_n(&7u32, 1).is_ok());
            /// assert_eq!(k.len(), 1);
            /// ```
            #[inline]
            pub fn check_n<Q>(&self, key: &Q, n: u32) -> Result<(), crate::Denied>
            where
                K: std::borrow::Borrow<Q>,
                Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
            {
                self.check_n_at(key, self.map.clock().now(), n)
            }

            /// Evicts every key idle at the map's clock reading; returns how many went.
            /// [`evict_idle_at`](Self::evict_idle_at) says which keys are idle.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
            /// let _ = k.check(&1u8);
            /// assert_eq!(k.evict_idle(), 0); // just checked: not idle yet
            /// ```
            pub fn evict_idle(&self) -> usize {
                self.evict_idle_at(self.map.clock().now())
            }

            /// The clock every check reads.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "Clock, ManualClock, Nanos};")]
            #[doc = concat!("let k = ", $builder)]
            ///     .clock(ManualClock::new(Nanos::new(5)))
            ///     .build()
            ///     .unwrap();
            /// # let _ = k.check(&1u8);
            /// assert_eq!(k.clock().now(), Nanos::new(5));
            /// ```
            pub fn clock(&self) -> &C {
                self.map.clock()
            }

            /// The map's clock reading now: the time its plain (non-`_at`) checks use. An
            /// inherent method, so reading it needs no [`Clock`] import.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "ManualClock, Nanos};")]
            #[doc = concat!("let k = ", $builder)]
            ///     .clock(ManualClock::new(Nanos::new(7)))
            ///     .build()
            ///     .unwrap();
            /// # let _ = k.check(&1u8);
            /// assert_eq!(k.now(), Nanos::new(7));
            /// ```
            pub fn now(&self) -> Nanos {
                self.map.clock().now()
            }

            /// Keys currently held (evicted keys no longer count).
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
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
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
            /// assert!(k.is_empty());
            /// let _ = k.check(&1u32);
            /// assert!(!k.is_empty());
            /// ```
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }

            /// The key bound (2^20, 1 048 576, unless the builder set one; `u64::MAX`:
            /// none).
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
            /// # let _ = k.check(&1u32);
            /// assert_eq!(k.max_keys(), 1 << 20);
            /// ```
            pub fn max_keys(&self) -> u64 {
                self.map.max_keys()
            }

            /// The table's slots (a power of two; each holds a key and its word): the memory
            /// the map holds is about `capacity()` slots of `size_of::<(W, K)>()` bytes, `W`
            /// the map's state word (`u64`; `u128` for the warming-up map).
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
            /// # let _ = k.check(&1u64);
            /// assert!(k.capacity().is_power_of_two());
            /// ```
            pub fn capacity(&self) -> usize {
                self.map.capacity()
            }

            /// How many times the table has been replaced (grown by inserts, or rebuilt
            /// without its evicted keys); a metric.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
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
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $new, ";")]
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
            /// [`Keyed::spawn_sweeper`](crate::Keyed::spawn_sweeper): a thread sweeps every
            /// half `sweep_every`, and early when a new key finds the map full (a check wakes
            /// it rather than sweeping); no check sweeps any more. The thread holds only a
            /// weak reference and ends when the map is dropped. With a `sweep_every` of
            /// `Duration::MAX` it ends at once and nothing changes. The tower `per_key`
            /// policy starts one for its map.
            ///
            /// ```
            /// use std::sync::Arc;
            /// use std::time::Duration;
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            ///
            /// let k = Arc::new(
            #[doc = concat!("    ", $builder)]
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
    };
}

/// The shared settings of an inline map's builder `$builder` (fields `quotas`, `settings`).
macro_rules! builder_methods {
    ($builder:ident, $front:ident, $module:literal, extra $extra:literal, builder $make:literal) => {
        impl<K, S, C> $builder<K, S, C>
        where
            K: Eq + Hash + Clone + Send + Sync + 'static,
            S: BuildHasher,
            C: Clock,
        {
            /// Picks each new key's quota: an index into the quotas in the order they were
            /// added (0 is the builder's own; one past them means quota 0). Called once per
            /// key insertion, not per check: a key keeps its quota until it is evicted.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $make)]
            ///     .classify(|user: &u32| usize::from(*user >= 100)) // 1: past the quotas
            ///     .build()
            ///     .unwrap();
            /// assert!(k.check(&7).is_ok());
            /// assert!(k.check(&700).is_ok());
            /// ```
            pub fn classify(
                mut self,
                classify: impl Fn(&K) -> usize + Send + Sync + 'static,
            ) -> Self {
                self.settings.classify = Box::new(classify);
                self
            }

            /// Sizes the table for `keys` keys from the start, and never shrinks it below
            /// that: up to `keys` keys, no insert grows the table, so new keys never pay for
            /// copying it (checks of held keys never wait for a resize either way), at the
            /// price of holding the memory (`~16 * 8/7 * keys` bytes for `u64` keys and a
            /// 64-bit word, twice that for a 128-bit one, rounded up to a power of two) while
            /// empty. Default 0: the table starts at 16 slots and
            /// follows the keys, up to what `max_keys` needs.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $make)]
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

            /// Holds at most `max_keys` keys (default 2^20, 1 048 576; `u64::MAX`: no bound;
            /// 0 is [`ConfigError::ZeroMaxKeys`]). Keys usually come from clients, so a map
            /// without a bound is memory a client flood can fill; the default is well above
            /// the keys one process sees active within a sweep period. The table never grows
            /// past what `max_keys` keys need (module docs, "Memory and the key bound").
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "ConfigError};")]
            #[doc = concat!("let k = ", $make)]
            ///     .max_keys(1)
            ///     .build()
            ///     .unwrap();
            /// assert!(k.check(&1u8).is_ok());
            /// assert!(k.check(&2u8).is_err()); // full, and key 1 is busy
            #[doc = concat!("let err = ", $make, ".max_keys(0).build();")]
            /// # let err = err.map(|k| k.check(&1u8).is_ok());
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
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), ", WhenFull};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $make)]
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

            /// How often idle keys are swept (default 10 s); `Duration::MAX` leaves sweeping
            /// to the map's `evict_idle`.
            ///
            /// ```
            /// use std::time::Duration;
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $make)]
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

            /// Hashes keys with `hasher` instead of std's `RandomState` (module docs,
            /// "HashDoS").
            ///
            /// ```
            /// use std::collections::hash_map::DefaultHasher;
            /// use std::hash::BuildHasherDefault;
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "};")]
            #[doc = concat!("let k = ", $make)]
            ///     .hasher(BuildHasherDefault::<DefaultHasher>::default())
            ///     .build()
            ///     .unwrap();
            /// assert!(k.check(&1u64).is_ok());
            /// ```
            pub fn hasher<T: BuildHasher>(self, hasher: T) -> $builder<K, T, C> {
                $builder {
                    quotas: self.quotas,
                    settings: self.settings.hasher(hasher),
                }
            }

            /// Reads time from `clock`; the map's base is its reading at `build`.
            ///
            /// ```
            #[doc = concat!("use turnstile::", $module, "::{", stringify!($front), "};")]
            #[doc = concat!("use turnstile::{", $extra, "Clock, ManualClock, Nanos};")]
            #[doc = concat!("let k = ", $make)]
            ///     .clock(ManualClock::new(Nanos::new(2)))
            ///     .build()
            ///     .unwrap();
            /// # let _ = k.check(&1u8);
            /// assert_eq!(k.clock().now(), Nanos::new(2));
            /// ```
            pub fn clock<D: Clock>(self, clock: D) -> $builder<K, S, D> {
                $builder {
                    quotas: self.quotas,
                    settings: self.settings.clock(clock),
                }
            }
        }
    };
}

/// The `Debug` of an inline map's builder `$builder` whose quotas are a `Vec` of their
/// settings: the quotas, then the shared settings.
macro_rules! builder_debug {
    ($builder:ident) => {
        impl<K, S, C: Clock> fmt::Debug for $builder<K, S, C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut d = f.debug_struct(stringify!($builder));
                d.field("quotas", &self.quotas);
                self.settings.debug_fields(&mut d);
                d.finish()
            }
        }
    };
}

pub(crate) use {builder_debug, builder_methods, front_methods};
