//! A request's cost read from the request (`PolicyExt::cost`): a route that costs 5 drains 5
//! from every limit, a cost past a burst is refused with no `Retry-After`, a free request
//! passes untouched, refunds give back the whole cost, delay mode reserves it; and a client
//! that tries to choose its own cost through a header the extractor reads.
#![cfg(all(feature = "tower", feature = "axum"))]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use turnstile::tower::{
    global, global_multi, key, per_key, Ask, Policy, PolicyExt, RateLimitLayer,
};
use turnstile::{Clock, KeyedTokenBucket, Limit, ManualClock, Nanos, TokenBucket};

use crate::multi::{fields, get_req, header, send, service};

/// 5 for "/search", 11 for "/export" (past every burst here), 0 for "/health", else 1.
fn by_route(req: &Request<Body>) -> u32 {
    match req.uri().path() {
        "/search" => 5,
        "/export" => 11,
        "/health" => 0,
        _ => 1,
    }
}

/// The `x-cost` header, capped: at least 1 (bad input or 0 is not free) and at most `max`.
fn capped_header(max: u32) -> impl Fn(&Request<Body>) -> u32 + Send + Sync + 'static {
    move |req| {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.trim().parse::<u32>().ok())
            .unwrap_or(1)
            .clamp(1, max)
    }
}

#[tokio::test]
async fn a_route_that_costs_5_drains_5_from_every_limit_and_past_a_burst_is_refused() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    // "burst": 2/s, bursts of 8; "daily": 10 a day.
    let limits = [
        turnstile::multi_token_bucket::Bandwidth::per(2, Duration::from_secs(1)).burst_of(8),
        turnstile::multi_token_bucket::Bandwidth::per(10, Duration::from_secs(86_400)),
    ];
    let mtb = turnstile::MultiTokenBucket::builder(&limits)
        .clock(clock.clone())
        .build()
        .unwrap();
    let layer = RateLimitLayer::new(
        global_multi("api", mtb)
            .names(["burst", "daily"])
            .cost(by_route),
    )
    .headers(turnstile::tower::Headers::Always);
    let mut svc = service(layer.clone());
    let status = |i: usize| {
        layer
            .policy()
            .policy()
            .limiter()
            .status_at(Nanos::new(1_000_000_000))[i]
            .remaining
    };

    let resp = send(&mut svc, get_req("/search")).await;
    assert_eq!(
        fields(&resp),
        (
            StatusCode::OK,
            None,
            Some(r#""burst";q=8;w=4, "daily";q=10;w=86400"#),
            Some(r#""burst";r=3;t=3"#)
        )
    );
    assert_eq!((status(0), status(1)), (3, 5));
    // Past the first limit's burst: refused, never curable, so no Retry-After; nothing taken.
    let resp = send(&mut svc, get_req("/export")).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "retry-after"), None);
    assert_eq!((status(0), status(1)), (3, 5));
    // A free route passes without taking anything, even once the limits are spent.
    for _ in 0..3 {
        assert_eq!(send(&mut svc, get_req("/")).await.status(), StatusCode::OK);
    }
    assert_eq!(
        send(&mut svc, get_req("/")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&mut svc, get_req("/health")).await.status(),
        StatusCode::OK
    );
    assert_eq!((status(0), status(1)), (0, 2));
}

/// The single-limit bucket: the same rules, with the fields of one item.
#[tokio::test]
async fn the_cost_of_a_request_on_a_single_bucket_and_past_its_burst() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let tb = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 10)
        .clock(clock.clone())
        .build();
    let layer = RateLimitLayer::new(global("all", tb).cost(by_route));
    let mut svc = service(layer.clone());
    let tokens = || {
        layer
            .policy()
            .policy()
            .limiter()
            .tokens_at(Nanos::new(1_000_000_000))
    };
    assert_eq!(
        send(&mut svc, get_req("/search")).await.status(),
        StatusCode::OK
    );
    assert_eq!(tokens(), 5.0);
    let resp = send(&mut svc, get_req("/export")).await;
    assert_eq!(
        fields(&resp),
        (
            StatusCode::TOO_MANY_REQUESTS,
            None,
            Some(r#""all";q=10;w=10"#),
            Some(r#""all";r=5;t=5"#)
        )
    );
    assert_eq!(tokens(), 5.0);
    // The 5 left pay for one more "/search"; the next is curable, in 5 s.
    assert_eq!(
        send(&mut svc, get_req("/search")).await.status(),
        StatusCode::OK
    );
    let resp = send(&mut svc, get_req("/search")).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "retry-after"), Some("5"));
}

/// `first.and(second).cost(f)` charges both; a refusal by `second` gives `first` back the
/// whole cost.
#[tokio::test]
async fn a_refusal_by_the_second_policy_gives_back_the_whole_cost() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let t0 = clock.now();
    let bucket = |burst| {
        Arc::new(
            TokenBucket::builder(Limit::per_second(1.0).unwrap(), burst)
                .clock(clock.clone())
                .build(),
        )
    };
    let (first, second) = (bucket(10), bucket(3));
    let policy = global("first", first.clone())
        .and(global("second", second.clone()))
        .cost(by_route);
    let mut svc = service(RateLimitLayer::new(policy));
    // 5 > the second's 3: refused, and the first has its 10 back.
    let resp = send(&mut svc, get_req("/search")).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "ratelimit"), Some(r#""second";r=3;t=0"#));
    assert_eq!((first.tokens_at(t0), second.tokens_at(t0)), (10.0, 3.0));
    // A cost of 1 passes both, and takes 1 from each.
    assert_eq!(send(&mut svc, get_req("/")).await.status(), StatusCode::OK);
    assert_eq!((first.tokens_at(t0), second.tokens_at(t0)), (9.0, 2.0));
}

