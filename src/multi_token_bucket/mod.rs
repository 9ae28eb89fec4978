//! Several limits, one decision: a token bucket with one to four limits ("20 per second
//! and 10 000 per day") checked together in one atomic step.
//!
//! Checking two limiters in turn leaves partial consumption: the first grants, the second
//! refuses, and the first's token is spent on a request that never ran (governor #156). A
//! [`MultiTokenBucket`] holds every limit's state in one 128-bit word, so a check admits
//! against all of them or none with one CAS, and a refusal, decided from one load, writes
//! nothing, names the limit that refused and says when all of them admit.
//!
//! Each limit is a [`TokenBucket`](crate::TokenBucket)-style GCRA bucket, a [`Bandwidth`]:
//! a burst and a rate. The word's layout, its range (9.1 years of readings past the
//! limiter's construction) and its precision (each limit counts time in units of a power-of-two
//! fraction of its token interval, reported by [`MultiTokenBucket::precision`]) are stated in
//! `src/multi_token_bucket/word.rs`; the CAS protocols in `engine.rs`.

mod engine;
pub(crate) mod word;

use std::fmt;
use std::ops::Deref;
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::limit::Limit;
use crate::limiter::{Denied, Idle, Limiter, QuotaStatus};

use engine::{Engine, Taken};
pub(crate) use word::{Lim, Limits, MAX_LIMITS};

/// One limit of a [`MultiTokenBucket`]: a bucket of `burst` tokens refilling at `limit`.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Limit, multi_token_bucket::Bandwidth};
///
/// let per_second = Bandwidth::new(Limit::per_second(20.0).unwrap(), 40);
/// let daily = Bandwidth::per(10_000, Duration::from_secs(86_400));
/// assert_eq!(daily.burst(), 10_000);
/// assert_eq!(per_second.limit().as_f64(), 20.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bandwidth {
    limit: Limit,
    burst: u32,
}

impl Bandwidth {
    /// A bucket of `burst` tokens refilling at `limit`.
    pub fn new(limit: Limit, burst: u32) -> Bandwidth {
        Bandwidth { limit, burst }
    }

    /// `quota` per `period`: a bucket of `quota` tokens refilling at `quota / period`, the
    /// form an API publishes ("1000 per hour"). A zero quota or period gives a zero limit,
    /// which the bucket's constructor refuses.
    pub fn per(quota: u32, period: Duration) -> Bandwidth {
        let rate = f64::from(quota) / period.as_secs_f64();
        let limit = if quota == 0 || period.is_zero() {
            Limit::ZERO
        } else {
            Limit::per_second(rate).unwrap_or(Limit::ZERO)
        };
        Bandwidth {
            limit,
            burst: quota,
        }
    }

    /// The same limit with burst `burst`: `Bandwidth::per(20, SECOND).burst(40)` refills at
    /// 20/s and holds 40.
    pub fn burst_of(self, burst: u32) -> Bandwidth {
        Bandwidth { burst, ..self }
    }

    /// The refill rate.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The most tokens the bucket holds.
    pub fn burst(&self) -> u32 {
        self.burst
    }
}

impl Limits {
    /// The limits as given.
    pub(crate) fn bandwidths(&self) -> Vec<Bandwidth> {
        self.lims[..self.k]
            .iter()
            .map(|l| Bandwidth::new(l.limit, l.burst))
            .collect()
    }
}

/// The word's configuration for `limits`, or why it cannot be held.
pub(crate) fn limits_of(limits: &[Bandwidth]) -> Result<Limits, ConfigError> {
    let k = limits.len();
    if k == 0 || k > MAX_LIMITS {
        return Err(ConfigError::LimitCount(k));
    }
    let mut lims = [Lim::EMPTY; MAX_LIMITS];
    for (i, b) in limits.iter().enumerate() {
        let why = if b.burst == 0 {
            Some("the burst must be at least 1")
        } else if b.limit.is_inf() || b.limit.as_f64() <= 0.0 {
            Some("the rate must be positive and finite")
        } else {
            None
        };
        let lim = match why {
            Some(why) => None.ok_or(why),
            None => Lim::new(b.limit, b.burst, k).ok_or(if k <= 2 {
                "among one or two limits, a rate above about 1.9e9 per second or a burst past \
                 2^58 units does not fit the word's field, and refilling a burst may take at \
                 most 146 years"
            } else {
                "its burst, or the refill of one millisecond at its rate, needs more tokens \
                 than the word's field holds (about 2^28 or 2^21 units for 3 or 4 limits), or \
                 refilling its burst takes over 146 years"
            }),
        };
        lims[i] = lim.map_err(|why| ConfigError::LimitOutOfRange {
            index: i,
            limit: b.limit.as_f64(),
            burst: b.burst,
            why,
        })?;
    }
    Ok(Limits {
        k,
        two: k == 2,
        min_burst: limits.iter().map(|b| b.burst).min().unwrap_or(0),
        lims,
    })
}

