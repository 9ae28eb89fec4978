//! [`Keyed`]'s map: an open-addressing table of `(word, key)` entries whose word
//! points to the key's [`Slot`] (its eviction state and limiter, one heap allocation that
//! never moves), read without a lock and written under one mutex.
//!
//! # Why not a general concurrent map
//! A check of a held key is one hash, one probe of this table (the key and its slot pointer
//! side by side, four `u64` entries to a cache line) and the slot itself (its state word
//! first, then the limiter: one line for a small limiter): two cache misses for a key out of
//! cache, as governor's dashmap (a control group and an entry). `scc::HashIndex` keeps its
//! buckets' metadata and entries in separate arrays and relocates values on resize (so the
//! limiter has to sit behind an `Arc`): three or four misses.
//!
//! # The protocol
//! An entry's word is `EMPTY` (0: never used), `TOMB` (1: its key was removed) or a pointer to
//! a live or `DEAD` [`Slot`] (`Box::into_raw`, aligned to 64, so never 0 or 1).
//!
//! * **Lookup** (lock-free, no shared write): pin an epoch (`crossbeam-epoch`), load the table
//!   pointer (`Acquire`), probe from `hash & mask`, loading each word (`Acquire`); `EMPTY`
//!   ends the probe (absent); any other word has its key written and published before it, so
//!   the key is compared; `TOMB` for the key is absent, a pointer is its slot.
//! * **Every write** (insert, remove, a sweep's removals, resize) holds `writer`. Only the lock
//!   holder turns `EMPTY` into anything else, writing the key first and publishing it with
//!   the word (`Release`), and no key is written again while its table lives (**an entry is
//!   never reused for another key**; a returning key reuses its own entry). So readers never
//!   see a torn or changing key.
//! * **Removal** stores `TOMB` and defers the slot's destruction to the epoch collector: a
//!   reader pinned before may still use it (it finds it `DEAD` and retries), one pinned after
//!   cannot reach it. A slot is linked from exactly one entry of the current table, and only
//!   its unlinking under `writer` frees it (retired tables free their keys, never slots).
//! * **Resize** (grow, shrink, or rebuild to drop tombstones and `DEAD` slots; under
//!   `writer`): clone and hash every key into a new table (user code, which may panic, runs
//!   before anything changes), copy each live slot's *pointer* (the limiter never moves, so
//!   a check still running on the old table writes the same limiter: no grant is lost and
//!   nothing needs freezing), publish the new table (`Release`) and retire the old one to the
//!   epoch collector. The `DEAD` slots left out are freed after the publication.
//!
//! At most seven eighths of the entries are non-`EMPTY`, so every probe ends; a table is
//! rebuilt at twice its live keys when it fills, and after a sweep that leaves it under an
//! eighth live or more than a quarter tombstones: memory follows the live keys.
//!
//! # Orderings
//! The word's `Release` store (after the key, or after the slot's construction) and a
//! lookup's `Acquire` load are what make the key and the slot visible to the lookup; the
//! table pointer's `Release` swap and `Acquire` load do the same for a new table's entries
//! and its `mask`. Everything else (`used`, `linked`, the words a writer reads) is read and
//! written under `writer` only, whose lock orders it: `Relaxed`.
//!
//! # Under loom
//! `loom-tests/tests/keyed_table.rs` (the table's races) and `keyed.rs` (the eviction
//! protocol) run this table itself: its atomics are `crate::sync`'s, its key cells loom's
//! `UnsafeCell` (which reports a key read that the key's write does not happen-before), its
//! hasher a fixed one (a model must run the same way every time) and its smallest table 2
//! entries, so that a model's second key grows it. crossbeam-epoch is not loom's, so the
//! reclamation is a stand-in of the same interface: [`pin`] does nothing, and a retired
//! table or slot is kept in a list under `writer` and freed when the map is dropped. That is
//! sound for a model, which drops its map (if at all) after joining its threads: nothing is
//! freed while a lookup can hold it. And it checks what the collector is trusted with, that
//! a table or slot is *retired*, not freed, while a lookup can reach it: a free that a lookup
//! holding the memory does not happen-before is reported by loom (a slot's drop writes a
//! loom cell that every lookup reads, `Slot::touch`; a table's drop writes its keys' cells).
//! The collector's own guarantee (a deferred free runs after every guard pinned before it
//! is dropped) is crossbeam-epoch's, model-checked in that crate.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::mem::MaybeUninit;
use std::ops::DerefMut;

