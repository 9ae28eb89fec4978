//! Per-key sliding-window counters with the state **inline**: each key is its key and one
//! 64-bit word in an open-addressing table shared by all keys, the same table and protocol
//! as [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s (lookup, insert, eviction, revival,
//! resizes, sweeps, key bound; its module docs describe them). The general
//! [`Keyed`](crate::Keyed)`<K, SlidingWindow>` holds a whole 128-bit limiter per key behind
//! a pointer (two dependent cache misses per random-key check); this map shares the
//! configuration between keys, so a `u64` key costs a 16-byte slot and a check one miss.
//!
//! # The rule
//! Each key is a [`SlidingWindow`](crate::SlidingWindow), with its arithmetic (the same
//! functions, not a copy): windows `[kP, (k+1)P)` counted from the map's **base** (the clock
//! reading at construction), the state `(k, prev, curr)`, a check of `n` at offset `e` into
//! window `j` rolls it (`j == k` keeps it, `j == k + 1` gives `(curr, 0)`, later `(0, 0)`),
//! grants iff `prev * (P - e) + (curr + n) * P <= Q * P` in integers, and adds `n` to
//! `curr`. A reading before the state's window is judged at that window's start. A refusal
//! is decided from one load, writes nothing, and carries the exact retry time
//! `SlidingWindow` gives (never, `None`, for `n > Q`). A check of `n = 0` passes and writes
//! nothing. Rolling divides nothing for a reading in the state's window or the next one;
//! only a reading two or more windows on divides by `P`.
//!
//! # The state word
//! The three fields share the 59 bits the map leaves a rule, each count in as many bits as
//! the quota needs (`b` = the bits of `Q`), the window index in the rest:
//!
//! ```text
//!  63      62..59     58..2b      2b-1..b   b-1..0
//! [FROZEN][ tag (4) ][ k      ][ prev    ][ curr   ]     b = bits of the quota (1..=29)
//!   tag 1..=15: a live key of quota `tag - 1`
//!   tag 0, FROZEN: the engine's (EMPTY, DEAD, a resize's copy)
//! ```
//!
//! **Invariant.** `prev <= Q` and `curr <= Q` (a grant needs `curr + n <= Q`), and the
//! committed words of a key form one sequence in which `k` never decreases and, for one `k`,
//! `curr` only grows: each is the roll of the word it replaced to the check's window, plus
//! the grant, written by one CAS from that word (the map's protocol). Every grant adds at
//! least 1 to `curr`, so it changes the word.
//!
//! **Range.** The index field has `59 - 2b` bits, so the map counts `2^(59 - 2b)` windows
//! from its base; the builder accepts a quota only if that is at least 8.5 years of
//! readings, else [`ConfigError::SlidingQuotaTooLarge`] with the largest quota the period
//! holds (a millisecond holds quotas up to 1023, a second up to 32767, a minute up to
//! 262143; a period of a nanosecond none). Readings before the base count as the base.
//! Past the range **time stands still** for the map: every reading counts as the range's
//! last nanosecond, the last of its last window, so no state rolls any more. There a key
//! gets what the weighted count allows (at most `Q` more) and is then refused for good, retry
//! time `None`; a key granted in the range's last two windows is never idle again, so it is
//! never evicted: the map fails closed.
//!
//! **Budget**, as [`SlidingWindow`](crate::SlidingWindow)'s rules 1–3, in **judged times**
//! (a grant's reading, or the start of the state's window if that is later): each aligned
//! window holds at most `Q` grants; at every grant `prev * (P - e) / P + curr <= Q`; so any
//! span of one period holds at most `Q + prev * f < 2Q`. Over a key's whole history, across
//! any number of evictions (below).
//!
//! **Orderings.** The rule has no atomics of its own: it computes the next word from the one
//! the map loaded, and the map's CASes are the whole protocol (`src/keyed/word_map.rs`).
//!
//! # A key's birth, and eviction
//! A key is **born** at `B` (inserted, or revived after a sweep at `J <= B` evicted it; `B` is
//! the later of the check's reading and the last sweep's time) as `(B / P, 0, 0)`, as
//! [`Keyed`](crate::Keyed) dates a new `SlidingWindow`
//! ([`Idle::born_at`](crate::Idle::born_at)): a reading at `B` or later sees a fresh
//! limiter; an older one is judged at the start of `B`'s window. A key is **idle** at `J`
//! when its weighted count at `J` is 0.
//!
//! **What eviction keeps.** A stored word with a grant has `curr >= 1`, so an idle key's
//! last grants are in a window `k <= J / P - 2`, and every window of the newborn is at least
//! `B / P >= J / P`: window `k + 1` holds no grant, the key's incarnations use disjoint
//! windows, and the newborn's first window starts with `prev = 0`, the true count of the
//! window before it (`k + 1` or later). (A word that never granted is `(k, 0, 0)`, a birth:
//! evicting it hands nothing.) So rules 1–3 hold, in judged times, over the history that runs on the
//! evicted word and then on the newborn: the budget holds across evictions. **Per reading**
//! the newborn is at least as strict as the evicted word at every reading from the start of
//! `J`'s window on (both see empty windows). An older, stale reading is not covered: the
//! evicted word would judge it in its own window, where its grants may refuse it, and the
//! newborn judges it at the start of `B`'s window, where nothing does. Such a grant is what
//! one `SlidingWindow` grants a stale reading that lost the race to a check in a later
//! window: counted there, within the budget. `Keyed<K, SlidingWindow>` does the same.
//!
//! # Deviations
//! From [`SlidingWindow`](crate::SlidingWindow): windows are counted from the map's base,
//! not from the clock's origin (the same windows as a `SlidingWindow` whose clock reads 0
//! at the map's construction); quotas are bounded by the period (above); readings before the
//! base count as the base, and past the range time stands still.
//!
//! From [`Keyed`](crate::Keyed)`<K, SlidingWindow>`: with the clock at 0 at construction,
//! none within the range: the same decisions, retry times, statuses, idleness and births
//! (`tests/keyed_sliding.rs` runs both side by side, across sweeps).
//!
//! # Quotas, memory, HashDoS, sweeps
//! As [`KeyedTokenBucket`](crate::KeyedTokenBucket)'s: up to [`MAX_QUOTAS`] configurations
//! picked per new key by `classify`, a slot of `8 + size_of::<K>()` bytes, at most `max_keys`
//! keys (a new key finding the map full is refused, [`WhenFull::Deny`], or let through
//! untracked, [`WhenFull::Allow`]), std's `RandomState` by default, and sweeps every
//! `sweep_every` inline, by hand ([`KeyedSlidingWindow::evict_idle`]) or on a thread of
//! their own ([`KeyedSlidingWindow::spawn_sweeper`]). A key is evicted by the first sweep
//! once its weighted count is 0: two windows after its last grant's at the latest.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

