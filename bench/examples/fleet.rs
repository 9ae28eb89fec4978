//! A fleet on one `redis-server`: N processes checking one limit, through `Leased` (leases
//! spent in process), the plain `Gcra` (a round trip per check) and `Coalesce<Gcra>` (a hot
//! key's concurrent checks in one round trip), side by side in one run (issue #26's benchmark).
//!
//! ```text
//! cargo run --release -p turnstile-bench --example fleet
//! cargo run --release -p turnstile-bench --example fleet -- --processes 1,8 --seconds 1
//! cargo run --release -p turnstile-bench --example fleet -- --json fleet.json
//! ```
//!
//! The example starts its own `redis-server` on a free loopback port (never 6379, no
//! persistence; `bench/examples/redis/server.rs`) and, for each cell, `N` copies of itself
//! (`--processes`, default 1, 2, 4, 8) as workers. Every worker connects, waits for a start
//! time the parent set (the system clock, which the server's `TIME` also reads), then checks
//! for `--seconds` (default 1) from `--tasks` tokio tasks (default 4, on a current-thread
//! runtime; each yields every 16 checks, as a server's tasks yield to I/O, so that the
//! leases' background renewals run) as fast as it can:
//!
//! * **hot**: one key, limited to 20 000 checks/s with a burst of 2 000 (`Leased`'s default
//!   `k`, an eighth of the burst: 250);
//! * **keys**: `--keys` keys (default 10 000) drawn at random, each limited to 1/s with a
//!   burst of 4 (`k` = 1: cold keys, leased one permit at a time, where the refused-until
//!   cache is what leasing adds).
//!
//! Each cell uses keys of its own (a fresh prefix), full at the start. Per cell it prints the
//! fleet's checks per second; what it admitted against the budget since the start
//! (`burst + limit × t` per key, counted from the start time every worker waited for, so at
//! least the budget counted from the first check), as the most it ever ran **over** (grants
//! are counted per millisecond: the count by the end of each millisecond against the budget
//! at that end), the most any span of whole milliseconds `[a, b]` ran over the budget of
//! its length (**over a span**: at most the leases unspent at `a`, `N × k`, by the stated
//! bound) and the most it ran **under** (against the budget at that millisecond's start,
//! from 100 ms on, when every process is saturated) next to `N × k` (judged on the hot key
//! only: on many keys each key's burst counts from the start, but the fleet reaches each key
//! only so fast, so not every key is saturated); the Redis script calls
//! per check (the server's own count, `INFO commandstats`, over the fleet's checks); and the
//! check latency (every check timed with `Instant`): the fleet's p50 and the worst process's
//! p99.
//!
//! The verdict checks issue #26's goals: never over, under at most `N × k` where every process
//! was saturated, at most `1 / k` Redis calls per check and a p99 of at most 1 µs on the hot
//! key through `Leased`, and the 8-process hot-key throughput at least 10× `Coalesce<Gcra>`'s.
//! Every process runs on this machine, beside the server: the figures are the fleet's on its
//! cores, not a network's.
//!
//! `--json FILE` writes every cell (schema `turnstile-fleet-bench/1`).
//!
//! Exit status: 0; 1 if a goal was missed or a check failed; 2 on a usage error, no
//! `redis-server` or a worker that did not report.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use turnstile::redis::{Coalesce, Gcra, Leased, RedisLimiter};
use turnstile::Limit;

#[path = "redis/server.rs"]
mod server;

/// The example's name in its messages.
const WHO: &str = "fleet example";
/// The hot key's limit and burst.
const HOT: PerKey = PerKey {
    rate: 20_000.0,
    burst: 2_000,
};
/// Each of the many keys' limit and burst.
const MANY: PerKey = PerKey {
    rate: 1.0,
    burst: 4,
};
/// Checks between two yields of a worker's task.
const YIELD_EVERY: u32 = 16;
/// The under-admission is judged from this far into a cell, once every process is saturated.
const WARM_MS: usize = 100;

struct Args {
    processes: Vec<usize>,
    seconds: f64,
    tasks: usize,
    keys: usize,
    json: Option<String>,
}

