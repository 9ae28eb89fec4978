//! turnstile's metrics, published through the [`metrics`](https://docs.rs/metrics) facade
//! (feature `metrics`) to whatever recorder the application installs: Prometheus,
//! OpenTelemetry, StatsD.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `turnstile_decisions_total` | counter | `policy`, `decision`, `mode` | decisions of a tower policy ([`crate::tower`]): `decision` is `allowed`, `refused` or `shadow_refused`; `mode` is `enforce` or `shadow`, the mode the request was judged under ([`Enforcement`](crate::tower::Enforcement); `enforce` for a policy without one) |
//! | `turnstile_near_limit_total` | counter | `policy` | grants that left at most `1 - fraction` of the quota, for a policy given a [`near_limit`](crate::tower::PerKey::near_limit) fraction (Envoy's "near limit") |
//! | `turnstile_keys` | gauge | `policy` | keys a `per_key` policy's map holds (not for a map that holds none, the sketch) |
//! | `turnstile_keys_max` | gauge | `policy` | the most keys it holds: its bound |
//! | `turnstile_evictions_total` | counter | `policy` | idle keys its sweeps evicted |
//! | `turnstile_map_full_total` | counter | `policy` | new keys that found it full (refused, or let through untracked): a key flood, or a bound too small |
//! | `turnstile_wait_seconds` | histogram | `policy` | how long a policy made each granted request wait for its reserved permits ([delay mode](crate::tower::RateLimitLayer::delay); only the policies that reserve ahead) |
//! | `turnstile_redis_call_seconds` | histogram | `policy` | a [`fleet`](crate::tower::fleet) policy's Redis calls, answered or not, by their time (up to its deadline) |
//! | `turnstile_redis_errors_total` | counter | `policy`, `kind` | its calls that failed, by [`RedisLimitError::kind`](crate::redis::RedisLimitError::kind) (`timeout`, `io`, `oom`, `readonly`, …) |
//! | `turnstile_fallback_mode` | gauge | `policy` | 1 while its [`Fallback`](crate::redis::Fallback) answers in process, 0 while Redis does |
//! | `turnstile_fallback_switches_total` | counter | `policy`, `to` | the fallback's switches, `to="fallback"` and `to="redis"` |
//! | `turnstile_fallback_misconfigurations_total` | counter | `policy` | calls Redis answered with a misconfiguration, answered in process |
//! | `turnstile_coalesce_checks_total`, `turnstile_coalesce_calls_total` | counter | `policy` | checks its [`Coalesce`](crate::redis::Coalesce) answered, and the round trips it sent for them: their ratio is the batch size |
//! | `turnstile_coalesce_queued` | gauge | `policy` | checks waiting behind a call in flight |
//!
//! `policy` is the name the policy was given ([`global`](crate::tower::global),
//! [`per_key`](crate::tower::per_key), …); policies of one name add up to one series.
//!
//! The fallback and coalescing series appear for a fleet policy whose limiter is or wraps
//! one. The Redis series need the feature `redis` too.
//!
//! **Publication.** A check does not write the facade: every thread counts into cache lines
//! of its own, so that two threads checking at once never write one line, and [`publish`]
//! adds the lines up and hands the totals to the recorder. Call it where the metrics are
//! read: in the handler of a Prometheus `/metrics` endpoint before rendering (the totals are
//! then exact as of the scrape), or every few seconds for a recorder that pushes. The
//! exceptions are the histograms (waits, Redis calls), whose values go to the recorder as
//! they come (the facade takes a histogram's values one by one), through the recorder
//! installed at a policy's first value: install it before serving.
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
use std::sync::{Arc, Mutex}; // Mutex: the registry, off the hot path (see `SOURCES`)

use metrics::Label;

