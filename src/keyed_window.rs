//! Per-key fixed windows with the state **inline**, go-zero `PeriodLimit` semantics: each key
//! is its key and one 64-bit word in an open-addressing table shared by all keys, the same
//! table and protocol as [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s (lookup, insert,
//! eviction, revival, resizes, sweeps, key bound; its module docs describe them). The general
//! [`Keyed`](crate::Keyed)`<K, FixedWindow>` holds a whole window limiter per key behind a
//! pointer (two cache misses per random-key check); this map shares the configuration
//! between keys, so a `u64` key costs a 16-byte slot and a check one miss.
//!
//! # The state word
//! Each key is a [`FixedWindow`](crate::FixedWindow): the end of its current window and what
//! the window has granted. A check of `n` at `now` opens a new window if the current one is
//! over (`now >= end`: the window ends one period after, or on the next boundary when
//! aligned, and counts `n`), else adds `n` to the count if it stays within the quota, else
//! refuses with the window's end as its retry time (never, `None`, for `n > quota`). A
//! reading older than the window's start counts in the window, as `FixedWindow`'s.
//!
//! The word holds both in the 59 bits the map leaves a rule, the count in as few bits as the
//! quota needs and the end in the others, counted from the map's **base** (the clock reading
//! at construction) in ticks of `2^s` ns:
//!
//! ```text
//!  63      62..59     58..c          c-1..0
//! [FROZEN][ tag (4) ][ end (ticks) ][ count ]     c = bits of the quota (1..=32)
//!   tag 1..=15: a live key of quota `tag - 1`
//!   tag 0, FROZEN: the engine's (EMPTY, DEAD, a resize's copy)
//! ```
//!
//! **Ticks.** `s` is the least shift that leaves the end field at least 8.5 years of readings
//! past the base, a period and a tick more: about `2^(c - 1)` ns (a quota of 1000 counts in
//! 10 bits, its ends in ticks of 512 ns). A window's end is **rounded up** to a tick, so it
//! lasts up to a tick longer than its period: never more grants, at most 1/256 of the period
//! later, which the builder checks ([`ConfigError::WindowTooShort`]: about 256 ns of period
//! per unit of quota). Readings on the tick grid see exactly `FixedWindow`'s windows.
//!
//! **Range.** Readings before the base count as the base; past the range (at least 8.5
//! years) time stands still for the map: a window open then never ends and its key is
//! refused once its quota is spent (it fails closed). Periods beyond 2^62 ns (146 years)
//! count as 2^62 ns: their windows outlast the range either way.
//!
//! **Budget.** Windows never overlap (one opens only at or after the last one's end, and
//! ends after the reading that opened it), each lasts at least its period, every grant is
//! counted in exactly one, and a window's count never passes the quota: at most
//! `quota * (1 + ceil(d / period))` grants in any span `d` of readings, whatever their order.
//!
//! **Orderings.** The rule has no atomics of its own: it computes the next word from the one
//! the map loaded, and the map's CASes are the whole protocol (`src/word_map.rs`). All the
//! rule needs from them is that a grant is applied with one CAS from the word it was computed
//! from, which every ordering gives.
//!
//! # A key's birth, and eviction
//! A key is **born** at `B` when it is inserted, or revived after a sweep at `J <= B` evicted
//! it (`B` is the later of the check's reading and the last sweep's time) as a **spent
//! window that ends at `B`**, as [`Keyed`](crate::Keyed) dates a new
//! [`FixedWindow`](crate::FixedWindow) ([`Idle::born_at`](crate::Idle::born_at)), the end
//! rounded down to a tick: a reading at `B` or later opens a window as on a fresh limiter;
//! an older one is refused, retry at that end. A key is **idle** at `J` once its window is over (`J >= end`); that end is a tick at
//! or before `J`, so at or before the newborn's: the evicted state and the newborn then open
//! the same window at the first reading at or after the newborn's end, and the newborn
//! refuses everything before: eviction never hands a key more than it had.
//! (A newborn with an empty window would count a stale reading in a window that may overlap
//! the evicted one: hence the spent one.)
//!
//! # Deviations
//! From go-zero's `PeriodLimit`, besides [`FixedWindow`](crate::FixedWindow)'s own (D14):
//! * the answer is a grant or a refusal with its retry time, not the three outcomes:
//!   [`KeyedWindow::status_at`] says what remains (a grant that leaves 0 is go-zero's
//!   `HitQuota`);
//! * windows end on a tick of the state word, up to `1/256` of the period late (above);
//! * readings before the base count as the base, and past the range time stands still.
//!
//! From [`Keyed`](crate::Keyed)`<K, FixedWindow>`: the same answers, refusals' retry times
//! included, for readings and window ends on the tick grid; off it, a window's end is rounded
//! up to the grid.
//!
//! # Quotas, memory, HashDoS, sweeps
//! As [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s: up to [`MAX_QUOTAS`] configurations
//! picked per new key by `classify`, a slot of `8 + size_of::<K>()` bytes, at most `max_keys`
//! keys (a new key finding the map full is refused, [`WhenFull::Deny`], or let through
//! untracked, [`WhenFull::Allow`]), std's `RandomState` by default, and sweeps every
//! `sweep_every` inline, by hand ([`KeyedWindow::evict_idle`]) or on a thread of their own
//! ([`KeyedWindow::spawn_sweeper`]). A key is evicted by the first sweep after its window
//! ends.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

