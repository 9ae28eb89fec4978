//! A lock-free leaky bucket with the semantics of uber-go's `ratelimit` (v0.3.1, the default
//! int64 limiter of `limiter_atomic_int64.go`): permits spaced `per / rate` apart, with up to
//! `slack` permits of credit banked while idle.
//!
//! # The protocol
//!
//! **Representation.** The whole limiter is one number, `next`: the time of the next
//! permission issue (upstream's `state`, in nanoseconds on the limiter's clock). With
//! `T = per / rate` (upstream's `perRequest`, truncated to whole nanoseconds) and
//! `M = slack * T` (`maxSlack`), one take at `now` from `prev` computes, exactly as upstream:
//!
//! ```text
//! first take ever                   -> next = now
//! now - prev > M + T                -> next = now - M        (M = 0: upstream's no-slack branch)
//! otherwise                         -> next = prev + T
//! permit time = max(next, now)
//! ```
//!
//! Upstream writes the no-slack case separately (`maxSlack == 0 && now-prev > perRequest ->
//! next = now`); with `M = 0` it is the same formula, and it is also what upstream does when
//! `T` truncates to 0 (`maxSlack = slack * 0 = 0`).
//!
//! **The state word** (`state`, one `AtomicU64`):
//! ```text
//!  63                                                   0
//! +------------------------------------------------------+
//! | next: nanoseconds on the limiter's clock (< u64::MAX) |
//! +------------------------------------------------------+
//!   u64::MAX = UNSET: no permit issued yet
//! ```
//! Upstream marks "no permit yet" with `0`, which is safe for Unix nanoseconds but not here:
//! [`Nanos::ZERO`] is a real reading ([`crate::ManualClock::default`], the first reading of
//! the quanta clock). The sentinel is therefore `u64::MAX`, i.e. [`Nanos::MAX`], which is not
//! a time anything can be granted at: [`Nanos::MAX`] means "never". A take at `Nanos::MAX`,
//! or one whose `next` would be `u64::MAX` or beyond (~584 years after the clock's origin),
//! is refused: [`LeakyBucket::take_at`] returns [`Nanos::MAX`] and nothing is consumed, a
//! check is denied for good. So every stored `next` is `< u64::MAX`, and a first take at
//! time 0 stores 0 like any other time.
//!
//! **Packing.** The word sits first in a 40-byte core with the words a take or a check reads
//! (`T`, `M`, `M + T`, the slack for a refusal's retry time, the unlimited flag), all of them
//! immutable; the core is the bucket's first field. It is cache-padded by default (a bucket
//! shared by many threads: the word's line holds nothing else that changes) and unpadded in
//! the [`Compact`] layout ([`LeakyBucketBuilder::build_compact`], for the many buckets of a keyed map),
//! where a slot's state and the core share one cache line. The rate, the period and the clock
//! follow; a check at a given time reads none of them.
//!
//! **Invariant.** Every committed `next` is (a) at least `T` above the `next` it replaced
//! (except the very first, which replaces `UNSET`), and (b) at least `now - M` for the `now`
//! of the take that committed it. Each branch shows it: `now - M > prev + T` in the cap branch,
//! `prev + T` otherwise, and the default branch runs only when `now - prev <= M + T`, i.e.
//! `prev + T >= now - M`. Neither (a) nor (b) depends on the order of the clock readings. So a
//! permit time `p = max(next, now)` lies in `[next, next + M]`, and the permits with times in
//! any span `[a, a + d]` have their `next`s in `[a - M, a + d]`, spaced at least `T` apart:
//!
//! > **bound:** at most `slack + 1 + d / T` permits in any span `d`, whatever the
//! > interleaving of threads and clock readings, including a clock that goes backwards.
//!
//! This is upstream's own arithmetic: its int64 limiter has the same property; the point here
//! is that the lock-free form keeps it. A take reading an earlier time than the last one
//! simply lands in the default branch (`prev + T`).
//!
//! **The CAS loop.** A take loads the word, computes `next` with its own `now`, and commits
//! with one `compare_exchange_weak`; a failed CAS retries from the value it returned (with a
//! [`Backoff`]), keeping its `now`. (Upstream re-reads the clock on every retry; the `_at`
//! forms take the caller's time, and the bound above holds for any `now`.) A check of `n`
//! permits is `n` consecutive takes at one `now`, committed as one CAS: after the first take
//! `next >= now - M`, so the other `n - 1` are all in the default branch and the last `next` is
//! `first + (n - 1) * T`; the check grants only if that is `<= now`. A denial, a zero-permit
//! check and a take that leaves `next` unchanged (`T = 0`) write nothing; they linearize at
//! the load.
//!
//! **Orderings.** Every access is `Relaxed`. The word publishes no other memory: the
//! configuration is immutable and reaches other threads with the limiter itself (whatever
//! shares the limiter, an `Arc`, a scoped spawn, gives the happens-before). What the protocol
//! needs is single-location coherence, which every ordering provides: a CAS succeeds only
//! against the latest value in the word's modification order, so the committed `next`s form
//! the sequential chain the invariant speaks of; a stale load only makes the CAS fail (and the
//! retry starts from the current value); and a load returns at least the value of any write
//! that happens-before it, so a caller that synchronized with a grant sees that grant.
//! Because `next` only grows, a denial decided on a stale value would be a denial on the
//! current one too (a stale `UNSET` can only deny a check of `n >= 2`, which is then
//! concurrent with the first take).
//!
//! # Deviations from uber-go/ratelimit
//! * **D6** a rate of 0 and a `per` of 0 are [`ConfigError`]s (upstream divides by zero or
//!   never limits); slack is a `u32`, so negative slack cannot be expressed.
//! * **D7** besides the blocking [`LeakyBucket::take`]: [`LeakyBucket::take_at`] returns the
//!   permit time without sleeping, [`LeakyBucket::try_take`] takes a permit only if no wait is
//!   needed (and writes nothing otherwise), `LeakyBucket::take_async` (feature `tokio`)
//!   sleeps on tokio's timer, and the [`Limiter`] check takes `n` permits at once.
//! * The "no permit yet" sentinel is [`Nanos::MAX`], not 0 (see above), and the end of
//!   representable time is refused instead of overflowing. A `per / rate` above `u64::MAX`
//!   nanoseconds (only reachable with a `per` longer than ~584 years) acts as `u64::MAX`.
//! * Dropping a `LeakyBucket::take_async` future after its first poll does not give the
//!   permit back. The crate convention is that dropping an async wait cancels its reservation;
//!   here the state is a single `next` that later takes build on, so a permit cannot be
//!   returned without moving theirs, and upstream's `Take` has no cancel either.
//! * [`LeakyBucket::unlimited`] is upstream's `NewUnlimited`: same type (so a configuration
//!   can switch limiting off without changing types); every take returns `now` at once and
//!   touches no state.

