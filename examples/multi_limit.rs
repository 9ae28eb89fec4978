//! Two policies in the RateLimit fields: 10 requests a second per client IP (bursts of 20),
//! and for everyone together a bucket of two limits checked all-or-nothing in one step,
//! "burst" (100 a second, bursts of 200) and "daily" (100 000 a day); `/search` costs 5.
//!
//! ```text
//! cargo run --example multi_limit --features tower,axum                  # prints responses
//! cargo run --example multi_limit --features tower,axum -- --serve 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/search
//! ```
//!
//! Every response carries every limit in `RateLimit-Policy` and, in `RateLimit`, one item
//! per policy: the client's own bucket and the global bucket's binding limit (the one with
//! the fewest left):
//!
//! ```text
//! ratelimit-policy: "per-ip";q=20;w=2, "burst";q=200;w=2, "daily";q=100000;w=86400
//! ratelimit: "per-ip";r=19;t=1, "burst";r=199;t=1
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, Response};
use tower::Service;
use turnstile::multi_token_bucket::Bandwidth;
use turnstile::tower::{global_multi, key, per_key, Headers, PolicyExt, RateLimitLayer};
use turnstile::{KeyedTokenBucket, Limit, MultiTokenBucket};

const SECOND: Duration = Duration::from_secs(1);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let serve = match (args.next().as_deref(), args.next()) {
        (None, _) => None,
        (Some("--serve"), Some(addr)) => Some(addr.parse::<SocketAddr>()?),
        _ => return Err("usage: multi_limit [--serve HOST:PORT]".into()),
    };

    let per_ip = per_key(
        "per-ip",
        key::PeerIp,
        KeyedTokenBucket::new(Limit::per_second(10.0)?, 20),
    );
    let everyone = global_multi(
        "all",
        MultiTokenBucket::new(&[
            Bandwidth::per(100, SECOND).burst_of(200),
            Bandwidth::per(100_000, 86_400 * SECOND),
        ])?,
    )
    .names(["burst", "daily"]);
    // The cost is the server's choice, by route: never read from the client unchecked.
    let cost = |req: &Request<Body>| if req.uri().path() == "/search" { 5 } else { 1 };
    let layer = RateLimitLayer::new(per_ip.and(everyone).cost(cost)).headers(Headers::Always);
    let app = Router::new()
        .route("/", get(|| async { "ok\n" }))
        .route("/search", get(|| async { "results\n" }))
        .layer(layer);

    if let Some(addr) = serve {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        println!("listening on http://{}", listener.local_addr()?);
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await?;
        return Ok(());
    }

    // In process: one client's requests, straight into the router's service.
    let mut svc = app;
    let peer: SocketAddr = "192.0.2.7:5000".parse()?;
    for path in ["/", "/search", "/search", "/search", "/search"] {
        let mut req = Request::get(path).body(Body::empty())?;
        req.extensions_mut().insert(peer);
        show(path, &send(&mut svc, req).await);
    }
    Ok(())
}

async fn send<S>(svc: &mut S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    svc.call(req).await.unwrap()
}

fn show(path: &str, resp: &Response<Body>) {
    println!("GET {path} -> {}", resp.status());
    for name in ["retry-after", "ratelimit-policy", "ratelimit"] {
        if let Some(v) = resp.headers().get(name) {
            println!("  {name}: {}", v.to_str().unwrap_or("?"));
        }
    }
}
