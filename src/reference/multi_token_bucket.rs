//! The twin of [`MultiTokenBucket`](crate::MultiTokenBucket): one x/time/rate twin
//! ([`reference::TokenBucket`](super::TokenBucket)) per limit, applied all-or-nothing under
//! one mutex. A check peeks every bucket and, only if each holds the tokens now, takes them
//! from each; a refusal reports the latest of the buckets' times to act, and the limit it
//! belongs to (the last such limit among equals, as the lock-free bucket does).

use std::sync::Mutex;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::limiter::{Denied, Limiter, QuotaStatus};
use crate::multi_token_bucket::{limits_of, Bandwidth, MultiDenied};

use super::TokenBucket;

/// N x/time/rate twins under one mutex: see the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{multi_token_bucket::Bandwidth, reference, Nanos};
///
/// let limits = [Bandwidth::per(2, Duration::from_secs(1)), Bandwidth::per(3, Duration::from_secs(60))];
/// let twin = reference::MultiTokenBucket::new(&limits).unwrap();
/// assert!(twin.check_n_at(Nanos::ZERO, 2).is_ok());
/// assert_eq!(twin.check_n_at(Nanos::ZERO, 2).unwrap_err().limit(), 1);
/// ```
pub struct MultiTokenBucket<C: Clock = QuantaClock> {
    buckets: Mutex<Vec<TokenBucket>>,
    clock: C,
}

impl MultiTokenBucket<QuantaClock> {
    /// Twins of `limits`, all full, on the shared quanta clock; the same validation as
    /// [`crate::MultiTokenBucket::new`].
    pub fn new(limits: &[Bandwidth]) -> Result<Self, ConfigError> {
        Self::with_clock(limits, QuantaClock::new())
    }
}

impl<C: Clock> MultiTokenBucket<C> {
    /// Twins of `limits`, all full, on `clock`.
    pub fn with_clock(limits: &[Bandwidth], clock: C) -> Result<Self, ConfigError> {
        limits_of(limits)?;
        Ok(MultiTokenBucket {
            buckets: Mutex::new(
                limits
                    .iter()
                    .map(|b| TokenBucket::new(b.limit(), b.burst()))
                    .collect(),
            ),
            clock,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TokenBucket>> {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The clock the twin reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// A check of `n` at `now`: takes `n` from every bucket if each holds them now.
    pub fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), MultiDenied> {
        let buckets = self.lock();
        Self::decide(&buckets, now, n)?;
        for b in buckets.iter() {
            let granted = b.allow_n_at(now, n);
            debug_assert!(granted);
        }
        Ok(())
    }

    /// Whether a check of `n` at `now` would pass, taking nothing.
    pub fn peek_n_at(&self, now: Nanos, n: u32) -> Result<(), MultiDenied> {
        Self::decide(&self.lock(), now, n)
    }

    fn decide(buckets: &[TokenBucket], now: Nanos, n: u32) -> Result<(), MultiDenied> {
        let mut latest: Option<(usize, Nanos)> = None;
        for (i, b) in buckets.iter().enumerate() {
            match b.peek_n_at(now, n).available_at {
                None => return Err(MultiDenied::new(Denied::new(now, None), i)),
                Some(at) if at > now && latest.is_none_or(|(_, l)| at >= l) => {
                    latest = Some((i, at));
                }
                Some(_) => {}
            }
        }
        match latest {
            None => Ok(()),
            Some((i, at)) => Err(MultiDenied::new(Denied::new(now, Some(at)), i)),
        }
    }

    /// Every bucket's status at `now`, in order.
    pub fn status_at(&self, now: Nanos) -> Vec<QuotaStatus> {
        self.lock().iter().filter_map(|b| b.quota_at(now)).collect()
    }

    /// Each bucket's tokens at `now`, in order (rate.go's `TokensAt`).
    pub fn tokens_at(&self, now: Nanos) -> Vec<f64> {
        self.lock().iter().map(|b| b.tokens_at(now)).collect()
    }

    /// Replaces the limits at `now`: a bucket kept by position gets rate.go's `SetLimitAt`
    /// and `SetBurstAt`, one added starts full, one removed is dropped.
    pub fn set_limits_at(&self, now: Nanos, limits: &[Bandwidth]) -> Result<(), ConfigError> {
        limits_of(limits)?;
        let mut buckets = self.lock();
        buckets.truncate(limits.len());
        for (i, l) in limits.iter().enumerate() {
            match buckets.get(i) {
                Some(b) => {
                    b.set_limit_at(now, l.limit());
                    b.set_burst_at(now, l.burst());
                }
                None => buckets.push(TokenBucket::new(l.limit(), l.burst())),
            }
        }
        Ok(())
    }
}

impl<C: Clock> Limiter for MultiTokenBucket<C> {
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        MultiTokenBucket::check_n_at(self, now, n).map_err(Denied::from)
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }
}
