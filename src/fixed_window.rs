//! A lock-free fixed-window counter with the semantics of go-zero's `PeriodLimit`: a quota of
//! requests per period, per limiter.
//!
//! # Semantics (go-zero `core/limit/periodlimit.go` and its Lua script)
//! * Every request of a window counts. The quota-th is [`Outcome::HitQuota`] and **is still
//!   permitted**; the ones before it are [`Outcome::Allowed`], the ones after it
//!   [`Outcome::OverQuota`] (refused). With a quota of 1 the first request is `HitQuota`
//!   (go-zero#1581).
//! * By default a window starts at the first request after the previous window ended and
//!   lasts one period (go-zero sets the key's TTL on the first hit). With
//!   [`FixedWindowBuilder::align`] windows end on period boundaries of UTC shifted by an explicit
//!   offset, as go-zero's `Align()` does with the process's time zone: a daily quota at
//!   offset +8 h resets at local midnight in UTC+8.
//! * [`FixedWindow::status_at`] gives the quota, what remains and when the window resets:
//!   what the `RateLimit-*` response headers carry.
//!
//! # The protocol
//! **The state word** (`state`, one `AtomicU128`, cache-padded):
//! ```text
//!  127                               64 63                                0
//! +-----------------------------------+-----------------------------------+
//! | end: u64 ns, when the window ends | count: u64, granted in the window |
//! +-----------------------------------+-----------------------------------+
//! ```
//! A fresh limiter holds `(0, 0)`: a window that ended at time 0, so the first request at any
//! time opens a new one. An `end` that saturated at `u64::MAX` (a period reaching past the end
//! of representable time) never ends.
//!
//! **A take of `n` at `now`** loads the word. If `now >= end` the window is over: the take
//! installs `(end', n)` with `end'` the end of the window `now` opens (`now + period`, or the
//! next boundary when aligned). Otherwise it installs `(end, count + n)`. Either is one
//! `compare_exchange_weak` on the whole word; a failed CAS retries from the word it returned
//! (with a [`Backoff`]). A take that would go over the quota, and a take of zero, write
//! nothing: they are decided from the load alone.
//!
//! **Invariant.** `count <= quota` always, and every grant is counted in exactly one window:
//! the CAS that grants it moves either `count` (same `end`) or `end` (a new window, `count =
//! n`) from the very word it read, so no grant can be lost or counted twice, and a window's
//! `count` only ever grows until `end` moves on. Windows never overlap: a new `end'` is set
//! only when `now >= end`, and `end' > now`.
//!
//! **Stale clock readings.** A take whose `now` lies before the current window's start (a
//! thread that read the clock, then lost a race to a thread that opened a newer window) is
//! counted in the current window: an earlier time never opens a new window and so never frees
//! quota (the window analogue of the token bucket's D2).
//!
//! **Orderings.** Every access is `Relaxed`: the configuration is immutable and reaches other
//! threads with the limiter; what the protocol needs is single-location coherence, which
//! every ordering gives (a CAS succeeds only against the latest value in the word's
//! modification order, so the committed words form one sequential history).
//!
//! # Deviations from go-zero
//! * **D14** a quota of 0 ([`ConfigError::ZeroQuota`]) and a period of 0
//!   ([`ConfigError::ZeroPeriod`]) are errors (go-zero refuses everything, or divides by zero
//!   when aligned); the alignment offset is an explicit parameter, UTC by default
//!   ([`FixedWindowBuilder::align`]); an offset of a day or more is [`ConfigError::InvalidUtcOffset`].
//! * go-zero counts over-quota requests too (`INCRBY` on every call). Here an over-quota take
//!   writes nothing (to the state's value: see the crate docs on 128-bit loads). For single
//!   takes, go-zero's only kind, the two cannot be told apart: once the count reaches the
//!   quota, every later take of the window is `OverQuota` either way, and the remaining quota
//!   is 0 either way. `reference::FixedWindow` keeps the
//!   literal `INCRBY` for single takes, and the differential test checks that they agree.
//!   They differ after a refused [`FixedWindow::take_n`] with `n > 1`, which counts nothing
//!   (all or nothing), where an `INCRBY n` would count all `n`: with quota 5, `take_n(3)` is
//!   `Allowed`, `take_n(3)` `OverQuota`, then `take_n(2)` is `HitQuota` here and would be
//!   `OverQuota` under `INCRBY` (the twin follows turnstile for `n != 1`; pinned by
//!   `tests/window_semantics.rs::take_n_is_all_or_nothing`).
//! * Periods are any [`Duration`] at nanosecond resolution, not whole seconds.
//! * [`FixedWindow::take_n`] (all or nothing, counted as `n` requests) is an extension; go-zero
//!   only takes one at a time.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::layout::{Compact, Layout, Padded};
use crate::limiter::{Denied, Idle, Limiter, QuotaStatus};
use crate::sync::{AtomicU128, Ordering};

