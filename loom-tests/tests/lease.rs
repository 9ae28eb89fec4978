//! loom models of `Lease` (`src/lease.rs`): permits spent by CAS, handed back by a swap to
//! zero, deposited by the renewal that one caller at a time claims, with the source's refusal
//! published by the claim's release. Each model checks that no permit is granted twice or
//! made up (granted + handed back + held = deposited), that one caller claims a renewal, and
//! that a spender who sees a renewal ended sees the refusal it recorded.
//!
//! Mutations each model catches (tried and reverted):
//! * the spend's CAS (which also takes the claim) replaced by a store:
//!   `two_spenders_vs_a_deposit_conserve_permits`, `spend_vs_take_all_conserves_permits` and
//!   `two_callers_on_an_empty_lease_claim_once`.
//! * `take_all`'s `fetch_and` replaced by a load and a store: `spend_vs_take_all_conserves_permits`.
//! * `end_renewal`'s CAS (and its first load) made `Relaxed`, or the spender's first word
//!   load made `Relaxed`: `a_refusal_is_seen_with_the_end_of_its_renewal` (the spender sees
//!   the claim released but not the refusal, and claims a renewal of what was just refused).
//!
//! Run: RUSTFLAGS="--cfg loom" cargo test -p loom-tests --release --test lease
#![cfg(loom)]

use std::sync::Arc;

use loom::thread;
use turnstile::lease::{Lease, Spend};
use turnstile::Nanos;

const NOW: Nanos = Nanos::new(1_000);

/// A lease holding `permits`, deposited through a renewal as a limiter would.
fn holding(permits: u32) -> Lease {
    let lease = Lease::new();
    assert_eq!(
        lease.try_spend_at(NOW, 1, 0),
        Spend::Short { claimed: true }
    );
    lease.end_renewal(permits, None);
    lease
}

fn granted(s: Spend) -> u32 {
    match s {
        Spend::Granted { .. } => 1,
        _ => 0,
    }
}

#[test]
fn two_spenders_vs_a_deposit_conserve_permits() {
    loom_tests::model_3_threads(|| {
        let lease = Arc::new(holding(1));
        // A renewal claimed by a grant below the low-water mark (2), ended by a third thread.
        let first = lease.try_spend_at(NOW, 1, 2);
        assert_eq!(
            first,
            Spend::Granted {
                left: 0,
                claimed: true
            }
        );
        let spenders: Vec<_> = (0..2)
            .map(|_| {
                let lease = lease.clone();
                thread::spawn(move || granted(lease.try_spend_at(NOW, 1, 0)))
            })
            .collect();
        lease.end_renewal(1, None);
        let got: u32 = spenders.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(got + lease.held(), 1, "one permit deposited");
    });
}

#[test]
fn spend_vs_take_all_conserves_permits() {
    loom::model(|| {
        let lease = Arc::new(holding(2));
        let spender = {
            let lease = lease.clone();
            thread::spawn(move || granted(lease.try_spend_at(NOW, 1, 0)))
        };
        let taken = lease.take_all();
        let got = spender.join().unwrap();
        assert_eq!(got + taken + lease.held(), 2);
    });
}

#[test]
fn two_callers_on_an_empty_lease_claim_once() {
    loom::model(|| {
        let lease = Arc::new(Lease::new());
        let other = {
            let lease = lease.clone();
            thread::spawn(move || lease.try_spend_at(NOW, 1, 0))
        };
        let mine = lease.try_spend_at(NOW, 1, 0);
        let theirs = other.join().unwrap();
        let claims = [mine, theirs]
            .iter()
            .filter(|s| **s == Spend::Short { claimed: true })
            .count();
        assert_eq!(claims, 1, "{mine:?} {theirs:?}");
    });
}

#[test]
fn a_refusal_is_seen_with_the_end_of_its_renewal() {
    loom::model(|| {
        let lease = Arc::new(Lease::new());
        assert_eq!(
            lease.try_spend_at(NOW, 1, 0),
            Spend::Short { claimed: true }
        );
        let until = Nanos::new(5_000);
        let spender = {
            let lease = lease.clone();
            thread::spawn(move || lease.try_spend_at(NOW, 1, 0))
        };
        lease.end_renewal(0, Some(until));
        match spender.join().unwrap() {
            // Before the end: the renewal was in flight.
            Spend::Short { claimed: false } => {}
            // After it: the refusal, never a new claim of what was just refused.
            Spend::Refused(d) => assert_eq!(d.retry_at(), Some(until)),
            other => panic!("{other:?}"),
        }
    });
}
