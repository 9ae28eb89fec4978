//! `KeyedTokenBucket` semantics: grants and denials with exact retry times, per-key
//! independence, quotas, the limits' edge cases, the key bound, eviction (idle keys only, the
//! memory comes back, a returning key is born no earlier than the sweep), resizes that keep
//! every key's state, and a differential test against an exact per-key GCRA in nanoseconds
//! and against x/time/rate's twin (`reference::TokenBucket`), one per key.
#![cfg(feature = "keyed")]

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use turnstile::keyed::token_bucket::{KeyedTokenBucket, WhenFull, MAX_QUOTAS};
use turnstile::{reference, ConfigError, Limit, Limiter, ManualClock, Nanos};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;

fn at(ns: u64) -> Nanos {
    Nanos::new(ns)
}

fn limit(per_sec: f64) -> Limit {
    Limit::per_second(per_sec).unwrap()
}

/// A map on a manual clock at 0 (its base), swept only by hand (also the sketch's exact
/// per-key buckets, `sketch.rs`).
pub(crate) fn map(
    per_sec: f64,
    burst: u32,
) -> KeyedTokenBucket<u64, std::collections::hash_map::RandomState, ManualClock> {
    KeyedTokenBucket::builder(limit(per_sec), burst)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap()
}

#[test]
fn grants_the_burst_then_denies_with_the_exact_retry_time() {
    let k = map(10.0, 3);
    for _ in 0..3 {
        assert!(k.check_n_at(&1, at(0), 1).is_ok());
    }
    let d = k.check_n_at(&1, at(0), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(100 * MS)));
    assert_eq!(d.checked_at(), at(0));
    assert!(k.check_n_at(&1, at(100 * MS - 1), 1).is_err());
    assert!(k.check_n_at(&1, at(100 * MS), 1).is_ok());
    // Two at once: the second token comes 100 ms after the first.
    let d = k.check_n_at(&1, at(150 * MS), 2).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(300 * MS)));
    assert!(k.check_n_at(&1, at(300 * MS), 2).is_ok());
    // A denial writes nothing: the tokens are as before it.
    assert_eq!(k.tokens_at(&1, at(300 * MS)), 0.0);
    assert_eq!(k.tokens_at(&1, at(600 * MS)), 3.0);
}

#[test]
fn retry_times_hold_for_limits_without_a_whole_nanosecond_interval() {
    for (per_sec, burst) in [(3.0, 2), (7.0, 1), (0.37, 5), (3e7, 100), (1.5e9, 10)] {
        let k = map(per_sec, burst);
        assert!(k.check_n_at(&1, at(SEC), burst).is_ok());
        for n in 1..=burst {
            let retry = k
                .check_n_at(&1, at(SEC), n)
                .unwrap_err()
                .retry_at()
                .unwrap();
            // The same check passes at the retry time and not a nanosecond before (the scale
            // rounds a ready time up by at most one ns).
            let exact = SEC as f64 + f64::from(n) * 1e9 / per_sec;
            assert!(
                (retry.as_u64() as f64 - exact).abs() <= 2.0,
                "{per_sec}/s n {n}: {retry:?} vs {exact}"
            );
            assert!(
                k.check_n_at(&1, at(retry.as_u64() - 2), n).is_err(),
                "{per_sec}/s n {n}"
            );
            let probe = map(per_sec, burst);
            assert!(probe.check_n_at(&1, at(SEC), burst).is_ok());
            assert!(
                probe.check_n_at(&1, retry, n).is_ok(),
                "{per_sec}/s n {n} at {retry:?}"
            );
        }
    }
}

#[test]
fn keys_are_independent() {
    const KEYS: u64 = if cfg!(miri) { 100 } else { 1000 };
    let k = map(1.0, 1);
    for key in 0..KEYS {
        assert!(k.check_n_at(&key, at(0), 1).is_ok(), "key {key}");
    }
    for key in 0..KEYS {
        assert!(k.check_n_at(&key, at(0), 1).is_err(), "key {key}");
    }
    assert_eq!(k.len(), KEYS as usize);
}

#[test]
fn borrowed_keys_look_up_owned_ones() {
    let k: KeyedTokenBucket<String, _, _> = KeyedTokenBucket::builder(limit(1.0), 1)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(k.check_n_at("alice", at(0), 1).is_ok());
    assert!(k.check_n_at(&"alice".to_string(), at(0), 1).is_err());
    assert!(k.contains("alice"));
    assert!(!k.contains("bob"));
}

