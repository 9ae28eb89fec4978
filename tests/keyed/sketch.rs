//! `SketchTokenBucket`: a client alone in its cells is exactly `KeyedTokenBucket`'s bucket
//! (a differential test on random checks); no client is ever granted beyond its own budget
//! however many share its cells (a property test against an exact per-key bucket fed the
//! sketch's grants, on tables of one line where every key collides, with stale readings);
//! its answers are its mutex twin's (`reference::SketchTokenBucket`, unpacked cells) where
//! keys collide; bad configurations are typed errors; the limits' edge cases; the penalty.
#![cfg(feature = "keyed")]

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hasher};
use std::time::Duration;

use proptest::prelude::*;
use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
use turnstile::{reference, ConfigError, Limit, Limiter, ManualClock, Nanos, TokenBucket};

const MS: u64 = 1_000_000;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

fn limit(per_sec: f64) -> Limit {
    Limit::per_second(per_sec).unwrap()
}

pub(crate) type Fixed = BuildHasherDefault<DefaultHasher>;

/// A sketch of `bytes` with `d` cells per key on a manual clock at 0, keys placed by a fixed
/// hasher (so a failing case replays); also `sketch_stress.rs`'s.
pub(crate) fn sketch(per_sec: f64, burst: u32, bytes: usize, d: usize) -> Sketch {
    penalized(per_sec, burst, bytes, d, Duration::ZERO)
}

#[test]
fn grants_the_burst_then_refuses_with_the_exact_retry_time() {
    let k = sketch(10.0, 3, 1 << 20, 2);
    for _ in 0..3 {
        assert!(k.check_n_at(&1, at(0), 1).is_ok());
    }
    let d = k.check_n_at(&1, at(0), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(100 * MS)));
    assert!(k.check_n_at(&1, at(100 * MS - 1), 1).is_err());
    assert!(k.check_n_at(&1, at(100 * MS), 1).is_ok());
    assert_eq!(k.tokens_at(&1, at(100 * MS)), 0.0);
    assert_eq!(k.tokens_at(&1, at(400 * MS)), 3.0);
    assert_eq!(k.tokens_at(&2, at(0)), 3.0); // never seen: full
}

#[test]
fn an_abuser_is_limited_and_a_client_in_other_cells_is_not() {
    // One line of sixteen cells, one cell per key: key 1 and any key on another cell are
    // independent; every key on key 1's cell is refused with it (the sketch's error).
    let k = sketch(1.0, 2, 64, 1);
    for _ in 0..2 {
        assert!(k.check_n_at(&1, at(0), 1).is_ok());
    }
    for _ in 0..100 {
        assert!(
            k.check_n_at(&1, at(0), 1).is_err(),
            "the abuser stays limited"
        );
    }
    // Other keys, read without a check (a check would fill the cells too).
    let (mut free, mut shared) = (0, 0);
    for key in 2..200u64 {
        match k.tokens_at(&key, at(0)) {
            2.0 => free += 1,
            0.0 => shared += 1,
            t => panic!("key {key}: {t} tokens"),
        }
    }
    assert!(
        shared > 0 && free > shared * 3,
        "free {free}, shared {shared}"
    );
}

/// A sketch as `sketch`'s, with a penalty; also `sketch_stress.rs`'s.
pub(crate) fn penalized(
    per_sec: f64,
    burst: u32,
    bytes: usize,
    d: usize,
    penalty: Duration,
) -> Sketch {
    SketchTokenBucket::builder(limit(per_sec), burst)
        .memory(bytes)
        .cells_per_key(d)
        .penalty(penalty)
        .hasher(Fixed::default())
        .clock(ManualClock::default())
        .build()
        .unwrap()
}

pub(crate) type Sketch = SketchTokenBucket<u64, Fixed, ManualClock>;