pub use crate::keyed::{WhenFull, DEFAULT_MAX_KEYS, DEFAULT_SWEEP_EVERY};
pub use crate::word_map::MAX_QUOTAS;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::limiter::{Denied, QuotaStatus};
use crate::window::{quota_status, WindowSpec, WindowStatus};
use crate::word_map::{Settings, WordMap};
use crate::word_rule::{WordRule, RANGE_MIN, X_MASK};

/// The longest period the word counts (ns): longer ones count as this.
const PERIOD_CAP: u64 = 1 << 62;

/// A window's end may be late by at most `period / TICKS_PER_PERIOD` (one tick).
const TICKS_PER_PERIOD: u64 = 256;

/// One configuration of the quota table: the window's spec and the word's layout.
#[derive(Clone, Copy, Debug)]
struct Quota {
    spec: WindowSpec,
    /// The period as given (for `Debug` and the status's window).
    period: Duration,
    /// The period in ns, at most [`PERIOD_CAP`].
    p: u64,
    /// Bits of the count: the quota's.
    c: u32,
    /// `2^s` ns per tick of the end.
    s: u32,
    /// The last reading offset (ns past the base) the word counts.
    range: u64,
}

impl Quota {
    /// The layout for `spec` (a validated quota and period): the least tick that leaves
    /// [`RANGE_MIN`] of readings, or [`ConfigError::WindowTooShort`] if that tick is more
    /// than `1 / TICKS_PER_PERIOD` of the period.
    fn new(spec: WindowSpec, period: Duration) -> Result<Quota, ConfigError> {
        let c = u32::BITS - spec.quota.leading_zeros();
        let p = spec.period.min(PERIOD_CAP);
        let end_bits = X_MASK.count_ones() - c;
        // The largest end offset (ns) the field holds with ticks of 2^s, and the readings it
        // leaves: a window opened at the last one ends a period and, rounded, a tick later.
        let range_of = |s: u32| {
            let max_end = ((1u128 << end_bits) - 1) << s;
            max_end.saturating_sub(u128::from(p) + (1u128 << s) - 1)
        };
        // end_bits + s = 63 holds 2^63 - 2^s ns > PERIOD_CAP + RANGE_MIN + a tick: found.
        let s = (0..=63 - end_bits)
            .find(|&s| range_of(s) >= u128::from(RANGE_MIN))
            .unwrap_or(63 - end_bits);
        let tick = 1u64 << s;
        if tick.saturating_mul(TICKS_PER_PERIOD) > spec.period {
            return Err(ConfigError::WindowTooShort {
                period,
                min: Duration::from_nanos(tick.saturating_mul(TICKS_PER_PERIOD)),
            });
        }
        Ok(Quota {
            spec,
            period,
            p,
            c,
            s,
            // range_of(s) < 2^63: the field's bits, end_bits + s <= 63.
            range: range_of(s) as u64,
        })
    }

    /// `w`: the reading's offset past `base`, in `[0, range]`.
    #[inline(always)]
    fn w(&self, base: u64, now: Nanos) -> u64 {
        now.as_u64().saturating_sub(base).min(self.range)
    }

    /// The end (ns past the base) of the window in state `x`.
    #[inline(always)]
    fn end(&self, x: u64) -> u64 {
        (x >> self.c) << self.s
    }

    #[inline(always)]
    fn count(&self, x: u64) -> u64 {
        x & ((1 << self.c) - 1)
    }

    /// Ticks up to `off`, rounded up (`off <= range + p`: no overflow, and the field holds
    /// the result).
    #[inline(always)]
    fn ticks_ceil(&self, off: u64) -> u64 {
        (off + (1 << self.s) - 1) >> self.s
    }

    /// The end (in ticks) of the window a check at offset `w` opens: a period later, or
    /// aligned, the next boundary (go-zero's TTL, `WindowSpec::window_end`).
    #[inline(always)]
    fn opened_at(&self, base: u64, w: u64) -> u64 {
        let left = if self.spec.aligned {
            self.until_boundary(base, w)
        } else {
            self.p
        };
        self.ticks_ceil(w + left)
    }

    /// From offset `w` to the next boundary, in `[1, p]`.
    #[cold]
    fn until_boundary(&self, base: u64, w: u64) -> u64 {
        let period = u128::from(self.spec.period);
        let into = (u128::from(base) + u128::from(w) + u128::from(self.spec.shift)) % period;
        // period - into is in [1, period]; the clamp keeps it at most PERIOD_CAP.
        ((period - into) as u64).min(self.p)
    }

    /// The reading at offset `off` past the base; `None` past the end of representable time.
    fn at(base: u64, off: u64) -> Option<Nanos> {
        base.checked_add(off)
            .filter(|&t| t < u64::MAX)
            .map(Nanos::new)
    }

