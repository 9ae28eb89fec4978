//! The sketch's cells and the protocol that raises them: a count-min sketch of GCRA arrival
//! times with conservative update, all-or-nothing per key in one 128-bit word. The user docs
//! are on [`SketchTokenBucket`](super::SketchTokenBucket).
//!
//! # Layout
//! A table of `2^b` lines of 64 bytes, each four 128-bit **words** of four **cells**:
//!
//! ```text
//!  127      112 111       96 95        80 79        64 63                      0
//! [ offset 3  ][ offset 2  ][ offset 1  ][ offset 0  ][        anchor a        ]
//! ```
//!
//! A cell holds an arrival time in the rule's units, `a * G + offset` with `G = 2^15` (the
//! **grain**): the anchor is the grain of the latest reading that wrote the word. A key's hash
//! picks one line, one word in it and `d` of the word's four cells (`1 <= d <= 3`): one cache
//! line per key, so a check misses the cache at most once, and one word, so a grant is one
//! CAS. The rule's units are set so that a whole burst and the penalty (if any) span at most `G`
//! units (`tau + p <= G`), which keeps every offset below `2^16` (below).
//!
//! # A check
//! Load the key's word; its arrival time is `m`, the smallest of its cells. Run the rule (a
//! token bucket, `TokenBucketQuota`) on `m` at the reading `u`: a refusal returns, having
//! written nothing (one load). A grant leaves `x' = max(m, u) + n * one <= u + tau`; the new
//! word has the anchor `a' = max(a, u / G)`, each of the key's cells raised to at least `x'`
//! (conservative update), every other cell unchanged except that a value below `a' * G` is
//! raised to `a' * G` (it was full at `u` and stays full for every later reading). One CAS
//! from the loaded word installs it, or the check starts over from the word it found. When
//! `u / G <= a` (every grant but the first in a grain) the anchor stays and no cell is below
//! it, so only the key's `d` fields are touched; the check is compiled once per `d`, so it
//! reads and writes exactly those.
//!
//! **A penalty** of `p > 0` units: a refusal of a key whose arrival time is a normal debt
//! (`m <= u + tau`) raises the key's cells to `x_p = u + tau + p` instead of writing nothing
//! (the same new word as a grant's, with `x_p` for `x'`, by one CAS); a refusal with
//! `m > u + tau` (during a penalty, or at a stale reading) writes nothing.
//!
//! **Offsets fit.** With `a' = u / G`: a key's new offset is `x' - a' * G <= (u - a' * G) +
//! tau + p < G + tau + p <= 2^16`. With `a' = a > u / G` (a stale reading): `x' - a * G < tau +
//! p`, since `u < a * G`. Other cells' offsets only shrink.
//!
//! # The invariant
//! Let `T_k` be key `k`'s arrival time under an exact per-key token bucket fed the checks of
//! `k` this table granted, in the order of their CASes. Then **every cell of every key `k`
//! holds at least `T_k`**: a grant of `k` raises all of `k`'s cells to `x' >= max(T_k, u) +
//! n * one` (the new `T_k`, since `m >= T_k`) in the same CAS that commits it, and no write
//! lowers a cell except to `a' * G`, which only replaces a value that is at most `a' * G`
//! with that value (a penalty only raises cells). So `m >= T_k`: a check granted at `m` is granted at `T_k` (a token
//! bucket's check is monotonic in its arrival time) and no key is ever granted beyond its own
//! budget, whoever shares its cells, at any reading, stale or not. Other keys only push a
//! cell up, which can refuse `k` early (a false refusal: the sketch's one error) but never
//! grant it late.
//!
//! Each grant is one CAS on one word, so checks are linearizable at their CAS (grants) or
//! load (refusals), and concurrent checks of one key race like checks of one token bucket;
//! `loom-tests/tests/keyed_sketch.rs` model-checks it. The CAS can fail only when another
//! check wrote the word: lock-free, with `crossbeam_utils::Backoff` between attempts.
//!
//! **Orderings.** The word is the whole state of its keys and nothing else is published
//! through it, so `Relaxed` would do for the decisions; the load is `Acquire` and the CAS
//! `AcqRel` (the same instructions on x86_64) so that a grant happens-before any check that
//! sees it, which a caller that hands work between threads by the limiter's answers may
//! expect.

