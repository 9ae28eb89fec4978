//! The shootout's machinery, shared by `examples/shootout.rs` and `tests/api/shootout_smoke.rs`
//! (which includes this file with `#[path]`): the command line, the four phases, the tables,
//! the verdict and the JSON writer. Nothing here writes to stdout directly: every report line
//! goes to the `out` it is given, so `--json -` can keep stdout for the JSON alone.

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::BuildHasher;
use std::io::{self, Write};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use governor::clock::{Clock as _, QuantaClock as GovClock, QuantaInstant, Reference as _};
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use turnstile::{
    reference, Clock as _, Denied, FixedWindow, Keyed, KeyedTokenBucket, LeakyBucket, LeakyMeter,
    Limit, Limiter, Nanos, QuantaClock, SlidingWindow, SmoothBursty, SmoothWarmingUp, TokenBucket,
};

#[path = "../common/report.rs"]
mod report;
use report::{json_f64, json_str, load_average};

/// Checks between two looks at the stop flag.
const BATCH: u32 = 256;

/// The window length of phase 3's window limiters.
const WINDOW: Duration = Duration::from_millis(10);

/// Cells (one limiter implementation hammered for `--seconds`) per thread count and run: phase 1
/// five (turnstile, mutex twin, governor, the two floors), phase 2 three (turnstile, mutex twin,
/// governor), phase 3 eleven (six algorithms, five with a twin), phase 4 nine (two workloads ×
/// turnstile, turnstile inline, governor, floor; and the random clients' indirect floor).
pub const CELLS_PER_THREAD_COUNT: usize = 5 + 3 + 11 + 9;

/// The most `--runs` accepts.
pub const MAX_RUNS: usize = 100;

/// What the default `--seconds` aims the whole run at, in seconds of hammering.
pub const DEFAULT_TOTAL_SECONDS: f64 = 48.0;

/// The per-cell seconds when there are few thread counts to sweep.
pub const MAX_DEFAULT_SECONDS: f64 = 1.5;

/// The least per-cell seconds the default picks, however many thread counts there are.
pub const MIN_DEFAULT_SECONDS: f64 = 0.1;

fn limit_of(rate: f64) -> Limit {
    Limit::per_second(rate).expect("validated rate")
}

// ---- governor behind the turnstile trait ----------------------------------------------------

/// governor's direct limiter (on its default quanta clock) as a [`Limiter`]. Times are
/// nanoseconds since the adapter was built, on governor's own clock.
///
/// governor always decides at its own clock reading, so `check_n_at` ignores its `now` except to
/// report a denial; `check_n` and `check` are overridden so that a check, granted or refused,
/// reads the clock once, as governor's own `check` does and as turnstile's `check` does, and a
/// refusal computes `NotUntil::earliest_possible` (turnstile's returns its retry time).
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

    /// Straight from governor's nanoseconds: no round trip through `Duration` (a division by
    /// 10^9 and back) on every refusal, work governor's own caller would not do.
    fn since_origin(&self, t: QuantaInstant) -> Nanos {
        Nanos::new(t.duration_since(self.origin).as_u64())
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
            // governor's check reads its clock once and does not report the reading; reading
            // it again here for `checked_at` would be a second read that turnstile's `check`
            // does not make. So the denial is stamped with its retry time (`retry_after` is
            // then zero: the shootout only counts denials, and `check_n_at` restamps it).
            Ok(Err(not_until)) => {
                let retry = self.since_origin(not_until.earliest_possible());
                Err(Denied::new(retry, Some(retry)))
            }
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

// ---- the floors ------------------------------------------------------------------------------

/// The least work a check can do, as a [`Limiter`] so the same [`run`] hammers it: one read of
/// turnstile's [`QuantaClock`] (the clock every turnstile limiter reads) and one load of a shared
/// cache-padded word, and with `cas` one compare-and-swap of it. The load-only floor always
/// refuses (the word, 0, is never ahead of the clock): the cost of a refusal decided from one
/// load. The CAS floor moves the word to the clock reading and grants if its one attempt wins:
/// the cost of a grant. Either returns what a limiter returns, a [`Denied`] with a retry time.
struct Floor {
    clock: QuantaClock,
    word: CachePadded<AtomicU64>,
    cas: bool,
}

impl Floor {
    fn new(cas: bool) -> Floor {
        Floor {
            clock: QuantaClock::new(),
            word: CachePadded::new(AtomicU64::new(0)),
            cas,
        }
    }
}

impl Limiter for Floor {
    #[inline]
    fn check_n_at(&self, now: Nanos, _n: u32) -> Result<(), Denied> {
        let w = self.word.load(Ordering::Acquire);
        if self.cas {
            let next = w.max(now.as_u64()).wrapping_add(1);
            match self
                .word
                .compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => Ok(()),
                Err(seen) => Err(Denied::new(now, Some(Nanos::new(seen)))),
            }
        } else if w > now.as_u64() {
            Ok(())
        } else {
            Err(Denied::new(now, Some(Nanos::new(w))))
        }
    }

    #[inline]
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    #[inline]
    fn check(&self) -> Result<(), Denied> {
        self.check_n_at(self.clock.now(), 1)
    }
}

/// The keyed floor: one clock read, a SipHash of the key (std's default `RandomState`, as
/// governor's and turnstile's keyed maps use) and one load of a cache-padded word the hash
/// picks out of `words` (sized like the workload's keys: 10 000 words is one likely cache miss
/// per check, one word is a hot client). Always refuses (the words stay 0), like [`Floor`]
/// without `cas`. With `W` a `Box` ([`KeyedFloor::indirect`]) each word is behind a pointer:
/// two dependent loads, the floor of a map whose limiters never move (`Keyed`'s).
struct KeyedFloor<W = CachePadded<AtomicU64>> {
    clock: QuantaClock,
    hasher: RandomState,
    words: Vec<W>,
}

/// A [`KeyedFloor`]'s word, in place or behind a pointer.
trait FloorWord {
    fn word(&self) -> &AtomicU64;
}

impl FloorWord for CachePadded<AtomicU64> {
    #[inline]
    fn word(&self) -> &AtomicU64 {
        self
    }
}

impl FloorWord for Box<CachePadded<AtomicU64>> {
    #[inline]
    fn word(&self) -> &AtomicU64 {
        self
    }
}

impl KeyedFloor {
    fn new(words: u64) -> KeyedFloor {
        KeyedFloor::of(words, || CachePadded::new(AtomicU64::new(0)))
    }
}

impl KeyedFloor<Box<CachePadded<AtomicU64>>> {
    /// Each word on a heap line of its own, allocated in order, reached through the vector.
    fn indirect(words: u64) -> Self {
        KeyedFloor::of(words, || Box::new(CachePadded::new(AtomicU64::new(0))))
    }
}

impl<W: FloorWord> KeyedFloor<W> {
    fn of(words: u64, word: impl Fn() -> W) -> Self {
        KeyedFloor {
            clock: QuantaClock::new(),
            hasher: RandomState::new(),
            words: (0..words.max(1)).map(|_| word()).collect(),
        }
    }

    /// `Err(the word)`, the retry time of a limiter whose word holds it.
    #[inline]
    fn check(&self, key: u64) -> Result<(), u64> {
        let now = self.clock.now().as_u64();
        let h = self.hasher.hash_one(key);
        // The hash onto 0..len by a multiply and a shift (Lemire's reduction): no division,
        // which a real table (a power-of-two mask) would not make either.
        let i = ((u128::from(h) * self.words.len() as u128) >> 64) as usize;
        let w = self.words[i].word().load(Ordering::Acquire);
        if w > now {
            Ok(())
        } else {
            Err(w)
        }
    }
}

