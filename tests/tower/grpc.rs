//! `turnstile::tower::RateLimitLayer` on a tonic server over real HTTP/2 on loopback: the layer
//! goes on `tonic::transport::Server::builder()`, in front of tonic-health's generated health
//! service, and a tonic client calls it. A refusal is `RESOURCE_EXHAUSTED` with `retry-after`
//! and the RateLimit fields in its metadata, sent as gRPC's trailers-only response (one
//! HEADERS frame that ends the stream, checked with a plain hyper HTTP/2 client). `PeerIp`
//! keys each client by the peer address tonic's server puts on the request. The limiter
//! runs on a `ManualClock`, so "retry after `Retry-After`" is an advance of that clock, never
//! a sleep.
#![cfg(feature = "tonic")]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use turnstile::tower::{global, key, per_key, Global, MissingKey, Policy, RateLimitLayer};
use turnstile::{KeyedTokenBucket, Limit, ManualClock, Nanos, TokenBucket};

type Bucket = TokenBucket<ManualClock>;

/// A token bucket of 1/s and burst 2 on `clock`: two calls, then one a second.
fn bucket(clock: &ManualClock) -> Global<Bucket> {
    global(
        "all",
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 2)
            .clock(clock.clone())
            .build(),
    )
}

/// Serves tonic-health's health service behind `layer` on 127.0.0.1, port 0.
async fn serve<P: Policy<tonic::body::Body>>(layer: RateLimitLayer<P>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // The reporter marks the "" service (the whole server) SERVING.
    let (reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        let _reporter = reporter;
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

async fn client(server: SocketAddr) -> HealthClient<Channel> {
    client_from(server, None).await
}

/// A client whose connection comes from `local` (127.0.0.x: a peer of its own).
async fn client_from(server: SocketAddr, local: Option<IpAddr>) -> HealthClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{server}"))
        .unwrap()
        .local_address(local)
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

/// One health check of the whole server.
async fn check(c: &mut HealthClient<Channel>) -> Result<ServingStatus, Status> {
    let resp = c
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    Ok(resp.into_inner().status())
}

fn meta<'a>(s: &'a Status, name: &str) -> Option<&'a str> {
    s.metadata().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn refused_with_resource_exhausted_and_the_headers_in_its_metadata_then_served_again() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let server = serve(RateLimitLayer::new(bucket(&clock))).await;
    let mut c = client(server).await;
    for _ in 0..2 {
        assert_eq!(check(&mut c).await.unwrap(), ServingStatus::Serving);
    }
    let s = check(&mut c).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert_eq!(s.message(), "rate limited");
    // 1/s: the next token in 1 s; the bucket refills from empty (2 tokens) in 2 s.
    assert_eq!(meta(&s, "retry-after"), Some("1"));
    assert_eq!(meta(&s, "ratelimit-policy"), Some(r#""all";q=2;w=2"#));
    assert_eq!(meta(&s, "ratelimit"), Some(r#""all";r=0;t=2"#));
    // Retry-After later, on the same channel, the call is served again; then refused again.
    clock.advance(Duration::from_secs(1));
    assert_eq!(check(&mut c).await.unwrap(), ServingStatus::Serving);
    let s = check(&mut c).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
}

/// One gRPC call of `/grpc.health.v1.Health/Check` over `send`: the response as received
/// (headers, and the body not yet read).
async fn raw_check(
    send: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    server: SocketAddr,
) -> http::Response<hyper::body::Incoming> {
    // A gRPC message frame: not compressed, length 0 (an empty HealthCheckRequest).
    let req = Request::post(format!("http://{server}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    send.send_request(req).await.unwrap()
}

#[tokio::test]
async fn a_refusal_is_trailers_only_one_headers_frame_that_ends_the_stream() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let server = serve(RateLimitLayer::new(bucket(&clock))).await;
    let tcp = tokio::net::TcpStream::connect(server).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    // Served: a message, then trailers with grpc-status 0, so the headers do not end it.
    for _ in 0..2 {
        let resp = raw_check(&mut send, server).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get("grpc-status").is_none());
        assert!(!resp.body().is_end_stream());
        let body = resp.into_body().collect().await.unwrap();
        assert_eq!(body.trailers().unwrap()["grpc-status"], "0");
    }
    // Refused: the status in the headers, and the stream already ended with them (h2 sets
    // is_end_stream only when the HEADERS frame carried END_STREAM and nothing is queued).
    let resp = raw_check(&mut send, server).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let h = resp.headers();
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "8");
    assert_eq!(h["grpc-message"], "rate%20limited");
    assert_eq!(h["retry-after"], "1");
    assert!(h.get("content-length").is_none(), "{h:?}");
    assert!(
        resp.body().is_end_stream(),
        "the refusal's HEADERS frame must end the stream"
    );
    let body = resp.into_body().collect().await.unwrap();
    assert!(body.trailers().is_none());
    assert!(body.to_bytes().is_empty());
}

#[tokio::test]
async fn without_grpc_refusals_a_tonic_client_reads_the_429_s_text_as_a_broken_message() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let server = serve(RateLimitLayer::new(bucket(&clock)).grpc(false)).await;
    let mut c = client(server).await;
    for _ in 0..2 {
        assert_eq!(check(&mut c).await.unwrap(), ServingStatus::Serving);
    }
    // No grpc-status header, so tonic decodes the body as gRPC messages before it looks at
    // the HTTP status: "Too Many Requests" starts with 'T' (84), not a compression flag.
    let s = check(&mut c).await.unwrap_err();
    assert_eq!(s.code(), Code::Internal, "{s:?}");
    assert_eq!(
        s.message(),
        "protocol error: received message with invalid compression flag: 84 (valid flags are \
         0 and 1) while receiving response with status: 429 Too Many Requests"
    );
    // The response's headers are the status's metadata all the same; the text's length is
    // exact, so it went as Content-Length.
    assert_eq!(meta(&s, "retry-after"), Some("1"));
    assert_eq!(meta(&s, "content-length"), Some("17"));
    assert_eq!(meta(&s, "ratelimit"), Some(r#""all";r=0;t=2"#));
    clock.advance(Duration::from_secs(1));
    assert_eq!(check(&mut c).await.unwrap(), ServingStatus::Serving);
}

#[tokio::test]
async fn without_grpc_refusals_and_with_no_body_a_tonic_client_maps_429_to_unavailable() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let layer = RateLimitLayer::new(bucket(&clock)).grpc(false).body("");
    let server = serve(layer).await;
    let mut c = client(server).await;
    for _ in 0..2 {
        assert_eq!(check(&mut c).await.unwrap(), ServingStatus::Serving);
    }
    // gRPC's HTTP-to-status mapping (doc/http-grpc-status-mapping.md): 429 is UNAVAILABLE
    // (a transient failure), not RESOURCE_EXHAUSTED as the layer's gRPC refusal says.
    let s = check(&mut c).await.unwrap_err();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(
        s.message(),
        "grpc-status header missing, mapped from HTTP status code 429"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(check(&mut c).await.unwrap(), ServingStatus::Serving);
}

#[tokio::test]
async fn per_ip_limits_key_each_peer_by_the_address_tonic_puts_on_the_request() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let map = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 2)
        .clock(clock.clone())
        .build()
        .unwrap();
    // A request PeerIp finds no address in is refused at once (with no RateLimit fields):
    // only a key read from tonic's TcpConnectInfo lets the first calls through.
    let policy = per_key("per-ip", key::PeerIp, map).on_missing_key(MissingKey::Deny);
    let layer = RateLimitLayer::new(policy);
    let server = serve(layer.clone()).await;
    let a: IpAddr = "127.0.0.2".parse().unwrap();
    let b: IpAddr = "127.0.0.3".parse().unwrap();
    let mut from_a = client_from(server, Some(a)).await;
    for _ in 0..2 {
        assert_eq!(check(&mut from_a).await.unwrap(), ServingStatus::Serving);
    }
    let s = check(&mut from_a).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert_eq!(meta(&s, "ratelimit"), Some(r#""per-ip";r=0;t=2"#));
    // Another peer has a burst of its own.
    let mut from_b = client_from(server, Some(b)).await;
    for _ in 0..2 {
        assert_eq!(check(&mut from_b).await.unwrap(), ServingStatus::Serving);
    }
    assert_eq!(
        check(&mut from_b).await.unwrap_err().code(),
        Code::ResourceExhausted
    );
    let map = layer.policy().map();
    assert_eq!(map.len(), 2);
    assert!(map.contains(&a) && map.contains(&b));
}
