//! The Redis example's machinery: the command line, the cells, the report, the verdict and the
//! JSON. `bench/examples/redis.rs` runs it against a server it starts (or `--url`);
//! `tests/redis/example_smoke.rs` includes this file as a module and runs it briefly. Nothing
//! here writes to stdout directly: every report line goes to the `out` it is given.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile::multi_token_bucket::Bandwidth;
use turnstile::redis::{
    Coalesce, ConnectOptions, Connection, Fallback, FixedWindow, Gcra, MultiGcra, RedisLimitError,
    RedisLimiter, TokenBucket,
};
use turnstile::Limit;

#[path = "../../../examples/common/report.rs"]
pub mod report;
#[path = "stall.rs"]
pub mod stall;
pub use report::{busy_note, fmt_dur, fmt_load, load_average, percentile, thousands};
use report::{json_f64, json_opt_f64, json_str};

/// The target of issue #11: a check at least this fraction of PING's throughput.
pub const TARGET: f64 = 0.8;

/// The limit every limiter cell uses: high enough that every check is granted and so writes
/// its key (the script's most expensive path), as a busy fleet limit would be most of the time.
pub const LIMIT_PER_SEC: f64 = 1e9;
/// The burst every limiter cell uses.
pub const BURST: u32 = 1000;
/// `MultiGcra`'s second limit in the two-limit cell, beside `LIMIT_PER_SEC` and `BURST`: a
/// tenth of the rate with a deeper burst, never denying at any rate reached here either.
pub const MULTI_SECOND_LIMIT_PER_SEC: f64 = 1e8;
pub const MULTI_SECOND_BURST: u32 = 100_000;
/// Issue #23's target for the two-limit cell: its ratio to PING at least this fraction of
/// the single-limit `Gcra` cell's.
pub const MULTI_TARGET: f64 = 0.8;
/// Rounds that alternate `gcra_hot_key` and `multi_gcra2_hot_key` after a level's cells, each
/// of `PAIR_SLICE` × `--seconds`: issue #23's ratio is their per-round ratios' median. Two
/// cells 10 s apart see different machines here (a neighbour's load comes and goes within
/// seconds); two slices side by side see nearly the same one.
pub const PAIR_ROUNDS: usize = 6;
pub const PAIR_SLICE: f64 = 0.25;

/// `redis::TokenBucket`'s rate (tokens per whole second) and burst in the benchmark: never
/// denying at any rate reached here.
pub const TB_RATE: u32 = 1_000_000_000;
pub const TB_BURST: u32 = 1_000_000;
/// `redis::FixedWindow`'s quota per 1 s window in the benchmark: never reached here.
pub const WINDOW_QUOTA: u32 = 1_000_000_000;

/// What one cell does per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `PING` on the same connection: one round trip and nothing else, the physical limit.
    Ping,
    /// `EVALSHA` of a script that only returns 1, on one key: the scripting engine's own cost,
    /// a reference (the floor of any limiter that is one script per check), not judged.
    ScriptNoop,
    /// `Gcra::throttle(key, 1)` on one hot key.
    GcraHot,
    /// `MultiGcra::throttle(key, 1)` with two limits on one hot key: both checked and both
    /// written, in one script call.
    MultiGcraHot,
    /// `Gcra::throttle(key, 1)` on a key picked at random among `--keys`.
    GcraRandom,
    /// `Fallback<Gcra>::check(key)` on one hot key, in Redis mode: Gcra plus the wrapper.
    FallbackHot,
    /// `Coalesce<Gcra>::try_check_n(key, 1)` on one hot key: concurrent checks of the key
    /// share one script call.
    CoalescedHot,
    /// `redis::TokenBucket` (go-zero's `TokenLimiter` script) `try_check_n(key, 1)` on one hot
    /// key.
    TokenBucketHot,
    /// `redis::FixedWindow` (go-zero's `PeriodLimit` script) `try_check_n(key, 1)` on one hot
    /// key.
    FixedWindowHot,
}

impl Op {
    /// The cell's name in the report and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::ScriptNoop => "evalsha_return_1",
            Op::GcraHot => "gcra_hot_key",
            Op::MultiGcraHot => "multi_gcra2_hot_key",
            Op::GcraRandom => "gcra_random_keys",
            Op::FallbackHot => "fallback_gcra_hot_key",
            Op::CoalescedHot => "coalesced_gcra_hot_key",
            Op::TokenBucketHot => "token_bucket_hot_key",
            Op::FixedWindowHot => "fixed_window_hot_key",
        }
    }

    /// Whether the cell is a limiter check (judged against PING), rather than a reference.
    pub fn is_check(self) -> bool {
        !matches!(self, Op::Ping | Op::ScriptNoop)
    }

    /// The limiter cells, in the order they run between the two PING cells.
    pub const CHECKS: [Op; 7] = [
        Op::GcraHot,
        Op::MultiGcraHot,
        Op::GcraRandom,
        Op::FallbackHot,
        Op::CoalescedHot,
        Op::TokenBucketHot,
        Op::FixedWindowHot,
    ];
}

