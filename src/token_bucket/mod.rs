//! A lock-free token bucket with the semantics of Go's `golang.org/x/time/rate`.
//!
//! A bucket of `burst` tokens refilling at `limit` tokens per second is held as GCRA's
//! *theoretical arrival time* in one 64-bit word, with the generation of its configuration:
//! a check is one load and, when it grants, one CAS; a denial writes nothing;
//! `set_limit`/`set_burst` are linearizable with every take, reservation and cancel (no
//! reservation is computed half under an old configuration). The word, the configuration
//! slots, the invariant and why each memory ordering is enough are in the engine's header
//! (`src/token_bucket/engine.rs`); reservations in `src/token_bucket/reservation.rs`.
//!
//! **Precision and range.** A unit is at most 1/16 ns above 7.5/s, so a clock reading is
//! rounded by less than 1/16 ns (not at all for whole-nanosecond intervals), and a token is
//! exactly `one` units, so the count of grants over any span is exact up to that rounding of
//! the span's two ends (`tests/token_bucket_precision.rs`: every limit from 1e-3/s to 1e8/s,
//! an hour of grants, within one of exact; 90 days across rebases). Tokens are kept to
//! `1/one` of a token (1/16 at 1e9/s, finer below). `x` has 57 bits; the hot path accepts
//! readings up to 2^56 units past the base (at least 2^50 ns, 13 days, at the highest limits;
//! 52 days at 1e8/s, years at low limits), and a reading past that **rebases**: a
//! reconfiguration with the same limit and burst at that reading (off the hot path, once per
//! weeks of uptime, or after a jump of the caller's times), so a process may run for ever.
//! Outstanding reservations may reach 2^57 units (D4 beyond that). Limits above `2^6` tokens
//! per ns (6.4e10/s) act as that limit; a burst that takes longer than 146 years to refill
//! never refills (acts as a zero limit).
//!
//! # Deviations from rate.go
//! * **D1** a [`Reservation`] (or [`OwnedReservation`]) is cancelled at most once
//!   ([`Reservation::cancel`] takes it by value).
//! * **D2** an earlier time never creates tokens: over any history, grants never exceed
//!   `burst + limit * (latest time - earliest time)` plus one request.
//! * **D3** [`Limit`] is validated: no NaN or negative limits.
//! * **D4** with a zero limit and too few tokens, a reservation is not OK and waits fail at
//!   once with [`WaitError::Never`]; the same holds for any reservation whose tokens would
//!   arrive past the state word's range (see *Precision and range*), where rate.go would wait.
//! * **D5** `n` is unsigned.
//! * **Cancel** restores the reserved tokens minus the tokens reserved after them, as rate.go
//!   does, but counts those later tokens exactly: each reservation keeps the unit at which it
//!   acts and the *token coordinate* of that instant (a count that every take raises by its
//!   tokens and that refill and `set_limit`/`set_burst` leave alone; see `Config::coord`),
//!   and a cancel measures the distance to the state's now. rate.go measures it as
//!   `r.limit * (lastEvent - timeToAct)` from times truncated to whole nanoseconds, so:
//!   - the two agree, to the token, for the latest reservation (at any limit) and for one
//!     whose later reservations were made under its own limit, before or after a
//!     `set_limit`, with no time spent under another limit in between (reproduced in
//!     `tests/token_bucket_semantics.rs`);
//!   - after an earlier cancel, rate.go's `lastEvent` still counts tokens that cancel gave
//!     back, so it restores less than later reservations left free (golang/go#56924,
//!     #69419); turnstile restores exactly that;
//!   - rate.go values reservations made under a *different* limit at the cancelled one's
//!     limit, and so also the refill of time spent under another limit before a later
//!     reservation (it moved that reservation's act time); turnstile counts their tokens;
//!   - turnstile never restores more than the reservation took, which rate.go does when
//!     `lastEvent` lies before the reservation's time (a zero-token reservation moves it
//!     there, or a raised limit lets a later take act earlier);
//!   - the two counts also part when a limit change or a burst cut sits between the
//!     reservation and its cancel *and* the bucket was full or cut in between: turnstile's
//!     count (tokens taken after it) ignores the cap; rate.go's (time between act times,
//!     at the reservation's limit) ignores it differently. Both stay within the burst;
//!   - a reservation made under an infinite limit took nothing and restores nothing, and
//!     one made before an infinite limit refilled the bucket restores nothing either (the
//!     refill already gave its tokens back; rate.go adds them on top).
//! * Precision: tokens are held to `1/one` of a token and times to a unit (above); rate.go holds
//!   tokens as `f64` and times in whole nanoseconds, so the two may part by a hair at a
//!   boundary (counted as `Borderline` by the differential tests).
//! * A reconfiguration that would carry more outstanding debt than the word's range (weeks of
//!   reservations, re-expressed at a much lower limit) keeps only the range's worth.

