//! Per-key limiters: one turnstile limiter per client (per IP, user, API key), built on first
//! use by a configuration function and dropped again once it is idle.
//!
//! # The map
//! Keys live in an [`scc::HashIndex`]: a lookup of an existing key takes no lock and writes no
//! shared memory (it pins an epoch in a thread-local slot), so two threads checking one hot
//! key contend only on that key's limiter word. Inserting a new key locks one bucket. Removed
//! entries are freed once no reader can still hold them (epoch reclamation), and the table
//! shrinks by itself as keys leave. Chosen by measurement on this 2-core EPYC VM (u64 keys,
//! a 64-byte value, lookup + one CAS, ns per op per thread, median of runs):
//!
//! | map | hot key 1 thread | hot key 2 threads | 100k random keys 1 / 2 threads | memory left after removing 1M keys |
//! |---|---|---|---|---|
//! | `scc::HashIndex` (chosen) | 18 | 42 | 117 / 116 | ~80 KiB: shrinks by itself |
//! | `papaya` (blocking resize) | 16 | 41 | 107 / 89 | 18 MiB: never shrinks |
//! | `papaya` (default resize) | 16 | 37 | 573–878 / 515–773 | 9 MiB |
//! | `dashmap` (governor's) | 20 | 65 | 99 / 93 | 258 MiB until `shrink_to_fit` |
//! | `scc::HashMap` | 28 | 84 | 110 / 123 | shrinks by itself |
//! | `RwLock<HashMap>` | 20 | 66 | 99 / 117 | 258 MiB until `shrink_to_fit` |
//!
//! # Memory
//! Each key costs its map entry (~60 bytes) plus its limiter. Limiters are cache-padded by
//! default, for one limiter hammered by every thread; for many keys build them in the
//! [`Compact`](crate::Compact) layout ([`TokenBucket::compact`](crate::TokenBucket::compact),
//! and `.build_compact()` for [`FixedWindow`](crate::FixedWindow) and
//! [`SlidingWindow`](crate::SlidingWindow)). Measured over a million keys by
//! `tests/keyed_memory.rs`: 254 bytes per key with a compact token bucket against 702 padded,
//! 158 with a compact fixed window against 574.
//!
//! # Eviction without losing a permit
//! A key whose limiter is idle ([`Idle`]: a fresh limiter would refuse at least as much) is
//! removed by a sweep, so memory follows the set of *active* keys. The danger is a sweep that
//! removes a limiter while another thread is using it: that thread's grant would land on a
//! limiter nobody sees any more, and the next request would start from a fresh one, granting
//! twice. Each entry therefore carries a small state word, `LIVE -> RETIRING -> DEAD`:
//!
//! * **Evicting** an entry: CAS `LIVE -> RETIRING`; `fence(SeqCst)`; if the limiter is still
//!   idle, CAS `RETIRING -> DEAD` and remove it, else put it back to `LIVE`.
//! * **Using** an entry: skip it if `DEAD`; run the check on its limiter; after a grant,
//!   `fence(SeqCst)`; then load the state. `LIVE`: done. `RETIRING`: CAS it back to `LIVE`,
//!   which vetoes the eviction (the limiter is no longer idle); if that CAS finds `DEAD`, or
//!   the state was `DEAD`, the entry was evicted: run the check again on the key's new entry.
//!
//! **Why no grant is lost.** The two fences are ordered. If the user's fence comes first, the
//! evictor's idleness check (after its own fence) sees the grant, finds the limiter busy and
//! keeps it. If the evictor's fence comes first, the user's state load (after its fence) sees
//! `RETIRING` or `DEAD`: either it vetoes the eviction in time, or it learns that its grant
//! landed on a dead limiter and replays the check on the live one. The dead limiter was idle,
//! i.e. equivalent to a fresh one, when it was retired, and every grant made on it after that
//! is replayed, so no request is counted twice and none is lost. The fences cost one `mfence`
//! per *granted* check (a denial writes nothing and needs none); loom checks the protocol in
//! `loom-tests/tests/keyed.rs` (take ‖ evict, insert ‖ evict ‖ take).
//!
//! # Sweeps and the key bound
//! A sweep visits every key; it runs inline in the first check after `sweep_every` (default
//! 10 s) has passed since the last one, or when the user calls [`Keyed::evict_idle`]. That
//! request pays for the sweep (35–130 ms for a million keys here, depending on the limiter);
//! [`Keyed::spawn_sweeper`] moves sweeps to a thread of their own, which latency-sensitive
//! servers with many keys should use. Sweeps judge idleness [`SWEEP_LAG`] (100 ms) behind
//! their clock reading, so a thread whose own reading is that stale never finds a fresh
//! limiter where the evicted one would still have been busy at its time. With
//! [`KeyedBuilder::max_keys`], a new key that finds the map full triggers an early sweep (at
//! most one per tenth of `sweep_every`); if that frees no room, the request is refused with a
//! retry time of the next such sweep ([`WhenFull::Deny`], the default: memory stays bounded and
//! an attacker cycling keys cannot reset anyone's limit) or let through without a limiter
//! ([`WhenFull::Allow`], for those who would rather fail open). Existing keys are never
//! evicted to make room: that would hand their owners a fresh quota.

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::limiter::{Denied, Idle, Limiter};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

