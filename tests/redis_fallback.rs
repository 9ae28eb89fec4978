//! `turnstile::redis::Fallback` against a real redis-server (tests/common/redis_server.rs):
//! answers from Redis while it answers; on a kill or a stall (SIGSTOP) it answers every call
//! from the in-process limiters, with no error reaching the caller and each call bounded by
//! the timeout; it goes back to Redis within a second of Redis answering again; errors that
//! are not connectivity problems are returned; the share scales the fallback; one health
//! check runs at a time and stops with the limiter.
//!
//! The Redis limiters are written elsewhere: these tests wrap a small counter limiter of
//! their own (`Counter`: a quota per window, counted by a Lua script), enough to drive every
//! path for real. Every test runs under an outer timeout, so a hang fails it.
#![cfg(feature = "redis")]

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use turnstile::redis::{Fallback, Mode, RedisLimitError, RedisLimiter};
use turnstile::{Clock, ConfigError, Denied, FixedWindow, QuantaClock};

/// What the counter's script does.
#[derive(Clone, Copy)]
enum Kind {
    /// Counts: `{1, 0}` granted, `{0, pttl}` over quota.
    Count,
    /// Answers with a Redis error (a broken script).
    ScriptError,
    /// Answers something the limiter does not understand.
    Unexpected,
}

const COUNT: &str = r"
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
struct Counter {
    con: ConnectionManager,
    script: Script,
    quota: u32,
    window: Duration,
    pings: Arc<AtomicU64>,
    alive: Arc<()>,
}

