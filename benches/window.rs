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
//! Per-operation figures as in every turnstile bench (`benches/harness`): the slowest thread's
//! time per operation, clock read included. Summarize with `scripts/bench-ratios`.

use std::time::Duration;

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

criterion_group! {
    name = benches;
    config = harness::config();
    targets = take_ok, take_deny
}
criterion_main!(benches);
