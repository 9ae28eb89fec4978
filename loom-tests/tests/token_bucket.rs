//! loom models of the token bucket's CAS protocols: every interleaving of two operations on
//! one limiter ends in the state of some sequential order, and never over-grants.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test token_bucket
#![cfg(loom)]

use loom::thread;
use loom_tests::{model_3_threads, model_at_bound};
use turnstile::{Limit, Limiter, ManualClock, Nanos, TokenBucket};

const SEC: u64 = 1_000_000_000;

/// loom threads must be 'static and a Reservation borrows its limiter: leak one small limiter
/// per explored execution.
fn limiter(limit: f64, burst: u32) -> &'static TokenBucket<ManualClock> {
    Box::leak(Box::new(
        TokenBucket::builder(Limit::per_second(limit).unwrap(), burst)
            .clock(ManualClock::default())
            .build(),
    ))
}

fn t(ns: u64) -> Nanos {
    Nanos::new(ns)
}

#[test]
fn allow_vs_allow_grants_the_last_token_once() {
    loom::model(|| {
        let l = limiter(1.0, 1);
        let a = thread::spawn(move || l.allow_at(t(0)));
        let b = l.allow_at(t(0));
        let a = a.join().unwrap();
        assert!(a ^ b, "exactly one of two racing allows gets the one token");
        assert_eq!(l.tokens_at(t(0)), 0.0);
    });
}

#[test]
fn reserve_vs_reserve_queues_both() {
    loom::model(|| {
        let l = limiter(1.0, 1);
        let a = thread::spawn(move || l.reserve_at(t(0)).time_to_act());
        let b = l.reserve_at(t(0)).time_to_act();
        let a = a.join().unwrap();
        let mut acts = [a.unwrap(), b.unwrap()];
        acts.sort();
        assert_eq!(acts, [t(0), t(SEC)]);
        assert_eq!(l.tokens_at(t(0)), -1.0);
    });
}

#[test]
fn reserve_vs_cancel_is_linearizable() {
    loom::model(|| {
        let l = limiter(1.0, 1);
        let first = l.reserve_at(t(0)); // tokens 0
        let r = l.reserve_at(t(0)); // tokens -1, act 1 s
        let a = thread::spawn(move || r.cancel_at(t(0)));
        let b = l.reserve_at(t(0)).time_to_act().unwrap();
        a.join().unwrap();
        let tokens = l.tokens_at(t(0));
        // cancel first: restores 1, then the reservation takes it back (act 1 s, tokens -1).
        // reserve first: act 2 s; r now has a later reservation holding its stretch: restores 0.
        assert!(
            (b == t(SEC) && tokens == -1.0) || (b == t(2 * SEC) && tokens == -2.0),
            "act {b:?}, tokens {tokens}"
        );
        drop(first);
    });
}

#[test]
fn cancel_vs_cancel_never_over_restores() {
    loom::model(|| {
        let l = limiter(1.0, 1);
        assert!(l.allow_at(t(0)));
        let r1 = l.reserve_at(t(0)); // act 1 s
        let r2 = l.reserve_at(t(0)); // act 2 s, tokens -2
        let a = thread::spawn(move || r1.cancel_at(t(0)));
        r2.cancel_at(t(0));
        a.join().unwrap();
        let tokens = l.tokens_at(t(0));
        // r1 then r2: r2 still held r1's stretch, so r1 restores 0, then r2 restores 1 -> -1.
        // r2 then r1: both restore 1 -> 0.
        assert!(tokens == -1.0 || tokens == 0.0, "tokens {tokens}");
    });
}

/// Two cancels of reservations that act at the same instant: no later reservation holds
/// either one's stretch, so rate.go restores each one's token whatever the order, and both
/// restorations must land. A cancel that stored its result blindly instead of CASing it would
/// lose one of them when both load the bucket before either writes.
#[test]
fn cancel_vs_cancel_both_restorations_land() {
    loom::model(|| {
        let l = limiter(1.0, 2);
        let r1 = l.reserve_at(t(0)); // acts at 0, 1 token left
        let r2 = l.reserve_at(t(0)); // acts at 0, none left
        assert_eq!(
            (r1.time_to_act(), r2.time_to_act()),
            (Some(t(0)), Some(t(0)))
        );
        let a = thread::spawn(move || r1.cancel_at(t(0)));
        r2.cancel_at(t(0));
        a.join().unwrap();
        assert_eq!(l.tokens_at(t(0)), 2.0, "both cancels gave their token back");
    });
}