/// What a window limiter said to a request (go-zero's `PeriodLimit` codes).
///
/// `HitQuota` is the quota-th request of the window and **is still permitted**; only
/// `OverQuota` is a refusal.
///
/// ```
/// use turnstile::Outcome;
/// assert!(Outcome::HitQuota.is_permitted());
/// assert!(!Outcome::OverQuota.is_permitted());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "an over-quota request must not go ahead: check the outcome"]
pub enum Outcome {
    /// Permitted, with quota left in the window.
    Allowed,
    /// Permitted, and it used the window's last unit of quota.
    HitQuota,
    /// Refused: the window's quota is spent.
    OverQuota,
}

impl Outcome {
    /// True for `Allowed` and `HitQuota`.
    ///
    /// ```
    /// use turnstile::Outcome;
    /// assert!(Outcome::Allowed.is_permitted());
    /// ```
    pub fn is_permitted(self) -> bool {
        !matches!(self, Outcome::OverQuota)
    }

    /// go-zero's script reply turned into an outcome: `current` is the count including this
    /// request.
    pub(crate) fn of(current: u64, quota: u32) -> Outcome {
        match current.cmp(&u64::from(quota)) {
            std::cmp::Ordering::Less => Outcome::Allowed,
            std::cmp::Ordering::Equal => Outcome::HitQuota,
            std::cmp::Ordering::Greater => Outcome::OverQuota,
        }
    }
}

/// A window limiter's quota as a client should see it: what the `RateLimit-Limit`,
/// `RateLimit-Remaining` and `RateLimit-Reset` response headers carry.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{FixedWindow, ManualClock, Nanos};
///
/// let w = FixedWindow::builder(10, Duration::from_secs(60))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// w.take_n_at(Nanos::ZERO, 3);
/// let s = w.status_at(Nanos::new(15_000_000_000));
/// assert_eq!((s.quota, s.remaining), (10, 7));
/// assert_eq!(s.resets_after(Nanos::new(15_000_000_000)), Duration::from_secs(45));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a status changes nothing: it is only worth its answer"]
pub struct WindowStatus {
    /// The quota per window.
    pub quota: u32,
    /// What is left of it now.
    pub remaining: u32,
    /// When the whole quota is available again if nothing more is taken.
    pub resets_at: Nanos,
}

impl WindowStatus {
    /// How long after `now` the quota resets (zero if it already has).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Nanos, WindowStatus};
    /// let s = WindowStatus { quota: 5, remaining: 0, resets_at: Nanos::new(2_000) };
    /// assert_eq!(s.resets_after(Nanos::new(500)), Duration::from_nanos(1_500));
    /// ```
    pub fn resets_after(&self, now: Nanos) -> Duration {
        self.resets_at.saturating_duration_since(now)
    }
}

/// A lock-free fixed-window counter: `quota` requests per `period`, with go-zero
/// `PeriodLimit`'s outcomes (see the [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{FixedWindow, ManualClock, Nanos, Outcome};
///
/// let w = FixedWindow::builder(2, Duration::from_secs(1))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t = Nanos::new(500_000_000);
/// assert_eq!(w.take_at(t), Outcome::Allowed);
/// assert_eq!(w.take_at(t), Outcome::HitQuota);  // the 2nd of 2: still permitted
/// assert_eq!(w.take_at(t), Outcome::OverQuota);
/// // The window opened at the first hit and lasts one period.
/// assert_eq!(w.take_at(Nanos::new(1_499_999_999)), Outcome::OverQuota);
/// assert_eq!(w.take_at(Nanos::new(1_500_000_000)), Outcome::Allowed);
/// ```
pub struct FixedWindow<C: Clock = QuantaClock, P: Layout = Padded> {
    /// `end << 64 | count`; see the module docs. Cache-padded unless `P` is [`Compact`].
    state: P::Cell<AtomicU128>,
    spec: WindowSpec,
    clock: C,
}