impl Counter {
    async fn new(server: &RedisServer, quota: u32, window: Duration, kind: Kind) -> Counter {
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
const TIMEOUT: Duration = Duration::from_millis(250);

/// The bound on any one call: the timeout, plus a generous second for a loaded machine.
const CALL_BOUND: Duration = Duration::from_millis(250 + 1000);

/// Back on Redis within 1 s of Redis answering (pings every 100 ms), plus slack.
const BACK_WITHIN: Duration = Duration::from_millis(1500);

/// Runs a test body under an outer limit, so that a hang is a failure, not a stuck run.
async fn guarded(body: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(20), body)
        .await
        .expect("the test hung: a call or a mode switch never finished");
}

/// One check, asserting that it answered (no error) within [`CALL_BOUND`]; true if granted.
async fn answered(fb: &Fallback<Counter>, key: &str) -> bool {
    let t = Instant::now();
    let r = fb.check(key).await;
    let took = t.elapsed();
    assert!(took < CALL_BOUND, "a call took {took:?}");
    r.unwrap_or_else(|e| panic!("an error reached the caller: {e:?}"))
        .is_ok()
}

/// `calls` checks of `key`; how many were granted.
async fn granted(fb: &Fallback<Counter>, key: &str, calls: u32) -> u32 {
    let mut g = 0;
    for _ in 0..calls {
        g += u32::from(answered(fb, key).await);
    }
    g
}

/// Polls the mode every 10 ms until it is `want`, failing after `limit`; returns the wait.
async fn wait_for(fb: &Fallback<Counter>, want: Mode, limit: Duration) -> Duration {
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

fn get(server: &RedisServer, key: &str) -> String {
    server.cli(&["get", key])
}

#[tokio::test]
async fn redis_mode_answers_from_redis() {
    let Some(server) = RedisServer::start("redis_mode_answers_from_redis") else {
        return;
    };
    guarded(async {
        let c = Counter::new(&server, 3, Duration::from_secs(60), Kind::Count).await;
        let fb = Fallback::builder(c).timeout(TIMEOUT).build().unwrap();
        assert_eq!(fb.mode(), Mode::Redis);
        for i in 1..=3 {
            assert_eq!(fb.check("a").await.unwrap(), Ok(()));
            assert_eq!(get(&server, "a"), i.to_string(), "counted in Redis");
        }
        let denied = fb.check("a").await.unwrap().unwrap_err();
        let wait = denied.retry_after().expect("the server's retry-after");
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(60));
        assert_eq!(get(&server, "a"), "3");
        assert_eq!(fb.check_n("b", 2).await.unwrap(), Ok(()));
        assert_eq!(get(&server, "b"), "2");
        assert_eq!(fb.mode(), Mode::Redis);
        assert_eq!(fb.switches_to_fallback(), 0);
        assert_eq!(fb.last_switch(), None);
        assert!(
            fb.local().is_empty(),
            "no local limiter while Redis answers"
        );
        assert_eq!(
            fb.limiter().pings.load(Ordering::Relaxed),
            0,
            "no health check"
        );
    })
    .await;
}

#[tokio::test]
async fn a_killed_server_is_answered_in_process_and_a_restarted_one_takes_over_again() {
    let Some(mut server) = RedisServer::start(
        "a_killed_server_is_answered_in_process_and_a_restarted_one_takes_over_again",
    ) else {
        return;
    };
    guarded(async {
        let c = Counter::new(&server, 5, Duration::from_secs(60), Kind::Count).await;
        let fb = Fallback::builder(c).timeout(TIMEOUT).build().unwrap();
        assert_eq!(granted(&fb, "k", 2).await, 2);
        assert_eq!(get(&server, "k"), "2");

        server.kill();
        let killed = Instant::now();
        // Every call answers, from the fallback: a fresh local window of 5 (share 1).
        assert_eq!(granted(&fb, "k", 12).await, 5);
        assert_eq!(fb.mode(), Mode::Fallback);
        assert_eq!(fb.switches_to_fallback(), 1);
        let down = fb.last_switch().expect("the switch to fallback is dated");
        assert!(down >= killed && down <= Instant::now());
        assert_eq!(fb.local().len(), 1);
        // Bad input is still bad input in fallback mode.
        assert!(matches!(fb.check("").await, Err(RedisLimitError::EmptyKey)));

        server.restart();
        let took = wait_for(&fb, Mode::Redis, BACK_WITHIN).await;
        eprintln!("back on Redis {took:?} after the restart answered");
        assert_eq!(fb.switches_to_redis(), 1);
        assert!(fb.last_switch().unwrap() > down, "the return is dated");
        assert_eq!(granted(&fb, "k", 1).await, 1);
        assert_eq!(
            get(&server, "k"),
            "1",
            "counted in the restarted (empty) Redis"
        );

        // The local limiters persist across outages: the next one finds "k" used up.
        server.kill();
        assert_eq!(granted(&fb, "k", 3).await, 0);
        assert_eq!(granted(&fb, "fresh", 6).await, 5);
        assert_eq!(fb.mode(), Mode::Fallback);
        assert_eq!(fb.switches_to_fallback(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_stalled_server_times_out_into_the_fallback_and_back() {
    let Some(server) = RedisServer::start("a_stalled_server_times_out_into_the_fallback_and_back")
    else {
        return;
    };
    guarded(async {
        let c = Counter::new(&server, 5, Duration::from_secs(60), Kind::Count).await;
        let fb = Fallback::builder(c).timeout(TIMEOUT).build().unwrap();
        assert_eq!(granted(&fb, "s", 1).await, 1);

        server.pause();
        // The first call waits out the timeout, then it and the rest answer in process.
        assert_eq!(granted(&fb, "s", 8).await, 5);
        assert_eq!(fb.mode(), Mode::Fallback);
        assert_eq!(fb.switches_to_fallback(), 1);
        // Pings time out too (each within the timeout, so they keep coming): still in
        // fallback a few intervals later.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert_eq!(fb.mode(), Mode::Fallback);
        let pinged = fb.limiter().pings.load(Ordering::Relaxed);
        assert!(
            pinged >= 2,
            "{pinged} pings: one hung instead of timing out"
        );

        server.resume();
        wait_for(&fb, Mode::Redis, BACK_WITHIN).await;
        assert_eq!(fb.switches_to_redis(), 1);
        let before: u32 = get(&server, "s").parse().unwrap();
        assert_eq!(granted(&fb, "s", 1).await, 1);
        let after: u32 = get(&server, "s").parse().unwrap();
        // (The call that timed out was sent, so Redis may have counted it late.)
        assert_eq!(after, before + 1, "counted in Redis again");
    })
    .await;
}

#[tokio::test]
async fn errors_that_are_not_connectivity_are_returned_in_redis_mode() {
    let Some(server) =
        RedisServer::start("errors_that_are_not_connectivity_are_returned_in_redis_mode")
    else {
        return;
    };
    guarded(async {
        let window = Duration::from_secs(60);
        let broken = Counter::new(&server, 5, window, Kind::ScriptError).await;
        let fb = Fallback::builder(broken).timeout(TIMEOUT).build().unwrap();
        for _ in 0..3 {
            let e = fb.check("x").await.unwrap_err();
            assert!(!e.is_connectivity(), "{e:?}");
            assert!(e.to_string().contains("broken limiter"), "{e}");
        }
        assert_eq!(fb.mode(), Mode::Redis);

        let odd = Counter::new(&server, 5, window, Kind::Unexpected).await;
        let fb2 = Fallback::builder(odd).timeout(TIMEOUT).build().unwrap();
        assert!(matches!(
            fb2.check("x").await,
            Err(RedisLimitError::UnexpectedReply(_))
        ));

        let good = Counter::new(&server, 5, window, Kind::Count).await;
        let fb3 = Fallback::builder(good).timeout(TIMEOUT).build().unwrap();
        assert!(matches!(
            fb3.check("").await,
            Err(RedisLimitError::EmptyKey)
        ));
        assert!(matches!(
            fb3.check_n("x", 6).await,
            Err(RedisLimitError::ExceedsBurst { n: 6, burst: 5 })
        ));

        for f in [&fb, &fb2, &fb3] {
            assert_eq!(f.mode(), Mode::Redis, "an answer is not an outage");
            assert_eq!(f.switches_to_fallback(), 0);
            assert!(f.local().is_empty(), "nothing was answered in process");
        }
        // No health check was started (it would have pinged by now).
        tokio::time::sleep(Duration::from_millis(250)).await;
        for f in [&fb, &fb2, &fb3] {
            assert_eq!(f.limiter().pings.load(Ordering::Relaxed), 0);
        }
    })
    .await;
}

#[tokio::test]
async fn the_share_scales_what_each_process_admits_in_fallback() {
    let Some(mut server) =
        RedisServer::start("the_share_scales_what_each_process_admits_in_fallback")
    else {
        return;
    };
    guarded(async {
        let window = Duration::from_secs(60);
        let quarter = Fallback::builder(Counter::new(&server, 100, window, Kind::Count).await)
            .timeout(TIMEOUT)
            .share(0.25)
            .build()
            .unwrap();
        let fleet = Fallback::builder(Counter::new(&server, 100, window, Kind::Count).await)
            .timeout(TIMEOUT)
            .fleet_size(4)
            .build()
            .unwrap();
        let whole = Fallback::builder(Counter::new(&server, 100, window, Kind::Count).await)
            .timeout(TIMEOUT)
            .build()
            .unwrap();
        assert_eq!(quarter.share(), 0.25);
        assert_eq!(fleet.share(), 0.25);
        assert_eq!(whole.share(), 1.0);

        server.kill();
        assert_eq!(granted(&quarter, "q", 150).await, 25);
        assert_eq!(granted(&fleet, "q", 150).await, 25);
        assert_eq!(granted(&whole, "q", 150).await, 100);
        for f in [&quarter, &fleet, &whole] {
            assert_eq!(f.mode(), Mode::Fallback);
        }
    })
    .await;
}

#[tokio::test]
async fn one_health_check_however_many_calls_fail_at_once() {
    let Some(mut server) = RedisServer::start("one_health_check_however_many_calls_fail_at_once")
    else {
        return;
    };
    guarded(async {
        let c = Counter::new(&server, 1000, Duration::from_secs(60), Kind::Count).await;
        let fb = Fallback::builder(c).timeout(TIMEOUT).build().unwrap();
        assert_eq!(granted(&fb, "m", 1).await, 1);

        server.kill();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..20 {
            let fb = fb.clone();
            tasks.spawn(async move { answered(&fb, "m").await });
        }
        let mut g = 0;
        while let Some(r) = tasks.join_next().await {
            g += u32::from(r.expect("no panic"));
        }
        assert_eq!(g, 20);
        assert_eq!(fb.mode(), Mode::Fallback);
        assert_eq!(
            fb.switches_to_fallback(),
            1,
            "one switch, however many failed"
        );

        // One health check pings about 10 times a second; 20 would ping about 200 times.
        let p0 = fb.limiter().pings.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let pinged = fb.limiter().pings.load(Ordering::Relaxed) - p0;
        assert!((1..=15).contains(&pinged), "{pinged} pings in 1 s");
    })
    .await;
}

#[tokio::test]
async fn the_health_check_stops_when_the_limiter_is_dropped() {
    let Some(mut server) = RedisServer::start("the_health_check_stops_when_the_limiter_is_dropped")
    else {
        return;
    };
    guarded(async {
        let c = Counter::new(&server, 5, Duration::from_secs(60), Kind::Count).await;
        let pings = c.pings.clone();
        let alive: Weak<()> = Arc::downgrade(&c.alive);
        let fb = Fallback::builder(c).timeout(TIMEOUT).build().unwrap();

        server.kill();
        assert!(answered(&fb, "d").await);
        assert_eq!(fb.mode(), Mode::Fallback);
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(pings.load(Ordering::Relaxed) >= 1, "the health check runs");

        drop(fb);
        // A ping in flight may finish (within the timeout); then nothing holds the limiter.
        tokio::time::sleep(TIMEOUT + Duration::from_millis(300)).await;
        assert!(
            alive.upgrade().is_none(),
            "the task keeps the limiter alive"
        );
        let p = pings.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(pings.load(Ordering::Relaxed), p, "pings after the drop");
    })
    .await;
}

/// Records every event of turnstile's with its level and fields, as `LEVEL field=value ...` lines.
#[derive(Clone, Default)]
struct Events(Arc<std::sync::Mutex<Vec<String>>>);

impl tracing::Subscriber for Events {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Line(String);
        impl tracing::field::Visit for Line {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={:?}", f.name(), v));
            }
        }
        if !event.metadata().target().starts_with("turnstile") {
            return;
        }
        let mut line = Line(event.metadata().level().to_string());
        event.record(&mut line);
        self.0.lock().unwrap().push(line.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn each_switch_is_a_tracing_event() {
    let Some(mut server) = RedisServer::start("each_switch_is_a_tracing_event") else {
        return;
    };
    // A current-thread runtime: the health check runs on this thread, under this default.
    let events = Events::default();
    let _guard = tracing::subscriber::set_default(events.clone());
    guarded(async {
        let c = Counter::new(&server, 5, Duration::from_secs(60), Kind::Count).await;
        let fb = Fallback::builder(c).timeout(TIMEOUT).build().unwrap();
        assert!(answered(&fb, "t").await);
        assert!(
            events.0.lock().unwrap().is_empty(),
            "nothing to say in Redis mode"
        );

        server.kill();
        assert!(answered(&fb, "t").await);
        assert!(answered(&fb, "t").await);
        {
            let seen = events.0.lock().unwrap();
            assert_eq!(seen.len(), 1, "one event for the switch: {seen:?}");
            assert!(seen[0].starts_with("WARN"), "{seen:?}");
            assert!(
                seen[0].contains(" error="),
                "the error is in the event: {seen:?}"
            );
        }

        server.restart();
        wait_for(&fb, Mode::Redis, BACK_WITHIN).await;
        let seen = events.0.lock().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[1].starts_with("INFO"), "{seen:?}");
        assert!(seen[1].contains(" outage="), "{seen:?}");
    })
    .await;
}

#[tokio::test]
async fn bad_settings_are_typed_errors_not_panics() {
    let Some(server) = RedisServer::start("bad_settings_are_typed_errors_not_panics") else {
        return;
    };
    guarded(async {
        let window = Duration::from_secs(60);
        let counter = || Counter::new(&server, 10, window, Kind::Count);
        let err = |b: turnstile::redis::FallbackBuilder<Counter>| b.build().unwrap_err();
        assert_eq!(
            err(Fallback::builder(counter().await).timeout(Duration::ZERO)),
            ConfigError::ZeroTimeout
        );
        assert_eq!(
            err(Fallback::builder(counter().await).ping_every(Duration::ZERO)),
            ConfigError::ZeroTimeout
        );
        assert_eq!(
            err(Fallback::builder(counter().await).share(1.5)),
            ConfigError::InvalidShare(1.5)
        );
        assert!(matches!(
            err(Fallback::builder(counter().await).share(f64::NAN)),
            ConfigError::InvalidShare(s) if s.is_nan()
        ));
        assert_eq!(
            err(Fallback::builder(counter().await).fleet_size(0)),
            ConfigError::InvalidShare(f64::INFINITY)
        );
        // The first invalid setting is the one reported; a later valid one does not hide it.
        assert_eq!(
            err(Fallback::builder(counter().await).share(0.0).share(0.5)),
            ConfigError::InvalidShare(0.0)
        );
        assert!(Fallback::builder(counter().await)
            .fleet_size(4)
            .build()
            .is_ok());
    })
    .await;
}
