//! turnstile's lock-free `LeakyBucket` vs its mutex twin vs governor's direct limiter, side by
//! side, on one shared limiter at 1 and 2 threads.
//!
//! Groups (`<workload>/<threads>t`), each with the ids `turnstile`, `mutex_twin`, `governor`:
//! * `take_at`: the non-blocking take, `take_at(clock.now())`, ignoring the permit time. The
//!   bucket is 1e9 per second (perRequest 1 ns) with a slack of `u32::MAX` (maxSlack 4.3 s),
//!   so every take runs the whole path and commits a CAS (or, for the twin, takes the mutex
//!   and writes), and the permit is always due at once: < 1e9 takes/s cannot use up 1 ns
//!   permits, and 4.3 s of slack outlasts any preemption between a thread's clock read and
//!   its CAS. governor has no take that reports a time without waiting: no cell.
//! * `take_at_no_clock`: (1 thread only) `take_at(t)` with one `t` read before measuring, so
//!   the figure is the take alone, without the clock read every other cell pays (~7 ns with
//!   the quanta clock here). Each take still commits (the permit moves 1 ns further into the
//!   future each time). Informational: it shows how much of the uncontended time is the clock.
//! * `try_take_ok`: `try_take()` that always succeeds, on the same bucket. governor: `check()`
//!   on the equivalent GCRA quota, 1e9 cells/s (its finest period, 1 ns) with a burst of
//!   `u32::MAX` (tau 4.3 s).
//! * `try_take_deny`: `try_take()` that always fails: 1 permit per hour without slack, taken
//!   before measuring. governor: 1 per hour, burst 1, drained.
//!
//! The groups above hold the bucket still (never behind, or never refilling). A bucket in use
//! lives **saturated**: it drains continuously and refuses most takes, each refusal with its
//! retry time. Those groups (`saturated_benches!` in `bench/benches/harness/mod.rs` defines them,
//! `bench/benches/harness/saturated.rs` has the configuration, the shootout's phase 3: 1e6/s, slack
//! 1000), ids `turnstile`, `mutex_twin` and `floor` (a clock read plus one load; no governor
//! cell: governor's GCRA is the token bucket's counterpart, in `bench/benches/token_bucket.rs`):
//! * `leaky_saturated_check/<threads>t`: `Limiter::check()`, the refusal's retry time
//!   black-boxed; `leaky_saturated_allow`: `try_take()`. Checks arrive far faster than 1e6/s,
//!   so ~all are refused; each cell then asserts that checking at full speed saturates it
//!   again (fewer than half of a round of 10 000 granted, within 5 s).
//! * `leaky_saturated_check_at/1t`, `leaky_saturated_allow_at/1t`: clock-free, as
//!   `scripts/instructions` counts them, `check_n_at(t, 1)` / `try_take_at(t)` with `t`
//!   advancing 50 ns a check, so that one in 20 is granted (verified after the cell).
//! * `leaky_burst_check/1t`: clock-free, idle then a burst larger than the slack: 2000 checks at
//!   one instant, then a jump of 2 ms (past a full refill), over and over.
//! * `meter_saturated_*`, `meter_burst_check/1t`: the same for `LeakyMeter` (capacity 1000,
//!   leaking 1e6/s; `allow()` / `allow_at(t)`), ids `turnstile` and `floor` (no twin).
//!
//! # What the reported time means
//! As in `bench/benches/token_bucket.rs`: every cell uses `iter_custom`. With `T` threads (1 or 2),
//! each thread waits on a `Barrier`, reads its own `Instant`, performs `iters` operations on
//! the one shared limiter, and reads the time again. The sample is the **largest** of the `T`
//! per-thread elapsed times, which criterion divides by `iters`: the figure is the time per
//! operation *as seen by one thread* while `T` threads contend (the slowest thread's).
//! Aggregate throughput is therefore `T / figure`. At 1 thread this is plain time per
//! operation. Every operation includes its clock read. Thread spawning and the barrier are
//! outside the timed region.
//!
//! Summarize with `scripts/bench-ratios` after a run.

use std::time::Duration;

#[macro_use]
mod harness;

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};
use harness::{cell, nz, THREADS};
use std::hint::black_box;
use turnstile::{reference, Clock, LeakyBucket};

// ---- limiters in the state each workload needs ------------------------------------------

/// See the module docs: 1 ns apart, 4.3 s of slack.
const OK_RATE: u32 = 1_000_000_000;
const OK_SLACK: u32 = u32::MAX;

fn turnstile_ok() -> LeakyBucket {
    LeakyBucket::builder(OK_RATE)
        .slack(OK_SLACK)
        .build()
        .unwrap()
}

fn twin_ok() -> reference::LeakyBucket {
    reference::LeakyBucket::try_from(turnstile::LeakyBucket::builder(OK_RATE).slack(OK_SLACK))
        .unwrap()
}

