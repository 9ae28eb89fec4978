//! The mutex twin of [`crate::LeakyBucket`]: a literal port of uber-go's `ratelimit` int64
//! limiter (`limiter_atomic_int64.go`, v0.3.1), used as the tests' oracle and the benchmarks'
//! baseline.
//!
//! The state is Go's, under one [`std::sync::Mutex`] instead of an atomic:
//!
//! | Go | here |
//! |---|---|
//! | `state int64` (UnixNano of the next permission issue, `0` = unset) | `state: i128` (nanoseconds on the limiter's clock, `0` = unset) |
//! | `perRequest time.Duration` | `per_request: i128` |
//! | `maxSlack time.Duration` (`slack * perRequest`) | `max_slack: i128` |
//!
//! The arithmetic is upstream's switch, line for line, on `i128`, which holds every value the
//! inputs can produce (`per` up to [`Duration::MAX`], slack up to `u32::MAX`) exactly, so it
//! never overflows where Go's `int64` would wrap. Times returned are clamped into
//! [`Nanos`].
//!
//! Kept from upstream, unlike [`crate::LeakyBucket`]: **`0` is the "unset" sentinel**, so a
//! take that reads exactly [`Nanos::ZERO`] while the state is 0 is a first take, again and
//! again (upstream's "a clock reading exactly the Unix epoch makes every call look like a
//! first call"). The differential test names this case.
//!
//! Taken from turnstile, because the API forces them: D6 (rate 0 and `per` 0 are
//! [`ConfigError`]s, slack is a `u32`) and D7 (`take_at`, `try_take`, `take_async`, and the
//! [`Limiter`] check, each written as the plain sequence of upstream takes it stands for).

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::leaky_bucket::LeakyBucketBuilder;
use crate::limiter::{Denied, Limiter};

/// Go's limiter fields (everything but the padding and the clock).
#[derive(Debug, Clone, Copy)]
struct Inner {
    /// Go's `state`: the time of the next permission issue, `0` before the first take.
    state: i128,
    per_request: i128,
    max_slack: i128,
}

impl Inner {
    /// The body of Go's CAS loop: the new `state` for one `Take` at `now`.
    fn next(&self, now: i128) -> i128 {
        let time_of_next_permission_issue = self.state;
        if time_of_next_permission_issue == 0
            || (self.max_slack == 0 && now - time_of_next_permission_issue > self.per_request)
        {
            // if this is our first call or t.maxSlack == 0 we need to shrink issue time to now
            now
        } else if self.max_slack > 0
            && now - time_of_next_permission_issue > self.max_slack + self.per_request
        {
            // a lot of nanoseconds passed since the last Take call
            // we will limit max accumulated time to maxSlack
            now - self.max_slack
        } else {
            // calculate the time at which our permission was issued
            time_of_next_permission_issue + self.per_request
        }
    }

    /// Go's `Take` without the sleep: commits the new state and returns it.
    fn take(&mut self, now: i128) -> i128 {
        let next = self.next(now);
        self.state = next;
        next
    }
}

/// An `i128` time clamped into [`Nanos`].
fn nanos(t: i128) -> Nanos {
    Nanos::new(t.clamp(0, i128::from(u64::MAX)) as u64)
}

/// The mutex-based leaky bucket: the **literal port** of uber-go's `ratelimit` int64 limiter,
/// used as the **test oracle** and the **benchmark baseline** for the lock-free
/// [`crate::LeakyBucket`], with the same API.
///
/// It keeps upstream's `0` sentinel (see the [module docs](self)): give it a clock that does
/// not read exactly [`Nanos::ZERO`], as upstream's tests set their mock clock to `time.Now()`.
///
/// ```
/// use std::time::Duration;
/// use turnstile::reference::LeakyBucket;
/// use turnstile::{ManualClock, Nanos};
///
/// let lb = LeakyBucket::try_from(turnstile::LeakyBucket::builder(10).slack(1).clock(ManualClock::default())).unwrap();
/// let t0 = Nanos::new(1_000_000_000);
/// assert_eq!(lb.take_at(t0), t0);
/// assert_eq!(lb.take_at(t0), t0 + Duration::from_millis(100));
/// let t1 = t0 + Duration::from_secs(3);
/// assert_eq!(lb.take_at(t1), t1); // slack + 1 = 2 immediate takes after idling
/// assert_eq!(lb.take_at(t1), t1);
/// assert!(!lb.try_take_at(t1));
/// ```
pub struct LeakyBucket<C: Clock = QuantaClock> {
    inner: Mutex<Inner>,
    rate: u32,
    per: Duration,
    slack: u32,
    unlimited: bool,
    clock: C,
}

