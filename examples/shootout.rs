//! The shootout: every limiter hammered by one thread per core on one shared instance, through
//! the crate-wide [`Limiter`] trait and the real clock.
//!
//! ```text
//! cargo run --release --example shootout [-- --seconds 3 --limit 1000000 --burst 1000]
//! ```
//!
//! Phase 1 uses a realistic limit (default 1,000,000/s, burst 1000) so that both grants and
//! denials happen, and checks the promise every limiter makes: over a window of `elapsed`, the
//! grants never exceed `burst + limit × elapsed` (the *budget*; turnstile's deviation D2 allows
//! one request more). `elapsed` is read on the limiter's own clock, before the threads start
//! and after they have all stopped, so it covers every check. Phase 2 uses a limiter that
//! always allows (a finite but huge limit: every check still commits its write) to show raw
//! throughput.
//!
//! Contenders: turnstile's lock-free [`TokenBucket`], its mutex twin
//! [`turnstile::reference::TokenBucket`] (a literal port of Go's rate.go), and governor's direct
//! limiter (a dev-dependency only) behind a small adapter. Phase 3 runs every other algorithm
//! (uber's leaky bucket, Guava's SmoothBursty and SmoothWarmingUp, go-zero's fixed window, the
//! sliding window, the water-level meter) against its own mutex twin at the phase-1 rate, each
//! checked against its own budget. Phase 4 runs `Keyed` (a token bucket per key) and
//! `KeyedTokenBucket` (one word per key, inline) against governor's keyed limiter, on 10 000
//! clients picked at random and on one hot client, and checks every key's budget. With the
//! defaults the whole run takes about 23 × 1.5 s.
//!
//! Exit status: 1 if any turnstile limiter grants more than its budget (plus one request).

use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use governor::clock::{Clock as _, QuantaClock as GovClock, QuantaInstant, Reference as _};
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use turnstile::{
    reference, Denied, FixedWindow, Keyed, KeyedTokenBucket, LeakyBucket, LeakyMeter, Limit,
    Limiter, Nanos, SlidingWindow, SmoothBursty, SmoothWarmingUp, TokenBucket,
};

/// Checks between two looks at the stop flag.
const BATCH: u32 = 256;

/// The window length of phase 3's window limiters.
const WINDOW: Duration = Duration::from_millis(10);

fn limit_of(rate: f64) -> Limit {
    Limit::per_second(rate).expect("validated rate")
}

// ---- governor behind the turnstile trait ----------------------------------------------------

/// governor's direct limiter (on its default quanta clock) as a [`Limiter`]. Times are
/// nanoseconds since the adapter was built, on governor's own clock.
///
/// governor always decides at its own clock reading, so `check_n_at` ignores its `now` except to
/// report a denial; `check_n` and `check` are overridden so that a grant reads the clock once,
/// as governor's own `check` does.
struct Governor {
    inner: RateLimiter<NotKeyed, InMemoryState, GovClock>,
    clock: GovClock,
    origin: QuantaInstant,
    /// The rate governor really enforces (its period is whole nanoseconds).
    effective_limit: f64,
}

impl Governor {
    fn new(limit: f64, burst: u32) -> Governor {
        // governor's period is whole nanoseconds, at least 1 (1e9/s) and here at most ~31 years.
        let period = Duration::try_from_secs_f64(1.0 / limit)
            .unwrap_or(Duration::MAX)
            .clamp(Duration::from_nanos(1), Duration::from_secs(1 << 30));
        let burst = NonZeroU32::new(burst.max(1)).expect("burst >= 1");
        let quota = Quota::with_period(period)
            .expect("nonzero period")
            .allow_burst(burst);
        let clock = GovClock::default();
        let origin = clock.now();
        Governor {
            inner: RateLimiter::direct_with_clock(quota, clock.clone()),
            clock,
            origin,
            effective_limit: 1e9 / period.as_nanos() as f64,
        }
    }

    fn since_origin(&self, t: QuantaInstant) -> Nanos {
        Nanos::from_duration(t.duration_since(self.origin).into())
    }