/// Hands every count turnstile keeps to the installed recorder (the global one, or the
/// thread's local one): each series' total since its sources were built, a counter's as its
/// absolute value, a gauge's as its value. Cheap enough for every scrape: a lock, and one
/// pass over the live sources and their stripes.
pub fn publish() {
    type Labels = Vec<(&'static str, String)>;
    let mut totals = BTreeMap::<(&'static str, Labels), (Kind, u64)>::new();
    {
        let mut sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
        // Another holder (the policy counting into it) or a live subject keeps a source.
        sources.retain(|s| Arc::strong_count(s) > 1 || s.alive());
        for s in sources.iter() {
            s.collect(&mut |series| {
                let labels = series
                    .labels
                    .iter()
                    .map(|&(k, v)| (k, v.to_owned()))
                    .collect();
                let total = totals
                    .entry((series.name, labels))
                    .or_insert((series.kind, 0));
                total.1 += series.value;
            });
        }
    }
    for (name, kind, help) in HELP {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
        }
    }
    for ((name, labels), (kind, value)) in totals {
        let labels: Vec<Label> = labels.into_iter().map(|(k, v)| Label::new(k, v)).collect();
        match kind {
            Kind::Counter => metrics::counter!(name, labels).absolute(value),
            Kind::Gauge => metrics::gauge!(name, labels).set(value as f64),
        }
    }
}

/// The kind and help text of every series.
const HELP: &[(&str, Kind, &str)] = &[
    (
        "turnstile_decisions_total",
        Kind::Counter,
        "Decisions of a rate-limit policy, by policy, decision and mode.",
    ),
    (
        "turnstile_near_limit_total",
        Kind::Counter,
        "Grants that left a policy's quota at or past its near-limit fraction used.",
    ),
    (
        "turnstile_keys",
        Kind::Gauge,
        "Keys a per-key policy's map holds.",
    ),
    (
        "turnstile_keys_max",
        Kind::Gauge,
        "The most keys a per-key policy's map holds.",
    ),
    (
        "turnstile_evictions_total",
        Kind::Counter,
        "Idle keys a per-key policy's map evicted.",
    ),
    (
        "turnstile_map_full_total",
        Kind::Counter,
        "New keys that found a per-key policy's map full: refused, or let through untracked.",
    ),
    (
        "turnstile_redis_errors_total",
        Kind::Counter,
        "A fleet policy's Redis calls that failed, by kind.",
    ),
    (
        "turnstile_fallback_mode",
        Kind::Gauge,
        "1 while a fleet policy's fallback answers in process, 0 while Redis does.",
    ),
    (
        "turnstile_fallback_switches_total",
        Kind::Counter,
        "A fleet policy's fallback's mode switches, by the mode switched to.",
    ),
    (
        "turnstile_fallback_misconfigurations_total",
        Kind::Counter,
        "Calls Redis answered with a misconfiguration, answered in process.",
    ),
    (
        "turnstile_coalesce_checks_total",
        Kind::Counter,
        "Checks a fleet policy's coalescer answered.",
    ),
    (
        "turnstile_coalesce_calls_total",
        Kind::Counter,
        "Round trips a fleet policy's coalescer sent.",
    ),
    (
        "turnstile_coalesce_queued",
        Kind::Gauge,
        "Checks waiting behind a coalescer's call in flight.",
    ),
];

/// A series' type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Only grows: published as a counter's absolute value.
    Counter,
    /// Any value: published as a gauge.
    Gauge,
}

/// One series' value, as a [`Source`] hands it over.
pub(crate) struct Series<'a> {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) labels: &'a [(&'static str, &'a str)],
    pub(crate) value: u64,
}

/// Something that keeps counts for [`publish`].
pub(crate) trait Source: Send + Sync {
    /// Calls `out` with each of its series.
    fn collect(&self, out: &mut dyn FnMut(Series<'_>));

    /// Whether it still has something to say when the registry holds the only reference
    /// to it (a source that reads something it does not own). The default: no.
    fn alive(&self) -> bool {
        false
    }
}

/// Every source built. A lock, off the hot path: taken when a policy is built and by
/// [`publish`], never by a check (which writes only its own counters). One is dropped (at a
/// publication) once nothing but this list holds it and it is not [`Source::alive`]: a
/// dropped policy's counts leave the totals (a counter's absolute value never goes down, so
/// its series keeps its last total).
static SOURCES: Mutex<Vec<Arc<dyn Source>>> = Mutex::new(Vec::new()); // build, publish: off the hot path

/// Adds `source` to what [`publish`] reads. Construction-time only.
// Only the tower policies count so far.
#[cfg_attr(not(feature = "tower"), allow(dead_code))]
pub(crate) fn register(source: Arc<dyn Source>) {
    SOURCES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(source);
}
