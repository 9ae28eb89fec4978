//! Many threads on one `LeakyBucket`: every granted permit time is recorded, and over the
//! sorted times the bound of the module docs must hold in every span:
//!
//! > at most `slack + 1 + d / perRequest` permits with times in any span of length `d`,
//!
//! with the real clock, with a manual clock moved by another thread, and with each thread
//! reading its own arbitrary (non-monotonic) times. Those free-running runs assert the bound
//! only: how much of it they are granted depends on how often the scheduler runs the workers.
//!
//! That the bucket hands out what it should (it limits, it does not merely refuse) is checked
//! in lockstep (`common::lockstep`): a manual clock set step by step (gaps shorter and longer
//! than the slack covers), all workers draining the bucket at each step with try_take and
//! check_n until each is refused one permit. With the clock standing still, what a step grants
//! in total is then fixed whatever the interleaving: it must equal what the mutex twin grants
//! at that time, one permit at a time until refused; and the bound holds.

use crate::common;

use std::time::Duration;

use turnstile::{reference, Clock, LeakyBucket, Limiter, ManualClock, Nanos, QuantaClock};

use common::hammer::{Hammer, Side};

/// How a worker reads the time.
#[derive(Clone, Copy)]
enum Time {
    /// The limiter's clock; the take op is the blocking `take()`.
    ClockBlocking,
    /// The limiter's clock; the take op is `take_at(now)` (never sleeps).
    Clock,
    /// The limiter's clock, and no takes: only try_take and check_n, which grant only permits
    /// that are due, so the state stays at the clock and every race is on a grantable permit.
    ClockChecksOnly,
    /// Each op at a random time in `[base, base + spread)`, in no order at all.
    Random { base: u64, spread: u64 },
}

struct Outcome {
    /// Every granted permit's time, sorted.
    permits: Vec<u64>,
    ops: u64,
}

