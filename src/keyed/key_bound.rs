//! What every keyed map keeps beside its table: the key bound (live keys plus reservations,
//! never above `max_keys`, and what a new key gets when the map is full) and the sweep
//! schedule (when the last sweep ran, the latest time any sweep judged at, and the sweeper
//! thread if there is one). [`Keyed`] and the inline maps (`src/keyed/word_map.rs`)
//! hold one each; the eviction protocol that uses it is theirs.
//!
//! # Orderings
//! All `Relaxed`. `len` is a counter whose CAS keeps it at or below `max_keys`; no other
//! memory hangs on it. `last_sweep` only elects one sweeping thread (by CAS) and rate-limits
//! sweeps; `inline_due` is a hint derived from it. `judged` is published by `fetch_max`
//! before a sweep's evictions and read by a birth after the acquiring operation that saw an
//! eviction (each map's module docs, step 2): that operation orders it, not `judged`'s own
//! ordering.

use std::fmt;
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::keyed::sweeper::Sweeper;
use crate::keyed::WhenFull;
use crate::limiter::Denied;
use crate::sync::{AtomicU64, Ordering};

/// What a keyed map holds and has let go, for an operator (`Keyed::stats`,
/// `InlineMap::stats`; with the feature `metrics`, published for every `per_key` policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MapStats {
    /// Keys held now (with those being inserted).
    pub keys: u64,
    /// The most it holds ([`KeyedBuilder::max_keys`](crate::keyed::KeyedBuilder::max_keys)).
    pub max_keys: u64,
    /// Keys evicted by its sweeps since it was built (idle ones: their limiter was full).
    pub evicted: u64,
    /// New keys that found it full since it was built: refused, or let through untracked
    /// ([`WhenFull`]). Non-zero means more clients came than the bound holds: a key flood, or
    /// a bound too small.
    pub full: u64,
}

/// The key bound and the sweep schedule of one keyed map: see the [module docs](self).
pub(crate) struct KeyBound {
    /// Live keys plus reservations for keys being inserted (or revived).
    len: AtomicU64,
    max_keys: u64,
    when_full: WhenFull,
    sweep_every: u64,
    /// Whether checks sweep inline, or a thread of the map's own.
    sweeper: Sweeper,
    /// When the last sweep started (ns on the map's clock); claimed by CAS so one thread
    /// sweeps.
    last_sweep: AtomicU64,
    /// When a check next sweeps inline, `last_sweep` plus the sweeper's gap, so that a
    /// check's test is one load and a compare. Never later than that sum (both only grow,
    /// and this is raised with `fetch_max`): a stale value sends a check to the cold path,
    /// which rereads both and raises it, but never skips a sweep.
    inline_due: AtomicU64,
    /// The latest time any sweep judged idleness at; only grows (`fetch_max`).
    judged: AtomicU64,
    /// Keys evicted by sweeps, ever: what [`MapStats`] reports.
    evicted: AtomicU64,
    /// New keys that found the map full, ever.
    full: AtomicU64,
}

/// Room reserved for one key ([`KeyBound::room`]): given back on drop unless [`Room::keep`]
/// is called, so that a key that does not go in (another thread inserted it first, or user
/// code panicked) leaves no reservation behind.
pub(crate) struct Room<'a>(&'a KeyBound, bool);

impl Room<'_> {
    /// The key went in: its room stays taken.
    pub(crate) fn keep(mut self) {
        self.1 = true;
    }
}

impl Drop for Room<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.release();
        }
    }
}

impl KeyBound {
    /// A map with no keys, `max_keys` at most, sweeping every `sweep_every` ns from `now`.
    pub(crate) fn new(max_keys: u64, when_full: WhenFull, sweep_every: u64, now: Nanos) -> Self {
        KeyBound {
            len: AtomicU64::new(0),
            max_keys,
            when_full,
            sweep_every,
            sweeper: Sweeper::new(sweep_every),
            last_sweep: AtomicU64::new(now.as_u64()),
            inline_due: AtomicU64::new(now.as_u64().saturating_add(sweep_every)),
            judged: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            full: AtomicU64::new(0),
        }
    }

    /// Live keys plus those being inserted.
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.len.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    pub(crate) fn max_keys(&self) -> u64 {
        self.max_keys
    }