#[test]
fn set_limit_vs_reserve_is_linearizable() {
    loom::model(|| {
        let l = limiter(1.0, 1);
        assert!(l.allow_at(t(0)));
        let a = thread::spawn(move || l.set_limit_at(t(0), Limit::per_second(2.0).unwrap()));
        let r = l.reserve_at(t(0));
        let (act, limit) = (r.time_to_act().unwrap(), r.limit().as_f64());
        a.join().unwrap();
        // set_limit first: the token costs 0.5 s at 2/s. reserve first: 1 s at 1/s. Never a
        // mix (a reservation computed half under the old configuration).
        assert!(
            (act == t(SEC / 2) && limit == 2.0) || (act == t(SEC) && limit == 1.0),
            "act {act:?} under limit {limit}"
        );
        assert_eq!(l.tokens_at(t(0)), -1.0);
        assert_eq!(l.limit().as_f64(), 2.0);
        drop(r);
    });
}

#[test]
fn set_burst_vs_allow_is_linearizable() {
    loom::model(|| {
        let l = limiter(1.0, 2);
        let a = thread::spawn(move || l.set_burst_at(t(0), 1));
        let granted = l.allow_n_at(t(0), 2);
        a.join().unwrap();
        let tokens = l.tokens_at(t(0));
        // set_burst first: 2 > burst 1, denied, 1 token left. allow first: granted, 0 left.
        assert!(
            (!granted && tokens == 1.0) || (granted && tokens == 0.0),
            "granted {granted}, tokens {tokens}"
        );
    });
}

#[test]
fn set_limit_vs_set_limit_vs_allow() {
    model_3_threads(|| {
        let l = limiter(1.0, 1);
        assert!(l.allow_at(t(0)));
        let a = thread::spawn(move || l.set_limit_at(t(SEC / 2), Limit::per_second(4.0).unwrap()));
        let b = thread::spawn(move || l.set_limit_at(t(SEC / 2), Limit::per_second(2.0).unwrap()));
        let granted = l.allow_at(t(SEC / 2));
        a.join().unwrap();
        b.join().unwrap();
        // Half a second at 1/s leaves half a token whatever the order: never enough.
        assert!(!granted);
        let tokens = l.tokens_at(t(SEC / 2));
        assert!((tokens - 0.5).abs() < 1e-9, "tokens {tokens}");
        let limit = l.limit().as_f64();
        assert!(limit == 4.0 || limit == 2.0);
    });
}

#[test]
fn set_burst_vs_reserve_is_linearizable() {
    loom::model(|| {
        let l = limiter(1.0, 2);
        assert!(l.allow_at(t(0)));
        let a = thread::spawn(move || l.set_burst_at(t(0), 3));
        let r = l.reserve_n_at(t(0), 3);
        let act = r.time_to_act();
        a.join().unwrap();
        let tokens = l.tokens_at(t(0));
        // set_burst first: 3 <= burst 3, reserved with 1 token in hand: act at 2 s, -2 left.
        // reserve first: 3 > burst 2, not OK; the burst then grows, 1 token left.
        assert!(
            (act == Some(t(2 * SEC)) && tokens == -2.0) || (act.is_none() && tokens == 1.0),
            "act {act:?}, tokens {tokens}"
        );
        drop(r);
    });
}

