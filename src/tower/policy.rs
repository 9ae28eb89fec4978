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

use std::future::{ready, Future, Ready};
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready as ready_poll, Context, Poll};
use std::time::Duration;

use http::Request;

use super::key::{KeyExtractor, KeyType};
use crate::{Clock, Denied, Idle, Keyed, KeyedTokenBucket, Limiter, Nanos, QuotaStatus};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ask {
    /// Fill [`Decision::report`] when the policy refuses.
    pub report: bool,
    /// Fill it when the policy grants, too ([`Headers::Always`](super::Headers::Always)).
    /// Apart, so that a layer that puts the headers on refusals only does not compute a
    /// status on every allowed request.
    pub report_grants: bool,
    /// Reserve up to this far ahead ([`Limiter::schedule_n_at`]); zero: now or never.
    pub max_wait: Duration,
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
    /// `(policy name, its status)`, in policy order.
    pub items: Vec<(Arc<str>, QuotaStatus)>,
}

/// A question a [`RateLimitLayer`](super::RateLimitLayer) asks of every request. Implemented
/// by [`Global`] (one limiter for everything), [`PerKey`] (a [`PerKeyMap`], [`Keyed`] or
/// [`KeyedTokenBucket`], and a [`KeyExtractor`]) and [`And`] (both must pass); build them
/// with [`global`], [`per_key`] and [`PolicyExt::and`].
pub trait Policy<B>: Send + Sync + 'static {
    /// What the policy reads from a request, owned.
    type Key: Send + 'static;
    /// What a grant must remember to be given back.
    type Grant: Send + 'static;
    /// The decision, in flight. `Unpin`, so that the layer can ask it once at once (an
    /// in-process policy's is [`Ready`]) before deciding whether the response future must
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
}

/// [`PolicyExt::and`] for every policy. A trait of its own, not a method of [`Policy`], so
/// that combining two policies needs no request body type to be inferred.
pub trait PolicyExt: Sized {
    /// This policy, then `other`: a request passes only if both pass, and a request `other`
    /// refuses gives back what this one granted ([`Policy::refund`]), so it takes nothing
    /// from either. Put limiters that cannot refund ([`Limiter::refund_n_at`] returns
    /// `false`, a Redis limiter) last.
    fn and<Q>(self, other: Q) -> And<Self, Q> {
        And {
            first: Arc::new(self),
            second: Arc::new(other),
        }
    }
}

impl<P> PolicyExt for P {}

// ---- Global -----------------------------------------------------------------------------

/// One limiter for every request: [`global`].
pub struct Global<L> {
    name: Arc<str>,
    limiter: L,
}

/// A policy that takes one permit from `limiter` per request, whatever the request; `name`
/// is its name in the `RateLimit` headers.
///
/// ```
/// use turnstile::tower::{global, Policy};
/// use turnstile::{Limit, TokenBucket};
///
/// let all = global("all", TokenBucket::new(Limit::per_second(1000.0).unwrap(), 100));
/// # let _ = all;
/// ```
pub fn global<L: Limiter + 'static>(name: impl Into<Arc<str>>, limiter: L) -> Global<L> {
    Global {
        name: name.into(),
        limiter,
    }
}

impl<L> Global<L> {
    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<B, L: Limiter + 'static> Policy<B> for Global<L> {
    type Key = ();
    /// The clock reading the permit was taken at (a window's refund finds the grant's window
    /// by it).
    type Grant = Nanos;
    type Future = Ready<Decision<Nanos>>;

    #[inline]
    fn key(&self, _: &Request<B>) -> Self::Key {}

    #[inline]
    fn decide(self: &Arc<Self>, _: (), ask: Ask) -> Self::Future {
        let now = self.limiter.now();
        let (result, wait) = take(&self.limiter, now, ask.max_wait);
        let report = one_report(ask.reports(result.is_ok()), &self.name, || {
            self.limiter.quota_at(now)
        });
        ready(Decision {
            result: result.map(|()| now),
            wait,
            report,
        })
    }

    fn refund(&self, at: Nanos) {
        let _ = self.limiter.refund_n_at(at, 1);
    }
}

// ---- PerKey -----------------------------------------------------------------------------

/// What a [`PerKey`] policy does with a request its extractor finds no key in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MissingKey<K> {
    /// Let it through, untouched by this policy.
    Allow,
    /// Refuse it (with no `Retry-After`: no wait makes a keyless request acceptable).
    Deny,
    /// Count it under this key: every keyless request shares one limit.
    As(K),
}

/// A per-key limiter map a [`PerKey`] policy takes permits from: implemented by
/// [`Keyed`] (any limiter per key, built by a factory) and by [`KeyedTokenBucket`] (a token
/// bucket per key, its state inline: one word per key, the cheaper check).
pub trait PerKeyMap<K>: Send + Sync + 'static {
    /// The map's clock reading now: the time a request is decided at.
    fn now(&self) -> Nanos;

    /// One permit for `key` at `now`: checked, or reserved up to `ask.max_wait` ahead where
    /// the map can reserve; with the wait, and `key`'s status after it when
    /// [`Ask::reports`] wants one for that answer (`None` otherwise, or when the map cannot
    /// say).
    fn take(
        &self,
        key: &K,
        now: Nanos,
        ask: Ask,
    ) -> ((Result<(), Denied>, Duration), Option<QuotaStatus>);

    /// Gives back one permit `take` granted `key` at `at` (a later policy refused the
    /// request). Exact where the key's limiter refunds exactly; a no-op where it cannot.
    fn refund(&self, key: &K, at: Nanos);

    /// Moves the map's sweeps off the request path: [`per_key`] calls it once, on the map it
    /// now owns. The crate's maps start their sweeper thread ([`Keyed::spawn_sweeper`],
    /// [`KeyedTokenBucket::spawn_sweeper`]), which ends when the policy (and so the map) is
    /// dropped. The default does nothing: the map sweeps as it likes.
    fn spawn_sweeper(self: &Arc<Self>)
    where
        Self: Sized,
    {
    }
}