pub use crate::keyed::word_map::MAX_QUOTAS;
pub use crate::keyed::WhenFull;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::fixed_window::WindowStatus;
use crate::keyed::word_rule::{WordRule, RANGE_MIN, X_MASK};
use crate::keyed::{InlineMap, InlineMapBuilder};
use crate::limiter::{Denied, QuotaStatus};
use crate::sliding_window::{quota_status, validate, Counts, Rule, View};

/// The bits of `x`.
const X_BITS: u32 = X_MASK.count_ones();

/// One quota of a [`KeyedSlidingWindow`]: the rule its keys follow, its configuration
/// precomputed. The map's builder makes it (`builder`, `quota`); it is the map's type
/// parameter (`KeyedSlidingWindow<K>` is `InlineMap<K, SlidingWindowQuota>`), named only to name
/// the map's builder, `InlineMapBuilder<K, SlidingWindowQuota>`.
// The sliding window's arithmetic and the word's layout: what a check reads comes first.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct SlidingWindowQuota {
    /// `P` and `Q`, as [`SlidingWindow`](crate::SlidingWindow)'s.
    pub(crate) rule: Rule,
    /// `b`: the bits of each count.
    pub(crate) b: u32,
    /// The last reading offset (ns past the base) the word counts.
    pub(crate) range: u64,
    /// The period as given (for `Debug` and the status's window).
    pub(crate) period: Duration,
}