    fn decide(&self, n: u32) -> Result<(), Denied> {
        let Some(n) = NonZeroU32::new(n) else {
            return Ok(());
        };
        let outcome = if n.get() == 1 {
            Ok(self.inner.check())
        } else {
            self.inner.check_n(n)
        };
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(Denied::new(
                self.now(),
                Some(self.since_origin(not_until.earliest_possible())),
            )),
            // More than the burst: never.
            Err(_) => Err(Denied::new(self.now(), None)),
        }
    }
}

impl Limiter for Governor {
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.decide(n).map_err(|d| Denied::new(now, d.retry_at()))
    }

    fn now(&self) -> Nanos {
        self.since_origin(self.clock.now())
    }

    fn check_n(&self, n: u32) -> Result<(), Denied> {
        self.decide(n)
    }

    fn check(&self) -> Result<(), Denied> {
        self.decide(1)
    }
}

// ---- the run ----------------------------------------------------------------------------------

struct Stats {
    granted: u64,
    denied: u64,
    /// On the limiter's clock, from before the first check to after the last.
    elapsed: Duration,
    /// On the wall clock, same span.
    wall: Duration,
}

/// Runs `work(id, stop)` on `threads` threads released together, after `before()` has run;
/// sleeps `dur`, raises `stop` and joins them. Returns `before()`'s value, the wall-clock time
/// of the release and each thread's result.
fn hammer<B, T: Send>(
    threads: usize,
    dur: Duration,
    before: impl FnOnce() -> B,
    work: impl Fn(usize, &AtomicBool) -> T + Sync,
) -> (B, Instant, Vec<T>) {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|id| {
                let (stop, barrier, work) = (&stop, &barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    work(id, stop)
                })
            })
            .collect();
        let b = before();
        let w0 = Instant::now();
        barrier.wait();
        std::thread::sleep(dur);
        stop.store(true, Ordering::Relaxed);
        let results = handles
            .into_iter()
            .map(|h| h.join().expect("shootout thread panicked"))
            .collect();
        (b, w0, results)
    })
}

/// Hammers `l` with `threads` threads calling `check()` for about `dur`.
fn run<L: Limiter>(l: &L, threads: usize, dur: Duration) -> Stats {
    // t0 is read before any thread can check: the window covers every check.
    let (t0, w0, per_thread) = hammer(
        threads,
        dur,
        || l.now(),
        |_, stop| {
            let (mut granted, mut denied) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..BATCH {
                    match l.check() {
                        Ok(()) => granted += 1,
                        Err(_) => denied += 1,
                    }
                }
            }
            (granted, denied)
        },
    );
    // Read after every thread has stopped.
    let elapsed = l.now() - t0;
    let wall = w0.elapsed();
    Stats {
        granted: per_thread.iter().map(|p| p.0).sum(),
        denied: per_thread.iter().map(|p| p.1).sum(),
        elapsed,
        wall,
    }
}

// ---- output -----------------------------------------------------------------------------------

/// The table of a phase that checks budgets.
fn budget_table() -> Table {
    Table::new(&[
        "limiter",
        "ops/s",
        "ns/op/thread",
        "granted",
        "budget",
        "granted/budget",
        "denied",
        "verdict",
    ])
}

/// One limiter's row; returns whether it stayed within `budget` (plus one request: D2).
fn budget_row(t: &mut Table, name: &str, s: &Stats, threads: usize, budget: f64) -> bool {
    let ops = s.granted + s.denied;
    let ok = (s.granted as f64) <= budget + 1.0;
    t.row(vec![
        name.to_string(),
        mops(ops, s.wall),
        ns_per_op(ops, threads, s.wall),
        grouped(s.granted),
        grouped(budget.floor() as u64),
        format!("{:.6}", s.granted as f64 / budget),
        format!("{:.2}%", 100.0 * s.denied as f64 / ops.max(1) as f64),
        if ok { "ok" } else { "OVER" }.to_string(),
    ]);
    ok
}

struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(head: &[&str]) -> Table {
        Table {
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn print(&self) {
        let widths: Vec<usize> = (0..self.head.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].len())
                    .chain([self.head[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let parts: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if i == 0 {
                        format!("{c:<w$}", w = widths[i])
                    } else {
                        format!("{c:>w$}", w = widths[i])
                    }
                })
                .collect();
            println!("  {}", parts.join("  "));
        };
        line(&self.head);
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule);
        for r in &self.rows {
            line(r);
        }
    }
}

/// `1234567` as `1_234_567`.
fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push('_');
        }
        out.push(ch);
    }
    out
}

fn mops(ops: u64, wall: Duration) -> String {
    format!("{:.2}M", ops as f64 / wall.as_secs_f64() / 1e6)
}

fn ns_per_op(ops: u64, threads: usize, wall: Duration) -> String {
    // Per thread: each thread spends `wall` on its share of the operations.
    format!(
        "{:.1}",
        wall.as_secs_f64() * 1e9 * threads as f64 / ops.max(1) as f64
    )
}

// ---- command line -----------------------------------------------------------------------------

struct Args {
    seconds: f64,
    threads: Option<usize>,
    limit: f64,
    burst: u32,
}

const USAGE: &str = "usage: shootout [--seconds N] [--threads T] [--limit R] [--burst B]
  --seconds N   seconds per limiter and phase (default 1.5)
  --threads T   threads (default: one per core)
  --limit R     phase 1 limit, events per second (default 1000000)
  --burst B     phase 1 burst (default 1000)";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seconds: 1.5,
        threads: None,
        limit: 1_000_000.0,
        burst: 1000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        // Accept both `--flag value` and `--flag=value`.
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "--seconds" => {
                let v = value()?;
                args.seconds = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0 && Duration::try_from_secs_f64(*s).is_ok())
                    .ok_or_else(|| format!("--seconds: expected a positive number, got {v:?}"))?;
            }
            "--threads" => {
                let v = value()?;
                args.threads =
                    Some(v.parse().ok().filter(|t: &usize| *t > 0).ok_or_else(|| {
                        format!("--threads: expected a positive integer, got {v:?}")
                    })?);
            }
            "--limit" => {
                let v = value()?;
                args.limit = v
                    .parse()
                    .ok()
                    .filter(|r: &f64| r.is_finite() && *r > 0.0)
                    .ok_or_else(|| format!("--limit: expected a positive rate, got {v:?}"))?;
            }
            "--burst" => {
                let v = value()?;
                args.burst =
                    v.parse().ok().filter(|b: &u32| *b > 0).ok_or_else(|| {
                        format!("--burst: expected a positive integer, got {v:?}")
                    })?;
            }
            // `cargo bench`/`cargo test` style pass-through flags are not expected here.
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