/// The immutable configuration, shared with the twin.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowSpec {
    pub(crate) quota: u32,
    /// The period in ns, saturated at `u64::MAX`.
    pub(crate) period: u64,
    /// For aligned windows, `(unix time of the clock's origin + UTC offset)` in ns, modulo the
    /// period: a clock reading `t` is at `t + shift` (mod period) on the shifted UTC time line
    /// whose period boundaries end the windows. Kept reduced so the spec stays small (a
    /// [`Compact`] window is 64 bytes).
    pub(crate) shift: u64,
    pub(crate) aligned: bool,
    /// Less than a day either way (checked by the builder).
    pub(crate) utc_offset_secs: i32,
}

impl WindowSpec {
    /// When the window that a first hit at `now` opens ends: go-zero's key TTL. Without
    /// alignment one period later; aligned, at the next boundary (go-zero's
    /// `calcExpireSeconds`, in `[1 ns, period]`). Saturates at [`Nanos::MAX`].
    pub(crate) fn window_end(&self, now: u64) -> u64 {
        if !self.aligned {
            return now.saturating_add(self.period);
        }
        let into = (u128::from(now) + u128::from(self.shift)) % u128::from(self.period);
        // period - into is in [1, period], which fits a u64.
        now.saturating_add(self.period - into as u64)
    }
}

impl FixedWindow<QuantaClock> {
    /// `quota` requests per `period`, windows starting at the first request, on the shared
    /// quanta clock. A zero quota or period is an error (deviation D14).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow};
    ///
    /// let w = FixedWindow::new(100, Duration::from_secs(60)).unwrap();
    /// assert!(w.take().is_permitted());
    /// assert_eq!(FixedWindow::new(0, Duration::from_secs(1)).unwrap_err(), ConfigError::ZeroQuota);
    /// ```
    pub fn new(quota: u32, period: Duration) -> Result<FixedWindow, ConfigError> {
        FixedWindowBuilder::new(quota, period).build()
    }

    /// A builder, with options [`FixedWindowBuilder::align`], [`FixedWindowBuilder::align_utc`],
    /// [`FixedWindowBuilder::unix_origin`] and [`FixedWindowBuilder::clock`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::FixedWindow;
    ///
    /// // 1000 requests per calendar day in UTC+8.
    /// let w = FixedWindow::builder(1000, Duration::from_secs(86_400))
    ///     .align(8 * 3600)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(w.utc_offset_secs(), Some(8 * 3600));
    /// ```
    pub fn builder(quota: u32, period: Duration) -> FixedWindowBuilder {
        FixedWindowBuilder::new(quota, period)
    }
}

impl<C: Clock, P: Layout> FixedWindow<C, P> {
    fn from_spec(spec: WindowSpec, clock: C) -> FixedWindow<C, P> {
        FixedWindow {
            state: P::cell(AtomicU128::new(pack(0, 0))),
            spec,
            clock,
        }
    }