impl SlidingWindowQuota {
    /// The layout for `quota` per `period`: [`ConfigError::ZeroQuota`],
    /// [`ConfigError::ZeroPeriod`], or [`ConfigError::SlidingQuotaTooLarge`] if the index
    /// field left would count less than [`RANGE_MIN`] of readings.
    fn new(quota: u32, period: Duration) -> Result<SlidingWindowQuota, ConfigError> {
        validate(quota, period)?;
        let rule = Rule::new(quota, period);
        let b = u32::BITS - quota.leading_zeros();
        match SlidingWindowQuota::range(rule.p, b) {
            Some(range) => Ok(SlidingWindowQuota {
                rule,
                b,
                range,
                period,
            }),
            None => Err(ConfigError::SlidingQuotaTooLarge {
                quota,
                period,
                // The most bits whose range holds; a period of 1 ns holds none.
                max: (1..=b)
                    .rev()
                    .find(|&b| SlidingWindowQuota::range(rule.p, b).is_some())
                    .map_or(0, |b| ((1u64 << b) - 1) as u32),
            }),
        }
    }

    /// The last offset a layout with counts of `b` bits counts (its last window's last
    /// nanosecond, at most `u64::MAX`), if that is at least [`RANGE_MIN`].
    fn range(p: u128, b: u32) -> Option<u64> {
        let k_bits = X_BITS.checked_sub(2 * b)?;
        // p <= 2^64 and k_bits <= 57: no overflow.
        let last = ((1u128 << k_bits) * p - 1).min(u128::from(u64::MAX)) as u64;
        (last >= RANGE_MIN).then_some(last)
    }

    /// The reading's offset past `base`, in `[0, range]`.
    #[inline(always)]
    fn w(&self, base: u64, now: Nanos) -> Nanos {
        Nanos::new(now.as_u64().saturating_sub(base).min(self.range))
    }

    #[inline(always)]
    fn unpack(&self, x: u64) -> Counts {
        let mask = (1 << self.b) - 1;
        Counts {
            k: x >> (2 * self.b),
            // Each at most the quota: `b` bits.
            prev: ((x >> self.b) & mask) as u32,
            curr: (x & mask) as u32,
        }
    }

    /// `(j, prev, curr)` as a word: `j <= range / P` fits the index field, the counts (at
    /// most the quota) theirs.
    #[inline(always)]
    fn pack(&self, j: u64, prev: u32, curr: u32) -> u64 {
        (j << (2 * self.b)) | (u64::from(prev) << self.b) | u64::from(curr)
    }

    /// The state `x` (`None`: a new or evicted key, no counts) as a check at `now` sees it.
    #[inline(always)]
    fn view(&self, x: Option<u64>, base: u64, now: Nanos) -> View {
        let s = x.map_or(
            Counts {
                k: 0,
                prev: 0,
                curr: 0,
            },
            |x| self.unpack(x),
        );
        self.rule.view(s, self.w(base, now))
    }

    /// The reading at offset `off` past the base: `None` past the range (time stands
    /// still there) or past the end of representable time.
    fn at(&self, base: u64, off: Nanos) -> Option<Nanos> {
        let off = off.as_u64();
        if off > self.range {
            return None;
        }
        base.checked_add(off).map(Nanos::new)
    }

    /// The quota a client sees at `now` in state `x` (`None`: a new or evicted key), as
    /// [`SlidingWindow::status_at`](crate::SlidingWindow::status_at).
    fn status(&self, x: Option<u64>, base: u64, now: Nanos) -> WindowStatus {
        let v = self.view(x, base, now);
        let s = self.rule.status(&v, self.w(base, now));
        WindowStatus {
            resets_at: if v.prev == 0 && v.curr == 0 {
                now
            } else {
                self.at(base, s.resets_at).unwrap_or(Nanos::MAX)
            },
            ..s
        }
    }
}

