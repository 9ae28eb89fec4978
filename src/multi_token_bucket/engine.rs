//! The multi-limit bucket's engine: its state word, its configuration slots and the CAS
//! protocols that move them (check, reconfiguration). The user docs are on
//! [`MultiTokenBucket`](super::MultiTokenBucket); the word's layout and arithmetic are
//! `word.rs`'s.
//!
//! # The protocol
//! **The state word** (`state`, one `AtomicU128`, cache-padded): the low 123 bits are the
//! word of `word.rs` (each limit's arrival time, or an anchor and offsets), the top five the
//! configuration's **epoch** modulo 32.
//!
//! **Configurations** live in the two seqlocked slots of a `ConfigSlots`
//! (`src/config_slots.rs`), one per epoch parity (`slots`): a header (the number of limits and the smallest burst) and six
//! words per limit, the three a check reads first, then the two a refusal's retry time needs,
//! then the rate for readers. Only `set_limits` writes them, serialized by a mutex the hot
//! path never touches: it writes the slot of epoch `e + 1`, then converts the state (each
//! limit's tokens at `now`, re-expressed in the new configuration) and installs it with
//! epoch `e + 1` by one CAS on the state word. Each slot carries the epoch it holds (`seq`),
//! written last: what a check that writes nothing validates its reading of the slot by.
//!
//! **The slot by a branch.** A check picks its slot by branching on the word's epoch parity,
//! not by indexing with it: the parity changes only with `set_limits`, so the branch is
//! predicted, and each arm reads its slot at a constant address, so the configuration loads
//! beside the word rather than after it. That matters because a 128-bit CAS starts only once
//! its new value is computed, unlike a 64-bit one (`crate::sync::keep_branch`).
//!
//! * **Invariant:** while the word carries epoch `e`, slot `e & 1` holds epoch `e`'s
//!   configuration: the writer next touches it for `e + 2`, which needs the word at `e + 1`.
//! * A **grant** reads the slot of its word's epoch and commits with one CAS on the whole
//!   word: if it succeeds, no reconfiguration committed in between, so the slot it read was
//!   its epoch's (a rewrite of that slot needs the word moved first). So no check is ever
//!   computed half under an old configuration: `set_limits` is linearizable with checks.
//! * A **refusal** (and a peek, and a check of zero) writes nothing: after reading the slot it
//!   reads the slot's `seq` and accepts its answer if it is still the word's epoch (the
//!   slot was not rewritten meanwhile); it then linearizes at its load. A refusal is decided
//!   from that one load of the state word, and validated by one 64-bit load.
//! * **ABA bound.** The epoch has 5 bits: a grant could commit against a stale slot only if
//!   32 reconfigurations ran (each taking the mutex and a CAS) between its load and its CAS
//!   *and* left the word's other 123 bits as they were; a refusal only if 32 ran between its
//!   load and its `seq` read.
//!
//! **Orderings.** The state word is loaded with `Acquire`: it pairs with the `Release` of the
//! reconfiguring CAS, so the slot written before that CAS is visible to whoever sees the new
//! epoch. A grant's CAS is `AcqRel` (failure `Acquire`, since the found word is the next
//! attempt's). Slot words are `Relaxed`: the writer, once it has seen the word at `e` (so the
//! slot of `e + 1` is spare), stores `seq = WRITING`, issues a `Release` fence, writes the
//! words and stores `seq = e + 1` (`Release`) (`ConfigSlots::write`); a refusal's validation
//! is an `Acquire` fence then the `seq` load (`ConfigSlots::holds`). If a reader read any slot word of a later write, the two fences
//! synchronize and it reads `WRITING` or a later epoch, so it retries (the seqlock argument,
//! with the state word's `Acquire` load as the first read of the sequence: it synchronizes
//! with the CAS that published `e`, after the slot's write for `e`). A grant needs no fence: its
//! successful CAS is `Release` and comes before the writer's CAS in the word's order, so the
//! writer's `Acquire` of the word synchronizes with it and the grant's slot reads happen
//! before the writer's slot writes. `loom-tests/tests/multi_token_bucket.rs` model-checks
//! check ‖ check and check ‖ `set_limits`.

use crossbeam_utils::{Backoff, CachePadded};

use super::word::{
    check, field_bits, reading, Lim, Limits, Source, Verdict, MAX_LIMITS, T_MAX, X_BITS, X_MASK,
};
use crate::config_slots::ConfigSlots;
use crate::limit::Limit;
use crate::sync::{keep_branch, AtomicU128, AtomicU64, Mutex, Ordering, WordOps}; // Mutex: set_limits only

