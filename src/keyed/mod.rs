//! Per-key limiters: one limit per client (per IP, user, API key), for a key space no one
//! bounds in advance. Two kinds of map:
//!
//! - [`Keyed`]`<K, L>` holds any limiter `L` per key, built on first use by a configuration
//!   function and dropped again once it is idle: every limiter's full API per key, and
//!   different limiter types per key through `Box<dyn PerKeyLimiter>`.
//! - [`InlineMap`], the limiter's state inline, one word per key, cheaper per check and per
//!   key: one type, named by its algorithm's alias ([`KeyedTokenBucket`],
//!   [`KeyedLeakyBucket`], [`KeyedLeakyMeter`], [`KeyedWindow`], [`KeyedSlidingWindow`],
//!   [`KeyedSmoothBursty`] and [`KeyedSmoothWarmingUp`], each in its module here, which
//!   states its algorithm), with up to [`MAX_QUOTAS`](fixed_window::MAX_QUOTAS) quota
//!   classes per map and one set of map settings ([`InlineMapBuilder`]).
//!
//! Both bound the keys they hold ([`KeyedBuilder::max_keys`], [`WhenFull`]) and sweep idle
//! keys in the background, so a flood of new clients costs bounded memory. A third kind holds
//! no keys at all: [`SketchTokenBucket`], token buckets per client in a fixed-size sketch
//! that never grows, at the price of a small, stated rate of early refusals of clients that
//! share all their cells with abusers.
//!
//! # `Keyed`: the map
//! A check of a held key takes no lock and writes no shared memory but the limiter's: one
//! hash, a probe of the map's table and the key's slot (its eviction state and limiter, one
//! allocation that never moves), so two threads checking one hot key contend only on that
//! key's limiter. Inserting a key, evicting one and resizing take the map's writer lock,
//! which no check of a held key takes; removed slots and old tables are freed once no reader
//! can still hold them. The table's protocol, and why it is not a general concurrent map,
//! are in `src/keyed/table.rs`.
//!
//! # Memory
//! Each key costs its table entry (8 bytes plus the key, at a load between seven sixteenths
//! and seven eighths) plus its slot (the limiter and a 4-byte state, rounded up to 64
//! bytes). Limiters are cache-padded by default, for one limiter hammered by every thread; for many keys build them in the
//! [`Compact`](crate::Compact) layout (`builder(..).build_compact()` for
//! [`TokenBucket`](crate::TokenBucket), [`LeakyMeter`](crate::LeakyMeter),
//! [`LeakyBucket`](crate::LeakyBucket), [`FixedWindow`](crate::FixedWindow),
//! [`SlidingWindow`](crate::SlidingWindow), [`SmoothBursty`](crate::SmoothBursty) and
//! [`SmoothWarmingUp`](crate::SmoothWarmingUp)): then a refused check reads one cache line
//! of the slot. Measured over 100 000 keys by
//! `tests/keyed_memory.rs`: about 300 bytes per key with a compact token bucket against 560
//! padded, 170 with a compact fixed window against 430 (the table's share varies with its
//! load, between 18 and 37 bytes for `u64` keys).
//!
//! # Eviction without losing a permit
//! A key whose limiter is idle ([`Idle`]: a fresh limiter would refuse at least as much) is
//! removed by a sweep, so memory follows the set of *active* keys. A sweep racing a check of
//! the same key never loses the check's grant nor counts it twice: each entry carries a small
//! state word (`LIVE -> RETIRING -> DEAD`), and a grant that lands on an entry being evicted
//! either vetoes the eviction or is replayed on the key's new entry (the protocol and why it
//! holds: `src/keyed/slot.rs`). The fences it takes cost one `mfence` per *granted* check; a
//! denial writes nothing and needs none.
//!
//! # Stale clock readings: newborn limiters are dated
//! A check's time is read before the check runs, and a thread can stall for seconds in
//! between (VM steal, CFS throttling). Meanwhile a sweep may judge the key's limiter idle at
//! its time `J`, evict it, and another thread may build the key a new one. Were the new one
//! simply fresh, the stale reading `t < J` would find a full limiter where the old one, at
//! `t`, was not: a token bucket emptied at `t` would grant its burst twice. So the map dates
//! every limiter it builds: before publishing it, it calls [`Idle::born_at`]`(B)` with
//! `B = max(the reading of the check that builds it, the latest time any sweep judged at)`.
//! A limiter born at `B` is exactly a fresh one from `B` on, and before `B` it is stricter
//! than anything idle at or before `B` (a token bucket is full at `B` and holds
//! `(B - t) * limit` tokens fewer at `t`; a window refuses until `B`; each impl says what it
//! means). So the check that builds a key's limiter sees a fresh one, unless its own reading
//! is older than a sweep: then it is a stale reading like any other.
//!
//! **Guarantee.** For every key, the grants of the checks made through the map, at any
//! times, from any threads, racing any sweeps (automatic, [`Keyed::evict_idle`], or
//! [`Keyed::evict_idle_at`] at any time), obey the bound of the key's limiter type over every
//! span, as if a single limiter had served the key all along: for a
//! [`TokenBucket`](crate::TokenBucket) at most `burst + limit * (y - x)` tokens in the
//! readings `[x, y]` (plus one request with reservations, its D2); for a
//! [`LeakyBucket`](crate::LeakyBucket) at most `slack + 1 + d / T` in any span `d`; for a
//! [`FixedWindow`](crate::FixedWindow) at most `quota` in each of its windows, which never
//! overlap; for a [`SlidingWindow`](crate::SlidingWindow) its rules 1–3 in
//! judged times; for the smooth limiters, their debt model with `next_free` never moving
//! back. No margin is assumed: a reading may be arbitrarily stale.
//!
//! **Proof sketch**: `src/keyed/slot.rs`, beside the eviction protocol it rests on.
//!
//! The price: a reading older than `B` on a newborn is judged as the newborn's state says,
//! stricter than a fresh limiter (a token bucket has fewer tokens, a window or a smooth
//! limiter refuses until `B`). Readings taken after the last sweep are not affected; one
//! taken a hair before a sweep that evicted its key may be refused, with a retry time of the
//! sweep's. A caller passing a time ahead of the clock to [`Keyed::check_n_at`] for a new
//! key dates that key's limiter at that time (as a single limiter used at that time would
//! hold the grant there).
//!
//! `tests/keyed_stress.rs` forces the stale interleaving and races stale readings against
//! a tight sweeper; loom checks steps 1 and 2 (`loom-tests/tests/keyed.rs`).
//!
//! # Sweeps and the key bound
//! A sweep visits every key; it runs inline in the first check after `sweep_every` (default
//! 10 s) has passed since the last one, or when the user calls [`Keyed::evict_idle`]. That
//! request pays for the sweep (tens of milliseconds for a million keys, depending on the
//! limiter); [`Keyed::spawn_sweeper`] moves sweeps to a thread of their own, which
//! latency-sensitive servers with many keys should use, and which the tower `per_key` policy
//! starts for its map: then no check sweeps (a full map wakes the thread for its early sweep
//! instead). Sweeps judge idleness at the **map's clock**, never at a time a caller passed to
//! [`Keyed::check_n_at`]: a caller's time only tells a check that a sweep may be due (it then
//! reads the clock), so one caller's future time cannot evict other keys that are busy at
//! the present.
//!
//! The map holds at most [`KeyedBuilder::max_keys`] keys (2^20, 1 048 576, by default: keys
//! usually come from clients, and a flood of distinct ones would otherwise grow the map
//! without end; `u64::MAX` is no bound). A new key that finds the map full
//! triggers an early sweep (at most one per tenth of `sweep_every`); if that frees no room,
//! the request is refused with a retry time of the next such sweep ([`WhenFull::Deny`], the
//! default: memory stays bounded and an attacker cycling keys cannot reset anyone's limit)
//! or let through without a limiter ([`WhenFull::Allow`], for those who would rather fail
//! open). Existing keys are never evicted to make room: that would hand their owners a fresh
//! quota. A flood of new keys at any rate so costs at most the bound's memory (the entry and
//! the limiter per key: module docs, "Memory"); checks of held keys take no lock a new key's
//! insert takes (inserts, and the resizes they cause, take the map's writer lock; a sweep
//! takes it for a few hundred entries at a time), and with a sweeper thread none of them
//! sweeps.

