//! loom models of `MultiTokenBucket`'s CAS protocols (`src/multi_token_bucket/engine.rs`: one
//! 128-bit state word carrying the configuration's epoch, the configurations in seqlocked
//! slots) and of the keyed map's (`src/keyed/multi_token_bucket.rs`, the word map at its
//! 128-bit width). Under loom the word is the `AtomicU128` stand-in of `src/sync.rs`, which
//! checks the orderings as written.
//!
//! Every model ends in the state of one sequential order of its operations, computed by
//! running that order on a fresh limiter in the model's own thread (`after`), and compared
//! through `status_at` (every limit's remaining tokens and reset): a lost update, a grant
//! counted twice or a grant computed under one configuration and committed under another
//! gives a state no order gives.
//!
//! Readings are whole seconds apart and the limits' rates whole per second or per minute, so
//! no decision sits on a grid unit's rounding.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test multi_token_bucket
#![cfg(loom)]

use std::collections::hash_map::DefaultHasher;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use loom::thread;
use loom_tests::model_at_bound;
use turnstile::keyed::multi_token_bucket::KeyedMultiTokenBucket;
use turnstile::multi_token_bucket::{Bandwidth, MultiDenied, MultiTokenBucket, Statuses};
use turnstile::{Limit, ManualClock, Nanos};

const SEC: u64 = 1_000_000_000;

type Mtb = MultiTokenBucket<ManualClock>;

/// A limit of `burst` refilling at `per_sec`.
fn bw(per_sec: f64, burst: u32) -> Bandwidth {
    Bandwidth::new(Limit::per_second(per_sec).unwrap(), burst)
}