/// An abuser refused once is shut out for the penalty (a refusal during it does not extend
/// it), then refills from empty; asking again at once, over its limit, starts another. Keys
/// sharing all its cells wait with it; keys in other cells are untouched; the RateLimit
/// fields say so.
#[test]
fn a_penalty_shuts_an_abuser_out_then_refills_it_from_empty() {
    const S: u64 = 1_000_000_000;
    let k = penalized(1.0, 2, 64, 1, Duration::from_secs(10));
    assert!(k.check_n_at(&1, at(0), 2).is_ok());
    let d = k.check_n_at(&1, at(S / 2), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(S / 2 + 11 * S)), "10 s, then a token");
    let s = k.quota_at(&1, at(S / 2));
    assert_eq!((s.remaining, s.reset), (0, Duration::from_secs(12)));
    // The penalty runs from 0.5 s to 10.5 s; the token it then refills comes at 11.5 s.
    for t in [S, 5 * S, 10 * S, 10 * S + S / 2 - 1] {
        let d = k.check_n_at(&1, at(t), 1).unwrap_err();
        assert_eq!(
            d.retry_at(),
            Some(at(S / 2 + 11 * S)),
            "at {t}: not extended"
        );
    }
    // The same refusals without a penalty: a token a second.
    let plain = sketch(1.0, 2, 64, 1);
    assert!(plain.check_n_at(&1, at(0), 2).is_ok());
    assert_eq!(
        plain.check_n_at(&1, at(S / 2), 1).unwrap_err().retry_at(),
        Some(at(S))
    );
    // Keys sharing the abuser's one cell are shut out with it; the others are full.
    let (mut free, mut shared) = (0, 0);
    for key in 2..200u64 {
        match k.tokens_at(&key, at(S)) {
            2.0 => free += 1,
            t if t <= -9.0 => shared += 1,
            t => panic!("key {key}: {t} tokens"),
        }
    }
    assert!(
        shared > 0 && free > shared * 3,
        "free {free}, shared {shared}"
    );
    // After it, a token a second from empty; asked at once again, another penalty.
    assert!(k.check_n_at(&1, at(S / 2 + 11 * S), 1).is_ok());
    let d = k.check_n_at(&1, at(S / 2 + 11 * S), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(S / 2 + 22 * S)));
    // A check that could never pass (more than the burst) is no abuse: no penalty.
    let k = penalized(1.0, 2, 64, 1, Duration::from_secs(10));
    assert_eq!(k.check_n_at(&1, at(0), 3).unwrap_err().retry_at(), None);
    assert!(k.check_n_at(&1, at(0), 2).is_ok());
}

#[test]
fn the_limits_edge_cases() {
    let clock = ManualClock::default();
    let inf = SketchTokenBucket::<u64, _, _>::builder(Limit::INF, 1)
        .clock(clock.clone())
        .build()
        .unwrap();
    for _ in 0..1000 {
        assert!(inf.check_n_at(&1, at(0), 1_000_000).is_ok());
    }
    let zero = SketchTokenBucket::<u64, _, _>::builder(Limit::ZERO, 2)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(zero.check_n_at(&1, at(0), 2).is_ok());
    let d = zero.check_n_at(&1, at(u64::MAX), 1).unwrap_err();
    assert_eq!(d.retry_at(), None, "no refill, ever");
    let k = sketch(10.0, 3, 64, 2);
    assert_eq!(k.check_n_at(&1, at(0), 4).unwrap_err().retry_at(), None);
    assert!(k.check_n_at(&1, at(0), 0).is_ok());
    assert_eq!(k.tokens_at(&1, at(0)), 3.0, "a check of 0 takes nothing");
    // Readings at the ends of time.
    assert!(k.check_n_at(&1, at(u64::MAX), 3).is_ok());
    assert!(k.check_n_at(&1, at(u64::MAX), 1).is_err());
}

