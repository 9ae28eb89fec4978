//! The servers of the HTTP benchmarks: one axum `Router` per cell (no layer, tower_governor's
//! layer, turnstile's), each allowing every request or denying all but the first of each peer.
//! `bench/examples/http/bench.rs` (the load generator over loopback TCP), `bench/benches/tower.rs` and
//! `bench/examples/http_instructions.rs` (one connection over an in-memory pipe) include this file,
//! so every measure runs the same servers.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;
use turnstile::tower::{key, per_key, Headers, RateLimitLayer};
use turnstile::{Keyed, KeyedTokenBucket, Limit, TokenBucket};

/// The allowing cells' limit per peer IP: 1e6/s, ten times what two cores serve, with a burst
/// of 10 s of that rate, so that every request runs the limiter's granting path and none is
/// ever denied. The burst must be long in time, not only in count: a GCRA (governor's) denies
/// when a thread's clock reading is older than the burst's span by the time it updates the
/// state, which a thread preempted for longer than the span does; with 1e9/s and a burst of
/// 1e6 (a 1 ms span) a busy machine saw 429s. turnstile's allowing cell uses the same figures.
pub const ALLOW_PER_SEC: u64 = 1_000_000;
pub const ALLOW_BURST: u32 = 10_000_000;

/// The denying cells' limit: a burst of 1 per peer IP, replenished once an hour, so that the
/// first request from each peer gets 200 and every later one 429 (the denial path).
pub const DENY_PERIOD: Duration = Duration::from_secs(3600);
pub const DENY_BURST: u32 = 1;

/// The handler every cell serves: `GET /` → `ok`.
async fn ok() -> &'static str {
    "ok"
}

/// The application without any layer.
pub fn app() -> Router {
    Router::new().route("/", get(ok))
}

/// Cell `no_layer`: the handler alone, the reference every layer is judged against.
pub fn no_layer_router() -> Option<Router> {
    Some(app())
}

/// Cell `governor_allow`: `tower_governor`'s `GovernorLayer` keyed by peer IP (its default
/// `PeerIpKeyExtractor`, reading `ConnectInfo<SocketAddr>`), never denying (one request per
/// 1 µs, burst [`ALLOW_BURST`]): the overhead of
/// the layer on the granting path.
pub fn governor_allow_router() -> Option<Router> {
    let config = GovernorConfigBuilder::default()
        .period(Duration::from_nanos(1_000_000_000 / ALLOW_PER_SEC))
        .burst_size(ALLOW_BURST)
        .finish()?;
    Some(app().layer(GovernorLayer::new(config)))
}

/// Cell `governor_deny`: the same layer with a burst of 1 replenished once an hour: all but the
/// first request of each peer get 429, the cost of the denial path.
pub fn governor_deny_router() -> Option<Router> {
    let config = GovernorConfigBuilder::default()
        .period(DENY_PERIOD)
        .burst_size(DENY_BURST)
        .finish()?;
    Some(app().layer(GovernorLayer::new(config)))
}

/// Cell `turnstile_allow`: turnstile's tower layer on the granting path.
///
/// Must return `Some(app().layer(..))`: the layer keyed by peer IP (from
/// `ConnectInfo<SocketAddr>`, which the server provides), with a limit that never denies here:
/// [`ALLOW_PER_SEC`] per second and a burst of [`ALLOW_BURST`], as `governor_allow`. Built
/// afresh for every cell run (a fresh limiter each time). Returning `None` leaves the cell out
/// of the run and the verdict says so.
pub fn turnstile_router() -> Option<Router> {
    Some(app().layer(turnstile_layer(
        Limit::per_second(ALLOW_PER_SEC as f64).ok()?,
        ALLOW_BURST,
    )))
}

/// Cell `turnstile_deny`: turnstile's tower layer on the denial path.
///
/// Keyed by peer IP with a burst of [`DENY_BURST`] replenished every [`DENY_PERIOD`], as
/// `governor_deny`: all but the first request of each peer get 429.
pub fn turnstile_deny_router() -> Option<Router> {
    Some(app().layer(turnstile_layer(Limit::every(DENY_PERIOD), DENY_BURST)))
}

