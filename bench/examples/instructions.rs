//! The measurement binary behind `scripts/instructions`: sets up one cell, then runs its
//! measured loop `ops` times in [`measured`]. On its own it measures nothing; the script runs
//! it under callgrind, counting only inside `measured`, twice per cell with two op counts, and
//! divides the difference of the totals by the difference of the op counts.
//!
//! ```text
//! cargo run --release -p turnstile-bench --example instructions -- <cell> <turnstile|governor> <ops>
//! ```
//!
//! Cells (turnstile goes through its public API only: `TokenBucket::builder`, `allow_n_at`,
//! `Keyed`, `check_n_at`, `ManualClock`, `Nanos`, `Limit`):
//! * `tb-allow`: one limiter that grants every check. turnstile: `allow_n_at(now, 1)` at a
//!   fixed time on a `ManualClock` (clock-free), 1e10/s with a burst of `u32::MAX` as in
//!   `bench/benches/token_bucket.rs`. governor: `check()` on `direct_with_clock(.., FakeRelativeClock)`
//!   (its clock read is one relaxed load), 1e9/s (its finest) with a burst of `u32::MAX`.
//! * `tb-deny`: one limiter that denies every check: turnstile 1e-3/s, governor 1 per hour,
//!   both with a burst of 1, drained during setup.
//! * `keyed-hot`: one key checked over and over, always granted. turnstile:
//!   `Keyed<u64, TokenBucket<ManualClock>>` and `check_n_at(&7, now, 1)` at a fixed time;
//!   governor: `dashmap_with_clock(.., FakeRelativeClock)` (its default store and hasher, with
//!   a fake clock) and `check_key(&7)`. Limits as in `tb-allow`.
//! * `keyed-random`: 100 000 keys inserted during setup, then each check picks a key from a
//!   fixed xorshift sequence (the same in every run and for both crates).
//! * `inline-hot`, `inline-random` (and `-foldhash`): the same two workloads on
//!   `KeyedTokenBucket` (the state inline, one word per key), 1e9/s with a burst of `u32::MAX`
//!   (governor's quota), with std's SipHash (the default, as governor's) or a seeded foldhash;
//!   the governor side is that of `keyed-hot` / `keyed-random`.
//! * `sketch-random`: the random-key workload on `SketchTokenBucket` (issue #24: no keys held,
//!   a 4 MiB table of cells, std's SipHash), at the same limit with its largest burst, 2^15,
//!   which the checks never exhaust; the governor side is `keyed-random`'s. The table is eight
//!   times the simulated last-level cache, so a random key's check misses it, once.
//! * `policy-hot` (`turnstile`, `facade`): issue #25's metrics overhead, see [`policy_hot`];
//!   `scripts/metrics-overhead` runs it, not `scripts/instructions`.
//! * `tb-allow-clock`, `tb-deny-clock`, `keyed-hot-clock`: the same with each crate's default
//!   real clock (turnstile `TokenBucket::new` + `allow()`, `Keyed::check`; governor
//!   `RateLimiter::direct`/`keyed` + `check`/`check_key`). Under valgrind the clock read is
//!   whatever each clock does on valgrind's emulated CPU, so these rows say less about native
//!   runs than the clock-free ones.
//!
//! * `keyed-random-<limiter>` (`inline`, `inline-leaky`, `inline-meter`, `inline-window`,
//!   `inline-bursty`, `inline-warming`, `inline-sliding`, `tb`, `leaky`, `fixed`, `sliding`,
//!   `bursty`, `warming`, `meter`, `governor`): every limiter in `Keyed<u64, L>` (`inline`:
//!   `KeyedTokenBucket`; `inline-leaky`: `KeyedLeakyBucket`, as `leaky` without slack;
//!   `inline-meter`: `KeyedLeakyMeter`, as `meter`;
//!   `inline-window`: `KeyedWindow`, as `fixed`; `inline-bursty`: `KeyedSmoothBursty`, as
//!   `bursty`; `inline-warming`: `KeyedSmoothWarmingUp`, as `warming`; `inline-sliding`:
//!   `KeyedSlidingWindow`, as `sliding`;
//!   `governor`: its keyed limiter) over 100 000 keys, **saturated**: each
//!   key at 10/s with a capacity of one (`bench/benches/harness/saturated.rs`, "every limiter per
//!   key"), inserted and emptied during setup, then `check_n_at(&key, t, 1)` with the retry
//!   time, `t` advancing 50 ns a check, keys from the xorshift sequence; see [`many_keys`].
//!   Beside them the floors of the two designs over the same keys (`floor`: the word in a
//!   16-byte table slot, one miss; `floor-indirect`: the word on a line of its own behind a
//!   pointer in the slot, two dependent misses, as any `Keyed<u64, L>`): [`sat::KeyedFloor`].
//!
//! Every loop passes the limiter, the time and the result through `std::hint::black_box`, and
//! each cell asserts after its loop that the last check still had the expected outcome, so a
//! cell that stopped measuring what it claims fails instead of printing a figure.

use std::collections::hash_map::RandomState;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use turnstile::keyed::multi_token_bucket::{Bandwidth, KeyedMultiTokenBucket};
use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
use turnstile::MultiTokenBucket;
use turnstile::{
    Keyed, KeyedLeakyBucket, KeyedLeakyMeter, KeyedSlidingWindow, KeyedSmoothBursty,
    KeyedSmoothWarmingUp, KeyedTokenBucket, KeyedWindow, Limit, ManualClock, Nanos, TokenBucket,
};

#[path = "../benches/harness/saturated.rs"]
mod saturated;
use saturated as sat;
use saturated::{Expect, Schedule};

/// The fixed time of every clock-free turnstile check (1 s after the origin).
const NOW: Nanos = Nanos::new(1_000_000_000);
/// Keys of the `keyed-random` cell.
const KEYS: u64 = 100_000;
/// The inline map's always-granting quota: governor's, 1e9/s with a burst of `u32::MAX`.
const OK_LIMIT_INLINE: f64 = 1e9;

