//! turnstile's lock-free `SmoothBursty` / `SmoothWarmingUp` vs their mutex twins (the literal
//! Guava ports), with governor's direct limiter as a reference for the non-blocking acquire,
//! side by side on one shared limiter at 1 and 2 threads.
//!
//! Groups (`<limiter>_<workload>/<threads>t`, limiter `bursty` or `warming`), ids `turnstile`,
//! `mutex_twin` and (where it has the operation) `governor`:
//! * `reserve`: `reserve_n(1)`, pay later, at a huge rate (1e15/s, a 1-second burst or a 1 s
//!   warm-up) so that waits are ~0. Every call resyncs (`next_free` moves to the clock reading)
//!   and spends a permit, so every call commits a CAS (the twin: takes the mutex and writes).
//!   governor has no reservations: no cell.
//! * `try_ok`: the non-blocking acquire that succeeds: `try_acquire_at(clock.now(), 1, 1 ms)`
//!   on the same huge-rate limiter (Guava's `tryAcquire(1, 1 ms)` without the sleep; the
//!   timeout absorbs the nanoseconds by which another thread's clock reading may lead).
//!   governor: `check()` at 1e9 cells/s (its finest) with a burst of `u32::MAX`.
//! * `try_deny`: the non-blocking acquire that fails: `try_acquire_at(clock.now(), 1, 0)` on a
//!   1e-3/s limiter that owes ~1000 s (one `reserve_n(1)` before measuring). A denial is a
//!   load (turnstile) or a lock and a compare (twin) and writes nothing. governor: `check()`
//!   on 1 per hour, burst 1, drained.
//!
//!
//! The groups above run at a huge rate or against a debt no check sees paid. A limiter in use
//! lives **saturated**: its debt is paid continuously and most acquires are refused, each
//! refusal with its retry time. Those groups (`saturated_benches!` in `bench/benches/harness/mod.rs`
//! defines them, `bench/benches/harness/saturated.rs` has the configuration, the shootout's phase 3:
//! 1e6/s, `bursty` with 1 s of burst, `warming` with a 100 ms warm-up), ids `turnstile`,
//! `mutex_twin` and `floor` (a clock read plus one load; no governor cell: governor has no
//! smooth limiter):
//! * `<limiter>_saturated_check/<threads>t`: `Limiter::check()`, the refusal's retry time
//!   black-boxed; `<limiter>_saturated_allow`: `try_acquire(1, 0)`. Checks arrive far faster
//!   than 1e6/s, so ~all are refused; each cell then asserts that checking at full speed
//!   saturates it again (fewer than half of a round of 10 000 granted, within 5 s: idle
//!   during criterion's analysis, it stores up to 1 s of permits).
//! * `<limiter>_saturated_check_at/1t`, `<limiter>_saturated_allow_at/1t`: clock-free, as
//!   `scripts/instructions` counts them, `check_n_at(t, 1)` / `try_acquire_at(t, 1, 0)` with
//!   `t` advancing 50 ns a check, so that one in 20 is granted (verified after the cell). The
//!   schedule starts once the stored permits a new limiter holds (a warming-up one starts
//!   cold) are paid for.
//! * `<limiter>_burst_check/1t`: clock-free, idle then a burst of 2000 checks at one instant,
//!   then a jump past two refills (`bursty`: 2 ms, with 1 ms of burst, i.e. 1000 permits, so
//!   that the burst is larger than the bucket; `warming`: 200 ms, two warm-ups, so that each
//!   burst finds it cold), over and over.
//!
//! # What the reported time means
//! As in `bench/benches/token_bucket.rs`: every cell uses `iter_custom`. With `T` threads (1 or 2),
//! each thread waits on a `Barrier`, reads its own `Instant`, performs `iters` operations on
//! the one shared limiter (clock read included), and reads the time again. The sample is the
//! **largest** of the `T` per-thread elapsed times, which criterion divides by `iters`: the
//! figure is the time per operation *as seen by one thread* while `T` threads contend.
//! Aggregate throughput is `T / figure`. Thread spawning and the barrier are outside the timed
//! region.
//!
//! Summarize with `scripts/bench-ratios` after a run.

use std::time::Duration;

#[macro_use]
mod harness;

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use harness::{cell, nz, THREADS};
use std::hint::black_box;
use turnstile::{reference, Clock, SmoothBursty, SmoothWarmingUp};

/// Huge but finite: every call runs the whole reserve path, and waits stay ~0.
const HUGE: f64 = 1e15;
/// One permit every 1000 s: one reservation leaves a debt no check will see paid.
const TINY: f64 = 1e-3;
const WARMUP: Duration = Duration::from_secs(1);
const OK_TIMEOUT: Duration = Duration::from_millis(1);

fn governor_ok() -> governor::DefaultDirectRateLimiter {
    RateLimiter::direct(Quota::per_second(nz(1_000_000_000)).allow_burst(nz(u32::MAX)))
}

fn governor_deny() -> governor::DefaultDirectRateLimiter {
    let g = RateLimiter::direct(Quota::per_hour(nz(1)).allow_burst(nz(1)));
    assert!(g.check().is_ok());
    assert!(g.check().is_err());
    g
}

