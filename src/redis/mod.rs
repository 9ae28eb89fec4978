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
//! | [`MultiGcra`] | [`MultiTokenBucket`](crate::MultiTokenBucket)'s decisions | one key per client: one to four arrival times, checked all-or-nothing, on `TIME` |
//! | [`Leased`] | [`Gcra`]'s key and bucket | `Gcra`'s key; each process leases up to `k` permits at once and spends them in process ([`Lease`](crate::lease::Lease)), with a stated bound |
//!
//! Every limiter is generic over its connection: a single server through the [`Connection`]
//! [`connect`] builds (redis-rs's reconnecting [`ConnectionManager`], with a response
//! timeout, TCP keepalive and a reconnect on `READONLY`), any `ConnectionManager` of your
//! own, or a Redis Cluster
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
//!
//! # Deadlines, outages and bad input
//! * **Every call answers within a deadline**: the connections [`connect`] and
//!   [`connect_cluster`] build time out a command after 250 ms
//!   ([`ConnectOptions::response_timeout`]), a [`Coalesce`] bounds each round trip it sends
//!   ([`CoalesceBuilder::deadline`]), a [`Blocking`] each call
//!   ([`BlockingBuilder::deadline`]), and a [`Fallback`] each check by its own timeout
//!   (100 ms), answering in process past it.
//! * **Outages** ([`RedisLimitError::is_outage`]): Redis unreachable or too slow, a full
//!   `Coalesce` queue, and the answers of a server that cannot serve now: `OOM`, `BUSY`,
//!   `LOADING`, `MASTERDOWN`, `READONLY`, `TRYAGAIN`, `CLUSTERDOWN`, `NOSCRIPT`. A
//!   [`Fallback`] answers them in process until its health check passes; the health check
//!   ([`RedisLimiter::ping`]) is a script Redis treats as a write, so it fails while any of
//!   them lasts. `READONLY` also makes a [`Connection`] reconnect (a failover leaves it on
//!   the demoted primary otherwise).
//! * **Misconfigurations** ([`RedisLimitError::is_misconfiguration`]: `NOPERM`,
//!   `WRONGTYPE`, a script error, an unexpected reply): a [`Fallback`] answers them in
//!   process too, logs them with `tracing` at most once a second, and stays on Redis.
//! * **Bad input** is refused before any round trip: an empty key, a key longer than
//!   512 bytes ([`RedisLimiter::max_key_len`]), more permits than the burst.

pub use ::redis::aio::ConnectionManager;

pub mod blocking;
pub mod coalesce;
mod connection;
mod error_log;
pub mod fallback;
pub mod fixed_window;
pub mod gcra;
mod gcra_lease;
pub mod leased;
pub mod multi_gcra;
pub mod token_bucket;

pub use blocking::{Blocking, BlockingBuilder};
pub use coalesce::{Coalesce, CoalesceBuilder, CoalesceStats, RedisBatch};
pub use connection::{connect, connect_with, ConnectOptions, Connection};
pub use fallback::{Fallback, FallbackBuilder, FallbackStats, Mode};
pub use fixed_window::{FixedWindow, FixedWindowBuilder};
pub use gcra::{Gcra, GcraBuilder, Throttle};
pub use leased::{LeaseStats, Leased, LeasedBuilder};
pub use multi_gcra::{MultiGcra, MultiGcraBuilder, MultiThrottle};
pub use token_bucket::{TokenBucket, TokenBucketBuilder};

pub(crate) use error_log::ErrorLog;

use std::time::Duration;

/// The deadline every Redis call gets unless configured otherwise: the response timeout of
/// the connections [`connect`] builds ([`ConnectOptions::response_timeout`]), a
/// [`Coalesce`]'s batch calls ([`CoalesceBuilder::deadline`]) and a [`Blocking`] call
/// ([`BlockingBuilder::deadline`]). Longer than [`Fallback`]'s per-call timeout
/// (100 ms), so that under a `Fallback` its own timer decides, and short
/// enough that a bare limiter over a stalled server answers
/// [`RedisLimitError::Timeout`] (or a timed-out [`RedisLimitError::Redis`]) a quarter of a
/// second later rather than never.
pub(crate) const DEFAULT_DEADLINE: Duration = Duration::from_millis(250);

