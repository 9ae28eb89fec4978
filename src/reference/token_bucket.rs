//! The mutex twin of [`crate::TokenBucket`]: a literal port of `golang.org/x/time/rate`
//! (`rate.go` at commit 2b4e439), used as the tests' oracle and the benchmarks' baseline.
//!
//! The state is Go's, field for field, under one [`std::sync::Mutex`]:
//!
//! | Go | here |
//! |---|---|
//! | `limit Limit` (float64) | `limit: f64` (`f64::MAX` is Go's `Inf`) |
//! | `burst int` | `burst: u32` (deviation D5: counts are unsigned) |
//! | `tokens float64` | `tokens: f64` (may be negative, or above `burst` after `SetBurst`) |
//! | `last time.Time` | `last: Nanos` (Go's zero `time.Time` is [`Nanos::ZERO`]) |
//! | `lastEvent time.Time` | `last_event: Nanos` |
//!
//! Go's `time.Duration` is kept as an `i64` of nanoseconds inside this file, so that the
//! signed arithmetic of `CancelAt` and the `InfDuration` (`i64::MAX` ns) cap are exactly
//! upstream's. Where Go's types and ours differ:
//! - `t.Sub(u)` saturates to the `i64` range of nanoseconds, as Go's does;
//! - `t.Add(d)` saturates at [`Nanos::ZERO`] and [`Nanos::MAX`] (Go's `time.Time` has a far wider
//!   range, so upstream never meets those ends);
//! - Go's `time.Duration(f)` of a float that is exactly 2^63 is undefined (amd64 gives
//!   `MinInt64`); here it saturates to `InfDuration`, and below `MinInt64` to `MinInt64`.
//!
//! Only the deviations that Rust's types force are taken: D1 (a reservation is cancelled by
//! value, so at most once), D3 ([`Limit`] is validated) and D5 (`n` is a `u32`). The twin keeps
//! upstream's minting of tokens when time goes backwards (not D2) and upstream's zero-limit
//! reservations that are OK with an infinite delay (not D4).

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::limiter::{Denied, Limiter, QuotaStatus};
use crate::token_bucket::{Peek, TokenBucketBuilder};
use crate::{Deadline, Limit, WaitError};

/// Go's `InfDuration`: `time.Duration(math.MaxInt64)`, in nanoseconds.
const INF_DURATION: i64 = i64::MAX;

/// Go's `Inf` limit (`math.MaxFloat64`, not IEEE infinity).
const INF: f64 = f64::MAX;

/// Go's `time.Duration.Seconds()`: whole seconds plus the nanosecond remainder, both
/// truncated toward zero, so `seconds(-d) == -seconds(d)`.
fn seconds(d: i64) -> f64 {
    let sec = d / 1_000_000_000;
    let nsec = d % 1_000_000_000;
    sec as f64 + nsec as f64 / 1e9
}

/// Go's `Limit.tokensFromDuration`.
fn tokens_from_duration(limit: f64, d: i64) -> f64 {
    if limit <= 0.0 {
        return 0.0;
    }
    seconds(d) * limit
}

/// Go's `Limit.durationFromTokens`: the result is negative for negative `tokens`.
fn duration_from_tokens(limit: f64, tokens: f64) -> i64 {
    if limit <= 0.0 {
        return INF_DURATION;
    }
    let duration = (tokens / limit) * 1e9;
    if duration > i64::MAX as f64 {
        return INF_DURATION;
    }
    // Truncates toward zero, as Go's conversion; saturates where Go's is undefined.
    duration as i64
}