fn usage() -> &'static str {
    "usage: fleet [--processes 1,2,4,8] [--seconds S] [--tasks T] [--keys K] [--json FILE]"
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        processes: vec![1, 2, 4, 8],
        seconds: 1.0,
        tasks: 4,
        keys: 10_000,
        json: None,
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--processes" => {
                a.processes = value()?
                    .split(',')
                    .map(|n| n.parse().map_err(|_| format!("bad process count {n}")))
                    .collect::<Result<_, _>>()?;
                if a.processes.iter().any(|&n| n == 0 || n > 64) {
                    return Err("process counts are 1 to 64".into());
                }
            }
            "--seconds" => {
                a.seconds = value()?.parse().map_err(|_| "bad --seconds")?;
                if !(a.seconds > 0.0 && a.seconds <= 60.0) {
                    return Err("--seconds is in (0, 60]".into());
                }
            }
            "--tasks" => {
                a.tasks = value()?.parse().map_err(|_| "bad --tasks")?;
                if a.tasks == 0 || a.tasks > 256 {
                    return Err("--tasks is 1 to 256".into());
                }
            }
            "--keys" => {
                a.keys = value()?.parse().map_err(|_| "bad --keys")?;
                if a.keys == 0 {
                    return Err("--keys is at least 1".into());
                }
            }
            "--json" => a.json = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Leased,
    Gcra,
    Coalesce,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Leased, Kind::Gcra, Kind::Coalesce];
    fn name(self) -> &'static str {
        match self {
            Kind::Leased => "Leased",
            Kind::Gcra => "Gcra",
            Kind::Coalesce => "Coalesce<Gcra>",
        }
    }
    fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// A cell's limit per key.
#[derive(Clone, Copy)]
struct PerKey {
    rate: f64,
    burst: u32,
}

impl PerKey {
    /// The hot key's (`keys` = 1), or each of `keys` random keys'.
    fn of(keys: usize) -> PerKey {
        if keys == 1 {
            HOT
        } else {
            MANY
        }
    }

    fn limit(self) -> Limit {
        Limit::per_second(self.rate).unwrap()
    }

    /// `Leased`'s default `max_lease`, the bounds' `k`: an eighth of the burst, at least 1.
    fn k(self) -> u32 {
        (self.burst / 8).max(1)
    }
}

/// A latency histogram: 1 ns bins below 1 024 ns, then 64 bins per power of two.
struct Hist(Vec<u64>);

impl Hist {
    fn new() -> Hist {
        Hist(vec![0; 1024 + 64 * 54])
    }
    fn bin(ns: u64) -> usize {
        if ns < 1024 {
            return ns as usize;
        }
        let e = 63 - ns.leading_zeros() as usize;
        1024 + (e - 10) * 64 + ((ns >> (e - 6)) & 63) as usize
    }
    fn low(bin: usize) -> u64 {
        if bin < 1024 {
            return bin as u64;
        }
        let (e, m) = ((bin - 1024) / 64 + 10, ((bin - 1024) % 64) as u64);
        (1 << e) + (m << (e - 6))
    }
    fn add(&mut self, ns: u64) {
        let last = self.0.len() - 1;
        self.0[Hist::bin(ns).min(last)] += 1;
    }
    fn merge(&mut self, other: &Hist) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a += b;
        }
    }
    fn percentile(&self, p: f64) -> u64 {
        let total: u64 = self.0.iter().sum();
        let rank = ((p * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bin, &c) in self.0.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Hist::low(bin);
            }
        }
        0
    }
}

/// What one worker reports.
struct Report {
    checks: u64,
    granted: u64,
    refused: u64,
    errors: u64,
    first_error: Option<String>,
    hist: Hist,
    /// Grants per millisecond since the start time.
    grants_ms: Vec<u64>,
}

impl Report {
    fn empty(bins: usize) -> Report {
        Report {
            checks: 0,
            granted: 0,
            refused: 0,
            errors: 0,
            first_error: None,
            hist: Hist::new(),
            grants_ms: vec![0; bins],
        }
    }