fn limit(per_second: f64) -> Limit {
    Limit::per_second(per_second).expect("valid limit")
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("nonzero")
}

/// governor's always-granting quota: 1e9/s (a 1 ns period, its finest), burst `u32::MAX`.
fn gov_ok_quota() -> Quota {
    Quota::per_second(nz(1_000_000_000)).allow_burst(nz(u32::MAX))
}

/// governor's always-denying quota once drained: 1 per hour, burst 1.
fn gov_deny_quota() -> Quota {
    Quota::per_hour(nz(1)).allow_burst(nz(1))
}

/// turnstile's always-granting bucket on a stopped clock: 1e10/s, burst `u32::MAX`.
fn ts_ok(clock: ManualClock) -> TokenBucket<ManualClock> {
    TokenBucket::builder(limit(1e10), u32::MAX)
        .clock(clock)
        .build()
}

/// The `multi<k>-allow` bucket: `k` limits of bursts that outlast every check of a cell at
/// one instant (2 000 000: the largest round number a 21-bit field of four limits holds).
fn multi_ok(k: usize, clock: ManualClock) -> MultiTokenBucket<ManualClock> {
    let limits: Vec<_> = (1..=k as u32)
        .map(|i| Bandwidth::new(limit(1000.0 * f64::from(i)), 2_000_000))
        .collect();
    MultiTokenBucket::builder(&limits)
        .clock(clock)
        .build()
        .expect("valid limits")
}

/// The first state of the `keyed-random` key sequence (any nonzero value).
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

/// The measured loop: `op`, `ops` times. Never inlined, so that callgrind can count this
/// function (and everything it calls) and nothing else (`--toggle-collect`): the setup before
/// it, including one-time work such as calibrating a TSC clock whose cost varies from run to
/// run, stays out of the figures.
#[inline(never)]
fn measured(ops: u64, mut op: impl FnMut()) {
    for _ in 0..ops {
        op();
    }
}

/// `x`'s successor in the xorshift64 sequence (13, 7, 17).
fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// The clock-free keyed limiter, one always-granting bucket per key.
fn ts_keyed(clock: &ManualClock) -> Keyed<u64, TokenBucket<ManualClock>, ManualClock> {
    let per_key = clock.clone();
    Keyed::builder(move |_: &u64| ts_ok(per_key.clone()))
        .clock(clock.clone())
        .sweep_every(Duration::MAX)
        .build()
        .expect("valid keyed limiter")
}

fn ts_inline<S: std::hash::BuildHasher>(
    clock: &ManualClock,
    hasher: S,
) -> KeyedTokenBucket<u64, S, ManualClock> {
    KeyedTokenBucket::builder(limit(OK_LIMIT_INLINE), u32::MAX)
        .hasher(hasher)
        .clock(clock.clone())
        .sweep_every(Duration::MAX)
        .build()
        .expect("valid keyed limiter")
}

/// The inline map's hot key: one key checked over and over at a fixed time.
fn inline_hot<S: std::hash::BuildHasher>(hasher: S, ops: u64) {
    let k = ts_inline(&ManualClock::new(NOW), hasher);
    measured(ops, || {
        let _ = black_box(black_box(&k).check_n_at(black_box(&7), black_box(NOW), 1));
    });
    assert!(k.check_n_at(&7, NOW, 1).is_ok(), "inline-hot ran dry");
}

/// A random-key cell: `KEYS` keys inserted with `check` first, then `ops` checks on keys from
/// the xorshift sequence; `len` must still be `KEYS` afterwards.
fn random_keys(ops: u64, check: impl Fn(u64) -> bool, len: impl Fn() -> usize, cell: &str) {
    for key in 0..KEYS {
        assert!(check(key), "{cell}: key {key} refused while inserting");
    }
    let mut x = SEED;
    measured(ops, || {
        x = xorshift(x);
        black_box(check(x % KEYS));
    });
    assert_eq!(len() as u64, KEYS, "{cell} added or lost keys");
}

/// The inline map over `KEYS` keys inserted first, checked in the xorshift order.
fn inline_random<S: std::hash::BuildHasher>(hasher: S, ops: u64) {
    let k = ts_inline(&ManualClock::new(NOW), hasher);
    let check = |key| black_box(&k).check_n_at(&key, black_box(NOW), 1).is_ok();
    random_keys(ops, check, || k.len(), "inline-random");
}

/// The sketch of `sketch-random`: see the module docs.
fn sketch() -> SketchTokenBucket<u64, std::collections::hash_map::RandomState, ManualClock> {
    SketchTokenBucket::builder(limit(OK_LIMIT_INLINE), 1 << 15)
        .clock(ManualClock::new(NOW))
        .build()
        .expect("valid sketch")
}

/// The sketch over `KEYS` keys checked once each first (it holds no keys: `len` is `KEYS`
/// by definition), then in the xorshift order.
fn sketch_random(ops: u64) {
    let k = sketch();
    let check = |key| black_box(&k).check_n_at(&key, black_box(NOW), 1).is_ok();
    random_keys(ops, check, || KEYS as usize, "sketch-random");
}

