//! The mutex twin of [`crate::SlidingWindow`]: the textbook sliding-window counter, used as
//! the tests' oracle and the benchmarks' baseline.
//!
//! There is no upstream code to port; this is the algorithm as Cloudflare's blog post "How we
//! built rate limiting capable of scaling to millions of domains" describes it: keep the count
//! of the current window and of the previous one, and estimate the rate over the last period as
//! `previous * (time left of the previous window in the sliding one) / period + current`. Here
//! that estimate plus the request must stay within the quota, evaluated exactly in integers
//! (multiplied through by the period, on `i128`) so that the twin and the lock-free limiter
//! agree to the request.
//!
//! Written plainly under one [`std::sync::Mutex`]: roll the windows forward, test, then count.
//! It takes the lock-free limiter's two decisions that the textbook leaves open, because the
//! differential test compares them: a time before the stored window is judged at the window's
//! start (an earlier time never frees capacity), and a denial changes nothing (not even the
//! roll).

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::fixed_window::WindowStatus;
use crate::limiter::{Denied, Idle, Limiter, QuotaStatus};
use crate::sliding_window::SlidingWindowBuilder;

/// The two counters and the window they belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counters {
    /// Index of the current window (`time / period`).
    window: i128,
    /// Requests counted in the previous window.
    previous: i128,
    /// Requests counted in the current window.
    current: i128,
}

/// The mutex-based sliding-window counter: the **textbook version** of the algorithm, used as
/// the **test oracle** and the **benchmark baseline** for the lock-free
/// [`crate::SlidingWindow`], with the same API.
///
/// ```
/// use std::time::Duration;
/// use turnstile::reference::SlidingWindow;
/// use turnstile::{ManualClock, Nanos};
///
/// let sw = SlidingWindow::try_from(turnstile::SlidingWindow::builder(5, Duration::from_secs(1)).clock(ManualClock::default())).unwrap();
/// assert!(sw.allow_n_at(Nanos::new(0), 5));
/// assert!(!sw.allow_at(Nanos::new(0)));
/// assert!(sw.allow_n_at(Nanos::new(1_500_000_000), 2)); // 5 * 0.5 + 2 = 4.5
/// assert!(!sw.allow_at(Nanos::new(1_500_000_000)));
/// ```
pub struct SlidingWindow<C: Clock = QuantaClock> {
    counters: Mutex<Counters>,
    quota: u32,
    period: Duration,
    clock: C,
}

impl SlidingWindow<QuantaClock> {
    /// `quota` per `period` on the quanta clock; quota 0 and period 0 are errors.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// assert_eq!(SlidingWindow::new(3, Duration::from_secs(1)).unwrap().quota(), 3);
    /// ```
    pub fn new(quota: u32, period: Duration) -> Result<SlidingWindow, ConfigError> {
        SlidingWindow::try_from(crate::SlidingWindow::builder(quota, period))
    }
}

impl<C: Clock> SlidingWindow<C> {
    fn from_builder(b: SlidingWindowBuilder<C>) -> Result<SlidingWindow<C>, ConfigError> {
        b.validate()?;
        Ok(SlidingWindow {
            counters: Mutex::new(Counters {
                window: 0,
                previous: 0,
                current: 0,
            }),
            quota: b.quota,
            period: b.period,
            clock: b.clock,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The period in nanoseconds. Beyond `2^64` ns no `Nanos` leaves window 0, so a longer
    /// period is the same as `2^64` ns (the lock-free limiter says the same).
    fn period_ns(&self) -> i128 {
        i128::try_from(self.period.as_nanos())
            .unwrap_or(i128::MAX)
            .min(1 << 64)
    }

    /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// use turnstile::{Clock, ManualClock, Nanos};
    /// let sw = SlidingWindow::try_from(turnstile::SlidingWindow::builder(1, Duration::from_secs(1)).clock(ManualClock::new(Nanos::new(4)))).unwrap();
    /// assert_eq!(sw.clock().now(), Nanos::new(4));
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The quota per window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// assert_eq!(SlidingWindow::new(9, Duration::from_secs(1)).unwrap().quota(), 9);
    /// ```
    pub fn quota(&self) -> u32 {
        self.quota
    }

    /// The window length.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// let sw = SlidingWindow::new(9, Duration::from_millis(5)).unwrap();
    /// assert_eq!(sw.period(), Duration::from_millis(5));
    /// ```
    pub fn period(&self) -> Duration {
        self.period
    }

    /// One request now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// let sw = SlidingWindow::new(1, Duration::from_secs(3600)).unwrap();
    /// assert!(sw.allow() && !sw.allow());
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow(&self) -> bool {
        self.allow_n_at(self.clock.now(), 1)
    }

    /// One request at `now`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// use turnstile::Nanos;
    /// let sw = SlidingWindow::new(1, Duration::from_secs(1)).unwrap();
    /// assert!(sw.allow_at(Nanos::new(0)));
    /// assert!(!sw.allow_at(Nanos::new(1_000_000_000)));
    /// assert!(sw.allow_at(Nanos::new(2_000_000_000)));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_at(&self, now: Nanos) -> bool {
        self.allow_n_at(now, 1)
    }

    /// `n` requests now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// let sw = SlidingWindow::new(4, Duration::from_secs(3600)).unwrap();
    /// assert!(sw.allow_n(4) && !sw.allow_n(1));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n(&self, n: u32) -> bool {
        self.allow_n_at(self.clock.now(), n)
    }

    /// `n` requests at `now`, all or nothing, under the lock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// use turnstile::Nanos;
    /// let sw = SlidingWindow::new(4, Duration::from_secs(1)).unwrap();
    /// assert!(sw.allow_n_at(Nanos::new(0), 4));
    /// assert!(sw.allow_n_at(Nanos::new(1_250_000_000), 1)); // 4 * 0.75 + 1 = 4
    /// assert!(!sw.allow_n_at(Nanos::new(1_250_000_000), 1));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n_at(&self, now: Nanos, n: u32) -> bool {
        self.check(now, n).is_ok()
    }

