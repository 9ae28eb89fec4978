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
//! # What the reported time means
//! As in `benches/token_bucket.rs` (see `benches/harness/mod.rs`): with `T` threads each
//! thread performs `iters` operations on the one shared limiter and the sample is the slowest
//! thread's elapsed time, divided by `iters` by criterion: the time per operation as seen by
//! one thread while `T` threads contend. Every operation includes its clock read.
//!
//! Summarize with `scripts/bench-ratios` after a run.

use std::time::Duration;

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

criterion_group! {
    name = benches;
    config = harness::config();
    targets = allow_ok, allow_deny
}
criterion_main!(benches);