/// `policy-hot` (issue #25, `scripts/metrics-overhead`): `Policy::decide` of a `per_key`
/// over the inline map of `inline-hot`, its hot key, granted; `facade` adds one increment of
/// a Prometheus counter through the `metrics` facade. Built with and without the bench's
/// `metrics` feature, `turnstile` is the decision with and without its counts.
fn policy_hot(ops: u64, facade: bool) {
    use axum::http::Request;
    use std::sync::Arc;
    use turnstile::tower::{key, per_key, Ask, Policy};
    let map = ts_inline(&ManualClock::new(NOW), RandomState::new());
    let p = Arc::new(per_key(
        "hot",
        key::from_fn(|_: &Request<()>| Some(7u64)),
        map,
    ));
    // The whole decision black-boxed, as the layer reads all of it (result, wait, report):
    // the optimizer may not drop the parts a loop that only tests the result leaves unread.
    let decide = || {
        let d = Policy::<()>::decide(black_box(&p), Some(7), Ask::default()).into_inner();
        black_box(&d).result.is_ok()
    };
    if facade {
        let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let counter = metrics::with_local_recorder(&prometheus, || {
            metrics::counter!("bench_decisions_total")
        });
        measured(ops, || {
            decide();
            counter.increment(1);
        });
    } else {
        measured(ops, || {
            decide();
        });
    }
    assert!(decide(), "policy-hot ran dry");
}

// ---- the saturated and burst cells (bench/benches/harness/saturated.rs) ---------------------------

/// The clock-free cells of the saturated workload (`sat-<limiter>-<op>`) and of the burst
/// workload (`burst-<limiter>-check`), each with the implementations it compares. `twin` is
/// the limiter's mutex twin (`turnstile::reference`), `floor` [`sat::Floor`] or
/// [`sat::KeyedFloor`]. Every cell also has `loop` (the loop, the schedule and, keyed, the key
/// sequence, without a check: what the script subtracts) and, where governor is measured,
/// `fake-clock` (the loop plus the advance of governor's fake clock, without a check), as
/// [`imps`] lists them.
const SAT_CELLS: &[(&str, &[&str])] = &[
    ("sat-tb-check", &["turnstile", "twin", "governor", "floor"]),
    ("sat-tb-allow", &["turnstile", "twin", "governor", "floor"]),
    ("sat-leaky-check", &["turnstile", "twin", "floor"]),
    ("sat-leaky-allow", &["turnstile", "twin", "floor"]),
    ("sat-bursty-check", &["turnstile", "twin", "floor"]),
    ("sat-bursty-allow", &["turnstile", "twin", "floor"]),
    ("sat-warming-check", &["turnstile", "twin", "floor"]),
    ("sat-warming-allow", &["turnstile", "twin", "floor"]),
    ("sat-fixed-check", &["turnstile", "twin", "floor"]),
    ("sat-fixed-allow", &["turnstile", "twin", "floor"]),
    ("sat-sliding-check", &["turnstile", "twin", "floor"]),
    ("sat-sliding-allow", &["turnstile", "twin", "floor"]),
    ("sat-meter-check", &["turnstile", "floor"]),
    ("sat-meter-allow", &["turnstile", "floor"]),
    ("sat-sometimes-allow", &["turnstile", "floor"]),
    ("sat-keyed-hot-check", &["turnstile", "governor", "floor"]),
    (
        "sat-keyed-random-check",
        &["turnstile", "governor", "floor"],
    ),
    ("sat-inline-hot-check", &["turnstile", "governor", "floor"]),
    (
        "sat-inline-random-check",
        &["turnstile", "governor", "floor"],
    ),
    ("burst-tb-check", &["turnstile", "twin", "governor"]),
    ("burst-leaky-check", &["turnstile", "twin"]),
    ("burst-bursty-check", &["turnstile", "twin"]),
    ("burst-warming-check", &["turnstile", "twin"]),
    ("burst-fixed-check", &["turnstile", "twin"]),
    ("burst-sliding-check", &["turnstile", "twin"]),
    ("burst-meter-check", &["turnstile"]),
    // issue #23: the multi-limit bucket (`turnstile`), the single token bucket at its binding
    // limit (`single`), the twin, and two governor limiters checked in turn.
    (
        "sat-multi2-check",
        &["turnstile", "single", "twin", "governor", "floor"],
    ),
    ("sat-multi4-check", &["turnstile", "single"]),
];

/// The many-keys cells of the maps with the state inline: `inline` (`KeyedTokenBucket`),
/// `inline-leaky` (`KeyedLeakyBucket`), `inline-meter` (`KeyedLeakyMeter`), `inline-window`
/// (`KeyedWindow`), `inline-bursty` (`KeyedSmoothBursty`), `inline-warming`
/// (`KeyedSmoothWarmingUp`), `inline-sliding`
/// (`KeyedSlidingWindow`).
const INLINE: [&str; 8] = [
    "inline",
    "inline-multi2",
    "inline-leaky",
    "inline-meter",
    "inline-window",
    "inline-bursty",
    "inline-warming",
    "inline-sliding",
];

/// The implementations of an allowed cell that has a floor beside turnstile and governor: a
/// load and a CAS on the word, 64-bit (`floor`, the single-limit bucket's) or 128-bit
/// (`floor128`, the multi-limit bucket's).
fn allowed_imps(cell: &str) -> Option<Vec<&'static str>> {
    match cell {
        "tb-allow" => Some(vec!["turnstile", "governor", "floor"]),
        "multi2-allow" | "multi4-allow" => Some(vec!["turnstile", "governor", "floor128"]),
        _ => None,
    }
}

/// Every implementation `cell` measures (see [`SAT_CELLS`]); `None` if it is not a saturated
/// or burst cell.
fn imps(cell: &str) -> Option<Vec<&'static str>> {
    let listed = match cell.strip_prefix("keyed-random-") {
        Some("governor") => &["governor"][..],
        Some("floor" | "floor-indirect") => &["floor"][..],
        Some(lim) if INLINE.contains(&lim) || sat::MANY_LIMITERS.contains(&lim) => {
            &["turnstile"][..]
        }
        _ => SAT_CELLS.iter().find(|(c, _)| *c == cell)?.1,
    };
    let mut v = listed.to_vec();
    v.push("loop");
    if listed.contains(&"governor") {
        v.push("fake-clock");
    }
    Some(v)
}

