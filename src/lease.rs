//! [`Lease`]: permits paid for elsewhere (a fleet's bucket on Redis), spent in process with
//! one atomic operation each: the in-process half of [`redis::Leased`](crate::redis::Leased).
//!
//! # The protocol
//! One 64-bit word holds the permits held and one flag:
//!
//! ```text
//! bit 32        RENEWING: one caller holds the claim to fetch more (at most one at a time)
//! bits 0..32    the permits held, spent by CAS, never below zero
//! ```
//!
//! beside a *refused-until* time (the quota source's last refusal: nothing can be had before
//! it) and the time of the last grant, coarse, for idleness.
//!
//! **Invariant:** permits leave the word only by a CAS that subtracts what it grants
//! ([`Lease::try_spend_at`]) or by the swap to zero that hands them back
//! ([`Lease::take_all`]), and enter it only by [`Lease::end_renewal`]'s deposit. So the
//! permits granted plus those handed back plus those held equal those deposited, in every
//! interleaving: a lease never grants a permit twice, nor one it was not given (the loom models
//! in `loom-tests/tests/lease.rs`).
//!
//! # Orderings
//! * The word's CASes are `AcqRel` and its loads `Acquire`: [`Lease::end_renewal`] stores
//!   the refused-until time before its `Release` CAS, so a spender whose `Acquire` load sees
//!   the claim released also sees the refusal that came with it (else it would ask again for
//!   what was just refused). The permit count itself needs no ordering: a CAS on one word is
//!   atomic whatever its ordering.
//! * The last-grant time is `Relaxed`: a reaper that reads it stale hands back the permits of a
//!   key in use, which then leases again (a round trip, never a permit too many).

use std::time::Duration;

use crossbeam_utils::{Backoff, CachePadded};

use crate::sync::{AtomicU64, Ordering};
use crate::{Denied, Nanos};

/// The renewal claim.
const RENEWING: u64 = 1 << 32;
/// The permits held.
const HELD: u64 = u32::MAX as u64;
/// The last-grant time is rewritten only when it is older than this (about 1 ms), so that a
/// hot key's checks write it about once a millisecond, not once each.
const TOUCH_GRAIN: u64 = 1 << 20;

/// Permits paid for elsewhere and spent here, one atomic operation per check, with a claim
/// that lets one caller at a time fetch more and a cached refusal that answers without asking.
///
/// [`redis::Leased`](crate::redis::Leased) keeps one per key, filled from the fleet's bucket
/// on Redis; any other source of quota can fill one the same way: spend with
/// [`Lease::try_spend_at`]; when it says the lease is short or low and hands you the claim,
/// fetch permits and [`Lease::end_renewal`] with what you got (or the refusal).
///
/// ```
/// use turnstile::lease::{Lease, Spend};
/// use turnstile::Nanos;
///
/// let lease = Lease::new();
/// let now = Nanos::new(1_000);
/// // Empty: the first caller gets the claim to fetch permits.
/// assert_eq!(lease.try_spend_at(now, 1, 0), Spend::Short { claimed: true });
/// // A second caller meanwhile waits for that renewal.
/// assert_eq!(lease.try_spend_at(now, 1, 0), Spend::Short { claimed: false });
/// // The source granted 4: the claimant keeps 1 for itself and deposits 3.
/// lease.end_renewal(3, None);
/// assert_eq!(lease.try_spend_at(now, 2, 1), Spend::Granted { left: 1, claimed: false });
/// // Below the low-water mark (fewer than 1 left): this grant also claims the next renewal.
/// assert_eq!(lease.try_spend_at(now, 1, 1), Spend::Granted { left: 0, claimed: true });
/// // The source refused until 5 000: checks are refused here until then, with no claim.
/// lease.end_renewal(0, Some(Nanos::new(5_000)));
/// let Spend::Refused(denied) = lease.try_spend_at(now, 1, 1) else { panic!() };
/// assert_eq!(denied.retry_at(), Some(Nanos::new(5_000)));
/// assert_eq!(lease.try_spend_at(Nanos::new(5_000), 1, 1), Spend::Short { claimed: true });
/// ```
#[derive(Debug)]
pub struct Lease {
    word: CachePadded<AtomicU64>,
    /// Nanos before which the source refuses: answered here until then.
    refused_until: AtomicU64,
    /// Nanos of the last grant, to within [`TOUCH_GRAIN`].
    last_grant: AtomicU64,
}

