//! The harness every turnstile benchmark shares, so that all cells measure the same thing.
//!
//! Each cell runs its operation on `threads` threads started together on one shared limiter:
//! every thread waits on a `Barrier`, reads its own `Instant`, performs `iters` operations and
//! reads the time again. The sample is the **largest** per-thread elapsed time, which
//! criterion divides by `iters`: the time per operation as seen by one thread (the slowest)
//! while `threads` threads contend; aggregate throughput is `threads / figure`. Spawning and
//! the barrier are outside the timed region. `scripts/bench-ratios` prints the ratios.
//!
//! [`saturated`] holds the saturated and burst workloads' configuration (the shootout's), their
//! clock-free schedules and their floors, shared with `bench/examples/instructions.rs` so that the
//! criterion cells and the instruction counts measure the same thing. Its cells are built
//! here: [`sat_cell`] on the real clock at 1 and 2 threads, [`stepped_cell`] clock-free at 1
//! thread, the times passed in.
#![allow(dead_code)] // each bench uses a subset

pub mod saturated;
#[allow(unused_imports)] // each bench uses a subset
pub use saturated::floor_cas;

use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use saturated::{Expect, Schedule};
use std::hint::black_box;
use turnstile::Nanos;

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

/// A saturated cell on the real clock: `op` (true if granted) under `id`, then
/// [`saturated::assert_saturated`] with rounds of `probe` checks through `op`, as `what`.
pub fn sat_cell<F: Fn() -> bool + Sync>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    what: &str,
    id: &str,
    threads: usize,
    probe: u32,
    op: F,
) {
    // Probed only if criterion ran the cell (a filter on the command line skips it): the
    // probe of a cell never measured would only time how fast its limiter can be emptied.
    let mut ran = false;
    let cell_op = || {
        black_box(op());
    };
    g.bench_function(id, |b| {
        ran = true;
        b.iter_custom(|iters| contended(threads, iters, &cell_op))
    });
    if ran {
        saturated::assert_saturated(&format!("{what} {id}"), probe, &op);
    }
}

/// A clock-free cell on one thread: `op(t, moved)` (true if granted) at the times of `s`, which
/// carries on from one criterion sample to the next (a limiter's clock only moves forward);
/// then [`saturated::verify`] that the state was `expect`'s, as `what`.
pub fn stepped_cell(
    g: &mut BenchmarkGroup<'_, WallTime>,
    what: &str,
    id: &str,
    mut s: Schedule,
    expect: Expect,
    mut op: impl FnMut(Nanos, u64) -> bool,
) {
    g.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            black_box(saturated::run_checks(&mut s, &mut op, iters));
            start.elapsed()
        })
    });
    saturated::verify(&mut s, expect, &format!("{what} {id}"), op);
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

