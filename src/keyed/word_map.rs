//! The engine of the keyed maps whose state is **inline**: an open-addressing table of
//! `(state, key)` slots, each key's whole limiter one atomic word beside its key, read and
//! written without a lock. What the word means is a [`WordRule`]'s (`src/keyed/word_rule.rs`);
//! this file is the table, its key bound and its sweeps, behind the one public front,
//! [`InlineMap`](crate::keyed::InlineMap) ([`KeyedTokenBucket`] and its siblings are its
//! aliases). User docs (memory, flood, hasher, sweeps) are on the front and its aliases'
//! modules.
//!
//! # The state word
//! The word is a `u64` or a `u128`, as the rule's [`WordRule::Word`] says
//! ([`Word`](crate::keyed::word_rule::Word)): the same code, monomorphized, for both. Flags and tag
//! are the top five bits at either width, `x` the rest (`BITS = 64` or `128`):
//! ```text
//!  BITS-1   BITS-2..BITS-5   BITS-6..0
//! [FROZEN][   tag (4)     ][ x (59 or 123 bits) ]
//!   tag 1..=15: a live key of quota `tag - 1`, x its rule's state
//!   tag 0:      x = 0 EMPTY (never used), x = 1 + q DEAD (evicted; quota q kept for revival)
//!   FROZEN:     set by a resize once the slot has been copied: no write lands here any more
//! ```
//! A slot is `(state, key)`: 16 bytes for a `u64` key and a 64-bit word, 32 for a 128-bit
//! one, aligned to 32 so that no slot straddles a cache line (`Word::Align`).
//!
//! # The protocol
//! Every atomic below is the slot's `state` unless named.
//!
//! * **Lookup** (lock-free, no write): pin an epoch (`crossbeam-epoch`), load the table
//!   pointer (`Acquire`), probe from `hash & mask`: load each state (`Acquire`); `EMPTY` ends
//!   the probe (the key is absent); any other state has its key written and published, so the
//!   key is compared.
//! * **Check** (lock-free, one CAS): on the live, unfrozen word the lookup loaded (not
//!   loaded again: a stale word only fails its CAS), ask the rule for `x'`; a
//!   refusal, and a grant that consumes nothing, write nothing (decided from the load); else
//!   CAS the word to `x'` (`Relaxed`: the word is the whole state, so a CAS that succeeds on
//!   the value it decided from is linearizable; `Acquire` on failure, see revival). A failed
//!   CAS retries on the value it found.
//! * **Insert** (a key absent from the table; serialized by the map's `writer` mutex, which no
//!   check of an existing key takes): under the lock, probe again; claim the first `EMPTY`
//!   slot, write the key into it, then `store(live, Release)`. Only the lock holder turns an
//!   `EMPTY` slot into anything else, so the key is written exactly once, before any reader
//!   can see a non-`EMPTY` state (`Release`/`Acquire`), and never written again while the
//!   table lives: **a slot is never reused for another key** within a table.
//! * **Evict** (a sweep at `J`): publish `J` (`judged.fetch_max`), then for each live word
//!   the rule judges idle at `J` CAS it to `DEAD(q)` (`Release`). No fence anywhere: the word
//!   is the only state, so the CAS succeeds only if no grant changed the word since the sweep
//!   judged it (every grant that consumes anything changes it: the rule's contract), and a
//!   grant's CAS on a word that became `DEAD` fails, reloads `DEAD` and revives.
//! * **Revive** (a check finding its key `DEAD`): reserve room under `max_keys`, then CAS
//!   `DEAD(q) -> live(q, born(B))` with `B = max(now, judged)` read after the `Acquire` load
//!   that saw `DEAD`; then check on the new word. A returning key reuses its slot, its own key.
//! * **Resize** (grow, or rebuild to drop `DEAD` slots; under `writer`): hash and clone every
//!   key first (user code, which may panic, runs before anything changes). Freeze the `DEAD`
//!   words (CAS `s -> s | FROZEN`, `Acquire`: see step 2 below): a frozen dead word can no
//!   longer be revived, so what is left to copy is known, and the new table is sized for it.
//!   Store the new table in the old one's `next` (`Release`). Then, for each live word:
//!   **copy it** into the new table (the key, then its word, as an insert does), **then
//!   freeze it** (CAS from the copied value, `AcqRel`); if a grant, update or eviction changed
//!   the word in between, the CAS fails, the newer word is copied over the first and the CAS
//!   retried. Publish the new table (`swap`, `Release`) and retire the old one to the epoch
//!   collector, which frees it (and its keys) once no pinned thread can still read it.
//! * **A check on a frozen word** goes on in the table the resize is filling: a live word was
//!   frozen only once its exact value was in the new table, and no thread writes the new
//!   slot before that freeze (only a frozen old slot leads to it; the table is not published
//!   yet), so the new slot is the word's continuation. The check loads `next` (its `Acquire`
//!   load of the frozen word, which the freeze's `Release` half published, makes `next` and
//!   the copy visible), finds the key there and runs its CAS loop on that word, following
//!   `next` again if a later resize has frozen that one too. **No check of a key the table
//!   holds waits for a resize**, nor for the thread doing it: it never needs the resizer to
//!   make progress. A frozen *dead* word was not copied: its check inserts the key again, and
//!   the insert (under `writer`) comes after the resize, as any new key's does. `EMPTY` slots
//!   need no freeze: only the lock holder fills them.
//!
//! loom checks the protocol through the maps (`loom-tests/tests/keyed_bucket.rs` and its
//! siblings, `keyed_warming.rs` at 128 bits: check ‖ evict with revival, insert ‖ check ‖
//! evict, check ‖ growth, two grants ‖ growth, update ‖ growth, check ‖ purge, a stale
//! reading across an eviction); a unit test
//! parks a resize with every word frozen and shows a grant on a held key completes.
//!
//! # Eviction never loses a grant; stale readings never gain
//! 1. A grant is a CAS on the live word; an eviction is a CAS of the same word, from the
//!    value the sweep judged idle, to `DEAD`. Of two CASes on one word from one value, one
//!    fails: either the grant lands and the eviction fails, or the eviction lands, the grant's
//!    CAS fails, and the check revives the key and runs again. No grant is lost; none counts
//!    twice.
//! 2. The evicted word was idle at `J`. The sweep published `J` before its `Release` CAS,
//!    and a reviver reads `judged` after an `Acquire` load that saw `DEAD`; a key purged by a
//!    resize and inserted again is inserted under the `writer` lock after that resize, which
//!    read `DEAD` with an `Acquire` CAS. Either way the new word is born at `B >= J`.
//! 3. By the rule's contract, the rule's budget for one key holds across the eviction (and
//!    a word born at `B >= J` grants nothing the evicted word would have refused, at any
//!    reading, or for the sliding window's rule at any reading from the start of `J`'s
//!    window on): over a key's whole history, across any number of evictions, it is
//!    granted no more than one limiter that served it all along may grant (for the sliding
//!    window, in judged times).
//!
//! # Orderings
//! **At either width.** Every step above is a load, a store or a CAS of the one state word,
//! and the argument needs of each only that it is one atomic access with the ordering
//! written: that the word is the whole state, that a CAS from a value fails if any write
//! changed it, and the `Release`/`Acquire` pairs named. A 64-bit word is std's `AtomicU64`.
//! A 128-bit word is `portable_atomic::AtomicU128` (through `crate::sync`, which issues its
//! load and CAS inline on x86_64: `src/atomic_u128.rs`): on x86_64 its CAS is one `lock cmpxchg16b`,
//! a single atomic read-modify-write of all 16 bytes (a full barrier, so at least the
//! ordering asked); its load is one `vmovdqa` where the processor has AVX
//! (atomic for aligned 16 bytes there) and otherwise a `cmpxchg16b` that writes back what it
//! read, atomic too, and so is its store (a check tests for the two instructions once, not
//! at each probe: `Word::fast`); elsewhere portable-atomic uses the platform's
//! 128-bit atomics or a lock of its own, each access atomic with at least the ordering
//! asked. So no load of a 128-bit word sees half of one write (a torn
//! `EMPTY`-to-live publication, or a mix of a grant and an eviction), and each ordering
//! above is enough at 128 bits for the reason it is at 64. Under loom the 128-bit word is
//! `crate::sync`'s stand-in, which checks the orderings as written.
//!
//! Besides the word's (above): the table pointer's `Release` swap and `Acquire` load publish
//! a new table's slots and `mask`; `used`, `len`, `last_sweep`, `judged` and `resizes` are
//! counters and hints whose values no other memory depends on (`judged` is read after the
//! `Acquire` that orders it, step 2): `Relaxed`.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::key_bound::KeyBound;
#[cfg(not(loom))]
use crate::keyed::sweeper::Sweeper;
use crate::keyed::word_rule::{Access, AtomicWord, Tested, Word, WordRule};
use crate::keyed::{WhenFull, DEFAULT_MAX_KEYS, DEFAULT_SWEEP_EVERY};
use crate::limiter::Denied;
use crate::sync::{keep_branch, AtomicPtr, AtomicU64, Mutex, Ordering, WordOps}; // Mutex: inserts of new keys and resizes only, never a check of an existing key

