//! [`Fleet`]: one limit for the whole fleet on Redis, answered within a deadline, with a
//! [`FailurePolicy`] for when Redis does not answer.

use std::future::{ready, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::Request;

#[cfg(feature = "redis")]
use super::fleet_observer::FleetObserver;
use super::*;
use crate::redis::StatusVerdict;
use crate::tower::key::{KeyExtractor, KeyType};
use crate::{Clock, Denied, Keyed};

/// The default [`FleetBuilder::deadline`] (its docs say why 100 ms).
#[cfg(feature = "redis")]
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_millis(100);

/// The retry time of a refusal the Redis limiter did not decide ([`FailurePolicy::Closed`],
/// whose docs say why one second).
#[cfg(feature = "redis")]
pub(crate) const FAILURE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The default [`FleetBuilder::local_max_keys`] (its docs say why 65 536).
#[cfg(feature = "redis")]
pub(crate) const DEFAULT_LOCAL_MAX_KEYS: u64 = 65_536;

/// What a [`Fleet`] policy answers when its Redis limiter does not: an error (the connection
/// down or refused, an answer such as `OOM`, `READONLY`, `BUSY`, `NOPERM`, a script error,
/// bad input), or no answer within the [deadline](FleetBuilder::deadline).
///
/// The default is [`FailurePolicy::Local`] with a share of 1: each process answers from its
/// own limiter per key, with the fleet's whole limit. Like failing open (Envoy's global rate
/// limit default), an outage of the limiter is not an outage of the service: a client within
/// the fleet's limit is within it at every process (what one process sees of its requests is a
/// part of them), so no request the fleet's limit admits is refused. Unlike failing open, a
/// client over the limit is still held to it at each process, instead of being let through
/// unlimited for as long as Redis is down (an attacker who can make Redis fail, by filling its
/// memory say, would otherwise switch the limit off). The price is a bounded in-process map
/// (at most 65 536 keys by default: [`FleetBuilder::local_max_keys`]) and, across a fleet of `n`, up
/// to `n` times the limit for a client spread over all of them; a share of `1 / n` keeps the
/// fleet near the one limit, at the cost of refusing a client whose requests reach one process
/// more than its share.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailurePolicy {
    /// Let the request through (fail open).
    Open,
    /// Refuse it (fail closed), with a `Retry-After` of one second: the least `Retry-After`
    /// says above zero. How long an outage lasts is not known; one second sends a client
    /// back soon without inviting it to retry at once.
    Closed,
    /// Answer in process: a limiter per key with the Redis limiter's configuration, its
    /// limit scaled by this share, in `(0, 1]` ([`RedisLimiter::local`](crate::redis::RedisLimiter::local)),
    /// in a map of at most [`FleetBuilder::local_max_keys`] keys. Its refusals carry the local
    /// limiter's retry time, and the `RateLimit` headers its status. The local limiters
    /// persist across outages (a flapping connection hands nobody a fresh budget at each
    /// flap) and are evicted once idle.
    Local(f64),
}

/// A fleet-wide limit on Redis, per key: [`fleet`] (features `tower` and `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct Fleet<X, R: crate::redis::RedisLimiter + 'static> {
    pub(super) name: Arc<str>,
    pub(super) observer: Observer,
    pub(super) redis_observer: FleetObserver,
    pub(super) extractor: X,
    // Shared with the local map's factory, which builds a key's limiter from it.
    pub(super) limiter: Arc<R>,
    pub(super) missing: MissingKey<String>,
    pub(super) deadline: Duration,
    pub(super) failure: FailurePolicy,
    /// The local limiters: built for [`FailurePolicy::Local`] only.
    pub(super) local: Option<Keyed<String, R::Local>>,
    pub(super) log: crate::redis::ErrorLog,
}

/// A policy that takes one permit per request from a Redis limiter
/// ([`Gcra`](crate::redis::Gcra), [`Fallback`](crate::redis::Fallback), [`Coalesce`](crate::redis::Coalesce), …)
/// under the request's key (its `Display` form): one limit shared by every server of a
/// fleet. Requests with no key (or an empty one, or one longer than the limiter's
/// [`max_key_len`](crate::redis::RedisLimiter::max_key_len)) pass; see [`FleetBuilder::on_missing_key`].
/// This is the policy with the defaults below; [`Fleet::builder`] changes them.
///
/// **Deadline and failures.** Each decision waits for Redis at most the
/// [deadline](FleetBuilder::deadline) (default 100 ms); an error the limiter
/// returns, whatever it is, and a missed deadline are answered by the
/// [failure policy](FleetBuilder::on_failure) (default [`FailurePolicy::Local`] with a share of 1:
/// see there why), and logged as a `tracing` warning, at most one a second per policy, with
/// the count of those not logged since ([`Fleet::failures`] counts them all). A
/// [`Fallback`](crate::redis::Fallback) limiter answers an unreachable Redis itself (in
/// process, and without a round trip for as long as the outage lasts); what it passes on
/// (an answer such as `OOM`, a script error) is the failure policy's.
///
/// **Every refusal a retry can cure carries `Retry-After`:** the server's figure, the local
/// limiter's, or one second for a refusal of [`FailurePolicy::Closed`]. (A
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
/// use turnstile::tower::{key, FailurePolicy, Fleet, MissingKey, RateLimitLayer};
/// use turnstile::Limit;
///
/// let con = turnstile::redis::connect("redis://127.0.0.1:6379/").await?;
/// let gcra = Gcra::new(con, Limit::per_second(10.0)?, 20)?;
/// let per_api_key = Fleet::builder("per-key", key::Header("x-api-key".parse()?), gcra)
///     .deadline(Duration::from_millis(50))
///     // Four servers: each answers a quarter of the limit while Redis is down.
///     .on_failure(FailurePolicy::Local(0.25))
///     .on_missing_key(MissingKey::Deny)
///     .build()?;
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
    Fleet::builder(name, extractor, limiter)
        .build()
        .unwrap_or_else(|_| unreachable!("the defaults are valid"))
}

