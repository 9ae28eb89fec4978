use super::*;
use crate::{FixedWindow, Idle, Limiter, ManualClock};

const SEC: u64 = 1_000_000_000;
/// Every tick of the quotas below divides this grid (quotas under 1024, short periods).
const GRID: u64 = 512;

/// `(quota, period in ns, aligned)`: quotas of 1 bit to 10, periods on the grid.
const CONFIGS: [(u32, u64, bool); 7] = [
    (1, 1024, false),
    (2, SEC, false),
    (5, 10 * SEC, true),
    (10, 60 * SEC, false),
    (100, 3 * SEC, true),
    (1000, SEC, false),
    (1023, 86_400 * SEC, true),
];

/// The unix origin of the aligned configurations: on the grid, off every boundary.
const ORIGIN: Duration = Duration::from_nanos(1_704_067_200 * SEC + 333 * GRID);

fn spec(quota: u32, period: u64, aligned: bool) -> WindowSpec {
    let align = aligned.then_some(3600);
    WindowSpec::new(
        quota,
        Duration::from_nanos(period),
        align,
        Some(ORIGIN),
        Nanos::ZERO,
    )
    .unwrap()
}

fn quota(quota: u32, period: u64, aligned: bool) -> FixedWindowQuota {
    FixedWindowQuota::new(spec(quota, period, aligned), Duration::from_nanos(period)).unwrap()
}

fn window(quota: u32, period: u64, aligned: bool, b: Nanos) -> FixedWindow<ManualClock> {
    let mut w = crate::fixed_window::FixedWindowBuilder::new(quota, Duration::from_nanos(period));
    if aligned {
        w = w.align(3600);
    }
    let mut w = w
        .unix_origin(ORIGIN)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    w.born_at(b);
    w
}

/// On the tick grid the rule answers as a `FixedWindow` born at the same time (its
/// `Idle::born_at`), check by check: grant or refusal, the refusal's retry time,
/// idleness and the status; readings go forwards and backwards (stale), and land on the
/// windows' edges.
#[test]
fn on_the_grid_the_rule_agrees_with_a_born_fixed_window() {
    let mut below = crate::clock::random_below();
    for &(q, period, aligned) in &CONFIGS {
        let rule = quota(q, period, aligned);
        assert!(
            GRID.is_multiple_of(1 << rule.s),
            "tick {} for {q}",
            1u64 << rule.s
        );
        for _ in 0..100 {
            let base = below(1 << 30) * GRID;
            let b = base + below(period / GRID * 3 + 1) * GRID;
            let fw = window(q, period, aligned, Nanos::new(b));
            let mut x = rule.born(base, Nanos::new(b));
            let mut now = b;
            for _ in 0..300 {
                let step = match below(5) {
                    0 => period,
                    1 => below(period / GRID + 2) * GRID,
                    2 => 0,
                    _ => below(period / GRID / u64::from(q) + 2) * GRID,
                };
                now = if below(5) == 0 {
                    now.saturating_sub(step).max(base)
                } else {
                    now + step
                };
                let t = Nanos::new(now);
                let n = match below(4) {
                    0 => below(u64::from(q) + 2) as u32,
                    1 => u32::MAX - below(2) as u32,
                    _ => 1,
                };
                assert_eq!(rule.idle(x, base, t), fw.is_idle_at(t), "idle at {now}");
                assert_eq!(rule.status(Some(x), base, t), fw.status_at(t), "at {now}");
                let want = fw.check_n_at(t, n);
                let got = rule.check(x, base, t, n);
                assert_eq!(got.map(|_| ()), want, "{q}/{period}ns: n {n} at {now}");
                if let Ok(Some(x2)) = got {
                    assert_ne!(x2, x, "contract 2: a grant that writes changes x");
                    assert!(x2 <= X_MASK);
                    x = x2;
                }
            }
        }
    }
}

/// Off the grid, the rule is `FixedWindow` with every window's end rounded up to a tick:
/// a literal model of that, at random readings, quotas of every size up to `u32::MAX`.
#[test]
fn off_the_grid_windows_end_on_the_next_tick() {
    let mut below = crate::clock::random_below();
    let configs = [
        (3, 1_000_003, false),
        (1000, SEC + 7, true),
        (70_000, 60 * SEC + 1, false),
        (u32::MAX, 86_400 * SEC, false),
        (u32::MAX - 1, 7 * 86_400 * SEC, true),
    ];
    for (q, period, aligned) in configs {
        let rule = quota(q, period, aligned);
        let sp = spec(q, period, aligned);
        let tick = 1u64 << rule.s;
        assert!(tick * TICKS_PER_PERIOD <= period);
        for _ in 0..100 {
            let base = below(1 << 50);
            let ceil = |t: u64| base + (t - base).div_ceil(tick) * tick;
            let b = base + below(3 * period);
            let floor = |t: u64| base + (t - base) / tick * tick;
            let (mut end, mut count) = (floor(b), u64::from(q));
            let mut x = rule.born(base, Nanos::new(b));
            let mut now = b;
            for _ in 0..200 {
                let step = if below(4) == 0 {
                    // Onto the window's edge: its end, or the nanosecond before.
                    end.saturating_sub(now).saturating_sub(below(2))
                } else {
                    below(period / 2 + 2)
                };
                now = if below(6) == 0 {
                    now.saturating_sub(step).max(base)
                } else {
                    now + step
                };
                let n = match below(3) {
                    0 => below(u64::from(q).min(1 << 20) + 2) as u32,
                    1 => q,
                    _ => 1,
                };
                let idle = rule.idle(x, base, Nanos::new(now));
                assert_eq!(idle, now >= end, "{q}/{period}: idle at {now}");
                let want = if n == 0 {
                    Ok(())
                } else if n > q {
                    Err(Denied::new(Nanos::new(now), None))
                } else if now >= end {
                    (end, count) = (ceil(sp.window_end(now)), u64::from(n));
                    Ok(())
                } else if count + u64::from(n) <= u64::from(q) {
                    count += u64::from(n);
                    Ok(())
                } else {
                    Err(Denied::new(Nanos::new(now), Some(Nanos::new(end))))
                };
                let got = rule.check(x, base, Nanos::new(now), n);
                assert_eq!(got.map(|_| ()), want, "{q}/{period}: n {n} at {now}");
                x = got.ok().flatten().unwrap_or(x);
                assert_eq!(
                    (base + rule.end(x), rule.count(x)),
                    (end, count),
                    "{q}/{period} at {now}"
                );
            }
        }
    }
}

