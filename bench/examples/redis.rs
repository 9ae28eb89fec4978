//! turnstile's Redis limiters against the physical limit: checks per second and p50/p99
//! latency on one multiplexed connection, against a plain `PING` on the same connection in the
//! same run (issue #11's benchmark).
//!
//! ```text
//! cargo run --release -p turnstile-bench --example redis
//! cargo run --release -p turnstile-bench --example redis -- --seconds 1 --tasks 1,4,16
//! cargo run --release -p turnstile-bench --example redis -- --url redis://127.0.0.1:6380/
//! cargo run --release -p turnstile-bench --example redis -- --json redis-bench.json
//! ```
//!
//! Without `--url` the example starts its own `redis-server` on a free loopback port (never
//! 6379) with `--save "" --appendonly no` in a temporary directory, and kills it when it ends,
//! also on an error or a panic (the handle kills it on drop; Ctrl-C reaches it too, as it
//! is in the same process group). Without `redis-server` on the `PATH` it says how to install
//! it and exits 2. With `--url` it writes keys under `turnstile:bench:*` on that server.
//!
//! Every cell runs on one redis-rs `ConnectionManager` (one multiplexed connection) for
//! `--seconds` (default 1.05 s, about 27 s in all with the alternating rounds), at each concurrency of `--tasks` (default 1
//! and 16 tokio tasks, on a multi-thread runtime): `PING`; `EVALSHA` of a script that only returns 1 (a
//! reference: the scripting engine's own cost, the floor of any one-script-per-check limiter);
//! `Gcra::throttle` on one hot key; `MultiGcra::throttle` with two limits on one hot key;
//! `Gcra::throttle` on random keys (`--keys`, default 10 000);
//! `Fallback<Gcra>::check` on a hot key, in Redis mode (the wrapper's overhead);
//! `Coalesce<Gcra>::try_check_n` on a hot key (concurrent checks share a script call);
//! `redis::TokenBucket` and `redis::FixedWindow` (go-zero's scripts) on a hot key; then `PING`
//! again, so that the machine's drift shows. Every call is timed with `std::time::Instant`;
//! p50 and p99 come from the sorted samples. The limit is so high that every check is granted,
//! i.e. runs the script's writing path (`SET ... PX`). Each cell also gives the server's own
//! time per call of its command and how busy that kept the server (`INFO commandstats` read
//! before and after the cell).
//!
//! The verdict gives each limiter cell's throughput over PING's at the same concurrency (the
//! mean of PING's two runs) against issue #11's target of 0.8, and what a good result looks
//! like, and each cell's checks per round trip (its checks over the server's count of its
//! command's calls): 1 everywhere but the coalesced cell; and the two-limit `MultiGcra`
//! cell's ratio over the single-limit `Gcra` cell's against issue #23's target of 0.8, the
//! median of six short rounds that alternate the two after each level's cells (so both see
//! the same machine). The machinery is in `bench/examples/redis/bench.rs`, which
//! `tests/redis/example_smoke.rs` also runs (briefly).
//!
//! `--fault stall` runs, instead of the cells, a stalled server: tasks (the largest `--tasks`
//! count per limiter, each checking once a millisecond) check through `Fallback<Gcra>` (its
//! default 100 ms timeout) and the bare `Gcra` (its connection's default 250 ms response
//! timeout) for `--seconds`, then while the example's own server is stopped (SIGSTOP) for
//! `--stall` seconds (default 3), then `--seconds` more after SIGCONT. Per limiter and phase
//! (before, stall, after) it prints the checks, the answered ones, p50/p99/max latency,
//! answers by kind (Redis allowed/denied, fallback allowed/denied, errors), and when the
//! fallback switched over and back (`bench/examples/redis/stall.rs`; `--json` schema
//! `turnstile-redis-stall/1`). Exit status 1 if the `Fallback` failed a check, gave no answer in
//! process during the stall or none from Redis after it. Never with `--url`.
//!
//! ```text
//! cargo run --release -p turnstile-bench --example redis -- --fault stall --stall 3 --seconds 2 --tasks 4
//! ```
//!
//! `--json FILE` writes every cell (schema `turnstile-redis-bench/2`: `cell`, `tasks`, `round`,
//! `ops`, `seconds`, `ops_per_sec`, `p50_ns`, `p99_ns`, `granted`, `denied`, `errors`,
//! `first_error`, `ratio_to_ping`, `p50_ratio_to_ping`, `server_us_per_call`, `server_busy`,
//! `server_calls`, `checks_per_call`).
//!
//! Exit status: 0; 1 if any call failed; 2 on a usage error, no `redis-server`, no connection
//! or an output file that cannot be written.

use std::io::Write;
use std::process::{Command, ExitCode};

#[path = "redis/bench.rs"]
mod bench;
#[path = "redis/server.rs"]
mod server;

use server::start_server;

/// The example's name in its messages.
const WHO: &str = "redis example";

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

    let (_server, url, what) = match &args.url {
        Some(url) => (None, url.clone(), format!("server {url}")),
        None => match start_server() {
            Ok(Some(s)) => {
                let url = format!("redis://127.0.0.1:{}/", s.port);
                let what = format!("own redis-server on 127.0.0.1:{} (no persistence)", s.port);
                (Some(s), url, what)
            }
            Ok(None) => {
                eprintln!(
                    "{WHO}: redis-server is not installed. Install it (Debian/Ubuntu: \
                     `apt-get install -y redis-server`, macOS: `brew install redis`), or pass \
                     --url redis://HOST:PORT/ to use a running server."
                );
                return ExitCode::from(2);
            }
            Err(e) => {
                eprintln!("{WHO}: {e}");
                return ExitCode::from(2);
            }
        },
    };

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{WHO}: building the tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let mut out = std::io::stdout().lock();
    if args.fault == Some(bench::Fault::Stall) {
        // `parse_args` refuses `--fault` with `--url`: the server is the example's own.
        let Some(server) = &_server else {
            return ExitCode::from(2);
        };
        let pid = server.child.id().to_string();
        let signal = |s: bench::stall::Signal| {
            let sig = match s {
                bench::stall::Signal::Stop => "-STOP",
                bench::stall::Signal::Continue => "-CONT",
            };
            match Command::new("kill").args([sig, &pid]).status() {
                Ok(st) if st.success() => Ok(()),
                Ok(st) => Err(format!("kill {sig} {pid}: {st}")),
                Err(e) => Err(format!("kill {sig} {pid}: {e}")),
            }
        };
        let report = match runtime.block_on(bench::stall::run_stall(
            &args, &url, &what, &signal, &mut out,
        )) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{WHO}: {e}");
                return ExitCode::from(2);
            }
        };
        let _ = out.flush();
        drop(out);
        drop(runtime);
        if let Err(code) =
            bench::report::write_json(WHO, args.json.as_deref(), json_file.as_mut(), || {
                bench::stall::stall_json(&report)
            })
        {
            return code;
        }
        return if report.fallback_held() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    let report = match runtime.block_on(bench::run_all(&args, &url, &what, cores, &mut out)) {
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
    // The connection's tasks go with the runtime, before the server goes (on `_server`'s drop).
    drop(runtime);

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