impl<K, L, C> PerKeyMap<K> for Keyed<K, L, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    L: Limiter + Idle + 'static,
    C: Clock + 'static,
{
    #[inline]
    fn now(&self) -> Nanos {
        Keyed::now(self)
    }

    #[inline]
    fn take(
        &self,
        key: &K,
        now: Nanos,
        ask: Ask,
    ) -> ((Result<(), Denied>, Duration), Option<QuotaStatus>) {
        // One visit to the key's limiter for the permit and, when asked for, the status (each
        // visit of a contended key's slot is a shared write), at `now`, which also dates a new
        // key's limiter (one dated at a later reading reads as not full at `now`): the status
        // only for the kind of answer the layer shows it on, so an allowed request under the
        // default headers (refusals only) pays for the check alone.
        self.visit_at(
            key,
            now,
            |l| {
                let taken = take(l, now, ask.max_wait);
                let status = if ask.reports(taken.0.is_ok()) {
                    l.quota_at(now)
                } else {
                    None
                };
                (taken, status)
            },
            // A grant wrote the limiter's state; a refusal did not.
            |((r, _), _)| r.is_ok(),
        )
        // The key is new and the map full: the map's answer (its WhenFull), no status.
        .unwrap_or_else(|full| ((full, Duration::ZERO), None))
    }

    #[inline]
    fn refund(&self, key: &K, at: Nanos) {
        let _ = self.refund_n_at(key, at, 1);
    }

    fn spawn_sweeper(self: &Arc<Self>) {
        // Detached: it ends by itself when the map drops.
        drop(Keyed::spawn_sweeper(self));
    }
}

/// The inline map: one lookup and one CAS per allowed request, the cheapest per-key check
/// turnstile has.
///
/// **No reserve-ahead.** [`KeyedTokenBucket`] has no schedule: under
/// [`RateLimitLayer::delay`](super::RateLimitLayer::delay) a request it cannot grant now is
/// refused at once, as with a zero `max_wait` (its `Retry-After` says when to come back).
/// Use a [`Keyed`] of [`TokenBucket`](crate::TokenBucket)s where requests should wait.
impl<K, S, C> PerKeyMap<K> for KeyedTokenBucket<K, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Clock + 'static,
{
    #[inline]
    fn now(&self) -> Nanos {
        KeyedTokenBucket::now(self)
    }

    #[inline]
    fn take(
        &self,
        key: &K,
        now: Nanos,
        ask: Ask,
    ) -> ((Result<(), Denied>, Duration), Option<QuotaStatus>) {
        // Never a wait: `max_wait` is ignored (no schedule here; see the impl's docs).
        let result = self.check_n_at(key, now, 1);
        // The status, when this answer shows it (under the default headers, a refusal only),
        // is a second lookup of the key, after the check: the check is one CAS on the key's
        // word and has no status to hand back, and the lookup is a load, no write. A
        // concurrent grant in between makes it a moment later than the check; the headers
        // say what is left, which is what the client wants to know.
        let status = if ask.reports(result.is_ok()) {
            self.quota_at(key, now)
        } else {
            None
        };
        ((result, Duration::ZERO), status)
    }

    #[inline]
    fn refund(&self, key: &K, at: Nanos) {
        let _ = self.refund_n_at(key, at, 1);
    }

    fn spawn_sweeper(self: &Arc<Self>) {
        // Detached: it ends by itself when the map drops.
        drop(KeyedTokenBucket::spawn_sweeper(self));
    }
}

/// A limiter per key, picked by a [`KeyExtractor`]: [`per_key`].
pub struct PerKey<K, X, M> {
    name: Arc<str>,
    extractor: X,
    /// Shared with the map's sweeper thread, which holds a `Weak` and ends when this drops.
    map: Arc<M>,
    missing: MissingKey<K>,
}

/// A policy that takes one permit per request from the limiter of the request's key, in
/// `map`; `extractor` reads the key. The map is a [`PerKeyMap`]: a [`Keyed`] (one limiter per
/// key, built by its factory on first sight and evicted when idle; any limiter, with
/// [`RateLimitLayer::delay`](super::RateLimitLayer::delay) where it can reserve) or a
/// [`KeyedTokenBucket`] (a token bucket per key, its state one word in the map: the cheaper
/// check, without delay mode). Requests with no key are allowed through; see
/// [`PerKey::on_missing_key`].
///
/// **Memory and sweeps.** Keys come from clients, so the map's bound is what a flood of
/// distinct keys can cost: both maps hold at most their `max_keys` keys,
/// [`DEFAULT_MAX_KEYS`](crate::keyed::DEFAULT_MAX_KEYS) (2^20) unless built with another,
/// and refuse new keys beyond it ([`WhenFull::Deny`](crate::keyed::WhenFull)) until a sweep
/// evicts idle ones; held keys are never evicted to make room, so the flood resets nobody's
/// limit. For a [`KeyedTokenBucket`] of `IpAddr` that is a 64 MiB table at the default
/// bound (32 bytes a slot; its module docs, "Memory and the key bound"); for a [`Keyed`],
/// the entry and limiter per key. `per_key` takes the map over and starts its sweeper thread
/// ([`PerKeyMap::spawn_sweeper`]), which ends when the policy is dropped: sweeps, periodic
/// or asked for by a full map, never run on a request's worker. A held key's check waits
/// for no other key's insert, for no resize of the table, and for no sweep.
///
/// ```
/// use turnstile::tower::{key, per_key, Policy};
/// use turnstile::{Keyed, Limit, TokenBucket};
///
/// let per_ip = per_key(
///     "per-ip",
///     key::PeerIp,
///     Keyed::new(|_| TokenBucket::new(Limit::per_second(10.0).unwrap(), 20)),
/// );
/// # let _ = per_ip;
/// ```
///
/// With the inline map, the key type still comes from the extractor (an `IpAddr` here):
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use std::sync::Arc;
/// use turnstile::tower::{key, per_key, Ask, Policy};
/// use turnstile::{KeyedTokenBucket, Limit};
///
/// let per_ip = Arc::new(per_key(
///     "per-ip",
///     key::PeerIp,
///     KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 2),
/// ));
/// let mut req = http::Request::new(());
/// req.extensions_mut()
///     .insert("192.0.2.7:5000".parse::<SocketAddr>().unwrap());
/// let decide = || {
///     let key = Policy::<()>::key(&*per_ip, &req);
///     Policy::<()>::decide(&per_ip, key, Ask::default()).into_inner()
/// };
/// assert!(decide().result.is_ok());
/// assert!(decide().result.is_ok());
/// assert!(decide().result.is_err()); // the burst of 2 is spent
/// assert_eq!(per_ip.map().len(), 1);
/// assert!(per_ip.map().contains(&"192.0.2.7".parse::<IpAddr>().unwrap()));
/// ```
pub fn per_key<K, X, M>(name: impl Into<Arc<str>>, extractor: X, map: M) -> PerKey<K, X, M>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: KeyType<Key = K> + Send + Sync + 'static,
    M: PerKeyMap<K>,
{
    let map = Arc::new(map);
    map.spawn_sweeper();
    PerKey {
        name: name.into(),
        extractor,
        map,
        missing: MissingKey::Allow,
    }
}

