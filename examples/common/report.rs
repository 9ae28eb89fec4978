//! What the benchmark examples share (`bench/examples/redis/bench.rs`, `bench/examples/http/bench.rs`):
//! number and latency formatting, percentiles, the machine's load average (and the
//! busy-machine note), the JSON writer's escaping and its `--json` file, and the exits for
//! `--help` and a bad argument. Each includes this file as a module with `#[path]`.
#![allow(dead_code)] // not every example uses every helper

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

/// `12345.6` as `12,346`.
pub fn thousands(x: f64) -> String {
    group_digits(x.round().max(0.0) as u64, ',')
}

/// `n` in decimal with `sep` between groups of three digits: `1234567` and `'_'` as
/// `1_234_567`.
pub fn group_digits(n: u64, sep: char) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(sep);
        }
        out.push(ch);
    }
    out
}

/// A latency in µs with one decimal, or ms above 10 ms.
pub fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

/// The `p` quantile of sorted samples (nearest rank); 0 for none.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The 1-minute load average, where `/proc/loadavg` exists.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A load average as the reports print it: two decimals, or "unknown".
pub fn fmt_load(load: Option<f64>) -> String {
    load.map_or("unknown".to_string(), |l| format!("{l:.2}"))
}

/// The note a report prints when other work shared the cores (a 1-minute load average above
/// the core count at the start or the end of the run), or `None`.
pub fn busy_note(start: Option<f64>, end: Option<f64>, cores: usize) -> Option<String> {
    let busy = |l: Option<f64>| l.is_some_and(|l| l > cores as f64 + 0.5);
    (busy(start) || busy(end)).then(|| {
        format!(
            "note: this machine was busy: 1-minute load average {} at the start and {} at the \
             end on {cores} cores (this run included), so other work shared the cores; treat \
             the figures as rough.",
            fmt_load(start),
            fmt_load(end),
        )
    })
}

pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub fn json_f64(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".to_string()
    }
}

pub fn json_opt_f64(x: Option<f64>) -> String {
    x.map_or("null".to_string(), json_f64)
}

/// The parsed arguments, or the exit: for `--help` (the parser's `Err("")`) the usage on
/// stdout and success, for a bad argument the error and the usage on stderr and 2. `who`
/// names the example in the message.
pub fn args_or_exit<A>(
    parsed: Result<A, String>,
    who: &str,
    usage: impl FnOnce() -> String,
) -> Result<A, ExitCode> {
    match parsed {
        Ok(a) => Ok(a),
        Err(e) if e.is_empty() => {
            println!("{}", usage());
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{who}: {e}\n\n{}", usage());
            Err(ExitCode::from(2))
        }
    }
}

/// The `--json PATH` file, created before the run so that a bad path fails now, not after
/// the run; `None` without `--json`.
pub fn create_json(who: &str, path: Option<&str>) -> Result<Option<File>, ExitCode> {
    let Some(path) = path else {
        return Ok(None);
    };
    match File::create(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) => {
            eprintln!("{who}: --json {path}: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// Writes `json()` to the file [`create_json`] opened for `path` (nothing without one), and
/// says so on stderr.
pub fn write_json(
    who: &str,
    path: Option<&str>,
    file: Option<&mut File>,
    json: impl FnOnce() -> String,
) -> Result<(), ExitCode> {
    let (Some(path), Some(f)) = (path, file) else {
        return Ok(());
    };
    match f.write_all(json().as_bytes()) {
        Ok(()) => {
            eprintln!("{who}: wrote {path}");
            Ok(())
        }
        Err(e) => {
            eprintln!("{who}: writing {path}: {e}");
            Err(ExitCode::from(2))
        }
    }
}
