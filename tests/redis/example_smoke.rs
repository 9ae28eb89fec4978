//! The Redis example's machinery (`bench/examples/redis/bench.rs`, included here as a module) run
//! briefly against a redis-server of the test's own: its command line and defaults, every cell
//! at 1 and 16 tasks for 0.05 s, the verdict and the JSON; and its fault phase
//! (`--fault stall`, `bench/examples/redis/stall.rs`) with a stall of 0.6 s. It asserts structure
//! (every cell ran, no call failed; the fallback answered through the stall), never timings
//! beyond a deadline plus a loaded machine's slack. Skipped loudly without redis-server, unless
//! `TURNSTILE_REQUIRE_REDIS=1`.
#![cfg(feature = "redis")]

use crate::common;

#[allow(dead_code)]
#[path = "../../bench/examples/redis/bench.rs"]
mod bench;

use bench::{parse_args, Op};
use common::redis_server::RedisServer;

fn parse(args: &[&str]) -> Result<bench::Args, String> {
    parse_args(args.iter().map(|s| s.to_string()))
}

#[test]
fn default_run_stays_under_30_seconds() {
    let a = parse(&[]).unwrap();
    assert_eq!(a.tasks, [1, 16]);
    assert_eq!(a.url, None);
    assert_eq!(a.keys, 10_000);
    assert!(a.expected_seconds() < 28.0, "{} s", a.expected_seconds());
}

#[test]
fn flags_parse() {
    let a = parse(&[
        "--tasks",
        "16,1,16",
        "--seconds",
        "0.5",
        "--keys",
        "7",
        "--url",
        "redis://127.0.0.1:7000/",
        "--json",
        "out.json",
    ])
    .unwrap();
    assert_eq!(a.tasks, [16, 1]);
    assert_eq!(a.seconds, 0.5);
    assert_eq!(a.keys, 7);
    assert_eq!(a.url.as_deref(), Some("redis://127.0.0.1:7000/"));
    assert_eq!(a.json.as_deref(), Some("out.json"));
    assert_eq!(a.fault, None);
    let a = parse(&["--fault", "stall", "--stall", "2.5"]).unwrap();
    assert_eq!(a.fault, Some(bench::Fault::Stall));
    assert_eq!(a.stall, 2.5);
    assert_eq!(parse(&["--help"]).unwrap_err(), "");
    for bad in [
        &["--tasks", "0"][..],
        &["--tasks", "x"],
        &["--seconds", "0"],
        &["--seconds", "nan"],
        &["--keys", "0"],
        &["--seconds"],
        &["--bogus"],
        &["--fault", "crash"],
        &["--stall", "0"],
        &["--fault", "stall", "--url", "redis://127.0.0.1:7000/"],
    ] {
        let e = parse(bad).unwrap_err();
        assert!(!e.is_empty(), "{bad:?}");
    }
}

#[test]
fn percentiles_are_nearest_rank() {
    let v: Vec<u64> = (1..=100).collect();
    assert_eq!(bench::percentile(&v, 0.50), 50);
    assert_eq!(bench::percentile(&v, 0.99), 99);
    assert_eq!(bench::percentile(&[7], 0.99), 7);
    assert_eq!(bench::percentile(&[], 0.5), 0);
    assert_eq!(bench::thousands(1234567.4), "1,234,567");
    assert_eq!(bench::thousands(999.0), "999");
}

