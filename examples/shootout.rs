//! The shootout: every limiter hammered by threads on one shared instance, through the
//! crate-wide [`turnstile::Limiter`] trait and the real clock, at every thread count of a sweep,
//! ending with a verdict.
//!
//! ```text
//! cargo run --release --example shootout
//! cargo run --release --example shootout -- --threads 1,2,4,8 --seconds 1 --json out.json
//! cargo run --release --example shootout -- --runs 3
//! cargo run --release --example shootout --features plot -- --plot shootout.svg
//! cargo run --release --example shootout -- --help
//! ```
//!
//! `--threads` defaults to 1, 2, 4, ... below the core count, then the core count
//! (`std::thread::available_parallelism`). A *cell* is one limiter implementation (or floor) at
//! one thread count in one run; a sweep runs 28 cells per thread count, and `--seconds` (seconds
//! per cell) defaults to whatever keeps the whole run at about 48 s (0.85 s per cell on 2 cores),
//! between 0.1 s and 1.5 s. The run prints its expected length when it starts.
//!
//! `--runs N` (default 1) runs every cell N times, alternating: at each thread count, round 1
//! runs every implementation of a limiter once, one after the other, then round 2, and so on
//! (rather than N repetitions of one implementation back to back), so a drift in the machine's
//! load hits every implementation alike. The default `--seconds` divides by N too, so the whole
//! run still takes about 48 s (0.25 s per cell with `--runs 3` on 2 cores). The verdict divides
//! each run's turnstile cell by the other's cell of the same run and gives each ratio as the
//! median (min-max) over the runs; its reading judges the median.
//!
//! Phase 1 uses a realistic limit (default 1,000,000/s, burst 1000) so that both grants and
//! denials happen, and checks the promise every limiter makes: over a window of `elapsed`, the
//! grants never exceed `burst + limit × elapsed` (the *budget*; turnstile's deviation D2 allows
//! one request more). `elapsed` is read on the limiter's own clock, before the threads start
//! and after they have all stopped, so it covers every check. Phase 2 uses a limiter that
//! always allows (a finite but huge limit: every check still commits its write) to show raw
//! throughput.
//!
//! Contenders: turnstile's lock-free [`turnstile::TokenBucket`], its mutex twin
//! [`turnstile::reference::TokenBucket`] (a literal port of Go's rate.go), and governor's direct
//! limiter (a dev-dependency only) behind a small adapter. Phase 3 runs every other algorithm
//! (uber's leaky bucket, Guava's SmoothBursty and SmoothWarmingUp, go-zero's fixed window, the
//! sliding window, the water-level meter) against its own mutex twin at the phase-1 rate, each
//! checked against its own budget. Phase 4 runs `Keyed` (a token bucket per key) and
//! `KeyedTokenBucket` (one word per key, inline) against governor's keyed limiter, on 10 000
//! clients picked at random and on one hot client, and checks every key's budget.
//!
//! *Floors* are no limiter: the least any check can cost, hammered by the same machinery in the
//! same run, beside the limiters. Phase 1 has two: `floor` (the refusal floor: one read of
//! turnstile's `QuantaClock`, the clock every turnstile limiter reads, and one load of a shared
//! cache-padded word; it refuses every check) and `floor_cas` (the grant floor: the same and one
//! compare-and-swap of the word, granting when it wins). Phase 3's limiters are set against
//! phase 1's floors. Phase 4 has `floor` per workload: a clock read, a SipHash of the key
//! (std's default `RandomState`, as governor's and turnstile's keyed maps use) and one load of
//! a cache-padded word the hash picks out of a table with as many words as the workload has
//! keys (10 000: one likely cache miss per check; 1 for the hot client), and for the random
//! clients `floor_indirect`, the same with each word behind a pointer (two dependent loads: the
//! least a map whose limiters never move, `Keyed`, can cost). Floors have no budget,
//! never count in `turnstile_budgets_held` or `budgets`, and their verdict lines (turnstile's
//! ops/s over the floor's) are for information, never judged.
//!
//! The verdict gives, per turnstile limiter, its ops/s over its mutex twin's, over governor's
//! and over the floors' at each thread count, whether its budget held at each, and what a good
//! result looks like. The machinery lives in `examples/shootout/harness.rs`, which
//! `tests/api/shootout_smoke.rs` also runs (briefly).
//!
//! `--json FILE` (or `--json -` for stdout, the report then going to stderr) writes:
//!
//! ```text
//! {
//!   "schema": "turnstile-shootout/1",
//!   "cores": 2, "load_average_1m": 1.93, "threads": [1, 2], "seconds_per_cell": 0.85,
//!   "runs": 1, "limit": 1000000, "burst": 1000,
//!   "turnstile_budgets_held": true,
//!   "cells": [
//!     {"phase": 1, "limiter": "token_bucket", "implementation": "turnstile", "threads": 1,
//!      "run": 1, "ops": 41000000, "seconds": 1.0001, "ops_per_sec": 40996000.2, "ns_per_op": 24.4,
//!      "granted": 1001000, "denied": 39999000,
//!      "budget": 1001000.3, "budget_scope": "limiter", "granted_against_budget": 1001000,
//!      "held": true, "keys": null},
//!     {"phase": 1, "limiter": "token_bucket", "implementation": "floor", "threads": 1,
//!      "run": 1, "ops": 52000000, "seconds": 1.0001, "ops_per_sec": 51994800.5,
//!      "ns_per_op": 19.2, "granted": 0, "denied": 52000000, "budget": null,
//!      "budget_scope": null, "granted_against_budget": null, "held": null, "keys": null},
//!     ...
//!   ],
//!   "verdict": [
//!     {"limiter": "token_bucket", "implementation": "turnstile", "against": "mutex_twin",
//!      "ops_per_sec_ratios": [{"threads": 1, "ratio": 1.02, "min": 1.02, "max": 1.02, "runs": 1},
//!                             {"threads": 2, "ratio": 3.1, "min": 3.1, "max": 3.1, "runs": 1}],
//!      "reading": "on par at 1 thread, ahead at 2 threads: as expected"},
//!     {"limiter": "token_bucket", "implementation": "turnstile", "against": "floor",
//!      "ops_per_sec_ratios": [...],
//!      "reading": "79% of the floor's ops/s at 1 thread, 83% at 2 threads: for information"},
//!     ...
//!   ],
//!   "budgets": [
//!     {"limiter": "token_bucket", "implementation": "turnstile",
//!      "held_at_every_thread_count": true},
//!     ...
//!   ]
//! }
//! ```
//!
//! `implementation` is `turnstile`, `turnstile_inline` (keyed phase), `mutex_twin`, `governor`,
//! or for a floor cell `floor` (clock + load, and in phase 4 + SipHash), `floor_cas` (clock +
//! load + compare-and-swap) or `floor_indirect` (phase 4: clock + SipHash + two dependent loads); `ns_per_op` is per thread (wall time × threads / ops). `run` counts
//! the `--runs` repetitions from 1: with `--runs N` every (limiter, implementation, threads) has
//! N cells. Phase 2 cells and floor cells have no budget: `budget`, `budget_scope`,
//! `granted_against_budget` and `held` are `null` (and `keys` for keyed floors). In `verdict`,
//! `ratio` is the median over the runs of each run's turnstile ops/s over the other's in the
//! same run, `min` and `max` the extremes, `runs` how many runs paired up. Keyed
//! cells (phase 4) check the key granted the most (`budget_scope` `worst_key`) against the
//! per-key budget and give the keys left in the map (`keys`). `held` is `granted_against_budget
//! <= budget + 1` (the one request of D2). `load_average_1m` is read from `/proc/loadavg` when
//! the run ends (`null` elsewhere); above the core count + 0.5 the verdict warns that other work
//! shared the cores.
//!
//! Exit status: 0; 1 if any turnstile limiter grants more than its budget (plus one request) at
//! any thread count; 2 on a usage error, `--plot` without the `plot` feature, or an output file
//! that cannot be written.

