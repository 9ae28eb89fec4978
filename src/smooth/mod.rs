//! Lock-free [`SmoothBursty`] and [`SmoothWarmingUp`] with the semantics of Guava's
//! `RateLimiter` (`SmoothRateLimiter.java`), at nanosecond resolution.
//!
//! # Guava's model, in one paragraph
//! The limiter keeps `stored_permits` (permits saved while idle, at most `max_permits`) and
//! `next_free`, the time at which the *next* request is granted, whatever its size. A request
//! of `n` permits at `now` first *resyncs* (if `now > next_free`, the idle time
//! `now - next_free` becomes `(now - next_free) / cool_down_interval` stored permits, capped at
//! `max_permits`, and `next_free = now`), then waits until `next_free` (**pay later**: it waits
//! only for the previous debt), spends `min(n, stored)` stored permits and pushes `next_free`
//! forward by their cost plus `fresh * stable_interval` for the rest. Stored permits are free
//! in [`SmoothBursty`]; in [`SmoothWarmingUp`] they cost the integral of a line rising from
//! `stable_interval` at `threshold_permits` to `cold_interval = cold_factor * stable_interval`
//! at `max_permits` (the trapezoid), and the stable interval below the threshold.
//!
//! # Arithmetic
//! Guava's, in nanoseconds (`stable_interval = 1e9 / rate`, warm-up in ns) with `f64` for
//! permits and intervals, and no division on the hot path (the configuration carries the two
//! reciprocals it needs, and one permit in fraction units, so that the common one-permit
//! request does not even round its size). A charge reads only the slot's first words: those
//! a reservation uses (five for [`SmoothBursty`], seven for [`SmoothWarmingUp`], whose kind is
//! a compile-time parameter of the shared core, so that a bursty charge carries no branch for
//! the warm-up's integral). Guava truncates each cost to whole microseconds; here each cost is
//! rounded to the **nearest nanosecond**, so that a value that floating point lands a hair
//! below a whole number (200 ms computed as 199.9999999999 ms) is not cut to the nanosecond
//! below. The warm-up cost is Guava's integral, `stable * take + slope * t * (above - t / 2)`
//! for the `t` permits above the threshold, which is its trapezoid plus its flat part summed
//! algebraically and rounded once. Conversions saturate (NaN, which only `0 * inf` for a zero
//! part could produce, is 0 as in Java's `(long)` cast).
//!
//! # Deviations from Guava
//! * **D8** nanosecond resolution: waits agree with Guava's to within a microsecond per
//!   operation (Guava truncates every cost to whole µs and reads time in µs, so at more than
//!   10^6 permits per second Guava stops limiting; turnstile does not). A warm-up shorter than
//!   a microsecond works (guava#6475).
//! * **D9** a zero warm-up is rejected ([`ConfigError::ZeroWarmup`]); no NaN is ever stored:
//!   under `+inf` the stored permits are `+inf` (Guava stores NaN after `setRate(+inf)` when
//!   none were stored), the slope is 0 where Guava's is NaN, and a zero `max_burst_seconds`
//!   at `+inf` gives `max_permits = 0` (Guava: NaN). Rates so large that `max_permits` would
//!   overflow cap it at `f64::MAX`.
//! * **D10** [`SmoothBurstyBuilder::initial_stored_permits`] (default 0, as Guava).
//! * **D11** typed errors: [`ConfigError::RateNotPositive`] for a rate that is zero, negative
//!   or NaN (`+inf` is allowed: no waits), [`ConfigError::SubnormalLimit`], [`ConfigError::ZeroWarmup`],
//!   [`ConfigError::InvalidColdFactor`] (below 1, infinite or NaN),
//!   [`ConfigError::InvalidBurstSeconds`] (negative, infinite or NaN),
//!   [`ConfigError::InvalidStoredPermits`] (negative or NaN); and zero permits on
//!   `acquire`, `reserve_n` and `try_acquire` give [`WaitError::ZeroPermits`] with nothing
//!   reserved. Nothing panics. (`Limiter::check_n_at(now, 0)` takes nothing and succeeds iff
//!   there is no debt.)
//! * [`SmoothBursty::rate`] returns the rate as set; Guava recomputes `1e6 / stable_interval`,
//!   which can differ in the last bit.
//! * **D4** (as the token bucket's): a subnormal rate is rejected
//!   ([`ConfigError::SubnormalLimit`]; its interval is not a finite number), and a request whose
//!   wait would end past the end of representable time (the debt of earlier requests
//!   saturated at `u64::MAX` ns, ~584 years from the clock's origin, e.g. after one request at
//!   `1e-12` permits per second) fails with [`WaitError::Never`] and reserves nothing, instead
//!   of sleeping for centuries; as a [`Limiter`] it is denied with no retry time.
//! * The async `SmoothBursty::acquire_async` does not give permits back when dropped: Guava
//!   has no cancel, and under pay later the request's cost has already been charged to the
//!   *next* caller.

