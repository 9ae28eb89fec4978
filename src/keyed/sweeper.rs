//! Where a keyed map's sweeps run: inline, in the check that finds one due, or on a thread of
//! the map's own ([`Keyed::spawn_sweeper`](crate::Keyed::spawn_sweeper),
//! [`KeyedTokenBucket::spawn_sweeper`](crate::KeyedTokenBucket::spawn_sweeper), and the tower
//! `per_key` policy, which starts one for its map). Once a thread sweeps, no check does: the
//! periodic sweep is the thread's, and a check that finds the map full wakes it instead of
//! sweeping (the early sweep of the maps' module docs), so a sweep's cost, which grows with
//! the keys, never lands on a request.

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;
#[cfg(not(loom))]
use std::time::{Duration, Instant};

use crate::sync::{AtomicU64, Ordering};

/// A map's sweep schedule: whether checks sweep, and the thread to wake if they do not.
pub(crate) struct Sweeper {
    /// The gap after the last sweep at which a check sweeps inline: the map's `sweep_every`,
    /// or `u64::MAX` (never) once a thread sweeps.
    inline_every: AtomicU64,
    /// The sweeping thread, once started: woken for an early sweep and when the map drops.
    thread: OnceLock<std::thread::Thread>,
    /// An early sweep is asked for ([`Sweeper::wake`]); so a spurious wake-up sweeps nothing.
    wanted: AtomicBool,
}

impl Sweeper {
    pub(crate) fn new(every: u64) -> Sweeper {
        Sweeper {
            inline_every: AtomicU64::new(every),
            thread: OnceLock::new(),
            wanted: AtomicBool::new(false),
        }
    }

    /// The gap after the last sweep at which a check sweeps inline (`u64::MAX`: never).
    #[inline(always)]
    pub(crate) fn inline_every(&self) -> u64 {
        self.inline_every.load(Ordering::Relaxed)
    }

    /// Asks the sweeping thread for a sweep now; false if there is none (the caller sweeps).
    pub(crate) fn wake(&self) -> bool {
        match self.thread.get() {
            Some(t) => {
                // std's `AtomicBool`: not part of any protocol loom checks.
                self.wanted
                    .store(true, std::sync::atomic::Ordering::Release);
                t.unpark();
                true
            }
            None => false,
        }
    }

    /// Starts a thread that runs `sweep` on `map` every half `every` ns and whenever
    /// [`Sweeper::wake`] asks, and ends once the map is dropped (woken by this `Sweeper`'s
    /// drop: it holds only a `Weak`). From then on checks never sweep. With `every` of
    /// `u64::MAX` (sweeps left to the caller) the thread ends at once and checks go on
    /// sweeping early when the map is full.
    #[cfg(not(loom))]
    pub(crate) fn spawn<M: Send + Sync + 'static>(
        map: &std::sync::Arc<M>,
        every: u64,
        sweeper: fn(&M) -> &Sweeper,
        sweep: fn(&M),
    ) -> std::thread::JoinHandle<()> {
        let weak = std::sync::Arc::downgrade(map);
        let nap = Duration::from_nanos((every / 2).max(1));
        let handle = std::thread::Builder::new()
            .name("turnstile-sweeper".into())
            .spawn(move || {
                if every == u64::MAX {
                    return;
                }
                let mut next = Instant::now() + nap;
                loop {
                    // Woken early by a full map, by the map's drop, or spuriously.
                    std::thread::park_timeout(next.saturating_duration_since(Instant::now()));
                    let Some(map) = weak.upgrade() else { return };
                    let wanted = sweeper(&map)
                        .wanted
                        .swap(false, std::sync::atomic::Ordering::Acquire);
                    if wanted || Instant::now() >= next {
                        sweep(&map);
                        next = Instant::now() + nap;
                    }
                }
            })
            .unwrap_or_else(|e| panic!("cannot start a sweeper thread: {e}"));
        if every != u64::MAX {
            let s = sweeper(map);
            // A second sweeper sweeps too, and ends on its next timed wake after the drop.
            let _ = s.thread.set(handle.thread().clone());
            s.inline_every.store(u64::MAX, Ordering::Relaxed);
        }
        handle
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        // The thread's `Weak` no longer upgrades: wake it to end now rather than at its next
        // timed sweep.
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}
