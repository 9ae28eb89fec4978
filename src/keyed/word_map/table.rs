//! The word map's table: a power of two of `(state, key)` slots, each key written once before
//! its word is published (the protocol is `word_map.rs`'s header).

use std::borrow::Borrow;
use std::mem::MaybeUninit;

use crate::keyed::word_rule::{Access, AtomicWord, Tested, Word};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering, WordOps};

/// One key: its state word and the key, written once before the word is published.
pub(super) struct Slot<K, W: Word> {
    /// Aligns a 128-bit word's slot to 32 bytes (`Word::Align`): none straddles a line.
    pub(super) _align: [W::Align; 0],
    pub(super) state: W::Atomic,
    pub(super) key: KeyCell<K>,
}

/// A power-of-two array of slots.
pub(super) struct Table<K, W: Word> {
    pub(super) slots: Box<[Slot<K, W>]>,
    pub(super) mask: usize,
    /// Non-`EMPTY` slots; changed only under `writer` (or before the table is published).
    pub(super) used: AtomicUsize,
    /// The table a resize is copying this one into: set (`Release`) before the first live
    /// word is frozen, so a check that finds its word frozen finds the word's continuation
    /// there (module docs, "Resize"). Not owned: the map owns its current table, the epoch
    /// collector the retired ones.
    pub(super) next: AtomicPtr<Table<K, W>>,
}

impl<K, W: Word> Table<K, W> {
    pub(super) fn new(slots: usize) -> Table<K, W> {
        debug_assert!(slots.is_power_of_two());
        Table {
            slots: (0..slots)
                .map(|_| Slot {
                    _align: [],
                    state: W::Atomic::new(W::EMPTY),
                    key: KeyCell::empty(),
                })
                .collect(),
            mask: slots - 1,
            used: AtomicUsize::new(0),
            next: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The table this one is being copied into, if a resize has started; valid while the
    /// guard that reached `self` is pinned (it is retired only after a later resize, which
    /// starts after this one has published it).
    #[inline]
    pub(super) fn next(&self) -> Option<&Table<K, W>> {
        // SAFETY: set once, by a resize, to a table that is the map's current one or retired
        // to the epoch collector after every guard pinned before its own replacement (ours
        // included) is dropped. `Acquire` pairs with the resize's `Release` store.
        unsafe { self.next.load(Ordering::Acquire).as_ref() }
    }

    /// The slot holding `key` (live, dead or frozen), if any, and its word as the probe's
    /// `Acquire` load read it: a check starts from that word rather than loading it again
    /// (a stale one only fails its CAS, and a refusal decided from it is decided from a load
    /// made during the check).
    #[inline(always)]
    pub(super) fn find<Q>(&self, hash: u64, key: &Q) -> Option<(&Slot<K, W>, W)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.find_via(Tested, hash, key)
    }

    /// [`Table::find`], loading each word through `access`.
    #[inline(always)]
    pub(super) fn find_via<A, Q>(&self, access: A, hash: u64, key: &Q) -> Option<(&Slot<K, W>, W)>
    where
        A: Access<W>,
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        // In locals: the `Acquire` loads below would otherwise make each probe reload them.
        let (slots, mask) = (&*self.slots, self.mask);
        let mut i = hash as usize & mask;
        // At most seven eighths of the slots are used, so an EMPTY slot ends every probe;
        // the bound (every slot visited once) is for safety only. A count down rather than
        // a range: one decrement and branch a probe.
        let mut left = mask;
        loop {
            // SAFETY: `i <= mask` and `slots.len() == mask + 1`.
            let slot = unsafe { slots.get_unchecked(i) };
            let s = access.view(&slot.state).load(Ordering::Acquire);
            if s == W::EMPTY {
                return None;
            }
            // SAFETY: `s != EMPTY` was loaded with `Acquire`, and the slot's key was written
            // before the `Release` store that first made its state non-`EMPTY` (`claim`);
            // keys are never written again while the table is reachable (module docs).
            if unsafe { slot.key.with(|k| k.borrow() == key) } {
                return Some((slot, s));
            }
            if left == 0 {
                return None;
            }
            left -= 1;
            i = (i + 1) & mask;
        }
    }