/// The command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// `--url`: a server to use instead of starting one.
    pub url: Option<String>,
    /// `--seconds`: seconds per cell.
    pub seconds: f64,
    /// `--tasks`: the concurrency levels, in order, deduplicated.
    pub tasks: Vec<usize>,
    /// `--keys`: how many keys the random-keys cell picks from.
    pub keys: usize,
    /// `--json FILE`.
    pub json: Option<String>,
    /// `--fault stall`: run the fault phase (`stall.rs`) instead of the cells.
    pub fault: Option<Fault>,
    /// `--stall S`: how long the fault phase stops the server.
    pub stall: f64,
}

/// A fault the example can put under the limiters (`--fault`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The example's own server stopped (SIGSTOP) for `--stall` seconds, then continued.
    Stall,
}

/// The default `--stall`, in seconds.
pub const DEFAULT_STALL: f64 = 3.0;

/// Cells per concurrency level: PING before and after the others, the no-op script and the
/// limiter cells.
pub const CELLS_PER_LEVEL: usize = 3 + Op::CHECKS.len() + 2 * PAIR_ROUNDS;

/// The default seconds per cell: the whole run (at the default `--tasks 1,16`, 20 cells and
/// 24 alternating slices of a quarter cell) about 27 s, within the 30 s the smoke test holds
/// it to.
pub const DEFAULT_SECONDS: f64 = 1.05;

impl Args {
    /// How many cells the run has.
    pub fn cells(&self) -> usize {
        CELLS_PER_LEVEL * self.tasks.len()
    }

    /// How long the cells take, in seconds (without start-up).
    pub fn expected_seconds(&self) -> f64 {
        let per_level =
            (CELLS_PER_LEVEL - 2 * PAIR_ROUNDS) as f64 + (2 * PAIR_ROUNDS) as f64 * PAIR_SLICE;
        per_level * self.tasks.len() as f64 * self.seconds
    }
}