impl<K, X, M> PerKey<K, X, M> {
    /// What to do with requests the extractor finds no key in (default
    /// [`MissingKey::Allow`]).
    pub fn on_missing_key(mut self, missing: MissingKey<K>) -> Self {
        self.missing = missing;
        self
    }

    /// The per-key map.
    pub fn map(&self) -> &M {
        &self.map
    }
}

/// A [`PerKey`] grant: the key charged and the clock reading it was charged at (none when a
/// keyless request was let through).
pub struct KeyGrant<K>(Option<(K, Nanos)>);

impl<B, K, X, M> Policy<B> for PerKey<K, X, M>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: KeyExtractor<B, Key = K>,
    M: PerKeyMap<K>,
{
    type Key = Option<K>;
    type Grant = KeyGrant<K>;
    type Future = Ready<Decision<KeyGrant<K>>>;

    #[inline]
    fn key(&self, req: &Request<B>) -> Self::Key {
        self.extractor.extract(req)
    }

    #[inline]
    fn decide(self: &Arc<Self>, key: Self::Key, ask: Ask) -> Self::Future {
        let key = match key {
            Some(k) => k,
            None => match &self.missing {
                MissingKey::Allow => {
                    return ready(Decision {
                        result: Ok(KeyGrant(None)),
                        wait: Duration::ZERO,
                        report: Report::default(),
                    })
                }
                MissingKey::Deny => {
                    let now = self.map.now();
                    return ready(Decision {
                        result: Err(Denied::new(now, None)),
                        wait: Duration::ZERO,
                        report: Report::default(),
                    });
                }
                MissingKey::As(k) => k.clone(),
            },
        };
        let now = self.map.now();
        let ((result, wait), status) = self.map.take(&key, now, ask);
        let report = one_report(status.is_some(), &self.name, || status);
        ready(Decision {
            result: result.map(|()| KeyGrant(Some((key, now)))),
            wait,
            report,
        })
    }

    fn refund(&self, grant: KeyGrant<K>) {
        if let KeyGrant(Some((key, at))) = grant {
            self.map.refund(&key, at);
        }
    }
}

// ---- And --------------------------------------------------------------------------------

/// Two policies, both of which must pass: [`PolicyExt::and`].
pub struct And<A, B> {
    first: Arc<A>,
    second: Arc<B>,
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

// ---- helpers ----------------------------------------------------------------------------

/// One permit from `l` at `now`: checked, or reserved up to `max_wait` ahead; with the wait.
#[inline]
fn take<L: Limiter + ?Sized>(
    l: &L,
    now: crate::Nanos,
    max_wait: Duration,
) -> (Result<(), Denied>, Duration) {
    if max_wait.is_zero() {
        return (l.check_n_at(now, 1), Duration::ZERO);
    }
    match l.schedule_n_at(now, 1, max_wait) {
        Ok(at) => (Ok(()), at.saturating_duration_since(now)),
        Err(d) => (Err(d), Duration::ZERO),
    }
}

/// A report of one policy's status, if asked for and known.
#[inline]
fn one_report(
    report: bool,
    name: &Arc<str>,
    status: impl FnOnce() -> Option<QuotaStatus>,
) -> Report {
    if !report {
        return Report::default();
    }
    Report {
        items: status().map(|s| (name.clone(), s)).into_iter().collect(),
    }
}

// ---- Redis ------------------------------------------------------------------------------

/// The default [`Fleet::deadline`]: 100 ms, [`Fallback`](crate::redis::Fallback)'s per-call
/// timeout. A healthy Redis answers a limiter's script in well under a millisecond on a LAN
/// and in a few at its tail, so 100 ms is far beyond any answer that is coming, yet is what a
/// request pays at most for an outage: under a person's notice and well under the timeouts of
/// clients and load balancers, which would otherwise give up first (the way a stalled Redis
/// becomes an outage of the service).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(100);

/// The retry time of a refusal the Redis limiter did not decide ([`FailurePolicy::Closed`]):
/// one second, the least `Retry-After` says above zero. How long an outage lasts is not
/// known; one second sends a client back soon without inviting it to retry at once.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub const FAILURE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The default bound on the keys of a [`Fleet`]'s local map ([`FailurePolicy::Local`]): 65 536
/// keys, at a few hundred bytes each (a compact limiter and its entry) some tens of MiB at
/// most. A new key that finds the map full is refused with a retry time (the map's
/// [`WhenFull::Deny`](crate::keyed::WhenFull::Deny)), so a flood of keys during an outage can
/// neither grow the process nor reset anyone's limit. [`Fleet::local_max_keys`] changes it.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub const DEFAULT_LOCAL_MAX_KEYS: u64 = 65_536;

/// What a [`Fleet`] policy answers when its Redis limiter does not: an error (the connection
/// down or refused, an answer such as `OOM`, `READONLY`, `BUSY`, `NOPERM`, a script error,
/// bad input), or no answer within the [deadline](Fleet::deadline).
///
/// The default is [`FailurePolicy::Local`] with a share of 1: each process answers from its
/// own limiter per key, with the fleet's whole limit. Like failing open (Envoy's global rate
/// limit default), an outage of the limiter is not an outage of the service: a client within
/// the fleet's limit is within it at every process (what one process sees of its requests is
/// a part of them), so no request the fleet's limit admits is refused. Unlike failing open, a
/// client over the limit is still held to it at each process, instead of being let through
/// unlimited for as long as Redis is down (an attacker who can make Redis fail, by filling
/// its memory say, would otherwise switch the limit off). The price is a bounded in-process
/// map ([`DEFAULT_LOCAL_MAX_KEYS`]) and, across a fleet of `n`, up to `n` times the limit for
/// a client spread over all of them; a share of `1 / n` keeps the fleet near the one limit,
/// at the cost of refusing a client whose requests reach one process more than its share.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailurePolicy {
    /// Let the request through (fail open).
    Open,
    /// Refuse it (fail closed), with a `Retry-After` of [`FAILURE_RETRY_AFTER`].
    Closed,
    /// Answer in process: a limiter per key with the Redis limiter's configuration, its
    /// limit scaled by this share, in `(0, 1]` ([`RedisLimiter::local`](crate::redis::RedisLimiter::local)),
    /// in a map of at most [`Fleet::local_max_keys`] keys. Its refusals carry the local
    /// limiter's retry time, and the `RateLimit` headers its status. The local limiters
    /// persist across outages (a flapping connection hands nobody a fresh budget at each
    /// flap) and are evicted once idle.
    Local(f64),
}