use crossbeam_utils::Backoff;

use crate::clock::Nanos;
use crate::keyed::token_bucket::TokenBucketQuota;
use crate::limiter::Denied;
use crate::sync::{AtomicU128, Ordering};

/// Words per line: four 128-bit words, one 64-byte cache line.
pub(crate) const WORDS: usize = 4;
/// Cells per word.
pub(crate) const CELLS: usize = 4;
/// The grain's bits: `G = 2^G_BITS` units.
pub(crate) const G_BITS: u32 = 15;
/// An offset's bits.
const OFFSET_BITS: u32 = 16;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// One cache line of words.
#[repr(C, align(64))]
pub(crate) struct Line([AtomicU128; WORDS]);

impl Line {
    fn new() -> Line {
        Line(std::array::from_fn(|_| AtomicU128::new(0)))
    }
}

/// Where a key's cells are: its line, its word in the line, and its cells in the word as a
/// bit set of the four.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Spot {
    pub(crate) line: usize,
    pub(crate) word: usize,
    pub(crate) cells: u8,
    /// The same cells as the bit offsets of their fields in the word's high half (0, 16, 32
    /// or 48), six bits each, in the order of `cells`' bits.
    pub(crate) shifts: u32,
}

/// The table.
pub(crate) struct Cells {
    lines: Box<[Line]>,
    /// Cells per key.
    d: usize,
}

impl Cells {
    /// `lines` lines (a power of two), every word 0: every key full.
    pub(crate) fn new(lines: usize, d: usize) -> Cells {
        debug_assert!(lines.is_power_of_two() && (1..=3).contains(&d));
        Cells {
            lines: (0..lines).map(|_| Line::new()).collect(),
            d,
        }
    }

    pub(crate) fn lines(&self) -> usize {
        self.lines.len()
    }

    /// Cells per key.
    pub(crate) fn d(&self) -> usize {
        self.d
    }

    /// The word at `spot` (its line masked: the table is a power of two of lines).
    #[inline(always)]
    fn word(&self, spot: Spot) -> &AtomicU128 {
        &self.lines[spot.line & (self.lines.len() - 1)].0[spot.word % WORDS]
    }

    /// A check of `n` at `spot` under `rule`, with `penalty` units for a client that goes
    /// over its limit (0 for none), where the rule's burst and the penalty span at most `G`
    /// units: see the module docs.
    #[inline]
    pub(crate) fn check(
        &self,
        rule: &TokenBucketQuota,
        penalty: u64,
        spot: Spot,
        base: u64,
        now: Nanos,
        n: u32,
    ) -> Result<(), Denied> {
        let c = Check {
            word: self.word(spot),
            rule,
            penalty,
            spot,
            base,
            now,
            n,
            u: rule.units(base, now),
        };
        // One body per number of cells a key has, so that a check reads and raises exactly
        // those fields, unrolled.
        match self.d {
            1 => c.run::<1>(),
            2 => c.run::<2>(),
            _ => c.run::<3>(),
        }
    }

    /// The arrival time of the key at `spot`: the smallest of its cells.
    pub(crate) fn arrival(&self, spot: Spot) -> u64 {
        arrival(self.word(spot).load(Ordering::Acquire), spot.cells)
    }
}

/// One check: its word, its rule, and its reading in units.
struct Check<'a> {
    word: &'a AtomicU128,
    rule: &'a TokenBucketQuota,
    penalty: u64,
    spot: Spot,
    base: u64,
    now: Nanos,
    n: u32,
    u: u64,
}