/// The usage text.
pub fn usage() -> String {
    format!(
        "usage: cargo run --release -p turnstile-bench --example redis -- [OPTIONS]

Checks per second and p50/p99 latency of turnstile's Redis limiters on one multiplexed
connection (redis-rs ConnectionManager), against PING on the same connection in the same run.
Without --url it starts its own redis-server on a free loopback port (no persistence) and
stops it at the end. Exit status: 0 ok; 1 if a cell had errors; 2 on a usage error, no
redis-server, or no connection.

options:
  --url URL         use this server (redis://host:port/db) instead of starting one; the run
                    writes keys under turnstile:bench:*
  --seconds S       seconds per cell (default {DEFAULT_SECONDS}: {CELLS_PER_LEVEL} cells per \
         task count, about {:.0} s in all)
  --tasks LIST      concurrent tasks per cell, comma-separated (default 1,16)
  --keys N          keys the random-keys cell picks from (default 10000)
  --json FILE       also write every cell and the verdict as JSON to FILE
  --fault stall     instead of the cells, a stalled server: checks through Fallback<Gcra> and
                    the bare Gcra, paced at one a millisecond per task (the largest --tasks
                    count per limiter), for --seconds, then with the example's own server
                    stopped (SIGSTOP) for --stall seconds, then --seconds more after SIGCONT;
                    answers and latency per phase. Needs the example's own server (no --url)
  --stall S         seconds the server stays stopped (default {DEFAULT_STALL})
  -h, --help        this text",
        DEFAULT_SECONDS * (CELLS_PER_LEVEL * 2) as f64
    )
}

/// Parses the arguments (without the program name). `Err("")` means `--help`.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        url: None,
        seconds: DEFAULT_SECONDS,
        tasks: vec![1, 16],
        keys: 10_000,
        json: None,
        fault: None,
        stall: DEFAULT_STALL,
    };
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--url" => a.url = Some(value("--url")?),
            "--seconds" => {
                let v = value("--seconds")?;
                a.seconds = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                    .ok_or(format!("--seconds {v}: a number of seconds in (0, 3600]"))?;
            }
            "--tasks" => {
                let v = value("--tasks")?;
                let mut tasks = Vec::new();
                for t in v.split(',') {
                    let n = t
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=4096).contains(n))
                        .ok_or(format!("--tasks {v}: task counts from 1 to 4096"))?;
                    if !tasks.contains(&n) {
                        tasks.push(n);
                    }
                }
                a.tasks = tasks;
            }
            "--keys" => {
                let v = value("--keys")?;
                a.keys = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=10_000_000).contains(n))
                    .ok_or(format!("--keys {v}: from 1 to 10000000"))?;
            }
            "--json" => a.json = Some(value("--json")?),
            "--fault" => match value("--fault")?.as_str() {
                "stall" => a.fault = Some(Fault::Stall),
                v => return Err(format!("--fault {v}: the one fault is `stall`")),
            },
            "--stall" => {
                let v = value("--stall")?;
                a.stall = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0 && *s <= 600.0)
                    .ok_or(format!("--stall {v}: a number of seconds in (0, 600]"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.fault.is_some() && a.url.is_some() {
        return Err("--fault stops the example's own server: not with --url".to_string());
    }
    Ok(a)
}

/// One cell's results.
#[derive(Debug, Clone)]
pub struct Cell {
    pub op: Op,
    pub tasks: usize,
    /// For PING: 0 for the run before the limiter cells, 1 for the one after.
    pub round: usize,
    pub ops: u64,
    pub seconds: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub granted: u64,
    pub denied: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// The server's own time per call of the cell's command (`PING` or `EVALSHA`, from
    /// `INFO commandstats` before and after the cell), in µs; `None` if it could not be read.
    pub server_us_per_call: Option<f64>,
    /// The share of the cell's wall time the server spent running the cell's command
    /// (1.0: the server's one thread was busy with it throughout).
    pub server_busy: Option<f64>,
    /// Calls of the cell's command the server ran during the cell (`INFO commandstats`).
    pub server_calls: Option<u64>,
}

impl Cell {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.seconds.max(1e-9)
    }

    /// Checks answered per round trip, as the server counted its calls: 1 unless checks
    /// were coalesced.
    pub fn checks_per_call(&self) -> Option<f64> {
        self.server_calls
            .filter(|&c| c > 0)
            .map(|c| self.ops as f64 / c as f64)
    }
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct Report {
    pub cells: Vec<Cell>,
    pub seconds_per_cell: f64,
    pub keys: usize,
    pub cores: usize,
    pub runtime_workers: usize,
    pub server: String,
    pub redis_version: String,
    pub load_start: Option<f64>,
    pub load_end: Option<f64>,
}

impl Report {
    /// PING's throughput at `tasks`: the mean of its runs before and after the limiter cells.
    pub fn ping_ops_per_sec(&self, tasks: usize) -> Option<f64> {
        let pings: Vec<f64> = self
            .cells
            .iter()
            .filter(|c| c.op == Op::Ping && c.tasks == tasks)
            .map(Cell::ops_per_sec)
            .collect();
        (!pings.is_empty()).then(|| pings.iter().sum::<f64>() / pings.len() as f64)
    }

    /// A cell's throughput over PING's at its concurrency.
    pub fn ratio(&self, c: &Cell) -> Option<f64> {
        self.ping_ops_per_sec(c.tasks)
            .map(|p| c.ops_per_sec() / p.max(1e-9))
    }

    /// How far PING's two runs at `tasks` are apart, as a fraction of their mean: the drift
    /// of the machine during the cells between them.
    pub fn ping_drift(&self, tasks: usize) -> Option<f64> {
        let pings: Vec<f64> = self
            .cells
            .iter()
            .filter(|c| c.op == Op::Ping && c.tasks == tasks)
            .map(Cell::ops_per_sec)
            .collect();
        if pings.len() < 2 {
            return None;
        }
        let (lo, hi) = pings
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &p| (lo.min(p), hi.max(p)));
        Some((hi - lo) / ((hi + lo) / 2.0).max(1e-9))
    }

    /// PING's p50 over a cell's p50 at its concurrency (the mean of PING's runs' p50s): a
    /// second reading of the ratio, steadier than throughput on a machine whose other work
    /// stalls the run now and then (a stall moves the throughput, not the median).
    pub fn p50_ratio(&self, c: &Cell) -> Option<f64> {
        let p50s: Vec<f64> = self
            .cells
            .iter()
            .filter(|p| p.op == Op::Ping && p.tasks == c.tasks)
            .map(|p| p.p50.as_secs_f64())
            .collect();
        if p50s.is_empty() || c.p50.is_zero() {
            return None;
        }
        Some(p50s.iter().sum::<f64>() / p50s.len() as f64 / c.p50.as_secs_f64())
    }

    /// The two-limit cell's ratio to PING over the single-limit `Gcra` cell's at `tasks`
    /// (issue #23's target: at least 0.8). PING cancels, so this is their throughputs' ratio,
    /// taken in each alternating round (`PAIR_ROUNDS`): sorted, so the median is the middle.
    pub fn multi_over_single_rounds(&self, tasks: usize) -> Vec<f64> {
        self.pair_rounds(tasks, |m, g| m.ops_per_sec() / g.ops_per_sec().max(1e-9))
    }

    /// The same from the p50s: Gcra's p50 over the two-limit cell's in each round.
    pub fn multi_over_single_p50_rounds(&self, tasks: usize) -> Vec<f64> {
        self.pair_rounds(tasks, |m, g| {
            g.p50.as_secs_f64() / m.p50.as_secs_f64().max(1e-12)
        })
    }

    fn pair_rounds(&self, tasks: usize, ratio: impl Fn(&Cell, &Cell) -> f64) -> Vec<f64> {
        let cell = |op: Op, round: usize| {
            self.cells
                .iter()
                .find(|c| c.op == op && c.tasks == tasks && c.round == round)
        };
        let mut ratios: Vec<f64> = (1..=PAIR_ROUNDS)
            .filter_map(|r| Some(ratio(cell(Op::MultiGcraHot, r)?, cell(Op::GcraHot, r)?)))
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios
    }

    pub fn errors(&self) -> u64 {
        self.cells.iter().map(|c| c.errors).sum()
    }
}

