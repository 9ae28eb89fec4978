//! [`Observer`]: a policy's decisions, counted for [`crate::metrics`] (feature `metrics`);
//! without the feature, nothing at all, and the calls compile away.

use std::sync::Arc;

use super::{Ask, PerKeyMap};

/// Counts one policy's decisions by decision and mode, under the policy's name.
pub(super) struct Observer {
    #[cfg(feature = "metrics")]
    counts: Arc<imp::Counts>,
    /// The share of the quota a grant must leave used to count as near the limit, in
    /// millionths (exact arithmetic: 0.8 of 10 is 8, not 7.999…); none unless set.
    #[cfg(feature = "metrics")]
    near: Option<u64>,
}

impl Observer {
    /// The observer of the policy named `name`, registered with [`crate::metrics::publish`].
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn new(name: &str) -> Self {
        Observer {
            #[cfg(feature = "metrics")]
            counts: imp::Counts::registered(name),
            #[cfg(feature = "metrics")]
            near: None,
        }
    }

    /// Counts the grants that leave at most `1 - fraction` of the quota (`fraction` in
    /// `(0, 1]`).
    #[cfg(feature = "metrics")]
    pub(super) fn near_limit(&mut self, fraction: f64) -> Result<(), crate::ConfigError> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(crate::ConfigError::NearLimitFraction(fraction));
        }
        self.near = Some((fraction * 1e6).round() as u64);
        Ok(())
    }

    /// Whether a grant's status is wanted (near-limit counting is on).
    #[inline(always)]
    pub(super) fn wants_status(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.near.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// A grant that left `status` (if known): counted if near the limit.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn granted(&self, status: Option<crate::QuotaStatus>) {
        #[cfg(feature = "metrics")]
        if let (Some(ppm), Some(s)) = (self.near, status) {
            let used = u128::from(s.quota.saturating_sub(s.remaining));
            if used * 1_000_000 >= u128::from(ppm) * u128::from(s.quota) {
                self.counts.near();
            }
        }
    }

    /// The observer of the `per_key` policy named `name` over `map`, which also publishes
    /// the map's [`PerKeyMap::stats`].
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn with_map<K: 'static, M: PerKeyMap<K>>(name: &str, map: &Arc<M>) -> Self {
        #[cfg(feature = "metrics")]
        imp::register_map(name, map);
        Observer::new(name)
    }

    /// Records the `wait` a granted request was given (delay mode), if any and if it will
    /// wait (a client not enforced goes on at once).
    #[inline(always)]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn waited(&self, wait: std::time::Duration, ask: &Ask) {
        // `max_wait` first: a policy asked to reserve nothing ahead has no wait (and the
        // check that decided so already tested it).
        #[cfg(feature = "metrics")]
        if !ask.max_wait.is_zero() && !wait.is_zero() && ask.enforced {
            self.counts.waited(wait);
        }
    }

    /// Counts a decision that `granted` (or not) under `ask`'s mode.
    ///
    /// `--cfg turnstile_uncounted` leaves the count out: scripts/metrics-overhead's control
    /// build, with the feature but no decision counted, which tells the count's own cost
    /// apart from everything else two builds differ in.
    #[inline(always)]
    #[cfg_attr(
        any(not(feature = "metrics"), turnstile_uncounted),
        allow(unused_variables)
    )]
    pub(super) fn record(&self, granted: bool, ask: &Ask) {
        #[cfg(all(feature = "metrics", not(turnstile_uncounted)))]
        self.counts.record(granted, ask.enforced);
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use std::marker::PhantomData;
    use std::sync::{Arc, OnceLock, Weak};

    use super::PerKeyMap;
    use crate::metrics::{register, Kind, Series, Source};
    use crate::striped_counters::StripedCounters;

    /// A `per_key` policy's map, read at each publication.
    struct MapSource<K, M> {
        name: Box<str>,
        map: Weak<M>,
        key: PhantomData<fn(&K)>,
    }

    pub(super) fn register_map<K: 'static, M: PerKeyMap<K>>(name: &str, map: &Arc<M>) {
        if map.stats().is_none() {
            return;
        }
        let source: Arc<dyn Source> = Arc::new(MapSource {
            name: name.into(),
            map: Arc::downgrade(map),
            key: PhantomData::<fn(&K)>,
        });
        // Held by the registry alone, which drops it once the map is gone (`alive`).
        register(source);
    }

    impl<K: 'static, M: PerKeyMap<K>> Source for MapSource<K, M> {
        fn alive(&self) -> bool {
            self.map.strong_count() > 0
        }

        fn collect(&self, out: &mut dyn FnMut(Series<'_>)) {
            let Some(s) = self.map.upgrade().and_then(|m| m.stats()) else {
                return;
            };
            let labels: &[(&str, &str)] = &[("policy", &self.name)];
            for (name, kind, value) in [
                ("turnstile_keys", Kind::Gauge, s.keys),
                ("turnstile_keys_max", Kind::Gauge, s.max_keys),
                ("turnstile_evictions_total", Kind::Counter, s.evicted),
                ("turnstile_map_full_total", Kind::Counter, s.full),
            ] {
                out(Series {
                    name,
                    kind,
                    labels,
                    value,
                });
            }
        }
    }

    /// The series, in counter order: `(decision, mode)`.
    const SERIES: [(&str, &str); 4] = [
        ("allowed", "enforce"),
        ("allowed", "shadow"),
        ("refused", "enforce"),
        ("shadow_refused", "shadow"),
    ];

    pub(super) struct Counts {
        name: Box<str>,
        /// By [`SERIES`], then the near-limit grants.
        counts: StripedCounters<5>,
        /// The waits histogram, bound to the recorder installed at the first wait (a
        /// histogram's values go to the facade one by one; a request that waits sleeps far
        /// longer than the recording takes).
        waits: OnceLock<metrics::Histogram>,
    }

    impl Counts {
        pub(super) fn registered(name: &str) -> Arc<Self> {
            let counts = Arc::new(Counts {
                name: name.into(),
                counts: StripedCounters::new(),
                waits: OnceLock::new(),
            });
            register(counts.clone());
            counts
        }

        pub(super) fn near(&self) {
            self.counts.add(SERIES.len(), 1);
        }

        #[cold]
        pub(super) fn waited(&self, wait: std::time::Duration) {
            self.waits
                .get_or_init(|| {
                    metrics::describe_histogram!(
                        "turnstile_wait_seconds",
                        metrics::Unit::Seconds,
                        "How long a policy made granted requests wait for their permits (delay mode)."
                    );
                    metrics::histogram!("turnstile_wait_seconds", "policy" => self.name.to_string())
                })
                .record(wait.as_secs_f64());
        }

        #[inline(always)]
        #[cfg_attr(turnstile_uncounted, allow(dead_code))] // the control build counts nothing
        pub(super) fn record(&self, granted: bool, enforced: bool) {
            // The index into SERIES: refusals after grants, shadow after enforce.
            let i = (usize::from(!granted) << 1) | usize::from(!enforced);
            self.counts.add(i, 1);
        }
    }

    impl Source for Counts {
        fn collect(&self, out: &mut dyn FnMut(Series<'_>)) {
            for (i, (decision, mode)) in SERIES.iter().enumerate() {
                let value = self.counts.get(i);
                if value > 0 {
                    out(Series {
                        name: "turnstile_decisions_total",
                        kind: Kind::Counter,
                        labels: &[
                            ("policy", &self.name),
                            ("decision", decision),
                            ("mode", mode),
                        ],
                        value,
                    });
                }
            }
            let near = self.counts.get(SERIES.len());
            if near > 0 {
                out(Series {
                    name: "turnstile_near_limit_total",
                    kind: Kind::Counter,
                    labels: &[("policy", &self.name)],
                    value: near,
                });
            }
        }
    }
}
