//! [`Global`]: one limiter for every request.

use std::future::{ready, Ready};
use std::sync::Arc;

use http::Request;

use super::*;
use crate::{Limiter, Nanos};

/// One limiter for every request: [`global`].
pub struct Global<L> {
    pub(super) name: Arc<str>,
    pub(super) limiter: L,
    pub(super) observer: Observer,
    pub(super) alarm: RefusalAlarm,
}

/// A policy that takes one permit from `limiter` per request, whatever the request (or the
/// request's cost: [`PolicyExt::cost`]); `name` is its name in the `RateLimit` headers. A
/// limiter of several limits ([`MultiTokenBucket`](crate::MultiTokenBucket)) is reported as
/// its binding limit under `name`; [`global_multi`] reports each of its limits.
///
/// ```
/// use turnstile::tower::{global, Policy};
/// use turnstile::{Limit, TokenBucket};
///
/// let all = global("all", TokenBucket::new(Limit::per_second(1000.0).unwrap(), 100));
/// # let _ = all;
/// ```
pub fn global<L: Limiter + 'static>(name: impl Into<Arc<str>>, limiter: L) -> Global<L> {
    let name = name.into();
    Global {
        observer: Observer::new(&name),
        alarm: RefusalAlarm::default(),
        name,
        limiter,
    }
}

impl<L> Global<L> {
    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }

    /// A `tracing` warning (feature `tracing`) when the policy refuses more than
    /// `per_second` requests a second, measured over a second or more, at most one a second:
    /// the policy's name, the refusals and the span they fell in, and whether they were
    /// enforced or shadow refusals ([`PolicyExt::enforcement`]).
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn alert_refusals(mut self, per_second: u64) -> Self {
        self.alarm = RefusalAlarm::new(&self.name, per_second);
        self
    }

    /// Counts (feature `metrics`, as `turnstile_near_limit_total`) the grants that leave
    /// at most `1 - fraction` of the quota: with 0.8, a grant after which a fifth or less is
    /// left, Envoy's "near limit". Each grant then reads the limiter's status once more (a
    /// load; for a keyed map, a second lookup of the key), so it is off unless set. An error
    /// for a fraction that is NaN or outside `(0, 1]`.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn near_limit(mut self, fraction: f64) -> Result<Self, crate::ConfigError> {
        self.observer.near_limit(fraction)?;
        Ok(self)
    }
}

impl<L: Limiter> Global<L> {
    /// Counts a grant at `now` if it left the limiter near its limit: out of line, off the
    /// path of a check without near-limit counting.
    #[cold]
    #[inline(never)]
    fn near(&self, now: Nanos) {
        self.observer.granted(self.limiter.quota_at(now));
    }
}

impl<B, L: Limiter + 'static> Policy<B> for Global<L> {
    type Key = ();
    /// The clock reading the permits were taken at (a window's refund finds the grant's
    /// window by it) and how many ([`Ask::cost`]).
    type Grant = (Nanos, u32);
    type Future = Ready<Decision<(Nanos, u32)>>;

    #[inline]
    fn key(&self, _: &Request<B>) -> Self::Key {}

    #[inline]
    fn decide(self: &Arc<Self>, _: (), ask: Ask) -> Self::Future {
        let now = self.limiter.now();
        let (result, wait) = take(&self.limiter, now, ask.cost, ask.max_wait);
        self.observer.record(result.is_ok(), &ask);
        self.observer.waited(wait, &ask);
        match &result {
            Ok(()) if self.observer.wants_status() => self.near(now),
            Ok(()) => {}
            Err(d) => self.alarm.refused(d.checked_at(), &ask, || None),
        }
        let report = one_report(ask.reports(result.is_ok()), &self.name, || {
            self.limiter.quota_at(now)
        });
        ready(Decision {
            result: result.map(|()| (now, ask.cost)),
            wait,
            report,
        })
    }

    fn refund(&self, (at, n): (Nanos, u32)) {
        if n > 0 {
            let _ = self.limiter.refund_n_at(at, n);
        }
    }
}

impl<L: Refund> Refunds for Global<L> {}