impl LeakyBucket<QuantaClock> {
    /// `rate` permits per second with slack 10 on the quanta clock (Go's `New(rate)`); a rate of
    /// 0 is [`ConfigError::ZeroRate`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(3).unwrap().per_request(), Duration::from_nanos(333_333_333));
    /// ```
    pub fn new(rate: u32) -> Result<LeakyBucket, ConfigError> {
        LeakyBucket::try_from(crate::LeakyBucket::builder(rate))
    }

    /// Go's `NewUnlimited()`: every take returns `now` at once.
    ///
    /// ```
    /// use turnstile::reference::LeakyBucket;
    /// let lb = LeakyBucket::unlimited();
    /// assert!(lb.try_take() && lb.try_take() && lb.is_unlimited());
    /// ```
    pub fn unlimited() -> LeakyBucket {
        LeakyBucket::try_from(crate::LeakyBucket::builder(1).unlimited())
            .unwrap_or_else(|_| unreachable!("an unlimited bucket has no setting to refuse"))
    }
}

impl<C: Clock> LeakyBucket<C> {
    /// Go's `newAtomicInt64Based(rate, opts...)` after `buildConfig`.
    fn from_builder(b: LeakyBucketBuilder<C>) -> Result<LeakyBucket<C>, ConfigError> {
        if b.unlimited {
            // Go's `NewUnlimited()`.
            return Ok(LeakyBucket {
                inner: Mutex::new(Inner {
                    state: 0,
                    per_request: 0,
                    max_slack: 0,
                }),
                rate: 0,
                per: Duration::ZERO,
                slack: 0,
                unlimited: true,
                clock: b.clock,
            });
        }
        b.validate()?;
        // perRequest := config.per / time.Duration(rate)
        let per_request = i128::try_from(b.per.as_nanos() / u128::from(b.rate))
            .expect("a Duration in nanoseconds fits an i128");
        // maxSlack := time.Duration(config.slack) * perRequest
        let max_slack = i128::from(b.slack) * per_request;
        Ok(LeakyBucket {
            inner: Mutex::new(Inner {
                state: 0,
                per_request,
                max_slack,
            }),
            rate: b.rate,
            per: b.per,
            slack: b.slack,
            unlimited: false,
            clock: b.clock,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    ///
    /// ```
    /// use turnstile::reference::LeakyBucket;
    /// use turnstile::{Clock, ManualClock, Nanos};
    /// let lb = LeakyBucket::try_from(turnstile::LeakyBucket::builder(1).clock(ManualClock::new(Nanos::new(9)))).unwrap();
    /// assert_eq!(lb.clock().now(), Nanos::new(9));
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Permits per `per`; 0 for an unlimited bucket.
    ///
    /// ```
    /// use turnstile::reference::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(50).unwrap().rate(), 50);
    /// ```
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// The period the rate is counted over; zero for an unlimited bucket.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(50).unwrap().per(), Duration::from_secs(1));
    /// ```
    pub fn per(&self) -> Duration {
        self.per
    }

    /// The slack in permits; 0 for an unlimited bucket.
    ///
    /// ```
    /// use turnstile::reference::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(50).unwrap().slack(), 10);
    /// ```
    pub fn slack(&self) -> u32 {
        self.slack
    }

    /// Go's `perRequest`, saturated into a [`Duration`]'s nanoseconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::LeakyBucket;
    /// assert_eq!(LeakyBucket::new(4).unwrap().per_request(), Duration::from_millis(250));
    /// ```
    pub fn per_request(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.lock().per_request).unwrap_or(u64::MAX))
    }

    /// Whether this is an unlimited bucket.
    ///
    /// ```
    /// use turnstile::reference::LeakyBucket;
    /// assert!(!LeakyBucket::new(1).unwrap().is_unlimited());
    /// ```
    pub fn is_unlimited(&self) -> bool {
        self.unlimited
    }

    /// Go's `Take()`: takes a permit, sleeps until its time outside the lock (with
    /// [`crate::clock::sleep_until`]), and returns the permit time.
    ///
    /// ```
    /// use turnstile::reference::LeakyBucket;
    /// let lb = LeakyBucket::try_from(turnstile::LeakyBucket::builder(1000).without_slack()).unwrap();
    /// let (a, b) = (lb.take(), lb.take());
    /// assert!(b.as_u64() - a.as_u64() >= 1_000_000);
    /// ```
    pub fn take(&self) -> Nanos {
        let now = self.clock.now();
        let permit = self.take_at(now);
        if permit > now {
            crate::clock::sleep_until(&self.clock, permit);
        }
        permit
    }

    /// Go's `Take()` at `now`, without the sleep: the permit time.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::LeakyBucket;
    /// use turnstile::{ManualClock, Nanos};
    /// let lb = LeakyBucket::try_from(turnstile::LeakyBucket::builder(4).clock(ManualClock::default())).unwrap();
    /// let t = Nanos::new(1);
    /// assert_eq!(lb.take_at(t), t);
    /// assert_eq!(lb.take_at(t), t + Duration::from_millis(250));
    /// ```
    pub fn take_at(&self, now: Nanos) -> Nanos {
        if self.unlimited {
            return now;
        }
        let now_ns = i128::from(now.as_u64());
        let new_time_of_next_permission_issue = self.lock().take(now_ns);
        // sleepDuration := time.Duration(newTimeOfNextPermissionIssue - now)
        if new_time_of_next_permission_issue - now_ns > 0 {
            return nanos(new_time_of_next_permission_issue);
        }
        // return now if we don't sleep as atomicLimiter does
        now
    }

    /// A take now only if it needs no sleep; see [`LeakyBucket::try_take_at`].
    ///
    /// ```
    /// use turnstile::reference::LeakyBucket;
    /// let lb = LeakyBucket::try_from(turnstile::LeakyBucket::builder(1).without_slack()).unwrap();
    /// assert!(lb.try_take());
    /// assert!(!lb.try_take());
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn try_take(&self) -> bool {
        self.try_take_at(self.clock.now())
    }

    /// Go's `Take()` at `now` if it would not sleep; otherwise nothing changes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::reference::LeakyBucket;
    /// use turnstile::{ManualClock, Nanos};
    /// let lb = LeakyBucket::try_from(turnstile::LeakyBucket::builder(10).clock(ManualClock::default())).unwrap();
    /// let t = Nanos::new(1);
    /// assert!(lb.try_take_at(t));
    /// assert!(!lb.try_take_at(t));
    /// assert!(lb.try_take_at(t + Duration::from_millis(100)));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn try_take_at(&self, now: Nanos) -> bool {
        self.check(now, 1).is_ok()
    }