/// The map's rule: `x` is `(k, prev, curr)` (module docs, "The state word").
impl WordRule for SlidingWindowQuota {
    type Word = u64;
    /// `(quota, period)` of each quota.
    type Quotas = Vec<(u32, Duration)>;
    const NAME: &'static str = "KeyedSlidingWindow";

    fn rules(
        quotas: &Self::Quotas,
        _: impl FnOnce() -> Nanos,
    ) -> Result<Vec<SlidingWindowQuota>, ConfigError> {
        quotas
            .iter()
            .map(|&(quota, period)| SlidingWindowQuota::new(quota, period))
            .collect()
    }

    fn debug_quotas(rules: &[SlidingWindowQuota], d: &mut fmt::DebugStruct<'_, '_>) {
        let quotas: Vec<_> = rules.iter().map(|q| (q.rule.quota, q.period)).collect();
        d.field("quotas", &quotas);
    }

    /// `(B / P, 0, 0)`: a fresh limiter rolled to `B`'s window, as `SlidingWindow::born_at`.
    #[inline(always)]
    fn born(&self, base: u64, now: Nanos) -> u64 {
        self.pack(self.view(None, base, now).j, 0, 0)
    }

    #[inline(always)]
    fn check(&self, x: u64, base: u64, now: Nanos, n: u32) -> Result<Option<u64>, Denied> {
        if n == 0 {
            return Ok(None);
        }
        let v = self.view(Some(x), base, now);
        if !self.rule.fits(&v, n) {
            return Err(self.denied(&v, base, now, n));
        }
        // fits: curr + n <= quota.
        Ok(Some(self.pack(v.j, v.prev, v.curr + n)))
    }

    /// The weighted count at `now` is 0.
    #[inline(always)]
    fn idle(&self, x: u64, base: u64, now: Nanos) -> bool {
        self.rule.load(&self.view(Some(x), base, now)) == 0
    }
}

impl SlidingWindowQuota {
    /// A refusal at `v`, with `SlidingWindow`'s retry time.
    #[inline(always)]
    fn denied(&self, v: &View, base: u64, now: Nanos, n: u32) -> Denied {
        Denied::new(now, self.rule.retry_at(v, n).and_then(|t| self.at(base, t)))
    }
}