// ---- results ----------------------------------------------------------------------------------

/// Whose limiter a cell hammered.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Impl {
    /// turnstile's lock-free limiter (for the keyed workloads: `Keyed` of compact token buckets).
    Turnstile,
    /// turnstile's `KeyedTokenBucket` (one word per key, inline in the map): keyed phase only.
    TurnstileInline,
    /// The same algorithm in `turnstile::reference`, behind a mutex.
    MutexTwin,
    /// The `governor` crate (phases 1, 2 and 4: it has no other algorithm).
    Governor,
    /// The refusal floor, no limiter: one clock read and one load of a shared word (phases 1
    /// and 4; in phase 4 also a SipHash of the key, the load then one likely cache miss).
    Floor,
    /// The grant floor, no limiter: one clock read, one load and one compare-and-swap of a
    /// shared word (phase 1).
    FloorCas,
    /// The keyed refusal floor of a map whose limiters never move (`Keyed`'s design): as the
    /// keyed `Floor`, with the word behind a pointer (phase 4's random clients).
    FloorIndirect,
}

impl Impl {
    pub const ALL: [Impl; 7] = [
        Impl::Turnstile,
        Impl::TurnstileInline,
        Impl::MutexTwin,
        Impl::Governor,
        Impl::Floor,
        Impl::FloorCas,
        Impl::FloorIndirect,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Impl::Turnstile => "turnstile",
            Impl::TurnstileInline => "turnstile_inline",
            Impl::MutexTwin => "mutex_twin",
            Impl::Governor => "governor",
            Impl::Floor => "floor",
            Impl::FloorCas => "floor_cas",
            Impl::FloorIndirect => "floor_indirect",
        }
    }

    pub fn is_turnstile(self) -> bool {
        matches!(self, Impl::Turnstile | Impl::TurnstileInline)
    }

    /// A floor cell: no limiter, the least work any limiter's check does (never judged, no
    /// budget).
    pub fn is_floor(self) -> bool {
        matches!(self, Impl::Floor | Impl::FloorCas | Impl::FloorIndirect)
    }
}

/// What a cell's grants are checked against.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scope {
    /// One limiter: all its grants against its budget.
    Limiter,
    /// A keyed limiter: the key granted the most against the per-key budget.
    WorstKey,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Limiter => "limiter",
            Scope::WorstKey => "worst_key",
        }
    }
}

/// A cell's budget check.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub scope: Scope,
    /// The grants checked: all of them, or the worst key's.
    pub granted: u64,
    /// The most the algorithm may ever grant in the run's window.
    pub budget: f64,
}

impl Budget {
    /// Whether the grants stayed within the budget plus one request (turnstile's deviation D2).
    pub fn held(&self) -> bool {
        (self.granted as f64) <= self.budget + 1.0
    }
}

/// One limiter implementation hammered at one thread count.
#[derive(Clone, Debug)]
pub struct Cell {
    pub phase: u8,
    pub limiter: &'static str,
    pub implementation: Impl,
    pub threads: usize,
    /// Which of the `--runs` repetitions this cell is, from 1.
    pub run: usize,
    /// Checks made, granted or denied.
    pub ops: u64,
    pub granted: u64,
    pub denied: u64,
    /// Wall-clock time from the threads' release to the last thread's stop.
    pub wall: Duration,
    /// `None` for phase 2, which always allows and has no budget to hold, and for the floors.
    pub budget: Option<Budget>,
    /// Keys in the map at the end (keyed phase only).
    pub keys: Option<usize>,
}

impl Cell {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Nanoseconds per check on each thread: each thread spends `wall` on its share.
    pub fn ns_per_op(&self) -> f64 {
        self.wall.as_secs_f64() * 1e9 * self.threads as f64 / self.ops.max(1) as f64
    }

    pub fn held(&self) -> Option<bool> {
        self.budget.map(|b| b.held())
    }
}

/// Everything one run measured.
pub struct Report {
    pub cores: usize,
    /// Repetitions of every cell (`--runs`).
    pub runs: usize,
    pub cells: Vec<Cell>,
    /// The 1-minute load average when the run ended (Linux only), this run's threads included.
    pub load: Option<f64>,
}

impl Report {
    /// Whether every turnstile cell with a budget held it.
    pub fn turnstile_held(&self) -> bool {
        self.cells
            .iter()
            .filter(|c| c.implementation.is_turnstile())
            .all(|c| c.held() != Some(false))
    }

    /// Every run of one implementation of `limiter` at `threads`, in run order.
    fn runs_of(&self, limiter: &str, imp: Impl, threads: usize) -> Vec<&Cell> {
        self.cells
            .iter()
            .filter(|c| c.limiter == limiter && c.implementation == imp && c.threads == threads)
            .collect()
    }

    /// The limiters in the order they ran.
    pub fn limiters(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for c in &self.cells {
            if !out.contains(&c.limiter) {
                out.push(c.limiter);
            }
        }
        out
    }
}

// ---- the command line -------------------------------------------------------------------------

/// Where `--json` writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonTo {
    /// `--json -`: the JSON on stdout, the human report on stderr.
    Stdout,
    File(String),
}

#[derive(Clone, Debug)]
pub struct Args {
    /// Seconds per cell.
    pub seconds: f64,
    /// Whether `--seconds` was given (otherwise derived from the thread counts).
    pub seconds_given: bool,
    /// Thread counts to sweep, ascending, no repeats.
    pub threads: Vec<usize>,
    pub limit: f64,
    pub burst: u32,
    /// Repetitions of every cell, alternating implementations (`--runs`).
    pub runs: usize,
    pub json: Option<JsonTo>,
    pub plot: Option<String>,
}

impl Args {
    /// Cells in the whole run, every repetition counted.
    pub fn cells(&self) -> usize {
        CELLS_PER_THREAD_COUNT * self.threads.len() * self.runs
    }

    /// Seconds of hammering in the whole run (setup adds a little).
    pub fn expected_seconds(&self) -> f64 {
        self.cells() as f64 * self.seconds
    }
}

/// 1, 2, 4, ... below `cores`, then `cores`.
pub fn default_threads(cores: usize) -> Vec<usize> {
    let cores = cores.max(1);
    let mut out: Vec<usize> = std::iter::successors(Some(1usize), |t| t.checked_mul(2))
        .take_while(|t| *t < cores)
        .collect();
    out.push(cores);
    out
}

/// Per-cell seconds so that the whole run, `runs` repetitions of every cell, hammers for about
/// [`DEFAULT_TOTAL_SECONDS`]: rounded down to 0.05 s, at most [`MAX_DEFAULT_SECONDS`], at least
/// [`MIN_DEFAULT_SECONDS`].
pub fn default_seconds(thread_counts: usize, runs: usize) -> f64 {
    let cells = (CELLS_PER_THREAD_COUNT * thread_counts.max(1) * runs.max(1)) as f64;
    let s = (DEFAULT_TOTAL_SECONDS / cells * 20.0).floor() / 20.0;
    s.clamp(MIN_DEFAULT_SECONDS, MAX_DEFAULT_SECONDS)
}