use std::borrow::Borrow;
use std::convert::Infallible;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::keyed::key_bound::KeyBound;
#[cfg(not(loom))]
use crate::keyed::sweeper::Sweeper;
use crate::limiter::{Denied, Idle, Limiter, QuotaStatus};
use crate::sync::Ordering;

/// A map's configuration function, fallible or (with `E = Infallible`) not.
type Factory<K, L, E> = Box<dyn Fn(&K) -> Result<L, E> + Send + Sync>;

/// The value of a result that cannot be an error (`Result::into_ok`, unstable in std).
#[inline(always)]
fn into_ok<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(t) => t,
        Err(never) => match never {},
    }
}

/// What a check does with a new key when the map already holds `max_keys` keys and a sweep
/// freed no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// Refuse the request; the denial's retry time is when the next early sweep may run.
    Deny,
    /// Let the request through without tracking the key (fail open).
    Allow,
}

/// Per-key limiters: any turnstile limiter `L`, one per key `K`, built on first use by a
/// configuration function (so keys can have different quotas) and evicted once idle. See the
/// [module docs](self) for the map, the eviction protocol and the full-map policy.
///
/// * **Different limiter types per key:** make `L` a `Box<dyn PerKeyLimiter>` (or an `Arc`,
///   to share one limiter between keys); see [`PerKeyLimiter`](crate::PerKeyLimiter).
/// * **A configuration that can fail** (a quota from a database, an unknown tier): build the
///   map with [`Keyed::try_new`] or [`Keyed::try_builder`] (the type parameter `E` is the
///   factory's error, `Infallible` otherwise) and check with [`Keyed::try_check`], which
///   returns the factory's error for such a key instead of panicking.
///
/// ```
/// use std::net::IpAddr;
/// use std::time::Duration;
/// use turnstile::{FixedWindow, Keyed, Limit, TokenBucket};
///
/// // 100 requests per minute per IP; 1000 for the office.
/// let office: IpAddr = "10.0.0.1".parse().unwrap();
/// let per_ip = Keyed::new(move |ip: &IpAddr| {
///     let quota = if *ip == office { 1000 } else { 100 };
///     FixedWindow::new(quota, Duration::from_secs(60)).unwrap()
/// });
/// let client: IpAddr = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.check(&client).is_ok());
/// assert_eq!(per_ip.len(), 1);
///
/// // Any limiter works, and denials say when to retry. Keys are looked up by any borrowed
/// // form (`&str` for `String` keys): a check allocates only when it inserts a new key.
/// let per_user = Keyed::new(|_: &String| TokenBucket::new(Limit::per_second(1.0).unwrap(), 1));
/// assert!(per_user.check("alice").is_ok());
/// let denied = per_user.check("alice").unwrap_err();
/// assert!(denied.retry_after().unwrap() <= Duration::from_secs(1));
/// ```
pub struct Keyed<K, L, C: Clock = QuantaClock, E = Infallible>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
{
    map: map::Map<K, L>,
    /// The configuration function; `E` is `Infallible` unless built by [`Keyed::try_new`] or
    /// [`Keyed::try_builder`].
    factory: Factory<K, L, E>,
    /// The key bound and the sweep schedule.
    bound: KeyBound,
    clock: C,
}

