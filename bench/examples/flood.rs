//! A key flood through `per_key`: N distinct IPv6 clients, one check each, at a given rate or
//! as fast as one thread can send them, while one legitimate client checks on another thread
//! at a steady pace and times every check. What the tower layer does per request, without the
//! HTTP: `Policy::decide` on the policy, with the key the extractor would have read.
//!
//! ```text
//! cargo run --release -p turnstile-bench --example flood -- [--keys N] [--rate KEYS_PER_S]
//!     [--map inline|keyed|sketch|governor] [--max-keys N] [--capacity N] [--memory BYTES]
//!     [--interval-us US] [--limit PER_S] [--burst B] [--baseline]
//! ```
//!
//! `--baseline` keeps the flood's pace and checks nothing: the legitimate client's figures
//! alone, in the same process on the same schedule, which is what its checks cost with no
//! flood at all (each after a sleep of `--interval-us`, so from cold caches).
//!
//! The map is built with its defaults (the key bound, `sweep_every`) unless `--max-keys` says
//! otherwise, and `per_key` runs its sweeps, as a server would get them. `--map sketch` is a
//! `SketchTokenBucket` of `--memory` bytes (4 MiB by default): no keys, no bound, no sweeps.
//! `--map governor` is governor's keyed limiter (`RateLimiter::keyed`, dashmap) behind the same
//! policy: no bound and no sweeps either (`retain_recent` is its user's to call), so it holds
//! every key the flood sends. Every client has the
//! same quota (`--limit`/`--burst`); the legitimate client checks well within it, so any
//! refusal it gets is the map's doing. The flood keys are idle (and so evictable) once their
//! token is back, `1/limit` after their check.
//!
//! Prints, once a second and at the end: the keys sent, the map's size, the process's RSS and
//! peak RSS (`VmRSS`, `VmHWM` from `/proc/self/status`), and the legitimate client's checks:
//! p50, p99, p99.9 and max latency, and how many it was refused.

use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::num::NonZeroU32;

use turnstile::tower::{key, per_key, Ask, PerKey, PerKeyMap, Policy, Taken};
use turnstile::{
    Clock, Denied, Keyed, KeyedTokenBucket, Limit, Nanos, QuantaClock, SketchTokenBucket,
    TokenBucket,
};

struct Args {
    keys: u64,
    /// New keys per second; 0: as fast as possible.
    rate: u64,
    map: String,
    max_keys: Option<u64>,
    /// The inline map's table sized up front for this many keys (its builder's `capacity`).
    capacity: usize,
    /// The sketch's table, bytes.
    memory: usize,
    interval: Duration,
    limit: f64,
    burst: u32,
    /// The flood's pace, no checks.
    baseline: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: flood [--keys N (10000000)] [--rate KEYS_PER_S (1000000; 0 = max)] \
         [--map inline|keyed|sketch|governor (inline)] [--max-keys N (the map's default)] \
         [--capacity N (0; inline only)] [--memory BYTES (4194304; sketch only)] \
         [--interval-us US (1000)] [--limit PER_S (1000)] [--burst B (1000)] [--baseline]"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut a = Args {
        keys: 10_000_000,
        rate: 1_000_000,
        map: "inline".into(),
        max_keys: None,
        capacity: 0,
        memory: 4 << 20,
        interval: Duration::from_millis(1),
        limit: 1000.0,
        burst: 1000,
        baseline: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--keys" => a.keys = value().parse().unwrap_or_else(|_| usage()),
            "--rate" => a.rate = value().parse().unwrap_or_else(|_| usage()),
            "--map" => a.map = value(),
            "--max-keys" => a.max_keys = Some(value().parse().unwrap_or_else(|_| usage())),
            "--capacity" => a.capacity = value().parse().unwrap_or_else(|_| usage()),
            "--memory" => a.memory = value().parse().unwrap_or_else(|_| usage()),
            "--interval-us" => {
                a.interval = Duration::from_micros(value().parse().unwrap_or_else(|_| usage()))
            }
            "--limit" => a.limit = value().parse().unwrap_or_else(|_| usage()),
            "--burst" => a.burst = value().parse().unwrap_or_else(|_| usage()),
            "--baseline" => a.baseline = true,
            _ => usage(),
        }
    }
    if !["inline", "keyed", "sketch", "governor"].contains(&a.map.as_str()) {
        usage();
    }
    a
}

/// `VmRSS` and `VmHWM` in MiB.
fn rss() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The `p`-th percentile of sorted samples (ns).
fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn held(keys: Option<usize>) -> String {
    keys.map_or("-".to_string(), |n| n.to_string())
}

fn us(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1e3)
}

fn decide<M: PerKeyMap<IpAddr>>(p: &Arc<PerKey<IpAddr, key::PeerIp, M>>, ip: IpAddr) -> bool {
    Policy::<()>::decide(p, Some(ip), Ask::default())
        .into_inner()
        .result
        .is_ok()
}

/// governor's keyed limiter as a per-key map: `check_key` for each request's key.
struct GovernorMap {
    limiter: governor::DefaultKeyedRateLimiter<IpAddr>,
    clock: QuantaClock,
}

impl PerKeyMap<IpAddr> for GovernorMap {
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn take(&self, key: &IpAddr, now: Nanos, _: Ask) -> Taken {
        Taken {
            result: self
                .limiter
                .check_key(key)
                .map_err(|_| Denied::new(now, None)),
            wait: Duration::ZERO,
            status: None,
        }
    }

    fn refund(&self, _: &IpAddr, _: Nanos, _: u32) {}
}

