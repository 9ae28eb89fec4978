//! `turnstile::redis::Blocking` against a real redis-server of each test's own
//! (tests/common/redis_server.rs): plain threads with no tokio of their own sharing one
//! limiter get exactly its burst; a blocking `Fallback` answers through a kill and goes back
//! to Redis after a restart with nobody calling (its health check runs on the wrapper's
//! runtime); called or built inside a tokio runtime it returns a typed error instead of
//! tokio's panic; dropping it inside or outside a runtime neither blocks nor panics, and its
//! worker thread goes; bad input is a typed error.
//!
//! Answers that depend on time use a slow limit (1 per minute), so the real time between
//! calls cannot change a count. Waits for a condition poll it under a generous deadline
//! (`wait_until`, `within`); no sleep decides an outcome.
#![cfg(feature = "redis")]

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::Duration;

use common::redis_server::{wait_until, RedisServer};
use turnstile::redis::{
    self, Blocking, ConnectionManager, Fallback, FixedWindow, Gcra, Mode, RedisLimitError,
    TokenBucket,
};
use turnstile::{ConfigError, Limit};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const MINUTE: Duration = Duration::from_secs(60);

/// Shared across threads (in an `Arc`): checked when this file compiles.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Blocking<Gcra>>();
    send_sync::<Blocking<TokenBucket<ConnectionManager>>>();
    send_sync::<Blocking<FixedWindow<ConnectionManager>>>();
    send_sync::<Blocking<Fallback<Gcra<ConnectionManager>>>>();
};

/// A blocking GCRA of one permit a minute with a burst of `burst`, on `url`.
fn gcra(url: &str, burst: u32) -> Blocking<Gcra> {
    Blocking::new(|| async move {
        let con = redis::connect(url).await?;
        Ok(Gcra::new(con, Limit::every(MINUTE), burst)?)
    })
    .expect("a blocking GCRA")
}

/// A multi-thread runtime with one worker named `name`, so a test can watch its thread.
fn runtime_named(name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .unwrap()
}

/// How many of this process's threads are named `name` (Linux: /proc/self/task/*/comm).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Runs `f` on a thread of its own and fails if it has not returned within `limit`: a hang
/// fails the test instead of stalling it.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(e) => panic!("{what}: no answer within {limit:?} ({e})"),
    }
}

