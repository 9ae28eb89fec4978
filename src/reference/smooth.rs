//! The mutex twins of [`crate::SmoothBursty`] and [`crate::SmoothWarmingUp`]: a literal port of
//! Guava's `RateLimiter` / `SmoothRateLimiter` (31.1, same as master), used as the tests'
//! oracle and the benchmarks' baseline.
//!
//! The state is Guava's, field for field, under one [`std::sync::Mutex`], **in microseconds**
//! as upstream:
//!
//! | Guava | here |
//! |---|---|
//! | `double storedPermits` | `stored_permits: f64` |
//! | `double maxPermits` | `max_permits: f64` |
//! | `double stableIntervalMicros` | `stable_interval_micros: f64` |
//! | `long nextFreeTicketMicros` | `next_free_ticket_micros: i64` |
//! | `SmoothBursty.maxBurstSeconds` | `Flavor::Bursty { max_burst_seconds }` |
//! | `SmoothWarmingUp.{warmupPeriodMicros, slope, thresholdPermits, coldFactor}` | `Flavor::WarmingUp` |
//!
//! The stopwatch reads `now.as_u64() / 1000` (the test `FakeStopwatch`'s
//! `NANOSECONDS.toMicros`). Java's arithmetic is kept: `(long)` casts (`as i64`: truncating,
//! saturating, NaN to 0), `Math.min` (which, unlike `f64::min`, returns NaN if either side is
//! NaN), `LongMath.saturatedAdd`, Java's wrapping `long` `+` and `-` elsewhere (the sum in
//! `reserveEarliestAvailable` wraps for ~2^31 permits at a rate below ~1/4000 per second, after
//! which `nextFreeTicketMicros` can go negative: an upstream bug kept here), and upstream's NaN
//! for a warm-up under one microsecond (guava#6475) or after `setRate(+inf)` with nothing
//! stored.
//!
//! Only the API deviations are taken, so that the twin has the lock-free limiters' API: D10
//! (`initial_stored_permits`), D11 (typed errors, including the rejection of a zero warm-up
//! from D9) and the `_at` forms, which take the time as [`Nanos`].

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::limit::PerSec;
use crate::limiter::{Denied, Limiter};
use crate::smooth::SmoothParams;
use crate::smooth::{SmoothBurstyBuilder, SmoothWarmingUpBuilder};
use crate::{ConfigError, WaitError};

/// Java's `Math.min(double, double)`: NaN if either argument is NaN.
fn java_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// `TimeUnit.toMicros` of a `Duration`, saturating at `Long.MAX_VALUE`.
fn to_micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The stopwatch: `NANOSECONDS.toMicros(now)`.
fn read_micros(now: Nanos) -> i64 {
    (now.as_u64() / 1000) as i64
}

/// Guava's `checkArgument(permitsPerSecond > 0.0 && !Double.isNaN(permitsPerSecond))`, plus
/// the crate-wide rejection of subnormal rates (deviation D4 of the lock-free limiters), so
/// the twin accepts exactly the configurations they do.
fn check_rate(rate: f64) -> Result<f64, ConfigError> {
    if rate <= 0.0 || rate.is_nan() {
        Err(ConfigError::RateNotPositive(rate))
    } else if rate.is_finite() && !rate.is_normal() {
        Err(ConfigError::SubnormalLimit(rate))
    } else {
        Ok(rate)
    }
}

/// Guava's `checkPermits`.
fn check_permits(n: u32) -> Result<(), WaitError> {
    if n > 0 {
        Ok(())
    } else {
        Err(WaitError::ZeroPermits)
    }
}

#[derive(Debug, Clone, Copy)]
enum Flavor {
    Bursty {
        max_burst_seconds: f64,
    },
    WarmingUp {
        warmup_period_micros: i64,
        slope: f64,
        threshold_permits: f64,
        cold_factor: f64,
    },
}

/// `SmoothRateLimiter`'s fields.
#[derive(Debug, Clone, Copy)]
struct Inner {
    stored_permits: f64,
    max_permits: f64,
    stable_interval_micros: f64,
    next_free_ticket_micros: i64,
    flavor: Flavor,
}

impl Inner {
    fn new(flavor: Flavor) -> Inner {
        Inner {
            stored_permits: 0.0,
            max_permits: 0.0,
            stable_interval_micros: 0.0,
            next_free_ticket_micros: 0,
            flavor,
        }
    }

