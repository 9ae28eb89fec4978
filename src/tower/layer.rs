//! [`RateLimitLayer`]: the layer, its settings, and what it shares with its services.

use super::*;

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
pub(super) struct Config {
    pub(super) status: StatusCode,
    // Bytes: a static text (the default, any `&'static str`) is shared, not copied, by
    // every refusal; an owned one is reference-counted.
    pub(super) body: Bytes,
    pub(super) headers: Headers,
    pub(super) grpc: bool,
    pub(super) max_wait: Duration,
}

impl Config {
    /// What an allowed response carries of a grant's `report`: all of it with
    /// [`Headers::Always`], else nothing.
    #[inline]
    pub(super) fn shown(&self, report: Report) -> Option<Report> {
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
pub(super) struct Shared<P> {
    // An `Arc` of its own too: a policy's `decide` may keep it (a Redis round trip).
    pub(super) policy: Arc<P>,
    pub(super) config: Config,
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

/// Tower [`Layer`](::tower::Layer) of [`RateLimit`]: see the [module docs](crate::tower).
pub struct RateLimitLayer<P> {
    pub(super) shared: Arc<Shared<P>>,
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
    /// A request that costs more than one permit ([`PolicyExt::cost`]) reserves its whole
    /// cost.
    ///
    /// Only policies that can reserve wait: a [`per_key`] over a
    /// [`KeyedTokenBucket`](crate::KeyedTokenBucket) or a
    /// [`KeyedMultiTokenBucket`](crate::KeyedMultiTokenBucket), and a policy over a
    /// [`MultiTokenBucket`](crate::MultiTokenBucket), have no schedule and refuse at once
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
