//! The HTTP example's machinery: the command line, the cells (each an axum `Router` built by a
//! function), the server, the load generator, the report, the verdict and the JSON.
//! `bench/examples/http.rs` runs it; `tests/tower/http_example_smoke.rs` includes this file as a
//! module and runs it briefly. Nothing here writes to stdout directly: every report line goes
//! to the `out` it is given.

use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use axum::serve::ListenerExt;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, HOST};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};

#[path = "../../../examples/common/report.rs"]
pub mod report;
pub use report::{busy_note, fmt_dur, fmt_load, load_average, percentile, thousands};

// Shared with bench/examples/http_instructions.rs, which counts one more cell than this run has.
#[allow(dead_code)]
#[path = "cells.rs"]
mod cells;
pub use cells::*;

#[path = "wire.rs"]
mod wire;
pub use wire::parse_head;

/// The target of issue #12: a layer that allows every request costs at most this fraction of
/// the no-layer throughput.
pub const TARGET_OVERHEAD: f64 = 0.05;

/// The JSON schema name.
pub const SCHEMA: &str = "turnstile-http-bench/1";

/// What a cell is for in the verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No layer: the reference.
    Baseline,
    /// A layer that allows every request: judged against the overhead target.
    Allow,
    /// A layer that denies almost every request: the cost of the denial path, not judged.
    Deny,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Baseline => "baseline",
            Kind::Allow => "allow",
            Kind::Deny => "deny",
        }
    }
}

/// One cell: a name and the function that builds its router (`None`: not available).
#[derive(Clone, Copy)]
pub struct CellSpec {
    pub name: &'static str,
    pub kind: Kind,
    pub build: fn() -> Option<Router>,
}

/// Every cell, in the order of the first round.
pub const CELLS: [CellSpec; 5] = [
    CellSpec {
        name: "no_layer",
        kind: Kind::Baseline,
        build: no_layer_router,
    },
    CellSpec {
        name: "governor_allow",
        kind: Kind::Allow,
        build: governor_allow_router,
    },
    CellSpec {
        name: "turnstile_allow",
        kind: Kind::Allow,
        build: turnstile_router,
    },
    CellSpec {
        name: "governor_deny",
        kind: Kind::Deny,
        build: governor_deny_router,
    },
    CellSpec {
        name: "turnstile_deny",
        kind: Kind::Deny,
        build: turnstile_deny_router,
    },
];

/// The command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// `--seconds`: measured seconds per cell.
    pub seconds: f64,
    /// `--warmup`: unmeasured seconds at the start of each cell (connecting included).
    pub warmup: f64,
    /// `--rounds`: how many times every cell runs, round-robin.
    pub rounds: usize,
    /// `--connections`: keep-alive connections of the load generator.
    pub connections: usize,
    /// `--peers`: how many loopback addresses (127.0.0.1, 127.0.0.2, ...) the connections come
    /// from, round-robin: the number of keys a peer-IP layer sees.
    pub peers: usize,
    /// `--server-threads`, `--client-threads`: worker threads of the two runtimes.
    pub server_threads: usize,
    pub client_threads: usize,
    /// `--client`: the load generator's HTTP/1.1 client.
    pub client: ClientKind,
    /// `--cells`: the cells to run (`no_layer` always runs).
    pub cells: Vec<&'static str>,
    /// `--json FILE`.
    pub json: Option<String>,
}

/// The default measured seconds per cell.
pub const DEFAULT_SECONDS: f64 = 2.5;
/// The default warm-up per cell.
pub const DEFAULT_WARMUP: f64 = 0.3;
/// The default number of rounds.
pub const DEFAULT_ROUNDS: usize = 3;
/// The default number of connections.
pub const DEFAULT_CONNECTIONS: usize = 32;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl Args {
    /// The cells this run asks for, in order, whether or not they are available.
    pub fn specs(&self) -> Vec<CellSpec> {
        CELLS
            .iter()
            .filter(|c| self.cells.contains(&c.name))
            .copied()
            .collect()
    }

    /// How long the run takes at most, in seconds (every asked-for cell available, without
    /// start-up): rounds × cells × (warm-up + seconds).
    pub fn expected_seconds(&self) -> f64 {
        (self.rounds * self.specs().len()) as f64 * (self.warmup + self.seconds)
    }
}