mod engine;
#[cfg(test)]
mod tests;

use std::fmt;
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::{ConfigError, WaitError};
use crate::layout::{Compact, Layout, Padded};
use crate::limiter::{Denied, Idle, Limiter};

use engine::*;

#[cfg(feature = "keyed")]
pub(crate) use engine::{
    check_rate, next_free, pack, warming_config, Config, EPOCH_BITS, FRAC_ONE,
};

/// The derived constants of a smooth limiter's current rate, in nanoseconds (Guava's fields,
/// which are in microseconds). For [`SmoothBursty`], stored permits cost nothing and
/// `threshold_permits`, `slope_ns` and `cold_interval_ns` are 0.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, SmoothWarmingUp};
/// let l = SmoothWarmingUp::builder(2.0, Duration::from_secs(4))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let p = l.params();
/// assert_eq!((p.threshold_permits, p.max_permits), (4.0, 8.0));
/// assert_eq!(p.slope_ns, 250_000_000.0); // Guava's 250000.0 µs
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmoothParams {
    /// Permits per second (`+inf` for no limit).
    pub rate: f64,
    /// `1e9 / rate` (0 under `+inf`).
    pub stable_interval_ns: f64,
    /// `stable_interval_ns * cold_factor` (warming up only).
    pub cold_interval_ns: f64,
    /// The most permits that can be stored.
    pub max_permits: f64,
    /// Stored permits above this cost more than the stable interval (warming up only).
    pub threshold_permits: f64,
    /// How much the cost of a stored permit grows per permit above the threshold, in ns per
    /// permit (warming up only).
    pub slope_ns: f64,
    /// Idle time that stores one permit.
    pub cool_down_interval_ns: f64,
}

/// Guava's `SmoothBursty`, lock-free: `rate` permits per second, paying later, with up to
/// `max_burst_seconds * rate` permits stored while idle and spent at no cost. It starts with
/// no stored permits (as Guava; deviation D10 makes that configurable).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, Nanos, SmoothBursty};
///
/// let l = SmoothBursty::builder(1.0).clock(ManualClock::default()).build().unwrap();
/// let t = Nanos::ZERO;
/// assert_eq!(l.reserve_n_at(t, 8).unwrap(), Duration::ZERO); // pay later: no wait...
/// assert_eq!(l.reserve_n_at(t, 1).unwrap(), Duration::from_secs(8)); // ...the next one pays
/// assert_eq!(l.try_acquire_at(t, 1, Duration::from_secs(1)).unwrap(), None); // 9 s of debt
/// ```
#[repr(C)] // the core first: a keyed map's check then reads one line (module docs)
pub struct SmoothBursty<C: Clock = QuantaClock, P: Layout = Padded> {
    /// The state word and the configurations, each cache-padded unless `P` is [`Compact`].
    core: Core<C, false, P>,
    /// The builder's `initial_stored_permits` (uncapped): what a fresh limiter of the same
    /// configuration would start with, for [`Idle`].
    initial_stored: f64,
}

/// Guava's `SmoothWarmingUp`, lock-free: `rate` permits per second after a warm-up. It starts
/// cold (all `max_permits` stored); stored permits above `threshold_permits` cost up to
/// `cold_factor` stable intervals each, so a cold limiter ramps up to its rate over the
/// warm-up period, and idling for the warm-up period makes it cold again.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, Nanos, SmoothWarmingUp};
///
/// let l = SmoothWarmingUp::builder(2.0, Duration::from_secs(4))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let mut now = Nanos::ZERO;
/// let mut waits = Vec::new();
/// for _ in 0..8 {
///     let w = l.reserve_n_at(now, 1).unwrap();
///     now = now + w;
///     waits.push(w.as_millis());
/// }
/// assert_eq!(waits, [0, 1375, 1125, 875, 625, 500, 500, 500]);
/// ```
pub struct SmoothWarmingUp<C: Clock = QuantaClock, P: Layout = Padded> {
    /// The state word and the configurations, each cache-padded unless `P` is [`Compact`].
    core: Core<C, true, P>,
}