/// What a check does with the word it read.
enum Step {
    /// It is decided, with nothing (more) to write.
    Answer(Result<(), Denied>),
    /// A grant: CAS the word read to this one.
    Write(u128),
}

impl Check<'_> {
    /// The check of `D` cells: the first attempt inline; the loop, with its backoff, only
    /// when a CAS lost a race (keeping it out of line keeps the uncontended check's
    /// registers free).
    #[inline(always)]
    fn run<const D: usize>(&self) -> Result<(), Denied> {
        let w = self.word.load(Ordering::Acquire);
        match self.step::<D>(w) {
            Step::Answer(a) => a,
            Step::Write(next) => {
                match self
                    .word
                    .compare_exchange(w, next, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => Ok(()),
                    Err(found) => self.contended::<D>(found),
                }
            }
        }
    }

    /// The check of `D` cells on word `w` (module docs).
    #[inline(always)]
    fn step<const D: usize>(&self, w: u128) -> Step {
        let (rule, u) = (self.rule, self.u);
        let m = arrival_d::<D>(w, self.spot.shifts);
        match rule.check_units(m, u, self.base, self.now, self.n) {
            Ok(Some(x2)) => Step::Write(raised_d::<D>(w, self.spot, x2, u >> G_BITS)),
            // Nothing to take: `n == 0`, or an infinite limit.
            Ok(None) => Step::Answer(Ok(())),
            // A penalty starts only from a normal debt (`m <= u + tau`): not during one, nor
            // for a check that could never pass (no retry time).
            Err(denied) if self.penalty == 0 || m > u + rule.tau || denied.retry_at().is_none() => {
                Step::Answer(Err(denied))
            }
            Err(_) => Step::Answer(penalize(
                self.word,
                w,
                rule,
                self.penalty,
                self.spot.cells,
                u,
                self.base,
                self.now,
                self.n,
            )),
        }
    }

    /// The check again from `w`, the word a lost CAS found, until its CAS wins or it is
    /// decided.
    #[cold]
    #[inline(never)]
    fn contended<const D: usize>(&self, mut w: u128) -> Result<(), Denied> {
        let backoff = Backoff::new();
        loop {
            backoff.spin();
            match self.step::<D>(w) {
                Step::Answer(a) => return a,
                Step::Write(next) => match self.word.compare_exchange_weak(
                    w,
                    next,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Ok(()),
                    Err(found) => w = found,
                },
            }
        }
    }
}

/// The refusal of a check of `n` at `u` that starts a penalty of `p` units on word `w`, read
/// by that check (module docs): one CAS raises the key's cells to `u + tau + p`, or, where
/// another write got in first, the check is judged again on the word it found. Cells only
/// rise, so the check stays refused; a penalty someone else started answers as one.
#[cold]
#[allow(clippy::too_many_arguments)]
fn penalize(
    word: &AtomicU128,
    mut w: u128,
    rule: &TokenBucketQuota,
    p: u64,
    set: u8,
    u: u64,
    base: u64,
    now: Nanos,
    n: u32,
) -> Result<(), Denied> {
    let cost = u64::from(n) * rule.scale.one;
    let backoff = Backoff::new();
    loop {
        let m = arrival(w, set);
        if m > u + rule.tau {
            return Err(rule.denied(m + cost, base, now));
        }
        let xp = u + rule.tau + p;
        let next = raised(w, set, xp, u >> G_BITS);
        match word.compare_exchange_weak(w, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Err(rule.denied(xp + cost, base, now)),
            Err(found) => w = found,
        }
        backoff.spin();
    }
}