pub fn usage(cores: usize) -> String {
    let threads = default_threads(cores);
    let seconds = default_seconds(threads.len(), 1);
    let seconds3 = default_seconds(threads.len(), 3);
    let list: Vec<String> = threads.iter().map(|t| t.to_string()).collect();
    format!(
        "usage: shootout [--threads LIST] [--seconds N] [--runs N] [--limit R] [--burst B] \
         [--json FILE|-] [--plot FILE.svg]

Hammers each limiter (turnstile's lock-free one, its mutex twin, governor where it has one)
from threads on one shared instance, prints ops/s, time per op and granted-vs-budget, and ends
with a verdict. Exit status: 0 ok; 1 if a turnstile limiter granted more than its budget;
2 on a usage error (or --plot without the `plot` feature) or an output file that cannot be
written.

  --threads LIST  thread counts to sweep, comma-separated, e.g. 1,2,4,8
                  (default: 1, 2, 4, ... below the core count, then the core count;
                  here {list})
  --seconds N     seconds per cell, one cell = one limiter at one thread count in one run
                  (default: {DEFAULT_TOTAL_SECONDS} s / ({CELLS_PER_THREAD_COUNT} cells x thread \
         counts x runs), rounded
                  down to 0.05 s, between {MIN_DEFAULT_SECONDS} and {MAX_DEFAULT_SECONDS}; here \
         {seconds:.2}, {total:.0} s in all,
                  or {seconds3:.2} with --runs 3)
  --runs N        repeat every cell N times, alternating the implementations of each limiter
                  round by round; the verdict gives each ratio as median (min-max) over the
                  runs and reads the median (default 1, at most {MAX_RUNS})
  --limit R       phase 1 and 3 rate, events per second (default 1000000)
  --burst B       phase 1 burst, phase 3 leaky-bucket slack and meter capacity (default 1000)
  --json FILE     also write every cell and the verdict as JSON to FILE; `--json -` writes
                  the JSON to stdout and the report to stderr (default: no JSON)
  --plot FILE     draw ops/s against threads per limiter as an SVG (default: no plot; needs
                  the `plot` feature: cargo run --release --example shootout --features plot)
  -h, --help      this text",
        list = list.join(","),
        total = seconds * (CELLS_PER_THREAD_COUNT * threads.len()) as f64,
    )
}

/// Parses the arguments after the program name. `Err("")` asks for the help text.
pub fn parse_args(argv: impl IntoIterator<Item = String>, cores: usize) -> Result<Args, String> {
    let mut args = Args {
        seconds: 0.0,
        seconds_given: false,
        threads: Vec::new(),
        limit: 1_000_000.0,
        burst: 1000,
        runs: 1,
        json: None,
        plot: None,
    };
    let mut it = argv.into_iter();
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
                args.seconds_given = true;
            }
            "--threads" => {
                let v = value()?;
                let mut list = Vec::new();
                for part in v.split(',') {
                    let t = part
                        .trim()
                        .parse()
                        .ok()
                        .filter(|t: &usize| (1..=4096).contains(t))
                        .ok_or_else(|| {
                            format!(
                                "--threads: expected a comma-separated list of thread counts \
                                 from 1 to 4096, got {v:?}"
                            )
                        })?;
                    list.push(t);
                }
                list.sort_unstable();
                list.dedup();
                args.threads = list;
            }
            "--runs" => {
                let v = value()?;
                args.runs = v
                    .parse()
                    .ok()
                    .filter(|r: &usize| (1..=MAX_RUNS).contains(r))
                    .ok_or_else(|| {
                        format!("--runs: expected a whole number from 1 to {MAX_RUNS}, got {v:?}")
                    })?;
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
            "--json" => {
                let v = value()?;
                args.json = Some(if v == "-" {
                    JsonTo::Stdout
                } else {
                    JsonTo::File(v)
                });
            }
            "--plot" => args.plot = Some(value()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.threads.is_empty() {
        args.threads = default_threads(cores);
    }
    if !args.seconds_given {
        args.seconds = default_seconds(args.threads.len(), args.runs);
    }
    Ok(args)
}

// ---- the run ----------------------------------------------------------------------------------

struct Stats {
    granted: u64,
    denied: u64,
    /// On the limiter's clock, from before the first check to after the last.
    elapsed: Duration,
    /// On the wall clock, from the release to the last stop.
    wall: Duration,
}

/// Runs `work(id, stop)` on `threads` threads released together, after `before()` has run;
/// sleeps `dur`, raises `stop` and joins them. Returns `before()`'s value, the wall-clock time
/// from the release to the last thread's stop and each thread's result.
fn hammer<B, T: Send>(
    threads: usize,
    dur: Duration,
    before: impl FnOnce() -> B,
    work: impl Fn(usize, &AtomicBool) -> T + Sync,
) -> (B, Duration, Vec<T>) {
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
        (b, w0.elapsed(), results)
    })
}

/// A refusal's retry time in nanoseconds (0 for never), which the hammers add up so that no
/// limiter's retry time is optimized away: every refusal must say when to retry, and here it is
/// read, as a caller answering with `Retry-After` reads it.
#[inline]
fn retry_ns(d: Denied) -> u64 {
    d.retry_at().map_or(0, Nanos::as_u64)
}

/// Hammers `l` with `threads` threads calling `check()` for about `dur`.
fn run<L: Limiter>(l: &L, threads: usize, dur: Duration) -> Stats {
    // t0 is read before any thread can check: the window covers every check.
    let (t0, wall, per_thread) = hammer(
        threads,
        dur,
        || l.now(),
        |_, stop| {
            let (mut granted, mut denied, mut retry) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..BATCH {
                    match l.check() {
                        Ok(()) => granted += 1,
                        Err(d) => {
                            denied += 1;
                            retry = retry.wrapping_add(retry_ns(d));
                        }
                    }
                }
            }
            std::hint::black_box(retry);
            (granted, denied)
        },
    );
    // Read after every thread has stopped.
    let elapsed = l.now() - t0;
    Stats {
        granted: per_thread.iter().map(|p| p.0).sum(),
        denied: per_thread.iter().map(|p| p.1).sum(),
        elapsed,
        wall,
    }
}

/// A cell from a single-limiter run; `budget` maps the run's stats to its budget.
fn cell(
    phase: u8,
    limiter: &'static str,
    implementation: Impl,
    (threads, run): (usize, usize),
    s: &Stats,
    budget: Option<&dyn Fn(&Stats) -> f64>,
) -> Cell {
    Cell {
        phase,
        limiter,
        implementation,
        threads,
        run,
        ops: s.granted + s.denied,
        granted: s.granted,
        denied: s.denied,
        wall: s.wall,
        budget: budget.map(|b| Budget {
            scope: Scope::Limiter,
            granted: s.granted,
            budget: b(s),
        }),
        keys: None,
    }
}

