//! Many threads acquiring non-blockingly from one `SmoothBursty` / `SmoothWarmingUp`. Every
//! grant is recorded with the time it may act at (the `next_free` it was granted at), and two
//! bounds are checked:
//! * **any span**: the permits acting in any window `[a, b]` of grants never exceed
//!   `max_permits + rate × (b - a) + largest n` (for `SmoothWarmingUp`, `rate × (b - a) +
//!   largest n`: its stored permits cost at least a stable interval each);
//! * **from creation**: all permits granted never exceed `initial stored + rate × span +
//!   largest n`, the span running from creation to the latest time used.
//!
//! Why they hold for Guava's model: `next_free - stored × stable_interval` grows by exactly
//! `n × stable_interval` per grant and never shrinks on a resync (the cap only adds), and a
//! request waits only for the previous debt, so the last request's own permits may lie beyond
//! the window (the "largest n"). Costs are rounded to the nearest nanosecond, so each grant may
//! be under-charged by up to 1 ns (two rounded parts): the bounds add `rate × 1 ns` per grant.
//! A lost update (two threads granted from the same state) shows as an over-grant. Run with
//! the real clock, with a manual clock moved by another thread, and with concurrent
//! `set_rate` (bounds at the higher rate). Those free-running runs assert the bounds only: how
//! much they are granted depends on how often the scheduler runs the workers.
//!
//! That the limiter hands permits out at its rate (it limits, it does not merely refuse) is
//! checked in lockstep (`common::lockstep`): a manual clock set step by step, all workers
//! draining a `SmoothBursty` at each step until each is refused one permit. By the argument
//! above, `next_free` after a drain is past the step's time `t` with nothing stored, and it
//! is `t0 + granted × stable_interval`, while before the last grant it was at most `t`: so
//! `rate × (t - t0) < granted <= rate × (t - t0) + largest n` (plus the rounding allowance),
//! whatever the interleaving.

use crate::common;

use std::time::Duration;

use turnstile::{
    Clock, Limiter, ManualClock, Nanos, QuantaClock, SmoothBursty, SmoothWarmingUp, WaitError,
};

use common::hammer::{Hammer, Side};

const MAX_N: u32 = 4;
/// Each worker makes at least this many operations, however late it is scheduled.
const MIN_OPS: u64 = 100;

/// The operations the workers use, on either limiter type.
trait Smooth: Limiter {
    fn reserve(&self, now: Nanos, n: u32) -> Result<Duration, WaitError>;
    fn try_acq(&self, now: Nanos, n: u32, t: Duration) -> Result<Option<Duration>, WaitError>;
    fn set(&self, rate: f64);
    fn max_permits(&self) -> f64;
}

/// Both limiters have the same inherent API; one impl serves them.
macro_rules! impl_smooth {
    ($($ty:ident),*) => {$(
        impl<C: Clock> Smooth for $ty<C> {
            fn reserve(&self, now: Nanos, n: u32) -> Result<Duration, WaitError> {
                self.reserve_n_at(now, n)
            }
            fn try_acq(&self, now: Nanos, n: u32, t: Duration) -> Result<Option<Duration>, WaitError> {
                self.try_acquire_at(now, n, t)
            }
            fn set(&self, rate: f64) {
                self.set_rate(rate).unwrap()
            }
            fn max_permits(&self) -> f64 {
                self.params().max_permits
            }
        }
    )*};
}
impl_smooth!(SmoothBursty, SmoothWarmingUp);

#[derive(Clone, Copy, PartialEq)]
enum Mix {
    /// `check_n_at` and `try_acquire_at` with a 200 µs timeout: denials write nothing.
    NonBlocking,
    /// Pay-later `reserve_n_at` only: every request is granted and queues behind the debt.
    Reserve,
    /// All three.
    All,
}

struct Totals {
    granted: u64,
    /// Every grant: (time it may act, permits), in no particular order.
    log: Vec<(u64, u32)>,
    grants: u64,
    /// The latest time any operation used, or any grant may act at: the span's end.
    latest: Nanos,
    ops: u64,
}

/// One worker's part of a run: what it was granted, and the latest time it used or may act at.
#[derive(Default)]
struct Mine {
    granted: u64,
    log: Vec<(u64, u32)>,
    latest: u64,
}

