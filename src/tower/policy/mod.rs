//! Policies: what a [`RateLimitLayer`](super::RateLimitLayer) asks before a request passes.
//!
//! A policy decides in two steps. [`Policy::key`] reads what it needs from the request (a
//! client's IP, a header), synchronously, while the request is at hand; [`Policy::decide`]
//! then takes the permits, possibly asynchronously (a Redis round trip), from an owned key.
//! Splitting the two lets [`And`] read every policy's key up front and still decide them
//! one after another, so that a request refused by the second policy gives back what the
//! first one granted ([`Policy::refund`]) and takes nothing from either.
//!
//! In-process policies ([`Global`], [`PerKey`] over a [`Keyed`] or a [`KeyedTokenBucket`])
//! decide at once: their future is [`std::future::Ready`], and a check is the limiter's own
//! lock-free check, with no allocation (the optional header report allocates only when
//! headers are configured).

mod alarm;
mod and;
mod cost;
mod enforced;
#[cfg(feature = "redis")]
mod fleet;
#[cfg(feature = "redis")]
mod fleet_observer;
mod global;
mod multi;
mod observer;
mod per_key;
#[cfg(test)]
mod tests;

pub use and::{And, AndFuture};
pub use cost::Cost;
pub use enforced::{Counts, Enforced, EnforcedFuture, Enforcement, Mode};
#[cfg(feature = "redis")]
pub use fleet::{fleet, FailurePolicy, Fleet, FleetBuilder};
pub use global::{global, Global};
pub use multi::{
    global_multi, per_key_multi, GlobalMulti, MultiQuota, PerKeyMulti, PerKeyMultiMap,
};
pub use per_key::{per_key, KeyGrant, MissingKey, PerKey, PerKeyMap, Taken};

use alarm::RefusalAlarm;
use observer::Observer;

use std::future::Future;
use std::hash::Hasher;
use std::sync::Arc;
use std::time::Duration;

use http::Request;

use crate::{Denied, Limiter, QuotaStatus, Refund};

/// One policy's answer.
#[derive(Debug)]
pub struct Decision<G> {
    /// The grant (what [`Policy::refund`] needs to give it back), or the denial with its
    /// retry time.
    pub result: Result<G, Denied>,
    /// How long the granted request must wait before it may go on (zero unless the policy
    /// was asked to reserve ahead: [`RateLimitLayer::delay`](super::RateLimitLayer::delay)).
    pub wait: Duration,
    /// The IETF RateLimit fields of the policies that decided, in order, when they were asked
    /// for (empty otherwise): after a grant, every policy's; after a denial, the denying
    /// policy's.
    pub report: Report,
}

/// What a [`Policy::decide`] is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// Fill [`Decision::report`] when the policy refuses.
    pub report: bool,
    /// Fill it when the policy grants, too ([`Headers::Always`](super::Headers::Always)).
    /// Apart, so that a layer that puts the headers on refusals only does not compute a
    /// status on every allowed request.
    pub report_grants: bool,
    /// Reserve up to this far ahead ([`Limiter::schedule_n_at`]); zero: now or never.
    pub max_wait: Duration,
    /// The permits the request costs: 1 unless a [`Cost`] policy ([`PolicyExt::cost`]) read
    /// another from the request. Zero passes without asking the limiter; more than a limit's
    /// burst is refused with no retry time (no `Retry-After`: no wait makes it pass).
    pub cost: u32,
    /// Whether a refusal is enforced: false for a client an [`Enforced`] policy above lets
    /// through anyway ([`Mode::Shadow`], or outside a [`Mode::Fraction`]), so that the
    /// policies deciding count the refusal as shadow-refused (feature `metrics`). Deciding
    /// is the same either way.
    pub enforced: bool,
}

/// Refusals only, no wait, a cost of 1, enforced.
impl Default for Ask {
    fn default() -> Self {
        Ask {
            report: false,
            report_grants: false,
            max_wait: Duration::ZERO,
            cost: 1,
            enforced: true,
        }
    }
}

impl Ask {
    /// Whether a decision that `granted` (or not) should fill [`Decision::report`].
    #[inline]
    pub fn reports(&self, granted: bool) -> bool {
        if granted {
            self.report_grants
        } else {
            self.report
        }
    }
}

/// Named [`QuotaStatus`]es: what the `RateLimit` and `RateLimit-Policy` headers carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// One item per limit, in policy order (a multi-limit policy's in its limits' order):
    /// every one goes in `RateLimit-Policy`, the [`binding`](ReportItem::binding) ones in
    /// `RateLimit` too.
    pub items: Vec<ReportItem>,
}