mod table;
use table::{Slot, Table};

/// The most quotas one map holds (the state word's 4-bit tag, with 0 for `EMPTY`/`DEAD`).
pub const MAX_QUOTAS: usize = 15;

/// The smallest table (slots). Under loom, 4: a model then grows the table with its fourth
/// key.
const MIN_SLOTS: usize = if cfg!(loom) { 4 } else { 16 };
/// A sweep rebuilds the table when it leaves more `DEAD` slots than live keys, and at least
/// this many (smaller tables are left to the next insert-triggered resize). Under loom, 2.
const PURGE_MIN: usize = if cfg!(loom) { 2 } else { 32 };

#[inline(always)]
fn live<W: Word>(q: usize, x: W) -> W {
    (W::from_u64(q as u64 + 1) << W::X_BITS) | x
}

#[inline(always)]
fn dead<W: Word>(q: usize) -> W {
    W::from_u64(1 + q as u64)
}

/// Whether a resize has frozen the word.
#[inline(always)]
fn frozen<W: Word>(s: W) -> bool {
    s & W::FROZEN != W::ZERO
}

/// The tag: `0` for `EMPTY`/`DEAD`, else the quota plus one.
#[inline(always)]
fn tag<W: Word>(s: W) -> usize {
    ((s & !W::FROZEN) >> W::X_BITS).low_u64() as usize
}

