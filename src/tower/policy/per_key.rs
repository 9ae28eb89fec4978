//! [`PerKey`]: a limiter per key, from a per-key map ([`PerKeyMap`]) and a key extractor.

use std::future::{ready, Ready};
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use http::Request;

use super::*;
use crate::keyed::MapStats;
use crate::tower::key::{KeyExtractor, KeyType};
use crate::{
    Clock, Denied, Idle, Keyed, KeyedTokenBucket, Limiter, Nanos, QuotaStatus, SketchTokenBucket,
};

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

/// What [`PerKeyMap::take`] answers for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    /// The permit, or the refusal with its retry time.
    pub result: Result<(), Denied>,
    /// How long to wait before acting on a granted permit: zero unless it was reserved
    /// ahead ([`Ask::max_wait`]).
    pub wait: Duration,
    /// The key's status after the take, when [`Ask::reports`] wants it for this answer and
    /// the map can say.
    pub status: Option<QuotaStatus>,
}

/// A per-key limiter map a [`PerKey`] policy takes permits from: implemented by
/// [`Keyed`] (any limiter per key, built by a factory), by [`KeyedTokenBucket`] (a token
/// bucket per key, its state inline: one word per key, the cheaper check), by
/// [`KeyedMultiTokenBucket`](crate::KeyedMultiTokenBucket) (several limits per key, inline;
/// [`per_key_multi`](super::per_key_multi) reports each of them) and by
/// [`SketchTokenBucket`] (a token bucket per key in fixed memory, no key held).
pub trait PerKeyMap<K>: Send + Sync + 'static {
    /// The map's clock reading now: the time a request is decided at.
    fn now(&self) -> Nanos;

    /// [`Ask::cost`] permits (never 0: the policy lets a free request through without
    /// asking the map) for `key` at `now`: checked, or reserved up to `ask.max_wait` ahead
    /// where the map can reserve; with the wait, and `key`'s status after it when
    /// [`Ask::reports`] wants one for that answer (`None` otherwise, or when the map cannot
    /// say).
    fn take(&self, key: &K, now: Nanos, ask: Ask) -> Taken;

    /// Gives back `n` permits `take` granted `key` at `at` (a later policy refused the
    /// request). Exact where the key's limiter refunds exactly; a no-op where it cannot.
    fn refund(&self, key: &K, at: Nanos, n: u32);

    /// Moves the map's sweeps off the request path: [`per_key`] calls it once, on the map it
    /// now owns. The crate's maps start their sweeper thread ([`Keyed::spawn_sweeper`],
    /// [`KeyedTokenBucket::spawn_sweeper`]), which ends when the policy (and so the map) is
    /// dropped. The default does nothing: the map sweeps as it likes.
    fn spawn_sweeper(self: &Arc<Self>)
    where
        Self: Sized,
    {
    }

    /// The keys it holds, has evicted and had no room for, where it holds keys (`None`, the
    /// default, for a map that holds none, as the sketch). With the feature `metrics`, a
    /// [`per_key`] policy publishes them.
    fn stats(&self) -> Option<MapStats> {
        None
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
        self.clock().now()
    }

    // Always: `PerKey::take_near` is a second caller, which must not outline it.
    #[inline(always)]
    fn take(&self, key: &K, now: Nanos, ask: Ask) -> Taken {
        // One visit to the key's limiter for the permit and, when asked for, the status (each
        // visit of a contended key's slot is a shared write), at `now`, which also dates a new
        // key's limiter (one dated at a later reading reads as not full at `now`): the status
        // only for the kind of answer the layer shows it on, so an allowed request under the
        // default headers (refusals only) pays for the check alone.
        self.visit_at(
            key,
            now,
            |l| {
                let (result, wait) = take(l, now, ask.cost, ask.max_wait);
                let status = if ask.reports(result.is_ok()) {
                    l.quota_at(now)
                } else {
                    None
                };
                Taken {
                    result,
                    wait,
                    status,
                }
            },
            // A grant wrote the limiter's state; a refusal did not.
            |t| t.result.is_ok(),
        )
        // The key is new and the map full: the map's answer (its WhenFull), no status.
        .unwrap_or_else(|full| Taken {
            result: full,
            wait: Duration::ZERO,
            status: None,
        })
    }

    #[inline]
    fn refund(&self, key: &K, at: Nanos, n: u32) {
        let _ = self.refund_n_at(key, at, n);
    }

    fn spawn_sweeper(self: &Arc<Self>) {
        // Detached: it ends by itself when the map drops.
        drop(Keyed::spawn_sweeper(self));
    }

    fn stats(&self) -> Option<MapStats> {
        Some(Keyed::stats(self))
    }
}