/// A bucket of `limits` on a manual clock at 0 (its base), leaked because loom threads must
/// be 'static.
fn bucket(limits: &[Bandwidth]) -> &'static Mtb {
    Box::leak(Box::new(
        MultiTokenBucket::builder(limits)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

fn t(ns: u64) -> Nanos {
    Nanos::new(ns)
}

/// One operation of a sequential order.
#[derive(Clone, Copy)]
enum Op<'a> {
    /// `check_n_at(t, n)`.
    Check(u64, u32),
    /// `set_limits_at(t, limits)`.
    Set(u64, &'a [Bandwidth]),
}

/// A fresh bucket of `limits` after `ops` in order: each check's outcome, and the bucket.
fn after(limits: &[Bandwidth], ops: &[Op<'_>]) -> (Vec<Result<(), MultiDenied>>, &'static Mtb) {
    let l = bucket(limits);
    let mut outcomes = Vec::new();
    for op in ops {
        match *op {
            Op::Check(at, n) => outcomes.push(l.check_n_at(t(at), n)),
            Op::Set(at, new) => l.set_limits_at(t(at), new).unwrap(),
        }
    }
    (outcomes, l)
}

/// The statuses at `at` of a fresh bucket of `limits` after `ops`.
fn state_after(limits: &[Bandwidth], ops: &[Op<'_>], at: u64) -> Statuses {
    after(limits, ops).1.status_at(t(at))
}

/// check ‖ check at one reading, both fitting the budget: limits of 3 at 1/s and 3 per
/// minute, checks of 1 and 2 at 0. Both grant in either order, and both land: every limit is
/// empty (a lost update, two checks each taking from the same word and one store winning,
/// leaves 1 or 2).
#[test]
fn check_vs_check_both_land() {
    loom::model(|| {
        let limits = [bw(1.0, 3), bw(0.05, 3)];
        let l = bucket(&limits);
        let a = thread::spawn(move || l.check_n_at(t(0), 1).is_ok());
        assert!(l.check_n_at(t(0), 2).is_ok());
        assert!(a.join().unwrap());
        let s = l.status_at(t(0));
        assert_eq!((s[0].remaining, s[1].remaining), (0, 0), "a grant was lost");
        let order = [Op::Check(0, 1), Op::Check(0, 2)];
        assert_eq!(s, state_after(&limits, &order, 0));
    });
}

/// check ‖ check at one reading where the budget holds only one: limits of 3 at 1/s and 2 per
/// minute, checks of 1 and 2 at 0. Whichever commits first is granted and the other refused
/// by the per-minute limit (index 1), which then holds 1 or 0; never both (the per-minute
/// limit would go to -1) and never neither.
#[test]
fn check_vs_check_grants_exactly_what_the_budget_allows() {
    loom::model(|| {
        let limits = [bw(1.0, 3), bw(2.0 / 60.0, 2)];
        let l = bucket(&limits);
        let a = thread::spawn(move || l.check_n_at(t(0), 1));
        let b = l.check_n_at(t(0), 2);
        let a = a.join().unwrap();
        let s = l.status_at(t(0));
        let order = match (a, b) {
            (Ok(()), Err(d)) => {
                assert_eq!(d.limit(), 1);
                [Op::Check(0, 1), Op::Check(0, 2)]
            }
            (Err(d), Ok(())) => {
                assert_eq!(d.limit(), 1);
                [Op::Check(0, 2), Op::Check(0, 1)]
            }
            (a, b) => panic!("checks of 1 and 2 against a burst of 2: {a:?}, {b:?}"),
        };
        assert_eq!(s, state_after(&limits, &order, 0));
    });
}

/// check ‖ check at different readings, one of them stale: limits of 1 at 1/s and 2 per
/// minute, a check of 1 at 0 and one at 1.5 s. In the order of the readings both grant (the
/// per-second limit refills in between); the other way round the check at 0 finds the
/// per-second limit spent by the later reading and is refused: a stale reading is judged no
/// more generously than the grant it follows. The final state is that order's.
#[test]
fn check_vs_check_at_different_readings_is_linearizable() {
    loom::model(|| {
        let limits = [bw(1.0, 1), bw(2.0 / 60.0, 2)];
        let late = 3 * SEC / 2;
        let l = bucket(&limits);
        let a = thread::spawn(move || l.check_n_at(t(0), 1).is_ok());
        let b = l.check_n_at(t(late), 1).is_ok();
        let a = a.join().unwrap();
        assert!(b, "the later reading is granted in either order");
        let order = if a {
            [Op::Check(0, 1), Op::Check(late, 1)]
        } else {
            [Op::Check(late, 1), Op::Check(0, 1)]
        };
        let (outcomes, _) = after(&limits, &order);
        assert_eq!(
            (outcomes[0].is_ok(), outcomes[1].is_ok()),
            (true, a),
            "not the sequential order's decisions"
        );
        assert_eq!(l.status_at(t(late)), state_after(&limits, &order, late));
    });
}

/// The configurations of the check ‖ `set_limits` models: limit 0's burst raised from 1 to
/// 2, limit 1 the same (2 at 1/s).
const OLD: [(f64, u32); 2] = [(1.0, 1), (1.0, 2)];
const NEW: [(f64, u32); 2] = [(1.0, 2), (1.0, 2)];

fn limits(c: [(f64, u32); 2]) -> [Bandwidth; 2] {
    c.map(|(r, b)| bw(r, b))
}

/// check ‖ `set_limits`, where a mix would grant what neither configuration does: after a
/// grant of 1 at 0 the old configuration holds (0, 1) tokens; `set_limits` keeps them by
/// index, so the new one holds (0, 1) too, and a check of 1 at 0 is refused under either.
/// But the old word read under the new configuration (limit 0's arrival time, 1 s, under a
/// burst of 2 s) holds (1, 1): a check judged half under each would be granted. It never is,
/// and the final state is the sequential one (the new limits, (0, 1) tokens). The check runs
/// in the spawned thread, which lets loom offer it stale values of the word and the slots
/// after the reconfiguration (`token_bucket.rs`' `set_limit_twice_vs_allow_on_a_full_bucket_
/// grants` says why).
#[test]
fn check_vs_set_limits_never_grants_what_neither_configuration_grants() {
    loom::model(|| {
        let (old, new) = (limits(OLD), limits(NEW));
        let l = bucket(&old);
        assert!(l.check_n_at(t(0), 1).is_ok());
        let a = thread::spawn(move || l.check_n_at(t(0), 1));
        l.set_limits_at(t(0), &new).unwrap();
        let d = a
            .join()
            .unwrap()
            .expect_err("refused under both configurations");
        assert_eq!(d.limit(), 0);
        assert_eq!(l.limits(), new.to_vec());
        let order = [Op::Check(0, 1), Op::Set(0, &new)];
        assert_eq!(l.status_at(t(0)), state_after(&old, &order, 0));
    });
}

/// check ‖ `set_limits` where the order decides: a check of 2 at 0 on a full bucket of the
/// old configuration (bursts 1 and 2) is refused by limit 0 (2 > its burst, never
/// admissible: no retry time); under the new one (bursts 2 and 2) granted, leaving none.
/// Check first: refused, then the limits change keeping (1, 2) tokens. `set_limits` first:
/// (1, 2) kept, so 1 short of the 2 on limit 0: refused with a retry at 1 s. A grant
/// computed under the old configuration never happens (2 is past its burst); one computed
/// on the old word under the new configuration (full: 2 and 2) would grant and leave
/// (0, 0), which no order gives.
#[test]
fn check_vs_set_limits_is_linearizable() {
    loom::model(|| {
        let (old, new) = (limits(OLD), limits(NEW));
        let l = bucket(&old);
        let a = thread::spawn(move || l.check_n_at(t(0), 2));
        l.set_limits_at(t(0), &new).unwrap();
        let d = a.join().unwrap().expect_err("refused in either order");
        let order: &[Op<'_>] = match d.retry_at() {
            None => &[Op::Check(0, 2), Op::Set(0, &new)],
            Some(r) => {
                assert_eq!(r, t(SEC), "not the new configuration's retry");
                &[Op::Set(0, &new), Op::Check(0, 2)]
            }
        };
        assert_eq!(d.limit(), 0);
        let (outcomes, _) = after(&old, order);
        assert_eq!(outcomes[0], Err(d));
        assert_eq!(l.status_at(t(0)), state_after(&old, order, 0));
    });
}

/// `set_limits` twice ‖ a check that every configuration grants: the second reconfiguration
/// rewrites the slot of the word the check may have loaded (epoch 0), so only the slot's
/// validation stops a refusal computed from a mix of the old and the third configuration's
/// words (or from a stale, still empty slot 1). The bucket is full, limit 1's burst is 2
/// throughout and limit 0's 1, 2, 1: a check of 1 at 0 is granted in every order and leaves
/// limit 1 one token. The second reconfiguration's limit 0 refills at 1/min: a mix of its
/// scale with the first's arrival time refuses.
#[test]
fn set_limits_twice_vs_check_on_a_full_bucket_grants() {
    model_at_bound(1, || {
        let old = limits(OLD);
        let third = [bw(1.0 / 60.0, 1), bw(1.0, 2)];
        let l = bucket(&old);
        let a = thread::spawn(move || l.check_n_at(t(0), 1));
        l.set_limits_at(t(0), &limits(NEW)).unwrap();
        l.set_limits_at(t(0), &third).unwrap();
        a.join()
            .unwrap()
            .expect("a full bucket grants under every configuration");
        assert_eq!(l.limits(), third.to_vec());
        assert_eq!(l.status_at(t(0))[1].remaining, 1);
        assert_eq!(l.status_at(t(0))[0].remaining, 0);
    });
}

/// A refusal ‖ `set_limits`: a refusal writes nothing and computes its retry time and the
/// limit that admits last from the whole slot of its word's epoch (the hot words and the
/// retry time's), so they are one configuration's: the old word's with the old slot, or the
/// new word's with the new slot, which the word's `Acquire` load (or the slot's own `seq`)
/// publishes. Limit 0 is spent at 10 s (a burst of 1), limit 1 holds 5 of 5 per minute;
/// limit 0's rate goes from 1e6/s to 10/s: the retry is 1 µs or 100 ms after 10 s (what the
/// sequential order reports), by limit 0. (A second reconfiguration, rewriting the
/// refusal's slot under it, is `set_limits_twice_vs_check_on_a_full_bucket_grants`'s race:
/// here every word of the refusal's second, full read of the slot could be offered old or
/// new, 2^25 ways, which no bound keeps to seconds.)
#[test]
fn refusal_vs_set_limits_reports_one_configurations_retry() {
    loom::model(|| {
        let at = 10 * SEC;
        let c = [1e6, 10.0].map(|r| [bw(r, 1), bw(5.0 / 60.0, 5)]);
        let l = bucket(&c[0]);
        assert!(l.check_n_at(t(at), 1).is_ok());
        let a = thread::spawn(move || l.check_n_at(t(at), 1));
        l.set_limits_at(t(at), &c[1]).unwrap();
        let d = a.join().unwrap().expect_err("limit 0 is spent");
        let before = after(&c[0], &[Op::Check(at, 1), Op::Check(at, 1)]).0[1];
        let later = [Op::Check(at, 1), Op::Set(at, &c[1]), Op::Check(at, 1)];
        let later = after(&c[0], &later).0[1];
        assert!(
            Err(d) == before || Err(d) == later,
            "{d:?}: neither {before:?} nor {later:?}"
        );
        assert_ne!(before, later);
        assert_eq!(d.limit(), 0);
    });
}

/// peek ‖ check: a peek writes nothing, so the check of the last token of limit 0 is granted
/// whatever the order, and the peek sees the token (before) or the refusal (after), as the
/// check itself would at that point. Limits 1 at 1/s and 2 per minute.
#[test]
fn peek_vs_check_takes_nothing() {
    loom::model(|| {
        let limits = [bw(1.0, 1), bw(2.0 / 60.0, 2)];
        let l = bucket(&limits);
        let a = thread::spawn(move || l.peek_n_at(t(0), 1));
        assert!(l.check_n_at(t(0), 1).is_ok(), "the peek took the token");
        let peeked = a.join().unwrap();
        if let Err(d) = peeked {
            assert_eq!((d.limit(), d.retry_at()), (0, Some(t(SEC))));
        }
        assert_eq!(
            l.status_at(t(0)),
            state_after(&limits, &[Op::Check(0, 1)], 0)
        );
    });
}

/// A fixed hasher: a model must run the same way every time.
type Fixed = BuildHasherDefault<DefaultHasher>;
type K = KeyedMultiTokenBucket<u8, Fixed, ManualClock>;

/// A keyed map of `limits` on a manual clock at 0 (its base), swept only by hand.
fn map(limits: &[Bandwidth]) -> &'static K {
    Box::leak(Box::new(
        KeyedMultiTokenBucket::builder(limits)
            .hasher(Fixed::default())
            .sweep_every(Duration::MAX)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

/// Keyed check ‖ check on one key (inserted first, taking nothing): limits of 3 at 1/s and 3
/// per minute, checks of 1 and 2 at 0 both granted, both landing in the key's word: every
/// limit empty, and a third check refused by limit 0 with its retry at 1 s.
#[test]
fn keyed_check_vs_check_on_one_key_both_land() {
    loom::model(|| {
        let limits = [bw(1.0, 3), bw(0.05, 3)];
        let k = map(&limits);
        assert!(k.check_n_at(&1, t(0), 0).is_ok());
        let a = thread::spawn(move || k.check_n_at(&1, t(0), 1).is_ok());
        assert!(k.check_n_at(&1, t(0), 2).is_ok());
        assert!(a.join().unwrap());
        let s = k.status_at(&1, t(0));
        assert_eq!((s[0].remaining, s[1].remaining), (0, 0), "a grant was lost");
        let order = [Op::Check(0, 1), Op::Check(0, 2)];
        assert_eq!(s, state_after(&limits, &order, 0));
        assert_eq!(k.len(), 1);
    });
}

/// Keyed check ‖ `evict_idle`: key 1 is idle (every limit full), so the sweep at 1 s may
/// evict it at any point of a check at 1 s. Either the grant lands and the eviction fails on
/// it, or the eviction lands and the check revives the key (full, born at 1 s) and grants on
/// it: one grant either way, the state that of a bucket checked once at 1 s.
#[test]
fn keyed_check_vs_evict_keeps_the_grant() {
    loom::model(|| {
        let limits = [bw(1.0, 1), bw(2.0 / 60.0, 2)];
        let k = map(&limits);
        assert!(k.check_n_at(&1, t(0), 0).is_ok());
        let a = thread::spawn(move || k.check_n_at(&1, t(SEC), 1).is_ok());
        let evicted = k.evict_idle_at(t(SEC));
        assert!(a.join().unwrap());
        assert_eq!(
            k.status_at(&1, t(SEC)),
            state_after(&limits, &[Op::Check(SEC, 1)], SEC),
            "{evicted} evicted"
        );
        assert!(k.check_n_at(&1, t(SEC), 1).is_err(), "the grant was lost");
        assert_eq!(k.len(), 1);
    });
}

/// A stale reading across an eviction: key 1 took 1 at 0 (limits 1 at 1/s and 2 per minute:
/// full again at 30 s); a check reads 0.5 s while the sweep judges at 30 s and evicts it.
/// Under the evicted state 0.5 s finds limit 0 half refilled and is refused; a key revived
/// as born at the stale reading would be full and grant. The reviver dates the key at the
/// sweep's time or later, which refuses 0.5 s.
#[test]
fn keyed_stale_reading_across_an_eviction_gains_nothing() {
    loom::model(|| {
        let limits = [bw(1.0, 1), bw(2.0 / 60.0, 2)];
        let k = map(&limits);
        assert!(k.check_n_at(&1, t(0), 1).is_ok());
        let stale = thread::spawn(move || k.check_n_at(&1, t(SEC / 2), 1).is_ok());
        k.evict_idle_at(t(30 * SEC));
        assert!(!stale.join().unwrap(), "two grants in [0, 0.5 s] at 1/s");
    });
}