/// One limit of a [`Report`]: its name in the headers and its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportItem {
    /// The item's name: the policy's, or for a policy of several limits
    /// ([`global_multi`], [`per_key_multi`]) the limit's own.
    pub name: Arc<str>,
    /// Its figures: `q` and `w` in `RateLimit-Policy`, `r` and `t` in `RateLimit`.
    pub status: QuotaStatus,
    /// Whether the item is in `RateLimit` too: a single-limit policy's item always is; of a
    /// multi-limit policy's, only its binding limit's (the fewest permits left, the longest
    /// reset among equals), the one that refuses first (the [module docs](crate::tower)
    /// say why).
    pub binding: bool,
}

impl ReportItem {
    /// A single-limit policy's item (in both fields).
    pub fn new(name: Arc<str>, status: QuotaStatus) -> Self {
        ReportItem {
            name,
            status,
            binding: true,
        }
    }
}

/// A question a [`RateLimitLayer`](super::RateLimitLayer) asks of every request. Implemented
/// by [`Global`] (one limiter for everything), [`PerKey`] (a [`PerKeyMap`],
/// [`Keyed`](crate::Keyed) or [`KeyedTokenBucket`](crate::KeyedTokenBucket), and a
/// [`KeyExtractor`](crate::tower::key::KeyExtractor)), [`GlobalMulti`] and [`PerKeyMulti`]
/// (their forms over limiters of several limits, each reported), [`And`] (both must pass) and
/// [`Cost`] (a request's cost from the request); build them with [`global`], [`per_key`],
/// [`global_multi`], [`per_key_multi`], [`PolicyExt::and`] and [`PolicyExt::cost`].
pub trait Policy<B>: Send + Sync + 'static {
    /// What the policy reads from a request, owned.
    type Key: Send + 'static;
    /// What a grant must remember to be given back.
    type Grant: Send + 'static;
    /// The decision, in flight. `Unpin`, so that the layer can ask it once at once (an
    /// in-process policy's is [`Ready`](std::future::Ready)) before deciding whether the response future must
    /// keep it; box an `async` block (`Pin<Box<dyn Future<..> + Send>>` is `Unpin`).
    type Future: Future<Output = Decision<Self::Grant>> + Send + Unpin + 'static;

    /// Reads the policy's key from `req`.
    fn key(&self, req: &Request<B>) -> Self::Key;

    /// Takes the permits for `key`, reserving them up to `max_wait` ahead (zero: now or
    /// never); with `report`, fills [`Decision::report`].
    fn decide(self: &Arc<Self>, key: Self::Key, ask: Ask) -> Self::Future;

    /// Gives back a grant of this policy (a later policy refused the request). Exact where
    /// the limiter's [`Limiter::refund_n_at`] is; a limiter that cannot refund keeps it.
    fn refund(&self, grant: Self::Grant);

    /// Feeds `state` what in `key` names the client, so that [`Mode::Fraction`] puts each
    /// client wholly in or out of the enforced share ([`PolicyExt::enforcement`]): a per-key
    /// policy's key, both keys of an [`And`], not a request's [`Cost`]. The default feeds
    /// nothing: a policy without a key ([`Global`]) is one client, in or out as a whole.
    fn hash_client<H: Hasher>(&self, key: &Self::Key, state: &mut H) {
        let _ = (key, state);
    }
}

/// A policy whose [`Policy::refund`] gives a grant back, as [`PolicyExt::and`] needs of the
/// policy it asks first: [`Global`] over a [`Refund`] limiter, [`PerKey`] over a
/// [`Keyed`](crate::Keyed) of [`Refund`] limiters or a
/// [`KeyedTokenBucket`](crate::KeyedTokenBucket), [`And`] of two such policies, and [`Cost`]
/// of one.
pub trait Refunds {}

/// [`PolicyExt::and`] for every policy. A trait of its own, not a method of [`Policy`], so
/// that combining two policies needs no request body type to be inferred.
pub trait PolicyExt: Sized {
    /// This policy, then `other`: a request passes only if both pass, and a request `other`
    /// refuses gives back what this one granted ([`Policy::refund`]), so it takes nothing
    /// from either. This policy must be able to give a grant back ([`Refunds`]); `other` may
    /// be any policy, so a limiter that keeps what it grants (a Redis limiter, a
    /// [`LeakyBucket`](crate::LeakyBucket)) goes last:
    ///
    /// ```compile_fail,E0277
    /// use turnstile::tower::{global, PolicyExt};
    /// use turnstile::{LeakyBucket, Limit, TokenBucket};
    ///
    /// let paced = global("paced", LeakyBucket::new(100).unwrap());
    /// let bucket = global("all", TokenBucket::new(Limit::per_second(100.0).unwrap(), 10));
    /// let both = paced.and(bucket); // error: a leaky bucket cannot give a grant back
    /// ```
    fn and<Q>(self, other: Q) -> And<Self, Q>
    where
        Self: Refunds,
    {
        And {
            first: Arc::new(self),
            second: Arc::new(other),
        }
    }

