//! turnstile's lock-free `SlidingWindow` vs its mutex twin, side by side, on one shared
//! limiter at 1 and 2 threads. (governor has no sliding-window counter: no cell.)
//!
//! Groups (`<workload>/<threads>t`), each with the ids `turnstile` and `mutex_twin`:
//! * `sliding_allow_ok`: `allow()` that always succeeds, so every call runs the whole path and commits
//!   a CAS (or, for the twin, takes the mutex and writes). Quota `u32::MAX` per second: a
//!   window holds ~4.3e9 grants, and both windows together weigh at most the grants of two
//!   seconds, which at well under 1e9 calls per second per thread stays far below the quota,
//!   so no call is ever denied (after each cell, more than half the quota must remain).
//! * `sliding_allow_deny`: `allow()` that always fails: quota 1 per hour, used before measuring (the
//!   quanta clock starts at the process start, so the run stays inside the first window). A
//!   denial is one load and no write.
//!
//! The groups above never fill the window or never leave it. A limiter in use lives
//! **saturated**: most checks are refused, each refusal with its retry time. Those groups
//! (`saturated_benches!` in `bench/benches/harness/mod.rs` defines them,
//! `bench/benches/harness/saturated.rs` has the configuration, the shootout's phase 3: 10 000 per
//! 10 ms, the phase-1 rate), ids `turnstile`, `mutex_twin` and `floor` (a clock read plus one
//! load):
//! * `sliding_saturated_check/<threads>t`: `Limiter::check()`, the refusal's retry time
//!   black-boxed; `sliding_saturated_allow`: `allow()`. Each cell then asserts that checking
//!   at full speed saturates it again (fewer than half of a round of 100 000 checks, more
//!   than 2 windows' quota, granted, within 5 s).
//! * `sliding_saturated_check_at/1t`, `sliding_saturated_allow_at/1t`: clock-free, as
//!   `scripts/instructions` counts them, `check_n_at(t, 1)` / `allow_at(t)` with `t`
//!   advancing 50 ns a check (the sliding estimate then grants one check in 40; verified after
//!   the cell).
//! * `sliding_burst_check/1t`: clock-free, 20 000 checks (twice the quota) at one instant, then
//!   a jump of two windows (the previous window forgotten), over and over.
//!
//! # What the reported time means
//! As in `bench/benches/token_bucket.rs` (see `bench/benches/harness/mod.rs`): with `T` threads each
//! thread performs `iters` operations on the one shared limiter and the sample is the slowest
//! thread's elapsed time, divided by `iters` by criterion: the time per operation as seen by
//! one thread while `T` threads contend. Every operation includes its clock read.
//!
//! Summarize with `scripts/bench-ratios` after a run.

use std::time::Duration;

#[macro_use]
mod harness;

use criterion::{criterion_group, criterion_main, Criterion};
use harness::{cell, THREADS};
use std::hint::black_box;
use turnstile::{reference, SlidingWindow};

// ---- limiters in the state each workload needs ------------------------------------------

/// See the module docs: never denies.
const OK_QUOTA: u32 = u32::MAX;
const OK_PERIOD: Duration = Duration::from_secs(1);

const HOUR: Duration = Duration::from_secs(3600);

fn turnstile_deny() -> SlidingWindow {
    let l = SlidingWindow::new(1, HOUR).unwrap();
    assert!(l.allow());
    assert!(!l.allow());
    l
}

fn twin_deny() -> reference::SlidingWindow {
    let l = reference::SlidingWindow::new(1, HOUR).unwrap();
    assert!(l.allow());
    assert!(!l.allow());
    l
}

// ---- workloads ---------------------------------------------------------------------------

fn allow_ok(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("sliding_allow_ok/{threads}t"));

        let sw = SlidingWindow::new(OK_QUOTA, OK_PERIOD).unwrap();
        cell(&mut g, "turnstile", threads, || {
            black_box(black_box(&sw).allow());
        });
        assert!(
            sw.status().remaining > OK_QUOTA / 2,
            "allow_ok limiter came near its quota"
        );

        let twin = reference::SlidingWindow::new(OK_QUOTA, OK_PERIOD).unwrap();
        cell(&mut g, "mutex_twin", threads, || {
            black_box(black_box(&twin).allow());
        });
        assert!(
            twin.status().remaining > OK_QUOTA / 2,
            "allow_ok twin came near its quota"
        );

        g.finish();
    }
}

fn allow_deny(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("sliding_allow_deny/{threads}t"));

        let sw = turnstile_deny();
        cell(&mut g, "turnstile", threads, || {
            black_box(black_box(&sw).allow());
        });
        assert!(!sw.allow());

        let twin = twin_deny();
        cell(&mut g, "mutex_twin", threads, || {
            black_box(black_box(&twin).allow());
        });
        assert!(!twin.allow());

        g.finish();
    }
}

saturated_benches!(
    sliding_saturated,
    "sliding",
    make: |clock, _burst| sat::sliding_window(clock),
    twin: |clock, _burst| sat::twin_sliding_window(clock),
    allow: |l| l.allow(),
    allow_at: |l, t| l.allow_at(t),
    start: |_l| sat::START,
    probe: 100_000,
    burst: Schedule::burst(u64::from(sat::QUOTA), sat::WINDOW),
);

criterion_group! {
    name = benches;
    config = harness::config();
    targets = allow_ok, allow_deny, sliding_saturated
}
criterion_main!(benches);