    /// `SmoothRateLimiter.doSetRate(double permitsPerSecond, long nowMicros)`.
    fn do_set_rate(&mut self, permits_per_second: f64, now_micros: i64) {
        self.resync(now_micros);
        let stable_interval_micros = 1_000_000.0 / permits_per_second;
        self.stable_interval_micros = stable_interval_micros;
        self.do_set_rate_flavor(permits_per_second, stable_interval_micros);
    }

    /// The subclasses' `doSetRate(double permitsPerSecond, double stableIntervalMicros)`.
    fn do_set_rate_flavor(&mut self, permits_per_second: f64, stable_interval_micros: f64) {
        let old_max_permits = self.max_permits;
        match &mut self.flavor {
            Flavor::Bursty { max_burst_seconds } => {
                self.max_permits = *max_burst_seconds * permits_per_second;
                if old_max_permits == f64::INFINITY {
                    // if we don't special-case this, we would get storedPermits == NaN, below
                    self.stored_permits = self.max_permits;
                } else {
                    self.stored_permits = if old_max_permits == 0.0 {
                        0.0 // initial state
                    } else {
                        self.stored_permits * self.max_permits / old_max_permits
                    };
                }
            }
            Flavor::WarmingUp {
                warmup_period_micros,
                slope,
                threshold_permits,
                cold_factor,
            } => {
                let warmup = *warmup_period_micros as f64;
                let cold_interval_micros = stable_interval_micros * *cold_factor;
                *threshold_permits = 0.5 * warmup / stable_interval_micros;
                self.max_permits = *threshold_permits
                    + 2.0 * warmup / (stable_interval_micros + cold_interval_micros);
                *slope = (cold_interval_micros - stable_interval_micros)
                    / (self.max_permits - *threshold_permits);
                if old_max_permits == f64::INFINITY {
                    // if we don't special-case this, we would get storedPermits == NaN, below
                    self.stored_permits = 0.0;
                } else {
                    self.stored_permits = if old_max_permits == 0.0 {
                        self.max_permits // initial state is cold
                    } else {
                        self.stored_permits * self.max_permits / old_max_permits
                    };
                }
            }
        }
    }

    /// `doGetRate()`.
    fn rate(&self) -> f64 {
        1_000_000.0 / self.stable_interval_micros
    }

    /// `queryEarliestAvailable(nowMicros)`: no resync.
    fn query_earliest_available(&self, _now_micros: i64) -> i64 {
        self.next_free_ticket_micros
    }

    /// `RateLimiter.canAcquire`: the subtraction form (google/guava#1622).
    fn can_acquire(&self, now_micros: i64, timeout_micros: i64) -> bool {
        self.query_earliest_available(now_micros)
            .wrapping_sub(timeout_micros)
            <= now_micros
    }

    /// `RateLimiter.reserveAndGetWaitLength`.
    fn reserve_and_get_wait_length(&mut self, permits: u32, now_micros: i64) -> i64 {
        let moment_available = self.reserve_earliest_available(permits, now_micros);
        moment_available.wrapping_sub(now_micros).max(0)
    }

    /// `SmoothRateLimiter.reserveEarliestAvailable`.
    fn reserve_earliest_available(&mut self, required_permits: u32, now_micros: i64) -> i64 {
        self.resync(now_micros);
        let return_value = self.next_free_ticket_micros;
        let required = f64::from(required_permits);
        let stored_permits_to_spend = java_min(required, self.stored_permits);
        let fresh_permits = required - stored_permits_to_spend;
        let wait_micros = self
            .stored_permits_to_wait_time(self.stored_permits, stored_permits_to_spend)
            .wrapping_add((fresh_permits * self.stable_interval_micros) as i64);
        self.next_free_ticket_micros = self.next_free_ticket_micros.saturating_add(wait_micros);
        self.stored_permits -= stored_permits_to_spend;
        return_value
    }

    /// `storedPermitsToWaitTime(storedPermits, permitsToTake)`.
    fn stored_permits_to_wait_time(&self, stored_permits: f64, mut permits_to_take: f64) -> i64 {
        match self.flavor {
            Flavor::Bursty { .. } => 0,
            Flavor::WarmingUp {
                threshold_permits, ..
            } => {
                let available_permits_above_threshold = stored_permits - threshold_permits;
                let mut micros: i64 = 0;
                // measuring the integral on the right part of the function (the climbing line)
                if available_permits_above_threshold > 0.0 {
                    let permits_above_threshold_to_take =
                        java_min(available_permits_above_threshold, permits_to_take);
                    let length = self.permits_to_time(available_permits_above_threshold)
                        + self.permits_to_time(
                            available_permits_above_threshold - permits_above_threshold_to_take,
                        );
                    micros = (permits_above_threshold_to_take * length / 2.0) as i64;
                    permits_to_take -= permits_above_threshold_to_take;
                }
                // measuring the integral on the left part of the function (the horizontal line)
                micros.wrapping_add((self.stable_interval_micros * permits_to_take) as i64)
            }
        }
    }