use std::fmt;
use std::time::Duration;

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::layout::{Compact, Layout, Padded};
use crate::limiter::{Denied, Idle, Limiter};
use crate::sync::{AtomicU64, Ordering};

/// `next` before the first permit: [`Nanos::MAX`], never a grantable time.
const UNSET: u64 = u64::MAX;

/// The default `per`: one second (upstream's default).
pub(crate) const DEFAULT_PER: Duration = Duration::from_secs(1);

/// The default slack: 10 permits (upstream's default).
pub(crate) const DEFAULT_SLACK: u32 = 10;

/// A lock-free leaky bucket: `rate` permits per `per` (one second by default), spaced
/// `per / rate` apart, with up to `slack` permits (10 by default) of credit banked while idle,
/// the semantics of uber-go's `ratelimit` (deviations in the [module docs](self)).
///
/// The first take is immediate; after an idle stretch `slack + 1` takes are immediate, then
/// they are spaced `per / rate` apart. [`LeakyBucket::take`] sleeps until its permit;
/// [`LeakyBucket::take_at`] reports the permit time without sleeping;
/// [`LeakyBucket::try_take`] takes a permit only if it needs no wait.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{LeakyBucket, ManualClock, Nanos};
///
/// let lb = LeakyBucket::builder(10)                 // 10 per second: 100 ms apart
///     .slack(2)
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t0 = Nanos::new(1_000_000_000);
/// assert_eq!(lb.take_at(t0), t0);                   // the first take is immediate
/// assert_eq!(lb.take_at(t0), t0 + Duration::from_millis(100));
/// assert!(!lb.try_take_at(t0));                     // would have to wait
///
/// // After idling, slack + 1 = 3 takes are immediate, then 100 ms spacing again.
/// let t1 = t0 + Duration::from_secs(5);
/// for _ in 0..3 {
///     assert_eq!(lb.take_at(t1), t1);
/// }
/// assert_eq!(lb.take_at(t1), t1 + Duration::from_millis(100));
/// ```
#[repr(C)] // the core first: in a keyed map's slot it then starts 8 bytes into a line
pub struct LeakyBucket<C: Clock = QuantaClock, P: Layout = Padded> {
    /// The state word and everything a check reads; cache-padded unless `P` is [`Compact`]
    /// (for the many buckets of a keyed map).
    core: P::Cell<Core>,
    rate: u32,
    per: Duration,
    clock: C,
}

/// What a take or a check reads, together: the state word, then the immutable words that
/// decide it (a refusal's retry time included). 40 bytes: one cache line when the core starts
/// a line or, in a keyed map's [`Compact`] slot, 8 bytes past one (the slot's own state comes
/// first). A grant's CAS takes the word's line exclusive, but every check needs that line
/// anyway, and the other words in it never change.
#[repr(C)]
struct Core {
    /// `next`, or `UNSET`; see the module docs.
    state: AtomicU64,
    pace: Pace,
    slack: u32,
    unlimited: bool,
}

const _: () = assert!(std::mem::size_of::<Core>() <= 56);

/// The derived, immutable arithmetic constants (all in nanoseconds).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Pace {
    /// `T = per / rate`, truncated, saturated at `u64::MAX`.
    per_request: u64,
    /// `M = slack * T`, saturated at `u64::MAX`.
    max_slack: u64,
    /// `M + T`, saturated at `u64::MAX` (then the cap branch can never run, as upstream, where
    /// no `now - prev` exceeds it).
    cap: u64,
}