#[cfg(feature = "redis")]
impl<X, R: crate::redis::RedisLimiter + 'static> FleetBuilder<X, R> {
    /// The most a decision waits for Redis (default 100 ms) before the
    /// [failure policy](FleetBuilder::on_failure) answers it. A call that missed it was sent: a
    /// stalled Redis may still count it when it wakes.
    ///
    /// The default is [`Fallback`](crate::redis::Fallback)'s per-call timeout. A healthy
    /// Redis answers a limiter's script in well under a millisecond on a LAN and in a few at
    /// its tail, so 100 ms is far beyond any answer that is coming, yet is what a request
    /// pays at most for an outage: under a person's notice and well under the timeouts of
    /// clients and load balancers, which would otherwise give up first (the way a stalled
    /// Redis becomes an outage of the service).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What answers a request the Redis limiter did not (default [`FailurePolicy::Local`]
    /// with a share of 1; see [`FailurePolicy`] for why).
    pub fn on_failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// The most keys [`FailurePolicy::Local`]'s map holds (default 65 536: at a few hundred
    /// bytes each, a compact limiter and its entry, some tens of MiB at most); a new key that
    /// finds it full is refused, with a retry time, so a flood of keys during an outage can
    /// neither grow the process nor reset anyone's limit.
    pub fn local_max_keys(mut self, max_keys: u64) -> Self {
        self.local_max_keys = max_keys;
        self
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

    /// The policy.
    ///
    /// # Errors
    /// [`ConfigError::ZeroTimeout`](crate::ConfigError::ZeroTimeout) for a zero deadline (no
    /// call would ever be answered),
    /// [`ConfigError::InvalidShare`](crate::ConfigError::InvalidShare) for a
    /// [`FailurePolicy::Local`] share outside `(0, 1]` (NaN included), and
    /// [`ConfigError::ZeroMaxKeys`](crate::ConfigError::ZeroMaxKeys) for a zero
    /// [`local_max_keys`](FleetBuilder::local_max_keys).
    pub fn build(self) -> Result<Fleet<X, R>, crate::ConfigError> {
        if self.deadline.is_zero() {
            return Err(crate::ConfigError::ZeroTimeout);
        }
        if self.local_max_keys == 0 {
            return Err(crate::ConfigError::ZeroMaxKeys);
        }
        let limiter = Arc::new(self.limiter);
        let local = match self.failure {
            FailurePolicy::Local(share) if !(share > 0.0 && share <= 1.0) => {
                return Err(crate::ConfigError::InvalidShare(share))
            }
            FailurePolicy::Local(share) => Some(local_map(&limiter, share, self.local_max_keys)?),
            FailurePolicy::Open | FailurePolicy::Closed => None,
        };
        Ok(Fleet {
            observer: Observer::new(&self.name),
            redis_observer: FleetObserver::new(&self.name, &limiter),
            name: self.name,
            extractor: self.extractor,
            limiter,
            missing: self.missing,
            deadline: self.deadline,
            failure: self.failure,
            local,
            log: crate::redis::ErrorLog::new(),
        })
    }
}

/// The local limiters of [`FailurePolicy::Local`]: `limiter`'s own local form with `share` of
/// its limit, one per key, at most `max_keys` of them.
#[cfg(feature = "redis")]
pub(super) fn local_map<R: crate::redis::RedisLimiter + 'static>(
    limiter: &Arc<R>,
    share: f64,
    max_keys: u64,
) -> Result<Keyed<String, R::Local>, crate::ConfigError> {
    let limiter = limiter.clone();
    Keyed::builder(move |_: &String| limiter.local(share))
        .max_keys(max_keys)
        .build()
}

/// Options for a [`Fleet`] policy: [`Fleet::builder`], then [`build`](FleetBuilder::build),
/// which checks them.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[must_use = "a builder does nothing until `build` is called"]
pub struct FleetBuilder<X, R> {
    name: Arc<str>,
    extractor: X,
    limiter: R,
    missing: MissingKey<String>,
    deadline: Duration,
    failure: FailurePolicy,
    local_max_keys: u64,
}

