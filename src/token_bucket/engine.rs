//! The token bucket's engine: the state word, its configuration slots and the CAS protocols
//! that move them (take, cancel, refund, reconfiguration). The user docs are on
//! [`TokenBucket`](super::TokenBucket); the arithmetic of one configuration is `config.rs`'s.
//!
//! # The protocol
//!
//! **Representation.** A bucket of `burst` tokens refilling at `limit` tokens per second is
//! held as one number, `tat` ("theoretical arrival time", GCRA's name): the instant at which
//! the bucket was (or will be) empty, ignoring the cap. The tokens at time `t` are
//! `min(burst, (t - tat) * limit)`, which can be negative while reservations are outstanding.
//! Taking `n` tokens at `t` is `tat' = max(tat, t - tau) + n * T`, with `T = 1/limit` and
//! `tau = burst * T`; this is exactly rate.go's `advance` then `tokens -= n`.
//!
//! Time is counted in **units** (`src/scale.rs`): one token is exactly `one` units, so
//! grants never drift. A unit is exactly 1/16 ns when `T` is a whole number of 1/16 ns (every
//! whole-nanosecond interval: readings then convert without any rounding), and otherwise
//! `T / 2^k` with `k` the smallest making it at most 1/16 ns; below 7.5/s `k <= 31` (so that
//! `n * one < 2^63` for any `u32` `n`) makes it coarser, as does a burst so large that
//! `burst * one` would pass 2^55 (466 ns at 1e-3/s: still exact in whole tokens). A clock reading
//! `now` becomes `u(now) = tau + units(now - base)`, one shift and one multiply by a 64-bit
//! constant; `base` is the configuration's origin, `since - tau` in nanoseconds (at most 2^56
//! ns before `since`), so `u` reaches `tau` near `since` and the state is never negative.
//! Readings before `base` count as `base`: by then a state built at `since` holds no tokens,
//! so an earlier reading never finds more than a later one (D2).
//!
//! **The state word** (`state`, one `AtomicU64`, cache-padded):
//! ```text
//!  63 62   61    57 56                                                  0
//! +--+----+--------+-----------------------------------------------------+
//! |0 | gen: 6 bits | x: tat in units, 57 bits                            |
//! +--+----+--------+-----------------------------------------------------+
//! ```
//! `x` is `tat` in the units of configuration `gen`, offset so that the bucket is full at
//! `u(now)` exactly when `x <= u(now) - tau`. A check of `n` at `now` is, in integers:
//! `x' = max(x, u - tau) + n * one`, granted iff `x' <= u (+ the caller's maximum wait)`; as
//! `n * one < 2^63`, `x' <= u` also proves `n <= burst`, so the hot path has no branch for it.
//! Bit 62, the top bit of `gen`, is its parity (the slot): `gen` counts with that bit as its
//! lowest digit (`gen_after`). Bit 63 stays clear so that the hot path can compute in the
//! word's own coordinates, `gen` bits and all, with no sum reaching 2^64: it never masks `x`
//! out nor puts `gen` back, and a denial checks that the whole word is unchanged. Under a zero or infinite limit nothing refills (`u = tau` for
//! ever: the scale's multiplier is zero) and `x = tau - tokens * one` simply stores the tokens.
//!
//! **Configurations** live in two slots of plain atomic words beside the state word, one per
//! `gen` parity, 64 bytes each (`Slot`): the six hot words (the negated `base`, `lim`,
//! `mul`, `tau`, `one` with `per_shift` in its upper half, and the scale's inverse `per`) that a check and its refusal's retry time read, then the burst and flags and the
//! epoch; the cold ones (limit, since, and the token-coordinate origin) that only
//! reservations, cancels and reconfigurations read sit apart (`ColdSlot`). Only `set_limit` /
//! `set_burst` (and a rebase) write slots; they are serialized among themselves by a mutex the
//! hot path never touches. A reconfiguration writes the slot of `gen + 1`, then converts the
//! state (tokens at `now` under the old configuration, re-expressed in the new one) and
//! installs it with one CAS on the state word. The **state word is the slots' sequence
//! number**: no separate seqlock.
//!
//! * **Invariant:** while the word carries `gen`, slot `gen & 1` holds that generation's
//!   configuration: the writer next touches it for `gen + 2`, which needs the word to reach
//!   `gen + 1` first.
//! * A **grant** reads the slot of its word's `gen` and commits with a CAS on the whole word:
//!   if it succeeds, no reconfiguration committed in between, so the slot it read was its
//!   `gen`'s (a rewrite of that slot needs the word moved first). So no reservation is ever
//!   computed half under an old configuration: `set_limit` is linearizable with `reserve` and
//!   `cancel`.
//! * A **denial** (and a zero-token request, and everything under an infinite limit) writes
//!   nothing: after reading the slot it reloads the word and accepts its answer if `gen` has
//!   not moved. It then linearizes at its first load.
//! * **ABA bound.** `gen` has 6 bits: a grant could commit against a stale slot only if 64
//!   reconfigurations ran (each taking the mutex and a CAS) between its load and its CAS *and*
//!   left `x` bit-for-bit where it was. A reservation also keeps its 32-bit `epoch` (in the
//!   slot), so a cancel is confused only by 2^32 reconfigurations, not by `gen` wrapping.
//!
//! **Orderings.** The state word is loaded with `Acquire`: it pairs with the `Release` of the
//! reconfiguring CAS, so the slot written before that CAS is visible to whoever sees the new
//! `gen`. Hot-path CASes are `AcqRel` (failure `Acquire`, since the failed value is used as the
//! next word); being read-modify-writes they continue the release sequence, so later readers
//! still see the slot. Slot words are `Relaxed`: a writer issues a `Release` fence after it
//! has seen the word at `gen + 1` (the CAS that made the slot spare) and before writing the
//! slot for `gen + 2`; a denial's validation is an `Acquire` fence then a reload. If a reader
//! read any slot word of the later write, the two fences synchronize and its reload sees
//! `gen + 1` or later, so it retries (the seqlock argument, with the state word as sequence).
//! A grant needs no fence: its successful CAS is `Release`, and the writer's `Acquire` load
//! of any later word synchronizes with it, so the grant's slot reads happen before the
//! writer's slot writes. `loom-tests/tests/token_bucket.rs` model-checks take vs cancel vs
//! reconfiguration.
//!
//! **Refunds** (`Limiter::refund_n_at`, for a grant that a second, layered limit then
//! refused) are a third CAS protocol on the word, beside takes and cancels: load the word,
//! read the hot words of its slot, compute `x' = max(x - n * one, u(now) - tau)` (the tokens
//! plus `n`, capped at the burst), and CAS the whole word to `x'` with its `gen` kept; a
//! failed CAS retries from the word it returned. A refund that changes nothing (an infinite
//! limit, a full bucket) writes nothing and validates its load as a denial does. As a CAS on
//! the whole word it never mixes configurations, and it linearizes at its CAS: a take racing
//! it sees the tokens either before or after the refund, never a torn value, and no refund is
//! lost (`loom-tests/tests/token_bucket.rs`, `refund_vs_*`). Why the result is exact, and the
//! one case where it is not, is on `refund_n_at`.