/// The longest key (as passed to a check; the operator's prefix is not counted) every Redis
/// limiter accepts by default: a longer one is [`RedisLimitError::KeyTooLong`], before any
/// round trip. Keys often come from requests (a header, a path); 512 bytes holds any
/// address, API key or user id while keeping a client from storing kilobytes per key in
/// Redis and in a [`Fallback`]'s local map. [`GcraBuilder::max_key_len`],
/// [`FixedWindowBuilder::max_key_len`] and [`TokenBucketBuilder::max_key_len`] change it.
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 512;

/// A connection to a Redis Cluster, from the URLs of some of its nodes (redis-rs's
/// `ClusterClient`, which follows `MOVED` and `ASK` redirections), with a response timeout
/// of 250 ms, as [`connect`]'s. Every turnstile Redis limiter touches one
/// slot per call, so it runs on a cluster unchanged.
///
/// ```no_run
/// # async fn f() -> Result<(), turnstile::redis::RedisLimitError> {
/// let con = turnstile::redis::connect_cluster(&["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"]).await?;
/// # Ok(()) }
/// ```
pub async fn connect_cluster(
    urls: &[&str],
) -> Result<::redis::cluster_async::ClusterConnection, RedisLimitError> {
    let client = ::redis::cluster::ClusterClient::builder(urls.to_vec())
        .response_timeout(DEFAULT_DEADLINE)
        .tcp_settings(connection::tcp_settings(Some(
            connection::DEFAULT_KEEPALIVE,
        )))
        .build()?;
    Ok(client.get_async_connection().await?)
}

/// Why a Redis limiter could not answer. Bad input is refused before any round trip.
///
/// Three kinds, each with its own answer in [`Fallback`] (and the tower policy `fleet`):
/// * **outages** ([`RedisLimitError::is_outage`]): Redis cannot serve now (unreachable, too
///   slow, or answering that it cannot: OOM, BUSY, LOADING, ...); answered by the failure
///   policy, in process;
/// * **misconfigurations** ([`RedisLimitError::is_misconfiguration`]): Redis answered, but
///   not what the limiter needs (NOPERM, WRONGTYPE, a script error, an unexpected reply);
///   logged, rate-limited, and answered by the failure policy too: they last until an
///   operator acts, and every request meanwhile still needs an answer;
/// * **bad input** (the rest: an empty or too long key, more permits than the burst, a
///   blocking call inside a runtime): the caller's to handle, returned as they are.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RedisLimitError {
    /// The key was empty.
    #[error("empty key: every limited client needs a non-empty key")]
    EmptyKey,
    /// The key was longer than the limiter accepts (512 bytes by default:
    /// [`RedisLimiter::max_key_len`]); refused before any round trip.
    #[error("a key of {len} bytes, longer than the {max} a limiter accepts")]
    KeyTooLong {
        /// The key's length in bytes.
        len: usize,
        /// The most the limiter accepts.
        max: usize,
    },
    /// More permits were asked for than the limiter can ever grant at once.
    #[error("{n} permits asked for, more than the burst of {burst}: never granted")]
    ExceedsBurst {
        /// Permits asked for.
        n: u32,
        /// The most the limiter grants at once.
        burst: u32,
    },
    /// Redis did not answer within the deadline. An outage.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered with an error, or the connection failed; an outage or a
    /// misconfiguration depending on the error ([`RedisLimitError::is_outage`]).
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// The script answered something this crate's script never returns. A misconfiguration
    /// (another program's data under the limiter's key, a proxy in the way).
    #[error("unexpected reply from the limiter's script: {0}")]
    UnexpectedReply(String),
    /// A [`Coalesce`] check was queued behind a call whose future was dropped outside any
    /// tokio runtime, so nothing could send it. An outage: a [`Fallback`] answers it.
    #[error("the coalesced call this check waited for was dropped outside a runtime")]
    Abandoned,
    /// A [`Coalesce`] already had its bound of checks waiting
    /// ([`CoalesceBuilder::max_queued`]): refused at once rather than queued. An outage: a
    /// [`Fallback`] answers it.
    #[error("{max} checks already wait for Redis: not queued")]
    QueueFull {
        /// The bound.
        max: usize,
    },
    /// A [`Blocking`] limiter was called (or built) on a thread where a tokio runtime is
    /// current, where blocking would stall the runtime (and tokio panics): await the async
    /// limiter there instead ([`Blocking::limiter`]). Not an outage.
    #[error("a blocking Redis limiter was called inside a tokio runtime, where it must not block; await the async limiter instead (Blocking::limiter)")]
    InsideAsyncRuntime,
}