impl<K, L> Keyed<K, L, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
{
    /// Per-key limiters built by `factory` on each key's first use, at most 2^20 (1 048 576)
    /// of them, swept every 10 s, on the shared quanta clock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u64| FixedWindow::new(2, Duration::from_secs(1)).unwrap());
    /// assert!(k.check(&7).is_ok());
    /// ```
    pub fn new(factory: impl Fn(&K) -> L + Send + Sync + 'static) -> Self {
        Self::builder(factory)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// A builder, with options [`KeyedBuilder::max_keys`], [`KeyedBuilder::when_full`],
    /// [`KeyedBuilder::sweep_every`] and [`KeyedBuilder::clock`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::WhenFull;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::builder(|_: &u64| FixedWindow::new(2, Duration::from_secs(1)).unwrap())
    ///     .max_keys(100_000)
    ///     .when_full(WhenFull::Deny)
    ///     .sweep_every(Duration::from_secs(30))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(factory: impl Fn(&K) -> L + Send + Sync + 'static) -> KeyedBuilder<K, L> {
        Keyed::try_builder(move |k: &K| Ok::<L, Infallible>(factory(k)))
    }
}

impl<K, L, E> Keyed<K, L, QuantaClock, E>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    E: 'static,
{
    /// Per-key limiters built by a **fallible** `factory`, so that a bad per-key
    /// configuration (a quota read from a database, a tier that does not exist) is an error
    /// the request sees rather than a panic: [`Keyed::try_check`] and its kin return the
    /// factory's error for such a key, as `Err(e)` around the check's own result.
    ///
    /// A key whose factory failed is not inserted and holds no room under `max_keys`; its
    /// next check runs the factory again (so a fixed configuration takes effect at once, and
    /// a failing factory should be cheap). Keys the factory accepts behave exactly as in
    /// [`Keyed::new`]. The infallible `check` methods are not offered on such a map: the type
    /// makes the caller handle `E`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow, Keyed};
    ///
    /// // Quotas per tier; an unknown tier, or a quota of 0, is a configuration error.
    /// let per_tier = Keyed::try_new(|tier: &String| {
    ///     let quota = match tier.as_str() {
    ///         "free" => 2,
    ///         "pro" => 100,
    ///         "broken" => 0,
    ///         other => return Err(format!("unknown tier {other:?}")),
    ///     };
    ///     FixedWindow::new(quota, Duration::from_secs(60)).map_err(|e| e.to_string())
    /// });
    /// assert_eq!(per_tier.try_check("free"), Ok(Ok(())));
    /// assert!(per_tier.try_check("gold").is_err()); // the factory's error: a 500, say
    /// assert!(per_tier.try_check("broken").is_err());
    /// assert_eq!(per_tier.len(), 1);
    ///
    /// // In a handler: `?` passes a configuration error on; a denial is a value to answer.
    /// fn handle(k: &Keyed<String, FixedWindow, turnstile::QuantaClock, String>) -> Result<u16, String> {
    ///     Ok(match k.try_check("free")? {
    ///         Ok(()) => 200,
    ///         Err(_denied) => 429,
    ///     })
    /// }
    /// assert_eq!(handle(&per_tier), Ok(200));
    /// assert_eq!(handle(&per_tier), Ok(429));
    /// ```
    pub fn try_new(factory: impl Fn(&K) -> Result<L, E> + Send + Sync + 'static) -> Self {
        Self::try_builder(factory)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// A builder for a map with a fallible `factory` ([`Keyed::try_new`]): the options of
    /// [`Keyed::builder`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::try_builder(|q: &u32| FixedWindow::new(*q, Duration::from_secs(1)))
    ///     .max_keys(10)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.try_check_n_at(&3, Nanos::ZERO, 3), Ok(Ok(())));
    /// assert_eq!(k.try_check_n_at(&0, Nanos::ZERO, 1), Err(ConfigError::ZeroQuota));
    /// ```
    pub fn try_builder(
        factory: impl Fn(&K) -> Result<L, E> + Send + Sync + 'static,
    ) -> KeyedBuilder<K, L, QuantaClock, E> {
        KeyedBuilder {
            factory: Box::new(factory),
            max_keys: DEFAULT_MAX_KEYS,
            when_full: WhenFull::Deny,
            sweep_every: DEFAULT_SWEEP_EVERY.as_nanos() as u64,
            clock: QuantaClock::new(),
        }
    }
}

/// How often idle keys are swept by default.
pub(crate) const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The key bound of a map built without `max_keys`: 2^20, a little over a million keys, well
/// above the keys one process sees active within a sweep period, at a modest cost (the
/// builders' `max_keys` docs give it). Keys usually come from clients, so a map without a
/// bound is memory a client flood can fill.
pub(crate) const DEFAULT_MAX_KEYS: u64 = 1 << 20;

impl<K, L, C, E> Keyed<K, L, C, E>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock,
    E: 'static,
{
    /// The clock every check reads (the keys' limiters are always called with its time).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
    ///     .clock(ManualClock::new(Nanos::new(5)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.clock().now(), Nanos::new(5));
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Keys currently held (evicted keys no longer count).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u32| FixedWindow::new(1, Duration::from_secs(1)).unwrap());
    /// for ip in 0..5 {
    ///     let _ = k.check(&ip);
    /// }
    /// assert_eq!(k.len(), 5);
    /// ```
    pub fn len(&self) -> usize {
        self.bound.len()
    }