    /// `SmoothWarmingUp.permitsToTime`.
    fn permits_to_time(&self, permits: f64) -> f64 {
        match self.flavor {
            Flavor::WarmingUp { slope, .. } => self.stable_interval_micros + permits * slope,
            Flavor::Bursty { .. } => self.stable_interval_micros,
        }
    }

    /// `coolDownIntervalMicros()`.
    fn cool_down_interval_micros(&self) -> f64 {
        match self.flavor {
            Flavor::Bursty { .. } => self.stable_interval_micros,
            Flavor::WarmingUp {
                warmup_period_micros,
                ..
            } => warmup_period_micros as f64 / self.max_permits,
        }
    }

    /// `resync(nowMicros)`.
    fn resync(&mut self, now_micros: i64) {
        // if nextFreeTicket is in the past, resync to now
        if now_micros > self.next_free_ticket_micros {
            let new_permits = now_micros.wrapping_sub(self.next_free_ticket_micros) as f64
                / self.cool_down_interval_micros();
            self.stored_permits = java_min(self.max_permits, self.stored_permits + new_permits);
            self.next_free_ticket_micros = now_micros;
        }
    }

    fn params(&self) -> SmoothParams {
        let (cold, threshold, slope) = match self.flavor {
            Flavor::Bursty { .. } => (0.0, 0.0, 0.0),
            Flavor::WarmingUp {
                slope,
                threshold_permits,
                cold_factor,
                ..
            } => (
                self.stable_interval_micros * cold_factor,
                threshold_permits,
                slope,
            ),
        };
        SmoothParams {
            rate: self.rate(),
            stable_interval_ns: self.stable_interval_micros * 1e3,
            cold_interval_ns: cold * 1e3,
            max_permits: self.max_permits,
            threshold_permits: threshold,
            slope_ns: slope * 1e3,
            cool_down_interval_ns: self.cool_down_interval_micros() * 1e3,
        }
    }
}

/// The shared body of both twins: the mutex, the clock, and `RateLimiter`'s methods.
struct Twin<C> {
    inner: Mutex<Inner>,
    clock: C,
}

impl<C: Clock> Twin<C> {
    /// `new SmoothX(stopwatch, ..)` then `setRate(pps)`, both at the clock's current time.
    fn new(flavor: Flavor, rate: f64, clock: C) -> Twin<C> {
        let mut inner = Inner::new(flavor);
        inner.do_set_rate(rate, read_micros(clock.now()));
        Twin {
            inner: Mutex::new(inner),
            clock,
        }
    }

    /// Nothing here panics with the lock held; a poisoned mutex is used anyway.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `RateLimiter.reserve(permits)` at `now`.
    fn reserve(&self, now: Nanos, permits: u32) -> Result<Duration, WaitError> {
        check_permits(permits)?;
        let micros = self
            .lock()
            .reserve_and_get_wait_length(permits, read_micros(now));
        Ok(Duration::from_micros(micros as u64))
    }

