//! [`Connection`]: the reconnecting connection [`connect`] builds, with a response timeout,
//! TCP keepalive, and a reconnect when the server answers `READONLY`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use ::redis::{Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::{RedisLimitError, DEFAULT_DEADLINE};

/// How long a connection is idle before the first keepalive probe, by default.
pub(crate) const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(10);

/// After a `READONLY` answer closes the connection, further `READONLY` answers within this
/// span are the same connection's (answers already on their way) and close nothing more:
/// one reconnect per failover, not one per request in flight.
const READONLY_QUIET: Duration = Duration::from_millis(100);

/// How [`connect_with`] sets up a connection. The defaults ([`ConnectOptions::new`]) are
/// what [`connect`] uses.
///
/// ```no_run
/// # async fn f() -> Result<(), turnstile::redis::RedisLimitError> {
/// use std::time::Duration;
/// use turnstile::redis::{connect_with, ConnectOptions};
///
/// let options = ConnectOptions::new()
///     .response_timeout(Duration::from_millis(50))
///     .keepalive(Some(Duration::from_secs(30)));
/// let con = connect_with("redis://10.0.0.5:6379/", &options).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectOptions {
    response_timeout: Duration,
    connection_timeout: Duration,
    keepalive: Option<Duration>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            response_timeout: DEFAULT_DEADLINE,
            connection_timeout: Duration::from_millis(500),
            keepalive: Some(DEFAULT_KEEPALIVE),
        }
    }
}

impl ConnectOptions {
    /// The defaults: a response timeout of 250 ms, a connection attempt timeout of 500 ms,
    /// and TCP keepalive after 10 s idle.
    pub fn new() -> Self {
        ConnectOptions::default()
    }

    /// The most a command waits for its answer (default 250 ms); past it the call fails with
    /// a timeout ([`RedisLimitError::is_outage`]). Zero is refused by [`connect_with`].
    ///
    /// The default is longer than a [`Fallback`](super::Fallback)'s per-call timeout
    /// (100 ms), so that under a `Fallback` its own timer decides, and short enough that a
    /// bare limiter over a stalled server answers a timeout a quarter of a second later
    /// rather than never.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The most one connection attempt waits (default 500 ms). Zero is refused by
    /// [`connect_with`].
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// TCP keepalive: probes after this long idle (default 10 s), so that a peer gone
    /// without a word (a host powered off, a NAT entry dropped) ends the connection and the
    /// manager reconnects; `None` turns it off.
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive = idle;
        self
    }
}

/// TCP settings with keepalive after `idle` (probes then every `idle / 2`, at least 1 s).
pub(crate) fn tcp_settings(idle: Option<Duration>) -> TcpSettings {
    let settings = TcpSettings::default().set_nodelay(true);
    let Some(idle) = idle else {
        return settings;
    };
    let keepalive = TcpKeepalive::new().with_time(idle);
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "windows"))]
    let keepalive = keepalive.with_interval((idle / 2).max(Duration::from_secs(1)));
    settings.set_keepalive(keepalive)
}

/// A reconnecting connection to one Redis server, set up for limiters ([`connect`],
/// [`connect_with`]): redis-rs's [`ConnectionManager`] (one multiplexed connection), with
///
/// * a **response timeout** on every command ([`ConnectOptions::response_timeout`], default
///   250 ms), so a stalled server (SIGSTOP, a network partition) answers a timeout instead
///   of nothing;
/// * **TCP keepalive** ([`ConnectOptions::keepalive`]);
/// * a prompt **reconnect**: within 100 ms of a restart or an outage (redis-rs's default
///   backoff can wait seconds, which would keep a [`Fallback`](super::Fallback) in fallback
///   that long), each attempt giving up after 500 ms;
/// * a **reconnect on `READONLY`**: after a failover, a connection left on the demoted
///   primary answers `READONLY` to every write, and `ConnectionManager` does not reconnect on
///   an answer. The first `READONLY` closes the connection (a `QUIT` sent on it), so the
///   manager reconnects, through the URL's name, to whichever server is primary now. The
///   `READONLY` itself is returned (an outage, which a `Fallback` answers in process).
///
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct Connection {
    manager: ConnectionManager,
    readonly: Arc<Readonly>,
}

/// When the last `READONLY` closed the connection.
struct Readonly {
    origin: Instant,
    /// Nanoseconds after `origin` of the last close, plus one (0: never).
    last_close: AtomicU64,
    closes: AtomicU64,
}

