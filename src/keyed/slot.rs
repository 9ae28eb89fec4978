//! One key's entry in [`Keyed`](super::Keyed)'s table: its limiter and its eviction state,
//! and the protocol by which a sweep evicts an idle limiter without losing a grant that races it.
//!
//! # The protocol
//! A key whose limiter is idle ([`Idle`]: a fresh limiter would refuse at least as much) is
//! removed by a sweep, so memory follows the set of *active* keys. The danger is a sweep that
//! removes a limiter while another thread is using it: that thread's grant would land on a
//! limiter nobody sees any more, and the next request would start from a fresh one, granting
//! twice. Each entry therefore carries a small state word, `LIVE -> RETIRING -> DEAD`:
//!
//! * **Evicting** an entry: CAS `LIVE -> RETIRING`; `fence(SeqCst)`; if the limiter is still
//!   idle, CAS `RETIRING -> DEAD` and remove it, else put it back to `LIVE`.
//! * **Using** an entry: skip it if `DEAD`; run the check on its limiter; after a grant,
//!   `fence(SeqCst)`; then load the state. `LIVE`: done. `RETIRING`: CAS it back to `LIVE`,
//!   which vetoes the eviction (the limiter is no longer idle); if that CAS finds `DEAD`, or
//!   the state was `DEAD`, the entry was evicted: run the check again on the key's new entry.
//!
//! **Why no grant is lost.** The two fences are ordered. If the user's fence comes first, the
//! evictor's idleness check (after its own fence) sees the grant, finds the limiter busy and
//! keeps it. If the evictor's fence comes first, the user's state load (after its fence) sees
//! `RETIRING` or `DEAD`: either it vetoes the eviction in time, or it learns that its grant
//! landed on a dead limiter and replays the check on the live one. The dead limiter was idle,
//! i.e. equivalent to a fresh one, when it was retired, and every grant made on it after that
//! is replayed, so no request is counted twice and none is lost. The fences cost one `mfence`
//! per *granted* check (a denial writes nothing and needs none); loom checks the protocol in
//! `loom-tests/tests/keyed.rs` (check ‖ evict, insert ‖ evict, check ‖ check ‖ evict, on a
//! limiter whose own atomics are all `Relaxed`).
//!
//! # Stale readings across an eviction
//! **Proof sketch.** Each of those bounds is proved, in its limiter's module, from one
//! quantity `q` (a token bucket's `tat`, a leaky bucket's `next`, a window's end or index, a
//! smooth limiter's `next_free` and the time its store would be empty): `q` never
//! decreases, each grant moves it by the grant's cost, and a grant at `t` needs `q` within
//! a fixed allowance of `t`; none of it depends on the order of the readings. Across an
//! eviction of `L` judged at `J`, followed by a newborn `N` born at `B`:
//!
//! 1. `L`, with every grant that counted on it, was idle at `J` (the eviction protocol
//!    above: a grant the evictor's second idleness check missed is replayed on `N`).
//! 2. `J <= B`. The sweep publishes `J` (`fetch_max` into `judged`) before it retires
//!    anything, and it retires each entry inside the map's `retain`, holding the map's
//!    writer lock, and unlinks it there. `N`'s `B` is read holding the writer lock for `N`'s
//!    insertion, so after `L`'s retirement: the sweep released the lock after writing
//!    `DEAD`, and the insertion took it after (it found `L` unlinked, or `DEAD` and
//!    unlinked it). Either way the publication happens-before the read of `judged`
//!    (through the lock), which so returns `J` or later.
//! 3. By [`Idle::born_at`]'s contract, `N`'s `q` is at least that of any limiter idle at
//!    some `j <= B` advanced to `B`; `L` was idle at `J <= B`, so `q` does not decrease
//!    across the swap. The key's whole history, across any number of evictions, is then a
//!    history the bound covers.

use crate::clock::Nanos;
use crate::limiter::{Idle, Limiter};
use crate::sync::{fence, AtomicU32, Ordering};

pub(super) const LIVE: u32 = 0;
pub(super) const RETIRING: u32 = 1;
pub(super) const DEAD: u32 = 2;

/// One key's limiter and its eviction state (`LIVE`, `RETIRING`, `DEAD`), aligned to a cache
/// line so that a compact limiter and the state are one line.
#[repr(C, align(64))]
pub(crate) struct Slot<L> {
    pub(super) state: AtomicU32,
    pub(super) limiter: L,
    /// Under loom, read by every lookup that finds the slot and written by its drop, so that
    /// loom reports a free that such a lookup does not happen-before (`src/keyed/table.rs`,
    /// "Under loom").
    #[cfg(loom)]
    freed: crate::sync::UnsafeCell<()>,
}

impl<L> Slot<L> {
    /// Whether the slot was evicted (`DEAD` is final). `Acquire`: a thread that sees it may
    /// build the key a new limiter, born no earlier than the sweep that killed this one.
    pub(super) fn is_dead(&self) -> bool {
        self.state.load(Ordering::Acquire) == DEAD
    }

    /// A lookup found this slot: under loom, a read of the cell the slot's drop writes. A
    /// no-op otherwise.
    #[inline(always)]
    pub(super) fn touch(&self) {
        #[cfg(loom)]
        self.freed.with(|_| ());
    }
}

#[cfg(loom)]
impl<L> Drop for Slot<L> {
    fn drop(&mut self) {
        self.freed.with_mut(|_| ());
    }
}

impl<L: Limiter + Idle> Slot<L> {
    pub(super) fn new(limiter: L) -> Slot<L> {
        Slot {
            state: AtomicU32::new(LIVE),
            limiter,
            #[cfg(loom)]
            freed: crate::sync::UnsafeCell::new(()),
        }
    }

    /// Runs `f` on the limiter under the protocol of the module docs; `None` if the entry was
    /// (or got) evicted and `f` must run again on the key's new entry. `wrote` says whether
    /// `f`'s result may have changed the limiter.
    #[inline]
    pub(super) fn run<R>(
        &self,
        f: impl FnOnce(&L) -> R,
        wrote: impl FnOnce(&R) -> bool,
    ) -> Option<R> {
        if self.state.load(Ordering::Acquire) == DEAD {
            return None;
        }
        let r = f(&self.limiter);
        let wrote = wrote(&r);
        if wrote {
            // Pairs with the evictor's fence: either it sees our write, or we see its mark.
            fence(Ordering::SeqCst);
        }
        match self.state.load(Ordering::Relaxed) {
            LIVE => Some(r),
            RETIRING if !wrote => Some(r),
            RETIRING => match self.state.compare_exchange(
                RETIRING,
                LIVE,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) | Err(LIVE) => Some(r),
                Err(_) => None,
            },
            _ => None,
        }
    }

    /// This slot's identity, to remove exactly this entry and not a newer one of its key.
    pub(super) fn id(&self) -> *const Slot<L> {
        self
    }

    /// The evictor's half: true if this entry is now `DEAD` (by this call) and must go.
    pub(super) fn retire(&self, now: Nanos) -> bool {
        if self.state.load(Ordering::Relaxed) != LIVE || !self.limiter.is_idle_at(now) {
            return false;
        }
        if self
            .state
            .compare_exchange(LIVE, RETIRING, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        // Pairs with the users' fence after a grant.
        fence(Ordering::SeqCst);
        if self.limiter.is_idle_at(now)
            && self
                .state
                .compare_exchange(RETIRING, DEAD, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return true;
        }
        let _ = self
            .state
            .compare_exchange(RETIRING, LIVE, Ordering::Relaxed, Ordering::Relaxed);
        false
    }
}