/// Per-key sliding-window counters, one 64-bit word per key in a table shared by all keys:
/// at most `quota` per aligned window, the previous window's count weighted by how much of
/// it the sliding window still overlaps, as [`SlidingWindow`](crate::SlidingWindow). See the
/// [module docs](self) for the word, its range, a key's birth and eviction, and the
/// deviations.
///
/// ```
/// use std::net::IpAddr;
/// use std::time::Duration;
/// use turnstile::keyed::sliding_window::KeyedSlidingWindow;
///
/// // 100 requests per client IP per minute, sliding.
/// let per_ip = KeyedSlidingWindow::new(100, Duration::from_secs(60)).unwrap();
/// let client: IpAddr = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.check(&client).is_ok());
/// assert_eq!(per_ip.status(&client).remaining, 99);
/// ```
///
/// Quotas per key, and the weighting at work:
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::sliding_window::KeyedSlidingWindow, ManualClock, Nanos};
///
/// let per_user = KeyedSlidingWindow::builder(4, Duration::from_secs(1)) // quota 0
///     .quota(1_000, Duration::from_secs(1)) // quota 1
///     .classify(|user: &u64| usize::from(*user < 10)) // users 0..10 are premium
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let ms = |m: u64| Nanos::new(m * 1_000_000);
/// assert!(per_user.check_n_at(&30, ms(900), 4).is_ok());
/// // At 1.25 s window 0's 4 weigh 3: one more fits, and a second at 1.5 s.
/// assert!(per_user.check_n_at(&30, ms(1250), 2).is_err());
/// assert!(per_user.check_n_at(&30, ms(1250), 1).is_ok());
/// let d = per_user.check_n_at(&30, ms(1250), 1).unwrap_err();
/// assert_eq!(d.retry_at(), Some(ms(1500)));
/// assert!(per_user.check_n_at(&3, ms(900), 1_000).is_ok());
/// ```
///
/// # A check
/// `check_n_at(key, now, n)` counts `n` requests for `key` at `now` if the weighted count stays
/// within the quota (`prev * (P - e) / P + curr + n <= quota`), as one atomic step, inserting the
/// key if it is new; otherwise changes nothing, as [`SlidingWindow`](crate::SlidingWindow)'s
/// [`Limiter`](crate::Limiter) check. A denial carries the exact retry time: the earliest time the
/// same check would pass if nothing else is taken; never (`None`) if `n > quota`. A refusal because
/// the map is full ([`WhenFull::Deny`]) says when the next early sweep may make room. `n == 0`
/// always passes.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::sliding_window::KeyedSlidingWindow, ManualClock, Nanos};
/// let k = KeyedSlidingWindow::<u8, _, _>::builder(5, Duration::from_secs(1))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let ms = |m: u64| Nanos::new(m * 1_000_000);
/// assert!(k.check_n_at(&1, ms(0), 5).is_ok());
/// // Full until window 0 ends; at 1.2 s its 5 weigh 4, and 1 more fits.
/// assert_eq!(k.check_n_at(&1, ms(500), 1).unwrap_err().retry_at(), Some(ms(1200)));
/// assert!(k.check_n_at(&1, ms(1200), 1).is_ok());
/// ```
///
/// # Idle keys
/// `evict_idle_at(now)` evicts every key whose weighted count is 0 at `now`. Returns how many went;
/// afterwards, if the table holds more evicted slots than live keys, rebuilds it without
/// them.
///
/// `now` may be any time and the budget holds for it (keys revived or inserted after this
/// call are born at `now` or later, module docs).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::sliding_window::KeyedSlidingWindow, ManualClock, Nanos};
/// let k = KeyedSlidingWindow::<u8, _, _>::builder(10, Duration::from_secs(1))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let s = |secs: u64| Nanos::new(secs * 1_000_000_000);
/// let _ = k.check_n_at(&1, s(0), 1);
/// let _ = k.check_n_at(&2, s(1), 1);
/// // Key 1's grant weighs until the end of window 1, key 2's until the end of window 2.
/// assert_eq!(k.evict_idle_at(s(2)), 1);
/// assert_eq!(k.len(), 1);
/// ```
pub type KeyedSlidingWindow<K, S = RandomState, C = QuantaClock> =
    InlineMap<K, SlidingWindowQuota, S, C>;

impl<K> KeyedSlidingWindow<K>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// `quota` requests per `period` per key, on the quanta clock, with the default key bound
    /// and sweeps. A zero quota or period is an error ([`ConfigError::ZeroQuota`],
    /// [`ConfigError::ZeroPeriod`]), and so is a quota too large for its period
    /// ([`ConfigError::SlidingQuotaTooLarge`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::sliding_window::KeyedSlidingWindow, ConfigError};
    /// let k = KeyedSlidingWindow::new(2, Duration::from_secs(1)).unwrap();
    /// assert!(k.check(&"alice").is_ok());
    /// assert!(k.check(&"alice").is_ok());
    /// assert!(k.check(&"alice").is_err());
    /// assert_eq!(
    ///     KeyedSlidingWindow::<u8>::new(0, Duration::from_secs(1)).unwrap_err(),
    ///     ConfigError::ZeroQuota
    /// );
    /// ```
    pub fn new(quota: u32, period: Duration) -> Result<Self, ConfigError> {
        Self::builder(quota, period).build()
    }

    /// Options: more quotas and how keys pick them, the key bound, sweeps, the hasher and
    /// the clock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::sliding_window::KeyedSlidingWindow;
    /// let k = KeyedSlidingWindow::<u32>::builder(10, Duration::from_secs(1))
    ///     .max_keys(100_000)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(quota: u32, period: Duration) -> InlineMapBuilder<K, SlidingWindowQuota> {
        InlineMapBuilder::with_quotas(vec![(quota, period)])
    }
}