impl Pace {
    fn new(rate: u32, per: Duration, slack: u32) -> Pace {
        // Upstream: perRequest = per / time.Duration(rate), integer (truncating) division.
        let t = per.as_nanos() / u128::from(rate.max(1));
        let t = u64::try_from(t).unwrap_or(u64::MAX);
        // Exact in u128: (2^64 - 1) * (2^32 - 1) + (2^64 - 1) < 2^128.
        let m = u128::from(t) * u128::from(slack);
        Pace {
            per_request: t,
            max_slack: u64::try_from(m).unwrap_or(u64::MAX),
            cap: u64::try_from(m + u128::from(t)).unwrap_or(u64::MAX),
        }
    }

    /// Upstream's switch: the `next` after one take at `now` from `prev`, or `None` if it would
    /// reach the end of representable time. `now` is below `UNSET`.
    #[inline]
    fn next(&self, prev: u64, now: u64) -> Option<u64> {
        if prev == UNSET {
            return Some(now);
        }
        if now > prev && now - prev > self.cap {
            // now - prev > cap >= max_slack, so this cannot underflow.
            return Some(now - self.max_slack);
        }
        match prev.checked_add(self.per_request) {
            Some(next) if next < UNSET => Some(next),
            _ => None,
        }
    }

    /// The `next` after `n >= 1` consecutive takes at `now` from `prev`, and whether every one
    /// of them is immediate; `None` past the end of time.
    #[inline]
    fn next_n(&self, prev: u64, now: u64, n: u32) -> Option<u64> {
        let first = self.next(prev, now)?;
        if n == 1 {
            return Some(first);
        }
        // After the first take next >= now - M: the rest are all `prev + T`.
        let last = u128::from(first) + u128::from(n - 1) * u128::from(self.per_request);
        u64::try_from(last).ok().filter(|&t| t < UNSET)
    }
}

impl LeakyBucket<QuantaClock> {
    /// `rate` permits per second with the default slack of 10, on the shared quanta clock
    /// (upstream's `New(rate)`). A rate of 0 is [`ConfigError::ZeroRate`] (deviation D6).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, LeakyBucket};
    ///
    /// let lb = LeakyBucket::new(3).unwrap();
    /// assert_eq!(lb.per_request(), Duration::from_nanos(333_333_333));
    /// assert_eq!(LeakyBucket::new(0).unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn new(rate: u32) -> Result<LeakyBucket, ConfigError> {
        LeakyBucketBuilder::new(rate).build()
    }

    /// A builder for `rate` permits per `per` (default one second), with options `per`,
    /// `slack`, `without_slack` and `clock`, applied in order (the last one wins).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::LeakyBucket;
    ///
    /// let lb = LeakyBucket::builder(7).per(Duration::from_secs(60)).build().unwrap();
    /// assert_eq!(lb.per_request(), Duration::from_nanos(8_571_428_571));
    /// ```
    pub fn builder(rate: u32) -> LeakyBucketBuilder {
        LeakyBucketBuilder::new(rate)
    }

    /// A limiter that never limits (upstream's `NewUnlimited`): every take returns `now` at
    /// once and touches no state. It is the same type as a limiting bucket, so a configuration
    /// can switch limiting off without changing types.
    ///
    /// ```
    /// use turnstile::{LeakyBucket, Limiter};
    ///
    /// let lb = LeakyBucket::unlimited();
    /// assert!(lb.is_unlimited());
    /// for _ in 0..1000 {
    ///     assert!(lb.try_take());
    /// }
    /// assert!(lb.check_n(u32::MAX).is_ok());
    /// ```
    pub fn unlimited() -> LeakyBucket {
        LeakyBucket::builder(1)
            .unlimited()
            .build()
            .unwrap_or_else(|_| unreachable!("an unlimited bucket has no setting to refuse"))
    }
}

impl<C: Clock, P: Layout> LeakyBucket<C, P> {
    fn from_parts(
        pace: Pace,
        rate: u32,
        per: Duration,
        slack: u32,
        unlimited: bool,
        clock: C,
    ) -> LeakyBucket<C, P> {
        LeakyBucket {
            core: P::cell(Core {
                state: AtomicU64::new(UNSET),
                pace,
                slack,
                unlimited,
            }),
            rate,
            per,
            clock,
        }
    }

    fn from_builder(b: LeakyBucketBuilder<C>) -> Result<LeakyBucket<C, P>, ConfigError> {
        if b.unlimited {
            let pace = Pace {
                per_request: 0,
                max_slack: 0,
                cap: 0,
            };
            return Ok(LeakyBucket::from_parts(
                pace,
                0,
                Duration::ZERO,
                0,
                true,
                b.clock,
            ));
        }
        b.validate()?;
        let pace = Pace::new(b.rate, b.per, b.slack);
        Ok(LeakyBucket::from_parts(
            pace, b.rate, b.per, b.slack, false, b.clock,
        ))
    }