/// The usage text.
pub fn usage() -> String {
    let all: Vec<&str> = CELLS.iter().map(|c| c.name).collect();
    let defaults = parse_args(Vec::new()).expect("the defaults parse");
    format!(
        "usage: cargo run --release -p turnstile-bench --example http -- [OPTIONS]

Requests per second and p50/p99 latency of a trivial axum handler (GET / -> \"ok\") on loopback,
without a layer, behind tower_governor's layer and behind turnstile's, in one run: the server
on one tokio runtime, the load generator (keep-alive HTTP/1.1 connections, one request in
flight each) on another, in the same process. The cells run round-robin, --rounds times,
starting one cell later each round. Exit status: 0 ok; 1 if any request failed; 2 on a usage
error or a server that cannot start.

options:
  --seconds S         measured seconds per cell (default {DEFAULT_SECONDS})
  --warmup S          unmeasured seconds before each cell's measurement (default {DEFAULT_WARMUP})
  --rounds N          times every cell runs (default {DEFAULT_ROUNDS}; about {:.0} s in all with \
         every cell)
  --connections C     keep-alive connections (default {DEFAULT_CONNECTIONS})
  --peers N           loopback source addresses 127.0.0.1..127.0.0.N the connections spread
                      over, i.e. keys of a peer-IP limiter (default 1: one hot key; Linux)
  --server-threads N  the server runtime's worker threads (default: cores, {})
  --client-threads N  the load generator's worker threads (default: cores, {})
  --client KIND       the load generator's client: hyper (hyper's client::conn::http1, the
                      default) or raw (a minimal HTTP/1.1 client here: fixed request bytes,
                      responses cut at Content-Length; cheaper, so the server gets more CPU)
  --cells LIST        comma-separated cells to run (default all: {}); no_layer always runs
  --json FILE         also write every cell and the verdict as JSON to FILE
  -h, --help          this text",
        defaults.expected_seconds(),
        defaults.server_threads,
        defaults.client_threads,
        all.join(","),
    )
}

/// Parses the arguments (without the program name). `Err("")` means `--help`.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        seconds: DEFAULT_SECONDS,
        warmup: DEFAULT_WARMUP,
        rounds: DEFAULT_ROUNDS,
        connections: DEFAULT_CONNECTIONS,
        peers: 1,
        server_threads: cores(),
        client_threads: cores(),
        client: ClientKind::Hyper,
        cells: CELLS.iter().map(|c| c.name).collect(),
        json: None,
    };
    let count = |flag: &str, v: &str, max: usize| {
        v.parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or(format!("{flag} {v}: a whole number from 1 to {max}"))
    };
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--seconds" => {
                let v = value("--seconds")?;
                a.seconds = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                    .ok_or(format!("--seconds {v}: a number of seconds in (0, 3600]"))?;
            }
            "--warmup" => {
                let v = value("--warmup")?;
                a.warmup = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 60.0)
                    .ok_or(format!("--warmup {v}: a number of seconds in [0, 60]"))?;
            }
            "--rounds" => a.rounds = count("--rounds", &value("--rounds")?, 100)?,
            "--connections" => {
                a.connections = count("--connections", &value("--connections")?, 4096)?
            }
            "--peers" => a.peers = count("--peers", &value("--peers")?, 254)?,
            "--server-threads" => {
                a.server_threads = count("--server-threads", &value("--server-threads")?, 256)?
            }
            "--client-threads" => {
                a.client_threads = count("--client-threads", &value("--client-threads")?, 256)?
            }
            "--client" => {
                let v = value("--client")?;
                a.client = match v.as_str() {
                    "hyper" => ClientKind::Hyper,
                    "raw" => ClientKind::Raw,
                    _ => return Err(format!("--client {v}: hyper or raw")),
                }
            }
            "--cells" => {
                let v = value("--cells")?;
                let mut cells = vec!["no_layer"];
                for name in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let spec = CELLS.iter().find(|c| c.name == name).ok_or(format!(
                        "--cells {v}: unknown cell {name} (cells: {})",
                        CELLS.iter().map(|c| c.name).collect::<Vec<_>>().join(",")
                    ))?;
                    if !cells.contains(&spec.name) {
                        cells.push(spec.name);
                    }
                }
                a.cells = cells;
            }
            "--json" => a.json = Some(value("--json")?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// One run of one cell.
#[derive(Debug, Clone)]
pub struct Cell {
    pub name: &'static str,
    pub kind: Kind,
    /// Which round (0-based), and the cell's position in that round.
    pub round: usize,
    pub position: usize,
    /// Requests answered in the measured window (any status).
    pub requests: u64,
    /// The measured window's length, from the end of the warm-up until the last request ended.
    pub seconds: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub status_200: u64,
    pub status_429: u64,
    pub status_other: u64,
    /// Requests that failed (connection or protocol errors); the connection is re-opened.
    pub errors: u64,
    /// The first error, or the first unexpected status.
    pub first_error: Option<String>,
    /// CPU time of the server runtime's threads, the load generator's, and of the rest of the
    /// machine (all cores' busy time minus this process's threads), each over the measured
    /// window's wall time: cores kept busy. `None` where `/proc` cannot be read.
    pub server_cpu: Option<f64>,
    pub client_cpu: Option<f64>,
    pub other_cpu: Option<f64>,
}

impl Cell {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds.max(1e-9)
    }

    /// The server's CPU time per request, in µs.
    pub fn server_us_per_request(&self) -> Option<f64> {
        let cpu = self.server_cpu?;
        (self.requests > 0).then(|| cpu * self.seconds * 1e6 / self.requests as f64)
    }

    /// The load generator's CPU time per request, in µs.
    pub fn client_us_per_request(&self) -> Option<f64> {
        let cpu = self.client_cpu?;
        (self.requests > 0).then(|| cpu * self.seconds * 1e6 / self.requests as f64)
    }
}