/// The four limiters of one flavour, built the same way: ours and the twin.
macro_rules! workloads {
    ($name:ident, $label:literal, $ours:expr, $twin:expr) => {
        fn $name(c: &mut Criterion) {
            for threads in THREADS {
                // reserve (pay later), waits ~0.
                let mut g = c.benchmark_group(format!("{}_reserve/{threads}t", $label));
                let l = $ours(HUGE);
                cell(&mut g, "turnstile", threads, || {
                    black_box(black_box(&l).reserve_n(1).unwrap());
                });
                assert!(l.reserve_n(1).unwrap() < Duration::from_millis(1));
                let t = $twin(HUGE);
                cell(&mut g, "mutex_twin", threads, || {
                    black_box(black_box(&t).reserve_n(1).unwrap());
                });
                assert!(t.reserve_n(1).unwrap() < Duration::from_millis(1));
                g.finish();

                // try_acquire that succeeds; governor's check as the reference.
                let mut g = c.benchmark_group(format!("{}_try_ok/{threads}t", $label));
                let l = $ours(HUGE);
                cell(&mut g, "turnstile", threads, || {
                    let l = black_box(&l);
                    black_box(l.try_acquire_at(l.clock().now(), 1, OK_TIMEOUT).unwrap());
                });
                assert!(l
                    .try_acquire_at(l.clock().now(), 1, OK_TIMEOUT)
                    .unwrap()
                    .is_some());
                let t = $twin(HUGE);
                cell(&mut g, "mutex_twin", threads, || {
                    let t = black_box(&t);
                    black_box(t.try_acquire_at(t.clock().now(), 1, OK_TIMEOUT).unwrap());
                });
                assert!(t
                    .try_acquire_at(t.clock().now(), 1, OK_TIMEOUT)
                    .unwrap()
                    .is_some());
                let gov = governor_ok();
                cell(&mut g, "governor", threads, || {
                    let _ = black_box(black_box(&gov).check());
                });
                assert!(gov.check().is_ok(), "governor ran dry");
                g.finish();

                // try_acquire that fails: a debt of ~1000 s.
                let mut g = c.benchmark_group(format!("{}_try_deny/{threads}t", $label));
                let l = $ours(TINY);
                l.reserve_n(1).unwrap();
                cell(&mut g, "turnstile", threads, || {
                    let l = black_box(&l);
                    black_box(
                        l.try_acquire_at(l.clock().now(), 1, Duration::ZERO)
                            .unwrap(),
                    );
                });
                assert!(l
                    .try_acquire_at(l.clock().now(), 1, Duration::ZERO)
                    .unwrap()
                    .is_none());
                let t = $twin(TINY);
                t.reserve_n(1).unwrap();
                cell(&mut g, "mutex_twin", threads, || {
                    let t = black_box(&t);
                    black_box(
                        t.try_acquire_at(t.clock().now(), 1, Duration::ZERO)
                            .unwrap(),
                    );
                });
                assert!(t
                    .try_acquire_at(t.clock().now(), 1, Duration::ZERO)
                    .unwrap()
                    .is_none());
                let gov = governor_deny();
                cell(&mut g, "governor", threads, || {
                    let _ = black_box(black_box(&gov).check());
                });
                assert!(gov.check().is_err());
                g.finish();
            }
        }
    };
}

workloads!(
    bursty,
    "bursty",
    |rate| SmoothBursty::new(rate).expect("valid rate"),
    |rate| reference::SmoothBursty::new(rate).expect("valid rate")
);
workloads!(
    warming,
    "warming",
    |rate| SmoothWarmingUp::new(rate, WARMUP).expect("valid rate"),
    |rate| reference::SmoothWarmingUp::new(rate, WARMUP).expect("valid rate")
);

/// `SmoothBursty`'s seconds of burst: the shootout's 1 s, or 1000 permits in the burst cell.
fn burst_seconds(burst: bool) -> f64 {
    if burst {
        0.001
    } else {
        1.0
    }
}

saturated_benches!(
    bursty_saturated,
    "bursty",
    make: |clock, burst| sat::smooth_bursty(clock, burst_seconds(burst)),
    twin: |clock, burst| sat::twin_smooth_bursty(clock, burst_seconds(burst)),
    allow: |l| matches!(l.try_acquire(1, Duration::ZERO), Ok(true)),
    allow_at: |l, t| matches!(l.try_acquire_at(t, 1, Duration::ZERO), Ok(Some(_))),
    start: |l| sat::drained_at(
        l,
        l.stored_permits_at(sat::START),
        |n| l.reserve_n_at(sat::START, n).expect("a reservation"),
        sat::START
    ),
    probe: 10_000,
    burst: Schedule::burst(u64::from(sat::BURST), Duration::from_millis(1)),
);

saturated_benches!(
    warming_saturated,
    "warming",
    make: |clock, _burst| sat::smooth_warming_up(clock),
    twin: |clock, _burst| sat::twin_smooth_warming_up(clock),
    allow: |l| matches!(l.try_acquire(1, Duration::ZERO), Ok(true)),
    allow_at: |l, t| matches!(l.try_acquire_at(t, 1, Duration::ZERO), Ok(Some(_))),
    start: |l| sat::drained_at(
        l,
        l.stored_permits_at(sat::START),
        |n| l.reserve_n_at(sat::START, n).expect("a reservation"),
        sat::START
    ),
    probe: 10_000,
    burst: Schedule::burst(u64::from(sat::BURST), sat::WARMUP),
);

criterion_group! {
    name = benches;
    config = harness::config();
    targets = bursty, warming, bursty_saturated, warming_saturated
}
criterion_main!(benches);
