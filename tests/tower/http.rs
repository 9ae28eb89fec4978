//! `turnstile::tower::RateLimitLayer` over real HTTP on loopback: an axum server (served with
//! `ConnectInfo<SocketAddr>`) driven by a hyper client whose connections can come from
//! different loopback addresses (127.0.0.2, 127.0.0.3, …: Linux routes all of 127/8 to lo), so
//! per-IP keys are real peers. Limiters run on a `ManualClock`, so "retry after
//! `Retry-After`" is an advance of that clock, never a sleep.
#![cfg(all(feature = "tower", feature = "axum"))]

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use turnstile::tower::key::{Cidr, ForwardedIp, PeerIp};
use turnstile::tower::{global, per_key, Headers, MissingKey, Policy, PolicyExt, RateLimitLayer};
use turnstile::{
    Clock, Keyed, KeyedTokenBucket, Limit, ManualClock, Nanos, SketchTokenBucket, TokenBucket,
};

type Bucket = TokenBucket<ManualClock>;
type Inline = KeyedTokenBucket<IpAddr, std::collections::hash_map::RandomState, ManualClock>;

/// Serves `app` on 127.0.0.1, port 0, with the peer address as `ConnectInfo`.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

fn app(layer: RateLimitLayer<impl Policy<axum::body::Body>>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// A client whose connections come from `from` (a loopback address).
fn client(from: &str) -> Client<HttpConnector, Empty<Bytes>> {
    let mut c = HttpConnector::new();
    c.set_local_address(Some(from.parse::<IpAddr>().unwrap()));
    Client::builder(TokioExecutor::new()).build(c)
}

struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

async fn get_from(
    c: &Client<HttpConnector, Empty<Bytes>>,
    server: SocketAddr,
    headers: &[(&str, &str)],
) -> Got {
    let mut b = Request::get(format!("http://{server}/"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = c.request(b.body(Empty::new()).unwrap()).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn header<'a>(g: &'a Got, name: &str) -> Option<&'a str> {
    g.headers.get(name).map(|v| v.to_str().unwrap())
}

/// Per-IP token buckets of `burst` at `per_sec`, on `clock`.
fn per_ip_buckets(
    clock: &ManualClock,
    per_sec: f64,
    burst: u32,
) -> Keyed<IpAddr, Bucket, ManualClock> {
    let c = clock.clone();
    Keyed::builder(move |_: &IpAddr| {
        TokenBucket::builder(Limit::per_second(per_sec).unwrap(), burst)
            .clock(c.clone())
            .build()
    })
    .clock(clock.clone())
    .build()
    .unwrap()
}

/// Per-IP token buckets of `burst` at `per_sec`, on `clock`, inline: a [`KeyedTokenBucket`].
fn per_ip_inline(clock: &ManualClock, per_sec: f64, burst: u32) -> Inline {
    KeyedTokenBucket::builder(Limit::per_second(per_sec).unwrap(), burst)
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn refused_after_the_burst_with_exact_headers_then_a_retry_after_retry_after_passes() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let layer = RateLimitLayer::new(per_key("per-ip", PeerIp, per_ip_buckets(&clock, 0.5, 3)));
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    for _ in 0..3 {
        let g = get_from(&c, server, &[]).await;
        assert_eq!((g.status, g.body.as_str()), (StatusCode::OK, "ok"));
        // Default: no RateLimit headers on allowed responses.
        assert!(header(&g, "ratelimit").is_none());
    }
    let g = get_from(&c, server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(g.body, "Too Many Requests");
    // 0.5/s: the next token in 2 s; the bucket full again in 6 s; it refills from empty in 6 s.
    assert_eq!(header(&g, "retry-after"), Some("2"));
    assert_eq!(header(&g, "ratelimit-policy"), Some(r#""per-ip";q=3;w=6"#));
    assert_eq!(header(&g, "ratelimit"), Some(r#""per-ip";r=0;t=6"#));
    // A little less than Retry-After is not enough; Retry-After is.
    clock.advance(Duration::from_millis(1_999));
    assert_eq!(
        get_from(&c, server, &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(get_from(&c, server, &[]).await.status, StatusCode::OK);
}

#[tokio::test]
async fn per_ip_keys_are_independent() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let layer = RateLimitLayer::new(per_key("per-ip", PeerIp, per_ip_buckets(&clock, 1.0, 2)));
    let server = serve(app(layer)).await;
    let (a, b) = (client("127.0.0.2"), client("127.0.0.3"));
    for _ in 0..2 {
        assert_eq!(get_from(&a, server, &[]).await.status, StatusCode::OK);
    }
    assert_eq!(
        get_from(&a, server, &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another peer has its own bucket.
    for _ in 0..2 {
        assert_eq!(get_from(&b, server, &[]).await.status, StatusCode::OK);
    }
    assert_eq!(
        get_from(&b, server, &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// The same with the inline map ([`KeyedTokenBucket`]): each peer its own bucket, 429 after
/// its burst with the bucket's exact fields, and a retry after `Retry-After` passes.
#[tokio::test]
async fn inline_per_ip_keys_are_independent_with_exact_headers_and_retry_after() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let layer = RateLimitLayer::new(per_key("per-ip", PeerIp, per_ip_inline(&clock, 0.5, 3)));
    let server = serve(app(layer)).await;
    let (a, b) = (client("127.0.0.2"), client("127.0.0.3"));
    let spend = |c| async move {
        for _ in 0..3 {
            let g = get_from(c, server, &[]).await;
            assert_eq!((g.status, g.body.as_str()), (StatusCode::OK, "ok"));
            // Default: no RateLimit headers on allowed responses.
            assert!(header(&g, "ratelimit").is_none());
        }
        let g = get_from(c, server, &[]).await;
        assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
        // 0.5/s: the next token in 2 s; full again in 6 s; it refills from empty in 6 s.
        assert_eq!(header(&g, "retry-after"), Some("2"));
        assert_eq!(header(&g, "ratelimit-policy"), Some(r#""per-ip";q=3;w=6"#));
        assert_eq!(header(&g, "ratelimit"), Some(r#""per-ip";r=0;t=6"#));
    };
    spend(&a).await;
    // Another peer has its own bucket, whole.
    spend(&b).await;
    // A little less than Retry-After is not enough; Retry-After is, for both.
    clock.advance(Duration::from_millis(1_999));
    for c in [&a, &b] {
        let g = get_from(c, server, &[]).await;
        assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&g, "retry-after"), Some("1"));
        assert_eq!(header(&g, "ratelimit"), Some(r#""per-ip";r=0;t=5"#));
    }
    clock.advance(Duration::from_millis(1));
    for c in [&a, &b] {
        assert_eq!(get_from(c, server, &[]).await.status, StatusCode::OK);
        assert_eq!(
            get_from(c, server, &[]).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

#[tokio::test]
async fn a_forged_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    // Only 127.0.0.5 is a trusted proxy.
    let proxies = ForwardedIp::x_forwarded_for(["127.0.0.5/32".parse::<Cidr>().unwrap()]);
    let layer = RateLimitLayer::new(per_key(
        "per-client",
        proxies,
        per_ip_buckets(&clock, 1.0, 1),
    ));
    let server = serve(app(layer)).await;
    let (client_a, proxy) = (client("127.0.0.2"), client("127.0.0.5"));
    // The client spends its one token, then forges headers to look like someone else.
    assert_eq!(
        get_from(&client_a, server, &[]).await.status,
        StatusCode::OK
    );
    for forged in [
        ("x-forwarded-for", "198.51.100.1"),
        ("forwarded", "for=198.51.100.2"),
    ] {
        let g = get_from(&client_a, server, &[forged]).await;
        assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS, "{forged:?}");
    }
    // Through the trusted proxy, the forwarded address is the key: a fresh bucket each.
    let xff = [("x-forwarded-for", "198.51.100.1")];
    assert_eq!(get_from(&proxy, server, &xff).await.status, StatusCode::OK);
    assert_eq!(
        get_from(&proxy, server, &xff).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let other = [("x-forwarded-for", "6.6.6.6, 198.51.100.3")];
    assert_eq!(
        get_from(&proxy, server, &other).await.status,
        StatusCode::OK
    );
    // And 127.0.0.2, forwarded by the proxy, is still the client that spent its token.
    let as_a = [("x-forwarded-for", "127.0.0.2")];
    assert_eq!(
        get_from(&proxy, server, &as_a).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn allowed_responses_carry_the_headers_when_asked() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let layer = RateLimitLayer::new(per_key("per-ip", PeerIp, per_ip_buckets(&clock, 10.0, 5)))
        .headers(Headers::Always);
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    for left in (0..5).rev() {
        let g = get_from(&c, server, &[]).await;
        assert_eq!(g.status, StatusCode::OK);
        assert_eq!(header(&g, "ratelimit-policy"), Some(r#""per-ip";q=5;w=1"#));
        let expected = format!(r#""per-ip";r={left};t=1"#);
        assert_eq!(header(&g, "ratelimit"), Some(expected.as_str()));
    }
}

/// On a real clock, a new key's first request is counted once in its headers: the key's
/// limiter is dated at the reading the check and the status use, so it is full at that
/// reading (one dated at a later reading would read as a moment short of full: one permit
/// and a second of reset off). 3 per 3 minutes: the test's time changes no whole second.
#[tokio::test]
async fn a_new_keys_first_request_on_a_real_clock_has_exact_headers() {
    let keyed = Keyed::new(|_: &IpAddr| TokenBucket::new(Limit::every(Duration::from_secs(60)), 3));
    let layer = RateLimitLayer::new(per_key("per-ip", PeerIp, keyed)).headers(Headers::Always);
    let server = serve(app(layer)).await;
    for peer in ["127.0.0.2", "127.0.0.3"] {
        let c = client(peer);
        for (left, reset) in [(2, 60), (1, 120)] {
            let g = get_from(&c, server, &[]).await;
            assert_eq!(g.status, StatusCode::OK);
            assert_eq!(
                header(&g, "ratelimit-policy"),
                Some(r#""per-ip";q=3;w=180"#)
            );
            let expected = format!(r#""per-ip";r={left};t={reset}"#);
            assert_eq!(header(&g, "ratelimit"), Some(expected.as_str()), "{peer}");
        }
    }
}

#[tokio::test]
async fn status_body_and_grpc() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let bucket = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
        .clock(clock.clone())
        .build();
    let layer = RateLimitLayer::new(global("all", bucket))
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .body("busy")
        .headers(Headers::Never);
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    assert_eq!(get_from(&c, server, &[]).await.status, StatusCode::OK);
    let g = get_from(&c, server, &[]).await;
    assert_eq!(
        (g.status, g.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "busy")
    );
    assert_eq!(header(&g, "retry-after"), Some("1"));
    assert!(header(&g, "ratelimit").is_none());
    // A gRPC call is refused the gRPC way: 200, grpc-status 8 (RESOURCE_EXHAUSTED).
    let g = get_from(&c, server, &[("content-type", "application/grpc+proto")]).await;
    assert_eq!(g.status, StatusCode::OK);
    assert_eq!(header(&g, "grpc-status"), Some("8"));
    assert_eq!(header(&g, "content-type"), Some("application/grpc"));
    assert_eq!(g.body, "");
}

#[tokio::test]
async fn keyless_requests_follow_the_configured_policy() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let api_key = turnstile::tower::key::Header(http::HeaderName::from_static("x-api-key"));
    let c2 = clock.clone();
    let keyed = Keyed::builder(move |_: &String| {
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(c2.clone())
            .build()
    })
    .clock(clock.clone())
    .build()
    .unwrap();
    let layer =
        RateLimitLayer::new(per_key("per-key", api_key, keyed).on_missing_key(MissingKey::Deny));
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    let g = get_from(&c, server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        header(&g, "retry-after").is_none(),
        "no wait makes a keyless request pass"
    );
    assert_eq!(
        get_from(&c, server, &[("x-api-key", "k1")]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_from(&c, server, &[("x-api-key", "k1")]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get_from(&c, server, &[("x-api-key", "k2")]).await.status,
        StatusCode::OK
    );
}

/// Two server instances, one Redis: one limit for both (a fleet of two).
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_redis_backed_layer_shared_by_two_servers_enforces_one_limit() {
    use common::redis_server::RedisServer;
    use turnstile::redis::Gcra;
    use turnstile::tower::fleet;

    let Some(redis) =
        RedisServer::start("a_redis_backed_layer_shared_by_two_servers_enforces_one_limit")
    else {
        return;
    };
    // 3 requests, then one a minute: the test's real time refills nothing that counts.
    let mut servers = Vec::new();
    for _ in 0..2 {
        let con = turnstile::redis::connect(&redis.url()).await.unwrap();
        let gcra = Gcra::new(con, Limit::every(Duration::from_secs(60)), 3).unwrap();
        let layer = RateLimitLayer::new(fleet("fleet-per-ip", PeerIp, gcra));
        servers.push(serve(app(layer)).await);
    }
    let c = client("127.0.0.2");
    let mut statuses = Vec::new();
    for i in 0..6 {
        let g = get_from(&c, servers[i % 2], &[]).await;
        if g.status == StatusCode::TOO_MANY_REQUESTS {
            // The server's retry-after: the next permit in up to a minute.
            let secs: u64 = header(&g, "retry-after").unwrap().parse().unwrap();
            assert!((55..=60).contains(&secs), "{secs}");
        }
        statuses.push(g.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    // Another client has its own key on the shared limit.
    let g = get_from(&client("127.0.0.3"), servers[1], &[]).await;
    assert_eq!(g.status, StatusCode::OK);
}

/// A Redis-backed layer's RateLimit headers come from the GCRA's own answer to each check:
/// 3 per minute, so the policy is q=3;w=180 and each grant leaves one permit fewer with the
/// bucket full a minute later. Redis's clock is real time, but a check on a full bucket
/// resets in exactly a minute and the later ones lose only the test's own time (well under a
/// second), so every value in whole seconds is exact.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_redis_backed_layer_sends_the_limiters_own_ratelimit_headers() {
    use common::redis_server::RedisServer;
    use turnstile::redis::Gcra;
    use turnstile::tower::fleet;

    let Some(redis) =
        RedisServer::start("a_redis_backed_layer_sends_the_limiters_own_ratelimit_headers")
    else {
        return;
    };
    let con = turnstile::redis::connect(&redis.url()).await.unwrap();
    let gcra = Gcra::new(con, Limit::every(Duration::from_secs(60)), 3).unwrap();
    let layer = RateLimitLayer::new(fleet("fleet", PeerIp, gcra)).headers(Headers::Always);
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    for (left, reset) in [(2, 60), (1, 120), (0, 180)] {
        let g = get_from(&c, server, &[]).await;
        assert_eq!(g.status, StatusCode::OK);
        assert_eq!(header(&g, "ratelimit-policy"), Some(r#""fleet";q=3;w=180"#));
        let expected = format!(r#""fleet";r={left};t={reset}"#);
        assert_eq!(header(&g, "ratelimit"), Some(expected.as_str()));
    }
    let g = get_from(&c, server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    // The next permit a minute after the first grant; the bucket full 3 minutes after it.
    assert_eq!(header(&g, "retry-after"), Some("60"));
    assert_eq!(header(&g, "ratelimit-policy"), Some(r#""fleet";q=3;w=180"#));
    assert_eq!(header(&g, "ratelimit"), Some(r#""fleet";r=0;t=180"#));
    // Another peer is another key: a full bucket of its own.
    let g = get_from(&client("127.0.0.3"), server, &[]).await;
    assert_eq!(header(&g, "ratelimit"), Some(r#""fleet";r=2;t=60"#));
}

/// The fleet policy over `Leased`: a peer's requests spend the process's lease of the shared
/// bucket, the refusal past it carries the refused-until time, and with Redis killed a request
/// that needs Redis is answered by the failure policy (in process) within the deadline.
#[cfg(feature = "redis")]
#[tokio::test]
async fn a_leased_fleet_layer_spends_its_lease_then_answers_by_its_failure_policy() {
    use common::redis_server::RedisServer;
    use turnstile::redis::{Gcra, Leased};
    use turnstile::tower::fleet;

    let Some(mut redis) = RedisServer::start(
        "a_leased_fleet_layer_spends_its_lease_then_answers_by_its_failure_policy",
    ) else {
        return;
    };
    let con = turnstile::redis::connect(&redis.url()).await.unwrap();
    let gcra = Gcra::new(con, Limit::every(Duration::from_secs(60)), 16).unwrap();
    let leased = Leased::builder(gcra).max_lease(4).build().unwrap();
    let layer = RateLimitLayer::new(fleet("leased", PeerIp, leased.clone()));
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    for i in 0..16 {
        assert_eq!(
            get_from(&c, server, &[]).await.status,
            StatusCode::OK,
            "request {i}"
        );
    }
    let g = get_from(&c, server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    // The next permit comes a minute after the first; the process asks again once its k
    // could be there, so the retry is at least that minute.
    let retry: u64 = header(&g, "retry-after").unwrap().parse().unwrap();
    assert!((60..=240).contains(&retry), "{retry}");
    assert!(
        leased.stats().redis_calls < 16,
        "leases of more than one permit"
    );
    // Redis gone: a new peer's request needs it, and the failure policy answers in time.
    redis.kill();
    let start = std::time::Instant::now();
    let g = get_from(&client("127.0.0.3"), server, &[]).await;
    assert_eq!(g.status, StatusCode::OK, "answered in process");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_request_refused_by_the_second_policy_takes_nothing_from_the_first() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    // Everyone shares 3; each peer has 1.
    let everyone = global(
        "all",
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 3)
            .clock(clock.clone())
            .build(),
    );
    let layer = RateLimitLayer::new(everyone.and(per_key(
        "per-ip",
        PeerIp,
        per_ip_buckets(&clock, 1.0, 1),
    )));
    let server = serve(app(layer)).await;
    let a = client("127.0.0.2");
    assert_eq!(get_from(&a, server, &[]).await.status, StatusCode::OK);
    // A's second: the global limit grants, A's own refuses, and the global grant is given
    // back (the refusal names A's policy).
    let g = get_from(&a, server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&g, "ratelimit-policy"), Some(r#""per-ip";q=1;w=1"#));
    // So the global limit still has 2, for two other peers; then it is spent.
    for peer in ["127.0.0.3", "127.0.0.4"] {
        assert_eq!(
            get_from(&client(peer), server, &[]).await.status,
            StatusCode::OK,
            "{peer}"
        );
    }
    let g = get_from(&client("127.0.0.5"), server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&g, "ratelimit-policy"), Some(r#""all";q=3;w=3"#));
}

/// The inline map's grant given back: per-IP inline buckets first, a global limit second;
/// a request the global limit refuses takes nothing from its peer's bucket.
#[tokio::test]
async fn a_request_refused_by_the_second_policy_takes_nothing_from_the_inline_first() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    // Each peer has 2 (refilling once a minute: not within this test); everyone shares 1 a
    // second.
    let per_ip = per_key("per-ip", PeerIp, per_ip_inline(&clock, 1.0 / 60.0, 2));
    let everyone = global(
        "all",
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(clock.clone())
            .build(),
    );
    let layer = RateLimitLayer::new(per_ip.and(everyone));
    let server = serve(app(layer)).await;
    let a = client("127.0.0.2");
    assert_eq!(get_from(&a, server, &[]).await.status, StatusCode::OK);
    // A's second: A's bucket grants, the global limit refuses, and A's grant is given back
    // (the refusal names the global policy).
    let g = get_from(&a, server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&g, "ratelimit-policy"), Some(r#""all";q=1;w=1"#));
    // So A still has 1: with the global token back, A passes once more, then its own bucket
    // is what refuses.
    clock.advance(Duration::from_secs(1));
    assert_eq!(get_from(&a, server, &[]).await.status, StatusCode::OK);
    clock.advance(Duration::from_secs(1));
    let g = get_from(&a, server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&g, "ratelimit-policy"),
        Some(r#""per-ip";q=2;w=120"#)
    );
    assert_eq!(header(&g, "ratelimit"), Some(r#""per-ip";r=0;t=118"#));
}

#[tokio::test]
async fn delay_mode_paces_requests_and_refuses_beyond_the_maximum_wait() {
    // A frozen limiter clock: every reservation's wait is exact and known in advance (the
    // waits themselves are real tokio sleeps, which never end early).
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let bucket = TokenBucket::builder(Limit::per_second(20.0).unwrap(), 1)
        .clock(clock.clone())
        .build();
    let layer = RateLimitLayer::new(global("all", bucket)).delay(Duration::from_millis(120));
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    let mut waited = Vec::new();
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let g = get_from(&c, server, &[]).await;
        assert_eq!(g.status, StatusCode::OK);
        waited.push(t0.elapsed());
    }
    // 20/s: the second request's permit is due 50 ms on, the third's 100 ms on.
    assert!(waited[1] >= Duration::from_millis(50), "{waited:?}");
    assert!(waited[2] >= Duration::from_millis(100), "{waited:?}");
    // The fourth would wait 150 ms, more than 120: refused at once, with the wait.
    let g = get_from(&c, server, &[]).await;
    assert_eq!(g.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&g, "retry-after"), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_while_waiting_gives_its_reservation_back() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let now = clock.now();
    let bucket = std::sync::Arc::new(
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(clock.clone())
            .build(),
    );
    let layer = RateLimitLayer::new(global("all", bucket.clone())).delay(Duration::from_secs(30));
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    assert_eq!(get_from(&c, server, &[]).await.status, StatusCode::OK);
    assert_eq!(bucket.tokens_at(now), 0.0);
    // The second request reserves the next token (1 s ahead) and waits for it...
    let waiting = tokio::spawn({
        let c = client("127.0.0.2");
        async move { get_from(&c, server, &[]).await.status }
    });
    common::eventually(
        Duration::from_secs(10),
        || bucket.tokens_at(now) < -0.5,
        "the reservation",
    )
    .await;
    // ...and its client goes away: the connection closes, the server drops the request,
    // and the token comes back.
    waiting.abort();
    common::eventually(
        Duration::from_secs(10),
        || bucket.tokens_at(now) > -0.5,
        "the refund",
    )
    .await;
    assert_eq!(bucket.tokens_at(now), 0.0);
}

/// A policy whose decision never comes (a backend that stalls, with no deadline of its own).
struct Stalled;

impl<B> Policy<B> for Stalled {
    type Key = ();
    type Grant = ();
    type Future = std::future::Pending<turnstile::tower::Decision<()>>;
    fn key(&self, _: &Request<B>) {}
    fn decide(self: &std::sync::Arc<Self>, _: (), _: turnstile::tower::Ask) -> Self::Future {
        std::future::pending()
    }
    fn refund(&self, _: ()) {}
}

/// `and`: a request whose client goes away while the second policy decides gives back the
/// first's permit (the server drops the request's future, and with it the decision).
#[tokio::test]
async fn a_request_dropped_while_the_second_policy_decides_gives_the_first_permit_back() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let now = clock.now();
    let bucket = std::sync::Arc::new(
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
            .clock(clock.clone())
            .build(),
    );
    let layer = RateLimitLayer::new(global("all", bucket.clone()).and(Stalled));
    let server = serve(app(layer)).await;
    let waiting = tokio::spawn({
        let c = client("127.0.0.2");
        async move { get_from(&c, server, &[]).await.status }
    });
    common::eventually(
        Duration::from_secs(10),
        || bucket.tokens_at(now) < 0.5,
        "the first policy's grant",
    )
    .await;
    waiting.abort();
    common::eventually(
        Duration::from_secs(10),
        || bucket.tokens_at(now) > 0.5,
        "the refund",
    )
    .await;
    assert_eq!(bucket.tokens_at(now), 1.0);
}

/// The inline map cannot reserve ahead: in delay mode a request it cannot grant now is
/// refused at once (not held until its token is due), and the refusal reserves nothing.
#[tokio::test]
async fn delay_mode_over_the_inline_map_refuses_at_once() {
    // A frozen limiter clock: a reservation would hold the request a real second on tokio's
    // timer and then answer 200; a refusal at once answers 429 (no timing asserted: the
    // status tells the two apart).
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let layer = RateLimitLayer::new(per_key("per-ip", PeerIp, per_ip_inline(&clock, 1.0, 1)))
        .delay(Duration::from_secs(30));
    let server = serve(app(layer)).await;
    let c = client("127.0.0.2");
    assert_eq!(get_from(&c, server, &[]).await.status, StatusCode::OK);
    let t0 = std::time::Instant::now();
    let g = get_from(&c, server, &[]).await;
    assert_eq!(
        g.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(header(&g, "retry-after"), Some("1"));
    // And nothing was reserved: the next token is the next request's, once.
    clock.advance(Duration::from_secs(1));
    assert_eq!(get_from(&c, server, &[]).await.status, StatusCode::OK);
    assert_eq!(
        get_from(&c, server, &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A [`SketchTokenBucket`] per client behind a trusted proxy: the client is its IPv6 /64 (the
/// extractor's default prefix), so twenty addresses of one /64 share one bucket, refused after
/// its burst with the bucket's exact fields; another /64 and an untrusted peer that forges the
/// header are clients of their own; a retry after `Retry-After` passes. The hasher is SipHash
/// with fixed keys, so the cells the test's keys get are the same on every run.
#[tokio::test]
async fn sketch_per_client_keys_by_ipv6_prefix_with_exact_headers() {
    type Fixed = std::hash::BuildHasherDefault<std::hash::DefaultHasher>;
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let sketch = SketchTokenBucket::<IpAddr, _, _>::builder(Limit::per_second(0.5).unwrap(), 3)
        .memory(1 << 16)
        .hasher(Fixed::default())
        .clock(clock.clone())
        .build()
        .unwrap();
    let proxies = ForwardedIp::x_forwarded_for(["127.0.0.5/32".parse::<Cidr>().unwrap()]);
    let layer = RateLimitLayer::new(per_key("per-client", proxies, sketch));
    let server = serve(app(layer)).await;
    let proxy = client("127.0.0.5");
    let mut statuses = Vec::new();
    let mut last = None;
    for n in 1..=20 {
        let xff = format!("2001:db8:1:2:{n:x}::{n:x}");
        let g = get_from(&proxy, server, &[("x-forwarded-for", xff.as_str())]).await;
        statuses.push(g.status.as_u16());
        last = Some(g);
    }
    assert_eq!(statuses[..4], [200, 200, 200, 429], "{statuses:?}");
    assert!(statuses[3..].iter().all(|&s| s == 429), "{statuses:?}");
    let g = last.unwrap();
    // 0.5/s: the next token in 2 s; full again in 6 s; it refills from empty in 6 s.
    assert_eq!(header(&g, "retry-after"), Some("2"));
    assert_eq!(
        header(&g, "ratelimit-policy"),
        Some(r#""per-client";q=3;w=6"#)
    );
    assert_eq!(header(&g, "ratelimit"), Some(r#""per-client";r=0;t=6"#));
    // Another /64 is another client, with its whole burst.
    let other = [("x-forwarded-for", "2001:db8:1:3::1")];
    for _ in 0..3 {
        assert_eq!(
            get_from(&proxy, server, &other).await.status,
            StatusCode::OK
        );
    }
    // A peer that is no trusted proxy is keyed by its own address, whatever it forwards.
    let direct = client("127.0.0.2");
    let forged = [("x-forwarded-for", "2001:db8:1:3::1")];
    assert_eq!(
        get_from(&direct, server, &forged).await.status,
        StatusCode::OK
    );
    // Retry-After later, the /64 gets one token, then is refused again.
    clock.advance(Duration::from_secs(2));
    let same = [("x-forwarded-for", "2001:db8:1:2::77")];
    assert_eq!(get_from(&proxy, server, &same).await.status, StatusCode::OK);
    assert_eq!(
        get_from(&proxy, server, &same).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}