    /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, FixedWindow, ManualClock, Nanos};
    /// let w = FixedWindow::builder(1, Duration::from_secs(1))
    ///     .clock(ManualClock::new(Nanos::new(4)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(w.clock().now(), Nanos::new(4));
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Requests permitted per window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::FixedWindow;
    /// assert_eq!(FixedWindow::new(7, Duration::from_secs(1)).unwrap().quota(), 7);
    /// ```
    pub fn quota(&self) -> u32 {
        self.spec.quota
    }

    /// The window length.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::FixedWindow;
    /// let w = FixedWindow::new(7, Duration::from_secs(3)).unwrap();
    /// assert_eq!(w.period(), Duration::from_secs(3));
    /// ```
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.spec.period)
    }

    /// The UTC offset windows are aligned to, or `None` if windows start at the first hit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::FixedWindow;
    /// let w = FixedWindow::builder(7, Duration::from_secs(60)).align_utc().build().unwrap();
    /// assert_eq!(w.utc_offset_secs(), Some(0));
    /// ```
    pub fn utc_offset_secs(&self) -> Option<i64> {
        self.spec
            .aligned
            .then_some(i64::from(self.spec.utc_offset_secs))
    }

    /// One request now (go-zero's `Take`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Outcome};
    /// let w = FixedWindow::new(1, Duration::from_secs(60)).unwrap();
    /// assert_eq!(w.take(), Outcome::HitQuota); // quota 1: the first is the quota-th
    /// assert_eq!(w.take(), Outcome::OverQuota);
    /// ```
    pub fn take(&self) -> Outcome {
        self.take_n_at(self.clock.now(), 1)
    }

    /// One request at `now`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Nanos, Outcome};
    /// let w = FixedWindow::new(5, Duration::from_secs(1)).unwrap();
    /// let outcomes: Vec<_> = (0..7).map(|_| w.take_at(Nanos::ZERO)).collect();
    /// assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Allowed).count(), 4);
    /// assert_eq!(outcomes[4], Outcome::HitQuota);
    /// assert_eq!(outcomes[5..], [Outcome::OverQuota, Outcome::OverQuota]);
    /// ```
    pub fn take_at(&self, now: Nanos) -> Outcome {
        self.take_n_at(now, 1)
    }

    /// `n` requests now, all or nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Outcome};
    /// let w = FixedWindow::new(5, Duration::from_secs(60)).unwrap();
    /// assert_eq!(w.take_n(5), Outcome::HitQuota);
    /// ```
    pub fn take_n(&self, n: u32) -> Outcome {
        self.take_n_at(self.clock.now(), n)
    }

    /// `n` requests at `now`, counted as `n` of the window's quota, all or nothing: the
    /// outcome is go-zero's for the last of them, and an `OverQuota` take counts none of
    /// them. A take of 0 is `Allowed` and changes nothing. A take of more than the quota is
    /// always `OverQuota`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Nanos, Outcome};
    /// let w = FixedWindow::new(5, Duration::from_secs(1)).unwrap();
    /// assert_eq!(w.take_n_at(Nanos::ZERO, 3), Outcome::Allowed);
    /// assert_eq!(w.take_n_at(Nanos::ZERO, 3), Outcome::OverQuota); // 6 > 5: nothing taken
    /// assert_eq!(w.take_n_at(Nanos::ZERO, 2), Outcome::HitQuota);
    /// ```
    pub fn take_n_at(&self, now: Nanos, n: u32) -> Outcome {
        match self.take_raw(now.as_u64(), n) {
            Ok(outcome) => outcome,
            Err(_) => Outcome::OverQuota,
        }
    }

    /// The quota, what remains of it and when it resets, now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::FixedWindow;
    /// let w = FixedWindow::new(5, Duration::from_secs(60)).unwrap();
    /// w.take();
    /// assert_eq!(w.status().remaining, 4);
    /// ```
    pub fn status(&self) -> WindowStatus {
        self.status_at(self.clock.now())
    }

    /// The quota, what remains of it at `now` and when the current window ends. With no
    /// window open at `now`, the whole quota remains and `resets_at` is the end of the
    /// window a request at `now` would open.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Nanos};
    /// let w = FixedWindow::new(5, Duration::from_secs(1)).unwrap();
    /// let idle = w.status_at(Nanos::new(7));
    /// assert_eq!((idle.remaining, idle.resets_at), (5, Nanos::new(1_000_000_007)));
    /// w.take_n_at(Nanos::new(10), 2);
    /// let s = w.status_at(Nanos::new(20));
    /// assert_eq!((s.remaining, s.resets_at), (3, Nanos::new(1_000_000_010)));
    /// ```
    pub fn status_at(&self, now: Nanos) -> WindowStatus {
        let (end, count) = unpack(self.state.load(Ordering::Relaxed));
        let now = now.as_u64();
        let (count, end) = if is_over(end, now) {
            (0, self.spec.window_end(now))
        } else {
            (count, end)
        };
        WindowStatus {
            quota: self.spec.quota,
            remaining: self.spec.quota - count as u32,
            resets_at: Nanos::new(end),
        }
    }

    /// The CAS loop: the outcome, or the end of the window a denied take must wait for
    /// (`None`: never, `n > quota`).
    #[inline]
    fn take_raw(&self, now: u64, n: u32) -> Result<Outcome, Option<u64>> {
        let quota = self.spec.quota;
        if n == 0 {
            return Ok(Outcome::Allowed);
        }
        if n > quota {
            return Err(None);
        }
        let backoff = Backoff::new();
        let mut word = self.state.load(Ordering::Relaxed);
        loop {
            let (end, count) = unpack(word);
            let (new, current) = if is_over(end, now) {
                (pack(self.spec.window_end(now), u64::from(n)), u64::from(n))
            } else {
                let current = count + u64::from(n);
                if current > u64::from(quota) {
                    return Err(Some(end));
                }
                (pack(end, current), current)
            };
            match self
                .state
                .compare_exchange_weak(word, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(Outcome::of(current, quota)),
                Err(actual) => {
                    word = actual;
                    backoff.spin();
                }
            }
        }
    }
}

