//! loom models of the smooth limiters' CAS protocols: every interleaving of two operations on
//! one limiter ends in the state of one of the two sequential orders, never a mix.
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test smooth
#![cfg(loom)]

use std::time::Duration;

use loom::thread;
use loom_tests::{model_3_threads, model_at_bound};
use turnstile::{Limiter, ManualClock, Nanos, SmoothBursty, SmoothWarmingUp};

const SEC: u64 = 1_000_000_000;

/// loom threads must be 'static: leak one small limiter per explored execution. Created at
/// time 0, so `next_free` starts at 0.
fn bursty(rate: f64) -> &'static SmoothBursty<ManualClock> {
    Box::leak(Box::new(
        SmoothBursty::builder(rate)
            .clock(ManualClock::default())
            .build()
            .unwrap(),
    ))
}

fn t(ns: u64) -> Nanos {
    Nanos::new(ns)
}

/// The limiter's `next_free`, read without changing anything: a denied zero-permit check
/// reports it (or passes if it is not after `now`).
fn next_free<L: Limiter>(l: &L, now: Nanos) -> Nanos {
    match l.check_n_at(now, 0) {
        Ok(()) => now,
        Err(d) => d.retry_at().unwrap(),
    }
}

#[test]
fn acquire_vs_acquire_queues_both() {
    loom::model(|| {
        let l = bursty(1.0);
        let a = thread::spawn(move || l.reserve_n_at(t(0), 1).unwrap());
        let b = l.reserve_n_at(t(0), 1).unwrap();
        let a = a.join().unwrap();
        // Pay later: the first waits for nothing, the second for the first's second.
        let mut waits = [a, b];
        waits.sort();
        assert_eq!(waits, [Duration::ZERO, Duration::from_secs(1)]);
        assert_eq!(next_free(l, t(0)), t(2 * SEC));
    });
}

#[test]
fn warming_acquire_vs_acquire_charges_the_trapezoid_once_each() {
    loom::model(|| {
        // 2 permits/s, 4 s warm-up, cold factor 3: from cold, the first permit costs 1.375 s
        // and the second 1.125 s, whichever thread gets which.
        let l: &'static SmoothWarmingUp<ManualClock> = Box::leak(Box::new(
            SmoothWarmingUp::builder(2.0, Duration::from_secs(4))
                .clock(ManualClock::default())
                .build()
                .unwrap(),
        ));
        let a = thread::spawn(move || l.reserve_n_at(t(0), 1).unwrap());
        let b = l.reserve_n_at(t(0), 1).unwrap();
        let a = a.join().unwrap();
        let mut waits = [a, b];
        waits.sort();
        assert_eq!(waits, [Duration::ZERO, Duration::from_millis(1375)]);
        assert_eq!(next_free(l, t(0)), t(2500 * SEC / 1000));
        assert_eq!(l.stored_permits_at(t(0)), 6.0);
    });
}

#[test]
fn try_acquire_vs_acquire_is_linearizable() {
    loom::model(|| {
        let l = bursty(1.0);
        let a = thread::spawn(move || l.try_acquire_at(t(0), 1, Duration::ZERO).unwrap());
        let b = l.reserve_n_at(t(0), 1).unwrap();
        let a = a.join().unwrap();
        let next = next_free(l, t(0));
        // try first: granted at once, then the reserve waits 1 s and owes until 2 s.
        // reserve first: no wait, owes until 1 s; the try sees the debt and changes nothing.
        assert!(
            (a == Some(Duration::ZERO) && b == Duration::from_secs(1) && next == t(2 * SEC))
                || (a.is_none() && b == Duration::ZERO && next == t(SEC)),
            "try {a:?}, reserve {b:?}, next_free {next:?}"
        );
    });
}

