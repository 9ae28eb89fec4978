//! Limiters shared by a whole fleet, on Redis (feature `redis`).
//!
//! go-zero's `TokenLimiter` and `PeriodLimit` live on Redis: that is how servers share one
//! limit. This module gives the same limiters to Rust services, compatible with go-zero's keys
//! and scripts so that Go and Rust services can share one limit, plus a precise GCRA on the
//! Redis server's clock:
//!
//! | type | compatible with | state |
//! |---|---|---|
//! | [`TokenBucket`] | go-zero `TokenLimiter` (`{key}.tokens`, `{key}.ts`) | tokens and a whole-second timestamp |
//! | [`FixedWindow`] | go-zero `PeriodLimit` (`prefix + key`) | a counter with a TTL |
//! | [`Gcra`] | redis-cell's `CL.THROTTLE` answers | one key: the theoretical arrival time, on `TIME` |
//!
//! Every limiter is generic over its connection: a single server through redis-rs's
//! reconnecting [`ConnectionManager`], or a Redis Cluster
//! through [`ClusterConnection`](::redis::cluster_async::ClusterConnection). Each call touches
//! one key or keys in one hash slot, so the limiters work on a cluster unchanged. Scripts are
//! sent once and run by `EVALSHA`; after `SCRIPT FLUSH`, a restart or a failover the server
//! answers `NOSCRIPT` and the script is loaded again, transparently (redis-rs's
//! [`Script`](::redis::Script)).
//!
//! A check answers like [`Keyed::try_check`](crate::Keyed::try_check): the outer `Result` is
//! an infrastructure error ([`RedisLimitError`]: bad input before any round trip, or Redis
//! itself failing), the inner one the limiter's verdict, with a [`Denied`](crate::Denied)
//! that says when to retry.

pub use ::redis::aio::ConnectionManager;

pub mod blocking;
pub mod coalesce;
pub mod fallback;
pub mod gcra;
pub mod token_bucket;
pub mod window;

pub use blocking::Blocking;
pub use coalesce::{Coalesce, CoalesceStats, RedisBatch, DEFAULT_MAX_BATCH};
pub use fallback::{Fallback, FallbackBuilder, Mode, DEFAULT_PING_EVERY, DEFAULT_TIMEOUT};
pub use gcra::{Gcra, GcraBuilder, Throttle};
pub use token_bucket::TokenBucket;
pub use window::FixedWindow;

use std::time::Duration;

/// A reconnecting connection to one Redis server, set up for limiters: after a restart or an
/// outage it reconnects within 100 ms (redis-rs's default backoff can wait seconds, which
/// would keep a [`Fallback`] in fallback that long), a connection attempt gives up after
/// 500 ms, and calls carry no response timeout of their own ([`Fallback`] puts its per-call
/// timeout around each check). Equivalent to redis-rs's
/// `Client::get_connection_manager_with_config` with those settings; build your own
/// [`ConnectionManager`] for others.
///
/// ```no_run
/// # async fn f() -> Result<(), turnstile::redis::RedisLimitError> {
/// let con = turnstile::redis::connect("redis://127.0.0.1:6379/").await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<ConnectionManager, RedisLimitError> {
    let config = ::redis::aio::ConnectionManagerConfig::new()
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(100))
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(None);
    let client = ::redis::Client::open(url)?;
    Ok(client.get_connection_manager_with_config(config).await?)
}

/// A connection to a Redis Cluster, from the URLs of some of its nodes (redis-rs's
/// `ClusterClient`, which follows `MOVED` and `ASK` redirections). Every turnstile Redis
/// limiter touches one slot per call, so it runs on a cluster unchanged.
///
/// ```no_run
/// # async fn f() -> Result<(), turnstile::redis::RedisLimitError> {
/// let con = turnstile::redis::connect_cluster(&["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"]).await?;
/// # Ok(()) }
/// ```
pub async fn connect_cluster(
    urls: &[&str],
) -> Result<::redis::cluster_async::ClusterConnection, RedisLimitError> {
    let client = ::redis::cluster::ClusterClient::new(urls.to_vec())?;
    Ok(client.get_async_connection().await?)
}

/// Why a Redis limiter could not answer. Bad input is refused before any round trip.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// The key was empty.
    #[error("empty key: every limited client needs a non-empty key")]
    EmptyKey,
    /// More permits were asked for than the limiter can ever grant at once.
    #[error("{n} permits asked for, more than the burst of {burst}: never granted")]
    ExceedsBurst {
        /// Permits asked for.
        n: u32,
        /// The most the limiter grants at once.
        burst: u32,
    },
    /// Redis did not answer within the per-call timeout.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error, or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// The script answered something this crate's script never returns.
    #[error("unexpected reply from the limiter's script: {0}")]
    UnexpectedReply(String),
    /// A [`Coalesce`] check was queued behind a call whose future was dropped outside any
    /// tokio runtime, so nothing could send it. Counts as connectivity: a [`Fallback`]
    /// answers it.
    #[error("the coalesced call this check waited for was dropped outside a runtime")]
    Abandoned,
    /// A [`Blocking`] limiter was called (or built) on a thread where a tokio runtime is
    /// current, where blocking would stall the runtime (and tokio panics): await the async
    /// limiter there instead ([`Blocking::limiter`]). Not a connectivity error.
    #[error("a blocking Redis limiter was called inside a tokio runtime, where it must not block; await the async limiter instead (Blocking::limiter)")]
    InsideAsyncRuntime,
}