/// A cell over all its rounds.
#[derive(Debug, Clone)]
pub struct Summary {
    pub name: &'static str,
    pub kind: Kind,
    pub rounds: usize,
    /// The mean of the rounds' requests per second.
    pub rps: f64,
    /// The means of the rounds' p50 and p99.
    pub p50: Duration,
    pub p99: Duration,
    /// The mean of the rounds' server CPU µs per request.
    pub server_us_per_request: Option<f64>,
    /// `rps` over no_layer's `rps` (1.0 for no_layer itself).
    pub ratio: f64,
    /// The lowest and highest of the rounds' own ratios: each round's rps over the same
    /// round's no_layer rps (the spread the machine's noise gives the ratio).
    pub round_ratio_min: f64,
    pub round_ratio_max: f64,
    /// Server CPU per request over no_layer's, minus 1: the layer's cost in the server's CPU,
    /// whatever the load generator and the machine's other work take.
    pub server_cpu_overhead: Option<f64>,
}

impl Summary {
    /// The throughput overhead: `1 - ratio`.
    pub fn overhead(&self) -> f64 {
        1.0 - self.ratio
    }

    /// Whether an allowing layer meets the target by its mean; `None` for the other kinds.
    pub fn meets_target(&self) -> Option<bool> {
        (self.kind == Kind::Allow).then(|| self.overhead() <= TARGET_OVERHEAD)
    }

    /// An allowing layer's verdict: `"meets"` when every round's own ratio is within the
    /// target, `"above"` when none is, `"inconclusive"` when the rounds straddle it (the
    /// machine's noise is larger than the difference); `None` for the other kinds.
    pub fn verdict(&self) -> Option<&'static str> {
        if self.kind != Kind::Allow {
            return None;
        }
        let bar = 1.0 - TARGET_OVERHEAD;
        Some(if self.round_ratio_min.is_nan() {
            if self.ratio >= bar {
                "meets"
            } else {
                "above"
            }
        } else if self.round_ratio_min >= bar {
            "meets"
        } else if self.round_ratio_max < bar {
            "above"
        } else {
            "inconclusive"
        })
    }
}

/// The whole run.
#[derive(Debug, Clone)]
pub struct Report {
    pub cells: Vec<Cell>,
    /// Cells asked for whose function returned `None`.
    pub skipped: Vec<&'static str>,
    pub args: Args,
    pub cores: usize,
    pub load_start: Option<f64>,
    pub load_end: Option<f64>,
}

impl Report {
    pub fn errors(&self) -> u64 {
        self.cells.iter().map(|c| c.errors).sum()
    }

    /// The names of the cells that ran, in their first round's order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        for c in &self.cells {
            if !names.contains(&c.name) {
                names.push(c.name);
            }
        }
        names
    }

    fn runs(&self, name: &str) -> Vec<&Cell> {
        self.cells.iter().filter(|c| c.name == name).collect()
    }

    /// no_layer's mean requests per second over its rounds.
    pub fn baseline_rps(&self) -> Option<f64> {
        let runs = self.runs("no_layer");
        (!runs.is_empty()).then(|| runs.iter().map(|c| c.rps()).sum::<f64>() / runs.len() as f64)
    }

    /// How far no_layer's rounds are apart, as a fraction of their mean: the machine's drift.
    pub fn baseline_drift(&self) -> Option<f64> {
        let runs: Vec<f64> = self.runs("no_layer").iter().map(|c| c.rps()).collect();
        if runs.len() < 2 {
            return None;
        }
        let (lo, hi) = runs
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        Some((hi - lo) / ((hi + lo) / 2.0).max(1e-9))
    }

    /// Every cell over its rounds, in the first round's order.
    pub fn summaries(&self) -> Vec<Summary> {
        let base = self.baseline_rps().unwrap_or(0.0).max(1e-9);
        let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
        let cpu_mean = |runs: &[&Cell]| {
            let v: Option<Vec<f64>> = runs.iter().map(|c| c.server_us_per_request()).collect();
            v.filter(|v| !v.is_empty()).map(|v| mean(&v))
        };
        let base_cpu = cpu_mean(&self.runs("no_layer"));
        self.names()
            .into_iter()
            .map(|name| {
                let runs = self.runs(name);
                let rps = mean(&runs.iter().map(|c| c.rps()).collect::<Vec<_>>());
                let round_ratios: Vec<f64> = runs
                    .iter()
                    .filter_map(|c| {
                        let b = self
                            .cells
                            .iter()
                            .find(|b| b.name == "no_layer" && b.round == c.round)?;
                        Some(c.rps() / b.rps().max(1e-9))
                    })
                    .collect();
                let server_us = cpu_mean(&runs);
                Summary {
                    name,
                    kind: runs[0].kind,
                    rounds: runs.len(),
                    rps,
                    p50: Duration::from_secs_f64(mean(
                        &runs.iter().map(|c| c.p50.as_secs_f64()).collect::<Vec<_>>(),
                    )),
                    p99: Duration::from_secs_f64(mean(
                        &runs.iter().map(|c| c.p99.as_secs_f64()).collect::<Vec<_>>(),
                    )),
                    server_us_per_request: server_us,
                    ratio: rps / base,
                    round_ratio_min: round_ratios.iter().copied().fold(f64::NAN, f64::min),
                    round_ratio_max: round_ratios.iter().copied().fold(f64::NAN, f64::max),
                    server_cpu_overhead: match (server_us, base_cpu) {
                        (Some(c), Some(b)) if b > 0.0 => Some(c / b - 1.0),
                        _ => None,
                    },
                }
            })
            .collect()
    }

    /// turnstile's throughput over tower_governor's, for the allowing and the denying cells,
    /// where both ran.
    pub fn turnstile_vs_governor(&self) -> (Option<f64>, Option<f64>) {
        let s = self.summaries();
        let rps = |name: &str| s.iter().find(|c| c.name == name).map(|c| c.rps);
        let ratio = |t: Option<f64>, g: Option<f64>| Some(t? / g?.max(1e-9));
        (
            ratio(rps("turnstile_allow"), rps("governor_allow")),
            ratio(rps("turnstile_deny"), rps("governor_deny")),
        )
    }
}

