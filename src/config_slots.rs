//! Double-buffered, seqlock-validated configuration slots: how a limiter whose state word
//! carries a configuration *epoch* finds that epoch's configuration without a lock.
//!
//! # Protocol
//! A configuration is `N` words. Slot `e & 1` holds epoch `e`. The writer (one at a time; the
//! limiter serializes reconfigurations with a lock the hot path never takes) fills the slot of
//! the *next* epoch, then publishes the epoch by a `Release` CAS on the limiter's state word.
//!
//! * **Invariant:** while the state word carries epoch `e`, slot `e & 1` holds epoch `e`'s
//!   configuration: the writer next touches that slot for epoch `e + 2`, which needs the state
//!   word to have moved to `e + 1` first.
//! * A reader that loaded the state word with `Acquire` and found epoch `e` reads slot `e & 1`
//!   as a seqlock: `seq` (`Acquire`), the words (`Relaxed`), an `Acquire` fence, `seq` again.
//!   If either `seq` differs from `e`, the slot was rewritten for `e + 2`, so the reader's state
//!   word is stale: it reloads the word, never waits for the writer.
//! * Writes: `seq` is set to `WRITING`, a `Release` fence orders that before the words, and
//!   `seq` is stored with `Release` after them. A reader that sees `seq == e` twice around its
//!   reads therefore saw no word of a later write (the standard seqlock argument, as in
//!   crossbeam's `AtomicCell`).
//! * Epoch `e`'s words thus reach a reader by two publications, each enough alone: the state
//!   word's `Acquire` load of the `Release` CAS that installed `e` (after the slot write), and
//!   the `Acquire` first load of the `Release` store of `seq = e`. The loom models fail only
//!   when one ordering of each is weakened (the table in `loom-tests/src/lib.rs`).

use crate::layout::{Layout, Padded};
use crate::sync::{fence, retry_hint, AtomicU64, Ordering};

const WRITING: u64 = u64::MAX;

struct Slot<const N: usize> {
    /// The epoch whose configuration the slot holds, or `WRITING`.
    seq: AtomicU64,
    words: [AtomicU64; N],
}

/// Two configuration slots of `N` words each, on their own cache line(s) so that writes to the
/// hot state word do not evict them (unless `P` is `Compact`: then they sit next to it).
pub(crate) struct ConfigSlots<const N: usize, P: Layout = Padded> {
    slots: P::Cell<[Slot<N>; 2]>,
}

impl<const N: usize, P: Layout> ConfigSlots<N, P> {
    /// Slots holding `first` as epoch 0.
    pub(crate) fn new(first: [u64; N]) -> Self {
        let slot = || Slot {
            seq: AtomicU64::new(WRITING),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        };
        let slots = ConfigSlots {
            slots: P::cell([slot(), slot()]),
        };
        slots.write(0, first);
        slots
    }

    /// Epoch `epoch`'s configuration, or `None` if its slot has been rewritten since (the
    /// caller's state word is stale and must be reloaded; under loom, `retry_hint` lets the
    /// model stop re-offering the stale word, as the caller's reload loop needs).
    #[inline]
    pub(crate) fn read(&self, epoch: u32) -> Option<[u64; N]> {
        self.read_first::<N>(epoch)
    }

    /// The first `M <= N` words of epoch `epoch`'s configuration, under the same validation as
    /// [`ConfigSlots::read`]: for the hot path, when the slot also holds words only rarer
    /// operations need.
    #[inline]
    pub(crate) fn read_first<const M: usize>(&self, epoch: u32) -> Option<[u64; M]> {
        let slot = &self.slots[(epoch & 1) as usize];
        if slot.seq.load(Ordering::Acquire) != u64::from(epoch) {
            retry_hint();
            return None;
        }
        let words = std::array::from_fn(|i| slot.words[i].load(Ordering::Relaxed));
        self.holds(epoch as usize, epoch).then_some(words)
    }

    /// Slot `parity`'s words, for a hot path that loads only the words it needs and then
    /// validates them with [`ConfigSlots::holds`] (without `read`'s first `seq` load: the
    /// state word's `Acquire` load that found the epoch is that first read).
    #[inline(always)]
    pub(crate) fn words(&self, parity: usize) -> &[AtomicU64; N] {
        &self.slots[parity & 1].words
    }

    /// Whether slot `parity` still holds epoch `epoch` after the caller's `Relaxed` loads of
    /// its words: an `Acquire` fence, then `seq`. If not, the caller's state word is stale.
    #[inline(always)]
    pub(crate) fn holds(&self, parity: usize, epoch: u32) -> bool {
        fence(Ordering::Acquire);
        if self.slots[parity & 1].seq.load(Ordering::Relaxed) != u64::from(epoch) {
            retry_hint();
            return false;
        }
        true
    }

    /// Writes epoch `epoch`'s configuration. Only one writer at a time, and only for the epoch
    /// after the state word's current one (or before the limiter is shared).
    pub(crate) fn write(&self, epoch: u32, words: [u64; N]) {
        let slot = &self.slots[(epoch & 1) as usize];
        slot.seq.store(WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in slot.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        slot.seq.store(u64::from(epoch), Ordering::Release);
    }
}
