//! Pacing: one thread calling `LeakyBucket::take()` at 1k, 10k and 100k permits per second,
//! for `--seconds` each (default 1). For each rate it prints the achieved rate, the lateness
//! of each wake-up (the clock reading after `take` returns minus the permit time) at p50, p99
//! and max, and the CPU time the thread used, as a share of the wall time.
//!
//! `take()` sleeps with `turnstile::clock::sleep_until`: a thread sleep until 80 µs before the
//! permit, then a spin. `--compare` adds, for
//! comparison, the same loop with a plain `std::thread::sleep` of the wait (`take_at` + sleep),
//! each with the default slack (10) and without slack.
//!
//! ```sh
//! cargo run --release --example pacing                      # ~3 s
//! cargo run --release --example pacing -- --seconds 2 --compare
//! ```
//!
//! CPU time is read from `/proc/thread-self/schedstat` (nanoseconds on the CPU), or from the
//! utime + stime ticks of `/proc/thread-self/stat` where schedstat is missing; elsewhere it
//! prints `-`.

use std::time::Duration;

use turnstile::{Clock, LeakyBucket, QuantaClock};

/// This thread's CPU time so far, if the platform says.
fn thread_cpu() -> Option<Duration> {
    if let Ok(s) = std::fs::read_to_string("/proc/thread-self/schedstat") {
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
            return Some(Duration::from_nanos(ns));
        }
    }
    // utime and stime are fields 14 and 15; the command name (field 2) may hold spaces, so
    // count from the last ')'. Ticks are USER_HZ, 100 on Linux.
    let s = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

#[derive(Clone, Copy, PartialEq)]
enum Sleep {
    /// `take()`: `sleep_until`, sleep then spin.
    Take,
    /// `take_at(now)` then `std::thread::sleep(permit - now)`.
    Plain,
}

struct Row {
    rate: u32,
    mode: &'static str,
    achieved: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    cpu: Option<f64>,
}

fn run(rate: u32, slack: u32, sleep: Sleep, seconds: f64) -> Row {
    let clock = QuantaClock::new();
    let lb = LeakyBucket::builder(rate)
        .slack(slack)
        .clock(clock)
        .build()
        .expect("valid rate");
    let run_for = Duration::from_secs_f64(seconds);
    let mut late = Vec::with_capacity((f64::from(rate) * seconds * 1.1) as usize + 16);
    let cpu0 = thread_cpu();
    let start = clock.now();
    let mut woke = start;
    while woke - start < run_for {
        let permit = match sleep {
            Sleep::Take => lb.take(),
            Sleep::Plain => {
                let now = clock.now();
                let permit = lb.take_at(now);
                if permit > now {
                    std::thread::sleep(permit - now);
                }
                permit
            }
        };
        woke = clock.now();
        late.push(woke - permit);
    }
    let wall = woke - start;
    let cpu = match (cpu0, thread_cpu()) {
        (Some(a), Some(b)) => Some((b - a).as_secs_f64() / wall.as_secs_f64() * 100.0),
        _ => None,
    };
    late.sort_unstable();
    let pct = |p: f64| late[((late.len() - 1) as f64 * p).round() as usize];
    Row {
        rate,
        mode: match (sleep, slack) {
            (Sleep::Take, 0) => "take(), no slack",
            (Sleep::Take, _) => "take()",
            (Sleep::Plain, 0) => "thread::sleep, no slack",
            (Sleep::Plain, _) => "thread::sleep",
        },
        achieved: late.len() as f64 / wall.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        max: late[late.len() - 1],
        cpu,
    }
}

fn us(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn main() {
    let mut seconds = 1.0;
    let mut compare = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => {
                seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|s: &f64| *s > 0.0)
                    .expect("--seconds takes a positive number")
            }
            "--compare" => compare = true,
            "-h" | "--help" => {
                println!("usage: pacing [--seconds S] [--compare]");
                return;
            }
            other => panic!("unknown argument {other}; try --help"),
        }
    }
    let _ = QuantaClock::new().now(); // calibrate before measuring
                                      // sleep_until's spin window: the 80 µs it spins before a deadline.
    let spin = Duration::from_micros(80);
    println!("LeakyBucket::take() pacing, one thread, {seconds} s per row; spin window {spin:?}");
    let head = format!(
        "{:>7}  {:<24} {:>11} {:>8}  {:>9} {:>9} {:>9}  {:>6}",
        "rate/s", "sleep", "achieved/s", "error", "p50 µs", "p99 µs", "max µs", "CPU %"
    );
    println!("{head}");
    println!("{}", "-".repeat(head.chars().count()));
    for rate in [1_000u32, 10_000, 100_000] {
        let mut modes = vec![(10, Sleep::Take)];
        if compare {
            modes.extend([(0, Sleep::Take), (10, Sleep::Plain), (0, Sleep::Plain)]);
        }
        for (slack, sleep) in modes {
            let r = run(rate, slack, sleep, seconds);
            println!(
                "{:>7}  {:<24} {:>11.0} {:>7.2}%  {:>9} {:>9} {:>9}  {:>6}",
                r.rate,
                r.mode,
                r.achieved,
                (r.achieved / f64::from(r.rate) - 1.0) * 100.0,
                us(r.p50),
                us(r.p99),
                us(r.max),
                r.cpu.map_or("-".into(), |c| format!("{c:.0}")),
            );
        }
    }
}
