//! The "water-level" leaky bucket, as a meter: a bucket of `capacity` units of water that
//! leaks at `leak` units per second; a request adds `n` units if they fit, else it is refused
//! (the leaky bucket of go-zero's rate-limiting article). Literally:
//!
//! ```text
//! water = max(0, water - (now - last) * leak); last = now
//! if water + n <= capacity { water += n; allow } else { refuse }
//! ```
//!
//! # Why there is no new protocol here
//! A leaky bucket used as a meter is exactly GCRA, i.e. a token bucket with
//! `burst = capacity` and `limit = leak`, seen from the other side:
//! `water = capacity - tokens`. Water leaking away is tokens refilling, an empty bucket is a
//! full one, and "`n` more units fit" is "`n` tokens are there". So [`LeakyMeter`] wraps a
//! [`TokenBucket`] and delegates every operation to it: one CAS protocol for both, the one
//! already model-checked under loom (`loom-tests/tests/token_bucket.rs`) and documented in
//! the [`token_bucket`](crate::token_bucket) module. A meter only takes water in (it has no
//! reservations), so its level always lies in `[0, capacity]`.
//!
//! # Packing
//! The token bucket is the meter's first field (`repr(C)`), the capacity after it. A check
//! reads the bucket's state word and hot configuration words (one cache line: see the token
//! bucket's *Configurations*) and nothing of the meter's own: the bucket refuses more than
//! `capacity = burst` units by itself under every leak but [`Limit::INF`], where it grants
//! without counting; the meter then reads the capacity, after a grant of two units or more,
//! and turns the grant into a refusal. The bucket is cache-padded by default and unpadded
//! in the [`Compact`] layout ([`LeakyMeterBuilder::build_compact`], for the many meters of a
//! keyed map), where a slot's state, the bucket's word and its hot words share one line.
//!
//! # Semantics and deviations from the literal algorithm
//! * The meter starts empty of water.
//! * Time is kept in ticks of 2^-32 ns, not floats: the level is exact up to the leak
//!   interval's rounding (~10 significant digits), and a request that fills the bucket to the
//!   brim exactly fits.
//! * **D2** holds, as in the token bucket: an earlier time never drains water. Asked at a
//!   time `t` earlier than the last addition, the meter counts all the water added so far,
//!   leaked only up to `t` (more than at the later time, never less), and `last` does not move
//!   back. So over any history, in any order of times, the meter admits at most
//!   `capacity + leak * (latest time - earliest time)` units plus one request.
//! * [`Limit::ZERO`] never leaks: once `capacity` units are in, nothing more ever fits.
//!   [`Limit::INF`] never fills: every request of at most `capacity` units fits.
//! * A request of more than `capacity` units never fits, whatever the leak (also under
//!   [`Limit::INF`]), and its denial has no retry time.
//! * Inherited from the token bucket: a leak so slow that draining the whole capacity would
//!   take longer than ~292 years never drains (it acts as [`Limit::ZERO`]), and under a
//!   finite positive leak a request whose water would have to leak past the end of
//!   representable time (2^63 ns, ~292 years after the clock's origin; so any request at
//!   [`Nanos::MAX`]) is refused, with no retry time.

use std::fmt;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::layout::{Compact, Layout, Padded};
use crate::limit::Limit;
use crate::limiter::{Denied, Idle, Limiter, QuotaStatus};
use crate::token_bucket::TokenBucket;

/// A lock-free water-level leaky bucket: `capacity` units of water leaking at `leak` units
/// per second; [`LeakyMeter::allow`] adds a unit if it fits. It starts empty.
///
/// It is a [`TokenBucket`] with `burst = capacity` and `limit = leak` underneath (water =
/// `capacity - tokens`), to which every call is delegated: one CAS protocol, the one already
/// model-checked under loom. See the [module docs](self) for the semantics.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{LeakyMeter, Limit, ManualClock, Nanos};
///
/// let clock = ManualClock::new(Nanos::ZERO);
/// let meter = LeakyMeter::builder(3, Limit::per_second(1.0).unwrap()).clock(clock.clone()).build().unwrap();
/// assert!(meter.allow_n(3));              // fills the bucket to the brim
/// assert!(!meter.allow());                // overflows: refused
/// clock.advance(Duration::from_secs(1));  // one unit leaks away
/// assert_eq!(meter.level(), 2.0);
/// assert!(meter.allow());
/// ```
#[repr(C)] // the bucket first: in a keyed map's slot its core then starts 8 bytes into a line
pub struct LeakyMeter<C: Clock = QuantaClock, P: Layout = Padded> {
    /// Cache-padded unless `P` is [`Compact`] (for the many meters of a keyed map).
    bucket: TokenBucket<C, P>,
    /// Read only when the bucket grants more than one unit (see `check_n_at`).
    capacity: u32,
}