    /// The window a client sees at `now` in state `x` (`None`: no window, a new or evicted
    /// key): what remains of the quota and when it resets.
    fn status(&self, x: Option<u64>, base: u64, now: Nanos) -> WindowStatus {
        let w = self.w(base, now);
        let (count, end) = match x {
            Some(x) if w < self.end(x) => (self.count(x), self.end(x)),
            _ => (0, self.opened_at(base, w) << self.s),
        };
        WindowStatus {
            quota: self.spec.quota,
            // count <= quota.
            remaining: self.spec.quota - count as u32,
            resets_at: Quota::at(base, end).unwrap_or(Nanos::MAX),
        }
    }
}

/// The map's rule: `x` is the window's end in ticks past the base and its count (module docs,
/// "The state word").
impl WordRule for Quota {
    type Word = u64;

    /// A spent window that ends at `B`, rounded **down** to a tick: a check at `B` opens a
    /// window at once. Safe for contract 3: an idle key's end is a tick at or before `J`, so
    /// at or before `B` rounded down.
    #[inline(always)]
    fn born(&self, base: u64, now: Nanos) -> u64 {
        ((self.w(base, now) >> self.s) << self.c) | u64::from(self.spec.quota)
    }

    #[inline(always)]
    fn check(&self, x: u64, base: u64, now: Nanos, n: u32) -> Result<Option<u64>, Denied> {
        if n == 0 {
            return Ok(None);
        }
        if n > self.spec.quota {
            return Err(Denied::new(now, None));
        }
        let w = self.w(base, now);
        let end = self.end(x);
        if w >= end {
            // Over: a new window, which ends after `w >= end` (so `x` changes).
            return Ok(Some((self.opened_at(base, w) << self.c) | u64::from(n)));
        }
        if self.count(x) + u64::from(n) <= u64::from(self.spec.quota) {
            return Ok(Some(x + u64::from(n)));
        }
        Err(Denied::new(now, Quota::at(base, end)))
    }

    /// The window is over at `now`.
    #[inline(always)]
    fn idle(&self, x: u64, base: u64, now: Nanos) -> bool {
        self.w(base, now) >= self.end(x)
    }
}

/// Per-key fixed windows (go-zero `PeriodLimit` semantics), one 64-bit word per key in a
/// table shared by all keys. See the [module docs](self) for the word, a key's birth and the
/// deviations.
///
/// ```
/// use std::net::IpAddr;
/// use std::time::Duration;
/// use turnstile::keyed_window::KeyedWindow;
///
/// // 100 requests per client IP per minute, windows from each client's first request.
/// let per_ip = KeyedWindow::new(100, Duration::from_secs(60)).unwrap();
/// let client: IpAddr = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.check(&client).is_ok());
/// assert_eq!(per_ip.status(&client).remaining, 99);
/// ```
///
/// Quotas per key, and windows aligned on UTC boundaries (go-zero's `Align`):
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed_window::KeyedWindow, ManualClock, Nanos};
///
/// const DAY: Duration = Duration::from_secs(86_400);
/// let per_user = KeyedWindow::builder(1_000, DAY) // quota 0: 1000 a day
///     .quota(100_000, DAY) // quota 1
///     .classify(|user: &u64| usize::from(*user < 10)) // users 0..10 are premium
///     .align_utc() // every window ends at midnight UTC
///     .unix_origin(Duration::from_secs(1_704_067_200)) // the clock reads 0 at 2024-01-01
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let noon = Nanos::new(43_200_000_000_000);
/// assert!(per_user.check_n_at(&3, noon, 50_000).is_ok());
/// assert!(per_user.check_n_at(&30, noon, 1_001).is_err()); // more than its quota
/// let s = per_user.status_at(&3, noon);
/// assert_eq!((s.remaining, s.resets_after(noon)), (50_000, Duration::from_secs(43_200)));
/// ```
pub struct KeyedWindow<K, S = RandomState, C: Clock = QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    map: WordMap<K, Quota, S, C>,
}

impl<K> KeyedWindow<K>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// `quota` requests per `period` per key, each key's windows starting at its first
    /// request, on the quanta clock, with the default key bound and sweeps. A zero quota or
    /// period is an error ([`ConfigError::ZeroQuota`], [`ConfigError::ZeroPeriod`]), and so is
    /// a quota too large for its period ([`ConfigError::WindowTooShort`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_window::KeyedWindow, ConfigError};
    /// let k = KeyedWindow::new(2, Duration::from_secs(1)).unwrap();
    /// assert!(k.check(&"alice").is_ok());
    /// assert!(k.check(&"alice").is_ok());
    /// assert!(k.check(&"alice").is_err());
    /// assert_eq!(
    ///     KeyedWindow::<u8>::new(0, Duration::from_secs(1)).unwrap_err(),
    ///     ConfigError::ZeroQuota
    /// );
    /// ```
    pub fn new(quota: u32, period: Duration) -> Result<Self, ConfigError> {
        Self::builder(quota, period).build()
    }

    /// Options: more quotas and how keys pick them, aligned windows, the key bound, sweeps,
    /// the hasher and the clock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_window::KeyedWindow;
    /// let k = KeyedWindow::<u32>::builder(10, Duration::from_secs(1))
    ///     .max_keys(100_000)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(quota: u32, period: Duration) -> KeyedWindowBuilder<K> {
        KeyedWindowBuilder {
            quotas: Quotas {
                list: vec![(quota, period)],
                align: None,
                unix_origin: None,
            },
            settings: Settings::new(),
        }
    }
}

