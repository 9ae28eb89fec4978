//! The mutex twin of [`crate::FixedWindow`]: go-zero's `PeriodLimit` Lua script, line for
//! line, on an in-memory "Redis key" under one [`std::sync::Mutex`]. The tests' oracle and the
//! benchmarks' baseline.
//!
//! ```text
//! local current = redis.call("INCRBY", KEYS[1], 1)      -- every call, over quota too
//! if current == 1 then redis.call("expire", KEYS[1], window) end
//! if current < limit then return 1 elseif current == limit then return 2 else return 0 end
//! ```
//!
//! The key is `Some((counter, expires_at))` and disappears (becomes `None`) once the clock
//! reaches `expires_at`, as a Redis key does at its TTL. `window` is the period, or with
//! alignment go-zero's `calcExpireSeconds`: `period - ((unix + offset) % period)`, here in
//! nanoseconds.
//!
//! Taken from turnstile because the API forces them: D14 (quota and period must be positive,
//! explicit UTC offset), and [`FixedWindow::take_n_at`] for `n != 1` (all or nothing; go-zero
//! has no such call).

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::fixed_window::{
    is_over, quota_status, refund_step, FixedWindowBuilder, Outcome, Refund, WindowSpec,
    WindowStatus,
};
use crate::limiter::{Denied, Limiter, QuotaStatus};

/// The in-memory key: go-zero's counter and its expiry time.
#[derive(Debug, Clone, Copy)]
struct Key {
    counter: u64,
    expires_at: u64,
}

/// go-zero's `PeriodLimit` for one key, under a mutex. Same API as [`crate::FixedWindow`].
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Nanos, Outcome};
/// use turnstile::reference::FixedWindow;
///
/// let w = FixedWindow::new(5, Duration::from_secs(100)).unwrap();
/// let replies: Vec<_> = (0..7).map(|_| w.take_at(Nanos::ZERO)).collect();
/// assert_eq!(replies[3], Outcome::Allowed);
/// assert_eq!(replies[4], Outcome::HitQuota);
/// assert_eq!(replies[5], Outcome::OverQuota);
/// ```
pub struct FixedWindow<C: Clock = QuantaClock> {
    key: Mutex<Option<Key>>,
    spec: WindowSpec,
    clock: C,
}

impl FixedWindow<QuantaClock> {
    /// The twin of [`crate::FixedWindow::new`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::FixedWindow;
    /// assert!(FixedWindow::new(1, Duration::from_secs(1)).is_ok());
    /// ```
    pub fn new(quota: u32, period: Duration) -> Result<FixedWindow, ConfigError> {
        FixedWindow::try_from(crate::FixedWindow::builder(quota, period))
    }
}

/// The twin from the lock-free limiter's options, with the same validation.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{reference, FixedWindow};
/// let options = FixedWindow::builder(3, Duration::from_secs(1)).align_utc();
/// assert_eq!(reference::FixedWindow::try_from(options).unwrap().quota(), 3);
/// ```
impl<C: Clock> TryFrom<FixedWindowBuilder<C>> for FixedWindow<C> {
    type Error = ConfigError;

    fn try_from(options: FixedWindowBuilder<C>) -> Result<FixedWindow<C>, ConfigError> {
        let (spec, clock) = options.into_spec()?;
        Ok(FixedWindow::from_spec(spec, clock))
    }
}

impl<C: Clock> FixedWindow<C> {
    pub(crate) fn from_spec(spec: WindowSpec, clock: C) -> FixedWindow<C> {
        FixedWindow {
            key: Mutex::new(None),
            spec,
            clock,
        }
    }

    /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Requests permitted per window.
    pub fn quota(&self) -> u32 {
        self.spec.quota
    }