/// What the tasks share.
struct Targets {
    con: Connection,
    noop: ::redis::Script,
    hot: Gcra,
    multi: MultiGcra,
    random: Gcra,
    fallback: Fallback<Gcra>,
    coalesced: Coalesce<Gcra>,
    token_bucket: TokenBucket,
    fixed_window: FixedWindow,
    keys: Vec<String>,
}

/// One call of `op`: `Ok(true)` granted (PING: answered), `Ok(false)` denied.
async fn call(op: Op, t: &Targets, rng: &mut u64) -> Result<bool, String> {
    match op {
        Op::Ping => {
            let mut con = t.con.clone();
            let pong: String = ::redis::cmd("PING")
                .query_async(&mut con)
                .await
                .map_err(|e| e.to_string())?;
            if pong == "PONG" {
                Ok(true)
            } else {
                Err(format!("PING answered {pong:?}"))
            }
        }
        Op::ScriptNoop => {
            let mut con = t.con.clone();
            t.noop
                .key("turnstile:bench:noop")
                .invoke_async::<i64>(&mut con)
                .await
                .map(|one| one == 1)
                .map_err(|e| e.to_string())
        }
        Op::GcraHot => t
            .hot
            .throttle("hot", 1)
            .await
            .map(|th| th.allowed)
            .map_err(|e| e.to_string()),
        Op::MultiGcraHot => t
            .multi
            .throttle("hot", 1)
            .await
            .map(|th| th.allowed)
            .map_err(|e| e.to_string()),
        Op::GcraRandom => {
            let i = (xorshift(rng) % t.keys.len() as u64) as usize;
            t.random
                .throttle(&t.keys[i], 1)
                .await
                .map(|th| th.allowed)
                .map_err(|e| e.to_string())
        }
        Op::FallbackHot => t
            .fallback
            .check("hot")
            .await
            .map(|v| v.is_ok())
            .map_err(|e: RedisLimitError| e.to_string()),
        Op::CoalescedHot => t
            .coalesced
            .try_check_n("hot", 1)
            .await
            .map(|v| v.is_ok())
            .map_err(|e| e.to_string()),
        Op::TokenBucketHot => t
            .token_bucket
            .try_check_n("hot", 1)
            .await
            .map(|v| v.is_ok())
            .map_err(|e| e.to_string()),
        Op::FixedWindowHot => t
            .fixed_window
            .try_check_n("hot", 1)
            .await
            .map(|v| v.is_ok())
            .map_err(|e| e.to_string()),
    }
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// The server's `(calls, usec)` for `command` (lower case, e.g. `evalsha`), from
/// `INFO commandstats`; `None` if it could not be read.
async fn command_stats(con: &Connection, command: &str) -> Option<(u64, u64)> {
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con.clone())
        .await
        .ok()?;
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find_map(|l| l.strip_prefix(prefix.as_str())) else {
        // Not called yet.
        return Some((0, 0));
    };
    let field = |name: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((field("calls")?, field("usec")?))
}

