//! The HTTP example's machinery (`bench/examples/http/bench.rs`, included here as a module) run
//! briefly: its command line and defaults, every available cell for two short rounds, the
//! verdict and the JSON. It asserts structure (every cell ran in every round, no request
//! failed, the allowing cells got only 200s, the denying cells 429s), never timings.

#![cfg(all(feature = "tower", feature = "axum"))]

#[allow(dead_code)]
#[path = "../../bench/examples/http/bench.rs"]
mod bench;

use bench::{parse_args, Kind, CELLS};

fn parse(args: &[&str]) -> Result<bench::Args, String> {
    parse_args(args.iter().map(|s| s.to_string()))
}

#[test]
fn default_run_stays_under_60_seconds() {
    let a = parse(&[]).unwrap();
    assert_eq!(a.connections, 32);
    assert_eq!(a.peers, 1);
    assert_eq!(a.rounds, 3);
    assert_eq!(a.json, None);
    assert_eq!(a.client, bench::ClientKind::Hyper);
    assert_eq!(a.cells.len(), CELLS.len(), "every cell by default");
    // With every cell available (the turnstile ones included), start-up aside.
    assert!(a.expected_seconds() < 50.0, "{} s", a.expected_seconds());
    assert!(bench::usage().contains("--connections"));
}

