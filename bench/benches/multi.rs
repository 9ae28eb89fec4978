//! Issue #23: several limits in one atomic step. `MultiTokenBucket` (2 and 4 limits) beside
//! the single-limit `TokenBucket`, the multi-limit twin (one rate.go bucket per limit under one
//! mutex) and two governor limiters checked in turn, on one shared limiter at 1 and 2 threads.
//!
//! Groups (`<workload>/<threads>t`):
//! * `multi_allowed`: `check()` that always passes, on the real clock. ids: `single`
//!   (`TokenBucket` at 1e10/s, burst `u32::MAX`, as `allow_ok` in `token_bucket.rs`), `multi2`
//!   and `multi4` (`MultiTokenBucket` of 2 and 4 limits at 1e9/s and slower, each with a burst
//!   of 1 000 000: never empty at < 1e8 checks/s; asserted after the cell), `mutex_twin2`,
//!   `governor2` (two governor limiters at 1e9/s, burst `u32::MAX`, checked in turn: both
//!   grant every time, so each check costs two), `floor` (a clock read and a CAS on a 64-bit
//!   word, as in `token_bucket.rs`) and `floor128` (a clock read, a load and a CAS on a
//!   128-bit word, inline `vmovdqa` and `lock cmpxchg16b` on x86_64:
//!   `harness::saturated::Floor128`).
//! * `multi_saturated_check`: the state a limiter lives in, at its limit: the shootout's phase-1
//!   quota (1e6/s, burst 1000) as the first limit, then laxer ones (10x and, for `multi4`,
//!   100x and 2x: `harness::saturated::multi_limits`), `check()` with the refusal's retry
//!   time black-boxed. ids: `single` (`TokenBucket` at the phase-1 quota: the multi-limit
//!   bucket's binding limit alone), `multi2`, `multi4`, `mutex_twin2`, `governor2` (the two
//!   quotas as two governor limiters checked in turn, the binding one first, so that a refusal
//!   costs governor one check: its cheapest order), `floor` (a clock read and one load),
//!   `floor128` (the same with a 128-bit load). Each
//!   cell then asserts that checking at full speed saturates it again.
//!
//! Per-operation figures as in every turnstile bench (`bench/benches/harness`): the slowest
//! thread's time per operation, clock read included. Summarize with `scripts/bench-ratios`;
//! `scripts/instructions multi2-allow multi4-allow sat-multi2-check sat-multi4-check` counts
//! the same clock-free.

mod harness;

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::sync::atomic::AtomicU64;

use crossbeam_utils::CachePadded;

use governor::{Quota, RateLimiter};
use harness::saturated as sat;
use harness::{cell, floor_cas, nz, sat_cell, THREADS};
use turnstile::multi_token_bucket::{Bandwidth, MultiTokenBucket};
use turnstile::{reference, Clock, Limit, Limiter, QuantaClock, TokenBucket};

fn limit(per_second: f64) -> Limit {
    Limit::per_second(per_second).expect("valid limit")
}

/// `k` limits that never run dry at the speed of a check: 1e9/s, 1e8/s, 5e8/s and 2e8/s (each
/// above the check rate, so each refills faster than checks take), each with a burst of
/// 1 000 000 (1 ms of refill for the first: a reading that reaches its CAS more than 1 ms
/// late is refused, as in `token_bucket.rs`'s `allow_ok`), which a 21-bit field of four
/// limits holds. Each cell then asserts that the bucket still grants.
fn allowed_limits(k: usize) -> Vec<Bandwidth> {
    [1e9, 1e8, 5e8, 2e8][..k]
        .iter()
        .map(|&r| Bandwidth::new(limit(r), 1_000_000))
        .collect()
}

fn multi_allowed(c: &mut Criterion) {
    for threads in THREADS {
        let mut g = c.benchmark_group(format!("multi_allowed/{threads}t"));

        let tb = TokenBucket::new(limit(1e10), u32::MAX);
        cell(&mut g, "single", threads, || {
            black_box(black_box(&tb).check().is_ok());
        });

        for k in [2, 4] {
            let m = MultiTokenBucket::new(&allowed_limits(k)).expect("valid limits");
            cell(&mut g, &format!("multi{k}"), threads, || {
                black_box(black_box(&m).check().is_ok());
            });
            assert!(m.check().is_ok(), "multi_allowed multi{k} ran dry");
        }

        let twin = reference::MultiTokenBucket::new(&allowed_limits(2)).expect("valid limits");
        cell(&mut g, "mutex_twin2", threads, || {
            black_box(Limiter::check(black_box(&twin)).is_ok());
        });

        let quota = Quota::per_second(nz(1_000_000_000)).allow_burst(nz(u32::MAX));
        let (a, b) = (RateLimiter::direct(quota), RateLimiter::direct(quota));
        cell(&mut g, "governor2", threads, || {
            black_box(black_box(&a).check().is_ok() && black_box(&b).check().is_ok());
        });

        let (clock, word) = (QuantaClock::new(), CachePadded::new(AtomicU64::new(0)));
        cell(&mut g, "floor", threads, || {
            let now = black_box(&clock).now();
            floor_cas(black_box(&word), now.as_u64());
        });

        let floor = sat::Floor128::new(QuantaClock::new());
        cell(&mut g, "floor128", threads, || floor.grant());

        g.finish();
    }
}

/// Checks of the real-clock saturation probe after each cell.
const PROBE: u32 = 10_000;

fn multi_saturated(c: &mut Criterion) {
    for threads in THREADS {
        let name = format!("multi_saturated_check/{threads}t");
        let mut g = c.benchmark_group(&name);

        let tb = sat::token_bucket(QuantaClock::new());
        sat_cell(&mut g, &name, "single", threads, PROBE, || sat::check(&tb));

        for k in [2, 4] {
            let m = sat::multi(QuantaClock::new(), k);
            sat_cell(&mut g, &name, &format!("multi{k}"), threads, PROBE, || {
                sat::check(&m)
            });
        }

        let twin = sat::twin_multi(QuantaClock::new(), 2);
        sat_cell(&mut g, &name, "mutex_twin2", threads, PROBE, || {
            sat::check(&twin)
        });

        let gov = sat::governor_pair();
        sat_cell(&mut g, &name, "governor2", threads, PROBE, || {
            sat::gov_check_pair(&gov)
        });

        let floor = sat::Floor::new(QuantaClock::new());
        cell(&mut g, "floor", threads, || {
            black_box(floor.check());
        });

        let floor = sat::Floor128::new(QuantaClock::new());
        cell(&mut g, "floor128", threads, || {
            black_box(floor.check());
        });

        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = harness::config();
    targets = multi_allowed, multi_saturated
}
criterion_main!(benches);