/// What one task counted.
struct TaskResult {
    samples: Vec<u64>,
    granted: u64,
    denied: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Runs one cell: `tasks` tasks calling `op` in a loop for `seconds`, each call timed.
async fn run_cell(
    op: Op,
    tasks: usize,
    round: usize,
    seconds: f64,
    targets: &Arc<Targets>,
) -> Cell {
    // One untimed call first: loads the script (NOSCRIPT, then SCRIPT LOAD) outside the cell.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let _ = call(op, targets, &mut seed).await;
    let command = if op == Op::Ping { "ping" } else { "evalsha" };
    let stats_before = command_stats(&targets.con, command).await;
    let span = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let deadline = start + span;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let targets = targets.clone();
            tokio::spawn(async move {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
                let mut r = TaskResult {
                    samples: Vec::with_capacity(1 << 14),
                    granted: 0,
                    denied: 0,
                    errors: 0,
                    first_error: None,
                };
                loop {
                    let t0 = Instant::now();
                    if t0 >= deadline {
                        break;
                    }
                    let outcome = call(op, &targets, &mut rng).await;
                    let ns = t0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                    match outcome {
                        Ok(true) => r.granted += 1,
                        Ok(false) => r.denied += 1,
                        Err(e) => {
                            r.errors += 1;
                            r.first_error.get_or_insert(e);
                            // Do not spin on a dead server.
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            continue;
                        }
                    }
                    r.samples.push(ns);
                }
                r
            })
        })
        .collect();
    let mut samples = Vec::new();
    let (mut granted, mut denied, mut errors, mut first_error) = (0, 0, 0, None);
    for h in handles {
        match h.await {
            Ok(r) => {
                samples.extend(r.samples);
                granted += r.granted;
                denied += r.denied;
                errors += r.errors;
                if first_error.is_none() {
                    first_error = r.first_error;
                }
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(format!("task failed: {e}"));
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let stats_after = command_stats(&targets.con, command).await;
    let (server_us_per_call, server_busy, server_calls) = match (stats_before, stats_after) {
        (Some((c0, u0)), Some((c1, u1))) if c1 > c0 => (
            Some(u1.saturating_sub(u0) as f64 / (c1 - c0) as f64),
            Some(u1.saturating_sub(u0) as f64 / 1e6 / elapsed.max(1e-9)),
            Some(c1 - c0),
        ),
        _ => (None, None, None),
    };
    samples.sort_unstable();
    Cell {
        op,
        tasks,
        round,
        ops: granted + denied,
        seconds: elapsed,
        p50: Duration::from_nanos(percentile(&samples, 0.50)),
        p99: Duration::from_nanos(percentile(&samples, 0.99)),
        granted,
        denied,
        errors,
        first_error,
        server_us_per_call,
        server_busy,
        server_calls,
    }
}

/// Connects to `url` and runs every cell, printing each as it ends. Must run inside a tokio
/// runtime (the example's is multi-thread; the smoke test's may be either).
pub async fn run_all(
    args: &Args,
    url: &str,
    server: &str,
    runtime_workers: usize,
    out: &mut dyn Write,
) -> Result<Report, String> {
    // The same generous deadline as the fallback cell's timeout: a loaded machine must not
    // turn a slow answer into an error.
    let options = ConnectOptions::new().response_timeout(Duration::from_secs(2));
    let con = turnstile::redis::connect_with(url, &options)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let info: String = ::redis::cmd("INFO")
        .arg("server")
        .query_async(&mut con.clone())
        .await
        .map_err(|e| format!("INFO server: {e}"))?;
    let redis_version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string();
    let limit = Limit::per_second(LIMIT_PER_SEC).map_err(|e| e.to_string())?;
    let gcra = |prefix: &str| {
        Gcra::builder(limit, BURST)
            .prefix(prefix)
            .build(con.clone())
            .map_err(|e| e.to_string())
    };
    let targets = Arc::new(Targets {
        con: con.clone(),
        noop: ::redis::Script::new("return 1"),
        hot: gcra("turnstile:bench:gcra_hot:")?,
        multi: MultiGcra::builder(&[
            Bandwidth::new(limit, BURST),
            Bandwidth::new(
                Limit::per_second(MULTI_SECOND_LIMIT_PER_SEC).map_err(|e| e.to_string())?,
                MULTI_SECOND_BURST,
            ),
        ])
        .prefix("turnstile:bench:multi_gcra_hot:")
        .build(con.clone())
        .map_err(|e| e.to_string())?,
        random: gcra("turnstile:bench:gcra_random:")?,
        fallback: Fallback::builder(gcra("turnstile:bench:fallback:")?)
            // A generous timeout: a loaded machine must not flip the wrapper into fallback
            // mode (the cell would then measure the local limiter, not Redis).
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| e.to_string())?,
        coalesced: Coalesce::builder(gcra("turnstile:bench:coalesced:")?)
            .deadline(Duration::from_secs(2))
            .build()
            .map_err(|e| e.to_string())?,
        // go-zero's whole-second token bucket and fixed window, also set never to deny.
        token_bucket: TokenBucket::builder(TB_RATE, TB_BURST)
            .prefix("turnstile:bench:token_bucket:")
            .build(con.clone())
            .map_err(|e| e.to_string())?,
        fixed_window: FixedWindow::builder(WINDOW_QUOTA, Duration::from_secs(1))
            .prefix("turnstile:bench:fixed_window:")
            .build(con.clone())
            .map_err(|e| e.to_string())?,
        keys: (0..args.keys).map(|i| format!("client{i}")).collect(),
    });

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load_start = load_average();
    let w = |e: io::Error| e.to_string();
    writeln!(
        out,
        "turnstile redis bench: {server}, redis {redis_version}, one multiplexed connection \
         (ConnectionManager)\n{cores} cores, {runtime_workers} runtime worker thread{}, \
         1-minute load {} at the start\n{} cells of {:.2} s (about {:.0} s); tasks {:?}; \
         limit {LIMIT_PER_SEC:e}/s burst {BURST} (every check granted: the script's writing \
         path; multi_gcra2 adds {MULTI_SECOND_LIMIT_PER_SEC:e}/s burst \
         {MULTI_SECOND_BURST}); {} keys for gcra_random_keys",
        if runtime_workers == 1 { "" } else { "s" },
        fmt_load(load_start),
        args.cells(),
        args.seconds,
        args.expected_seconds(),
        args.tasks,
        args.keys,
    )
    .map_err(w)?;
    writeln!(
        out,
        "\n{:<22} {:>5} {:>12} {:>10} {:>10} {:>12} {:>9} {:>7}",
        "cell", "tasks", "checks/s", "p50", "p99", "srv µs/call", "srv busy", "errors"
    )
    .map_err(w)?;

    let mut cells = Vec::new();
    for &tasks in &args.tasks {
        let mut order = vec![(Op::Ping, 0), (Op::ScriptNoop, 0)];
        order.extend(Op::CHECKS.iter().map(|&op| (op, 0)));
        order.push((Op::Ping, 1));
        for (op, round) in order {
            let c = run_cell(op, tasks, round, args.seconds, &targets).await;
            let name = if op == Op::Ping && round == 1 {
                "ping (again)"
            } else {
                op.name()
            };
            writeln!(
                out,
                "{:<22} {:>5} {:>12} {:>10} {:>10} {:>12} {:>9} {:>7}",
                name,
                tasks,
                thousands(c.ops_per_sec()),
                fmt_dur(c.p50),
                fmt_dur(c.p99),
                c.server_us_per_call
                    .map_or("-".to_string(), |u| format!("{u:.2}")),
                c.server_busy
                    .map_or("-".to_string(), |b| format!("{:.0}%", b * 100.0)),
                c.errors
            )
            .map_err(w)?;
            cells.push(c);
        }
        let mut pair = Vec::new();
        for round in 1..=PAIR_ROUNDS {
            for op in [Op::GcraHot, Op::MultiGcraHot] {
                let c = run_cell(op, tasks, round, args.seconds * PAIR_SLICE, &targets).await;
                pair.push(format!("{:.0}", c.ops_per_sec()));
                cells.push(c);
            }
        }
        writeln!(
            out,
            "{PAIR_ROUNDS} rounds alternating gcra_hot_key and multi_gcra2_hot_key at {tasks} \
             task{}, checks/s: {}",
            if tasks == 1 { "" } else { "s" },
            pair.join(" ")
        )
        .map_err(w)?;
    }
    if targets.fallback.stats().switches_to_fallback > 0 {
        writeln!(
            out,
            "note: the Fallback cell switched to fallback mode {} time(s): part of it measured \
             the local limiter, not Redis",
            targets.fallback.stats().switches_to_fallback
        )
        .map_err(w)?;
    }
    Ok(Report {
        cells,
        seconds_per_cell: args.seconds,
        keys: args.keys,
        cores,
        runtime_workers,
        server: server.to_string(),
        redis_version,
        load_start,
        load_end: load_average(),
    })
}

/// The verdict word of a limiter cell against the target.
pub fn verdict_word(ratio: f64) -> &'static str {
    if ratio >= TARGET {
        "meets the 0.8x target"
    } else {
        "BELOW the 0.8x target"
    }
}

