//! [`RefusalAlarm`]: a `tracing` warning when a policy refuses more requests a second than
//! its operator set (feature `tracing`), at most one a second; without the feature, or
//! unset, nothing but a branch on the refusal path.

use super::Ask;
use crate::Nanos;

/// A policy's refusal alarm: off unless the policy was given a threshold.
#[derive(Default)]
pub(super) struct RefusalAlarm {
    #[cfg(feature = "tracing")]
    inner: Option<Box<imp::Alarm>>,
}

impl RefusalAlarm {
    /// An alarm at `per_second` refusals a second for the policy named `name`.
    #[cfg(feature = "tracing")]
    pub(super) fn new(name: &str, per_second: u64) -> Self {
        RefusalAlarm {
            inner: Some(Box::new(imp::Alarm::new(name, per_second))),
        }
    }

    /// A refusal at `at` under `ask`, of the key `key` names (when the operator lets the
    /// event show keys).
    #[inline(always)]
    #[cfg_attr(not(feature = "tracing"), allow(unused_variables))]
    pub(super) fn refused(&self, at: Nanos, ask: &Ask, key: impl FnOnce() -> Option<String>) {
        #[cfg(feature = "tracing")]
        if let Some(alarm) = &self.inner {
            alarm.refused(at, ask.enforced, key);
        }
    }
}

#[cfg(feature = "tracing")]
mod imp {
    use crate::striped_counters::StripedCounters;
    use crate::sync::{AtomicU64, Ordering};
    use crate::Nanos;

    /// The window the rate is measured over, at least: a second.
    const WINDOW: u64 = 1_000_000_000;

    pub(super) struct Alarm {
        name: Box<str>,
        per_second: u64,
        /// Refusals, per thread (a flood of refusals writes no shared line).
        refusals: StripedCounters<1>,
        /// When the window being counted started (ns on the policy's clock).
        since: AtomicU64,
        /// The refusals counted before it.
        before: AtomicU64,
    }

    impl Alarm {
        pub(super) fn new(name: &str, per_second: u64) -> Self {
            Alarm {
                name: name.into(),
                per_second,
                refusals: StripedCounters::new(),
                since: AtomicU64::new(0),
                before: AtomicU64::new(0),
            }
        }

        /// Counts a refusal; past the window's end, the one refusal whose CAS closes the
        /// window judges it (`Relaxed` throughout: the figures only go in a log line).
        #[inline]
        pub(super) fn refused(
            &self,
            at: Nanos,
            enforced: bool,
            key: impl FnOnce() -> Option<String>,
        ) {
            self.refusals.add(0, 1);
            let since = self.since.load(Ordering::Relaxed);
            if at.as_u64() < since.saturating_add(WINDOW) {
                return;
            }
            self.close(since, at, enforced, key);
        }

        #[cold]
        #[inline(never)]
        fn close(
            &self,
            since: u64,
            at: Nanos,
            enforced: bool,
            key: impl FnOnce() -> Option<String>,
        ) {
            if self
                .since
                .compare_exchange(since, at.as_u64(), Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                return;
            }
            let total = self.refusals.get(0);
            let refusals = total.saturating_sub(self.before.swap(total, Ordering::Relaxed));
            let secs = (at.as_u64() - since) as f64 / 1e9;
            if refusals as f64 / secs < self.per_second as f64 {
                return;
            }
            let mode = if enforced { "enforce" } else { "shadow" };
            match key() {
                Some(key) => tracing::warn!(
                    policy = &*self.name,
                    refusals,
                    seconds = secs,
                    threshold_per_second = self.per_second,
                    mode,
                    key = %key,
                    "turnstile: a policy refused more requests a second than its alarm threshold; `key` is the one refused last"
                ),
                None => tracing::warn!(
                    policy = &*self.name,
                    refusals,
                    seconds = secs,
                    threshold_per_second = self.per_second,
                    mode,
                    "turnstile: a policy refused more requests a second than its alarm threshold"
                ),
            }
        }
    }
}
