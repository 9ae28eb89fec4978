//! [`ErrorLog`]: configuration errors logged at most once a second per limiter.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::RedisLimitError;

/// The most one limiter logs of its configuration errors: one event per this span, the
/// ones in between counted in the next event's `suppressed` field.
const EVERY: Duration = Duration::from_secs(1);

/// A rate-limited `tracing::error!` for errors that last until an operator acts (`NOPERM`, a
/// script error, `WRONGTYPE`): every request meets them, and a log line per request would
/// flood the logs. Lock-free: two atomics, and the clock read only on the error path.
pub(crate) struct ErrorLog {
    origin: Instant,
    /// Nanoseconds after `origin` before which nothing more is logged.
    next: AtomicU64,
    suppressed: AtomicU64,
    total: AtomicU64,
}

impl ErrorLog {
    pub(crate) fn new() -> Self {
        ErrorLog {
            origin: Instant::now(),
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            total: AtomicU64::new(0),
        }
    }

    /// Counts `e`, and logs it unless one was logged within the last second.
    #[cold]
    pub(crate) fn report(&self, e: &RedisLimitError, answered_by: &'static str) {
        self.total.fetch_add(1, Relaxed);
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let next = self.next.load(Relaxed);
        let until = now.saturating_add(EVERY.as_nanos() as u64);
        if now < next
            || self
                .next
                .compare_exchange(next, until, Relaxed, Relaxed)
                .is_err()
        {
            self.suppressed.fetch_add(1, Relaxed);
            return;
        }
        let suppressed = self.suppressed.swap(0, Relaxed);
        tracing::error!(
            error = %e,
            suppressed,
            answered_by,
            "turnstile: Redis answered a rate-limit check with a configuration error (fix the server's ACL, data or scripts); at most one such event a second"
        );
    }

    /// How many errors were reported, logged or not.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }
}