mod config;
mod engine;
mod reservation;

pub use reservation::{OwnedReservation, Peek, Reservation};

use std::fmt;
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::deadline::Deadline;
use crate::error::WaitError;
use crate::layout::{Compact, Layout, Padded};
use crate::limit::Limit;
use crate::limiter::{Denied, Idle, Limiter, QuotaStatus};
use crate::sync::{Mutex, Ordering}; // Mutex: reconfiguration only, never the hot path
use engine::*;
/// A lock-free token bucket: `limit` tokens per second, at most `burst` at once, with the API
/// and semantics of Go's `rate.Limiter` (deviations in the [module docs](self)).
///
/// The bucket starts full. `allow` takes tokens now or not at all; `reserve` always takes
/// them (when the request can ever be met) and says how long to wait; `wait_n_blocking` and
/// `wait_n` (feature `tokio`) sleep until then, or fail at once if that would pass their
/// [`Deadline`] (a timeout, an instant, or none). A [`Reservation`] borrows the bucket; for a
/// bucket in an `Arc`, [`OwnedReservation::reserve_n`] makes one that can move into another
/// task.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
///
/// let clock = ManualClock::new(Nanos::ZERO);
/// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 2).clock(clock.clone()).build();
/// assert!(tb.allow_n(2));          // the initial burst
/// assert!(!tb.allow());            // empty
/// let r = tb.reserve();            // pay now, act later
/// assert_eq!(r.delay(), Duration::from_millis(100));
/// r.cancel();                      // changed our mind: the token comes back
/// clock.advance(Duration::from_millis(100));
/// assert!(tb.allow());
/// ```
#[repr(C)] // the core first: in a keyed map's slot it then starts 8 bytes into a line
pub struct TokenBucket<C: Clock = QuantaClock, P: Layout = Padded> {
    /// The state word and both configurations, cache-padded unless `P` is [`Compact`] (for
    /// the many buckets of a keyed map).
    core: P::Cell<Core>,
    /// Each configuration's cold words, apart from the hot ones.
    colds: [ColdSlot; 2],
    /// Serializes `set_limit`/`set_burst` only; `allow`, `reserve` and `cancel` never take it.
    reconfig: Mutex<()>, // off the hot path: serializes reconfigurations only
    clock: C,
}

impl TokenBucket<QuantaClock> {
    /// A full bucket of `burst` tokens refilling at `limit`, on the shared quanta clock.
    ///
    /// ```
    /// use turnstile::{Limit, TokenBucket};
    /// let tb = TokenBucket::new(Limit::per_second(5.0).unwrap(), 3);
    /// assert_eq!(tb.burst(), 3);
    /// ```
    pub fn new(limit: Limit, burst: u32) -> Self {
        Self::in_layout(limit, burst, QuantaClock::new())
    }

    /// A builder for a full bucket of `burst` tokens refilling at `limit`, as every limiter
    /// has one: [`TokenBucketBuilder::clock`], then [`build`](TokenBucketBuilder::build) or
    /// [`build_compact`](TokenBucketBuilder::build_compact).
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(5.0).unwrap(), 3)
    ///     .clock(ManualClock::default())
    ///     .build();
    /// assert!(tb.allow_n_at(Nanos::ZERO, 3));
    /// assert!(!tb.allow_at(Nanos::ZERO));
    /// ```
    pub fn builder(limit: Limit, burst: u32) -> TokenBucketBuilder {
        TokenBucketBuilder {
            limit,
            burst,
            clock: QuantaClock::new(),
        }
    }
}