/// The inline map: one lookup and one CAS per allowed request, the cheapest per-key check
/// turnstile has.
///
/// **No reserve-ahead.** [`KeyedTokenBucket`] has no schedule: under
/// [`RateLimitLayer::delay`](crate::tower::RateLimitLayer::delay) a request it cannot grant now is
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
        self.clock().now()
    }

    // Always: `PerKey::take_near` is a second caller, which must not outline it.
    #[inline(always)]
    fn take(&self, key: &K, now: Nanos, ask: Ask) -> Taken {
        // Never a wait: `max_wait` is ignored (no schedule here; see the impl's docs).
        let result = self.check_n_at(key, now, ask.cost);
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
        Taken {
            result,
            wait: Duration::ZERO,
            status,
        }
    }

    #[inline]
    fn refund(&self, key: &K, at: Nanos, n: u32) {
        let _ = self.refund_n_at(key, at, n);
    }

    fn spawn_sweeper(self: &Arc<Self>) {
        // Detached: it ends by itself when the map drops.
        drop(KeyedTokenBucket::spawn_sweeper(self));
    }

    fn stats(&self) -> Option<MapStats> {
        Some(KeyedTokenBucket::stats(self))
    }
}

/// The fixed-memory map: one hash and one cache line per request, whatever the number of
/// clients, and nothing to sweep (its module docs: when to choose it over
/// [`KeyedTokenBucket`]).
///
/// **No reserve-ahead and no refund.** As [`KeyedTokenBucket`], a request it cannot grant now
/// is refused at once under [`RateLimitLayer::delay`](crate::tower::RateLimitLayer::delay).
/// A grant raised cells other clients may share, so it cannot be taken back without lowering
/// theirs: the policy is not [`Refunds`], and goes last in an [`and`](super::PolicyExt::and).
impl<K, S, C> PerKeyMap<K> for SketchTokenBucket<K, S, C>
where
    K: Hash + Send + Sync + 'static,
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
        // As the inline map's: a second load of the key's word, only when the answer shows it.
        let status = ask.reports(result.is_ok()).then(|| self.quota_at(key, now));
        Taken {
            result,
            wait: Duration::ZERO,
            status,
        }
    }

    #[inline]
    fn refund(&self, _: &K, _: Nanos, _: u32) {}
}

/// A limiter per key, picked by a [`KeyExtractor`]: [`per_key`].
pub struct PerKey<K, X, M> {
    pub(super) name: Arc<str>,
    pub(super) extractor: X,
    /// Shared with the map's sweeper thread, which holds a `Weak` and ends when this drops.
    pub(super) map: Arc<M>,
    pub(super) missing: MissingKey<K>,
    pub(super) observer: Observer,
    pub(super) alarm: RefusalAlarm,
    /// How the alarm names a key, if the operator lets it.
    #[cfg(feature = "tracing")]
    pub(super) key_label: Option<fn(&K) -> String>,
}

/// A policy that takes one permit per request from the limiter of the request's key, in
/// `map`; `extractor` reads the key. The map is a [`PerKeyMap`]: a [`Keyed`] (one limiter per
/// key, built by its factory on first sight and evicted when idle; any limiter, with
/// [`RateLimitLayer::delay`](crate::tower::RateLimitLayer::delay) where it can reserve) or a
/// [`KeyedTokenBucket`] (a token bucket per key, its state one word in the map: the cheaper
/// check, without delay mode). Requests with no key are allowed through; see
/// [`PerKey::on_missing_key`].
///
/// **Memory and sweeps.** Keys come from clients, so the map's bound is what a flood of
/// distinct keys can cost: both maps hold at most their `max_keys` keys, 2^20 (1 048 576)
/// unless built with another, and refuse new keys beyond it
/// ([`WhenFull::Deny`](crate::keyed::WhenFull)) until a sweep evicts idle ones; held keys are
/// never evicted to make room, so the flood resets nobody's limit. For a [`KeyedTokenBucket`]
/// of `IpAddr` that is a 64 MiB table at the default bound (32 bytes a slot; its module docs,
/// "Memory and the key bound"); for a [`Keyed`], the entry and limiter per key. `per_key`
/// takes the map over and starts its sweeper thread ([`PerKeyMap::spawn_sweeper`]), which ends
/// when the policy is dropped: sweeps, periodic or asked for by a full map, never run on a
/// request's worker. A held key's check waits for no other key's insert, for no resize of the
/// table, and for no sweep.
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
    let name = name.into();
    PerKey {
        observer: Observer::with_map(&name, &map),
        alarm: RefusalAlarm::default(),
        #[cfg(feature = "tracing")]
        key_label: None,
        name,
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

    /// A `tracing` warning (feature `tracing`) when the policy refuses more than
    /// `per_second` requests a second (all keys together), measured over a second or more,
    /// at most one a second: the policy's name, the refusals and the span they fell in, and
    /// whether they were enforced or shadow refusals ([`PolicyExt::enforcement`]). No key:
    /// [`PerKey::alert_refusals_with_keys`] adds the last one refused.
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn alert_refusals(mut self, per_second: u64) -> Self {
        self.alarm = RefusalAlarm::new(&self.name, per_second);
        self
    }

    /// [`PerKey::alert_refusals`], the warning naming the key refused last (under a flood
    /// from one client, that client), as its `Debug` form. A key may be personal data (an
    /// address, an API key): log it where the operator may.
    #[cfg(feature = "tracing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
    pub fn alert_refusals_with_keys(mut self, per_second: u64) -> Self
    where
        K: std::fmt::Debug,
    {
        self.alarm = RefusalAlarm::new(&self.name, per_second);
        self.key_label = Some(|k| format!("{k:?}"));
        self
    }

    /// As [`Global::near_limit`](super::Global::near_limit), from the key's status: a
    /// second lookup of the key on each grant, hence off unless set.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn near_limit(mut self, fraction: f64) -> Result<Self, crate::ConfigError> {
        self.observer.near_limit(fraction)?;
        Ok(self)
    }
}

