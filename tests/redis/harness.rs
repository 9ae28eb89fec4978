//! The Redis tests' own servers (tests/common/redis_server.rs): a server starts on a free
//! loopback port with no persistence, survives a kill and restart on its port, pauses, and a
//! three-master cluster comes up with every slot covered.
#![cfg(feature = "redis")]

use crate::common;

use common::redis_server::{ping, RedisCluster, RedisServer};

#[test]
fn a_server_of_its_own_on_loopback_without_persistence() {
    let Some(mut s) = RedisServer::start("a_server_of_its_own_on_loopback_without_persistence")
    else {
        return;
    };
    assert_ne!(s.port, 6379);
    assert!(ping(s.port));
    assert_eq!(s.cli(&["config", "get", "save"]), "save");
    assert_eq!(s.cli(&["config", "get", "appendonly"]), "appendonly\nno");
    s.cli(&["set", "k", "1"]);
    s.kill();
    assert!(!ping(s.port));
    s.restart();
    assert_eq!(s.cli(&["get", "k"]), "", "restarted empty");
    s.pause();
    assert!(!ping(s.port), "a paused server answers nothing");
    s.resume();
    assert!(ping(s.port));
}

#[test]
fn a_three_master_cluster_covers_every_slot() {
    let Some(c) = RedisCluster::start("a_three_master_cluster_covers_every_slot", 3) else {
        return;
    };
    let info = c.nodes[0].cli(&["cluster", "info"]);
    assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    assert!(info.contains("cluster_known_nodes:3"), "{info}");
}

/// `turnstile::redis::connect` reconnects within the 100 ms backoff it sets: a restarted
/// server answers the same connection again well within a second.
#[tokio::test]
async fn connect_reconnects_promptly_after_a_restart() {
    use std::time::{Duration, Instant};
    let Some(mut s) = RedisServer::start("connect_reconnects_promptly_after_a_restart") else {
        return;
    };
    let mut con = turnstile::redis::connect(&s.url()).await.unwrap();
    let pong: String = redis::cmd("PING").query_async(&mut con).await.unwrap();
    assert_eq!(pong, "PONG");
    s.restart();
    let start = Instant::now();
    loop {
        let r: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut con).await;
        if r.is_ok() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "no reconnect: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `turnstile::redis::connect_cluster` reaches every master: a limiter's keys spread over
/// the slots all answer.
#[tokio::test]
async fn connect_cluster_reaches_every_master() {
    use turnstile::redis::{Gcra, RedisLimiter};
    use turnstile::Limit;
    let Some(c) = RedisCluster::start("connect_cluster_reaches_every_master", 3) else {
        return;
    };
    let urls = c.urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let con = turnstile::redis::connect_cluster(&urls).await.unwrap();
    // One a minute: each key lives a minute after its grant, long enough to be counted.
    let gcra = Gcra::new(con, Limit::every(std::time::Duration::from_secs(60)), 5).unwrap();
    for k in 0..30 {
        assert!(gcra
            .try_check_n(&format!("client-{k}"), 1)
            .await
            .unwrap()
            .is_ok());
    }
    let holding = c
        .nodes
        .iter()
        .filter(|n| n.cli(&["dbsize"]).parse::<u64>().unwrap() > 0)
        .count();
    assert_eq!(holding, 3, "keys on every master");
}

/// A port taken between the free-port check and the server's bind (another test's connection
/// drew it as an ephemeral port) makes redis-server exit at start: the harness sees the exit
/// at once rather than waiting 10 s for a PING, and starts on another port.
#[test]
fn a_taken_port_is_seen_at_once_and_another_is_used() {
    if !common::redis_server::available("a_taken_port_is_seen_at_once_and_another_is_used") {
        return;
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let t0 = std::time::Instant::now();
    assert!(RedisServer::try_start_on(port, &[]).is_none());
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(9),
        "seen before the PING timeout"
    );
    drop(taken);
}