    /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    ///
    /// ```
    /// use turnstile::{Clock, LeakyBucket, ManualClock, Nanos};
    ///
    /// let lb = LeakyBucket::builder(1).clock(ManualClock::new(Nanos::new(9))).build().unwrap();
    /// assert_eq!(lb.clock().now(), Nanos::new(9));
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Permits per [`LeakyBucket::per`]; 0 for an unlimited bucket, which has no rate.
    ///
    /// ```
    /// use turnstile::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(50).unwrap().rate(), 50);
    /// ```
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// The period the rate is counted over (one second unless set with
    /// [`LeakyBucketBuilder::per`]); zero for an unlimited bucket.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(50).unwrap().per(), Duration::from_secs(1));
    /// ```
    pub fn per(&self) -> Duration {
        self.per
    }

    /// The permits of credit that idling can bank (10 unless set); 0 for an unlimited bucket.
    ///
    /// ```
    /// use turnstile::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(50).unwrap().slack(), 10);
    /// assert_eq!(LeakyBucket::builder(50).without_slack().build().unwrap().slack(), 0);
    /// ```
    pub fn slack(&self) -> u32 {
        self.core.slack
    }

    /// The spacing between permits, `per / rate` truncated to whole nanoseconds (upstream's
    /// `perRequest`); zero for an unlimited bucket, or when the rate exceeds `per` in
    /// nanoseconds (then the bucket only spaces permits by their clock readings, as upstream).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(3).unwrap().per_request(), Duration::from_nanos(333_333_333));
    /// ```
    pub fn per_request(&self) -> Duration {
        Duration::from_nanos(self.core.pace.per_request)
    }

    /// Whether this is an [unlimited](LeakyBucket::unlimited) bucket.
    ///
    /// ```
    /// use turnstile::LeakyBucket;
    /// assert!(!LeakyBucket::new(1).unwrap().is_unlimited());
    /// ```
    pub fn is_unlimited(&self) -> bool {
        self.core.unlimited
    }

    /// Takes a permit and sleeps the thread until its time (upstream's `Take`); returns the
    /// permit time: the clock reading if no wait was needed, else the scheduled time.
    ///
    /// The sleep is [`crate::clock::sleep_until`] on the limiter's clock: a thread sleep until
    /// shortly before the permit, then a spin of at most 80 µs, so the wake-up is within
    /// microseconds of the permit. With a [`crate::ManualClock`] it returns once the clock
    /// reaches the permit or the wait, measured in real time, has elapsed. A refused permit
    /// ([`Nanos::MAX`], see [`LeakyBucket::take_at`]) returns at once.
    ///
    /// ```
    /// use turnstile::{Clock, LeakyBucket};
    ///
    /// let lb = LeakyBucket::builder(1000).without_slack().build().unwrap(); // 1 ms apart
    /// let first = lb.take();
    /// let second = lb.take();
    /// assert!(second.as_u64() - first.as_u64() >= 1_000_000);
    /// assert!(lb.clock().now() >= second);
    /// ```
    pub fn take(&self) -> Nanos {
        let now = self.clock.now();
        let permit = self.take_at(now);
        // Nanos::MAX is a refusal ("never"), not a time to sleep until.
        if permit > now && permit != Nanos::MAX {
            crate::clock::sleep_until(&self.clock, permit);
        }
        permit
    }

    /// Takes a permit at `now` and returns its time without sleeping (deviation D7): `now` if
    /// it is due already, else the later time the caller should wait for. The permit is
    /// consumed either way. Returns [`Nanos::MAX`] ("never"), consuming nothing, if the permit
    /// would fall at or after the end of representable time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{LeakyBucket, ManualClock, Nanos};
    ///
    /// let lb = LeakyBucket::builder(4).without_slack().clock(ManualClock::default()).build().unwrap();
    /// let t = Nanos::ZERO; // a first take at time 0 is a first take like any other
    /// assert_eq!(lb.take_at(t), t);
    /// assert_eq!(lb.take_at(t), t + Duration::from_millis(250));
    /// assert_eq!(lb.take_at(t), t + Duration::from_millis(500));
    /// ```
    pub fn take_at(&self, now: Nanos) -> Nanos {
        if self.core.unlimited {
            return now;
        }
        let now = now.as_u64();
        if now == UNSET {
            return Nanos::MAX;
        }
        let backoff = Backoff::new();
        let mut prev = self.core.state.load(Ordering::Relaxed);
        loop {
            let Some(next) = self.core.pace.next(prev, now) else {
                return Nanos::MAX;
            };
            if next == prev {
                // T = 0 and nothing to move: the answer stands on the load.
                return Nanos::new(next.max(now));
            }
            match self.core.state.compare_exchange_weak(
                prev,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Nanos::new(next.max(now)),
                Err(current) => {
                    backoff.spin();
                    prev = current;
                }
            }
        }
    }