    /// Puts `key` with word `state` in the first `EMPTY` slot of its probe. Only under
    /// `writer` (or on a table not yet published), with room left ([`Table::has_room`]).
    pub(super) fn claim(&self, hash: u64, key: K, state: W) -> &Slot<K, W> {
        let mut i = hash as usize & self.mask;
        loop {
            let slot = &self.slots[i];
            // Relaxed: only the lock holder turns EMPTY into anything else.
            if slot.state.load(Ordering::Relaxed) == W::EMPTY {
                // SAFETY: the slot is EMPTY, so no reader reads its key (`find` compares keys
                // only after seeing a non-EMPTY state), and only we (holding `writer`) write
                // it; the `Release` store below publishes the key with the state.
                unsafe { slot.key.write(key) };
                slot.state.store(state, Ordering::Release);
                self.used.fetch_add(1, Ordering::Relaxed);
                return slot;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Whether one more key fits under the load bound, seven eighths (hashbrown's, which
    /// governor's dashmap shards use): 16 bytes per slot for `u64` keys and 64-bit words
    /// against hashbrown's 17 per bucket, at the same load. Linear probing at 7/8 averages
    /// 4.5 probes for a key present (16-byte slots: 4 to a cache line; 32-byte ones, a
    /// 128-bit word's: 2) and ~32 for one absent, which only the first check of a new key
    /// pays.
    pub(super) fn has_room(&self) -> bool {
        (self.used.load(Ordering::Relaxed) + 1) * 8 <= self.slots.len() * 7
    }
}

impl<K, W: Word> Drop for Table<K, W> {
    fn drop(&mut self) {
        for slot in self.slots.iter_mut() {
            if slot.state.load(Ordering::Relaxed) != W::EMPTY {
                // SAFETY: a non-EMPTY slot's key was written (`claim`); `&mut self` means no
                // reader is left (the table was unpublished and its epoch has passed, or the
                // map itself is being dropped).
                unsafe { slot.key.drop_in_place() };
            }
        }
    }
}

/// A key written once (under the writer lock, while its slot is `EMPTY`) and then only read.
pub(super) struct KeyCell<K>(Cell<MaybeUninit<K>>);

#[cfg(not(loom))]
pub(super) type Cell<T> = std::cell::UnsafeCell<T>;
#[cfg(loom)]
pub(super) type Cell<T> = loom::cell::UnsafeCell<T>;

// SAFETY: the cell is shared between threads only under the write-once protocol of
// `Table::claim` / `Table::find` (module docs): the one write happens-before every read.
// Keys are sent to the thread that frees the table, hence `K: Send`, and read by many
// threads, hence `K: Sync`.
unsafe impl<K: Send + Sync> Sync for KeyCell<K> {}
// SAFETY: as above; the cell owns its `K`.
unsafe impl<K: Send> Send for KeyCell<K> {}

impl<K> KeyCell<K> {
    pub(super) fn empty() -> Self {
        KeyCell(Cell::new(MaybeUninit::uninit()))
    }

    /// # Safety
    /// The cell is uninitialized and nobody else reads or writes it until a `Release`
    /// publication that readers `Acquire` before reading.
    pub(super) unsafe fn write(&self, key: K) {
        unsafe {
            #[cfg(not(loom))]
            (*self.0.get()).write(key);
            #[cfg(loom)]
            self.0.with_mut(|p| {
                (*p).write(key);
            });
        }
    }

    /// # Safety
    /// The key was written, and that write happens-before this call.
    #[inline(always)]
    pub(super) unsafe fn with<R>(&self, f: impl FnOnce(&K) -> R) -> R {
        unsafe {
            #[cfg(not(loom))]
            return f((*self.0.get()).assume_init_ref());
            #[cfg(loom)]
            return self.0.with(|p| f((*p).assume_init_ref()));
        }
    }

    /// # Safety
    /// The key was written, and nobody else can read it any more.
    pub(super) unsafe fn drop_in_place(&mut self) {
        unsafe {
            #[cfg(not(loom))]
            self.0.get_mut().assume_init_drop();
            #[cfg(loom)]
            self.0.with_mut(|p| (*p).assume_init_drop());
        }
    }
}
