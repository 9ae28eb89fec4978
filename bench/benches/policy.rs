//! Issue #25: what counting a tower policy's decisions costs a check. `Policy::decide` of a
//! `per_key` policy over a `KeyedTokenBucket` (the state inline, SipHash, the real clock),
//! every check granted (1e9/s, burst `u32::MAX`), each thread checking a client of its own
//! (a server's threads serve different clients: the limiter's words are not shared, so a
//! counter every thread writes is the only shared line).
//!
//! Group `policy_check/<threads>t`, ids:
//! * `turnstile_metrics_off` or `turnstile_metrics_on`: the decision as this binary was built,
//!   without or with the bench's `metrics` feature (turnstile's: the decisions counted per
//!   thread, `src/striped_counters.rs`). `scripts/metrics-overhead` builds and runs both and
//!   prints their ratio.
//! * `turnstile_metrics_uncounted` (built with `metrics` and `--cfg turnstile_uncounted`):
//!   the control, the feature on but no decision counted (`src/tower/policy/observer.rs`).
//! * `facade_counter` (built without `metrics` only): the decision plus one increment of a
//!   Prometheus counter handle through the `metrics` facade, held across checks (the facade's
//!   cheapest use): one atomic counter every thread writes.
//!
//! Per-operation figures as in every turnstile bench (`bench/benches/harness`): the slowest
//! thread's time per operation, clock read included.

mod harness;

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::Request;
use criterion::{criterion_group, criterion_main, Criterion};
use harness::{cell, THREADS};
use turnstile::tower::{key, per_key, Ask, Policy};
use turnstile::{KeyedTokenBucket, Limit};

/// The clients handed out, one a thread.
static NEXT_CLIENT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static CLIENT: Cell<u64> = Cell::new(NEXT_CLIENT.fetch_add(1, Ordering::Relaxed));
}

fn policy_check(c: &mut Criterion) {
    let map = KeyedTokenBucket::builder(Limit::per_second(1e9).unwrap(), u32::MAX)
        .build()
        .expect("a valid map");
    let policy = Arc::new(per_key(
        "bench",
        key::from_fn(|_: &Request<()>| Some(0u64)),
        map,
    ));
    let decide = || {
        let client = CLIENT.with(Cell::get);
        let d = Policy::<()>::decide(black_box(&policy), Some(client), Ask::default()).into_inner();
        // All of it black-boxed, as the layer reads all of it (result, wait, report).
        assert!(black_box(&d).result.is_ok(), "a check was refused");
    };
    let id = if cfg!(turnstile_uncounted) {
        "turnstile_metrics_uncounted"
    } else if cfg!(feature = "metrics") {
        "turnstile_metrics_on"
    } else {
        "turnstile_metrics_off"
    };
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("policy_check/{threads}t"));
        cell(&mut g, id, threads, decide);
        if !cfg!(feature = "metrics") {
            let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            let counter = metrics::with_local_recorder(
                &prometheus,
                || metrics::counter!("bench_decisions_total", "decision" => "allowed"),
            );
            cell(&mut g, "facade_counter", threads, || {
                decide();
                counter.increment(1);
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = harness::config();
    targets = policy_check
}
criterion_main!(benches);
