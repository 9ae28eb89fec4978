//! What the `Fallback` tests share (`tests/redis_fallback.rs`, and
//! `tests/redis_fallback_tracing.rs`, which runs alone in its process): a small test-only
//! Redis limiter (`Counter`) and the helpers that drive it.
#![allow(dead_code)] // not every test binary uses every helper

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::redis_server::RedisServer;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use turnstile::redis::{Fallback, Mode, RedisLimitError, RedisLimiter};
use turnstile::{Clock, Denied, FixedWindow, QuantaClock};

/// What the counter's script does.
#[derive(Clone, Copy)]
pub enum Kind {
    /// Counts: `{1, 0}` granted, `{0, pttl}` over quota.
    Count,
    /// Answers with a Redis error (a broken script).
    ScriptError,
    /// Answers something the limiter does not understand.
    Unexpected,
}

pub const COUNT: &str = r"
local n = tonumber(ARGV[1])
local c = redis.call('INCRBY', KEYS[1], n)
if c == n then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if c > tonumber(ARGV[3]) then
  redis.call('DECRBY', KEYS[1], n)
  return {0, redis.call('PTTL', KEYS[1])}
end
return {1, 0}
";

/// A test-only Redis limiter: at most `quota` permits per key per `window` (from the first
/// hit), counted in Redis; its local twin is a `FixedWindow` with the quota scaled by the
/// share. Counts its pings, and `alive` tells when it is dropped.
pub struct Counter {
    pub con: ConnectionManager,
    pub script: Script,
    pub quota: u32,
    pub window: Duration,
    pub pings: Arc<AtomicU64>,
    pub alive: Arc<()>,
}

impl Counter {
    pub async fn new(server: &RedisServer, quota: u32, window: Duration, kind: Kind) -> Counter {
        let client = redis::Client::open(server.url()).unwrap();
        // Reconnect promptly (no multi-second backoff after a restart), and no response
        // timeout of the connection's own: only the Fallback's timeout may cut a stalled call.
        let config = ConnectionManagerConfig::new()
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(100))
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(None);
        let con = client
            .get_connection_manager_with_config(config)
            .await
            .unwrap();
        let src = match kind {
            Kind::Count => COUNT,
            Kind::ScriptError => "return redis.error_reply('ERR broken limiter')",
            Kind::Unexpected => "return 'what'",
        };
        Counter {
            con,
            script: Script::new(src),
            quota,
            window,
            pings: Arc::new(AtomicU64::new(0)),
            alive: Arc::new(()),
        }
    }
}

impl RedisLimiter for Counter {
    type Local = FixedWindow;

    fn local(&self, share: f64) -> FixedWindow {
        let quota = (f64::from(self.quota) * share).ceil().max(1.0) as u32;
        FixedWindow::new(quota, self.window).unwrap()
    }

    async fn ping(&self) -> Result<(), RedisLimitError> {
        self.pings.fetch_add(1, Ordering::Relaxed);
        let mut con = self.con.clone();
        let pong: String = redis::cmd("PING").query_async(&mut con).await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(RedisLimitError::UnexpectedReply(pong))
        }
    }

    async fn try_check_n(&self, key: &str, n: u32) -> Result<Result<(), Denied>, RedisLimitError> {
        if key.is_empty() {
            return Err(RedisLimitError::EmptyKey);
        }
        if n > self.quota {
            return Err(RedisLimitError::ExceedsBurst {
                n,
                burst: self.quota,
            });
        }
        let mut con = self.con.clone();
        let reply: Value = self
            .script
            .key(key)
            .arg(n)
            .arg(self.window.as_millis() as u64)
            .arg(self.quota)
            .invoke_async(&mut con)
            .await?;
        match reply {
            Value::Array(v) => match v.as_slice() {
                [Value::Int(1), Value::Int(_)] => Ok(Ok(())),
                [Value::Int(0), Value::Int(pttl)] => {
                    let now = QuantaClock::new().now();
                    let wait = Duration::from_millis((*pttl).max(0) as u64);
                    Ok(Err(Denied::new(now, Some(now.saturating_add(wait)))))
                }
                _ => Err(RedisLimitError::UnexpectedReply(format!("{v:?}"))),
            },
            other => Err(RedisLimitError::UnexpectedReply(format!("{other:?}"))),
        }
    }
}

/// The per-call timeout of these tests: generous for a loaded machine in Redis mode, short
/// enough for the stall test.
pub const TIMEOUT: Duration = Duration::from_millis(250);

/// The bound on any one call: the timeout, plus a generous second for a loaded machine.
pub const CALL_BOUND: Duration = Duration::from_millis(250 + 1000);

/// Back on Redis within 1 s of Redis answering (pings every 100 ms), plus slack.
pub const BACK_WITHIN: Duration = Duration::from_millis(1500);

/// Runs a test body under an outer limit, so that a hang is a failure, not a stuck run.
pub async fn guarded(body: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(20), body)
        .await
        .expect("the test hung: a call or a mode switch never finished");
}

/// One check, asserting that it answered (no error) within [`CALL_BOUND`]; true if granted.
pub async fn answered(fb: &Fallback<Counter>, key: &str) -> bool {
    let t = Instant::now();
    let r = fb.check(key).await;
    let took = t.elapsed();
    assert!(took < CALL_BOUND, "a call took {took:?}");
    r.unwrap_or_else(|e| panic!("an error reached the caller: {e:?}"))
        .is_ok()
}

/// `calls` checks of `key`; how many were granted.
pub async fn granted(fb: &Fallback<Counter>, key: &str, calls: u32) -> u32 {
    let mut g = 0;
    for _ in 0..calls {
        g += u32::from(answered(fb, key).await);
    }
    g
}

/// Polls the mode every 10 ms until it is `want`, failing after `limit`; returns the wait.
pub async fn wait_for(fb: &Fallback<Counter>, want: Mode, limit: Duration) -> Duration {
    let t = Instant::now();
    while fb.mode() != want {
        assert!(
            t.elapsed() < limit,
            "still {:?} after {limit:?}, waiting for {want:?}",
            fb.mode()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t.elapsed()
}

pub fn get(server: &RedisServer, key: &str) -> String {
    server.cli(&["get", key])
}