    /// `RateLimiter.tryAcquire(permits, timeout)` at `now`, without the sleep.
    fn try_acquire(
        &self,
        now: Nanos,
        permits: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, WaitError> {
        let timeout_micros = to_micros(timeout).max(0);
        check_permits(permits)?;
        let micros_to_wait;
        {
            let mut inner = self.lock();
            let now_micros = read_micros(now);
            if !inner.can_acquire(now_micros, timeout_micros) {
                return Ok(None);
            } else {
                micros_to_wait = inner.reserve_and_get_wait_length(permits, now_micros);
            }
        }
        Ok(Some(Duration::from_micros(micros_to_wait as u64)))
    }

    fn check(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        let mut inner = self.lock();
        let now_micros = read_micros(now);
        if !inner.can_acquire(now_micros, 0) {
            let next = inner.next_free_ticket_micros as u64;
            return Err(Denied::new(
                now,
                Some(Nanos::new(next.saturating_mul(1000))),
            ));
        }
        if n > 0 {
            inner.reserve_and_get_wait_length(n, now_micros);
        }
        Ok(())
    }

    fn set_rate(&self, now: Nanos, rate: f64) -> Result<(), ConfigError> {
        let rate = check_rate(rate)?;
        self.lock().do_set_rate(rate, read_micros(now));
        Ok(())
    }

    fn stored_permits_at(&self, now: Nanos) -> f64 {
        let mut copy = *self.lock();
        copy.resync(read_micros(now));
        copy.stored_permits
    }
}

/// The mutex twin of [`crate::SmoothBursty`]: Guava's `SmoothBursty`, literally (see the
/// [module docs](self)). Same API.
///
/// ```
/// use std::time::Duration;
/// use turnstile::reference::SmoothBursty;
/// use turnstile::{ManualClock, Nanos};
///
/// let l = SmoothBursty::try_from(turnstile::SmoothBursty::builder(1.0).clock(ManualClock::default())).unwrap();
/// assert_eq!(l.reserve_n_at(Nanos::ZERO, 8).unwrap(), Duration::ZERO);
/// assert_eq!(l.reserve_n_at(Nanos::ZERO, 1).unwrap(), Duration::from_secs(8));
/// ```
pub struct SmoothBursty<C: Clock = QuantaClock> {
    twin: Twin<C>,
}

/// The mutex twin of [`crate::SmoothWarmingUp`]: Guava's `SmoothWarmingUp`, literally (see the
/// [module docs](self)). Same API.
pub struct SmoothWarmingUp<C: Clock = QuantaClock> {
    twin: Twin<C>,
}

impl SmoothBursty<QuantaClock> {
    /// `RateLimiter.create(rate)`: a 1-second burst, on the shared quanta clock.
    ///
    /// # Errors
    /// [`ConfigError::RateNotPositive`] unless `rate > 0`.
    pub fn new(rate: f64) -> Result<Self, ConfigError> {
        Self::try_from(crate::SmoothBursty::builder(rate))
    }
}

impl SmoothWarmingUp<QuantaClock> {
    /// `RateLimiter.create(rate, warmup)`: cold factor 3, on the shared quanta clock.
    ///
    /// # Errors
    /// [`ConfigError::RateNotPositive`], [`ConfigError::ZeroWarmup`].
    pub fn new(rate: f64, warmup: Duration) -> Result<Self, ConfigError> {
        Self::try_from(crate::SmoothWarmingUp::builder(rate, warmup))
    }
}

/// The twin from the lock-free limiter's options, validated as the lock-free limiter is:
/// [`ConfigError::RateNotPositive`], [`ConfigError::InvalidBurstSeconds`],
/// [`ConfigError::InvalidStoredPermits`].
///
/// ```
/// use turnstile::{reference, SmoothBursty};
/// let options = SmoothBursty::builder(5.0).max_burst_seconds(2.0);
/// assert!(reference::SmoothBursty::try_from(options).is_ok());
/// ```
impl<C: Clock> TryFrom<SmoothBurstyBuilder<C>> for SmoothBursty<C> {
    type Error = ConfigError;

    fn try_from(options: SmoothBurstyBuilder<C>) -> Result<SmoothBursty<C>, ConfigError> {
        let (rate, b, p, clock) = options.validated()?;
        let twin = Twin::new(
            Flavor::Bursty {
                max_burst_seconds: b,
            },
            rate,
            clock,
        );
        if p > 0.0 {
            let mut inner = twin.lock();
            inner.stored_permits = p.min(inner.max_permits);
        }
        Ok(SmoothBursty { twin })
    }
}

/// The twin from the lock-free limiter's options, validated as the lock-free limiter is:
/// [`ConfigError::RateNotPositive`], [`ConfigError::ZeroWarmup`],
/// [`ConfigError::InvalidColdFactor`]. The warm-up is truncated to whole microseconds, as
/// upstream (so one under 1 µs gives upstream's NaN arithmetic).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{reference, SmoothWarmingUp};
/// let options = SmoothWarmingUp::builder(5.0, Duration::from_secs(1)).cold_factor(2.0);
/// assert!(reference::SmoothWarmingUp::try_from(options).is_ok());
/// ```
impl<C: Clock> TryFrom<SmoothWarmingUpBuilder<C>> for SmoothWarmingUp<C> {
    type Error = ConfigError;

