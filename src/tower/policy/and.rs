//! [`And`]: two policies that must both pass, the second's refusal giving back the first's
//! grant.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready as ready_poll, Context, Poll};
use std::time::Duration;

use http::Request;

use super::*;

/// Two policies, both of which must pass: [`PolicyExt::and`].
pub struct And<A, B> {
    pub(super) first: Arc<A>,
    pub(super) second: Arc<B>,
}

impl<A, B> And<A, B> {
    /// The policy asked first.
    pub fn first(&self) -> &A {
        &self.first
    }

    /// The policy asked second.
    pub fn second(&self) -> &B {
        &self.second
    }
}

impl<Body: 'static, A: Policy<Body>, B: Policy<Body>> Policy<Body> for And<A, B> {
    type Key = (A::Key, B::Key);
    type Grant = (A::Grant, B::Grant);
    type Future = AndFuture<Body, A, B>;

    fn key(&self, req: &Request<Body>) -> Self::Key {
        (self.first.key(req), self.second.key(req))
    }

    fn decide(self: &Arc<Self>, (a, b): Self::Key, ask: Ask) -> Self::Future {
        AndFuture {
            state: AndState::First {
                fut: self.first.decide(a, ask),
                second_key: Some(b),
            },
            policy: self.clone(),
            ask,
        }
    }

    fn refund(&self, (a, b): Self::Grant) {
        self.second.refund(b);
        self.first.refund(a);
    }

    fn hash_client<H: std::hash::Hasher>(&self, (a, b): &Self::Key, state: &mut H) {
        self.first.hash_client(a, state);
        self.second.hash_client(b, state);
    }
}

pin_project_lite::pin_project! {
    /// [`And`]'s decision in flight: the first policy's, then the second's (no allocation).
    /// Dropped while the second decides (the client went away, a timeout layer gave up), it
    /// gives back what the first granted, as a refusal by the second would.
    pub struct AndFuture<Body, A: Policy<Body>, B: Policy<Body>> {
        #[pin]
        state: AndState<Body, A, B>,
        policy: Arc<And<A, B>>,
        ask: Ask,
    }

    impl<Body, A: Policy<Body>, B: Policy<Body>> PinnedDrop for AndFuture<Body, A, B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // The first's grant is held here only while the second decides: once the second
            // has answered, it has been handed on in the decision or given back. A grant of
            // the second still in flight is its own future's to give back (a nested `And`'s,
            // dropped with this one's fields, after this).
            if let AndStateProj::Second { first, .. } = this.state.project() {
                if let Some((grant, _, _)) = first.take() {
                    this.policy.first.refund(grant);
                }
            }
        }
    }
}

pin_project_lite::pin_project! {
    #[project = AndStateProj]
    enum AndState<Body, A: Policy<Body>, B: Policy<Body>> {
        First {
            #[pin]
            fut: A::Future,
            second_key: Option<B::Key>,
        },
        Second {
            #[pin]
            fut: B::Future,
            first: Option<(A::Grant, Duration, Report)>,
        },
        Done,
    }
}

impl<Body, A: Policy<Body>, B: Policy<Body>> Future for AndFuture<Body, A, B> {
    type Output = Decision<(A::Grant, B::Grant)>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                AndStateProj::First { fut, second_key } => {
                    let d = ready_poll!(fut.poll(cx));
                    match d.result {
                        Err(denied) => {
                            this.state.set(AndState::Done);
                            return Poll::Ready(Decision {
                                result: Err(denied),
                                wait: Duration::ZERO,
                                report: d.report,
                            });
                        }
                        Ok(grant) => {
                            let key = second_key.take().expect("polled after completion");
                            let fut = this.policy.second.decide(key, *this.ask);
                            this.state.set(AndState::Second {
                                fut,
                                first: Some((grant, d.wait, d.report)),
                            });
                        }
                    }
                }
                AndStateProj::Second { fut, first } => {
                    let d = ready_poll!(fut.poll(cx));
                    let (grant_a, wait_a, mut report) =
                        first.take().expect("polled after completion");
                    this.state.set(AndState::Done);
                    return Poll::Ready(match d.result {
                        Ok(grant_b) => {
                            report.items.extend(d.report.items);
                            Decision {
                                result: Ok((grant_a, grant_b)),
                                // Both reservations hold until the later one's time.
                                wait: wait_a.max(d.wait),
                                report,
                            }
                        }
                        Err(denied) => {
                            // Refused by the second: the first gives back what it granted.
                            this.policy.first.refund(grant_a);
                            Decision {
                                result: Err(denied),
                                wait: Duration::ZERO,
                                report: d.report,
                            }
                        }
                    });
                }
                AndStateProj::Done => panic!("AndFuture polled after completion"),
            }
        }
    }
}

impl<A: Refunds, B: Refunds> Refunds for And<A, B> {}