use super::Slot;
use crate::sync::{AtomicPtr, AtomicUsize, Mutex, Ordering, ProbeHint, UnsafeCell}; // Mutex: inserts of new keys, removals and resizes only, never a check of a held key

use reclaim::Retired;
pub(super) use reclaim::{pin, Guard};

/// The keys' hasher: std's SipHash with a random key (keys come from clients, see
/// `KeyedTokenBucket`'s "HashDoS"); under loom a fixed one (module docs).
#[cfg(not(loom))]
type Hasher = std::collections::hash_map::RandomState;
#[cfg(loom)]
type Hasher = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;

const EMPTY: usize = 0;
const TOMB: usize = 1;
/// The smallest table; under loom 2, so that a model's second key grows it.
const MIN_ENTRIES: usize = if cfg!(loom) { 2 } else { 16 };
/// Entries a sweep visits per hold of `writer`, so that inserts wait for a chunk, not a sweep.
const SWEEP_CHUNK: usize = 256;

struct Entry<K, L> {
    word: AtomicUsize,
    key: KeyCell<K>,
    _slot: std::marker::PhantomData<*const Slot<L>>,
}

struct Table<K, L> {
    entries: Box<[Entry<K, L>]>,
    mask: usize,
    /// Non-`EMPTY` entries; changed only under `writer` (or before the table is published).
    used: AtomicUsize,
    /// Entries holding a slot pointer (live or `DEAD`); as `used`.
    linked: AtomicUsize,
}

// SAFETY: entries are shared under the protocol of the module docs; slots are `Send + Sync`
// limiters (`Limiter: Send + Sync`), keys `Send + Sync` (`Keyed`'s bounds).
unsafe impl<K: Send + Sync, L: Send + Sync> Sync for Table<K, L> {}
// SAFETY: as above.
unsafe impl<K: Send, L: Send + Sync> Send for Table<K, L> {}

impl<K, L> Table<K, L> {
    fn new(entries: usize) -> Table<K, L> {
        debug_assert!(entries.is_power_of_two());
        Table {
            entries: (0..entries)
                .map(|_| Entry {
                    word: AtomicUsize::new(EMPTY),
                    key: KeyCell::empty(),
                    _slot: std::marker::PhantomData,
                })
                .collect(),
            mask: entries - 1,
            used: AtomicUsize::new(0),
            linked: AtomicUsize::new(0),
        }
    }

