//! Many threads on one `SlidingWindow` (quota 50 per 1 ms): every grant is recorded with `t`,
//! the time its check was made at, and `after`, a clock reading taken after the check
//! returned. The guarantee of the module docs is then checked over the records, soundly for
//! any linearization of the threads.
//!
//! **Where a grant counts.** A grant linearizes at its CAS, judged at its own `t` clamped up to
//! the start of the window the state was in; that window was set by grants committed earlier,
//! at times read earlier. So its effective window lies between `window(t)` and
//! `window(after)`. With the real clock `after` gets a margin, `SLOP`: quanta reads the TSC
//! with a plain `rdtsc`, which the CPU may execute before the CAS retires, and TSCs of two
//! cores may differ slightly. A grant is **unambiguous** in window `k` if both ends are in `k`.
//!
//! **The checks.**
//! 1. Each window: the unambiguous grants of window `k` number at most `quota` (the limiter's
//!    `curr` for `k` counts at least them).
//! 2. Each pair of consecutive windows: all grants whose two ends lie in the pair number at
//!    most `2 * quota`.
//! 3. The weighted rule, at each unambiguous grant `g` of window `k + 1`, at offset
//!    `e = t_g - (k + 1) P` (exact: its clamp cannot move it, the state was in `k + 1` at
//!    most): every grant of effective window `k` committed before `g` (the state's window
//!    never goes back), so the limiter's `prev` is at least `U` = the unambiguous grants of
//!    window `k`; and its `curr` counted, before `g`, at least `V` = the unambiguous grants of
//!    window `k + 1` that had returned before `g` read its time (`after_h + SLOP < t_g`: their
//!    CAS precedes `g`'s). So `U * (P - e) + (V + n_g) * P <= quota * P` must hold. A limiter
//!    that ignored the previous window (a fixed window) fails it.
//!
//! **Free-running runs** (the real clock, 2 and 8 threads; a `ManualClock` that a controller
//! thread steps by a quarter period, landing exactly on every window start while the workers
//! hammer) assert the three checks only: which cases they reach is up to the scheduler (on a
//! loaded machine the controller may step just a few times).
//!
//! **The lockstep run** forces the cases: the clock is set to every quarter period, window
//! start included, and at each step all workers drain the limiter at once until each is
//! refused one permit (`common::lockstep`). With the clock standing still during a step, every
//! grant is unambiguous, each window was drained at each of its steps when the next begins (so
//! check 3 is evaluated, with `U > 0`, at the grants of every window after the first; each
//! window grants something by its last quarter), and what each step grants in total is fixed
//! by the rules: it must equal what the mutex twin grants at that
//! time, one permit at a time until refused. A limiter that refuses, over-grants, or ignores
//! the previous window fails, whatever the interleaving.

use crate::common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use turnstile::{reference, Clock, Limiter, ManualClock, Nanos, QuantaClock, SlidingWindow};

use common::hammer::{Hammer, Side};

const QUOTA: u32 = 50;
const PERIOD_NS: u64 = 1_000_000;
/// The margin on `after` for the real clock (see the module docs).
const SLOP: u64 = 2_000;
/// Each worker makes at least this many checks, however late it is scheduled: the first
/// check on the fresh limiter is granted, so no run ends with nothing granted.
const MIN_OPS: u64 = 100;

#[derive(Clone, Copy, Debug)]
struct Grant {
    t: u64,
    after: u64,
    n: u32,
}