/// The quota a live or dead word belongs to.
#[inline(always)]
fn quota_of<W: Word>(s: W) -> usize {
    match tag(s) {
        0 => ((s & W::X_MASK).low_u64() - 1) as usize,
        t => t - 1,
    }
}

/// The slots of a table that holds `keys` keys without growing (at most 7/8 used, a power of
/// two, at least [`MIN_SLOTS`]); saturates for absurd counts, which then fail to allocate as
/// any huge allocation does.
fn slots_for(keys: usize) -> usize {
    let need = keys.saturating_add(1).saturating_mul(8).div_ceil(7);
    need.checked_next_power_of_two()
        .unwrap_or(1 << (usize::BITS - 1))
        .max(MIN_SLOTS)
}

/// What an [`InlineMapBuilder`](crate::keyed::InlineMapBuilder) sets besides its quotas.
pub(crate) struct Settings<K, S = RandomState, C = QuantaClock> {
    pub(crate) capacity: usize,
    pub(crate) classify: Box<dyn Fn(&K) -> usize + Send + Sync>,
    pub(crate) hasher: S,
    pub(crate) max_keys: u64,
    pub(crate) when_full: WhenFull,
    pub(crate) sweep_every: u64,
    pub(crate) clock: C,
}

impl<K> Settings<K> {
    /// The defaults: quota 0 for every key, std's `RandomState`, [`DEFAULT_MAX_KEYS`],
    /// [`WhenFull::Deny`], sweeps every [`DEFAULT_SWEEP_EVERY`], the quanta clock.
    pub(crate) fn new() -> Self {
        Settings {
            capacity: 0,
            classify: Box::new(|_| 0),
            hasher: RandomState::new(),
            max_keys: DEFAULT_MAX_KEYS,
            when_full: WhenFull::Deny,
            sweep_every: DEFAULT_SWEEP_EVERY.as_nanos() as u64,
            clock: QuantaClock::new(),
        }
    }
}

impl<K, S, C> Settings<K, S, C> {
    pub(crate) fn hasher<T>(self, hasher: T) -> Settings<K, T, C> {
        Settings {
            capacity: self.capacity,
            classify: self.classify,
            hasher,
            max_keys: self.max_keys,
            when_full: self.when_full,
            sweep_every: self.sweep_every,
            clock: self.clock,
        }
    }

    pub(crate) fn clock<D>(self, clock: D) -> Settings<K, S, D> {
        Settings {
            capacity: self.capacity,
            classify: self.classify,
            hasher: self.hasher,
            max_keys: self.max_keys,
            when_full: self.when_full,
            sweep_every: self.sweep_every,
            clock,
        }
    }

    /// The settings the map's `Debug` shows, after its quotas.
    pub(crate) fn debug_fields(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        KeyBound::debug_fields(d, self.max_keys, self.when_full, self.sweep_every);
    }
}

/// A keyed map of one-word states: see the [module docs](self).
pub(crate) struct WordMap<K, R, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    R: WordRule,
{
    /// The current table; replaced only by a resize, under `writer`.
    table: AtomicPtr<Table<K, R::Word>>,
    /// The rules indexed by **tag** (quota `q` at `q + 1`), so that a live word finds its
    /// configuration with one index that needs no bounds check (a tag is 4 bits). Tags past
    /// the configured quotas, and tag 0, hold quota 0 and are never a live word's.
    by_tag: Box<[R; 16]>,
    /// How many quotas were configured.
    quota_count: usize,
    classify: Box<dyn Fn(&K) -> usize + Send + Sync>,
    hasher: S,
    /// The base of every key's `x`: ns on `clock`.
    base: u64,
    /// Serializes inserts of absent keys and resizes; never taken by a check of a key the
    /// table holds (live, dead or frozen).
    writer: Mutex<()>, // inserts and resizes only, never a check of an existing key
    /// The key bound and the sweep schedule.
    bound: KeyBound,
    /// Tables replaced so far (grown or purged); a metric.
    resizes: AtomicU64,
    /// The fewest slots a table has (from the builder's `capacity`).
    min_slots: usize,
    clock: C,
}