/// Words per limit in a slot.
const PER_LIMIT: usize = 6;
const WORDS: usize = 1 + PER_LIMIT * MAX_LIMITS;
/// The header's flag of two limits: a check tests this bit, not `k`.
const TWO: u64 = 1 << 2;
/// Epochs count modulo 32, in the word's top five bits.
const EPOCHS: u32 = 32;

/// What a check decided.
pub(super) enum Taken {
    Granted,
    /// Refused: limit `by` admits last, at `retry` ns past the base (`None`: never).
    Denied {
        by: usize,
        retry: u64,
    },
}

pub(super) struct Engine {
    state: CachePadded<AtomicU128>,
    /// The configurations of the word's epoch and the next, by parity.
    slots: ConfigSlots<WORDS>,
    /// The clock reading every grid counts from.
    pub(super) base: u64,
    /// `base`, negated, and the last reading the word tells apart ([`T_MAX`]), read from
    /// memory: a reading is then one add and one compare, where a 64-bit constant would take
    /// a copy and a shift.
    neg_base: u64,
    t_max: u64,
    /// The current configuration, for `set_limits`: whoever holds it is the one writer. Only
    /// `set_limits` takes it, to serialize reconfigurations (each writes the spare slot, which
    /// two writers at once would tear); a reconfiguration is published by the CAS on `state`.
    writer: Mutex<Limits>, // off the hot path: checks, peeks and refusals never take it
}

impl Engine {
    /// An engine of `limits`, all full at `base`.
    pub(super) fn new(limits: Limits, base: u64) -> Engine {
        Engine {
            state: CachePadded::new(AtomicU128::new(limits.born(0))),
            slots: ConfigSlots::new(to_words(&limits)),
            base,
            neg_base: base.wrapping_neg(),
            t_max: T_MAX,
            writer: Mutex::new(limits), // set_limits only: see the field
        }
    }

    /// A check of `n` at the clock reading `now`, consuming if `take` (else a peek): one
    /// attempt inline, the retries (a lost CAS, a reconfiguration) out of line.
    #[inline(always)]
    pub(super) fn check(&self, now: u64, n: u32, take: bool) -> Taken {
        let t = now.wrapping_add(self.neg_base);
        if t > self.t_max {
            return self.check_far(now, n, take);
        }
        // The processor's 128-bit load and CAS tested for once, for both.
        match self.state.inline() {
            Some(state) => self.check_on(state, t, n, take),
            None => self.check_portable(t, n, take),
        }
    }

    /// [`Self::check`] at a reading before the base (which counts as the base) or past the
    /// word's range (which counts as its end).
    #[cold]
    #[inline(never)]
    fn check_far(&self, now: u64, n: u32, take: bool) -> Taken {
        self.check_portable(reading(now, self.base), n, take)
    }

    /// [`Self::check`] where the state word's operations test for their instructions.
    #[inline(never)]
    fn check_portable(&self, t: u64, n: u32, take: bool) -> Taken {
        self.check_on(&*self.state, t, n, take)
    }

    /// [`Self::check`] at `t` ns past the base, through `state`: the state word.
    #[inline(always)]
    fn check_on<W: WordOps<u128>>(&self, state: &W, t: u64, n: u32, take: bool) -> Taken {
        let word = state.load(Ordering::Acquire);
        // The slot by a branch on the epoch's parity, not by an index (module docs).
        let attempt = if (word >> X_BITS) & 1 == 0 {
            keep_branch();
            self.attempt(state, 0, word, t, n, take)
        } else {
            self.attempt(state, 1, word, t, n, take)
        };
        match attempt {
            Ok(taken) => taken,
            Err(found) => self.check_slow(state, found, t, n, take),
        }
    }

    /// One attempt from `word`, whose epoch's slot is `parity`: the answer, or the word to try
    /// again from.
    #[inline(always)]
    fn attempt<W: WordOps<u128>>(
        &self,
        state: &W,
        parity: usize,
        word: u128,
        t: u64,
        n: u32,
        take: bool,
    ) -> Result<Taken, u128> {
        let epoch = (word >> X_BITS) as u64;
        debug_assert_eq!(epoch as usize & 1, parity);
        let verdict = check(&Slot(self.slots.words(parity)), word, t, n);
        if let (&Verdict::Grant(next), true) = (&verdict, take) {
            return state
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
                .map(|_| Taken::Granted);
        }
        // Nothing written: valid if the slot still holds the word's epoch (module docs).
        if !self.slots.holds(parity, epoch as u32) {
            return Err(state.load(Ordering::Acquire));
        }
        Ok(match verdict {
            Verdict::Deny { by, retry } => Taken::Denied { by, retry },
            _ => Taken::Granted,
        })
    }