crate::word_map::front_methods!(
    KeyedWindow,
    "keyed_window",
    extra "",
    new "KeyedWindow::new(5, std::time::Duration::from_secs(1)).unwrap()",
    builder "KeyedWindow::builder(5, std::time::Duration::from_secs(1))"
);

impl<K, S, C> KeyedWindow<K, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// One request for `key` now, if its window has room.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_window::KeyedWindow;
    /// let k = KeyedWindow::new(1, Duration::from_secs(60)).unwrap();
    /// assert!(k.check("alice").is_ok());
    /// assert!(k.check("alice").is_err()); // until the minute is over
    /// assert!(k.check("bob").is_ok());
    /// # let _: &KeyedWindow<String> = &k;
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n_at(key, self.map.clock().now(), 1)
    }

    /// `n` requests for `key` now, all or nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_window::KeyedWindow;
    /// let k = KeyedWindow::new(5, Duration::from_secs(1)).unwrap();
    /// assert!(k.check_n(&1u8, 3).is_ok());
    /// assert!(k.check_n(&1u8, 3).is_err()); // 2 left
    /// assert_eq!(k.check_n(&1u8, 6).unwrap_err().retry_at(), None); // more than the quota
    /// ```
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n_at(key, self.map.clock().now(), n)
    }

    /// Counts `n` requests for `key` at `now` if they fit in its window, as one atomic step,
    /// inserting the key if it is new; otherwise changes nothing, as
    /// [`FixedWindow`](crate::FixedWindow)'s [`Limiter`](crate::Limiter) check. A denial says
    /// when the window ends; never (`None`) if `n > quota`. A refusal because the map is full
    /// ([`WhenFull::Deny`]) says when the next early sweep may make room. `n == 0` always
    /// passes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_window::KeyedWindow, ManualClock, Nanos};
    /// let k = KeyedWindow::<u8, _, _>::builder(3, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let t0 = Nanos::new(1_000_000_000);
    /// assert!(k.check_n_at(&1, t0, 3).is_ok()); // opens the key's window: [t0, t0 + 1 s)
    /// let d = k.check_n_at(&1, t0 + Duration::from_millis(400), 1).unwrap_err();
    /// assert_eq!(d.retry_after(), Some(Duration::from_millis(600)));
    /// assert!(k.check_n_at(&1, t0 + Duration::from_secs(1), 3).is_ok()); // a new window
    /// ```
    #[inline]
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.map.check_n_at(key, now, n)
    }

    /// [`KeyedWindow::status_at`] at the map's clock reading.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_window::KeyedWindow;
    /// let k = KeyedWindow::new(5, Duration::from_secs(60)).unwrap();
    /// k.check_n(&1u8, 2).unwrap();
    /// assert_eq!(k.status(&1u8).remaining, 3);
    /// ```
    pub fn status<Q>(&self, key: &Q) -> WindowStatus
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.status_at(key, self.map.clock().now())
    }

    /// The quota of `key`, what remains of it at `now` and when its window ends, as
    /// [`FixedWindow::status_at`](crate::FixedWindow::status_at): with no window open at
    /// `now` (a key the map does not hold, or whose window is over), the whole quota remains
    /// and `resets_at` is the end of the window a request at `now` would open. A key the map
    /// does not hold gets the quota `classify` picks for it. Writes nothing, inserts nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_window::KeyedWindow, ManualClock, Nanos};
    /// let k = KeyedWindow::<u8, _, _>::builder(10, Duration::from_secs(60))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 3).unwrap();
    /// let t = Nanos::new(15_000_000_000);
    /// let s = k.status_at(&1, t);
    /// assert_eq!((s.quota, s.remaining), (10, 7));
    /// assert_eq!(s.resets_after(t), Duration::from_secs(45));
    /// assert_eq!(k.status_at(&2, t).remaining, 10); // a new key
    /// ```
    pub fn status_at<Q>(&self, key: &Q, now: Nanos) -> WindowStatus
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (quota, x) = match self.map.read(key) {
            Some((quota, x)) => (quota, x),
            None => (self.map.classify(&key.to_owned()), None),
        };
        quota.status(x, self.map.base(), now)
    }

    /// [`KeyedWindow::status_at`] as the IETF `RateLimit` fields, as
    /// [`FixedWindow`](crate::FixedWindow)'s `quota_at`: `q` = the quota, `w` = the period,
    /// `r` = what remains, `t` = until the window ends. Always `Some`: the `Option` is
    /// `Keyed::quota_at`'s shape, for code written against both.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_window::KeyedWindow, ManualClock, Nanos, QuotaStatus};
    /// let k = KeyedWindow::<u8, _, _>::builder(5, Duration::from_secs(60))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 2).unwrap();
    /// let s = k.quota_at(&1, Nanos::new(15_000_000_000)).unwrap();
    /// assert_eq!(s, QuotaStatus {
    ///     quota: 5,
    ///     window: Duration::from_secs(60),
    ///     remaining: 3,
    ///     reset: Duration::from_secs(45),
    /// });
    /// ```
    pub fn quota_at<Q>(&self, key: &Q, now: Nanos) -> Option<QuotaStatus>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (quota, x) = match self.map.read(key) {
            Some((quota, x)) => (quota, x),
            None => (self.map.classify(&key.to_owned()), None),
        };
        let s = quota.status(x, self.map.base(), now);
        Some(quota_status(&quota.spec, s, now))
    }

    /// Evicts every key whose window is over at the map's clock reading; returns how many
    /// went.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_window::KeyedWindow;
    /// let k = KeyedWindow::new(1, Duration::from_secs(60)).unwrap();
    /// let _ = k.check(&1u8);
    /// assert_eq!(k.evict_idle(), 0); // its window is open
    /// ```
    pub fn evict_idle(&self) -> usize {
        self.evict_idle_at(self.map.clock().now())
    }

    /// Evicts every key whose window is over at `now`. Returns how many went; afterwards, if
    /// the table holds more evicted slots than live keys, rebuilds it without them.
    ///
    /// `now` may be any time and no key ever grants more for it (keys revived or inserted
    /// after this call are born at `now` or later, module docs).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_window::KeyedWindow, ManualClock, Nanos};
    /// let k = KeyedWindow::<u8, _, _>::builder(10, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let t = Nanos::new(1_000_000_000);
    /// let _ = k.check_n_at(&1, t, 1);
    /// let _ = k.check_n_at(&2, t + Duration::from_millis(500), 1);
    /// // Key 1's window ends at t + 1 s, key 2's half a second later.
    /// assert_eq!(k.evict_idle_at(t + Duration::from_secs(1)), 1);
    /// assert_eq!(k.len(), 1);
    /// ```
    pub fn evict_idle_at(&self, now: Nanos) -> usize {
        self.map.evict_idle_at(now)
    }
}