#[test]
fn quotas_are_picked_per_key_at_insertion() {
    let k = KeyedTokenBucket::builder(limit(1.0), 1)
        .quota(limit(10.0), 5)
        .quota(Limit::INF, 1)
        .quota(Limit::ZERO, 2)
        .classify(|key: &u64| (*key % 10) as usize) // 4..=9 are past the table: quota 0
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    // Quota 0: 1 per second, burst 1.
    assert!(k.check_n_at(&0, at(0), 1).is_ok());
    assert_eq!(
        k.check_n_at(&0, at(0), 1).unwrap_err().retry_at(),
        Some(at(SEC))
    );
    // Quota 1: 10 per second, burst 5.
    assert!(k.check_n_at(&1, at(0), 5).is_ok());
    assert_eq!(
        k.check_n_at(&1, at(0), 2).unwrap_err().retry_at(),
        Some(at(200 * MS))
    );
    assert_eq!(k.check_n_at(&1, at(0), 6).unwrap_err().retry_at(), None);
    // Quota 2: unlimited.
    for _ in 0..if cfg!(miri) { 100 } else { 1000 } {
        assert!(k.check_n_at(&2, at(0), 1_000_000).is_ok());
    }
    // Quota 3: no refill: the burst once, then never.
    assert!(k.check_n_at(&3, at(0), 2).is_ok());
    assert_eq!(
        k.check_n_at(&3, at(1000 * SEC), 1).unwrap_err().retry_at(),
        None
    );
    // An index past the table is quota 0.
    assert!(k.check_n_at(&9, at(0), 1).is_ok());
    assert!(k.check_n_at(&9, at(0), 1).is_err());
    assert_eq!(
        k.evict_idle_at(at(1000 * SEC)),
        4,
        "keys 0, 1, 2, 9 are full again; 3 never is"
    );
}

#[test]
fn too_many_quotas_is_a_config_error() {
    let mut b = KeyedTokenBucket::<u8>::builder(limit(1.0), 1);
    for _ in 1..MAX_QUOTAS {
        b = b.quota(limit(2.0), 2);
    }
    let b = b.quota(limit(2.0), 2);
    assert_eq!(
        b.build().unwrap_err(),
        ConfigError::TooManyQuotas(MAX_QUOTAS + 1)
    );
    let mut b = KeyedTokenBucket::<u8>::builder(limit(1.0), 1).clock(ManualClock::default());
    for _ in 1..MAX_QUOTAS {
        b = b.quota(limit(2.0), 2);
    }
    assert!(b.build().is_ok());
    assert_eq!(
        KeyedTokenBucket::<u8>::builder(limit(1.0), 1)
            .max_keys(0)
            .build()
            .unwrap_err(),
        ConfigError::ZeroMaxKeys
    );
}

#[test]
fn more_than_the_burst_and_a_zero_burst_never_pass() {
    let k = map(10.0, 3);
    assert_eq!(k.check_n_at(&1, at(0), 4).unwrap_err().retry_at(), None);
    assert_eq!(
        k.check_n_at(&1, at(0), u32::MAX).unwrap_err().retry_at(),
        None
    );
    assert!(
        k.check_n_at(&1, at(0), 3).is_ok(),
        "the refusals took nothing"
    );
    let k = map(10.0, 0);
    assert_eq!(k.check_n_at(&1, at(0), 1).unwrap_err().retry_at(), None);
    assert!(k.check_n_at(&1, at(0), 0).is_ok());
}

#[test]
fn zero_tokens_pass_unless_a_stale_reading_finds_a_deficit() {
    let k = map(10.0, 1);
    assert!(k.check_n_at(&1, at(SEC), 0).is_ok());
    assert!(k.check_n_at(&1, at(SEC), 1).is_ok());
    assert!(k.check_n_at(&1, at(SEC), 0).is_ok());
    // 100 ms earlier the bucket held one token fewer than it had at 1 s: in deficit.
    assert!(k.check_n_at(&1, at(SEC - 150 * MS), 0).is_err());
}

#[test]
fn readings_before_the_base_count_as_the_base() {
    let clock = ManualClock::new(at(5 * SEC));
    let k: KeyedTokenBucket<u64, _, _> = KeyedTokenBucket::builder(limit(1.0), 1)
        .sweep_every(Duration::MAX)
        .clock(clock)
        .build()
        .unwrap();
    assert!(k.check_n_at(&1, at(0), 1).is_ok());
    // Judged at the base (5 s): the next token comes at 6 s.
    assert_eq!(
        k.check_n_at(&1, at(SEC), 1).unwrap_err().retry_at(),
        Some(at(6 * SEC))
    );
    assert!(k.check_n_at(&1, at(6 * SEC), 1).is_ok());
}

