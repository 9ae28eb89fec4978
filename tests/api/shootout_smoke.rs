//! The shootout example's machinery (`examples/shootout/harness.rs`, included here as a
//! module) run briefly: its command line and defaults, a real run of every phase at 1 and 2
//! threads for 0.05 s a cell, a run with `--runs 2`, the floor cells, the verdict's medians and
//! the JSON. It asserts structure and turnstile's budgets, never timings.
#![cfg(feature = "keyed")]

use std::collections::HashSet;

#[allow(dead_code)]
#[path = "../../examples/shootout/harness.rs"]
mod harness;
#[cfg(feature = "plot")]
#[allow(dead_code)]
#[path = "../../examples/shootout/plot.rs"]
mod plot;

use harness::{
    default_seconds, default_threads, parse_args, Impl, JsonTo, Ratio, Scope,
    CELLS_PER_THREAD_COUNT,
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
    // On 2 cores (this project's machines): 56 cells of 0.85 s.
    let a = parse(&[], 2).unwrap();
    assert_eq!(a.threads, [1, 2]);
    assert_eq!(a.runs, 1);
    assert_eq!(a.seconds, 0.85);
    assert!(!a.seconds_given);
    assert_eq!(a.cells(), 2 * CELLS_PER_THREAD_COUNT);
    // --runs 3 shrinks the cells so the whole run still takes about as long: 168 of 0.25 s.
    let a = parse(&["--runs", "3"], 2).unwrap();
    assert_eq!(a.runs, 3);
    assert_eq!(a.seconds, 0.25);
    assert_eq!(a.cells(), 3 * 2 * CELLS_PER_THREAD_COUNT);
    assert!((a.expected_seconds() - 42.0).abs() < 1e-9);
    // Given seconds are kept whatever the runs.
    assert_eq!(
        parse(&["--runs", "3", "--seconds", "1"], 2)
            .unwrap()
            .seconds,
        1.0
    );
    // Under a minute wherever the 0.1 s floor does not bind (up to 2^19 cores; with 3 runs,
    // up to 16 cores).
    for cores in [1, 2, 3, 4, 8, 16, 64, 256] {
        for runs in [1, 2, 3] {
            if runs > 1 && cores > 16 {
                continue;
            }
            let runs_arg = runs.to_string();
            let a = parse(&["--runs", &runs_arg], cores).unwrap();
            assert!(
                a.expected_seconds() < 55.0,
                "{cores} cores, {runs} runs: {} s",
                a.expected_seconds()
            );
            assert_eq!(a.seconds, default_seconds(a.threads.len(), runs));
            assert!(a.seconds >= 0.1);
        }
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
            "--runs=4",
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
    assert_eq!(a.runs, 4);
    assert_eq!(a.cells(), 4 * 3 * CELLS_PER_THREAD_COUNT);
    assert_eq!(a.json, Some(JsonTo::File("out.json".into())));
    assert_eq!(a.plot.as_deref(), Some("p.svg"));
    assert_eq!(
        parse(&["--json", "-"], 2).unwrap().json,
        Some(JsonTo::Stdout)
    );
    // A single count still works, and the seconds follow the list's length.
    let a = parse(&["--threads", "3"], 2).unwrap();
    assert_eq!(a.threads, [3]);
    assert_eq!(a.seconds, default_seconds(1, 1));

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
        &["--runs", "0"],
        &["--runs", "101"],
        &["--runs", "two"],
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
        "--runs",
        "--json",
        "--plot",
        "--help",
    ] {
        assert!(u.contains(flag), "{flag} missing from the help");
    }
    assert!(u.matches("default").count() >= 7, "{u}");
    assert!(
        u.contains("here 0.85") && u.contains("0.25 with --runs 3"),
        "{u}"
    );
    assert!(u.contains("here 1,2"), "{u}");
}

