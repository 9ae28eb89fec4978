//! Rate limiting as tower middleware (feature `tower`): for axum, hyper and tonic servers.
//!
//! A [`RateLimitLayer`] asks a [`Policy`] about every request before the inner service sees
//! it. A request the policy refuses gets `429 Too Many Requests` (configurable) with
//! `Retry-After` in whole seconds, rounded up, and the IETF RateLimit fields of
//! draft-ietf-httpapi-ratelimit-headers in their structured-field form:
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=20;w=2
//! RateLimit: "per-ip";r=0;t=1
//! ```
//!
//! `q` is the quota (a bucket's burst, a window's quota), `w` the window in seconds (a
//! bucket's time to refill from empty), `r` what is left and `t` the seconds until the quota
//! is whole again: each limiter's own figures ([`Limiter::quota_at`](crate::Limiter::quota_at)),
//! not estimates. Allowed responses carry them too with [`RateLimitLayer::headers`]. A gRPC
//! request (`content-type: application/grpc…`) is refused the gRPC way: HTTP 200 with
//! `grpc-status: 8` (`RESOURCE_EXHAUSTED`) and no body (a "trailers-only" response), which
//! tonic clients read as a status whose metadata carries the same `retry-after` and RateLimit
//! fields.
//!
//! Policies compose: [`global`] (one limiter for everything), [`per_key`] (a per-key map,
//! [`PerKeyMap`], with a [`key::KeyExtractor`]: the peer's IP, a trusted proxy's
//! `X-Forwarded-For`, a header, any function; the map is a [`Keyed`](crate::Keyed), any
//! limiter per key, or a [`KeyedTokenBucket`](crate::KeyedTokenBucket), a token bucket per
//! key with its state inline, the cheaper check but without [`RateLimitLayer::delay`]) and
//! [`PolicyExt::and`] (both must pass; a request the second refuses gives back what the first
//! granted, so it takes nothing from either).
//!
//! **Several limits, one policy.** A [`MultiTokenBucket`](crate::MultiTokenBucket) ("20 a
//! second with bursts of 40, and 10 000 a day", checked all-or-nothing in one atomic step)
//! under [`global_multi`], or a [`KeyedMultiTokenBucket`](crate::KeyedMultiTokenBucket) under
//! [`per_key_multi`], reports each limit as an item of its own, named by `.names([..])` (by
//! default `"{policy}-0"`, `"{policy}-1"`, …). Every item goes in `RateLimit-Policy`, so a
//! client learns the whole policy; `RateLimit` carries one item per policy, as the draft
//! allows: for a multi-limit policy its **binding** limit, the one with the fewest permits
//! left (the longest reset among equals), which is the one that refuses first. Its `r` is
//! what the client may send now (no other limit admits less) and its `t` when that changes,
//! so a client reading `RateLimit` alone paces itself right, and the field stays one item
//! long on every response; when the daily limit comes to hold fewer than the burst, the
//! item becomes the daily one. (Under plain [`global`] or [`per_key`] such a limiter is one
//! item under the policy's name: its binding limit's.)
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::time::Duration;
//! use tower::{Layer, Service};
//! use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
//! use turnstile::tower::{global_multi, Headers, RateLimitLayer};
//! use turnstile::{ManualClock, Nanos};
//!
//! const SECOND: Duration = Duration::from_secs(1);
//! let limits = [Bandwidth::per(20, SECOND).burst_of(40), Bandwidth::per(10_000, 86_400 * SECOND)];
//! let mtb = MultiTokenBucket::builder(&limits).clock(ManualClock::new(Nanos::ZERO)).build().unwrap();
//! let api = global_multi("api", mtb).names(["burst", "daily"]);
//! let layer = RateLimitLayer::new(api).headers(Headers::Always);
//! let mut svc = layer.layer(axum::Router::new().route("/", axum::routing::get(|| async { "ok" })));
//! let req = || http::Request::get("/").body(axum::body::Body::empty()).unwrap();
//! std::future::poll_fn(|cx| Service::<http::Request<axum::body::Body>>::poll_ready(&mut svc, cx)).await.unwrap();
//! let resp = svc.call(req()).await.unwrap();
//! assert_eq!(resp.headers()["ratelimit-policy"], r#""burst";q=40;w=2, "daily";q=10000;w=86400"#);
//! assert_eq!(resp.headers()["ratelimit"], r#""burst";r=39;t=1"#);
//! # }
//! # #[cfg(not(feature = "axum"))]
//! # fn main() {}
//! ```
//!
//! **A request's cost.** [`PolicyExt::cost`] reads what a request costs from the request
//! (its route, its declared size, a header: any function of it) in place of 1: that many
//! permits from every limiter of the policy it wraps, all of an [`And`] or only one side of
//! it (`per_ip.and(daily.cost(f))`), refunded whole when a later policy refuses, reserved
//! whole in [delay mode](RateLimitLayer::delay). A cost of 0 passes without touching a
//! limiter (nor inserting a key); a cost past a limit's burst is refused with no
//! `Retry-After`, like every refusal no wait can cure. The function is the server's: a
//! client must not choose its own price, so cap what it reads from a header (the method's
//! docs show how).
//!
//! **Rolling a limit out.** [`PolicyExt::enforcement`] puts a policy under an
//! [`Enforcement`] handle whose [`Mode`] an operator changes at run time: enforce every
//! refusal, none (shadow mode: counted, and the request goes on, the limiter taking exactly
//! what enforcing would), or those of a stable fraction of clients. [`Enforced::counts`]
//! says what it decided; with the feature `metrics`, every policy's decisions are counted
//! for `turnstile::metrics` too, labelled by the policy's name and the mode.
//!
//! The layer is cheap to clone (one `Arc`) and adds no allocation per request on the hot
//! path beyond the key itself (an `IpAddr` is none); the RateLimit headers, when sent, are
//! formatted into one small buffer each. Allowed responses pass through as the inner service
//! made them; a refusal is written in the server's own body type ([`RefusalBody`]: axum's
//! and tonic's bodies with features `axum` and `tonic`, and [`ResponseBody`], which any
//! other server's bodies can be wrapped in).
//!
//! ```
//! use std::time::Duration;
//! use turnstile::tower::{global, key, per_key, PolicyExt, RateLimitLayer};
//! use turnstile::{Keyed, Limit, TokenBucket};
//!
//! let per_ip = per_key(
//!     "per-ip",
//!     key::PeerIp,
//!     Keyed::new(|_| TokenBucket::new(Limit::per_second(10.0).unwrap(), 20)),
//! );
//! let everyone = global("all", TokenBucket::new(Limit::per_second(1000.0).unwrap(), 200));
//! let layer = RateLimitLayer::new(per_ip.and(everyone));
//! // axum: Router::new().route("/", get(handler)).layer(layer), served with
//! // into_make_service_with_connect_info::<SocketAddr>() so that PeerIp sees the peer.
//! # let _ = layer;
//! ```
//!
//! On a tonic server (feature `tonic`), the layer goes on the [`Server`](https://docs.rs/tonic/latest/tonic/transport/server/struct.Server.html)
//! builder, in front of every service it serves:
//!
//! ```no_run
//! # #[cfg(feature = "tonic")] {
//! use turnstile::tower::{global, RateLimitLayer};
//! use turnstile::{Limit, TokenBucket};
//!
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! // Any tonic service; tonic-health's here.
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! let everyone = global("all", TokenBucket::new(Limit::per_second(1000.0).unwrap(), 200));
//! tonic::transport::Server::builder()
//!     .layer(RateLimitLayer::new(everyone))
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(())
//! # }
//! # }
//! ```

