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
pub mod key;
mod policy;

pub use body::{RefusalBody, ResponseBody};

#[cfg(feature = "redis")]
pub use policy::{
    fleet, FailurePolicy, Fleet, DEFAULT_DEADLINE, DEFAULT_LOCAL_MAX_KEYS, FAILURE_RETRY_AFTER,
};
pub use policy::{
    global, per_key, And, AndFuture, Ask, Decision, Global, KeyGrant, MissingKey, PerKey,
    PerKeyMap, Policy, PolicyExt, Report, Taken,
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

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// Which responses carry the `RateLimit` and `RateLimit-Policy` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Headers {
    /// None (only `Retry-After` on a refusal).
    Never,
    /// Refusals (the default).
    #[default]
    OnDenial,
    /// Every response: allowed ones say what is left after them.
    Always,
}

#[derive(Debug, Clone)]
struct Config {
    status: StatusCode,
    // Bytes: a static text (the default, any `&'static str`) is shared, not copied, by
    // every refusal; an owned one is reference-counted.
    body: Bytes,
    headers: Headers,
    grpc: bool,
    max_wait: Duration,
}

impl Config {
    /// What an allowed response carries of a grant's `report`: all of it with
    /// [`Headers::Always`], else nothing.
    #[inline]
    fn shown(&self, report: Report) -> Option<Report> {
        if self.headers == Headers::Always {
            return Some(report);
        }
        // A grant's report is empty unless asked for (`Ask::report_grants`): nothing to free,
        // so no call to its drop on every allowed request. One that is not (a policy filled
        // it anyway) is dropped as usual.
        if report.items.capacity() == 0 {
            std::mem::forget(report);
        }
        None
    }
}

/// What a layer and every service it makes share, behind one reference count: axum makes a
/// handler's service anew for every request (a clone of this, and its drop after), so each
/// count more would be two more atomic writes to a shared line per request.
struct Shared<P> {
    // An `Arc` of its own too: a policy's `decide` may keep it (a Redis round trip).
    policy: Arc<P>,
    config: Config,
}

// Not derived: no `P: Clone` needed (the builder methods copy the configuration, not the
// policy, when the layer has been cloned).
impl<P> Clone for Shared<P> {
    fn clone(&self) -> Self {
        Shared {
            policy: self.policy.clone(),
            config: self.config.clone(),
        }
    }
}

/// Tower [`Layer`](::tower::Layer) of [`RateLimit`]: see the [module docs](self).
pub struct RateLimitLayer<P> {
    shared: Arc<Shared<P>>,
}

impl<P> Clone for RateLimitLayer<P> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: self.shared.clone(),
        }
    }
}

impl<P> RateLimitLayer<P> {
    /// A layer asking `policy` about every request: refusals get 429 with `Retry-After`
    /// and the RateLimit headers, a body of "Too Many Requests", and gRPC requests
    /// `grpc-status: 8`.
    pub fn new(policy: P) -> Self {
        RateLimitLayer {
            shared: Arc::new(Shared {
                policy: Arc::new(policy),
                config: Config {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    body: Bytes::from_static(b"Too Many Requests"),
                    headers: Headers::OnDenial,
                    grpc: true,
                    max_wait: Duration::ZERO,
                },
            }),
        }
    }

    /// The status of a refusal (default 429).
    pub fn status(mut self, status: StatusCode) -> Self {
        self.config_mut().status = status;
        self
    }