/// The error codes with which a Redis server says it cannot serve now, though it will
/// again without anyone changing the configuration: out of memory under `noeviction`, a
/// script running past its time limit, a dataset loading, a replica whose primary is down
/// (or a demoted primary), a cluster resharding or down, and a script cache emptied between
/// a load and its run.
const OUTAGE_CODES: [&str; 8] = [
    "OOM",
    "BUSY",
    "LOADING",
    "MASTERDOWN",
    "READONLY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOSCRIPT",
];

/// Every [`RedisLimitError::kind`], in a fixed order.
pub(crate) const ERROR_KINDS: [&str; 20] = [
    "empty_key",
    "key_too_long",
    "exceeds_burst",
    "timeout",
    "queue_full",
    "abandoned",
    "inside_async_runtime",
    "unexpected_reply",
    "io",
    "oom",
    "busy",
    "loading",
    "masterdown",
    "readonly",
    "tryagain",
    "clusterdown",
    "noscript",
    "cluster",
    "server_error",
    "redis",
];

impl RedisLimitError {
    /// A short, stable name for what went wrong, for metrics and logs: `timeout`,
    /// `queue_full`, `abandoned`, `unexpected_reply`; for an error of Redis's, the server's
    /// code where it is one of the outages ([`RedisLimitError::is_outage`]: `oom`, `busy`,
    /// `loading`, `masterdown`, `readonly`, `tryagain`, `clusterdown`, `noscript`), `io` for
    /// a connection that failed, dropped or was refused, `cluster` for a cluster
    /// redirection, `server_error` for any other code the server sent (`NOPERM`,
    /// `WRONGTYPE`, a script error), `redis` for the rest; and for bad input `empty_key`,
    /// `key_too_long`, `exceeds_burst`, `inside_async_runtime`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::RedisLimitError;
    /// assert_eq!(RedisLimitError::Timeout(Duration::from_millis(100)).kind(), "timeout");
    /// let oom = redis::parse_redis_value(b"-OOM command not allowed\r\n")
    ///     .unwrap()
    ///     .extract_error()
    ///     .unwrap_err();
    /// assert_eq!(RedisLimitError::Redis(oom).kind(), "oom");
    /// ```
    pub fn kind(&self) -> &'static str {
        ERROR_KINDS[self.kind_index()]
    }

    /// The index of [`RedisLimitError::kind`] in [`ERROR_KINDS`].
    pub(crate) fn kind_index(&self) -> usize {
        match self {
            RedisLimitError::EmptyKey => 0,
            RedisLimitError::KeyTooLong { .. } => 1,
            RedisLimitError::ExceedsBurst { .. } => 2,
            RedisLimitError::Timeout(_) => 3,
            RedisLimitError::QueueFull { .. } => 4,
            RedisLimitError::Abandoned => 5,
            RedisLimitError::InsideAsyncRuntime => 6,
            RedisLimitError::UnexpectedReply(_) => 7,
            RedisLimitError::Redis(e) => {
                if let Some(i) = e
                    .code()
                    .and_then(|c| OUTAGE_CODES.iter().position(|&o| o == c))
                {
                    return 9 + i;
                }
                if e.is_timeout() {
                    3
                } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
                {
                    8
                } else if e.is_cluster_error() {
                    17
                } else if e.code().is_some() {
                    18
                } else {
                    19
                }
            }
        }
    }
    /// Whether Redis cannot serve now: unreachable (a connection error, a refused or
    /// dropped connection), too slow (a timeout), a full [`Coalesce`] queue, or a server
    /// answering that it cannot (`OOM`, `BUSY`, `LOADING`, `MASTERDOWN`, `READONLY`,
    /// `TRYAGAIN`, `CLUSTERDOWN`, `NOSCRIPT`, and cluster redirections). What a [`Fallback`]
    /// answers in process, switching to fallback mode until the health check passes.
    pub fn is_outage(&self) -> bool {
        match self {
            RedisLimitError::Timeout(_)
            | RedisLimitError::Abandoned
            | RedisLimitError::QueueFull { .. } => true,
            RedisLimitError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    || e.is_cluster_error()
                    || e.code().is_some_and(|c| OUTAGE_CODES.contains(&c))
            }
            _ => false,
        }
    }

    /// The same as [`RedisLimitError::is_outage`] (its former name).
    pub fn is_connectivity(&self) -> bool {
        self.is_outage()
    }

    /// Whether Redis answered, but not what the limiter needs: an error that is not an
    /// outage (`NOPERM`, `WRONGTYPE`, a script error, an unknown command) or an unexpected
    /// reply. It lasts until an operator changes something; a [`Fallback`] logs it
    /// (rate-limited) and answers the check in process, without leaving Redis mode.
    pub fn is_misconfiguration(&self) -> bool {
        match self {
            RedisLimitError::UnexpectedReply(_) => true,
            RedisLimitError::Redis(_) => !self.is_outage(),
            _ => false,
        }
    }
}

