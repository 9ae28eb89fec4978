//! `Fallback` over the real Redis limiters other than the token bucket (whose own test file
//! has its case): `redis::Gcra` and `redis::FixedWindow` answer from Redis, from their
//! in-process twin at the fleet share while the server is down, and from Redis again once it
//! is back.
#![cfg(feature = "redis")]

mod common;

use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use turnstile::redis::{self, Fallback, FixedWindow, Gcra, Mode, RedisLimiter};
use turnstile::Limit;

/// Kill, answer in process, restart, back on Redis: the same steps for any limiter whose
/// fallback share admits exactly `local_burst` checks of one key at once.
async fn through_an_outage<L: RedisLimiter + 'static>(
    s: &mut RedisServer,
    limiter: L,
    key_in_redis: &str,
    local_burst: u32,
) {
    let f = Fallback::builder(limiter)
        .timeout(Duration::from_millis(300))
        .fleet_size(2)
        .build()
        .unwrap();
    assert!(f.check("k").await.unwrap().is_ok(), "answered by Redis");
    assert_eq!(s.cli(&["exists", key_in_redis]), "1");
    assert_eq!(f.mode(), Mode::Redis);

    s.kill();
    for i in 0..local_burst {
        assert!(f.check("k").await.unwrap().is_ok(), "local grant {i}");
    }
    assert_eq!(f.mode(), Mode::Fallback);
    assert!(
        f.check("k").await.unwrap().is_err(),
        "the share's burst is spent"
    );

    s.restart();
    let restarted = Instant::now();
    while f.mode() != Mode::Redis {
        assert!(
            restarted.elapsed() < Duration::from_secs(5),
            "still in fallback"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(f.check("k").await.unwrap().is_ok(), "a fresh server grants");
    assert_eq!(
        s.cli(&["exists", key_in_redis]),
        "1",
        "counted in Redis again"
    );
}

#[tokio::test]
async fn gcra_through_an_outage() {
    let Some(mut s) = RedisServer::start("gcra_through_an_outage") else {
        return;
    };
    let con = redis::connect(&s.url()).await.unwrap();
    // One a minute, bursts of 6: the fleet share of 2 admits 3 at once.
    let g = Gcra::builder(Limit::every(Duration::from_secs(60)), 6)
        .prefix("g:")
        .build(con)
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        through_an_outage(&mut s, g, "g:k", 3),
    )
    .await
    .expect("no hang");
}

#[tokio::test]
async fn fixed_window_through_an_outage() {
    let Some(mut s) = RedisServer::start("fixed_window_through_an_outage") else {
        return;
    };
    let con = redis::connect(&s.url()).await.unwrap();
    // 10 a minute: the fleet share of 2 admits 5.
    let w = FixedWindow::builder(con, 10, Duration::from_secs(60))
        .prefix("w:")
        .build()
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        through_an_outage(&mut s, w, "w:k", 5),
    )
    .await
    .expect("no hang");
}