/// Contract 3: a key idle at `J`, evicted and born again at `B >= J`, grants nothing its
/// old state would have refused, stale readings (before `B`, before `J`) included. The
/// old state shadows the newborn: it takes exactly the newborn's grants, and each must be
/// one it grants too.
#[test]
fn an_idle_key_born_again_never_grants_more() {
    let mut below = crate::clock::random_below();
    let mut evictions = 0u32;
    for &(q, period, aligned) in &CONFIGS {
        let rule = quota(q, period, aligned);
        for _ in 0..300 {
            let base = below(1 << 40);
            let j = base + below(period * 4 + 1000);
            // A window ending around J, with any count.
            let end = (j + period / 2).saturating_sub(below(period + 3)).max(base);
            let x_old = (rule.ticks_ceil(end - base) << rule.c) | below(u64::from(q) + 1);
            if !rule.idle(x_old, base, Nanos::new(j)) {
                continue;
            }
            evictions += 1;
            let b = j + [0, 1, below(period + 3)][below(3) as usize];
            let mut born = rule.born(base, Nanos::new(b));
            let mut old = x_old;
            for _ in 0..40 {
                let edges = [b, end, j, b + period, end.saturating_sub(period)];
                let at = if below(2) == 0 {
                    edges[below(5) as usize] + below(2)
                } else {
                    (b + below(period * 2 + 2)).saturating_sub(below(period * 2 + 2))
                };
                let at = Nanos::new(at.max(base));
                let n = 1 + below(u64::from(q)) as u32;
                if let Ok(w) = rule.check(born, base, at, n) {
                    let o = rule.check(old, base, at, n);
                    assert!(
                        o.is_ok(),
                        "born {born} granted n {n} at {at:?}, old {old} refused"
                    );
                    born = w.unwrap_or(born);
                    old = o.unwrap().unwrap_or(old);
                }
            }
        }
    }
    assert!(evictions > 500, "only {evictions} idle states tried");
}

#[test]
fn the_range_is_at_least_eight_and_a_half_years_and_ticks_fit_the_period() {
    const YEAR: f64 = 365.25 * 86_400e9;
    let d = Duration::from_nanos;
    for (q, period) in [
        (1, 256),
        (1000, SEC),
        (1000, 146 * 365 * 86_400 * SEC),
        (u32::MAX, 86_400 * SEC),
        (1, u64::MAX),
    ] {
        let rule = quota(q, period, false);
        assert!(rule.range as f64 >= 8.5 * YEAR, "{q}/{period}");
        // The last reading of the range: a new window's word still fits.
        let top = Nanos::new(rule.range);
        let x = rule.born(0, top);
        assert!(x <= X_MASK);
        if let Ok(Some(x2)) = rule.check(x, 0, top, 1) {
            assert!(x2 <= X_MASK);
        }
        // A window opened there, all of the quota at once: end and count still fit.
        let open = rule.check(0, 0, top, q).unwrap().unwrap();
        assert!(open <= X_MASK && rule.count(open) == u64::from(q));
        assert!(rule.end(open) > rule.range);
    }
    // A quota of 1000 ticks in 512 ns: periods from 131 072 ns.
    let err = FixedWindowQuota::new(spec(1000, 131_071, false), d(131_071)).unwrap_err();
    assert_eq!(
        err,
        ConfigError::WindowTooShort {
            period: d(131_071),
            min: d(131_072)
        }
    );
    assert!(FixedWindowQuota::new(spec(1000, 131_072, false), d(131_072)).is_ok());
    assert!(FixedWindowQuota::new(spec(u32::MAX, SEC, false), d(SEC)).is_err());
    // The 10 bits of 1000 leave 49 for the end: 512 ns ticks; 1024 is the next one.
    assert_eq!(quota(1000, SEC, false).s, 9);
    assert_eq!(quota(1024, SEC, false).s, 10);
}

/// Past the range time stands still: a key gets at most its window's quota more, then
/// is refused for good (it fails closed), and nothing overflows.
#[test]
fn past_the_range_a_key_fails_closed() {
    let rule = quota(3, SEC, false);
    let base = 5;
    let mut x = rule.born(base, Nanos::new(base));
    let mut grants = 0;
    for i in 0..10u64 {
        let t = Nanos::new(base + rule.range + i * 1_000_000 * SEC);
        if let Ok(w) = rule.check(x, base, t, 1) {
            grants += 1;
            x = w.unwrap_or(x);
        }
    }
    assert_eq!(grants, 3);
    assert!(rule.check(x, base, Nanos::MAX, 1).is_err());
    assert!(!rule.idle(x, base, Nanos::MAX));
}