/// Bad input every limiter refuses before any round trip: an empty key, or one longer than
/// `max`.
pub(crate) fn check_key(key: &str, max: usize) -> Result<(), RedisLimitError> {
    if key.is_empty() {
        return Err(RedisLimitError::EmptyKey);
    }
    if key.len() > max {
        return Err(RedisLimitError::KeyTooLong {
            len: key.len(),
            max,
        });
    }
    Ok(())
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
    type Local: crate::PerKeyLimiter + 'static;

    /// An in-process limiter for one key with this limiter's configuration, its rate scaled by
    /// `share` (in `(0, 1]`: `1 / fleet size` keeps a fleet in fallback near the one limit;
    /// quotas and bursts scale too, rounded up to at least 1).
    fn local(&self, share: f64) -> Self::Local;

    /// Whether the limiter's server can serve it now: what the fallback's health check sends
    /// every 100 ms to learn that Redis is back, and a readiness probe. The crate's limiters
    /// send a script that writes nothing but is flagged as one that may write, so a server
    /// that answers `PING` but cannot run the limiter (out of memory, a read-only replica)
    /// fails it too; a server too old for script flags (Redis < 7) gets a plain `PING`.
    fn ping(&self) -> impl std::future::Future<Output = Result<(), RedisLimitError>> + Send;

    /// The longest key (as passed to a check) the limiter accepts: longer is
    /// [`RedisLimitError::KeyTooLong`] before any round trip. 512 bytes unless the limiter
    /// says otherwise: that holds any address, API key or user id, while keeping a client
    /// whose keys come from requests from storing kilobytes per key in Redis and in a
    /// [`Fallback`]'s local map.
    fn max_key_len(&self) -> usize {
        DEFAULT_MAX_KEY_LEN
    }

    /// The mode and switches of the [`Fallback`] this limiter is or wraps, for an operator
    /// (what the tower policy `fleet` publishes with the feature `metrics`); `None` (the
    /// default) for a limiter without one.
    fn fallback_state(&self) -> Option<(Mode, FallbackStats)> {
        None
    }

    /// The figures of the [`Coalesce`] this limiter is or wraps; `None` (the default) for a
    /// limiter without one.
    fn coalesce_stats(&self) -> Option<CoalesceStats> {
        None
    }

    /// Takes `n` permits for `key` if the shared limit has them.
    fn try_check_n(
        &self,
        key: &str,
        n: u32,
    ) -> impl std::future::Future<Output = Result<Result<(), crate::Denied>, RedisLimitError>> + Send;

    /// [`RedisLimiter::try_check_n`], answered as a [`StatusVerdict`]: the verdict with the
    /// key's [`QuotaStatus`](crate::QuotaStatus) right after the check (the IETF `RateLimit`
    /// fields: what the tower policy `fleet` sends in its headers, feature `tower`), from the
    /// **same** answer: no other command, no second round trip, so the status is the one this
    /// check left (its `remaining` counts this check's permits out if granted).
    ///
    /// The status is `None` when the limiter cannot say exactly from that answer. The default
    /// checks with [`RedisLimiter::try_check_n`] and answers `None`; [`Gcra`] (from its
    /// [`Throttle`]), [`TokenBucket`] and [`FixedWindow`] (from what their scripts already
    /// return) and [`Fallback`] (the wrapped limiter's while Redis answers, the key's local
    /// limiter's in fallback mode) override it. [`Coalesce`] keeps the default: its batch
    /// calls return verdicts only.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use turnstile::redis::{Gcra, RedisLimiter, StatusVerdict};
    /// use turnstile::Limit;
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6379/").await?;
    /// let per_user = Gcra::new(con, Limit::per_second(10.0)?, 20)?;
    /// let StatusVerdict { result, status } = per_user.try_check_n_status("alice", 1).await?;
    /// let status = status.expect("a GCRA always knows its status");
    /// // RateLimit-Policy: "per-user";q=20;w=2
    /// assert_eq!((status.quota, status.window_secs()), (20, 2));
    /// if result.is_ok() {
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
        async move {
            Ok(StatusVerdict {
                result: check.await?,
                status: None,
            })
        }
    }
}