const LIVE: u32 = 0;
const RETIRING: u32 = 1;
const DEAD: u32 = 2;

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
pub struct Keyed<K, L, C: Clock = QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
{
    map: map::Map<K, L>,
    factory: Box<dyn Fn(&K) -> L + Send + Sync>,
    /// Live entries plus reservations for entries being inserted; never above `max_keys`.
    len: AtomicU64,
    max_keys: u64,
    when_full: WhenFull,
    sweep_every: u64,
    /// When the last sweep started (ns on `clock`); claimed by CAS so one thread sweeps.
    last_sweep: AtomicU64,
    clock: C,
}

/// One key's limiter and its eviction state (`LIVE`, `RETIRING`, `DEAD`).
pub(crate) struct Slot<L> {
    state: AtomicU32,
    limiter: L,
}

impl<L: Limiter + Idle> Slot<L> {
    fn new(limiter: L) -> Slot<L> {
        Slot {
            state: AtomicU32::new(LIVE),
            limiter,
        }
    }

    /// Runs `f` on the limiter under the protocol of the module docs; `None` if the entry was
    /// (or got) evicted and `f` must run again on the key's new entry. `wrote` says whether
    /// `f`'s result may have changed the limiter.
    #[inline]
    fn run<R>(&self, f: impl FnOnce(&L) -> R, wrote: impl FnOnce(&R) -> bool) -> Option<R> {
        if self.state.load(Ordering::Acquire) == DEAD {
            return None;
        }
        let r = f(&self.limiter);
        let wrote = wrote(&r);
        if wrote {
            // Pairs with the evictor's fence: either it sees our write, or we see its mark.
            fence(Ordering::SeqCst);
        }
        match self.state.load(Ordering::Relaxed) {
            LIVE => Some(r),
            RETIRING if !wrote => Some(r),
            RETIRING => match self.state.compare_exchange(
                RETIRING,
                LIVE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) | Err(LIVE) => Some(r),
                Err(_) => None,
            },
            _ => None,
        }
    }

    /// This slot's identity, to remove exactly this entry and not a newer one of its key.
    fn id(&self) -> *const Slot<L> {
        self
    }

    /// The evictor's half: true if this entry is now `DEAD` (by this call) and must go.
    fn retire(&self, now: Nanos) -> bool {
        if self.state.load(Ordering::Relaxed) != LIVE || !self.limiter.is_idle_at(now) {
            return false;
        }
        if self
            .state
            .compare_exchange(LIVE, RETIRING, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // Pairs with the users' fence after a grant.
        fence(Ordering::SeqCst);
        if self.limiter.is_idle_at(now)
            && self
                .state
                .compare_exchange(RETIRING, DEAD, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return true;
        }
        let _ = self
            .state
            .compare_exchange(RETIRING, LIVE, Ordering::Relaxed, Ordering::Relaxed);
        false
    }
}

impl<K, L> Keyed<K, L, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
{
    /// Per-key limiters built by `factory` on each key's first use, with no key bound, sweeps
    /// every 10 s, on the shared quanta clock.
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
        KeyedBuilder {
            factory: Box::new(factory),
            max_keys: u64::MAX,
            when_full: WhenFull::Deny,
            sweep_every: DEFAULT_SWEEP_EVERY.as_nanos() as u64,
            clock: QuantaClock::new(),
        }
    }
}