    /// The attempts after a first that did not settle, from `word`, with backoff.
    #[cold]
    #[inline(never)]
    fn check_slow<W: WordOps<u128>>(
        &self,
        state: &W,
        mut word: u128,
        t: u64,
        n: u32,
        take: bool,
    ) -> Taken {
        let backoff = Backoff::new();
        loop {
            backoff.spin();
            let parity = (word >> X_BITS) as usize & 1;
            match self.attempt(state, parity, word, t, n, take) {
                Ok(taken) => return taken,
                Err(found) => word = found,
            }
        }
    }

    /// The configuration and the arithmetic's bits, read together.
    pub(super) fn snapshot(&self) -> (Limits, u128) {
        loop {
            let word = self.state.load(Ordering::Acquire);
            if let Some(words) = self.slots.read((word >> X_BITS) as u32) {
                return (full(&words), word & X_MASK);
            }
        }
    }

    /// Installs `new` at `t` ns past the base: each limit kept by index keeps its tokens.
    pub(super) fn set_limits(&self, new: Limits, t: u64) {
        let mut current = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut word = self.state.load(Ordering::Acquire);
        let epoch = ((word >> X_BITS) as u32 + 1) % EPOCHS;
        self.slots.write(epoch, to_words(&new));
        let backoff = Backoff::new();
        loop {
            let x = current.convert(word & X_MASK, &new, t);
            let next = (u128::from(epoch) << X_BITS) | x;
            match self
                .state
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(found) => {
                    word = found;
                    backoff.spin();
                }
            }
        }
        *current = new;
    }

    /// Makes the state born at `t` (all limits full then): for a limiter not yet shared.
    pub(super) fn reborn(&self, t: u64) {
        let (limits, _) = self.snapshot();
        let word = self.state.load(Ordering::Acquire);
        self.state
            .store((word & !X_MASK) | limits.born(t), Ordering::Release);
    }
}

/// A configuration as slot words: the header (`k - 1`, the smallest burst), then per limit `mul`,
/// `one`, `tau` (what a check reads), `per`, `per_shift` and `burst`, and the limit's bits.
fn to_words(l: &Limits) -> [u64; WORDS] {
    let mut w = [0u64; WORDS];
    w[0] = (l.k - 1) as u64 | if l.k == 2 { TWO } else { 0 } | u64::from(l.min_burst) << 32;
    for (i, lim) in l.lims.iter().enumerate() {
        let s = &mut w[1 + i * PER_LIMIT..1 + (i + 1) * PER_LIMIT];
        s.copy_from_slice(&[
            lim.mul,
            lim.one,
            lim.tau,
            lim.per,
            u64::from(lim.per_shift) | u64::from(lim.burst) << 32,
            lim.limit.as_f64().to_bits(),
        ]);
    }
    w
}

/// A slot's words as a check reads them: the header, and each limit's words one by one. Any
/// words give values `check` takes without panicking (`k` is two bits, the index masked), as a
/// torn read must.
struct Slot<'a>(&'a [AtomicU64; WORDS]);

impl Source for Slot<'_> {
    #[inline(always)]
    fn head(&self) -> (usize, u32, bool) {
        let head = self.0[0].load(Ordering::Relaxed);
        let k = (head & 3) as usize + 1;
        (k, (head >> 32) as u32, head & TWO != 0)
    }

    #[inline(always)]
    fn grid(&self, i: usize) -> (u64, u64) {
        let s = &self.0[1 + (i % MAX_LIMITS) * PER_LIMIT..];
        (s[0].load(Ordering::Relaxed), s[1].load(Ordering::Relaxed))
    }

    #[inline(always)]
    fn tau(&self, i: usize) -> u64 {
        self.0[1 + (i % MAX_LIMITS) * PER_LIMIT + 2].load(Ordering::Relaxed)
    }

    #[inline(always)]
    fn cold(&self, i: usize) -> (u64, u32, u32) {
        let s = &self.0[1 + (i % MAX_LIMITS) * PER_LIMIT..];
        let shift_burst = s[4].load(Ordering::Relaxed);
        (
            s[3].load(Ordering::Relaxed),
            shift_burst as u32,
            (shift_burst >> 32) as u32,
        )
    }
}

/// The whole configuration of slot words.
fn full(w: &[u64; WORDS]) -> Limits {
    let k = (w[0] & 3) as usize + 1;
    let lims = std::array::from_fn(|i| {
        let s = &w[1 + i * PER_LIMIT..1 + (i + 1) * PER_LIMIT];
        Lim {
            mul: s[0],
            one: s[1],
            tau: s[2],
            per: s[3],
            per_shift: s[4] as u32,
            burst: (s[4] >> 32) as u32,
            limit: Limit::from_valid(f64::from_bits(s[5])),
        }
    });
    debug_assert!(field_bits(k) >= 21);
    Limits {
        k,
        two: k == 2,
        min_burst: (w[0] >> 32) as u32,
        lims,
    }
}
