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
//! 3. and the limiter does hand quota out: over the run at least a tenth of
//!    `windows * quota` is granted (a limiter that refused everything would pass 1 and 2).
//!
//! Runs on the real clock with 2 and 8 threads, and on a manual clock stepped across window
//! boundaries by another thread while the workers hammer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use turnstile::{Clock, FixedWindow, Limiter, ManualClock, Nanos};

struct Grant {
    t: u64,
    t_after: u64,
    n: u64,
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn hammer<C: Clock>(
    w: &FixedWindow<C>,
    threads: usize,
    run_for: Duration,
    mover: Option<&(dyn Fn() + Sync)>,
) -> Vec<Grant> {
    let stop = AtomicBool::new(false);
    let all = Mutex::new(Vec::new());
    let start = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for id in 0..threads {
            let (stop, all, start) = (&stop, &all, &start);
            s.spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64 + 1);
                let mut mine = Vec::new();
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    let n = 1 + (xorshift(&mut rng) % 3) as u32;
                    let t = w.clock().now();
                    let granted = if n == 1 && xorshift(&mut rng) % 2 == 0 {
                        w.take_at(t).is_permitted()
                    } else {
                        w.check_n_at(t, n).is_ok()
                    };
                    if granted {
                        let t_after = w.clock().now().as_u64();
                        mine.push(Grant {
                            t: t.as_u64(),
                            t_after,
                            n: u64::from(n),
                        });
                    }
                }
                all.lock().unwrap().extend(mine);
            });
        }
        start.wait();
        let until = std::time::Instant::now() + run_for;
        while std::time::Instant::now() < until {
            match mover {
                Some(m) => m(),
                None => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    all.into_inner().unwrap()
}

/// Checks 1–3 of the module docs; returns (windows seen, total granted).
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
    assert!(
        total * 10 >= windows * u64::from(quota),
        "granted {total} over {windows} windows of {quota}"
    );
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
        assert!(
            total * 10 >= windows * u64::from(quota),
            "{total} over {windows}"
        );
    }
}
