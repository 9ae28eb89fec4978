//! [`FleetObserver`]: what a [`fleet`](super::fleet) policy's Redis calls did, for
//! [`crate::metrics`] (feature `metrics`): each call's latency, its errors by kind, and the
//! state of the [`Fallback`](crate::redis::Fallback) and [`Coalesce`](crate::redis::Coalesce)
//! its limiter is or wraps. Without the feature, nothing at all.

use std::sync::Arc;

use crate::redis::{RedisLimitError, RedisLimiter};

/// A fleet policy's Redis figures, under the policy's name.
pub(super) struct FleetObserver {
    #[cfg(feature = "metrics")]
    inner: Arc<imp::FleetCounts>,
}

/// When a call started (with the feature `metrics`; nothing without).
#[cfg(feature = "metrics")]
pub(super) type Started = std::time::Instant;
#[cfg(not(feature = "metrics"))]
pub(super) struct Started;

impl FleetObserver {
    /// The observer of the fleet policy named `name` over `limiter`, registered with
    /// [`crate::metrics::publish`].
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn new<R: RedisLimiter + 'static>(name: &str, limiter: &Arc<R>) -> Self {
        FleetObserver {
            #[cfg(feature = "metrics")]
            inner: imp::FleetCounts::registered(name, limiter),
        }
    }

    /// A call starts.
    #[inline]
    pub(super) fn start(&self) -> Started {
        #[cfg(feature = "metrics")]
        return std::time::Instant::now();
        #[cfg(not(feature = "metrics"))]
        Started
    }

    /// The call that started at `started` ended, answered or not.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn ended(&self, started: Started) {
        #[cfg(feature = "metrics")]
        self.inner.ended(started.elapsed());
    }

    /// A call failed with `error`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn failed(&self, error: &RedisLimitError) {
        #[cfg(feature = "metrics")]
        self.inner.errors.add(error.kind_index(), 1);
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use std::sync::{Arc, OnceLock, Weak};
    use std::time::Duration;

    use crate::metrics::{register, Kind, Series, Source};
    use crate::redis::{CoalesceStats, FallbackStats, Mode, RedisLimiter, ERROR_KINDS};
    use crate::striped_counters::StripedCounters;

    /// What the source reads of the limiter: [`RedisLimiter`] is not object-safe (its
    /// checks return `impl Future`), so its two state methods go through this.
    trait RedisState: Send + Sync {
        fn fallback_state(&self) -> Option<(Mode, FallbackStats)>;
        fn coalesce_stats(&self) -> Option<CoalesceStats>;
    }

    impl<R: RedisLimiter> RedisState for R {
        fn fallback_state(&self) -> Option<(Mode, FallbackStats)> {
            RedisLimiter::fallback_state(self)
        }
        fn coalesce_stats(&self) -> Option<CoalesceStats> {
            RedisLimiter::coalesce_stats(self)
        }
    }

    pub(super) struct FleetCounts {
        name: Box<str>,
        pub(super) errors: StripedCounters<{ ERROR_KINDS.len() }>,
        limiter: Weak<dyn RedisState>,
        /// The latency histogram, bound to the recorder installed when the first call ended:
        /// a histogram's values go to the recorder as they come (the facade has no way to
        /// hand it a distribution), which costs a Redis call nothing it would notice.
        latency: OnceLock<metrics::Histogram>,
    }

    impl FleetCounts {
        pub(super) fn registered<R: RedisLimiter + 'static>(
            name: &str,
            limiter: &Arc<R>,
        ) -> Arc<Self> {
            let state: Arc<dyn RedisState> = limiter.clone();
            let counts = Arc::new(FleetCounts {
                name: name.into(),
                errors: StripedCounters::new(),
                limiter: Arc::downgrade(&state),
                latency: OnceLock::new(),
            });
            register(counts.clone());
            counts
        }

        pub(super) fn ended(&self, elapsed: Duration) {
            self.latency
                .get_or_init(|| {
                    metrics::describe_histogram!(
                        "turnstile_redis_call_seconds",
                        metrics::Unit::Seconds,
                        "A fleet policy's Redis calls, answered or not, by their time."
                    );
                    metrics::histogram!("turnstile_redis_call_seconds", "policy" => self.name.to_string())
                })
                .record(elapsed.as_secs_f64());
        }
    }

    impl Source for FleetCounts {
        fn collect(&self, out: &mut dyn FnMut(Series<'_>)) {
            let policy: &[(&str, &str)] = &[("policy", &self.name)];
            for (i, kind) in ERROR_KINDS.iter().enumerate() {
                let value = self.errors.get(i);
                if value > 0 {
                    out(Series {
                        name: "turnstile_redis_errors_total",
                        kind: Kind::Counter,
                        labels: &[("policy", &self.name), ("kind", kind)],
                        value,
                    });
                }
            }
            let Some(limiter) = self.limiter.upgrade() else {
                return;
            };
            let series = |name, kind, labels, value| Series {
                name,
                kind,
                labels,
                value,
            };
            if let Some((mode, s)) = limiter.fallback_state() {
                let fallback = u64::from(mode == Mode::Fallback);
                out(series(
                    "turnstile_fallback_mode",
                    Kind::Gauge,
                    policy,
                    fallback,
                ));
                for (to, value) in [
                    ("fallback", s.switches_to_fallback),
                    ("redis", s.switches_to_redis),
                ] {
                    out(Series {
                        name: "turnstile_fallback_switches_total",
                        kind: Kind::Counter,
                        labels: &[("policy", &self.name), ("to", to)],
                        value,
                    });
                }
                out(series(
                    "turnstile_fallback_misconfigurations_total",
                    Kind::Counter,
                    policy,
                    s.misconfigurations,
                ));
            }
            if let Some(s) = limiter.coalesce_stats() {
                out(series(
                    "turnstile_coalesce_checks_total",
                    Kind::Counter,
                    policy,
                    s.checks,
                ));
                out(series(
                    "turnstile_coalesce_calls_total",
                    Kind::Counter,
                    policy,
                    s.calls,
                ));
                out(series(
                    "turnstile_coalesce_queued",
                    Kind::Gauge,
                    policy,
                    s.queued,
                ));
            }
        }
    }
}