impl<K, S, C> fmt::Debug for KeyedWindow<K, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("KeyedWindow");
        let rules = self.map.rules();
        d.field("len", &self.len())
            .field(
                "quotas",
                &rules
                    .iter()
                    .map(|q| (q.spec.quota, q.period))
                    .collect::<Vec<_>>(),
            )
            .field(
                "utc_offset_secs",
                &rules[0]
                    .spec
                    .aligned
                    .then_some(rules[0].spec.utc_offset_secs),
            );
        self.map.debug_fields(&mut d);
        d.finish()
    }
}

/// Options for a [`KeyedWindow`]: more quotas, aligned windows, and the map's settings.
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedWindowBuilder<K, S = RandomState, C: Clock = QuantaClock> {
    quotas: Quotas,
    settings: Settings<K, S, C>,
}

/// What a [`KeyedWindowBuilder`] sets besides the map's settings.
#[derive(Debug)]
struct Quotas {
    /// `(quota, period)` of each quota, quota 0 first.
    list: Vec<(u32, Duration)>,
    /// Every quota's alignment: a UTC offset in seconds.
    align: Option<i64>,
    unix_origin: Option<Duration>,
}

crate::word_map::builder_methods!(
    KeyedWindowBuilder,
    KeyedWindow,
    "keyed_window",
    extra "",
    builder "KeyedWindow::builder(5, std::time::Duration::from_secs(1))"
);