#[test]
fn set_rate_vs_acquire_is_linearizable() {
    loom::model(|| {
        // 1/s with a 1-second burst, empty at 0. A reservation at 0 and set_rate(2) at 0.5 s.
        let l = bursty(1.0);
        let a = thread::spawn(move || l.set_rate_at(t(SEC / 2), 2.0).unwrap());
        let wait = l.reserve_n_at(t(0), 1).unwrap();
        a.join().unwrap();
        let next = next_free(l, t(0));
        let stored = l.stored_permits_at(t(0));
        // reserve first: no wait, owes 1 s at 1/s; set_rate at 0.5 s is inside the debt.
        // set_rate first: resync stores 0.5 permit at 1/s, rescaled to 1 of 2; the reserve
        // waits 0.5 s for next_free and spends the stored permit for free.
        // A mix (the reservation computed under 1/s and committed on the new word) would
        // wait 0.5 s and owe until 1 s.
        assert!(
            (wait == Duration::ZERO && next == t(SEC) && stored == 0.0)
                || (wait == Duration::from_millis(500) && next == t(SEC / 2) && stored == 0.0),
            "wait {wait:?}, next_free {next:?}, stored {stored}"
        );
        assert_eq!(l.rate(), 2.0);
    });
}

/// A reservation racing one `set_rate` at the same instant, the reservation on the spawned
/// thread so that loom explores it reading the new epoch's word while its slot's words are
/// still stale for that thread (the slot was written by the other thread just before the word).
/// The configuration of the word's epoch must reach the reader through one of its two
/// publications (the word's `Acquire`/`Release`, or the slot's own `seq`); if neither did, the
/// reservation would be charged under the slot's initial zeros.
#[test]
fn acquire_vs_set_rate_is_charged_at_one_rate() {
    loom::model(|| {
        let l = bursty(1.0);
        let a = thread::spawn(move || l.reserve_n_at(t(0), 1).unwrap());
        l.set_rate_at(t(0), 2.0).unwrap();
        let wait = a.join().unwrap();
        let next = next_free(l, t(0));
        // reserve first: one permit at 1/s, next_free 1 s; set_rate at 0 is inside the debt.
        // set_rate first: one permit at 2/s, next_free 0.5 s. No wait either way.
        assert_eq!(wait, Duration::ZERO);
        assert!(next == t(SEC) || next == t(SEC / 2), "next_free {next:?}");
    });
}

#[test]
fn set_rate_vs_try_acquire_is_linearizable() {
    loom::model(|| {
        // One reservation owes until 1 s; set_rate(4) at 2 s resyncs (stores 1 permit, full)
        // and rescales to 4 stored. A try at 0.5 s with a 0.5 s timeout sees the debt either way.
        let l = bursty(1.0);
        l.reserve_n_at(t(0), 1).unwrap();
        let a = thread::spawn(move || l.set_rate_at(t(2 * SEC), 4.0).unwrap());
        let got = l
            .try_acquire_at(t(SEC / 2), 2, Duration::from_millis(500))
            .unwrap();
        a.join().unwrap();
        let next = next_free(l, t(0));
        // try first: waits 0.5 s, owes 2 fresh permits at 1/s until 3 s; set_rate at 2 s is
        // inside the debt, stores nothing: next 3 s.
        // set_rate first: next_free moves to 2 s; the try at 0.5 s sees 2 s - 0.5 s > 0.5 s
        // and is denied with nothing changed: next 2 s, 4 permits stored.
        assert!(
            (got == Some(Duration::from_millis(500)) && next == t(3 * SEC))
                || (got.is_none() && next == t(2 * SEC) && l.stored_permits_at(t(2 * SEC)) == 4.0),
            "try {got:?}, next_free {next:?}"
        );
    });
}

/// The outcomes every sequential order of `set_rate(2)` and `set_rate(+inf)` (both at 0.5 s)
/// and a one-permit reservation at 0 gives on a fresh 1/s limiter (see the callers): the
/// reservation is free of wait only if it came first, and then it owes its second, so
/// `next_free` is 1 s; otherwise it waits for the 0.5 s that the first `set_rate`'s resync
/// moved `next_free` to, and spends a stored permit or nothing (under `+inf`): 0.5 s.
fn assert_sequential_set_rate_twice_vs_acquire(wait: Duration, next: Nanos) {
    assert!(
        (wait == Duration::ZERO && next == t(SEC))
            || (wait == Duration::from_millis(500) && next == t(SEC / 2)),
        "wait {wait:?}, next_free {next:?}"
    );
}