impl<C: Clock, P: Layout> Limiter for FixedWindow<C, P> {
    /// Takes `n` requests if they fit in the window (`Allowed` or `HitQuota`). A denial's
    /// retry time is the end of the current window; there is none if `n > quota`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Limiter, Nanos};
    /// let w = FixedWindow::new(2, Duration::from_secs(1)).unwrap();
    /// assert!(w.check_n_at(Nanos::new(100), 2).is_ok());
    /// let denied = w.check_n_at(Nanos::new(400_000_100), 1).unwrap_err();
    /// assert_eq!(denied.retry_after(), Some(Duration::from_millis(600)));
    /// assert_eq!(w.check_n_at(Nanos::new(100), 3).unwrap_err().retry_at(), None);
    /// ```
    #[inline]
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        match self.take_raw(now.as_u64(), n) {
            Ok(_) => Ok(()),
            Err(end) => Err(Denied::new(now, end.map(Nanos::new))),
        }
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// [`FixedWindow::status_at`] as the IETF fields, exactly: `q` = the quota, `w` = the
    /// period, `r` = what remains of the quota in the window open at `now` (the whole quota
    /// if none is), `t` = until that window ends (or, with none open, until the end of the
    /// window a request at `now` would open: a period, or the next boundary when aligned).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Limiter, Nanos, QuotaStatus};
    /// let w = FixedWindow::new(5, Duration::from_secs(60)).unwrap();
    /// assert!(w.check_n_at(Nanos::ZERO, 2).is_ok());
    /// let s = w.quota_at(Nanos::new(15_000_000_000)).unwrap();
    /// assert_eq!(s, QuotaStatus {
    ///     quota: 5,
    ///     window: Duration::from_secs(60),
    ///     remaining: 3,
    ///     reset: Duration::from_secs(45),
    /// });
    /// ```
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        Some(quota_status(&self.spec, self.status_at(now), now))
    }

    /// Takes `n` back out of the count of the window the grant went into, if that can be
    /// done exactly. **`now` must be the reading the grant was made at** (the tower layer
    /// passes the check's own `now`): it is how the window is identified. One CAS loop on
    /// the state word, as a take's.
    ///
    /// The window open at `now` is the grant's if it started no later than `now`, i.e.
    /// `end - period <= now < end`: a window opened after the grant starts at or after the
    /// grant's window's end, past `now`. Then:
    ///
    /// * **aligned** ([`FixedWindowBuilder::align`]): the count drops by `n`; windows end on fixed
    ///   boundaries whoever opens them, so the count is the only trace of the grant: exact;
    /// * **unaligned**, window opened before `now`: the grant did not open it, so again only
    ///   the count holds the grant: exact;
    /// * **unaligned**, window opened at `now` and nothing else left in it (`count == n`):
    ///   the grant may have opened it; without it no window would be open, so the state
    ///   becomes a fresh limiter's (no window): exact from `now` on;
    /// * **unaligned**, window opened at `now` with other grants in it: if the grant opened
    ///   it, without it the window would have opened at the next of those grants' readings
    ///   and end later; the limiter cannot tell, so it returns **`false`** and keeps the
    ///   grant.
    ///
    /// Also `false` (nothing changes) when no window open at `now` started by `now`: the
    /// grant was a stale reading counted in a newer window, or a window has opened after
    /// it; which window holds the grant is then unknown. And `false` for a count below `n`
    /// (a refund of permits never taken). `n = 0` is `true` (a check of 0 counts nothing).
    ///
    /// A window that has rolled over since the grant cannot be met with the grant's own
    /// reading (windows end after the readings they count); a later `now` that finds no
    /// window open returns `true` only when aligned (the grant's window is over and left no
    /// trace), and `false` unaligned (without the grant, a window opened by a later request
    /// could still be open).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Limiter, Nanos};
    /// let w = FixedWindow::new(2, Duration::from_secs(1)).unwrap();
    /// assert!(w.check_n_at(Nanos::ZERO, 1).is_ok()); // opens the window
    /// let t = Nanos::new(100);
    /// assert!(w.check_n_at(t, 1).is_ok());
    /// assert!(w.refund_n_at(t, 1)); // a later grant: only the count holds it
    /// assert_eq!(w.status_at(t).remaining, 1);
    /// // Opened at `t` with another grant in it: which one opened it is unknown.
    /// assert!(w.check_n_at(Nanos::new(2_000_000_000), 2).is_ok());
    /// assert!(!w.refund_n_at(Nanos::new(2_000_000_000), 1));
    /// ```
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        if n == 0 {
            return true;
        }
        let now = now.as_u64();
        let n = u64::from(n);
        let backoff = Backoff::new();
        let mut word = self.state.load(Ordering::Relaxed);
        loop {
            let new = match refund_step(&self.spec, unpack(word), now, n) {
                Refund::Nothing(exact) => return exact,
                Refund::Count(count) => pack(unpack(word).0, count),
                Refund::Close => 0,
            };
            match self
                .state
                .compare_exchange_weak(word, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => {
                    word = actual;
                    backoff.spin();
                }
            }
        }
    }
}