/// A clock-free cell: `op(t, moved)` (true if granted; `moved` is how far `t` is after the
/// previous check's time) at the times of `s`, `ops` times through [`sat::run_checks`]
/// inside [`measured`]; then
/// [`sat::verify`]: [`sat::VERIFY`] more, whose grants must be as `expect` says.
fn stepped(
    ops: u64,
    mut s: Schedule,
    expect: Expect,
    what: &str,
    mut op: impl FnMut(Nanos, u64) -> bool,
) {
    measured(1, || {
        black_box(sat::run_checks(&mut s, &mut op, ops));
    });
    let granted = sat::verify(&mut s, expect, what, op);
    eprintln!(
        "{what}: {granted} of {} checks granted after the loop",
        sat::VERIFY
    );
}

/// `keys` keys inserted and emptied with `insert` (a check at the schedule's start, true if
/// granted: `burst` of them a key, all granted), then `op(key, t, moved)` on keys from the
/// xorshift sequence, as [`stepped`]. Emptied, every key is saturated from the first check
/// on, instead of spending its burst at a random point of the loop.
#[allow(clippy::too_many_arguments)]
fn stepped_keys(
    ops: u64,
    s: Schedule,
    expect: Expect,
    what: &str,
    keys: u64,
    burst: u32,
    mut insert: impl FnMut(u64) -> bool,
    mut op: impl FnMut(u64, Nanos, u64) -> bool,
) {
    for key in 0..keys {
        for _ in 0..burst {
            assert!(insert(key), "{what}: key {key} refused while emptying it");
        }
    }
    let mut x = SEED;
    stepped(ops, s, expect, what, |t, moved| {
        x = xorshift(x);
        op(x % keys, t, moved)
    });
}

/// The many-keys cells (`keyed-random-<limiter>`): [`sat::MANY_KEYS`] keys, each emptied
/// during setup at a time of its own, spread over one [`sat::MANY_PERIOD`] before
/// [`sat::START`] (key `k` at `START - MANY_PERIOD + k * MANY_PERIOD / MANY_KEYS`, in
/// order), so that from the first check on keys come due at the steady rate of a saturated
/// map (emptied at one instant, no key would refill within a measurement); then `op(key, t,
/// moved)` on the saturated schedule with keys from the xorshift sequence, as [`stepped`],
/// expecting one grant in about 20. `op` empties the keys too (checks until one is refused).
fn many_keys(ops: u64, expect: Expect, what: &str, mut op: impl FnMut(u64, Nanos, u64) -> bool) {
    let lim = what.strip_prefix("keyed-random-").unwrap_or(what);
    let period = u64::try_from(sat::many_due(lim).as_nanos()).expect("a short period");
    let step = period / sat::MANY_KEYS;
    let mut t = sat::START.as_u64() - period;
    for key in 0..sat::MANY_KEYS {
        t += step;
        let mut moved = step;
        let mut granted = 0;
        while op(key, Nanos::new(t), moved) {
            moved = 0;
            granted += 1;
            assert!(
                granted < 16,
                "{what}: key {key} never refused while emptying it"
            );
        }
    }
    assert_eq!(
        t,
        sat::START.as_u64(),
        "{what}: setup ends at the schedule's start"
    );
    let mut x = SEED;
    stepped(ops, Schedule::saturated(), expect, what, |t, moved| {
        x = xorshift(x);
        op(x % sat::MANY_KEYS, t, moved)
    });
}