/// Epoch reclamation of retired tables: `crossbeam-epoch`, or under loom a stand-in that never
/// frees them (a model is short), so the models check the table protocol itself.
#[cfg(not(loom))]
mod reclaim {
    pub(super) use crossbeam_epoch::Guard;

    #[inline(always)]
    pub(super) fn pin() -> Guard {
        crossbeam_epoch::pin()
    }

    /// Frees `table` once no thread pinned now can still read it.
    ///
    /// # Safety
    /// `table` came from `Box::into_raw` and is no longer reachable from the map.
    pub(super) unsafe fn retire<T: Send + 'static>(guard: &Guard, table: *mut T) {
        unsafe {
            // SAFETY (of the deferred drop): crossbeam runs it after every thread pinned at this
            // point has unpinned; any thread pinning later loads the new table pointer.
            guard.defer_unchecked(move || drop(Box::from_raw(table)));
            guard.flush();
        }
    }
}

#[cfg(loom)]
mod reclaim {
    pub(super) struct Guard;

    pub(super) fn pin() -> Guard {
        Guard
    }

    /// Leaks: loom threads may still read the table, and a model is short.
    pub(super) unsafe fn retire<T>(_: &Guard, _: *mut T) {}
}

/// How one check ended on the slot it found.
enum Outcome {
    Done(Result<(), Denied>),
    /// The slot is frozen by a resize. A live word was copied to the table the resize is
    /// filling before it was frozen: the check goes on there ([`Table::next`]). A dead one
    /// was not copied: the key is inserted again, after the resize.
    Frozen,
}

/// Where an operation that found `slot` of `table` frozen goes on: the table the resize
/// copies into, if the word is live (copied there before it was frozen); `None` for a dead
/// word, which is not copied.
#[inline]
fn forward<'g, K, W: Word>(table: &'g Table<K, W>, slot: &Slot<K, W>) -> Option<&'g Table<K, W>> {
    // `Acquire` pairs with the freeze's `AcqRel`: the copy and `next` are visible.
    if tag(slot.state.load(Ordering::Acquire)) == 0 {
        return None;
    }
    table.next()
}

impl<K, S, C> Settings<K, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// The map over `rules` (quota `q` is `rules[q]`; at least one);
    /// [`ConfigError::ZeroMaxKeys`] or [`ConfigError::TooManyQuotas`] if those are out of
    /// range.
    pub(crate) fn build<R: WordRule>(
        self,
        rules: &[R],
    ) -> Result<WordMap<K, R, S, C>, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        if rules.len() > MAX_QUOTAS {
            return Err(ConfigError::TooManyQuotas(rules.len()));
        }
        debug_assert!(!rules.is_empty(), "a map always has its quota 0");
        let now = self.clock.now().as_u64();
        let min_slots = slots_for(self.capacity);
        let table = Box::into_raw(Box::new(Table::new(min_slots)));
        Ok(WordMap {
            table: AtomicPtr::new(table),
            // Tag t is quota t - 1; tag 0 and unused tags repeat quota 0, never read for a
            // live word.
            by_tag: Box::new(std::array::from_fn(|t| {
                if (1..=rules.len()).contains(&t) {
                    rules[t - 1]
                } else {
                    rules[0]
                }
            })),
            quota_count: rules.len(),
            classify: self.classify,
            hasher: self.hasher,
            base: now,
            writer: Mutex::new(()), // inserts and resizes only
            bound: KeyBound::new(
                self.max_keys,
                self.when_full,
                self.sweep_every,
                Nanos::new(now),
            ),
            resizes: AtomicU64::new(0),
            min_slots,
            clock: self.clock,
        })
    }
}

