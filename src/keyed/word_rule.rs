//! The algorithm half of a keyed map with its state **inline**: how one key's state word
//! moves. The map half (the table, its lock-free lookup, inserts, eviction, revival and
//! resizes) is the word map (`src/keyed/word_map.rs`), shared by every such map; a rule only computes.
//!
//! # The word's width
//! A rule picks its state word's width, [`WordRule::Word`]: `u64` (every rule whose state
//! fits 59 bits) or `u128` (Guava's warming-up limiter, whose state is two independent
//! numbers). The map is the same code for both, monomorphized; only the atomic differs
//! (std's `AtomicU64`, or `AtomicU128` through `crate::sync`: portable-atomic's with an
//! inline `vmovdqa` per load and `cmpxchg16b` per CAS on x86_64, or loom's stand-in).
//!
//! # The contract
//! A key's state is `x`, at most [`Word::X_MASK`] (the word's low `BITS - 5` bits: 59 of a
//! `u64`, 123 of a `u128`); the map keeps the quota's tag and its own flags in the top five.
//! `base` is the map's base reading (ns on its clock, taken at construction); a rule counts
//! time from it, so that its bits last.
//!
//! 1. **`check` reads nothing but its arguments and `self`**, and writes nothing: the map
//!    applies a grant with one CAS from the `x` it was computed from, and retries on the
//!    value a failed CAS found.
//! 2. **A grant that consumes anything changes `x`.** An eviction is a CAS from the `x` the
//!    sweep judged idle, so a grant that left `x` as it was could be lost to it. A grant
//!    that consumes nothing (`n == 0`, an unlimited quota) returns `Ok(None)` and is not
//!    written.
//! 3. **`idle(x, J)` means evicting hands a key nothing**: for every `B >= J`, the budget
//!    the rule states for one key's history (its alias's module docs) holds for a history that
//!    runs on `x` up to the eviction and on `born(B)` after it, whatever its readings (stale
//!    ones, earlier than `B` or `J`, included). Per reading, the newborn is at least as
//!    strict: a check that `born(B)` grants, `x` grants too, at every reading for the
//!    bucket, leaky, smooth and fixed-window rules, and for the sliding window's at every
//!    reading from the start of `J`'s window on. (An older reading is judged by the sliding
//!    window's `x` in its own, older windows, where its grants may refuse it, and by
//!    `born(B)` at the start of `B`'s window: its budget is stated in judged times, and is
//!    what holds. Check by check the two may also part after a stale reading that `x` would
//!    have granted and `born(B)` refuses: then `x` has spent what the newborn still holds.)
//!    A revived key is born at `B = max(now, J)` of the sweep that evicted it. The map runs
//!    no check on a key between the sweep's judgement and its CAS, and the CAS fails if one
//!    landed.
//! 4. **`born` never panics and saturates**; so does every time computation of a rule.
use std::fmt::{self, Debug};
use std::ops::{BitAnd, BitOr, Not, Shl, Shr};

use crate::clock::Nanos;
use crate::error::ConfigError;
use crate::limiter::Denied;
use crate::sync::{AtomicU128, AtomicU64, HasInline, InlineU128, Ordering, WordOps};

/// The bits of a 64-bit key state `x`: the map keeps its quota's tag and its flags in the
/// other five.
pub(crate) const X_MASK: u64 = <u64 as Word>::X_MASK;

/// A state word's width (module docs): its layout constants and its atomic.
pub trait Word:
    Copy
    + Eq
    + Ord
    + Debug
    + Send
    + Sync
    + 'static
    + BitAnd<Output = Self>
    + BitOr<Output = Self>
    + Not<Output = Self>
    + Shl<u32, Output = Self>
    + Shr<u32, Output = Self>
{
    /// The word's bits.
    const BITS: u32;
    const ZERO: Self;
    /// The top bit: set by a resize once the slot is copied.
    const FROZEN: Self;
    /// The bits of `x`, below the flag and the 4-bit tag.
    const X_BITS: u32 = Self::BITS - 5;
    const X_MASK: Self;
    /// A slot never used.
    const EMPTY: Self = Self::ZERO;
    /// The atomic holding a slot's word.
    type Atomic: AtomicWord<Self>;
    /// How a check reaches its words once the processor is known to have the instructions
    /// the word needs ([`Word::fast`]).
    type Fast: Access<Self>;
    /// A zero-sized type whose alignment a slot takes (through a `[Align; 0]` field): a
    /// slot's size, so that no slot straddles two cache lines.
    type Align: Send + Sync + 'static;

    /// The access whose loads and CASes test for nothing, where the processor allows it:
    /// tested once per check, where each of the atomic's own operations tests (a 128-bit
    /// word's, `src/atomic_u128.rs`) and a check's probe loads several words. Always `Some`
    /// for a 64-bit word.
    fn fast() -> Option<Self::Fast>;

    fn from_u64(v: u64) -> Self;
    /// The low 64 bits.
    fn low_u64(self) -> u64;
}

/// The operations the map performs on a slot's word, as the atomic's own methods.
pub trait AtomicWord<W>: WordOps<W> + Send + Sync {
    fn new(v: W) -> Self;
    fn store(&self, v: W, order: Ordering);
    fn compare_exchange(&self, current: W, new: W, s: Ordering, f: Ordering) -> Result<W, W>;
}

