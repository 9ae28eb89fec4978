//! The shared-limit load test that every Redis limiter runs: several clients, each on its own
//! thread, runtime and connection, with a few tasks each, hammer one key for a while; the
//! test then checks the permits granted against `burst + rate × elapsed`.
#![allow(dead_code)] // not every test binary uses every helper

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use turnstile::redis::{ConnectionManager, RedisLimiter};

/// What a run counted.
#[derive(Debug)]
pub struct SharedRun {
    /// Permits granted, all clients together.
    pub granted: u64,
    /// Checks made.
    pub checks: u64,
    /// From the moment every client was ready until the last one finished.
    pub elapsed: Duration,
}

/// `clients` clients, each built by `make` on its own connection to `url` and shared by
/// `tasks` tokio tasks, check `key` for `run`; task `t` of client `c` asks for `1 + (c + t) % 2`
/// permits at a time. Every client is set up (connected, script loaded by a peek) before the
/// clock starts; a setup error panics only after the barriers, so nothing hangs.
pub fn run<L, F>(
    url: &str,
    key: &'static str,
    run: Duration,
    clients: u32,
    tasks: u32,
    make: F,
) -> SharedRun
where
    L: RedisLimiter + 'static,
    F: Fn(ConnectionManager) -> L + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let granted = Arc::new(AtomicU64::new(0));
    let checks = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(clients as usize + 1));
    let go = Arc::new(Barrier::new(clients as usize + 1));
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (url, make) = (url.to_string(), make.clone());
            let (granted, checks) = (granted.clone(), checks.clone());
            let (ready, go) = (ready.clone(), go.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let setup = async {
                        let client = redis::Client::open(url)?;
                        let con = ConnectionManager::new(client).await?;
                        let l = make(con);
                        let _ = l.try_check_n(key, 0).await?; // script loaded, connection warm
                        Ok::<_, Box<dyn std::error::Error>>(Arc::new(l))
                    }
                    .await;
                    ready.wait();
                    go.wait();
                    let l = setup.expect("client setup");
                    let end = Instant::now() + run;
                    let handles: Vec<_> = (0..tasks)
                        .map(|t| {
                            let (l, granted, checks) = (l.clone(), granted.clone(), checks.clone());
                            let n = 1 + (c + t) % 2;
                            tokio::spawn(async move {
                                while Instant::now() < end {
                                    checks.fetch_add(1, Ordering::Relaxed);
                                    if l.try_check_n(key, n).await.unwrap().is_ok() {
                                        granted.fetch_add(u64::from(n), Ordering::Relaxed);
                                    }
                                }
                            })
                        })
                        .collect();
                    for h in handles {
                        h.await.unwrap();
                    }
                });
            })
        })
        .collect();
    ready.wait();
    let start = Instant::now();
    go.wait();
    for t in threads {
        t.join().unwrap();
    }
    SharedRun {
        granted: granted.load(Ordering::Relaxed),
        checks: checks.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
    }
}

/// Asserts that `r` granted at most `burst + rate × elapsed + 2` permits (2: the largest
/// request) and at least 98 % of `burst + rate × elapsed`.
pub fn assert_within_the_limit(r: &SharedRun, rate: f64, burst: u32) {
    let elapsed = r.elapsed.as_secs_f64();
    let granted = r.granted as f64;
    let bound = f64::from(burst) + rate * elapsed;
    eprintln!(
        "{granted} permits granted in {} checks over {elapsed:.3} s; bound {bound:.1}",
        r.checks
    );
    assert!(granted <= bound + 2.0, "{granted} > {bound} + n");
    assert!(granted >= 0.98 * bound, "{granted} < 98 % of {bound}");
}

/// A connection that waits as long as a test stops the server to force a batch (the default
/// response timeout would end the call in flight first).
pub fn patient_connection() -> turnstile::redis::ConnectOptions {
    turnstile::redis::ConnectOptions::new().response_timeout(Duration::from_secs(60))
}

/// A `Coalesce` whose calls wait as long as the connection does.
pub fn patient<L: turnstile::redis::RedisBatch + 'static>(
    limiter: L,
) -> turnstile::redis::Coalesce<L> {
    turnstile::redis::Coalesce::builder(limiter)
        .deadline(Duration::from_secs(60))
        .build()
        .unwrap()
}