impl SmoothBursty<QuantaClock> {
    /// Guava's `RateLimiter.create(rate)`: a 1-second burst, on the shared quanta clock.
    ///
    /// # Errors
    /// [`ConfigError::RateNotPositive`] unless `rate > 0` (`+inf` allowed),
    /// [`ConfigError::SubnormalLimit`] for a subnormal rate.
    pub fn new(rate: f64) -> Result<Self, ConfigError> {
        Self::builder(rate).build()
    }

    /// A builder for `rate` permits per second (defaults: a 1-second burst, no stored
    /// permits, the quanta clock).
    pub fn builder(rate: f64) -> SmoothBurstyBuilder<QuantaClock> {
        SmoothBurstyBuilder::with_defaults(rate)
    }
}

impl SmoothWarmingUp<QuantaClock> {
    /// Guava's `RateLimiter.create(rate, warmup)`: cold factor 3, on the shared quanta clock.
    ///
    /// # Errors
    /// [`ConfigError::RateNotPositive`], [`ConfigError::ZeroWarmup`].
    pub fn new(rate: f64, warmup: Duration) -> Result<Self, ConfigError> {
        Self::builder(rate, warmup).build()
    }

    /// A builder for `rate` permits per second reached after `warmup` (defaults: cold factor
    /// 3, the quanta clock).
    pub fn builder(rate: f64, warmup: Duration) -> SmoothWarmingUpBuilder<QuantaClock> {
        SmoothWarmingUpBuilder::with_defaults(rate, warmup)
    }
}

/// Builds a [`SmoothBursty`]; see [`SmoothBursty::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct SmoothBurstyBuilder<C: Clock = QuantaClock> {
    rate: f64,
    max_burst_seconds: f64,
    initial_stored_permits: f64,
    clock: C,
}

impl SmoothBurstyBuilder<QuantaClock> {
    /// Guava's defaults (a 1-second burst, starting empty).
    fn with_defaults(rate: f64) -> Self {
        SmoothBurstyBuilder {
            rate,
            max_burst_seconds: 1.0,
            initial_stored_permits: 0.0,
            clock: QuantaClock::new(),
        }
    }
}

impl<C: Clock> SmoothBurstyBuilder<C> {
    /// How many seconds of permits can be stored while idle (Guava's `maxBurstSeconds`,
    /// default 1.0): `max_permits = max_burst_seconds * rate`.
    pub fn max_burst_seconds(mut self, seconds: f64) -> Self {
        self.max_burst_seconds = seconds;
        self
    }

    /// Permits stored at creation, capped at `max_permits` (deviation D10; Guava: 0).
    pub fn initial_stored_permits(mut self, permits: f64) -> Self {
        self.initial_stored_permits = permits;
        self
    }

    /// The clock to read time from.
    pub fn clock<C2: Clock>(self, clock: C2) -> SmoothBurstyBuilder<C2> {
        SmoothBurstyBuilder {
            rate: self.rate,
            max_burst_seconds: self.max_burst_seconds,
            initial_stored_permits: self.initial_stored_permits,
            clock,
        }
    }

    /// The validated options, for the limiter and its twin: `(rate, max_burst_seconds,
    /// initial_stored_permits, clock)`.
    pub(crate) fn validated(self) -> Result<(f64, f64, f64, C), ConfigError> {
        let rate = check_rate(self.rate)?;
        let b = self.max_burst_seconds;
        if !(b >= 0.0 && b.is_finite()) {
            return Err(ConfigError::InvalidBurstSeconds(b));
        }
        let p = self.initial_stored_permits;
        if p.is_nan() || p < 0.0 {
            return Err(ConfigError::InvalidStoredPermits(p));
        }
        Ok((rate, b, p, self.clock))
    }

    /// The limiter; its rate takes effect at the clock's current time.
    ///
    /// # Errors
    /// [`ConfigError::RateNotPositive`], [`ConfigError::InvalidBurstSeconds`] (negative,
    /// infinite or NaN), [`ConfigError::InvalidStoredPermits`] (negative or NaN).
    ///
    /// ```
    /// use turnstile::{ConfigError, SmoothBursty};
    /// let e = SmoothBursty::builder(0.0).build().unwrap_err();
    /// assert_eq!(e, ConfigError::RateNotPositive(0.0));
    /// assert!(SmoothBursty::builder(f64::INFINITY).build().is_ok());
    /// ```
    pub fn build(self) -> Result<SmoothBursty<C>, ConfigError> {
        self.build_in()
    }

