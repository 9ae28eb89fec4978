//! [`Cost`]: a policy whose requests cost what a function of the request says.

use std::sync::Arc;

use http::Request;

use super::*;

/// A policy whose requests cost what a function of the request says: [`PolicyExt::cost`].
pub struct Cost<P, F> {
    // An `Arc`, as `And`'s halves: `Policy::decide` takes the policy as `&Arc<Self>`.
    pub(super) inner: Arc<P>,
    pub(super) cost: F,
}

impl<P, F> Cost<P, F> {
    /// The policy charged.
    pub fn policy(&self) -> &P {
        &self.inner
    }
}

impl<B, P, F> Policy<B> for Cost<P, F>
where
    P: Policy<B>,
    F: Fn(&Request<B>) -> u32 + Send + Sync + 'static,
{
    /// The inner policy's key and the request's cost, both read while the request is at
    /// hand (the cost is a plain number: no allocation).
    type Key = (P::Key, u32);
    type Grant = P::Grant;
    type Future = P::Future;

    #[inline]
    fn key(&self, req: &Request<B>) -> Self::Key {
        (self.inner.key(req), (self.cost)(req))
    }

    #[inline]
    fn decide(self: &Arc<Self>, (key, cost): Self::Key, ask: Ask) -> Self::Future {
        self.inner.decide(key, Ask { cost, ..ask })
    }

    /// The inner policy's refund: its grant remembers the cost it took.
    fn refund(&self, grant: Self::Grant) {
        self.inner.refund(grant)
    }

    /// The inner policy's client: the cost is the request's, not the client's.
    fn hash_client<H: std::hash::Hasher>(&self, (key, _): &Self::Key, state: &mut H) {
        self.inner.hash_client(key, state);
    }
}

impl<P: Refunds, F> Refunds for Cost<P, F> {}