#[test]
fn a_short_run_holds_every_turnstile_budget_and_writes_valid_json() {
    let args = parse(&["--threads", "1,2", "--seconds", "0.05"], 2).unwrap();
    let mut text = Vec::new();
    let report = harness::run_all(&args, &mut text).unwrap();
    harness::print_verdict(&report, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();

    // Every cell ran once: 28 per thread count, each (limiter, implementation, threads) once.
    assert_eq!(report.cells.len(), 2 * CELLS_PER_THREAD_COUNT, "{text}");
    let keys: HashSet<_> = report
        .cells
        .iter()
        .map(|c| (c.limiter, c.implementation, c.threads))
        .collect();
    assert_eq!(keys.len(), report.cells.len());
    for c in &report.cells {
        assert!([1, 2].contains(&c.threads));
        assert_eq!(c.run, 1);
        assert!(c.ops > 0, "{c:?}");
        assert_eq!(c.granted + c.denied, c.ops, "{c:?}");
        let floor = c.implementation.is_floor();
        assert_eq!(c.budget.is_none(), c.phase == 2 || floor, "{c:?}");
        assert_eq!(c.keys.is_some(), c.phase == 4 && !floor, "{c:?}");
        // The refusal floor refuses every check: it measures a refusal, not a grant.
        if c.implementation == Impl::Floor {
            assert_eq!(c.granted, 0, "{c:?}");
        }
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
    // The floors: both in phase 1 and the refusal floor in each keyed workload, at every thread
    // count; nowhere else.
    let floors: HashSet<_> = report
        .cells
        .iter()
        .filter(|c| c.implementation.is_floor())
        .map(|c| (c.limiter, c.implementation, c.threads))
        .collect();
    let mut want = HashSet::new();
    for t in [1, 2] {
        want.insert(("token_bucket", Impl::Floor, t));
        want.insert(("token_bucket", Impl::FloorCas, t));
        want.insert(("keyed_random", Impl::Floor, t));
        want.insert(("keyed_random", Impl::FloorIndirect, t));
        want.insert(("keyed_hot", Impl::Floor, t));
    }
    assert_eq!(floors, want);
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
    // Against the floors: phase 1's own, phase 3's limiters against phase 1's, each keyed
    // implementation against its workload's; never phase 2.
    for l in [
        "token_bucket",
        "leaky_bucket",
        "smooth_bursty",
        "smooth_warming_up",
        "fixed_window",
        "sliding_window",
        "leaky_meter",
    ] {
        for f in [Impl::Floor, Impl::FloorCas] {
            assert!(pairs.contains(&(l, Impl::Turnstile, f)), "{l} {f:?}");
        }
    }
    for l in ["keyed_random", "keyed_hot"] {
        for ours in [Impl::Turnstile, Impl::TurnstileInline] {
            assert!(pairs.contains(&(l, ours, Impl::Floor)), "{l} {ours:?}");
        }
    }
    for ours in [Impl::Turnstile, Impl::TurnstileInline] {
        assert!(pairs.contains(&("keyed_random", ours, Impl::FloorIndirect)));
    }
    assert_eq!(pairs.len(), 7 + 4 + 2 + 7 * 2 + 4 + 2);
    for c in &comps {
        assert_eq!(c.ratios.len(), 2);
        assert!(c.ratios.iter().all(|r| r.runs == 1 && r.min == r.max));
        // A floor is never judged: no "expected" on its lines, nor on anything against it.
        if c.against.is_floor() {
            assert!(
                c.reading().ends_with("for information") && !c.reading().contains("expect"),
                "{}",
                c.reading()
            );
        } else {
            assert!(c.reading().contains("expect"), "{}", c.reading());
        }
    }
    for needle in [
        "phase 1",
        "phase 2",
        "phase 3",
        "phase 4",
        "expected run time: 56 cells",
        "floor_cas",
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
    assert_eq!(json["runs"], 1);
    assert_eq!(json["turnstile_budgets_held"], true);
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), report.cells.len());
    for (j, c) in cells.iter().zip(&report.cells) {
        assert_eq!(j["limiter"], c.limiter);
        assert_eq!(j["implementation"], c.implementation.name());
        assert_eq!(j["threads"], c.threads);
        assert_eq!(j["run"], 1);
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
    for v in verdict {
        for r in v["ops_per_sec_ratios"].as_array().unwrap() {
            assert_eq!(r["runs"], 1, "{v}");
            assert_eq!(r["min"], r["ratio"], "{v}");
            assert_eq!(r["max"], r["ratio"], "{v}");
        }
    }
    // One budget line per turnstile implementation (none for the floors): 10 limiters, 2 of
    // them keyed with two turnstile implementations; null only for the always-allowing phase 2.
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
        assert!(svg.contains("floor_cas"));
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
        run: 1,
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
        runs: 1,
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

#[test]
fn two_runs_alternate_and_the_verdict_reads_the_median() {
    let args = parse(&["--threads", "1", "--seconds", "0.02", "--runs", "2"], 2).unwrap();
    let mut text = Vec::new();
    let report = harness::run_all(&args, &mut text).unwrap();
    harness::print_verdict(&report, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert_eq!(report.runs, 2);
    assert_eq!(report.cells.len(), 2 * CELLS_PER_THREAD_COUNT, "{text}");
    // Every (limiter, implementation) ran twice, run 1 then run 2, and the runs alternate:
    // run 1 of every implementation of a limiter comes before run 2 of any.
    for l in report.limiters() {
        let mine: Vec<_> = report.cells.iter().filter(|c| c.limiter == l).collect();
        let last_first = mine.iter().rposition(|c| c.run == 1).unwrap();
        let first_second = mine.iter().position(|c| c.run == 2).unwrap();
        assert!(last_first < first_second, "{l}: runs not alternated");
        let runs: HashSet<_> = mine.iter().map(|c| (c.implementation, c.run)).collect();
        assert_eq!(runs.len(), mine.len(), "{l}");
        assert_eq!(mine.len() % 2, 0, "{l}");
    }
    assert!(report.turnstile_held());
    for c in harness::comparisons(&report) {
        assert_eq!(c.ratios.len(), 1);
        let r = c.ratios[0];
        assert_eq!(r.runs, 2, "{} {:?}", c.limiter, c.against);
        assert!(r.min <= r.median && r.median <= r.max, "{r:?}");
    }
    for needle in [
        "expected run time: 56 cells (28 per thread count x 1 thread counts x 2 runs)",
        "alternating",
        "median (min-max) over 2 runs",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&harness::to_json(&args, &report)).unwrap();
    assert_eq!(json["runs"], 2);
    let runs: Vec<_> = json["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["run"].as_u64().unwrap())
        .collect();
    assert_eq!(
        runs.iter().filter(|r| **r == 2).count(),
        CELLS_PER_THREAD_COUNT
    );
    for v in json["verdict"].as_array().unwrap() {
        let r = &v["ops_per_sec_ratios"][0];
        assert_eq!(r["runs"], 2, "{v}");
        assert!(
            r["min"].as_f64() <= r["ratio"].as_f64() && r["ratio"].as_f64() <= r["max"].as_f64()
        );
    }
}

#[test]
fn ratios_are_the_median_of_the_runs_paired_by_run() {
    assert!(Ratio::of(1, vec![]).is_none());
    let r = Ratio::of(2, vec![3.0, 0.5, 1.0]).unwrap();
    assert_eq!(
        (r.threads, r.median, r.min, r.max, r.runs),
        (2, 1.0, 0.5, 3.0, 3)
    );
    assert_eq!(r.show(), "1.00x (0.50-3.00)");
    assert_eq!(Ratio::of(1, vec![4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
    assert_eq!(Ratio::of(1, vec![1.25]).unwrap().show(), "1.25x");

    // A made-up report: turnstile over governor at 0.5, 0.8 and 3.0 in runs 1, 2, 3 (governor's
    // cells listed in another order and not alike, so pairing by position or with the first
    // would give other ratios). The median 0.8 is behind; the mean (1.43) would read ahead.
    let cell = |implementation, run, ops| harness::Cell {
        phase: 1,
        limiter: "token_bucket",
        implementation,
        threads: 1,
        run,
        ops,
        granted: 0,
        denied: ops,
        wall: std::time::Duration::from_secs(1),
        budget: None,
        keys: None,
    };
    let report = harness::Report {
        cores: 2,
        runs: 3,
        cells: vec![
            cell(Impl::Turnstile, 1, 50),
            cell(Impl::Turnstile, 2, 80),
            cell(Impl::Turnstile, 3, 600),
            cell(Impl::Governor, 3, 200),
            cell(Impl::Governor, 1, 100),
            cell(Impl::Governor, 2, 100),
            cell(Impl::Floor, 1, 1000),
            cell(Impl::Floor, 2, 1000),
            cell(Impl::Floor, 3, 1000),
        ],
        load: None,
    };
    let comps = harness::comparisons(&report);
    assert_eq!(comps.len(), 2);
    let gov = &comps[0];
    assert_eq!(gov.against, Impl::Governor);
    let r = gov.ratios[0];
    assert_eq!((r.median, r.min, r.max, r.runs), (0.8, 0.5, 3.0, 3));
    assert_eq!(gov.reading(), "behind at 1 thread: below expectations");
    let floor = &comps[1];
    assert_eq!(floor.against, Impl::Floor);
    assert_eq!(floor.ratios[0].median, 0.08);
    assert_eq!(
        floor.reading(),
        "8% of the floor's ops/s at 1 thread: for information"
    );
    let mut text = Vec::new();
    harness::print_verdict(&report, &mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("0.80x (0.50-3.00)"), "{text}");
    // The floors have no budget and no budget line: they never count in a turnstile verdict.
    let json: serde_json::Value = serde_json::from_str(&harness::to_json(
        &parse(&["--threads", "1", "--runs", "3"], 2).unwrap(),
        &report,
    ))
    .unwrap();
    assert_eq!(json["verdict"][0]["ops_per_sec_ratios"][0]["ratio"], 0.8);
    assert_eq!(json["verdict"][0]["ops_per_sec_ratios"][0]["min"], 0.5);
    assert_eq!(json["verdict"][0]["ops_per_sec_ratios"][0]["max"], 3.0);
    assert_eq!(json["verdict"][0]["ops_per_sec_ratios"][0]["runs"], 3);
    assert_eq!(json["budgets"].as_array().unwrap().len(), 1);
    assert_eq!(json["budgets"][0]["implementation"], "turnstile");
}
