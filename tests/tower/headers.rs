//! The headers agree with the decision: over random request times on a `ManualClock`, a
//! request sent at the same instant as the one before it is refused exactly when that one's
//! `RateLimit` field said `r=0` (in any of its items: each is a limit the request must pass),
//! for every in-process limiter the layer takes, alone, per key and under `and`. A limiter
//! that cannot say its remaining quota sends no `RateLimit` field at all, rather than a
//! wrong one. (The fleet policies' fields come from their Redis scripts' own replies, on the
//! server's clock, which no test can stop between two requests.)
#![cfg(all(feature = "tower", feature = "axum"))]

use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use proptest::prelude::*;
use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::tower::{
    global, global_multi, key, per_key, per_key_multi, Headers, Policy, PolicyExt, RateLimitLayer,
};
use turnstile::{
    FixedWindow, Keyed, KeyedMultiTokenBucket, KeyedTokenBucket, LeakyBucket, LeakyMeter, Limit,
    ManualClock, Nanos, SketchTokenBucket, SlidingWindow, SmoothBursty, TokenBucket,
};

use crate::multi::{get_req, send, service};

const START: Nanos = Nanos::new(1_000_000_000);
const SECOND: Duration = Duration::from_secs(1);

/// What a response said: refused or not, and the smallest `r` of its `RateLimit` items
/// (`None` without the field).
fn read(resp: &http::Response<Body>) -> (bool, Option<u64>) {
    let refused = resp.status() == StatusCode::TOO_MANY_REQUESTS;
    let r = resp.headers().get("ratelimit").map(|v| {
        v.to_str()
            .unwrap()
            .split(", ")
            .map(|item| {
                let r = item.split(';').find_map(|p| p.strip_prefix("r=")).unwrap();
                r.parse::<u64>().unwrap()
            })
            .min()
            .unwrap()
    });
    (refused, r)
}

/// Sends a request after each of `steps` (milliseconds on `clock`, before it) through
/// `policy`'s layer, with the headers on every response, and checks each request sent at
/// the same instant as the one before against that one's `r`. Returns how many requests
/// were refused and how many pairs were checked, so that a caller can tell the sequence
/// reached the limit.
fn agree<P: Policy<Body>>(
    what: &str,
    policy: P,
    clock: &ManualClock,
    steps: &[u64],
    has_fields: bool,
) -> Result<(usize, usize), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut svc = service(RateLimitLayer::new(policy).headers(Headers::Always));
    let (mut refused, mut pairs) = (0, 0);
    let mut last: Option<(bool, Option<u64>)> = None;
    for (i, &ms) in steps.iter().enumerate() {
        clock.advance(Duration::from_millis(ms));
        let resp = rt.block_on(send(&mut svc, get_req("/")));
        let now = read(&resp);
        prop_assert_eq!(now.1.is_some(), has_fields, "{}: request {}", what, i);
        if let (0, Some((_, Some(r)))) = (ms, last) {
            pairs += 1;
            prop_assert_eq!(
                now.0,
                r == 0,
                "{}: request {} refused={} after r={}",
                what,
                i,
                now.0,
                r
            );
        }
        refused += usize::from(now.0);
        last = Some(now);
    }
    Ok((refused, pairs))
}

/// Request times: mostly at once (a burst), sometimes a little later, now and then after a
/// pause long enough to refill.
fn steps() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(
        prop_oneof![6 => Just(0u64), 3 => 1u64..400, 1 => 400u64..3000],
        1..60,
    )
}

/// Two limits: 4 a second with bursts of 3, and 10 a minute.
fn bandwidths() -> [Bandwidth; 2] {
    [
        Bandwidth::per(4, SECOND).burst_of(3),
        Bandwidth::per(10, 60 * SECOND),
    ]
}

/// One client's key (every request is the same client's).
fn one_client() -> impl key::KeyExtractor<Body, Key = u8> + Clone {
    key::from_fn(|_: &Request<Body>| Some(1u8))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_request_is_refused_exactly_when_the_one_before_said_r_0(steps in steps()) {
        let limit = Limit::per_second(4.0).unwrap();
        let mut refused = 0;
        macro_rules! case {
            ($what:expr, |$c:ident| $policy:expr, $fields:expr) => {{
                let $c = ManualClock::new(START);
                refused += agree($what, $policy, &$c, &steps, $fields)?.0;
            }};
        }
        case!("TokenBucket", |c| global("p", TokenBucket::builder(limit, 3).clock(c.clone()).build()), true);
        case!("LeakyMeter", |c| global("p", LeakyMeter::builder(3, limit).clock(c.clone()).build().unwrap()), true);
        case!("FixedWindow", |c| global("p", FixedWindow::builder(3, SECOND).clock(c.clone()).build().unwrap()), true);
        case!("SlidingWindow", |c| global("p", SlidingWindow::builder(3, SECOND).clock(c.clone()).build().unwrap()), true);
        case!("MultiTokenBucket", |c| global("p", MultiTokenBucket::builder(&bandwidths()).clock(c.clone()).build().unwrap()), true);
        case!("MultiTokenBucket, every limit", |c| global_multi("p", MultiTokenBucket::builder(&bandwidths()).clock(c.clone()).build().unwrap()), true);
        case!("Keyed<TokenBucket>", |c| per_key("p", one_client(), Keyed::builder({
            let c = c.clone();
            move |_: &u8| TokenBucket::builder(limit, 3).clock(c.clone()).build()
        }).clock(c.clone()).build().unwrap()), true);
        case!("Keyed<FixedWindow>", |c| per_key("p", one_client(), Keyed::builder({
            let c = c.clone();
            move |_: &u8| FixedWindow::builder(3, SECOND).clock(c.clone()).build().unwrap()
        }).clock(c.clone()).build().unwrap()), true);
        case!("KeyedTokenBucket", |c| per_key("p", one_client(), KeyedTokenBucket::builder(limit, 3).clock(c.clone()).build().unwrap()), true);
        case!("SketchTokenBucket", |c| per_key("p", one_client(), SketchTokenBucket::builder(limit, 3).clock(c.clone()).build().unwrap()), true);
        case!("KeyedMultiTokenBucket", |c| per_key_multi("p", one_client(), KeyedMultiTokenBucket::builder(&bandwidths()).clock(c.clone()).build().unwrap()), true);
        case!("KeyedTokenBucket and FixedWindow", |c| per_key("a", one_client(), KeyedTokenBucket::builder(limit, 3).clock(c.clone()).build().unwrap())
            .and(global("b", FixedWindow::builder(5, 2 * SECOND).clock(c.clone()).build().unwrap())), true);
        // No exact remaining quota to tell: no field, never a wrong one.
        case!("LeakyBucket", |c| global("p", LeakyBucket::builder(4).slack(2).clock(c.clone()).build().unwrap()), false);
        case!("SmoothBursty", |c| global("p", SmoothBursty::builder(4.0).clock(c.clone()).build().unwrap()), false);
        // Most sequences reach some limit: the property is not checked on grants alone.
        prop_assert!(refused > 0 || steps.iter().filter(|&&s| s == 0).count() < 3 || steps.len() < 4);
    }
}