    fn to_json(&self) -> String {
        let hist: Vec<String> = (self.hist.0.iter().enumerate())
            .filter(|(_, c)| **c > 0)
            .map(|(b, c)| format!("[{b},{c}]"))
            .collect();
        let grants: Vec<String> = self.grants_ms.iter().map(u64::to_string).collect();
        format!(
            "{{\"checks\":{},\"granted\":{},\"refused\":{},\"errors\":{},\"first_error\":{},\"hist\":[{}],\"grants_ms\":[{}]}}",
            self.checks,
            self.granted,
            self.refused,
            self.errors,
            self.first_error
                .as_deref()
                .map_or("null".into(), |e| format!("{e:?}")),
            hist.join(","),
            grants.join(",")
        )
    }

    fn from_json(s: &str) -> Result<Report, String> {
        let v: serde_json::Value = serde_json::from_str(s).map_err(|e| e.to_string())?;
        let n = |k: &str| v[k].as_u64().ok_or(format!("no {k}"));
        let mut hist = Hist::new();
        for pair in v["hist"].as_array().ok_or("no hist")? {
            let (b, c) = (pair[0].as_u64().unwrap_or(0), pair[1].as_u64().unwrap_or(0));
            if let Some(slot) = hist.0.get_mut(b as usize) {
                *slot += c;
            }
        }
        Ok(Report {
            checks: n("checks")?,
            granted: n("granted")?,
            refused: n("refused")?,
            errors: n("errors")?,
            first_error: v["first_error"].as_str().map(str::to_owned),
            hist,
            grants_ms: (v["grants_ms"].as_array().ok_or("no grants_ms")?)
                .iter()
                .map(|x| x.as_u64().unwrap_or(0))
                .collect(),
        })
    }
}