/// Runs `threads` workers for `run_for` of real time on `l`, while `side` (if any) runs in a
/// loop on another thread (moving a manual clock, or changing the rate).
fn hammer(
    l: &dyn Smooth,
    threads: usize,
    run_for: Duration,
    mix: Mix,
    side: Option<&(dyn Fn(u64) + Sync)>,
) -> Totals {
    let h = Hammer {
        threads,
        run_for,
        min_ops: MIN_OPS,
    };
    let side = side.map(|f| move |s: Side<'_>| f(s.turn));
    let run = h.run(
        |o, mine: &mut Mine| {
            let x = common::xorshift(o.rng);
            let n = 1 + (x % u64::from(MAX_N)) as u32;
            let now = l.now();
            let choice = match mix {
                Mix::NonBlocking => (x >> 8) % 2,
                Mix::Reserve => 2,
                Mix::All => (x >> 8) % 3,
            };
            let act = match choice {
                0 => l.check_n_at(now, n).ok().map(|()| now),
                1 => l
                    .try_acq(now, n, Duration::from_micros(200))
                    .unwrap()
                    .map(|w| now + w),
                _ => Some(now + l.reserve(now, n).unwrap()),
            };
            if let Some(act) = act {
                mine.granted += u64::from(n);
                mine.latest = mine.latest.max(act.as_u64());
                mine.log.push((act.as_u64(), n));
            }
            mine.latest = mine.latest.max(now.as_u64());
        },
        side.as_ref().map(|f| f as &(dyn Fn(Side<'_>) + Sync)),
    );
    let log: Vec<(u64, u32)> = run
        .kept
        .iter()
        .flat_map(|m| m.log.iter().copied())
        .collect();
    Totals {
        granted: run.kept.iter().map(|m| m.granted).sum(),
        grants: log.len() as u64,
        latest: Nanos::new(run.kept.iter().map(|m| m.latest).max().unwrap_or(0)),
        log,
        ops: run.ops,
    }
}

/// Checks both bounds (module docs): `stored` is what may be stored at any time (bursty:
/// `max_permits`), `initial` what was stored at creation `t0`.
/// `last` is what the last request may hold beyond the window: `MAX_N`, or more if it was
/// charged at a lower rate than `rate`.
fn check_bounds(
    what: &str,
    got: &mut Totals,
    (rate, stored, initial, last): (f64, f64, f64, f64),
    t0: Nanos,
) {
    assert!(got.granted > 0, "{what}: nothing granted");
    let rounding = rate * 1e-9 * got.grants as f64;
    let span = (got.latest - t0).as_secs_f64();
    let budget = initial + rate * span + last + rounding;
    assert!(
        got.granted as f64 <= budget,
        "{what}: granted {} > budget {budget} ({} grants in {} ops)",
        got.granted,
        got.grants,
        got.ops
    );
    // Any window [a_i, a_j] of grants sorted by act time: the largest excess of
    // sum(n) - rate * (a_j - a_i), by one scan keeping the best window start.
    got.log.sort_unstable();
    let per_ns = rate * 1e-9;
    let (mut before, mut best_start, mut worst) = (0.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for &(act, n) in &got.log {
        let a = act as f64 * per_ns;
        // A window may start here: it excludes everything granted before.
        best_start = best_start.min(before - a);
        before += f64::from(n);
        worst = worst.max(before - a - best_start);
    }
    let allowed = stored + last + rounding;
    assert!(
        worst <= allowed,
        "{what}: a window held {worst} permits more than rate × its length (allowed {allowed})"
    );
    eprintln!(
        "{what}: granted {} of {budget:.0}; window excess {worst:.1} of {allowed:.1}; \
         {} grants in {} ops",
        got.granted, got.grants, got.ops
    );
}

// A rate whose stable interval is a whole number of nanoseconds (5 µs), so that the
// rounding allowance is the only slack.
const RATE: f64 = 200_000.0;
const N: f64 = MAX_N as f64;

#[test]
fn real_clock_never_grants_more_than_the_budget() {
    for threads in [2, 8] {
        for mix in [Mix::NonBlocking, Mix::Reserve] {
            let clock = QuantaClock::new();
            let t0 = clock.now();
            let l = SmoothBursty::builder(RATE).clock(clock).build().unwrap();
            let mut got = hammer(&l, threads, Duration::from_millis(300), mix, None);
            let what = format!("bursty {threads}t");
            check_bounds(&what, &mut got, (RATE, l.max_permits(), 0.0, N), t0);

            let clock = QuantaClock::new();
            let t0 = clock.now();
            let l = SmoothWarmingUp::builder(RATE, Duration::from_millis(20))
                .clock(clock)
                .build()
                .unwrap();
            let mut got = hammer(&l, threads, Duration::from_millis(300), mix, None);
            // Every permit of a warming-up limiter costs at least a stable interval: its
            // stored permits add nothing to either bound.
            let what = format!("warming {threads}t");
            check_bounds(&what, &mut got, (RATE, 0.0, 0.0, N), t0);
        }
    }
}

#[test]
fn manual_clock_moved_by_another_thread_never_grants_more_than_the_budget() {
    let rate = 1_000_000.0;
    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let t0 = clock.now();
    let l = SmoothBursty::builder(rate)
        .max_burst_seconds(0.001)
        .clock(clock.clone())
        .build()
        .unwrap();
    let mover = clock.clone();
    let mut got = hammer(
        &l,
        4,
        Duration::from_millis(400),
        Mix::All,
        Some(&move |_| mover.advance(Duration::from_nanos(100))),
    );
    check_bounds(
        "manual bursty",
        &mut got,
        (rate, l.max_permits(), 0.0, N),
        t0,
    );

    let clock = ManualClock::new(Nanos::new(1_000_000_000));
    let t0 = clock.now();
    let l = SmoothWarmingUp::builder(rate, Duration::from_millis(1))
        .cold_factor(5.0)
        .clock(clock.clone())
        .build()
        .unwrap();
    let mover = clock.clone();
    let mut got = hammer(
        &l,
        4,
        Duration::from_millis(400),
        Mix::NonBlocking,
        Some(&move |_| mover.advance(Duration::from_nanos(100))),
    );
    check_bounds("manual warming", &mut got, (rate, 0.0, 0.0, N), t0);
}

#[test]
fn concurrent_set_rate_never_grants_more_than_the_largest_budget() {
    let (lo, hi) = (50_000.0, 200_000.0);
    let clock = QuantaClock::new();
    let t0 = clock.now();
    let l = SmoothBursty::builder(hi).clock(clock).build().unwrap();
    let max_hi = l.max_permits();
    let lr = &l;
    let mut got = hammer(
        &l,
        4,
        Duration::from_millis(400),
        Mix::NonBlocking,
        Some(&move |i| lr.set(if i % 2 == 0 { lo } else { hi })),
    );
    // The last request may have been charged at the lower rate: hi / lo times its permits.
    let bounds = (hi, max_hi, 0.0, N * hi / lo);
    check_bounds("set_rate bursty", &mut got, bounds, t0);

    let clock = QuantaClock::new();
    let t0 = clock.now();
    let l = SmoothWarmingUp::builder(hi, Duration::from_millis(5))
        .clock(clock)
        .build()
        .unwrap();
    let lr = &l;
    let mut got = hammer(
        &l,
        4,
        Duration::from_millis(400),
        Mix::All,
        Some(&move |i| lr.set(if i % 2 == 0 { lo } else { hi })),
    );
    check_bounds("set_rate warming", &mut got, (hi, 0.0, 0.0, N), t0);
}

#[test]
fn lockstep_drains_hand_out_the_rate() {
    // 20 permits per step of 100 µs; 200 steps.
    const STEPS: usize = 200;
    let step = 100_000u64;
    let t0 = 1_000_000_000;
    let at = |i: usize| Nanos::new(t0 + i as u64 * step);
    for threads in [2, 8] {
        let clock = ManualClock::new(at(0));
        let l = SmoothBursty::builder(RATE)
            .clock(clock.clone())
            .build()
            .unwrap();
        let per_worker = common::lockstep(
            threads,
            STEPS,
            |i| clock.set(at(i)),
            |w, i| {
                let mut x = common::rng_seed((w as u64 + 1) << 32 | i as u64);
                let (t, mut permits, mut grants) = (at(i), 0u64, 0u64);
                loop {
                    common::xorshift(&mut x);
                    let n = 1 + (x % u64::from(MAX_N)) as u32;
                    let ok = if (x >> 8).is_multiple_of(2) {
                        l.check_n_at(t, n).is_ok()
                    } else {
                        l.try_acquire_at(t, n, Duration::ZERO).unwrap().is_some()
                    };
                    if ok {
                        permits += u64::from(n);
                        grants += 1;
                    } else if n == 1 {
                        return (permits, grants);
                    }
                }
            },
        );
        let (mut permits, mut grants) = (0u64, 0u64);
        for i in 0..STEPS {
            permits += per_worker.iter().map(|p| p[i].0).sum::<u64>();
            grants += per_worker.iter().map(|p| p[i].1).sum::<u64>();
            let refill = RATE * (at(i) - at(0)).as_secs_f64();
            let rounding = RATE * 1e-9 * grants as f64;
            let g = permits as f64;
            assert!(
                g > refill - rounding && g <= refill + N + rounding,
                "{threads} threads, step {i}: granted {g}, refill {refill}"
            );
        }
        eprintln!("lockstep, {threads} threads: {permits} permits in {grants} grants");
    }
}