/// Runs every phase at every thread count, printing each phase's table to `out` as it ends.
pub fn run_all(args: &Args, out: &mut dyn Write) -> io::Result<Report> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dur = Duration::from_secs_f64(args.seconds);
    let list: Vec<String> = args.threads.iter().map(|t| t.to_string()).collect();
    writeln!(
        out,
        "turnstile shootout: {cores} cores; threads {} on one shared limiter; {:.2} s per cell",
        list.join(", "),
        args.seconds
    )?;
    if args.runs > 1 {
        writeln!(
            out,
            "{} runs: at each thread count every limiter's implementations run one after the \
             other, then again, {} rounds (alternating, so drift hits every implementation alike)",
            args.runs, args.runs
        )?;
    }
    writeln!(
        out,
        "expected run time: {} cells ({CELLS_PER_THREAD_COUNT} per thread count x {} thread \
         counts x {} run{}) x {:.2} s = {:.0} s, plus a little setup",
        args.cells(),
        args.threads.len(),
        args.runs,
        if args.runs == 1 { "" } else { "s" },
        args.seconds,
        args.expected_seconds()
    )?;
    let mut cells = Vec::new();
    phase1(args, dur, out, &mut cells)?;
    phase2(args, dur, out, &mut cells)?;
    phase3(args, dur, out, &mut cells)?;
    phase4(args, dur, out, &mut cells)?;
    Ok(Report {
        cores,
        runs: args.runs,
        cells,
        load: load_average(),
    })
}

/// `(threads, run)` for every thread count and every run, runs innermost: each round runs every
/// implementation once.
fn rounds(args: &Args) -> impl Iterator<Item = (usize, usize)> + '_ {
    args.threads
        .iter()
        .flat_map(move |&t| (1..=args.runs).map(move |r| (t, r)))
}

/// Phase 1: the token bucket at a realistic limit, against its twin, governor and the floors.
fn phase1(
    args: &Args,
    dur: Duration,
    out: &mut dyn Write,
    cells: &mut Vec<Cell>,
) -> io::Result<()> {
    writeln!(
        out,
        "\nphase 1: token bucket, limit {}/s, burst {} (budget = burst + limit x elapsed)",
        args.limit, args.burst
    )?;
    writeln!(
        out,
        "  floors (no limiter, no budget): floor = turnstile's QuantaClock read + one load of a \
         shared word\n  (a refusal); floor_cas = the same + one compare-and-swap of it (a grant)"
    )?;
    let limit = limit_of(args.limit);
    let burst = f64::from(args.burst);
    let mut gov_limit = args.limit;
    let first = cells.len();
    let name = "token_bucket";
    for tr in rounds(args) {
        let budget = |s: &Stats| burst + args.limit * s.elapsed.as_secs_f64();
        let s = run(&TokenBucket::new(limit, args.burst), tr.0, dur);
        cells.push(cell(1, name, Impl::Turnstile, tr, &s, Some(&budget)));
        let s = run(&reference::TokenBucket::new(limit, args.burst), tr.0, dur);
        cells.push(cell(1, name, Impl::MutexTwin, tr, &s, Some(&budget)));
        let gov = Governor::new(args.limit, args.burst);
        gov_limit = gov.effective_limit;
        let s = run(&gov, tr.0, dur);
        let gov_budget = |s: &Stats| burst + gov_limit * s.elapsed.as_secs_f64();
        cells.push(cell(1, name, Impl::Governor, tr, &s, Some(&gov_budget)));
        let s = run(&Floor::new(false), tr.0, dur);
        cells.push(cell(1, name, Impl::Floor, tr, &s, None));
        let s = run(&Floor::new(true), tr.0, dur);
        cells.push(cell(1, name, Impl::FloorCas, tr, &s, None));
    }
    budget_table(&cells[first..], args.runs).print(out)?;
    if cells[first..]
        .iter()
        .any(|c| c.implementation == Impl::MutexTwin && c.held() == Some(false))
    {
        writeln!(
            out,
            "  (the twin is rate.go verbatim: a check whose clock reading is older than the last \
             one\n   (a thread preempted between reading the clock and taking the lock) moves \
             `last` back,\n   and the next check mints that time again; turnstile's D2 forbids \
             this)"
        )?;
    }
    if (gov_limit - args.limit).abs() > 1e-9 * args.limit {
        writeln!(
            out,
            "  (governor's period is whole nanoseconds: it enforces {gov_limit:.3}/s; its budget \
             uses that)"
        )?;
    }
    Ok(())
}

/// Phase 2: always allowing, raw throughput.
fn phase2(
    args: &Args,
    dur: Duration,
    out: &mut dyn Write,
    cells: &mut Vec<Cell>,
) -> io::Result<()> {
    // Finite, so every check writes; the burst gives tau = burst / limit = 0.43 s, so a thread
    // preempted between its clock read and its CAS is not denied for its stale time (D2).
    const RAW_LIMIT: f64 = 1e10;
    const RAW_BURST: u32 = u32::MAX;
    writeln!(
        out,
        "\nphase 2: token bucket always allowing (limit {RAW_LIMIT:e}/s, burst {}; governor \
         1e9/s, burst {}): every check writes, raw throughput",
        grouped(u64::from(RAW_BURST)),
        grouped(u64::from(u32::MAX))
    )?;
    let raw = limit_of(RAW_LIMIT);
    let first = cells.len();
    let name = "token_bucket_raw";
    for tr in rounds(args) {
        let s = run(&TokenBucket::new(raw, RAW_BURST), tr.0, dur);
        cells.push(cell(2, name, Impl::Turnstile, tr, &s, None));
        let s = run(&reference::TokenBucket::new(raw, RAW_BURST), tr.0, dur);
        cells.push(cell(2, name, Impl::MutexTwin, tr, &s, None));
        let s = run(&Governor::new(1e9, u32::MAX), tr.0, dur);
        cells.push(cell(2, name, Impl::Governor, tr, &s, None));
    }
    let mut head = vec!["limiter", "impl", "threads"];
    if args.runs > 1 {
        head.push("run");
    }
    head.extend(["ops/s", "ns/op/thread", "granted", "denied"]);
    let mut t = Table::new(&head);
    let mut last = "";
    for c in &cells[first..] {
        let mut row = lead(c, last, args.runs);
        row.extend([
            mops(c),
            format!("{:.1}", c.ns_per_op()),
            grouped(c.granted),
            grouped(c.denied),
        ]);
        t.row(row);
        last = c.limiter;
    }
    t.print(out)?;
    Ok(())
}