/// The configuration seqlock's retry path: the allow loads the state word of epoch 0 and reads
/// slot 0 while it is rewritten for epoch 2 (by the second `set_limit`, after the first
/// installed epoch 1 in slot 1): the allow sees `seq == 0` and then words of the new write,
/// which only the slot's re-check rejects. The bucket is full and the burst 1 under every
/// configuration, so every order grants. An allow that used epoch 2's limit (0.25/s: a token
/// costs 4 s), or any mix of its words, on epoch 0's body (full at 1/s: 1 s of refill) would
/// see a wait and deny on that load alone.
///
/// The allow runs in the spawned thread: loom then also explores it reading stale values
/// (the word of epoch 0, `seq == 0`, each slot word old or new) after the reconfigurations,
/// which is the same race seen through the memory model. (With the allow on the main thread,
/// loom's race detection, which keeps one last access per atomic, never schedules the second
/// write inside the allow's read.) Those stale reads need no preemption; the bound of 2 keeps
/// the model to seconds (each extra preemption multiplies its executions by ~5).
#[test]
fn set_limit_twice_vs_allow_on_a_full_bucket_grants() {
    model_at_bound(2, || {
        let l = limiter(1.0, 1);
        let a = thread::spawn(move || l.allow_at(t(0)));
        l.set_limit_at(t(0), Limit::per_second(0.5).unwrap());
        l.set_limit_at(t(0), Limit::per_second(0.25).unwrap());
        let granted = a.join().unwrap();
        assert!(granted, "a full bucket grants under every configuration");
        assert_eq!(l.tokens_at(t(0)), 0.0);
        assert_eq!(l.limit().as_f64(), 0.25);
    });
}

/// A denial writes nothing, so it must check that the slot it read was its word's: two burst
/// cuts racing an allow that every configuration grants (1 token left at 10 s, burst 3 cut to
/// 1, twice, so the second rewrites the allow's slot). A read that mixes the second cut's base
/// (9 s: burst 1 at 1/s) with the first configuration's `tau` and scale sees 13 tokens owed
/// against 4 and denies; only the validating reload (after an `Acquire` fence, paired with
/// the writer's `Release` fence) turns that into a retry. Catches dropping the validation,
/// either fence, or the writer's first-generation CAS ordering.
#[test]
fn set_burst_twice_vs_allow_never_denies_what_every_configuration_grants() {
    model_at_bound(2, || {
        let l = limiter(1.0, 3);
        assert!(l.allow_n_at(t(10 * SEC), 2));
        let a = thread::spawn(move || l.allow_at(t(10 * SEC)));
        l.set_burst_at(t(10 * SEC), 1);
        l.set_burst_at(t(10 * SEC), 1);
        let granted = a.join().unwrap();
        assert!(granted, "one token is left under every configuration");
        assert_eq!(l.tokens_at(t(10 * SEC)), 0.0);
    });
}

/// Two reconfigurations racing an allow on a full bucket, three threads: every order grants
/// and leaves no token (the burst is 1 whatever the limit).
#[test]
fn set_limit_vs_set_limit_vs_allow_on_a_full_bucket_grants() {
    model_3_threads(|| {
        let l = limiter(1.0, 1);
        let a = thread::spawn(move || l.set_limit_at(t(0), Limit::per_second(0.5).unwrap()));
        let b = thread::spawn(move || l.set_limit_at(t(0), Limit::per_second(0.25).unwrap()));
        let granted = l.allow_at(t(0));
        a.join().unwrap();
        b.join().unwrap();
        assert!(granted, "a full bucket grants under every configuration");
        assert_eq!(l.tokens_at(t(0)), 0.0);
        let limit = l.limit().as_f64();
        assert!(limit == 0.5 || limit == 0.25, "limit {limit}");
    });
}

/// A refund (`Limiter::refund_n_at`, the third CAS protocol on the word) racing a check for
/// the token it gives back: either order is a sequential one (refund first: the check gets
/// the token; check first: refused, and the refund lands after), never a lost refund nor a
/// token granted twice.
#[test]
fn refund_vs_check_is_linearizable() {
    loom::model(|| {
        let l = limiter(1.0, 1);
        assert!(l.check_n_at(t(0), 1).is_ok()); // empty
        let a = thread::spawn(move || l.refund_n_at(t(0), 1));
        let granted = l.check_n_at(t(0), 1).is_ok();
        assert!(a.join().unwrap());
        let tokens = l.tokens_at(t(0));
        assert!(
            (granted && tokens == 0.0) || (!granted && tokens == 1.0),
            "granted {granted}, tokens {tokens}"
        );
    });
}