/// A fleet-wide limit on Redis, per key: [`fleet`] (features `tower` and `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct Fleet<X, R: crate::redis::RedisLimiter + 'static> {
    name: Arc<str>,
    extractor: X,
    // Shared with the local map's factory, which builds a key's limiter from it.
    limiter: Arc<R>,
    missing: MissingKey<String>,
    deadline: Duration,
    failure: FailurePolicy,
    local_max_keys: u64,
    /// The local limiters: built for [`FailurePolicy::Local`] only.
    local: Option<Keyed<String, R::Local>>,
    log: crate::redis::ErrorLog,
}

/// A policy that takes one permit per request from a Redis limiter
/// ([`Gcra`](crate::redis::Gcra), [`Fallback`](crate::redis::Fallback), [`Coalesce`](crate::redis::Coalesce), …)
/// under the request's key (its `Display` form): one limit shared by every server of a
/// fleet. Requests with no key (or an empty one, or one longer than the limiter's
/// [`max_key_len`](crate::redis::RedisLimiter::max_key_len)) pass; see [`Fleet::on_missing_key`].
///
/// **Deadline and failures.** Each decision waits for Redis at most the
/// [deadline](Fleet::deadline) (default [`DEFAULT_DEADLINE`], 100 ms); an error the limiter
/// returns, whatever it is, and a missed deadline are answered by the
/// [failure policy](Fleet::on_failure) (default [`FailurePolicy::Local`] with a share of 1:
/// see there why), and logged as a `tracing` warning, at most one a second per policy, with
/// the count of those not logged since ([`Fleet::failures`] counts them all). A
/// [`Fallback`](crate::redis::Fallback) limiter answers an unreachable Redis itself (in
/// process, and without a round trip for as long as the outage lasts); what it passes on
/// (an answer such as `OOM`, a script error) is the failure policy's.
///
/// **Every refusal a retry can cure carries `Retry-After`:** the server's figure, the local
/// limiter's, or [`FAILURE_RETRY_AFTER`] for a refusal of [`FailurePolicy::Closed`]. (A
/// keyless request under [`MissingKey::Deny`] gets none: no wait makes it acceptable.)
///
/// A Redis grant cannot be given back, so in [`PolicyExt::and`] put this policy last. The
/// decision is a boxed future (one allocation per request, next to a network round trip).
/// The `RateLimit` headers carry the key's status after the check, from the limiter's own
/// answer to it
/// ([`RedisLimiter::try_check_n_status`](crate::redis::RedisLimiter::try_check_n_status),
/// no extra round trip): exact for [`Gcra`](crate::redis::Gcra) (`q` = burst, `w` = burst /
/// limit, `r` and `t` from its [`Throttle`](crate::redis::Throttle)), for the go-zero
/// [`TokenBucket`](crate::redis::TokenBucket) and
/// [`FixedWindow`](crate::redis::FixedWindow), and for a
/// [`Fallback`](crate::redis::Fallback) over them (its local limiter's while Redis is
/// down). A limiter that cannot say exactly (a [`Coalesce`](crate::redis::Coalesce), whose
/// batches answer verdicts only) leaves the policy out of the headers; so do
/// [`FailurePolicy::Open`] and [`FailurePolicy::Closed`] answers.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use turnstile::redis::Gcra;
/// use turnstile::tower::{fleet, key, FailurePolicy, MissingKey, RateLimitLayer};
/// use turnstile::Limit;
///
/// let con = turnstile::redis::connect("redis://127.0.0.1:6379/").await?;
/// let gcra = Gcra::new(con, Limit::per_second(10.0)?, 20)?;
/// let per_api_key = fleet("per-key", key::Header("x-api-key".parse()?), gcra)
///     .deadline(Duration::from_millis(50))?
///     // Four servers: each answers a quarter of the limit while Redis is down.
///     .on_failure(FailurePolicy::Local(0.25))?
///     .on_missing_key(MissingKey::Deny);
/// let layer = RateLimitLayer::new(per_api_key);
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub fn fleet<X, R>(name: impl Into<Arc<str>>, extractor: X, limiter: R) -> Fleet<X, R>
where
    R: crate::redis::RedisLimiter + 'static,
{
    let limiter = Arc::new(limiter);
    let failure = FailurePolicy::Local(1.0);
    Fleet {
        name: name.into(),
        extractor,
        local: Some(
            local_map(&limiter, 1.0, DEFAULT_LOCAL_MAX_KEYS)
                .unwrap_or_else(|_| unreachable!("the defaults are valid")),
        ),
        limiter,
        missing: MissingKey::Allow,
        deadline: DEFAULT_DEADLINE,
        failure,
        local_max_keys: DEFAULT_LOCAL_MAX_KEYS,
        log: crate::redis::ErrorLog::new(),
    }
}