/// Prints the verdict: per limiter cell its ratio to PING against the 0.8 target, what a good
/// result looks like, the load note and the result line.
pub fn print_verdict(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\nverdict: checks/s over PING's checks/s at the same concurrency (PING: the mean of its \
         runs before and after the limiter cells); target >= {TARGET:.2}x\n\
         (p50 ratio: PING's p50 over the cell's, steadier under stalls; the verdict reads the \
         throughput ratio)"
    )?;
    writeln!(
        out,
        "{:<22} {:>5} {:>12} {:>12} {:>8} {:>9} {:>11}  reading",
        "cell", "tasks", "checks/s", "PING/s", "ratio", "p50 ratio", "checks/trip"
    )?;
    for c in report
        .cells
        .iter()
        .filter(|c| c.op != Op::Ping && c.round == 0)
    {
        let ping = report.ping_ops_per_sec(c.tasks).unwrap_or(0.0);
        let ratio = report.ratio(c).unwrap_or(0.0);
        let reading = if c.errors > 0 {
            format!(
                "ERRORS: {} failed call(s), first: {}",
                c.errors,
                c.first_error.as_deref().unwrap_or("?")
            )
        } else if !c.op.is_check() {
            "reference: a script that does nothing (not judged)".to_string()
        } else {
            verdict_word(ratio).to_string()
        };
        writeln!(
            out,
            "{:<22} {:>5} {:>12} {:>12} {:>7.2}x {:>9} {:>11}  {reading}",
            c.op.name(),
            c.tasks,
            thousands(c.ops_per_sec()),
            thousands(ping),
            ratio,
            report
                .p50_ratio(c)
                .map_or("-".to_string(), |r| format!("{r:.2}x")),
            c.checks_per_call()
                .map_or("-".to_string(), |r| format!("{r:.2}")),
        )?;
    }
    let mut tasks: Vec<usize> = report.cells.iter().map(|c| c.tasks).collect();
    tasks.dedup();
    let spread = |r: &[f64]| format!("{:.2} ({:.2}-{:.2})", r[r.len() / 2], r[0], r[r.len() - 1]);
    for &t in &tasks {
        let r = report.multi_over_single_rounds(t);
        if !r.is_empty() {
            writeln!(
                out,
                "multi_gcra2_hot_key's ratio over gcra_hot_key's at {t} task{}, median (min-max) \
                 of {} alternating rounds: {} (target >= {MULTI_TARGET:.2}: {}; from the p50s: \
                 {})",
                if t == 1 { "" } else { "s" },
                r.len(),
                spread(&r),
                if r[r.len() / 2] >= MULTI_TARGET {
                    "met"
                } else {
                    "BELOW"
                },
                spread(&report.multi_over_single_p50_rounds(t)),
            )?;
        }
    }
    for t in tasks {
        if let Some(d) = report.ping_drift(t) {
            writeln!(
                out,
                "PING's two runs at {t} task{} differ by {:.0}% (the machine's drift during the \
                 cells between them{})",
                if t == 1 { "" } else { "s" },
                d * 100.0,
                if d > 0.1 {
                    ": more than 10%, treat the ratios at this concurrency as rough"
                } else {
                    ""
                }
            )?;
        }
    }
    writeln!(
        out,
        "\nwhat a good result looks like:
  - a check is one EVALSHA round trip, exactly as a PING is one round trip; what differs is
    the script's work on the server (TIME, GET, arithmetic, SET PX) and the client's work
    (building the call, parsing the reply). At >= 0.80x of PING the script costs little next
    to the round trip, which is the physical limit of any limiter on Redis without coalescing.
  - 1 task: latency-bound (one call in flight), so checks/s is about 1 / p50; the ratio shows
    the script's extra microseconds over an already small round trip (loopback), the harshest
    setting for the ratio. Over a real network the round trip grows and the ratio nears 1.00x.
  - 16 tasks: redis-rs pipelines the calls of all tasks on the one connection, so throughput
    is bound by the server's and the client's CPU rather than the round trip; the script's
    cost shows most here.
  - srv µs/call is the server's own time per call of the cell's command (PING or EVALSHA,
    from INFO commandstats around the cell); srv busy is that time over the cell's wall time.
    A script that reads TIME and GETs and SETs a key costs the server some 10-20 µs against
    PING's 0.1-0.3 µs: where srv busy nears 100% the server's one thread is the limit, and
    checks/s cannot pass 1 / (srv µs/call) without coalescing. Lower srv busy with a low
    ratio means the client's side (or the machine's other work) is the limit.
  - evalsha_return_1 (a script that only returns 1) is the floor of any limiter that runs one
    script per check: its ratio is the most a limiter script can reach here.
  - checks/trip is the cell's checks over the server's calls of its command: 1.00 for every
    cell but coalesced_gcra_hot_key, where concurrent checks of the hot key wait for the call
    in flight and then go together in one script call, each decided as if alone. At 1 task
    nothing is concurrent, so it is gcra_hot_key plus the wrapper; at 16 tasks checks/trip
    nears the number of tasks and the cell can pass PING's throughput, since one call
    answers many checks (the server's thread, not the round trip, stops being the limit).
  - multi_gcra2_hot_key (MultiGcra with two limits: one GET and one SET of a key holding both
    arrival times, each limit's arithmetic in the script) is judged against gcra_hot_key as
    well as PING: issue #23's target is its ratio at >= 0.80x of the single-limit one's,
    read from short rounds that alternate the two (the machine's load moves more between two
    cells seconds apart than between two slices side by side).
  - gcra_random_keys should be close to gcra_hot_key (a key lookup is cheap); the Fallback
    cell close to Gcra's (its overhead in Redis mode is one atomic load and a timer).
    token_bucket_hot_key (go-zero's TokenLimiter script: two GETs and two SETEXs, the client's
    clock) and fixed_window_hot_key (go-zero's PeriodLimit script: INCRBY and PTTL, EXPIRE on a
    new window) are judged the same way and show what go-zero's scripts cost next to Gcra's.
  - on a shared 2-core machine the server, the client and other work compete for the cores:
    ratios move by 10-20% from run to run; rerun with a larger --seconds before trusting a
    BELOW."
    )?;
    if let Some(note) = busy_note(report.load_start, report.load_end, report.cores) {
        writeln!(out, "\n{note}")?;
    }
    let checks: Vec<&Cell> = report
        .cells
        .iter()
        .filter(|c| c.op.is_check() && c.round == 0)
        .collect();
    let meeting = checks
        .iter()
        .filter(|c| report.ratio(c).is_some_and(|r| r >= TARGET))
        .count();
    if report.errors() > 0 {
        writeln!(
            out,
            "\nresult: FAILED: {} call(s) failed (see the verdict)",
            report.errors()
        )
    } else {
        writeln!(
            out,
            "\nresult: no errors; {meeting} of {} limiter cells at >= {TARGET:.2}x of PING",
            checks.len()
        )
    }
}