use crossbeam_utils::Backoff;

use super::config::{Cold, Config, Hot};
use super::reservation::Ticket;
use super::TokenBucket;
use crate::clock::{Clock, Nanos};
use crate::layout::Layout;
use crate::limit::Limit;
use crate::sync::{fence, AtomicU64, Mutex, Ordering}; // Mutex: set_limit/set_burst only, never the hot path

/// What a take decided.
pub(super) enum Decision {
    Granted {
        /// The state the take left (or found, if it took nothing), and `u(now)`.
        x: u64,
        due: u64,
        took: bool,
        /// Its configuration: the hot words always, the cold ones only for `RESERVE`.
        cfg: Config,
    },
    Denied {
        retry_at: Option<Nanos>,
        /// The limit, for `WaitError::Never` (`RESERVE` only).
        limit: f64,
    },
}

/// What `take` needs beyond the verdict (its `MODE`): nothing, a refusal's retry time
/// (`CHECK` for a time passed in, `CHECK_NOW` for one the call reads from the clock; see
/// `take_in` for why the two differ), or the whole configuration.
pub(super) const ALLOW: u8 = 0;
pub(super) const CHECK: u8 = 1;
pub(super) const RESERVE: u8 = 2;
pub(super) const CHECK_NOW: u8 = 3;

/// The verdict of [`Hot::check`] on one state word.
pub(super) enum Check {
    /// Granted at `u(now) = due`, leaving the state at `x`.
    Take { x: u64, due: u64 },
    /// Granted with no state change (infinite limit).
    Free,
    /// Denied: it would be granted once `u(t)` reaches `need`.
    Wait { need: u64 },
    /// Never granted (more than the burst, a zero limit, or past the word's range).
    Never,
    /// `now` is past the configuration's hot range: rebase, then check again.
    Far,
}

/// Bits of the state word.
pub(super) const GEN_SHIFT: u32 = 57;
pub(super) const X_MAX: u64 = (1 << GEN_SHIFT) - 1;
/// `gen`'s six bits, 57..=62; bit 63 is always clear (see *The state word*).
pub(super) const GEN_MASK: u64 = 63 << GEN_SHIFT;
/// The word's bit that is `gen`'s parity (the slot).
pub(super) const PARITY_SHIFT: u32 = 62;