/// How far behind its clock reading a sweep judges idleness. A limiter idle at some time
/// stays idle later, so a sweep that evicts what was idle `SWEEP_LAG` ago is safe for every
/// check whose clock reading is at most that stale (a thread that read the clock, then lost
/// the CPU before its check): it never meets a fresh limiter where the evicted one would have
/// been busy at its time.
pub const SWEEP_LAG: Duration = Duration::from_millis(100);

/// How often idle keys are swept by default.
pub const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(10);

impl<K, L, C> Keyed<K, L, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock,
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
        usize::try_from(self.len.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
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

    /// The key bound (`u64::MAX`: none).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u32| FixedWindow::new(1, Duration::from_secs(1)).unwrap());
    /// assert_eq!(k.max_keys(), u64::MAX);
    /// ```
    pub fn max_keys(&self) -> u64 {
        self.max_keys
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
        self.maybe_sweep(now, false);
        match self.with_at(key, now, |l| l.check_n_at(now, n), |r| r.is_ok()) {
            Some(r) => r,
            None => self.full(now),
        }
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
        let now = self.clock.now();
        self.maybe_sweep(now, false);
        self.with_at(key, now, f, |_| true)
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
        let guard = map::Guard::new();
        self.map.get(key, &guard).is_some()
    }

    /// Moves sweeping off the request path: a thread sweeps every half `sweep_every`, so no
    /// check ever finds a sweep due and runs it inline (a sweep visits every key: ~35–130 ms
    /// for a million keys here, which one unlucky request would otherwise wait for). The
    /// thread holds only a weak reference and ends within half `sweep_every` of the last
    /// `Arc` being dropped. With `sweep_every` of `Duration::MAX` it ends at once.
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
        let weak = std::sync::Arc::downgrade(self);
        let every = self.sweep_every;
        std::thread::spawn(move || {
            if every == u64::MAX {
                return;
            }
            let nap = Duration::from_nanos((every / 2).max(1));
            loop {
                std::thread::sleep(nap);
                let Some(k) = weak.upgrade() else { return };
                let now = k.clock.now();
                k.last_sweep.store(now.as_u64(), Ordering::Relaxed);
                k.evict_idle_at(now.saturating_sub(SWEEP_LAG));
            }
        })
    }

    /// Evicts every key that was idle [`SWEEP_LAG`] ago (so stale clock readings of other
    /// threads are safe); returns how many went.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::new(|_: &u8| FixedWindow::new(2, Duration::from_secs(60)).unwrap());
    /// let _ = k.check(&1);
    /// assert_eq!(k.evict_idle(), 0); // its window is open
    /// ```
    pub fn evict_idle(&self) -> usize {
        self.evict_idle_at(self.clock.now().saturating_sub(SWEEP_LAG))
    }

    /// Evicts every key whose limiter is idle at `now` ([`Idle::is_idle_at`]); returns how many
    /// went.
    ///
    /// `now` must not run ahead of the times later checks use: a limiter idle at a future
    /// `now` may still be busy at the real present, and evicting it hands its key a fresh
    /// limiter. The plain [`Keyed::evict_idle`] and the automatic sweeps use the map's clock.
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
        let mut evicted = 0;
        self.map.retain(|slot| {
            if slot.retire(now) {
                evicted += 1;
                self.len.fetch_sub(1, Ordering::Relaxed);
                false
            } else {
                slot.state.load(Ordering::Relaxed) != DEAD
            }
        });
        evicted
    }

    /// The retry loop: finds or builds the key's entry and runs `f` on it under the eviction
    /// protocol. `None`: the key is new and the map is full.
    fn with_at<Q, R>(
        &self,
        key: &Q,
        now: Nanos,
        f: impl Fn(&L) -> R,
        wrote: impl Fn(&R) -> bool,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let backoff = Backoff::new();
        loop {
            {
                let guard = map::Guard::new();
                if let Some(slot) = self.map.get(key, &guard) {
                    if let Some(r) = slot.run(&f, &wrote) {
                        return Some(r);
                    }
                    // Evicted under us: help remove it, then use the key's new entry.
                    self.map.remove_same(key, slot.id());
                    backoff.snooze();
                    continue;
                }
            }
            if !self.insert(key, now) {
                return None;
            }
        }
    }

    /// Builds and inserts `key`'s limiter; false if the map is full (after an early sweep).
    /// Returns true also when another thread inserted the key first.
    fn insert<Q>(&self, key: &Q, now: Nanos) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if !self.reserve() {
            self.maybe_sweep(now, true);
            if !self.reserve() {
                return false;
            }
        }
        // Gives the room back unless the key goes in: if it was inserted first by another
        // thread, or if the factory (user code) panics.
        struct Room<'a>(&'a AtomicU64, bool);
        impl Drop for Room<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    self.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        let mut room = Room(&self.len, false);
        let key = key.to_owned();
        let slot = std::sync::Arc::new(Slot::new((self.factory)(&key)));
        room.1 = self.map.insert(key, slot);
        true
    }

    /// Reserves room for one more key under `max_keys`.
    fn reserve(&self) -> bool {
        let mut len = self.len.load(Ordering::Relaxed);
        loop {
            if len >= self.max_keys {
                return false;
            }
            match self
                .len
                .compare_exchange_weak(len, len + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => len = actual,
            }
        }
    }

    /// The full-map policy's answer.
    fn full(&self, now: Nanos) -> Result<(), Denied> {
        match self.when_full {
            WhenFull::Allow => Ok(()),
            WhenFull::Deny => {
                let next = self
                    .last_sweep
                    .load(Ordering::Relaxed)
                    .saturating_add(self.early_sweep_gap())
                    .max(now.as_u64().saturating_add(1));
                Err(Denied::new(now, Some(Nanos::new(next))))
            }
        }
    }

    /// An early sweep (map full) may follow the last one after this long.
    fn early_sweep_gap(&self) -> u64 {
        (self.sweep_every / 10).max(1_000_000)
    }

    /// Sweeps if one is due: `sweep_every` after the last one, or (`early`, the map is full)
    /// a tenth of that. One load when none is due; the thread whose CAS claims the sweep runs
    /// it.
    #[inline]
    fn maybe_sweep(&self, now: Nanos, early: bool) {
        let last = self.last_sweep.load(Ordering::Relaxed);
        let gap = if early {
            self.early_sweep_gap()
        } else {
            self.sweep_every
        };
        if now.as_u64() < last.saturating_add(gap) {
            return;
        }
        if self
            .last_sweep
            .compare_exchange(last, now.as_u64(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.evict_idle_at(now.saturating_sub(SWEEP_LAG));
        }
    }
}