impl<K, S, C> InlineMap<K, SlidingWindowQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// [`KeyedSlidingWindow::status_at`] at the map's clock reading.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::sliding_window::KeyedSlidingWindow;
    /// let k = KeyedSlidingWindow::new(5, Duration::from_secs(60)).unwrap();
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

    /// The quota of `key` as a client should see it at `now`, as
    /// [`SlidingWindow::status_at`](crate::SlidingWindow::status_at): `remaining` is the
    /// most a check at `now` would grant, `resets_at` when the weighted count reaches 0 if
    /// nothing more is taken (`now` if it is 0 already). A key the map does not hold has its
    /// whole quota, the one `classify` picks for it. Writes nothing, inserts nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::sliding_window::KeyedSlidingWindow, ManualClock, Nanos, WindowStatus};
    /// let k = KeyedSlidingWindow::<u8, _, _>::builder(5, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let ms = |m: u64| Nanos::new(m * 1_000_000);
    /// k.check_n_at(&1, ms(200), 5).unwrap();
    /// // At 1.5 s the 5 weigh 2.5: 2 remain; the weight is gone at 2.0 s.
    /// assert_eq!(
    ///     k.status_at(&1, ms(1500)),
    ///     WindowStatus { quota: 5, remaining: 2, resets_at: ms(2000) }
    /// );
    /// assert_eq!(k.status_at(&2, ms(1500)).remaining, 5); // a new key
    /// ```
    pub fn status_at<Q>(&self, key: &Q, now: Nanos) -> WindowStatus
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (quota, x) = self.read(key);
        quota.status(x, self.map.base(), now)
    }

    /// [`KeyedSlidingWindow::status_at`] as the IETF `RateLimit` fields, as
    /// [`SlidingWindow`](crate::SlidingWindow)'s `quota_at`: `q` = the quota, `w` = the
    /// period, `r` = what a check at `now` would grant, `t` = until the weighted count is 0.
    /// Always `Some`: the `Option` is `Keyed::quota_at`'s shape, for code written against
    /// both.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::sliding_window::KeyedSlidingWindow, ManualClock, Nanos, QuotaStatus};
    /// let k = KeyedSlidingWindow::<u8, _, _>::builder(5, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 5).unwrap();
    /// let s = k.quota_at(&1, Nanos::new(1_500_000_000)).unwrap();
    /// assert_eq!(s, QuotaStatus {
    ///     quota: 5,
    ///     window: Duration::from_secs(1),
    ///     remaining: 2,
    ///     reset: Duration::from_millis(500),
    /// });
    /// ```
    pub fn quota_at<Q>(&self, key: &Q, now: Nanos) -> Option<QuotaStatus>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (quota, x) = self.read(key);
        let s = quota.status(x, self.map.base(), now);
        Some(quota_status(s, quota.period, now))
    }

    /// The quota of `key` and its state (`None`: evicted, or not held; then the quota
    /// `classify` picks for it), from one load.
    fn read<Q>(&self, key: &Q) -> (&SlidingWindowQuota, Option<u64>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.map
            .read(key)
            .unwrap_or_else(|| (self.map.classify(&key.to_owned()), None))
    }
}

