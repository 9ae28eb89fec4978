//! The Redis example's fault phase (`--fault stall`): the example's own `redis-server` stopped
//! (SIGSTOP) for `--stall` seconds between two healthy spans of `--seconds`, then continued
//! (SIGCONT), while tasks check through `Fallback<Gcra>` (default timeout, 100 ms) and through
//! a bare `Gcra` (its connection's response timeout, 250 ms), each on a connection of its own.
//! Every call is timed and classed by the phase it started in (before, during the stall,
//! after) and by its answer: Redis allowed or denied, fallback allowed or denied, or an error.
//! `tests/redis_example_smoke.rs` runs it briefly against a server of its own.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile::redis::{ConnectOptions, Fallback, Gcra, Mode};
use turnstile::Limit;

use super::report::{fmt_dur, json_f64, json_str, percentile};
use super::Args;

/// Each key's limit in the fault phase: the hot key (every other check of every task) goes
/// over it, the other keys stay well under it, so both kinds of answer show in every phase.
pub const STALL_LIMIT_PER_SEC: f64 = 1000.0;
pub const STALL_BURST: u32 = 100;
/// The keys the other checks pick from.
pub const STALL_KEYS: usize = 1000;
/// How often each task checks.
pub const PACE: Duration = Duration::from_millis(1);
/// The fallback's per-call timeout: `Fallback::new`'s default, 100 ms.
const FALLBACK_TIMEOUT: Duration = Duration::from_millis(100);
/// The bare limiter's bound: `ConnectOptions::new`'s default response timeout, 250 ms.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(250);

/// A signal the fault phase asks for: stop the server, or let it continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Stop,
    Continue,
}

/// The three phases.
pub const PHASES: [&str; 3] = ["before", "stall", "after"];

/// What one call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    RedisAllowed,
    RedisDenied,
    FallbackAllowed,
    FallbackDenied,
    Error,
}

/// One phase of one limiter.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    pub limiter: &'static str,
    pub phase: &'static str,
    pub seconds: f64,
    /// Calls started in the phase.
    pub checks: u64,
    pub redis_allowed: u64,
    pub redis_denied: u64,
    pub fallback_allowed: u64,
    pub fallback_denied: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Latency of every call started in the phase, answered or not.
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Phase {
    /// Calls answered with a verdict (from Redis or in process).
    pub fn answered(&self) -> u64 {
        self.checks - self.errors
    }
}

/// The fault phase's results.
#[derive(Debug, Clone)]
pub struct StallReport {
    pub phases: Vec<Phase>,
    pub tasks: usize,
    pub before: f64,
    pub stall: f64,
    pub after: f64,
    /// When the `Fallback` switched to fallback mode, after the SIGSTOP.
    pub to_fallback_after_stop: Option<Duration>,
    /// When it switched back to Redis, after the SIGCONT.
    pub to_redis_after_continue: Option<Duration>,
    pub switches_to_fallback: u64,
    pub switches_to_redis: u64,
}

impl StallReport {
    pub fn phase(&self, limiter: &str, phase: &str) -> Option<&Phase> {
        self.phases
            .iter()
            .find(|p| p.limiter == limiter && p.phase == phase)
    }

    /// Whether the `Fallback` did what it is for: no error in any phase, answers from the
    /// fallback during the stall, from Redis after it, back on Redis once.
    pub fn fallback_held(&self) -> bool {
        let all = |f: fn(&Phase) -> bool| {
            PHASES
                .iter()
                .filter_map(|ph| self.phase(FALLBACK, ph))
                .all(f)
        };
        all(|p| p.errors == 0)
            && self
                .phase(FALLBACK, "stall")
                .is_some_and(|p| p.fallback_allowed + p.fallback_denied > 0)
            && self
                .phase(FALLBACK, "after")
                .is_some_and(|p| p.redis_allowed + p.redis_denied > 0)
            && self.switches_to_fallback >= 1
            && self.switches_to_redis == self.switches_to_fallback
    }
}

pub const FALLBACK: &str = "fallback_gcra";
pub const BARE: &str = "gcra";

/// One task's record of one call: when it started, how long it took, what it got.
type Record = (Instant, u64, Kind, Option<String>);

