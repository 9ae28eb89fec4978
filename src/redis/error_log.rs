//! [`ErrorLog`]: failures logged at most once a second per limiter or policy.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::RedisLimitError;
use crate::{Clock, Nanos, QuantaClock};

/// The most one limiter (or one tower `fleet` policy) logs of its failures: one event per
/// this span, the ones in between counted in the next event's `suppressed` field.
const EVERY: Duration = Duration::from_secs(1);

/// A gate for rate-limited `tracing` events about failures that every request meets while
/// they last (`NOPERM`, a script error, `WRONGTYPE`, an outage under the `fleet` policy): a
/// log line per request would flood the logs. Lock-free: three atomics, and the clock read
/// only on the failure path.
#[derive(Debug, Default)]
pub(crate) struct ErrorLog {
    /// The quanta reading before which nothing more is logged.
    next: AtomicU64,
    suppressed: AtomicU64,
    total: AtomicU64,
}

impl ErrorLog {
    pub(crate) fn new() -> Self {
        ErrorLog::default()
    }

    /// Counts a failure at `now`: `Some(failures not logged since the last event)` if this
    /// one is to be logged, `None` if it is counted among them.
    pub(crate) fn admit_at(&self, now: Nanos) -> Option<u64> {
        self.total.fetch_add(1, Relaxed);
        let next = self.next.load(Relaxed);
        let until = now.saturating_add(EVERY).as_u64();
        if now.as_u64() < next
            || self
                .next
                .compare_exchange(next, until, Relaxed, Relaxed)
                .is_err()
        {
            self.suppressed.fetch_add(1, Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Relaxed))
    }

    /// [`ErrorLog::admit_at`] on the process's clock.
    #[cold]
    pub(crate) fn admit(&self) -> Option<u64> {
        self.admit_at(QuantaClock::new().now())
    }

    /// Counts the configuration error `e`, and logs it unless one was logged within the
    /// last second.
    #[cold]
    pub(crate) fn report(&self, e: &RedisLimitError, answered_by: &'static str) {
        let Some(suppressed) = self.admit() else {
            return;
        };
        tracing::error!(
            error = %e,
            suppressed,
            answered_by,
            "turnstile: Redis answered a rate-limit check with a configuration error (fix the server's ACL, data or scripts); at most one such event a second"
        );
    }

    /// How many failures were counted, logged or not.
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_at_most_once_a_second_with_the_count_it_left_out() {
        let log = ErrorLog::new();
        let s = |ms: u64| Nanos::new(5_000_000_000 + ms * 1_000_000);
        assert_eq!(log.admit_at(s(0)), Some(0));
        assert_eq!(log.admit_at(s(1)), None);
        assert_eq!(log.admit_at(s(999)), None);
        assert_eq!(log.admit_at(s(1_000)), Some(2));
        assert_eq!(log.admit_at(s(1_500)), None);
        assert_eq!(log.admit_at(s(2_000)), Some(1));
        assert_eq!(log.total(), 6);
    }
}