    /// The body of a refusal (default "Too Many Requests"): a `&'static str` or
    /// `&'static [u8]` (no allocation per refusal), or any other [`Bytes`] (a `String`, a
    /// `Vec<u8>`: shared by the refusals, not copied). A gRPC refusal has no body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.config_mut().body = body.into();
        self
    }

    /// Which responses carry the RateLimit headers (default [`Headers::OnDenial`]).
    pub fn headers(mut self, headers: Headers) -> Self {
        self.config_mut().headers = headers;
        self
    }

    /// Whether gRPC requests are refused with `grpc-status: 8` (default) rather than the
    /// HTTP status. Without it a tonic client does not see `RESOURCE_EXHAUSTED`: a refusal
    /// with a body fails to decode as a gRPC message (`INTERNAL`, "invalid compression
    /// flag"), and one without ([`body("")`](Self::body)) is mapped from its HTTP status by
    /// gRPC's rules (429 is `UNAVAILABLE`).
    pub fn grpc(mut self, grpc: bool) -> Self {
        self.config_mut().grpc = grpc;
        self
    }

    /// Delay mode: a request that would be refused but can be served within `max_wait` waits
    /// (asynchronously, on tokio's timer) until its permits are due, then goes on; one that
    /// cannot is refused at once. The permits are reserved when the request arrives
    /// ([`Limiter::schedule_n_at`](crate::Limiter::schedule_n_at): exact for a token bucket,
    /// x/time/rate's `Wait`), so waiters are served in order and never overtake the limit.
    /// Cancel-safe: a request dropped while it waits (the client went away, a timeout layer
    /// gave up) gives its reservation back ([`Policy::refund`]). Zero (the default) refuses
    /// at once.
    ///
    /// Only policies that can reserve wait: a [`per_key`] over a
    /// [`KeyedTokenBucket`](crate::KeyedTokenBucket) has no schedule and refuses at once
    /// whatever `max_wait` (as do a limiter that reserves nothing ahead, the default
    /// [`Limiter::schedule_n_at`](crate::Limiter::schedule_n_at), and the Redis
    /// policies); for per-key waits use a [`Keyed`](crate::Keyed) of
    /// [`TokenBucket`](crate::TokenBucket)s.
    pub fn delay(mut self, max_wait: Duration) -> Self {
        self.config_mut().max_wait = max_wait;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.shared.policy
    }

    fn config_mut(&mut self) -> &mut Config {
        &mut Arc::make_mut(&mut self.shared).config
    }
}

impl<S, P> ::tower::Layer<S> for RateLimitLayer<P> {
    type Service = RateLimit<S, P>;

    fn layer(&self, inner: S) -> RateLimit<S, P> {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The rate-limited service: [`RateLimitLayer`].
pub struct RateLimit<S, P> {
    inner: S,
    shared: Arc<Shared<P>>,
}

impl<S: Clone, P> Clone for RateLimit<S, P> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, P, ReqBody, ResBody> ::tower::Service<Request<ReqBody>> for RateLimit<S, P>
where
    S: ::tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    P: Policy<ReqBody>,
    ResBody: RefusalBody,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, P, ReqBody>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let Shared { policy, config } = &*self.shared;
        let key = policy.key(&req);
        let ask = Ask {
            report: config.headers != Headers::Never,
            report_grants: config.headers == Headers::Always,
            max_wait: config.max_wait,
        };
        let mut check = policy.decide(key, ask);
        // An in-process policy has decided already (its future is `Ready`): act on the
        // decision here, calling the inner service this poll_ready made ready, so that the
        // response future holds only the inner one. A policy that is still deciding (Redis)
        // is polled again by the response future, with the caller's waker: a future may be
        // polled with a different waker each time, the last one being the one it wakes.
        let noop = &mut Context::from_waker(std::task::Waker::noop());
        match Pin::new(&mut check).poll(noop) {
            // The common case, spelled out so that the inner future is written where the
            // response future keeps it (one copy fewer of a future that holds the request).
            Poll::Ready(Decision {
                result: Ok(_),
                wait,
                report,
            }) if wait.is_zero() => ResponseFuture {
                report: config.shown(report),
                state: State::Calling {
                    fut: self.inner.call(req),
                },
            },
            // A wait for reserved permits, or a refusal.
            Poll::Ready(decision) => ResponseFuture {
                report: None,
                state: settle(self, decision, req),
            },
            Poll::Pending => ResponseFuture {
                report: None,
                state: still_checking(self, check, req),
            },
        }
    }
}