// ---- CPU accounting (Linux /proc) -------------------------------------------------------------

/// The thread-name prefixes of the two runtimes (`/proc/self/task/*/comm`).
pub const SERVER_THREAD: &str = "http-server";
pub const CLIENT_THREAD: &str = "http-client";

/// CPU time so far, in seconds: of the server runtime's threads, of the load generator's, of
/// this whole process, and of the whole machine (busy time summed over all cores).
#[derive(Debug, Clone, Copy)]
struct CpuSnapshot {
    server: f64,
    client: f64,
    process: f64,
    machine: Option<f64>,
}

/// A thread's CPU time in seconds: `schedstat`'s nanoseconds on the CPU, else `stat`'s
/// utime + stime in clock ticks (USER_HZ, 100 on Linux).
fn thread_cpu(dir: &std::path::Path) -> Option<f64> {
    if let Ok(s) = std::fs::read_to_string(dir.join("schedstat")) {
        if let Some(ns) = s
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
        {
            return Some(ns as f64 / 1e9);
        }
    }
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn cpu_snapshot() -> Option<CpuSnapshot> {
    let mut snap = CpuSnapshot {
        server: 0.0,
        client: 0.0,
        process: 0.0,
        machine: None,
    };
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = entry.ok()?.path();
        let Some(cpu) = thread_cpu(&dir) else {
            continue; // the thread ended meanwhile
        };
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        snap.process += cpu;
        if comm.starts_with(SERVER_THREAD) {
            snap.server += cpu;
        } else if comm.starts_with(CLIENT_THREAD) {
            snap.client += cpu;
        }
    }
    // /proc/stat's first line: cpu user nice system idle iowait irq softirq steal ..., ticks.
    snap.machine = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        let f: Vec<u64> = s
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        let busy: u64 = f.iter().sum::<u64>() - f.get(3)? - f.get(4)?;
        Some(busy as f64 / 100.0)
    });
    Some(snap)
}

// ---- the server and the load generator --------------------------------------------------------

/// The server of one cell: `router` served by `axum::serve` on 127.0.0.1, port 0, with
/// `ConnectInfo<SocketAddr>` (what peer-IP layers key on) and TCP_NODELAY, on `rt`.
struct Server {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<io::Result<()>>,
}

fn start_server(rt: &tokio::runtime::Runtime, router: Router) -> Result<Server, String> {
    let listener = rt
        .block_on(TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .map_err(|e| format!("binding 127.0.0.1:0: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("the listener's address: {e}"))?;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = stopped.await;
        })
        .await
    });
    Ok(Server { addr, stop, task })
}

/// What one connection counted.
#[derive(Default)]
struct ConnResult {
    samples: Vec<u64>,
    status_200: u64,
    status_429: u64,
    status_other: u64,
    errors: u64,
    first_error: Option<String>,
}

/// Which HTTP/1.1 client the load generator uses (`--client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientKind {
    /// hyper's `client::conn::http1`: a real HTTP/1.1 client (no pool), its connection driven
    /// by a task of its own.
    Hyper,
    /// A minimal client of this file: one fixed `GET / HTTP/1.1` written with one `try_write`,
    /// the response read into a buffer and cut at `Content-Length` (which hyper's server
    /// always sends for these bodies). No task per connection and no header map: the cheapest
    /// load generator, which leaves the server more of a small machine's cores.
    Raw,
}

impl ClientKind {
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Hyper => "hyper",
            ClientKind::Raw => "raw",
        }
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// One keep-alive connection of the load generator.
enum Conn {
    Hyper { sender: Sender, host: HeaderValue },
    Raw(RawConn),
}

/// Opens one keep-alive HTTP/1.1 connection from `from` (port 0) to `to`.
async fn connect(kind: ClientKind, from: Ipv4Addr, to: SocketAddr) -> Result<Conn, String> {
    let socket = TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    socket
        .bind(SocketAddrV4::new(from, 0).into())
        .map_err(|e| format!("binding {from}:0: {e}"))?;
    let stream = socket
        .connect(to)
        .await
        .map_err(|e| format!("connecting {from} -> {to}: {e}"))?;
    let _ = stream.set_nodelay(true);
    match kind {
        ClientKind::Hyper => {
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let host =
                HeaderValue::from_str(&to.to_string()).expect("an address is a valid header");
            Ok(Conn::Hyper { sender, host })
        }
        ClientKind::Raw => Ok(Conn::Raw(RawConn {
            request: format!("GET / HTTP/1.1\r\nhost: {to}\r\n\r\n").into_bytes(),
            stream,
            buf: vec![0; 4096],
        })),
    }
}