/// Phase 3: every other algorithm against its mutex twin, at the phase-1 rate.
fn phase3(
    args: &Args,
    dur: Duration,
    out: &mut dyn Write,
    cells: &mut Vec<Cell>,
) -> io::Result<()> {
    let rate = args.limit;
    let whole_rate = rate.round().clamp(1.0, f64::from(u32::MAX)) as u32;
    let slack = args.burst;
    let warmup = Duration::from_millis(100);
    writeln!(
        out,
        "\nphase 3: the other algorithms at {whole_rate}/s against their twins \
         (budget = what the algorithm may ever grant in the window)"
    )?;
    writeln!(
        out,
        "  leaky bucket: slack {slack} -> slack + 1 + elapsed / interval; smooth: max stored \
         permits + rate x elapsed + 1 (bursty 1 s of burst, warming-up {warmup:?} warm-up)"
    )?;
    let quota = (whole_rate / 100).max(1);
    writeln!(
        out,
        "  windows: quota {quota} per {WINDOW:?} -> quota x (elapsed / period + 1) fixed, + 2 \
         sliding; leaky meter: capacity {} -> capacity + rate x elapsed + 1",
        slack.max(1)
    )?;
    let interval_ns = (1_000_000_000u64 / u64::from(whole_rate)).max(1) as f64;
    let leaky_budget =
        |s: &Stats| f64::from(slack) + 1.0 + s.elapsed.as_nanos() as f64 / interval_ns;
    let bursty_budget = |s: &Stats| rate + rate * s.elapsed.as_secs_f64() + 1.0;
    let warm_max = SmoothWarmingUp::new(rate, warmup)
        .expect("valid warm-up limiter")
        .params()
        .max_permits;
    let warm_budget = |s: &Stats| warm_max + rate * s.elapsed.as_secs_f64() + 1.0;
    // Windows of 10 ms holding the same rate; a first-hit fixed window opens at most
    // elapsed / period + 1 windows, and at most elapsed / period + 2 aligned sliding windows
    // overlap the run, each granting at most the quota.
    let windows = |s: &Stats| (s.elapsed.as_nanos() / WINDOW.as_nanos()) as f64;
    let fixed_budget = |s: &Stats| f64::from(quota) * (windows(s) + 1.0);
    let sliding_budget = |s: &Stats| f64::from(quota) * (windows(s) + 2.0);
    // The meter: capacity + leak x elapsed (+1, D2), like a token bucket.
    let meter_budget = |s: &Stats| f64::from(slack.max(1)) + rate * s.elapsed.as_secs_f64() + 1.0;

    let first = cells.len();
    // Each limiter at every thread count, turnstile then its twin, round after round; a fresh
    // instance per cell. The floors are phase 1's: the same clock, load and CAS.
    let mut add = |name: &'static str,
                   budget: &dyn Fn(&Stats) -> f64,
                   ours: &dyn Fn(usize) -> Stats,
                   twin: Option<&dyn Fn(usize) -> Stats>| {
        for tr in rounds(args) {
            cells.push(cell(
                3,
                name,
                Impl::Turnstile,
                tr,
                &ours(tr.0),
                Some(budget),
            ));
            if let Some(twin) = twin {
                cells.push(cell(
                    3,
                    name,
                    Impl::MutexTwin,
                    tr,
                    &twin(tr.0),
                    Some(budget),
                ));
            }
        }
    };
    add(
        "leaky_bucket",
        &leaky_budget,
        &|t| {
            let l = LeakyBucket::builder(whole_rate).slack(slack).build();
            run(&l.expect("valid"), t, dur)
        },
        Some(&|t| {
            let l = reference::LeakyBucket::try_from(
                turnstile::LeakyBucket::builder(whole_rate).slack(slack),
            );
            run(&l.expect("valid"), t, dur)
        }),
    );
    add(
        "smooth_bursty",
        &bursty_budget,
        &|t| run(&SmoothBursty::new(rate).expect("valid"), t, dur),
        Some(&|t| run(&reference::SmoothBursty::new(rate).expect("valid"), t, dur)),
    );
    add(
        "smooth_warming_up",
        &warm_budget,
        &|t| run(&SmoothWarmingUp::new(rate, warmup).expect("valid"), t, dur),
        Some(&|t| {
            let l = reference::SmoothWarmingUp::new(rate, warmup);
            run(&l.expect("valid"), t, dur)
        }),
    );
    add(
        "fixed_window",
        &fixed_budget,
        &|t| run(&FixedWindow::new(quota, WINDOW).expect("valid"), t, dur),
        Some(&|t| {
            let l = reference::FixedWindow::new(quota, WINDOW);
            run(&l.expect("valid"), t, dur)
        }),
    );
    add(
        "sliding_window",
        &sliding_budget,
        &|t| run(&SlidingWindow::new(quota, WINDOW).expect("valid"), t, dur),
        Some(&|t| {
            let l = reference::SlidingWindow::new(quota, WINDOW);
            run(&l.expect("valid"), t, dur)
        }),
    );
    add(
        "leaky_meter",
        &meter_budget,
        &|t| {
            let l = LeakyMeter::new(slack.max(1), limit_of(rate));
            run(&l.expect("valid"), t, dur)
        },
        None,
    );
    budget_table(&cells[first..], args.runs).print(out)?;
    writeln!(
        out,
        "  (the floors for these are phase 1's, the same clock read, load and CAS: see the verdict)"
    )
}

/// Phase 4: per-key limiters, turnstile's `Keyed` (each key a token bucket in the `Compact`
/// layout meant for keyed maps) and `KeyedTokenBucket` (each key one word inline) against
/// governor's keyed limiter (dashmap). First `KEYS` clients picked at random by every thread,
/// each with a small budget; then one hot client with the phase-1 rate. Every key's grants are
/// counted and checked against its own budget.
fn phase4(
    args: &Args,
    dur: Duration,
    out: &mut dyn Write,
    cells: &mut Vec<Cell>,
) -> io::Result<()> {
    const KEYS: u64 = 10_000;
    const KEY_RATE: u32 = 100;
    const KEY_BURST: u32 = 10;
    const HOT_RATE: u32 = 1_000_000;
    const HOT_BURST: u32 = 1000;
    writeln!(
        out,
        "\nphase 4: keyed limiters (and their floor): {} clients at {KEY_RATE}/s (burst {KEY_BURST}) picked at \
         random, then 1 hot client at {}/s (burst {HOT_BURST}); budget per key = burst + rate x \
         elapsed",
        grouped(KEYS),
        grouped(u64::from(HOT_RATE))
    )?;
    let first = cells.len();
    for (name, keys, rate, burst) in [
        ("keyed_random", KEYS, KEY_RATE, KEY_BURST),
        ("keyed_hot", 1, HOT_RATE, HOT_BURST),
    ] {
        let limit = limit_of(f64::from(rate));
        for (threads, run) in rounds(args) {
            let keyed_cell = |imp, s: KeyedStats, held: usize| {
                // Wall time bounds every limiter clock's elapsed time here, up to calibration
                // error: the one request of slack in `Budget::held` covers both.
                let budget = f64::from(burst) + f64::from(rate) * s.wall.as_secs_f64();
                let total = s.granted.iter().sum();
                Cell {
                    phase: 4,
                    limiter: name,
                    implementation: imp,
                    threads,
                    run,
                    ops: s.ops,
                    granted: total,
                    denied: s.ops - total,
                    wall: s.wall,
                    budget: Some(Budget {
                        scope: Scope::WorstKey,
                        granted: s.granted.iter().copied().max().unwrap_or(0),
                        budget,
                    }),
                    keys: Some(held),
                }
            };
            let ours =
                Keyed::new(move |_: &u64| TokenBucket::builder(limit, burst).build_compact());
            let s = run_keyed(threads, dur, keys, |k| ours.check(&k).map_err(retry_ns));
            cells.push(keyed_cell(Impl::Turnstile, s, ours.len()));
            drop(ours);
            let inline = KeyedTokenBucket::new(limit, burst);
            let s = run_keyed(threads, dur, keys, |k| inline.check(&k).map_err(retry_ns));
            cells.push(keyed_cell(Impl::TurnstileInline, s, inline.len()));
            drop(inline);
            let gov = RateLimiter::keyed(
                Quota::per_second(NonZeroU32::new(rate).expect("nonzero"))
                    .allow_burst(NonZeroU32::new(burst).expect("nonzero")),
            );
            // A refusal computes its retry time, NotUntil::earliest_possible, as turnstile's
            // does (in nanoseconds since a reading of governor's clock, as the direct adapter's).
            let origin = GovClock::default().now();
            let s = run_keyed(threads, dur, keys, |k| {
                gov.check_key(&k)
                    .map_err(|nu| nu.earliest_possible().duration_since(origin).as_u64())
            });
            cells.push(keyed_cell(Impl::Governor, s, gov.len()));
            drop(gov);
            // No limiter: no budget and no keys held.
            let floor = KeyedFloor::new(keys);
            let s = run_keyed(threads, dur, keys, |k| floor.check(k));
            let mut c = keyed_cell(Impl::Floor, s, 0);
            c.budget = None;
            c.keys = None;
            cells.push(c);
            if keys > 1 {
                let floor = KeyedFloor::indirect(keys);
                let s = run_keyed(threads, dur, keys, |k| floor.check(k));
                let mut c = keyed_cell(Impl::FloorIndirect, s, 0);
                c.budget = None;
                c.keys = None;
                cells.push(c);
            }
        }
    }
    let mut head = vec!["limiter", "impl", "threads"];
    if args.runs > 1 {
        head.push("run");
    }
    head.extend([
        "ops/s",
        "ns/op/thread",
        "granted",
        "worst key granted/budget",
        "keys held",
        "verdict",
    ]);
    let mut t = Table::new(&head);
    let mut last = "";
    for c in &cells[first..] {
        let mut row = lead(c, last, args.runs);
        row.extend([
            mops(c),
            format!("{:.1}", c.ns_per_op()),
            grouped(c.granted),
            c.budget.map_or("-".to_string(), |b| {
                format!("{:.4}", b.granted as f64 / b.budget)
            }),
            c.keys.map_or("-".to_string(), |k| grouped(k as u64)),
            verdict_word(c).to_string(),
        ]);
        t.row(row);
        last = c.limiter;
    }
    t.print(out)?;
    writeln!(
        out,
        "  (floor: no limiter; a QuantaClock read + SipHash of the key (std RandomState) + one \
         load of a
   cache-padded word the hash picks out of as many as there are keys: one \
         likely cache miss
   per random check, one hot word for the hot client; floor_indirect: the same word behind \
         a pointer,
   two dependent loads, the least a map whose limiters never move (Keyed's) can cost)"
    )
}

struct KeyedStats {
    /// Grants per key.
    granted: Vec<u64>,
    ops: u64,
    /// Wall time from the release to the last stop: covers every check.
    wall: Duration,
}

/// Hammers `check(key)` with `threads` threads, each picking keys in `0..keys` at random;
/// `check` answers `Err(retry time in ns)` for a refusal, which is added up (see [`retry_ns`]).
fn run_keyed(
    threads: usize,
    dur: Duration,
    keys: u64,
    check: impl Fn(u64) -> Result<(), u64> + Sync,
) -> KeyedStats {
    let granted: Vec<AtomicU64> = (0..keys).map(|_| AtomicU64::new(0)).collect();
    let ((), wall, per_thread) = hammer(
        threads,
        dur,
        || (),
        |id, stop| {
            let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64 + 1);
            let (mut ops, mut retry) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..BATCH {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = rng % keys;
                    match check(key) {
                        Ok(()) => {
                            granted[key as usize].fetch_add(1, Ordering::Relaxed);
                        }
                        Err(r) => retry = retry.wrapping_add(r),
                    }
                }
                ops += u64::from(BATCH);
            }
            std::hint::black_box(retry);
            ops
        },
    );
    KeyedStats {
        granted: granted.into_iter().map(|g| g.into_inner()).collect(),
        ops: per_thread.iter().sum(),
        wall,
    }
}