/// Go's `t.Sub(u)`: `t - u` in nanoseconds, saturated to the `i64` range.
fn go_sub(t: Nanos, u: Nanos) -> i64 {
    let d = i128::from(t.as_u64()) - i128::from(u.as_u64());
    d.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Go's `t.Add(d)` for a signed `d`, saturating at the ends of [`Nanos`].
fn go_add(t: Nanos, d: i64) -> Nanos {
    if d >= 0 {
        t + Duration::from_nanos(d.unsigned_abs())
    } else {
        t - Duration::from_nanos(d.unsigned_abs())
    }
}

/// A [`Duration`] as a Go duration, saturating at `InfDuration`.
fn from_std(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(INF_DURATION)
}

/// Go's `Limiter` fields (everything but the mutex).
#[derive(Debug, Clone, Copy)]
struct Inner {
    limit: f64,
    burst: u32,
    tokens: f64,
    last: Nanos,
    last_event: Nanos,
}

/// What Go's `reserveN` returns, without the limiter pointer.
struct Reserved {
    ok: bool,
    tokens: u32,
    time_to_act: Nanos,
    limit: Limit,
}

impl Inner {
    /// Go's `advance(t)`: the tokens at `t`, with no mutation. Time going backwards counts as
    /// no time passing; the result is clamped to `burst` from above only.
    fn advance(&self, t: Nanos) -> f64 {
        let mut last = self.last;
        if t < last {
            last = t;
        }
        let elapsed = go_sub(t, last);
        let delta = tokens_from_duration(self.limit, elapsed);
        let mut tokens = self.tokens + delta;
        let burst = f64::from(self.burst);
        if tokens > burst {
            tokens = burst;
        }
        tokens
    }

    /// Go's `reserveN(t, n, maxFutureReserve)`.
    fn reserve_n(&mut self, t: Nanos, n: u32, max_future_reserve: i64) -> Reserved {
        if self.limit == INF {
            // Upstream leaves the reservation's `limit` at Go's zero value here; see
            // `Reservation::cancel_at`, which reads it back as 0.
            return Reserved {
                ok: true,
                tokens: n,
                time_to_act: t,
                limit: Limit::INF,
            };
        }

        let mut tokens = self.advance(t);
        tokens -= f64::from(n);

        let mut wait_duration = 0;
        if tokens < 0.0 {
            wait_duration = duration_from_tokens(self.limit, -tokens);
        }

        let ok = n <= self.burst && wait_duration <= max_future_reserve;

        let mut r = Reserved {
            ok,
            tokens: 0,
            time_to_act: Nanos::ZERO,
            limit: Limit::from_valid(self.limit),
        };
        if ok {
            r.tokens = n;
            r.time_to_act = go_add(t, wait_duration);

            self.last = t;
            self.tokens = tokens;
            self.last_event = r.time_to_act;
        }
        r
    }

    /// The earliest time `n` tokens are available, with no mutation (see
    /// [`TokenBucket::peek_n_at`]).
    fn available_at(&self, now: Nanos, n: u32) -> Option<Nanos> {
        if self.limit == INF {
            return Some(now);
        }
        if n > self.burst {
            return None;
        }
        let tokens = self.advance(now) - f64::from(n);
        if tokens >= 0.0 {
            return Some(now);
        }
        let wait = duration_from_tokens(self.limit, -tokens);
        if wait == INF_DURATION {
            None
        } else {
            Some(go_add(now, wait))
        }
    }

    /// Go's `SetLimitAt` / `SetBurstAt` prologue: `tokens = advance(t); last = t`.
    fn advance_to(&mut self, t: Nanos) {
        let tokens = self.advance(t);
        self.last = t;
        self.tokens = tokens;
    }
}

/// The mutex-based token bucket: the **literal port** of Go's `golang.org/x/time/rate`
/// `Limiter`, used as the **test oracle** and the **benchmark baseline** for the lock-free
/// [`crate::TokenBucket`], with the same API.
///
/// It holds up to `burst` tokens, starts full, and refills at `limit` tokens per second. Its
/// arithmetic is upstream's, float for float (see the [module docs](self)), including
/// upstream's quirks that the lock-free limiter fixes: time going backwards can mint tokens
/// (the lock-free limiter's deviation D2), and with [`Limit::ZERO`] an empty bucket grants
/// reservations that are OK with an infinite delay (deviation D4). Every operation takes the
/// mutex; it is correct and slow on purpose.
///
/// ```
/// use std::time::Duration;
/// use turnstile::reference::TokenBucket;
/// use turnstile::{Limit, ManualClock, Nanos};
///
/// // 10 tokens per second, bursts of 2; the bucket starts full.
/// let tb = TokenBucket::from(turnstile::TokenBucket::builder(Limit::per_second(10.0).unwrap(), 2).clock(ManualClock::default()));
/// let t0 = Nanos::new(1_000_000_000);
/// assert!(tb.allow_n_at(t0, 2));
/// assert!(!tb.allow_at(t0));
///
/// // A reservation on the empty bucket waits 100 ms for its token ...
/// let r = tb.reserve_at(t0);
/// assert!(r.ok());
/// assert_eq!(r.delay_from(t0), Duration::from_millis(100));
/// // ... and cancelling it in time gives the token back.
/// r.cancel_at(t0);
/// assert_eq!(tb.tokens_at(t0), 0.0);
/// assert_eq!(tb.tokens_at(t0 + Duration::from_millis(100)), 1.0);
/// ```
pub struct TokenBucket<C: Clock = QuantaClock> {
    inner: Mutex<Inner>,
    clock: C,
}

impl TokenBucket<QuantaClock> {
    /// A full bucket of `burst` tokens refilled at `limit` per second, on the default
    /// [`QuantaClock`] (Go's `NewLimiter(limit, burst)`).
    pub fn new(limit: Limit, burst: u32) -> Self {
        Self::from(crate::TokenBucket::builder(limit, burst))
    }
}

impl<C: Clock> From<TokenBucketBuilder<C>> for TokenBucket<C> {
    /// A full bucket of the builder's `burst` tokens refilled at its `limit` per second,
    /// reading time from its clock. `last` and `last_event` start at [`Nanos::ZERO`], Go's
    /// zero time.
    fn from(options: TokenBucketBuilder<C>) -> Self {
        let (limit, burst, clock) = options.into_parts();
        TokenBucket {
            inner: Mutex::new(Inner {
                limit: limit.as_f64(),
                burst,
                tokens: f64::from(burst),
                last: Nanos::ZERO,
                last_event: Nanos::ZERO,
            }),
            clock,
        }
    }
}

impl<C: Clock> TokenBucket<C> {
    /// The bucket's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Nothing in this file panics with the lock held, but a poisoned mutex is used anyway
    /// rather than propagating someone else's panic.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reservation(&self, r: Reserved) -> Reservation<'_, C> {
        Reservation {
            lim: self,
            ok: r.ok,
            tokens: r.tokens,
            time_to_act: r.time_to_act,
            limit: r.limit,
        }
    }

    /// The refill rate (Go's `Limit()`).
    pub fn limit(&self) -> Limit {
        Limit::from_valid(self.lock().limit)
    }

    /// The bucket's capacity: the most tokens one call can take (Go's `Burst()`).
    pub fn burst(&self) -> u32 {
        self.lock().burst
    }

    /// The tokens available now (Go's `Tokens()`); see [`TokenBucket::tokens_at`].
    pub fn tokens(&self) -> f64 {
        self.tokens_at(self.clock.now())
    }

    /// The tokens available at `now`, with no mutation (Go's `TokensAt`). Negative while
    /// reservations are outstanding. With [`Limit::INF`] this is `burst` whenever `now` is
    /// after the last update, and the raw stored count otherwise, as upstream.
    pub fn tokens_at(&self, now: Nanos) -> f64 {
        self.lock().advance(now)
    }

    /// Takes one token now if it is available (Go's `Allow()`).
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow(&self) -> bool {
        self.allow_at(self.clock.now())
    }

    /// Takes one token at `now` if it is available (Go's `AllowN(now, 1)`).
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_at(&self, now: Nanos) -> bool {
        self.allow_n_at(now, 1)
    }

    /// Takes `n` tokens now if they are available.
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n(&self, n: u32) -> bool {
        self.allow_n_at(self.clock.now(), n)
    }

    /// Takes `n` tokens at `now` if they are available with no wait; changes nothing
    /// otherwise (Go's `AllowN`, i.e. `reserveN(now, n, 0).ok`). `n == 0` is denied while the
    /// bucket is in deficit, as upstream.
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n_at(&self, now: Nanos, n: u32) -> bool {
        self.lock().reserve_n(now, n, 0).ok
    }

    /// Reserves one token now (Go's `Reserve()`).
    pub fn reserve(&self) -> Reservation<'_, C> {
        self.reserve_at(self.clock.now())
    }

    /// Reserves one token at `now` (Go's `ReserveN(now, 1)`).
    pub fn reserve_at(&self, now: Nanos) -> Reservation<'_, C> {
        self.reserve_n_at(now, 1)
    }

    /// Reserves `n` tokens now; see [`TokenBucket::reserve_n_at`].
    pub fn reserve_n(&self, n: u32) -> Reservation<'_, C> {
        self.reserve_n_at(self.clock.now(), n)
    }

    /// Reserves `n` tokens at `now`, however long they take to arrive (Go's `ReserveN`, with
    /// `maxFutureReserve = InfDuration`). The reservation is not OK only if `n > burst` (and the
    /// limit is not [`Limit::INF`]); a failed reservation changes nothing. With
    /// [`Limit::ZERO`] and too few tokens the reservation is OK with a delay of `InfDuration`
    /// (`i64::MAX` ns), as upstream.
    pub fn reserve_n_at(&self, now: Nanos, n: u32) -> Reservation<'_, C> {
        let r = self.lock().reserve_n(now, n, INF_DURATION);
        self.reservation(r)
    }

    /// Reserves `n` tokens now if they arrive within `max_wait`; see
    /// [`TokenBucket::try_reserve_n_at`].
    pub fn try_reserve_n(&self, n: u32, max_wait: Duration) -> Reservation<'_, C> {
        self.try_reserve_n_at(self.clock.now(), n, max_wait)
    }

    /// Reserves `n` tokens at `now` if they arrive within `max_wait` (Go's internal
    /// `reserveN(now, n, maxFutureReserve)`; `max_wait` saturates at `InfDuration`). If they
    /// would not, the reservation is not OK and nothing changes.
    pub fn try_reserve_n_at(&self, now: Nanos, n: u32, max_wait: Duration) -> Reservation<'_, C> {
        let r = self.lock().reserve_n(now, n, from_std(max_wait));
        self.reservation(r)
    }

    /// Looks at the bucket now without taking anything; see [`TokenBucket::peek_n_at`].
    pub fn peek_n(&self, n: u32) -> Peek {
        self.peek_n_at(self.clock.now(), n)
    }

    /// Looks at the bucket at `now` without taking anything: the tokens there (Go's
    /// `TokensAt(now)`) and the earliest time `n` tokens are available if nobody else takes
    /// any. That time is `now` if they are there already (and always with [`Limit::INF`]),
    /// `None` if `n > burst` or the wait is infinite ([`Limit::ZERO`] with too few tokens, or
    /// a wait of `InfDuration` or more), else `now` plus Go's `durationFromTokens` of the
    /// missing tokens.
    pub fn peek_n_at(&self, now: Nanos, n: u32) -> Peek {
        let inner = self.lock();
        Peek {
            tokens: inner.advance(now),
            available_at: inner.available_at(now, n),
        }
    }

    /// Changes the refill rate now; see [`TokenBucket::set_limit_at`].
    pub fn set_limit(&self, limit: Limit) {
        self.set_limit_at(self.clock.now(), limit);
    }

    /// Changes the refill rate at `now` (Go's `SetLimitAt`): the tokens are first brought up
    /// to `now` at the old rate (and `last` moves to `now`, even backwards). Outstanding
    /// reservations keep their time to act and, for cancelling, their old limit.
    pub fn set_limit_at(&self, now: Nanos, limit: Limit) {
        let mut inner = self.lock();
        inner.advance_to(now);
        inner.limit = limit.as_f64();
    }

    /// Changes the capacity now; see [`TokenBucket::set_burst_at`].
    pub fn set_burst(&self, burst: u32) {
        self.set_burst_at(self.clock.now(), burst);
    }

    /// Changes the capacity at `now` (Go's `SetBurstAt`): the tokens are first brought up to
    /// `now`, capped by the **old** burst, so the stored count can exceed a smaller new burst
    /// until the next read clamps it, as upstream.
    pub fn set_burst_at(&self, now: Nanos, burst: u32) {
        let mut inner = self.lock();
        inner.advance_to(now);
        inner.burst = burst;
    }

    /// Steps 1-4 of Go's `wait`: the reservation and its delay, or `None` if there is nothing
    /// to wait for.
    fn begin_wait(
        &self,
        now: Nanos,
        n: u32,
        deadline: Option<Nanos>,
    ) -> Result<Option<(Reservation<'_, C>, Duration)>, WaitError> {
        let (burst, limit) = {
            let inner = self.lock();
            (inner.burst, inner.limit)
        };
        if n > burst && limit != INF {
            return Err(WaitError::ExceedsBurst { n, burst });
        }
        let wait_limit = match deadline {
            Some(d) if d <= now => return Err(WaitError::DeadlinePassed { n }),
            Some(d) => go_sub(d, now),
            None => INF_DURATION,
        };
        let r = self.lock().reserve_n(now, n, wait_limit);
        let r = self.reservation(r);
        if !r.ok() {
            return Err(WaitError::WouldExceedDeadline { n });
        }
        let delay = r.delay_from(now);
        if delay.is_zero() {
            return Ok(None);
        }
        Ok(Some((r, delay)))
    }

    /// Waits, sleeping the thread, until `n` tokens are available (Go's `WaitN`, with a
    /// [`Deadline`] in place of the context's: a `Duration` timeout from the start of the
    /// wait, an `Instant`, `None`, or [`Deadline::at`] a reading of this bucket's clock).
    ///
    /// The checks run in upstream's order, and only the last one sleeps:
    /// 1. `n > burst` with a finite limit → [`WaitError::ExceedsBurst`];
    /// 2. `deadline <= now` → [`WaitError::DeadlinePassed`];
    /// 3. the tokens would arrive after the deadline → [`WaitError::WouldExceedDeadline`],
    ///    with nothing reserved;
    /// 4. no delay → `Ok` at once;
    /// 5. otherwise sleep for the delay, then `Ok`.
    ///
    /// With [`Limit::ZERO`], too few tokens and no deadline this sleeps for `InfDuration`
    /// (about 292 years), as upstream blocks forever.
    pub fn wait_n_blocking(&self, n: u32, deadline: impl Into<Deadline>) -> Result<(), WaitError> {
        let now = self.clock.now();
        // The reservation is spent, not cancelled: the tokens are used.
        if let Some((_spent, delay)) = self.begin_wait(now, n, deadline.into().resolve(now))? {
            std::thread::sleep(delay);
        }
        Ok(())
    }

    /// Waits asynchronously, on tokio's timer, until `n` tokens are available: the same checks
    /// in the same order as [`TokenBucket::wait_n_blocking`]. If the future is dropped before
    /// the sleep ends, the reservation is cancelled at the clock's time then, as Go cancels it
    /// when the context is done.
    ///
    /// # Panics
    /// As [`tokio::time::sleep`], if polled outside a tokio runtime with the timer enabled.
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn wait_n(&self, n: u32, deadline: impl Into<Deadline>) -> Result<(), WaitError> {
        let now = self.clock.now();
        let Some((r, delay)) = self.begin_wait(now, n, deadline.into().resolve(now))? else {
            return Ok(());
        };
        let mut guard = CancelOnDrop(Some(r));
        tokio::time::sleep(delay).await;
        // Slept to the end: the tokens are used, so disarm the guard.
        let _spent = guard.0.take();
        Ok(())
    }
}