impl Conn {
    /// One request: its status once the whole body is read.
    async fn request(&mut self) -> Result<u16, String> {
        match self {
            Conn::Hyper { sender, host } => {
                sender.ready().await.map_err(|e| e.to_string())?;
                let mut req = Request::new(Empty::<Bytes>::new());
                req.headers_mut().insert(HOST, host.clone());
                let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
                let status = resp.status().as_u16();
                let mut body = resp.into_body();
                while let Some(frame) = body.frame().await {
                    frame.map_err(|e| e.to_string())?;
                }
                Ok(status)
            }
            Conn::Raw(c) => c.request().await,
        }
    }
}

/// The minimal client's connection.
struct RawConn {
    request: Vec<u8>,
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    async fn request(&mut self) -> Result<u16, String> {
        let mut sent = 0;
        while sent < self.request.len() {
            self.stream.writable().await.map_err(|e| e.to_string())?;
            match self.stream.try_write(&self.request[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("writing the request: {e}")),
            }
        }
        // One request in flight: whatever arrives belongs to this response.
        let mut filled = 0;
        let mut head: Option<(u16, usize)> = None; // (status, the response's whole length)
        loop {
            if let Some((status, total)) = head {
                if filled >= total {
                    if filled > total {
                        return Err("more bytes than the response's Content-Length".into());
                    }
                    return Ok(status);
                }
            }
            if filled == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
            self.stream.readable().await.map_err(|e| e.to_string())?;
            match self.stream.try_read(&mut self.buf[filled..]) {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(format!("reading the response: {e}")),
            }
            if head.is_none() {
                head = parse_head(&self.buf[..filled])?;
            }
        }
    }
}

/// One connection's loop: requests back to back (one in flight) until `deadline`, timing
/// those that start at or after `measure_from`. On an error it counts it and reconnects.
async fn drive(
    kind: ClientKind,
    from: Ipv4Addr,
    to: SocketAddr,
    measure_from: Instant,
    deadline: Instant,
) -> ConnResult {
    let mut r = ConnResult {
        samples: Vec::with_capacity(1 << 14),
        ..ConnResult::default()
    };
    let mut conn = None;
    loop {
        if Instant::now() >= deadline {
            break;
        }
        if conn.is_none() {
            match connect(kind, from, to).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    r.errors += 1;
                    r.first_error.get_or_insert(e);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected just above");
        // A request's latency excludes connecting; it counts if it starts in the window.
        let t0 = Instant::now();
        let measured = t0 >= measure_from && t0 < deadline;
        let outcome = c.request().await;
        let ns = t0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        match outcome {
            Ok(status) if measured => {
                match status {
                    200 => r.status_200 += 1,
                    429 => r.status_429 += 1,
                    other => {
                        r.status_other += 1;
                        r.first_error
                            .get_or_insert(format!("unexpected status {other}"));
                    }
                }
                r.samples.push(ns);
            }
            Ok(_) => {}
            Err(e) => {
                // Counted even in the warm-up: a failing request is never expected.
                r.errors += 1;
                r.first_error.get_or_insert(e);
                conn = None;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }
    r
}

/// Runs one cell: a fresh server with `router` on `server_rt`, `args.connections` connections
/// on `client_rt` for the warm-up and then `args.seconds` measured.
fn run_cell(
    spec: &CellSpec,
    router: Router,
    round: usize,
    position: usize,
    args: &Args,
    server_rt: &tokio::runtime::Runtime,
    client_rt: &tokio::runtime::Runtime,
) -> Result<Cell, String> {
    let server = start_server(server_rt, router)?;
    let to = server.addr;
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let deadline = measure_from + Duration::from_secs_f64(args.seconds);
    let peers = args.peers;
    let connections = args.connections;
    let client = args.client;
    let (results, cpu0, cpu1, end) = client_rt.block_on(async move {
        let handles: Vec<_> = (0..connections)
            .map(|i| {
                let from = Ipv4Addr::new(127, 0, 0, 1 + (i % peers) as u8);
                tokio::spawn(drive(client, from, to, measure_from, deadline))
            })
            .collect();
        // This future runs on the calling thread, not on either runtime's workers: the
        // snapshots cost neither side.
        tokio::time::sleep_until(measure_from.into()).await;
        let cpu0 = cpu_snapshot();
        tokio::time::sleep_until(deadline.into()).await;
        let cpu1 = cpu_snapshot();
        let mut results = Vec::with_capacity(handles.len());
        for h in handles {
            results.push(
                h.await
                    .map_err(|e| format!("a connection's task failed: {e}")),
            );
        }
        (results, cpu0, cpu1, Instant::now())
    });
    // Every connection is closed (their senders dropped): the server shuts down at once.
    let _ = server.stop.send(());
    let stopped = server_rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), server.task).await });
    let mut cell = Cell {
        name: spec.name,
        kind: spec.kind,
        round,
        position,
        requests: 0,
        seconds: end.saturating_duration_since(measure_from).as_secs_f64(),
        p50: Duration::ZERO,
        p99: Duration::ZERO,
        status_200: 0,
        status_429: 0,
        status_other: 0,
        errors: 0,
        first_error: None,
        server_cpu: None,
        client_cpu: None,
        other_cpu: None,
    };
    match stopped {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => {
            cell.errors += 1;
            cell.first_error = Some(format!("the server failed: {e}"));
        }
        Ok(Err(e)) => {
            cell.errors += 1;
            cell.first_error = Some(format!("the server's task failed: {e}"));
        }
        Err(_) => {
            cell.errors += 1;
            cell.first_error = Some("the server did not shut down within 5 s".to_string());
        }
    }
    let mut samples = Vec::new();
    for r in results {
        match r {
            Ok(r) => {
                samples.extend(r.samples);
                cell.status_200 += r.status_200;
                cell.status_429 += r.status_429;
                cell.status_other += r.status_other;
                cell.errors += r.errors;
                if cell.first_error.is_none() {
                    cell.first_error = r.first_error;
                }
            }
            Err(e) => {
                cell.errors += 1;
                cell.first_error.get_or_insert(e);
            }
        }
    }
    samples.sort_unstable();
    cell.requests = samples.len() as u64;
    cell.p50 = Duration::from_nanos(percentile(&samples, 0.50));
    cell.p99 = Duration::from_nanos(percentile(&samples, 0.99));
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        let wall = (deadline - measure_from).as_secs_f64();
        cell.server_cpu = Some((b.server - a.server) / wall);
        cell.client_cpu = Some((b.client - a.client) / wall);
        cell.other_cpu = match (a.machine, b.machine) {
            (Some(m0), Some(m1)) => Some((((m1 - m0) - (b.process - a.process)) / wall).max(0.0)),
            _ => None,
        };
    }
    Ok(cell)
}

