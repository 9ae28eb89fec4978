//! The cost of a rate-limit layer in an HTTP server: requests per second and p50/p99 latency
//! of a trivial axum handler on loopback without a layer, behind `tower_governor`'s layer and
//! behind turnstile's, in one run (issue #12's benchmark).
//!
//! ```text
//! cargo run --release -p turnstile-bench --example http
//! cargo run --release -p turnstile-bench --example http -- --rounds 5 --seconds 4
//! cargo run --release -p turnstile-bench --example http -- --connections 64 --peers 16 --client raw
//! cargo run --release -p turnstile-bench --example http -- --cells governor_allow --json http-bench.json
//! ```
//!
//! Each cell serves `GET /` → `ok` with `axum::serve` on 127.0.0.1 (port 0), through
//! `into_make_service_with_connect_info::<SocketAddr>()` (the layers key on the peer IP from
//! `ConnectInfo`), on a tokio multi-thread runtime of its own (`--server-threads`, default one
//! per core). A fresh server (and so a fresh limiter) serves every cell run. The load
//! generator runs in the same process on a second runtime (`--client-threads`, default one
//! per core): `--connections` (default 32) keep-alive HTTP/1.1 connections, each a hyper
//! `client::conn::http1` handshake over a `TcpStream` (no pool, no `Client`), each sending
//! requests back to back, one in flight, for a warm-up (`--warmup`, default 0.3 s, not
//! measured) and then `--seconds` (default 2.5 s). Every request is timed with
//! `std::time::Instant` from sending it to reading the end of its body; p50 and p99 come from
//! the sorted samples. `--client raw` swaps hyper's client for a minimal one (fixed request
//! bytes, the response cut at `Content-Length`, no task per connection): about 15% less client
//! CPU per request here, most of a request's cost on either side being syscalls and the
//! runtime's scheduling. `--peers N` spreads the connections over the source addresses
//! 127.0.0.1..127.0.0.N (Linux routes all of 127/8 to loopback), i.e. over N keys.
//!
//! The cells: `no_layer` (the reference); `governor_allow` (tower_governor's `GovernorLayer`
//! keyed by peer IP, 1e6/s with a burst of 1e7, never denying: the layer's overhead); `turnstile_allow` (the same
//! with turnstile's layer, `turnstile_router()` in `bench/examples/http/bench.rs`, skipped while it
//! returns `None`); `governor_deny` and `turnstile_deny` (a burst of 1 per peer replenished
//! hourly: 429 for all but the first request, the denial path's cost). They run round-robin,
//! `--rounds` times (default 3, about 25 s with three cells, 42 s with five), each round
//! starting one cell later, so the machine's drift shows in no_layer's rounds rather than
//! biasing one cell. Each cell also gives the CPU the server's threads, the load generator's
//! threads and the rest of the machine used during its window (from `/proc`, on Linux).
//!
//! The verdict gives each cell's throughput over no_layer's mean, the overhead against issue
//! #12's target of at most 5% (meets or above only when every round's own ratio to its
//! no_layer agrees, else inconclusive), the spread of the per-round ratios, the server's CPU time per
//! request against no_layer's, turnstile over tower_governor where both ran, and what a good
//! result looks like. The machinery is in `bench/examples/http/bench.rs`, which
//! `tests/tower/http_example_smoke.rs` also runs (briefly).
//!
//! `--json FILE` writes the run (schema `turnstile-http-bench/1`): the settings, the load
//! averages, `summary` (per cell: `requests_per_sec`, `p50_ns`, `p99_ns`, `ratio_to_no_layer`,
//! `overhead`, `round_ratio_min`/`max`, `server_us_per_request`, `server_cpu_overhead`,
//! `meets_target` by the mean, `verdict`: meets, above or inconclusive by the rounds), `turnstile_vs_governor_allow`/`deny`, and `cells` (every cell run:
//! `cell`, `kind`, `round`, `requests`, `seconds`, `requests_per_sec`, `p50_ns`, `p99_ns`,
//! `status_200`, `status_429`, `status_other`, `errors`, `first_error`, `server_cpu`,
//! `client_cpu`, `other_cpu`, `server_us_per_request`, `client_us_per_request`).
//!
//! Exit status: 0; 1 if any request failed; 2 on a usage error, a server that cannot start or
//! an output file that cannot be written.

use std::io::Write;
use std::process::ExitCode;

#[path = "http/bench.rs"]
mod bench;

/// The example's name in its messages.
const WHO: &str = "http example";

fn main() -> ExitCode {
    let args = match bench::report::args_or_exit(
        bench::parse_args(std::env::args().skip(1)),
        WHO,
        bench::usage,
    ) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let mut json_file = match bench::report::create_json(WHO, args.json.as_deref()) {
        Ok(f) => f,
        Err(code) => return code,
    };

    let mut out = std::io::stdout().lock();
    let report = match bench::run_all(&args, &mut out) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{WHO}: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = bench::print_verdict(&report, &mut out) {
        eprintln!("{WHO}: writing the report: {e}");
        return ExitCode::from(2);
    }
    let _ = out.flush();
    drop(out);

    if let Err(code) =
        bench::report::write_json(WHO, args.json.as_deref(), json_file.as_mut(), || {
            bench::to_json(&report)
        })
    {
        return code;
    }
    if report.errors() > 0 {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
