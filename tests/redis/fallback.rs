//! `turnstile::redis::Fallback` against a real redis-server (tests/common/redis_server.rs):
//! answers from Redis while it answers; on a kill or a stall (SIGSTOP) it answers every call
//! from the in-process limiters, with no error reaching the caller and each call bounded by
//! the timeout; it goes back to Redis within a second of Redis answering again;
//! misconfigurations are answered in process without leaving Redis mode; the share scales
//! the fallback; the local map is bounded by default; one health check runs at a time and
//! stops with the limiter.
//!
//! These tests wrap a small counter limiter of their own (`Counter` in
//! `tests/common/redis_counter.rs`: a quota per window, counted by a Lua script), enough to
//! drive every path for real; the tracing events are checked alone in their own binary
//! (`tests/redis_fallback_tracing.rs`). Every test runs under an outer timeout, so a hang
//! fails it.
#![cfg(feature = "redis")]

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use common::redis_counter::*;
use common::redis_server::RedisServer;
use turnstile::redis::{Fallback, Mode, RedisLimitError};
use turnstile::ConfigError;

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
        assert_eq!(fb.stats().switches_to_fallback, 0);
        assert_eq!(fb.stats().last_switch, None);
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
        assert_eq!(fb.stats().switches_to_fallback, 1);
        let down = fb
            .stats()
            .last_switch
            .expect("the switch to fallback is dated");
        assert!(down >= killed && down <= Instant::now());
        assert_eq!(fb.local().len(), 1);
        // Bad input is still bad input in fallback mode.
        assert!(matches!(fb.check("").await, Err(RedisLimitError::EmptyKey)));

        server.restart();
        let took = wait_for(&fb, Mode::Redis, BACK_WITHIN).await;
        eprintln!("back on Redis {took:?} after the restart answered");
        assert_eq!(fb.stats().switches_to_redis, 1);
        assert!(
            fb.stats().last_switch.unwrap() > down,
            "the return is dated"
        );
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
        assert_eq!(fb.stats().switches_to_fallback, 2);
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
        assert_eq!(fb.stats().switches_to_fallback, 1);
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
        assert_eq!(fb.stats().switches_to_redis, 1);
        let before: u32 = get(&server, "s").parse().unwrap();
        assert_eq!(granted(&fb, "s", 1).await, 1);
        let after: u32 = get(&server, "s").parse().unwrap();
        // (The call that timed out was sent, so Redis may have counted it late.)
        assert_eq!(after, before + 1, "counted in Redis again");
    })
    .await;
}

#[tokio::test]
async fn misconfigurations_are_answered_in_process_without_leaving_redis_mode() {
    let Some(server) =
        RedisServer::start("misconfigurations_are_answered_in_process_without_leaving_redis_mode")
    else {
        return;
    };
    guarded(async {
        let window = Duration::from_secs(60);
        // A script error on every call: answered by the local limiter (quota 5), counted,
        // and Redis is tried again on every call (the mode stays).
        let broken = Counter::new(&server, 5, window, Kind::ScriptError).await;
        let fb = Fallback::builder(broken).timeout(TIMEOUT).build().unwrap();
        let verdicts: Vec<bool> = {
            let mut v = Vec::new();
            for _ in 0..7 {
                v.push(fb.check("x").await.expect("answered in process").is_ok());
            }
            v
        };
        assert_eq!(verdicts, [true, true, true, true, true, false, false]);
        assert_eq!(fb.stats().misconfigurations, 7);
        assert_eq!(fb.local().len(), 1, "the key's local limiter answered");

        let odd = Counter::new(&server, 5, window, Kind::Unexpected).await;
        let fb2 = Fallback::builder(odd).timeout(TIMEOUT).build().unwrap();
        assert!(fb2.check("x").await.unwrap().is_ok());
        assert_eq!(fb2.stats().misconfigurations, 1);

        // Bad input is still the caller's.
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
        assert!(fb3.local().is_empty(), "nothing was answered in process");
        assert_eq!(fb3.stats().misconfigurations, 0);

        for f in [&fb, &fb2, &fb3] {
            assert_eq!(f.mode(), Mode::Redis, "a misconfiguration is not an outage");
            assert_eq!(f.stats().switches_to_fallback, 0);
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
            fb.stats().switches_to_fallback,
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

/// The local map holds 100 000 keys unless told otherwise (and a call waits 100 ms, the other
/// default the docs state); a new key that finds it full is refused with a retry time (the
/// next sweep), the keys in it keep theirs.
#[tokio::test]
async fn the_local_map_is_bounded_by_default() {
    let Some(mut server) = RedisServer::start("the_local_map_is_bounded_by_default") else {
        return;
    };
    guarded(async {
        let c = Counter::new(&server, 5, Duration::from_secs(60), Kind::Count).await;
        let fb = Fallback::new(c);
        assert_eq!(fb.local().max_keys(), 100_000);
        assert_eq!(fb.timeout(), Duration::from_millis(100));
        let c = Counter::new(&server, 5, Duration::from_secs(60), Kind::Count).await;
        let fb = Fallback::builder(c)
            .timeout(TIMEOUT)
            .max_keys(2)
            .build()
            .unwrap();
        server.kill();
        assert!(answered(&fb, "a").await);
        assert!(answered(&fb, "b").await);
        assert_eq!(fb.mode(), Mode::Fallback);
        let full = fb.check("c").await.unwrap().unwrap_err();
        assert!(
            full.retry_after().is_some(),
            "a full map says when to retry"
        );
        assert!(
            answered(&fb, "a").await,
            "keys in the map keep their limits"
        );
        assert_eq!(fb.local().len(), 2);
    })
    .await;
}