fn runtime(name: &'static str, threads: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| format!("building the {name} runtime: {e}"))
}

/// Runs every cell, round-robin, printing each as it ends. Builds its own two runtimes (the
/// server's and the load generator's), so it must not be called from inside a runtime.
pub fn run_all(args: &Args, out: &mut dyn Write) -> Result<Report, String> {
    let server_rt = runtime(SERVER_THREAD, args.server_threads)?;
    let client_rt = runtime(CLIENT_THREAD, args.client_threads)?;
    let mut specs = Vec::new();
    let mut skipped = Vec::new();
    for spec in args.specs() {
        if (spec.build)().is_some() {
            specs.push(spec);
        } else {
            skipped.push(spec.name);
        }
    }
    let cores = cores();
    let load_start = load_average();
    let w = |e: io::Error| e.to_string();
    writeln!(
        out,
        "turnstile http bench: a trivial axum handler (GET / -> \"ok\") on 127.0.0.1, HTTP/1.1\n\
         {cores} cores; server runtime {} worker thread(s), load generator runtime {} (same \
         process); 1-minute load {} at the start\n\
         {} connection(s) ({} client) from {} peer address(es), one request in flight each; \
         {} round(s) of \
         {} cell(s), each {:.2} s warm-up + {:.2} s measured (about {:.0} s)\n\
         allowing cells: {ALLOW_PER_SEC:e}/s burst {ALLOW_BURST} per peer IP (never denies); \
         denying cells: burst {DENY_BURST} per peer IP, one more every {} s",
        args.server_threads,
        args.client_threads,
        fmt_load(load_start),
        args.connections,
        args.client.name(),
        args.peers,
        args.rounds,
        specs.len(),
        args.warmup,
        args.seconds,
        (args.rounds * specs.len()) as f64 * (args.warmup + args.seconds),
        DENY_PERIOD.as_secs(),
    )
    .map_err(w)?;
    for name in &skipped {
        writeln!(
            out,
            "cell {name}: skipped (its function returns None{})",
            if name.starts_with("turnstile") {
                ": turnstile's tower layer is not wired in yet, see turnstile_router() in \
                 bench/examples/http/bench.rs"
            } else {
                ""
            }
        )
        .map_err(w)?;
    }
    writeln!(
        out,
        "\n{:<16} {:>5} {:>10} {:>10} {:>10} {:>9} {:>9} {:>5} {:>6} {:>7} {:>7} {:>7} {:>8} {:>8}",
        "cell",
        "round",
        "req/s",
        "p50",
        "p99",
        "200",
        "429",
        "other",
        "errors",
        "srv cpu",
        "cli cpu",
        "others",
        "srv µs/r",
        "cli µs/r"
    )
    .map_err(w)?;
    let mut cells = Vec::new();
    for round in 0..args.rounds {
        // Each round starts one cell later: no cell always runs first or last.
        for position in 0..specs.len() {
            let spec = &specs[(round + position) % specs.len()];
            let router =
                (spec.build)().ok_or(format!("cell {}: its function returned None", spec.name))?;
            let c = run_cell(spec, router, round, position, args, &server_rt, &client_rt)?;
            let cpu = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
            writeln!(
                out,
                "{:<16} {:>5} {:>10} {:>10} {:>10} {:>9} {:>9} {:>5} {:>6} {:>7} {:>7} {:>7} {:>8} {:>8}",
                c.name,
                c.round + 1,
                thousands(c.rps()),
                fmt_dur(c.p50),
                fmt_dur(c.p99),
                c.status_200,
                c.status_429,
                c.status_other,
                c.errors,
                cpu(c.server_cpu),
                cpu(c.client_cpu),
                cpu(c.other_cpu),
                c.server_us_per_request()
                    .map_or("-".to_string(), |u| format!("{u:.1}")),
                c.client_us_per_request()
                    .map_or("-".to_string(), |u| format!("{u:.1}")),
            )
            .map_err(w)?;
            cells.push(c);
        }
    }
    drop(client_rt);
    drop(server_rt);
    Ok(Report {
        cells,
        skipped,
        args: args.clone(),
        cores,
        load_start,
        load_end: load_average(),
    })
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".to_string(), |x| format!("{:+.1}%", x * 100.0))
}