    /// Counts `n` keys a sweep evicted (their room already given back, one by one).
    pub(crate) fn evicted(&self, n: usize) {
        if n > 0 {
            self.evicted.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The map's figures for an operator.
    pub(crate) fn stats(&self) -> MapStats {
        MapStats {
            keys: self.len.load(Ordering::Relaxed),
            max_keys: self.max_keys,
            evicted: self.evicted.load(Ordering::Relaxed),
            full: self.full.load(Ordering::Relaxed),
        }
    }

    #[cfg(not(loom))] // for spawn_sweeper only
    pub(crate) fn sweep_every(&self) -> u64 {
        self.sweep_every
    }

    /// The map's sweeper, for its `spawn_sweeper`.
    #[cfg(not(loom))] // for spawn_sweeper only
    pub(crate) fn sweeper(&self) -> &Sweeper {
        &self.sweeper
    }

    /// Takes room for one more key under `max_keys`; false if there is none.
    pub(crate) fn reserve(&self) -> bool {
        let mut len = self.len.load(Ordering::Relaxed);
        loop {
            if len >= self.max_keys {
                return false;
            }
            match self
                .len
                .compare_exchange_weak(len, len + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => len = actual,
            }
        }
    }

    /// Gives back the room of one key (evicted, or a reservation not used).
    pub(crate) fn release(&self) {
        self.len.fetch_sub(1, Ordering::Relaxed);
    }

    /// Room for one more key, or `None` if the map is full even after an early sweep (run by
    /// `sweep` at the reading it is handed, or by the sweeper thread).
    pub(crate) fn room(
        &self,
        now: Nanos,
        clock: &impl Clock,
        sweep: impl FnOnce(Nanos),
    ) -> Option<Room<'_>> {
        if !self.reserve() {
            self.maybe_sweep(now, true, clock, sweep);
            if !self.reserve() {
                return None;
            }
        }
        Some(Room(self, false))
    }

    /// Publishes a sweep's judgement time, before any of its evictions.
    pub(crate) fn judge(&self, now: Nanos) {
        self.judged.fetch_max(now.as_u64(), Ordering::Relaxed);
    }

    /// The birth time of a limiter built for a check at `now`: `now`, or the latest time a
    /// sweep judged at if that is later (then the check's reading is older than a sweep that
    /// may have evicted the key's previous limiter, and is judged as stale).
    pub(crate) fn birth(&self, now: Nanos) -> Nanos {
        now.max(Nanos::new(self.judged.load(Ordering::Relaxed)))
    }

    /// The answer to a new key when the map is full: the `when_full` policy; a denial retries
    /// at the next early sweep.
    pub(crate) fn full(&self, now: Nanos) -> Result<(), Denied> {
        self.full.fetch_add(1, Ordering::Relaxed);
        match self.when_full {
            WhenFull::Allow => Ok(()),
            WhenFull::Deny => {
                let next = self
                    .last_sweep
                    .load(Ordering::Relaxed)
                    .saturating_add(self.early_sweep_gap())
                    .max(now.as_u64().saturating_add(1));
                Err(Denied::new(now, Some(Nanos::new(next))))
            }
        }
    }

    /// The least time between early sweeps (asked by a full map): a tenth of `sweep_every`,
    /// at least 1 ms.
    fn early_sweep_gap(&self) -> u64 {
        (self.sweep_every / 10).max(1_000_000)
    }

    /// Sweeps with `sweep` (handed the reading to judge at) if one is due at `hint` (a
    /// check's time): `sweep_every` after the last one, or (`early`, the map is full) a tenth
    /// of that. One load and a compare when none is due; the rest is out of line. A sweep is
    /// judged on the map's own clock, never on `hint`: a caller's time may be anything, and
    /// a future one would evict keys that are busy at the present. So a due `hint` is
    /// confirmed by a clock reading, and the thread whose CAS claims the sweep runs it at
    /// that reading, unless a sweeper thread takes it.
    #[inline(always)]
    pub(crate) fn maybe_sweep(
        &self,
        hint: Nanos,
        early: bool,
        clock: &impl Clock,
        sweep: impl FnOnce(Nanos),
    ) {
        let due = if early {
            let last = self.last_sweep.load(Ordering::Relaxed);
            last.saturating_add(self.early_sweep_gap())
        } else {
            self.inline_due.load(Ordering::Relaxed)
        };
        if hint.as_u64() < due {
            return;
        }
        self.claim_sweep(early, clock, sweep);
    }

    #[cold]
    fn claim_sweep(&self, early: bool, clock: &impl Clock, sweep: impl FnOnce(Nanos)) {
        let last = self.last_sweep.load(Ordering::Relaxed);
        let every = self.sweeper.inline_every();
        let gap = if early { self.early_sweep_gap() } else { every };
        let due = last.saturating_add(gap);
        let now = clock.now();
        if now.as_u64() < due {
            if !early {
                // `inline_due` was behind (a sweeper thread started, or two sweeps' updates
                // landed out of order): raise it, so the next checks stay on the fast path.
                self.inline_due.fetch_max(due, Ordering::Relaxed);
            }
            return;
        }
        if self
            .last_sweep
            .compare_exchange(last, now.as_u64(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.inline_due
                .fetch_max(now.as_u64().saturating_add(every), Ordering::Relaxed);
            if !self.sweeper.wake() {
                sweep(now);
            }
        }
    }

    /// Records a sweep the sweeper thread starts at `now`.
    #[cfg(not(loom))] // for spawn_sweeper only
    pub(crate) fn swept(&self, now: Nanos) {
        self.last_sweep.store(now.as_u64(), Ordering::Relaxed);
    }

    /// The bound's fields for a map's (or its builder's) `Debug`.
    pub(crate) fn debug_fields(
        d: &mut fmt::DebugStruct<'_, '_>,
        max_keys: u64,
        when: WhenFull,
        every: u64,
    ) {
        // `None`: no key bound (u64::MAX).
        d.field("max_keys", &(max_keys != u64::MAX).then_some(max_keys))
            .field("when_full", &when)
            .field("sweep_every", &Duration::from_nanos(every));
    }

    /// [`Self::debug_fields`] of this bound.
    pub(crate) fn debug(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        Self::debug_fields(d, self.max_keys, self.when_full, self.sweep_every);
    }
}
