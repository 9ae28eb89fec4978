//! The Redis tests' own servers (tests/common/redis_server.rs): a server starts on a free
//! loopback port with no persistence, survives a kill and restart on its port, pauses, and a
//! three-master cluster comes up with every slot covered.
#![cfg(feature = "redis")]

mod common;

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