#[test]
fn extreme_times_neither_panic_nor_mint_tokens() {
    let k = map(10.0, 2);
    for t in common::extreme_times() {
        let _ = k.check_n_at(&1, t, 1);
        let _ = k.check_n_at(&2, t, 3);
        let _ = k.tokens_at(&1, t);
        let _ = k.evict_idle_at(t);
    }
    // Past the map's range time stands still: a key gets its burst, then nothing.
    let k = map(10.0, 2);
    assert!(k.check_n_at(&1, Nanos::MAX, 2).is_ok());
    let d = k.check_n_at(&1, Nanos::MAX, 1).unwrap_err();
    assert!(d.retry_at().unwrap() > at(8 * 365 * 86_400 * SEC));
    assert!(k.check_n_at(&1, Nanos::MAX, 1).is_err());
}

#[test]
fn the_key_bound_refuses_or_admits_untracked() {
    let k = KeyedTokenBucket::<u64, _, _>::builder(limit(1.0), 1)
        .max_keys(2)
        .sweep_every(Duration::from_secs(10))
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(k.check_n_at(&1, at(0), 1).is_ok());
    assert!(k.check_n_at(&2, at(0), 1).is_ok());
    let d = k.check_n_at(&3, at(0), 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(SEC)), "the next early sweep");
    assert_eq!(k.len(), 2);
    // Existing keys are never evicted to make room; idle ones are.
    k.clock().set(at(2 * SEC));
    assert!(
        k.check_n_at(&3, at(2 * SEC), 1).is_ok(),
        "an early sweep freed room"
    );
    assert_eq!(k.len(), 1);

    let k = KeyedTokenBucket::<u64, _, _>::builder(limit(1.0), 1)
        .max_keys(1)
        .when_full(WhenFull::Allow)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(k.check_n_at(&1, at(0), 1).is_ok());
    for _ in 0..3 {
        assert!(k.check_n_at(&2, at(0), 1).is_ok(), "untracked");
    }
    assert_eq!(k.len(), 1);
    assert!(!k.contains(&2));
}

#[test]
fn a_returning_key_counts_against_the_bound() {
    let k = KeyedTokenBucket::<u64, _, _>::builder(limit(1.0), 1)
        .max_keys(1)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    assert!(k.check_n_at(&1, at(0), 1).is_ok());
    assert_eq!(k.evict_idle_at(at(SEC)), 1);
    assert!(k.check_n_at(&2, at(SEC), 1).is_ok());
    // Key 1 is evicted (its slot kept, dead): bringing it back needs room.
    assert!(k.check_n_at(&1, at(SEC), 1).is_err());
    assert_eq!(k.len(), 1);
    assert_eq!(k.evict_idle_at(at(2 * SEC)), 1);
    assert!(k.check_n_at(&1, at(2 * SEC), 1).is_ok());
    assert_eq!(k.len(), 1);
}

#[test]
fn only_idle_keys_are_evicted_and_they_come_back_full() {
    let k = map(10.0, 2);
    assert!(k.check_n_at(&1, at(0), 2).is_ok());
    assert!(k.check_n_at(&2, at(0), 1).is_ok());
    assert!(k.check_n_at(&3, at(100 * MS), 2).is_ok());
    // At 100 ms key 2 is full again, key 1 holds one token, key 3 none.
    assert_eq!(k.evict_idle_at(at(100 * MS)), 1);
    assert!(!k.contains(&2) && k.contains(&1) && k.contains(&3));
    assert_eq!(k.len(), 2);
    assert_eq!(k.tokens_at(&1, at(100 * MS)), 1.0);
    assert_eq!(k.evict_idle_at(at(300 * MS)), 2);
    assert!(k.is_empty());
    for key in 1..=3 {
        assert!(
            k.check_n_at(&key, at(300 * MS), 2).is_ok(),
            "key {key} is back, full"
        );
        assert!(k.check_n_at(&key, at(300 * MS), 1).is_err());
    }
    assert_eq!(k.len(), 3);
}