/// Cancels a waiting reservation if its wait future is dropped before the sleep ends.
#[cfg(feature = "tokio")]
struct CancelOnDrop<'a, C: Clock>(Option<Reservation<'a, C>>);

#[cfg(feature = "tokio")]
impl<C: Clock> Drop for CancelOnDrop<'_, C> {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.cancel();
        }
    }
}

impl<C: Clock> Limiter for TokenBucket<C> {
    /// [`TokenBucket::allow_n_at`]; on denial, the time from [`TokenBucket::peek_n_at`],
    /// decided under the same lock.
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        let mut inner = self.lock();
        if inner.reserve_n(now, n, 0).ok {
            Ok(())
        } else {
            // A failed reserveN changed nothing, so this is the state the check saw.
            Err(Denied::new(now, inner.available_at(now, n)))
        }
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The fields of [`crate::TokenBucket`]'s `quota_at`, from Go's state: `q = burst`,
    /// `w = burst / limit` and `t = (burst - advance(now)) / limit` in nanoseconds rounded
    /// up (from `f64`, where the lock-free limiter counts units: the two may part by a
    /// nanosecond), `r = floor(advance(now))`, 0 in debt. Infinite limit: `r = q`, `w = t
    /// = 0`. Zero limit: `w = Duration::MAX`, `t` 0 when full, else `Duration::MAX`.
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        let inner = self.lock();
        let burst = u64::from(inner.burst);
        if inner.limit == INF {
            return Some(QuotaStatus {
                quota: burst,
                window: Duration::ZERO,
                remaining: burst,
                reset: Duration::ZERO,
            });
        }
        let tokens = inner.advance(now);
        let remaining = if tokens <= 0.0 {
            0
        } else {
            (tokens.floor() as u64).min(burst)
        };
        let secs_ceil = |tokens: f64| {
            if inner.limit <= 0.0 {
                return Duration::MAX;
            }
            let ns = (tokens / inner.limit * 1e9).ceil();
            if ns >= u64::MAX as f64 {
                Duration::MAX
            } else {
                Duration::from_nanos(ns as u64)
            }
        };
        let full = f64::from(inner.burst);
        let reset = if tokens >= full {
            Duration::ZERO
        } else {
            secs_ceil(full - tokens)
        };
        Some(QuotaStatus {
            quota: burst,
            window: secs_ceil(full),
            remaining,
            reset,
        })
    }

    /// Gives `n` tokens back at `now`, as the last step of Go's `CancelAt` does with
    /// `restoreTokens = n`: `tokens = min(advance(now) + n, burst); last = now` (under an
    /// infinite limit nothing, as `CancelAt`; `n = 0` nothing). Always `true`; why that is
    /// exact is on [`crate::TokenBucket`]'s `refund_n_at`. Like `CancelAt`, it moves `last`
    /// back for a `now` before it (the upstream minting the lock-free limiter does not copy,
    /// deviation D2).
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        let mut inner = self.lock();
        if inner.limit == INF || n == 0 {
            return true;
        }
        let tokens = (inner.advance(now) + f64::from(n)).min(f64::from(inner.burst));
        inner.last = now;
        inner.tokens = tokens;
        true
    }
}