    /// The entry holding `key` and the word loaded from it (a slot pointer or `TOMB`), if any.
    #[inline(always)]
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<(&Entry<K, L>, usize)>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        // In locals: the `Acquire` loads below would otherwise make each probe reload them.
        let (entries, mask) = (&*self.entries, self.mask);
        let mut i = hash as usize & mask;
        // At most seven eighths of the entries are used, so an EMPTY one ends every probe;
        // the bound (every entry visited once) is for safety only. A count down rather than
        // a range: one decrement and branch a probe.
        let mut left = mask;
        loop {
            // SAFETY: `i <= mask` and `entries.len() == mask + 1`.
            let e = unsafe { entries.get_unchecked(i) };
            let w = e.word.load(Ordering::Acquire);
            if w == EMPTY {
                return None;
            }
            // SAFETY: a non-EMPTY word was loaded with `Acquire`, and the entry's key was
            // written before the `Release` store that first made it non-EMPTY (`claim`);
            // keys are never written again while the table is reachable (module docs).
            if unsafe { e.key.with(|k| k.borrow() == key) } {
                return Some((e, w));
            }
            if left == 0 {
                return None;
            }
            left -= 1;
            i = (i + 1) & mask;
        }
    }

    /// Puts `key` with word `word` in the first `EMPTY` entry of its probe. Only under
    /// `writer` (or on a table not yet published), with room left ([`Table::has_room`]).
    fn claim(&self, hash: u64, key: K, word: usize) {
        let mut i = hash as usize & self.mask;
        loop {
            let e = &self.entries[i];
            // Relaxed: only the lock holder turns EMPTY into anything else.
            if e.word.load(Ordering::Relaxed) == EMPTY {
                // SAFETY: the entry is EMPTY, so no reader reads its key (`find` compares keys
                // only after seeing a non-EMPTY word), and only we (holding `writer`) write
                // it; the `Release` store below publishes the key with the word.
                unsafe { e.key.write(key) };
                e.word.store(word, Ordering::Release);
                self.used.fetch_add(1, Ordering::Relaxed);
                self.linked.fetch_add(1, Ordering::Relaxed);
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Whether one more key fits under the load bound, seven eighths.
    fn has_room(&self) -> bool {
        (self.used.load(Ordering::Relaxed) + 1) * 8 <= self.entries.len() * 7
    }
}

impl<K, L> Drop for Table<K, L> {
    fn drop(&mut self) {
        for e in self.entries.iter_mut() {
            // Relaxed: `&mut self`, every write to the word happens-before this.
            if e.word.load(Ordering::Relaxed) != EMPTY {
                // SAFETY: a non-EMPTY entry's key was written (`claim`); `&mut self` means no
                // reader is left. Slots are not ours: the map frees them (module docs).
                unsafe { e.key.drop_in_place() };
            }
        }
    }
}

/// A key written once (under `writer`, while its entry is `EMPTY`) and then only read.
struct KeyCell<K>(UnsafeCell<MaybeUninit<K>>);

impl<K> KeyCell<K> {
    fn empty() -> Self {
        KeyCell(UnsafeCell::new(MaybeUninit::uninit()))
    }

    /// # Safety
    /// The cell is uninitialized and nobody reads or writes it until a `Release` publication
    /// that readers `Acquire` before reading.
    unsafe fn write(&self, key: K) {
        unsafe {
            self.0.with_mut(|p| {
                (*p).write(key);
            });
        }
    }

    /// # Safety
    /// The key was written, and that write happens-before this call.
    #[inline(always)]
    unsafe fn with<R>(&self, f: impl FnOnce(&K) -> R) -> R {
        unsafe { self.0.with(|p| f((*p).assume_init_ref())) }
    }

    /// # Safety
    /// The key was written, and nobody else can read it any more.
    unsafe fn drop_in_place(&mut self) {
        unsafe {
            self.0.with_mut(|p| (*p).assume_init_drop());
        }
    }
}

/// Reclamation of unlinked slots and replaced tables: crossbeam-epoch, or under loom a
/// stand-in of the same interface (module docs, "Under loom").
#[cfg(not(loom))]
mod reclaim {
    pub(crate) use crossbeam_epoch::Guard;

    /// Pins the current thread's epoch: slots and tables reached under the guard stay valid
    /// while it lives.
    #[inline(always)]
    pub(crate) fn pin() -> Guard {
        crossbeam_epoch::pin()
    }

    /// What the map keeps of its retired memory, under its writer lock: nothing, the
    /// collector owns it.
    pub(super) struct Retired;

    impl Retired {
        pub(super) fn new() -> Self {
            Retired
        }

        /// Runs `free` once every guard pinned now is gone.
        ///
        /// # Safety
        /// What `free` frees is no longer reachable from the map: only a thread pinned now
        /// can still hold it.
        pub(super) unsafe fn defer(&mut self, guard: &Guard, free: impl FnOnce() + 'static) {
            unsafe {
                guard.defer_unchecked(free);
                guard.flush();
            }
        }
    }
}

#[cfg(loom)]
mod reclaim {
    /// Nothing to pin: nothing is freed while the model runs.
    pub(crate) struct Guard;

    pub(crate) fn pin() -> Guard {
        Guard
    }

    /// The retired memory's frees, run when the map (and so this list) is dropped.
    pub(super) struct Retired(Vec<Box<dyn FnOnce()>>);

    impl Retired {
        pub(super) fn new() -> Self {
            Retired(Vec::new())
        }

        /// Keeps `free` for the map's drop.
        ///
        /// # Safety
        /// As the real one's.
        pub(super) unsafe fn defer(&mut self, _: &Guard, free: impl FnOnce() + 'static) {
            self.0.push(Box::new(free));
        }
    }

    impl Drop for Retired {
        fn drop(&mut self) {
            for free in self.0.drain(..) {
                free();
            }
        }
    }
}

/// The map: the current table, the writer lock (with what the reclamation keeps) and the
/// hasher ([`Hasher`]).
pub(super) struct Map<K: 'static, L: 'static> {
    table: AtomicPtr<Table<K, L>>,
    /// The current table's entries and mask, for a check's prefetch before it pins.
    hint: ProbeHint<Entry<K, L>>,
    writer: Mutex<Retired>, // inserts, removals, resizes: never a check of a held key
    hasher: Hasher,
}

// SAFETY: the raw table pointer is owned (module docs); the rest is `Send + Sync`.
unsafe impl<K: Send + Sync, L: Send + Sync> Sync for Map<K, L> {}
// SAFETY: as above.
unsafe impl<K: Send + Sync, L: Send + Sync> Send for Map<K, L> {}

/// The slot a word points to.
///
/// # Safety
/// `w` is neither `EMPTY` nor `TOMB`, loaded under a guard still alive for `'g`.
#[inline(always)]
unsafe fn slot<'g, L>(w: usize) -> &'g Slot<L> {
    unsafe { &*(w as *const Slot<L>) }
}

impl<K: Eq + Hash + Clone + Send + Sync + 'static, L: Send + Sync + 'static> Map<K, L> {
    pub(super) fn new() -> Self {
        let table = Box::new(Table::new(MIN_ENTRIES));
        Map {
            hint: ProbeHint::new(table.entries.as_ptr(), table.mask),
            table: AtomicPtr::new(Box::into_raw(table)),
            writer: Mutex::new(Retired::new()), // see the field
            hasher: Hasher::default(),
        }
    }

    #[inline(always)]
    fn table<'g>(&self, _guard: &'g Guard) -> &'g Table<K, L> {
        // SAFETY: the pointer is always a live table from `Box::into_raw`; a replaced one is
        // retired to the epoch collector, which frees it only after every guard pinned before
        // the replacement (ours included) is dropped. `Acquire` pairs with the resize's
        // publication, so the table's contents are visible.
        unsafe { &*self.table.load(Ordering::Acquire) }
    }

    /// Starts loading the line where `hash`'s probe starts, before a lookup pins: see
    /// [`ProbeHint`].
    #[inline(always)]
    pub(super) fn prefetch(&self, hash: u64) {
        self.hint.prefetch(hash);
    }

    #[inline(always)]
    pub(super) fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        // Not `hash_one`, which LLVM keeps out of line whole: split like this, SipHash's
        // finish inlines into the lookup (only the key's `write` stays a call, as in dashmap).
        let mut h = self.hasher.build_hasher();
        key.hash(&mut h);
        std::hash::Hasher::finish(&h)
    }

    fn lock(&self) -> impl DerefMut<Target = Retired> + '_ {
        // A panic under the lock (a key's `Hash` or `Clone`) leaves the map consistent: every
        // write publishes a finished entry or table.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `key`'s slot (live or `DEAD`), valid while `guard` lives.
    #[inline]
    pub(super) fn get<'g, Q>(&self, key: &Q, guard: &'g Guard) -> Option<&'g Slot<L>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get_hashed(self.hash(key), key, guard)
    }

    /// [`Map::get`] for a key whose hash is `hash` (from [`Map::hash`]).
    #[inline]
    pub(super) fn get_hashed<'g, Q>(
        &self,
        hash: u64,
        key: &Q,
        guard: &'g Guard,
    ) -> Option<&'g Slot<L>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        match self.table(guard).find(hash, key)?.1 {
            TOMB => None,
            w => {
                // SAFETY: a slot pointer, loaded under `guard`: freed only by the collector
                // after its unlinking, once every guard pinned before that (ours) is gone.
                let s = unsafe { slot(w) };
                s.touch();
                Some(s)
            }
        }
    }

    /// Inserts `key` with the slot `make` builds (under the lock), unless the key holds a
    /// slot that is not `DEAD`; a `DEAD` one is unlinked first. True if inserted.
    pub(super) fn insert_with(&self, key: K, make: impl FnOnce() -> Slot<L>) -> bool {
        let hash = self.hash(&key);
        let mut retired = self.lock();
        let guard = pin();
        let mut t = self.table(&guard);
        if let Some((e, w)) = t.find(hash, &key) {
            if w != TOMB {
                // SAFETY: a slot pointer; only we (holding `writer`) could unlink it.
                if !unsafe { slot::<L>(w) }.is_dead() {
                    return false;
                }
                // SAFETY: holding `writer`; `e` holds a slot pointer in the current table.
                unsafe { self.unlink(&mut retired, t, e, &guard) };
            }
            let s = Box::into_raw(Box::new(make())) as usize;
            e.word.store(s, Ordering::Release);
            t.linked.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        if !t.has_room() {
            t = self.resize(
                &mut retired,
                t,
                t.linked.load(Ordering::Relaxed) + 1,
                &guard,
            );
        }
        let s = Box::into_raw(Box::new(make())) as usize;
        t.claim(hash, key, s);
        true
    }

    /// Stores `TOMB` in `e` and hands its slot to the collector.
    ///
    /// # Safety
    /// Holding `writer`; `e` is an entry of the current table `t` holding a slot pointer.
    unsafe fn unlink(
        &self,
        retired: &mut Retired,
        t: &Table<K, L>,
        e: &Entry<K, L>,
        guard: &Guard,
    ) {
        unsafe {
            retire_slots::<L>(retired, vec![self.detach(t, e)], guard);
        }
    }

    /// Stores `TOMB` in `e` and returns its slot pointer, for the caller to retire.
    ///
    /// # Safety
    /// As [`Map::unlink`].
    unsafe fn detach(&self, t: &Table<K, L>, e: &Entry<K, L>) -> usize {
        let w = e.word.load(Ordering::Relaxed);
        e.word.store(TOMB, Ordering::Release);
        t.linked.fetch_sub(1, Ordering::Relaxed);
        w
    }

    /// Removes `key`'s entry if it still holds the slot `id`.
    pub(super) fn remove_same<Q>(&self, key: &Q, id: *const Slot<L>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let mut retired = self.lock();
        let guard = pin();
        let t = self.table(&guard);
        if let Some((e, w)) = t.find(hash, key) {
            if w == id as usize {
                // SAFETY: holding `writer`; `e` holds a slot pointer in the current table.
                unsafe { self.unlink(&mut retired, t, e, &guard) };
            }
        }
    }

    /// Visits every slot, `SWEEP_CHUNK` entries per hold of `writer`; a slot `keep` refuses
    /// is unlinked there (so a new slot for its key is built after, under the same lock).
    /// Then rebuilds the table if it is mostly empty or tombstones.
    pub(super) fn retain(&self, mut keep: impl FnMut(&Slot<L>) -> bool) {
        let mut i = 0;
        let (mut seen, mut seen_len): (*const Table<K, L>, usize) = (std::ptr::null(), 0);
        loop {
            let mut retired = self.lock();
            let guard = pin();
            let t = self.table(&guard);
            let len = t.entries.len();
            if !std::ptr::eq(seen, t) {
                if !seen.is_null() {
                    // Resized between two chunks: go on from the same share of the new table
                    // (a key near the seam may be visited twice, harmlessly, or be left for
                    // the next sweep).
                    i = (i as u128 * len as u128 / seen_len as u128) as usize;
                }
                (seen, seen_len) = (t, len);
            }
            // A table freed and another allocated at its address between two chunks looks
            // unchanged: clamp.
            i = i.min(len);
            let end = (i + SWEEP_CHUNK).min(len);
            let mut gone = Vec::new();
            for e in &t.entries[i..end] {
                let w = e.word.load(Ordering::Relaxed);
                if w == EMPTY || w == TOMB {
                    continue;
                }
                // SAFETY: a slot pointer; only we (holding `writer`) could unlink it.
                if !keep(unsafe { slot(w) }) {
                    // SAFETY: holding `writer`; `e` holds a slot pointer in the current table.
                    gone.push(unsafe { self.detach(t, e) });
                }
            }
            if !gone.is_empty() {
                // SAFETY: detached from the current table just now. One deferred drop per
                // chunk, not per slot: the collector frees a few bags per pin.
                unsafe { retire_slots::<L>(&mut retired, gone, &guard) };
            }
            i = end;
            if i >= len {
                let linked = t.linked.load(Ordering::Relaxed);
                let tombs = t.used.load(Ordering::Relaxed) - linked;
                if len > MIN_ENTRIES && (linked * 8 < len || tombs * 4 > len) {
                    self.resize(&mut retired, t, linked, &guard);
                }
                return;
            }
        }
    }

    /// Replaces the current table `t` by one sized for `keys` keys, without its tombstones
    /// and `DEAD` slots; returns the new table. Under `writer`.
    fn resize<'g>(
        &self,
        retired: &mut Retired,
        t: &Table<K, L>,
        keys: usize,
        guard: &'g Guard,
    ) -> &'g Table<K, L> {
        let size = keys.saturating_mul(2).max(MIN_ENTRIES).next_power_of_two();
        let new = Box::new(Table::<K, L>::new(size));
        let mut dead = Vec::new();
        for e in t.entries.iter() {
            let w = e.word.load(Ordering::Relaxed);
            if w == EMPTY || w == TOMB {
                continue;
            }
            // SAFETY: a slot pointer; only we (holding `writer`) could unlink it.
            if unsafe { slot::<L>(w) }.is_dead() {
                dead.push(w);
                continue;
            }
            // SAFETY: a non-EMPTY entry's key was written; we hold `writer`.
            let (hash, key) = unsafe { e.key.with(|k| (self.hash(k), k.clone())) };
            new.claim(hash, key, w);
        }
        self.hint.set(new.entries.as_ptr(), new.mask);
        let new = Box::into_raw(new);
        let old = self.table.swap(new, Ordering::Release);
        // SAFETY: `old` came from `Box::into_raw` and is no longer reachable from the map; the
        // collector frees it after every guard pinned now (readers on it) is gone.
        unsafe { retired.defer(guard, move || drop(Box::from_raw(old))) };
        if !dead.is_empty() {
            // SAFETY: linked only from `old`, now unpublished, and `DEAD`.
            unsafe { retire_slots::<L>(retired, dead, guard) };
        }
        // SAFETY: just published; retired only by a later resize, under `writer`, after
        // `guard`'s epoch.
        unsafe { &*new }
    }
}

