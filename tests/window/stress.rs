//! Many threads on one `FixedWindow`, windows aligned to multiples of the period so the test
//! knows every window's bounds. Each grant is recorded with the time it was asked at (`t`)
//! and a clock reading taken after it returned (`t_after`): the window that counted it lies
//! between the window of `t` and the window of `t_after` (a take whose `t` is stale is counted
//! in the window current at its CAS, never an earlier one). So:
//!
//! 1. the grants whose `t` and `t_after` fall in the same window `k` were all counted in `k`:
//!    together at most `quota`;
//! 2. any grant whose `t` and `t_after` both fall in windows `k` or `k + 1` was counted in one
//!    of the two: at most `2 * quota` in all (this covers the roll-over instant);
//!
//! Runs on the real clock with 2 and 8 threads, and on a manual clock stepped across window
//! boundaries by another thread while the workers hammer. Those free-running runs assert 1
//! and 2 only (and that something was granted): how much quota they reach depends on how often
//! the scheduler runs the workers.
//!
//! 3. That the limiter does hand its quota out (a limiter that refused everything would pass 1
//!    and 2) is checked in lockstep (`common::lockstep`): a manual clock set just before, on,
//!    just after and in the middle of every window start, all workers draining the limiter
//!    at each of those times until each is refused one permit. Whatever the interleaving,
//!    every window then grants exactly `quota`, and 1 and 2 hold.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use turnstile::{Clock, FixedWindow, Limiter, ManualClock, Nanos};

use common::hammer::{Hammer, Side};

struct Grant {
    t: u64,
    t_after: u64,
    n: u64,
}