// ---- tables -----------------------------------------------------------------------------------

fn verdict_word(c: &Cell) -> &'static str {
    match c.held() {
        Some(true) => "ok",
        Some(false) => "OVER",
        None => "-",
    }
}

/// The first columns of a phase table's row: the limiter (only where it changes), the
/// implementation, the threads and, with more than one run, the run.
fn lead(c: &Cell, last: &str, runs: usize) -> Vec<String> {
    let mut row = vec![
        if c.limiter == last { "" } else { c.limiter }.to_string(),
        c.implementation.name().to_string(),
        c.threads.to_string(),
    ];
    if runs > 1 {
        row.push(c.run.to_string());
    }
    row
}

/// The table of a phase that checks one budget per limiter (floors: no budget, `-`).
fn budget_table(cells: &[Cell], runs: usize) -> Table {
    let mut head = vec!["limiter", "impl", "threads"];
    if runs > 1 {
        head.push("run");
    }
    head.extend([
        "ops/s",
        "ns/op/thread",
        "granted",
        "budget",
        "granted/budget",
        "denied",
        "verdict",
    ]);
    let mut t = Table::new(&head);
    let mut last = "";
    for c in cells {
        let dash = || "-".to_string();
        let mut row = lead(c, last, runs);
        row.extend([
            mops(c),
            format!("{:.1}", c.ns_per_op()),
            grouped(c.granted),
            c.budget
                .map_or_else(dash, |b| grouped(b.budget.floor() as u64)),
            c.budget
                .map_or_else(dash, |b| format!("{:.6}", b.granted as f64 / b.budget)),
            format!("{:.2}%", 100.0 * c.denied as f64 / c.ops.max(1) as f64),
            verdict_word(c).to_string(),
        ]);
        t.row(row);
        last = c.limiter;
    }
    t
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

    /// Prints the table; the columns in `left` are left-aligned, the rest right-aligned.
    fn print_aligned(&self, out: &mut dyn Write, left: &[usize]) -> io::Result<()> {
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
        let mut line = |cells: &[String]| {
            let parts: Vec<String> = cells
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if left.contains(&i) {
                        format!("{c:<w$}", w = widths[i])
                    } else {
                        format!("{c:>w$}", w = widths[i])
                    }
                })
                .collect();
            writeln!(out, "  {}", parts.join("  ").trim_end())
        };
        line(&self.head)?;
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule)?;
        for r in &self.rows {
            line(r)?;
        }
        Ok(())
    }

    fn print(&self, out: &mut dyn Write) -> io::Result<()> {
        self.print_aligned(out, &[0, 1])
    }
}

/// `1234567` as `1_234_567`.
fn grouped(n: u64) -> String {
    report::group_digits(n, '_')
}

fn mops(c: &Cell) -> String {
    format!("{:.2}M", c.ops_per_sec() / 1e6)
}

// ---- the verdict ------------------------------------------------------------------------------

/// turnstile's ops/s over the other's at one thread count, over the runs.
#[derive(Clone, Copy, Debug)]
pub struct Ratio {
    pub threads: usize,
    /// The median over the runs (of an even count, the mean of the middle two): what the
    /// reading judges.
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Runs with both cells: each run's turnstile cell over the other's cell of the same run.
    pub runs: usize,
}

impl Ratio {
    /// The ratio of each run, summarized; `None` if there is none.
    pub fn of(threads: usize, mut each: Vec<f64>) -> Option<Ratio> {
        if each.is_empty() {
            return None;
        }
        each.sort_by(f64::total_cmp);
        let n = each.len();
        let median = if n % 2 == 1 {
            each[n / 2]
        } else {
            (each[n / 2 - 1] + each[n / 2]) / 2.0
        };
        Some(Ratio {
            threads,
            median,
            min: each[0],
            max: each[n - 1],
            runs: n,
        })
    }

    /// `1.02x`, or with more than one run `1.02x (0.97-1.10)`: median (min-max).
    pub fn show(&self) -> String {
        if self.runs > 1 {
            format!("{:.2}x ({:.2}-{:.2})", self.median, self.min, self.max)
        } else {
            format!("{:.2}x", self.median)
        }
    }
}