/// Options for a [`TokenBucket`]. Its configuration is already validated ([`Limit`]), so
/// building cannot fail.
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug, Clone)]
pub struct TokenBucketBuilder<C: Clock = QuantaClock> {
    limit: Limit,
    burst: u32,
    clock: C,
}

impl<C: Clock> TokenBucketBuilder<C> {
    /// Reads time from `clock` (default: the shared quanta clock).
    ///
    /// ```
    /// use turnstile::{Clock, Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::INF, 1)
    ///     .clock(ManualClock::new(Nanos::new(9)))
    ///     .build();
    /// assert_eq!(tb.clock().now(), Nanos::new(9));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> TokenBucketBuilder<D> {
        TokenBucketBuilder {
            limit: self.limit,
            burst: self.burst,
            clock,
        }
    }

    /// The bucket, cache-padded: for one limiter every thread checks.
    ///
    /// ```
    /// use turnstile::{Limit, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 2).build();
    /// assert_eq!(tb.burst(), 2);
    /// ```
    pub fn build(self) -> TokenBucket<C> {
        TokenBucket::in_layout(self.limit, self.burst, self.clock)
    }

    /// The bucket in the [`Compact`] layout: the state word unpadded, next to the
    /// configuration, for the many buckets of a [`Keyed`](crate::Keyed) map (about a third of
    /// the bytes per key). Same behaviour.
    ///
    /// ```
    /// use turnstile::{Limit, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 2).build_compact();
    /// assert!(tb.allow_n(2));
    /// ```
    pub fn build_compact(self) -> TokenBucket<C, Compact> {
        TokenBucket::in_layout(self.limit, self.burst, self.clock)
    }

    /// The options, for the mutex twin's `From`.
    #[cfg(feature = "reference")]
    pub(crate) fn into_parts(self) -> (Limit, u32, C) {
        (self.limit, self.burst, self.clock)
    }
}

impl<C: Clock> From<TokenBucketBuilder<C>> for TokenBucket<C> {
    /// [`TokenBucketBuilder::build`].
    fn from(options: TokenBucketBuilder<C>) -> TokenBucket<C> {
        options.build()
    }
}

impl<C: Clock, P: Layout> TokenBucket<C, P> {
    /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The current limit.
    pub fn limit(&self) -> Limit {
        Limit::from_valid(self.snapshot().1.limit)
    }

    /// The current burst.
    pub fn burst(&self) -> u32 {
        self.snapshot().1.burst()
    }

    /// Tokens in the bucket now; negative while reservations are outstanding.
    pub fn tokens(&self) -> f64 {
        self.tokens_at(self.clock.now())
    }

    /// Tokens in the bucket at `now` (rate.go's `TokensAt`); nothing changes.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 5).clock(ManualClock::default()).build();
    /// assert!(tb.allow_n_at(Nanos::ZERO, 5));
    /// assert_eq!(tb.tokens_at(Nanos::new(200_000_000)), 2.0);
    /// ```
    pub fn tokens_at(&self, now: Nanos) -> f64 {
        let (word, cfg) = self.snapshot();
        cfg.tokens(x_of(word), now)
    }

    /// Takes one token now if there is one.
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow(&self) -> bool {
        self.allow_n_at(self.clock.now(), 1)
    }

    /// [`TokenBucket::allow`] at `now`.
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_at(&self, now: Nanos) -> bool {
        self.allow_n_at(now, 1)
    }

    /// Takes `n` tokens now if there are `n`.
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n(&self, n: u32) -> bool {
        self.allow_n_at(self.clock.now(), n)
    }