impl<K, S, C> KeyedWindowBuilder<K, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Ends every quota's windows on period boundaries of UTC shifted by `utc_offset_secs`
    /// (go-zero's `Align()`), as [`window::Builder::align`](crate::window::Builder::align):
    /// a window opened at `t` ends at the next `b > t` with `(b + offset) % period == 0` in
    /// Unix time. The offset must be less than a day either way
    /// ([`ConfigError::InvalidUtcOffset`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_window::KeyedWindow, ManualClock, Nanos};
    /// // Hourly windows; the clock reads 0 at 10:45 UTC.
    /// let k = KeyedWindow::<u8, _, _>::builder(10, Duration::from_secs(3600))
    ///     .align(0)
    ///     .unix_origin(Duration::from_secs(10 * 3600 + 45 * 60))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 10).unwrap();
    /// let d = k.check_n_at(&1, Nanos::ZERO, 1).unwrap_err();
    /// assert_eq!(d.retry_after(), Some(Duration::from_secs(15 * 60))); // at 11:00
    /// ```
    pub fn align(mut self, utc_offset_secs: i64) -> Self {
        self.quotas.align = Some(utc_offset_secs);
        self
    }

    /// Aligned windows in UTC: `align(0)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_window::KeyedWindow;
    /// let k = KeyedWindow::builder(1, Duration::from_secs(60)).align_utc().build().unwrap();
    /// assert!(k.check(&1u8).is_ok());
    /// ```
    pub fn align_utc(self) -> Self {
        self.align(0)
    }

    /// The Unix time at which the map's clock reads [`Nanos::ZERO`]; only aligned windows use
    /// it. By default it is taken from the system clock at `build`, as
    /// [`window::Builder::unix_origin`](crate::window::Builder::unix_origin).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_window::KeyedWindow, ManualClock, Nanos};
    /// let k = KeyedWindow::<u8, _, _>::builder(1, Duration::from_secs(60))
    ///     .align_utc()
    ///     .unix_origin(Duration::from_secs(90)) // 1.5 minutes past a boundary
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.status_at(&1, Nanos::ZERO).resets_at, Nanos::new(30_000_000_000));
    /// ```
    pub fn unix_origin(mut self, unix_time_at_zero: Duration) -> Self {
        self.quotas.unix_origin = Some(unix_time_at_zero);
        self
    }

    /// Adds a quota of `quota` requests per `period`: the first call adds quota 1 (quota 0
    /// is the builder's), and so on, up to [`MAX_QUOTAS`] in all (more is
    /// [`ConfigError::TooManyQuotas`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_window::KeyedWindow;
    /// let k = KeyedWindow::builder(10, Duration::from_secs(60))
    ///     .quota(1000, Duration::from_secs(60)) // quota 1
    ///     .classify(|ip: &[u8; 4]| usize::from(ip[0] == 10))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n(&[10, 0, 0, 1], 500).is_ok());
    /// ```
    pub fn quota(mut self, quota: u32, period: Duration) -> Self {
        self.quotas.list.push((quota, period));
        self
    }

    /// Picks each new key's quota (an index into the quotas in the order they were added; one
    /// past them means quota 0). Called once per key insertion, not per check: a key keeps
    /// its quota until it is evicted.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_window::KeyedWindow;
    /// let k = KeyedWindow::builder(1, Duration::from_secs(1))
    ///     .quota(2, Duration::from_secs(1))
    ///     .classify(|user: &u32| if *user < 100 { 1 } else { 0 })
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n(&7, 2).is_ok());
    /// assert!(k.check_n(&700, 2).is_err());
    /// ```
    pub fn classify(mut self, classify: impl Fn(&K) -> usize + Send + Sync + 'static) -> Self {
        self.settings.classify = Box::new(classify);
        self
    }

    /// The map, or the first setting that cannot be used: a quota or period of 0
    /// ([`ConfigError::ZeroQuota`], [`ConfigError::ZeroPeriod`]), a quota too large for its
    /// period ([`ConfigError::WindowTooShort`]), [`ConfigError::InvalidUtcOffset`],
    /// [`ConfigError::ZeroMaxKeys`] or [`ConfigError::TooManyQuotas`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_window::KeyedWindow, ConfigError};
    /// let err = KeyedWindow::<u8>::builder(1_000_000, Duration::from_millis(1)).build();
    /// assert!(matches!(err.unwrap_err(), ConfigError::WindowTooShort { .. }));
    /// assert!(KeyedWindow::<u8>::builder(1_000_000, Duration::from_secs(1)).build().is_ok());
    /// ```
    pub fn build(self) -> Result<KeyedWindow<K, S, C>, ConfigError> {
        let now = self.settings.clock.now();
        let Quotas {
            list,
            align,
            unix_origin,
        } = &self.quotas;
        let quotas = list
            .iter()
            .map(|&(quota, period)| {
                Quota::new(
                    WindowSpec::new(quota, period, *align, *unix_origin, now)?,
                    period,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KeyedWindow {
            map: self.settings.build(&quotas)?,
        })
    }
}

impl<K, S, C: Clock> fmt::Debug for KeyedWindowBuilder<K, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("KeyedWindowBuilder");
        d.field("quotas", &self.quotas.list)
            .field("align", &self.quotas.align)
            .field("unix_origin", &self.quotas.unix_origin);
        self.settings.debug_fields(&mut d);
        d.finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{FixedWindow, Idle, Limiter, ManualClock};

    const SEC: u64 = 1_000_000_000;
    /// Every tick of the quotas below divides this grid (quotas under 1024, short periods).
    const GRID: u64 = 512;

    /// `(quota, period in ns, aligned)`: quotas of 1 bit to 10, periods on the grid.
    const CONFIGS: [(u32, u64, bool); 7] = [
        (1, 1024, false),
        (2, SEC, false),
        (5, 10 * SEC, true),
        (10, 60 * SEC, false),
        (100, 3 * SEC, true),
        (1000, SEC, false),
        (1023, 86_400 * SEC, true),
    ];

    /// The unix origin of the aligned configurations: on the grid, off every boundary.
    const ORIGIN: Duration = Duration::from_nanos(1_704_067_200 * SEC + 333 * GRID);

    fn spec(quota: u32, period: u64, aligned: bool) -> WindowSpec {
        let align = aligned.then_some(3600);
        WindowSpec::new(
            quota,
            Duration::from_nanos(period),
            align,
            Some(ORIGIN),
            Nanos::ZERO,
        )
        .unwrap()
    }

    fn quota(quota: u32, period: u64, aligned: bool) -> Quota {
        Quota::new(spec(quota, period, aligned), Duration::from_nanos(period)).unwrap()
    }

    fn window(quota: u32, period: u64, aligned: bool, b: Nanos) -> FixedWindow<ManualClock> {
        let mut w = crate::window::Builder::new(quota, Duration::from_nanos(period));
        if aligned {
            w = w.align(3600);
        }
        let mut w = w
            .unix_origin(ORIGIN)
            .clock(ManualClock::default())
            .build()
            .unwrap();
        w.born_at(b);
        w
    }

    /// On the tick grid the rule answers as a `FixedWindow` born at the same time (its
    /// `Idle::born_at`), check by check: grant or refusal, the refusal's retry time,
    /// idleness and the status; readings go forwards and backwards (stale), and land on the
    /// windows' edges.
    #[test]
    fn on_the_grid_the_rule_agrees_with_a_born_fixed_window() {
        let mut below = crate::clock::random_below();
        for &(q, period, aligned) in &CONFIGS {
            let rule = quota(q, period, aligned);
            assert!(
                GRID.is_multiple_of(1 << rule.s),
                "tick {} for {q}",
                1u64 << rule.s
            );
            for _ in 0..100 {
                let base = below(1 << 30) * GRID;
                let b = base + below(period / GRID * 3 + 1) * GRID;
                let fw = window(q, period, aligned, Nanos::new(b));
                let mut x = rule.born(base, Nanos::new(b));
                let mut now = b;
                for _ in 0..300 {
                    let step = match below(5) {
                        0 => period,
                        1 => below(period / GRID + 2) * GRID,
                        2 => 0,
                        _ => below(period / GRID / u64::from(q) + 2) * GRID,
                    };
                    now = if below(5) == 0 {
                        now.saturating_sub(step).max(base)
                    } else {
                        now + step
                    };
                    let t = Nanos::new(now);
                    let n = match below(4) {
                        0 => below(u64::from(q) + 2) as u32,
                        1 => u32::MAX - below(2) as u32,
                        _ => 1,
                    };
                    assert_eq!(rule.idle(x, base, t), fw.is_idle_at(t), "idle at {now}");
                    assert_eq!(rule.status(Some(x), base, t), fw.status_at(t), "at {now}");
                    let want = fw.check_n_at(t, n);
                    let got = rule.check(x, base, t, n);
                    assert_eq!(got.map(|_| ()), want, "{q}/{period}ns: n {n} at {now}");
                    if let Ok(Some(x2)) = got {
                        assert_ne!(x2, x, "contract 2: a grant that writes changes x");
                        assert!(x2 <= X_MASK);
                        x = x2;
                    }
                }
            }
        }
    }

    /// Off the grid, the rule is `FixedWindow` with every window's end rounded up to a tick:
    /// a literal model of that, at random readings, quotas of every size up to `u32::MAX`.
    #[test]
    fn off_the_grid_windows_end_on_the_next_tick() {
        let mut below = crate::clock::random_below();
        let configs = [
            (3, 1_000_003, false),
            (1000, SEC + 7, true),
            (70_000, 60 * SEC + 1, false),
            (u32::MAX, 86_400 * SEC, false),
            (u32::MAX - 1, 7 * 86_400 * SEC, true),
        ];
        for (q, period, aligned) in configs {
            let rule = quota(q, period, aligned);
            let sp = spec(q, period, aligned);
            let tick = 1u64 << rule.s;
            assert!(tick * TICKS_PER_PERIOD <= period);
            for _ in 0..100 {
                let base = below(1 << 50);
                let ceil = |t: u64| base + (t - base).div_ceil(tick) * tick;
                let b = base + below(3 * period);
                let floor = |t: u64| base + (t - base) / tick * tick;
                let (mut end, mut count) = (floor(b), u64::from(q));
                let mut x = rule.born(base, Nanos::new(b));
                let mut now = b;
                for _ in 0..200 {
                    let step = if below(4) == 0 {
                        // Onto the window's edge: its end, or the nanosecond before.
                        end.saturating_sub(now).saturating_sub(below(2))
                    } else {
                        below(period / 2 + 2)
                    };
                    now = if below(6) == 0 {
                        now.saturating_sub(step).max(base)
                    } else {
                        now + step
                    };
                    let n = match below(3) {
                        0 => below(u64::from(q).min(1 << 20) + 2) as u32,
                        1 => q,
                        _ => 1,
                    };
                    let idle = rule.idle(x, base, Nanos::new(now));
                    assert_eq!(idle, now >= end, "{q}/{period}: idle at {now}");
                    let want = if n == 0 {
                        Ok(())
                    } else if n > q {
                        Err(Denied::new(Nanos::new(now), None))
                    } else if now >= end {
                        (end, count) = (ceil(sp.window_end(now)), u64::from(n));
                        Ok(())
                    } else if count + u64::from(n) <= u64::from(q) {
                        count += u64::from(n);
                        Ok(())
                    } else {
                        Err(Denied::new(Nanos::new(now), Some(Nanos::new(end))))
                    };
                    let got = rule.check(x, base, Nanos::new(now), n);
                    assert_eq!(got.map(|_| ()), want, "{q}/{period}: n {n} at {now}");
                    x = got.ok().flatten().unwrap_or(x);
                    assert_eq!(
                        (base + rule.end(x), rule.count(x)),
                        (end, count),
                        "{q}/{period} at {now}"
                    );
                }
            }
        }
    }

    /// Contract 3: a key idle at `J`, evicted and born again at `B >= J`, grants nothing its
    /// old state would have refused, stale readings (before `B`, before `J`) included. The
    /// old state shadows the newborn: it takes exactly the newborn's grants, and each must be
    /// one it grants too.
    #[test]
    fn an_idle_key_born_again_never_grants_more() {
        let mut below = crate::clock::random_below();
        let mut evictions = 0u32;
        for &(q, period, aligned) in &CONFIGS {
            let rule = quota(q, period, aligned);
            for _ in 0..300 {
                let base = below(1 << 40);
                let j = base + below(period * 4 + 1000);
                // A window ending around J, with any count.
                let end = (j + period / 2).saturating_sub(below(period + 3)).max(base);
                let x_old = (rule.ticks_ceil(end - base) << rule.c) | below(u64::from(q) + 1);
                if !rule.idle(x_old, base, Nanos::new(j)) {
                    continue;
                }
                evictions += 1;
                let b = j + [0, 1, below(period + 3)][below(3) as usize];
                let mut born = rule.born(base, Nanos::new(b));
                let mut old = x_old;
                for _ in 0..40 {
                    let edges = [b, end, j, b + period, end.saturating_sub(period)];
                    let at = if below(2) == 0 {
                        edges[below(5) as usize] + below(2)
                    } else {
                        (b + below(period * 2 + 2)).saturating_sub(below(period * 2 + 2))
                    };
                    let at = Nanos::new(at.max(base));
                    let n = 1 + below(u64::from(q)) as u32;
                    if let Ok(w) = rule.check(born, base, at, n) {
                        let o = rule.check(old, base, at, n);
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
    fn the_range_is_at_least_eight_and_a_half_years_and_ticks_fit_the_period() {
        const YEAR: f64 = 365.25 * 86_400e9;
        let d = Duration::from_nanos;
        for (q, period) in [
            (1, 256),
            (1000, SEC),
            (1000, 146 * 365 * 86_400 * SEC),
            (u32::MAX, 86_400 * SEC),
            (1, u64::MAX),
        ] {
            let rule = quota(q, period, false);
            assert!(rule.range as f64 >= 8.5 * YEAR, "{q}/{period}");
            // The last reading of the range: a new window's word still fits.
            let top = Nanos::new(rule.range);
            let x = rule.born(0, top);
            assert!(x <= X_MASK);
            if let Ok(Some(x2)) = rule.check(x, 0, top, 1) {
                assert!(x2 <= X_MASK);
            }
            // A window opened there, all of the quota at once: end and count still fit.
            let open = rule.check(0, 0, top, q).unwrap().unwrap();
            assert!(open <= X_MASK && rule.count(open) == u64::from(q));
            assert!(rule.end(open) > rule.range);
        }
        // A quota of 1000 ticks in 512 ns: periods from 131 072 ns.
        let err = Quota::new(spec(1000, 131_071, false), d(131_071)).unwrap_err();
        assert_eq!(
            err,
            ConfigError::WindowTooShort {
                period: d(131_071),
                min: d(131_072)
            }
        );
        assert!(Quota::new(spec(1000, 131_072, false), d(131_072)).is_ok());
        assert!(Quota::new(spec(u32::MAX, SEC, false), d(SEC)).is_err());
        // The 10 bits of 1000 leave 49 for the end: 512 ns ticks; 1024 is the next one.
        assert_eq!(quota(1000, SEC, false).s, 9);
        assert_eq!(quota(1024, SEC, false).s, 10);
    }

    /// Past the range time stands still: a key gets at most its window's quota more, then
    /// is refused for good (it fails closed), and nothing overflows.
    #[test]
    fn past_the_range_a_key_fails_closed() {
        let rule = quota(3, SEC, false);
        let base = 5;
        let mut x = rule.born(base, Nanos::new(base));
        let mut grants = 0;
        for i in 0..10u64 {
            let t = Nanos::new(base + rule.range + i * 1_000_000 * SEC);
            if let Ok(w) = rule.check(x, base, t, 1) {
                grants += 1;
                x = w.unwrap_or(x);
            }
        }
        assert_eq!(grants, 3);
        assert!(rule.check(x, base, Nanos::MAX, 1).is_err());
        assert!(!rule.idle(x, base, Nanos::MAX));
    }
}