    /// Takes a permit now if it needs no wait; see [`LeakyBucket::try_take_at`].
    ///
    /// ```
    /// use turnstile::LeakyBucket;
    ///
    /// let lb = LeakyBucket::builder(1).without_slack().build().unwrap();
    /// assert!(lb.try_take());   // the first take is immediate
    /// assert!(!lb.try_take());  // the next one is a second away
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn try_take(&self) -> bool {
        self.try_take_at(self.clock.now())
    }

    /// Takes a permit at `now` if it is due already (deviation D7); otherwise changes nothing
    /// and writes nothing. A success is exactly a [`LeakyBucket::take_at`] that returned `now`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{LeakyBucket, ManualClock, Nanos};
    ///
    /// let lb = LeakyBucket::builder(10).without_slack().clock(ManualClock::default()).build().unwrap();
    /// let t = Nanos::new(1_000_000_000);
    /// assert!(lb.try_take_at(t));
    /// assert!(!lb.try_take_at(t + Duration::from_millis(99)));
    /// assert!(lb.try_take_at(t + Duration::from_millis(100)));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn try_take_at(&self, now: Nanos) -> bool {
        self.check(now, 1).is_ok()
    }

    /// Takes a permit, waiting on tokio's timer until its time; returns the permit time as
    /// [`LeakyBucket::take`] does (feature `tokio`). Tokio's timer has millisecond
    /// granularity, so the wake-up may be up to a millisecond late.
    ///
    /// The permit is taken when the future is first polled. **Dropping the future after that
    /// does not give the permit back**: upstream's `Take` has no cancel, and later takes are
    /// already spaced after it (see the [module docs](self)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use turnstile::LeakyBucket;
    ///
    /// let lb = LeakyBucket::builder(1000).without_slack().build().unwrap();
    /// let first = lb.take_async().await;
    /// let second = lb.take_async().await;
    /// assert!(second.as_u64() - first.as_u64() >= 1_000_000);
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn take_async(&self) -> Nanos {
        let now = self.clock.now();
        let permit = self.take_at(now);
        // Nanos::MAX is a refusal ("never"), not a time to sleep until.
        if permit > now && permit != Nanos::MAX {
            tokio::time::sleep(permit - now).await;
        }
        permit
    }

    /// `n` consecutive takes at `now`, all immediate, as one atomic step; on denial, the
    /// earliest time the same check could succeed (`None`: never).
    #[inline]
    fn check(&self, now: Nanos, n: u32) -> Result<(), Option<Nanos>> {
        if self.core.unlimited || n == 0 {
            return Ok(());
        }
        let now = now.as_u64();
        if now == UNSET {
            return Err(None);
        }
        let backoff = Backoff::new();
        let mut prev = self.core.state.load(Ordering::Relaxed);
        loop {
            let next = match self.core.pace.next_n(prev, now, n) {
                Some(next) if next <= now => next,
                Some(next) => return Err(self.retry_at(prev, next, n)),
                None => return Err(None),
            };
            if next == prev {
                return Ok(());
            }
            match self.core.state.compare_exchange_weak(
                prev,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(current) => {
                    backoff.spin();
                    prev = current;
                }
            }
        }
    }

    /// The earliest time at which `n >= 1` consecutive takes from `prev` are all immediate,
    /// given that at `now` they are not: their last `next` came out as `next > now`.
    /// Before the first permit a take never banks credit (upstream's first `Take` returns with
    /// `next = now`), so `n >= 2` can never pass; nor can `n > slack + 1`. Otherwise it is
    /// `prev + n * T`: there the takes are in the default branch (`n * T <= M + T`) and the
    /// last one lands exactly on `now`. That is the refused `next` itself: with
    /// `n - 1 <= slack` the cap branch gives `now - M + (n - 1) * T <= now`, never a refusal,
    /// so a refusal came from the default branch, whose last `next` is `prev + n * T`.
    #[inline]
    fn retry_at(&self, prev: u64, next: u64, n: u32) -> Option<Nanos> {
        if prev == UNSET || n - 1 > self.core.slack {
            return None;
        }
        debug_assert_eq!(
            Some(u128::from(next)),
            u128::from(prev).checked_add(u128::from(n) * u128::from(self.core.pace.per_request))
        );
        Some(Nanos::new(next))
    }
}