/// The generation after `gen` (6 bits, as `gen_of` returns them). The slot parity is the top
/// bit (bit 62 of the word), so the count runs with that bit as its lowest digit: the
/// parity alternates on every step and the whole field repeats after 64.
pub(super) fn gen_after(generation: u64) -> u64 {
    let parity = generation >> 5;
    let high = generation & 31;
    if parity == 0 {
        generation | 32
    } else {
        (high + 1) & 31
    }
}

#[inline(always)]
pub(super) fn x_of(word: u64) -> u64 {
    word & X_MAX
}

#[inline(always)]
pub(super) fn gen_of(word: u64) -> u64 {
    word >> GEN_SHIFT
}

/// A unit is at most `2^-FINE` ns (see [`crate::scale`]).
pub(super) const FINE: u32 = 4;
/// Units per token under a zero or infinite limit (stored tokens): as many as keep the
/// whole burst within `TAU_MAX` units and `n << k` below 2^63 (2^-23 of a token for the
/// largest burst, 2^-31 up to a burst of 16M).
pub(super) fn stored_k(burst: u32) -> u32 {
    (55 - (32 - burst.leading_zeros())).min(crate::scale::K_MAX)
}

/// Readings up to this many units past the base take the hot path (see *Precision and
/// range*); `tau <= TAU_MAX` is half of it, so a rebased configuration is always in range.
pub(super) const V_HOT: u64 = 1 << 56;
/// How far before `since` a configuration's base lies at most (2^56 ns, 2.3 years).
pub(super) const BASE_BACK: u64 = 1 << 56;

/// `shape` bits: the burst (low 32), `k` (bits 32..38) and the infinite-limit flag.
pub(super) const INF_BIT: u64 = 1 << 40;

/// The scale's `per_shift`, bits 48..56 of `shape`.
#[inline(always)]
pub(super) fn per_shift_of(shape: u64) -> u32 {
    ((shape >> 48) & 0xff) as u32
}

/// Fractional bits of a token coordinate.
pub(super) const COORD_BITS: u32 = 32;
pub(super) const COORD_ONE: f64 = (1u64 << COORD_BITS) as f64;

/// `(x - tau) / one` in coordinate units (2^-32 token). `|x - tau| < 2^58`, so the product
/// stays below 2^90; floored, so that equal unit counts give equal coordinates.
pub(super) fn coord_offset(x: u64, tau: u64, one: u64) -> i128 {
    let d = i128::from(x) - i128::from(tau);
    if one.is_power_of_two() {
        (d << COORD_BITS) >> one.trailing_zeros()
    } else {
        (d << COORD_BITS).div_euclid(i128::from(one))
    }
}

/// The largest `lim` for `base` such that `now.wrapping_sub(base) < lim` holds only for
/// `now >= base`: a reading before the base wraps to at least `2^64 - base`.
pub(super) fn wrap_free(base: u64) -> u64 {
    (u64::MAX - base).saturating_add(1)
}

/// The state word and, beside it, both configurations' slots. A check reads the word and the
/// six hot words of its slot: for parity 0 (every bucket until its first reconfiguration) the
/// first 56 bytes, one cache line when the core starts a line or, in a keyed map's
/// [`Compact`] slot, 8 bytes past one (`Keyed`'s slot state comes first). A grant's CAS takes
/// the word's line exclusive, but every check needs that line anyway; the configuration words
/// in it change only on reconfiguration.
#[repr(C)]
pub(super) struct Core {
    pub(super) state: AtomicU64,
    pub(super) slots: [Slot; 2],
}

/// One configuration's words (see *Configurations* in the module docs), eight to a cache
/// line's worth so that a word's slot is its parity bit shifted to a multiple of 64: the six
/// that every check reads first (its refusal's retry time included), then the two only
/// reservations, cancels and reconfigurations read.
#[derive(Default)]
#[repr(C)]
pub(super) struct Slot {
    /// `base`, negated: the hot path's `now - base` is then one add, not a copy and a
    /// subtract.
    pub(super) neg_base: AtomicU64,
    pub(super) lim: AtomicU64,
    pub(super) mul: AtomicU64,
    pub(super) tau: AtomicU64,
    /// `one | per_shift << 32` (`one <= 2^31`, `src/scale.rs`): two words in one, so that
    /// the hot words stay six.
    pub(super) one_shift: AtomicU64,
    pub(super) per: AtomicU64,
    pub(super) shape: AtomicU64,
    /// `epoch | inf_gen << 32`.
    pub(super) meta: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

/// The rest of a configuration's words: only reconfigurations, cancels and reports read them.
#[derive(Default)]
pub(super) struct ColdSlot {
    pub(super) limit: AtomicU64,
    pub(super) since: AtomicU64,
    pub(super) origin_lo: AtomicU64,
    pub(super) origin_hi: AtomicU64,
}

/// The two halves of one configuration's slot.
#[derive(Clone, Copy)]
pub(super) struct SlotRef<'a> {
    pub(super) slot: &'a Slot,
    pub(super) cold: &'a ColdSlot,
}