fn governor_ok() -> governor::DefaultDirectRateLimiter {
    RateLimiter::direct(Quota::per_second(nz(1_000_000_000)).allow_burst(nz(u32::MAX)))
}

const HOUR: Duration = Duration::from_secs(3600);

fn turnstile_deny() -> LeakyBucket {
    let l = LeakyBucket::builder(1)
        .per(HOUR)
        .without_slack()
        .build()
        .unwrap();
    assert!(l.try_take());
    assert!(!l.try_take());
    l
}

fn twin_deny() -> reference::LeakyBucket {
    let l = reference::LeakyBucket::try_from(
        turnstile::LeakyBucket::builder(1).per(HOUR).without_slack(),
    )
    .unwrap();
    assert!(l.try_take());
    assert!(!l.try_take());
    l
}

fn governor_deny() -> governor::DefaultDirectRateLimiter {
    let g = RateLimiter::direct(Quota::per_hour(nz(1)).allow_burst(nz(1)));
    assert!(g.check().is_ok());
    assert!(g.check().is_err());
    g
}

// ---- workloads ---------------------------------------------------------------------------

fn take_at(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("take_at/{threads}t"));

        let lb = turnstile_ok();
        cell(&mut g, "turnstile", threads, || {
            let lb = black_box(&lb);
            black_box(lb.take_at(lb.clock().now()));
        });
        let now = lb.clock().now();
        assert_eq!(lb.take_at(now), now, "take_at bucket fell behind");

        let twin = twin_ok();
        cell(&mut g, "mutex_twin", threads, || {
            let twin = black_box(&twin);
            black_box(twin.take_at(twin.clock().now()));
        });
        let now = twin.clock().now();
        assert_eq!(twin.take_at(now), now, "take_at twin fell behind");

        // governor has no non-waiting take that reports a time: no cell.
        g.finish();
    }
}

fn take_at_no_clock(c: &mut Criterion) {
    let mut g = c.benchmark_group("take_at_no_clock/1t");

    let lb = turnstile_ok();
    let t = lb.clock().now();
    cell(&mut g, "turnstile", 1, || {
        black_box(black_box(&lb).take_at(black_box(t)));
    });

    let twin = twin_ok();
    let t = twin.clock().now();
    cell(&mut g, "mutex_twin", 1, || {
        black_box(black_box(&twin).take_at(black_box(t)));
    });

    g.finish();
}

fn try_take_ok(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("try_take_ok/{threads}t"));

        let lb = turnstile_ok();
        cell(&mut g, "turnstile", threads, || {
            black_box(black_box(&lb).try_take());
        });
        assert!(lb.try_take(), "try_take_ok bucket ran dry");

        let twin = twin_ok();
        cell(&mut g, "mutex_twin", threads, || {
            black_box(black_box(&twin).try_take());
        });
        assert!(twin.try_take(), "try_take_ok twin ran dry");

        let gov = governor_ok();
        cell(&mut g, "governor", threads, || {
            let _ = black_box(black_box(&gov).check());
        });
        assert!(gov.check().is_ok(), "try_take_ok governor ran dry");

        g.finish();
    }
}

fn try_take_deny(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("try_take_deny/{threads}t"));

        let lb = turnstile_deny();
        cell(&mut g, "turnstile", threads, || {
            black_box(black_box(&lb).try_take());
        });
        assert!(!lb.try_take());

        let twin = twin_deny();
        cell(&mut g, "mutex_twin", threads, || {
            black_box(black_box(&twin).try_take());
        });
        assert!(!twin.try_take());

        let gov = governor_deny();
        cell(&mut g, "governor", threads, || {
            let _ = black_box(black_box(&gov).check());
        });
        assert!(gov.check().is_err());

        g.finish();
    }
}

saturated_benches!(
    leaky_saturated,
    "leaky",
    make: |clock, _burst| sat::leaky_bucket(clock),
    twin: |clock, _burst| sat::twin_leaky_bucket(clock),
    allow: |l| l.try_take(),
    allow_at: |l, t| l.try_take_at(t),
    start: |_l| sat::START,
    probe: 10_000,
    burst: Schedule::burst(u64::from(sat::BURST), Duration::from_millis(1)),
);

saturated_benches!(
    meter_saturated,
    "meter",
    make: |clock, _burst| sat::leaky_meter(clock),
    allow: |l| l.allow(),
    allow_at: |l, t| l.allow_at(t),
    start: |_l| sat::START,
    probe: 10_000,
    burst: Schedule::burst(u64::from(sat::BURST), Duration::from_millis(1)),
);

criterion_group! {
    name = benches;
    config = harness::config();
    targets = take_at, take_at_no_clock, try_take_ok, try_take_deny, leaky_saturated,
        meter_saturated
}
criterion_main!(benches);
