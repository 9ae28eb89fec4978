//! The mutex twin of [`crate::lease::Lease`]: the same permits, renewal claim and refused-until
//! time, as plain fields under one lock, each operation a few lines read top to bottom. The
//! oracle of the lease's property test (`tests/api/lease.rs`).

use std::sync::Mutex;

use crate::lease::Spend;
use crate::{Denied, Nanos};

/// [`crate::lease::Lease`] under a mutex.
///
/// ```
/// use turnstile::lease::Spend;
/// use turnstile::{reference, Nanos};
///
/// let lease = reference::Lease::new();
/// assert_eq!(lease.try_spend_at(Nanos::new(1), 1, 0), Spend::Short { claimed: true });
/// lease.end_renewal(2, None);
/// assert_eq!(lease.held(), 2);
/// ```
#[derive(Debug, Default)]
pub struct Lease {
    state: Mutex<State>, // the twin's one lock: it is the oracle, slow on purpose
}

#[derive(Debug, Default)]
struct State {
    held: u32,
    renewing: bool,
    refused_until: u64,
}

impl Lease {
    /// An empty lease.
    pub fn new() -> Lease {
        Lease::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`crate::lease::Lease::try_spend_at`].
    pub fn try_spend_at(&self, now: Nanos, n: u32, renew_below: u32) -> Spend {
        let mut s = self.state();
        if s.held >= n {
            s.held -= n;
            let claimed = !s.renewing && s.held < renew_below;
            s.renewing |= claimed;
            return Spend::Granted {
                left: s.held,
                claimed,
            };
        }
        if now.as_u64() < s.refused_until {
            return Spend::Refused(Denied::new(now, Some(Nanos::new(s.refused_until))));
        }
        if s.renewing {
            return Spend::Short { claimed: false };
        }
        s.renewing = true;
        Spend::Short { claimed: true }
    }

    /// [`crate::lease::Lease::end_renewal`].
    pub fn end_renewal(&self, permits: u32, refused_until: Option<Nanos>) {
        let mut s = self.state();
        if let Some(until) = refused_until {
            s.refused_until = until.as_u64();
        }
        s.held = s.held.saturating_add(permits);
        s.renewing = false;
    }

    /// [`crate::lease::Lease::take_all`].
    pub fn take_all(&self) -> u32 {
        std::mem::take(&mut self.state().held)
    }

    /// [`crate::lease::Lease::held`].
    pub fn held(&self) -> u32 {
        self.state().held
    }

    /// [`crate::lease::Lease::is_renewing`].
    pub fn is_renewing(&self) -> bool {
        self.state().renewing
    }

    /// [`crate::lease::Lease::refused_until`].
    pub fn refused_until(&self) -> Nanos {
        Nanos::new(self.state().refused_until)
    }
}