    /// The limiter in the [`Compact`] layout (its state word unpadded, next to its
    /// configurations), for the many per-key limiters of a [`Keyed`](crate::Keyed) map: a
    /// check there reads one cache line of the key's slot. The same errors as
    /// [`SmoothBurstyBuilder::build`].
    ///
    /// ```
    /// # #[cfg(feature = "keyed")] {
    /// use turnstile::{Keyed, SmoothBursty};
    /// let per_user = Keyed::new(|_: &String| SmoothBursty::builder(5.0).build_compact().unwrap());
    /// assert!(per_user.check("alice").is_ok());
    /// # }
    /// ```
    pub fn build_compact(self) -> Result<SmoothBursty<C, Compact>, ConfigError> {
        self.build_in()
    }

    fn build_in<P: Layout>(self) -> Result<SmoothBursty<C, P>, ConfigError> {
        let (rate, b, p, clock) = self.validated()?;
        let kind = Kind::Bursty {
            max_burst_seconds: b,
        };
        Ok(SmoothBursty {
            core: Core::new(kind, rate, p, clock),
            initial_stored: p,
        })
    }
}

/// [`SmoothBurstyBuilder::build`] as a conversion, the form the mutex twin is built by too
/// (`reference::SmoothBursty`, feature `reference`): code generic over the two builds either.
impl<C: Clock> TryFrom<SmoothBurstyBuilder<C>> for SmoothBursty<C> {
    type Error = ConfigError;

    fn try_from(options: SmoothBurstyBuilder<C>) -> Result<SmoothBursty<C>, ConfigError> {
        options.build()
    }
}

/// Builds a [`SmoothWarmingUp`]; see [`SmoothWarmingUp::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct SmoothWarmingUpBuilder<C: Clock = QuantaClock> {
    rate: f64,
    warmup: Duration,
    cold_factor: f64,
    clock: C,
}

impl SmoothWarmingUpBuilder<QuantaClock> {
    /// Guava's defaults (cold factor 3).
    fn with_defaults(rate: f64, warmup: Duration) -> Self {
        SmoothWarmingUpBuilder {
            rate,
            warmup,
            cold_factor: 3.0,
            clock: QuantaClock::new(),
        }
    }
}

impl<C: Clock> SmoothWarmingUpBuilder<C> {
    /// The cold interval as a multiple of the stable one (default 3.0, at least 1).
    pub fn cold_factor(mut self, cold_factor: f64) -> Self {
        self.cold_factor = cold_factor;
        self
    }

    /// The clock to read time from.
    pub fn clock<C2: Clock>(self, clock: C2) -> SmoothWarmingUpBuilder<C2> {
        SmoothWarmingUpBuilder {
            rate: self.rate,
            warmup: self.warmup,
            cold_factor: self.cold_factor,
            clock,
        }
    }

    /// The validated options, for the limiter and its twin: `(rate, warmup, cold_factor, clock)`.
    pub(crate) fn validated(self) -> Result<(f64, Duration, f64, C), ConfigError> {
        let rate = check_warming(self.rate, self.warmup, self.cold_factor)?;
        Ok((rate, self.warmup, self.cold_factor, self.clock))
    }

    /// The limiter, cold; its rate takes effect at the clock's current time.
    ///
    /// # Errors
    /// [`ConfigError::RateNotPositive`], [`ConfigError::ZeroWarmup`] (deviation D9),
    /// [`ConfigError::InvalidColdFactor`] (below 1, infinite or NaN).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, SmoothWarmingUp};
    /// assert_eq!(
    ///     SmoothWarmingUp::builder(1.0, Duration::ZERO).build().unwrap_err(),
    ///     ConfigError::ZeroWarmup(Duration::ZERO)
    /// );
    /// let e = SmoothWarmingUp::builder(1.0, Duration::from_secs(1)).cold_factor(0.5).build();
    /// assert_eq!(e.unwrap_err(), ConfigError::InvalidColdFactor(0.5));
    /// ```
    pub fn build(self) -> Result<SmoothWarmingUp<C>, ConfigError> {
        self.build_in()
    }