#[test]
fn flags_parse() {
    let a = parse(&[
        "--seconds",
        "0.5",
        "--warmup",
        "0",
        "--rounds",
        "2",
        "--connections",
        "8",
        "--peers",
        "4",
        "--server-threads",
        "1",
        "--client-threads",
        "3",
        "--client",
        "raw",
        "--cells",
        "governor_deny,governor_allow,governor_deny",
        "--json",
        "out.json",
    ])
    .unwrap();
    assert_eq!(a.seconds, 0.5);
    assert_eq!(a.warmup, 0.0);
    assert_eq!(a.rounds, 2);
    assert_eq!(a.connections, 8);
    assert_eq!(a.peers, 4);
    assert_eq!((a.server_threads, a.client_threads), (1, 3));
    assert_eq!(a.client, bench::ClientKind::Raw);
    // no_layer always runs; the cells keep the harness's order.
    assert_eq!(a.cells, ["no_layer", "governor_deny", "governor_allow"]);
    let names: Vec<&str> = a.specs().iter().map(|c| c.name).collect();
    assert_eq!(names, ["no_layer", "governor_allow", "governor_deny"]);
    assert_eq!(a.json.as_deref(), Some("out.json"));
    assert_eq!(parse(&["--help"]).unwrap_err(), "");
    for bad in [
        &["--seconds", "0"][..],
        &["--seconds", "nan"],
        &["--warmup", "-1"],
        &["--rounds", "0"],
        &["--connections", "x"],
        &["--peers", "255"],
        &["--server-threads", "0"],
        &["--cells", "nginx"],
        &["--client", "curl"],
        &["--seconds"],
        &["--bogus"],
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
}

#[test]
fn raw_client_reads_a_response_head() {
    assert_eq!(
        bench::parse_head(b"HTTP/1.1 200 OK\r\ncontent-le"),
        Ok(None)
    );
    let ok = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nContent-Length: 2\r\n\r\nok";
    assert_eq!(bench::parse_head(ok), Ok(Some((200, ok.len()))));
    let denied = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 33\r\n\r\n";
    assert_eq!(
        bench::parse_head(denied),
        Ok(Some((429, denied.len() + 33)))
    );
    assert!(bench::parse_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
    assert!(bench::parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
    assert!(bench::parse_head(b"SSH-2.0\r\n\r\n").is_err());
}

#[test]
fn raw_client_runs_the_governor_cells() {
    let args = parse(&[
        "--seconds",
        "0.1",
        "--warmup",
        "0.05",
        "--rounds",
        "1",
        "--connections",
        "2",
        "--server-threads",
        "1",
        "--client-threads",
        "1",
        "--client",
        "raw",
        "--cells",
        "governor_allow,governor_deny",
    ])
    .unwrap();
    let mut out = Vec::new();
    let report = bench::run_all(&args, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(report.cells.len(), 3, "{text}");
    for c in &report.cells {
        assert_eq!(c.errors, 0, "{}: {:?}\n{text}", c.name, c.first_error);
        assert!(c.requests > 0, "{}", c.name);
        assert_eq!(c.status_other, 0, "{}", c.name);
        if c.kind == Kind::Deny {
            assert!(c.status_429 > 0, "{}", c.name);
        } else {
            assert_eq!(c.status_429, 0, "{}", c.name);
        }
    }
}

#[test]
fn every_cell_runs_and_answers_as_expected() {
    let args = parse(&[
        "--seconds",
        "0.2",
        "--warmup",
        "0.05",
        "--rounds",
        "2",
        "--connections",
        "4",
        "--server-threads",
        "1",
        "--client-threads",
        "1",
    ])
    .unwrap();
    let mut out = Vec::new();
    let report = bench::run_all(&args, &mut out).unwrap();
    bench::print_verdict(&report, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();

    // Every cell whose function builds a router ran once per round; the others are listed
    // as skipped (the turnstile cells, until its layer is wired in).
    let available: Vec<&str> = CELLS
        .iter()
        .filter(|c| (c.build)().is_some())
        .map(|c| c.name)
        .collect();
    for name in ["no_layer", "governor_allow", "governor_deny"] {
        assert!(available.contains(&name), "{name}");
    }
    assert_eq!(report.cells.len(), available.len() * args.rounds, "{text}");
    for c in CELLS {
        let rounds: Vec<usize> = report
            .cells
            .iter()
            .filter(|r| r.name == c.name)
            .map(|r| r.round)
            .collect();
        if available.contains(&c.name) {
            assert_eq!(rounds, [0, 1], "{} ran in every round\n{text}", c.name);
        } else {
            assert!(rounds.is_empty(), "{}", c.name);
            assert!(report.skipped.contains(&c.name), "{}", c.name);
            assert!(
                text.contains(&format!("cell {}: skipped", c.name)),
                "{text}"
            );
        }
    }
    for c in &report.cells {
        assert_eq!(
            c.errors, 0,
            "{} round {}: {:?}\n{text}",
            c.name, c.round, c.first_error
        );
        assert!(
            c.requests > 0,
            "{} round {} ran no request",
            c.name,
            c.round
        );
        assert_eq!(
            c.requests,
            c.status_200 + c.status_429 + c.status_other,
            "{}",
            c.name
        );
        assert_eq!(c.status_other, 0, "{}: {:?}", c.name, c.first_error);
        assert!(c.p50 <= c.p99);
        match c.kind {
            // The no-limit cells: every request allowed.
            Kind::Baseline | Kind::Allow => {
                assert_eq!(c.status_429, 0, "{} round {}", c.name, c.round)
            }
            // A burst of 1 per peer, replenished hourly: the first request (in the warm-up)
            // is the only one allowed, so the measured window is (almost) all 429s.
            Kind::Deny => {
                assert!(c.status_429 > 0, "{} round {}", c.name, c.round);
                assert!(
                    c.status_200 <= args.peers as u64,
                    "{} round {}: {} allowed",
                    c.name,
                    c.round,
                    c.status_200
                );
            }
        }
    }
    let summaries = report.summaries();
    assert_eq!(summaries.len(), available.len());
    let base = summaries.iter().find(|s| s.name == "no_layer").unwrap();
    assert!((base.ratio - 1.0).abs() < 1e-9);
    for s in &summaries {
        assert!(s.ratio > 0.0, "{}", s.name);
        assert_eq!(s.meets_target().is_some(), s.kind == Kind::Allow);
        assert_eq!(s.verdict().is_some(), s.kind == Kind::Allow);
    }
    assert!(report.baseline_drift().is_some());
    let (allow, _) = report.turnstile_vs_governor();
    assert_eq!(allow.is_some(), available.contains(&"turnstile_allow"));

    assert!(text.contains("verdict:"), "{text}");
    assert!(text.contains("what a good result looks like"), "{text}");
    assert!(text.contains("load average"), "{text}");
    assert!(text.contains("result: no errors"), "{text}");
    for name in &available {
        assert!(text.contains(name), "{name} missing\n{text}");
    }

    let json: serde_json::Value = serde_json::from_str(&bench::to_json(&report)).unwrap();
    assert_eq!(json["schema"], "turnstile-http-bench/1");
    assert_eq!(json["rounds"], 2);
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), report.cells.len());
    for c in cells {
        assert_eq!(c["errors"], 0);
        assert!(c["requests_per_sec"].as_f64().unwrap() > 0.0);
        assert!(c["p50_ns"].as_u64().unwrap() <= c["p99_ns"].as_u64().unwrap());
    }
    let summary = json["summary"].as_array().unwrap();
    assert_eq!(summary.len(), available.len());
    for s in summary {
        if s["kind"] == "baseline" {
            assert!(s["overhead"].is_null());
            assert!(s["meets_target"].is_null());
        } else {
            assert!(s["overhead"].is_f64());
            assert!(s["ratio_to_no_layer"].as_f64().unwrap() > 0.0);
            assert_eq!(s["meets_target"].is_boolean(), s["kind"] == "allow");
            assert_eq!(s["verdict"].is_string(), s["kind"] == "allow");
        }
    }
    assert_eq!(
        json["skipped"].as_array().unwrap().len(),
        report.skipped.len()
    );
}
