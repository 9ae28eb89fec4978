//! Policies over limiters of several limits ([`MultiTokenBucket`]: "20 a second and 10 000 a
//! day"), which report each limit as an item of its own: [`global_multi`] and
//! [`per_key_multi`].
//!
//! Every limit goes in `RateLimit-Policy`, so a client learns the whole policy; `RateLimit`
//! carries one item per policy, its binding limit's (the fewest permits left, the longest
//! reset among equals: [`Statuses::binding`](crate::multi_token_bucket::Statuses::binding)).
//! The draft lets a server send one item per policy there; the binding one is the item whose
//! `r` is what the client may send now (no other limit admits less) and whose `t` is when
//! that changes, so a client that reads only `RateLimit` paces itself right, and the field
//! stays as short as a single limit's on every response.

use std::future::{ready, Ready};
use std::hash::{BuildHasher, Hash};
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use http::Request;

use super::*;
use crate::multi_token_bucket::{Statuses, MAX_LIMITS};
use crate::tower::key::{KeyExtractor, KeyType};
use crate::QuotaStatus;
use crate::{Clock, Idle, Keyed, KeyedMultiTokenBucket, Limiter, MultiTokenBucket, Nanos};

/// A limiter of several limits that can tell a client of each: what [`global_multi`] reports,
/// one item per limit. Implemented by [`MultiTokenBucket`] (and through `Arc` and `Box`).
///
/// ```
/// use std::time::Duration;
/// use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
/// use turnstile::tower::MultiQuota;
/// use turnstile::{ManualClock, Nanos};
///
/// let limits = [Bandwidth::per(20, Duration::from_secs(1)), Bandwidth::per(10_000, Duration::from_secs(86_400))];
/// let mtb = MultiTokenBucket::builder(&limits).clock(ManualClock::default()).build().unwrap();
/// let q = mtb.quotas_at(Nanos::ZERO);
/// assert_eq!((q.len(), q[1].quota), (2, 10_000));
/// ```
pub trait MultiQuota: Limiter {
    /// Every limit's status, in order: a slice (no allocation for the crate's limiters).
    type Quotas: Deref<Target = [QuotaStatus]>;

    /// Every limit's status at `now`, in the limiter's order.
    fn quotas_at(&self, now: Nanos) -> Self::Quotas;
}

impl<C: Clock> MultiQuota for MultiTokenBucket<C> {
    type Quotas = Statuses;

    #[inline]
    fn quotas_at(&self, now: Nanos) -> Statuses {
        self.status_at(now)
    }
}

impl<L: MultiQuota + ?Sized> MultiQuota for Arc<L> {
    type Quotas = L::Quotas;

    #[inline]
    fn quotas_at(&self, now: Nanos) -> L::Quotas {
        (**self).quotas_at(now)
    }
}

impl<L: MultiQuota + ?Sized> MultiQuota for Box<L> {
    type Quotas = L::Quotas;

    #[inline]
    fn quotas_at(&self, now: Nanos) -> L::Quotas {
        (**self).quotas_at(now)
    }
}

/// The items' names: `names` in order, then `"{policy}-{i}"` for each index up to `count`
/// (at least [`MAX_LIMITS`], the most a [`MultiTokenBucket`] holds, so that limits added
/// later by `set_limits` are named too). Built once: a report clones them (a reference
/// count each), never formats one.
fn default_names(policy: &str, count: usize) -> Vec<Arc<str>> {
    (0..count.max(MAX_LIMITS))
        .map(|i| Arc::from(format!("{policy}-{i}")))
        .collect()
}

/// `names` over the first of `all`.
fn set_names<N: Into<Arc<str>>>(all: &mut Vec<Arc<str>>, names: impl IntoIterator<Item = N>) {
    for (i, n) in names.into_iter().enumerate() {
        match all.get_mut(i) {
            Some(slot) => *slot = n.into(),
            None => all.push(n.into()),
        }
    }
}

