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
//! The groups above hold the word still (always granted, or a bucket that never refills). A
//! bucket in use lives **saturated**: it refills continuously and refuses most checks, each
//! refusal with its retry time. Those groups (`bench/benches/harness/saturated.rs` has the
//! configuration, the shootout's phase 1: 1e6/s, burst 1000; governor the same quota), with
//! the ids `turnstile`, `mutex_twin`, `governor` and `floor`:
//! * `saturated_check`: `Limiter::check()` on the real clock, the refusal's
//!   `Denied::retry_at` black-boxed; governor's `check()` with its retry time from
//!   `NotUntil::earliest_possible()`. Checks arrive far faster than 1e6/s, so ~all are
//!   refused; each cell then asserts that checking at full speed saturates it again (fewer
//!   than half of a round of 10 000 granted, within 5 s). `floor`: a read of
//!   the quanta clock plus one load (a refusal decided from the word alone).
//! * `saturated_allow`: the same with `allow()` (governor: `check().is_ok()`).
//! * `saturated_check_at`, `saturated_allow_at` (1 thread): clock-free, as
//!   `scripts/instructions` counts them: `check_n_at(t, 1)` / `allow_at(t)` with `t` advancing
//!   50 ns a check, so that one check in 20 is granted; governor on a `FakeRelativeClock`
//!   advanced by 50 ns a check (its clock read is one load; the advance, a load and a CAS on
//!   the fake clock's word, is in its figure); `floor`: one load. Each cell then verifies that
//!   200 000 more checks grant one in 20.
//! * `burst_check` (1 thread, clock-free): idle, then a burst larger than the bucket: 2000
//!   checks at one instant (1000 granted, 1000 refused), then the time jumps 2 ms (past a full
//!   refill), over and over. No floor: half the checks are grants.
//! * `sometimes_saturated_run` (`Sometimes`, the port of x/time/rate's `sometimes.go`, at an
//!   interval of 1 µs: the phase-1 rate), `run(|| ())` on the real clock, and
//!   `sometimes_saturated_run_at` (1 thread) clock-free as above: ids `turnstile` and `floor`
//!   (it has neither twin nor governor counterpart).
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
use harness::saturated::{self as sat, Expect, Schedule};
use harness::{cell, floor_cas, nz, sat_cell, stepped_cell, THREADS};
use turnstile::{reference, Clock, Limit, ManualClock, QuantaClock, TokenBucket};

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

/// Checks of the real-clock saturation probe after each cell.
const PROBE: u32 = 10_000;

fn saturated(c: &mut Criterion) {
    for threads in THREADS {
        saturated_group::<true>(c, "check", threads);
        saturated_group::<false>(c, "allow", threads);
    }
}

/// `saturated_<op>/<threads>t`: `Limiter::check` if `CHECK`, else `allow`.
fn saturated_group<const CHECK: bool>(c: &mut Criterion, op: &str, threads: usize) {
    let name = format!("saturated_{op}/{threads}t");
    let mut g = c.benchmark_group(&name);

    let tb = sat::token_bucket(QuantaClock::new());
    sat_cell(&mut g, &name, "turnstile", threads, PROBE, || {
        if CHECK {
            sat::check(&tb)
        } else {
            black_box(&tb).allow()
        }
    });

    let twin = sat::twin_token_bucket(QuantaClock::new());
    sat_cell(&mut g, &name, "mutex_twin", threads, PROBE, || {
        if CHECK {
            sat::check(&twin)
        } else {
            black_box(&twin).allow()
        }
    });

    let gov = sat::governor();
    sat_cell(&mut g, &name, "governor", threads, PROBE, || {
        if CHECK {
            sat::gov_check(&gov)
        } else {
            black_box(&gov).check().is_ok()
        }
    });

    let floor = sat::Floor::new(QuantaClock::new());
    cell(&mut g, "floor", threads, || {
        black_box(floor.check());
    });

    g.finish();
}