/// `threads` workers checking 1 to 3 permits at the limiter's clock for `run_for` of real
/// time; `mover`, if any, runs in a loop on another thread meanwhile, given the number of
/// checks made so far and the stop flag. Returns every grant and the number of checks.
fn hammer<C: Clock>(
    l: &SlidingWindow<C>,
    threads: usize,
    run_for: Duration,
    mover: Option<&(dyn Fn(Side<'_>) + Sync)>,
) -> (Vec<Grant>, u64) {
    let h = Hammer {
        threads,
        run_for,
        min_ops: MIN_OPS,
    };
    let run = h.run(
        |o, mine: &mut Vec<Grant>| {
            let n = match common::xorshift(o.rng) % 8 {
                0 => 2,
                1 => 3,
                _ => 1,
            };
            let t = l.clock().now();
            let ok = if n == 1 {
                l.allow_at(t)
            } else {
                l.check_n_at(t, n).is_ok()
            };
            let after = l.clock().now();
            if ok {
                mine.push(Grant {
                    t: t.as_u64(),
                    after: after.as_u64(),
                    n,
                });
            }
            o.progress.fetch_add(1, Ordering::Relaxed);
        },
        mover,
    );
    (run.kept.into_iter().flatten().collect(), run.ops)
}

#[derive(Debug)]
#[allow(dead_code)] // the fields are printed through Debug
struct Report {
    permits: u64,
    ambiguous: u64,
    /// Windows in which something was granted.
    windows: u64,
    /// Permits granted / the quota, over those windows.
    fill: f64,
    /// Grants at which check 3 was evaluated with a nonzero `U`.
    weighted_checks: u64,
}

/// The three checks of the module docs; a witness on failure.
fn verify(grants: &[Grant], quota: u32, p: u64, slop: u64) -> Result<Report, String> {
    if grants.is_empty() {
        return Err("nothing granted".into());
    }
    let win = |t: u64| t / p;
    let q = u64::from(quota);
    // Unambiguous grants per window; pair sums keyed by the pair's first window.
    let mut unambiguous: BTreeMap<u64, Vec<Grant>> = BTreeMap::new();
    let mut pairs: BTreeMap<u64, u64> = BTreeMap::new();
    let mut ambiguous = 0;
    for g in grants {
        let (lo, hi) = (win(g.t), win(g.after + slop));
        if hi < lo {
            return Err(format!("{g:?}: read the clock backwards"));
        }
        let n = u64::from(g.n);
        match hi - lo {
            0 => {
                unambiguous.entry(lo).or_default().push(*g);
                *pairs.entry(lo).or_default() += n;
                if lo > 0 {
                    *pairs.entry(lo - 1).or_default() += n;
                }
            }
            1 => {
                ambiguous += n;
                *pairs.entry(lo).or_default() += n;
            }
            _ => ambiguous += n,
        }
    }
    let sum = |v: &[Grant]| v.iter().map(|g| u64::from(g.n)).sum::<u64>();
    // 1. Each window.
    for (k, v) in &unambiguous {
        if sum(v) > q {
            return Err(format!("window {k}: {} unambiguous permits > {q}", sum(v)));
        }
    }
    // 2. Each pair.
    for (k, total) in &pairs {
        if *total > 2 * q {
            return Err(format!(
                "windows {k}, {}: {total} permits > {}",
                k + 1,
                2 * q
            ));
        }
    }
    // 3. The weighted rule.
    let (p128, q128) = (u128::from(p), u128::from(q));
    let mut weighted_checks = 0;
    for (k1, v) in &unambiguous {
        let u = match k1.checked_sub(1).and_then(|k| unambiguous.get(&k)) {
            Some(prev) => sum(prev),
            None => 0,
        };
        let mut by_after = v.clone();
        by_after.sort_by_key(|g| g.after);
        for g in v {
            let before: u64 = by_after
                .iter()
                .take_while(|h| h.after + slop < g.t)
                .map(|h| u64::from(h.n))
                .sum();
            let e = u128::from(g.t - k1 * p);
            let lhs = u128::from(u) * (p128 - e) + u128::from(before + u64::from(g.n)) * p128;
            if lhs > q128 * p128 {
                return Err(format!(
                    "window {k1}: {g:?} at offset {e} with prev >= {u} and {before} before it: \
                     {u} * ({p} - {e}) / {p} + {before} + {} > {q}",
                    g.n
                ));
            }
            weighted_checks += u64::from(u > 0);
        }
    }
    let permits = grants.iter().map(|g| u64::from(g.n)).sum::<u64>();
    // Windows in which something was granted: on a loaded machine every worker can be off
    // the CPU for a few windows, and then nobody asked.
    let mut active: Vec<u64> = grants.iter().map(|g| win(g.t)).collect();
    active.sort_unstable();
    active.dedup();
    let windows = active.len() as u64;
    Ok(Report {
        permits,
        ambiguous,
        windows,
        fill: permits as f64 / (windows * q) as f64,
        weighted_checks,
    })
}

/// The three checks; returns the report. Free-running runs assert nothing else.
fn check(grants: &[Grant], ops: u64, slop: u64, what: &str) -> Report {
    let r = verify(grants, QUOTA, PERIOD_NS, slop).unwrap_or_else(|e| panic!("{what}: {e}"));
    eprintln!("{what}: {ops} checks, {r:?}");
    r
}

fn window<C: Clock>(clock: C) -> SlidingWindow<C> {
    SlidingWindow::builder(QUOTA, Duration::from_nanos(PERIOD_NS))
        .clock(clock)
        .build()
        .unwrap()
}

#[test]
fn real_clock_keeps_the_guarantee() {
    for threads in [2, 8] {
        let l = window(QuantaClock::new());
        let (grants, ops) = hammer(&l, threads, Duration::from_millis(300), None);
        check(
            &grants,
            ops,
            SLOP,
            &format!("real clock, {threads} threads"),
        );
    }
}

#[test]
fn manual_clock_stepped_by_a_racing_thread_keeps_the_guarantee() {
    for threads in [2, 8] {
        let clock = ManualClock::new(Nanos::new(1_000 * PERIOD_NS));
        let l = window(clock.clone());
        // A quarter period per step, so every window start is a reading that the workers
        // may race on; each step waits for 100 more checks, so that some do (on a loaded
        // machine a timed pause may pass while every worker is off the CPU). It spins rather
        // than yields: a yielding mover gets too few time slices beside 8 busy workers.
        let mover = move |s: Side<'_>| {
            let target = s.progress.load(Ordering::Relaxed) + 100;
            while s.progress.load(Ordering::Relaxed) < target {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                std::hint::spin_loop();
            }
            clock.advance(Duration::from_nanos(PERIOD_NS / 4));
        };
        let (grants, ops) = hammer(&l, threads, Duration::from_millis(300), Some(&mover));
        check(&grants, ops, 0, &format!("manual clock, {threads} threads"));
    }
}

/// One worker's part of a lockstep step at `t`: checks 1 to 3 permits until a check for one
/// is refused (the clock stands still, so from then on every check would be). Returns the
/// grants and the number of checks.
fn drain<C: Clock>(l: &SlidingWindow<C>, t: Nanos, x: &mut u64) -> (Vec<Grant>, u64) {
    let (mut mine, mut checks) = (Vec::new(), 0);
    loop {
        let n = 1 + (common::xorshift(x) % 3) as u32;
        let ok = if n == 1 {
            l.allow_at(t)
        } else {
            l.check_n_at(t, n).is_ok()
        };
        checks += 1;
        if ok {
            let t = t.as_u64();
            mine.push(Grant { t, after: t, n });
        } else if n == 1 {
            return (mine, checks);
        }
    }
}

#[test]
fn manual_clock_stepped_onto_every_boundary_keeps_the_guarantee() {
    // 40 windows in quarter periods, window starts included.
    const STEPS: usize = 160;
    let t0 = 1_000 * PERIOD_NS;
    let at = |i: usize| Nanos::new(t0 + i as u64 * PERIOD_NS / 4);
    let twin = reference::SlidingWindow::try_from(
        turnstile::SlidingWindow::builder(QUOTA, Duration::from_nanos(PERIOD_NS))
            .clock(ManualClock::default()),
    )
    .unwrap();
    // What the twin grants at each step, asked one permit at a time until refused.
    let expected: Vec<u64> = (0..STEPS)
        .map(|i| (0..).take_while(|_| twin.allow_at(at(i))).count() as u64)
        .collect();
    for threads in [2, 8] {
        let clock = ManualClock::new(at(0));
        let l = window(clock.clone());
        let per_worker = common::lockstep(
            threads,
            STEPS,
            |i| clock.set(at(i)),
            |w, i| {
                let mut x = common::rng_seed((w as u64 + 1) << 32 | i as u64);
                drain(&l, at(i), &mut x)
            },
        );
        let what = format!("lockstep, {threads} threads");
        for (i, &want) in expected.iter().enumerate() {
            let got: u64 = per_worker
                .iter()
                .flat_map(|phases| &phases[i].0)
                .map(|g| u64::from(g.n))
                .sum();
            assert_eq!(got, want, "{what}: step {i} at {:?}", at(i));
        }
        let ops = per_worker.iter().flatten().map(|p| p.1).sum();
        let grants: Vec<Grant> = per_worker.into_iter().flatten().flat_map(|p| p.0).collect();
        let r = check(&grants, ops, 0, &what);
        // Forced: each of windows 1..40 grants something and follows a window that did.
        assert!(
            r.weighted_checks >= (STEPS / 4 - 1) as u64,
            "{what}: the weighted rule was tested at {} grants only",
            r.weighted_checks
        );
    }
}

#[test]
fn the_checker_catches_overgrants() {
    let g = |t: u64, after: u64, n: u32| Grant { t, after, n };
    let p = 1_000;
    // Fine: 5 at the start of window 1, then window 2 fills as the weight decays.
    let ok = [g(1_000, 1_001, 5), g(2_200, 2_201, 1), g(2_400, 2_401, 1)];
    assert!(verify(&ok, 5, p, 0).is_ok());
    // 1. Six unambiguous in one window.
    assert!(verify(&[g(1_000, 1_001, 5), g(1_500, 1_501, 1)], 5, p, 0).is_err());
    // 2. 5 + 5 + 1 in a pair, the middle 5 straddling the boundary (each window alone and
    // the weighted rule are fine: the 1 comes at e = 999, where the 5 weigh 0.005).
    let pair = [g(1_000, 1_001, 5), g(1_999, 2_000, 5), g(2_999, 2_999, 1)];
    assert!(verify(&pair, 5, p, 0).is_err());
    // 3. A fixed window: 5 at the end of window 1, 5 at the start of window 2.
    let fixed = [g(1_999, 1_999, 5), g(2_000, 2_000, 5)];
    assert!(verify(&fixed, 5, p, 0).is_err());
    // 3. Too early by one: 5 (P - e) + 2P <= 5P needs e >= 400, the second at 399.
    let early = [g(1_000, 1_001, 5), g(2_200, 2_201, 1), g(2_399, 2_399, 1)];
    assert!(verify(&early, 5, p, 0).is_err());
    // ...unless the first had not returned before the second read its time.
    let racing = [g(1_000, 1_001, 5), g(2_200, 2_399, 1), g(2_399, 2_399, 1)];
    assert!(verify(&racing, 5, p, 0).is_ok());
    // Nothing granted.
    assert!(verify(&[], 5, p, 0).is_err());
}
