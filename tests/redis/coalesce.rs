//! `turnstile::redis::Coalesce` against a real redis-server of each test's own: a batch is
//! forced (the server stopped with SIGSTOP while checks queue behind the call in flight) and
//! must decide exactly what the same checks decide one by one; checks dropped while queued
//! take nothing and never strand the checks behind them; the shared-limit bound holds under
//! load from four processes' worth of coalescing clients; bad input never enters a batch.
#![cfg(feature = "redis")]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::redis_shared::{self, patient, patient_connection};
use turnstile::redis::{Coalesce, Fallback, Gcra, RedisLimitError, RedisLimiter, Throttle};
use turnstile::Limit;

/// One permit an hour: the real time a test takes refills nothing that counts.
fn hourly() -> Limit {
    Limit::every(Duration::from_secs(3600))
}

async fn gcra(s: &RedisServer, burst: u32) -> Gcra {
    let con = turnstile::redis::connect_with(&s.url(), &patient_connection())
        .await
        .expect("connect");
    let g = Gcra::new(con, hourly(), burst).unwrap();
    g.peek("warm-up").await.expect("script loaded");
    g
}

/// Waits (yielding to the runtime) until `c` has `n` checks queued.
async fn until_queued(c: &Coalesce<Gcra>, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.stats().queued != n {
        assert!(
            Instant::now() < deadline,
            "{:?}, waiting for {n}",
            c.stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until `c` has sent `n` calls (the first check of a key holds it once sent).
async fn until_sent(c: &Coalesce<Gcra>, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.stats().calls != n {
        assert!(
            Instant::now() < deadline,
            "{:?}, waiting for {n} calls",
            c.stats()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// `fut`, or a failure after 20 s instead of a hang (a stranded queue never answers).
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("answered within 20 s: a queue was stranded")
}

/// Request sizes for the forced batch: enough demand to run the burst out midway, mixed so
/// that a denied large request is followed by an allowed smaller one.
fn sizes(count: usize) -> Vec<u32> {
    (0..count).map(|i| [3, 1, 2, 4, 1, 3, 1][i % 7]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_batch_decides_what_the_same_checks_decide_one_by_one() {
    let Some(s) =
        RedisServer::start("a_forced_batch_decides_what_the_same_checks_decide_one_by_one")
    else {
        return;
    };
    // The sizes sum to 15 per 7 requests: 150 after 70, so the 71st (3) is denied and the
    // 72nd (1) takes the last permit.
    const BURST: u32 = 151;
    let ns = sizes(200);
    let c = Arc::new(patient(gcra(&s, BURST).await));

    // The server stops: the first check's call hangs in flight and the others queue behind
    // it, in a known order (each is queued before the next is spawned).
    s.pause();
    let mut tasks = Vec::new();
    for (i, &n) in ns.iter().enumerate() {
        let c2 = c.clone();
        tasks.push(tokio::spawn(
            async move { c2.try_check_n("batched", n).await },
        ));
        if i == 0 {
            until_sent(&c, 1).await;
        } else {
            until_queued(&c, i as u64).await;
        }
    }
    s.resume();
    let mut batched = Vec::new();
    for t in tasks {
        batched.push(
            within(t)
                .await
                .unwrap()
                .expect("no infrastructure error")
                .is_ok(),
        );
    }
    let stats = c.stats();
    assert_eq!(
        (stats.checks, stats.calls, stats.queued),
        (200, 2, 0),
        "{stats:?}"
    );

    // The same requests, one call each, in the same order, on another key.
    let g = c.limiter();
    let mut alone = Vec::new();
    let mut answers: Vec<Throttle> = Vec::new();
    for &n in &ns {
        let t = g.throttle("alone", n).await.unwrap();
        alone.push(t.allowed);
        answers.push(t);
    }
    assert_eq!(batched, alone);
    // The interesting cases happened: the burst ran out, and after a denial a smaller
    // request still passed (a batch is not one request for the sum).
    let granted: u32 = ns.iter().zip(&alone).filter(|p| *p.1).map(|p| *p.0).sum();
    assert_eq!(granted, BURST, "the burst is used up exactly");
    assert!(alone.contains(&false));
    assert!(
        alone.windows(2).any(|w| !w[0] && w[1]),
        "a denial followed by a grant: {alone:?}"
    );
    // And the two keys hold the same: nothing left.
    assert_eq!(g.peek("batched").await.unwrap().remaining, 0);
    assert_eq!(g.peek("alone").await.unwrap().remaining, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_checks_take_nothing_and_never_strand_the_queue() {
    let Some(s) = RedisServer::start("dropped_checks_take_nothing_and_never_strand_the_queue")
    else {
        return;
    };
    const BURST: u32 = 100;
    let c = Arc::new(patient(gcra(&s, BURST).await));
    s.pause();
    // The leader (5 permits) and 10 queued checks of 2 permits each.
    let spawn = |n: u32| {
        let c = c.clone();
        tokio::spawn(async move { c.try_check_n("k", n).await })
    };
    let leader = spawn(5);
    until_sent(&c, 1).await;
    let mut queued = Vec::new();
    for i in 0..10u64 {
        queued.push(spawn(2));
        until_queued(&c, i + 1).await;
    }
    // Four queued checks go away (clients gone), then the leader itself: its request is
    // already on the wire, so it still takes its 5; the queue must still be sent.
    for t in queued.drain(..4) {
        t.abort();
        assert!(t.await.unwrap_err().is_cancelled());
    }
    leader.abort();
    assert!(leader.await.unwrap_err().is_cancelled());
    s.resume();
    for t in queued {
        assert!(within(t).await.unwrap().unwrap().is_ok());
    }
    // 5 (the leader's request, sent before it was dropped) + 6 × 2: the four dropped
    // checks took nothing.
    let left = c.limiter().peek("k").await.unwrap().remaining;
    assert_eq!(left, BURST - 5 - 12);
    let stats = c.stats();
    assert_eq!((stats.calls, stats.queued), (2, 0), "{stats:?}");
    // The key is free again: the next check is a call of its own.
    assert!(c.try_check_n("k", 1).await.unwrap().is_ok());
    assert_eq!(c.stats().calls, 3);
}

#[tokio::test]
async fn bad_input_never_enters_a_batch() {
    let Some(s) = RedisServer::start("bad_input_never_enters_a_batch") else {
        return;
    };
    let c = patient(gcra(&s, 3).await);
    assert!(matches!(
        c.try_check_n("", 1).await,
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(matches!(
        c.try_check_n("k", 4).await,
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert_eq!(c.stats().calls, 0);
    // A batch of the plain limiter refuses as a whole before any round trip.
    assert!(matches!(
        c.limiter().throttle_batch("k", &[1, 4]).await,
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert_eq!(c.limiter().peek("k").await.unwrap().remaining, 3);
}

#[tokio::test]
async fn a_fallback_wraps_a_coalescing_limiter() {
    let Some(mut s) = RedisServer::start("a_fallback_wraps_a_coalescing_limiter") else {
        return;
    };
    let f = Fallback::builder(patient(gcra(&s, 2).await))
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    assert!(f.check_n("k", 2).await.unwrap().is_ok());
    assert!(f.check_n("k", 1).await.unwrap().is_err());
    s.kill();
    // Redis gone: the in-process share answers (a fresh local bucket of 2), no error.
    assert!(f.check_n("k", 1).await.unwrap().is_ok());
}

/// Four clients, each one `Coalesce` shared by 8 tasks on its own runtime, on one key for
/// about 2 s: the granted permits stay within `burst + rate × elapsed + n` and reach 98 % of
/// it. Whether and how much the checks coalesce is up to the scheduler; the bound must hold
/// either way (the forced batches above show that batches happen and decide exactly).
#[test]
fn the_shared_limit_holds_under_coalesced_load() {
    let Some(s) = RedisServer::start("the_shared_limit_holds_under_coalesced_load") else {
        return;
    };
    const RATE: f64 = 500.0;
    const BURST: u32 = 50;
    let run = redis_shared::run(&s.url(), "shared", Duration::from_secs(2), 4, 8, |con| {
        patient(Gcra::new(con, Limit::per_second(RATE).unwrap(), BURST).unwrap())
    });
    redis_shared::assert_within_the_limit(&run, RATE, BURST);
}
