//! The shootout example's machinery (`examples/shootout/harness.rs`, included here as a
//! module) run briefly: its command line and defaults, a real run of every phase at 1 and 2
//! threads for 0.05 s a cell, the verdict and the JSON. It asserts structure and turnstile's
//! budgets, never timings.
#![cfg(feature = "keyed")]

use std::collections::HashSet;

#[allow(dead_code)]
#[path = "../examples/shootout/harness.rs"]
mod harness;
#[cfg(feature = "plot")]
#[allow(dead_code)]
#[path = "../examples/shootout/plot.rs"]
mod plot;

use harness::{
    default_seconds, default_threads, parse_args, Impl, JsonTo, Scope, CELLS_PER_THREAD_COUNT,
};

fn parse(args: &[&str], cores: usize) -> Result<harness::Args, String> {
    parse_args(args.iter().map(|s| s.to_string()), cores)
}

#[test]
fn default_threads_cover_one_to_all_cores() {
    assert_eq!(default_threads(1), [1]);
    assert_eq!(default_threads(2), [1, 2]);
    assert_eq!(default_threads(6), [1, 2, 4, 6]);
    assert_eq!(default_threads(8), [1, 2, 4, 8]);
    assert_eq!(default_threads(12), [1, 2, 4, 8, 12]);
}

#[test]
fn default_run_stays_under_a_minute() {
    // On 2 cores (this project's machines): 46 cells of 1.0 s.
    let a = parse(&[], 2).unwrap();
    assert_eq!(a.threads, [1, 2]);
    assert_eq!(a.seconds, 1.0);
    assert!(!a.seconds_given);
    assert_eq!(a.cells(), 2 * CELLS_PER_THREAD_COUNT);
    // Under a minute wherever the 0.1 s floor does not bind (up to 2^19 cores).
    for cores in [1, 2, 3, 4, 8, 16, 64, 256] {
        let a = parse(&[], cores).unwrap();
        assert!(
            a.expected_seconds() < 55.0,
            "{cores} cores: {} s",
            a.expected_seconds()
        );
        assert_eq!(a.seconds, default_seconds(a.threads.len()));
        assert!(a.seconds >= 0.1);
    }
}

#[test]
fn flags_parse() {
    let a = parse(
        &[
            "--threads",
            "4,1,2,2",
            "--seconds=0.5",
            "--limit",
            "5000",
            "--burst=7",
            "--json",
            "out.json",
            "--plot",
            "p.svg",
        ],
        2,
    )
    .unwrap();
    assert_eq!(a.threads, [1, 2, 4]);
    assert_eq!(a.seconds, 0.5);
    assert!(a.seconds_given);
    assert_eq!(a.limit, 5000.0);
    assert_eq!(a.burst, 7);
    assert_eq!(a.json, Some(JsonTo::File("out.json".into())));
    assert_eq!(a.plot.as_deref(), Some("p.svg"));
    assert_eq!(
        parse(&["--json", "-"], 2).unwrap().json,
        Some(JsonTo::Stdout)
    );
    // A single count still works, and the seconds follow the list's length.
    let a = parse(&["--threads", "3"], 2).unwrap();
    assert_eq!(a.threads, [3]);
    assert_eq!(a.seconds, default_seconds(1));

    assert_eq!(parse(&["--help"], 2).unwrap_err(), "");
    assert_eq!(parse(&["-h"], 2).unwrap_err(), "");
    for bad in [
        &["--threads", "0"][..],
        &["--threads", "1,,2"],
        &["--threads", "two"],
        &["--seconds", "0"],
        &["--seconds", "-1"],
        &["--limit", "inf"],
        &["--burst", "0"],
        &["--json"],
        &["--frobnicate"],
    ] {
        assert!(parse(bad, 2).is_err(), "{bad:?} should be refused");
    }
}

#[test]
fn help_lists_every_flag_with_its_default() {
    let u = harness::usage(2);
    for flag in [
        "--threads",
        "--seconds",
        "--limit",
        "--burst",
        "--json",
        "--plot",
        "--help",
    ] {
        assert!(u.contains(flag), "{flag} missing from the help");
    }
    assert!(u.matches("default").count() >= 6, "{u}");
    assert!(u.contains("here 1,2"), "{u}");
}