mod body;
mod future;
pub mod key;
mod layer;
mod policy;
mod response;
mod service;

pub use body::{RefusalBody, ResponseBody};
pub use future::ResponseFuture;
pub use layer::{Headers, RateLimitLayer};
pub use response::{RATELIMIT, RATELIMIT_POLICY};
pub use service::RateLimit;

#[cfg(feature = "redis")]
pub use policy::{fleet, FailurePolicy, Fleet, FleetBuilder};
pub use policy::{
    global, global_multi, per_key, per_key_multi, And, AndFuture, Ask, Cost, Counts, Decision,
    Enforced, EnforcedFuture, Enforcement, Global, GlobalMulti, KeyGrant, MissingKey, Mode,
    MultiQuota, PerKey, PerKeyMap, PerKeyMulti, PerKeyMultiMap, Policy, PolicyExt, Refunds, Report,
    ReportItem, Taken,
};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Request, Response, StatusCode};

use crate::Denied;

use future::*;
use layer::*;
use response::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QuotaStatus;
    use std::time::Duration;

    #[test]
    fn headers_are_structured_fields() {
        let mut h = HeaderMap::new();
        let s = |q, w, r, t| QuotaStatus {
            quota: q,
            window: Duration::from_millis(w),
            remaining: r,
            reset: Duration::from_millis(t),
        };
        write_report(
            &mut h,
            &Report {
                items: vec![
                    ReportItem::new("per-ip".into(), s(20, 2000, 0, 1)),
                    ReportItem::new("a \"b\"\\é".into(), s(100, 60_000, 42, 16_001)),
                ],
            },
        );
        assert_eq!(
            h[&RATELIMIT_POLICY],
            r#""per-ip";q=20;w=2, "a \"b\"\\";q=100;w=60"#
        );
        assert_eq!(h[&RATELIMIT], r#""per-ip";r=0;t=1, "a \"b\"\\";r=42;t=17"#);
    }

    #[test]
    fn every_item_is_in_the_policy_and_only_binding_ones_in_ratelimit() {
        let mut h = HeaderMap::new();
        let s = |q, w, r, t| QuotaStatus {
            quota: q,
            window: Duration::from_secs(w),
            remaining: r,
            reset: Duration::from_secs(t),
        };
        let item = |name: &str, status, binding| ReportItem {
            name: name.into(),
            status,
            binding,
        };
        write_report(
            &mut h,
            &Report {
                items: vec![
                    item("burst", s(40, 2, 39, 1), false),
                    item("daily", s(10_000, 86_400, 12, 7_000), true),
                    item("per-ip", s(20, 2, 19, 1), true),
                ],
            },
        );
        assert_eq!(
            h[&RATELIMIT_POLICY],
            r#""burst";q=40;w=2, "daily";q=10000;w=86400, "per-ip";q=20;w=2"#
        );
        assert_eq!(h[&RATELIMIT], r#""daily";r=12;t=7000, "per-ip";r=19;t=1"#);
        // No binding item (a report built by hand): no `RateLimit`, an empty list.
        let mut h = HeaderMap::new();
        let items = vec![item("burst", s(40, 2, 39, 1), false)];
        write_report(&mut h, &Report { items });
        assert!(h.contains_key(&RATELIMIT_POLICY) && !h.contains_key(&RATELIMIT));
    }

    #[test]
    fn names_are_escaped_whether_or_not_they_are_plain_ascii() {
        let sf = |name: &str| {
            let mut out = Vec::new();
            write_sf_string(&mut out, name);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(sf("per-ip"), r#""per-ip""#);
        // All visible ASCII, so only the escapes tell the plain path from the careful one.
        assert_eq!(sf(r#"a"b"#), r#""a\"b""#);
        assert_eq!(sf(r"a\b"), r#""a\\b""#);
        assert_eq!(sf("tab\there é"), r#""tabhere ""#);
    }

    #[test]
    fn numbers_are_written_whole_at_both_ends() {
        for n in [0, 7, 10, 99, 1000, 4_294_967_296, u64::MAX] {
            let mut out = Vec::new();
            write_u64(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }
}