    /// Takes a permit, waiting on tokio's timer (feature `tokio`); dropping the future after
    /// its first poll does not give the permit back.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use turnstile::reference::LeakyBucket;
    /// let lb = LeakyBucket::try_from(turnstile::LeakyBucket::builder(1000).without_slack()).unwrap();
    /// let (a, b) = (lb.take_async().await, lb.take_async().await);
    /// assert!(b.as_u64() - a.as_u64() >= 1_000_000);
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn take_async(&self) -> Nanos {
        let now = self.clock.now();
        let permit = self.take_at(now);
        if permit > now {
            tokio::time::sleep(permit - now).await;
        }
        permit
    }

    /// `n` of Go's takes at `now` under one lock, kept only if none of them would sleep.
    fn check(&self, now: Nanos, n: u32) -> Result<(), Option<Nanos>> {
        if self.unlimited || n == 0 {
            return Ok(());
        }
        let now_ns = i128::from(now.as_u64());
        let mut inner = self.lock();
        let mut trial = *inner;
        let first = trial.take(now_ns);
        if n > 1 {
            // The other n - 1 takes at the same `now` are Go's switch again. Each is a first
            // take if the state is 0 (upstream's sentinel, reached here only at now = 0: they
            // all return 0); otherwise the first take left state >= now - maxSlack, so each
            // is the default branch and adds perRequest. They are counted, not looped: n can
            // be u32::MAX.
            if first != 0 {
                trial.state = first + i128::from(n - 1) * trial.per_request;
            }
        }
        // The last take is the latest: none sleeps iff it does not.
        if trial.state - now_ns > 0 {
            return Err(retry_at(&inner, self.slack, n));
        }
        *inner = trial;
        Ok(())
    }
}