#[test]
fn four_plain_threads_share_exactly_the_burst() {
    let Some(s) = RedisServer::start("four_plain_threads_share_exactly_the_burst") else {
        return;
    };
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "no tokio runtime in this test"
    );
    let limiter = Arc::new(gcra(&s.url(), 5));
    limiter
        .ping()
        .expect("PING through the limiter's connection");

    let start = Arc::new(Barrier::new(4));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (limiter, start) = (Arc::clone(&limiter), Arc::clone(&start));
            std::thread::spawn(move || {
                assert!(tokio::runtime::Handle::try_current().is_err());
                start.wait();
                (0..4)
                    .map(|_| limiter.try_check("shared").expect("an answer"))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let verdicts: Vec<_> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();

    assert_eq!(verdicts.len(), 16);
    let granted = verdicts.iter().filter(|v| v.is_ok()).count();
    assert_eq!(granted, 5, "exactly the burst, shared by the four threads");
    for denied in verdicts.iter().filter_map(|v| v.as_ref().err()) {
        let retry = denied.retry_after().expect("the server's retry-after");
        assert!(retry > Duration::ZERO && retry <= MINUTE, "{retry:?}");
        assert_eq!(denied.retry_after_secs(), Some(60), "{retry:?}");
    }
    // Counted in Redis: the key's whole burst is spent, another key's is not.
    assert_eq!(s.cli(&["exists", "turnstile:gcra:shared"]), "1");
    let t = limiter.run(|g| g.peek("shared")).unwrap();
    assert_eq!((t.allowed, t.remaining), (true, 0), "{t:?}");
    let t = limiter
        .block_on(limiter.limiter().peek("other"))
        .unwrap()
        .unwrap();
    assert_eq!(t.remaining, 5, "{t:?}");
    assert_eq!(limiter.try_check_n("other", 5).unwrap(), Ok(()));
    assert!(limiter.try_check("other").unwrap().is_err());
}

#[test]
fn a_blocking_fallback_answers_through_a_kill_and_returns_to_redis_after_a_restart() {
    let Some(mut s) = RedisServer::start(
        "a_blocking_fallback_answers_through_a_kill_and_returns_to_redis_after_a_restart",
    ) else {
        return;
    };
    let url = s.url();
    let limiter = Blocking::new(|| async move {
        let con = redis::connect(&url).await?;
        // One a minute, bursts of 6: the fleet share of 2 admits 3 at once in fallback.
        let g = Gcra::builder(Limit::every(MINUTE), 6)
            .prefix("fb:")
            .build(con)?;
        Ok(Fallback::builder(g)
            .timeout(Duration::from_millis(300))
            .fleet_size(2)
            .build()?)
    })
    .unwrap();
    assert_eq!(limiter.try_check("k").unwrap(), Ok(()), "answered by Redis");
    assert_eq!(s.cli(&["exists", "fb:k"]), "1");
    assert_eq!(limiter.limiter().mode(), Mode::Redis);

    s.kill();
    // Every call answers (no connectivity error reaches the caller), from the local share.
    for i in 0..3 {
        assert_eq!(limiter.try_check("k").unwrap(), Ok(()), "local grant {i}");
    }
    assert_eq!(limiter.limiter().mode(), Mode::Fallback);
    let denied = limiter.try_check("k").unwrap().unwrap_err();
    assert!(
        denied.retry_after().is_some(),
        "the local limiter's retry time"
    );
    assert!(matches!(
        limiter.try_check(""),
        Err(RedisLimitError::EmptyKey)
    ));
    assert_eq!(limiter.limiter().stats().switches_to_fallback, 1);

    s.restart();
    // Nobody calls: the health check runs on the wrapper's runtime between calls.
    wait_until(
        Duration::from_secs(10),
        || limiter.limiter().mode() == Mode::Redis,
        "the blocking fallback to go back to Redis",
    );
    assert_eq!(limiter.limiter().stats().switches_to_redis, 1);
    assert_eq!(
        s.cli(&["exists", "fb:k"]),
        "0",
        "the restarted server is empty"
    );
    assert_eq!(
        limiter.try_check("k").unwrap(),
        Ok(()),
        "a fresh server grants"
    );
    assert_eq!(s.cli(&["exists", "fb:k"]), "1", "counted in Redis again");
    limiter.ping().expect("PING within the fallback's timeout");
}

/// Everything a `Blocking` offers, called where a tokio runtime is current: the typed error,
/// no panic, nothing sent to Redis; then the async limiter is awaited there instead.
async fn refused_inside_a_runtime(test: &str) {
    let Some(s) = RedisServer::start(test) else {
        return;
    };
    let url = s.url();
    // Built on a thread with no runtime of its own.
    let limiter = std::thread::spawn(move || gcra(&url, 3)).join().unwrap();

    let inside = |e: RedisLimitError| {
        assert!(matches!(e, RedisLimitError::InsideAsyncRuntime), "{e:?}");
        assert!(!e.is_connectivity(), "not something a fallback covers");
        assert!(e.to_string().contains("await the async limiter"), "{e}");
    };
    inside(limiter.try_check("k").unwrap_err());
    inside(limiter.try_check_n("k", 2).unwrap_err());
    inside(limiter.ping().unwrap_err());
    inside(limiter.run(|g| g.throttle("k", 1)).unwrap_err());
    inside(limiter.block_on(async { 1 }).unwrap_err());
    assert_eq!(s.cli(&["exists", "turnstile:gcra:k"]), "0", "nothing sent");

    // What the error says to do: await the async limiter.
    assert_eq!(
        limiter.limiter().throttle("k", 1).await.unwrap().remaining,
        2
    );

    // Building one here is refused before anything is built.
    let called = AtomicBool::new(false);
    let e = Blocking::<Gcra>::new(|| {
        called.store(true, Ordering::Relaxed);
        async { Err::<_, BoxError>("never built".into()) }
    })
    .unwrap_err();
    assert!(matches!(
        e.downcast_ref::<RedisLimitError>(),
        Some(RedisLimitError::InsideAsyncRuntime)
    ));
    assert!(!called.load(Ordering::Relaxed));

    // Dropping it here neither panics nor blocks.
    drop(limiter);
}

#[tokio::test]
async fn inside_a_current_thread_runtime_is_a_typed_error() {
    refused_inside_a_runtime("inside_a_current_thread_runtime_is_a_typed_error").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_a_multi_thread_runtime_is_a_typed_error() {
    refused_inside_a_runtime("inside_a_multi_thread_runtime_is_a_typed_error").await;
}

#[test]
fn dropping_outside_a_runtime_does_not_block_and_stops_the_worker() {
    let Some(mut s) =
        RedisServer::start("dropping_outside_a_runtime_does_not_block_and_stops_the_worker")
    else {
        return;
    };
    const NAME: &str = "tsb-drop-out";
    let url = s.url();
    let limiter = Blocking::builder()
        .runtime(runtime_named(NAME))
        .build(|| async move {
            let con = redis::connect(&url).await?;
            let g = Gcra::new(con, Limit::every(MINUTE), 3)?;
            Ok(Fallback::builder(g)
                .timeout(Duration::from_millis(300))
                .build()?)
        })
        .unwrap();
    assert_eq!(threads_named(NAME), 1, "one worker");
    // In fallback, so there is a health check pinging a dead server and a connection
    // trying to reconnect when the wrapper goes.
    s.kill();
    assert!(limiter.try_check("k").unwrap().is_ok());
    assert_eq!(limiter.limiter().mode(), Mode::Fallback);

    within(Duration::from_secs(10), "drop", move || drop(limiter));
    wait_until(
        Duration::from_secs(10),
        || threads_named(NAME) == 0,
        "the wrapper's worker thread to exit",
    );
}

/// Builds a `Blocking` on a thread with no runtime, uses it there, and returns it.
fn built_elsewhere(url: String, name: &'static str) -> Blocking<Gcra> {
    std::thread::spawn(move || {
        let limiter = Blocking::builder()
            .runtime(runtime_named(name))
            .build(|| async move {
                let con = redis::connect(&url).await?;
                Ok(Gcra::new(con, Limit::every(MINUTE), 3)?)
            })
            .unwrap();
        assert_eq!(limiter.try_check("k").unwrap(), Ok(()));
        limiter
    })
    .join()
    .unwrap()
}

#[tokio::test]
async fn dropping_inside_a_current_thread_runtime_does_not_panic_and_stops_the_worker() {
    let Some(s) = RedisServer::start(
        "dropping_inside_a_current_thread_runtime_does_not_panic_and_stops_the_worker",
    ) else {
        return;
    };
    const NAME: &str = "tsb-drop-in-ct";
    let limiter = built_elsewhere(s.url(), NAME);
    assert_eq!(threads_named(NAME), 1);
    drop(limiter);
    wait_until(
        Duration::from_secs(10),
        || threads_named(NAME) == 0,
        "the wrapper's worker thread to exit",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_inside_a_multi_thread_runtime_does_not_panic_and_stops_the_worker() {
    let Some(s) = RedisServer::start(
        "dropping_inside_a_multi_thread_runtime_does_not_panic_and_stops_the_worker",
    ) else {
        return;
    };
    const NAME: &str = "tsb-drop-in-mt";
    let limiter = built_elsewhere(s.url(), NAME);
    // Dropped by a task, on one of this runtime's workers.
    tokio::spawn(async move { drop(limiter) }).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        || threads_named(NAME) == 0,
        "the wrapper's worker thread to exit",
    );
}

#[test]
fn bad_input_is_a_typed_error() {
    let Some(s) = RedisServer::start("bad_input_is_a_typed_error") else {
        return;
    };
    let url = s.url();
    let limiter = gcra(&url, 3);
    assert!(matches!(
        limiter.try_check(""),
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(matches!(
        limiter.try_check_n("", 1),
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(matches!(
        limiter.run(|g| g.throttle("", 1)),
        Err(RedisLimitError::EmptyKey)
    ));
    assert!(matches!(
        limiter.try_check_n("k", 4),
        Err(RedisLimitError::ExceedsBurst { n: 4, burst: 3 })
    ));
    assert_eq!(s.cli(&["dbsize"]), "0", "refused before any round trip");

    // The builder closure's errors come back as they were, through `?`.
    let e = Blocking::new(|| async {
        let con = redis::connect(&url).await?;
        Ok(Gcra::new(con, Limit::every(MINUTE), 0)?)
    })
    .unwrap_err();
    assert_eq!(
        e.downcast_ref::<ConfigError>(),
        Some(&ConfigError::ZeroCapacity)
    );
    // A port bound and held, never listened on: connecting to it is refused, and no other
    // test's server can take it while the connection manager retries (a port found free and
    // let go could be, by a server starting in the same test binary meanwhile).
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let nobody = format!("redis://127.0.0.1:{}/", held.local_addr().unwrap().port());
    let e = within(Duration::from_secs(20), "connect to nobody", move || {
        Blocking::new(|| async move {
            let con = redis::connect(&nobody).await?;
            Ok(Gcra::new(con, Limit::every(MINUTE), 1)?)
        })
        .unwrap_err()
    });
    drop(held);
    let e = e
        .downcast_ref::<RedisLimitError>()
        .expect("connect's error");
    assert!(e.is_connectivity(), "{e:?}");

    // A current-thread runtime is refused before the closure runs.
    let current_thread = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = Blocking::builder()
        .runtime(current_thread)
        .build::<Gcra, _, _>(|| async { unreachable!("not built on a current-thread runtime") })
        .unwrap_err();
    assert_eq!(
        e.downcast_ref::<ConfigError>(),
        Some(&ConfigError::CurrentThreadRuntime)
    );
    // A zero deadline, under which every call would time out, likewise.
    let e = Blocking::builder()
        .deadline(Duration::ZERO)
        .build::<Gcra, _, _>(|| async { unreachable!("not built with a zero deadline") })
        .unwrap_err();
    assert_eq!(
        e.downcast_ref::<ConfigError>(),
        Some(&ConfigError::ZeroTimeout)
    );
}