    /// Takes `n` tokens at `now` if there are `n`; otherwise changes nothing (and writes
    /// nothing).
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 3).clock(ManualClock::default()).build();
    /// assert!(tb.allow_n_at(Nanos::ZERO, 3));
    /// assert!(!tb.allow_n_at(Nanos::ZERO, 1));
    /// assert!(tb.allow_n_at(Nanos::new(1_000_000_000), 1));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n_at(&self, now: Nanos, n: u32) -> bool {
        self.take_then::<ALLOW, _>(now, n, 0, |d| matches!(d, Decision::Granted { .. }))
    }

    /// Reserves one token; see [`TokenBucket::reserve_n_at`].
    pub fn reserve(&self) -> Reservation<'_, C, P> {
        self.reserve_n_at(self.clock.now(), 1)
    }

    /// [`TokenBucket::reserve`] at `now`.
    pub fn reserve_at(&self, now: Nanos) -> Reservation<'_, C, P> {
        self.reserve_n_at(now, 1)
    }

    /// Reserves `n` tokens; see [`TokenBucket::reserve_n_at`].
    pub fn reserve_n(&self, n: u32) -> Reservation<'_, C, P> {
        self.reserve_n_at(self.clock.now(), n)
    }

    /// Reserves `n` tokens at `now`, however long they take to arrive. The reservation is not
    /// OK if `n` exceeds the burst or the tokens never arrive (deviation D4); otherwise the
    /// tokens are taken and [`Reservation::delay_from`] says how long to wait before acting.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(2.0).unwrap(), 1).clock(ManualClock::default()).build();
    /// let first = tb.reserve_n_at(Nanos::ZERO, 1);
    /// let second = tb.reserve_n_at(Nanos::ZERO, 1);
    /// assert_eq!(first.delay_from(Nanos::ZERO), Duration::ZERO);
    /// assert_eq!(second.delay_from(Nanos::ZERO), Duration::from_millis(500));
    /// assert!(!tb.reserve_n_at(Nanos::ZERO, 2).ok()); // more than the burst
    /// ```
    pub fn reserve_n_at(&self, now: Nanos, n: u32) -> Reservation<'_, C, P> {
        self.reserve_within(now, n, u64::MAX)
    }

    /// Reserves `n` tokens only if they arrive within `max_wait`; see
    /// [`TokenBucket::try_reserve_n_at`].
    pub fn try_reserve_n(&self, n: u32, max_wait: Duration) -> Reservation<'_, C, P> {
        self.try_reserve_n_at(self.clock.now(), n, max_wait)
    }

    /// Reserves `n` tokens at `now` only if they arrive within `max_wait`; otherwise the
    /// reservation is not OK and nothing changes (Guava's `tryAcquire(n, timeout)` as a
    /// reservation). This is what the waits use with their deadline, and `allow` is this
    /// with a zero wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let limit = Limit::per_second(1.0).unwrap();
    /// let tb = TokenBucket::builder(limit, 1).clock(ManualClock::default()).build();
    /// assert!(tb.allow_at(Nanos::ZERO));
    /// assert!(!tb.try_reserve_n_at(Nanos::ZERO, 1, Duration::from_millis(999)).ok());
    /// assert!(tb.try_reserve_n_at(Nanos::ZERO, 1, Duration::from_secs(1)).ok());
    /// ```
    pub fn try_reserve_n_at(
        &self,
        now: Nanos,
        n: u32,
        max_wait: Duration,
    ) -> Reservation<'_, C, P> {
        self.reserve_within(now, n, Nanos::from_duration(max_wait).as_u64())
    }

    /// What `n` tokens would cost now; see [`TokenBucket::peek_n_at`].
    pub fn peek_n(&self, n: u32) -> Peek {
        self.peek_n_at(self.clock.now(), n)
    }

    /// Reports the tokens at `now` and the earliest time `n` tokens will be available (if
    /// nobody else takes any), without taking anything.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 4).clock(ManualClock::default()).build();
    /// assert!(tb.allow_n_at(Nanos::ZERO, 4));
    /// let p = tb.peek_n_at(Nanos::ZERO, 2);
    /// assert_eq!(p.tokens, 0.0);
    /// assert_eq!(p.available_at, Some(Nanos::new(200_000_000)));
    /// assert_eq!(tb.peek_n_at(Nanos::ZERO, 5).available_at, None); // > burst: never
    /// ```
    pub fn peek_n_at(&self, now: Nanos, n: u32) -> Peek {
        let (word, cfg) = self.snapshot();
        let tokens = cfg.tokens(x_of(word), now);
        let available_at = cfg.available_at(x_of(word), now, n);
        Peek {
            tokens,
            available_at,
        }
    }

    /// Changes the limit now; see [`TokenBucket::set_limit_at`].
    pub fn set_limit(&self, limit: Limit) {
        self.set_limit_at(self.clock.now(), limit)
    }

    /// Changes the limit at `now`: the tokens accrued up to `now` under the old limit are
    /// kept, and refill continues at the new one. Outstanding reservations keep their times.
    /// Linearizable with concurrent reservations and cancels.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 10).clock(ManualClock::default()).build();
    /// assert!(tb.allow_n_at(Nanos::ZERO, 10));
    /// tb.set_limit_at(Nanos::ZERO, Limit::per_second(100.0).unwrap());
    /// assert_eq!(tb.tokens_at(Nanos::new(50_000_000)), 5.0);
    /// ```
    pub fn set_limit_at(&self, now: Nanos, limit: Limit) {
        self.reconfigure(now, None, |cfg| (limit, cfg.burst()))
    }

    /// Changes the burst now; see [`TokenBucket::set_burst_at`].
    pub fn set_burst(&self, burst: u32) {
        self.set_burst_at(self.clock.now(), burst)
    }

    /// Changes the burst at `now`. Tokens above a smaller burst are clamped on the next read,
    /// as in rate.go. Linearizable with concurrent reservations and cancels.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 5).clock(ManualClock::default()).build();
    /// tb.set_burst_at(Nanos::ZERO, 2);
    /// assert_eq!(tb.tokens_at(Nanos::ZERO), 2.0);
    /// ```
    pub fn set_burst_at(&self, now: Nanos, burst: u32) {
        self.reconfigure(now, None, |cfg| (Limit::from_valid(cfg.limit), burst))
    }

    /// Waits until `n` tokens are available and takes them, sleeping the thread; fails at
    /// once if that would pass `deadline`: a [`Duration`] (a timeout from the start of this
    /// wait), a [`std::time::Instant`], `None` (no deadline), or any [`Deadline`] (such as
    /// [`Deadline::at`] a reading of this limiter's clock). The checks run in rate.go's
    /// order: more than the burst ([`WaitError::ExceedsBurst`]), deadline already passed
    /// ([`WaitError::DeadlinePassed`]), tokens that never arrive ([`WaitError::Never`],
    /// deviation D4), tokens that arrive after the deadline
    /// ([`WaitError::WouldExceedDeadline`]). A failed wait takes nothing. With no wait needed
    /// it returns without sleeping.
    ///
    /// The sleep is [`crate::clock::sleep_until`] on the limiter's clock: a thread sleep, then
    /// a spin of at most 80 µs for a precise wake-up.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, TokenBucket, WaitError};
    /// let tb = TokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// tb.wait_n_blocking(1, None).unwrap();          // immediate: the bucket starts full
    /// assert_eq!(
    ///     tb.wait_n_blocking(2, None),
    ///     Err(WaitError::ExceedsBurst { n: 2, burst: 1 })
    /// );
    /// // The next token is a second away: more than a 10 ms timeout.
    /// assert_eq!(
    ///     tb.wait_n_blocking(1, Duration::from_millis(10)),
    ///     Err(WaitError::WouldExceedDeadline { n: 1 })
    /// );
    /// ```
    pub fn wait_n_blocking(&self, n: u32, deadline: impl Into<Deadline>) -> Result<(), WaitError> {
        let now = self.clock.now();
        let r = self.reserve_for_wait(now, n, deadline.into().resolve(now))?;
        if let Some(t) = r.time_to_act() {
            crate::clock::sleep_until(&self.clock, t);
        }
        Ok(())
    }

    /// Waits (asynchronously, on tokio's timer) until `n` tokens are available and takes
    /// them; the deadline, checks and errors are those of [`TokenBucket::wait_n_blocking`],
    /// and the wait starts (its timeout counts, an instant is converted) when the future is
    /// first polled. A `tokio::time::Instant` is a deadline too, measured on tokio's clock.
    /// Dropping the future before it completes cancels its reservation, as rate.go does when
    /// the context is cancelled.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use turnstile::{Limit, TokenBucket, WaitError};
    /// let tb = TokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// tb.wait_n(1, None).await.unwrap();
    /// let soon = tokio::time::Instant::now() + Duration::from_millis(10);
    /// assert_eq!(tb.wait_n(1, soon).await, Err(WaitError::WouldExceedDeadline { n: 1 }));
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn wait_n(&self, n: u32, deadline: impl Into<Deadline>) -> Result<(), WaitError> {
        let now = self.clock.now();
        let r = self.reserve_for_wait(now, n, deadline.into().resolve(now))?;
        let delay = r.delay_from(now);
        if delay.is_zero() {
            return Ok(());
        }
        // Dropped with the future while the sleep is pending: cancels the reservation.
        struct CancelOnDrop<'a, C: Clock, P: Layout>(Option<Reservation<'a, C, P>>);
        impl<C: Clock, P: Layout> Drop for CancelOnDrop<'_, C, P> {
            fn drop(&mut self) {
                if let Some(r) = self.0.take() {
                    r.cancel();
                }
            }
        }
        let mut guard = CancelOnDrop(Some(r));
        tokio::time::sleep(delay).await;
        guard.0 = None; // completed: keep the tokens
        Ok(())
    }
}