/// A refused check of a [`MultiTokenBucket`]: when every limit admits the same check again,
/// and which limit admits last.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, Nanos, multi_token_bucket::{Bandwidth, MultiTokenBucket}};
///
/// let limits = [Bandwidth::per(2, Duration::from_secs(1)), Bandwidth::per(3, Duration::from_secs(60))];
/// let mtb = MultiTokenBucket::builder(&limits).clock(ManualClock::default()).build().unwrap();
/// assert!(mtb.check_n_at(Nanos::ZERO, 2).is_ok());
/// let refused = mtb.check_n_at(Nanos::ZERO, 2).unwrap_err();
/// // The per-second limit admits 2 more in a second, the per-minute one not for 20 s.
/// assert_eq!(refused.limit(), 1);
/// assert_eq!(refused.retry_after(), Some(Duration::from_secs(20)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a refusal says when to retry: answer the request with it"]
pub struct MultiDenied {
    denied: Denied,
    limit: usize,
}

impl MultiDenied {
    /// A refusal by limit `limit`.
    pub(crate) fn new(denied: Denied, limit: usize) -> MultiDenied {
        MultiDenied { denied, limit }
    }

    /// The refusal as every limiter gives it: its time and when to retry.
    pub fn denied(&self) -> Denied {
        self.denied
    }

    /// The index of the limit that admits last (the one that refused, if one did): the
    /// limit whose `Retry-After` this is. Past a limit's burst it is that limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The earliest time every limit admits the same check; `None` if one never can (more
    /// than its burst).
    pub fn retry_at(&self) -> Option<Nanos> {
        self.denied.retry_at()
    }

    /// How long after the check to retry; `None` if a retry can never succeed.
    pub fn retry_after(&self) -> Option<Duration> {
        self.denied.retry_after()
    }
}

impl From<MultiDenied> for Denied {
    fn from(d: MultiDenied) -> Denied {
        d.denied
    }
}

impl fmt::Display for MultiDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (limit {})", self.denied, self.limit)
    }
}

impl std::error::Error for MultiDenied {}

/// Every limit's [`QuotaStatus`], in the order the limits were given: a slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Statuses {
    k: usize,
    all: [QuotaStatus; MAX_LIMITS],
}

impl Deref for Statuses {
    type Target = [QuotaStatus];

    fn deref(&self) -> &[QuotaStatus] {
        &self.all[..self.k]
    }
}

impl Statuses {
    /// The statuses of word `x` of `limits` at `t` ns past its base.
    pub(crate) fn of(limits: &Limits, x: u128, t: u64) -> Statuses {
        Statuses {
            k: limits.k,
            all: limits.status(x, t),
        }
    }

    /// The status a single-limit header shows: the limit with the fewest permits left (the
    /// longest reset among equals), the one that refuses first.
    pub fn binding(&self) -> QuotaStatus {
        let mut b = self.all[0];
        for s in &self[1..] {
            if (s.remaining, std::cmp::Reverse(s.reset)) < (b.remaining, std::cmp::Reverse(b.reset))
            {
                b = *s;
            }
        }
        b
    }
}