/// The local limiters of [`FailurePolicy::Local`]: `limiter`'s own local form with `share` of
/// its limit, one per key, at most `max_keys` of them.
#[cfg(feature = "redis")]
fn local_map<R: crate::redis::RedisLimiter + 'static>(
    limiter: &Arc<R>,
    share: f64,
    max_keys: u64,
) -> Result<Keyed<String, R::Local>, crate::ConfigError> {
    let limiter = limiter.clone();
    Keyed::builder(move |_: &String| limiter.local(share))
        .max_keys(max_keys)
        .build()
}

#[cfg(feature = "redis")]
impl<X, R: crate::redis::RedisLimiter + 'static> Fleet<X, R> {
    /// The most a decision waits for Redis (default [`DEFAULT_DEADLINE`]) before the
    /// [failure policy](Fleet::on_failure) answers it. A call that missed it was sent: a
    /// stalled Redis may still count it when it wakes.
    ///
    /// # Errors
    /// [`ConfigError::ZeroTimeout`](crate::ConfigError::ZeroTimeout) for zero: no call
    /// would ever be answered.
    pub fn deadline(mut self, deadline: Duration) -> Result<Self, crate::ConfigError> {
        if deadline.is_zero() {
            return Err(crate::ConfigError::ZeroTimeout);
        }
        self.deadline = deadline;
        Ok(self)
    }

    /// What answers a request the Redis limiter did not (default [`FailurePolicy::Local`]
    /// with a share of 1; see [`FailurePolicy`] for why).
    ///
    /// # Errors
    /// [`ConfigError::InvalidShare`](crate::ConfigError::InvalidShare) for a local share
    /// outside `(0, 1]` (NaN included).
    pub fn on_failure(mut self, failure: FailurePolicy) -> Result<Self, crate::ConfigError> {
        self.local = match failure {
            FailurePolicy::Local(share) if !(share > 0.0 && share <= 1.0) => {
                return Err(crate::ConfigError::InvalidShare(share))
            }
            FailurePolicy::Local(share) => {
                Some(local_map(&self.limiter, share, self.local_max_keys)?)
            }
            FailurePolicy::Open | FailurePolicy::Closed => None,
        };
        self.failure = failure;
        Ok(self)
    }

    /// The most keys [`FailurePolicy::Local`]'s map holds (default
    /// [`DEFAULT_LOCAL_MAX_KEYS`]); a new key that finds it full is refused, with a retry
    /// time.
    ///
    /// # Errors
    /// [`ConfigError::ZeroMaxKeys`](crate::ConfigError::ZeroMaxKeys) for zero.
    pub fn local_max_keys(mut self, max_keys: u64) -> Result<Self, crate::ConfigError> {
        if max_keys == 0 {
            return Err(crate::ConfigError::ZeroMaxKeys);
        }
        self.local_max_keys = max_keys;
        let failure = self.failure;
        self.on_failure(failure)
    }

    /// What to do with requests the extractor finds no key in, or an empty one (default
    /// [`MissingKey::Allow`]), as [`PerKey::on_missing_key`]: let them through, refuse them
    /// (with no `Retry-After`), or count them all under one key (its `Display` form).
    pub fn on_missing_key(mut self, missing: MissingKey<X::Key>) -> Self
    where
        X: KeyType,
        X::Key: std::fmt::Display,
    {
        self.missing = match missing {
            MissingKey::Allow => MissingKey::Allow,
            MissingKey::Deny => MissingKey::Deny,
            MissingKey::As(k) => MissingKey::As(k.to_string()),
        };
        self
    }

    /// The Redis limiter.
    pub fn limiter(&self) -> &R {
        &self.limiter
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// How many decisions the failure policy has answered (Redis errors and missed
    /// deadlines), logged or not.
    pub fn failures(&self) -> u64 {
        self.log.total()
    }

    /// [`FailurePolicy::Local`]'s limiters (`None` under another policy): for
    /// [`Keyed::len`] or a key's limiter.
    pub fn local(&self) -> Option<&Keyed<String, R::Local>> {
        self.local.as_ref()
    }

    /// The answer of the failure policy to a check of `key` the limiter failed with `error`.
    #[cold]
    fn failed(
        &self,
        key: &str,
        error: &crate::redis::RedisLimitError,
        ask: Ask,
    ) -> crate::redis::StatusVerdict {
        if let Some(suppressed) = self.log.admit() {
            tracing::warn!(
                policy = &*self.name,
                %error,
                on_failure = ?self.failure,
                suppressed,
                "turnstile: the fleet policy's Redis limiter failed; the failure policy answered"
            );
        }
        match (&self.failure, &self.local) {
            (FailurePolicy::Local(_), Some(local)) => {
                // The in-process per-key check (no reserve-ahead: the Redis limiters have
                // none either), with the key's local status when the answer shows it.
                let ask = Ask {
                    max_wait: Duration::ZERO,
                    ..ask
                };
                let ((result, _), status) =
                    PerKeyMap::take(local, &key.to_owned(), local.now(), ask);
                (result, status)
            }
            (FailurePolicy::Open, _) => (Ok(()), None),
            _ => (
                Err(crate::redis::denied_after(Some(FAILURE_RETRY_AFTER))),
                None,
            ),
        }
    }
}