impl<C: Clock, P: Layout> TokenBucket<C, P> {
    /// A check of `n` at `now` in mode `CHECK` or `CHECK_NOW` (engine.rs), answered as
    /// [`Limiter::check_n_at`] answers.
    #[inline(always)]
    fn check_in<const MODE: u8>(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.take_then::<MODE, _>(now, n, 0, |d| match d {
            Decision::Granted { .. } => Ok(()),
            Decision::Denied { retry_at, .. } => Err(Denied::new(now, retry_at)),
        })
    }
}

impl<C: Clock, P: Layout> Limiter for TokenBucket<C, P> {
    #[inline]
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.check_in::<CHECK>(now, n)
    }

    /// The same decision as [`Limiter::check_n_at`] at the clock's reading, ordered for a
    /// reading that arrives late: the refusal's retry time is computed while the clock is
    /// read.
    #[inline]
    fn check_n(&self, n: u32) -> Result<(), Denied> {
        self.check_in::<CHECK_NOW>(self.clock.now(), n)
    }

    /// x/time/rate's `ReserveN` with a deadline: the tokens are taken at once (the bucket
    /// goes into debt) and may be used from the returned instant, at most `max_wait` on;
    /// [`Limiter::refund_n_at`] gives them back. A refusal's retry time is when the same call
    /// would succeed: when the wait is down to `max_wait`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, Limiter, ManualClock, Nanos, TokenBucket};
    ///
    /// let tb = TokenBucket::builder(Limit::per_second(2.0).unwrap(), 1).clock(ManualClock::default()).build();
    /// let wait = Duration::from_secs(1);
    /// assert_eq!(tb.schedule_n_at(Nanos::ZERO, 1, wait), Ok(Nanos::ZERO));
    /// assert_eq!(tb.schedule_n_at(Nanos::ZERO, 1, wait), Ok(Nanos::new(500_000_000)));
    /// assert_eq!(tb.schedule_n_at(Nanos::ZERO, 1, wait), Ok(Nanos::new(1_000_000_000)));
    /// // The next would be due 1.5 s on, past the 1 s allowed: refused, and the same call
    /// // succeeds once its wait is down to 1 s, in 0.5 s.
    /// let denied = tb.schedule_n_at(Nanos::ZERO, 1, wait).unwrap_err();
    /// assert_eq!(denied.retry_after(), Some(Duration::from_millis(500)));
    /// ```
    fn schedule_n_at(&self, now: Nanos, n: u32, max_wait: Duration) -> Result<Nanos, Denied> {
        let max_wait = Nanos::from_duration(max_wait).as_u64();
        match self.take::<RESERVE>(now, n, max_wait) {
            Decision::Granted { x, due, took, cfg } => {
                Ok(Self::granted(now, n, x, due, took, &cfg).time_to_act)
            }
            Decision::Denied { retry_at, .. } => Err(Denied::new(now, retry_at)),
        }
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The bucket's own state at `now`, exactly (counted in units, no float):
    ///
    /// * `q` (quota) = the burst;
    /// * `w` (window) = the time to refill from empty, `burst / limit`, rounded **up** to the
    ///   nanosecond;
    /// * `r` (remaining) = the whole tokens at `now`, `floor(min(burst, tokens))`, and 0 while
    ///   the bucket is in debt (reservations outstanding): a check of `n <= r` passes now;
    /// * `t` (reset) = until the bucket is full again if nothing more is taken, `(burst -
    ///   tokens) / limit` rounded **up** to the nanosecond (the first nanosecond at which it
    ///   is full: a client that waits `t` finds `r = q`); 0 when full.
    ///
    /// Under [`Limit::INF`] every check passes and nothing is counted: `r = q = burst`,
    /// `w = t = 0`. Under [`Limit::ZERO`] (or a limit so low that the burst would take more
    /// than 146 years to refill, which acts as zero) nothing ever refills: `w =
    /// Duration::MAX`, and `t` is 0 while the bucket is still full, else `Duration::MAX` (it
    /// is never whole again; [`QuotaStatus::reset_secs`] saturates). The same when the time
    /// it would be full lies past the end of [`Nanos`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, Limiter, ManualClock, Nanos, QuotaStatus, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(4.0).unwrap(), 2).clock(ManualClock::default()).build();
    /// assert!(tb.check_n_at(Nanos::ZERO, 2).is_ok());
    /// let q = tb.quota_at(Nanos::new(300_000_000)).unwrap(); // 1.2 tokens
    /// assert_eq!(q, QuotaStatus {
    ///     quota: 2,
    ///     window: Duration::from_millis(500),
    ///     remaining: 1,
    ///     reset: Duration::from_millis(200),
    /// });
    /// ```
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        let (word, cfg) = self.snapshot();
        Some(cfg.quota(x_of(word), now))
    }

    /// Gives `n` tokens back at `now`: `tokens = min(burst, tokens(now) + n)`, one CAS on
    /// the state word (`x' = max(x - n * one, u(now) - tau)`; see *Refunds* below). Always
    /// `true`. `now` may be the reading of the grant or any later one.
    ///
    /// **Why it is exact.** Let the grant take `n` at `t0` from `T0` tokens and the refund
    /// come at `t1`, `dt = t1 - t0`. Without the grant the bucket would hold
    /// `min(b, T0 + limit * dt)`; with it and the refund it holds
    /// `min(b, min(b, T0 - n + limit * dt) + n)`, which is the same number (if the inner
    /// `min` takes `b`, then `T0 + limit * dt >= b + n` and both are `b`). So the tokens,
    /// the only state, are those of a history without the grant, and every later decision
    /// is the one that history makes. This holds whatever happened in between that did not
    /// **take** tokens (denials, refunds, reconfigurations, which carry the tokens over).
    ///
    /// **The one limit of that exactness.** A take by someone else between the grant and
    /// the refund is judged on `n` fewer tokens; if, without the grant, that take would have
    /// found the bucket *full* (so that refill since `t0` would have been lost to the cap),
    /// the refund gives back up to that lost refill (never more than `n`) beyond the history
    /// without the grant. That needs the clock to move between grant and refund while the
    /// bucket was within `n` of full; with the refund at the grant's own reading and every
    /// take in between at no later reading (a frozen clock, or one thread), it cannot happen.
    /// What always holds: **net grants** (grants minus refunds) over any span of readings
    /// stay within `burst + limit * span` (deviation D2's bound): a take raises `x` by at
    /// least its cost and a refund lowers it by at most its `n`, and a grant needs `x <=
    /// u(now)`.
    ///
    /// Under [`Limit::INF`] a check takes nothing, so the refund does nothing (as rate.go's
    /// `CancelAt`). Never more than the burst: a refund into a full bucket does nothing. Like
    /// every refund, it assumes the `n` tokens were taken (the trait's contract); a grant made
    /// under an infinite limit took nothing, so refunding it after a `set_limit` to a finite
    /// one gives `n` tokens that were never taken.
    ///
    /// ```
    /// use turnstile::{Limit, Limiter, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 3).clock(ManualClock::default()).build();
    /// let before = tb.quota_at(Nanos::ZERO);
    /// assert!(tb.check_n_at(Nanos::ZERO, 2).is_ok());
    /// assert!(tb.refund_n_at(Nanos::ZERO, 2)); // a second limit refused the request
    /// assert_eq!(tb.quota_at(Nanos::ZERO), before);
    /// assert!(tb.refund_n_at(Nanos::ZERO, 1));  // a refund never fills past the burst
    /// assert_eq!(tb.tokens_at(Nanos::ZERO), 3.0);
    /// ```
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        self.refund(now, n);
        true
    }
}

