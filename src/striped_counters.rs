//! [`StripedCounters`]: counts that every thread adds to without sharing a cache line.
//!
//! A count bumped on every request by every thread is one cache line bounced between cores:
//! at two threads its `fetch_add` costs more than the check it counts. So each counter is
//! split into stripes, one cache line each, and a thread adds only to its own stripe; a
//! read sums the stripes.
//!
//! **Stripes.** A power of two, at least the machine's parallelism (at most 64), chosen at
//! construction. A thread's stripe is a thread-local index handed out round robin on its
//! first add, so up to that many threads each write a line no other thread writes; more
//! threads share stripes, which costs contention, never a lost count (`fetch_add`).
//!
//! **Orderings.** `Relaxed` throughout: a count publishes nothing. Each `fetch_add` is
//! atomic, so no add is lost, and a sum read after the adds it should see have happened
//! before it (their threads joined, their responses received) sees every one of them: it
//! is exact at rest, and a lower bound of the adds in flight while it runs.

use std::cell::Cell;

use crate::sync::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// `N` counters, each striped over cache lines written by different threads.
pub(crate) struct StripedCounters<const N: usize> {
    stripes: Box<[CachePadded<[AtomicU64; N]>]>,
}

/// The most stripes: past it, threads share lines.
const MAX_STRIPES: usize = 64;

/// The next stripe index to hand out: a thread takes one on its first add. std's atomic,
/// not the loom shim's: a static needs a `const` constructor, and which stripe a thread
/// gets changes no count.
static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

thread_local! {
    /// This thread's stripe index (before masking), or `usize::MAX` before its first add.
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// This thread's stripe index, unmasked.
#[inline]
fn stripe() -> usize {
    STRIPE.with(|s| {
        let i = s.get();
        if i != usize::MAX {
            return i;
        }
        let i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % MAX_STRIPES;
        s.set(i);
        i
    })
}

impl<const N: usize> StripedCounters<N> {
    /// `N` counters at 0, with a stripe per thread the machine runs at once.
    pub(crate) fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stripes = threads.next_power_of_two().min(MAX_STRIPES);
        StripedCounters {
            stripes: (0..stripes).map(|_| CachePadded::new(zeros())).collect(),
        }
    }

    /// Adds `n` to counter `i`, on this thread's stripe.
    #[inline]
    pub(crate) fn add(&self, i: usize, n: u64) {
        let s = &self.stripes[stripe() & (self.stripes.len() - 1)];
        s[i].fetch_add(n, Ordering::Relaxed);
    }

    /// Counter `i`: the sum of its stripes.
    pub(crate) fn get(&self, i: usize) -> u64 {
        self.stripes.iter().fold(0u64, |sum, s| {
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
        // More threads than stripes: some share a line, and still no add is lost.
        std::thread::scope(|s| {
            for t in 0..(MAX_STRIPES as u64 + 3) {
                let c = &c;
                s.spawn(move || {
                    for _ in 0..1000 {
                        c.add(0, 1);
                        c.add(1, t);
                    }
                });
            }
        });
        let threads = MAX_STRIPES as u64 + 3;
        assert_eq!(c.get(0), threads * 1000);
        assert_eq!(c.get(1), 1000 * threads * (threads - 1) / 2);
    }
}
