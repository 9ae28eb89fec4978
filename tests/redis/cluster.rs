//! `turnstile::redis::Gcra` on a 3-master Redis Cluster (tests/common/redis_server.rs), through
//! redis-rs's async `ClusterConnection`: keys spread over every master, a key answered through
//! a `MOVED` after its slot migrates (with its state: a denied key stays denied), and the
//! script reloaded on every master after `SCRIPT FLUSH`.
#![cfg(feature = "redis")]

use crate::common;

use std::time::Duration;

use common::redis_server::RedisCluster;
use redis::cluster_async::ClusterConnection;
use turnstile::redis::{Gcra, RedisLimiter};
use turnstile::Limit;

async fn connect(c: &RedisCluster) -> ClusterConnection {
    redis::cluster::ClusterClient::new(c.urls())
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection")
}

fn per_minute() -> Limit {
    Limit::every(Duration::from_secs(60))
}

/// The master (index into `c.nodes`) that owns `slot`, by its `CLUSTER NODES` line.
fn owner(c: &RedisCluster, slot: u16) -> usize {
    let nodes = c.nodes[0].cli(&["cluster", "nodes"]);
    for line in nodes.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let port: u16 = f[1]
            .split('@')
            .next()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let owns = f[8..].iter().any(|r| {
            if r.starts_with('[') {
                return false; // a slot being migrated or imported
            }
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            (lo.parse::<u16>().unwrap()..=hi.parse::<u16>().unwrap()).contains(&slot)
        });
        if owns {
            return c.nodes.iter().position(|n| n.port == port).unwrap();
        }
    }
    panic!("no owner of slot {slot} in\n{nodes}");
}

/// `MOVED` errors a node has answered (`INFO errorstats`).
fn moved_count(c: &RedisCluster, node: usize) -> u64 {
    let info = c.nodes[node].cli(&["info", "errorstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_MOVED:count="))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test]
async fn many_keys_over_every_master() {
    let Some(c) = RedisCluster::start("many_keys_over_every_master", 3) else {
        return;
    };
    let g = Gcra::builder(per_minute(), 2)
        .prefix("gcra:")
        .build(connect(&c).await)
        .unwrap();
    g.ping().await.expect("PING on a cluster");
    let keys: Vec<String> = (0..150).map(|i| format!("user-{i}")).collect();
    for k in &keys {
        assert!(g.throttle(k, 1).await.unwrap().allowed, "{k}");
        let t = g.throttle(k, 1).await.unwrap();
        assert!(t.allowed && t.remaining == 0, "{k}: {t:?}");
        let t = g.throttle(k, 1).await.unwrap();
        assert!(!t.allowed && t.retry_after.is_some(), "{k}: {t:?}");
        assert!(g.try_check_n(k, 1).await.unwrap().is_err(), "{k}");
    }
    // Every master holds some of them (the keys spread over the slots).
    let per_node: Vec<u64> = c
        .nodes
        .iter()
        .map(|n| n.cli(&["dbsize"]).parse().unwrap())
        .collect();
    assert_eq!(per_node.iter().sum::<u64>(), 150, "{per_node:?}");
    assert!(per_node.iter().all(|&k| k > 20), "{per_node:?}");
    // Keys with one hash tag share a slot, so one master.
    for i in 0..10 {
        assert!(
            g.throttle(&format!("{{tenant}}:{i}"), 2)
                .await
                .unwrap()
                .allowed
        );
    }
}

#[tokio::test]
async fn a_key_keeps_its_state_through_a_moved() {
    let Some(c) = RedisCluster::start("a_key_keeps_its_state_through_a_moved", 3) else {
        return;
    };
    let g = Gcra::new(connect(&c).await, per_minute(), 3).unwrap();
    let key = "migrating";
    let rkey = g.redis_key(key);
    assert!(g.throttle(key, 3).await.unwrap().allowed);
    let before = g.throttle(key, 1).await.unwrap();
    assert!(!before.allowed, "{before:?}");

    let slot: u16 = c.nodes[0]
        .cli(&["cluster", "keyslot", &rkey])
        .parse()
        .unwrap();
    let src = owner(&c, slot);
    let dst = (src + 1) % 3;
    let id = |i: usize| c.nodes[i].cli(&["cluster", "myid"]);
    let (src_id, dst_id) = (id(src), id(dst));
    let slot = slot.to_string();
    assert_eq!(
        c.nodes[dst].cli(&["cluster", "setslot", &slot, "importing", &src_id]),
        "OK"
    );
    assert_eq!(
        c.nodes[src].cli(&["cluster", "setslot", &slot, "migrating", &dst_id]),
        "OK"
    );
    let port = c.nodes[dst].port.to_string();
    let migrated = c.nodes[src].cli(&[
        "migrate",
        "127.0.0.1",
        &port,
        "",
        "0",
        "5000",
        "KEYS",
        &rkey,
    ]);
    assert_eq!(migrated, "OK");
    for n in &c.nodes {
        assert_eq!(n.cli(&["cluster", "setslot", &slot, "node", &dst_id]), "OK");
    }
    assert_eq!(owner(&c, slot.parse().unwrap()), dst);
    assert_eq!(
        c.nodes[dst].cli(&["exists", &rkey]),
        "1",
        "moved with its slot"
    );
    let moved_before = moved_count(&c, src);

    // The connection still maps the slot to `src`: it gets MOVED, follows it, and finds the
    // state there, TAT and TTL: still denied, the same retry time less the time spent.
    let after = g.throttle(key, 1).await.unwrap();
    assert!(!after.allowed, "{after:?}");
    assert_eq!(after.remaining, 0);
    let (r0, r1) = (before.retry_after.unwrap(), after.retry_after.unwrap());
    assert!(
        r1 <= r0 && r1 + Duration::from_secs(2) > r0,
        "{r0:?} then {r1:?}"
    );
    assert!(moved_count(&c, src) > moved_before, "a MOVED was answered");
    let pttl: i64 = c.nodes[dst].cli(&["pttl", &rkey]).parse().unwrap();
    assert!(pttl > 170_000 && pttl <= 180_000, "TTL kept: {pttl}");
    // Other keys of that slot, and of others, keep working.
    assert!(g.throttle("fresh", 3).await.unwrap().allowed);
    assert!(g.peek(key).await.unwrap().allowed);
    assert!(g.try_check_n(key, 1).await.unwrap().is_err());
}

#[tokio::test]
async fn script_flush_on_every_master_reloads_transparently() {
    let Some(c) = RedisCluster::start("script_flush_on_every_master_reloads_transparently", 3)
    else {
        return;
    };
    let g = Gcra::new(connect(&c).await, per_minute(), 3).unwrap();
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    for k in &keys {
        assert_eq!(g.throttle(k, 1).await.unwrap().remaining, 2);
    }
    for n in &c.nodes {
        assert_eq!(n.cli(&["script", "flush"]), "OK");
    }
    for k in &keys {
        assert_eq!(g.throttle(k, 1).await.unwrap().remaining, 1, "{k}");
    }
    // Flushed on one master only: its keys reload, the others never notice.
    assert_eq!(c.nodes[1].cli(&["script", "flush"]), "OK");
    for k in &keys {
        let t = g.throttle(k, 1).await.unwrap();
        assert!(t.allowed && t.remaining == 0, "{k}: {t:?}");
        assert!(!g.throttle(k, 1).await.unwrap().allowed, "{k}");
    }
}