    /// True if no key is held.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u32| FixedWindow::new(1, Duration::from_secs(1)).unwrap());
    /// assert!(k.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key bound (2^20, 1 048 576, unless the builder set one; `u64::MAX`: none).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u32| FixedWindow::new(1, Duration::from_secs(1)).unwrap());
    /// assert_eq!(k.max_keys(), 1 << 20);
    /// ```
    pub fn max_keys(&self) -> u64 {
        self.bound.max_keys()
    }

    /// Keys held, the bound, keys evicted and new keys that found the map full.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::WhenFull;
    /// use turnstile::{FixedWindow, Keyed, Nanos};
    /// let k = Keyed::builder(|_: &u32| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
    ///     .max_keys(2)
    ///     .when_full(WhenFull::Deny)
    ///     .build()
    ///     .unwrap();
    /// for ip in 0..3 {
    ///     let _ = k.check_n_at(&ip, Nanos::ZERO, 1);
    /// }
    /// k.evict_idle_at(Nanos::new(1_000_000_000));
    /// let s = k.stats();
    /// assert_eq!((s.keys, s.max_keys, s.evicted, s.full), (0, 2, 2, 1));
    /// ```
    pub fn stats(&self) -> MapStats {
        self.bound.stats()
    }
}

/// The checks of a map whose factory cannot fail ([`Keyed::new`], [`Keyed::builder`]); a map
/// built by [`Keyed::try_new`] offers [`Keyed::try_check`] and its kin instead.
impl<K, L, C> Keyed<K, L, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock,
{
    /// `f` on `key`'s limiter at `now`, as [`Keyed::with`] runs it (the sweep, a new key's
    /// insertion, the retry on an evicted limiter), for the tower policies, which take a
    /// permit and read the limiter's status in one visit. `wrote` says whether `f` changed
    /// the limiter (a grant) or only read it (a refusal), as the map's own checks tell it.
    /// `Err` with the map's answer when the key is new and the map full (its `WhenFull`).
    #[cfg(feature = "tower")]
    pub(crate) fn visit_at<Q, R>(
        &self,
        key: &Q,
        now: Nanos,
        f: impl Fn(&L) -> R,
        wrote: impl Fn(&R) -> bool,
    ) -> Result<R, Result<(), Denied>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.maybe_sweep(now, false);
        match into_ok(self.run_at(key, now, f, wrote)) {
            Some(r) => Ok(r),
            None => Err(self.bound.full(now)),
        }
    }

    /// One permit for `key` now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &&str| FixedWindow::new(1, Duration::from_secs(60)).unwrap());
    /// assert!(k.check(&"alice").is_ok());
    /// assert!(k.check(&"alice").is_err());
    /// assert!(k.check(&"bob").is_ok());
    /// ```
    pub fn check<Q>(&self, key: &Q) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n_at(key, self.clock.now(), 1)
    }

    /// `n` permits for `key` now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u8| FixedWindow::new(3, Duration::from_secs(60)).unwrap());
    /// assert!(k.check_n(&1, 3).is_ok());
    /// ```
    pub fn check_n<Q>(&self, key: &Q, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n_at(key, self.clock.now(), n)
    }

    /// `n` permits for `key` at `now`: the key's limiter's [`Limiter::check_n_at`], building
    /// the limiter first if the key is new. A denial says when to retry; so does a refusal
    /// because the map is full ([`WhenFull::Deny`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n_at(&1, Nanos::ZERO, 1).is_ok());
    /// let d = k.check_n_at(&1, Nanos::new(250_000_000), 1).unwrap_err();
    /// assert_eq!(d.retry_after(), Some(Duration::from_millis(750)));
    /// ```
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        into_ok(self.try_check_n_at(key, now, n))
    }

    /// Runs `f` on `key`'s limiter (building it if the key is new): for the limiter's own API,
    /// such as [`FixedWindow::take`](crate::FixedWindow::take)'s outcome or
    /// [`FixedWindow::status`](crate::FixedWindow::status) for response headers. `None` if the
    /// key is new and the map is full.
    ///
    /// `f` may run more than once: if the key's limiter is evicted while `f` runs, `f` runs
    /// again on the key's new limiter and only that run counts (the evicted limiter was idle,
    /// and is dropped with whatever `f` did to it).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed, Outcome};
    /// let k = Keyed::new(|_: &u8| FixedWindow::new(2, Duration::from_secs(60)).unwrap());
    /// assert_eq!(k.with(&1, |w| w.take()), Some(Outcome::Allowed));
    /// assert_eq!(k.with(&1, |w| w.status().remaining), Some(1));
    /// ```
    pub fn with<Q, R>(&self, key: &Q, f: impl Fn(&L) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        into_ok(self.try_with(key, f))
    }

    /// [`Keyed::with`] at `now`: a key new to the map gets a limiter dated `now`, as a check
    /// at `now` dates it, so that `f` reading the limiter at `now` (a check and its
    /// [`Limiter::quota_at`] in one visit, as the tower layer's headers need) sees exactly
    /// what [`Keyed::check_n_at`] would. [`Keyed::with`] dates a new key's limiter at its own
    /// later reading of the clock, which an `f` at an earlier `now` would read as not yet
    /// full.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Keyed, Limit, Limiter, ManualClock, Nanos, TokenBucket};
    /// let clock = ManualClock::new(Nanos::new(10));
    /// let c = clock.clone();
    /// let k = Keyed::builder(move |_: &u8| {
    ///     TokenBucket::builder(Limit::per_second(1.0).unwrap(), 3).clock(c.clone()).build()
    /// })
    /// .clock(clock)
    /// .build()
    /// .unwrap();
    /// let now = Nanos::new(10);
    /// let (taken, status) = k.with_at(&1, now, |l| (l.check_n_at(now, 1), l.quota_at(now))).unwrap();
    /// assert!(taken.is_ok());
    /// assert_eq!(status.unwrap().remaining, 2);
    /// ```
    pub fn with_at<Q, R>(&self, key: &Q, now: Nanos, f: impl Fn(&L) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.maybe_sweep(now, false);
        into_ok(self.run_at(key, now, f, |_| true))
    }
}