#[test]
fn every_cell_runs_against_a_real_server() {
    let Some(server) = RedisServer::start("redis_example_smoke") else {
        return;
    };
    let args = parse(&["--seconds", "0.05", "--tasks", "1,16", "--keys", "100"]).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut out = Vec::new();
    let report = runtime
        .block_on(bench::run_all(
            &args,
            &server.url(),
            "the smoke test's server",
            2,
            &mut out,
        ))
        .unwrap();
    bench::print_verdict(&report, &mut out).unwrap();
    drop(runtime);
    let text = String::from_utf8(out).unwrap();

    assert_eq!(report.cells.len(), args.cells(), "{text}");
    for &tasks in &args.tasks {
        for op in Op::CHECKS.into_iter().chain([Op::ScriptNoop]) {
            let n = report
                .cells
                .iter()
                .filter(|c| c.op == op && c.tasks == tasks && c.round == 0)
                .count();
            assert_eq!(n, 1, "{} at {tasks} tasks\n{text}", op.name());
        }
        let pings: Vec<usize> = report
            .cells
            .iter()
            .filter(|c| c.op == Op::Ping && c.tasks == tasks)
            .map(|c| c.round)
            .collect();
        assert_eq!(pings, [0, 1], "PING before and after, at {tasks} tasks");
        // The alternating rounds of the two-limit cell and the one-limit one: a ratio each.
        let rounds = report.multi_over_single_rounds(tasks);
        assert_eq!(rounds.len(), bench::PAIR_ROUNDS, "{text}");
        assert!(
            rounds.iter().all(|r| r.is_finite() && *r > 0.0),
            "{rounds:?}"
        );
        assert!(report.ping_ops_per_sec(tasks).unwrap() > 0.0);
    }
    for c in &report.cells {
        assert_eq!(
            c.errors,
            0,
            "{} at {} tasks: {:?}\n{text}",
            c.op.name(),
            c.tasks,
            c.first_error
        );
        assert!(
            c.ops > 0,
            "{} at {} tasks ran no call",
            c.op.name(),
            c.tasks
        );
        // The limit is far above any rate reached: every check is granted.
        assert_eq!(c.denied, 0, "{} at {} tasks", c.op.name(), c.tasks);
        assert!(c.p50 <= c.p99);
        if c.op != Op::Ping {
            assert!(report.ratio(c).is_some());
            assert!(report.p50_ratio(c).is_some());
            // The server counted one script call per check, except where checks coalesce.
            let per_call = c.checks_per_call().expect("the server's call count");
            if c.op == Op::CoalescedHot {
                assert!(per_call >= 1.0, "{per_call}");
            } else {
                assert_eq!(per_call, 1.0, "{} at {} tasks", c.op.name(), c.tasks);
            }
        }
    }
    assert!(text.contains("verdict:"), "{text}");
    assert!(text.contains("what a good result looks like"), "{text}");
    assert!(text.contains("checks/trip"), "{text}");
    assert!(text.contains("result: no errors"), "{text}");
    for op in Op::CHECKS.into_iter().chain([Op::ScriptNoop]) {
        assert!(text.contains(op.name()), "{} missing\n{text}", op.name());
    }

    let json: serde_json::Value = serde_json::from_str(&bench::to_json(&report)).unwrap();
    assert_eq!(json["schema"], "turnstile-redis-bench/2");
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), report.cells.len());
    for c in cells {
        assert_eq!(c["errors"], 0);
        assert!(c["ops_per_sec"].as_f64().unwrap() > 0.0);
        assert!(c["checks_per_call"].as_f64().unwrap() >= 1.0);
        if c["cell"] == "ping" {
            assert!(c["ratio_to_ping"].is_null());
        } else {
            assert!(c["ratio_to_ping"].as_f64().unwrap() > 0.0);
        }
    }
}

#[test]
fn stall_phase_against_a_real_server() {
    use bench::stall::{Signal, BARE, FALLBACK, PHASES};

    let Some(server) = RedisServer::start("redis_example_smoke_stall") else {
        return;
    };
    let args = parse(&[
        "--fault",
        "stall",
        "--seconds",
        "0.5",
        "--stall",
        "0.6",
        "--tasks",
        "2",
    ])
    .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let signal = |s: Signal| {
        match s {
            Signal::Stop => server.pause(),
            Signal::Continue => server.resume(),
        }
        Ok(())
    };
    let mut out = Vec::new();
    let report = runtime
        .block_on(bench::stall::run_stall(
            &args,
            &server.url(),
            "the smoke test's server",
            &signal,
            &mut out,
        ))
        .unwrap();
    drop(runtime);
    let text = String::from_utf8(out).unwrap();

    assert_eq!(report.phases.len(), 6, "{text}");
    assert!(report.fallback_held(), "{text}");
    assert!(
        text.contains("result: fallback_gcra answered every check"),
        "{text}"
    );
    // A second of slack over each deadline: a loaded machine, not a hang. The deadlines are
    // the defaults the run uses: `Fallback`'s timeout and `connect`'s response timeout.
    let slack = std::time::Duration::from_secs(1);
    let fallback_timeout = std::time::Duration::from_millis(100);
    let response_timeout = std::time::Duration::from_millis(250);
    for phase in PHASES {
        let f = report.phase(FALLBACK, phase).unwrap();
        assert!(f.checks > 0 && f.errors == 0, "{phase}\n{text}");
        assert!(f.max <= fallback_timeout + slack, "{phase}\n{text}");
        let g = report.phase(BARE, phase).unwrap();
        assert!(g.max <= response_timeout + slack, "{phase}\n{text}");
    }
    let stall = report.phase(FALLBACK, "stall").unwrap();
    assert!(stall.fallback_allowed > 0, "{text}");
    assert!(report.phase(BARE, "stall").unwrap().errors > 0, "{text}");
    assert!(
        report.phase(BARE, "after").unwrap().answered() > 0,
        "{text}"
    );

    let json: serde_json::Value = serde_json::from_str(&bench::stall::stall_json(&report)).unwrap();
    assert_eq!(json["schema"], "turnstile-redis-stall/1");
    assert_eq!(json["phases"].as_array().unwrap().len(), 6);
    assert_eq!(json["fallback_held"], true);
}