/// One many-keys cell (see [`many_keys`]): `lim` one of [`sat::MANY_LIMITERS`] on
/// `Keyed<u64, L>`, `inline` (`KeyedTokenBucket` at the same rate with a burst of 1) or
/// `governor` (its keyed limiter, same quota, on a `FakeRelativeClock` advanced by the
/// schedule); each with `loop` (and governor's `fake-clock`) to subtract.
fn many_keys_cell(lim: &str, imp: &str, ops: u64, cell: &str) {
    // The map's clock at the earliest emptying time: the checks pass their own times.
    let due = u64::try_from(sat::many_due(lim).as_nanos()).expect("a short period");
    let clock = ManualClock::new(Nanos::new(sat::START.as_u64() - due));
    let (rate, expect) = (sat::MANY_RATE, Expect::Saturated);
    match (lim, imp) {
        (_, "loop") => many_keys(ops, Expect::Refused, cell, |k, t, _| {
            black_box((k, t)) == (u64::MAX, Nanos::ZERO)
        }),
        (_, "fake-clock") => {
            let c = FakeRelativeClock::default();
            many_keys(ops, Expect::Refused, cell, |k, t, m| {
                sat::advance(&c, m);
                black_box((k, t)) == (u64::MAX, Nanos::ZERO)
            });
        }
        ("governor", _) => {
            let (g, c) = sat::governor_keyed_fake(rate, 1, RandomState::new());
            many_keys(ops, expect, cell, |k, _, m| {
                sat::advance(&c, m);
                sat::gov_check_key(&g, k)
            });
        }
        ("floor", _) => {
            let f = sat::KeyedFloor::new(clock, 0..sat::MANY_KEYS);
            many_keys(ops, Expect::Refused, cell, |k, t, _| f.check_at(k, t));
        }
        ("floor-indirect", _) => {
            let f = sat::KeyedFloor::indirect(clock, 0..sat::MANY_KEYS);
            many_keys(ops, Expect::Refused, cell, |k, t, _| f.check_at(k, t));
        }
        ("inline", _) => {
            let l = sat::keyed_bucket(clock, rate, 1, RandomState::new());
            many_keys(ops, expect, cell, |k, t, _| {
                sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1))
            });
        }
        ("inline-multi2", _) => {
            // As `inline`, and a daily limit that never binds (the schedule grants each key
            // about 864 000 a day).
            let l = KeyedMultiTokenBucket::builder(&[
                Bandwidth::new(Limit::per_second(f64::from(rate)).expect("a rate"), 1),
                Bandwidth::per(1_000_000, Duration::from_secs(86_400)),
            ])
            .clock(clock)
            .sweep_every(Duration::MAX)
            .build()
            .expect("valid keyed limiter");
            many_keys(ops, expect, cell, |k, t, _| {
                sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1))
            });
        }
        ("inline-leaky", _) => {
            // As `leaky`: no slack, one request a `MANY_PERIOD`.
            let l = KeyedLeakyBucket::builder(rate)
                .without_slack()
                .clock(clock)
                .sweep_every(Duration::MAX)
                .build()
                .expect("valid keyed limiter");
            many_keys(ops, expect, cell, |k, t, _| {
                sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1))
            });
        }
        ("inline-meter", _) => {
            // As `meter`: a capacity of one unit, leaking `rate` a second.
            let leak = Limit::per_second(f64::from(rate)).expect("a rate");
            let l = KeyedLeakyMeter::builder(1, leak)
                .clock(clock)
                .sweep_every(Duration::MAX)
                .build()
                .expect("valid keyed limiter");
            many_keys(ops, expect, cell, |k, t, _| {
                sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1))
            });
        }
        ("inline-window", _) => {
            // As `fixed`: one request a `MANY_PERIOD`.
            let l = KeyedWindow::builder(1, sat::MANY_PERIOD)
                .clock(clock)
                .sweep_every(Duration::MAX)
                .build()
                .expect("valid keyed limiter");
            many_keys(ops, expect, cell, |k, t, _| {
                sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1))
            });
        }
        ("inline-sliding", _) => {
            // As `sliding`: one request a `MANY_PERIOD`.
            let l = KeyedSlidingWindow::builder(1, sat::MANY_PERIOD)
                .clock(clock)
                .sweep_every(Duration::MAX)
                .build()
                .expect("valid keyed limiter");
            many_keys(ops, expect, cell, |k, t, _| {
                sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1))
            });
        }
        ("inline-bursty", _) => {
            // As `bursty`: one request's worth (a `MANY_PERIOD`) of burst, one stored permit.
            let l = KeyedSmoothBursty::builder(f64::from(rate))
                .max_burst_seconds(sat::MANY_PERIOD.as_secs_f64())
                .clock(clock)
                .sweep_every(Duration::MAX)
                .build()
                .expect("valid keyed limiter");
            many_keys(ops, expect, cell, |k, t, _| {
                sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1))
            });
        }
        ("inline-warming", _) => {
            // As `warming`: one request's worth (a `MANY_PERIOD`) of warm-up, cold factor 3.
            let l = KeyedSmoothWarmingUp::builder(f64::from(rate), sat::MANY_PERIOD)
                .clock(clock)
                .sweep_every(Duration::MAX)
                .build()
                .expect("valid keyed limiter");
            many_keys(ops, expect, cell, |k, t, _| {
                sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1))
            });
        }
        _ => crate::with_many_keyed!(sat, lim, clock, |l| many_keys(
            ops,
            expect,
            cell,
            |k, t, _| { sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1)) }
        )),
    }
}