use std::io::Write;
use std::process::ExitCode;

#[path = "shootout/harness.rs"]
mod harness;
#[cfg(feature = "plot")]
#[path = "shootout/plot.rs"]
mod plot;

use harness::JsonTo;

fn main() -> ExitCode {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let args = match harness::parse_args(std::env::args().skip(1), cores) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{}", harness::usage(cores));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("shootout: {e}\n\n{}", harness::usage(cores));
            return ExitCode::from(2);
        }
    };
    if args.plot.is_some() && !cfg!(feature = "plot") {
        eprintln!(
            "shootout: --plot needs the `plot` feature (plotters, SVG only):\n  \
             cargo run --release --example shootout --features plot -- --plot shootout.svg"
        );
        return ExitCode::from(2);
    }
    // Open the output files before the run, so a bad path fails now, not after a minute.
    let mut json_file = match &args.json {
        Some(JsonTo::File(path)) => match std::fs::File::create(path) {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("shootout: --json {path}: {e}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    if let Some(path) = &args.plot {
        if let Err(e) = std::fs::File::create(path) {
            eprintln!("shootout: --plot {path}: {e}");
            return ExitCode::from(2);
        }
    }

    // With `--json -` stdout carries the JSON alone; the report goes to stderr.
    let mut out: Box<dyn Write> = if args.json == Some(JsonTo::Stdout) {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    let report = match harness::run_all(&args, &mut out)
        .and_then(|r| harness::print_verdict(&r, &mut out).map(|()| r))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("shootout: writing the report: {e}");
            return ExitCode::from(2);
        }
    };
    let _ = out.flush();
    drop(out);

    let mut status = ExitCode::SUCCESS;
    if let Some(to) = &args.json {
        let json = harness::to_json(&args, &report);
        let written = match (to, json_file.as_mut()) {
            (JsonTo::File(_), Some(f)) => f.write_all(json.as_bytes()),
            _ => std::io::stdout().lock().write_all(json.as_bytes()),
        };
        match (written, to) {
            (Err(e), _) => {
                eprintln!("shootout: writing the JSON: {e}");
                status = ExitCode::from(2);
            }
            (Ok(()), JsonTo::File(path)) => eprintln!("shootout: wrote {path}"),
            (Ok(()), JsonTo::Stdout) => {}
        }
    }
    #[cfg(feature = "plot")]
    if let Some(path) = &args.plot {
        let title = format!(
            "turnstile shootout: ops/s against threads ({} cores, {:.2} s per cell)",
            report.cores, args.seconds
        );
        match plot::plot(std::path::Path::new(path), &report, &title) {
            Ok(()) => eprintln!("shootout: wrote {path}"),
            Err(e) => {
                eprintln!("shootout: --plot {e}");
                status = ExitCode::from(2);
            }
        }
    }

    if !report.turnstile_held() {
        eprintln!("\nshootout: a turnstile limiter granted more than its budget");
        return ExitCode::FAILURE;
    }
    status
}
