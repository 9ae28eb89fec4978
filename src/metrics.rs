//! turnstile's metrics, published through the [`metrics`](https://docs.rs/metrics) facade
//! (feature `metrics`) to whatever recorder the application installs: Prometheus,
//! OpenTelemetry, StatsD.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `turnstile_decisions_total` | counter | `policy`, `decision`, `mode` | decisions of a tower policy ([`crate::tower`]): `decision` is `allowed`, `refused` or `shadow_refused`; `mode` is `enforce` or `shadow`, the mode the request was judged under ([`Enforcement`](crate::tower::Enforcement); `enforce` for a policy without one) |
//!
//! `policy` is the name the policy was given ([`global`](crate::tower::global),
//! [`per_key`](crate::tower::per_key), …); policies of one name add up to one series.
//!
//! **Publication.** A check does not write the facade: every thread counts into cache lines
//! of its own, so that two threads checking at once never write one line, and [`publish`]
//! adds the lines up and hands the totals to the recorder. Call it where the metrics are
//! read: in the handler of a Prometheus `/metrics` endpoint before rendering (the totals are
//! then exact as of the scrape), or every few seconds for a recorder that pushes.
//!
//! ```
//! # #[cfg(feature = "tower")] {
//! use metrics_exporter_prometheus::PrometheusBuilder;
//! use turnstile::tower::{global, Ask, Policy};
//! use turnstile::{Limit, TokenBucket};
//!
//! let prometheus = PrometheusBuilder::new().build_recorder();
//! let handle = prometheus.handle();
//! metrics::with_local_recorder(&prometheus, || {
//!     let all = std::sync::Arc::new(global("all", TokenBucket::new(Limit::per_second(1.0).unwrap(), 1)));
//!     for _ in 0..3 {
//!         let _ = Policy::<()>::decide(&all, (), Ask::default());
//!     }
//!     turnstile::metrics::publish();
//! });
//! let text = handle.render();
//! assert!(text.contains(r#"turnstile_decisions_total{policy="all",decision="allowed",mode="enforce"} 1"#));
//! assert!(text.contains(r#"turnstile_decisions_total{policy="all",decision="refused",mode="enforce"} 2"#));
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::{Mutex, Weak};

use metrics::Label;

/// Hands every count turnstile keeps to the installed recorder (the global one, or the
/// thread's local one): each series' total since its sources were built, as a counter's
/// absolute value. Cheap enough for every scrape: a lock, and one pass over the live sources
/// and their stripes.
pub fn publish() {
    let mut totals = BTreeMap::<(&'static str, Vec<(&'static str, String)>), u64>::new();
    {
        let mut sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
        sources.retain(|s| s.strong_count() > 0);
        for s in sources.iter().filter_map(Weak::upgrade) {
            s.collect(&mut |series| {
                let labels = series
                    .labels
                    .iter()
                    .map(|&(k, v)| (k, v.to_owned()))
                    .collect();
                *totals.entry((series.name, labels)).or_default() += series.value;
            });
        }
    }
    for (name, help) in HELP {
        metrics::describe_counter!(*name, *help);
    }
    for ((name, labels), value) in totals {
        let labels: Vec<Label> = labels.into_iter().map(|(k, v)| Label::new(k, v)).collect();
        metrics::counter!(name, labels).absolute(value);
    }
}

/// The help text of every series.
const HELP: &[(&str, &str)] = &[(
    "turnstile_decisions_total",
    "Decisions of a rate-limit policy, by policy, decision and mode.",
)];

/// One series' value, as a [`Source`] hands it over.
pub(crate) struct Series<'a> {
    pub(crate) name: &'static str,
    pub(crate) labels: &'a [(&'static str, &'a str)],
    pub(crate) value: u64,
}

/// Something that keeps counts for [`publish`].
pub(crate) trait Source: Send + Sync {
    /// Calls `out` with each of its series.
    fn collect(&self, out: &mut dyn FnMut(Series<'_>));
}

/// Every source built, held weakly: a dropped policy's counts leave the totals (a counter's
/// absolute value never goes down, so its series keeps its last total).
static SOURCES: Mutex<Vec<Weak<dyn Source>>> = Mutex::new(Vec::new());

/// Adds `source` to what [`publish`] reads. Construction-time only.
// Only the tower policies count so far.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) fn register(source: Weak<dyn Source>) {
    SOURCES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(source);
}
