//! [`Observer`]: a policy's decisions, counted for [`crate::metrics`] (feature `metrics`);
//! without the feature, nothing at all, and the calls compile away.

#[cfg(feature = "metrics")]
use std::sync::Arc;

use super::Ask;

/// Counts one policy's decisions by decision and mode, under the policy's name.
pub(super) struct Observer {
    #[cfg(feature = "metrics")]
    counts: Arc<imp::Counts>,
}

impl Observer {
    /// The observer of the policy named `name`, registered with [`crate::metrics::publish`].
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn new(name: &str) -> Self {
        Observer {
            #[cfg(feature = "metrics")]
            counts: imp::Counts::registered(name),
        }
    }

    /// Counts a decision that `granted` (or not) under `ask`'s mode.
    #[inline(always)]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(super) fn record(&self, granted: bool, ask: &Ask) {
        #[cfg(feature = "metrics")]
        self.counts.record(granted, ask.enforced);
    }
}

#[cfg(feature = "metrics")]
mod imp {
    use std::sync::Arc;

    use crate::metrics::{register, Series, Source};
    use crate::striped_counters::StripedCounters;

    /// The series, in counter order: `(decision, mode)`.
    const SERIES: [(&str, &str); 4] = [
        ("allowed", "enforce"),
        ("allowed", "shadow"),
        ("refused", "enforce"),
        ("shadow_refused", "shadow"),
    ];

    pub(super) struct Counts {
        name: Box<str>,
        counts: StripedCounters<4>,
    }

    impl Counts {
        pub(super) fn registered(name: &str) -> Arc<Self> {
            let counts = Arc::new(Counts {
                name: name.into(),
                counts: StripedCounters::new(),
            });
            let source: Arc<dyn Source> = counts.clone();
            register(Arc::downgrade(&source));
            counts
        }

        #[inline(always)]
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
                        labels: &[
                            ("policy", &self.name),
                            ("decision", decision),
                            ("mode", mode),
                        ],
                        value,
                    });
                }
            }
        }
    }
}