    /// The quota as a client should see it now.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// let sw = SlidingWindow::new(4, Duration::from_secs(3600)).unwrap();
    /// assert!(sw.allow());
    /// assert_eq!(sw.status().remaining, 3);
    /// ```
    pub fn status(&self) -> WindowStatus {
        self.status_at(self.clock.now())
    }

    /// The quota at `now`: how many requests would be granted, and when the estimate falls to
    /// 0 if nothing more is taken.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// use turnstile::{Nanos, WindowStatus};
    /// let sw = SlidingWindow::new(4, Duration::from_secs(1)).unwrap();
    /// assert!(sw.allow_n_at(Nanos::new(0), 4));
    /// assert_eq!(
    ///     sw.status_at(Nanos::new(1_500_000_000)),
    ///     WindowStatus { quota: 4, remaining: 2, resets_at: Nanos::new(2_000_000_000) }
    /// );
    /// ```
    pub fn status_at(&self, now: Nanos) -> WindowStatus {
        let stored = *self.lock();
        let (c, elapsed) = self.rolled(stored, now);
        let period = self.period_ns();
        let quota = i128::from(self.quota);
        let estimate = c.previous * (period - elapsed) + c.current * period;
        let remaining = ((quota * period - estimate) / period).max(0);
        let resets_at = if estimate == 0 {
            now
        } else if c.current == 0 {
            // Only the previous window weighs: gone when the current one ends.
            clamp((c.window + 1) * period)
        } else {
            // The current window weighs until the end of the next one.
            clamp((c.window + 2) * period)
        };
        WindowStatus {
            quota: self.quota,
            remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            resets_at,
        }
    }

    /// The counters as they stand at `now`, and how far into their window `now` is.
    fn rolled(&self, stored: Counters, now: Nanos) -> (Counters, i128) {
        let period = self.period_ns();
        let t = i128::from(now.as_u64());
        let window = t / period;
        if window < stored.window {
            // A time before the stored window counts as the start of that window.
            return (stored, 0);
        }
        let elapsed = t % period;
        let c = if window == stored.window {
            stored
        } else if window == stored.window + 1 {
            Counters {
                window,
                previous: stored.current,
                current: 0,
            }
        } else {
            Counters {
                window,
                previous: 0,
                current: 0,
            }
        };
        (c, elapsed)
    }

    /// Roll, test, count; on denial the earliest time the same request would pass.
    fn check(&self, now: Nanos, n: u32) -> Result<(), Option<Nanos>> {
        if n == 0 {
            return Ok(());
        }
        let mut stored = self.lock();
        let (mut c, elapsed) = self.rolled(*stored, now);
        let period = self.period_ns();
        let quota = i128::from(self.quota);
        let n = i128::from(n);
        if c.previous * (period - elapsed) + (c.current + n) * period <= quota * period {
            c.current += n;
            *stored = c;
            return Ok(());
        }
        Err(self.retry_at(c, n))
    }

    /// The first time the request fits: later in this window, while the previous window's
    /// share shrinks; else in the next one, with this window as the previous; else at the start
    /// of the window after that, when both are empty.
    fn retry_at(&self, c: Counters, n: i128) -> Option<Nanos> {
        let period = self.period_ns();
        let quota = i128::from(self.quota);
        if n > quota {
            return None;
        }
        // The first offset into a window with counts (previous, current) at which
        // previous * (period - e) + (current + n) * period <= quota * period, i.e.
        // previous * e >= previous * period - (quota - current - n) * period.
        let first = |previous: i128, current: i128| -> Option<i128> {
            let left = (quota - current - n) * period;
            if left < 0 {
                return None;
            }
            if previous == 0 {
                return Some(0);
            }
            let need = previous * period - left;
            if need <= 0 {
                return Some(0);
            }
            let e = (need + previous - 1) / previous; // ceil(need / previous)
            (e < period).then_some(e)
        };
        let start = c.window * period;
        let t = match first(c.previous, c.current) {
            Some(e) => start + e,
            None => match first(c.current, 0) {
                Some(e) => start + period + e,
                None => start + 2 * period,
            },
        };
        (t <= i128::from(u64::MAX)).then(|| Nanos::new(t as u64))
    }
}