/// One limiter of several limits for every request, each limit an item of the `RateLimit`
/// headers: [`global_multi`].
pub struct GlobalMulti<L> {
    pub(super) names: Vec<Arc<str>>,
    pub(super) limiter: L,
    pub(super) observer: Observer,
}

/// A policy that takes one permit (or the request's cost: [`PolicyExt::cost`]) from every
/// limit of `limiter` per request, all or none, and reports each limit as an item of its own:
/// all of them in `RateLimit-Policy`, the binding one in `RateLimit` (the
/// [module docs](crate::tower) say why). The items are named `"{name}-0"`, `"{name}-1"`, …
/// unless [`GlobalMulti::names`] names them; a limit past the names (one added by
/// `set_limits` past the fourth) is left out of the headers.
///
/// A [`MultiTokenBucket`] cannot give a grant back, so in [`PolicyExt::and`] this policy goes
/// last; nor does it reserve ahead: under [`RateLimitLayer::delay`](crate::tower::RateLimitLayer::delay)
/// a request it cannot grant now is refused at once.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
/// use turnstile::tower::{global_multi, Ask, Policy};
/// use turnstile::{ManualClock, Nanos};
///
/// const SECOND: Duration = Duration::from_secs(1);
/// let limits = [Bandwidth::per(20, SECOND).burst_of(40), Bandwidth::per(10_000, 86_400 * SECOND)];
/// let mtb = MultiTokenBucket::builder(&limits).clock(ManualClock::default()).build().unwrap();
/// let api = Arc::new(global_multi("api", mtb).names(["burst", "daily"]));
/// let ask = Ask { report_grants: true, ..Ask::default() };
/// let d = Policy::<()>::decide(&api, (), ask).into_inner();
/// let items: Vec<_> = d.report.items.iter().map(|i| (&*i.name, i.status.remaining, i.binding)).collect();
/// assert_eq!(items, [("burst", 39, true), ("daily", 9_999, false)]);
/// ```
pub fn global_multi<L: MultiQuota + 'static>(name: impl AsRef<str>, limiter: L) -> GlobalMulti<L> {
    let count = limiter.quotas_at(limiter.now()).len();
    GlobalMulti {
        names: default_names(name.as_ref(), count),
        limiter,
        observer: Observer::new(name.as_ref()),
    }
}