/// [`Limiter::refund_n_at`] gives a grant back (see there).
impl<C: Clock, P: Layout> crate::limiter::Refund for FixedWindow<C, P> {}

/// What a refund of `n` at `now` does to the window `(end, count)` (see `refund_n_at` for
/// `FixedWindow`; the twin decides with the same function on its key).
pub(crate) enum Refund {
    /// Nothing changes; whether that is exact.
    Nothing(bool),
    /// The window's count becomes this.
    Count(u64),
    /// The window goes: the state becomes a fresh limiter's.
    Close,
}

/// The decision of `refund_n_at` for `FixedWindow` on window `(end, count)`.
pub(crate) fn refund_step(spec: &WindowSpec, (end, count): (u64, u64), now: u64, n: u64) -> Refund {
    if is_over(end, now) {
        return Refund::Nothing(spec.aligned);
    }
    let start = end.saturating_sub(spec.period);
    if start > now || count < n {
        // A stale grant or a newer window (or permits never taken): which window holds it?
        return Refund::Nothing(false);
    }
    if spec.aligned || start < now {
        Refund::Count(count - n)
    } else if count == n {
        Refund::Close
    } else {
        Refund::Nothing(false)
    }
}

/// A window limiter's status as the IETF fields: `q` quota, `w` period, `r` remaining, `t`
/// until the window ends.
pub(crate) fn quota_status(spec: &WindowSpec, s: WindowStatus, now: Nanos) -> QuotaStatus {
    QuotaStatus {
        quota: u64::from(s.quota),
        window: Duration::from_nanos(spec.period),
        remaining: u64::from(s.remaining),
        reset: s.resets_after(now),
    }
}

impl<C: Clock, P: Layout> Idle for FixedWindow<C, P> {
    /// Idle once no window is open at `now`: a fresh limiter is then identical.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Idle, Nanos};
    /// let w = FixedWindow::new(2, Duration::from_secs(1)).unwrap();
    /// w.take_at(Nanos::ZERO);
    /// assert!(!w.is_idle_at(Nanos::new(999_999_999)));
    /// assert!(w.is_idle_at(Nanos::new(1_000_000_000)));
    /// ```
    fn is_idle_at(&self, now: Nanos) -> bool {
        let (end, _) = unpack(self.state.load(Ordering::Relaxed));
        is_over(end, now.as_u64())
    }

    /// A spent window that ends at `b`: `(end, count) = (b, quota)`. A reading `t < b` is
    /// `OverQuota`, with retry at `b`; at `b` or later the window is over and the first take
    /// opens a new one, exactly as on a fresh limiter. A limiter idle at `j <= b` has every
    /// window ended by `j`, so the windows of the key never overlap across the swap and each
    /// still holds at most `quota` grants. (A stale reading counted in the current window,
    /// as this limiter does for readings older than its window, would be counted in a
    /// window that may overlap the replaced limiter's last one: hence the refusal.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Idle, Limiter, Nanos};
    /// let mut w = FixedWindow::new(2, Duration::from_secs(1)).unwrap();
    /// w.born_at(Nanos::new(5_000_000_000));
    /// let stale = w.check_n_at(Nanos::new(4_900_000_000), 1).unwrap_err();
    /// assert_eq!(stale.retry_at(), Some(Nanos::new(5_000_000_000)));
    /// assert!(w.check_n_at(Nanos::new(5_000_000_000), 2).is_ok());
    /// ```
    fn born_at(&mut self, b: Nanos) {
        // `u64::MAX` would be a window that never ends.
        let new = pack(b.as_u64().min(u64::MAX - 1), u64::from(self.spec.quota));
        let mut word = self.state.load(Ordering::Relaxed);
        while let Err(actual) =
            self.state
                .compare_exchange_weak(word, new, Ordering::Relaxed, Ordering::Relaxed)
        {
            word = actual;
        }
    }
}