/// Defines `fn $name(c: &mut Criterion)`, the saturated and burst groups of one limiter
/// (ids `turnstile`, `mutex_twin` where a `twin` is given, `floor`; see
/// `bench/benches/harness/saturated.rs` for the configuration):
/// * `<prefix>_saturated_check/<threads>t`: `Limiter::check()` on the real clock, the
///   refusal's retry time black-boxed, then [`sat_cell`]'s saturation probe (rounds of
///   `probe` checks);
/// * `<prefix>_saturated_allow/<threads>t`: the same with the plain yes/no `allow`;
/// * `<prefix>_saturated_check_at/1t`, `<prefix>_saturated_allow_at/1t`: clock-free (50 ns a
///   check from the time `start` returns for the limiter, one check in 20 granted) with
///   `check_n_at` and `allow_at`;
/// * `<prefix>_burst_check/1t`: clock-free, the `burst` schedule, `check_n_at`.
///
/// `make` and `twin` build the limiter on the clock `$c` (the quanta clock, or a
/// `ManualClock` clock-free); `$b` is true for the burst cell's. Use with `#[macro_use] mod
/// harness;`.
#[allow(unused_macros)] // only the benches of single limiters use it
macro_rules! saturated_benches {
    (
        $name:ident, $prefix:literal,
        make: |$c:ident, $b:ident| $make:expr,
        $(twin: |$tc:ident, $tb:ident| $twin:expr,)?
        allow: |$l:ident| $allow:expr,
        allow_at: |$la:ident, $t:ident| $allow_at:expr,
        start: |$ls:ident| $start:expr,
        probe: $probe:expr,
        burst: $burst:expr $(,)?
    ) => {
        fn $name(c: &mut criterion::Criterion) {
            use crate::harness::saturated::{self as sat, Expect, Schedule};
            use crate::harness::{cell, sat_cell, stepped_cell, THREADS};
            use std::hint::black_box;
            use turnstile::{ManualClock, QuantaClock};

            fn group<const CHECK: bool>(c: &mut criterion::Criterion, op: &str, threads: usize) {
                let name = format!(concat!($prefix, "_saturated_{}/{}t"), op, threads);
                let mut g = c.benchmark_group(&name);
                {
                    let ($c, $b) = (QuantaClock::new(), false);
                    let ours = $make;
                    sat_cell(&mut g, &name, "turnstile", threads, $probe, || {
                        if CHECK {
                            sat::check(&ours)
                        } else {
                            let $l = black_box(&ours);
                            $allow
                        }
                    });
                }
                $({
                    let ($tc, $tb) = (QuantaClock::new(), false);
                    let twin = $twin;
                    sat_cell(&mut g, &name, "mutex_twin", threads, $probe, || {
                        if CHECK {
                            sat::check(&twin)
                        } else {
                            let $l = black_box(&twin);
                            $allow
                        }
                    });
                })?
                let floor = sat::Floor::new(QuantaClock::new());
                cell(&mut g, "floor", threads, || {
                    black_box(floor.check());
                });
                g.finish();
            }

            fn group_at<const CHECK: bool>(c: &mut criterion::Criterion, op: &str) {
                let name = format!(concat!($prefix, "_saturated_{}_at/1t"), op);
                let mut g = c.benchmark_group(&name);
                {
                    let ($c, $b) = (ManualClock::new(sat::START), false);
                    let ours = $make;
                    let s = {
                        let $ls = &ours;
                        Schedule::saturated().from($start)
                    };
                    stepped_cell(&mut g, &name, "turnstile", s, Expect::Saturated, |t, _| {
                        if CHECK {
                            sat::check_at(&ours, t)
                        } else {
                            let ($la, $t) = (black_box(&ours), black_box(t));
                            $allow_at
                        }
                    });
                }
                $({
                    let ($tc, $tb) = (ManualClock::new(sat::START), false);
                    let twin = $twin;
                    let s = {
                        let $ls = &twin;
                        Schedule::saturated().from($start)
                    };
                    stepped_cell(&mut g, &name, "mutex_twin", s, Expect::Saturated, |t, _| {
                        if CHECK {
                            sat::check_at(&twin, t)
                        } else {
                            let ($la, $t) = (black_box(&twin), black_box(t));
                            $allow_at
                        }
                    });
                })?
                let floor = sat::Floor::new(ManualClock::new(sat::START));
                let s = Schedule::saturated();
                stepped_cell(&mut g, &name, "floor", s, Expect::Refused, |t, _| {
                    floor.check_at(t)
                });
                g.finish();
            }

            fn burst_group(c: &mut criterion::Criterion) {
                let name = concat!($prefix, "_burst_check/1t");
                let mut g = c.benchmark_group(name);
                {
                    let ($c, $b) = (ManualClock::new(sat::START), true);
                    let ours = $make;
                    stepped_cell(&mut g, name, "turnstile", $burst, Expect::Burst, |t, _| {
                        sat::check_at(&ours, t)
                    });
                }
                $({
                    let ($tc, $tb) = (ManualClock::new(sat::START), true);
                    let twin = $twin;
                    stepped_cell(&mut g, name, "mutex_twin", $burst, Expect::Burst, |t, _| {
                        sat::check_at(&twin, t)
                    });
                })?
                g.finish();
            }

            for threads in THREADS {
                group::<true>(c, "check", threads);
                group::<false>(c, "allow", threads);
            }
            group_at::<true>(c, "check");
            group_at::<false>(c, "allow");
            burst_group(c);
        }
    };
}