/// Two refunds of tokens taken at one instant: both land (a refund that stored its result
/// blindly would lose one when both load the word before either writes), and the burst caps
/// them: a third refund, of a token never taken, fills nothing past it.
#[test]
fn refund_vs_refund_both_land_within_the_burst() {
    loom::model(|| {
        let l = limiter(1.0, 2);
        assert!(l.check_n_at(t(0), 2).is_ok());
        let a = thread::spawn(move || l.refund_n_at(t(0), 1));
        assert!(l.refund_n_at(t(0), 1));
        assert!(a.join().unwrap());
        assert_eq!(l.tokens_at(t(0)), 2.0, "both refunds gave their token back");
        assert!(l.refund_n_at(t(0), 1));
        assert_eq!(l.tokens_at(t(0)), 2.0, "never past the burst");
    });
}

/// A refund racing a reconfiguration commits with a CAS on the whole word, so it lands in the
/// configuration of the word it read or retries in the new one: never half in each. set_burst
/// first (to 3, keeping 0 tokens), then the refund: 1. The refund first (1 token), then
/// set_burst: 1.
#[test]
fn refund_vs_set_burst_is_linearizable() {
    loom::model(|| {
        let l = limiter(1.0, 1);
        assert!(l.check_n_at(t(0), 1).is_ok());
        let a = thread::spawn(move || l.set_burst_at(t(0), 3));
        assert!(l.refund_n_at(t(0), 1));
        a.join().unwrap();
        assert_eq!(l.tokens_at(t(0)), 1.0);
        assert_eq!(l.burst(), 3);
    });
}

/// A check's refusal is decided inline from loads alone, retry time included: the time is
/// computed from the hot words and two more of the slot (`per`, `per_shift`), all validated
/// by the reload of the state word. Two limit changes race the refusal of an empty bucket at
/// 10 s, the second rewriting the refusal's slot: the retry time must be the one of a single
/// configuration (its token is back 1 us on at 1e6/s, 1 ms at 1e3/s, 100 ms at 10/s), never
/// a mix of one configuration's word or base with another's scale (such a mix reports 19.9 s).
/// Catches dropping the reload that validates the inline refusal. One preemption is enough
/// for that (the refusal stopped after its load while both changes run, or reading stale
/// values); two take minutes, as the refusal's retry through the slow path reads every slot
/// word.
#[test]
fn set_limit_twice_vs_a_refused_check_reports_one_configurations_retry() {
    refused_check_vs_set_limit_twice(|l| l.check_n_at(t(10 * SEC), 1));
}

/// The same race for a check that reads the clock itself (`check_n`), whose inline refusal
/// computes its retry time before the verdict and refuses from it alone.
#[test]
fn set_limit_twice_vs_a_refused_clocked_check_reports_one_configurations_retry() {
    refused_check_vs_set_limit_twice(|l| l.check_n(1));
}

/// The model of the two tests above: `check` refuses an empty bucket at 10 s while two limit
/// changes run.
fn refused_check_vs_set_limit_twice(
    check: fn(&TokenBucket<ManualClock>) -> Result<(), turnstile::Denied>,
) {
    model_at_bound(1, move || {
        let l = limiter(1e6, 1);
        l.clock().set(t(10 * SEC));
        assert!(l.check_n_at(t(10 * SEC), 1).is_ok());
        let a = thread::spawn(move || check(l));
        l.set_limit_at(t(10 * SEC), Limit::per_second(1e3).unwrap());
        l.set_limit_at(t(10 * SEC), Limit::per_second(10.0).unwrap());
        let denied = a.join().unwrap().expect_err("an empty bucket refuses");
        let retry = denied.retry_at().expect("a retry can succeed").as_u64() - 10 * SEC;
        assert!(
            [1_000, 1_000_000, 100_000_000].contains(&retry),
            "retry {retry} ns on: not one configuration's"
        );
    });
}