/// A token bucket with one to four limits, checked all-or-nothing in one atomic step: "20 per
/// second with a burst of 40, and 10 000 per day".
///
/// A check of `n` passes only if every limit holds `n` tokens, and then takes `n` from each
/// with one CAS; a refusal writes nothing and says which limit admits last and when
/// ([`MultiDenied`]). [`peek_n_at`](MultiTokenBucket::peek_n_at) asks the same without
/// taking; [`status_at`](MultiTokenBucket::status_at) gives each limit's remaining tokens
/// and reset, for the `RateLimit` headers; [`set_limits`](MultiTokenBucket::set_limits)
/// replaces the limits, linearizable with concurrent checks.
///
/// Each limit is GCRA ([`TokenBucket`](crate::TokenBucket)'s `allow`): its tokens refill
/// continuously up to its burst. Readings older than the last grant are judged no more
/// generously than the grant was, so over any span of readings limit `i` grants at most
/// `burst_i + limit_i * span` (module docs).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, Nanos, multi_token_bucket::{Bandwidth, MultiTokenBucket}};
///
/// const SECOND: Duration = Duration::from_secs(1);
/// let limits = [Bandwidth::per(20, SECOND).burst_of(40), Bandwidth::per(100, 60 * SECOND)];
/// let mtb = MultiTokenBucket::builder(&limits).clock(ManualClock::default()).build().unwrap();
/// assert!(mtb.check_n_at(Nanos::ZERO, 40).is_ok());   // the burst
/// let refused = mtb.check_at(Nanos::ZERO).unwrap_err();
/// assert_eq!(refused.limit(), 0);                        // the per-second limit refused
/// assert_eq!(refused.retry_after(), Some(Duration::from_millis(50)));
/// // Both limits paid for the 40: the per-minute one holds 60.
/// assert_eq!(mtb.status_at(Nanos::ZERO)[1].remaining, 60);
/// ```
pub struct MultiTokenBucket<C: Clock = QuantaClock> {
    engine: Engine,
    clock: C,
}

impl MultiTokenBucket<QuantaClock> {
    /// A bucket of `limits` (one to four), all full, on the shared quanta clock.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
    ///
    /// let mtb = MultiTokenBucket::new(&[
    ///     Bandwidth::per(20, Duration::from_secs(1)),
    ///     Bandwidth::per(10_000, Duration::from_secs(86_400)),
    /// ])
    /// .unwrap();
    /// assert!(mtb.check().is_ok());
    /// ```
    pub fn new(limits: &[Bandwidth]) -> Result<Self, ConfigError> {
        Self::builder(limits).build()
    }

    /// A builder for a bucket of `limits`: [`MultiTokenBucketBuilder::clock`], then
    /// [`build`](MultiTokenBucketBuilder::build), which checks the limits.
    pub fn builder(limits: &[Bandwidth]) -> MultiTokenBucketBuilder {
        MultiTokenBucketBuilder {
            limits: limits.to_vec(),
            clock: QuantaClock::new(),
        }
    }
}

/// Options for a [`MultiTokenBucket`].
#[must_use = "a builder does nothing until `build` is called"]
#[derive(Debug, Clone)]
pub struct MultiTokenBucketBuilder<C: Clock = QuantaClock> {
    limits: Vec<Bandwidth>,
    clock: C,
}

impl<C: Clock> MultiTokenBucketBuilder<C> {
    /// The clock the bucket reads (the shared quanta clock unless set).
    pub fn clock<D: Clock>(self, clock: D) -> MultiTokenBucketBuilder<D> {
        MultiTokenBucketBuilder {
            limits: self.limits,
            clock,
        }
    }

    /// The bucket, all limits full at the clock's reading now; or a [`ConfigError`]: no
    /// limits or more than four ([`ConfigError::LimitCount`]), or a limit the word cannot
    /// hold ([`ConfigError::LimitOutOfRange`]: a zero burst, a zero or infinite rate, a
    /// burst past its field).
    pub fn build(self) -> Result<MultiTokenBucket<C>, ConfigError> {
        let limits = limits_of(&self.limits)?;
        let base = self.clock.now().as_u64();
        Ok(MultiTokenBucket {
            engine: Engine::new(limits, base),
            clock: self.clock,
        })
    }
}

impl<C: Clock> MultiTokenBucket<C> {
    /// The clock the bucket reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// `now` as the engine's time: ns past its base, readings before it counted as it.
    fn t(&self, now: Nanos) -> u64 {
        now.as_u64().saturating_sub(self.engine.base)
    }