/// A [`PerKey`] grant: the key charged, the clock reading it was charged at and the permits
/// it took (none when a keyless or free request was let through).
pub struct KeyGrant<K>(pub(super) Option<(K, Nanos, u32)>);

impl<K, X, M> PerKey<K, X, M>
where
    K: Clone,
    M: PerKeyMap<K>,
{
    /// The decision for `key` (`None`: the request had none): the missing-key rule, a free
    /// request passed untouched, else `take`'s answer from the map for the key at the map's
    /// clock: the result, the wait and the report.
    #[inline]
    pub(super) fn decide_with(
        &self,
        key: Option<K>,
        ask: Ask,
        take: impl FnOnce(&M, &K, Nanos) -> (Result<(), Denied>, Duration, Report),
    ) -> Decision<KeyGrant<K>> {
        let pass = || Decision {
            result: Ok(KeyGrant(None)),
            wait: Duration::ZERO,
            report: Report::default(),
        };
        let key = match key {
            Some(k) => k,
            None => match &self.missing {
                MissingKey::Allow => {
                    self.observer.record(true, &ask);
                    return pass();
                }
                MissingKey::Deny => {
                    let now = self.map.now();
                    self.observer.record(false, &ask);
                    self.alarm.refused(now, &ask, || None);
                    return Decision {
                        result: Err(Denied::new(now, None)),
                        wait: Duration::ZERO,
                        report: Report::default(),
                    };
                }
                MissingKey::As(k) => k.clone(),
            },
        };
        // Free: nothing to take, and no key inserted for it.
        if ask.cost == 0 {
            self.observer.record(true, &ask);
            return pass();
        }
        let now = self.map.now();
        let (result, wait, report) = take(&self.map, &key, now);
        // Counted here, while the answer is in registers, before the decision is built.
        self.observer.record(result.is_ok(), &ask);
        self.observer.waited(wait, &ask);
        if result.is_err() {
            #[cfg(feature = "tracing")]
            let label = || self.key_label.map(|f| f(&key));
            #[cfg(not(feature = "tracing"))]
            let label = || None;
            self.alarm.refused(now, &ask, label);
        }
        Decision {
            result: result.map(|()| KeyGrant(Some((key, now, ask.cost)))),
            wait,
            report,
        }
    }
}

impl<K, X, M: PerKeyMap<K>> PerKey<K, X, M> {
    /// [`PerKeyMap::take`] with the grant's status too, counted if near the limit. Inlined in
    /// its branch, so that `ask` stays in registers: a call out of line would need it in
    /// memory, written on every check whether or not the branch is taken.
    #[inline(always)]
    fn take_near(&self, key: &K, now: Nanos, ask: Ask) -> Taken {
        let taken = self.map.take(
            key,
            now,
            Ask {
                report_grants: true,
                ..ask
            },
        );
        if taken.result.is_ok() {
            self.observer.granted(taken.status);
        }
        taken
    }
}

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
        let d = self.decide_with(key, ask, |map, key, now| {
            let Taken {
                result,
                wait,
                status,
            } = if self.observer.wants_status() {
                self.take_near(key, now, ask)
            } else {
                map.take(key, now, ask)
            };
            let report = one_report(ask.reports(result.is_ok()), &self.name, || status);
            (result, wait, report)
        });
        ready(d)
    }

    fn refund(&self, grant: KeyGrant<K>) {
        if let KeyGrant(Some((key, at, n))) = grant {
            self.map.refund(&key, at, n);
        }
    }

    fn hash_client<H: std::hash::Hasher>(&self, key: &Self::Key, state: &mut H) {
        key.hash(state);
    }
}

impl<K, X, L, C> Refunds for PerKey<K, X, Keyed<K, L, C>>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    L: Refund + Idle + 'static,
    C: Clock,
{
}

impl<K, X, S, C> Refunds for PerKey<K, X, KeyedTokenBucket<K, S, C>>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
}