impl<C: Clock, P: Layout> Limiter for LeakyBucket<C, P> {
    /// Takes `n` permits at `now` if `n` consecutive takes would all be immediate, as one
    /// atomic step; otherwise changes nothing. A denial's retry time is when the same check
    /// would pass if nobody else takes a permit; there is none (`None`) if `n > slack + 1`,
    /// or if `n >= 2` before the first permit was ever taken (upstream's first take banks no
    /// credit).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{LeakyBucket, Limiter, ManualClock, Nanos};
    ///
    /// let lb = LeakyBucket::builder(10).slack(3).clock(ManualClock::default()).build().unwrap();
    /// let t0 = Nanos::new(1_000_000_000);
    /// assert!(lb.check_n_at(t0, 1).is_ok());
    /// let t1 = t0 + Duration::from_secs(10);     // idle: 3 permits of credit banked
    /// assert!(lb.check_n_at(t1, 4).is_ok());     // slack + 1 at once
    /// let denied = lb.check_n_at(t1, 1).unwrap_err();
    /// assert_eq!(denied.retry_after(), Some(Duration::from_millis(100)));
    /// assert_eq!(lb.check_n_at(t1, 5).unwrap_err().retry_at(), None); // > slack + 1
    /// ```
    #[inline]
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.check(now, n)
            .map_err(|retry_at| Denied::new(now, retry_at))
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    // `quota_at` keeps the default `None` for now: an exact reading exists (`q = slack + 1`
    // immediate permits, `r` = how many consecutive takes at `now` would be immediate, `t`
    // = until all `slack + 1` are) but is not written yet.
    //
    // `refund_n_at` keeps the default `false`: the step is GCRA's, `next' = max(prev, now -
    // M - T) + T`, so `next - n * T` (floored at `now - M - T`) would undo most grants
    // exactly, but not one that was the bucket's **first** take: that replaced `UNSET`, and
    // no `next` stands for `UNSET` (a fresh bucket banks no credit while idle; any `next`
    // does), while the word cannot tell whether the grant was the first. So it keeps what it
    // gave.
}

/// Idle when the next take at `now` or later would find the slack credit full: no permit
/// was ever taken (the state is `UNSET`, **identical** to a fresh bucket), or
/// `now - next > maxSlack + perRequest`, so that a take at any time from `now` on runs
/// upstream's cap branch (`next = now - maxSlack`): the bucket remembers nothing but the
/// full credit of `slack` permits. A fresh bucket has none (its first take sets
/// `next = now`), so it is **stricter**: it grants one permit at once where this one grants
/// `slack + 1`, and every later permit time is the same or later (upstream's step is
/// monotone in `next`). An unlimited bucket is always idle (it keeps no state). One load of
/// the state word; nothing is written.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Idle, LeakyBucket, ManualClock, Nanos};
///
/// let lb = LeakyBucket::builder(10).slack(2).clock(ManualClock::default()).build().unwrap();
/// let t0 = Nanos::new(1_000_000_000);
/// assert!(lb.is_idle_at(t0));                              // no permit yet
/// assert!(lb.try_take_at(t0));
/// // Idle once more than (slack + 1) * 100 ms = 300 ms have passed since `next`.
/// assert!(!lb.is_idle_at(t0 + Duration::from_millis(300)));
/// assert!(lb.is_idle_at(t0 + Duration::from_millis(300) + Duration::from_nanos(1)));
/// ```
impl<C: Clock, P: Layout> Idle for LeakyBucket<C, P> {
    fn is_idle_at(&self, now: Nanos) -> bool {
        if self.core.unlimited {
            return true;
        }
        let prev = self.core.state.load(Ordering::Relaxed);
        let now = now.as_u64();
        // The condition of `Pace::next`'s cap branch.
        prev == UNSET || (now > prev && now - prev > self.core.pace.cap)
    }

    /// `next = b - T`: as if the last permit had been issued one pace before `b`. A take at
    /// `b` then commits `next = b`, exactly as a fresh bucket's first take at `b` does; a
    /// reading `t < b` finds `next + T = b > t` and is refused until `b`; a take after `b`
    /// banks credit from `b` on, up to the slack (a fresh bucket banks none before its first
    /// permit: it is the one state that has no time). A bucket idle at `j <= b` has no
    /// permit or `next < j - M - T`, so the first `next` committed here (`b` or later, see
    /// `Pace::next`) is more than `T` above its last: the spacing the bound
    /// `slack + 1 + d / T` counts stays intact across the swap. If `b < T` the bucket stays
    /// unset: then no bucket was idle at `j <= b` with a permit (that needs `j > M + T`).
    /// Unused, the newborn is idle from `b + M` on (its credit full), not at once.
    fn born_at(&mut self, b: Nanos) {
        if let Some(next) = born_next(self.core.unlimited, self.core.pace.per_request, b) {
            self.core.state.store(next, Ordering::Relaxed);
        }
    }
}

/// The `next` a bucket born at `b` holds ([`Idle::born_at`]), if it is not left unset.
fn born_next(unlimited: bool, per_request: u64, b: Nanos) -> Option<u64> {
    let b = b.as_u64();
    // `b == u64::MAX` would need `T == 0` to give `UNSET`: never a time anything is granted at.
    (!unlimited && b >= per_request && b - per_request != UNSET).then(|| b - per_request)
}

impl<C: Clock, P: Layout> fmt::Debug for LeakyBucket<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.core.unlimited {
            return f.write_str("LeakyBucket(unlimited)");
        }
        let next = self.core.state.load(Ordering::Relaxed);
        f.debug_struct("LeakyBucket")
            .field("rate", &self.rate)
            .field("per", &self.per)
            .field("slack", &self.core.slack)
            .field("per_request", &self.per_request())
            .field("next", &(next != UNSET).then_some(Nanos::new(next)))
            .finish()
    }
}

