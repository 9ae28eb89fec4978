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
//! the map loaded, and the map's CASes are the whole protocol (`src/keyed/word_map.rs`). All the
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

pub use crate::keyed::word_map::MAX_QUOTAS;
pub use crate::keyed::WhenFull;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::fixed_window::{quota_status, WindowSpec, WindowStatus};
use crate::keyed::word_rule::{WordRule, RANGE_MIN, X_MASK};
use crate::keyed::{InlineMap, InlineMapBuilder};
use crate::limiter::{Denied, QuotaStatus};

/// The longest period the word counts (ns): longer ones count as this.
const PERIOD_CAP: u64 = 1 << 62;

/// A window's end may be late by at most `period / TICKS_PER_PERIOD` (one tick).
const TICKS_PER_PERIOD: u64 = 256;

/// One quota of a [`KeyedWindow`]: the rule its keys follow, its configuration
/// precomputed. The map's builder makes it (`builder`, `quota`); it is the map's type
/// parameter (`KeyedWindow<K>` is `InlineMap<K, FixedWindowQuota>`), named only to name
/// the map's builder, `InlineMapBuilder<K, FixedWindowQuota>`.
#[derive(Clone, Copy, Debug)]
pub struct FixedWindowQuota {
    pub(crate) spec: WindowSpec,
    /// The period as given (for `Debug` and the status's window).
    pub(crate) period: Duration,
    /// The period in ns, at most [`PERIOD_CAP`].
    pub(crate) p: u64,
    /// Bits of the count: the quota's.
    pub(crate) c: u32,
    /// `2^s` ns per tick of the end.
    pub(crate) s: u32,
    /// The last reading offset (ns past the base) the word counts.
    pub(crate) range: u64,
}

impl FixedWindowQuota {
    /// The layout for `spec` (a validated quota and period): the least tick that leaves
    /// [`RANGE_MIN`] of readings, or [`ConfigError::WindowTooShort`] if that tick is more
    /// than `1 / TICKS_PER_PERIOD` of the period.
    fn new(spec: WindowSpec, period: Duration) -> Result<FixedWindowQuota, ConfigError> {
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
        Ok(FixedWindowQuota {
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
            resets_at: FixedWindowQuota::at(base, end).unwrap_or(Nanos::MAX),
        }
    }
}

/// The map's rule: `x` is the window's end in ticks past the base and its count (module docs,
/// "The state word").
impl WordRule for FixedWindowQuota {
    type Word = u64;
    type Quotas = Quotas;
    const NAME: &'static str = "KeyedWindow";

    fn rules(
        quotas: &Quotas,
        now: impl FnOnce() -> Nanos,
    ) -> Result<Vec<FixedWindowQuota>, ConfigError> {
        let Quotas {
            list,
            align,
            unix_origin,
        } = quotas;
        let now = now();
        list.iter()
            .map(|&(quota, period)| {
                FixedWindowQuota::new(
                    WindowSpec::new(quota, period, *align, *unix_origin, now)?,
                    period,
                )
            })
            .collect()
    }