impl LeakyMeter<QuantaClock> {
    /// An empty bucket of `capacity` units leaking at `leak` units per second, on the shared
    /// quanta clock.
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] if `capacity` is 0 (no unit could ever fit).
    ///
    /// ```
    /// use turnstile::{ConfigError, LeakyMeter, Limit};
    ///
    /// let meter = LeakyMeter::new(10, Limit::per_second(5.0).unwrap()).unwrap();
    /// assert!(meter.allow());
    /// assert_eq!(LeakyMeter::new(0, Limit::INF).unwrap_err(), ConfigError::ZeroCapacity);
    /// ```
    pub fn new(capacity: u32, leak: Limit) -> Result<LeakyMeter, ConfigError> {
        LeakyMeter::builder(capacity, leak).build()
    }

    /// A builder for an empty bucket of `capacity` units leaking at `leak` units per second,
    /// as every limiter has one: [`LeakyMeterBuilder::clock`], then
    /// [`build`](LeakyMeterBuilder::build) or [`build_compact`](LeakyMeterBuilder::build_compact).
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit, ManualClock, Nanos};
    ///
    /// let meter = LeakyMeter::builder(2, Limit::ZERO)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(meter.allow_n_at(Nanos::ZERO, 2));
    /// assert!(!meter.allow_at(Nanos::new(u64::MAX / 2))); // a zero leak never drains
    /// ```
    pub fn builder(capacity: u32, leak: Limit) -> LeakyMeterBuilder {
        LeakyMeterBuilder {
            capacity,
            leak,
            clock: QuantaClock::new(),
        }
    }
}

/// Options for a [`LeakyMeter`]; [`build`](LeakyMeterBuilder::build) checks them.
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug, Clone)]
pub struct LeakyMeterBuilder<C: Clock = QuantaClock> {
    capacity: u32,
    leak: Limit,
    clock: C,
}

impl<C: Clock> LeakyMeterBuilder<C> {
    /// Reads time from `clock` (default: the shared quanta clock).
    ///
    /// ```
    /// use turnstile::{Clock, LeakyMeter, Limit, ManualClock, Nanos};
    /// let meter = LeakyMeter::builder(1, Limit::INF)
    ///     .clock(ManualClock::new(Nanos::new(9)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(meter.clock().now(), Nanos::new(9));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> LeakyMeterBuilder<D> {
        LeakyMeterBuilder {
            capacity: self.capacity,
            leak: self.leak,
            clock,
        }
    }

    /// The meter, cache-padded: for one limiter every thread checks.
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] if `capacity` is 0.
    ///
    /// ```
    /// use turnstile::{ConfigError, LeakyMeter, Limit};
    /// assert!(LeakyMeter::builder(3, Limit::INF).build().is_ok());
    /// let zero = LeakyMeter::builder(0, Limit::INF).build();
    /// assert_eq!(zero.unwrap_err(), ConfigError::ZeroCapacity);
    /// ```
    pub fn build(self) -> Result<LeakyMeter<C>, ConfigError> {
        let bucket = TokenBucket::builder(self.leak, self.capacity).clock(self.clock);
        LeakyMeter::of(self.capacity, bucket.build())
    }

    /// The meter in the [`Compact`] layout: the token bucket underneath unpadded, for the
    /// many meters of a [`Keyed`](crate::Keyed) map (a fraction of the bytes per key, and one
    /// cache line per check). Same behaviour and errors.
    ///
    /// ```
    /// # #[cfg(feature = "keyed")] {
    /// use turnstile::{Keyed, LeakyMeter, Limit};
    /// let leak = Limit::per_second(10.0).unwrap();
    /// let per_ip = Keyed::new(move |_: &u32| LeakyMeter::builder(5, leak).build_compact().unwrap());
    /// assert!(per_ip.check_n(&1, 5).is_ok());
    /// # }
    /// ```
    pub fn build_compact(self) -> Result<LeakyMeter<C, Compact>, ConfigError> {
        let bucket = TokenBucket::builder(self.leak, self.capacity).clock(self.clock);
        LeakyMeter::of(self.capacity, bucket.build_compact())
    }
}

impl<C: Clock> TryFrom<LeakyMeterBuilder<C>> for LeakyMeter<C> {
    type Error = ConfigError;