/// One saturated, burst or many-keys cell; `None` if `cell` is not one.
fn saturated_cell(cell: &str, imp: &str, ops: u64) -> Option<Result<(), String>> {
    let imps = imps(cell)?;
    if !imps.contains(&imp) {
        return Some(Err(format!(
            "cell {cell} has no implementation {imp:?} (it has {imps:?})"
        )));
    }
    if let Some(lim) = cell.strip_prefix("keyed-random-") {
        many_keys_cell(lim, imp, ops, cell);
        return Some(Ok(()));
    }
    let (kind, rest) = cell.split_once('-').expect("a cell name");
    let (lim, op) = rest.rsplit_once('-').expect("a cell name");
    let burst = kind == "burst";
    let expect = match (imp, burst) {
        ("floor" | "loop" | "fake-clock", _) => Expect::Refused,
        (_, true) => Expect::Burst,
        (_, false) => Expect::Saturated,
    };
    let one_ms = Duration::from_millis(1);
    let (capacity, refill) = match lim {
        "fixed" | "sliding" => (u64::from(sat::QUOTA), sat::WINDOW),
        "warming" => (u64::from(sat::BURST), sat::WARMUP),
        _ => (u64::from(sat::BURST), one_ms),
    };
    let s = if burst {
        Schedule::burst(capacity, refill)
    } else {
        Schedule::saturated()
    };
    // The burst cell's SmoothBursty holds 1 ms of permits (the token bucket's 1000), so that
    // its burst is larger than its bucket; the saturated cell's has the shootout's 1 s.
    let burst_seconds = if burst {
        f64::from(sat::BURST) / f64::from(sat::RATE)
    } else {
        1.0
    };
    let clock = ManualClock::new(sat::START);
    macro_rules! go {
        ($s:expr, |$t:pat_param, $m:pat_param| $body:expr) => {
            stepped(ops, $s, expect, cell, |$t: Nanos, $m: u64| $body)
        };
    }
    // A smooth limiter's saturated schedule starts once its stored permits are spent; its
    // burst schedule starts from rest, where the burst finds them.
    macro_rules! smooth {
        ($l:expr) => {{
            let l = $l;
            let s = if burst {
                s
            } else {
                let stored = l.stored_permits_at(sat::START);
                s.from(sat::drained_at(
                    &l,
                    stored,
                    |n| l.reserve_n_at(sat::START, n).expect("a reservation"),
                    sat::START,
                ))
            };
            (l, s)
        }};
    }
    match (lim, op, imp) {
        ("keyed-hot" | "keyed-random" | "inline-hot" | "inline-random", _, _) => {
            keyed_cell(lim, imp, ops, s, expect, cell, clock)
        }
        (_, _, "floor") => {
            let f = sat::Floor::new(clock);
            go!(s, |t, _| f.check_at(t));
        }
        (_, _, "loop") => go!(s, |t, _| black_box(t) == Nanos::ZERO),
        (_, _, "fake-clock") => {
            let c = FakeRelativeClock::default();
            go!(s, |t, m| {
                sat::advance(&c, m);
                black_box(t) == Nanos::ZERO
            });
        }
        ("tb", "check", "turnstile") | ("multi2" | "multi4", "check", "single") => {
            let l = sat::token_bucket(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("multi2" | "multi4", "check", "turnstile") => {
            let l = sat::multi(clock, if lim == "multi2" { 2 } else { 4 });
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("multi2", "check", "twin") => {
            let l = sat::twin_multi(clock, 2);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("multi2", "check", "governor") => {
            let (g, c) = sat::governor_pair_fake();
            go!(s, |_, m| {
                sat::advance(&c, m);
                sat::gov_check_pair(&g)
            });
        }
        ("tb", "allow", "turnstile") => {
            let l = sat::token_bucket(clock);
            go!(s, |t, _| black_box(&l).allow_at(black_box(t)));
        }
        ("tb", "check", "twin") => {
            let l = sat::twin_token_bucket(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("tb", "allow", "twin") => {
            let l = sat::twin_token_bucket(clock);
            go!(s, |t, _| black_box(&l).allow_at(black_box(t)));
        }
        ("tb", "check", "governor") => {
            let (g, c) = sat::governor_fake();
            go!(s, |_, m| {
                sat::advance(&c, m);
                sat::gov_check(&g)
            });
        }
        ("tb", "allow", "governor") => {
            let (g, c) = sat::governor_fake();
            go!(s, |_, m| {
                sat::advance(&c, m);
                black_box(&g).check().is_ok()
            });
        }
        ("leaky", "check", "turnstile") => {
            let l = sat::leaky_bucket(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("leaky", "allow", "turnstile") => {
            let l = sat::leaky_bucket(clock);
            go!(s, |t, _| black_box(&l).try_take_at(black_box(t)));
        }
        ("leaky", "check", "twin") => {
            let l = sat::twin_leaky_bucket(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("leaky", "allow", "twin") => {
            let l = sat::twin_leaky_bucket(clock);
            go!(s, |t, _| black_box(&l).try_take_at(black_box(t)));
        }
        ("bursty", "check", "turnstile") => {
            let (l, s) = smooth!(sat::smooth_bursty(clock, burst_seconds));
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("bursty", "allow", "turnstile") => {
            let (l, s) = smooth!(sat::smooth_bursty(clock, burst_seconds));
            go!(s, |t, _| matches!(
                black_box(&l).try_acquire_at(black_box(t), 1, Duration::ZERO),
                Ok(Some(_))
            ));
        }
        ("bursty", "check", "twin") => {
            let (l, s) = smooth!(sat::twin_smooth_bursty(clock, burst_seconds));
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("bursty", "allow", "twin") => {
            let (l, s) = smooth!(sat::twin_smooth_bursty(clock, burst_seconds));
            go!(s, |t, _| matches!(
                black_box(&l).try_acquire_at(black_box(t), 1, Duration::ZERO),
                Ok(Some(_))
            ));
        }
        ("warming", "check", "turnstile") => {
            let (l, s) = smooth!(sat::smooth_warming_up(clock));
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("warming", "allow", "turnstile") => {
            let (l, s) = smooth!(sat::smooth_warming_up(clock));
            go!(s, |t, _| matches!(
                black_box(&l).try_acquire_at(black_box(t), 1, Duration::ZERO),
                Ok(Some(_))
            ));
        }
        ("warming", "check", "twin") => {
            let (l, s) = smooth!(sat::twin_smooth_warming_up(clock));
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("warming", "allow", "twin") => {
            let (l, s) = smooth!(sat::twin_smooth_warming_up(clock));
            go!(s, |t, _| matches!(
                black_box(&l).try_acquire_at(black_box(t), 1, Duration::ZERO),
                Ok(Some(_))
            ));
        }
        ("fixed", "check", "turnstile") => {
            let l = sat::fixed_window(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("fixed", "allow", "turnstile") => {
            let l = sat::fixed_window(clock);
            go!(s, |t, _| black_box(&l).take_at(black_box(t)).is_permitted());
        }
        ("fixed", "check", "twin") => {
            let l = sat::twin_fixed_window(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("fixed", "allow", "twin") => {
            let l = sat::twin_fixed_window(clock);
            go!(s, |t, _| black_box(&l).take_at(black_box(t)).is_permitted());
        }
        ("sliding", "check", "turnstile") => {
            let l = sat::sliding_window(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("sliding", "allow", "turnstile") => {
            let l = sat::sliding_window(clock);
            go!(s, |t, _| black_box(&l).allow_at(black_box(t)));
        }
        ("sliding", "check", "twin") => {
            let l = sat::twin_sliding_window(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("sliding", "allow", "twin") => {
            let l = sat::twin_sliding_window(clock);
            go!(s, |t, _| black_box(&l).allow_at(black_box(t)));
        }
        ("meter", "check", "turnstile") => {
            let l = sat::leaky_meter(clock);
            go!(s, |t, _| sat::check_at(&l, t));
        }
        ("meter", "allow", "turnstile") => {
            let l = sat::leaky_meter(clock);
            go!(s, |t, _| black_box(&l).allow_at(black_box(t)));
        }
        ("sometimes", "allow", "turnstile") => {
            let l = sat::sometimes(clock);
            go!(s, |t, _| black_box(&l).run_at(black_box(t), || ()));
        }
        _ => unreachable!("{cell} {imp} is listed in SAT_CELLS but has no arm"),
    }
    Some(Ok(()))
}

/// The keyed saturated cells: `keyed-*` on `Keyed<u64, TokenBucket>` (compact buckets, as the
/// shootout's), `inline-*` on `KeyedTokenBucket`, both beside governor's keyed limiter
/// (dashmap, on a `FakeRelativeClock`) and [`sat::KeyedFloor`], all hashing with `RandomState`
/// (SipHash-1-3, each process with its own random keys: what users run). The keys shape the
/// tables, so the random-key figures move by a few per cent from run to run (the hot key's do
/// not); fixed keys would make them repeat, but let the compiler fold the key setup into the
/// hash (~5-16 instructions fewer a check, and not in `Keyed`'s map, which takes no hasher). `*-hot`: key [`sat::HOT`] at
/// the phase-1 quota; `*-random`: [`sat::KEYS`] keys inserted first, then picked from the
/// xorshift sequence, each at [`sat::KEY_RATE`]/s with a burst of [`sat::KEY_BURST`].
fn keyed_cell(
    lim: &str,
    imp: &str,
    ops: u64,
    s: Schedule,
    expect: Expect,
    cell: &str,
    clock: ManualClock,
) {
    let (map, keys) = lim.split_once('-').expect("a keyed cell");
    let (rate, burst) = sat::keyed_quota(keys == "hot");
    let start = sat::START;
    macro_rules! go {
        (|$k:pat_param, $t:pat_param, $m:pat_param| $body:expr, |$ik:pat_param| $insert:expr) => {
            if keys == "hot" {
                stepped(ops, s, expect, cell, |$t: Nanos, $m: u64| {
                    let $k = sat::HOT;
                    $body
                })
            } else {
                stepped_keys(
                    ops,
                    s,
                    expect,
                    cell,
                    sat::KEYS,
                    burst,
                    |$ik: u64| $insert,
                    |$k: u64, $t: Nanos, $m: u64| $body,
                )
            }
        };
    }
    match (map, imp) {
        (_, "loop") => go!(
            |k, t, _| black_box((k, t)) == (u64::MAX, Nanos::ZERO),
            |_| true
        ),
        (_, "fake-clock") => {
            let c = FakeRelativeClock::default();
            go!(
                |k, t, m| {
                    sat::advance(&c, m);
                    black_box((k, t)) == (u64::MAX, Nanos::ZERO)
                },
                |_| true
            );
        }
        (_, "floor") => {
            let h = RandomState::new();
            let f = if keys == "hot" {
                sat::KeyedFloor::with_hasher(clock, [sat::HOT], h)
            } else {
                sat::KeyedFloor::with_hasher(clock, 0..sat::KEYS, h)
            };
            go!(|k, t, _| f.check_at(black_box(k), t), |_| true);
        }
        (_, "governor") => {
            let (g, c) = sat::governor_keyed_fake(rate, burst, RandomState::new());
            go!(
                |k, _, m| {
                    sat::advance(&c, m);
                    sat::gov_check_key(&g, k)
                },
                |k| g.check_key(&k).is_ok()
            );
        }
        ("keyed", "turnstile") => {
            let l = sat::keyed(clock, rate, burst);
            go!(
                |k, t, _| sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1)),
                |k| l.check_n_at(&k, start, 1).is_ok()
            );
        }
        ("inline", "turnstile") => {
            let l = sat::keyed_bucket(clock, rate, burst, RandomState::new());
            go!(
                |k, t, _| sat::retry(black_box(&l).check_n_at(&black_box(k), black_box(t), 1)),
                |k| l.check_n_at(&k, start, 1).is_ok()
            );
        }
        _ => unreachable!("{cell} {imp} is listed in SAT_CELLS but has no arm"),
    }
}

fn run(cell: &str, imp: &str, ops: u64) -> Result<(), String> {
    if let Some(r) = saturated_cell(cell, imp, ops) {
        return r;
    }
    match (cell, imp) {
        ("inline-hot", "turnstile") => {
            inline_hot(std::collections::hash_map::RandomState::new(), ops)
        }
        ("inline-random", "turnstile") => {
            inline_random(std::collections::hash_map::RandomState::new(), ops)
        }
        ("inline-hot-foldhash", "turnstile") => {
            inline_hot(foldhash::fast::RandomState::default(), ops)
        }
        ("inline-random-foldhash", "turnstile") => {
            inline_random(foldhash::fast::RandomState::default(), ops)
        }
        ("sketch-random", "turnstile") => sketch_random(ops),
        ("policy-hot", "turnstile") => policy_hot(ops, false),
        ("policy-hot", "facade") => policy_hot(ops, true),
        ("inline-hot" | "inline-hot-foldhash", "governor") => return run("keyed-hot", imp, ops),
        ("inline-random" | "inline-random-foldhash" | "sketch-random", "governor") => {
            return run("keyed-random", imp, ops)
        }
        ("tb-allow", "turnstile") => {
            let tb = ts_ok(ManualClock::new(NOW));
            measured(ops, || {
                black_box(black_box(&tb).allow_n_at(black_box(NOW), 1));
            });
            assert!(tb.allow_n_at(NOW, 1), "tb-allow ran dry");
        }
        ("tb-allow", "floor") => {
            let word = AtomicU64::new(0);
            measured(ops, || {
                sat::floor_cas(black_box(&word), black_box(NOW).as_u64())
            });
        }
        ("multi2-allow" | "multi4-allow", "floor128") => {
            let f = sat::Floor128::new(ManualClock::new(NOW));
            measured(ops, || f.grant_at(black_box(NOW)));
        }
        ("tb-allow", "governor") => {
            let g = RateLimiter::direct_with_clock(gov_ok_quota(), FakeRelativeClock::default());
            measured(ops, || {
                let _ = black_box(black_box(&g).check());
            });
            assert!(g.check().is_ok(), "tb-allow governor ran dry");
        }
        ("multi2-allow" | "multi4-allow", "turnstile") => {
            let k = if cell == "multi2-allow" { 2 } else { 4 };
            let l = multi_ok(k, ManualClock::new(NOW));
            measured(ops, || {
                black_box(black_box(&l).check_n_at(black_box(NOW), 1).is_ok());
            });
            assert!(l.check_n_at(NOW, 1).is_ok(), "{cell} ran dry");
        }
        ("multi2-allow" | "multi4-allow", "governor") => {
            let c = FakeRelativeClock::default();
            let a = RateLimiter::direct_with_clock(gov_ok_quota(), c.clone());
            let b = RateLimiter::direct_with_clock(gov_ok_quota(), c);
            measured(ops, || {
                let _ = black_box(black_box(&a).check().is_ok() && black_box(&b).check().is_ok());
            });
            assert!(
                a.check().is_ok() && b.check().is_ok(),
                "{cell} governor ran dry"
            );
        }
        ("tb-deny", "turnstile") => {
            let tb = TokenBucket::builder(limit(1e-3), 1)
                .clock(ManualClock::new(NOW))
                .build();
            assert!(tb.allow_n_at(NOW, 1));
            measured(ops, || {
                black_box(black_box(&tb).allow_n_at(black_box(NOW), 1));
            });
            assert!(!tb.allow_n_at(NOW, 1), "tb-deny let one through");
        }
        ("tb-deny", "governor") => {
            let g = RateLimiter::direct_with_clock(gov_deny_quota(), FakeRelativeClock::default());
            assert!(g.check().is_ok());
            measured(ops, || {
                let _ = black_box(black_box(&g).check());
            });
            assert!(g.check().is_err(), "tb-deny governor let one through");
        }
        ("keyed-hot", "turnstile") => {
            let k = ts_keyed(&ManualClock::new(NOW));
            measured(ops, || {
                let _ = black_box(black_box(&k).check_n_at(black_box(&7), black_box(NOW), 1));
            });
            assert!(k.check_n_at(&7, NOW, 1).is_ok(), "keyed-hot ran dry");
        }
        ("keyed-hot", "governor") => {
            let g = RateLimiter::dashmap_with_clock(gov_ok_quota(), FakeRelativeClock::default());
            measured(ops, || {
                let _ = black_box(black_box(&g).check_key(black_box(&7u64)));
            });
            assert!(g.check_key(&7).is_ok(), "keyed-hot governor ran dry");
        }
        ("keyed-random", "turnstile") => {
            let k = ts_keyed(&ManualClock::new(NOW));
            let check = |key| black_box(&k).check_n_at(&key, black_box(NOW), 1).is_ok();
            random_keys(ops, check, || k.len(), "keyed-random");
        }
        ("keyed-random", "governor") => {
            let g = RateLimiter::dashmap_with_clock(gov_ok_quota(), FakeRelativeClock::default());
            let check = |key| black_box(&g).check_key(&key).is_ok();
            random_keys(ops, check, || g.len(), "keyed-random governor");
        }
        ("tb-allow-clock", "turnstile") => {
            let tb = TokenBucket::new(limit(1e10), u32::MAX);
            measured(ops, || {
                black_box(black_box(&tb).allow());
            });
            assert!(tb.allow(), "tb-allow-clock ran dry");
        }
        ("tb-allow-clock", "governor") => {
            let g = RateLimiter::direct(gov_ok_quota());
            measured(ops, || {
                let _ = black_box(black_box(&g).check());
            });
            assert!(g.check().is_ok(), "tb-allow-clock governor ran dry");
        }
        ("tb-deny-clock", "turnstile") => {
            let tb = TokenBucket::new(limit(1e-3), 1);
            assert!(tb.allow());
            measured(ops, || {
                black_box(black_box(&tb).allow());
            });
            assert!(!tb.allow(), "tb-deny-clock let one through");
        }
        ("tb-deny-clock", "governor") => {
            let g = RateLimiter::direct(gov_deny_quota());
            assert!(g.check().is_ok());
            measured(ops, || {
                let _ = black_box(black_box(&g).check());
            });
            assert!(g.check().is_err(), "tb-deny-clock governor let one through");
        }
        ("keyed-hot-clock", "turnstile") => {
            let k: Keyed<u64, TokenBucket> =
                Keyed::builder(|_: &u64| TokenBucket::new(limit(1e10), u32::MAX))
                    .sweep_every(Duration::MAX)
                    .build()
                    .expect("valid keyed limiter");
            measured(ops, || {
                let _ = black_box(black_box(&k).check(black_box(&7)));
            });
            assert!(k.check(&7).is_ok(), "keyed-hot-clock ran dry");
        }
        ("keyed-hot-clock", "governor") => {
            let g = RateLimiter::keyed(gov_ok_quota());
            measured(ops, || {
                let _ = black_box(black_box(&g).check_key(black_box(&7u64)));
            });
            assert!(g.check_key(&7).is_ok(), "keyed-hot-clock governor ran dry");
        }
        _ => return Err(format!("unknown cell {cell:?} / implementation {imp:?}")),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `instructions imps <cell>`: the implementations a cell measures (for the script).
    if let [word, cell] = args.as_slice() {
        if word == "imps" {
            match allowed_imps(cell).or_else(|| imps(cell)) {
                Some(imps) => println!("{}", imps.join(" ")),
                None => println!("turnstile governor"),
            }
            return ExitCode::SUCCESS;
        }
    }
    let parsed = match args.as_slice() {
        [cell, imp, ops] => ops.parse::<u64>().ok().map(|ops| (cell, imp, ops)),
        _ => None,
    };
    let Some((cell, imp, ops)) = parsed else {
        eprintln!("usage: instructions <cell> <turnstile|governor> <ops> (see the source)");
        return ExitCode::from(2);
    };
    match run(cell, imp, ops) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("instructions: {e}");
            ExitCode::from(2)
        }
    }
}