/// One line of the verdict: a turnstile implementation of a limiter against another
/// implementation, as the ratio of ops/s at each thread count.
pub struct Comparison {
    pub limiter: &'static str,
    pub ours: Impl,
    pub against: Impl,
    /// Only thread counts where both ran, ascending.
    pub ratios: Vec<Ratio>,
}

impl Comparison {
    /// A short reading for a newcomer, judged on the medians; against a floor, for information
    /// only (a floor is no limiter: nothing reaches it, and there is no "expected").
    pub fn reading(&self) -> String {
        let at = |t: usize| format!("{t} thread{}", if t == 1 { "" } else { "s" });
        if self.against.is_floor() {
            let parts: Vec<String> = self
                .ratios
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let of = if i == 0 { " of the floor's ops/s" } else { "" };
                    format!("{:.0}%{of} at {}", 100.0 * r.median, at(r.threads))
                })
                .collect();
            return format!("{}: for information", parts.join(", "));
        }
        let class = |r: f64| {
            if r < 0.9 {
                "behind"
            } else if r <= 1.1 {
                "on par"
            } else {
                "ahead"
            }
        };
        let (Some(first), Some(last)) = (self.ratios.first(), self.ratios.last()) else {
            return String::new();
        };
        let (t_lo, lo, t_hi, hi) = (first.threads, first.median, last.threads, last.median);
        let shape = if t_lo == t_hi {
            format!("{} at {}", class(lo), at(t_lo))
        } else if class(lo) == class(hi) {
            format!("{} from {} to {}", class(lo), at(t_lo), at(t_hi))
        } else {
            format!(
                "{} at {}, {} at {}",
                class(lo),
                at(t_lo),
                class(hi),
                at(t_hi)
            )
        };
        let good = match self.against {
            // Lock-free should match the twin alone and pull ahead as threads grow.
            Impl::MutexTwin if t_hi > 1 => lo >= 0.9 && hi > 1.1,
            Impl::MutexTwin => lo >= 0.9,
            // governor is lock-free too: turnstile should at least keep up.
            _ => lo >= 0.9 && hi >= 0.9,
        };
        format!(
            "{shape}: {}",
            if good {
                "as expected"
            } else {
                "below expectations"
            }
        )
    }
}