#[cfg(feature = "redis")]
impl<B, X, R> Policy<B> for Fleet<X, R>
where
    X: KeyExtractor<B>,
    X::Key: std::fmt::Display,
    R: crate::redis::RedisLimiter + 'static,
{
    type Key = Option<String>;
    type Grant = ();
    type Future = Pin<Box<dyn Future<Output = Decision<()>> + Send>>;

    fn key(&self, req: &Request<B>) -> Self::Key {
        self.extractor.extract(req).map(|k| k.to_string())
    }

    fn decide(self: &Arc<Self>, key: Self::Key, ask: Ask) -> Self::Future {
        // An empty key, or one longer than the limiter takes, is no key: the limiter would
        // refuse it as bad input, which the failure policy must not answer (under `Open` a
        // client could pass unlimited by sending a long key).
        let max = self.limiter.max_key_len();
        let key = match key.filter(|k| !k.is_empty() && k.len() <= max) {
            Some(k) => k,
            None => match &self.missing {
                MissingKey::Allow => return Box::pin(ready(decided(Ok(())))),
                MissingKey::Deny => {
                    let now = crate::QuantaClock::new().now();
                    return Box::pin(ready(decided(Err(Denied::new(now, None)))));
                }
                MissingKey::As(k) => k.clone(),
            },
        };
        let this = self.clone();
        Box::pin(async move {
            // With headers, the check that also answers the key's status (the same round
            // trip: the status comes from the check's own reply). Without, the plain check:
            // for the limiters that can say, the status costs nothing in Redis but is still
            // work here (a `Fallback` in fallback mode reads its local limiter's), and a
            // hand-written limiter's `try_check_n` may be cheaper than its status.
            let deadline = this.deadline;
            let answer = if ask.report || ask.report_grants {
                tokio::time::timeout(deadline, this.limiter.try_check_n_status(&key, 1)).await
            } else {
                let check = this.limiter.try_check_n(&key, 1);
                tokio::time::timeout(deadline, async move { Ok((check.await?, None)) }).await
            };
            let (result, status) = match answer {
                Ok(Ok(verdict)) => verdict,
                Ok(Err(e)) => this.failed(&key, &e, ask),
                Err(_elapsed) => {
                    this.failed(&key, &crate::redis::RedisLimitError::Timeout(deadline), ask)
                }
            };
            let report = one_report(ask.reports(result.is_ok()), &this.name, || status);
            Decision {
                report,
                ..decided(result)
            }
        })
    }

    fn refund(&self, _: ()) {}
}