    /// This policy with a request's cost read by `cost` from the request (its route, its
    /// body's declared size, a header), in place of 1: each request takes that many permits
    /// from every limiter of this policy (both of an [`And`]), and a refund gives them all
    /// back. A cost of 0 passes without touching the limiters; a cost above a limit's burst
    /// is refused with no `Retry-After` (no wait makes it pass), as any check a limiter can
    /// never grant. Where costs nest, the innermost applies to its policy: in
    /// `per_ip.and(daily.cost(f)).cost(g)`, `per_ip` is charged `g`, `daily` `f`. Delay mode
    /// ([`RateLimitLayer::delay`](super::RateLimitLayer::delay)) reserves the whole cost.
    ///
    /// `cost` is the server's code, reading what a client sends: a client must not choose
    /// its own price. Cap what it reads from a header, and do not let it fall to 0 (free) on
    /// bad input:
    ///
    /// ```
    /// use turnstile::tower::{global, PolicyExt, RateLimitLayer};
    /// use turnstile::{Limit, TokenBucket};
    ///
    /// let all = global("all", TokenBucket::new(Limit::per_second(100.0).unwrap(), 100));
    /// let priced = all.cost(|req: &http::Request<()>| match req.uri().path() {
    ///     "/search" => 5, // a costly route
    ///     _ => req
    ///         .headers()
    ///         .get("x-batch-size")
    ///         .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
    ///         .unwrap_or(1)
    ///         .clamp(1, 50), // a client cannot ask for a cost of 0 or of 4 billion
    /// });
    /// let layer = RateLimitLayer::new(priced);
    /// # let _ = layer;
    /// ```
    fn cost<F>(self, cost: F) -> Cost<Self, F> {
        Cost {
            inner: Arc::new(self),
            cost,
        }
    }

    /// This policy under `enforcement`'s mode, which an operator changes at run time:
    /// refusals enforced ([`Mode::Enforce`]), only counted while the request goes on
    /// ([`Mode::Shadow`]), or enforced for a stable fraction of clients
    /// ([`Mode::Fraction`]); every decision counted ([`Enforced::counts`]). Shadow mode
    /// takes from the limiters exactly what enforcement would ([`Enforced`] says why), so
    /// its shadow refusals are the ones enforcement would make. One handle may drive
    /// several policies; wrap each policy of an [`And`] to roll them out apart.
    fn enforcement(self, enforcement: Enforcement) -> Enforced<Self> {
        Enforced::new(self, enforcement)
    }
}

impl<P> PolicyExt for P {}

// ---- helpers ----------------------------------------------------------------------------

/// `n` permits from `l` at `now`: checked, or reserved up to `max_wait` ahead; with the wait.
/// None (a free request) pass without asking the limiter.
#[inline]
pub(super) fn take<L: Limiter + ?Sized>(
    l: &L,
    now: crate::Nanos,
    n: u32,
    max_wait: Duration,
) -> (Result<(), Denied>, Duration) {
    if n == 0 {
        return (Ok(()), Duration::ZERO);
    }
    if max_wait.is_zero() {
        return (l.check_n_at(now, n), Duration::ZERO);
    }
    match l.schedule_n_at(now, n, max_wait) {
        Ok(at) => (Ok(()), at.saturating_duration_since(now)),
        Err(d) => (Err(d), Duration::ZERO),
    }
}

/// A report of one policy's status, if asked for and known.
#[inline]
pub(super) fn one_report(
    report: bool,
    name: &Arc<str>,
    status: impl FnOnce() -> Option<QuotaStatus>,
) -> Report {
    if !report {
        return Report::default();
    }
    Report {
        items: status()
            .map(|s| ReportItem::new(name.clone(), s))
            .into_iter()
            .collect(),
    }
}

/// A report of a multi-limit policy's `statuses`, named by `names` (the limits past the last
/// name are left out): every item in `RateLimit-Policy`, the binding one in `RateLimit`. One
/// allocation, as [`one_report`]'s.
pub(super) fn multi_report(names: &[Arc<str>], statuses: &[QuotaStatus]) -> Report {
    let statuses = &statuses[..statuses.len().min(names.len())];
    let b = binding(statuses);
    let mut items = Vec::with_capacity(statuses.len());
    items.extend(
        statuses
            .iter()
            .zip(names)
            .enumerate()
            .map(|(i, (s, name))| ReportItem {
                name: name.clone(),
                status: *s,
                binding: i == b,
            }),
    );
    Report { items }
}

/// The index of the binding status: the fewest permits left, the longest reset among
/// equals, the first among equals of both ([`Statuses::binding`]'s rule).
///
/// [`Statuses::binding`]: crate::multi_token_bucket::Statuses::binding
pub(super) fn binding(statuses: &[QuotaStatus]) -> usize {
    let mut b = 0;
    for (i, s) in statuses.iter().enumerate().skip(1) {
        let best = &statuses[b];
        if (s.remaining, std::cmp::Reverse(s.reset))
            < (best.remaining, std::cmp::Reverse(best.reset))
        {
            b = i;
        }
    }
    b
}