#[cfg(feature = "redis")]
impl<X, R: crate::redis::RedisLimiter + 'static> Fleet<X, R> {
    /// A builder of the policy named `name` that keys requests with `extractor` and takes
    /// their permits from `limiter`, with the defaults [`fleet`] has: a 100 ms
    /// [deadline](FleetBuilder::deadline), [`FailurePolicy::Local`] with a share of 1 over at
    /// most 65 536 keys, keyless requests let through.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use turnstile::redis::Gcra;
    /// use turnstile::tower::{key, FailurePolicy, Fleet};
    /// use turnstile::{ConfigError, Limit};
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6379/").await?;
    /// let gcra = Gcra::new(con, Limit::per_second(10.0)?, 20)?;
    /// let policy = Fleet::builder("per-ip", key::PeerIp, gcra.clone())
    ///     .on_failure(FailurePolicy::Closed)
    ///     .build()?;
    /// assert_eq!(policy.failure_policy(), FailurePolicy::Closed);
    /// let bad = Fleet::builder("per-ip", key::PeerIp, gcra).deadline(Duration::ZERO);
    /// assert_eq!(bad.build().err(), Some(ConfigError::ZeroTimeout));
    /// # Ok(()) }
    /// ```
    pub fn builder(name: impl Into<Arc<str>>, extractor: X, limiter: R) -> FleetBuilder<X, R> {
        FleetBuilder {
            name: name.into(),
            extractor,
            limiter,
            missing: MissingKey::Allow,
            deadline: DEFAULT_DEADLINE,
            failure: FailurePolicy::Local(1.0),
            local_max_keys: DEFAULT_LOCAL_MAX_KEYS,
        }
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

    /// `result`, counted, as a decision with no report.
    fn observed(&self, result: Result<(), Denied>, ask: &Ask) -> Decision<()> {
        self.observer.record(result.is_ok(), ask);
        decided(result)
    }

    /// The answer of the failure policy to a check of `key` the limiter failed with `error`.
    #[cold]
    fn failed(&self, key: &str, error: &crate::redis::RedisLimitError, ask: Ask) -> StatusVerdict {
        self.redis_observer.failed(error);
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
                let Taken { result, status, .. } =
                    PerKeyMap::take(local, &key.to_owned(), local.clock().now(), ask);
                StatusVerdict { result, status }
            }
            (FailurePolicy::Open, _) => StatusVerdict {
                result: Ok(()),
                status: None,
            },
            _ => StatusVerdict {
                result: Err(crate::redis::denied_after(Some(FAILURE_RETRY_AFTER))),
                status: None,
            },
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
                MissingKey::Allow => return Box::pin(ready(self.observed(Ok(()), &ask))),
                MissingKey::Deny => {
                    let now = crate::QuantaClock::new().now();
                    let denied = Err(Denied::new(now, None));
                    return Box::pin(ready(self.observed(denied, &ask)));
                }
                MissingKey::As(k) => k.clone(),
            },
        };
        // Free: no round trip, nothing taken.
        if ask.cost == 0 {
            return Box::pin(ready(self.observed(Ok(()), &ask)));
        }
        let this = self.clone();
        let n = ask.cost;
        Box::pin(async move {
            // With headers, the check that also answers the key's status (the same round
            // trip: the status comes from the check's own reply). Without, the plain check:
            // for the limiters that can say, the status costs nothing in Redis but is still
            // work here (a `Fallback` in fallback mode reads its local limiter's), and a
            // hand-written limiter's `try_check_n` may be cheaper than its status.
            let deadline = this.deadline;
            let started = this.redis_observer.start();
            let answer = if ask.report || ask.report_grants {
                tokio::time::timeout(deadline, this.limiter.try_check_n_status(&key, n)).await
            } else {
                let check = this.limiter.try_check_n(&key, n);
                tokio::time::timeout(deadline, async move {
                    Ok(StatusVerdict {
                        result: check.await?,
                        status: None,
                    })
                })
                .await
            };
            this.redis_observer.ended(started);
            let StatusVerdict { result, status } = match answer {
                Ok(Ok(verdict)) => verdict,
                Ok(Err(e)) => this.failed(&key, &e, ask),
                Err(_elapsed) => {
                    this.failed(&key, &crate::redis::RedisLimitError::Timeout(deadline), ask)
                }
            };
            let report = one_report(ask.reports(result.is_ok()), &this.name, || status);
            Decision {
                report,
                ..this.observed(result, &ask)
            }
        })
    }

    fn refund(&self, _: ()) {}

    fn hash_client<H: std::hash::Hasher>(&self, key: &Self::Key, state: &mut H) {
        std::hash::Hash::hash(key, state);
    }
}

/// A fleet decision, with no report.
#[cfg(feature = "redis")]
pub(super) fn decided(result: Result<(), Denied>) -> Decision<()> {
    Decision {
        result,
        wait: Duration::ZERO,
        report: Report::default(),
    }
}