/// The configuration seqlock's retry path on a smooth limiter: the reservation loads the word
/// of epoch 0 and reads slot 0 while it is rewritten for epoch 2 (`set_rate(+inf)` after
/// `set_rate(2)` installed epoch 1). A reservation is decided without a CAS only under a
/// `+inf` rate, so that is the second rate: a reservation that took epoch 2's words (or any
/// mix with its rate) for epoch 0's word would neither wait (`next_free` 0) nor charge,
/// leaving `next_free` at 0.5 s, which no sequential order gives. As in the token bucket's
/// model, the reservation runs in the spawned thread so that loom explores its stale reads,
/// and the bound of 2 keeps the model to seconds.
#[test]
fn set_rate_twice_vs_acquire_is_linearizable() {
    model_at_bound(2, || {
        let l = bursty(1.0);
        let a = thread::spawn(move || l.reserve_n_at(t(0), 1).unwrap());
        l.set_rate_at(t(SEC / 2), 2.0).unwrap();
        l.set_rate_at(t(SEC / 2), f64::INFINITY).unwrap();
        let wait = a.join().unwrap();
        assert_sequential_set_rate_twice_vs_acquire(wait, next_free(l, t(0)));
        assert_eq!(l.rate(), f64::INFINITY);
    });
}

/// Two rate changes racing a reservation, three threads: the outcome of some sequential order.
#[test]
fn set_rate_vs_set_rate_vs_acquire_is_linearizable() {
    model_3_threads(|| {
        let l = bursty(1.0);
        let a = thread::spawn(move || l.set_rate_at(t(SEC / 2), 2.0).unwrap());
        let b = thread::spawn(move || l.set_rate_at(t(SEC / 2), f64::INFINITY).unwrap());
        let wait = l.reserve_n_at(t(0), 1).unwrap();
        a.join().unwrap();
        b.join().unwrap();
        assert_sequential_set_rate_twice_vs_acquire(wait, next_free(l, t(0)));
        assert!(l.rate() == 2.0 || l.rate() == f64::INFINITY);
    });
}

/// Two checks racing for the one permit of an empty 1/s limiter at 0: one is granted, the
/// other refused with the winner's `next_free` (1 s) as its retry time, and nothing charged
/// for it. The loser either loads the winner's word and refuses from that load alone, or
/// loads the first word, loses the CAS, and refuses from the word the CAS returned: a loser
/// that charged anyway (a grant past the limit) or refused with the stale `next_free` (a retry
/// time of 0) fails.
#[test]
fn check_vs_check_refuses_the_loser_with_the_winners_next_free() {
    loom::model(|| {
        let l = bursty(1.0);
        let a = thread::spawn(move || l.check_n_at(t(0), 1));
        let b = l.check_n_at(t(0), 1);
        let a = a.join().unwrap();
        let (won, lost) = match (a, b) {
            (Ok(()), Err(d)) | (Err(d), Ok(())) => ((), d),
            other => panic!("one grant and one refusal expected, got {other:?}"),
        };
        let () = won;
        assert_eq!(lost.retry_at(), Some(t(SEC)));
        assert_eq!(lost.checked_at(), t(0));
        assert_eq!(next_free(l, t(0)), t(SEC));
    });
}

/// A refused check racing a `set_rate` that moves `next_free`: one reservation at 0 owes
/// until 1 s; `set_rate(4)` at 2 s resyncs `next_free` to 2 s. A check at 0.5 s is refused
/// from its load alone either way, with the retry time of the word it loaded: 1 s (before the
/// rate change) or 2 s (after); and it writes nothing, so `next_free` ends at 2 s with the
/// store full (4 permits).
#[test]
fn set_rate_vs_refused_check_is_linearizable() {
    loom::model(|| {
        let l = bursty(1.0);
        l.reserve_n_at(t(0), 1).unwrap();
        let a = thread::spawn(move || l.set_rate_at(t(2 * SEC), 4.0).unwrap());
        let d = l.check_n_at(t(SEC / 2), 1).unwrap_err();
        a.join().unwrap();
        let retry = d.retry_at();
        assert!(
            retry == Some(t(SEC)) || retry == Some(t(2 * SEC)),
            "retry {retry:?}"
        );
        assert_eq!(next_free(l, t(0)), t(2 * SEC));
        assert_eq!(l.stored_permits_at(t(2 * SEC)), 4.0);
    });
}