// ---- JSON -------------------------------------------------------------------------------------

/// The run as JSON (schema `turnstile-redis-bench/2`).
pub fn to_json(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{{");
    let _ = writeln!(s, "  \"schema\": \"turnstile-redis-bench/2\",");
    let _ = writeln!(
        s,
        "  \"server\": {}, \"redis_version\": {},",
        json_str(&report.server),
        json_str(&report.redis_version)
    );
    let _ = writeln!(
        s,
        "  \"cores\": {}, \"runtime_workers\": {}, \"load_average_1m_start\": {}, \
         \"load_average_1m_end\": {},",
        report.cores,
        report.runtime_workers,
        json_opt_f64(report.load_start),
        json_opt_f64(report.load_end)
    );
    let _ = writeln!(
        s,
        "  \"seconds_per_cell\": {}, \"keys\": {}, \"limit\": {}, \"burst\": {}, \"target\": {},",
        json_f64(report.seconds_per_cell),
        report.keys,
        json_f64(LIMIT_PER_SEC),
        BURST,
        json_f64(TARGET)
    );
    let _ = writeln!(s, "  \"cells\": [");
    for (i, c) in report.cells.iter().enumerate() {
        let ratio = if c.op != Op::Ping {
            json_opt_f64(report.ratio(c))
        } else {
            "null".to_string()
        };
        let _ = writeln!(
            s,
            "    {{\"cell\": {}, \"tasks\": {}, \"round\": {}, \"ops\": {}, \"seconds\": {}, \
             \"ops_per_sec\": {}, \"p50_ns\": {}, \"p99_ns\": {}, \"granted\": {}, \
             \"denied\": {}, \"errors\": {}, \"first_error\": {}, \"ratio_to_ping\": {}, \
             \"p50_ratio_to_ping\": {}, \"server_us_per_call\": {}, \"server_busy\": {}, \
             \"server_calls\": {}, \"checks_per_call\": {}}}{}",
            json_str(c.op.name()),
            c.tasks,
            c.round,
            c.ops,
            json_f64(c.seconds),
            json_f64(c.ops_per_sec()),
            c.p50.as_nanos(),
            c.p99.as_nanos(),
            c.granted,
            c.denied,
            c.errors,
            c.first_error
                .as_deref()
                .map_or("null".to_string(), json_str),
            ratio,
            if c.op != Op::Ping {
                json_opt_f64(report.p50_ratio(c))
            } else {
                "null".to_string()
            },
            json_opt_f64(c.server_us_per_call),
            json_opt_f64(c.server_busy),
            c.server_calls.map_or("null".to_string(), |n| n.to_string()),
            json_opt_f64(c.checks_per_call()),
            if i + 1 == report.cells.len() { "" } else { "," }
        );
    }
    let _ = writeln!(s, "  ]");
    let _ = writeln!(s, "}}");
    s
}
