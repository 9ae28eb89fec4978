//! An axum server behind turnstile's tower layer: 10 requests a second per client IP (bursts
//! of 20) and 1000 a second for everyone, with the RateLimit headers on every response.
//!
//! ```text
//! cargo run --example axum --features tower,axum
//! curl -i http://127.0.0.1:3000/          # 200, with ratelimit-policy and ratelimit
//! for i in $(seq 25); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/; done
//! ```
//!
//! The 21st request of a quick burst gets `429 Too Many Requests` with `Retry-After: 1` and
//! `ratelimit: "per-ip";r=0;t=2`. `--addr HOST:PORT` picks another address (default
//! 127.0.0.1:3000); `--delay MS` waits up to that long instead of refusing at once.

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use turnstile::tower::{global, key, per_key, Headers, PolicyExt, RateLimitLayer};
use turnstile::{Keyed, Limit, TokenBucket};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut addr: SocketAddr = "127.0.0.1:3000".parse()?;
    let mut delay = Duration::ZERO;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--addr", Some(v)) => addr = v.parse()?,
            ("--delay", Some(v)) => delay = Duration::from_millis(v.parse()?),
            _ => {
                return Err(format!("usage: axum [--addr HOST:PORT] [--delay MS] (got {a})").into())
            }
        }
    }
    let per_ip = per_key(
        "per-ip",
        key::PeerIp,
        Keyed::new(|_| TokenBucket::new(Limit::per_second(10.0).unwrap(), 20)),
    );
    let everyone = global("all", TokenBucket::new(Limit::per_second(1000.0)?, 200));
    let layer = RateLimitLayer::new(per_ip.and(everyone))
        .headers(Headers::Always)
        .delay(delay);
    let app = Router::new()
        .route("/", get(|| async { "ok\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