    /// The limiter in the [`Compact`] layout (its state word unpadded, next to its
    /// configurations), for the many per-key limiters of a [`Keyed`](crate::Keyed) map: a
    /// check there reads one cache line of the key's slot. The same errors as
    /// [`SmoothWarmingUpBuilder::build`].
    ///
    /// ```
    /// # #[cfg(feature = "keyed")] {
    /// use std::time::Duration;
    /// use turnstile::{Keyed, SmoothWarmingUp};
    /// let per_user = Keyed::new(|_: &String| {
    ///     SmoothWarmingUp::builder(5.0, Duration::from_secs(2)).build_compact().unwrap()
    /// });
    /// assert!(per_user.check("alice").is_ok());
    /// # }
    /// ```
    pub fn build_compact(self) -> Result<SmoothWarmingUp<C, Compact>, ConfigError> {
        self.build_in()
    }

    fn build_in<P: Layout>(self) -> Result<SmoothWarmingUp<C, P>, ConfigError> {
        let (rate, warmup, cf, clock) = self.validated()?;
        let kind = Kind::WarmingUp {
            warmup_ns: Nanos::from_duration(warmup).as_u64() as f64,
            cold_factor: cf,
        };
        // Cold: all max_permits stored (Guava: old max 0 -> maxPermits).
        Ok(SmoothWarmingUp {
            core: Core::new(kind, rate, f64::INFINITY, clock),
        })
    }
}

/// [`SmoothWarmingUpBuilder::build`] as a conversion, the form the mutex twin is built by too
/// (`reference::SmoothWarmingUp`, feature `reference`): code generic over the two builds either.
impl<C: Clock> TryFrom<SmoothWarmingUpBuilder<C>> for SmoothWarmingUp<C> {
    type Error = ConfigError;

    fn try_from(options: SmoothWarmingUpBuilder<C>) -> Result<SmoothWarmingUp<C>, ConfigError> {
        options.build()
    }
}