/// What [`Lease::try_spend_at`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a claim must be ended with `end_renewal`, and a refusal answered"]
pub enum Spend {
    /// The permits were taken from the lease, `left` remain. `claimed`: the grant left the
    /// lease below the low-water mark with no renewal in flight, and this call took the claim to
    /// renew it: fetch more, then [`Lease::end_renewal`].
    Granted {
        /// Permits held after this grant.
        left: u32,
        /// This call holds the renewal claim.
        claimed: bool,
    },
    /// The lease holds too few permits and the source refused until a time after `now`: the
    /// denial says when to retry. Nothing was claimed.
    Refused(Denied),
    /// The lease holds too few permits. `claimed`: this call took the claim to fetch them
    /// (fetch, then [`Lease::end_renewal`]); otherwise another caller's renewal is in flight.
    Short {
        /// This call holds the renewal claim.
        claimed: bool,
    },
}

impl Default for Lease {
    fn default() -> Self {
        Lease::new()
    }
}

impl Lease {
    /// An empty lease: no permits, no renewal in flight, no refusal.
    pub fn new() -> Lease {
        Lease {
            word: CachePadded::new(AtomicU64::new(0)),
            refused_until: AtomicU64::new(0),
            last_grant: AtomicU64::new(0),
        }
    }

    /// Takes `n` permits at `now` if the lease holds them; a grant that leaves fewer than
    /// `renew_below` with no renewal in flight also claims the renewal, in the same CAS (0:
    /// never on a grant).
    pub fn try_spend_at(&self, now: Nanos, n: u32, renew_below: u32) -> Spend {
        let backoff = Backoff::new();
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            let held = (w & HELD) as u32;
            let renewing = w & RENEWING != 0;
            let (new, done) = if held >= n {
                let left = held - n;
                let claimed = !renewing && left < renew_below;
                let claim = if claimed { RENEWING } else { 0 };
                ((w - u64::from(n)) | claim, Spend::Granted { left, claimed })
            } else {
                let until = self.refused_until.load(Ordering::Relaxed);
                if now.as_u64() < until {
                    return Spend::Refused(Denied::new(now, Some(Nanos::new(until))));
                }
                if renewing {
                    return Spend::Short { claimed: false };
                }
                (w | RENEWING, Spend::Short { claimed: true })
            };
            match self
                .word
                .compare_exchange_weak(w, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if let Spend::Granted { .. } = done {
                        self.touch(now);
                    }
                    return done;
                }
                Err(seen) => {
                    w = seen;
                    backoff.spin();
                }
            }
        }
    }

    /// Ends the renewal this caller claimed: deposits `permits` (saturating at `u32::MAX`
    /// held) and, if the source refused, records that nothing can be had before
    /// `refused_until`; then releases the claim. Call it exactly once per claim, whatever
    /// the fetch's outcome (zero permits and `None` after an error).
    pub fn end_renewal(&self, permits: u32, refused_until: Option<Nanos>) {
        if let Some(until) = refused_until {
            self.refused_until.store(until.as_u64(), Ordering::Relaxed);
        }
        let backoff = Backoff::new();
        let mut w = self.word.load(Ordering::Acquire);
        loop {
            let held = (w & HELD).saturating_add(u64::from(permits)).min(HELD);
            match self.word.compare_exchange_weak(
                w,
                held, // the claim released
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(seen) => {
                    w = seen;
                    backoff.spin();
                }
            }
        }
    }

    /// Takes every permit held, to hand them back to the source; leaves a renewal in flight
    /// alone (its permits arrive later, and are taken by a later call).
    pub fn take_all(&self) -> u32 {
        (self.word.fetch_and(!HELD, Ordering::AcqRel) & HELD) as u32
    }

    /// The permits held now.
    pub fn held(&self) -> u32 {
        (self.word.load(Ordering::Acquire) & HELD) as u32
    }

    /// Whether a renewal is in flight (claimed and not ended).
    pub fn is_renewing(&self) -> bool {
        self.word.load(Ordering::Acquire) & RENEWING != 0
    }

    /// Before this time the source refuses: checks that find the lease short are refused
    /// here ([`Spend::Refused`]). Zero if it never refused.
    pub fn refused_until(&self) -> Nanos {
        Nanos::new(self.refused_until.load(Ordering::Relaxed))
    }

    /// The time of the last grant, to within about a millisecond; zero before the first.
    pub fn last_grant(&self) -> Nanos {
        Nanos::new(self.last_grant.load(Ordering::Relaxed))
    }

    /// Whether the lease has been unused since `now - idle`: no grant since, nothing held
    /// beyond what a reaper may hand back.
    pub fn unused_for(&self, now: Nanos, idle: Duration) -> bool {
        self.last_grant().saturating_add(idle) <= now
    }

    fn touch(&self, now: Nanos) {
        let last = self.last_grant.load(Ordering::Relaxed);
        if now.as_u64() > last.saturating_add(TOUCH_GRAIN) {
            self.last_grant.store(now.as_u64(), Ordering::Relaxed);
        }
    }
}