/// The state of a request whose policy is still deciding (a Redis round trip): boxed, with
/// everything the decision needs later. Out of line and cold, so that `call`'s common path
/// keeps the request where it is.
#[cold]
#[inline(never)]
fn still_checking<S, P, ReqBody>(
    this: &mut RateLimit<S, P>,
    check: P::Future,
    req: Request<ReqBody>,
) -> State<S, P, ReqBody>
where
    S: ::tower::Service<Request<ReqBody>> + Clone,
    P: Policy<ReqBody>,
{
    State::Slow {
        slow: Box::pin(Slow::Checking {
            check,
            req: Some(req),
            // The service made ready by poll_ready answers this request; a clone takes its
            // place.
            inner: Some(take_inner(&mut this.inner)),
            shared: this.shared.clone(),
        }),
    }
}

/// The ready inner service, a clone left in its place.
fn take_inner<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// The state a decision made in `call` leads to when it is not a grant for now (which `call`
/// handles itself): the request waiting for its reserved permits, or the refusal.
fn settle<S, P, ReqBody>(
    this: &mut RateLimit<S, P>,
    decision: Decision<P::Grant>,
    req: Request<ReqBody>,
) -> State<S, P, ReqBody>
where
    S: ::tower::Service<Request<ReqBody>> + Clone,
    P: Policy<ReqBody>,
{
    let Decision {
        result,
        wait,
        report,
    } = decision;
    match result {
        Ok(grant) => State::Slow {
            slow: Box::pin(Slow::waiting(
                wait,
                req,
                take_inner(&mut this.inner),
                this.shared.policy.clone(),
                grant,
                this.shared.config.shown(report),
            )),
        },
        Err(denied) => State::Refused {
            resp: Some(refusal(&this.shared.config, &denied, &report, &req)),
        },
    }
}

pin_project_lite::pin_project! {
    /// [`RateLimit`]'s response in flight: the inner service's response, or the refusal; a
    /// decision not made at once (a Redis policy) or a wait for reserved permits (delay
    /// mode) first, in a box of its own so that the common case moves a small future.
    pub struct ResponseFuture<S, P, ReqBody>
    where
        S: ::tower::Service<Request<ReqBody>>,
        P: Policy<ReqBody>,
    {
        #[pin]
        state: State<S, P, ReqBody>,
        // What the allowed response carries (with `Headers::Always`): beside the state, not
        // in its `Calling` variant, so that `call` writes the inner future where it stays
        // (a variant with a second field costs a copy of the whole future).
        report: Option<Report>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<S, P, ReqBody>
    where
        S: ::tower::Service<Request<ReqBody>>,
        P: Policy<ReqBody>,
    {
        Calling {
            #[pin]
            fut: S::Future,
        },
        Refused {
            resp: Option<Response<Bytes>>,
        },
        Slow {
            slow: Pin<Box<Slow<S, P, ReqBody>>>,
        },
    }
}

pin_project_lite::pin_project! {
    #[project = SlowProj]
    enum Slow<S, P, ReqBody>
    where
        S: ::tower::Service<Request<ReqBody>>,
        P: Policy<ReqBody>,
    {
        Checking {
            #[pin]
            check: P::Future,
            req: Option<Request<ReqBody>>,
            inner: Option<S>,
            shared: Arc<Shared<P>>,
        },
        Waiting {
            #[pin]
            sleep: tokio::time::Sleep,
            req: Option<Request<ReqBody>>,
            inner: Option<S>,
            reservation: Reservation<P, ReqBody>,
            report: Option<Report>,
        },
    }
}

/// What a [`Slow`] step ends in.
// A return value, never stored: the waiting state goes into the box the checking one
// leaves (`Pin::set`), so boxing it here would only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Next<S: ::tower::Service<Request<ReqBody>>, P: Policy<ReqBody>, ReqBody> {
    /// The inner service's response is next.
    Call(S::Future, Option<Report>),
    /// Refused.
    Refuse(Response<Bytes>),
    /// Waiting for reserved permits.
    Wait(Slow<S, P, ReqBody>),
}