/// The API both smooth limiters share.
macro_rules! smooth_api {
    ($ty:ident) => {
        impl<C: Clock, P: Layout> $ty<C, P> {
            /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
            /// methods use.
            pub fn clock(&self) -> &C {
                &self.core.clock
            }

            /// The rate in permits per second, as last set (`+inf` for no limit).
            pub fn rate(&self) -> f64 {
                self.core.load().1.rate
            }

            /// The derived constants of the current rate.
            pub fn params(&self) -> SmoothParams {
                self.core.load().1.params(self.core.kind)
            }

            /// The permits stored now; see the `_at` form.
            pub fn stored_permits(&self) -> f64 {
                self.stored_permits_at(self.core.clock.now())
            }

            /// The permits that would be stored at `now` (Guava's `storedPermits` after a
            /// resync), with no change. `+inf` under a `+inf` rate.
            pub fn stored_permits_at(&self, now: Nanos) -> f64 {
                self.core.stored_permits_at(now)
            }

            /// Changes the rate now; see the `_at` form.
            ///
            /// # Errors
            /// [`ConfigError::RateNotPositive`]; the limiter is unchanged.
            pub fn set_rate(&self, rate: f64) -> Result<(), ConfigError> {
                self.core.set_rate(self.core.clock.now(), rate)
            }

            /// Changes the rate at `now` (Guava's `setRate`): the stored permits are brought
            /// up to `now` at the old rate and rescaled to the new maximum, and `next_free` is
            /// kept, so the debt already owed is repaid at the old rate. Linearizable with
            /// concurrent reservations.
            ///
            /// # Errors
            /// [`ConfigError::RateNotPositive`] unless `rate > 0` (`+inf` allowed),
            /// [`ConfigError::SubnormalLimit`] for a subnormal rate; the
            /// limiter is unchanged.
            pub fn set_rate_at(&self, now: Nanos, rate: f64) -> Result<(), ConfigError> {
                self.core.set_rate(now, rate)
            }

            /// Reserves `n` permits now; see the `_at` form.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0; [`WaitError::Never`] if the debt of earlier
            /// requests ends past the end of representable time (deviation D4).
            pub fn reserve_n(&self, n: u32) -> Result<Duration, WaitError> {
                self.core.reserve(self.core.clock.now(), n)
            }

            /// Reserves `n` permits at `now` and returns how long to wait before acting
            /// (Guava's `reserve`, pay later: the wait is the debt left by earlier requests,
            /// and this request's cost moves `next_free` for the next one). Always succeeds.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0; [`WaitError::Never`] if the debt of earlier
            /// requests ends past the end of representable time (deviation D4). Nothing is
            /// reserved either way.
            pub fn reserve_n_at(&self, now: Nanos, n: u32) -> Result<Duration, WaitError> {
                self.core.reserve(now, n)
            }

            /// Reserves `n` permits and sleeps the thread until they may be used (Guava's
            /// `acquire`). Returns the time slept (as computed, not measured).
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0; [`WaitError::Never`] if the debt of earlier
            /// requests ends past the end of representable time (deviation D4). Nothing is
            /// reserved either way.
            pub fn acquire(&self, n: u32) -> Result<Duration, WaitError> {
                let now = self.core.clock.now();
                let wait = self.core.reserve(now, n)?;
                sleep(&self.core.clock, now, wait);
                Ok(wait)
            }

            /// [`Self::acquire`] sleeping on tokio's timer. Dropping the future does not give
            /// the permits back (Guava has no cancel; see the module docs).
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0; [`WaitError::Never`] if the debt of earlier
            /// requests ends past the end of representable time (deviation D4). Nothing is
            /// reserved either way.
            #[cfg(feature = "tokio")]
            #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
            pub async fn acquire_async(&self, n: u32) -> Result<Duration, WaitError> {
                let wait = self.core.reserve(self.core.clock.now(), n)?;
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
                Ok(wait)
            }

            /// Acquires `n` permits if that means waiting at most `timeout`, sleeping the
            /// thread for the wait (Guava's `tryAcquire(n, timeout)`). `false` means nothing
            /// changed.
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0; [`WaitError::Never`] if the debt of earlier
            /// requests ends past the end of representable time (deviation D4). Nothing is
            /// reserved either way.
            pub fn try_acquire(&self, n: u32, timeout: Duration) -> Result<bool, WaitError> {
                let now = self.core.clock.now();
                match self.core.try_acquire(now, n, timeout)? {
                    Some(wait) => {
                        sleep(&self.core.clock, now, wait);
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }

            /// The non-sleeping core of [`Self::try_acquire`] at `now`: if the debt left by
            /// earlier requests ends within `timeout` (Guava's `canAcquire`,
            /// `next_free - timeout <= now`; the size of this request does not matter), the
            /// permits are reserved and the wait is returned; otherwise `None` and nothing
            /// changes (nothing is even written).
            ///
            /// # Errors
            /// [`WaitError::ZeroPermits`] if `n` is 0; [`WaitError::Never`] if the debt of earlier
            /// requests ends past the end of representable time (deviation D4). Nothing is
            /// reserved either way.
            pub fn try_acquire_at(
                &self,
                now: Nanos,
                n: u32,
                timeout: Duration,
            ) -> Result<Option<Duration>, WaitError> {
                self.core.try_acquire(now, n, timeout)
            }
        }

        /// A non-blocking acquire that succeeds only if it need not wait (Guava's
        /// `tryAcquire(n)` with a zero timeout). A denial's `retry_at` is the current
        /// `next_free`. `n == 0` takes nothing and succeeds iff there is no debt.
        impl<C: Clock, P: Layout> Limiter for $ty<C, P> {
            #[inline]
            fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
                self.core.check(now, n)
            }

            #[inline]
            fn now(&self) -> Nanos {
                self.core.clock.now()
            }

            // `quota_at` keeps the default `None`: Guava's limiter has no quota a client could
            // be told exactly. A check passes iff `next_free <= now`, whatever its size (pay
            // later), so "permits that would be granted now" is unbounded or zero, and the
            // stored permits are a discount on the *next* caller's wait, not a count of
            // requests.
            //
            // `refund_n_at` keeps the default `false`: a grant's cost was charged to the
            // future (it pushed `next_free` forward and spent stored permits at the warm-up
            // integral's price), and a later grant may already have been admitted, or priced,
            // from that `next_free`; taking the cost back out cannot undo those, and spent
            // stored permits cannot be put back at the price they were taken (the integral
            // depends on where the count stood). So it keeps what it gave.
        }

        impl<C: Clock, P: Layout> fmt::Debug for $ty<C, P> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.core.fmt(stringify!($ty), f)
            }
        }
    };
}