/// [`Limiter::refund_n_at`] gives a grant back (see there).
impl<C: Clock, P: Layout> crate::limiter::Refund for TokenBucket<C, P> {}

/// Idle exactly when the bucket is full at `now`: its tokens at `now` equal its burst, which
/// is what a fresh bucket holds, so the two are **identical** from `now` on (a full bucket
/// has no outstanding reservation holding tokens, and a cancel can never fill it past full).
///
/// * Finite limit: full means `x <= u(now) - tau`, compared in units (exact, no float).
/// * Zero limit: the stored tokens equal the burst (it never refills, so a bucket that ever
///   granted a token is never idle again: a fresh one would have its burst back).
/// * Infinite limit: every request is granted either way; the bucket is idle when its tokens
///   at `now` equal the burst, as a fresh infinite bucket's always do. After a switch to
///   `Limit::INF` at time `s` that is every `now > s` (rate.go's `advance` fills the bucket
///   once any time has passed); at `now <= s` the stored tokens must equal the burst, so the
///   tokens a later `set_limit` back to a finite limit would keep are a fresh bucket's.
///
/// The comparison is with a fresh bucket of the **current** configuration: a bucket whose
/// limit or burst was changed with [`TokenBucket::set_limit`] or [`TokenBucket::set_burst`]
/// is idle when full of its current burst. A keyed map rebuilds an evicted bucket from its
/// factory, so a per-key `set_limit`/`set_burst` does not survive eviction.
/// Nothing is written.
///
/// ```
/// use turnstile::{Idle, Limit, ManualClock, Nanos, TokenBucket};
/// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 2).clock(ManualClock::default()).build();
/// assert!(tb.is_idle_at(Nanos::ZERO));                  // new: full
/// assert!(tb.allow_at(Nanos::ZERO));
/// assert!(!tb.is_idle_at(Nanos::new(99_999_999)));      // one token short of full
/// assert!(tb.is_idle_at(Nanos::new(100_000_000)));      // refilled
/// ```
impl<C: Clock, P: Layout> Idle for TokenBucket<C, P> {
    fn is_idle_at(&self, now: Nanos) -> bool {
        let (word, cfg) = self.snapshot();
        cfg.is_full(x_of(word), now)
    }