#[test]
fn bad_configurations_are_typed_errors() {
    let b = || SketchTokenBucket::<u64>::builder(limit(1.0), 1);
    for d in [0, 4, usize::MAX] {
        assert_eq!(
            b().cells_per_key(d).build().unwrap_err(),
            ConfigError::SketchCells(d)
        );
    }
    for bytes in [0, 63, (1 << 38) + 1, usize::MAX] {
        assert_eq!(
            b().memory(bytes).build().unwrap_err(),
            ConfigError::SketchMemory(bytes)
        );
    }
    for rate in [0.0, 1.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = b().sized_for(10, rate).build().unwrap_err();
        assert!(
            matches!(e, ConfigError::SketchSize { abusers: 10, .. }),
            "{rate}: {e:?}"
        );
    }
    let e = b().sized_for(u64::MAX, 1e-12).build().unwrap_err();
    assert!(matches!(e, ConfigError::SketchSize { .. }), "{e:?}");
    assert_eq!(
        SketchTokenBucket::<u64>::builder(limit(1.0), (1 << 15) + 1)
            .build()
            .unwrap_err(),
        ConfigError::SketchBurst((1 << 15) + 1)
    );
    // The extremes that are valid.
    assert!(SketchTokenBucket::<u64>::builder(limit(1.0), 1 << 15)
        .build()
        .is_ok());
    assert!(SketchTokenBucket::<u64>::builder(limit(1e12), 1 << 15)
        .build()
        .is_ok());
    assert!(SketchTokenBucket::<u64>::builder(limit(1e-9), 1)
        .build()
        .is_ok());
    // A penalty: the burst and `penalty * limit` tokens fit 2^15 together.
    let with = |burst, penalty| {
        SketchTokenBucket::<u64>::builder(limit(1000.0), burst)
            .penalty(penalty)
            .build()
    };
    assert!(with(1000, Duration::from_secs(31)).is_ok());
    assert!(with(1 << 15, Duration::ZERO).is_ok());
    for (burst, penalty) in [
        (1000, Duration::from_secs(32)),
        (1 << 15, Duration::from_millis(1)),
        (1, Duration::from_secs(1 << 40)),
        (1, Duration::MAX),
    ] {
        assert_eq!(
            with(burst, penalty).unwrap_err(),
            ConfigError::SketchPenalty { penalty, burst },
            "{burst} {penalty:?}"
        );
    }
    // Nothing to penalize where nothing refills or nothing is refused for want of time.
    for l in [Limit::INF, Limit::ZERO] {
        assert!(SketchTokenBucket::<u64>::builder(l, 1)
            .penalty(Duration::MAX)
            .build()
            .is_ok());
    }
    assert_eq!(b().memory(64).build().unwrap().memory(), 64);
    assert_eq!(b().memory(127).build().unwrap().memory(), 64);
    assert_eq!(b().sized_for(0, 0.5).build().unwrap().memory(), 64);
}