/// How a check reaches a slot's word: through the atomic itself ([`Tested`]), or through a
/// view that skips the processor test the atomic would make at each operation, proved once
/// for the whole check ([`Word::fast`]).
pub trait Access<W: Word>: Copy {
    type View: WordOps<W> + ?Sized;
    fn view(self, word: &W::Atomic) -> &Self::View;
}

/// The atomic's own operations, each testing what it needs.
#[derive(Clone, Copy, Debug)]
pub struct Tested;

impl<W: Word> Access<W> for Tested {
    type View = W::Atomic;

    #[inline(always)]
    fn view(self, word: &W::Atomic) -> &W::Atomic {
        word
    }
}

/// A 128-bit word as [`InlineU128`]: its `vmovdqa` and `cmpxchg16b` with no test.
impl Access<u128> for HasInline {
    type View = InlineU128;

    #[inline(always)]
    fn view(self, word: &AtomicU128) -> &InlineU128 {
        HasInline::view(self, word)
    }
}

/// The alignment of a slot with a 128-bit word: a 32-byte one (a key of up to 16 bytes) is
/// only 16-aligned otherwise, and so is its allocation, which puts every other slot across
/// two lines, two misses a check where one would do. A larger key's slot is rounded up to
/// 64 bytes: a line each.
#[repr(align(32))]
pub struct Align32;

macro_rules! word {
    ($w:ty, $atomic:ty, $align:ty, $fast:ty, $get:expr) => {
        impl Word for $w {
            const BITS: u32 = <$w>::BITS;
            const ZERO: $w = 0;
            const FROZEN: $w = 1 << (<$w>::BITS - 1);
            const X_MASK: $w = (1 << (<$w>::BITS - 5)) - 1;
            type Atomic = $atomic;
            type Fast = $fast;
            type Align = $align;

            #[inline(always)]
            fn fast() -> Option<$fast> {
                $get
            }

            #[inline(always)]
            fn from_u64(v: u64) -> $w {
                v as $w
            }

            #[inline(always)]
            fn low_u64(self) -> u64 {
                self as u64
            }
        }

        // Each method calls the atomic's inherent one (inherent methods take precedence).
        impl AtomicWord<$w> for $atomic {
            #[inline(always)]
            fn new(v: $w) -> Self {
                <$atomic>::new(v)
            }

            #[inline(always)]
            fn store(&self, v: $w, order: Ordering) {
                <$atomic>::store(self, v, order)
            }

            #[inline(always)]
            fn compare_exchange(
                &self,
                current: $w,
                new: $w,
                s: Ordering,
                f: Ordering,
            ) -> Result<$w, $w> {
                <$atomic>::compare_exchange(self, current, new, s, f)
            }
        }
    };
}

// A 16-byte slot (a 64-bit word and a `u64` key) is aligned to its word, 8: allocations are
// 16-aligned, so it never straddles a line; a wider key makes a slot of 24 bytes or more,
// which no alignment keeps within a line.
word!(u64, AtomicU64, (), Tested, Some(Tested));
word!(u128, AtomicU128, Align32, HasInline, HasInline::get());

/// 8.5 years (of 365.25 days) in nanoseconds: the least range of readings past the base
/// that every rule's word holds, whatever its configuration.
pub(crate) const RANGE_MIN: u64 = 85 * 36_525 * 86_400 * 1_000_000; // 8.5 * 365.25 days
const _: () = assert!(RANGE_MIN == 268_239_600_000_000_000);

/// One configuration of a keyed map with inline state: see the [module docs](self).
///
/// Public in name only (this module is private): it is the bound of
/// [`InlineMap`](super::InlineMap)'s rule parameter, which users never name; they name a map
/// by its alias.
pub trait WordRule: Copy + Send + Sync + 'static {
    /// The state word's width (module docs).
    type Word: Word;

    /// What the map's builder records of its quotas, quota 0 first, until `build` turns it
    /// into rules with [`WordRule::rules`].
    type Quotas: Debug + Send + Sync;

    /// The map's name (its alias) in its `Debug`.
    const NAME: &'static str;

    /// The rules of `quotas` for a map built at `now()` (ns on its clock; read only by a rule
    /// that needs it), quota 0 first, or the first quota's [`ConfigError`], as the single
    /// limiter's builder reports it.
    fn rules(quotas: &Self::Quotas, now: impl FnOnce() -> Nanos) -> Result<Vec<Self>, ConfigError>;

    /// Adds the quotas' settings (`rules`, quota 0 first) to the map's `Debug`.
    fn debug_quotas(rules: &[Self], d: &mut fmt::DebugStruct<'_, '_>);

    /// The state of a key born at `now`: inserted, or revived after an eviction judged at
    /// or before `now`. At most [`Word::X_MASK`].
    fn born(&self, base: u64, now: Nanos) -> Self::Word;

    /// A check of `n` at `now` on state `x`: `Ok(Some(x2))` grants by writing `x2` (at most
    /// [`Word::X_MASK`], and `!= x`), `Ok(None)` grants without a write, `Err` refuses
    /// (nothing written) with the denial's retry time.
    fn check(
        &self,
        x: Self::Word,
        base: u64,
        now: Nanos,
        n: u32,
    ) -> Result<Option<Self::Word>, Denied>;

    /// Whether evicting a key in state `x` at `now` changes nothing it could be granted
    /// (contract 3).
    fn idle(&self, x: Self::Word, base: u64, now: Nanos) -> bool;
}