/// The review's repro for the general `Keyed`, on the inline map: a grant at 0, a reading at
/// 0.3 s used after the key was evicted at 1.1 s. A fresh bucket would grant it (2 tokens in
/// [0, 0.3 s] against a budget of 1.3); born at 1.1 s, the key holds 0.2 tokens at 0.3 s.
#[test]
fn a_stale_reading_after_an_eviction_gains_nothing() {
    let k = map(1.0, 1);
    assert!(k.check_n_at(&7, at(0), 1).is_ok());
    let reading = at(300 * MS);
    k.clock().set(at(1_100 * MS));
    assert_eq!(k.evict_idle(), 1);
    let d = k.check_n_at(&7, reading, 1).unwrap_err();
    assert_eq!(d.retry_at(), Some(at(1_100 * MS)));
    assert!(k.check_n_at(&7, at(1_100 * MS), 1).is_ok());
}

/// The same after the table was rebuilt without the evicted key (a purge): the key is
/// inserted again, and still born at the sweep.
#[test]
fn a_stale_reading_after_a_purge_gains_nothing() {
    let k = map(1.0, 1);
    for key in 0..100 {
        assert!(k.check_n_at(&key, at(0), 1).is_ok());
    }
    let big = k.capacity();
    k.clock().set(at(1_100 * MS));
    assert_eq!(k.evict_idle(), 100);
    assert!(
        k.capacity() < big,
        "the sweep rebuilt the table without its dead keys"
    );
    assert_eq!(
        k.check_n_at(&7, at(300 * MS), 1).unwrap_err().retry_at(),
        Some(at(1_100 * MS))
    );
}

/// Keys of the resize tests: fewer under Miri (an interpreter), still several resizes.
const RESIZE_KEYS: u64 = if cfg!(miri) { 150 } else { 10_000 };

#[test]
fn resizes_keep_every_key_state() {
    let k = map(1.0, 3);
    let first = k.capacity();
    for key in 0..RESIZE_KEYS {
        assert!(k.check_n_at(&key, at(0), 1 + (key % 3) as u32).is_ok());
    }
    assert!(
        k.capacity() as u64 >= RESIZE_KEYS * 4 / 3,
        "grew to {}",
        k.capacity()
    );
    assert!(k.capacity() > first);
    assert!(k.resizes() >= 3, "{} resizes", k.resizes());
    for key in 0..RESIZE_KEYS {
        let used = 1 + key % 3;
        assert_eq!(k.tokens_at(&key, at(0)), (3 - used) as f64, "key {key}");
        assert!(
            k.check_n_at(&key, at(0), 4 - used as u32).is_err(),
            "key {key}"
        );
    }
    // Evict the keys that spent 1 (full again at 1 s), then purge: the rest keep their state.
    let spent_one = RESIZE_KEYS.div_ceil(3) as usize;
    assert_eq!(k.evict_idle_at(at(SEC)), spent_one);
    for key in 0..RESIZE_KEYS {
        let used = 1 + key % 3;
        if used > 1 {
            assert_eq!(k.tokens_at(&key, at(SEC)), (4 - used) as f64, "key {key}");
        }
    }
    assert_eq!(
        k.evict_idle_at(at(3 * SEC)),
        RESIZE_KEYS as usize - spent_one
    );
    assert!(k.capacity() <= 64, "purged to {}", k.capacity());
    assert!(k.is_empty());
}

#[test]
fn a_presized_table_neither_grows_nor_shrinks_below_its_capacity() {
    const CAPACITY: u64 = if cfg!(miri) { 50 } else { 1000 };
    let k: KeyedTokenBucket<u64, _, _> = KeyedTokenBucket::builder(limit(1.0), 1)
        .capacity(CAPACITY as usize)
        .sweep_every(Duration::MAX)
        .clock(ManualClock::default())
        .build()
        .unwrap();
    let slots = k.capacity();
    assert!(slots as u64 * 7 / 8 >= CAPACITY, "{slots} slots");
    for key in 0..CAPACITY {
        assert!(k.check_n_at(&key, at(0), 1).is_ok());
    }
    assert_eq!(k.resizes(), 0);
    assert_eq!(k.evict_idle_at(at(SEC)), CAPACITY as usize);
    assert_eq!(k.resizes(), 1, "purged");
    assert_eq!(k.capacity(), slots, "not below the capacity asked for");
    // Past the capacity it grows as usual.
    for key in 0..2 * CAPACITY {
        assert!(k.check_n_at(&key, at(SEC), 1).is_ok());
    }
    assert!(k.capacity() > slots);
}