    fn try_from(options: SmoothWarmingUpBuilder<C>) -> Result<SmoothWarmingUp<C>, ConfigError> {
        let (rate, warmup, cf, clock) = options.validated()?;
        let flavor = Flavor::WarmingUp {
            warmup_period_micros: to_micros(warmup),
            slope: 0.0,
            threshold_permits: 0.0,
            cold_factor: cf,
        };
        Ok(SmoothWarmingUp {
            twin: Twin::new(flavor, rate, clock),
        })
    }
}

/// The API both twins share (that of the lock-free limiters).
macro_rules! twin_api {
    ($ty:ident) => {
        impl<C: Clock> $ty<C> {
            /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
            /// methods use.
            pub fn clock(&self) -> &C {
                &self.twin.clock
            }

            /// Guava's `getRate()`: `1e6 / stableIntervalMicros`.
            pub fn rate(&self) -> f64 {
                self.twin.lock().rate()
            }

            /// Guava's derived fields, converted to nanoseconds.
            pub fn params(&self) -> SmoothParams {
                self.twin.lock().params()
            }

            /// The permits stored now.
            pub fn stored_permits(&self) -> f64 {
                self.stored_permits_at(self.twin.clock.now())
            }

            /// Guava's `storedPermits` after a `resync(now)`, on a copy.
            pub fn stored_permits_at(&self, now: Nanos) -> f64 {
                self.twin.stored_permits_at(now)
            }

            /// `setRate(rate)` now.
            ///
            /// # Errors
            /// [`ConfigError::RateNotPositive`] unless `rate > 0`.
            pub fn set_rate(&self, rate: f64) -> Result<(), ConfigError> {
                self.twin.set_rate(self.twin.clock.now(), rate)
            }

            /// `setRate(rate)` with the stopwatch reading `now`.
            ///
            /// # Errors
            /// [`ConfigError::RateNotPositive`] unless `rate > 0`.
            pub fn set_rate_at(&self, now: Nanos, rate: f64) -> Result<(), ConfigError> {
                self.twin.set_rate(now, rate)
            }

            /// `reserve(n)` now: the wait, in whole microseconds.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0.
            pub fn reserve_n(&self, n: u32) -> Result<Duration, WaitError> {
                self.twin.reserve(self.twin.clock.now(), n)
            }

            /// `reserve(n)` with the stopwatch reading `now`.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0.
            pub fn reserve_n_at(&self, now: Nanos, n: u32) -> Result<Duration, WaitError> {
                self.twin.reserve(now, n)
            }

            /// `acquire(n)`: reserve, sleep outside the mutex, return the wait.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0.
            pub fn acquire(&self, n: u32) -> Result<Duration, WaitError> {
                let wait = self.reserve_n(n)?;
                if !wait.is_zero() {
                    std::thread::sleep(wait);
                }
                Ok(wait)
            }

            /// `acquire(n)` on tokio's timer.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0.
            #[cfg(feature = "tokio")]
            #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
            pub async fn acquire_async(&self, n: u32) -> Result<Duration, WaitError> {
                let wait = self.reserve_n(n)?;
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                Ok(wait)
            }

            /// `tryAcquire(n, timeout)`: sleeps outside the mutex when granted.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0.
            pub fn try_acquire(&self, n: u32, timeout: Duration) -> Result<bool, WaitError> {
                match self.twin.try_acquire(self.twin.clock.now(), n, timeout)? {
                    Some(wait) => {
                        if !wait.is_zero() {
                            std::thread::sleep(wait);
                        }
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }

            /// `tryAcquire(n, timeout)` with the stopwatch reading `now`, without the sleep:
            /// `Some(wait)` if granted, `None` (and no change) if not.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0.
            pub fn try_acquire_at(
                &self,
                now: Nanos,
                n: u32,
                timeout: Duration,
            ) -> Result<Option<Duration>, WaitError> {
                self.twin.try_acquire(now, n, timeout)
            }
        }

        /// `tryAcquire(n)` with a zero timeout; a denial's `retry_at` is `nextFreeTicket`.
        /// `n == 0` takes nothing and succeeds iff there is no debt.
        impl<C: Clock> Limiter for $ty<C> {
            fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
                self.twin.check(now, n)
            }

            fn now(&self) -> Nanos {
                self.twin.clock.now()
            }
        }

        impl<C: Clock> fmt::Debug for $ty<C> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // As the lock-free limiter's Debug: Guava's fields in user terms (the rate,
                // the store now, `nextFreeTicketMicros` as a time in nanoseconds).
                let inner = *self.twin.lock();
                let next_free = u64::try_from(inner.next_free_ticket_micros)
                    .unwrap_or(0)
                    .saturating_mul(1000);
                f.debug_struct(concat!("reference::", stringify!($ty)))
                    .field("rate", &PerSec(inner.rate()))
                    .field("max_permits", &inner.max_permits)
                    .field(
                        "stored_permits",
                        &self.twin.stored_permits_at(self.twin.clock.now()),
                    )
                    .field("next_free", &Nanos::new(next_free))
                    .finish()
            }
        }
    };
}

twin_api!(SmoothBursty);
twin_api!(SmoothWarmingUp);