/// Hands the slots `ws` point to to the collector, in one deferred drop.
///
/// # Safety
/// Each of `ws` is a slot pointer no longer reachable from the current table.
unsafe fn retire_slots<L: 'static>(retired: &mut Retired, ws: Vec<usize>, guard: &Guard) {
    unsafe {
        // SAFETY (of the deferred drop): run after every guard pinned now is gone; later ones
        // cannot reach the slots.
        retired.defer(guard, move || {
            for w in ws {
                drop(Box::from_raw(w as *mut Slot<L>));
            }
        });
    }
}

impl<K: 'static, L: 'static> Drop for Map<K, L> {
    fn drop(&mut self) {
        // Relaxed: `&mut self`, every write happens-before this.
        let t = self.table.load(Ordering::Relaxed);
        // SAFETY: `&mut self`: no reader is left; the current table and the slots it links
        // are ours alone (retired tables and unlinked slots belong to the collector).
        let t = unsafe { Box::from_raw(t) };
        for e in t.entries.iter() {
            let w = e.word.load(Ordering::Relaxed);
            if w != EMPTY && w != TOMB {
                // SAFETY: as above; each slot is linked from one entry of this table.
                drop(unsafe { Box::from_raw(w as *mut Slot<L>) });
            }
        }
    }
}