impl<K, L, C> fmt::Debug for Keyed<K, L, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("len", &self.len())
            .field("max_keys", &self.max_keys)
            .field("when_full", &self.when_full)
            .field("sweep_every", &Duration::from_nanos(self.sweep_every))
            .finish()
    }
}

/// Options for a [`Keyed`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedBuilder<K, L, C: Clock = QuantaClock> {
    factory: Box<dyn Fn(&K) -> L + Send + Sync>,
    max_keys: u64,
    when_full: WhenFull,
    sweep_every: u64,
    clock: C,
}

impl<K, L, C> KeyedBuilder<K, L, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock,
{
    /// Holds at most `max_keys` keys; what happens to a new key beyond that is
    /// [`KeyedBuilder::when_full`]'s policy. Zero is [`ConfigError::ZeroMaxKeys`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(60)).unwrap())
    ///     .max_keys(1)
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1).is_ok());
    /// assert!(k.check(&2).is_err()); // full, and key 1 is busy: refused
    /// ```
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What a new key gets when the map is full: [`WhenFull::Deny`] (the default) or
    /// [`WhenFull::Allow`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::WhenFull;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(60)).unwrap())
    ///     .max_keys(1)
    ///     .when_full(WhenFull::Allow)
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1).is_ok());
    /// assert!(k.check(&2).is_ok()); // untracked
    /// assert_eq!(k.len(), 1);
    /// ```
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.when_full = policy;
        self
    }

    /// How often idle keys are swept (default [`DEFAULT_SWEEP_EVERY`], 10 s). The sweep runs
    /// inline in the first check after the interval, and visits every key (~50 ns a key
    /// here). `Duration::MAX` leaves sweeping to [`Keyed::evict_idle`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(60)).unwrap())
    ///     .sweep_every(Duration::from_secs(1))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.is_empty());
    /// ```
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX);
        self
    }

    /// Reads time from `clock`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, FixedWindow, Keyed, ManualClock, Nanos};
    /// let k = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
    ///     .clock(ManualClock::new(Nanos::new(2)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.clock().now(), Nanos::new(2));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> KeyedBuilder<K, L, D> {
        KeyedBuilder {
            factory: self.factory,
            max_keys: self.max_keys,
            when_full: self.when_full,
            sweep_every: self.sweep_every,
            clock,
        }
    }

    /// The keyed limiter; a `max_keys` of 0 is [`ConfigError::ZeroMaxKeys`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow, Keyed};
    /// let err = Keyed::builder(|_: &u8| FixedWindow::new(1, Duration::from_secs(1)).unwrap())
    ///     .max_keys(0)
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err, ConfigError::ZeroMaxKeys);
    /// ```
    pub fn build(self) -> Result<Keyed<K, L, C>, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        let now = self.clock.now().as_u64();
        Ok(Keyed {
            map: map::Map::new(),
            factory: self.factory,
            len: AtomicU64::new(0),
            max_keys: self.max_keys,
            when_full: self.when_full,
            sweep_every: self.sweep_every,
            last_sweep: AtomicU64::new(now),
            clock: self.clock,
        })
    }
}