#[test]
fn a_short_run_holds_every_turnstile_budget_and_writes_valid_json() {
    let args = parse(&["--threads", "1,2", "--seconds", "0.05"], 2).unwrap();
    let mut text = Vec::new();
    let report = harness::run_all(&args, &mut text).unwrap();
    harness::print_verdict(&report, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();

    // Every cell ran once: 23 per thread count, each (limiter, implementation, threads) once.
    assert_eq!(report.cells.len(), 2 * CELLS_PER_THREAD_COUNT, "{text}");
    let keys: HashSet<_> = report
        .cells
        .iter()
        .map(|c| (c.limiter, c.implementation, c.threads))
        .collect();
    assert_eq!(keys.len(), report.cells.len());
    for c in &report.cells {
        assert!([1, 2].contains(&c.threads));
        assert!(c.ops > 0, "{c:?}");
        assert_eq!(c.granted + c.denied, c.ops, "{c:?}");
        assert_eq!(c.budget.is_none(), c.phase == 2, "{c:?}");
        assert_eq!(c.keys.is_some(), c.phase == 4, "{c:?}");
        if let Some(b) = c.budget {
            assert_eq!(b.scope == Scope::WorstKey, c.phase == 4, "{c:?}");
            assert!(b.granted <= c.granted);
        }
        // The point of the shootout: a turnstile limiter never goes over its budget.
        if c.implementation.is_turnstile() {
            assert_ne!(
                c.held(),
                Some(false),
                "turnstile over budget: {c:?}\n{text}"
            );
        }
    }
    assert!(report.turnstile_held());
    let limiters = report.limiters();
    assert_eq!(
        limiters,
        [
            "token_bucket",
            "token_bucket_raw",
            "leaky_bucket",
            "smooth_bursty",
            "smooth_warming_up",
            "fixed_window",
            "sliding_window",
            "leaky_meter",
            "keyed_random",
            "keyed_hot",
        ]
    );

    // The verdict: every turnstile limiter against its twin where it has one, against governor
    // where it has one, and a readable result line.
    let comps = harness::comparisons(&report);
    let pairs: HashSet<_> = comps
        .iter()
        .map(|c| (c.limiter, c.ours, c.against))
        .collect();
    for l in &limiters[..7] {
        assert!(
            pairs.contains(&(*l, Impl::Turnstile, Impl::MutexTwin)),
            "{l}"
        );
    }
    for l in [
        "token_bucket",
        "token_bucket_raw",
        "keyed_random",
        "keyed_hot",
    ] {
        assert!(pairs.contains(&(l, Impl::Turnstile, Impl::Governor)), "{l}");
    }
    for l in ["keyed_random", "keyed_hot"] {
        assert!(
            pairs.contains(&(l, Impl::TurnstileInline, Impl::Governor)),
            "{l}"
        );
    }
    assert_eq!(pairs.len(), 7 + 4 + 2);
    for c in &comps {
        assert_eq!(c.ratios.len(), 2);
        assert!(c.reading().contains("expect"), "{}", c.reading());
    }
    for needle in [
        "phase 1",
        "phase 2",
        "phase 3",
        "phase 4",
        "expected run time: 46 cells",
        "verdict",
        "what a good result looks like",
        "result: every turnstile budget held at every thread count (1, 2)",
        "no twin or governor to compare with",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }

    // The JSON parses and carries every cell with every field.
    let json: serde_json::Value = serde_json::from_str(&harness::to_json(&args, &report))
        .expect("the shootout writes valid JSON");
    assert_eq!(json["schema"], "turnstile-shootout/1");
    assert_eq!(json["threads"], serde_json::json!([1, 2]));
    assert_eq!(json["seconds_per_cell"], 0.05);
    assert_eq!(json["turnstile_budgets_held"], true);
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), report.cells.len());
    for (j, c) in cells.iter().zip(&report.cells) {
        assert_eq!(j["limiter"], c.limiter);
        assert_eq!(j["implementation"], c.implementation.name());
        assert_eq!(j["threads"], c.threads);
        assert_eq!(j["phase"], c.phase);
        assert_eq!(j["ops"], c.ops);
        assert_eq!(j["granted"], c.granted);
        assert_eq!(j["denied"], c.denied);
        for f in ["seconds", "ops_per_sec", "ns_per_op"] {
            assert!(j[f].as_f64().unwrap() > 0.0, "{f} in {j}");
        }
        match c.budget {
            Some(b) => {
                assert_eq!(j["held"], b.held());
                assert_eq!(j["granted_against_budget"], b.granted);
                assert_eq!(j["budget_scope"], b.scope.name());
                assert!(j["budget"].as_f64().unwrap() > 0.0);
            }
            None => {
                for f in ["budget", "budget_scope", "granted_against_budget", "held"] {
                    assert!(j[f].is_null(), "{f} in {j}");
                }
            }
        }
    }
    let verdict = json["verdict"].as_array().unwrap();
    assert_eq!(verdict.len(), comps.len());
    assert!(verdict.iter().all(|v| v["reading"].is_string()));
    // One budget line per turnstile implementation: 10 limiters, 2 of them keyed with two
    // turnstile implementations; null only for the always-allowing phase 2.
    let budgets = json["budgets"].as_array().unwrap();
    assert_eq!(budgets.len(), 12);
    for b in budgets {
        let expected = if b["limiter"] == "token_bucket_raw" {
            serde_json::Value::Null
        } else {
            serde_json::Value::Bool(true)
        };
        assert_eq!(b["held_at_every_thread_count"], expected, "{b}");
    }

    #[cfg(feature = "plot")]
    {
        let path = std::env::temp_dir().join(format!(
            "turnstile-shootout-smoke-{}.svg",
            std::process::id()
        ));
        plot::plot(&path, &report, "smoke").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(200)]);
        for l in &limiters {
            assert!(svg.contains(l), "{l} missing from the plot");
        }
        assert!(svg.contains("governor") && svg.contains("mutex_twin"));
    }
}