/// Every turnstile implementation against its twin, governor and the floors, where they ran.
/// Each run's turnstile cell is divided by the other's cell of the same run (the same round).
/// Phase 3 has no floor cells of its own: its limiters are set against phase 1's floors.
pub fn comparisons(report: &Report) -> Vec<Comparison> {
    let threads: Vec<usize> = {
        let mut t: Vec<usize> = report.cells.iter().map(|c| c.threads).collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    let mut out = Vec::new();
    for limiter in report.limiters() {
        for ours in Impl::ALL.into_iter().filter(|i| i.is_turnstile()) {
            for against in [
                Impl::MutexTwin,
                Impl::Governor,
                Impl::Floor,
                Impl::FloorCas,
                Impl::FloorIndirect,
            ] {
                let phase = report.cells.iter().find(|c| c.limiter == limiter);
                let theirs = if against.is_floor() && phase.is_some_and(|c| c.phase == 3) {
                    "token_bucket"
                } else {
                    limiter
                };
                let ratios: Vec<Ratio> = threads
                    .iter()
                    .filter_map(|&t| {
                        let b = report.runs_of(theirs, against, t);
                        let each = report
                            .runs_of(limiter, ours, t)
                            .into_iter()
                            .filter_map(|a| {
                                let b = b.iter().find(|b| b.run == a.run)?;
                                Some(a.ops_per_sec() / b.ops_per_sec().max(1e-9))
                            })
                            .collect();
                        Ratio::of(t, each)
                    })
                    .collect();
                if !ratios.is_empty() {
                    out.push(Comparison {
                        limiter,
                        ours,
                        against,
                        ratios,
                    });
                }
            }
        }
    }
    out
}

/// Prints the verdict: ratios, budgets, what a good result looks like and the result line.
pub fn print_verdict(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let threads: Vec<usize> = {
        let mut t: Vec<usize> = report.cells.iter().map(|c| c.threads).collect();
        t.sort_unstable();
        t.dedup();
        t
    };
    writeln!(
        out,
        "\nverdict: turnstile's ops/s over the other's at each thread count (above 1.00x: \
         turnstile is faster),\nand turnstile's budget at each thread count (held or OVER){}",
        if report.runs > 1 {
            format!(
                ";\neach ratio is the median (min-max) over {} runs, the reading judges the median",
                report.runs
            )
        } else {
            String::new()
        }
    )?;
    let mut head = vec!["limiter", "turnstile", "against"];
    let cols: Vec<String> = threads
        .iter()
        .map(|t| format!("{t} thread{}", if *t == 1 { "" } else { "s" }))
        .collect();
    head.extend(cols.iter().map(String::as_str));
    head.push("reading");
    let mut t = Table::new(&head);
    let comps = comparisons(report);
    // Every turnstile implementation that ran, in the order it ran.
    let mut ours: Vec<(&'static str, Impl)> = Vec::new();
    for c in report
        .cells
        .iter()
        .filter(|c| c.implementation.is_turnstile())
    {
        if !ours.contains(&(c.limiter, c.implementation)) {
            ours.push((c.limiter, c.implementation));
        }
    }
    let mut last = "";
    for (limiter, imp) in ours {
        let mut first = true;
        let mut head = |against: &str| {
            let row = vec![
                if first && limiter != last {
                    limiter
                } else {
                    ""
                }
                .to_string(),
                if first { imp.name() } else { "" }.to_string(),
                against.to_string(),
            ];
            first = false;
            row
        };
        let mine: Vec<&Comparison> = comps
            .iter()
            .filter(|c| c.limiter == limiter && c.ours == imp)
            .collect();
        if mine.iter().all(|c| c.against.is_floor()) {
            let mut row = head("-");
            row.extend(threads.iter().map(|_| "-".to_string()));
            row.push("no twin or governor to compare with".to_string());
            t.row(row);
        }
        for c in mine {
            let mut row = head(c.against.name());
            for &th in &threads {
                row.push(
                    c.ratios
                        .iter()
                        .find(|r| r.threads == th)
                        .map_or("-".to_string(), Ratio::show),
                );
            }
            row.push(c.reading());
            t.row(row);
        }
        let mut row = head("budget");
        let mut all = true;
        let mut any_budget = false;
        for &th in &threads {
            let each: Vec<bool> = report
                .runs_of(limiter, imp, th)
                .into_iter()
                .filter_map(Cell::held)
                .collect();
            let held = (!each.is_empty()).then(|| each.iter().all(|h| *h));
            all &= held != Some(false);
            any_budget |= held.is_some();
            row.push(
                match held {
                    Some(true) => "held",
                    Some(false) => "OVER",
                    None => "-",
                }
                .to_string(),
            );
        }
        row.push(
            if !any_budget {
                "none: this limiter always allows"
            } else if all {
                "held at every thread count"
            } else {
                "OVER: a bug in turnstile"
            }
            .to_string(),
        );
        t.row(row);
        last = limiter;
    }
    let reading = 3 + threads.len();
    t.print_aligned(out, &[0, 1, 2, reading])?;

    let others_over: Vec<String> = report
        .cells
        .iter()
        .filter(|c| !c.implementation.is_turnstile() && c.held() == Some(false))
        .map(|c| format!("{} {} at {}", c.limiter, c.implementation.name(), c.threads))
        .collect();
    if !others_over.is_empty() {
        writeln!(
            out,
            "  not turnstile, over budget (for information; see the phase notes): {}",
            others_over.join(", ")
        )?;
    }
    writeln!(
        out,
        "\nwhat a good result looks like:
  - against mutex_twin: about 1.00x or better at 1 thread (an uncontended compare-and-swap
    costs about what an uncontended lock does), then above 1.00x and growing as threads grow:
    a lock makes threads queue and sleep, a failed compare-and-swap just retries.
  - against governor: governor is lock-free too (GCRA, one compare-and-swap on one word), so
    expect about 1.00x or better at every thread count; below 0.90x is a gap worth a look.
  - against floor (a clock read + one load: a refusal) and floor_cas (+ one compare-and-swap:
    a grant), and in the keyed phase floor (a clock read + a SipHash + one likely cache miss)
    and floor_indirect (+ a second, dependent one, behind a pointer): no limiter, the least a
    check can cost; for information, never judged. Phase 3's limiters
    are set against phase 1's floors.
  - budget: every turnstile line says held. An OVER is a bug and makes the run exit 1. Twins and
    governor are shown for information only (rate.go's twin can go over in phase 1).
  - ratios move by 10-20% from run to run even on a quiet machine, and far more with more
    threads than cores or other work running; rerun with --runs 3 (the median is judged) or
    a larger --seconds before trusting a \"below expectations\"."
    )?;
    // The run itself keeps up to its largest thread count busy; more than half a core beyond
    // the cores means something else was competing for them.
    if let Some(load) = report.load {
        if load > report.cores as f64 + 0.5 {
            writeln!(
                out,
                "\nnote: this machine was busy: 1-minute load average {load:.2} on {} cores at the \
                 end (this run's threads included), so other work shared the cores; treat the \
                 ratios as rough and rerun on a quiet machine.",
                report.cores
            )?;
        }
    }
    let list: Vec<String> = threads.iter().map(|t| t.to_string()).collect();
    if report.turnstile_held() {
        writeln!(
            out,
            "\nresult: every turnstile budget held at every thread count ({})",
            list.join(", ")
        )
    } else {
        let over: Vec<String> = report
            .cells
            .iter()
            .filter(|c| c.implementation.is_turnstile() && c.held() == Some(false))
            .map(|c| format!("{} {} at {}", c.limiter, c.implementation.name(), c.threads))
            .collect();
        writeln!(
            out,
            "\nresult: FAILED: a turnstile limiter granted more than its budget: {}",
            over.join(", ")
        )
    }
}

// ---- JSON -------------------------------------------------------------------------------------

fn json_opt<T>(x: Option<T>, f: impl Fn(T) -> String) -> String {
    x.map_or("null".to_string(), f)
}

/// The whole run as one JSON document (the shape is in `examples/shootout.rs`'s docs).
pub fn to_json(args: &Args, report: &Report) -> String {
    let mut s = String::new();
    let list: Vec<String> = args.threads.iter().map(|t| t.to_string()).collect();
    let _ = writeln!(s, "{{");
    let _ = writeln!(s, "  \"schema\": \"turnstile-shootout/1\",");
    let _ = writeln!(s, "  \"cores\": {},", report.cores);
    let _ = writeln!(
        s,
        "  \"load_average_1m\": {},",
        json_opt(report.load, json_f64)
    );
    let _ = writeln!(s, "  \"threads\": [{}],", list.join(", "));
    let _ = writeln!(s, "  \"seconds_per_cell\": {},", json_f64(args.seconds));
    let _ = writeln!(s, "  \"runs\": {},", report.runs);
    let _ = writeln!(s, "  \"limit\": {},", json_f64(args.limit));
    let _ = writeln!(s, "  \"burst\": {},", args.burst);
    let _ = writeln!(
        s,
        "  \"turnstile_budgets_held\": {},",
        report.turnstile_held()
    );
    let _ = writeln!(s, "  \"cells\": [");
    for (i, c) in report.cells.iter().enumerate() {
        let b = c.budget;
        let _ = writeln!(
            s,
            "    {{\"phase\": {}, \"limiter\": {}, \"implementation\": {}, \"threads\": {}, \
             \"run\": {}, \"ops\": {}, \"seconds\": {}, \"ops_per_sec\": {}, \"ns_per_op\": {}, \
             \"granted\": {}, \"denied\": {}, \"budget\": {}, \"budget_scope\": {}, \
             \"granted_against_budget\": {}, \"held\": {}, \"keys\": {}}}{}",
            c.phase,
            json_str(c.limiter),
            json_str(c.implementation.name()),
            c.threads,
            c.run,
            c.ops,
            json_f64(c.wall.as_secs_f64()),
            json_f64(c.ops_per_sec()),
            json_f64(c.ns_per_op()),
            c.granted,
            c.denied,
            json_opt(b, |b| json_f64(b.budget)),
            json_opt(b, |b| json_str(b.scope.name())),
            json_opt(b, |b| b.granted.to_string()),
            json_opt(b, |b| b.held().to_string()),
            json_opt(c.keys, |k| k.to_string()),
            if i + 1 < report.cells.len() { "," } else { "" }
        );
    }
    let _ = writeln!(s, "  ],");
    let _ = writeln!(s, "  \"verdict\": [");
    let comps = comparisons(report);
    for (i, c) in comps.iter().enumerate() {
        let ratios: Vec<String> = c
            .ratios
            .iter()
            .map(|r| {
                format!(
                    "{{\"threads\": {}, \"ratio\": {}, \"min\": {}, \"max\": {}, \"runs\": {}}}",
                    r.threads,
                    json_f64(r.median),
                    json_f64(r.min),
                    json_f64(r.max),
                    r.runs
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "    {{\"limiter\": {}, \"implementation\": {}, \"against\": {}, \
             \"ops_per_sec_ratios\": [{}], \"reading\": {}}}{}",
            json_str(c.limiter),
            json_str(c.ours.name()),
            json_str(c.against.name()),
            ratios.join(", "),
            json_str(&c.reading()),
            if i + 1 < comps.len() { "," } else { "" }
        );
    }
    let _ = writeln!(s, "  ],");
    // Per turnstile implementation: whether its budget held at every thread count (null for
    // the always-allowing phase 2).
    let _ = writeln!(s, "  \"budgets\": [");
    let mut ours: Vec<(&'static str, Impl)> = Vec::new();
    for c in report
        .cells
        .iter()
        .filter(|c| c.implementation.is_turnstile())
    {
        if !ours.contains(&(c.limiter, c.implementation)) {
            ours.push((c.limiter, c.implementation));
        }
    }
    for (i, (limiter, imp)) in ours.iter().enumerate() {
        let held: Vec<bool> = report
            .cells
            .iter()
            .filter(|c| c.limiter == *limiter && c.implementation == *imp)
            .filter_map(Cell::held)
            .collect();
        let _ = writeln!(
            s,
            "    {{\"limiter\": {}, \"implementation\": {}, \"held_at_every_thread_count\": \
             {}}}{}",
            json_str(limiter),
            json_str(imp.name()),
            if held.is_empty() {
                "null".to_string()
            } else {
                held.iter().all(|h| *h).to_string()
            },
            if i + 1 < ours.len() { "," } else { "" }
        );
    }
    let _ = writeln!(s, "  ]");
    let _ = writeln!(s, "}}");
    s
}