/// Runs the fault phase against the server at `url`; `signal` stops and continues that
/// server. Prints the report to `out`.
pub async fn run_stall(
    args: &Args,
    url: &str,
    server: &str,
    signal: &dyn Fn(Signal) -> Result<(), String>,
    out: &mut dyn Write,
) -> Result<StallReport, String> {
    let w = |e: io::Error| e.to_string();
    let tasks = args.tasks.iter().copied().max().unwrap_or(1);
    // The defaults a service gets from `connect`: a 250 ms response timeout.
    let options = ConnectOptions::new();
    let connect = || async {
        turnstile::redis::connect_with(url, &options)
            .await
            .map_err(|e| format!("connecting to {url}: {e}"))
    };
    let limit = Limit::per_second(STALL_LIMIT_PER_SEC).map_err(|e| e.to_string())?;
    let fallback = Fallback::new(
        Gcra::builder(limit, STALL_BURST)
            .prefix("turnstile:stall:fallback:")
            .build(connect().await?)
            .map_err(|e| e.to_string())?,
    );
    // The report states the defaults it ran with: they must be these.
    assert_eq!(fallback.timeout(), FALLBACK_TIMEOUT);
    let bare = Gcra::builder(limit, STALL_BURST)
        .prefix("turnstile:stall:gcra:")
        .build(connect().await?)
        .map_err(|e| e.to_string())?;
    let keys: Arc<Vec<String>> = Arc::new((0..STALL_KEYS).map(|i| format!("client{i}")).collect());
    // One untimed call each: loads the script.
    let _ = fallback
        .check("warm")
        .await
        .map_err(|e| format!("warm-up: {e}"))?;
    bare.throttle("warm", 1)
        .await
        .map_err(|e| format!("warm-up: {e}"))?;

    writeln!(
        out,
        "turnstile redis stall: {server}; SIGSTOP for {:.1} s after {:.1} s, then {:.1} s more\n\
         {tasks} task{} per limiter, each checking every {} ms: every other check on one hot \
         key over its limit ({STALL_LIMIT_PER_SEC}/s, burst {STALL_BURST}), the others on \
         {STALL_KEYS} keys under it\n\
         {FALLBACK}: Fallback<Gcra>, timeout {} ms, PING every 100 ms while in fallback; \
         {BARE}: the bare Gcra, connection response timeout {} ms; one connection each",
        args.stall,
        args.seconds,
        args.seconds,
        if tasks == 1 { "" } else { "s" },
        PACE.as_millis(),
        FALLBACK_TIMEOUT.as_millis(),
        RESPONSE_TIMEOUT.as_millis(),
    )
    .map_err(w)?;

    let start = Instant::now();
    let end = start + Duration::from_secs_f64(2.0 * args.seconds + args.stall);
    let mut handles = Vec::new();
    for i in 0..tasks {
        for which in [FALLBACK, BARE] {
            let (fallback, bare, keys) = (fallback.clone(), bare.clone(), keys.clone());
            handles.push(tokio::spawn(async move {
                let mut records: Vec<Record> = Vec::with_capacity(1 << 14);
                let mut tick = tokio::time::interval(PACE);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut n = 0u64;
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
                loop {
                    tick.tick().await;
                    let t0 = Instant::now();
                    if t0 >= end {
                        break;
                    }
                    n += 1;
                    let key = if n.is_multiple_of(2) {
                        "hot"
                    } else {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        &keys[(rng % keys.len() as u64) as usize]
                    };
                    let (kind, error) = if which == FALLBACK {
                        let mode = fallback.mode();
                        let v = fallback.check(key).await;
                        // The mode around the call: a call that started in Redis mode and
                        // ends in fallback mode is the one that timed out and was answered
                        // in process.
                        let local = mode == Mode::Fallback || fallback.mode() == Mode::Fallback;
                        match v {
                            Ok(Ok(())) if local => (Kind::FallbackAllowed, None),
                            Ok(Err(_)) if local => (Kind::FallbackDenied, None),
                            Ok(Ok(())) => (Kind::RedisAllowed, None),
                            Ok(Err(_)) => (Kind::RedisDenied, None),
                            Err(e) => (Kind::Error, Some(e.to_string())),
                        }
                    } else {
                        match bare.throttle(key, 1).await {
                            Ok(t) if t.allowed => (Kind::RedisAllowed, None),
                            Ok(_) => (Kind::RedisDenied, None),
                            Err(e) => (Kind::Error, Some(e.to_string())),
                        }
                    };
                    let ns = t0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                    records.push((t0, ns, kind, error));
                }
                (which, records)
            }));
        }
    }

    tokio::time::sleep_until((start + Duration::from_secs_f64(args.seconds)).into()).await;
    // Taken just before the signal: from here a call may find the server stopped.
    let stopped = Instant::now();
    signal(Signal::Stop)?;
    tokio::time::sleep_until((stopped + Duration::from_secs_f64(args.stall)).into()).await;
    // Read before the SIGCONT: the one switch so far is the one to fallback.
    let to_fallback = fallback.stats().last_switch;
    let resumed = Instant::now();
    // On an error the server stays stopped: the example's drop kills it.
    signal(Signal::Continue)?;

    let mut by_limiter: Vec<(&'static str, Vec<Record>)> = vec![(FALLBACK, vec![]), (BARE, vec![])];
    for h in handles {
        let (which, records) = h.await.map_err(|e| format!("task failed: {e}"))?;
        let slot = by_limiter.iter_mut().find(|(l, _)| *l == which).unwrap();
        slot.1.extend(records);
    }
    let finished = Instant::now();
    let bounds = [
        (PHASES[0], start, stopped),
        (PHASES[1], stopped, resumed),
        (PHASES[2], resumed, finished),
    ];
    let mut phases = Vec::new();
    for (limiter, records) in &by_limiter {
        for &(phase, from, to) in &bounds {
            let mut p = Phase {
                limiter,
                phase,
                seconds: (to - from).as_secs_f64(),
                ..Phase::default()
            };
            let mut samples = Vec::new();
            for (_, ns, kind, error) in records
                .iter()
                .filter(|r| phase_of(r.0, r.1, stopped, resumed) == phase)
            {
                p.checks += 1;
                samples.push(*ns);
                match kind {
                    Kind::RedisAllowed => p.redis_allowed += 1,
                    Kind::RedisDenied => p.redis_denied += 1,
                    Kind::FallbackAllowed => p.fallback_allowed += 1,
                    Kind::FallbackDenied => p.fallback_denied += 1,
                    Kind::Error => {
                        p.errors += 1;
                        if p.first_error.is_none() {
                            p.first_error = error.clone();
                        }
                    }
                }
            }
            samples.sort_unstable();
            p.p50 = Duration::from_nanos(percentile(&samples, 0.50));
            p.p99 = Duration::from_nanos(percentile(&samples, 0.99));
            p.max = Duration::from_nanos(samples.last().copied().unwrap_or(0));
            phases.push(p);
        }
    }
    let back = fallback.stats().last_switch;
    let report = StallReport {
        phases,
        tasks,
        before: args.seconds,
        stall: (resumed - stopped).as_secs_f64(),
        after: (finished - resumed).as_secs_f64(),
        to_fallback_after_stop: to_fallback.filter(|&t| t >= stopped).map(|t| t - stopped),
        to_redis_after_continue: back
            .filter(|&t| t >= resumed && fallback.stats().switches_to_redis > 0)
            .map(|t| t - resumed),
        switches_to_fallback: fallback.stats().switches_to_fallback,
        switches_to_redis: fallback.stats().switches_to_redis,
    };
    print_stall(&report, out).map_err(w)?;
    Ok(report)
}

/// The phase of a call that started at `t0` and took `ns`: `stall` if it was in flight at any
/// moment between the SIGSTOP and the SIGCONT (so the calls the stop caught in flight count
/// there, with their wait), else `before` or `after`.
fn phase_of(t0: Instant, ns: u64, stopped: Instant, resumed: Instant) -> &'static str {
    let t1 = t0 + Duration::from_nanos(ns);
    if t1 < stopped {
        PHASES[0]
    } else if t0 < resumed {
        PHASES[1]
    } else {
        PHASES[2]
    }
}