/// When `n` takes from `inner`'s state would all be immediate: `state + n * perRequest`, or
/// never before the first take (for `n >= 2`) and for `n > slack + 1`.
fn retry_at(inner: &Inner, slack: u32, n: u32) -> Option<Nanos> {
    if inner.state == 0 || n - 1 > slack {
        return None;
    }
    let t = inner.state + i128::from(n) * inner.per_request;
    (t < i128::from(u64::MAX)).then(|| nanos(t))
}

impl<C: Clock> Limiter for LeakyBucket<C> {
    /// `n` takes at `now`, all kept if none would sleep, else none (changing nothing).
    ///
    /// ```
    /// use turnstile::reference::LeakyBucket;
    /// use turnstile::{Limiter, ManualClock, Nanos};
    /// let lb = LeakyBucket::try_from(turnstile::LeakyBucket::builder(10).clock(ManualClock::default())).unwrap();
    /// assert!(lb.check_n_at(Nanos::new(1), 1).is_ok());
    /// assert!(lb.check_n_at(Nanos::new(1), 1).is_err());
    /// ```
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.check(now, n)
            .map_err(|retry_at| Denied::new(now, retry_at))
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }
}

impl<C: Clock> fmt::Debug for LeakyBucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As the lock-free bucket's Debug; `next` is Go's `state`, the time of the next
        // permission issue (`None` before the first take).
        if self.unlimited {
            return f.write_str("reference::LeakyBucket(unlimited)");
        }
        let inner = *self.lock();
        let next = (inner.state != 0).then(|| Nanos::new(u64::try_from(inner.state).unwrap_or(0)));
        f.debug_struct("reference::LeakyBucket")
            .field("rate", &self.rate)
            .field("per", &self.per)
            .field("slack", &self.slack)
            .field("per_request", &self.per_request())
            .field("next", &next)
            .finish()
    }
}

/// The twin from the lock-free bucket's options (Go's `Per`, `WithSlack`, `WithoutSlack`,
/// `WithClock`, applied in order); rate 0 and `per` 0 are errors (deviation D6).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{reference, ConfigError, LeakyBucket};
/// let options = LeakyBucket::builder(100).per(Duration::from_secs(60)).slack(1);
/// let lb = reference::LeakyBucket::try_from(options).unwrap();
/// assert_eq!((lb.slack(), lb.per_request()), (1, Duration::from_millis(600)));
/// let zero = reference::LeakyBucket::try_from(LeakyBucket::builder(0));
/// assert_eq!(zero.unwrap_err(), ConfigError::ZeroRate);
/// ```
impl<C: Clock> TryFrom<LeakyBucketBuilder<C>> for LeakyBucket<C> {
    type Error = ConfigError;

    fn try_from(options: LeakyBucketBuilder<C>) -> Result<LeakyBucket<C>, ConfigError> {
        LeakyBucket::from_builder(options)
    }
}