impl<K, S, C> InlineMapBuilder<K, SlidingWindowQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Adds a quota of `quota` requests per `period`: the first call adds quota 1 (quota 0
    /// is the builder's), and so on, up to [`MAX_QUOTAS`] in all (more is
    /// [`ConfigError::TooManyQuotas`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::sliding_window::KeyedSlidingWindow;
    /// let k = KeyedSlidingWindow::builder(10, Duration::from_secs(60))
    ///     .quota(1000, Duration::from_secs(60)) // quota 1
    ///     .classify(|ip: &[u8; 4]| usize::from(ip[0] == 10))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n(&[10, 0, 0, 1], 500).is_ok());
    /// ```
    pub fn quota(mut self, quota: u32, period: Duration) -> Self {
        self.quotas.push((quota, period));
        self
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{Idle, Limiter, ManualClock, SlidingWindow};

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000_000_000;

    fn quota(q: u32, period: u64) -> SlidingWindowQuota {
        SlidingWindowQuota::new(q, Duration::from_nanos(period)).unwrap()
    }

    /// `(quota, period in ns)`: small, odd, and at the largest quota each period holds.
    const CONFIGS: [(u32, u64); 7] = [
        (1, 1000),
        (2, SEC),
        (5, 3 * SEC + 7),
        (1023, MS),
        (32_767, SEC),
        (262_143, 60 * SEC),
        (100, 86_400 * SEC),
    ];

    /// The rule answers as a `SlidingWindow` born at the same time, check by check: grant
    /// or refusal, the retry time, idleness and the status; readings go forwards and
    /// backwards (stale), onto window edges, with any base (windows count from it).
    #[test]
    fn the_rule_agrees_with_a_born_sliding_window() {
        let mut below = crate::clock::random_below();
        for &(q, p) in &CONFIGS {
            let rule = quota(q, p);
            for _ in 0..60 {
                let base = below(1 << 50);
                let b = base + below(p * 3 + 1);
                let mut sw = SlidingWindow::builder(q, Duration::from_nanos(p))
                    .clock(ManualClock::default())
                    .build()
                    .unwrap();
                sw.born_at(Nanos::new(b - base));
                let mut x = rule.born(base, Nanos::new(b));
                let mut now = b;
                for _ in 0..300 {
                    let step = match below(5) {
                        0 => p,
                        1 => below(p * 2 + 2),
                        2 => 0,
                        3 => (p - now.saturating_sub(base) % p).saturating_sub(below(2)),
                        _ => below(p / u64::from(q) + 2),
                    };
                    now = if below(5) == 0 {
                        now.saturating_sub(step).max(base)
                    } else {
                        now + step
                    };
                    let (t, rel) = (Nanos::new(now), Nanos::new(now - base));
                    let n = match below(4) {
                        0 => below(u64::from(q) + 2) as u32,
                        1 => u32::MAX - below(2) as u32,
                        _ => 1 + below(3) as u32,
                    };
                    assert_eq!(rule.idle(x, base, t), sw.is_idle_at(rel), "idle at {now}");
                    let s = sw.status_at(rel);
                    let ours = rule.status(Some(x), base, t);
                    assert_eq!(ours.remaining, s.remaining, "{q}/{p} at {now}");
                    assert_eq!(
                        ours.resets_after(t),
                        s.resets_after(rel),
                        "{q}/{p} at {now}"
                    );
                    let want = sw.check_n_at(rel, n).map_err(|d| d.retry_at());
                    let got = rule.check(x, base, t, n);
                    let shift = |r: Option<Nanos>| r.map(|r| Nanos::new(r.as_u64() - base));
                    assert_eq!(
                        got.map(|_| ()).map_err(|d| shift(d.retry_at())),
                        want,
                        "{q}/{p}: n {n} at {now}"
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

    /// Contract 3, as the module docs state it for this rule: a key idle at `J`, born again
    /// at `B >= J`, grants nothing the old state would refuse at a reading from the start
    /// of `J`'s window on; and an older reading can part them (the old state refuses, the
    /// newborn grants), which is why the contract is the budget in judged times.
    #[test]
    fn an_idle_key_born_again_is_as_strict_from_the_sweeps_window_on() {
        let mut below = crate::clock::random_below();
        let (mut evictions, mut parted) = (0u32, 0u32);
        for &(q, p) in &CONFIGS {
            let rule = quota(q, p);
            for _ in 0..300 {
                let base = below(1 << 40);
                // A state with grants in window k (and maybe k - 1), judged at J.
                let k = 1 + below(5);
                let x = rule.pack(
                    k,
                    below(u64::from(q) + 1) as u32,
                    1 + below(u64::from(q)) as u32,
                );
                let j = base + (k + below(4)) * p + below(p);
                if !rule.idle(x, base, Nanos::new(j)) {
                    assert!(j - base < (k + 2) * p, "idle two windows on");
                    continue;
                }
                evictions += 1;
                let b = j + [0, 1, below(p * 2 + 3)][below(3) as usize];
                let born = rule.born(base, Nanos::new(b));
                let from = base + (j - base) / p * p;
                for _ in 0..40 {
                    let at = (b + below(p * 2 + 2))
                        .saturating_sub(below(p * 4 + 2))
                        .max(base);
                    let n = 1 + below(u64::from(q)) as u32;
                    let (nb, old) = (
                        rule.check(born, base, Nanos::new(at), n),
                        rule.check(x, base, Nanos::new(at), n),
                    );
                    if at >= from {
                        assert!(nb.is_err() || old.is_ok(), "n {n} at {at}, J {j}");
                    } else if nb.is_ok() && old.is_err() {
                        parted += 1;
                    }
                }
            }
        }
        assert!(evictions > 500, "only {evictions} idle states tried");
        assert!(parted > 0, "no stale reading parted them");
    }

    #[test]
    fn layouts_hold_eight_and_a_half_years_and_reject_what_does_not_fit() {
        const YEAR: f64 = 365.25 * 86_400e9;
        let d = Duration::from_nanos;
        // (period, the largest quota): P = 1 ms needs 38 bits of index, 1 s 28, 60 s 23.
        for (p, max) in [
            (MS, 1023),
            (SEC, 32_767),
            (60 * SEC, 262_143),
            (2, 1),
            (u64::MAX, (1 << 29) - 1),
        ] {
            let rule = quota(max, p);
            assert!(rule.range as f64 >= 8.5 * YEAR, "{max}/{p}");
            assert_eq!(
                SlidingWindowQuota::new(max + 1, d(p)).unwrap_err(),
                ConfigError::SlidingQuotaTooLarge {
                    quota: max + 1,
                    period: d(p),
                    max
                }
            );
            // The last reading of the range: a full window's word fits.
            let top = Nanos::new(rule.range);
            let x = rule.check(rule.born(0, top), 0, top, max).unwrap().unwrap();
            assert!(x <= X_MASK);
            assert_eq!(rule.unpack(x).k, rule.range / p);
            assert_eq!(rule.unpack(x).curr, max);
        }
        assert_eq!(
            SlidingWindowQuota::new(1, d(1)).unwrap_err(),
            ConfigError::SlidingQuotaTooLarge {
                quota: 1,
                period: d(1),
                max: 0
            }
        );
        assert!(SlidingWindowQuota::new(u32::MAX, Duration::MAX).is_err());
        assert_eq!(
            SlidingWindowQuota::new(0, d(1)).unwrap_err(),
            ConfigError::ZeroQuota
        );
        assert_eq!(
            SlidingWindowQuota::new(1, d(0)).unwrap_err(),
            ConfigError::ZeroPeriod
        );
    }

    /// Past the range time stands still: a key gets what the weighting allows at the
    /// range's last nanosecond, then is refused for good (retry: never), is never idle, and
    /// nothing overflows.
    #[test]
    fn past_the_range_a_key_fails_closed() {
        // The largest quota of a second: a range of 2^29 s, within the clock's.
        let rule = quota(32_767, SEC);
        let base = 5;
        let mut x = rule.born(base, Nanos::new(base));
        let mut grants = 0;
        for i in 0..10u64 {
            let t = Nanos::new(base + rule.range + i * 1_000_000 * SEC);
            match rule.check(x, base, t, 10_000) {
                Ok(w) => {
                    grants += 1;
                    x = w.unwrap_or(x);
                }
                Err(d) => assert_eq!(d.retry_at(), None),
            }
        }
        assert_eq!(grants, 3);
        // 2767 remain, for good.
        let d = rule.check(x, base, Nanos::MAX, 2_768).unwrap_err();
        assert_eq!(d.retry_at(), None);
        assert!(!rule.idle(x, base, Nanos::MAX));
    }
}