impl RedisLimitError {
    /// Whether Redis could not be reached (a connection error, a refused or dropped
    /// connection, a timeout), as opposed to an answer: the cases a fallback covers. A script
    /// error, bad input or an unexpected reply is not.
    pub fn is_connectivity(&self) -> bool {
        match self {
            RedisLimitError::Timeout(_) | RedisLimitError::Abandoned => true,
            RedisLimitError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || e.is_cluster_error()
            }
            _ => false,
        }
    }
}

/// What every Redis limiter offers, and what the fallback ([`RedisLimitError::is_connectivity`]
/// errors answered in process) builds on.
///
/// `try_check_n` answers like [`Keyed::try_check_n`](crate::Keyed::try_check_n): the outer
/// error is bad input or Redis failing, the inner `Err` a denial with its retry time. A
/// denial's [`Denied`](crate::Denied) is dated on the process's
/// [`QuantaClock`](crate::QuantaClock) (`checked_at` is the local reading when the answer
/// arrived, `retry_at` that reading plus the retry-after the server computed), so
/// `retry_after()` and `retry_after_secs()` are the server's figures.
pub trait RedisLimiter: Send + Sync {
    /// The in-process limiter with the same configuration, one per key: what the fallback
    /// answers with while Redis is unreachable.
    type Local: crate::KeyedLimiter + 'static;

    /// An in-process limiter for one key with this limiter's configuration, its rate scaled by
    /// `share` (in `(0, 1]`: `1 / fleet size` keeps a fleet in fallback near the one limit;
    /// quotas and bursts scale too, rounded up to at least 1).
    fn local(&self, share: f64) -> Self::Local;

    /// One `PING` on the limiter's connection: what the fallback's health check sends every
    /// 100 ms to learn that Redis is back.
    fn ping(&self) -> impl std::future::Future<Output = Result<(), RedisLimitError>> + Send;

    /// Takes `n` permits for `key` if the shared limit has them.
    fn try_check_n(
        &self,
        key: &str,
        n: u32,
    ) -> impl std::future::Future<Output = Result<Result<(), crate::Denied>, RedisLimitError>> + Send;

    /// [`RedisLimiter::try_check_n`], answered with the key's [`QuotaStatus`](crate::QuotaStatus)
    /// right after the check (the IETF `RateLimit` fields: what the tower policy `fleet`
    /// sends in its headers, feature `tower`), from the **same** answer: no
    /// other command, no second round trip, so the status is the one this check left (its
    /// `remaining` counts this check's permits out if granted).
    ///
    /// `None` when the limiter cannot say exactly from that answer. The default checks with
    /// [`RedisLimiter::try_check_n`] and answers `None`; [`Gcra`] (from its [`Throttle`]),
    /// [`TokenBucket`] and [`FixedWindow`] (from what their scripts already return) and
    /// [`Fallback`] (the wrapped limiter's while Redis answers, the key's local limiter's in
    /// fallback mode) override it. [`Coalesce`] keeps the default: its batch calls return
    /// verdicts only.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use turnstile::redis::{Gcra, RedisLimiter};
    /// use turnstile::Limit;
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6379/").await?;
    /// let per_user = Gcra::new(con, Limit::per_second(10.0)?, 20)?;
    /// let (verdict, status) = per_user.try_check_n_status("alice", 1).await?;
    /// let status = status.expect("a GCRA always knows its status");
    /// // RateLimit-Policy: "per-user";q=20;w=2
    /// assert_eq!((status.quota, status.window_secs()), (20, 2));
    /// if verdict.is_ok() {
    ///     println!("RateLimit: \"per-user\";r={};t={}", status.remaining, status.reset_secs());
    /// }
    /// # Ok(()) }
    /// ```
    fn try_check_n_status(
        &self,
        key: &str,
        n: u32,
    ) -> impl std::future::Future<Output = Result<StatusVerdict, RedisLimitError>> + Send {
        let check = self.try_check_n(key, n);
        async move { Ok((check.await?, None)) }
    }
}

/// What [`RedisLimiter::try_check_n_status`] answers: the verdict, and the key's status after
/// the check when the limiter can say it exactly.
pub type StatusVerdict = (Result<(), crate::Denied>, Option<crate::QuotaStatus>);

/// A [`Denied`](crate::Denied) from a server's retry-after, dated on the process's clock.
pub(crate) fn denied_after(retry_after: Option<Duration>) -> crate::Denied {
    use crate::Clock;
    let now = crate::QuantaClock::new().now();
    crate::Denied::new(now, retry_after.map(|d| now.saturating_add(d)))
}

/// `PING` on a connection, expecting `PONG`.
pub(crate) async fn ping<C>(con: &C) -> Result<(), RedisLimitError>
where
    C: ::redis::aio::ConnectionLike + Clone + Send,
{
    let mut con = con.clone();
    let pong: String = ::redis::cmd("PING").query_async(&mut con).await?;
    if pong == "PONG" {
        Ok(())
    } else {
        Err(RedisLimitError::UnexpectedReply(pong))
    }
}