#[test]
fn sweeps_run_inline_when_due() {
    let clock = ManualClock::default();
    let k: KeyedTokenBucket<u64, _, _> = KeyedTokenBucket::builder(limit(10.0), 1)
        .sweep_every(Duration::from_secs(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(k.check_n_at(&1, at(0), 1).is_ok());
    assert_eq!(k.len(), 1);
    clock.set(at(2 * SEC));
    assert!(k.check_n_at(&2, at(2 * SEC), 1).is_ok());
    assert!(!k.contains(&1), "the check at 2 s swept the idle key 1");
}

// ---- differential ------------------------------------------------------------------------

/// The spec, exactly: per key, GCRA in nanoseconds for a limit whose interval `t_ns` is a
/// whole number of nanoseconds: a check of `n` at `t` is granted iff
/// `max(tat, t) + n * T <= t + burst * T`, and the retry time is `max(tat, t) + n*T - burst*T`.
struct Exact {
    t_ns: u64,
    burst: u64,
    tat: HashMap<u8, u64>,
}

impl Exact {
    fn check(&mut self, key: u8, t: u64, n: u32) -> Result<(), Option<u64>> {
        let n = u64::from(n);
        // A check inserts its key (full at `t`) whatever it decides.
        let tat = self.tat.entry(key).or_insert(t);
        if n > self.burst {
            return Err(None);
        }
        let next = (*tat).max(t) + n * self.t_ns;
        if next <= t + self.burst * self.t_ns {
            *tat = next;
            Ok(())
        } else {
            Err(Some(next - self.burst * self.t_ns))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    /// Every check agreed with the spec and with x/time/rate's twin.
    Agreed,
    /// Agreed with the spec; the twin differed only at a grant's exact boundary (its float
    /// arithmetic may land a hair either side of the last token).
    TwinBorderline,
}

#[test]
fn differential_against_exact_gcra_and_the_twins() {
    let ops = proptest::collection::vec((0u8..4, 0u64..400, 0u32..5, any::<bool>()), 1..120);
    let cfg = (
        prop::sample::select(vec![1u64, 3, 1000, 250 * MS, 100 * MS, 7 * MS]),
        1u64..5,
    );
    common::tally("keyed_bucket", (cfg, ops), |((t_ns, burst), ops)| {
        let per_sec = SEC as f64 / t_ns as f64;
        let k = map(per_sec, burst as u32);
        let mut exact = Exact {
            t_ns,
            burst,
            tat: HashMap::new(),
        };
        let mut twins: HashMap<u8, reference::TokenBucket<ManualClock>> = HashMap::new();
        let mut t = 0u64;
        let mut end = End::Agreed;
        for (key, dt, n, evict) in ops {
            // Time steps in units of a tenth of the interval, so boundaries are hit exactly.
            t += dt * t_ns.div_ceil(10).max(1);
            if evict {
                let before = k.len();
                let evicted = k.evict_idle_at(at(t));
                // An evicted key is full at `t`: the spec and the twin forget it too.
                let full: Vec<u8> = exact
                    .tat
                    .iter()
                    .filter(|&(_, &tat)| tat <= t)
                    .map(|(&key, _)| key)
                    .collect();
                prop_assert_eq!(evicted, full.len(), "evicted at {}", t);
                prop_assert_eq!(k.len(), before - evicted);
                for key in full {
                    exact.tat.remove(&key);
                    twins.remove(&key);
                }
            }
            let tat_before = exact.tat.get(&key).copied().unwrap_or(0);
            let got = k.check_n_at(&u64::from(key), at(t), n);
            let want = exact.check(key, t, n);
            prop_assert_eq!(
                got.map_err(|d| d.retry_at().map(Nanos::as_u64)),
                want,
                "key {} n {} at {} (T {} ns, burst {})",
                key,
                n,
                t,
                t_ns,
                burst
            );
            let twin = twins.entry(key).or_insert_with(|| {
                reference::TokenBucket::from(
                    turnstile::TokenBucket::builder(limit(per_sec), burst as u32)
                        .clock(ManualClock::default()),
                )
            });
            let twin_ok = twin.check_n_at(at(t), n).is_ok();
            if twin_ok != want.is_ok() {
                // Only at the boundary: the grant leaves (or would leave) zero tokens, give
                // or take a nanosecond.
                let next = tat_before.max(t) + u64::from(n) * t_ns;
                let edge = next.abs_diff(t + burst * t_ns) <= 1;
                prop_assert!(
                    edge,
                    "twin says {} for key {} n {} at {}",
                    twin_ok,
                    key,
                    n,
                    t
                );
                end = End::TwinBorderline;
                // Keep the twin in step with the spec from here: rebuild it from the spec.
                twins.remove(&key);
                break;
            }
        }
        Ok(end)
    });
}