/// Delay mode reserves the whole cost: a request that costs 5 from an empty bucket of 1/s
/// waits 5 s; one past the burst is refused at once.
#[test]
fn delay_mode_reserves_the_whole_cost() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let tb = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 5)
        .clock(clock.clone())
        .build();
    let p = Arc::new(global("all", tb).cost(by_route));
    let ask = Ask {
        max_wait: Duration::from_secs(30),
        ..Ask::default()
    };
    let decide = |path: &str| {
        let key = Policy::<Body>::key(&*p, &get_req(path));
        Policy::<Body>::decide(&p, key, ask).into_inner()
    };
    let d = decide("/search");
    assert!(d.result.is_ok());
    assert_eq!(d.wait, Duration::ZERO);
    let d = decide("/search");
    assert!(d.result.is_ok());
    assert_eq!(d.wait, Duration::from_secs(5));
    // Given back (the waiter went away): the whole 5.
    Policy::<Body>::refund(&*p, d.result.unwrap());
    assert_eq!(decide("/search").wait, Duration::from_secs(5));
    // Past the burst: no wait makes it pass.
    let d = decide("/export");
    assert_eq!(d.result.unwrap_err().retry_at(), None);
}

/// A client that sets `x-cost` to choose its price: the extractor caps it, so a huge cost
/// takes the cap (the server's choice) and a zero, negative or malformed one counts 1, never
/// free. Without a cap, a cost of `u32::MAX` is a refusal with no `Retry-After` that takes
/// nothing; and a free request never inserts a key, so a client allowed cost 0 cannot grow
/// a per-key map.
#[tokio::test]
async fn a_client_cannot_choose_its_own_cost() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let t0 = clock.now();
    let tb = Arc::new(
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 100)
            .clock(clock.clone())
            .build(),
    );
    let mut svc = service(RateLimitLayer::new(
        global("all", tb.clone()).cost(capped_header(8)),
    ));
    let with_cost = |v: &str| {
        let mut req = get_req("/");
        req.headers_mut().insert("x-cost", v.parse().unwrap());
        req
    };
    let mut expected = 100.0;
    for (sent, charged) in [
        ("4294967295", 8.0),
        ("99999999999999999999", 1.0), // past u32: malformed
        ("0", 1.0),
        ("-5", 1.0),
        ("3", 3.0),
        ("abc", 1.0),
    ] {
        assert_eq!(
            send(&mut svc, with_cost(sent)).await.status(),
            StatusCode::OK
        );
        expected -= charged;
        assert_eq!(tb.tokens_at(t0), expected, "x-cost: {sent}");
    }
    let long = "9".repeat(8 * 1024);
    assert_eq!(
        send(&mut svc, with_cost(&long)).await.status(),
        StatusCode::OK
    );
    assert_eq!(tb.tokens_at(t0), expected - 1.0);

    // No cap: the largest cost is refused, never curable, and takes nothing.
    let uncapped = |req: &Request<Body>| {
        req.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
            .unwrap_or(1)
    };
    let tb = Arc::new(
        TokenBucket::builder(Limit::per_second(1.0).unwrap(), 100)
            .clock(clock.clone())
            .build(),
    );
    let mut svc = service(RateLimitLayer::new(
        global("all", tb.clone()).cost(uncapped),
    ));
    let resp = send(&mut svc, with_cost("4294967295")).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&resp, "retry-after"), None);
    assert_eq!(tb.tokens_at(t0), 100.0);

    // Free requests from a thousand keys: no key inserted.
    let per_ip = per_key(
        "per-ip",
        key::Header("x-client".parse().unwrap()),
        KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 10)
            .clock(clock.clone())
            .build()
            .unwrap(),
    )
    .cost(uncapped);
    let layer = RateLimitLayer::new(per_ip);
    let mut svc = service(layer.clone());
    for i in 0..1000 {
        let mut req = with_cost("0");
        req.headers_mut()
            .insert("x-client", i.to_string().parse().unwrap());
        assert_eq!(send(&mut svc, req).await.status(), StatusCode::OK);
    }
    assert_eq!(layer.policy().policy().map().len(), 0);
}

/// The same through a per-key map: the key's bucket gets the whole cost back.
#[tokio::test]
async fn a_per_key_grant_is_given_back_whole() {
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let t0 = clock.now();
    let per_client = per_key(
        "per-client",
        key::Header("x-client".parse().unwrap()),
        KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 10)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let all = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 3)
        .clock(clock.clone())
        .build();
    let layer = RateLimitLayer::new(per_client.and(global("all", all)).cost(by_route));
    let mut svc = service(layer.clone());
    let req = |path: &str| {
        let mut req = get_req(path);
        req.headers_mut()
            .insert("x-client", "alice".parse().unwrap());
        req
    };
    let both = layer.policy().policy();
    let alice = || both.first().map().tokens_at("alice", t0);
    assert_eq!(
        send(&mut svc, req("/search")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(alice(), 10.0);
    assert_eq!(send(&mut svc, req("/")).await.status(), StatusCode::OK);
    assert_eq!(alice(), 9.0);
}
