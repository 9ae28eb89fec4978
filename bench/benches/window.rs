//! turnstile's lock-free `FixedWindow` vs its mutex twin (go-zero's script under a mutex),
//! side by side, on one shared limiter at 1 and 2 threads. governor has no fixed window: no
//! governor cell.
//!
//! Groups (`<workload>/<threads>t`), ids `turnstile` and `mutex_twin`:
//! * `fixed_take_ok`: `take()` that is always permitted: a quota of `u32::MAX` per 1 s window
//!   (no run reaches 4.3 billion takes in a second here), so every take commits a CAS (or
//!   takes the mutex and writes) and windows roll over every second, as in production.
//! * `fixed_take_deny`: `take()` that is always `OverQuota`: a quota of 1 per hour, spent
//!   before measuring. turnstile decides it from one load; the twin takes the mutex and, as
//!   go-zero's `INCRBY` does, counts the refused request.
//!
//!
//! The groups above never fill a window or never leave one. A window in use lives
//! **saturated**: each window's quota is spent at its start and the rest of its checks are
//! refused, each refusal with its retry time (the next window). Those groups
//! (`saturated_benches!` in `bench/benches/harness/mod.rs` defines them,
//! `bench/benches/harness/saturated.rs` has the configuration, the shootout's phase 3: 10 000 per
//! 10 ms window, the phase-1 rate), ids `turnstile`, `mutex_twin` and `floor` (a clock read
//! plus one load):
//! * `fixed_saturated_check/<threads>t`: `Limiter::check()`, the refusal's retry time
//!   black-boxed; `fixed_saturated_allow`: `take().is_permitted()`. Each cell then asserts that
//!   checking at full speed saturates it again (fewer than half of a round of 100 000 checks,
//!   more than 2 windows' quota, granted, within 5 s).
//! * `fixed_saturated_check_at/1t`, `fixed_saturated_allow_at/1t`: clock-free, as
//!   `scripts/instructions` counts them, `check_n_at(t, 1)` / `take_at(t)` with `t` advancing
//!   50 ns a check, so that one in 20 is granted (verified after the cell).
//! * `fixed_burst_check/1t`: clock-free, 20 000 checks (twice the quota) at one instant, then a
//!   jump of two windows, over and over.
//!
//! Per-operation figures as in every turnstile bench (`bench/benches/harness`): the slowest thread's
//! time per operation, clock read included. Summarize with `scripts/bench-ratios`.

use std::time::Duration;

#[macro_use]
mod harness;

use criterion::{criterion_group, criterion_main, Criterion};
use harness::{cell, THREADS};
use std::hint::black_box;
use turnstile::{reference, FixedWindow, Outcome};

const HOUR: Duration = Duration::from_secs(3600);

fn take_ok(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("fixed_take_ok/{threads}t"));

        let w = FixedWindow::new(u32::MAX, Duration::from_secs(1)).unwrap();
        cell(&mut g, "turnstile", threads, || {
            let _ = black_box(black_box(&w).take());
        });
        assert!(w.take().is_permitted(), "fixed_take_ok window ran dry");

        let twin = reference::FixedWindow::new(u32::MAX, Duration::from_secs(1)).unwrap();
        cell(&mut g, "mutex_twin", threads, || {
            let _ = black_box(black_box(&twin).take());
        });
        assert!(twin.take().is_permitted(), "fixed_take_ok twin ran dry");

        g.finish();
    }
}

fn take_deny(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("fixed_take_deny/{threads}t"));

        let w = FixedWindow::new(1, HOUR).unwrap();
        assert_eq!(w.take(), Outcome::HitQuota);
        cell(&mut g, "turnstile", threads, || {
            let _ = black_box(black_box(&w).take());
        });
        assert_eq!(w.take(), Outcome::OverQuota);

        let twin = reference::FixedWindow::new(1, HOUR).unwrap();
        assert_eq!(twin.take(), Outcome::HitQuota);
        cell(&mut g, "mutex_twin", threads, || {
            let _ = black_box(black_box(&twin).take());
        });
        assert_eq!(twin.take(), Outcome::OverQuota);

        g.finish();
    }
}

saturated_benches!(
    fixed_saturated,
    "fixed",
    make: |clock, _burst| sat::fixed_window(clock),
    twin: |clock, _burst| sat::twin_fixed_window(clock),
    allow: |l| l.take().is_permitted(),
    allow_at: |l, t| l.take_at(t).is_permitted(),
    start: |_l| sat::START,
    probe: 100_000,
    burst: Schedule::burst(u64::from(sat::QUOTA), sat::WINDOW),
);

criterion_group! {
    name = benches;
    config = harness::config();
    targets = take_ok, take_deny, fixed_saturated
}
criterion_main!(benches);