impl<K, R, S, C> WordMap<K, R, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    R: WordRule,
    S: BuildHasher,
    C: Clock,
{
    pub(crate) fn clock(&self) -> &C {
        &self.clock
    }

    /// The base every rule counts time from: ns on the map's clock.
    #[inline(always)]
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// The configured quotas' rules, quota 0 first.
    pub(crate) fn rules(&self) -> &[R] {
        &self.by_tag[1..=self.quota_count]
    }

    /// The quota the builder's `classify` gives a new `key` (one past the quotas: 0).
    fn class_of(&self, key: &K) -> usize {
        let q = (self.classify)(key);
        if q < self.quota_count {
            q
        } else {
            0
        }
    }

    /// The rule of the quota a new `key` would get.
    pub(crate) fn classify(&self, key: &K) -> &R {
        &self.by_tag[self.class_of(key) + 1]
    }

    pub(crate) fn len(&self) -> usize {
        self.bound.len()
    }

    pub(crate) fn max_keys(&self) -> u64 {
        self.bound.max_keys()
    }

    pub(crate) fn stats(&self) -> crate::keyed::MapStats {
        self.bound.stats()
    }

    pub(crate) fn capacity(&self) -> usize {
        let guard = reclaim::pin();
        self.table(&guard).slots.len()
    }

    pub(crate) fn resizes(&self) -> u64 {
        self.resizes.load(Ordering::Relaxed)
    }

    /// The check of `n` on `key` at `now` by its rule, inserting or reviving the key.
    #[inline]
    pub(crate) fn check_n_at<Q>(&self, key: &Q, now: Nanos, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.maybe_sweep(now, false);
        let hash = self.hasher.hash_one(key);
        match R::Word::fast() {
            Some(fast) => self.check_via(fast, hash, key, now, n),
            None => self.check_tested(hash, key, now, n),
        }
    }

    /// [`Self::check_via`] through the atomic's own operations: out of line, where a
    /// processor lacks what [`Word::fast`] needs.
    #[inline(never)]
    fn check_tested<Q>(&self, hash: u64, key: &Q, now: Nanos, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_via(Tested, hash, key, now, n)
    }

    /// The check of `n` on `key` (hashed to `hash`), its words reached through `access`.
    #[inline(always)]
    fn check_via<A, Q>(
        &self,
        access: A,
        hash: u64,
        key: &Q,
        now: Nanos,
        n: u32,
    ) -> Result<(), Denied>
    where
        A: Access<R::Word>,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        loop {
            {
                let guard = reclaim::pin();
                let mut table = self.table(&guard);
                while let Some((slot, s)) = table.find_via(access, hash, key) {
                    match self.on_slot(access, slot, s, now, n) {
                        Outcome::Done(r) => return r,
                        Outcome::Frozen => match forward(table, slot) {
                            Some(next) => table = next,
                            // A dead key in a table being copied, which drops it: inserted
                            // again below, under `writer`, so after the copy is out.
                            None => break,
                        },
                    }
                }
            }
            if !self.insert(key, hash, now) {
                return self.bound.full(now);
            }
        }
    }

    /// The check on the slot holding the key, whose word `find` loaded as `s`: the CAS loop
    /// of the module docs.
    #[inline(always)]
    fn on_slot<A: Access<R::Word>>(
        &self,
        access: A,
        slot: &Slot<K, R::Word>,
        mut s: R::Word,
        now: Nanos,
        n: u32,
    ) -> Outcome {
        let backoff = Backoff::new();
        loop {
            let t = tag(s);
            if t == 0 {
                if frozen(s) {
                    return Outcome::Frozen;
                }
                match self.revive(slot, s, now) {
                    Ok(new) => s = new,
                    Err(r) => return Outcome::Done(r),
                }
                continue;
            }
            // The first quota by its constant index, which the branch predictor then follows:
            // its rule's words load without waiting for the word's tag ([`keep_branch`]).
            let rule = if t == 1 {
                keep_branch();
                &self.by_tag[1]
            } else {
                &self.by_tag[t]
            };
            let new = match rule.check(s & R::Word::X_MASK, self.base, now, n) {
                Ok(Some(x)) => (s & !R::Word::X_MASK) | x,
                Ok(None) => return Outcome::Done(Ok(())),
                Err(d) => return Outcome::Done(Err(d)),
            };
            if frozen(s) {
                return Outcome::Frozen;
            }
            match access.view(&slot.state).compare_exchange_weak(
                s,
                new,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => return Outcome::Done(Ok(())),
                Err(actual) => {
                    s = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// Brings back a key found `DEAD` (word `s`): a fresh word born at `max(now, judged)`.
    /// Returns the word now in the slot (ours or a racing reviver's), or the full-map answer.
    #[cold]
    fn revive(
        &self,
        slot: &Slot<K, R::Word>,
        s: R::Word,
        now: Nanos,
    ) -> Result<R::Word, Result<(), Denied>> {
        let Some(room) = self.bound.room(now, &self.clock, |at| {
            self.evict_idle_at(at);
        }) else {
            return Err(self.bound.full(now));
        };
        let q = quota_of(s);
        // After the `Acquire` load that saw DEAD: at least the time of the sweep that wrote
        // it (module docs, step 2).
        let x = self.by_tag[q + 1].born(self.base, self.bound.birth(now));
        match slot
            .state
            .compare_exchange(s, live(q, x), Ordering::Relaxed, Ordering::Acquire)
        {
            Ok(_) => {
                room.keep();
                Ok(live(q, x))
            }
            // Another reviver won (its room is the key's), or a resize froze the word.
            Err(actual) => Ok(actual),
        }
    }

    /// Inserts `key` (absent when looked up); false if the map is full. True also if another
    /// thread inserted it first.
    #[cold]
    fn insert<Q>(&self, key: &Q, hash: u64, now: Nanos) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Given back unless the key goes in (another thread inserted it first, or user code
        // panicked).
        let Some(room) = self.bound.room(now, &self.clock, |at| {
            self.evict_idle_at(at);
        }) else {
            return false;
        };
        // User code (to_owned, classify) runs before the lock.
        let owned = key.to_owned();
        let q = self.class_of(&owned);
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let guard = reclaim::pin();
        let mut table = self.table(&guard);
        if table.find(hash, key).is_some() {
            return true;
        }
        if !table.has_room() {
            table = self.resize(table, 1, &guard);
        }
        // Under `writer`, after any resize that purged an earlier incarnation of the key:
        // the judged time of its eviction is visible here (module docs, step 2).
        let x = self.by_tag[q + 1].born(self.base, self.bound.birth(now));
        table.claim(hash, owned, live(q, x));
        room.keep();
        true
    }

    /// Replaces `old` (the current table) by a new one holding its live keys, sized for them
    /// plus `extra` with room to grow. Only under `writer`. No check waits for it: each live
    /// word is copied into the new table *before* it is frozen in the old one, so a check
    /// that finds it frozen goes on in the new table at once (module docs, "Resize").
    fn resize<'g>(
        &self,
        old: &'g Table<K, R::Word>,
        extra: usize,
        guard: &'g reclaim::Guard,
    ) -> &'g Table<K, R::Word> {
        // User code first (Hash, Clone): if it panics, nothing has changed.
        let mut keys: Vec<(usize, u64, K)> = Vec::with_capacity(old.used.load(Ordering::Relaxed));
        for (i, slot) in old.slots.iter().enumerate() {
            if slot.state.load(Ordering::Relaxed) != R::Word::EMPTY {
                // SAFETY: non-EMPTY, and we hold `writer`, under which it was written.
                let k = unsafe { slot.key.with(K::clone) };
                keys.push((i, self.hasher.hash_one(&k), k));
            }
        }
        // Dead words first: frozen, they cannot be revived any more, so what is left to copy
        // is known before the new table is sized. `Acquire` synchronizes with the eviction's
        // `Release`, so the sweep's `judged` is visible to every insert after us under
        // `writer` (module docs, step 2). A check that finds a dead word frozen inserts the
        // key again, under `writer`, after this resize.
        keys.retain(|&(i, _, _)| {
            let state = &old.slots[i].state;
            let mut s = state.load(Ordering::Relaxed);
            while tag(s) == 0 {
                match state.compare_exchange_weak(
                    s,
                    s | R::Word::FROZEN,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return false,
                    Err(actual) => s = actual,
                }
            }
            true
        });
        // Room to grow (twice the keys), but never past the key bound's table: at the bound
        // a resize purges the dead slots and keeps the size, so memory stays the bound's.
        let need = slots_for(keys.len() + extra);
        let bound = slots_for(usize::try_from(self.bound.max_keys()).unwrap_or(usize::MAX));
        let grown = ((keys.len() + extra).max(1) * 2).next_power_of_two();
        let new = Box::into_raw(Box::new(Table::new(
            grown.min(bound).max(need).max(self.min_slots),
        )));
        // SAFETY: just allocated; published below, freed only by a later resize (after
        // `guard` unpins) or with the map.
        let new_ref: &'g Table<K, R::Word> = unsafe { &*new };
        // Before any live word is frozen: a check that sees the freeze (`Acquire`, from the
        // freeze's `AcqRel`) sees this too.
        old.next.store(new, Ordering::Release);
        // Live words: copy, then freeze the word copied; if the word changed in between (a
        // grant, an update, an eviction), copy the newer one and try again. The new slot is
        // read by no check until the freeze succeeds (only a frozen old slot leads there,
        // and the new table is not published yet), so the copy is the word's continuation.
        for (i, hash, k) in keys {
            let state = &old.slots[i].state;
            let mut s = state.load(Ordering::Acquire);
            let copy = new_ref.claim(hash, k, s);
            loop {
                match state.compare_exchange_weak(
                    s,
                    s | R::Word::FROZEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(actual) => {
                        s = actual;
                        copy.state.store(s, Ordering::Release);
                    }
                }
            }
        }
        #[cfg(test)]
        tests::resize_hook();
        let old_ptr = self.table.swap(new, Ordering::AcqRel);
        self.resizes.fetch_add(1, Ordering::Relaxed);
        debug_assert!(std::ptr::eq(old_ptr, old));
        // SAFETY: `old_ptr` came from `Box::into_raw` and is unreachable from the map now;
        // threads pinned before the swap may still read it (and follow its `next`, the new
        // table, which outlives them), which the epoch waits for.
        unsafe { reclaim::retire(guard, old_ptr) };
        new_ref
    }

    /// The current table, valid while `guard` is pinned.
    #[inline(always)]
    fn table<'g>(&self, _guard: &'g reclaim::Guard) -> &'g Table<K, R::Word> {
        // SAFETY: the pointer is always a live table from `Box::into_raw`; a replaced one is
        // retired to the epoch collector, which frees it only after every guard pinned before
        // the replacement (ours included) is dropped. `Acquire` pairs with the resize's
        // publication, so the table's contents are visible.
        unsafe { &*self.table.load(Ordering::Acquire) }
    }

    /// The word of `key` as one load reads it: `None` if absent, else its quota's rule and
    /// its state (`None` if evicted). Writes nothing, inserts nothing.
    pub(crate) fn read<Q>(&self, key: &Q) -> Option<(&R, Option<R::Word>)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = reclaim::pin();
        let hash = self.hasher.hash_one(key);
        let (_, s) = self.table(&guard).find(hash, key)?;
        let rule = &self.by_tag[quota_of(s) + 1];
        Some((rule, (tag(s) != 0).then_some(s & R::Word::X_MASK)))
    }

    /// Moves a held, live key's state by `f` (`None`: leave it), with one CAS per attempt; an
    /// absent or evicted key is left alone. Not a grant: `f` must only ever give back
    /// (an eviction may then judge the key idle a little sooner, never later).
    pub(crate) fn update<Q>(&self, key: &Q, f: impl Fn(&R, R::Word) -> Option<R::Word>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let guard = reclaim::pin();
        let mut table = self.table(&guard);
        while let Some((slot, s)) = table.find(hash, key) {
            if self.update_slot(slot, s, &f) {
                return;
            }
            // Frozen, so live (a dead word returns above): its continuation is in the table
            // being filled.
            match forward(table, slot) {
                Some(next) => table = next,
                None => return,
            }
        }
    }

    /// [`Self::update`] on the slot holding the key; false if it found the word frozen.
    fn update_slot(
        &self,
        slot: &Slot<K, R::Word>,
        mut s: R::Word,
        f: &impl Fn(&R, R::Word) -> Option<R::Word>,
    ) -> bool {
        let backoff = Backoff::new();
        loop {
            let t = tag(s);
            if t == 0 {
                // Dead (evicted idle): nothing to move.
                return true;
            }
            let Some(x) = f(&self.by_tag[t], s & R::Word::X_MASK) else {
                return true;
            };
            if frozen(s) {
                return false;
            }
            match slot.state.compare_exchange_weak(
                s,
                (s & !R::Word::X_MASK) | x,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => {
                    s = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// True if `key` is held (live).
    pub(crate) fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        matches!(self.read(key), Some((_, Some(_))))
    }

    /// The map's sweeper, for [`InlineMap::spawn_sweeper`](crate::keyed::InlineMap::spawn_sweeper).
    #[cfg(not(loom))] // for spawn_sweeper only
    pub(crate) fn sweeper(&self) -> &Sweeper {
        self.bound.sweeper()
    }

    #[cfg(not(loom))] // for spawn_sweeper only
    pub(crate) fn sweep_every(&self) -> u64 {
        self.bound.sweep_every()
    }

    /// What a sweeper thread runs: a sweep at the map's clock, recorded as the last one.
    #[cfg(not(loom))] // for spawn_sweeper only
    pub(crate) fn sweep_now(&self) {
        let now = self.clock.now();
        self.bound.swept(now);
        self.evict_idle_at(now);
    }

    /// Evicts the keys the rule judges idle at `now`; rebuilds the table when dead slots
    /// outnumber the live keys. Returns how many keys it evicted.
    pub(crate) fn evict_idle_at(&self, now: Nanos) -> usize {
        // Published before any eviction's `Release` CAS (module docs, step 2).
        self.bound.judge(now);
        let guard = reclaim::pin();
        let table = self.table(&guard);
        let (mut evicted, mut live_keys, mut dead_slots) = (0, 0, 0);
        for slot in table.slots.iter() {
            let s = slot.state.load(Ordering::Relaxed);
            if s == R::Word::EMPTY || frozen(s) {
                continue;
            }
            let q = quota_of(s);
            if tag(s) == 0 {
                dead_slots += 1;
                continue;
            }
            if self.by_tag[q + 1].idle(s & R::Word::X_MASK, self.base, now)
                && slot
                    .state
                    .compare_exchange(s, dead(q), Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            {
                evicted += 1;
                dead_slots += 1;
                self.bound.release();
            } else {
                live_keys += 1;
            }
        }
        if dead_slots > live_keys && dead_slots >= PURGE_MIN {
            let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let current = self.table(&guard);
            if std::ptr::eq(current, table) {
                self.resize(current, 0, &guard);
            }
        }
        self.bound.evicted(evicted);
        evicted
    }

    /// Sweeps inline if one is due at `hint` (a check's reading).
    #[inline(always)]
    fn maybe_sweep(&self, hint: Nanos, early: bool) {
        self.bound.maybe_sweep(hint, early, &self.clock, |now| {
            self.evict_idle_at(now);
        });
    }

    /// The settings the map's `Debug` shows, after its quotas.
    pub(crate) fn debug_fields(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        self.bound.debug(d);
    }
}

impl<K, R, S, C> Drop for WordMap<K, R, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    R: WordRule,
{
    fn drop(&mut self) {
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: `&mut self`: no check is running; the current table is ours alone (retired
        // ones belong to the collector).
        drop(unsafe { Box::from_raw(table) });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// Run by a resize on this thread after it has frozen every word of the old table
        /// and before it publishes the new one.
        pub(crate) static RESIZE_HOOK: RefCell<Option<Box<dyn Fn()>>> = const { RefCell::new(None) };
    }

    pub(super) fn resize_hook() {
        RESIZE_HOOK.with(|h| {
            if let Some(hook) = h.borrow().as_ref() {
                hook();
            }
        });
    }

    fn layout_round_trips<W: Word>() {
        for q in 0..MAX_QUOTAS {
            let s: W = live(q, W::X_MASK);
            assert_eq!(tag(s), q + 1);
            assert_eq!(quota_of(s), q);
            assert!(!frozen(s));
            assert!(frozen(s | W::FROZEN));
            assert_eq!(quota_of(s | W::FROZEN), q);
            let d: W = dead(q);
            assert_eq!(tag(d), 0);
            assert_ne!(d, W::EMPTY);
            assert_eq!(quota_of(d), q);
            assert_eq!(quota_of(d | W::FROZEN), q);
        }
        // The flags and the tag are the top five bits, x the rest.
        assert_eq!(W::X_BITS, W::BITS - 5);
        assert_eq!(!W::X_MASK, W::FROZEN | (W::from_u64(15) << W::X_BITS));
    }

    /// A `u64` key's slot is 16 bytes with a 64-bit word and 32 with a 128-bit one, each
    /// aligned to its size: four or two to a cache line, none across two.
    #[test]
    fn slots_never_straddle_a_line() {
        use std::mem::{align_of, size_of};
        assert_eq!(
            (size_of::<Slot<u64, u64>>(), align_of::<Slot<u64, u64>>()),
            (16, 8)
        );
        assert_eq!(
            (size_of::<Slot<u64, u128>>(), align_of::<Slot<u64, u128>>()),
            (32, 32)
        );
        assert_eq!(size_of::<Slot<[u8; 16], u128>>(), 32);
        let t = Table::<u64, u128>::new(MIN_SLOTS);
        assert_eq!(t.slots.as_ptr() as usize % 32, 0);
    }

    #[test]
    fn word_layout_round_trips() {
        layout_round_trips::<u64>();
        layout_round_trips::<u128>();
    }

    /// A 128-bit word's check through the atomic's own operations (the path of a processor
    /// without AVX, which this one has) decides as the fast path does: two maps fed the same
    /// checks and sweeps, one through each, agree on every answer.
    #[cfg(not(loom))]
    #[test]
    fn the_tested_path_decides_as_the_fast_one() {
        use crate::keyed::multi_token_bucket::{Bandwidth, MultiTokenBucketQuota};
        use crate::ManualClock;
        use std::time::Duration;

        let quotas = vec![vec![
            Bandwidth::per(3, Duration::from_secs(1)),
            Bandwidth::per(5, Duration::from_secs(10)),
        ]];
        let rules = MultiTokenBucketQuota::rules(&quotas, || Nanos::ZERO).unwrap();
        let build = || {
            Settings::new()
                .clock(ManualClock::default())
                .build(&rules)
                .unwrap()
        };
        let (fast, tested) = (build(), build());
        let (mut granted, mut refused, mut evicted) = (0, 0, 0);
        for i in 0..600u64 {
            // Every 100 checks, 20 s pass: every key is idle, evicted, then revived.
            let now = Nanos::new(i * 29_000_000 + i / 100 * 20_000_000_000);
            let (key, n) = (i % 7, 1 + (i % 3) as u32);
            if i % 100 == 0 {
                let gone = fast.evict_idle_at(now);
                assert_eq!(gone, tested.evict_idle_at(now));
                evicted += gone;
            }
            let a = fast.check_n_at(&key, now, n);
            let b = tested.check_tested(tested.hasher.hash_one(key), &key, now, n);
            assert_eq!(a, b, "check {i}");
            if a.is_ok() {
                granted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(
            granted > 50 && refused > 50 && evicted >= 7 * 5,
            "{granted} granted, {refused} refused, {evicted} evicted"
        );
    }
}