/// A fleet decision, with no report.
#[cfg(feature = "redis")]
fn decided(result: Result<(), Denied>) -> Decision<()> {
    Decision {
        result,
        wait: Duration::ZERO,
        report: Report::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tower::key;
    use crate::{Limit, ManualClock, TokenBucket};
    use std::task::Waker;

    fn now_or_never<F: Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => v,
            Poll::Pending => panic!("an in-process policy decides at once"),
        }
    }

    /// A `PerKey` over `map` (1/s, burst 2, on a clock at 1 s): the status only on the
    /// answers asked for, exact; reserve-ahead as the map can; a refund gives the permit back.
    /// Returns the waits of two requests past the burst under a 10 s `max_wait`.
    fn per_key_contract<M: PerKeyMap<u8>>(map: M) -> Vec<Duration> {
        let p = Arc::new(per_key(
            "k",
            key::from_fn(|r: &Request<()>| r.uri().path().as_bytes().get(1).copied()),
            map,
        ));
        let req = |path: &str| Request::get(path).body(()).unwrap();
        let decide = |path: &str, ask: Ask| {
            now_or_never(Policy::<()>::decide(
                &p,
                Policy::<()>::key(&*p, &req(path)),
                ask,
            ))
        };
        let refusals_only = Ask {
            report: true,
            ..Ask::default()
        };
        let always = Ask {
            report_grants: true,
            ..refusals_only
        };
        let status = |remaining, reset: u64| QuotaStatus {
            quota: 2,
            window: Duration::from_secs(2),
            remaining,
            reset: Duration::from_secs(reset),
        };
        // Grants under the default headers carry no status; under Always they do.
        let d = decide("/a", refusals_only);
        assert!(d.result.is_ok() && d.report.items.is_empty());
        let d = decide("/a", always);
        assert!(d.result.is_ok());
        assert_eq!(d.report.items, vec![("k".into(), status(0, 2))]);
        // A refusal: with the status when asked for, without when not.
        let d = decide("/a", refusals_only);
        assert!(d.result.is_err());
        assert_eq!(d.report.items, vec![("k".into(), status(0, 2))]);
        assert!(decide("/a", Ask::default()).report.items.is_empty());
        // Another key is whole.
        let d = decide("/b", always);
        assert_eq!(d.report.items, vec![("k".into(), status(1, 1))]);
        // A refund gives "/b"'s permit back; "/a" has none to spend.
        match decide("/b", Ask::default()).result {
            Ok(g) => Policy::<()>::refund(&*p, g),
            Err(_) => panic!("\"/b\" had one left"),
        }
        let d = decide("/b", always);
        assert!(d.result.is_ok(), "the refund gave nothing back");
        assert_eq!(d.report.items, vec![("k".into(), status(0, 2))]);
        // Past the burst with a maximum wait: reserved ahead, or refused at once.
        let ahead = Ask {
            max_wait: Duration::from_secs(10),
            ..Ask::default()
        };
        (0..2)
            .map(|_| {
                let d = decide("/a", ahead);
                if d.result.is_err() {
                    assert_eq!(d.wait, Duration::ZERO);
                }
                d.wait
            })
            .collect()
    }

    #[test]
    fn per_key_over_either_map_reports_only_what_is_asked_and_refunds() {
        let limit = Limit::per_second(1.0).unwrap();
        let clock = ManualClock::new(Nanos::new(1_000_000_000));
        let c = clock.clone();
        let keyed = Keyed::builder(move |_: &u8| TokenBucket::with_clock(limit, 2, c.clone()))
            .clock(clock.clone())
            .build()
            .unwrap();
        // A Keyed of token buckets reserves: 1 s, then 2 s ahead.
        assert_eq!(
            per_key_contract(keyed),
            [Duration::from_secs(1), Duration::from_secs(2)]
        );
        let clock = ManualClock::new(Nanos::new(1_000_000_000));
        let inline = KeyedTokenBucket::builder(limit, 2)
            .clock(clock.clone())
            .build()
            .unwrap();
        // The inline map cannot: refused at once, twice (the first reserved nothing).
        assert_eq!(per_key_contract(inline), [Duration::ZERO; 2]);
    }

    #[test]
    fn both_reservations_hold_until_the_later_ones_time() {
        let clock = ManualClock::new(Nanos::new(1_000_000_000));
        let bucket = |per_sec| {
            TokenBucket::with_clock(Limit::per_second(per_sec).unwrap(), 1, clock.clone())
        };
        let both = Arc::new(global("slow", bucket(1.0)).and(global("fast", bucket(2.0))));
        let req = Request::new(());
        let ask = Ask {
            max_wait: Duration::from_secs(10),
            ..Ask::default()
        };
        let decide = || {
            now_or_never(Policy::<()>::decide(
                &both,
                Policy::<()>::key(&*both, &req),
                ask,
            ))
        };
        assert_eq!(decide().wait, Duration::ZERO);
        // The slow bucket's next token is 1 s away, the fast one's 0.5 s: wait for both.
        let d = decide();
        assert!(d.result.is_ok());
        assert_eq!(d.wait, Duration::from_secs(1));
    }

    /// A policy whose decision never comes (a Redis that stalls, with no deadline).
    struct Stalled;

    impl Policy<()> for Stalled {
        type Key = ();
        type Grant = ();
        type Future = std::future::Pending<Decision<()>>;
        fn key(&self, _: &Request<()>) {}
        fn decide(self: &Arc<Self>, _: (), _: Ask) -> Self::Future {
            std::future::pending()
        }
        fn refund(&self, _: ()) {}
    }

    /// Polls `policy`'s decision once, for a request, and drops it while it is pending.
    fn abandon<P: Policy<()>>(policy: &Arc<P>) {
        let req = Request::new(());
        let mut fut = Policy::<()>::decide(policy, policy.key(&req), Ask::default());
        let noop = &mut Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut fut).poll(noop).is_pending());
    }

    #[test]
    fn and_gives_the_first_grant_back_when_dropped_while_the_second_decides() {
        let clock = ManualClock::new(Nanos::new(1_000_000_000));
        // Burst 1, no refill on a clock that stands still: a permit is back only if refunded.
        let bucket = || TokenBucket::with_clock(Limit::per_second(1.0).unwrap(), 1, clock.clone());
        let tokens = |g: &Global<TokenBucket<ManualClock>>| g.limiter().tokens();

        let both = Arc::new(global("a", bucket()).and(Stalled));
        abandon(&both);
        assert_eq!(
            tokens(&both.first),
            1.0,
            "the first's grant was not given back"
        );

        // Nested, either way round: every grant taken before the stall comes back.
        let left = Arc::new(
            global("a", bucket())
                .and(global("b", bucket()))
                .and(Stalled),
        );
        abandon(&left);
        assert_eq!(
            (tokens(&left.first.first), tokens(&left.first.second)),
            (1.0, 1.0)
        );
        let right = Arc::new(global("a", bucket()).and(global("b", bucket()).and(Stalled)));
        abandon(&right);
        assert_eq!(
            (tokens(&right.first), tokens(&right.second.first)),
            (1.0, 1.0)
        );

        // Delay mode: the first reserved ahead (its burst spent, the next token 1 s away);
        // the reservation comes back too.
        let ahead = Arc::new(global("a", bucket()).and(Stalled));
        assert!(ahead.first.limiter().check_n_at(clock.now(), 1).is_ok());
        let mut fut = Policy::<()>::decide(
            &ahead,
            ((), ()),
            Ask {
                max_wait: Duration::from_secs(10),
                ..Ask::default()
            },
        );
        let noop = &mut Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut fut).poll(noop).is_pending());
        assert_eq!(tokens(&ahead.first), -1.0, "the first reserved ahead");
        drop(fut);
        assert_eq!(
            tokens(&ahead.first),
            0.0,
            "the reservation was not given back"
        );

        // A decision that completed is the caller's: dropping it after changes nothing.
        let done = Arc::new(global("a", bucket()).and(global("b", bucket())));
        let d = now_or_never(Policy::<()>::decide(&done, ((), ()), Ask::default()));
        assert!(d.result.is_ok());
        drop(d);
        assert_eq!((tokens(&done.first), tokens(&done.second)), (0.0, 0.0));
    }

    #[cfg(feature = "redis")]
    mod fleet {
        use super::*;
        use crate::redis::{RedisLimitError, RedisLimiter};
        use crate::FixedWindow;
        use std::sync::atomic::{AtomicU8, Ordering};

        const GRANT: u8 = 0;
        const FAIL: u8 = 1;
        const STALL: u8 = 2;

        /// A Redis limiter that grants, fails or stalls, as told; its local form is a window
        /// of 4 a minute, scaled by the share.
        #[derive(Default)]
        struct Fake(AtomicU8);

        impl RedisLimiter for Fake {
            type Local = FixedWindow;
            fn local(&self, share: f64) -> FixedWindow {
                FixedWindow::new((4.0 * share).ceil() as u32, Duration::from_secs(60)).unwrap()
            }
            async fn ping(&self) -> Result<(), RedisLimitError> {
                Ok(())
            }
            async fn try_check_n(
                &self,
                _: &str,
                _: u32,
            ) -> Result<Result<(), Denied>, RedisLimitError> {
                match self.0.load(Ordering::Relaxed) {
                    GRANT => Ok(Ok(())),
                    FAIL => Err(RedisLimitError::UnexpectedReply("OOM".into())),
                    _ => std::future::pending().await,
                }
            }
        }

        type Fleet = super::Fleet<key::Header, Fake>;

        fn policy(failure: FailurePolicy, mode: u8) -> Arc<Fleet> {
            let f = fleet(
                "f",
                key::Header("x-key".parse().unwrap()),
                Fake(AtomicU8::new(mode)),
            );
            Arc::new(f.on_failure(failure).unwrap())
        }

        async fn decide(p: &Arc<Fleet>, key: Option<&str>, ask: Ask) -> Decision<()> {
            let mut req = Request::new(());
            if let Some(k) = key {
                req.headers_mut().insert("x-key", k.parse().unwrap());
            }
            Policy::<()>::decide(p, p.key(&req), ask).await
        }

        /// The answers to `n` checks of one key: `Some(Retry-After in seconds)` for a refusal,
        /// `None` for a grant.
        async fn answers(p: &Arc<Fleet>, n: usize) -> Vec<Option<Option<u64>>> {
            let mut out = Vec::new();
            for _ in 0..n {
                let d = decide(p, Some("k"), Ask::default()).await;
                out.push(d.result.err().map(|e| e.retry_after_secs()));
            }
            out
        }

        #[tokio::test]
        async fn each_failure_policy_answers_a_failing_redis_as_it_says() {
            assert_eq!(
                answers(&policy(FailurePolicy::Open, FAIL), 6).await,
                [None; 6]
            );
            // Closed: refused, and told when to come back.
            assert_eq!(
                answers(&policy(FailurePolicy::Closed, FAIL), 2).await,
                [Some(Some(1)); 2]
            );
            // Local with half the limit: 2 of the window's 4, then refused until the window
            // ends (60 s away, rounded up).
            let local = policy(FailurePolicy::Local(0.5), FAIL);
            let got = answers(&local, 4).await;
            assert_eq!(got[..2], [None, None]);
            assert!(matches!(got[2], Some(Some(59..=60))), "{got:?}");
            assert_eq!(local.local().unwrap().len(), 1);
            // The local answer reports the local window, when asked for.
            let d = decide(
                &local,
                Some("k"),
                Ask {
                    report: true,
                    ..Ask::default()
                },
            )
            .await;
            assert_eq!(d.report.items[0].1.quota, 2);
            assert_eq!(local.failures(), 5);
            // The default is the local answer with the whole limit.
            let default = Arc::new(fleet(
                "f",
                key::Header("x-key".parse().unwrap()),
                Fake(AtomicU8::new(FAIL)),
            ));
            assert_eq!(default.failure_policy(), FailurePolicy::Local(1.0));
            assert_eq!(
                answers(&default, 5)
                    .await
                    .iter()
                    .filter(|a| a.is_none())
                    .count(),
                4
            );
            // A Redis that answers is what decides, whatever the failure policy.
            assert_eq!(
                answers(&policy(FailurePolicy::Closed, GRANT), 3).await,
                [None; 3]
            );
        }

        #[tokio::test(start_paused = true)]
        async fn a_stalled_redis_is_answered_at_the_deadline_by_the_failure_policy() {
            let deadline = Duration::from_millis(30);
            for (failure, granted) in [(FailurePolicy::Open, true), (FailurePolicy::Closed, false)]
            {
                let p = policy(failure, STALL);
                let p = Arc::new(Arc::into_inner(p).unwrap().deadline(deadline).unwrap());
                let start = tokio::time::Instant::now();
                // Far past the deadline, the test's own: without one, no answer ever comes.
                let d = tokio::time::timeout(deadline * 100, decide(&p, Some("k"), Ask::default()))
                    .await
                    .expect("no answer at the deadline");
                assert_eq!(start.elapsed(), deadline);
                assert_eq!(d.result.is_ok(), granted);
                assert_eq!(p.failures(), 1);
            }
        }

        #[tokio::test]
        async fn a_request_without_a_key_gets_the_missing_key_choice() {
            let with = |m: MissingKey<String>| {
                let f = fleet(
                    "f",
                    key::Header("x-key".parse().unwrap()),
                    Fake(AtomicU8::new(FAIL)),
                );
                Arc::new(
                    f.on_failure(FailurePolicy::Local(0.5))
                        .unwrap()
                        .on_missing_key(m),
                )
            };
            // Allow: through, untouched (no failure: Redis is not asked).
            let p = with(MissingKey::Allow);
            for key in [None, Some("")] {
                assert!(decide(&p, key, Ask::default()).await.result.is_ok());
            }
            assert_eq!(p.failures(), 0);
            // Deny: refused, with no Retry-After (no wait makes it acceptable).
            let p = with(MissingKey::Deny);
            for key in [None, Some("")] {
                let d = decide(&p, key, Ask::default()).await;
                assert_eq!(d.result.unwrap_err().retry_after(), None);
            }
            // As: every keyless request shares one key's limit (2 here, locally).
            let p = with(MissingKey::As("anonymous".into()));
            let mut granted = 0;
            for key in [None, Some(""), None, None] {
                granted += decide(&p, key, Ask::default()).await.result.is_ok() as u32;
            }
            assert_eq!(granted, 2);
            assert!(p.local().unwrap().contains("anonymous"));
            assert!(decide(&p, Some("other"), Ask::default())
                .await
                .result
                .is_ok());
        }

        #[test]
        fn bad_settings_are_typed_errors() {
            let f = || fleet("f", key::PeerIp, Fake::default());
            assert!(matches!(
                f().deadline(Duration::ZERO),
                Err(crate::ConfigError::ZeroTimeout)
            ));
            for share in [0.0, 1.5, f64::NAN] {
                assert!(matches!(
                    f().on_failure(FailurePolicy::Local(share)),
                    Err(crate::ConfigError::InvalidShare(_))
                ));
            }
            assert!(matches!(
                f().local_max_keys(0),
                Err(crate::ConfigError::ZeroMaxKeys)
            ));
            let f = f().local_max_keys(3).unwrap();
            assert_eq!(f.local().unwrap().max_keys(), 3);
            assert!(f
                .on_failure(FailurePolicy::Closed)
                .unwrap()
                .local()
                .is_none());
        }
    }
}
