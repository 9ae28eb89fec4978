//! turnstile's tower layer beside tower_governor's and no layer at all, in one run: the time
//! of one whole HTTP/1.1 request (hyper's server as `axum::serve` runs it, axum, the layer,
//! the handler, and a minimal client) over an in-memory connection
//! (`bench/examples/http/pipe.rs`), so that loopback TCP's scheduling noise, which swamps a layer's
//! cost in the load example (`bench/examples/http.rs`), is out of the figure. The servers are the
//! load example's (`bench/examples/http/cells.rs`): a layer keyed by peer IP.
//!
//! Groups, ids `no_layer`, `turnstile` (per-IP buckets in a `Keyed` map), `turnstile_inline`
//! (in a `KeyedTokenBucket`, one word per key) and `governor`:
//! * `http_allow`: a layer that allows every request (`no_layer` serves the bare router).
//! * `http_deny`: a layer that refuses all but the peer's first request: 429 with
//!   `Retry-After`, turnstile's with the IETF `RateLimit` fields too (its default).
//! * `http_deny_bare`: the same, turnstile's without the `RateLimit` fields (`Retry-After`
//!   only; tower_governor's default refusal has `Retry-After` and `x-ratelimit-after`).
//!
//! One thread, one request in flight; each sample times `iters` requests back to back.
//! `scripts/bench-ratios` prints turnstile over governor and over `no_layer` (its "floor"
//! column). `scripts/instructions http-allow http-deny http-deny-bare` counts the server's
//! instructions a request of the same cells, a figure that does not move with the machine.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};

// Shared with the HTTP examples, which serve cells this bench does not time.
#[allow(dead_code)]
#[path = "../examples/http/cells.rs"]
mod cells;
#[path = "../examples/http/pipe.rs"]
mod pipe;

/// The peer every request comes from.
const PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 40_000);

type Build = fn() -> Option<Router>;
/// A cell: its id, its router, the status its requests get.
type Cell = (&'static str, Build, u16);

/// Each group's cells.
const GROUPS: [(&str, [Cell; 4]); 3] = [
    (
        "http_allow",
        [
            ("no_layer", cells::no_layer_router, 200),
            ("turnstile", cells::turnstile_router, 200),
            ("turnstile_inline", cells::turnstile_inline_router, 200),
            ("governor", cells::governor_allow_router, 200),
        ],
    ),
    (
        "http_deny",
        [
            ("no_layer", cells::no_layer_router, 200),
            ("turnstile", cells::turnstile_deny_router, 429),
            ("turnstile_inline", cells::turnstile_inline_deny_router, 429),
            ("governor", cells::governor_deny_router, 429),
        ],
    ),
    (
        "http_deny_bare",
        [
            ("no_layer", cells::no_layer_router, 200),
            ("turnstile", cells::turnstile_deny_bare_router, 429),
            (
                "turnstile_inline",
                cells::turnstile_inline_deny_bare_router,
                429,
            ),
            ("governor", cells::governor_deny_router, 429),
        ],
    ),
];

fn requests(c: &mut Criterion) {
    for (group, cells) in GROUPS {
        let mut g = c.benchmark_group(group);
        for (id, build, expected) in cells {
            let router = build().expect("the cell's router");
            let mut pipe = pipe::Pipe::new(router, PEER).expect("an in-memory connection");
            // The peer's first request (allowed even by the refusing layers) creates its key.
            assert_eq!(pipe.request(), Ok(200), "{group}/{id}: the first request");
            g.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    let status = pipe.requests(iters);
                    let elapsed = start.elapsed();
                    // A cell that stopped getting its status measures something else.
                    assert_eq!(status, Ok(expected), "{group}/{id}");
                    elapsed
                })
            });
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_millis(2500))
        .sample_size(30);
    targets = requests
}
criterion_main!(benches);
