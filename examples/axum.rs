//! An axum server behind turnstile's tower layer: 10 requests a second per client IP (bursts
//! of 20) and 1000 a second for everyone, with the RateLimit headers on every response; a
//! stricter per-IP limit (2 a second, bursts of 5) being rolled out, in shadow mode unless
//! told otherwise; and the decisions of all three as Prometheus metrics at `/metrics`.
//!
//! ```text
//! cargo run --example axum --features tower,axum,metrics
//! curl -i http://127.0.0.1:3000/          # 200, with ratelimit-policy and ratelimit
//! for i in $(seq 25); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/; done
//! curl -s http://127.0.0.1:3000/metrics   # turnstile_decisions_total{policy=..,decision=..,mode=..}
//! ```
//!
//! The 21st request of a quick burst gets `429 Too Many Requests` with `Retry-After: 1` and
//! `ratelimit: "per-ip";r=0;t=2`; from the 6th on, the strict limit counts shadow refusals
//! (`decision="shadow_refused",mode="shadow"`) and refuses nothing. `--strict enforce`
//! enforces it, `--strict 0.1` for a tenth of the clients. `--addr HOST:PORT` picks another
//! address (default 127.0.0.1:3000); `--delay MS` waits up to that long instead of refusing
//! at once.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use turnstile::tower::{
    global, key, per_key, Enforcement, Headers, Mode, PolicyExt, RateLimitLayer,
};
use turnstile::{Clock, Keyed, KeyedTokenBucket, Limit, QuantaClock, TokenBucket};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut addr: SocketAddr = "127.0.0.1:3000".parse()?;
    let mut delay = Duration::ZERO;
    let mut strict = Mode::Shadow;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--addr", Some(v)) => addr = v.parse()?,
            ("--delay", Some(v)) => delay = Duration::from_millis(v.parse()?),
            ("--strict", Some(v)) => strict = mode(&v)?,
            _ => return Err(format!("usage: axum [--addr HOST:PORT] [--delay MS] [--strict shadow|enforce|FRACTION] (got {a})").into()),
        }
    }
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let app = app(
        QuantaClock::new(),
        delay,
        Enforcement::new(strict)?,
        prometheus,
    );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

/// `shadow`, `enforce`, or the fraction of clients enforced.
fn mode(v: &str) -> Result<Mode, String> {
    match v {
        "shadow" => Ok(Mode::Shadow),
        "enforce" => Ok(Mode::Enforce),
        f => f
            .parse()
            .map(Mode::Fraction)
            .map_err(|_| format!("--strict takes shadow, enforce or a fraction, not {f}")),
    }
}

/// The server: `/` behind the three policies on `clock`, the strict one under `strict`'s
/// mode (which the caller may change while it serves), and `/metrics` (not rate limited)
/// rendering `prometheus` after publishing turnstile's counts to it.
pub fn app<C: Clock + Clone + 'static>(
    clock: C,
    delay: Duration,
    strict: Enforcement,
    prometheus: PrometheusHandle,
) -> Router {
    let per_ip = per_key(
        "per-ip",
        key::PeerIp,
        Keyed::builder({
            let clock = clock.clone();
            move |_| {
                TokenBucket::builder(Limit::per_second(10.0).unwrap(), 20)
                    .clock(clock.clone())
                    .build()
            }
        })
        .clock(clock.clone())
        .build()
        .unwrap(),
    );
    let strict = per_key(
        "per-ip-strict",
        key::PeerIp,
        KeyedTokenBucket::builder(Limit::per_second(2.0).unwrap(), 5)
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
    .enforcement(strict);
    let everyone = global(
        "all",
        TokenBucket::builder(Limit::per_second(1000.0).unwrap(), 200)
            .clock(clock)
            .build(),
    );
    let layer = RateLimitLayer::new(per_ip.and(strict).and(everyone))
        .headers(Headers::Always)
        .delay(delay);
    Router::new()
        .route("/", get(|| async { "ok\n" }))
        .layer(layer)
        .route(
            "/metrics",
            get(move || async move {
                turnstile::metrics::publish();
                prometheus.render()
            }),
        )
}