impl Connection {
    /// The redis-rs connection manager underneath.
    pub fn manager(&self) -> &ConnectionManager {
        &self.manager
    }

    /// How many times a `READONLY` answer has closed the connection so that it reconnects.
    pub fn readonly_reconnects(&self) -> u64 {
        self.readonly.closes.load(Relaxed)
    }

    /// Closes the connection after a `READONLY` answer, unless one did within
    /// [`READONLY_QUIET`].
    #[cold]
    fn after_readonly(&self) {
        let r = &*self.readonly;
        let now = u64::try_from(r.origin.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = r.last_close.load(Relaxed);
        let quiet = READONLY_QUIET.as_nanos() as u64;
        if last != 0 && now.saturating_sub(last) < quiet {
            return;
        }
        if r.last_close
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        r.closes.fetch_add(1, Relaxed);
        tracing::warn!(
            "turnstile: Redis answered READONLY (a replica, or a primary demoted by a failover); reconnecting"
        );
        let mut manager = self.manager.clone();
        // The server closes the connection after QUIT's answer; the PING after it then
        // fails on the closed connection, which makes the manager reconnect at once rather
        // than at the next check.
        tokio::spawn(async move {
            let _: Result<Value, _> = ::redis::cmd("QUIT").query_async(&mut manager).await;
            let _: Result<Value, _> = ::redis::cmd("PING").query_async(&mut manager).await;
        });
    }

    /// Whether `answer` is `READONLY`: redis-rs returns a server's error reply as a value
    /// (converted into an error by the caller's `query_async`), a failed pipeline as an
    /// error.
    fn check_one(&self, answer: &Result<Value, RedisError>) {
        let readonly = match answer {
            Ok(Value::ServerError(e)) => e.code() == "READONLY",
            Ok(_) => false,
            Err(e) => e.code() == Some("READONLY"),
        };
        if readonly {
            self.after_readonly();
        }
    }

    fn check_many(&self, answer: &Result<Vec<Value>, RedisError>) {
        let readonly = match answer {
            Ok(values) => values
                .iter()
                .any(|v| matches!(v, Value::ServerError(e) if e.code() == "READONLY")),
            Err(e) => e.code() == Some("READONLY"),
        };
        if readonly {
            self.after_readonly();
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let answer = self.manager.req_packed_command(cmd).await;
            self.check_one(&answer);
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let answer = self.manager.req_packed_commands(cmd, offset, count).await;
            self.check_many(&answer);
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("manager", &self.manager)
            .field("readonly_reconnects", &self.readonly_reconnects())
            .finish()
    }
}

/// [`connect_with`] with the default [`ConnectOptions`]: a response timeout of 250 ms, TCP
/// keepalive, a reconnect within 100 ms, and a reconnect on `READONLY` (see [`Connection`]).
///
/// ```no_run
/// # async fn f() -> Result<(), turnstile::redis::RedisLimitError> {
/// let con = turnstile::redis::connect("redis://127.0.0.1:6379/").await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Connection, RedisLimitError> {
    connect_with(url, &ConnectOptions::default()).await
}

/// A reconnecting [`Connection`] to the server at `url`, set up as `options` say.
///
/// # Errors
/// A zero response or connection timeout (redis-rs's `InvalidClientConfig`), a bad URL, or
/// the first connection attempt failing.
pub async fn connect_with(
    url: &str,
    options: &ConnectOptions,
) -> Result<Connection, RedisLimitError> {
    if options.response_timeout.is_zero() || options.connection_timeout.is_zero() {
        return Err(RedisError::from((
            ::redis::ErrorKind::InvalidClientConfig,
            "a zero timeout: every call would time out",
        ))
        .into());
    }
    let config = ConnectionManagerConfig::new()
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(100))
        .set_connection_timeout(Some(options.connection_timeout))
        .set_response_timeout(Some(options.response_timeout));
    let info = ::redis::IntoConnectionInfo::into_connection_info(url)?
        .set_tcp_settings(tcp_settings(options.keepalive));
    let client = ::redis::Client::open(info)?;
    Ok(Connection {
        manager: client.get_connection_manager_with_config(config).await?,
        readonly: Arc::new(Readonly {
            origin: Instant::now(),
            last_close: AtomicU64::new(0),
            closes: AtomicU64::new(0),
        }),
    })
}