/// Prints the verdict: per cell its throughput over no_layer's, the overhead against the 5 %
/// target, turnstile over tower_governor, what a good result looks like, the load note and the
/// result line.
pub fn print_verdict(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let summaries = report.summaries();
    writeln!(
        out,
        "\nverdict: each cell's req/s (the mean of its {} round(s)) over no_layer's mean; a \
         layer that allows every request should cost <= {:.0}% (issue #12)\n\
         (round ratios: the lowest and highest of each round's req/s over the same round's \
         no_layer; srv cpu/req: the server's CPU time per request over no_layer's, minus 1)",
        report.args.rounds,
        TARGET_OVERHEAD * 100.0
    )?;
    writeln!(
        out,
        "{:<16} {:>10} {:>10} {:>10} {:>7} {:>9} {:>13} {:>12}  reading",
        "cell", "req/s", "p50", "p99", "ratio", "overhead", "round ratios", "srv cpu/req"
    )?;
    for s in &summaries {
        let errors: u64 = report
            .cells
            .iter()
            .filter(|c| c.name == s.name)
            .map(|c| c.errors)
            .sum();
        let reading = if errors > 0 {
            let first = report.cells.iter().find_map(|c| {
                (c.name == s.name)
                    .then_some(c.first_error.as_deref())
                    .flatten()
            });
            format!(
                "ERRORS: {errors} failed request(s), first: {}",
                first.unwrap_or("?")
            )
        } else {
            let target = TARGET_OVERHEAD * 100.0;
            match (s.kind, s.verdict()) {
                (Kind::Baseline, _) => "the reference".to_string(),
                (Kind::Deny, _) => {
                    "the denial path (429 for almost every request; not judged)".to_string()
                }
                (_, Some("meets")) => {
                    format!("meets the <= {target:.0}% target (in every round)")
                }
                (_, Some("above")) => format!("ABOVE the {target:.0}% target (in every round)"),
                _ => format!(
                    "inconclusive: the rounds straddle {:.2}x (the mean says {}); rerun with \
                     more --rounds",
                    1.0 - TARGET_OVERHEAD,
                    if s.meets_target() == Some(true) {
                        "within"
                    } else {
                        "above"
                    }
                ),
            }
        };
        writeln!(
            out,
            "{:<16} {:>10} {:>10} {:>10} {:>6.3}x {:>9} {:>13} {:>12}  {reading}",
            s.name,
            thousands(s.rps),
            fmt_dur(s.p50),
            fmt_dur(s.p99),
            s.ratio,
            if s.kind == Kind::Baseline {
                "-".to_string()
            } else {
                format!("{:.1}%", s.overhead() * 100.0)
            },
            if s.kind == Kind::Baseline || s.round_ratio_min.is_nan() {
                "-".to_string()
            } else {
                format!("{:.2}-{:.2}", s.round_ratio_min, s.round_ratio_max)
            },
            if s.kind == Kind::Baseline {
                "-".to_string()
            } else {
                pct(s.server_cpu_overhead)
            },
        )?;
    }
    if let Some(d) = report.baseline_drift() {
        writeln!(
            out,
            "no_layer's {} rounds differ by {:.0}% (the machine's drift during the run{})",
            report.args.rounds,
            d * 100.0,
            if d > 0.05 {
                ": more than the 5% target itself, so the overheads are rough; rerun with more \
                 --rounds or --seconds"
            } else {
                ""
            }
        )?;
    }
    let (allow, deny) = report.turnstile_vs_governor();
    match allow {
        Some(r) => writeln!(
            out,
            "turnstile_allow / governor_allow: {r:.3}x req/s ({})",
            if r > 1.0 {
                "turnstile ahead, as issue #12 asks"
            } else {
                "turnstile NOT ahead of tower_governor"
            }
        )?,
        None => writeln!(
            out,
            "turnstile_allow / governor_allow: - (needs both cells; turnstile's is {})",
            if report.skipped.contains(&"turnstile_allow") {
                "not wired in yet: turnstile_router() returns None"
            } else {
                "not in this run"
            }
        )?,
    }
    if let Some(r) = deny {
        writeln!(out, "turnstile_deny / governor_deny: {r:.3}x req/s")?;
    }
    writeln!(
        out,
        "\nwhat a good result looks like:
  - the handler does nothing, so a request's cost is almost all hyper's and axum's HTTP work
    (parsing, routing, writing the response) and the loopback syscalls; a rate-limit layer adds
    a key extraction (ConnectInfo's peer IP), a keyed lookup and an atomic update per request.
    Within 5% of no_layer (ratio >= 0.95x) that is noise next to the HTTP work, which is issue
    #12's target; turnstile_allow should also be above governor_allow (ratio > 1.00x).
  - the server and the load generator share this machine's cores: when they are saturated
    (srv cpu + cli cpu + others near the core count) req/s measures the whole machine, and a
    layer's extra server CPU shows in req/s diluted by the load generator's share. srv cpu/req
    (the server threads' CPU time per request, from /proc, against no_layer's) reads the
    layer's cost without that dilution: a few % at most for a cheap layer. cli cpu next to srv
    cpu says how much of the machine the load generator takes (hyper's client is about as
    expensive per request as its server); more --connections than the server can serve only
    add latency (p50 ~ connections / req/s).
  - governor_deny (and turnstile_deny) answer 429 from the layer without calling the handler:
    their req/s is the denial path's cost and should be at or above no_layer's. A denial that
    costs more than a grant would let a flood of denied requests hurt the service.
  - every connection comes from 127.0.0.1 (one key, contended by all connections) unless
    --peers spreads them over 127.0.0.x.
  - on a shared 2-core machine rounds move by 5-10%: compare the round ratios' spread with the
    overhead before calling a cell above or within the target, and rerun with more --rounds."
    )?;
    match busy_note(report.load_start, report.load_end, report.cores) {
        Some(note) => writeln!(out, "\n{note}")?,
        None => writeln!(
            out,
            "\n1-minute load average {} at the start, {} at the end ({} cores)",
            fmt_load(report.load_start),
            fmt_load(report.load_end),
            report.cores
        )?,
    }
    let judged: Vec<&Summary> = summaries.iter().filter(|s| s.kind == Kind::Allow).collect();
    let meeting = judged
        .iter()
        .filter(|s| s.verdict() == Some("meets"))
        .count();
    let inconclusive = judged
        .iter()
        .filter(|s| s.verdict() == Some("inconclusive"))
        .count();
    if report.errors() > 0 {
        writeln!(
            out,
            "\nresult: FAILED: {} request(s) failed (see the verdict)",
            report.errors()
        )
    } else {
        writeln!(
            out,
            "\nresult: no errors; {meeting} of {} allowing layer cell(s) within {:.0}% of \
             no_layer in every round, {inconclusive} inconclusive{}",
            judged.len(),
            TARGET_OVERHEAD * 100.0,
            if report.skipped.is_empty() {
                String::new()
            } else {
                format!("; skipped: {}", report.skipped.join(", "))
            }
        )
    }
}

/// The run as JSON (schema `turnstile-http-bench/1`).
pub fn to_json(report: &Report) -> String {
    use serde_json::json;
    let a = &report.args;
    let cells: Vec<_> = report
        .cells
        .iter()
        .map(|c| {
            json!({
                "cell": c.name,
                "kind": c.kind.name(),
                "round": c.round,
                "position": c.position,
                "requests": c.requests,
                "seconds": c.seconds,
                "requests_per_sec": c.rps(),
                "p50_ns": c.p50.as_nanos() as u64,
                "p99_ns": c.p99.as_nanos() as u64,
                "status_200": c.status_200,
                "status_429": c.status_429,
                "status_other": c.status_other,
                "errors": c.errors,
                "first_error": c.first_error,
                "server_cpu": c.server_cpu,
                "client_cpu": c.client_cpu,
                "other_cpu": c.other_cpu,
                "server_us_per_request": c.server_us_per_request(),
                "client_us_per_request": c.client_us_per_request(),
            })
        })
        .collect();
    let summary: Vec<_> = report
        .summaries()
        .iter()
        .map(|s| {
            let judged = s.kind != Kind::Baseline;
            json!({
                "cell": s.name,
                "kind": s.kind.name(),
                "rounds": s.rounds,
                "requests_per_sec": s.rps,
                "p50_ns": s.p50.as_nanos() as u64,
                "p99_ns": s.p99.as_nanos() as u64,
                "ratio_to_no_layer": s.ratio,
                "overhead": judged.then(|| s.overhead()),
                "round_ratio_min": (judged && s.round_ratio_min.is_finite()).then_some(s.round_ratio_min),
                "round_ratio_max": (judged && s.round_ratio_max.is_finite()).then_some(s.round_ratio_max),
                "server_us_per_request": s.server_us_per_request,
                "server_cpu_overhead": if judged { s.server_cpu_overhead } else { None },
                "meets_target": s.meets_target(),
                "verdict": s.verdict(),
            })
        })
        .collect();
    let (allow, deny) = report.turnstile_vs_governor();
    let v = json!({
        "schema": SCHEMA,
        "cores": report.cores,
        "server_threads": a.server_threads,
        "client_threads": a.client_threads,
        "client": a.client.name(),
        "connections": a.connections,
        "peers": a.peers,
        "rounds": a.rounds,
        "seconds_per_cell": a.seconds,
        "warmup_per_cell": a.warmup,
        "load_average_1m_start": report.load_start,
        "load_average_1m_end": report.load_end,
        "target_overhead": TARGET_OVERHEAD,
        "allow_per_sec": ALLOW_PER_SEC,
        "allow_burst": ALLOW_BURST,
        "deny_period_secs": DENY_PERIOD.as_secs(),
        "deny_burst": DENY_BURST,
        "skipped": report.skipped,
        "no_layer_drift": report.baseline_drift(),
        "turnstile_vs_governor_allow": allow,
        "turnstile_vs_governor_deny": deny,
        "summary": summary,
        "cells": cells,
    });
    let mut s = serde_json::to_string_pretty(&v).expect("a JSON value serializes");
    s.push('\n');
    s
}