impl<K, L, C: Clock> fmt::Debug for KeyedBuilder<K, L, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBuilder")
            .field("max_keys", &self.max_keys)
            .field("when_full", &self.when_full)
            .field("sweep_every", &Duration::from_nanos(self.sweep_every))
            .finish()
    }
}

/// The concurrent map behind [`Keyed`]: `scc::HashIndex`, or under loom a mutex-protected
/// stand-in that loom can see (as `sync.rs` does for the 128-bit atomic). The eviction
/// protocol above is what the loom models check; the map's own atomicity is scc's.
#[cfg(not(loom))]
mod map {
    use std::borrow::Borrow;
    use std::hash::Hash;
    use std::sync::Arc;

    use super::Slot;

    pub(super) use scc::ebr::Guard;

    pub(super) struct Map<K: 'static, L: 'static>(scc::HashIndex<K, Arc<Slot<L>>>);

    impl<K: Eq + Hash + Clone + 'static, L: 'static> Map<K, L> {
        pub(super) fn new() -> Self {
            Map(scc::HashIndex::default())
        }

        #[inline]
        pub(super) fn get<'g, Q>(&self, key: &Q, guard: &'g Guard) -> Option<&'g Slot<L>>
        where
            K: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            self.0.peek(key, guard).map(|slot| &**slot)
        }

        /// False if the key was present.
        pub(super) fn insert(&self, key: K, slot: Arc<Slot<L>>) -> bool {
            self.0.insert(key, slot).is_ok()
        }

        /// Removes `key` if it still maps to the slot `id`.
        pub(super) fn remove_same<Q>(&self, key: &Q, id: *const Slot<L>)
        where
            K: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            self.0
                .remove_if(key, |current| std::ptr::eq(&**current, id));
        }

        pub(super) fn retain(&self, mut keep: impl FnMut(&Slot<L>) -> bool) {
            self.0.retain(|_, slot| keep(slot));
        }
    }
}

#[cfg(loom)]
mod map {
    use std::borrow::Borrow;
    use std::collections::HashMap;
    use std::hash::Hash;
    use std::sync::Arc;

    use super::Slot;

    /// No epochs under loom: entries are `Arc`s handed out by clone.
    pub(super) struct Guard;

    impl Guard {
        pub(super) fn new() -> Guard {
            Guard
        }
    }

    pub(super) struct Map<K, L>(loom::sync::Mutex<HashMap<K, Arc<Slot<L>>>>); // loom models only

    impl<K: Eq + Hash + Clone, L> Map<K, L> {
        pub(super) fn new() -> Self {
            Map(loom::sync::Mutex::new(HashMap::new())) // loom models only
        }

        pub(super) fn get<Q>(&self, key: &Q, _: &Guard) -> Option<Arc<Slot<L>>>
        where
            K: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            self.0.lock().unwrap().get(key).cloned()
        }

        pub(super) fn insert(&self, key: K, slot: Arc<Slot<L>>) -> bool {
            let mut m = self.0.lock().unwrap();
            if m.contains_key(&key) {
                return false;
            }
            m.insert(key, slot);
            true
        }

        pub(super) fn remove_same<Q>(&self, key: &Q, id: *const Slot<L>)
        where
            K: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            let mut m = self.0.lock().unwrap();
            if m.get(key).is_some_and(|s| std::ptr::eq(&**s, id)) {
                m.remove(key);
            }
        }

        pub(super) fn retain(&self, mut keep: impl FnMut(&Slot<L>) -> bool) {
            self.0.lock().unwrap().retain(|_, slot| keep(slot));
        }
    }
}