#[test]
fn an_overrun_is_reported_and_fails_the_run() {
    // No timing here: a made-up report with one turnstile cell over its budget.
    let args = parse(&["--threads", "1", "--seconds", "1"], 2).unwrap();
    let cell = |implementation, granted| harness::Cell {
        phase: 1,
        limiter: "token_bucket",
        implementation,
        threads: 1,
        ops: 100,
        granted,
        denied: 100 - granted,
        wall: std::time::Duration::from_secs(1),
        budget: Some(harness::Budget {
            scope: Scope::Limiter,
            granted,
            budget: 10.0,
        }),
        keys: None,
    };
    let mut report = harness::Report {
        cores: 2,
        // 11 is within the budget plus D2's one request; the twin's overrun is not a failure.
        cells: vec![cell(Impl::Turnstile, 11), cell(Impl::MutexTwin, 50)],
        load: Some(9.0),
    };
    assert!(report.turnstile_held());
    report.cells[0] = cell(Impl::Turnstile, 12);
    assert!(!report.turnstile_held());
    let mut text = Vec::new();
    harness::print_verdict(&report, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("OVER: a bug in turnstile"), "{text}");
    assert!(text.contains("this machine was busy"), "{text}");
    assert!(
        text.contains("result: FAILED: a turnstile limiter granted more than its budget: token_bucket turnstile at 1"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&harness::to_json(&args, &report)).unwrap();
    assert_eq!(json["turnstile_budgets_held"], false);
    assert_eq!(json["load_average_1m"], 9.0);
    assert_eq!(json["cells"][0]["held"], false);
    assert_eq!(json["cells"][1]["held"], false);
    assert_eq!(
        json["budgets"],
        serde_json::json!([{"limiter": "token_bucket", "implementation": "turnstile",
                            "held_at_every_thread_count": false}])
    );
}
