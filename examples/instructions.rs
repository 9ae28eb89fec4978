//! The measurement binary behind `scripts/instructions`: sets up one cell, then runs its
//! measured loop `ops` times in [`measured`]. On its own it measures nothing; the script runs
//! it under callgrind, counting only inside `measured`, twice per cell with two op counts, and
//! divides the difference of the totals by the difference of the op counts.
//!
//! ```text
//! cargo run --release --example instructions -- <cell> <turnstile|governor> <ops>
//! ```
//!
//! Cells (turnstile goes through its public API only: `TokenBucket::with_clock`, `allow_n_at`,
//! `Keyed`, `check_n_at`, `ManualClock`, `Nanos`, `Limit`):
//! * `tb-allow`: one limiter that grants every check. turnstile: `allow_n_at(now, 1)` at a
//!   fixed time on a `ManualClock` (clock-free), 1e10/s with a burst of `u32::MAX` as in
//!   `benches/token_bucket.rs`. governor: `check()` on `direct_with_clock(.., FakeRelativeClock)`
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
//! * `tb-allow-clock`, `tb-deny-clock`, `keyed-hot-clock`: the same with each crate's default
//!   real clock (turnstile `TokenBucket::new` + `allow()`, `Keyed::check`; governor
//!   `RateLimiter::direct`/`keyed` + `check`/`check_key`). Under valgrind the clock read is
//!   whatever each clock does on valgrind's emulated CPU, so these rows say less about native
//!   runs than the clock-free ones.
//!
//! Every loop passes the limiter, the time and the result through `std::hint::black_box`, and
//! each cell asserts after its loop that the last check still had the expected outcome, so a
//! cell that stopped measuring what it claims fails instead of printing a figure.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use turnstile::{Keyed, KeyedTokenBucket, Limit, ManualClock, Nanos, TokenBucket};

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
    TokenBucket::with_clock(limit(1e10), u32::MAX, clock)
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

fn run(cell: &str, imp: &str, ops: u64) -> Result<(), String> {
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
        ("inline-hot" | "inline-hot-foldhash", "governor") => return run("keyed-hot", imp, ops),
        ("inline-random" | "inline-random-foldhash", "governor") => {
            return run("keyed-random", imp, ops)
        }
        ("tb-allow", "turnstile") => {
            let tb = ts_ok(ManualClock::new(NOW));
            measured(ops, || {
                black_box(black_box(&tb).allow_n_at(black_box(NOW), 1));
            });
            assert!(tb.allow_n_at(NOW, 1), "tb-allow ran dry");
        }
        ("tb-allow", "governor") => {
            let g = RateLimiter::direct_with_clock(gov_ok_quota(), FakeRelativeClock::default());
            measured(ops, || {
                let _ = black_box(black_box(&g).check());
            });
            assert!(g.check().is_ok(), "tb-allow governor ran dry");
        }
        ("tb-deny", "turnstile") => {
            let tb = TokenBucket::with_clock(limit(1e-3), 1, ManualClock::new(NOW));
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