impl<C: Clock, P: Layout> fmt::Debug for FixedWindow<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // At the clock's reading, in the terms of a response header ([`WindowStatus`]).
        let status = self.status_at(self.clock.now());
        f.debug_struct("FixedWindow")
            .field("quota", &self.spec.quota)
            .field("period", &self.period())
            .field("utc_offset_secs", &self.utc_offset_secs())
            .field("remaining", &status.remaining)
            .field("resets_at", &status.resets_at)
            .finish()
    }
}

/// Options for a [`FixedWindow`]. With the `reference` feature, the mutex twin is built from
/// the same options, validated the same way (`reference::FixedWindow::try_from(builder)`).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ConfigError, FixedWindow};
///
/// let err = FixedWindow::builder(5, Duration::from_secs(60)).align(86_400).build();
/// assert_eq!(err.unwrap_err(), ConfigError::InvalidUtcOffset(86_400));
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct FixedWindowBuilder<C: Clock = QuantaClock> {
    quota: u32,
    period: Duration,
    align: Option<i64>,
    unix_origin: Option<Duration>,
    clock: C,
}

impl FixedWindowBuilder<QuantaClock> {
    /// The defaults, on the quanta clock: what `FixedWindow::builder` starts from.
    pub(crate) fn new(quota: u32, period: Duration) -> FixedWindowBuilder {
        FixedWindowBuilder {
            quota,
            period,
            align: None,
            unix_origin: None,
            clock: QuantaClock::new(),
        }
    }
}

impl<C: Clock> FixedWindowBuilder<C> {
    /// Ends windows on period boundaries of UTC shifted by `utc_offset_secs` (go-zero's
    /// `Align()`, with the offset explicit instead of the process's time zone; deviation D14).
    /// A window opened at time `t` ends at the next `b > t` with `(b + offset) % period == 0`
    /// in Unix time. The offset must be less than a day either way.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, ManualClock, Nanos};
    ///
    /// // Daily windows in UTC+8; the clock's origin is 2024-01-01 20:00 in UTC+8.
    /// let w = FixedWindow::builder(10, Duration::from_secs(86_400))
    ///     .align(8 * 3600)
    ///     .unix_origin(Duration::from_secs(1_704_110_400))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// w.take_at(Nanos::ZERO);
    /// // The window ends at local midnight: 4 hours later.
    /// assert_eq!(w.status_at(Nanos::ZERO).resets_after(Nanos::ZERO), Duration::from_secs(14_400));
    /// ```
    pub fn align(mut self, utc_offset_secs: i64) -> Self {
        self.align = Some(utc_offset_secs);
        self
    }

    /// Aligned windows in UTC: `align(0)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::FixedWindow;
    /// let w = FixedWindow::builder(1, Duration::from_secs(60)).align_utc().build().unwrap();
    /// assert_eq!(w.utc_offset_secs(), Some(0));
    /// ```
    pub fn align_utc(self) -> Self {
        self.align(0)
    }

    /// The Unix time at which the limiter's clock reads [`Nanos::ZERO`]; only aligned
    /// windows use it. By default it is taken from the system clock when the limiter is
    /// built (`SystemTime::now()` minus the clock's reading); set it with a
    /// [`ManualClock`](crate::ManualClock) for reproducible windows.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, ManualClock, Nanos};
    /// let w = FixedWindow::builder(1, Duration::from_secs(60))
    ///     .align_utc()
    ///     .unix_origin(Duration::from_secs(90)) // 1.5 minutes past a boundary
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(w.status_at(Nanos::ZERO).resets_at, Nanos::new(30_000_000_000));
    /// ```
    pub fn unix_origin(mut self, unix_time_at_zero: Duration) -> Self {
        self.unix_origin = Some(unix_time_at_zero);
        self
    }

    /// Reads time from `clock`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, FixedWindow, ManualClock, Nanos};
    /// let w = FixedWindow::builder(1, Duration::from_secs(1))
    ///     .clock(ManualClock::new(Nanos::new(3)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(w.clock().now(), Nanos::new(3));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> FixedWindowBuilder<D> {
        FixedWindowBuilder {
            quota: self.quota,
            period: self.period,
            align: self.align,
            unix_origin: self.unix_origin,
            clock,
        }
    }

    /// The validated configuration and the clock, for the limiter and its twin (deviation D14).
    pub(crate) fn into_spec(self) -> Result<(WindowSpec, C), ConfigError> {
        let spec = WindowSpec::new(
            self.quota,
            self.period,
            self.align,
            self.unix_origin,
            self.clock.now(),
        )?;
        Ok((spec, self.clock))
    }
}