    /// Full at `b` and not before: the bucket is rebuilt with its configuration based at `b`
    /// and a full burst there, so a reading `t < b` finds `(b - t) * limit` tokens fewer than
    /// the burst (none at all before `b - tau`). A bucket idle at `j <= b` has
    /// `tat <= j - tau <= b - tau`: this `tat` is at least its, which is all the budget proof
    /// (`grants in [x, y] <= burst + limit * (y - x)` plus one request) needs, as `tat` then
    /// never decreases over the key's whole history. Under a zero or infinite limit the
    /// stored tokens do not depend on time: the bucket stays as built (full).
    fn born_at(&mut self, b: Nanos) {
        let (_, cfg) = self.snapshot();
        let burst = cfg.burst();
        self.reconfigure(b, Some(f64::from(burst)), |cfg| {
            (Limit::from_valid(cfg.limit), cfg.burst())
        });
        // A keyed map's checks read parity 0's slot from the line that holds the map's slot
        // state and this state word (`Core`); the reconfiguration installed the other one.
        // Nothing can read this bucket (`&mut self`), so the configuration moves back, one
        // generation on, with the same words and the same `x`.
        let word = self.core.state.load(Ordering::Relaxed);
        if (word >> PARITY_SHIFT) & 1 == 1 {
            let cfg = self.slot(word).config();
            let generation = gen_after(gen_of(word));
            self.slot(generation << GEN_SHIFT).write(&cfg);
            self.core
                .state
                .store((generation << GEN_SHIFT) | x_of(word), Ordering::Relaxed);
        }
    }
}

impl<C: Clock, P: Layout> fmt::Debug for TokenBucket<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (word, cfg) = self.snapshot();
        f.debug_struct("TokenBucket")
            .field("limit", &Limit::from_valid(cfg.limit))
            .field("burst", &cfg.burst())
            .field("tokens", &cfg.tokens(x_of(word), self.clock.now()))
            .finish()
    }
}