impl<L> GlobalMulti<L> {
    /// Names the limits, in order, in the headers (written as structured-field strings:
    /// quoted and escaped, bytes outside visible ASCII dropped). Limits past the names
    /// given keep their default names.
    pub fn names<N: Into<Arc<str>>>(mut self, names: impl IntoIterator<Item = N>) -> Self {
        set_names(&mut self.names, names);
        self
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<B, L: MultiQuota + 'static> Policy<B> for GlobalMulti<L> {
    type Key = ();
    /// The clock reading the permits were taken at and how many.
    type Grant = (Nanos, u32);
    type Future = Ready<Decision<(Nanos, u32)>>;

    #[inline]
    fn key(&self, _: &Request<B>) -> Self::Key {}

    #[inline]
    fn decide(self: &Arc<Self>, _: (), ask: Ask) -> Self::Future {
        let now = self.limiter.now();
        let (result, wait) = take(&self.limiter, now, ask.cost, ask.max_wait);
        self.observer.record(result.is_ok(), &ask);
        let report = if ask.reports(result.is_ok()) {
            multi_report(&self.names, &self.limiter.quotas_at(now))
        } else {
            Report::default()
        };
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

impl<L: MultiQuota + Refund> Refunds for GlobalMulti<L> {}

/// A per-key map of limiters of several limits, which can tell a client of each of a key's
/// limits: what [`per_key_multi`] takes. Implemented by [`KeyedMultiTokenBucket`] (the
/// limits' word inline per key: one lookup and one CAS) and by a [`Keyed`] of
/// [`MultiQuota`] limiters (a [`MultiTokenBucket`] per key).
pub trait PerKeyMultiMap<K>: PerKeyMap<K> {
    /// Every limit's status, in order.
    type Quotas: Deref<Target = [QuotaStatus]>;

    /// [`PerKeyMap::take`], with every limit's status of `key` after it when
    /// [`Ask::reports`] wants them for that answer (`None` otherwise, or when the map cannot
    /// say), in place of [`Taken::status`].
    fn take_all(&self, key: &K, now: Nanos, ask: Ask) -> (Taken, Option<Self::Quotas>);
}

impl<K, L, C> PerKeyMultiMap<K> for Keyed<K, L, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    L: MultiQuota + Idle + 'static,
    C: Clock + 'static,
{
    type Quotas = L::Quotas;

    #[inline]
    fn take_all(&self, key: &K, now: Nanos, ask: Ask) -> (Taken, Option<L::Quotas>) {
        // One visit for the permits and the statuses, as `PerKeyMap::take`'s.
        self.visit_at(
            key,
            now,
            |l| {
                let (result, wait) = take(l, now, ask.cost, ask.max_wait);
                let quotas = ask.reports(result.is_ok()).then(|| l.quotas_at(now));
                let taken = Taken {
                    result,
                    wait,
                    status: None,
                };
                (taken, quotas)
            },
            |(t, _)| t.result.is_ok(),
        )
        .unwrap_or_else(|full| {
            let taken = Taken {
                result: full,
                wait: Duration::ZERO,
                status: None,
            };
            (taken, None)
        })
    }
}

/// The inline multi-limit map: one lookup and one CAS per allowed request. Under [`per_key`]
/// its status is the key's binding limit's ([`KeyedMultiTokenBucket::quota_at`]); under
/// [`per_key_multi`], every limit's.
///
/// **No reserve-ahead and no refund**, as the map has neither: under
/// [`RateLimitLayer::delay`](crate::tower::RateLimitLayer::delay) a request it cannot grant
/// now is refused at once, and in [`PolicyExt::and`] it goes last.
impl<K, S, C> PerKeyMap<K> for KeyedMultiTokenBucket<K, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Clock + 'static,
{
    #[inline]
    fn now(&self) -> Nanos {
        self.clock().now()
    }

    // Always: `PerKey::take_near` is a second caller, which must not outline it.
    #[inline(always)]
    fn take(&self, key: &K, now: Nanos, ask: Ask) -> Taken {
        let result = self.check_n_at(key, now, ask.cost);
        // As `KeyedTokenBucket`'s: the status, when this answer shows it, is a second
        // lookup (a load) after the check's CAS.
        let status = if ask.reports(result.is_ok()) {
            self.quota_at(key, now)
        } else {
            None
        };
        Taken {
            result,
            wait: Duration::ZERO,
            status,
        }
    }

    /// Nothing: the map cannot give permits back.
    #[inline]
    fn refund(&self, _: &K, _: Nanos, _: u32) {}

    fn spawn_sweeper(self: &Arc<Self>) {
        // Detached: it ends by itself when the map drops.
        drop(KeyedMultiTokenBucket::spawn_sweeper(self));
    }

    fn stats(&self) -> Option<crate::keyed::MapStats> {
        Some(KeyedMultiTokenBucket::stats(self))
    }
}

impl<K, S, C> PerKeyMultiMap<K> for KeyedMultiTokenBucket<K, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Clock + 'static,
{
    type Quotas = Statuses;

    #[inline]
    fn take_all(&self, key: &K, now: Nanos, ask: Ask) -> (Taken, Option<Statuses>) {
        let result = self.check_n_at(key, now, ask.cost);
        let quotas = ask
            .reports(result.is_ok())
            .then(|| self.status_at(key, now));
        let taken = Taken {
            result,
            wait: Duration::ZERO,
            status: None,
        };
        (taken, quotas)
    }
}

/// A limiter of several limits per key, each limit an item of the `RateLimit` headers:
/// [`per_key_multi`].
pub struct PerKeyMulti<K, X, M> {
    pub(super) inner: PerKey<K, X, M>,
    pub(super) names: Vec<Arc<str>>,
}

/// [`per_key`] over a map of limiters of several limits per key ([`PerKeyMultiMap`]: a
/// [`KeyedMultiTokenBucket`], or a [`Keyed`] of [`MultiTokenBucket`]s), reporting each of the key's limits as an item of its
/// own, as [`global_multi`] does: named `"{name}-0"`, `"{name}-1"`, … unless
/// [`PerKeyMulti::names`] names them. Everything else is [`per_key`]'s: the map's bound and
/// sweeper, [`PerKeyMulti::on_missing_key`].
///
/// ```
/// use std::time::Duration;
/// use turnstile::multi_token_bucket::Bandwidth;
/// use turnstile::tower::{key, per_key_multi, RateLimitLayer};
/// use turnstile::KeyedMultiTokenBucket;
///
/// const SECOND: Duration = Duration::from_secs(1);
/// let per_ip = per_key_multi(
///     "per-ip",
///     key::PeerIp,
///     KeyedMultiTokenBucket::new(&[
///         Bandwidth::per(10, SECOND).burst_of(20),
///         Bandwidth::per(1_000, 86_400 * SECOND),
///     ])
///     .unwrap(),
/// )
/// .names(["per-ip-burst", "per-ip-daily"]);
/// let layer = RateLimitLayer::new(per_ip);
/// # let _ = layer;
/// ```
pub fn per_key_multi<K, X, M>(name: impl AsRef<str>, extractor: X, map: M) -> PerKeyMulti<K, X, M>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: KeyType<Key = K> + Send + Sync + 'static,
    M: PerKeyMultiMap<K>,
{
    let name = name.as_ref();
    PerKeyMulti {
        inner: per_key(name, extractor, map),
        // A key's count is not known before its first request: the defaults cover the most
        // a `MultiTokenBucket` holds.
        names: default_names(name, 0),
    }
}

impl<K, X, M> PerKeyMulti<K, X, M> {
    /// Names the limits, in order, in the headers (as [`GlobalMulti::names`]).
    pub fn names<N: Into<Arc<str>>>(mut self, names: impl IntoIterator<Item = N>) -> Self {
        set_names(&mut self.names, names);
        self
    }

    /// What to do with requests the extractor finds no key in (default
    /// [`MissingKey::Allow`]).
    pub fn on_missing_key(mut self, missing: MissingKey<K>) -> Self {
        self.inner.missing = missing;
        self
    }

    /// The per-key map.
    pub fn map(&self) -> &M {
        &self.inner.map
    }
}

impl<B, K, X, M> Policy<B> for PerKeyMulti<K, X, M>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    X: KeyExtractor<B, Key = K>,
    M: PerKeyMultiMap<K>,
{
    type Key = Option<K>;
    type Grant = KeyGrant<K>;
    type Future = Ready<Decision<KeyGrant<K>>>;

    #[inline]
    fn key(&self, req: &Request<B>) -> Self::Key {
        self.inner.extractor.extract(req)
    }

    #[inline]
    fn decide(self: &Arc<Self>, key: Self::Key, ask: Ask) -> Self::Future {
        let d = self.inner.decide_with(key, ask, |map, key, now| {
            let (Taken { result, wait, .. }, quotas) = map.take_all(key, now, ask);
            let report = match quotas {
                Some(q) => multi_report(&self.names, &q),
                None => Report::default(),
            };
            (result, wait, report)
        });
        ready(d)
    }

    fn refund(&self, grant: KeyGrant<K>) {
        if let KeyGrant(Some((key, at, n))) = grant {
            self.inner.map.refund(&key, at, n);
        }
    }

    fn hash_client<H: std::hash::Hasher>(&self, key: &Self::Key, state: &mut H) {
        key.hash(state);
    }
}

impl<K, X, M> Refunds for PerKeyMulti<K, X, M> where PerKey<K, X, M>: Refunds {}