fn saturated_at(c: &mut Criterion) {
    saturated_at_group::<true>(c, "check");
    saturated_at_group::<false>(c, "allow");
}

/// `saturated_<op>_at/1t`, clock-free: `check_n_at` if `CHECK`, else `allow_at`.
fn saturated_at_group<const CHECK: bool>(c: &mut Criterion, op: &str) {
    let name = format!("saturated_{op}_at/1t");
    let mut g = c.benchmark_group(&name);
    let s = Schedule::saturated;
    let e = Expect::Saturated;

    let tb = sat::token_bucket(ManualClock::new(sat::START));
    stepped_cell(&mut g, &name, "turnstile", s(), e, |t, _| {
        if CHECK {
            sat::check_at(&tb, t)
        } else {
            black_box(&tb).allow_at(black_box(t))
        }
    });

    let twin = sat::twin_token_bucket(ManualClock::new(sat::START));
    stepped_cell(&mut g, &name, "mutex_twin", s(), e, |t, _| {
        if CHECK {
            sat::check_at(&twin, t)
        } else {
            black_box(&twin).allow_at(black_box(t))
        }
    });

    let (gov, clock) = sat::governor_fake();
    stepped_cell(&mut g, &name, "governor", s(), e, |_, moved| {
        sat::advance(&clock, moved);
        if CHECK {
            sat::gov_check(&gov)
        } else {
            black_box(&gov).check().is_ok()
        }
    });

    let floor = sat::Floor::new(ManualClock::new(sat::START));
    stepped_cell(&mut g, &name, "floor", s(), Expect::Refused, |t, _| {
        floor.check_at(t)
    });

    g.finish();
}

fn burst(c: &mut Criterion) {
    let name = "burst_check/1t";
    let mut g = c.benchmark_group(name);
    let s = || Schedule::burst(u64::from(sat::BURST), std::time::Duration::from_millis(1));
    let e = Expect::Burst;

    let tb = sat::token_bucket(ManualClock::new(sat::START));
    stepped_cell(&mut g, name, "turnstile", s(), e, |t, _| {
        sat::check_at(&tb, t)
    });

    let twin = sat::twin_token_bucket(ManualClock::new(sat::START));
    stepped_cell(&mut g, name, "mutex_twin", s(), e, |t, _| {
        sat::check_at(&twin, t)
    });

    let (gov, clock) = sat::governor_fake();
    stepped_cell(&mut g, name, "governor", s(), e, |_, moved| {
        sat::advance(&clock, moved);
        sat::gov_check(&gov)
    });

    g.finish();
}

fn sometimes(c: &mut Criterion) {
    for threads in THREADS {
        let name = format!("sometimes_saturated_run/{threads}t");
        let mut g = c.benchmark_group(&name);
        let l = sat::sometimes(QuantaClock::new());
        sat_cell(&mut g, &name, "turnstile", threads, PROBE, || {
            black_box(&l).run(|| ())
        });
        let floor = sat::Floor::new(QuantaClock::new());
        cell(&mut g, "floor", threads, || {
            black_box(floor.check());
        });
        g.finish();
    }

    let name = "sometimes_saturated_run_at/1t";
    let mut g = c.benchmark_group(name);
    let l = sat::sometimes(ManualClock::new(sat::START));
    stepped_cell(
        &mut g,
        name,
        "turnstile",
        Schedule::saturated(),
        Expect::Saturated,
        |t, _| black_box(&l).run_at(black_box(t), || ()),
    );
    let floor = sat::Floor::new(ManualClock::new(sat::START));
    stepped_cell(
        &mut g,
        name,
        "floor",
        Schedule::saturated(),
        Expect::Refused,
        |t, _| floor.check_at(t),
    );
    g.finish();
}

criterion_group! {
    name = benches;
    config = harness::config();
    targets = allow_ok, allow_deny, reserve_cancel, saturated, saturated_at, burst, sometimes
}
criterion_main!(benches);