/// `threads` workers mixing take / try_take / check_n on `l` for `run_for` of real time;
/// `mover`, if any, runs in a loop on another thread meanwhile.
fn hammer<C: Clock>(
    l: &LeakyBucket<C>,
    threads: usize,
    run_for: Duration,
    time: Time,
    mover: Option<&(dyn Fn() + Sync)>,
) -> Outcome {
    let max_n = l.slack() + 2;
    // At least 100 operations each, however late the worker is scheduled: the first on the
    // fresh bucket is granted.
    let h = Hammer {
        threads,
        run_for,
        min_ops: 100,
    };
    let side = mover.map(|f| {
        move |_: Side<'_>| {
            f();
            std::thread::yield_now();
        }
    });
    let run = h.run(
        |o, mine: &mut Vec<u64>| {
            let r = common::xorshift(o.rng);
            let now = match time {
                Time::Random { base, spread } => Nanos::new(base + r % spread),
                _ => l.clock().now(),
            };
            let mut op = (r >> 32) % 10;
            if matches!(time, Time::ClockChecksOnly) {
                op %= 7;
            }
            match op {
                0..=3 => {
                    if l.try_take_at(now) {
                        mine.push(now.as_u64());
                    }
                }
                4..=6 => {
                    let n = 1 + ((r >> 40) as u32 % max_n);
                    if l.check_n_at(now, n).is_ok() {
                        mine.extend(std::iter::repeat_n(now.as_u64(), n as usize));
                    }
                }
                _ => {
                    let p = match time {
                        Time::ClockBlocking => l.take(),
                        _ => l.take_at(now),
                    };
                    assert_ne!(p, Nanos::MAX);
                    mine.push(p.as_u64());
                }
            }
        },
        side.as_ref().map(|f| f as &(dyn Fn(Side<'_>) + Sync)),
    );
    let mut permits: Vec<u64> = run.kept.into_iter().flatten().collect();
    permits.sort_unstable();
    Outcome {
        permits,
        ops: run.ops,
    }
}

/// Checks the bound in every span of the sorted permit times in O(n): with
/// `u_i = t_i - i * T`, "`j - i + 1 <= slack + 1 + (t_j - t_i) / T` for all `i < j`" is
/// "`u_i - u_j <= slack * T`". Returns how full the whole run was (granted / allowed from the
/// first to the last permit), or a witness span that holds too many permits.
fn bound(permits: &[u64], per_request: u64, slack: u32) -> Result<f64, String> {
    if permits.is_empty() {
        return Err("nothing granted".into());
    }
    let (t, m) = (
        i128::from(per_request),
        i128::from(slack) * i128::from(per_request),
    );
    let (mut max_u, mut max_at) = (i128::from(permits[0]), 0);
    for (j, &tj) in permits.iter().enumerate() {
        let u = i128::from(tj) - j as i128 * t;
        if max_u - u > m {
            let i = max_at;
            return Err(format!(
                "{} permits in [{}, {}] (span {} ns) > slack + 1 + span / T = {}",
                j - i + 1,
                permits[i],
                tj,
                tj - permits[i],
                i128::from(slack) + 1 + i128::from(tj - permits[i]) / t
            ));
        }
        if u > max_u {
            (max_u, max_at) = (u, j);
        }
    }
    let span = permits[permits.len() - 1] - permits[0];
    let allowed = f64::from(slack) + 1.0 + span as f64 / per_request as f64;
    if permits.len() as f64 > allowed + 1e-9 {
        return Err(format!("total {} > {allowed}", permits.len()));
    }
    Ok(permits.len() as f64 / allowed)
}

fn check_bound(permits: &[u64], per_request: u64, slack: u32, what: &str) -> f64 {
    let fill = bound(permits, per_request, slack).unwrap_or_else(|e| panic!("{what}: {e}"));
    eprintln!("{what}: {} permits, {fill:.4} of the bound", permits.len());
    fill
}

fn bucket<C: Clock>(rate: u32, slack: u32, clock: C) -> LeakyBucket<C> {
    LeakyBucket::builder(rate)
        .slack(slack)
        .clock(clock)
        .build()
        .unwrap()
}

#[test]
fn real_clock_never_exceeds_the_bound() {
    for threads in [2, 8] {
        for slack in [0, 10, 1_000] {
            // 50k/s: 20 µs apart, so blocking takes spin rather than sleep.
            let l = bucket(50_000, slack, QuantaClock::new());
            let got = hammer(
                &l,
                threads,
                Duration::from_millis(300),
                Time::ClockBlocking,
                None,
            );
            let what = format!(
                "real clock, {threads} threads, slack {slack}, {} ops",
                got.ops
            );
            check_bound(&got.permits, 20_000, slack, &what);
        }
    }
}

#[test]
fn real_clock_checks_only_never_exceed_the_bound() {
    for threads in [2, 4] {
        for slack in [0, 2] {
            // 2M/s: 500 ns apart, so nearly every check races for a permit that is due.
            let l = bucket(2_000_000, slack, QuantaClock::new());
            let got = hammer(
                &l,
                threads,
                Duration::from_millis(300),
                Time::ClockChecksOnly,
                None,
            );
            let what = format!(
                "real clock, checks only, {threads} threads, slack {slack}, {} ops",
                got.ops
            );
            check_bound(&got.permits, 500, slack, &what);
        }
    }
}

#[test]
fn manual_clock_moved_by_another_thread_never_exceeds_the_bound() {
    for (threads, slack) in [(2, 0), (4, 10), (8, 3)] {
        let clock = ManualClock::new(Nanos::new(1_000_000_000));
        let l = bucket(1_000_000, slack, clock.clone()); // 1 µs apart
        let mover = move || clock.advance(Duration::from_nanos(700));
        let got = hammer(
            &l,
            threads,
            Duration::from_millis(300),
            Time::Clock,
            Some(&mover),
        );
        let what = format!("manual clock, {threads} threads, slack {slack}");
        check_bound(&got.permits, 1_000, slack, &what);
    }
}

#[test]
fn arbitrary_interleavings_of_clock_readings_never_exceed_the_bound() {
    // Every op at a random time in a 2 ms window, so readings go backwards all the time.
    for (threads, slack) in [(2, 0), (4, 10), (8, 5)] {
        let l = bucket(1_000_000, slack, ManualClock::default());
        let time = Time::Random {
            base: 5_000_000_000,
            spread: 2_000_000,
        };
        let got = hammer(&l, threads, Duration::from_millis(200), time, None);
        let what = format!("random times, {threads} threads, slack {slack}");
        check_bound(&got.permits, 1_000, slack, &what);
    }
}

#[test]
fn lockstep_drains_grant_what_the_twin_grants() {
    // Gaps in µs (1 permit each), some within the slack's reach and some beyond it.
    const GAPS: [u64; 6] = [1, 3, 50, 2, 20, 1_500];
    const STEPS: usize = 240;
    let times: Vec<Nanos> = (0..STEPS)
        .scan(5_000_000_000u64, |t, i| {
            *t += GAPS[i % GAPS.len()] * 1_000;
            Some(Nanos::new(*t))
        })
        .collect();
    for (threads, slack) in [(2, 0), (8, 0), (2, 10), (8, 10), (8, 1_000)] {
        let twin = reference::LeakyBucket::try_from(
            turnstile::LeakyBucket::builder(1_000_000)
                .slack(slack)
                .clock(ManualClock::default()),
        )
        .unwrap();
        let expected: Vec<u64> = times
            .iter()
            .map(|&t| (0..).take_while(|_| twin.try_take_at(t)).count() as u64)
            .collect();
        let clock = ManualClock::new(times[0]);
        let l = bucket(1_000_000, slack, clock.clone());
        let max_n = slack + 2;
        let per_worker = common::lockstep(
            threads,
            STEPS,
            |i| clock.set(times[i]),
            |w, i| {
                let mut x = common::rng_seed((w as u64 + 1) << 32 | i as u64);
                let t = times[i];
                let mut mine = 0u64;
                loop {
                    let r = common::xorshift(&mut x);
                    let n = if r.is_multiple_of(2) {
                        1
                    } else {
                        1 + (r >> 8) as u32 % max_n
                    };
                    let ok = if n == 1 && (r >> 4).is_multiple_of(2) {
                        l.try_take_at(t)
                    } else {
                        l.check_n_at(t, n).is_ok()
                    };
                    if ok {
                        mine += u64::from(n);
                    } else if n == 1 {
                        return mine;
                    }
                }
            },
        );
        let mut permits = Vec::new();
        for (i, &want) in expected.iter().enumerate() {
            let got: u64 = per_worker.iter().map(|p| p[i]).sum();
            assert_eq!(got, want, "{threads} threads, slack {slack}: step {i}");
            permits.extend(std::iter::repeat_n(times[i].as_u64(), got as usize));
        }
        let what = format!("lockstep, {threads} threads, slack {slack}");
        check_bound(&permits, 1_000, slack, &what);
    }
}

#[test]
fn the_bound_checker_catches_an_overgrant() {
    // 2 permits in a span of half a T with slack 0 is one too many.
    assert!(bound(&[0, 500, 1_000], 1_000, 0).is_err());
    assert_eq!(bound(&[0, 1_000, 2_000], 1_000, 0), Ok(1.0));
    assert!(bound(&[5, 5, 5], 1_000, 1).is_err());
    assert!(bound(&[5, 5, 1_005], 1_000, 1).is_ok());
    // Every pair counts, not only neighbours: pairs T apart, 1 slack, but 4 in 1.5 T.
    assert!(bound(&[0, 0, 1_000, 1_000, 2_000, 2_000], 1_000, 1).is_err());
}