impl<S, P, ReqBody, ResBody> Future for ResponseFuture<S, P, ReqBody>
where
    S: ::tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    P: Policy<ReqBody>,
    ResBody: RefusalBody,
{
    type Output = Result<Response<ResBody>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        // The common case: the inner service's response, passed on as it comes (its poll
        // writes straight into ours).
        if this.report.is_none() {
            if let StateProj::Calling { fut } = this.state.as_mut().project() {
                return fut.poll(cx);
            }
        }
        poll_rest(this.state, this.report, cx)
    }
}

/// [`ResponseFuture::poll`] but for an inner response without a report: one with the
/// `RateLimit` fields to add, a refusal, or a slow state (a decision in flight, a wait for
/// reserved permits). Out of line, so that the common case is a small function.
#[inline(never)]
fn poll_rest<S, P, ReqBody, ResBody>(
    mut state: Pin<&mut State<S, P, ReqBody>>,
    report: &mut Option<Report>,
    cx: &mut Context<'_>,
) -> Poll<Result<Response<ResBody>, S::Error>>
where
    S: ::tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    P: Policy<ReqBody>,
    ResBody: RefusalBody,
{
    loop {
        match state.as_mut().project() {
            StateProj::Calling { fut } => {
                let mut resp = ready!(fut.poll(cx))?;
                if let Some(report) = report.take() {
                    write_report(resp.headers_mut(), &report);
                }
                return Poll::Ready(Ok(resp));
            }
            StateProj::Refused { resp } => {
                let resp = resp.take().expect("polled after completion");
                return Poll::Ready(Ok(resp.map(ResBody::refusal)));
            }
            StateProj::Slow { slow } => match ready!(slow.as_mut().poll_step(cx)) {
                Next::Call(fut, shown) => {
                    *report = shown;
                    state.set(State::Calling { fut });
                }
                Next::Refuse(resp) => return Poll::Ready(Ok(resp.map(ResBody::refusal))),
                Next::Wait(next) => slow.set(next),
            },
        }
    }
}