/// Prints the table, the switches and what a good result looks like.
pub fn print_stall(r: &StallReport, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "\n{:<14} {:<7} {:>6} {:>7} {:>9} {:>10} {:>10} {:>10} {:>9} {:>10} {:>9} {:>11} {:>7}",
        "limiter",
        "phase",
        "secs",
        "checks",
        "answered",
        "p50",
        "p99",
        "max",
        "redis ok",
        "redis deny",
        "fallbk ok",
        "fallbk deny",
        "errors"
    )?;
    for p in &r.phases {
        writeln!(
            out,
            "{:<14} {:<7} {:>6.1} {:>7} {:>9} {:>10} {:>10} {:>10} {:>9} {:>10} {:>9} {:>11} {:>7}",
            p.limiter,
            p.phase,
            p.seconds,
            p.checks,
            p.answered(),
            fmt_dur(p.p50),
            fmt_dur(p.p99),
            fmt_dur(p.max),
            p.redis_allowed,
            p.redis_denied,
            p.fallback_allowed,
            p.fallback_denied,
            p.errors
        )?;
    }
    let ms =
        |d: Option<Duration>| d.map_or("never".to_string(), |d| format!("{} ms", d.as_millis()));
    writeln!(
        out,
        "{FALLBACK}: to fallback {} after SIGSTOP, back to Redis {} after SIGCONT ({} switch(es) \
         to fallback, {} back)",
        ms(r.to_fallback_after_stop),
        ms(r.to_redis_after_continue),
        r.switches_to_fallback,
        r.switches_to_redis
    )?;
    for p in r.phases.iter().filter(|p| p.errors > 0) {
        writeln!(
            out,
            "{} {}: first error: {}",
            p.limiter,
            p.phase,
            p.first_error.as_deref().unwrap_or("?")
        )?;
    }
    writeln!(
        out,
        "\nwhat a good result looks like: {FALLBACK} answers every check in every phase (no \
         errors), its max within its {} ms timeout plus scheduling slack; during the stall the \
         first checks wait out the timeout, then the fallback answers in process in \
         microseconds, still denying the hot key; it is back on Redis within about one PING \
         interval (100 ms) of the SIGCONT. The bare {BARE} answers nothing during the stall: \
         each check is an error after its {} ms response timeout, never a hang, and Redis \
         answers it again after.",
        FALLBACK_TIMEOUT.as_millis(),
        RESPONSE_TIMEOUT.as_millis()
    )?;
    if r.fallback_held() {
        writeln!(
            out,
            "\nresult: {FALLBACK} answered every check; slowest {} during the stall",
            r.phase(FALLBACK, "stall")
                .map_or("-".to_string(), |p| fmt_dur(p.max))
        )
    } else {
        writeln!(
            out,
            "\nresult: FAILED: {FALLBACK} errors, no fallback answers during the stall, or no \
             Redis answers after it (see the table)"
        )
    }
}