/// Builds a [`LeakyBucket`]: upstream's options `Per`, `WithSlack`, `WithoutSlack` and
/// `WithClock`, applied in order, so the last one wins.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ConfigError, LeakyBucket, ManualClock};
///
/// let lb = LeakyBucket::builder(100)
///     .per(Duration::from_secs(60))
///     .slack(5)
///     .without_slack()          // the last slack option wins: no slack
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert_eq!(lb.slack(), 0);
/// assert_eq!(lb.per_request(), Duration::from_millis(600));
/// assert_eq!(
///     LeakyBucket::builder(1).per(Duration::ZERO).build().unwrap_err(),
///     ConfigError::ZeroPeriod
/// );
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct LeakyBucketBuilder<C: Clock = QuantaClock> {
    pub(crate) rate: u32,
    pub(crate) per: Duration,
    pub(crate) slack: u32,
    /// Set by [`LeakyBucketBuilder::unlimited`]: the other settings are then not used.
    pub(crate) unlimited: bool,
    pub(crate) clock: C,
}

impl LeakyBucketBuilder<QuantaClock> {
    /// The defaults, on the quanta clock: what `LeakyBucket::builder` starts from.
    pub(crate) fn new(rate: u32) -> LeakyBucketBuilder {
        LeakyBucketBuilder {
            rate,
            per: DEFAULT_PER,
            slack: DEFAULT_SLACK,
            unlimited: false,
            clock: QuantaClock::new(),
        }
    }
}

impl<C: Clock> LeakyBucketBuilder<C> {
    /// Counts the rate per `per` instead of per second (upstream's `Per`; default one
    /// second). Zero is rejected by [`LeakyBucketBuilder::build`] with
    /// [`ConfigError::ZeroPeriod`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::LeakyBucket;
    /// let lb = LeakyBucket::builder(2).per(Duration::from_millis(10)).build().unwrap();
    /// assert_eq!(lb.per_request(), Duration::from_millis(5));
    /// ```
    pub fn per(mut self, per: Duration) -> Self {
        self.per = per;
        self
    }

    /// Lets idling bank up to `slack` permits of credit (upstream's `WithSlack`; default 10);
    /// after an idle stretch `slack + 1` takes are immediate.
    ///
    /// ```
    /// use turnstile::LeakyBucket;
    /// assert_eq!(LeakyBucket::builder(2).slack(4).build().unwrap().slack(), 4);
    /// ```
    pub fn slack(mut self, slack: u32) -> Self {
        self.slack = slack;
        self
    }

    /// No credit at all (upstream's `WithoutSlack`, i.e. slack 0): every take after the first
    /// is spaced `per / rate` from the previous permit or from its own time, whichever is
    /// later.
    ///
    /// ```
    /// use turnstile::LeakyBucket;
    /// assert_eq!(LeakyBucket::builder(2).without_slack().build().unwrap().slack(), 0);
    /// ```
    pub fn without_slack(self) -> Self {
        self.slack(0)
    }

    /// Builds a bucket that never limits (upstream's `NewUnlimited`, as
    /// [`LeakyBucket::unlimited`]): every take returns its time at once and touches no state.
    /// The rate, `per` and slack are then neither used nor checked, and the bucket reports
    /// them as 0. Only the clock still matters: `take` returns its reading.
    ///
    /// ```
    /// use turnstile::{LeakyBucket, ManualClock, Nanos};
    ///
    /// let lb = LeakyBucket::builder(1)
    ///     .unlimited()
    ///     .clock(ManualClock::new(Nanos::new(5)))
    ///     .build()
    ///     .unwrap();
    /// assert!(lb.is_unlimited());
    /// assert_eq!(lb.take(), Nanos::new(5));
    /// assert_eq!(lb.take_at(Nanos::new(7)), Nanos::new(7));
    /// ```
    pub fn unlimited(mut self) -> Self {
        self.unlimited = true;
        self
    }

    /// Reads time from `clock` (upstream's `WithClock`).
    ///
    /// ```
    /// use turnstile::{Clock, LeakyBucket, ManualClock, Nanos};
    /// let lb = LeakyBucket::builder(2).clock(ManualClock::new(Nanos::new(3))).build().unwrap();
    /// assert_eq!(lb.clock().now(), Nanos::new(3));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> LeakyBucketBuilder<D> {
        LeakyBucketBuilder {
            rate: self.rate,
            per: self.per,
            slack: self.slack,
            unlimited: self.unlimited,
            clock,
        }
    }

    /// The settings' checks, shared with the mutex twin's `TryFrom`.
    /// Rate 0 and `per` 0 are errors (deviation D6).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        validate(self.rate, self.per)
    }

    /// The bucket, or the first setting that cannot be used: a rate of 0
    /// ([`ConfigError::ZeroRate`]) or a `per` of 0 ([`ConfigError::ZeroPeriod`]), deviation
    /// D6.
    ///
    /// ```
    /// use turnstile::{ConfigError, LeakyBucket};
    /// assert!(LeakyBucket::builder(1).build().is_ok());
    /// assert_eq!(LeakyBucket::builder(0).build().unwrap_err(), ConfigError::ZeroRate);
    /// ```
    pub fn build(self) -> Result<LeakyBucket<C>, ConfigError> {
        LeakyBucket::from_builder(self)
    }

    /// The bucket in the [`Compact`] layout: its state word unpadded, next to the words a
    /// check reads, for the many per-key buckets of a [`Keyed`](crate::Keyed) map (a fraction
    /// of the bytes per key, and one cache line per check). The same settings and errors as
    /// [`LeakyBucketBuilder::build`].
    ///
    /// ```
    /// # #[cfg(feature = "keyed")] {
    /// use turnstile::{Keyed, LeakyBucket};
    /// let per_ip = Keyed::new(|_: &u32| LeakyBucket::builder(100).build_compact().unwrap());
    /// assert!(per_ip.check(&1).is_ok());
    /// # }
    /// ```
    pub fn build_compact(self) -> Result<LeakyBucket<C, Compact>, ConfigError> {
        LeakyBucket::from_builder(self)
    }
}