impl<S, P, ReqBody> Slow<S, P, ReqBody>
where
    S: ::tower::Service<Request<ReqBody>>,
    P: Policy<ReqBody>,
{
    /// A granted request waiting `wait` for its reserved permits, which it gives back to
    /// `policy` if it is dropped before they are due.
    fn waiting(
        wait: Duration,
        req: Request<ReqBody>,
        inner: S,
        policy: Arc<P>,
        grant: P::Grant,
        report: Option<Report>,
    ) -> Self {
        Slow::Waiting {
            sleep: tokio::time::sleep(wait),
            req: Some(req),
            inner: Some(inner),
            reservation: Reservation {
                held: Some((policy, grant)),
            },
            report,
        }
    }

    /// Polls the decision or the wait; what comes next once it is over.
    fn poll_step(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Next<S, P, ReqBody>> {
        match self.project() {
            SlowProj::Checking {
                check,
                req,
                inner,
                shared,
            } => {
                let decision = ready!(check.poll(cx));
                let req = req.take().expect("polled after completion");
                Poll::Ready(match decision.result {
                    Ok(grant) => {
                        let mut inner = inner.take().expect("polled after completion");
                        let report = shared.config.shown(decision.report);
                        // A wait only where the layer lets requests wait (a policy asked to
                        // reserve nothing ahead has no wait to give).
                        if !shared.config.max_wait.is_zero() && !decision.wait.is_zero() {
                            Next::Wait(Slow::waiting(
                                decision.wait,
                                req,
                                inner,
                                shared.policy.clone(),
                                grant,
                                report,
                            ))
                        } else {
                            Next::Call(inner.call(req), report)
                        }
                    }
                    Err(denied) => {
                        Next::Refuse(refusal(&shared.config, &denied, &decision.report, &req))
                    }
                })
            }
            SlowProj::Waiting {
                sleep,
                req,
                inner,
                reservation,
                report,
            } => {
                ready!(sleep.poll(cx));
                // Due: the permits are used, nothing to give back.
                reservation.held = None;
                let req = req.take().expect("polled after completion");
                let mut inner = inner.take().expect("polled after completion");
                Poll::Ready(Next::Call(inner.call(req), report.take()))
            }
        }
    }
}

/// A waiting request's permits: given back if it is dropped before they are due.
struct Reservation<P: Policy<B>, B> {
    held: Option<(Arc<P>, P::Grant)>,
}

impl<P: Policy<B>, B> Drop for Reservation<P, B> {
    fn drop(&mut self) {
        if let Some((policy, grant)) = self.held.take() {
            policy.refund(grant);
        }
    }
}

/// Whether a request is gRPC (`content-type: application/grpc`, `application/grpc+proto`…).
fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The response to refused `req` (its body the text to send, `""` for gRPC).
fn refusal<B>(
    config: &Config,
    denied: &Denied,
    report: &Report,
    req: &Request<B>,
) -> Response<Bytes> {
    let grpc = config.grpc && is_grpc(req.headers());
    // gRPC's refusal has no body: its status is in the headers (a "trailers-only" response).
    let mut resp = Response::new(if grpc {
        Bytes::new()
    } else {
        config.body.clone()
    });
    if grpc {
        // gRPC's "trailers-only" response: the status in the headers of an empty 200.
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(GRPC_STATUS.clone(), HeaderValue::from_static("8"));
        h.insert(
            GRPC_MESSAGE.clone(),
            HeaderValue::from_static("rate%20limited"),
        );
    } else {
        *resp.status_mut() = config.status;
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
    }
    if let Some(secs) = denied.retry_after_secs() {
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    if config.headers != Headers::Never {
        write_report(resp.headers_mut(), report);
    }
    resp
}

/// `RateLimit-Policy` and `RateLimit` from `report` (nothing if it is empty). Bytes, not
/// `fmt`: on a refusal these two values are most of the layer's work, and `write!` costs
/// several times a plain digit loop.
fn write_report(headers: &mut HeaderMap, report: &Report) {
    if report.items.is_empty() {
        return;
    }
    let mut policy = Vec::with_capacity(32 * report.items.len());
    let mut state = Vec::with_capacity(32 * report.items.len());
    for (i, (name, s)) in report.items.iter().enumerate() {
        if i > 0 {
            policy.extend_from_slice(b", ");
            state.extend_from_slice(b", ");
        }
        write_sf_string(&mut policy, name);
        policy.extend_from_slice(b";q=");
        write_u64(&mut policy, s.quota);
        policy.extend_from_slice(b";w=");
        write_u64(&mut policy, s.window_secs());
        write_sf_string(&mut state, name);
        state.extend_from_slice(b";r=");
        write_u64(&mut state, s.remaining);
        state.extend_from_slice(b";t=");
        write_u64(&mut state, s.reset_secs());
    }
    if let (Ok(p), Ok(s)) = (HeaderValue::try_from(policy), HeaderValue::try_from(state)) {
        headers.insert(RATELIMIT_POLICY.clone(), p);
        headers.insert(RATELIMIT.clone(), s);
    }
}

/// A structured-field string (RFC 8941 §3.3.3): quoted, `"` and `\` escaped; other bytes
/// outside visible ASCII dropped (a policy name is the server's own text; a character beyond
/// ASCII is dropped whole, all its bytes being above 0x7e).
fn write_sf_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    if bytes
        .iter()
        .all(|&b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        out.extend_from_slice(bytes);
    } else {
        for &b in bytes {
            match b {
                b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
                b' '..=b'~' => out.push(b),
                _ => {}
            }
        }
    }
    out.push(b'"');
}

/// `n` in decimal.
fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

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
                    ("per-ip".into(), s(20, 2000, 0, 1)),
                    ("a \"b\"\\é".into(), s(100, 60_000, 42, 16_001)),
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