impl<K, L, C, E> Keyed<K, L, C, E>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock,
    E: 'static,
{
    /// One permit for `key` now, on a map with a fallible factory ([`Keyed::try_new`]):
    /// `Err(e)` if the key is new and its factory failed with `e` (nothing is inserted, no
    /// panic), else `Ok` of the check's own result, as [`Keyed::check`]'s.
    ///
    /// The two layers keep two different things apart: `Err(e)` is a configuration problem
    /// (answer it as a server error, log it, pass it on with `?`), while `Ok(Err(denied))`
    /// is the limiter working as intended (answer `429` with
    /// [`Denied::retry_after_secs`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow, Keyed};
    /// // The key is the quota: 0 is a bad configuration.
    /// let k = Keyed::try_new(|q: &u32| FixedWindow::new(*q, Duration::from_secs(60)));
    /// assert_eq!(k.try_check(&1), Ok(Ok(())));
    /// assert!(matches!(k.try_check(&1), Ok(Err(_)))); // denied
    /// assert_eq!(k.try_check(&0), Err(ConfigError::ZeroQuota));
    /// ```
    pub fn try_check<Q>(&self, key: &Q) -> Result<Result<(), Denied>, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_check_n_at(key, self.clock.now(), 1)
    }

    /// `n` permits for `key` now; see [`Keyed::try_check`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow, Keyed};
    /// let k = Keyed::try_new(|q: &u32| FixedWindow::new(*q, Duration::from_secs(60)));
    /// assert_eq!(k.try_check_n(&3, 3), Ok(Ok(())));
    /// assert_eq!(k.try_check_n(&0, 1), Err(ConfigError::ZeroQuota));
    /// ```
    pub fn try_check_n<Q>(&self, key: &Q, n: u32) -> Result<Result<(), Denied>, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_check_n_at(key, self.clock.now(), n)
    }

    /// `n` permits for `key` at `now`; see [`Keyed::try_check`] and [`Keyed::check_n_at`].
    /// A new key that finds the map full gets the full-map policy's answer without its
    /// factory being run.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::try_builder(|q: &u32| FixedWindow::new(*q, Duration::from_secs(1)))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.try_check_n_at(&1, Nanos::ZERO, 1), Ok(Ok(())));
    /// let denied = k.try_check_n_at(&1, Nanos::ZERO, 1).unwrap().unwrap_err();
    /// assert_eq!(denied.retry_after_secs(), Some(1));
    /// assert_eq!(k.try_check_n_at(&0, Nanos::ZERO, 1), Err(ConfigError::ZeroQuota));
    /// ```
    pub fn try_check_n_at<Q>(&self, key: &Q, now: Nanos, n: u32) -> Result<Result<(), Denied>, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.maybe_sweep(now, false);
        Ok(
            match self.run_at(key, now, |l| l.check_n_at(now, n), |r| r.is_ok())? {
                Some(r) => r,
                None => self.bound.full(now),
            },
        )
    }

    /// [`Keyed::with`] on a map with a fallible factory: `Err(e)` if the key is new and its
    /// factory failed with `e`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow, Keyed};
    /// let k = Keyed::try_new(|q: &u32| FixedWindow::new(*q, Duration::from_secs(60)));
    /// assert_eq!(k.try_with(&5, |w| w.status().remaining), Ok(Some(5)));
    /// assert_eq!(k.try_with(&0, |w| w.status().remaining), Err(ConfigError::ZeroQuota));
    /// ```
    pub fn try_with<Q, R>(&self, key: &Q, f: impl Fn(&L) -> R) -> Result<Option<R>, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        self.maybe_sweep(now, false);
        self.run_at(key, now, f, |_| true)
    }

    /// True if `key` currently has a limiter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u8| FixedWindow::new(2, Duration::from_secs(60)).unwrap());
    /// assert!(!k.contains(&1));
    /// let _ = k.check(&1);
    /// assert!(k.contains(&1));
    /// ```
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let guard = map::pin();
        self.map.get(key, &guard).is_some()
    }

    /// The key's limiter's [`Limiter::quota_at`] (the IETF RateLimit fields; what they mean
    /// is on each limiter's impl). A key with no limiter (new, or evicted as idle) gets the
    /// fields of the limiter its next check would build: the factory's, dated to `now` with
    /// [`Idle::born_at`] as an insert dates it, but **not inserted** (so this runs the
    /// factory, which for a boxed limiter allocates, each time for such a key). `None` if
    /// that limiter says `None`, or the factory fails (a map built with
    /// [`Keyed::try_new`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(5, Duration::from_secs(60)).unwrap())
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n_at(&1, Nanos::ZERO, 2).is_ok());
    /// assert_eq!(k.quota_at(&1, Nanos::ZERO).unwrap().remaining, 3);
    /// assert_eq!(k.quota_at(&2, Nanos::ZERO).unwrap().remaining, 5); // new: fresh
    /// assert!(!k.contains(&2));
    /// ```
    pub fn quota_at<Q>(&self, key: &Q, now: Nanos) -> Option<QuotaStatus>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        {
            let guard = map::pin();
            if let Some(slot) = self.map.get(key, &guard) {
                if let Some(r) = slot.run(|l| l.quota_at(now), |_| false) {
                    return r;
                }
            }
        }
        let mut fresh = (self.factory)(&key.to_owned()).ok()?;
        fresh.born_at(self.bound.birth(now));
        fresh.quota_at(now)
    }

    /// The key's limiter's [`Limiter::refund_n_at`]: gives back `n` permits that a check of
    /// this key took, if that limiter can do so exactly (see its impl for what `now` must be
    /// and when it can). Never builds a limiter: `false` if the key has none (it was never
    /// checked, or was evicted as idle since: whatever was left of the grant went with the
    /// limiter, which the map cannot judge for every limiter type). Runs under the map's
    /// eviction protocol as a grant does, so a refund racing a sweep either lands on the
    /// limiter the key keeps or reports `false`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(60)).unwrap())
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let t = Nanos::new(5);
    /// assert!(k.check_n_at(&1, t, 1).is_ok());
    /// assert!(k.refund_n_at(&1, t, 1)); // the global limit refused the request
    /// assert!(k.check_n_at(&1, t, 1).is_ok());
    /// assert!(!k.refund_n_at(&9, t, 1)); // no limiter for that key
    /// ```
    pub fn refund_n_at<Q>(&self, key: &Q, now: Nanos, n: u32) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = map::pin();
        match self.map.get(key, &guard) {
            Some(slot) => slot
                .run(|l| l.refund_n_at(now, n), |did| *did)
                .unwrap_or(false),
            None => false,
        }
    }

    /// Moves sweeping off the request path: a thread sweeps every half `sweep_every`, and
    /// early when a new key finds the map full (the check wakes it rather than sweeping), so
    /// no check ever runs a sweep inline (a sweep visits every key: tens of milliseconds for a
    /// million keys, which one unlucky request would otherwise wait for). The thread holds only
    /// a weak reference and ends when the map is dropped. With `sweep_every` of
    /// `Duration::MAX` it ends at once and nothing changes. The tower `per_key` policy starts
    /// one for its map.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    ///
    /// let k = Arc::new(
    ///     Keyed::builder(|_: &u32| FixedWindow::new(5, Duration::from_secs(1)).unwrap())
    ///         .sweep_every(Duration::from_millis(20))
    ///         .build()
    ///         .unwrap(),
    /// );
    /// let sweeper = k.spawn_sweeper();
    /// assert!(k.check(&1).is_ok());
    /// drop(k);
    /// sweeper.join().unwrap(); // ends once the map is gone
    /// ```
    #[cfg(not(loom))]
    pub fn spawn_sweeper(self: &std::sync::Arc<Self>) -> std::thread::JoinHandle<()>
    where
        C: 'static,
    {
        Sweeper::spawn(
            self,
            self.bound.sweep_every(),
            |k| k.bound.sweeper(),
            |k| {
                let now = k.clock.now();
                k.bound.swept(now);
                k.evict_idle_at(now);
            },
        )
    }

    /// Evicts every key idle at the map's clock reading; returns how many went. Stale clock
    /// readings of other threads are safe (module docs, "Stale clock readings").
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u8| FixedWindow::new(2, Duration::from_secs(60)).unwrap());
    /// let _ = k.check(&1);
    /// assert_eq!(k.evict_idle(), 0); // its window is open
    /// ```
    pub fn evict_idle(&self) -> usize {
        self.evict_idle_at(self.clock.now())
    }

    /// Evicts every key whose limiter is idle at `now` ([`Idle::is_idle_at`]); returns how many
    /// went.
    ///
    /// `now` may be any time and no key ever grants more for it: the limiters built after
    /// this call are born at `now` or later ([`Idle::born_at`]). But a `now` ahead of the
    /// clock evicts limiters that are still busy at the present, and their keys' next
    /// limiters refuse (or hold fewer tokens) until the clock reaches `now`: stricter than
    /// needed. The plain [`Keyed::evict_idle`] and the automatic sweeps use the map's clock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(2, Duration::from_secs(1)).unwrap())
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let _ = k.check_n_at(&1, Nanos::ZERO, 1);
    /// let _ = k.check_n_at(&2, Nanos::new(500_000_000), 1);
    /// assert_eq!(k.evict_idle_at(Nanos::new(1_000_000_000)), 1); // key 1's window is over
    /// assert_eq!(k.len(), 1);
    /// ```
    pub fn evict_idle_at(&self, now: Nanos) -> usize {
        // Published before anything is retired: every limiter built after one of these
        // evictions is born at `now` or later (module docs, step 2 of the proof, which also
        // relies on `retire` running inside `retain`, under the map's writer lock).
        self.bound.judge(now);
        let mut evicted = 0;
        self.map.retain(|slot| {
            if slot.retire(now) {
                evicted += 1;
                self.bound.release();
                false
            } else {
                slot.state.load(Ordering::Relaxed) != DEAD
            }
        });
        self.bound.evicted(evicted);
        evicted
    }

    /// Runs `f` on every live limiter, a chunk of the table per hold of its writer lock (as
    /// a sweep): for [`redis::Leased`](crate::redis::Leased)'s reaper, which hands back the
    /// permits of idle keys. A key may be visited twice if the table resizes meanwhile.
    #[cfg(feature = "redis")]
    pub(crate) fn for_each(&self, mut f: impl FnMut(&L)) {
        // A dead slot is unlinked, as a sweep unlinks one.
        self.map.retain(|slot| {
            let live = !slot.is_dead();
            if live {
                f(&slot.limiter);
            }
            live
        });
    }

    /// The retry loop: finds or builds the key's entry and runs `f` on it under the eviction
    /// protocol. `Ok(None)`: the key is new and the map is full; `Err`: the key is new and
    /// its factory failed.
    fn run_at<Q, R>(
        &self,
        key: &Q,
        now: Nanos,
        f: impl Fn(&L) -> R,
        wrote: impl Fn(&R) -> bool,
    ) -> Result<Option<R>, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let backoff = Backoff::new();
        let hash = self.map.hash(key);
        // The key's entry starts loading while the pin's barrier drains.
        self.map.prefetch(hash);
        loop {
            {
                let guard = map::pin();
                if let Some(slot) = self.map.get_hashed(hash, key, &guard) {
                    if let Some(r) = slot.run(&f, &wrote) {
                        return Ok(Some(r));
                    }
                    // Evicted under us: help remove it, then use the key's new entry.
                    self.map.remove_same(key, slot.id());
                    backoff.snooze();
                    continue;
                }
            }
            if !self.insert(key, now)? {
                return Ok(None);
            }
        }
    }

    /// Builds and inserts `key`'s limiter; false if the map is full (after an early sweep),
    /// `Err` if the factory failed (the room reserved for the key is given back).
    /// Returns true also when another thread inserted the key first.
    #[cold]
    fn insert<Q>(&self, key: &Q, now: Nanos) -> Result<bool, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Given back unless the key goes in: if it was inserted first by another thread, or
        // if the factory (user code) fails or panics.
        let Some(room) = self.bound.room(now, &self.clock, |at| {
            self.evict_idle_at(at);
        }) else {
            return Ok(false);
        };
        let key = key.to_owned();
        let mut limiter = (self.factory)(&key)?;
        let inserted = self.map.insert_with(key, || {
            // Under the map's writer lock, so after the removal of any limiter the key had:
            // the judged time of that eviction is visible here (module docs, step 2).
            limiter.born_at(self.bound.birth(now));
            Slot::new(limiter)
        });
        if inserted {
            room.keep();
        }
        Ok(true)
    }

    /// Sweeps if one is due at `hint` (a check's time): one load and a compare when none is.
    #[inline(always)]
    fn maybe_sweep(&self, hint: Nanos, early: bool) {
        self.bound.maybe_sweep(hint, early, &self.clock, |now| {
            self.evict_idle_at(now);
        });
    }
}