/// The fault phase as JSON (schema `turnstile-redis-stall/1`).
pub fn stall_json(r: &StallReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{{");
    let _ = writeln!(s, "  \"schema\": \"turnstile-redis-stall/1\",");
    let _ = writeln!(
        s,
        "  \"tasks\": {}, \"before_s\": {}, \"stall_s\": {}, \"after_s\": {}, \
         \"to_fallback_after_stop_ms\": {}, \"to_redis_after_continue_ms\": {}, \
         \"switches_to_fallback\": {}, \"switches_to_redis\": {}, \"fallback_held\": {},",
        r.tasks,
        json_f64(r.before),
        json_f64(r.stall),
        json_f64(r.after),
        r.to_fallback_after_stop
            .map_or("null".to_string(), |d| json_f64(d.as_secs_f64() * 1e3)),
        r.to_redis_after_continue
            .map_or("null".to_string(), |d| json_f64(d.as_secs_f64() * 1e3)),
        r.switches_to_fallback,
        r.switches_to_redis,
        r.fallback_held()
    );
    let _ = writeln!(s, "  \"phases\": [");
    for (i, p) in r.phases.iter().enumerate() {
        let _ = writeln!(
            s,
            "    {{\"limiter\": {}, \"phase\": {}, \"seconds\": {}, \"checks\": {}, \
             \"redis_allowed\": {}, \"redis_denied\": {}, \"fallback_allowed\": {}, \
             \"fallback_denied\": {}, \"errors\": {}, \"first_error\": {}, \"p50_ns\": {}, \
             \"p99_ns\": {}, \"max_ns\": {}}}{}",
            json_str(p.limiter),
            json_str(p.phase),
            json_f64(p.seconds),
            p.checks,
            p.redis_allowed,
            p.redis_denied,
            p.fallback_allowed,
            p.fallback_denied,
            p.errors,
            p.first_error
                .as_deref()
                .map_or("null".to_string(), json_str),
            p.p50.as_nanos(),
            p.p99.as_nanos(),
            p.max.as_nanos(),
            if i + 1 == r.phases.len() { "" } else { "," }
        );
    }
    let _ = writeln!(s, "  ]");
    let _ = writeln!(s, "}}");
    s
}
