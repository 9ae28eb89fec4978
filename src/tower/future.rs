//! [`ResponseFuture`]: a response in flight, and the slow states (a decision not made at
//! once, a wait for reserved permits) boxed apart from it.

use super::*;

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
        pub(super) state: State<S, P, ReqBody>,
        // What the allowed response carries (with `Headers::Always`): beside the state, not
        // in its `Calling` variant, so that `call` writes the inner future where it stays
        // (a variant with a second field costs a copy of the whole future).
        pub(super) report: Option<Report>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    pub(super) enum State<S, P, ReqBody>
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
    pub(super) enum Slow<S, P, ReqBody>
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
pub(super) enum Next<S: ::tower::Service<Request<ReqBody>>, P: Policy<ReqBody>, ReqBody> {
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
pub(super) fn poll_rest<S, P, ReqBody, ResBody>(
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
    pub(super) fn waiting(
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
pub(super) struct Reservation<P: Policy<B>, B> {
    pub(super) held: Option<(Arc<P>, P::Grant)>,
}

impl<P: Policy<B>, B> Drop for Reservation<P, B> {
    fn drop(&mut self) {
        if let Some((policy, grant)) = self.held.take() {
            policy.refund(grant);
        }
    }
}