    /// A check of one at the clock's reading.
    #[inline]
    pub fn check(&self) -> Result<(), MultiDenied> {
        self.check_n_at(self.clock.now(), 1)
    }

    /// A check of one at `now`.
    #[inline]
    pub fn check_at(&self, now: Nanos) -> Result<(), MultiDenied> {
        self.check_n_at(now, 1)
    }

    /// A check of `n` at the clock's reading.
    #[inline]
    pub fn check_n(&self, n: u32) -> Result<(), MultiDenied> {
        self.check_n_at(self.clock.now(), n)
    }

    /// A check of `n` at `now`: takes `n` tokens from every limit if each holds them, and
    /// nothing otherwise. `n = 0` always passes and takes nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Nanos, multi_token_bucket::{Bandwidth, MultiTokenBucket}};
    ///
    /// let limits = [Bandwidth::per(5, Duration::from_secs(1)), Bandwidth::per(8, Duration::from_secs(60))];
    /// let mtb = MultiTokenBucket::builder(&limits).clock(ManualClock::default()).build().unwrap();
    /// assert!(mtb.check_n_at(Nanos::ZERO, 5).is_ok());
    /// // A second later the per-second limit is full again, but the per-minute one holds 3.
    /// let later = Nanos::new(1_000_000_000);
    /// assert_eq!(mtb.check_n_at(later, 4).unwrap_err().limit(), 1);
    /// assert!(mtb.check_n_at(later, 3).is_ok());   // the refusal took nothing
    /// assert_eq!(mtb.check_n_at(later, 9).unwrap_err().retry_at(), None); // past a burst
    /// ```
    #[inline]
    pub fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), MultiDenied> {
        self.decide(now, n, true)
    }

    /// Whether a check of `n` at the clock's reading would pass, taking nothing.
    pub fn peek_n(&self, n: u32) -> Result<(), MultiDenied> {
        self.peek_n_at(self.clock.now(), n)
    }

    /// Whether a check of `n` at `now` would pass, taking nothing: the same answer, the same
    /// retry time and limit, and no write.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Nanos, multi_token_bucket::{Bandwidth, MultiTokenBucket}};
    ///
    /// let mtb = MultiTokenBucket::builder(&[Bandwidth::per(1, Duration::from_secs(1))])
    ///     .clock(ManualClock::default()).build().unwrap();
    /// assert!(mtb.peek_n_at(Nanos::ZERO, 1).is_ok());
    /// assert!(mtb.peek_n_at(Nanos::ZERO, 1).is_ok());  // still there
    /// assert!(mtb.check_n_at(Nanos::ZERO, 1).is_ok());
    /// assert!(mtb.peek_n_at(Nanos::ZERO, 1).is_err());
    /// ```
    pub fn peek_n_at(&self, now: Nanos, n: u32) -> Result<(), MultiDenied> {
        self.decide(now, n, false)
    }

    #[inline(always)]
    fn decide(&self, now: Nanos, n: u32, take: bool) -> Result<(), MultiDenied> {
        match self.engine.check(now.as_u64(), n, take) {
            Taken::Granted => Ok(()),
            Taken::Denied { by, retry } => Err(MultiDenied::new(
                Denied::new(now, Limits::at(self.engine.base, retry, now)),
                by,
            )),
        }
    }

    /// Every limit's status at the clock's reading.
    pub fn status(&self) -> Statuses {
        self.status_at(self.clock.now())
    }

    /// Every limit's status at `now`, in the order given: `quota` its burst, `window` the time
    /// it takes to refill from empty, `remaining` its whole tokens, `reset` the time until it
    /// is full if nothing more is taken (the fields of the `RateLimit` headers).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Nanos, multi_token_bucket::{Bandwidth, MultiTokenBucket}};
    ///
    /// let limits = [Bandwidth::per(10, Duration::from_secs(1)), Bandwidth::per(100, Duration::from_secs(3600))];
    /// let mtb = MultiTokenBucket::builder(&limits).clock(ManualClock::default()).build().unwrap();
    /// mtb.check_n_at(Nanos::ZERO, 4).unwrap();
    /// let s = mtb.status_at(Nanos::ZERO);
    /// assert_eq!((s[0].remaining, s[0].reset), (6, Duration::from_millis(400)));
    /// assert_eq!((s[1].remaining, s[1].reset), (96, Duration::from_secs(144)));
    /// assert_eq!(s[1].window, Duration::from_secs(3600));
    /// assert_eq!(s.binding(), s[0]);
    /// ```
    pub fn status_at(&self, now: Nanos) -> Statuses {
        let (limits, x) = self.engine.snapshot();
        Statuses::of(&limits, x, self.t(now))
    }

    /// The limits, in the order given.
    pub fn limits(&self) -> Vec<Bandwidth> {
        self.engine.snapshot().0.bandwidths()
    }

    /// Each limit's precision: a reading counts as up to this much earlier than it is (fewer
    /// tokens, never more), so a limit admits at most this late, and never early. One unit of
    /// the limit's time grid for one or two limits, two for three or four; a unit is a
    /// fraction of the token interval, as fine as the word's bits allow (module docs).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
    ///
    /// let day = Duration::from_secs(86_400);
    /// let mtb = MultiTokenBucket::new(&[Bandwidth::per(20, Duration::from_secs(1)), Bandwidth::per(10_000, day)]).unwrap();
    /// assert!(mtb.precision().iter().all(|unit| *unit <= Duration::from_micros(100)));
    /// ```
    pub fn precision(&self) -> Vec<Duration> {
        let (limits, _) = self.engine.snapshot();
        (0..limits.k).map(|i| limits.precision(i)).collect()
    }

    /// Replaces the limits at the clock's reading (see [`set_limits_at`](Self::set_limits_at)).
    pub fn set_limits(&self, limits: &[Bandwidth]) -> Result<(), ConfigError> {
        self.set_limits_at(self.clock.now(), limits)
    }

    /// Replaces the limits at `now`: each limit keeps its tokens by position (capped at its
    /// new burst, as x/time/rate's `SetLimit` and `SetBurst` keep them), a limit added
    /// starts full, a limit removed is forgotten. Linearizable with concurrent checks: each
    /// is judged wholly under the old limits or wholly under the new. The limits are
    /// checked first: on an error nothing changes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Nanos, multi_token_bucket::{Bandwidth, MultiTokenBucket}};
    ///
    /// let sec = Duration::from_secs(1);
    /// let mtb = MultiTokenBucket::builder(&[Bandwidth::per(10, sec)]).clock(ManualClock::default()).build().unwrap();
    /// mtb.check_n_at(Nanos::ZERO, 7).unwrap();
    /// mtb.set_limits_at(Nanos::ZERO, &[Bandwidth::per(10, sec), Bandwidth::per(2, 60 * sec)]).unwrap();
    /// assert_eq!(mtb.status_at(Nanos::ZERO)[0].remaining, 3); // kept
    /// assert_eq!(mtb.check_n_at(Nanos::ZERO, 3).unwrap_err().limit(), 1); // the new one holds 2
    /// ```
    pub fn set_limits_at(&self, now: Nanos, limits: &[Bandwidth]) -> Result<(), ConfigError> {
        let limits = limits_of(limits)?;
        self.engine.set_limits(limits, self.t(now));
        Ok(())
    }
}

impl<C: Clock> Limiter for MultiTokenBucket<C> {
    #[inline]
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        MultiTokenBucket::check_n_at(self, now, n).map_err(Denied::from)
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The binding limit's status ([`Statuses::binding`]): the one that refuses first.
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        Some(self.status_at(now).binding())
    }
}

impl<C: Clock> Idle for MultiTokenBucket<C> {
    /// Every limit full.
    fn is_idle_at(&self, now: Nanos) -> bool {
        let (limits, x) = self.engine.snapshot();
        limits.idle(x, self.t(now))
    }

    fn born_at(&mut self, b: Nanos) {
        self.engine.reborn(self.t(b));
    }
}

impl<C: Clock> fmt::Debug for MultiTokenBucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiTokenBucket")
            .field("limits", &self.limits())
            .finish_non_exhaustive()
    }
}
