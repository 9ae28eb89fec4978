//! turnstile's lock-free `TokenBucket` vs its mutex twin vs governor's direct limiter, side by
//! side, on one shared limiter at 1 and 2 threads.
//!
//! Groups (`<workload>/<threads>t`), each with the ids `turnstile`, `mutex_twin`, `governor`:
//! * `allow_ok`: `allow()` that always succeeds. The limit is high (1e10/s) but finite, so
//!   every call runs the whole take path and commits a CAS (or, for the twin, takes the mutex
//!   and writes); `Limit::INF` would touch no state and is not used. The burst is `u32::MAX`,
//!   i.e. `tau` = burst / limit = 0.43 s: a check whose clock reading is older than the
//!   bucket's `tat - tau` is denied (deviation D2: an earlier time never creates tokens), so
//!   `tau` must outlast any preemption between a thread's clock read and its CAS. With 1e15/s
//!   and a burst of 1e9 (`tau` = 1 us) the 2-thread run saw such denials. The bucket cannot
//!   empty: 1e10 tokens/s refill against < 1e9 calls/s.
//!   governor: 1e9 cells/s (its finest period, 1 ns) with a burst of `u32::MAX` (`tau` = 4.3 s).
//! * `allow_deny`: `allow()` that always fails: 1e-3/s, burst 1, drained before measuring.
//!   governor: 1 per hour, burst 1, drained.
//! * `floor` (an id in `allow_ok` and `allow_deny`): the physical floor of a check on one
//!   shared word, with no limiter logic: one read of the same quanta clock plus a load and a
//!   CAS that increments a cache-padded `AtomicU64` (`allow_ok`), or plus a load alone
//!   (`allow_deny`). Any single-word limiter pays at least this; under contention the CAS
//!   moves the cache line between cores on every grant.
//! * `reserve_cancel`: `reserve_n(1)` then `Reservation::cancel()` on a drained 1/s bucket of
//!   burst 1, so each reservation is ~1 s in the future and its cancel really gives the token
//!   back (a cancel after the time to act is a no-op in rate.go, which a full bucket would
//!   measure instead). governor has no reservations: no cell.
//!
//! # What the reported time means
//! Every cell uses `iter_custom`. With `T` threads (1 or 2), each thread waits on a `Barrier`,
//! reads its own `Instant`, performs `iters` operations on the one shared limiter, and reads
//! the time again. The sample is the **largest** of the `T` per-thread elapsed times, which
//! criterion divides by `iters`: the figure is the time per operation *as seen by one thread*
//! while `T` threads contend (the slowest thread's). Aggregate throughput is therefore
//! `T / figure`. At 1 thread this is plain time per operation. The same definition is used for
//! all three implementations. Thread spawning and the barrier are outside the timed region.
//!
//! Summarize with `scripts/bench-ratios` after a run.

mod harness;

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use governor::{Quota, RateLimiter};
use harness::{cell, floor_cas, nz, THREADS};
use turnstile::{reference, Clock, Limit, QuantaClock, TokenBucket};

fn limit(per_second: f64) -> Limit {
    Limit::per_second(per_second).expect("valid limit")
}

// ---- limiters in the state each workload needs ------------------------------------------

/// See the module docs: finite, and a `tau` (burst / limit) of 0.43 s.
const OK_LIMIT: f64 = 1e10;
const OK_BURST: u32 = u32::MAX;

fn governor_ok() -> governor::DefaultDirectRateLimiter {
    // 1e9/s is governor's finest rate (a 1 ns replenish period).
    RateLimiter::direct(Quota::per_second(nz(1_000_000_000)).allow_burst(nz(u32::MAX)))
}

fn governor_deny() -> governor::DefaultDirectRateLimiter {
    let g = RateLimiter::direct(Quota::per_hour(nz(1)).allow_burst(nz(1)));
    assert!(g.check().is_ok());
    assert!(g.check().is_err());
    g
}

fn turnstile_deny() -> TokenBucket {
    let tb = TokenBucket::new(limit(1e-3), 1);
    assert!(tb.allow());
    assert!(!tb.allow());
    tb
}

fn twin_deny() -> reference::TokenBucket {
    let tb = reference::TokenBucket::new(limit(1e-3), 1);
    assert!(tb.allow());
    assert!(!tb.allow());
    tb
}

// ---- workloads ---------------------------------------------------------------------------

fn allow_ok(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("allow_ok/{threads}t"));

        let tb = TokenBucket::new(limit(OK_LIMIT), OK_BURST);
        cell(&mut g, "turnstile", threads, || {
            black_box(black_box(&tb).allow());
        });
        assert!(tb.allow(), "allow_ok bucket ran dry");

        let twin = reference::TokenBucket::new(limit(OK_LIMIT), OK_BURST);
        cell(&mut g, "mutex_twin", threads, || {
            black_box(black_box(&twin).allow());
        });
        assert!(twin.allow(), "allow_ok twin ran dry");

        let gov = governor_ok();
        cell(&mut g, "governor", threads, || {
            let _ = black_box(black_box(&gov).check());
        });
        assert!(gov.check().is_ok(), "allow_ok governor ran dry");

        let (clock, word) = (QuantaClock::new(), CachePadded::new(AtomicU64::new(0)));
        cell(&mut g, "floor", threads, || {
            let now = black_box(&clock).now();
            floor_cas(black_box(&word), now.as_u64());
        });

        g.finish();
    }
}

fn allow_deny(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("allow_deny/{threads}t"));

        let tb = turnstile_deny();
        cell(&mut g, "turnstile", threads, || {
            black_box(black_box(&tb).allow());
        });
        assert!(!tb.allow());

        let twin = twin_deny();
        cell(&mut g, "mutex_twin", threads, || {
            black_box(black_box(&twin).allow());
        });
        assert!(!twin.allow());

        let gov = governor_deny();
        cell(&mut g, "governor", threads, || {
            let _ = black_box(black_box(&gov).check());
        });
        assert!(gov.check().is_err());

        let (clock, word) = (QuantaClock::new(), CachePadded::new(AtomicU64::new(0)));
        cell(&mut g, "floor", threads, || {
            let now = black_box(&clock).now();
            black_box(black_box(&word).load(Ordering::Acquire) < now.as_u64());
        });

        g.finish();
    }
}

fn reserve_cancel(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("reserve_cancel/{threads}t"));

        let tb = TokenBucket::new(limit(1.0), 1);
        assert!(tb.allow());
        cell(&mut g, "turnstile", threads, || {
            let r = black_box(&tb).reserve_n(1);
            black_box(r.ok());
            r.cancel();
        });

        let twin = reference::TokenBucket::new(limit(1.0), 1);
        assert!(twin.allow());
        cell(&mut g, "mutex_twin", threads, || {
            let r = black_box(&twin).reserve_n(1);
            black_box(r.ok());
            r.cancel();
        });

        // governor has no reserve/cancel: no cell.
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = harness::config();
    targets = allow_ok, allow_deny, reserve_cancel
}
criterion_main!(benches);