/// [`arrival`] for a key of `D` cells at `shifts` (`Spot::shifts`).
#[inline(always)]
fn arrival_d<const D: usize>(w: u128, shifts: u32) -> u64 {
    let hi = (w >> 64) as u64;
    let field = |j: usize| hi >> (shifts >> (6 * j) & 63) & OFFSET_MASK;
    let min = match D {
        1 => field(0),
        2 => field(0).min(field(1)),
        _ => field(0).min(field(1)).min(field(2)),
    };
    ((w as u64) << G_BITS) + min
}

/// [`raised`] for a key of `D` cells at `spot`: where the reading's grain is not past the
/// anchor (all but the first grant in each grain of `G` units), the anchor stays and only the
/// key's fields move, each to at least `x2 - a * G`; where it is two grains or more past (a
/// word idle that long, as most are under random keys), every other field is 0; one grain
/// past, the general form.
#[inline(always)]
fn raised_d<const D: usize>(w: u128, spot: Spot, x2: u64, g: u64) -> u128 {
    let anchor = w as u64;
    // Branches, not a `max`: the anchor the common case writes comes from the word, not
    // from the clock reading's later conversion.
    if g > anchor {
        if g - anchor == 1 {
            return raised(w, spot.cells, x2, g);
        }
        // Two grains or more on (a word no one wrote lately): every cell, below `a * G +
        // 2^16 <= g * G`, is full at `g * G` and its field is 0, as `raised` would leave it.
        return with_fields::<D>(0, g, spot, x2);
    }
    with_fields::<D>((w >> 64) as u64, anchor, spot, x2)
}

/// The word of anchor `anchor` and fields `hi`, with the `D` fields at `spot` raised to at
/// least `x2 - anchor * G`.
#[inline(always)]
fn with_fields<const D: usize>(mut hi: u64, anchor: u64, spot: Spot, x2: u64) -> u128 {
    // `x2 >= m >= anchor * G` (every cell is at least its anchor) or `x2 >= u >= g * G`, and,
    // as in `raised`, below `anchor * G + 2^16`.
    let x = x2 - (anchor << G_BITS);
    debug_assert!(x <= OFFSET_MASK, "offset {x}");
    for j in 0..D {
        let at = spot.shifts >> (6 * j) & 63;
        let field = hi >> at & OFFSET_MASK;
        hi = hi & !(OFFSET_MASK << at) | field.max(x) << at;
    }
    u128::from(hi) << 64 | u128::from(anchor)
}

/// The smallest of the cells in `set` of word `w`, in units.
#[inline(always)]
fn arrival(w: u128, set: u8) -> u64 {
    let anchor = w as u64;
    let mut min = u64::MAX;
    for i in 0..CELLS {
        if set >> i & 1 == 1 {
            min = min.min(offset(w, i));
        }
    }
    (anchor << G_BITS).saturating_add(min)
}

/// Cell `i`'s offset in word `w`.
#[inline(always)]
fn offset(w: u128, i: usize) -> u64 {
    (w >> (64 + OFFSET_BITS as usize * i)) as u64 & OFFSET_MASK
}

/// Word `w` after a grant that leaves the cells in `set` at `x2`, read in grain `g`: anchored
/// at `max(a, g)`, the key's cells raised to `x2`, every cell at least the anchor (module
/// docs).
#[inline(always)]
fn raised(w: u128, set: u8, x2: u64, g: u64) -> u128 {
    let anchor = (w as u64).max(g);
    let start = anchor << G_BITS;
    let mut hi = 0u64;
    for i in 0..CELLS {
        let v = ((w as u64) << G_BITS).saturating_add(offset(w, i));
        let v = if set >> i & 1 == 1 { v.max(x2) } else { v };
        // An offset below 2^16 (module docs: "Offsets fit"); a cell below the anchor is 0.
        let off = v.saturating_sub(start);
        debug_assert!(off <= OFFSET_MASK, "offset {off} of cell {i}");
        let off = off.min(OFFSET_MASK);
        hi |= off << (OFFSET_BITS as usize * i);
    }
    u128::from(hi) << 64 | u128::from(anchor)
}