/// [`Limiter::refund_n_at`] gives a grant back (see there).
impl<C: Clock> crate::limiter::Refund for TokenBucket<C> {}

impl<C: Clock> fmt::Debug for TokenBucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As the lock-free bucket's Debug: the tokens at the clock's reading.
        let inner = *self.lock();
        f.debug_struct("reference::TokenBucket")
            .field("limit", &Limit::from_valid(inner.limit))
            .field("burst", &inner.burst)
            .field("tokens", &self.tokens_at(self.clock.now()))
            .finish()
    }
}

/// Tokens reserved from a [`TokenBucket`] (Go's `Reservation`): whether they were granted,
/// and when the holder may act. Dropping it keeps the tokens; [`Reservation::cancel`] gives
/// back what it can.
///
/// Cancelling takes the reservation by value, so it happens at most once (deviation D1;
/// upstream's `CancelAt` restores tokens again on every call).
///
/// ```
/// use std::time::Duration;
/// use turnstile::reference::TokenBucket;
/// use turnstile::{Limit, ManualClock, Nanos};
///
/// let tb = TokenBucket::from(turnstile::TokenBucket::builder(Limit::per_second(4.0).unwrap(), 1).clock(ManualClock::default()));
/// let t = Nanos::new(1_000_000_000);
/// assert!(tb.reserve_at(t).ok());
/// let r = tb.reserve_at(t);
/// assert_eq!(r.time_to_act(), Some(t + Duration::from_millis(250)));
/// assert_eq!(r.delay_from(t + Duration::from_millis(100)), Duration::from_millis(150));
/// ```
#[must_use = "a reservation holds tokens; cancel it if the action will not happen"]
pub struct Reservation<'a, C: Clock = QuantaClock> {
    lim: &'a TokenBucket<C>,
    ok: bool,
    tokens: u32,
    time_to_act: Nanos,
    limit: Limit,
}

