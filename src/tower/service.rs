//! [`RateLimit`]: the service, which asks the policy in `call` and answers at once where it can.

use super::*;

/// The rate-limited service: [`RateLimitLayer`].
pub struct RateLimit<S, P> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared<P>>,
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
            // A `Cost` policy sets its own.
            cost: 1,
            // An `Enforced` policy clears it for the clients it lets through.
            enforced: true,
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
pub(super) fn still_checking<S, P, ReqBody>(
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
pub(super) fn take_inner<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// The state a decision made in `call` leads to when it is not a grant for now (which `call`
/// handles itself): the request waiting for its reserved permits, or the refusal.
pub(super) fn settle<S, P, ReqBody>(
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