impl SlotRef<'_> {
    #[inline(always)]
    pub(super) fn hot(&self) -> Hot {
        let s = self.slot;
        let one_shift = s.one_shift.load(Ordering::Relaxed);
        Hot {
            base: s.neg_base.load(Ordering::Relaxed).wrapping_neg(),
            lim: s.lim.load(Ordering::Relaxed),
            mul: s.mul.load(Ordering::Relaxed),
            tau: s.tau.load(Ordering::Relaxed),
            one: one_shift & u64::from(u32::MAX),
            per_shift: (one_shift >> 32) as u32,
        }
    }

    pub(super) fn cold(&self) -> Cold {
        let (s, c) = (self.slot, self.cold);
        let meta = s.meta.load(Ordering::Relaxed);
        let origin = (u128::from(c.origin_hi.load(Ordering::Relaxed)) << 64
            | u128::from(c.origin_lo.load(Ordering::Relaxed))) as i128;
        let shape = s.shape.load(Ordering::Relaxed);
        Cold {
            shape,
            per: s.per.load(Ordering::Relaxed),
            per_shift: per_shift_of(shape),
            epoch: meta as u32,
            inf_gen: (meta >> 32) as u32,
            limit: f64::from_bits(c.limit.load(Ordering::Relaxed)),
            since: c.since.load(Ordering::Relaxed),
            // i128::MIN stands for "overflowed": no coordinate reaches it (see `coord`).
            origin: (origin != i128::MIN).then_some(origin),
        }
    }

    /// The scale's inverse, `per`: the hot word a refusal's retry time reads last.
    #[inline(always)]
    pub(super) fn per(&self) -> u64 {
        self.slot.per.load(Ordering::Relaxed)
    }

    /// [`Config::time_of`] from the hot words (`per` and `per_shift` among them), for the
    /// inline refusal of a check (`x > tau`, under a limit that refills): the same instant,
    /// or `None` past the end of time.
    #[inline(always)]
    pub(super) fn time_of(&self, hot: &Hot, x: u64) -> Option<Nanos> {
        let ns = crate::scale::nanos_ceil_pos(x - hot.tau, self.per(), hot.per_shift)?;
        ns.checked_add(hot.base).map(Nanos::new)
    }

    pub(super) fn config(&self) -> Config {
        Config {
            hot: self.hot(),
            cold: self.cold(),
        }
    }

    /// Relaxed stores: the writer's fence and CAS order them (module docs, *Orderings*).
    pub(super) fn write(&self, c: &Config) {
        let (s, d, h) = (self.slot, self.cold, &c.hot);
        // `one` shares a word with `per_shift`; a check's refusal relies on `per = 0` for a
        // limit that never refills.
        debug_assert!(h.one <= 1 << 31 && (h.mul == 0) == (c.per == 0));
        s.neg_base.store(h.base.wrapping_neg(), Ordering::Relaxed);
        s.lim.store(h.lim, Ordering::Relaxed);
        s.mul.store(h.mul, Ordering::Relaxed);
        s.tau.store(h.tau, Ordering::Relaxed);
        s.one_shift
            .store(h.one | u64::from(c.per_shift) << 32, Ordering::Relaxed);
        s.shape.store(c.shape, Ordering::Relaxed);
        s.per.store(c.per, Ordering::Relaxed);
        s.meta.store(
            u64::from(c.epoch) | (u64::from(c.inf_gen) << 32),
            Ordering::Relaxed,
        );
        d.limit.store(c.limit.to_bits(), Ordering::Relaxed);
        d.since.store(c.since, Ordering::Relaxed);
        let origin = c.origin.unwrap_or(i128::MIN) as u128;
        d.origin_lo.store(origin as u64, Ordering::Relaxed);
        d.origin_hi.store((origin >> 64) as u64, Ordering::Relaxed);
    }
}

impl<C: Clock, P: Layout> TokenBucket<C, P> {
    /// A full bucket in layout `P`.
    pub(super) fn in_layout(limit: Limit, burst: u32, clock: C) -> Self {
        let cfg = Config::new(0, limit, burst, Nanos::ZERO, 0, Some(0));
        // The bucket starts full: rate.go's tokens = burst with last = the zero time.
        let x = cfg.x_from_tokens(f64::from(burst), Nanos::ZERO);
        let slots = [Slot::default(), Slot::default()];
        let colds = [ColdSlot::default(), ColdSlot::default()];
        SlotRef {
            slot: &slots[0],
            cold: &colds[0],
        }
        .write(&cfg);
        TokenBucket {
            core: P::cell(Core {
                state: AtomicU64::new(x),
                slots,
            }),
            colds,
            reconfig: Mutex::new(()), // see the field: reconfiguration only
            clock,
        }
    }