/// `len` is the keys the map holds (`None`: a map that holds none).
fn run<M: PerKeyMap<IpAddr>>(a: &Args, map: M, len: fn(&M) -> Option<usize>) {
    let policy = Arc::new(per_key("flood", key::PeerIp, map));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let started = Arc::new(AtomicU64::new(0));
    let legit_ip = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1));

    // Touched up front, so that the samples add nothing to RSS during the flood.
    let mut samples = vec![1u64; 1 << 18]; // not 0: calloc would hand back untouched pages
    samples.clear();
    let legit = {
        let (policy, stop, interval) = (policy.clone(), stop.clone(), a.interval);
        let started = started.clone();
        std::thread::spawn(move || {
            let mut refused = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = decide(&policy, legit_ip);
                samples.push(t.elapsed().as_nanos() as u64);
                started.store(1, Ordering::Relaxed);
                refused += u64::from(!ok);
                std::thread::sleep(interval);
            }
            (samples, refused)
        })
    };

    while started.load(Ordering::Relaxed) == 0 {
        std::thread::yield_now();
    }
    let flood = {
        let (policy, sent, keys, rate) = (policy.clone(), sent.clone(), a.keys, a.rate);
        let baseline = a.baseline;
        std::thread::spawn(move || {
            let start = Instant::now();
            for i in 0..keys {
                // 2001:db8::/32, one /128 per client.
                let ip = IpAddr::V6(Ipv6Addr::from((0x2001_0db8u128 << 96) | u128::from(i)));
                if !baseline {
                    decide(&policy, ip);
                }
                if i % 1024 == 1023 {
                    sent.store(i + 1, Ordering::Relaxed);
                    if rate > 0 {
                        let due = Duration::from_secs_f64((i + 1) as f64 / rate as f64);
                        if let Some(ahead) = due.checked_sub(start.elapsed()) {
                            std::thread::sleep(ahead);
                        }
                    }
                }
            }
            sent.store(keys, Ordering::Relaxed);
        })
    };

    let start = Instant::now();
    // The baseline: both threads running (their stacks, stdout's buffer touched), the first
    // 1 024 flood keys in; what the map takes for the rest is the growth reported.
    while sent.load(Ordering::Relaxed) == 0 && !flood.is_finished() {
        std::thread::yield_now();
    }
    let (rss0, _) = rss();
    println!(
        "{:>5.1} s  after the first 1024 keys: RSS {rss0:.1} MiB",
        start.elapsed().as_secs_f64()
    );
    while !flood.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        let t = start.elapsed();
        if t.as_millis() % 1000 < 100 {
            let (rss, hwm) = rss();
            println!(
                "{:>5.1} s  sent {:>10}  map {:>9}  RSS {rss:>7.1} MiB  peak {hwm:>7.1} MiB",
                t.as_secs_f64(),
                sent.load(Ordering::Relaxed),
                held(len(policy.map())),
            );
        }
    }
    flood.join().unwrap();
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (mut samples, refused) = legit.join().unwrap();
    samples.sort_unstable();
    let (rss, hwm) = rss();
    println!(
        "done: {} keys in {:.2} s ({:.0} keys/s); map {}; RSS {rss:.1} MiB, peak {hwm:.1} MiB \
         ({:+.0} KiB after the first 1024 keys)",
        a.keys,
        elapsed.as_secs_f64(),
        a.keys as f64 / elapsed.as_secs_f64(),
        held(len(policy.map())),
        (rss - rss0) * 1024.0,
    );
    println!(
        "legitimate client: {} checks, {} refused; latency p50 {}, p99 {}, p99.9 {}, max {}",
        samples.len(),
        refused,
        us(pct(&samples, 0.50)),
        us(pct(&samples, 0.99)),
        us(pct(&samples, 0.999)),
        us(samples.last().copied().unwrap_or(0)),
    );
}

fn main() {
    let a = parse();
    let limit = Limit::per_second(a.limit).unwrap_or_else(|_| usage());
    println!(
        "flood: {}{} keys at {}, map {}, max_keys {}, limit {}/s burst {}, legitimate check every {:?}",
        if a.baseline { "baseline, no checks of " } else { "" },
        a.keys,
        if a.rate == 0 {
            "full speed".to_string()
        } else {
            format!("{} keys/s", a.rate)
        },
        a.map,
        a.max_keys
            .map_or("(default)".to_string(), |m| m.to_string()),
        a.limit,
        a.burst,
        a.interval,
    );
    if a.map == "inline" {
        let mut b = KeyedTokenBucket::builder(limit, a.burst).capacity(a.capacity);
        if let Some(m) = a.max_keys {
            b = b.max_keys(m);
        }
        run(&a, b.build().unwrap_or_else(|_| usage()), |m| Some(m.len()));
    } else if a.map == "governor" {
        let quota =
            governor::Quota::per_second(NonZeroU32::new(a.limit as u32).unwrap_or_else(|| usage()))
                .allow_burst(NonZeroU32::new(a.burst).unwrap_or_else(|| usage()));
        let map = GovernorMap {
            limiter: governor::RateLimiter::keyed(quota),
            clock: QuantaClock::new(),
        };
        run(&a, map, |m| Some(m.limiter.len()));
    } else if a.map == "sketch" {
        let sketch = SketchTokenBucket::builder(limit, a.burst)
            .memory(a.memory)
            .build()
            .unwrap_or_else(|_| usage());
        run(&a, sketch, |_| None);
    } else {
        let burst = a.burst;
        let mut b =
            Keyed::builder(move |_: &IpAddr| TokenBucket::builder(limit, burst).build_compact());
        if let Some(m) = a.max_keys {
            b = b.max_keys(m);
        }
        run(&a, b.build().unwrap_or_else(|_| usage()), |m| Some(m.len()));
    }
}