/// An `i128` time saturated into [`Nanos`].
fn clamp(t: i128) -> Nanos {
    Nanos::new(t.clamp(0, i128::from(u64::MAX)) as u64)
}

impl<C: Clock> Limiter for SlidingWindow<C> {
    /// [`SlidingWindow::allow_n_at`] with the retry time on denial.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// use turnstile::{Limiter, Nanos};
    /// let sw = SlidingWindow::new(5, Duration::from_secs(1)).unwrap();
    /// assert!(sw.check_n_at(Nanos::new(0), 5).is_ok());
    /// let denied = sw.check_n_at(Nanos::new(0), 1).unwrap_err();
    /// assert_eq!(denied.retry_at(), Some(Nanos::new(1_200_000_000)));
    /// ```
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.check(now, n)
            .map_err(|retry_at| Denied::new(now, retry_at))
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// [`SlidingWindow::status_at`] as the IETF fields, as the lock-free limiter's.
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        let s = self.status_at(now);
        Some(QuotaStatus {
            quota: u64::from(s.quota),
            window: self.period,
            remaining: u64::from(s.remaining),
            reset: s.resets_after(now),
        })
    }

    /// The lock-free limiter's refund, on the counters: `current -= n` when the stored
    /// window is the one `now` (the grant's reading) falls in; `true` with nothing to do
    /// when it is two or more windows back; otherwise (or `current < n`) `false`.
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        if n == 0 {
            return true;
        }
        let mut stored = self.lock();
        let period = self.period_ns();
        let window = i128::from(now.as_u64()) / period;
        let n = i128::from(n);
        if stored.window == window {
            if stored.current < n {
                return false;
            }
            stored.current -= n;
            true
        } else {
            stored.window + 2 <= window
        }
    }
}

impl<C: Clock> Idle for SlidingWindow<C> {
    /// True when the estimate at `now` is 0.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::SlidingWindow;
    /// use turnstile::{Idle, Nanos};
    /// let sw = SlidingWindow::new(5, Duration::from_secs(1)).unwrap();
    /// assert!(sw.allow_at(Nanos::new(0)));
    /// assert!(!sw.is_idle_at(Nanos::new(1_000_000_000)));
    /// assert!(sw.is_idle_at(Nanos::new(2_000_000_000)));
    /// ```
    fn is_idle_at(&self, now: Nanos) -> bool {
        let stored = *self.lock();
        let (c, _) = self.rolled(stored, now);
        c.previous == 0 && c.current == 0
    }

    /// Rolled to `b`'s window, as the lock-free limiter's.
    fn born_at(&mut self, b: Nanos) {
        let stored = *self.lock();
        let (c, _) = self.rolled(stored, b);
        *self.lock() = c;
    }
}

impl<C: Clock> fmt::Debug for SlidingWindow<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As the lock-free limiter's Debug, at the clock's reading.
        let now = self.clock.now();
        let stored = *self.lock();
        let (c, _) = self.rolled(stored, now);
        let status = self.status_at(now);
        f.debug_struct("reference::SlidingWindow")
            .field("quota", &self.quota)
            .field("period", &self.period)
            .field("previous", &c.previous)
            .field("current", &c.current)
            .field("remaining", &status.remaining)
            .field("resets_at", &status.resets_at)
            .finish()
    }
}

/// The twin from the lock-free limiter's options, with its validation: quota 0 is
/// [`ConfigError::ZeroQuota`], period 0 [`ConfigError::ZeroPeriod`].
///
/// ```
/// use std::time::Duration;
/// use turnstile::{reference, ConfigError, ManualClock, SlidingWindow};
/// let options = SlidingWindow::builder(7, Duration::from_secs(1)).clock(ManualClock::default());
/// assert_eq!(reference::SlidingWindow::try_from(options).unwrap().quota(), 7);
/// let zero = reference::SlidingWindow::try_from(SlidingWindow::builder(0, Duration::from_secs(1)));
/// assert_eq!(zero.unwrap_err(), ConfigError::ZeroQuota);
/// ```
impl<C: Clock> TryFrom<SlidingWindowBuilder<C>> for SlidingWindow<C> {
    type Error = ConfigError;

    fn try_from(options: SlidingWindowBuilder<C>) -> Result<SlidingWindow<C>, ConfigError> {
        SlidingWindow::from_builder(options)
    }
}
