//! [`StripedCounters`]: counts that every thread adds to without sharing a cache line, and
//! without a locked instruction.
//!
//! A count bumped on every request by every thread is one cache line bounced between cores:
//! at two threads its `fetch_add` costs more than the check it counts. Even alone, a
//! `fetch_add` is a locked instruction, which waits for the core's store buffer to drain:
//! several nanoseconds a check. So each counter is split into one slot per thread, a cache
//! line each, and a thread adds to its own slot with a plain load and store; a read sums
//! the slots.
//!
//! **Slots.** [`SLOTS`] per set of counters. A thread takes a slot index on its first add,
//! from a process-wide pool, and gives it back when it exits (a thread-local's destructor);
//! the next thread to take it carries on adding to the same slots. A thread that finds the
//! pool empty (more than `SLOTS` threads alive at once), or adds while its thread-locals are
//! being destroyed, adds to a shared overflow line with `fetch_add` instead: slower, never
//! wrong.
//!
//! **Why a plain add is exact.** A slot has one writer at a time: its thread, for as long
//! as the thread holds the index. The writer's load then store never races another write,
//! so no add is lost. A slot changes hands through the pool's mutex, which orders the last
//! store of the old thread before the first load of the new one.
//!
//! **Orderings.** `Relaxed` throughout: a count publishes nothing. A sum read after the adds
//! it should see have happened before it (their threads joined, their responses received)
//! sees every one of them: it is exact at rest, and a lower bound of the adds in flight.

use std::sync::Mutex; // the slot pool: a thread's first add and its exit, never an add after

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering};

/// The slots of a set of counters: the most threads that add without a locked instruction.
const SLOTS: usize = 64;

/// `N` counters, each in one slot per thread plus an overflow line.
pub(crate) struct StripedCounters<const N: usize> {
    /// Inline, not boxed: an add then follows one pointer fewer (the counters' owner is on
    /// the heap already).
    slots: [CachePadded<[AtomicU64; N]>; SLOTS],
    overflow: CachePadded<[AtomicU64; N]>,
}

/// The slot indices free to take, and how many were ever handed out. A lock, off the hot
/// path: a thread takes it on its first add and when it exits, never on an add after that.
static POOL: Mutex<(Vec<usize>, usize)> = Mutex::new((Vec::new(), 0)); // first add, exit: off the hot path

/// A thread's slot index, given back to the pool when the thread exits.
struct Owned(usize);

impl Drop for Owned {
    fn drop(&mut self) {
        // First, so that an add from a later destructor goes to the overflow line.
        INDEX.set(OVERFLOW);
        POOL.lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .push(self.0);
    }
}

/// [`INDEX`] before the thread's first add.
const UNSET: usize = usize::MAX;
/// [`INDEX`] of a thread that adds to the overflow line.
const OVERFLOW: usize = SLOTS;

thread_local! {
    /// This thread's slot index, [`UNSET`] or [`OVERFLOW`]: a `const` thread-local without
    /// a destructor, so that an add reads it with one load.
    static INDEX: std::cell::Cell<usize> = const { std::cell::Cell::new(UNSET) };
    /// The slot this thread owns, given back when it exits.
    static OWNED: std::cell::Cell<Option<Owned>> = const { std::cell::Cell::new(None) };
}

/// Takes a slot from the pool for this thread (or the overflow line if none is free, or
/// if the thread is exiting).
#[cold]
#[inline(never)]
fn first_slot() -> usize {
    let taken = {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let (free, handed) = &mut *pool;
        free.pop().or_else(|| {
            (*handed < SLOTS).then(|| {
                *handed += 1;
                *handed - 1
            })
        })
    };
    let Some(i) = taken else {
        INDEX.set(OVERFLOW);
        return OVERFLOW;
    };
    // Registers the destructor that gives the slot back; if the thread-locals are already
    // being destroyed, give it back now and use the overflow line.
    if OWNED.try_with(|o| o.set(Some(Owned(i)))).is_err() {
        POOL.lock().unwrap_or_else(|e| e.into_inner()).0.push(i);
        INDEX.set(OVERFLOW);
        return OVERFLOW;
    }
    INDEX.set(i);
    i
}

impl<const N: usize> StripedCounters<N> {
    /// `N` counters at 0.
    pub(crate) fn new() -> Self {
        StripedCounters {
            slots: std::array::from_fn(|_| CachePadded::new(zeros())),
            overflow: CachePadded::new(zeros()),
        }
    }

    /// Adds `n` to counter `i`, in this thread's slot: one test of the thread's index, which
    /// sends a thread without a slot yet ([`UNSET`], past every slot) to the same cold path
    /// as one on the overflow line.
    #[inline]
    pub(crate) fn add(&self, i: usize, n: u64) {
        let s = INDEX.get();
        if s < SLOTS {
            // This thread is the slot's one writer: a plain read and write, no lock.
            let c = &self.slots[s][i];
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        } else {
            self.add_slow(s, i, n);
        }
    }

    /// [`Self::add`] for a thread whose index is [`UNSET`] (it takes one) or [`OVERFLOW`].
    #[cold]
    #[inline(never)]
    fn add_slow(&self, s: usize, i: usize, n: u64) {
        if s == UNSET && first_slot() < SLOTS {
            return self.add(i, n); // in the slot just taken
        }
        self.overflow[i].fetch_add(n, Ordering::Relaxed);
    }

    /// Counter `i`: the sum of its slots.
    pub(crate) fn get(&self, i: usize) -> u64 {
        self.slots
            .iter()
            .chain(std::iter::once(&self.overflow))
            .fold(0u64, |sum, s| {
                sum.wrapping_add(s[i].load(Ordering::Relaxed))
            })
    }
}

fn zeros<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_add_of_every_thread_is_counted() {
        let c = StripedCounters::<2>::new();
        // More threads than slots at once: some add to the overflow line, and still no add
        // is lost; then threads that reuse the slots of exited ones.
        let threads = SLOTS as u64 + 3;
        for _ in 0..2 {
            let barrier = std::sync::Barrier::new(threads as usize);
            std::thread::scope(|s| {
                for t in 0..threads {
                    let (c, barrier) = (&c, &barrier);
                    s.spawn(move || {
                        barrier.wait(); // all alive at once
                        for _ in 0..1000 {
                            c.add(0, 1);
                            c.add(1, t);
                        }
                    });
                }
            });
        }
        assert_eq!(c.get(0), 2 * threads * 1000);
        assert_eq!(c.get(1), 2 * 1000 * threads * (threads - 1) / 2);
    }
}