    /// The slot of `word`'s generation, chosen without a branch (the hot path, `take_then`,
    /// branches on the parity instead, for the processor to predict).
    #[inline(always)]
    pub(super) fn slot(&self, word: u64) -> SlotRef<'_> {
        self.slot_at((word >> PARITY_SHIFT) as usize & 1)
    }

    /// Slot `i`'s two halves.
    #[inline(always)]
    fn slot_at(&self, i: usize) -> SlotRef<'_> {
        SlotRef {
            slot: &self.core.slots[i],
            cold: &self.colds[i],
        }
    }

    /// Whether the configuration read for `word` is still that of the current generation: an
    /// `Acquire` fence, then a reload (see *Orderings* in the module docs). Used by every
    /// outcome that writes nothing.
    #[inline(always)]
    pub(super) fn still_current(&self, word: u64) -> bool {
        fence(Ordering::Acquire);
        gen_of(self.core.state.load(Ordering::Relaxed)) == gen_of(word)
    }

    /// [`TokenBucket::still_current`] for the hot path: the whole word unchanged, which
    /// implies the same generation and costs one compare (a moved word goes the slow way).
    #[inline(always)]
    pub(super) fn unchanged(&self, word: u64) -> bool {
        fence(Ordering::Acquire);
        self.core.state.load(Ordering::Relaxed) == word
    }

    /// The state word and the configuration of its generation, consistent with each other.
    pub(super) fn snapshot(&self) -> (u64, Config) {
        loop {
            let word = self.core.state.load(Ordering::Acquire);
            let cfg = self.slot(word).config();
            if self.still_current(word) {
                return (word, cfg);
            }
        }
    }

    /// The take behind allow, check, reserve and wait: one attempt inline, for the common
    /// cases (in range, granted at once, CAS uncontended; or denied, for `allow`, and for
    /// `check` with its retry time when one exists), and
    /// everything else in [`TokenBucket::take_slow`]. `MODE` says what the caller needs
    /// beyond the verdict: `ALLOW` nothing, `CHECK` a denial's retry time, `RESERVE` the
    /// whole configuration (read before the CAS, so the CAS validates it).
    #[inline(always)]
    pub(super) fn take<const MODE: u8>(&self, now: Nanos, n: u32, max_wait: u64) -> Decision {
        self.take_then::<MODE, _>(now, n, max_wait, |d| d)
    }

    /// [`take`](Self::take), its decision handed to `then` in each branch of the parity, so
    /// that the branches join on `then`'s (small) answer rather than on a `Decision`, which
    /// the compiler would otherwise merge through memory.
    #[inline(always)]
    pub(super) fn take_then<const MODE: u8, R>(
        &self,
        now: Nanos,
        n: u32,
        max_wait: u64,
        then: impl FnOnce(Decision) -> R,
    ) -> R {
        let word = self.core.state.load(Ordering::Acquire);
        // A branch on the parity, not the shift of `slot`: the processor predicts it (the
        // parity changes only on reconfiguration) and reads the slot, and computes the
        // reading's units, while the word is still being loaded. With the slot's address
        // computed from the word, each grant's next load waited on a chain of word, slot
        // and multiply behind the previous grant's CAS.
        if word & (1 << PARITY_SHIFT) == 0 {
            then(self.take_in::<MODE>(word, self.slot_at(0), now, n, max_wait))
        } else {
            then(self.take_in::<MODE>(word, self.slot_at(1), now, n, max_wait))
        }
    }

    /// [`take`](Self::take) of `word`, whose generation's slot is `slot`.
    #[inline(always)]
    fn take_in<const MODE: u8>(
        &self,
        word: u64,
        slot: SlotRef<'_>,
        now: Nanos,
        n: u32,
        max_wait: u64,
    ) -> Decision {
        let hot = slot.hot();
        let d = now.as_u64().wrapping_sub(hot.base);
        // Also sends readings before the base, and every check under an infinite limit
        // (`lim = 0`), to the slow path.
        if d < hot.lim {
            // The verdict, `max(x, v) + n * one <= v + tau`, split in two so that the
            // word's path to it is one add and one compare: `x2 = x + n * one` (the state a
            // refusal is retried against) and `need` come from the word, `v + tau` from the
            // reading alone. x < 2^57, n * one < 2^63 and v + tau < 2^57: no sum overflows;
            // `need <= tau` also proves n <= burst, so no branch tests the burst.
            let need = u64::from(n) * hot.one;
            let x2 = x_of(word) + need;
            // Where a check's refusal computes its retry time depends on when the reading
            // arrives. A check that reads the clock itself (`CHECK_NOW`) waits for the clock
            // far longer than for the word: it computes the retry time from the word while
            // the clock is read, and a reading two nanoseconds or more before it is refused
            // with one subtract and one compare, no units. A check handed its time (`CHECK`)
            // has the reading at once: it decides the verdict first and computes the retry
            // time only when refused, since a grant's CAS issues only once every branch ahead
            // of it has resolved, and a branch on the retry time (a multiply behind the
            // word's load) would hold each grant back by it. (A refused `n <= burst` has
            // `x >= v`, since from `x < v` the take ends at `v + n * one <= v + tau`, granted;
            // so `x2` is the state the slow path would retry against. A retry time past the
            // end of time, and a request no burst holds, go the slow way, which says
            // "never".)
            let early = if MODE == CHECK_NOW && x2 > hot.tau && x2 <= X_MAX && need <= hot.tau {
                if hot.per_shift >= 64 {
                    // `time_of`, split where a unit is under a nanosecond: `ns` is the
                    // ceiling of the exact instant after the base (`per` is exact or high by
                    // 2^-63 of itself), and `units` overshoots by under a quarter unit for
                    // `d < lim` (`d * 2^-58` units, `src/scale.rs`). A reading two
                    // nanoseconds or more before the retry time, `d < ns - 1` (`d` is
                    // `now - base` exactly here, and the comparison cannot overflow where
                    // `base + ns` would), therefore holds fewer units than `x2 - tau`:
                    // refused, with no units computed. The last nanosecond takes the exact
                    // comparison below.
                    let per = slot.per();
                    let ns = crate::scale::nanos_ceil_pos_fine(x2 - hot.tau, per, hot.per_shift);
                    let retry = ns.checked_add(hot.base).map(Nanos::new);
                    if d < ns - 1 && retry.is_some() && self.unchanged(word) {
                        return Decision::Denied {
                            retry_at: retry,
                            limit: 0.0,
                        };
                    }
                    retry
                } else {
                    // Coarser units: the exact comparison below decides.
                    slot.time_of(&hot, x2)
                }
            } else {
                None
            };
            let v = hot.units(d);
            let fits = x2 <= v + hot.tau && need <= hot.tau;
            if fits && n != 0 {
                // In the word's own coordinates (its generation bits on top), so that the
                // generation is not put back: `new = gw + max(x, v) + n * one`, with
                // gw <= 2^63 - 2^57 (bit 63 clear): no sum overflows.
                let gw = word & GEN_MASK;
                let new = word.max(gw + v) + need;
                let cold = if MODE == RESERVE {
                    slot.cold()
                } else {
                    Cold::default()
                };
                if self
                    .core
                    .state
                    .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Decision::Granted {
                        x: new - gw,
                        due: v + hot.tau,
                        took: true,
                        cfg: Config { hot, cold },
                    };
                }
            } else if !fits && MODE == ALLOW && self.unchanged(word) {
                return Decision::Denied {
                    retry_at: None,
                    limit: 0.0,
                };
            } else if !fits && (MODE == CHECK || MODE == CHECK_NOW) {
                // Refused: granted once `u` reaches `x2` (`SlotRef::time_of`; `x2 > v + tau
                // >= tau`, so `x2 - tau` is at least one unit).
                let retry = if MODE == CHECK_NOW {
                    early
                } else if need <= hot.tau && x2 <= X_MAX {
                    slot.time_of(&hot, x2)
                } else {
                    None
                };
                if let Some(retry_at) = retry {
                    if self.unchanged(word) {
                        return Decision::Denied {
                            retry_at: Some(retry_at),
                            limit: 0.0,
                        };
                    }
                }
            }
        }
        self.take_slow::<MODE>(now, n, max_wait)
    }

    /// Every case of a take, in a CAS loop with backoff: contention, waits, zero-token
    /// requests, infinite and zero limits, readings before the base, and rebasing.
    #[inline(never)]
    pub(super) fn take_slow<const MODE: u8>(&self, now: Nanos, n: u32, max_wait: u64) -> Decision {
        let backoff = Backoff::new();
        let mut word = self.core.state.load(Ordering::Acquire);
        loop {
            let cfg = self.slot(word).config();
            match cfg.check(x_of(word), now, n, max_wait) {
                Check::Take { x, due } if n != 0 => {
                    match self.core.state.compare_exchange_weak(
                        word,
                        (word & GEN_MASK) | x,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            return Decision::Granted {
                                x,
                                due,
                                took: true,
                                cfg,
                            }
                        }
                        Err(current) => {
                            backoff.spin();
                            word = current;
                            continue;
                        }
                    }
                }
                // Nothing to take: the answer stands on the load alone.
                Check::Take { x, due } => {
                    if self.still_current(word) {
                        return Decision::Granted {
                            x,
                            due,
                            took: false,
                            cfg,
                        };
                    }
                }
                Check::Free => {
                    if self.still_current(word) {
                        let due = cfg.hot.tau;
                        return Decision::Granted {
                            x: due,
                            due,
                            took: false,
                            cfg,
                        };
                    }
                }
                Check::Wait { need } => {
                    if self.still_current(word) {
                        let retry_at = if MODE == ALLOW {
                            None
                        } else {
                            cfg.time_of(need)
                        };
                        return Decision::Denied {
                            retry_at,
                            limit: cfg.limit,
                        };
                    }
                }
                Check::Never => {
                    if self.still_current(word) {
                        return Decision::Denied {
                            retry_at: None,
                            limit: cfg.limit,
                        };
                    }
                }
                Check::Far => self.rebase(now),
            }
            // The configuration moved under us (or a rebase ran): start again from the word.
            word = self.core.state.load(Ordering::Acquire);
        }
    }

    pub(super) fn cancel(&self, r: &Ticket, now: Nanos) {
        // rate.go's CancelAt checks, in its order (the limit check is inside the loop).
        if !r.ok || !r.took || r.tokens == 0 || r.time_to_act < now {
            return;
        }
        let backoff = Backoff::new();
        let mut word = self.core.state.load(Ordering::Acquire);
        loop {
            let cfg = self.slot(word).config();
            let x = x_of(word);
            let new = if cfg.is_inf() || r.inf_gen != cfg.inf_gen {
                // rate.go does nothing under an infinite limit; after an infinite refill the
                // bucket already holds what `r` took.
                None
            } else if cfg.is_far(now) {
                self.rebase(now);
                word = self.core.state.load(Ordering::Acquire);
                continue;
            } else {
                cfg.give_back(x, r)
                    .and_then(|back| cfg.restore(x, now, back))
            };
            match self.commit_x(word, new, &backoff) {
                None => return,
                Some(current) => word = current,
            }
        }
    }

    /// [`Limiter::refund_n_at`]: the CAS loop of *Refunds* (module docs). Reads only the hot
    /// words; like a grant, it commits with a CAS on the whole word, so the slot it read is
    /// its generation's; a refund that changes nothing (an infinite limit, a full bucket)
    /// writes nothing and validates its load like a denial.
    pub(super) fn refund(&self, now: Nanos, n: u32) {
        if n == 0 {
            return;
        }
        let backoff = Backoff::new();
        let mut word = self.core.state.load(Ordering::Acquire);
        loop {
            let cfg = self.slot(word).config();
            let hot = cfg.hot;
            let new_x = if cfg.is_inf() {
                // An infinite limit: the check took nothing.
                None
            } else {
                let d = now.as_u64().saturating_sub(hot.base);
                if hot.mul != 0 && d >= hot.lim {
                    // Past the hot range (`mod.rs`, *Precision and range*): rebase, then again.
                    self.rebase(now);
                    word = self.core.state.load(Ordering::Acquire);
                    continue;
                }
                // u(now) - tau: the state of a full bucket at `now` (0 units under a zero
                // limit, where nothing refills; a reading before the base counts as the base).
                let full = hot.units(d);
                let x = x_of(word);
                // tokens' = min(burst, tokens(now) + n)  <=>  x' = max(x - n * one, full).
                let x2 = x.saturating_sub(u64::from(n) * hot.one).max(full);
                (x2 < x).then_some(x2)
            };
            match self.commit_x(word, new_x, &backoff) {
                None => return,
                Some(current) => word = current,
            }
        }
    }

    /// The commit step `cancel` and `refund` share: writes `new_x` into `word` under its
    /// generation with one CAS or, when there is nothing to write, validates the load as a
    /// denial does (the slot it read must still be the word's). `None` when done; otherwise
    /// the word to run the loop again from.
    #[inline]
    pub(super) fn commit_x(&self, word: u64, new_x: Option<u64>, backoff: &Backoff) -> Option<u64> {
        let Some(new_x) = new_x else {
            return if self.still_current(word) {
                None
            } else {
                Some(self.core.state.load(Ordering::Acquire))
            };
        };
        match self.core.state.compare_exchange_weak(
            word,
            (word & GEN_MASK) | new_x,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => None,
            Err(current) => {
                backoff.spin();
                Some(current)
            }
        }
    }

    /// Re-expresses the state in a configuration based at `now`, if `now` is past the hot
    /// range of the current one (`mod.rs`, *Precision and range*). Off the hot path: at most once
    /// per ~two weeks of readings, or after a jump of the caller's times.
    #[cold]
    #[inline(never)]
    pub(super) fn rebase(&self, now: Nanos) {
        let _writer = self.reconfig.lock().unwrap_or_else(|e| e.into_inner()); // off the hot path: a rebase is a rare reconfiguration
        let (_, cur) = self.snapshot();
        if cur.is_far(now) {
            self.reconfigure_locked(now, None, |cfg| (Limit::from_valid(cfg.limit), cfg.burst()));
        }
    }

    /// Installs the configuration `f` returns, at `now`; with `fill`, the bucket then holds
    /// that many tokens instead of the ones it had.
    pub(super) fn reconfigure(
        &self,
        now: Nanos,
        fill: Option<f64>,
        f: impl Fn(&Config) -> (Limit, u32),
    ) {
        // Off the hot path: serializes reconfigurations among themselves so that only one
        // writer ever touches the spare slot. allow/reserve/cancel never take this lock.
        let _writer = self.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        self.reconfigure_locked(now, fill, f)
    }

    pub(super) fn reconfigure_locked(
        &self,
        now: Nanos,
        fill: Option<f64>,
        f: impl Fn(&Config) -> (Limit, u32),
    ) {
        let backoff = Backoff::new();
        let mut word = self.core.state.load(Ordering::Acquire);
        loop {
            // Only this writer changes generations, so the slot of `word` is intact.
            let cur = self.slot(word).config();
            let (limit, burst) = f(&cur);
            let x = x_of(word);
            let tokens = fill.unwrap_or_else(|| cur.tokens(x, now));
            let mut next = Config::new(
                cur.epoch.wrapping_add(1),
                limit,
                burst,
                now,
                cur.inf_gen_after(now),
                None,
            );
            next.fit(tokens);
            let new_x = next.x_from_tokens(tokens, now);
            // The new configuration's coordinates continue the old ones: the state keeps its
            // coordinate, so a cancel still counts exactly the tokens taken since a reservation.
            next.cold.origin = cur
                .coord(x)
                .and_then(|c| c.checked_sub(next.coord_offset(new_x)));
            let generation = gen_after(gen_of(word));
            // The slot of `gen` was last that of `gen - 2`; a reader still holding such a word
            // must see `gen - 1` on its validating reload if it reads any word written here.
            fence(Ordering::Release);
            // The slot of the word this CAS installs.
            self.slot(generation << GEN_SHIFT).write(&next);
            match self.core.state.compare_exchange_weak(
                word,
                (generation << GEN_SHIFT) | new_x,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(current) => {
                    backoff.spin();
                    word = current;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Idle, Limiter};

    /// `born_at` (a keyed map's new bucket) leaves the configuration in slot 0, the one in
    /// the line a keyed map's check loads first, and the bucket as a reconfiguration at the
    /// birth time leaves it.
    #[test]
    pub(super) fn born_at_leaves_the_configuration_in_slot_zero() {
        let limit = Limit::per_second(10.0).unwrap();
        let mut tb = TokenBucket::builder(limit, 2)
            .clock(crate::ManualClock::default())
            .build_compact();
        let born = Nanos::new(5_000_000_000);
        tb.born_at(born);
        let word = tb.core.state.load(Ordering::Relaxed);
        assert_eq!((word >> PARITY_SHIFT) & 1, 0, "word {word:#x}");
        let cfg = tb.slot(word).config();
        assert_eq!(
            (cfg.since, cfg.burst(), cfg.limit),
            (born.as_u64(), 2, 10.0)
        );
        assert!(tb.check_n_at(born, 2).is_ok() && tb.check_n_at(born, 1).is_err());
    }

    /// The generation count visits all 64 values before it repeats, its parity (the slot)
    /// alternates on every step, and a word built from any of them keeps bit 63 clear.
    #[test]
    pub(super) fn generations_cycle_through_64_with_alternating_parity() {
        let mut seen = [false; 64];
        let mut generation = 0;
        for step in 0..64 {
            assert!(
                !seen[generation as usize],
                "generation {generation} repeats at step {step}"
            );
            seen[generation as usize] = true;
            let word = (generation << GEN_SHIFT) | X_MAX;
            assert_eq!(word >> 63, 0, "generation {generation} sets bit 63");
            assert_eq!(word & GEN_MASK, generation << GEN_SHIFT);
            let next = gen_after(generation);
            assert_ne!(
                next >> 5,
                generation >> 5,
                "parity stays at {generation} -> {next}"
            );
            assert_eq!((word >> PARITY_SHIFT) & 1, generation >> 5);
            generation = next;
        }
        assert_eq!(generation, 0);
    }
}