impl WindowSpec {
    /// The validated configuration of `quota` per `period`, aligned at `align` (a UTC offset
    /// in seconds) if given, on a clock that reads `now` at Unix time `unix_origin + now`
    /// (default: the system clock's now): [`ConfigError::ZeroQuota`],
    /// [`ConfigError::ZeroPeriod`] or [`ConfigError::InvalidUtcOffset`] (deviation D14).
    pub(crate) fn new(
        quota: u32,
        period: Duration,
        align: Option<i64>,
        unix_origin: Option<Duration>,
        now: Nanos,
    ) -> Result<WindowSpec, ConfigError> {
        if quota == 0 {
            return Err(ConfigError::ZeroQuota);
        }
        if period.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        let period_ns = Nanos::from_duration(period).as_u64();
        let shift = match align {
            None => None,
            Some(offset) if offset.unsigned_abs() >= 86_400 => {
                return Err(ConfigError::InvalidUtcOffset(offset))
            }
            Some(offset) => {
                let origin = match unix_origin {
                    Some(origin) => origin.as_nanos(),
                    None => SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_nanos()
                        .saturating_sub(u128::from(now.as_u64())),
                };
                // Durations are below 2^64 s < 2^94 ns: i128 holds it with room to spare.
                let shift = origin as i128 + i128::from(offset) * 1_000_000_000;
                Some(shift.rem_euclid(i128::from(period_ns)) as u64)
            }
        };
        Ok(WindowSpec {
            quota,
            period: period_ns,
            shift: shift.unwrap_or(0),
            aligned: shift.is_some(),
            // |offset| < 86 400 here.
            utc_offset_secs: align.unwrap_or(0) as i32,
        })
    }
}

impl<C: Clock> FixedWindowBuilder<C> {
    /// The limiter, or the first setting that cannot be used: [`ConfigError::ZeroQuota`],
    /// [`ConfigError::ZeroPeriod`] or [`ConfigError::InvalidUtcOffset`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, FixedWindow};
    /// assert_eq!(
    ///     FixedWindow::builder(1, Duration::ZERO).build().unwrap_err(),
    ///     ConfigError::ZeroPeriod
    /// );
    /// ```
    pub fn build(self) -> Result<FixedWindow<C>, ConfigError> {
        let (spec, clock) = self.into_spec()?;
        Ok(FixedWindow::from_spec(spec, clock))
    }

    /// The limiter in the [`Compact`] layout: its state word unpadded, next to its
    /// configuration, for the many per-key limiters of a [`Keyed`](crate::Keyed) map (a
    /// fraction of the bytes per key, and one cache line per check).
    ///
    /// ```
    /// # #[cfg(feature = "keyed")] {
    /// use std::time::Duration;
    /// use turnstile::{FixedWindow, Keyed};
    /// let per_ip = Keyed::new(|_: &u32| {
    ///     FixedWindow::builder(100, Duration::from_secs(60)).build_compact().unwrap()
    /// });
    /// assert!(per_ip.check(&1).is_ok());
    /// # }
    /// ```
    pub fn build_compact(self) -> Result<FixedWindow<C, Compact>, ConfigError> {
        let (spec, clock) = self.into_spec()?;
        Ok(FixedWindow::from_spec(spec, clock))
    }
}

/// [`FixedWindowBuilder::build`] as a conversion, the form the mutex twin is built by too
/// (`reference::FixedWindow`, feature `reference`): code generic over the two builds either.
impl<C: Clock> TryFrom<FixedWindowBuilder<C>> for FixedWindow<C> {
    type Error = ConfigError;

    fn try_from(options: FixedWindowBuilder<C>) -> Result<FixedWindow<C>, ConfigError> {
        options.build()
    }
}

/// Whether the window ending at `end` is over at `now`. A window whose end saturated at
/// [`Nanos::MAX`] (a period reaching past the end of representable time) never ends.
#[inline]
pub(crate) fn is_over(end: u64, now: u64) -> bool {
    now >= end && end != u64::MAX
}

fn pack(end: u64, count: u64) -> u128 {
    (u128::from(end) << 64) | u128::from(count)
}

fn unpack(word: u128) -> (u64, u64) {
    ((word >> 64) as u64, word as u64)
}
