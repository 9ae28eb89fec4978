//! The summary lines of the fault and hostile-client tests (requests sent, answers by kind,
//! the slowest answer, keys held): on stderr, and appended to the file that
//! `TURNSTILE_TEST_REPORT` names, if set. libtest hides a passing test's stderr, so the file is
//! how `scripts/test` prints them after its summary, whichever binaries ran.
#![allow(dead_code)] // not every test binary uses every helper

use std::io::Write;

/// Prints `line` and, under `scripts/test`, records it for the run's summary. One `write` per
/// line on a file opened for appending, so lines from concurrent tests never interleave.
pub fn line(line: &str) {
    eprintln!("{line}");
    let Some(path) = std::env::var_os("TURNSTILE_TEST_REPORT") else {
        return;
    };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        panic!("TURNSTILE_TEST_REPORT={path:?} cannot record a summary line: {e}");
    }
}