/// `threads` workers taking and checking 1 to 3 permits at the window's clock for `run_for`
/// of real time, `mover` (if any) in a loop on another thread meanwhile; every grant.
fn hammer<C: Clock>(
    w: &FixedWindow<C>,
    threads: usize,
    run_for: Duration,
    mover: Option<&(dyn Fn() + Sync)>,
) -> Vec<Grant> {
    // At least 100 operations each, however late the worker is scheduled: the first on the
    // fresh limiter is granted.
    let h = Hammer {
        threads,
        run_for,
        min_ops: 100,
    };
    let side = mover.map(|m| move |_: Side<'_>| m());
    let run = h.run(
        |o, kept: &mut Vec<Grant>| {
            let n = 1 + (common::xorshift(o.rng) % 3) as u32;
            let t = w.clock().now();
            let granted = if n == 1 && common::xorshift(o.rng).is_multiple_of(2) {
                w.take_at(t).is_permitted()
            } else {
                w.check_n_at(t, n).is_ok()
            };
            if granted {
                let t_after = w.clock().now().as_u64();
                kept.push(Grant {
                    t: t.as_u64(),
                    t_after,
                    n: u64::from(n),
                });
            }
        },
        side.as_ref().map(|f| f as &(dyn Fn(Side<'_>) + Sync)),
    );
    run.kept.into_iter().flatten().collect()
}

/// Checks 1 and 2 of the module docs; returns (windows seen, total granted).
fn check(grants: &[Grant], quota: u64, period: u64) -> (u64, u64) {
    let mut exact: BTreeMap<u64, u64> = BTreeMap::new();
    let mut pairs: BTreeMap<u64, u64> = BTreeMap::new();
    let mut total = 0;
    for g in grants {
        let (a, b) = (g.t / period, g.t_after / period);
        assert!(a <= b);
        total += g.n;
        if a == b {
            *exact.entry(a).or_default() += g.n;
        }
        if b - a <= 1 {
            // Counted in a or a + 1 (= b when b > a): both pairs (a - 1, a) and (a, a + 1)
            // must include it when a == b; only (a, b) otherwise.
            *pairs.entry(a).or_default() += g.n;
            if a == b && a > 0 {
                *pairs.entry(a - 1).or_default() += g.n;
            }
        }
    }
    for (k, &c) in &exact {
        assert!(c <= quota, "window {k}: {c} grants > quota {quota}");
    }
    for (k, &c) in &pairs {
        assert!(
            c <= 2 * quota,
            "windows {k},{}: {c} grants > 2 x {quota}",
            k + 1
        );
    }
    let first = grants.iter().map(|g| g.t / period).min().unwrap_or(0);
    let last = grants.iter().map(|g| g.t_after / period).max().unwrap_or(0);
    (last - first + 1, total)
}

fn aligned<C: Clock>(quota: u32, period: Duration, clock: C) -> FixedWindow<C> {
    FixedWindow::builder(quota, period)
        .align_utc()
        .unix_origin(Duration::ZERO) // boundaries at multiples of the period on the clock
        .clock(clock)
        .build()
        .unwrap()
}

fn real_clock(threads: usize) {
    let (quota, period) = (40u32, Duration::from_millis(2));
    let w = FixedWindow::builder(quota, period)
        .align_utc()
        .unix_origin(Duration::ZERO)
        .build()
        .unwrap();
    let grants = hammer(&w, threads, Duration::from_millis(400), None);
    let (windows, total) = check(&grants, u64::from(quota), period.as_nanos() as u64);
    eprintln!("real clock, {threads} threads: {total} granted over {windows} windows");
    assert!(total > 0, "nothing granted");
}

#[test]
fn never_more_than_the_quota_per_window_2_threads() {
    real_clock(2);
}

#[test]
fn never_more_than_the_quota_per_window_8_threads() {
    real_clock(8);
}

#[test]
fn manual_clock_stepped_across_boundaries() {
    let (quota, period) = (25u32, 1_000_000u64);
    let clock = ManualClock::new(Nanos::new(period - 3));
    let w = aligned(quota, Duration::from_nanos(period), clock.clone());
    let step = || {
        // A few steps per window, landing on and next to the boundaries.
        clock.advance(Duration::from_nanos(period / 4 + 1));
        std::thread::yield_now();
    };
    for threads in [2, 8] {
        let grants = hammer(&w, threads, Duration::from_millis(200), Some(&step));
        let (windows, total) = check(&grants, u64::from(quota), period);
        eprintln!("manual clock, {threads} threads: {total} granted over {windows} windows");
        assert!(total > 0, "nothing granted");
    }
}

#[test]
fn lockstep_drains_grant_exactly_the_quota_in_every_window() {
    let (quota, period) = (25u32, 1_000_000u64);
    // Just before, on, just after and in the middle of the starts of windows 1001..1050.
    let times: Vec<u64> = (1_001..1_051u64)
        .flat_map(|k| {
            [
                k * period - 1,
                k * period,
                k * period + 1,
                k * period + period / 2,
            ]
        })
        .collect();
    for threads in [2, 8] {
        let clock = ManualClock::new(Nanos::new(times[0]));
        let w = aligned(quota, Duration::from_nanos(period), clock.clone());
        let per_worker = common::lockstep(
            threads,
            times.len(),
            |i| clock.set(Nanos::new(times[i])),
            |id, i| {
                let mut rng = common::rng_seed((id as u64 + 1) << 32 | i as u64);
                let t = Nanos::new(times[i]);
                let mut mine = Vec::new();
                loop {
                    let n = 1 + (common::xorshift(&mut rng) % 3) as u32;
                    let granted = if n == 1 {
                        w.take_at(t).is_permitted()
                    } else {
                        w.check_n_at(t, n).is_ok()
                    };
                    if granted {
                        mine.push(Grant {
                            t: t.as_u64(),
                            t_after: t.as_u64(),
                            n: u64::from(n),
                        });
                    } else if n == 1 {
                        return mine;
                    }
                }
            },
        );
        let grants: Vec<Grant> = per_worker.into_iter().flatten().flatten().collect();
        check(&grants, u64::from(quota), period);
        let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
        for g in &grants {
            *per_window.entry(g.t / period).or_default() += g.n;
        }
        // Windows 1000 (the one before the first start) to 1050, each drained.
        assert_eq!(per_window.len(), 51, "{threads} threads: {per_window:?}");
        for (k, &c) in &per_window {
            assert_eq!(c, u64::from(quota), "{threads} threads: window {k}");
        }
    }
}