impl<K, L, C, E> fmt::Debug for Keyed<K, L, C, E>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock,
    E: 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Keyed");
        d.field("len", &self.len());
        self.bound.debug(&mut d);
        d.finish()
    }
}

/// The concurrent map behind [`Keyed`] (`src/keyed/table.rs`), the same under loom but for
/// its reclamation, hasher and smallest size (that file's "Under loom").
mod builder;
mod slot;
mod table;

// The maps with their limiter's state inline, one word per key: one front (`inline_map`) over
// the shared word-map engine (`word_map`), with a `word_rule` per limiter in its module (the
// alias, its constructors and readings), and what every map shares: the key bound and the
// sweeper.
pub mod fixed_window;
mod inline_map;
pub(crate) mod key_bound;
pub mod leaky_bucket;
pub mod leaky_meter;
pub mod multi_token_bucket;
pub mod sketch_token_bucket;
pub mod sliding_window;
pub mod smooth_bursty;
pub mod smooth_warming_up;
pub(crate) mod sweeper;
pub mod token_bucket;
pub(crate) mod word_map;
pub(crate) mod word_rule;

pub use builder::KeyedBuilder;
pub use fixed_window::KeyedWindow;
pub use inline_map::{InlineMap, InlineMapBuilder};
pub use key_bound::MapStats;
pub use leaky_bucket::KeyedLeakyBucket;
pub use leaky_meter::KeyedLeakyMeter;
pub use multi_token_bucket::KeyedMultiTokenBucket;
pub use sketch_token_bucket::SketchTokenBucket;
pub use sliding_window::KeyedSlidingWindow;
pub(crate) use slot::Slot;
use slot::DEAD;
pub use smooth_bursty::KeyedSmoothBursty;
pub use smooth_warming_up::KeyedSmoothWarmingUp;
use table as map;
pub use token_bucket::KeyedTokenBucket;

/// For the limiters' layout tests: where each of `words(limiter)` (a name, an address in the
/// limiter and a size) ends, in bytes from the start of the cache line where a `Keyed` slot
/// holding `make()`'s limiter begins. The slot's state word comes first, so a limiter never
/// starts the line (asserted). A word that ends by byte 64 is read with the slot's state.
#[cfg(all(test, not(loom)))]
pub(crate) fn word_ends_in_slot<L, const N: usize>(
    make: impl Fn() -> L + Send + Sync + 'static,
    words: impl Fn(&L) -> [(&'static str, *const u8, usize); N],
) -> [(&'static str, usize); N]
where
    L: Limiter + Idle + 'static,
{
    let k = Keyed::builder(move |_: &u64| make())
        .clock(crate::ManualClock::default())
        .build()
        .expect("a keyed map");
    k.with(&7, |l| {
        let start = std::ptr::from_ref(l) as usize;
        assert_ne!(start % 64, 0, "the limiter starts a line");
        let line = start & !63;
        words(l).map(|(name, at, size)| (name, at as usize - line + size))
    })
    .expect("a new key's limiter")
}
