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
    pub struct AndFuture<Body, A: Policy<Body>, B: Policy<Body>> {
        #[pin]
        state: AndState<Body, A, B>,
        policy: Arc<And<A, B>>,
        ask: Ask,
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

/// A fleet-wide limit on Redis, per key: [`fleet`] (features `tower` and `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct Fleet<X, R> {
    name: Arc<str>,
    extractor: X,
    limiter: R,
}

/// A policy that takes one permit per request from a Redis limiter
/// ([`Gcra`](crate::redis::Gcra), [`Fallback`](crate::redis::Fallback), [`Coalesce`](crate::redis::Coalesce), …)
/// under the request's key (its `Display` form): one limit shared by every server of a
/// fleet. Requests with no key pass. A Redis error that reaches the policy (a limiter not
/// wrapped in a `Fallback`) refuses the request with no `Retry-After`: failing closed is the
/// safe side of a limit, and a [`Fallback`](crate::redis::Fallback) is how to fail open.
///
/// A Redis grant cannot be given back, so in [`PolicyExt::and`] put this policy last. The
/// decision is a boxed future (one allocation per request, next to a network round trip);
/// `Retry-After` is the server's figure. The `RateLimit` headers carry the key's status
/// after the check, from the limiter's own answer to it
/// ([`RedisLimiter::try_check_n_status`](crate::redis::RedisLimiter::try_check_n_status),
/// no extra round trip): exact for [`Gcra`](crate::redis::Gcra) (`q` = burst, `w` = burst /
/// limit, `r` and `t` from its [`Throttle`](crate::redis::Throttle)), for the go-zero
/// [`TokenBucket`](crate::redis::TokenBucket) and
/// [`FixedWindow`](crate::redis::FixedWindow), and for a
/// [`Fallback`](crate::redis::Fallback) over them (its local limiter's while Redis is
/// down). A limiter that cannot say exactly (a [`Coalesce`](crate::redis::Coalesce), whose
/// batches answer verdicts only) leaves the policy out of the headers; so does a Redis error.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub fn fleet<X, R>(name: impl Into<Arc<str>>, extractor: X, limiter: R) -> Fleet<X, R>
where
    R: crate::redis::RedisLimiter + 'static,
{
    Fleet {
        name: name.into(),
        extractor,
        limiter,
    }
}

#[cfg(feature = "redis")]
impl<X, R> Fleet<X, R> {
    /// The Redis limiter.
    pub fn limiter(&self) -> &R {
        &self.limiter
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
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
        let this = self.clone();
        Box::pin(async move {
            let Some(key) = key else {
                return Decision {
                    result: Ok(()),
                    wait: Duration::ZERO,
                    report: Report::default(),
                };
            };
            // With headers, the check that also answers the key's status (the same round
            // trip: the status comes from the check's own reply). Without, the plain check:
            // for the limiters that can say, the status costs nothing in Redis but is still
            // work here (a `Fallback` in fallback mode reads its local limiter's), and a
            // hand-written limiter's `try_check_n` may be cheaper than its status.
            let (result, status) = if ask.report || ask.report_grants {
                match this.limiter.try_check_n_status(&key, 1).await {
                    Ok((verdict, status)) => (verdict, status),
                    Err(_) => (Err(crate::redis::denied_after(None)), None),
                }
            } else {
                match this.limiter.try_check_n(&key, 1).await {
                    Ok(verdict) => (verdict, None),
                    Err(_) => (Err(crate::redis::denied_after(None)), None),
                }
            };
            let report = one_report(ask.reports(result.is_ok()), &this.name, || status);
            Decision {
                result,
                wait: Duration::ZERO,
                report,
            }
        })
    }

    fn refund(&self, _: ()) {}
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
}