/// What [`RedisLimiter::try_check_n_status`] answers: the verdict, and the key's status after
/// the check when the limiter can say it exactly.
///
/// ```
/// use std::time::Duration;
/// use turnstile::redis::StatusVerdict;
/// use turnstile::QuotaStatus;
///
/// /// The `RateLimit` header field for an answer, when the limiter could say.
/// fn rate_limit(answer: &StatusVerdict) -> Option<String> {
///     let s = answer.status?;
///     Some(format!("\"per-user\";r={};t={}", s.remaining, s.reset_secs()))
/// }
///
/// let answer = StatusVerdict {
///     result: Ok(()),
///     status: Some(QuotaStatus {
///         quota: 20,
///         window: Duration::from_secs(2),
///         remaining: 19,
///         reset: Duration::from_millis(100),
///     }),
/// };
/// assert!(answer.result.is_ok());
/// assert_eq!(rate_limit(&answer).as_deref(), Some("\"per-user\";r=19;t=1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "the verdict says whether the permits were granted"]
pub struct StatusVerdict {
    /// The permits, or the refusal with its retry time.
    pub result: Result<(), crate::Denied>,
    /// The key's status after the check (its `remaining` counts this check's permits out if
    /// granted), when the limiter can say it exactly from the check's own answer.
    pub status: Option<crate::QuotaStatus>,
}

/// A [`Denied`](crate::Denied) from a server's retry-after, dated on the process's clock.
pub(crate) fn denied_after(retry_after: Option<Duration>) -> crate::Denied {
    use crate::Clock;
    let now = crate::QuantaClock::new().now();
    crate::Denied::new(now, retry_after.map(|d| now.saturating_add(d)))
}

/// The health probe of [`RedisLimiter::ping`] on a connection: a script flagged as one that
/// may write (Redis 7 refuses it at once under `OOM`, on a read-only replica, while `BUSY` or
/// `LOADING`), and a plain `PING` where the server cannot compile the flag (Redis < 7).
pub(crate) async fn ping<C>(con: &C) -> Result<(), RedisLimitError>
where
    C: ::redis::aio::ConnectionLike + Clone + Send,
{
    let mut con = con.clone();
    let probe: Result<String, _> = ::redis::cmd("EVAL")
        .arg(PROBE)
        .arg(0)
        .query_async(&mut con)
        .await;
    let pong = match probe {
        Ok(pong) => pong,
        Err(e) => {
            let e = RedisLimitError::from(e);
            if e.is_outage() {
                return Err(e);
            }
            ::redis::cmd("PING").query_async(&mut con).await?
        }
    };
    if pong == "PONG" {
        Ok(())
    } else {
        Err(RedisLimitError::UnexpectedReply(pong))
    }
}

/// The probe script: no flags after the shebang means "may write" to Redis 7.
const PROBE: &str = "#!lua\nreturn 'PONG'";

#[cfg(test)]
mod kind_tests {
    use super::*;

    #[test]
    fn every_outage_code_is_its_own_kind() {
        for code in OUTAGE_CODES {
            let e = ::redis::parse_redis_value(format!("-{code} detail\r\n").as_bytes())
                .unwrap()
                .extract_error()
                .unwrap_err();
            assert_eq!(RedisLimitError::Redis(e).kind(), code.to_lowercase());
        }
        let other = ::redis::parse_redis_value(b"-NOPERM no\r\n")
            .unwrap()
            .extract_error()
            .unwrap_err();
        assert_eq!(RedisLimitError::Redis(other).kind(), "server_error");
        let kinds: std::collections::HashSet<_> = ERROR_KINDS.iter().collect();
        assert_eq!(kinds.len(), ERROR_KINDS.len(), "a kind named twice");
    }
}