smooth_api!(SmoothBursty);
smooth_api!(SmoothWarmingUp);

/// Idle when no debt is owed at `now` (`next_free <= now`) and the permits stored at `now`
/// are at least the [`SmoothBurstyBuilder::initial_stored_permits`] a fresh limiter of the
/// same configuration (its **current** rate, and the builder's initial permits capped at the
/// current maximum, both in the store's fixed-point units) starts with. A fresh limiter is
/// then **stricter or identical**: its `next_free` is `now` too, its store holds no more, and
/// stored permits are free here, so from `now` on it never grants sooner. With Guava's
/// default of no initial permits that is simply "no debt": the credit banked while idle is
/// forgotten by the fresh limiter. A keyed map rebuilds from its factory, so a per-key
/// `set_rate` does not survive eviction. One load of the state word; nothing is written.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Idle, ManualClock, Nanos, SmoothBursty};
///
/// let l = SmoothBursty::builder(2.0).clock(ManualClock::default()).build().unwrap();
/// assert!(l.is_idle_at(Nanos::ZERO));
/// assert_eq!(l.reserve_n_at(Nanos::ZERO, 2).unwrap(), Duration::ZERO); // 1 s of debt
/// assert!(!l.is_idle_at(Nanos::new(999_999_999)));
/// assert!(l.is_idle_at(Nanos::new(1_000_000_000)));
/// ```
impl<C: Clock, P: Layout> Idle for SmoothBursty<C, P> {
    fn is_idle_at(&self, now: Nanos) -> bool {
        let Some((cfg, stored)) = self.core.idle_view(now) else {
            return false;
        };
        // A fresh limiter's store, through the same rounding (and `0` for a zero maximum,
        // where every fraction stands for no permits).
        cfg.inf || stored >= cfg.stored(cfg.frac_of(self.initial_stored))
    }

    /// Built at `b`: `next_free = b` with the initial store. A reading `t < b` owes the debt
    /// `b - t` and is refused until `b` (a check grants only when `next_free <= now`). A
    /// limiter idle at `j <= b` has `next_free <= j` and at least the initial store at `j`,
    /// so advanced to `b` it has `next_free = b` and at least as many (free) stored permits:
    /// this state is that one with some credit forgotten. `next_free` never decreases over
    /// the key's history, nor does the time at which the store would be empty.
    fn born_at(&mut self, b: Nanos) {
        self.core.born_at(b);
    }
}

/// Idle when no debt is owed at `now` (`next_free <= now`) and the store is full at `now`
/// (all `max_permits` stored: cold, after idling for the warm-up period). A fresh limiter
/// starts exactly so (full and cold, `next_free = now`), so the two are **identical** from
/// `now` on. (Dropping a warm limiter with no debt would also let nothing more through, as
/// stored permits only make requests dearer here, but it would make an active key cold
/// again; this condition forgets nothing.) A keyed map rebuilds from its factory, so a
/// per-key `set_rate` does not survive eviction. One load of the state word; nothing is
/// written.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Idle, ManualClock, Nanos, SmoothWarmingUp};
///
/// let l = SmoothWarmingUp::builder(2.0, Duration::from_secs(4))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert!(l.is_idle_at(Nanos::ZERO));                      // new: cold
/// l.reserve_n_at(Nanos::ZERO, 1).unwrap();                 // 1.375 s of debt, 7 stored
/// assert!(!l.is_idle_at(Nanos::new(1_000_000_000)));      // debt
/// assert!(!l.is_idle_at(Nanos::new(1_500_000_000)));      // 7.25 stored: warmer than new
/// assert!(l.is_idle_at(Nanos::new(2_000_000_000)));       // 8 stored: cold again
/// ```
impl<C: Clock, P: Layout> Idle for SmoothWarmingUp<C, P> {
    fn is_idle_at(&self, now: Nanos) -> bool {
        let Some((cfg, stored)) = self.core.idle_view(now) else {
            return false;
        };
        cfg.inf || stored >= cfg.max_permits
    }

    /// Built at `b`: `next_free = b`, cold (the store full). A reading `t < b` owes the debt
    /// `b - t` and is refused until `b`. A limiter idle at `j <= b` is cold with
    /// `next_free <= j`; advanced to `b` it is exactly this state, so from `b` on the two
    /// are identical and before `b` this one grants nothing.
    fn born_at(&mut self, b: Nanos) {
        self.core.born_at(b);
    }
}