/// Where the fixed hasher puts key `k` in a table of `lines` lines, as `SketchTokenBucket`
/// places keys (the hash's high half picks the line): to choose keys that do not collide.
fn line_of(k: u64, lines: u64) -> u64 {
    let mut h = Fixed::default().build_hasher();
    h.write_u64(k);
    (h.finish() >> 32) & (lines - 1)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    /// Keys alone in their lines: every decision and every key's whole tokens left are
    /// `KeyedTokenBucket`'s, and every retry and reset time within one of the sketch's units
    /// of it (a sketch counts in units of at most 1/2^14 of a
    /// burst, `KeyedTokenBucket` in units of at most a nanosecond), on random checks at
    /// readings that never go back (`KeyedTokenBucket` dates a new key at its first reading,
    /// which the sketch, holding no keys, cannot: a reading before it finds fewer tokens there
    /// and a full bucket here).
    #[test]
    fn a_client_alone_in_its_cells_is_a_token_bucket(
        mut ops in proptest::collection::vec((0usize..4, 0u64..2_000, 0u32..6), 1..200),
        d in 1usize..=3,
        rate in prop_oneof![Just(10.0), Just(3.0), Just(1e6), Just(0.5)],
    ) {
        let lines = (1u64 << 20) / 64;
        let keys: Vec<u64> = {
            let mut seen = std::collections::HashSet::new();
            (0u64..).filter(|&k| seen.insert(line_of(k, lines))).take(4).collect()
        };
        ops.sort_by_key(|op| op.1);
        // The exact per-key buckets: a `KeyedTokenBucket` that never evicts.
        let (s, e) = (sketch(rate, 4, 1 << 20, d), crate::bucket::map(rate, 4));
        let unit = 4.0 * 1e9 / rate / f64::from(1 << 14);
        for (key, ms, n) in ops {
            let (key, now) = (keys[key], at(ms * MS));
            match (s.check_n_at(&key, now, n), e.check_n_at(&key, now, n)) {
                (Ok(()), Ok(())) => {}
                (Err(a), Err(b)) => match (a.retry_at(), b.retry_at()) {
                    (Some(a), Some(b)) => prop_assert!(
                        (a.as_u64() as f64 - b.as_u64() as f64).abs() <= unit + 1.0,
                        "retry {:?} vs {:?}", a, b
                    ),
                    (a, b) => prop_assert_eq!(a, b),
                },
                (a, b) => prop_assert!(false, "key {} n {} at {:?}: {:?} vs {:?}", key, n, now, a, b),
            }
            // And the RateLimit fields: the same whole tokens, the reset within a unit.
            let (a, b) = (s.quota_at(&key, now), e.quota_at(&key, now).unwrap());
            prop_assert_eq!((a.quota, a.remaining), (b.quota, b.remaining), "{:?} vs {:?}", a, b);
            prop_assert!(a.window.abs_diff(b.window).as_nanos() as f64 <= unit * 4.0 + 1.0);
            prop_assert!(
                a.reset.abs_diff(b.reset).as_nanos() as f64 <= unit + 1.0,
                "key {} at {:?}: {:?} vs {:?}", key, now, a, b
            );
        }
    }

    /// The sketch and its mutex twin (`reference::SketchTokenBucket`: the same placement and
    /// rule on unpacked `u64` cells) on tables of one or two lines where 24 keys share cells
    /// in every way `d` allows, with and without a penalty, on random checks at readings that
    /// never go back: every decision and retry time, and every key's tokens and RateLimit
    /// fields after each check, are equal. What this checks is the packing: a word's anchor,
    /// its 16-bit offsets, the clamp of a cell to the anchor and the conservative update.
    #[test]
    fn the_sketch_answers_as_its_twin(
        mut ops in proptest::collection::vec((0u64..24, 0u64..4_000, 0u32..5), 1..300),
        d in 1usize..=3,
        burst in 1u32..5,
        rate in prop_oneof![Just(10.0), Just(3.0), Just(1e6)],
        penalty_tokens in prop_oneof![Just(0.0), Just(3.0)],
        bytes in prop_oneof![Just(64usize), Just(128)],
    ) {
        ops.sort_by_key(|op| op.1);
        let options = || {
            SketchTokenBucket::<u64, _, _>::builder(limit(rate), burst)
                .memory(bytes)
                .cells_per_key(d)
                .penalty(Duration::from_secs_f64(penalty_tokens / rate))
                .hasher(Fixed::default())
                .clock(ManualClock::default())
        };
        let (s, twin) = (options().build().unwrap(), reference::SketchTokenBucket::try_from(options()).unwrap());
        for (key, ms, n) in ops {
            let now = at(ms * MS);
            let (a, b) = (s.check_n_at(&key, now, n), twin.check_n_at(&key, now, n));
            prop_assert_eq!(a, b, "key {} n {} at {:?}", key, n, now);
            for k in 0..24 {
                prop_assert_eq!(s.tokens_at(&k, now), twin.tokens_at(&k, now), "key {}", k);
                prop_assert_eq!(s.quota_at(&k, now), twin.quota_at(&k, now), "key {}", k);
            }
        }
    }

    /// Every key on one line of sixteen cells, sharing them in every way `d` allows: each
    /// check the sketch grants, an exact bucket per key (a `TokenBucket`, full at the base)
    /// fed only those grants grants too, so no key's admitted stream ever exceeds its own
    /// budget. Readings go back and forth.
    #[test]
    fn no_client_is_granted_beyond_its_own_budget(
        ops in proptest::collection::vec((0u64..16, 0u64..3_000, 0u32..4), 1..300),
        d in 1usize..=3,
        burst in 1u32..4,
        penalty_ms in prop_oneof![Just(0u64), Just(250), Just(1_000)],
    ) {
        let s = penalized(10.0, burst, 64, d, Duration::from_millis(penalty_ms));
        let mut own = std::collections::HashMap::new();
        for (key, ms, n) in ops {
            let now = at(ms * MS);
            if s.check_n_at(&key, now, n).is_ok() {
                let bucket = own.entry(key).or_insert_with(|| {
                    TokenBucket::builder(limit(10.0), burst).clock(ManualClock::default()).build()
                });
                prop_assert!(
                    bucket.check_n_at(now, n).is_ok(),
                    "key {} granted {} at {:?} beyond its own bucket", key, n, now
                );
            }
        }
    }
}