/// `turnstile_deny` without the `RateLimit` headers (`Headers::Never`: `Retry-After` only),
/// the refusal closest to tower_governor's default one (`Retry-After` and
/// `x-ratelimit-after`): the denial path's cost apart from the headers it sends.
pub fn turnstile_deny_bare_router() -> Option<Router> {
    Some(
        app().layer(turnstile_layer(Limit::every(DENY_PERIOD), DENY_BURST).headers(Headers::Never)),
    )
}

/// Cell `turnstile_inline_allow`: `turnstile_allow` with the inline per-key map
/// ([`KeyedTokenBucket`]: each peer's bucket one word in the map) instead of a `Keyed` map of
/// `TokenBucket`s; same limit, [`ALLOW_PER_SEC`] and [`ALLOW_BURST`].
pub fn turnstile_inline_router() -> Option<Router> {
    Some(app().layer(turnstile_inline_layer(
        Limit::per_second(ALLOW_PER_SEC as f64).ok()?,
        ALLOW_BURST,
    )))
}

/// Cell `turnstile_inline_deny`: `turnstile_deny` over the inline map.
pub fn turnstile_inline_deny_router() -> Option<Router> {
    Some(app().layer(turnstile_inline_layer(
        Limit::every(DENY_PERIOD),
        DENY_BURST,
    )))
}

/// `turnstile_inline_deny` without the `RateLimit` headers, as `turnstile_deny_bare`.
pub fn turnstile_inline_deny_bare_router() -> Option<Router> {
    Some(app().layer(
        turnstile_inline_layer(Limit::every(DENY_PERIOD), DENY_BURST).headers(Headers::Never),
    ))
}

/// turnstile's layer as the governor cells configure theirs: a token bucket per peer IP (a
/// `Keyed` map, read from `ConnectInfo<SocketAddr>`), refusals with `Retry-After` and the
/// RateLimit headers (its defaults).
fn turnstile_layer(
    limit: Limit,
    burst: u32,
) -> RateLimitLayer<impl turnstile::tower::Policy<axum::body::Body>> {
    RateLimitLayer::new(per_key(
        "per-ip",
        key::PeerIp,
        Keyed::new(move |_: &std::net::IpAddr| TokenBucket::new(limit, burst)),
    ))
}

/// [`turnstile_layer`] over the inline map: a [`KeyedTokenBucket`] per peer IP (SipHash, its
/// default, as governor's dashmap), refusals as `turnstile_layer`'s.
fn turnstile_inline_layer(
    limit: Limit,
    burst: u32,
) -> RateLimitLayer<impl turnstile::tower::Policy<axum::body::Body>> {
    RateLimitLayer::new(per_key(
        "per-ip",
        key::PeerIp,
        KeyedTokenBucket::new(limit, burst),
    ))
}

/// Cell `pass_through` (instruction counts and `bench/benches/tower.rs` only): a layer that does
/// nothing but call the inner service, so that what any layer costs under axum's
/// `Router::layer` (which boxes and clones the layered route for every request) shows apart
/// from what a rate-limit layer adds to it.
pub fn pass_through_router() -> Option<Router> {
    Some(app().layer(PassThroughLayer))
}

/// [`pass_through_router`]'s layer.
#[derive(Clone, Copy)]
pub struct PassThroughLayer;

impl<S> tower::Layer<S> for PassThroughLayer {
    type Service = PassThrough<S>;
    fn layer(&self, inner: S) -> PassThrough<S> {
        PassThrough(inner)
    }
}

/// [`PassThroughLayer`]'s service: the inner one, called as it is.
#[derive(Clone)]
pub struct PassThrough<S>(S);

impl<S: tower::Service<R>, R> tower::Service<R> for PassThrough<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }
    fn call(&mut self, req: R) -> S::Future {
        self.0.call(req)
    }
}