    /// [`LeakyMeterBuilder::build`].
    fn try_from(options: LeakyMeterBuilder<C>) -> Result<LeakyMeter<C>, ConfigError> {
        options.build()
    }
}

impl<C: Clock, P: Layout> LeakyMeter<C, P> {
    /// A meter of `capacity` over `bucket`, a full bucket of `capacity` tokens (empty of
    /// water). A zero capacity is an error: no unit could ever fit.
    fn of(capacity: u32, bucket: TokenBucket<C, P>) -> Result<Self, ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        Ok(LeakyMeter { bucket, capacity })
    }

    /// The units of water the bucket holds.
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit};
    /// assert_eq!(LeakyMeter::new(7, Limit::INF).unwrap().capacity(), 7);
    /// ```
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The units of water that leak away per second.
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit};
    /// let leak = Limit::per_second(2.5).unwrap();
    /// assert_eq!(LeakyMeter::new(1, leak).unwrap().leak_rate(), leak);
    /// ```
    pub fn leak_rate(&self) -> Limit {
        self.bucket.limit()
    }

    /// The meter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    ///
    /// ```
    /// use turnstile::{Clock, LeakyMeter, Limit, ManualClock, Nanos};
    /// let meter = LeakyMeter::builder(1, Limit::INF).clock(ManualClock::new(Nanos::new(4))).build().unwrap();
    /// assert_eq!(meter.clock().now(), Nanos::new(4));
    /// ```
    pub fn clock(&self) -> &C {
        self.bucket.clock()
    }

    /// Adds one unit of water now if it fits; see [`LeakyMeter::allow_n_at`].
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit};
    /// let meter = LeakyMeter::new(1, Limit::per_second(0.001).unwrap()).unwrap();
    /// assert!(meter.allow());
    /// assert!(!meter.allow()); // full for the next 1000 s
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow(&self) -> bool {
        self.allow_n_at(self.bucket.clock().now(), 1)
    }

    /// Adds one unit of water at `now` if it fits; see [`LeakyMeter::allow_n_at`].
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit, ManualClock, Nanos};
    /// let meter = LeakyMeter::builder(1, Limit::per_second(10.0).unwrap()).clock(ManualClock::default()).build().unwrap();
    /// assert!(meter.allow_at(Nanos::ZERO));
    /// assert!(!meter.allow_at(Nanos::new(99_999_999)));
    /// assert!(meter.allow_at(Nanos::new(100_000_000)));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_at(&self, now: Nanos) -> bool {
        self.allow_n_at(now, 1)
    }

    /// Adds `n` units of water now if they all fit; see [`LeakyMeter::allow_n_at`].
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit};
    /// let meter = LeakyMeter::new(5, Limit::per_second(1.0).unwrap()).unwrap();
    /// assert!(meter.allow_n(5));
    /// assert!(!meter.allow_n(1));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n(&self, n: u32) -> bool {
        self.allow_n_at(self.bucket.clock().now(), n)
    }

    /// Adds `n` units of water at `now` if `level_at(now) + n <= capacity`; otherwise adds
    /// nothing (all or nothing, and a refusal writes nothing). More than `capacity` units
    /// never fit. `n = 0` adds nothing and fits, unless `now` is so much earlier than the last
    /// addition that the water counted at `now` (D2, see the [module docs](self)) exceeds the
    /// capacity.
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit, ManualClock, Nanos};
    /// let meter = LeakyMeter::builder(4, Limit::per_second(2.0).unwrap()).clock(ManualClock::default()).build().unwrap();
    /// assert!(meter.allow_n_at(Nanos::ZERO, 3));
    /// assert!(!meter.allow_n_at(Nanos::ZERO, 2));                // 3 + 2 > 4: nothing added
    /// assert_eq!(meter.level_at(Nanos::ZERO), 3.0);
    /// assert!(meter.allow_n_at(Nanos::new(500_000_000), 2));     // one unit leaked in 0.5 s
    /// assert!(!meter.allow_n_at(Nanos::new(500_000_000), 5));    // never fits
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n_at(&self, now: Nanos, n: u32) -> bool {
        // See `check_n_at`: the capacity is only read after a grant of more than one unit.
        self.bucket.allow_n_at(now, n) && fits(n, self.capacity)
    }

    /// The water in the bucket now; see [`LeakyMeter::level_at`].
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit};
    /// let meter = LeakyMeter::new(3, Limit::ZERO).unwrap();
    /// assert_eq!(meter.level(), 0.0);
    /// assert!(meter.allow_n(2));
    /// assert_eq!(meter.level(), 2.0);
    /// ```
    pub fn level(&self) -> f64 {
        self.level_at(self.bucket.clock().now())
    }

    /// The water in the bucket at `now`, in `[0, capacity]`: what is left of the units added
    /// after leaking at the leak rate (the bucket's tokens, from the other side). Nothing
    /// changes. At a time earlier than the last addition it counts all the water added so far
    /// (D2), capped at `capacity`.
    ///
    /// ```
    /// use turnstile::{LeakyMeter, Limit, ManualClock, Nanos};
    /// let meter = LeakyMeter::builder(10, Limit::per_second(4.0).unwrap()).clock(ManualClock::default()).build().unwrap();
    /// assert!(meter.allow_n_at(Nanos::ZERO, 10));
    /// assert_eq!(meter.level_at(Nanos::new(250_000_000)), 9.0);
    /// assert_eq!(meter.level_at(Nanos::new(1_125_000_000)), 5.5);
    /// assert_eq!(meter.level_at(Nanos::new(10_000_000_000)), 0.0);
    /// ```
    pub fn level_at(&self, now: Nanos) -> f64 {
        let capacity = f64::from(self.capacity);
        (capacity - self.bucket.tokens_at(now)).clamp(0.0, capacity)
    }
}

