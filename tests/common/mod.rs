//! What the tests share: the differential tests' runner (random operation sequences through
//! proptest, counting how each one ended: ran to the end, or stopped where a named deviation
//! applies), the bad-input tests' extreme times, and the wait for a Redis fallback to switch
//! back.

#[cfg(feature = "tracing")]
pub mod events;
pub mod hammer;
#[cfg(feature = "redis")]
pub mod redis_counter;
pub mod redis_server;
#[cfg(feature = "redis")]
pub mod redis_shared;
pub mod stale_race;
pub mod summary;

use std::collections::BTreeMap;
use std::fmt::Debug;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use turnstile::Nanos;

/// Runs `case` on `TURNSTILE_DIFF_CASES` (default 3000, 4 under Miri) values of `strategy`, failing on the
/// first case that fails (shrunk, as proptest does), and returns how many cases ended each
/// way. `label` names the run in the printed tally.
#[allow(dead_code)] // not every test binary uses every helper
pub fn tally<S, K>(
    label: &str,
    strategy: S,
    case: impl Fn(S::Value) -> Result<K, TestCaseError>,
) -> BTreeMap<K, u32>
where
    S: Strategy,
    K: Ord + Debug,
{
    let cases = std::env::var("TURNSTILE_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(miri) { 4 } else { 3000 });
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let stats = std::cell::RefCell::new(BTreeMap::<K, u32>::new());
    runner
        .run(&strategy, |value| {
            let end = case(value)?;
            *stats.borrow_mut().entry(end).or_default() += 1;
            Ok(())
        })
        .unwrap();
    let stats = stats.into_inner();
    eprintln!("{label} outcomes: {stats:?}");
    stats
}

/// The extreme times the bad-input tests try every operation at: the start of time, one
/// second in, the middle, and the last nanoseconds before and at `Nanos::MAX`.
#[allow(dead_code)] // not every test binary uses every helper
pub fn extreme_times() -> Vec<Nanos> {
    [
        0,
        1,
        1_000_000_000,
        u64::MAX / 2,
        u64::MAX - 1_000_000_000,
        u64::MAX - 2,
        u64::MAX - 1,
        u64::MAX,
    ]
    .into_iter()
    .map(Nanos::new)
    .collect()
}

/// Runs `threads` workers through `phases` phases in lockstep: before phase `i`, `setup(i)`
/// runs while every worker is parked at a barrier (it may set a manual clock); then all the
/// workers run `work(worker, i)` at once, and the next phase starts when every one has
/// returned. Returns each worker's results, by worker then phase.
///
/// This is how the stress tests force the case they assert: within a phase the workers still
/// race each other (how they interleave is the scheduler's), but the clock stands still and
/// each worker drains the limiter until it is refused, so what a phase grants in total is
/// fixed by the limiter's rules alone: a loaded machine that runs the workers one after the
/// other changes nothing that is checked.
///
/// A worker that panics keeps meeting the barriers (so the others do not hang) and re-raises
/// its panic at the end; `setup` must not panic.
#[allow(dead_code)] // not every test binary uses every helper
pub fn lockstep<R: Send>(
    threads: usize,
    phases: usize,
    mut setup: impl FnMut(usize),
    work: impl Fn(usize, usize) -> R + Sync,
) -> Vec<Vec<R>> {
    let barrier = std::sync::Barrier::new(threads + 1);
    let (barrier, work) = (&barrier, &work);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                s.spawn(move || {
                    let mut mine = Vec::with_capacity(phases);
                    let mut panicked = None;
                    for i in 0..phases {
                        barrier.wait(); // setup(i) is done
                        if panicked.is_none() {
                            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                work(w, i)
                            }));
                            match r {
                                Ok(r) => mine.push(r),
                                Err(e) => panicked = Some(e),
                            }
                        }
                        barrier.wait(); // phase i is over
                    }
                    if let Some(e) = panicked {
                        std::panic::resume_unwind(e);
                    }
                    mine
                })
            })
            .collect();
        for i in 0..phases {
            setup(i);
            barrier.wait();
            barrier.wait();
        }
        workers.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The start of a worker's pseudo-random stream: `seed` (a worker id, a step, or both) mixed
/// with a fixed odd constant, so that neighbouring seeds give unrelated streams. Deterministic,
/// so a failing stress run replays the same choices.
#[allow(dead_code)] // not every test binary uses every helper
pub fn rng_seed(seed: u64) -> u64 {
    0x9E37_79B9_7F4A_7C15 ^ seed
}

/// Advances a xorshift64 stream and returns its new value: cheap enough for the stress tests'
/// inner loops.
#[allow(dead_code)] // not every test binary uses every helper
pub fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Polls `cond` every 10 ms on tokio's timer until it holds, failing after `limit`: for a
/// state another task reaches (never a timing assertion: the limit is generous).
#[cfg(feature = "tokio")]
#[allow(dead_code)] // not every test binary uses every helper
pub async fn eventually(limit: std::time::Duration, mut cond: impl FnMut() -> bool, what: &str) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Waits, without blocking the runtime, until `f` answers from Redis again after its server
/// came back (its health check switches it back by itself); fails after 5 s.
#[cfg(feature = "redis")]
#[allow(dead_code)] // not every test binary uses every helper
pub async fn back_on_redis<L: turnstile::redis::RedisLimiter + 'static>(
    f: &turnstile::redis::Fallback<L>,
) {
    let restarted = std::time::Instant::now();
    while f.mode() != turnstile::redis::Mode::Redis {
        assert!(
            restarted.elapsed() < std::time::Duration::from_secs(5),
            "still in fallback"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