// ---- main -------------------------------------------------------------------------------------

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("shootout: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = args.threads.unwrap_or(cores);
    let dur = Duration::from_secs_f64(args.seconds);
    let limit = Limit::per_second(args.limit).expect("validated limit");

    println!(
        "turnstile shootout: {cores} cores, {threads} threads on one shared limiter, \
         {:.1} s per limiter",
        args.seconds
    );

    // Phase 1: a realistic limit.
    println!(
        "\nphase 1: limit {}/s, burst {} (budget = burst + limit x elapsed)",
        args.limit, args.burst
    );
    let mut over = false;
    let mut twin_over = false;
    let mut t = budget_table();
    let gov = Governor::new(args.limit, args.burst);
    let contenders: [(&str, f64, Stats); 3] = [
        (
            "turnstile",
            args.limit,
            run(&TokenBucket::new(limit, args.burst), threads, dur),
        ),
        (
            "mutex_twin",
            args.limit,
            run(
                &reference::TokenBucket::new(limit, args.burst),
                threads,
                dur,
            ),
        ),
        ("governor", gov.effective_limit, run(&gov, threads, dur)),
    ];
    for (name, eff_limit, s) in &contenders {
        let budget = f64::from(args.burst) + eff_limit * s.elapsed.as_secs_f64();
        // One request of slack: D2's "plus one request".
        let ok = budget_row(&mut t, name, s, threads, budget);
        if !ok && *name == "turnstile" {
            over = true;
        }
        if !ok && *name == "mutex_twin" {
            twin_over = true;
        }
    }
    t.print();
    if twin_over {
        println!(
            "  (the twin is rate.go verbatim: a check whose clock reading is older than the last \
             one\n   (a thread preempted between reading the clock and taking the lock) moves \
             `last` back,\n   and the next check mints that time again; turnstile's D2 forbids \
             this)"
        );
    }
    if (gov.effective_limit - args.limit).abs() > 1e-9 * args.limit {
        println!(
            "  (governor's period is whole nanoseconds: it enforces {:.3}/s; its budget uses that)",
            gov.effective_limit
        );
    }

    // Phase 2: always allowing, raw throughput.
    // Finite, so every check writes; the burst gives tau = burst / limit = 0.43 s, so a thread
    // preempted between its clock read and its CAS is not denied for its stale time (D2).
    const RAW_LIMIT: f64 = 1e10;
    const RAW_BURST: u32 = u32::MAX;
    println!(
        "\nphase 2: always allowing (limit {RAW_LIMIT:e}/s, burst {}; governor 1e9/s, burst {}): \
         every check writes",
        grouped(u64::from(RAW_BURST)),
        grouped(u64::from(u32::MAX))
    );
    let raw = Limit::per_second(RAW_LIMIT).expect("valid limit");
    let mut t = Table::new(&["limiter", "ops/s", "ns/op/thread", "granted", "denied"]);
    let gov = Governor::new(1e9, u32::MAX);
    let contenders: [(&str, Stats); 3] = [
        (
            "turnstile",
            run(&TokenBucket::new(raw, RAW_BURST), threads, dur),
        ),
        (
            "mutex_twin",
            run(&reference::TokenBucket::new(raw, RAW_BURST), threads, dur),
        ),
        ("governor", run(&gov, threads, dur)),
    ];
    for (name, s) in &contenders {
        let ops = s.granted + s.denied;
        t.row(vec![
            name.to_string(),
            mops(ops, s.wall),
            ns_per_op(ops, threads, s.wall),
            grouped(s.granted),
            grouped(s.denied),
        ]);
    }
    t.print();

    over |= phase3(&args, threads, dur);
    over |= phase4(threads, dur);

    if over {
        eprintln!("\nshootout: a turnstile limiter granted more than its budget");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Phase 3: every other algorithm against its mutex twin, at the phase-1 rate. Returns whether
/// a turnstile limiter went over its budget.
fn phase3(args: &Args, threads: usize, dur: Duration) -> bool {
    let rate = args.limit;
    let whole_rate = rate.round().clamp(1.0, f64::from(u32::MAX)) as u32;
    let slack = args.burst;
    let warmup = Duration::from_millis(100);
    println!(
        "\nphase 3: the other algorithms at {whole_rate}/s against their twins \
         (budget = what the algorithm may ever grant in the window)"
    );
    println!(
        "  leaky bucket: slack {slack} -> slack + 1 + elapsed / interval; smooth: max stored \
         permits + rate x elapsed + 1 (bursty 1 s of burst, warming-up {warmup:?} warm-up)"
    );
    println!(
        "  windows: quota {} per {WINDOW:?} -> quota x (elapsed / period + 1) fixed, + 2 \
         sliding; leaky meter: capacity {} -> capacity + rate x elapsed + 1",
        (whole_rate / 100).max(1),
        slack.max(1)
    );
    let interval_ns = (1_000_000_000u64 / u64::from(whole_rate)).max(1) as f64;
    let leaky_budget =
        |s: &Stats| f64::from(slack) + 1.0 + s.elapsed.as_nanos() as f64 / interval_ns;
    let bursty_budget = |s: &Stats| rate + rate * s.elapsed.as_secs_f64() + 1.0;
    let warm = SmoothWarmingUp::new(rate, warmup).expect("valid warm-up limiter");
    let warm_max = warm.params().max_permits;
    let warm_budget = |s: &Stats| warm_max + rate * s.elapsed.as_secs_f64() + 1.0;

    // Windows of 10 ms holding the same rate; a first-hit fixed window opens at most
    // elapsed / period + 1 windows, and at most elapsed / period + 2 aligned sliding windows
    // overlap the run, each granting at most the quota.
    let quota = (whole_rate / 100).max(1);
    let windows = |s: &Stats| (s.elapsed.as_nanos() / WINDOW.as_nanos()) as f64;
    let fixed_budget = |s: &Stats| f64::from(quota) * (windows(s) + 1.0);
    let sliding_budget = |s: &Stats| f64::from(quota) * (windows(s) + 2.0);
    // The meter: capacity + leak x elapsed (+1, D2), like a token bucket.
    let meter_budget = |s: &Stats| f64::from(slack.max(1)) + rate * s.elapsed.as_secs_f64() + 1.0;
    let leaky_cfg = || LeakyBucket::builder(whole_rate).slack(slack);
    let rows: Vec<(&str, bool, Stats, f64)> = {
        let mut rows = Vec::new();
        let mut add = |name, ours, s: Stats, budget: &dyn Fn(&Stats) -> f64| {
            let b = budget(&s);
            rows.push((name, ours, s, b));
        };
        add(
            "leaky_bucket",
            true,
            run(&leaky_cfg().build().expect("valid"), threads, dur),
            &leaky_budget,
        );
        add(
            "  mutex_twin",
            false,
            run(
                &reference::LeakyBucket::builder(whole_rate)
                    .slack(slack)
                    .build()
                    .expect("valid"),
                threads,
                dur,
            ),
            &leaky_budget,
        );
        add(
            "smooth_bursty",
            true,
            run(&SmoothBursty::new(rate).expect("valid"), threads, dur),
            &bursty_budget,
        );
        add(
            "  mutex_twin",
            false,
            run(
                &reference::SmoothBursty::new(rate).expect("valid"),
                threads,
                dur,
            ),
            &bursty_budget,
        );
        add(
            "smooth_warming_up",
            true,
            run(&warm, threads, dur),
            &warm_budget,
        );
        add(
            "  mutex_twin",
            false,
            run(
                &reference::SmoothWarmingUp::new(rate, warmup).expect("valid"),
                threads,
                dur,
            ),
            &warm_budget,
        );
        add(
            "fixed_window",
            true,
            run(
                &FixedWindow::new(quota, WINDOW).expect("valid"),
                threads,
                dur,
            ),
            &fixed_budget,
        );
        add(
            "  mutex_twin",
            false,
            run(
                &reference::FixedWindow::new(quota, WINDOW).expect("valid"),
                threads,
                dur,
            ),
            &fixed_budget,
        );
        add(
            "sliding_window",
            true,
            run(
                &SlidingWindow::new(quota, WINDOW).expect("valid"),
                threads,
                dur,
            ),
            &sliding_budget,
        );
        add(
            "  mutex_twin",
            false,
            run(
                &reference::SlidingWindow::new(quota, WINDOW).expect("valid"),
                threads,
                dur,
            ),
            &sliding_budget,
        );
        add(
            "leaky_meter",
            true,
            run(
                &LeakyMeter::new(slack.max(1), limit_of(rate)).expect("valid"),
                threads,
                dur,
            ),
            &meter_budget,
        );
        rows
    };
    let mut t = budget_table();
    let mut over = false;
    for (name, ours, s, budget) in &rows {
        let ok = budget_row(&mut t, name, s, threads, *budget);
        over |= *ours && !ok;
    }
    t.print();
    over
}

/// Phase 4: per-key limiters, turnstile's `Keyed` (each key a token bucket in the `Compact`
/// layout meant for keyed maps) and `KeyedTokenBucket` (each key one word inline) against
/// governor's keyed limiter (dashmap). First `KEYS` clients picked at random by every thread, each with a
/// small budget; then one hot client with the phase-1 rate. Every key's grants are counted and
/// checked against its own budget. Returns whether turnstile went over.
fn phase4(threads: usize, dur: Duration) -> bool {
    const KEYS: u64 = 10_000;
    const KEY_RATE: u32 = 100;
    const KEY_BURST: u32 = 10;
    const HOT_RATE: u32 = 1_000_000;
    const HOT_BURST: u32 = 1000;
    println!(
        "\nphase 4: keyed limiters: {} clients at {KEY_RATE}/s (burst {KEY_BURST}) picked at \
         random, then 1 hot client at {}/s (burst {HOT_BURST}); budget per key = burst + rate x \
         elapsed",
        grouped(KEYS),
        grouped(u64::from(HOT_RATE))
    );
    let mut t = Table::new(&[
        "limiter",
        "ops/s",
        "ns/op/thread",
        "granted",
        "worst key granted/budget",
        "keys held",
        "verdict",
    ]);
    let mut over = false;
    for (label, keys, rate, burst) in [
        ("random keys", KEYS, KEY_RATE, KEY_BURST),
        ("hot key", 1, HOT_RATE, HOT_BURST),
    ] {
        let limit = limit_of(f64::from(rate));
        let ours = Keyed::new(move |_: &u64| TokenBucket::compact(limit, burst));
        let s = run_keyed(threads, dur, keys, |k| ours.check(&k).is_ok());
        over |= !keyed_row(
            &mut t,
            &format!("turnstile, {label}"),
            &s,
            threads,
            rate,
            burst,
            ours.len(),
        );
        drop(ours);
        let inline = KeyedTokenBucket::new(limit, burst);
        let s = run_keyed(threads, dur, keys, |k| inline.check(&k).is_ok());
        over |= !keyed_row(
            &mut t,
            &format!("turnstile inline, {label}"),
            &s,
            threads,
            rate,
            burst,
            inline.len(),
        );
        drop(inline);
        let gov = RateLimiter::keyed(
            Quota::per_second(NonZeroU32::new(rate).expect("nonzero"))
                .allow_burst(NonZeroU32::new(burst).expect("nonzero")),
        );
        let s = run_keyed(threads, dur, keys, |k| gov.check_key(&k).is_ok());
        keyed_row(
            &mut t,
            &format!("governor, {label}"),
            &s,
            threads,
            rate,
            burst,
            gov.len(),
        );
    }
    t.print();
    over
}

struct KeyedStats {
    /// Grants per key.
    granted: Vec<u64>,
    ops: u64,
    /// Wall time from before the first check to after the last: covers every check.
    wall: Duration,
}

/// Hammers `check(key)` with `threads` threads, each picking keys in `0..keys` at random.
fn run_keyed(
    threads: usize,
    dur: Duration,
    keys: u64,
    check: impl Fn(u64) -> bool + Sync,
) -> KeyedStats {
    let granted: Vec<std::sync::atomic::AtomicU64> = (0..keys)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    let ((), w0, per_thread) = hammer(
        threads,
        dur,
        || (),
        |id, stop| {
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64 + 1);
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..BATCH {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = rng % keys;
                    if check(key) {
                        granted[key as usize].fetch_add(1, Ordering::Relaxed);
                    }
                }
                ops += u64::from(BATCH);
            }
            ops
        },
    );
    let ops = per_thread.iter().sum();
    KeyedStats {
        granted: granted.into_iter().map(|g| g.into_inner()).collect(),
        ops,
        wall: w0.elapsed(),
    }
}

/// One keyed row; returns whether every key stayed within its budget (plus one request: D2).
fn keyed_row(
    t: &mut Table,
    name: &str,
    s: &KeyedStats,
    threads: usize,
    rate: u32,
    burst: u32,
    held: usize,
) -> bool {
    // Wall time bounds every limiter clock's elapsed time here, up to calibration error:
    // one request of slack covers both.
    let budget = f64::from(burst) + f64::from(rate) * s.wall.as_secs_f64() + 1.0;
    let worst = s.granted.iter().copied().max().unwrap_or(0);
    let ok = (worst as f64) <= budget;
    t.row(vec![
        name.to_string(),
        mops(s.ops, s.wall),
        ns_per_op(s.ops, threads, s.wall),
        grouped(s.granted.iter().sum()),
        format!("{:.4}", worst as f64 / budget),
        grouped(held as u64),
        if ok { "ok" } else { "OVER" }.to_string(),
    ]);
    ok
}