/// Whether `n` units can ever fit a meter of `capacity >= 1`: one unit always does, so
/// `capacity` (a load from past the bucket's hot words) is only compared for more.
#[inline(always)]
fn fits(n: u32, capacity: u32) -> bool {
    n <= 1 || n <= capacity
}

/// Adds `n` units of water at `now` if they fit ([`LeakyMeter::allow_n_at`]). A denial's
/// retry time is the earliest time enough water has leaked for the same request to fit if
/// nothing else is added meanwhile; there is none (`None`) if `n > capacity` or the leak is
/// [`Limit::ZERO`] and the water never goes down.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{LeakyMeter, Limit, Limiter, ManualClock, Nanos};
///
/// let meter = LeakyMeter::builder(2, Limit::per_second(4.0).unwrap()).clock(ManualClock::default()).build().unwrap();
/// assert!(meter.check_n_at(Nanos::ZERO, 2).is_ok());
/// let denied = meter.check_n_at(Nanos::ZERO, 1).unwrap_err();
/// assert_eq!(denied.retry_after(), Some(Duration::from_millis(250)));
/// assert_eq!(meter.check_n_at(Nanos::ZERO, 3).unwrap_err().retry_at(), None);
/// ```
impl<C: Clock, P: Layout> Limiter for LeakyMeter<C, P> {
    /// The bucket underneath decides, and its verdict stands except for one case: under
    /// [`Limit::INF`] it grants any `n` and counts nothing, where the meter refuses more than
    /// `capacity` units. Under any other leak the bucket refuses `n > capacity = burst` itself,
    /// with no retry time. So the capacity is read only after a grant, and not even then for
    /// one unit (`capacity >= 1`): a check reads the bucket's words alone.
    #[inline]
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.bucket.check_n_at(now, n)?;
        if fits(n, self.capacity) {
            Ok(())
        } else {
            Err(Denied::new(now, None))
        }
    }

    fn now(&self) -> Nanos {
        self.bucket.clock().now()
    }

    /// The token bucket underneath's fields (room for water is its tokens): `q` = the
    /// capacity, `w` = the time to drain a full meter (`capacity / leak`, rounded up to the
    /// nanosecond), `r` = the whole units of room at `now`, `t` = until the meter is empty
    /// (rounded up). A zero leak: `w = Duration::MAX`, and `t` is `Duration::MAX` unless
    /// the meter is empty.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{LeakyMeter, Limit, Limiter, ManualClock, Nanos};
    /// let meter = LeakyMeter::builder(4, Limit::per_second(2.0).unwrap()).clock(ManualClock::default()).build().unwrap();
    /// assert!(meter.check_n_at(Nanos::ZERO, 3).is_ok());
    /// let s = meter.quota_at(Nanos::new(500_000_000)).unwrap(); // 2 units of water left
    /// assert_eq!((s.quota, s.remaining), (4, 2));
    /// assert_eq!((s.window, s.reset), (Duration::from_secs(2), Duration::from_secs(1)));
    /// ```
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        self.bucket.quota_at(now)
    }

    /// Takes `n` units of water back out at `now`, never below empty: the token bucket
    /// underneath's refund (one CAS; always `true`), exact for the reason given there (water
    /// leaked since the grant is the same with or without it, as long as the meter did not
    /// run empty in between for a check made meanwhile).
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        self.bucket.refund_n_at(now, n)
    }
}