/// [`LeakyBucketBuilder::build`] as a conversion, the form the mutex twin is built by too
/// (`reference::LeakyBucket`, feature `reference`): code generic over the two builds either.
impl<C: Clock> TryFrom<LeakyBucketBuilder<C>> for LeakyBucket<C> {
    type Error = ConfigError;

    fn try_from(options: LeakyBucketBuilder<C>) -> Result<LeakyBucket<C>, ConfigError> {
        options.build()
    }
}

/// Deviation D6: the settings upstream divides by, or never limits with.
pub(crate) fn validate(rate: u32, per: Duration) -> Result<(), ConfigError> {
    if rate == 0 {
        return Err(ConfigError::ZeroRate);
    }
    if per.is_zero() {
        return Err(ConfigError::ZeroPeriod);
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Where each word a take or a check reads ends in a keyed map's slot, for a compact
    /// bucket on `clock`.
    #[cfg(feature = "keyed")]
    fn check_word_ends<C: Clock + Clone + Send + Sync + 'static>(
        clock: C,
    ) -> [(&'static str, usize); 4] {
        let make = move || {
            LeakyBucket::builder(10)
                .clock(clock.clone())
                .build_compact()
                .unwrap()
        };
        crate::keyed::word_ends_in_slot(make, |l| {
            let c: &Core = &l.core;
            [
                ("state", std::ptr::addr_of!(c.state).cast(), 8),
                ("pace", std::ptr::addr_of!(c.pace).cast(), 24),
                ("slack", std::ptr::addr_of!(c.slack).cast(), 4),
                ("unlimited", std::ptr::addr_of!(c.unlimited).cast(), 1),
            ]
        })
    }

    /// The compact layout changes where the words are, nothing else: both layouts answer a
    /// schedule of checks and takes alike, refusals' retry times included.
    #[test]
    fn compact_and_padded_buckets_agree() {
        let clock = crate::ManualClock::default();
        let padded = LeakyBucket::builder(10).slack(2).clock(clock.clone());
        let (padded, compact) = (padded.clone().build().unwrap(), padded.build_compact());
        let compact = compact.unwrap();
        for (t, x) in crate::clock::random_readings(10_000, 60_000_000) {
            let n = (x >> 32) as u32 % 5;
            if x & 1 == 0 {
                assert_eq!(padded.check_n_at(t, n), compact.check_n_at(t, n));
            } else {
                assert_eq!(padded.take_at(t), compact.take_at(t));
            }
        }
    }

    /// In a keyed map's slot, the words a compact bucket's check reads lie in the slot's
    /// first cache line, with the slot's own state: one line a check.
    #[cfg(feature = "keyed")]
    #[test]
    fn compact_check_reads_one_line_of_a_keyed_slot() {
        let manual = check_word_ends(crate::ManualClock::default());
        let quanta = check_word_ends(QuantaClock::new());
        for (name, end) in manual.into_iter().chain(quanta) {
            assert!(end <= 64, "{name} ends at byte {end} of the slot");
        }
    }

    #[test]
    fn pace_saturates_instead_of_overflowing() {
        let p = Pace::new(1, Duration::MAX, u32::MAX);
        assert_eq!(p.per_request, u64::MAX);
        assert_eq!(p.max_slack, u64::MAX);
        assert_eq!(p.cap, u64::MAX);
        assert_eq!(p.next(UNSET, 5), Some(5));
        assert_eq!(p.next(5, 6), None);
        let p = Pace::new(u32::MAX, Duration::from_nanos(1), u32::MAX);
        assert_eq!((p.per_request, p.max_slack, p.cap), (0, 0, 0));
        assert_eq!(p.next(5, 6), Some(6));
        assert_eq!(p.next(5, 5), Some(5));
        assert_eq!(p.next(5, 4), Some(5));
    }

    #[test]
    fn unified_cap_branch_is_upstreams_no_slack_branch() {
        let p = Pace::new(10, Duration::from_secs(1), 0);
        let t = 100_000_000;
        assert_eq!(p.next(0, t + 1), Some(t + 1)); // now - prev > T: next = now
        assert_eq!(p.next(0, t), Some(t)); // == T: prev + T
    }
}