/// The worker: `--worker URL KIND KEYS SECONDS TASKS START_MS PREFIX`.
fn worker(args: &[String]) -> Result<Report, String> {
    let [url, kind, keys, seconds, tasks, start_ms, prefix] = args else {
        return Err("worker arguments".into());
    };
    let kind = Kind::parse(kind).ok_or("bad kind")?;
    let keys: usize = keys.parse().map_err(|_| "keys")?;
    let seconds: f64 = seconds.parse().map_err(|_| "seconds")?;
    let tasks: usize = tasks.parse().map_err(|_| "tasks")?;
    let start_ms: u64 = start_ms.parse().map_err(|_| "start")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let con = turnstile::redis::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let per_key = PerKey::of(keys);
        let gcra = Gcra::builder(per_key.limit(), per_key.burst)
            .prefix(prefix.clone())
            .build(con)
            .map_err(|e| e.to_string())?;
        let limiter = std::sync::Arc::new(match kind {
            Kind::Leased => {
                Limiter::Leased(Leased::builder(gcra).build().map_err(|e| e.to_string())?)
            }
            Kind::Gcra => Limiter::Gcra(gcra),
            Kind::Coalesce => Limiter::Coalesce(Coalesce::new(gcra)),
        });
        let names: std::sync::Arc<Vec<String>> =
            std::sync::Arc::new((0..keys).map(|i| format!("k{i}")).collect());
        // The start time on the monotonic clock: wait for it on the system clock.
        let start_at = UNIX_EPOCH + Duration::from_millis(start_ms);
        let wait = start_at
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        tokio::time::sleep(wait).await;
        let late = SystemTime::now()
            .duration_since(start_at)
            .unwrap_or(Duration::ZERO);
        let start = Instant::now() - late;
        let end = start + Duration::from_secs_f64(seconds);
        let bins = (seconds * 1000.0).ceil() as usize + 1;
        let mut handles = Vec::new();
        for t in 0..tasks {
            let (limiter, names) = (limiter.clone(), names.clone());
            handles.push(tokio::spawn(async move {
                let mut r = Report::empty(bins);
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ ((t as u64 + 1) * 0x2545_F491_4F6C_DD1D);
                loop {
                    let t0 = Instant::now();
                    if t0 >= end {
                        return r;
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let key = &names[(x % names.len() as u64) as usize];
                    let verdict = limiter.check(key).await;
                    let t1 = Instant::now();
                    r.hist.add((t1 - t0).as_nanos() as u64);
                    r.checks += 1;
                    match verdict {
                        Ok(Ok(())) => {
                            r.granted += 1;
                            let ms = (t1 - start).as_millis() as usize;
                            r.grants_ms[ms.min(bins - 1)] += 1;
                        }
                        Ok(Err(_)) => r.refused += 1,
                        Err(e) => {
                            r.errors += 1;
                            r.first_error.get_or_insert(e);
                        }
                    }
                    if r.checks.is_multiple_of(u64::from(YIELD_EVERY)) {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        let mut total = Report::empty(bins);
        for h in handles {
            let r = h.await.map_err(|e| e.to_string())?;
            total.checks += r.checks;
            total.granted += r.granted;
            total.refused += r.refused;
            total.errors += r.errors;
            if total.first_error.is_none() {
                total.first_error = r.first_error;
            }
            total.hist.merge(&r.hist);
            for (a, b) in total.grants_ms.iter_mut().zip(&r.grants_ms) {
                *a += b;
            }
        }
        Ok(total)
    })
}

enum Limiter {
    Leased(Leased),
    Gcra(Gcra),
    Coalesce(Coalesce<Gcra>),
}

impl Limiter {
    async fn check(&self, key: &str) -> Result<Result<(), turnstile::Denied>, String> {
        let r = match self {
            Limiter::Leased(l) => l.check_n(key, 1).await,
            Limiter::Gcra(g) => g.try_check_n(key, 1).await,
            Limiter::Coalesce(c) => c.try_check_n(key, 1).await,
        };
        r.map_err(|e| e.to_string())
    }
}

/// One cell's figures.
struct Cell {
    keys: usize,
    processes: usize,
    kind: Kind,
    checks: u64,
    granted: u64,
    refused: u64,
    errors: u64,
    first_error: Option<String>,
    seconds: f64,
    budget: f64,
    over: f64,
    /// The most the grants of any span of whole milliseconds ran over that span's budget.
    span_over: f64,
    under: f64,
    saturated: bool,
    nk: u64,
    calls: u64,
    p50: u64,
    p99_worst: u64,
}

impl Cell {
    fn checks_per_sec(&self) -> f64 {
        self.checks as f64 / self.seconds
    }
    fn calls_per_check(&self) -> f64 {
        self.calls as f64 / self.checks.max(1) as f64
    }
}

/// The server's count of script calls (`EVALSHA` and `EVAL`).
fn script_calls(port: u16) -> Result<u64, String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "commandstats"])
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum())
}

fn run_cell(
    args: &Args,
    port: u16,
    keys: usize,
    processes: usize,
    kind: Kind,
    index: usize,
) -> Result<Cell, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let url = format!("redis://127.0.0.1:{port}/");
    let prefix = format!("fleet:{index}:");
    let before = script_calls(port)?;
    let start_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_millis() as u64
        + 300
        + 20 * processes as u64;
    let mut children = Vec::new();
    for _ in 0..processes {
        let child = Command::new(&exe)
            .arg("--worker")
            .args([
                url.as_str(),
                kind.name(),
                &keys.to_string(),
                &args.seconds.to_string(),
                &args.tasks.to_string(),
                &start_ms.to_string(),
                &prefix,
            ])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting a worker: {e}"))?;
        children.push(child);
    }
    let mut reports = Vec::new();
    for mut c in children {
        let line = BufReader::new(c.stdout.take().ok_or("no stdout")?)
            .lines()
            .next()
            .ok_or("a worker said nothing")?
            .map_err(|e| e.to_string())?;
        let status = c.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("a worker failed: {status}: {line}"));
        }
        reports.push(Report::from_json(&line)?);
    }
    let calls = script_calls(port)? - before;
    let PerKey { rate, burst } = PerKey::of(keys);
    let k = u64::from(PerKey::of(keys).k());
    let bins = reports[0].grants_ms.len();
    let mut cum = 0.0;
    let (mut over, mut under) = (f64::MIN, f64::MIN);
    let budget_at = |ms: usize| keys as f64 * (f64::from(burst) + rate * ms as f64 / 1000.0);
    for b in 0..bins {
        cum += reports.iter().map(|r| r.grants_ms[b] as f64).sum::<f64>();
        let end = (b + 1).min((args.seconds * 1000.0).ceil() as usize);
        over = over.max(cum - budget_at(end));
        if b >= WARM_MS && b < bins - 1 {
            under = under.max(budget_at(b) - cum);
        }
    }
    // Every span [a, b] of whole milliseconds against the budget of its length (its grants
    // happened within it, so within b + 1 - a ms).
    let per_ms: Vec<f64> = (0..bins)
        .map(|b| reports.iter().map(|r| r.grants_ms[b] as f64).sum())
        .collect();
    let mut span_over = f64::MIN;
    for a in 0..bins {
        let mut within = 0.0;
        for (b, g) in per_ms.iter().enumerate().skip(a) {
            within += g;
            let allowed = keys as f64 * (f64::from(burst) + rate * (b + 1 - a) as f64 / 1000.0);
            span_over = span_over.max(within - allowed);
        }
    }
    let mut hist = Hist::new();
    for r in &reports {
        hist.merge(&r.hist);
    }
    let first_error = reports.iter().find_map(|r| r.first_error.clone());
    Ok(Cell {
        keys,
        processes,
        kind,
        checks: reports.iter().map(|r| r.checks).sum(),
        granted: reports.iter().map(|r| r.granted).sum(),
        refused: reports.iter().map(|r| r.refused).sum(),
        errors: reports.iter().map(|r| r.errors).sum(),
        first_error,
        seconds: args.seconds,
        budget: budget_at((args.seconds * 1000.0).ceil() as usize),
        over,
        span_over,
        under,
        saturated: reports.iter().all(|r| r.refused * 2 >= r.checks),
        nk: processes as u64 * k * keys as u64,
        calls,
        p50: hist.percentile(0.5),
        p99_worst: reports
            .iter()
            .map(|r| r.hist.percentile(0.99))
            .max()
            .unwrap_or(0),
    })
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some("--worker") {
        return match worker(&argv[1..]) {
            Ok(r) => {
                println!("{}", r.to_json());
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("{{\"error\":{e:?}}}");
                ExitCode::from(2)
            }
        };
    }
    let args = match parse_args(argv.into_iter()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{WHO}: {e}\n{}", usage());
            return ExitCode::from(2);
        }
    };
    let server = match server::start_server() {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!(
                "{WHO}: redis-server is not installed (Debian/Ubuntu: `apt-get install -y \
                 redis-server`, macOS: `brew install redis`)"
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("{WHO}: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "fleet on one redis-server (127.0.0.1:{}, no persistence): {} s per cell, {} tasks per \
         process; hot key {}/s burst {} (k = {}); {} keys at {}/s burst {} each (k = {})\n",
        server.port,
        args.seconds,
        args.tasks,
        HOT.rate,
        HOT.burst,
        HOT.k(),
        args.keys,
        MANY.rate,
        MANY.burst,
        MANY.k()
    );
    let _ = writeln!(
        out,
        "| keys | N | limiter | checks/s | admitted / budget | over | over a span | most under (N × k) | Redis calls/check | p50 | worst p99 |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    let mut cells = Vec::new();
    let mut index = 0;
    for keys in [1, args.keys] {
        for &n in &args.processes {
            for kind in Kind::ALL {
                index += 1;
                let cell = match run_cell(&args, server.port, keys, n, kind, index) {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("{WHO}: {e}");
                        return ExitCode::from(2);
                    }
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.0} | {} / {:.0} | {:.0} | {:.0} | {:.0}{} ({}) | {:.5} | {} ns | {} ns |",
                    if keys == 1 { "hot".to_string() } else { keys.to_string() },
                    n,
                    kind.name(),
                    cell.checks_per_sec(),
                    cell.granted,
                    cell.budget,
                    cell.over.max(0.0),
                    cell.span_over.max(0.0),
                    cell.under.max(0.0),
                    if cell.saturated { "" } else { " (not saturated)" },
                    cell.nk,
                    cell.calls_per_check(),
                    cell.p50,
                    cell.p99_worst
                );
                let _ = out.flush();
                cells.push(cell);
            }
        }
    }
    let ok = verdict(&cells, &mut out);
    if let Some(path) = &args.json {
        if let Err(e) = std::fs::write(path, to_json(&cells)) {
            eprintln!("{WHO}: {path}: {e}");
            return ExitCode::from(2);
        }
    }
    drop(server);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Issue #26's goals against the cells; true if all hold.
fn verdict(cells: &[Cell], out: &mut impl Write) -> bool {
    let mut ok = true;
    let _ = writeln!(out, "\nverdict (issue #26):");
    let mut say = |good: bool, what: String| {
        ok &= good;
        let _ = writeln!(out, "- {} {what}", if good { "ok  " } else { "MISS" });
    };
    let errors: u64 = cells.iter().map(|c| c.errors).sum();
    let first = cells.iter().find_map(|c| c.first_error.clone());
    say(
        errors == 0,
        format!(
            "no check failed ({errors} errors{})",
            first.map_or(String::new(), |e| format!(", first: {e}"))
        ),
    );
    let worst_over = cells.iter().map(|c| c.over).fold(f64::MIN, f64::max);
    say(
        worst_over <= 0.0,
        format!(
            "never over the budget since the start (most over in any cell: {:.0})",
            worst_over.max(0.0)
        ),
    );
    for c in cells.iter().filter(|c| c.kind == Kind::Leased) {
        let keys = if c.keys == 1 {
            "hot".to_string()
        } else {
            format!("{} keys", c.keys)
        };
        // On many keys a key's burst counts from the start, but the fleet reaches each key
        // only so fast: not every key is saturated, and the figure is shown, not judged.
        if c.saturated && c.keys == 1 {
            say(
                c.under <= c.nk as f64,
                format!(
                    "Leased, {keys}, N = {}: under by at most {:.0} ≤ N × k = {}",
                    c.processes,
                    c.under.max(0.0),
                    c.nk
                ),
            );
        }
        say(
            c.span_over <= c.nk as f64,
            format!(
                "Leased, {keys}, N = {}: over any span by at most {:.0} ≤ N × k = {}",
                c.processes,
                c.span_over.max(0.0),
                c.nk
            ),
        );
        if c.keys == 1 {
            let k = f64::from(HOT.k());
            say(
                c.calls_per_check() <= 1.0 / k,
                format!(
                    "Leased, hot, N = {}: {:.5} Redis calls per check ≤ 1/k = {:.5}",
                    c.processes,
                    c.calls_per_check(),
                    1.0 / k
                ),
            );
            say(
                c.p99_worst <= 1_000,
                format!(
                    "Leased, hot, N = {}: worst process p99 {} ns ≤ 1 µs",
                    c.processes, c.p99_worst
                ),
            );
        }
    }
    let hot8 = |kind| {
        cells
            .iter()
            .find(|c| c.keys == 1 && c.processes == 8 && c.kind == kind)
    };
    if let (Some(l), Some(c)) = (hot8(Kind::Leased), hot8(Kind::Coalesce)) {
        let ratio = l.checks_per_sec() / c.checks_per_sec();
        say(ratio >= 10.0, format!("hot key, 8 processes: Leased {:.0} checks/s = {ratio:.1}× Coalesce<Gcra>'s {:.0} (goal ≥ 10×)", l.checks_per_sec(), c.checks_per_sec()));
    }
    ok
}

fn to_json(cells: &[Cell]) -> String {
    let rows: Vec<String> = cells
        .iter()
        .map(|c| {
            format!(
                "{{\"keys\":{},\"processes\":{},\"limiter\":\"{}\",\"checks\":{},\"granted\":{},\"refused\":{},\"errors\":{},\"seconds\":{},\"checks_per_sec\":{:.1},\"budget\":{:.1},\"over\":{:.1},\"span_over\":{:.1},\"under\":{:.1},\"saturated\":{},\"n_k\":{},\"redis_calls\":{},\"calls_per_check\":{:.6},\"p50_ns\":{},\"worst_p99_ns\":{}}}",
                c.keys, c.processes, c.kind.name(), c.checks, c.granted, c.refused, c.errors, c.seconds,
                c.checks_per_sec(), c.budget, c.over, c.span_over, c.under, c.saturated, c.nk, c.calls,
                c.calls_per_check(), c.p50, c.p99_worst
            )
        })
        .collect();
    format!(
        "{{\"schema\":\"turnstile-fleet-bench/1\",\"cells\":[{}]}}\n",
        rows.join(",")
    )
}