/// [`Limiter::refund_n_at`] gives a grant back (see there).
impl<C: Clock, P: Layout> crate::limiter::Refund for LeakyMeter<C, P> {}

/// Idle exactly when the bucket is empty of water at `now` (the token bucket underneath is
/// full; see its [`Idle`] impl): a fresh meter is then **identical** from `now` on.
///
/// ```
/// use turnstile::{Idle, LeakyMeter, Limit, ManualClock, Nanos};
/// let meter = LeakyMeter::builder(2, Limit::per_second(1.0).unwrap()).clock(ManualClock::default()).build().unwrap();
/// assert!(meter.is_idle_at(Nanos::ZERO));
/// assert!(meter.allow_at(Nanos::ZERO));
/// assert!(!meter.is_idle_at(Nanos::new(999_999_999)));
/// assert!(meter.is_idle_at(Nanos::new(1_000_000_000)));   // drained
/// ```
impl<C: Clock, P: Layout> Idle for LeakyMeter<C, P> {
    fn is_idle_at(&self, now: Nanos) -> bool {
        self.bucket.is_idle_at(now)
    }

    /// Empty of water at `b` and not before (the token bucket underneath is full at `b`; see
    /// its [`Idle::born_at`]): a reading `t < b` finds `(b - t) * leak` units of water in it.
    fn born_at(&mut self, b: Nanos) {
        self.bucket.born_at(b);
    }
}

/// Shows the capacity, the leak rate and the water level at the clock's reading.
///
/// ```
/// use turnstile::{LeakyMeter, Limit, ManualClock};
/// let meter = LeakyMeter::builder(3, Limit::per_second(1.0).unwrap()).clock(ManualClock::default()).build()
///     .unwrap();
/// assert!(meter.allow_n(2));
/// assert_eq!(format!("{meter:?}"), "LeakyMeter { capacity: 3, leak: 1/s, level: 2.0 }");
/// ```
impl<C: Clock, P: Layout> fmt::Debug for LeakyMeter<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The meter's own terms: the water now, not the token bucket it is built on.
        f.debug_struct("LeakyMeter")
            .field("capacity", &self.capacity)
            .field("leak", &self.leak_rate())
            .field("level", &self.level())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The compact layout changes where the words are, nothing else: both layouts answer a
    /// schedule of checks alike (more than the capacity under an infinite leak included).
    #[test]
    fn compact_and_padded_meters_agree() {
        for leak in [Limit::ZERO, Limit::per_second(10.0).unwrap(), Limit::INF] {
            let clock = crate::ManualClock::default();
            let padded = LeakyMeter::builder(3, leak)
                .clock(clock.clone())
                .build()
                .unwrap();
            let compact = LeakyMeter::builder(3, leak)
                .clock(clock)
                .build_compact()
                .unwrap();
            for (t, x) in crate::clock::random_readings(10_000, 60_000_000) {
                let n = (x >> 32) as u32 % 6;
                if x & 1 == 0 {
                    assert_eq!(padded.check_n_at(t, n), compact.check_n_at(t, n));
                } else {
                    assert_eq!(padded.allow_n_at(t, n), compact.allow_n_at(t, n));
                }
                assert_eq!(padded.level_at(t), compact.level_at(t));
            }
        }
    }

    /// In a keyed map's slot a compact meter's bucket starts 8 bytes into the slot's first
    /// line, where the token bucket's own layout keeps its state word and hot words in that
    /// line; the capacity, which a check of one unit never reads, comes after the bucket.
    #[cfg(feature = "keyed")]
    #[test]
    fn compact_meter_starts_with_its_bucket() {
        let leak = Limit::per_second(10.0).unwrap();
        let make = move || {
            LeakyMeter::builder(1, leak)
                .clock(crate::ManualClock::default())
                .build_compact()
                .unwrap()
        };
        // Size 0: where each begins.
        let [(_, bucket), (_, capacity)] = crate::keyed::word_ends_in_slot(make, |m| {
            [
                ("bucket", std::ptr::addr_of!(m.bucket).cast(), 0),
                ("capacity", std::ptr::addr_of!(m.capacity).cast(), 0),
            ]
        });
        assert_eq!(bucket, 8);
        assert!(
            capacity > bucket,
            "capacity at {capacity}, bucket at {bucket}"
        );
    }
}
