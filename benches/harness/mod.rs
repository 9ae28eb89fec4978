//! The harness every turnstile benchmark shares, so that all cells measure the same thing.
//!
//! Each cell runs its operation on `threads` threads started together on one shared limiter:
//! every thread waits on a `Barrier`, reads its own `Instant`, performs `iters` operations and
//! reads the time again. The sample is the **largest** per-thread elapsed time, which
//! criterion divides by `iters`: the time per operation as seen by one thread (the slowest)
//! while `threads` threads contend; aggregate throughput is `threads / figure`. Spawning and
//! the barrier are outside the timed region. `scripts/bench-ratios` prints the ratios.
#![allow(dead_code)] // each bench uses a subset

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};

/// The thread counts of every group (`<workload>/<threads>t`).
pub const THREADS: [usize; 2] = [1, 2];

/// Runs `op` `iters` times on each of `threads` threads started together; returns the slowest
/// thread's elapsed time.
pub fn contended<F: Fn() + Sync>(threads: usize, iters: u64, op: &F) -> Duration {
    let run = || {
        let start = Instant::now();
        for _ in 0..iters {
            op();
        }
        start.elapsed()
    };
    if threads == 1 {
        return run();
    }
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    run()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .max()
            .unwrap_or_default()
    })
}

/// One cell: `op` under the id `id` (`turnstile`, `mutex_twin` or `governor`).
pub fn cell<F: Fn() + Sync>(g: &mut BenchmarkGroup<'_, WallTime>, id: &str, threads: usize, op: F) {
    g.bench_function(id, |b| {
        b.iter_custom(|iters| contended(threads, iters, &op))
    });
}

/// The CAS of a `floor` cell: one load and a CAS loop on `word`, adding `v | 1` (the value a
/// limiter's grant would compute from the time it read).
#[inline(always)]
pub fn floor_cas(word: &AtomicU64, v: u64) {
    let mut cur = word.load(Ordering::Acquire);
    while let Err(actual) = word.compare_exchange_weak(
        cur,
        cur.wrapping_add(v | 1),
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        cur = actual;
    }
}

/// A nonzero `u32` for governor's quotas.
pub fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

/// Every bench's criterion settings: short enough for a 2-core machine, long enough to settle.
pub fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_millis(2500))
        .sample_size(30)
}