    /// The window length.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.spec.period)
    }

    /// One request now.
    pub fn take(&self) -> Outcome {
        self.take_at(self.clock.now())
    }

    /// One request at `now`: the script, literally.
    pub fn take_at(&self, now: Nanos) -> Outcome {
        let now = now.as_u64();
        let mut key = self.live_key(now);
        // INCRBY key 1
        let current = key.map_or(0, |k| k.counter).saturating_add(1);
        let expires_at = match *key {
            // if current == 1 then EXPIRE key window
            None => self.expire_seconds(now),
            Some(k) => k.expires_at,
        };
        *key = Some(Key {
            counter: current,
            expires_at,
        });
        Outcome::of(current, self.spec.quota)
    }

    /// `n` requests now.
    pub fn take_n(&self, n: u32) -> Outcome {
        self.take_n_at(self.clock.now(), n)
    }

    /// `n` requests at `now`: one is [`FixedWindow::take_at`]; otherwise all or nothing (read
    /// the counter, `INCRBY n` only if it stays within the quota), 0 is `Allowed`.
    pub fn take_n_at(&self, now: Nanos, n: u32) -> Outcome {
        if n == 1 {
            return self.take_at(now);
        }
        if n == 0 {
            return Outcome::Allowed;
        }
        let now = now.as_u64();
        let mut key = self.live_key(now);
        let current = key.map_or(0, |k| k.counter) + u64::from(n);
        if current > u64::from(self.spec.quota) {
            return Outcome::OverQuota;
        }
        let expires_at = key.map_or_else(|| self.expire_seconds(now), |k| k.expires_at);
        *key = Some(Key {
            counter: current,
            expires_at,
        });
        Outcome::of(current, self.spec.quota)
    }

    /// The quota, what remains now and when it resets.
    pub fn status(&self) -> WindowStatus {
        self.status_at(self.clock.now())
    }

    /// The quota, what remains at `now` (`quota - min(counter, quota)`) and when the key
    /// expires (or would, if created at `now`).
    ///
    /// A read: a key whose TTL has passed at `now` is seen as absent but not deleted (Redis
    /// deletes it lazily, on the next command that touches it). Deleting it here would make
    /// the twin forget, on a mere read at a later `now`, a window that a refund at the
    /// grant's own (earlier) reading still needs, which the lock-free limiter, whose reads
    /// write nothing, keeps.
    pub fn status_at(&self, now: Nanos) -> WindowStatus {
        let now = now.as_u64();
        let key = self
            .key
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .filter(|k| !is_over(k.expires_at, now));
        let (counter, expires_at) =
            key.map_or((0, self.expire_seconds(now)), |k| (k.counter, k.expires_at));
        WindowStatus {
            quota: self.spec.quota,
            remaining: (u64::from(self.spec.quota) - counter.min(u64::from(self.spec.quota)))
                as u32,
            resets_at: Nanos::new(expires_at),
        }
    }

    /// The key, after Redis has expired it if its TTL has passed at `now`.
    fn live_key(&self, now: u64) -> MutexGuard<'_, Option<Key>> {
        let mut key = self.key.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*key, Some(k) if is_over(k.expires_at, now)) {
            *key = None;
        }
        key
    }

    /// The key's expiry time for a counter created at `now`: `now + period`, or aligned
    /// `now + (period - ((unix + offset) % period))` (go-zero's `calcExpireSeconds`).
    fn expire_seconds(&self, now: u64) -> u64 {
        if !self.spec.aligned {
            return now.saturating_add(self.spec.period);
        }
        // `shift` is (unix time of the clock's origin + offset) mod period, so `unix` is the
        // shifted Unix time mod period plus a multiple of it: the same remainder.
        let unix = i128::from(now) + i128::from(self.spec.shift);
        let period = i128::from(self.spec.period);
        let expire = period - unix.rem_euclid(period);
        now.saturating_add(expire as u64)
    }
}

impl<C: Clock> Limiter for FixedWindow<C> {
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        if n > self.spec.quota {
            return Err(Denied::new(now, None));
        }
        if self.take_n_at(now, n).is_permitted() {
            return Ok(());
        }
        let expires_at = self.live_key(now.as_u64()).map(|k| k.expires_at);
        Err(Denied::new(now, expires_at.map(Nanos::new)))
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// [`FixedWindow::status_at`] as the IETF fields, as the lock-free limiter's.
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        Some(quota_status(&self.spec, self.status_at(now), now))
    }

    /// The lock-free limiter's refund on the key: `DECRBY n` when the key is the grant's
    /// (created no later than `now`, the grant's reading), `DEL` when the grant may have
    /// created it and nothing else is left in it, nothing (false) when that cannot be told.
    /// go-zero has no refund. Its counter also counts refused calls (`INCRBY` on every
    /// call), which turnstile's does not; a refund is turnstile's extension, so the twin first
    /// drops that excess (`min(counter, quota)`: the refused calls took nothing, as
    /// [`FixedWindow::take_n_at`] for `n != 1` already has it) and then takes `n` off.
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        if n == 0 {
            return true;
        }
        let now = now.as_u64();
        let mut key = self.live_key(now);
        let (counter, expires_at) = match *key {
            // No live key: the window is over (`is_over(0, now)` always holds).
            None => (0, 0),
            Some(k) => (k.counter.min(u64::from(self.spec.quota)), k.expires_at),
        };
        match refund_step(&self.spec, (expires_at, counter), now, u64::from(n)) {
            Refund::Nothing(exact) => exact,
            Refund::Count(c) => {
                *key = Some(Key {
                    counter: c,
                    expires_at,
                });
                true
            }
            Refund::Close => {
                *key = None;
                true
            }
        }
    }
}

impl<C: Clock> fmt::Debug for FixedWindow<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As the lock-free limiter's Debug, at the clock's reading.
        let status = self.status_at(self.clock.now());
        f.debug_struct("reference::FixedWindow")
            .field("quota", &self.spec.quota)
            .field("period", &self.period())
            .field(
                "utc_offset_secs",
                &self
                    .spec
                    .aligned
                    .then_some(i64::from(self.spec.utc_offset_secs)),
            )
            .field("remaining", &status.remaining)
            .field("resets_at", &status.resets_at)
            .finish()
    }
}
