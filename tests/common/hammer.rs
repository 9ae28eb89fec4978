//! The stress tests' runner: worker threads hammering one limiter at once for a span of real
//! time, each on its own random stream, while a side thread (if any) moves a manual clock or
//! reconfigures the limiter. Every `*_stress.rs` file writes only what one operation does and
//! what it keeps; the threads, the start line and the stop are here, once.
//!
//! All threads (workers and side) wait at one barrier, so the span starts with every worker
//! running; each worker makes at least `min_ops` operations however late it is scheduled, so a
//! slow machine still exercises the race the test is about, then stops at the flag.
#![allow(dead_code)] // only the stress binaries use it

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

/// What one worker is handed on each operation.
pub struct Op<'a> {
    /// The worker's index, `0..threads`.
    pub id: usize,
    /// The worker's xorshift state (seeded by its id): advance it with `common::xorshift`.
    pub rng: &'a mut u64,
    /// Operations made so far by every worker, for a side thread that moves time with them;
    /// counted only by the workers that add to it.
    pub progress: &'a AtomicU64,
}

/// What the side thread is handed on each turn of its loop.
pub struct Side<'a> {
    /// How many turns it has taken before this one.
    pub turn: u64,
    pub progress: &'a AtomicU64,
    pub stop: &'a AtomicBool,
}

/// How long and how hard to hammer.
#[derive(Clone, Copy, Debug)]
pub struct Hammer {
    pub threads: usize,
    pub run_for: Duration,
    /// Operations each worker makes at least, however late it starts.
    pub min_ops: u64,
}

/// What each worker kept (`keep`, started from `W::default()`) and how many operations it made.
pub struct Run<W> {
    pub kept: Vec<W>,
    pub ops: u64,
}

impl Hammer {
    /// Runs `op` in a loop on each of `threads` workers for `run_for`, `side` (if any) in a
    /// loop on one more thread meanwhile; returns what every worker kept.
    pub fn run<W: Default + Send>(
        self,
        op: impl Fn(Op<'_>, &mut W) + Sync,
        side: Option<&(dyn Fn(Side<'_>) + Sync)>,
    ) -> Run<W> {
        let stop = AtomicBool::new(false);
        let progress = AtomicU64::new(0);
        let start = Barrier::new(self.threads + 1 + usize::from(side.is_some()));
        let (op, stop, progress, start) = (&op, &stop, &progress, &start);
        let runs: Vec<(W, u64)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..self.threads)
                .map(|id| {
                    s.spawn(move || {
                        let mut rng = super::rng_seed(id as u64 + 1);
                        let (mut kept, mut ops) = (W::default(), 0u64);
                        start.wait();
                        while ops < self.min_ops || !stop.load(Ordering::Relaxed) {
                            let o = Op {
                                id,
                                rng: &mut rng,
                                progress,
                            };
                            op(o, &mut kept);
                            ops += 1;
                        }
                        (kept, ops)
                    })
                })
                .collect();
            if let Some(f) = side {
                s.spawn(move || {
                    start.wait();
                    let mut turn = 0;
                    while !stop.load(Ordering::Relaxed) {
                        f(Side {
                            turn,
                            progress,
                            stop,
                        });
                        turn += 1;
                    }
                });
            }
            start.wait();
            std::thread::sleep(self.run_for);
            stop.store(true, Ordering::Relaxed);
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        Run {
            ops: runs.iter().map(|r| r.1).sum(),
            kept: runs.into_iter().map(|r| r.0).collect(),
        }
    }
}
