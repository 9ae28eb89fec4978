//! `turnstile::lease::Lease` against its mutex twin (`turnstile::reference::Lease`) on random
//! sequences of spends, renewals (ended with permits, a refusal or nothing), hand-backs and
//! clock steps: every answer and every state read must agree.
#![cfg(feature = "reference")]

use proptest::prelude::*;
use turnstile::lease::{Lease, Spend};
use turnstile::{reference, Nanos};

#[derive(Debug, Clone)]
enum Op {
    Spend {
        n: u32,
        renew_below: u32,
    },
    /// Ends the renewal in flight, if any: `permits`, and a refusal `refuse` ns ahead.
    End {
        permits: u32,
        refuse: Option<u64>,
    },
    TakeAll,
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u32..5, 0u32..6).prop_map(|(n, renew_below)| Op::Spend { n, renew_below }),
        2 => (0u32..8, proptest::option::of(0u64..50))
            .prop_map(|(permits, refuse)| Op::End { permits, refuse }),
        1 => Just(Op::TakeAll),
        2 => (0u64..30).prop_map(Op::Advance),
    ]
}

proptest! {
    #[test]
    fn the_lease_answers_as_its_mutex_twin(ops in proptest::collection::vec(op(), 1..200)) {
        let (lease, twin) = (Lease::new(), reference::Lease::new());
        let mut now = Nanos::new(1_000);
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Spend { n, renew_below } => {
                    let a = lease.try_spend_at(now, n, renew_below);
                    let b = twin.try_spend_at(now, n, renew_below);
                    prop_assert_eq!(a, b, "op {}", i);
                }
                // A renewal is ended once, by whoever claimed it: only while one is in flight.
                Op::End { permits, refuse } => {
                    if twin.is_renewing() {
                        let until = refuse.map(|d| Nanos::new(now.as_u64() + d));
                        lease.end_renewal(permits, until);
                        twin.end_renewal(permits, until);
                    }
                }
                Op::TakeAll => prop_assert_eq!(lease.take_all(), twin.take_all(), "op {}", i),
                Op::Advance(d) => now = Nanos::new(now.as_u64() + d),
            }
            prop_assert_eq!(lease.held(), twin.held(), "op {}", i);
            prop_assert_eq!(lease.is_renewing(), twin.is_renewing(), "op {}", i);
            prop_assert_eq!(lease.refused_until(), twin.refused_until(), "op {}", i);
        }
    }
}

#[test]
fn a_refusal_ends_at_its_time_and_a_claim_is_taken_once() {
    let lease = Lease::new();
    let now = Nanos::new(10);
    assert_eq!(
        lease.try_spend_at(now, 1, 0),
        Spend::Short { claimed: true }
    );
    lease.end_renewal(0, Some(Nanos::new(20)));
    let Spend::Refused(d) = lease.try_spend_at(Nanos::new(19), 1, 0) else {
        panic!("refused until 20")
    };
    assert_eq!(d.retry_at(), Some(Nanos::new(20)));
    assert_eq!(
        lease.try_spend_at(Nanos::new(20), 1, 0),
        Spend::Short { claimed: true }
    );
    assert_eq!(
        lease.try_spend_at(Nanos::new(20), 1, 0),
        Spend::Short { claimed: false }
    );
    // Permits held are spent even while a refusal is in force.
    lease.end_renewal(1, Some(Nanos::new(99)));
    assert!(matches!(
        lease.try_spend_at(Nanos::new(21), 1, 0),
        Spend::Granted { left: 0, .. }
    ));
}
