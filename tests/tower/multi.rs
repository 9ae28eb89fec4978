//! The RateLimit fields of policies over limiters of several limits (`global_multi`,
//! `per_key_multi`): every limit in `RateLimit-Policy`, the binding one in `RateLimit`, exact
//! strings on allowed and refused responses of an axum router, on a `ManualClock`.
#![cfg(all(feature = "tower", feature = "axum"))]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tower::{Layer, Service};
use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::tower::{
    global, global_multi, key, per_key, per_key_multi, Headers, PolicyExt, RateLimit,
    RateLimitLayer,
};
use turnstile::{Clock, KeyedMultiTokenBucket, KeyedTokenBucket, Limit, ManualClock, Nanos};

pub(crate) const SECOND: Duration = Duration::from_secs(1);
pub(crate) const DAY: Duration = Duration::from_secs(86_400);

/// "burst": 2 a second, bursts of 4 (refills from empty in 2 s); "daily": 10 a day (one
/// token every 8640 s).
pub(crate) fn limits() -> [Bandwidth; 2] {
    [
        Bandwidth::per(2, SECOND).burst_of(4),
        Bandwidth::per(10, DAY),
    ]
}

pub(crate) fn bucket(clock: &ManualClock) -> MultiTokenBucket<ManualClock> {
    MultiTokenBucket::builder(&limits())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// `layer` over a router answering "ok" on every path used here.
pub(crate) fn service<P>(layer: RateLimitLayer<P>) -> RateLimit<Router, P> {
    let router = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/search", get(|| async { "ok" }))
        .route("/export", get(|| async { "ok" }))
        .route("/health", get(|| async { "ok" }));
    layer.layer(router)
}

/// One request through `svc`.
pub(crate) async fn send<S>(svc: &mut S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    std::future::poll_fn(|cx| svc.poll_ready(cx)).await.unwrap();
    svc.call(req).await.unwrap()
}

pub(crate) fn get_req(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

/// A request from peer `ip` (what `key::PeerIp` reads).
fn from_peer(path: &str, ip: &str) -> Request<Body> {
    let mut req = get_req(path);
    req.extensions_mut()
        .insert(format!("{ip}:5000").parse::<SocketAddr>().unwrap());
    req
}

pub(crate) fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

/// `(status, Retry-After, RateLimit-Policy, RateLimit)`.
pub(crate) fn fields(
    resp: &Response<Body>,
) -> (StatusCode, Option<&str>, Option<&str>, Option<&str>) {
    (
        resp.status(),
        header(resp, "retry-after"),
        header(resp, "ratelimit-policy"),
        header(resp, "ratelimit"),
    )
}

const POLICY: &str = r#""burst";q=4;w=2, "daily";q=10;w=86400"#;

#[tokio::test]
async fn two_limits_every_item_in_the_policy_the_binding_one_in_ratelimit() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let api = global_multi("api", bucket(&clock)).names(["burst", "daily"]);
    let mut svc = service(RateLimitLayer::new(api).headers(Headers::Always));
    // Allowed: "burst" holds 3 (full in 0.5 s), "daily" 9 (full in 8640 s): "burst" binds.
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(
        fields(&resp),
        (
            StatusCode::OK,
            None,
            Some(POLICY),
            Some(r#""burst";r=3;t=1"#)
        )
    );
    for _ in 0..3 {
        assert_eq!(send(&mut svc, get_req("/")).await.status(), StatusCode::OK);
    }
    // Refused: the burst is spent; its next token in 0.5 s, full in 2 s.
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(
        fields(&resp),
        (
            StatusCode::TOO_MANY_REQUESTS,
            Some("1"),
            Some(POLICY),
            Some(r#""burst";r=0;t=2"#)
        )
    );
}

#[tokio::test]
async fn the_binding_item_moves_to_the_daily_limit_once_it_holds_fewer() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let api = global_multi("api", bucket(&clock)).names(["burst", "daily"]);
    let layer = RateLimitLayer::new(api).headers(Headers::Always);
    let mut svc = service(layer.clone());
    let mut last = None;
    // 4 now and 4 two seconds later (the burst refilled): "daily" holds 2, "burst" 0.
    for _ in 0..2 {
        for _ in 0..4 {
            let resp = send(&mut svc, get_req("/")).await;
            assert_eq!(resp.status(), StatusCode::OK);
            last = Some(header(&resp, "ratelimit").unwrap().to_owned());
        }
        clock.advance(2 * SECOND);
    }
    assert_eq!(last.as_deref(), Some(r#""burst";r=0;t=2"#));
    // Four seconds in: "burst" full (4), "daily" 2. One more: "burst" 3, "daily" 1, which
    // binds: full again 9 tokens of 8640 s after the start, 4 s ago: 77 756 s, and a
    // fraction of a second more, as the bucket counts a reading up to one unit of its grid
    // early (never more tokens: `MultiTokenBucket::precision`), so 77 757 whole seconds.
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(
        fields(&resp),
        (
            StatusCode::OK,
            None,
            Some(POLICY),
            Some(r#""daily";r=1;t=77757"#)
        )
    );
    let mtb = layer.policy().limiter();
    let reset = mtb.status_at(clock.now())[1].reset;
    let exact = Duration::from_secs(77_756);
    assert!(
        reset > exact && reset <= exact + mtb.precision()[1],
        "{reset:?}"
    );
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(header(&resp, "ratelimit"), Some(r#""daily";r=0;t=86397"#));
    // Refused by the daily limit: its next token 8640 s after the start.
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(
        fields(&resp),
        (
            StatusCode::TOO_MANY_REQUESTS,
            Some("8636"),
            Some(POLICY),
            Some(r#""daily";r=0;t=86397"#)
        )
    );
}

#[tokio::test]
async fn default_names_are_the_policys_and_the_index_and_names_are_escaped() {
    let clock = ManualClock::new(Nanos::ZERO);
    let mut svc = service(RateLimitLayer::new(global_multi("api", bucket(&clock))));
    send(&mut svc, get_req("/")).await;
    for _ in 0..4 {
        send(&mut svc, get_req("/")).await;
    }
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some(r#""api-0";q=4;w=2, "api-1";q=10;w=86400"#)
    );
    assert_eq!(header(&resp, "ratelimit"), Some(r#""api-0";r=0;t=2"#));

    // Named in part: the rest keep their defaults. Quotes and backslashes escaped, bytes
    // outside visible ASCII (a tab, an é) dropped, as for a single policy's name.
    let named = global_multi("api", bucket(&clock)).names([r#"a "quoted"	name"#]);
    let mut svc = service(RateLimitLayer::new(named).headers(Headers::Always));
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some(r#""a \"quoted\"name";q=4;w=2, "api-1";q=10;w=86400"#)
    );
    let named = global_multi("api", bucket(&clock)).names([r"back\slash", "daily é"]);
    let mut svc = service(RateLimitLayer::new(named).headers(Headers::Always));
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some(r#""back\\slash";q=4;w=2, "daily ";q=10;w=86400"#)
    );
    assert_eq!(header(&resp, "ratelimit"), Some(r#""back\\slash";r=3;t=1"#));
}

/// A single-limit policy and a multi-limit one: three items in `RateLimit-Policy`, two
/// policies in `RateLimit` (the per-IP bucket, and the global bucket's binding limit).
#[tokio::test]
async fn a_single_and_a_multi_limit_policy_give_two_policies_in_ratelimit() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let per_ip = per_key(
        "per-ip",
        key::PeerIp,
        KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 3)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let api = global_multi("api", bucket(&clock)).names(["burst", "daily"]);
    let mut svc = service(RateLimitLayer::new(per_ip.and(api)).headers(Headers::Always));
    let resp = send(&mut svc, from_peer("/", "192.0.2.7")).await;
    assert_eq!(
        fields(&resp),
        (
            StatusCode::OK,
            None,
            Some(r#""per-ip";q=3;w=3, "burst";q=4;w=2, "daily";q=10;w=86400"#),
            Some(r#""per-ip";r=2;t=1, "burst";r=3;t=1"#)
        )
    );
}

/// `per_key` over the inline multi-limit map shows the key's binding limit under the
/// policy's name; `per_key_multi` every limit.
#[tokio::test]
async fn per_key_over_the_inline_multi_limit_map_one_item_or_every_limit() {
    let map = |clock: &ManualClock| {
        KeyedMultiTokenBucket::builder(&limits())
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let mut svc = service(
        RateLimitLayer::new(per_key("per-ip", key::PeerIp, map(&clock))).headers(Headers::Always),
    );
    let resp = send(&mut svc, from_peer("/", "192.0.2.7")).await;
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some(r#""per-ip";q=4;w=2"#)
    );
    assert_eq!(header(&resp, "ratelimit"), Some(r#""per-ip";r=3;t=1"#));

    let per_ip = per_key_multi("per-ip", key::PeerIp, map(&clock)).names(["ip-burst", "ip-daily"]);
    let mut svc = service(RateLimitLayer::new(per_ip));
    for _ in 0..4 {
        let resp = send(&mut svc, from_peer("/", "192.0.2.7")).await;
        assert_eq!(resp.status(), StatusCode::OK);
        // Refusals only (the default): an allowed response carries no fields.
        assert_eq!(header(&resp, "ratelimit"), None);
    }
    let resp = send(&mut svc, from_peer("/", "192.0.2.7")).await;
    assert_eq!(
        fields(&resp),
        (
            StatusCode::TOO_MANY_REQUESTS,
            Some("1"),
            Some(r#""ip-burst";q=4;w=2, "ip-daily";q=10;w=86400"#),
            Some(r#""ip-burst";r=0;t=2"#)
        )
    );
    // Another client is whole.
    let resp = send(&mut svc, from_peer("/", "192.0.2.8")).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

/// `global` over a multi-limit bucket (no names): one item, its binding limit, as before.
#[tokio::test]
async fn global_over_a_multi_limit_bucket_shows_its_binding_limit() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let mut svc =
        service(RateLimitLayer::new(global("api", bucket(&clock))).headers(Headers::Always));
    let resp = send(&mut svc, get_req("/")).await;
    assert_eq!(header(&resp, "ratelimit-policy"), Some(r#""api";q=4;w=2"#));
    assert_eq!(header(&resp, "ratelimit"), Some(r#""api";r=3;t=1"#));
}

/// A multi-limit report allocates what a single limit's does: one `Vec` (the names are built
/// once, at construction, and cloned by reference count); a decision not asked for a report,
/// with a cost or not, allocates nothing.
#[test]
fn a_multi_limit_report_allocates_as_a_single_ones_does() {
    use std::cell::Cell;
    use std::sync::Arc;
    use turnstile::tower::{Ask, Policy};
    use turnstile::TokenBucket;

    let count = |f: &mut dyn FnMut()| {
        let before = crate::hostile::ALLOCATIONS.with(Cell::get);
        f();
        crate::hostile::ALLOCATIONS.with(Cell::get) - before
    };
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let single = Arc::new(global(
        "all",
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 100)
            .clock(clock.clone())
            .build(),
    ));
    let multi = Arc::new(global_multi("api", bucket(&clock)).names(["burst", "daily"]));
    let costed = Arc::new(global_multi("api", bucket(&clock)).cost(|_: &Request<()>| 2));
    let always = Ask {
        report: true,
        report_grants: true,
        ..Ask::default()
    };
    let decide_single = |ask| Policy::<()>::decide(&single, (), ask).into_inner();
    let decide_multi = |ask| Policy::<()>::decide(&multi, (), ask).into_inner();
    let req = Request::new(());
    let decide_costed = |ask| {
        let key = Policy::<()>::key(&*costed, &req);
        Policy::<()>::decide(&costed, key, ask).into_inner()
    };
    // Warm up whatever a first call sets up (thread locals, the clock).
    drop((
        decide_single(always),
        decide_multi(always),
        decide_costed(always),
    ));
    let mut report = None;
    let one = count(&mut || report = Some(decide_single(always).report));
    assert_eq!(report.take().unwrap().items.len(), 1);
    let two = count(&mut || report = Some(decide_multi(always).report));
    assert_eq!(report.take().unwrap().items.len(), 2);
    assert_eq!((one, two), (1, 1));
    // A refusal's report: the same one allocation.
    for _ in 0..3 {
        drop(decide_multi(Ask::default()));
    }
    let mut decision = None;
    let refused = count(&mut || decision = Some(decide_multi(always)));
    let decision = decision.unwrap();
    assert!(decision.result.is_err());
    assert_eq!((decision.report.items.len(), refused), (2, 1));
    // No report asked for: nothing, with a cost or without.
    assert_eq!(count(&mut || drop(decide_multi(Ask::default()))), 0);
    assert_eq!(count(&mut || drop(decide_costed(Ask::default()))), 0);
}