    fn debug_quotas(rules: &[FixedWindowQuota], d: &mut fmt::DebugStruct<'_, '_>) {
        let quotas: Vec<_> = rules.iter().map(|q| (q.spec.quota, q.period)).collect();
        d.field("quotas", &quotas).field(
            "utc_offset_secs",
            &rules[0]
                .spec
                .aligned
                .then_some(rules[0].spec.utc_offset_secs),
        );
    }

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
        Err(Denied::new(now, FixedWindowQuota::at(base, end)))
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
/// use turnstile::keyed::fixed_window::KeyedWindow;
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
/// use turnstile::{keyed::fixed_window::KeyedWindow, ManualClock, Nanos};
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
///
/// # A check
/// `check_n_at(key, now, n)` counts `n` requests for `key` at `now` if they fit in its window, as
/// one atomic step, inserting the key if it is new; otherwise changes nothing, as
/// [`FixedWindow`](crate::FixedWindow)'s [`Limiter`](crate::Limiter) check. A denial says when the
/// window ends; never (`None`) if `n > quota`. A refusal because the map is full
/// ([`WhenFull::Deny`]) says when the next early sweep may make room. `n == 0` always passes.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::fixed_window::KeyedWindow, ManualClock, Nanos};
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
///
/// # Idle keys
/// `evict_idle_at(now)` evicts every key whose window is over at `now`. Returns how many went;
/// afterwards, if the table holds more evicted slots than live keys, rebuilds it without them.
///
/// `now` may be any time and no key ever grants more for it (keys revived or inserted
/// after this call are born at `now` or later, module docs).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::fixed_window::KeyedWindow, ManualClock, Nanos};
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
pub type KeyedWindow<K, S = RandomState, C = QuantaClock> = InlineMap<K, FixedWindowQuota, S, C>;

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
    /// use turnstile::{keyed::fixed_window::KeyedWindow, ConfigError};
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
    /// use turnstile::keyed::fixed_window::KeyedWindow;
    /// let k = KeyedWindow::<u32>::builder(10, Duration::from_secs(1))
    ///     .max_keys(100_000)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(quota: u32, period: Duration) -> InlineMapBuilder<K, FixedWindowQuota> {
        InlineMapBuilder::with_quotas(Quotas {
            list: vec![(quota, period)],
            align: None,
            unix_origin: None,
        })
    }
}

impl<K, S, C> InlineMap<K, FixedWindowQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// [`KeyedWindow::status_at`] at the map's clock reading.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::fixed_window::KeyedWindow;
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
    /// use turnstile::{keyed::fixed_window::KeyedWindow, ManualClock, Nanos};
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
    /// use turnstile::{keyed::fixed_window::KeyedWindow, ManualClock, Nanos, QuotaStatus};
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
}

pub(crate) use quotas::Quotas;

/// The builder's record, public in name only (its module is private): the rule's
/// [`WordRule::Quotas`].
mod quotas {
    use super::*;

    /// What a keyed window's builder sets besides the map's settings.
    #[derive(Debug)]
    pub struct Quotas {
        /// `(quota, period)` of each quota, quota 0 first.
        pub(crate) list: Vec<(u32, Duration)>,
        /// Every quota's alignment: a UTC offset in seconds.
        pub(crate) align: Option<i64>,
        pub(crate) unix_origin: Option<Duration>,
    }
}

impl<K, S, C> InlineMapBuilder<K, FixedWindowQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Ends every quota's windows on period boundaries of UTC shifted by `utc_offset_secs`
    /// (go-zero's `Align()`), as [`window::FixedWindowBuilder::align`](crate::fixed_window::FixedWindowBuilder::align):
    /// a window opened at `t` ends at the next `b > t` with `(b + offset) % period == 0` in
    /// Unix time. The offset must be less than a day either way
    /// ([`ConfigError::InvalidUtcOffset`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::fixed_window::KeyedWindow, ManualClock, Nanos};
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
    /// use turnstile::keyed::fixed_window::KeyedWindow;
    /// let k = KeyedWindow::builder(1, Duration::from_secs(60)).align_utc().build().unwrap();
    /// assert!(k.check(&1u8).is_ok());
    /// ```
    pub fn align_utc(self) -> Self {
        self.align(0)
    }

    /// The Unix time at which the map's clock reads [`Nanos::ZERO`]; only aligned windows use
    /// it. By default it is taken from the system clock at `build`, as
    /// [`window::FixedWindowBuilder::unix_origin`](crate::fixed_window::FixedWindowBuilder::unix_origin).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::fixed_window::KeyedWindow, ManualClock, Nanos};
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
    /// use turnstile::keyed::fixed_window::KeyedWindow;
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
}

#[cfg(all(test, not(loom)))]
mod tests;