impl<C: Clock> Reservation<'_, C> {
    /// Whether the tokens were granted (Go's `OK()`). A reservation that is not OK holds
    /// nothing and changed nothing.
    pub fn ok(&self) -> bool {
        self.ok
    }

    /// The tokens this reservation holds: `n` if OK, `0` if not (Go sets `tokens` only on
    /// success).
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// The bucket's limit when the reservation was made; cancelling uses it even if the limit
    /// has changed since.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// When the holder may act, or `None` if the reservation is not OK.
    pub fn time_to_act(&self) -> Option<Nanos> {
        self.ok.then_some(self.time_to_act)
    }

    /// How long after `now` the holder must wait before acting (Go's `DelayFrom`): zero if the
    /// time to act has come, [`Duration::MAX`] if the reservation is not OK.
    pub fn delay_from(&self, now: Nanos) -> Duration {
        if !self.ok {
            return Duration::MAX;
        }
        self.time_to_act.saturating_duration_since(now)
    }

    /// [`Reservation::delay_from`] the bucket clock's current time (Go's `Delay()`).
    pub fn delay(&self) -> Duration {
        self.delay_from(self.lim.clock.now())
    }

    /// Cancels at the bucket clock's current time; see [`Reservation::cancel_at`].
    pub fn cancel(self) {
        let now = self.lim.clock.now();
        self.cancel_at(now);
    }

    /// Gives back, at `now`, the tokens that no later reservation depends on (Go's `CancelAt`).
    ///
    /// Does nothing if the reservation is not OK, the bucket's **current** limit is
    /// [`Limit::INF`], it holds no tokens, or its time to act is before `now` (cancelling at
    /// exactly the time to act still restores). Otherwise it restores its tokens minus those
    /// reserved after it (`limit × (last_event − time_to_act)`, at the reservation's own
    /// limit), capped at `burst`; sets `last = now` (even backwards); and, if it was the latest
    /// reservation, moves `last_event` back to when it would have started.
    pub fn cancel_at(self, now: Nanos) {
        if !self.ok {
            return;
        }
        let mut lim = self.lim.lock();
        if lim.limit == INF || self.tokens == 0 || self.time_to_act < now {
            return;
        }
        // Go builds the reservation of an Inf limiter without setting its `limit`, so it reads
        // back as the zero Limit here (only reachable after the limit has become finite).
        let r_limit = if self.limit.is_inf() {
            0.0
        } else {
            self.limit.as_f64()
        };

        let restore_tokens = f64::from(self.tokens)
            - tokens_from_duration(r_limit, go_sub(lim.last_event, self.time_to_act));
        if restore_tokens <= 0.0 {
            return;
        }
        let mut tokens = lim.advance(now);
        tokens += restore_tokens;
        let burst = f64::from(lim.burst);
        if tokens > burst {
            tokens = burst;
        }
        lim.last = now;
        lim.tokens = tokens;
        if self.time_to_act == lim.last_event {
            // Negative for a positive limit; InfDuration for the zero limit, as upstream.
            let prev = duration_from_tokens(r_limit, -f64::from(self.tokens));
            let prev_event = go_add(self.time_to_act, prev);
            if prev_event >= now {
                lim.last_event = prev_event;
            }
        }
    }
}

impl<C: Clock> fmt::Debug for Reservation<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("ok", &self.ok)
            .field("tokens", &self.tokens)
            .field("time_to_act", &self.time_to_act)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}
