//! The multi-limit word: one to four GCRA limits in the low 123 bits of a `u128`, and the
//! arithmetic of a check on it. Pure functions of a word, a configuration and a reading: the
//! standalone limiter (`engine.rs`) and the keyed map (`src/keyed/multi_token_bucket.rs`)
//! apply them with one CAS.
//!
//! # The representation
//! Limit `i` is a GCRA bucket of `burst_i` tokens refilling at `limit_i`: its state is its
//! *theoretical arrival time* `tat_i`, the time at which it is (or was) empty ignoring the cap.
//! A check of `n` at `t` takes `tat_i' = max(tat_i, t) + n * T_i` of **every** limit and is
//! granted iff `tat_i' <= t + tau_i` for **every** `i` (`T_i = 1 / limit_i`, `tau_i = burst_i *
//! T_i`): all limits or none, decided on one word.
//!
//! **Grids.** Each limit counts time on a fixed grid of its own, anchored at the limiter's
//! base: `u_i(t) = floor((t - base) / g_i)`, with `T_i = one_i * g_i` **exactly** (`one_i =
//! 2^k_i`, `src/scale.rs`), so grants add exact multiples of `one_i` and never drift, whatever
//! their number. The only rounding is the reading's: a reading counts as up to one grid unit
//! `g_i` earlier than it is (fewer tokens, never more).
//!
//! **Two layouts.** One or two limits store their arrival times themselves (*wide*); three or
//! four store them as offsets from a shared anchor (*anchored*). The wide layout is the
//! shorter check (no anchor to convert), which is why the common cases get it.
//!
//! * **Wide** (`k <= 2`): limit `i`'s field, at bit `64 * i`, is `tat_i`: 59 bits, enough for
//!   every reading of the range and two bursts on top (`u_i(T_MAX) + 2 * tau_i < 2^59`), so
//!   that `tat_i + n * one_i` for any check of at most the burst fits it, granted or not.
//! * **Anchored** (`k = 3, 4`): storing four full arrival times would take four 59-bit fields.
//!   But every grant sets `tat_i >= u_i(t)` and no grant passes `tat_i <= u_i(t) + tau_i`, so
//!   after the latest grant, at `t_max`, every `tat_i` lies in `[u_i(t_max), u_i(t_max) +
//!   tau_i]`: the word stores `t_max` once, coarsely, as `w = floor(t_max / G)` with `G =
//!   2^20` ns (about a millisecond), and each limit as its offset `d_i = tat_i - a_i(w)` from
//!   its anchor `a_i(w) = u_i(w * G)` on its own grid. The anchor is a fixed function of `w`,
//!   so moving `w` forward re-expresses each `d_i` exactly (`d_i' = tat_i' - a_i(w')`,
//!   integers): the coarse anchor costs bits, never precision. `0 <= d_i <= tau_i + u_i(G) +
//!   1` (the grid units of one `G`), which is what a field must hold.
//!
//!   A reading `t` counts, on limit `i`'s grid, as the anchor of its own grain plus the units
//!   since it: `u_i'(t) = a_i(floor(t / G)) + u_i(t mod G)`. Within the word's grain (a busy
//!   limiter's every check) that is the offset `r_i = u_i(t mod G)` from the stored anchor,
//!   so a check compares and packs offsets as they are: one multiply per limit. Two roundings
//!   down make `u_i'(t)` up to one unit less than `u_i(t)`, still monotonic in `t`; where `G`
//!   is a whole number of units they are equal.
//!
//! ```text
//!  wide, k = 1, 2:
//!  127..123   122..64           63..59   58..0
//! [ owner ][ tat_1: 59 bits ][   0   ][ tat_0: 59 bits ]
//!
//!  anchored, k = 3, 4:
//!  127..123   122..85            84..0
//! [ owner ][ w: 38 bits ][ d_{k-1} .. d_1 d_0: F bits each, d_0 lowest ]
//!   F = 28, 21 bits for k = 3, 4 limits
//!
//!   owner: the standalone limiter's epoch, or the keyed map's flag and quota tag
//! ```
//!
//! **Precision.** Each limit's grid unit is the finest power-of-two fraction of its token
//! interval that fits its field, and never finer than the nanosecond (the 64-bit conversion's
//! range). Wide, that is a few nanoseconds (1 ns for a 20/s limit, 5 ns for 10 000/day), and
//! a rate above about 1.9e9/s does not fit (a unit may not exceed a token). Anchored, it
//! keeps `burst_i * one_i + u_i(G) + 2 < 2^F`: among four limits (21-bit fields), a 20/s
//! limit with burst 40 counts in units of 1.5 µs, a 10 000/day limit in units of 67.5 ms.
//! A reading is rounded down to the unit (wide) or up to two (anchored), and a retry time up
//! to the nanosecond, so a limit admits at most one unit late (wide) or two (anchored), and
//! never early. [`MultiTokenBucket::precision`] reports that bound for each limit.
//!
//! **Range.** Readings up to 2^58 ns (9.1 years) past the base (`w` holds 2^38 intervals of
//! 2^20 ns; a wide field every reading's units). Past that, time stands still for the word:
//! each limit grants at most its burst more and then refuses (it fails closed).
//!
//! **Budget.** `tat_i` never decreases, each grant adds `n * one_i`, and a grant at `t` needs
//! `tat_i' <= u_i(t) + tau_i`; so over any readings `[a, b]` limit `i` grants at most
//! `burst_i + limit_i * (b - a)` (plus one unit, two anchored), whatever order the readings
//! arrive in: a stale reading only finds a smaller `u_i`, so fewer tokens. All limits hold together,
//! since a grant is one word.
//!
//! [`MultiTokenBucket::precision`]: super::MultiTokenBucket::precision

use crate::clock::Nanos;
use crate::limit::Limit;
use crate::limiter::QuotaStatus;
use crate::scale::{nanos_ceil_pos, units, Scale, D_MAX, J};
use crate::sync::keep_branch;

use std::time::Duration;

/// A retry time that never comes: past the burst (or past `u64` nanoseconds, 584 years).
pub(crate) const NEVER: u64 = u64::MAX;

/// The most limits one word holds.
pub(crate) const MAX_LIMITS: usize = 4;

/// The bits of the word the arithmetic owns; the top five are its owner's.
pub(crate) const X_BITS: u32 = 123;
pub(crate) const X_MASK: u128 = (1 << X_BITS) - 1;

/// `G = 2^G_SHIFT` ns: the anchor's grain.
const G_SHIFT: u32 = 20;
const G_MASK: u64 = (1 << G_SHIFT) - 1;
const W_BITS: u32 = 38;
const W_MASK: u64 = (1 << W_BITS) - 1;
/// The offsets' bits, below `w`.
const FIELDS: u32 = X_BITS - W_BITS;
const _: () = assert!(FIELDS == 85);
/// The largest reading (ns past the base) the word tells apart: `w` fits its bits, and
/// `units` its argument.
pub(crate) const T_MAX: u64 = D_MAX;
const _: () = assert!(T_MAX >> G_SHIFT <= W_MASK);

/// The most limits the wide layout holds, and its fields: 59 bits at bits 0 and 64.
const WIDE: usize = 2;
const WIDE_BITS: u32 = 59;
const WIDE_MASK: u64 = (1 << WIDE_BITS) - 1;
const _: () = assert!(64 + WIDE_BITS == X_BITS);

/// Each limit's field bits for `k` limits.
pub(crate) const fn field_bits(k: usize) -> u32 {
    if k <= WIDE {
        WIDE_BITS
    } else {
        FIELDS / k as u32
    }
}

/// The lowest bit of limit `i`'s field among `k` limits.
#[inline(always)]
const fn field_at(i: usize, k: usize) -> u32 {
    if k <= WIDE {
        64 * i as u32
    } else {
        i as u32 * FIELDS / k as u32
    }
}

/// One limit of a word: its scale and whole burst in units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Lim {
    /// Units per ns, times `2^58` (`src/scale.rs`).
    pub(crate) mul: u64,
    /// Units per token.
    pub(crate) one: u64,
    /// `burst * one`.
    pub(crate) tau: u64,
    /// Ns per unit, times `2^per_shift`, rounded up: for retry times.
    pub(crate) per: u64,
    pub(crate) per_shift: u32,
    pub(crate) burst: u32,
    /// The configured rate, for readers.
    pub(crate) limit: Limit,
}

impl Lim {
    /// No limit: the slots' words past a configuration's last limit.
    pub(crate) const EMPTY: Lim = Lim {
        mul: 0,
        one: 0,
        tau: 0,
        per: 0,
        per_shift: 0,
        burst: 0,
        limit: Limit::ZERO,
    };

    /// The limit of `limit` and `burst` among `k` limits, or `None` if no grid makes it fit
    /// its field (a rate too high for the field's range, or a burst past it).
    pub(crate) fn new(limit: Limit, burst: u32, k: usize) -> Option<Lim> {
        if burst == 0 || limit.is_inf() || limit.as_f64() <= 0.0 {
            return None;
        }
        // The finest the 64-bit conversion takes: a unit of at most a nanosecond.
        let finest = Scale::new(limit, burst, 0)?;
        let room = 1u128 << field_bits(k);
        // What a field holds beside the burst: every reading (wide), or one anchor grain.
        // A wide field holds two bursts, so that a refused check's `tat'` fits it too.
        let (span, bursts) = if k <= WIDE {
            (T_MAX, 2)
        } else {
            (1 << G_SHIFT, 1)
        };
        let fits = |s: &Scale| {
            bursts * u128::from(burst) * u128::from(s.one) + s.units_wide(span) + 3 <= room
                && s.mul <= finest.mul
        };
        if fits(&finest) {
            return Some(Lim::of(limit, burst, finest));
        }
        (0..=40u32)
            .rev()
            .filter_map(|k| Scale::with_k(limit, k))
            .find(fits)
            .map(|s| Lim::of(limit, burst, s))
    }

    fn of(limit: Limit, burst: u32, s: Scale) -> Lim {
        Lim {
            mul: s.mul,
            one: s.one,
            tau: u64::from(burst) * s.one,
            per: s.per,
            per_shift: s.per_shift,
            burst,
            limit,
        }
    }

    /// `u_i(t)`: the grid units in `t <= T_MAX` ns past the base.
    #[inline(always)]
    fn u(&self, t: u64) -> u64 {
        units(t, self.mul)
    }

    /// The anchor `a_i(w)`.
    #[inline(always)]
    fn a(&self, w: u64) -> u64 {
        units(w << G_SHIFT, self.mul)
    }

    /// Ns for `u >= 1` units, rounded up (`None` past `u64`).
    fn ns(&self, u: u64) -> Option<u64> {
        if u == 0 {
            Some(0)
        } else {
            nanos_ceil_pos(u, self.per, self.per_shift)
        }
    }

    /// The grid unit.
    pub(crate) fn unit(&self) -> Duration {
        Duration::from_nanos(self.ns(1).unwrap_or(u64::MAX))
    }
}

/// A word's configuration: `k` limits, the first `k` of `lims`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Limits {
    pub(crate) k: usize,
    /// `k == 2`, kept apart so that a check tests it first, on its own, where a test of `k`
    /// joins the others in one switch.
    pub(crate) two: bool,
    /// The smallest burst: a check of more can never pass.
    pub(crate) min_burst: u32,
    pub(crate) lims: [Lim; MAX_LIMITS],
}

/// What a check decided.
pub(crate) enum Verdict {
    /// Granted: the word after the grant, the owner's bits as they were.
    Grant(u128),
    /// Granted without a write (`n == 0`).
    Free,
    /// Refused: limit `by` admits last, all admit at `retry` ns past the base ([`NEVER`]:
    /// never, `n` is past limit `by`'s burst).
    Deny { by: usize, retry: u64 },
}

/// Where a check reads its configuration: a [`Limits`] (the keyed map's quota), or the
/// standalone bucket's slot words, loaded one by one so that a check reads only what it
/// needs: the three hot words of each of its limits (a grant of two limits, one full, only
/// two of that one), and a refusal two more of each.
pub(crate) trait Source {
    /// The number of limits, in `1..=4`, the smallest burst, and whether there are two (the
    /// common case, which a check tests for first).
    fn head(&self) -> (usize, u32, bool);
    /// Limit `i`'s `mul` and `one`.
    fn grid(&self, i: usize) -> (u64, u64);
    /// Limit `i`'s `tau`.
    fn tau(&self, i: usize) -> u64;
    /// Limit `i`'s `mul`, `one` and `tau`.
    #[inline(always)]
    fn hot(&self, i: usize) -> (u64, u64, u64) {
        let (mul, one) = self.grid(i);
        (mul, one, self.tau(i))
    }
    /// Limit `i`'s `per`, `per_shift` and `burst`.
    fn cold(&self, i: usize) -> (u64, u32, u32);
}

impl Source for Limits {
    #[inline(always)]
    fn head(&self) -> (usize, u32, bool) {
        (self.k, self.min_burst, self.two)
    }

    #[inline(always)]
    fn grid(&self, i: usize) -> (u64, u64) {
        (self.lims[i].mul, self.lims[i].one)
    }

    #[inline(always)]
    fn tau(&self, i: usize) -> u64 {
        self.lims[i].tau
    }

    #[inline(always)]
    fn cold(&self, i: usize) -> (u64, u32, u32) {
        let l = &self.lims[i];
        (l.per, l.per_shift, l.burst)
    }
}

/// `units` of a reading already shifted by `J`: the high half of `(d << J) * mul`.
#[inline(always)]
fn hi(dj: u64, mul: u64) -> u64 {
    ((u128::from(dj) * u128::from(mul)) >> 64) as u64
}

/// A check of `n` at `t` ns past the base on the word `x`, under the configuration `s` gives.
/// The owner's bits (above [`X_BITS`]) are passed into a grant's word as they are.
#[inline(always)]
pub(crate) fn check<S: Source>(s: &S, x: u128, t: u64, n: u32) -> Verdict {
    debug_assert!(t <= T_MAX);
    let (k, min_burst, two) = s.head();
    // One compare for both: `n == 0` wraps past every burst (`min_burst >= 1`). None for a
    // check of one (`allow`, a constant once inlined): every burst is at least one.
    if n != 1 && n.wrapping_sub(1) >= min_burst {
        return if n == 0 {
            Verdict::Free
        } else {
            never(s, k, n)
        };
    }
    // Two limits by a test of their own, not a jump table over `k`.
    if two {
        keep_branch();
        return check_wide::<2, S>(s, x, t, n);
    }
    match k {
        1 => check_wide::<1, S>(s, x, t, n),
        3 => check_anchored::<3, S>(s, x, t, n),
        _ => check_anchored::<4, S>(s, x, t, n),
    }
}

/// A clock reading `now` as the word's reading past `base`: a reading before the base counts
/// as the base, one past the word's range as its end. A branch, not a clamp, on the way from
/// the clock to the CAS ([`keep_branch`]).
#[inline(always)]
pub(crate) fn reading(now: u64, base: u64) -> u64 {
    let t = now.wrapping_sub(base);
    if t > T_MAX {
        return reading_far(now, base);
    }
    t
}

#[cold]
#[inline(never)]
fn reading_far(now: u64, base: u64) -> u64 {
    now.saturating_sub(base).min(T_MAX)
}

/// The hot path of up to two limits (`n` in `1..=min_burst`, `t <= T_MAX`): each field is
/// its limit's `tat`, and each 64-bit half of the word holds one. Limit 1's half is read,
/// compared and written back whole, the owner's bits above its field included, with its
/// reading `u` raised by the same bits (a field's values stay below them): so a grant is the
/// two halves as computed, nothing masked out or packed back. Limit 0's half has no bits above
/// its field (clear in every word a grant or `pack` writes).
///
/// A limit whose `tat` is at most `u` (full, or refilled since) admits `n` without a test,
/// since `n` is at most its burst; one that is draining refuses if `tat' > u + tau`, where
/// `tat'` fits its field (a wide field holds two bursts) and so cannot carry into the
/// owner's bits. Wrapping arithmetic: a torn configuration read (discarded afterwards by its
/// validation) must not panic; a real one never wraps (the module docs' bounds).
#[inline(always)]
fn check_wide<const K: usize, S: Source>(s: &S, x: u128, t: u64, n: u32) -> Verdict {
    let tj = t << J;
    let half = [x as u64, (x >> 64) as u64];
    let above = |i: usize| if i == 0 { 0 } else { half[1] & !WIDE_MASK };
    // Each limit's `u` and `n` in its units, `u` raised by the bits above its field.
    let mut at = [(0u64, 0u64); K];
    for (i, at) in at.iter_mut().enumerate() {
        let (mul, one) = s.grid(i);
        *at = (hi(tj, mul) | above(i), u64::from(n).wrapping_mul(one));
    }
    let mut out = half;
    for (i, &(u, take)) in at.iter().enumerate() {
        out[i] = if half[i] > u {
            keep_branch();
            let tat = half[i].wrapping_add(take);
            if tat > u.wrapping_add(s.tau(i)) {
                keep_branch();
                let need: [(u64, u64); K] = std::array::from_fn(|i| {
                    let ((u, take), a) = (at[i], above(i));
                    let tat = later(half[i], u).wrapping_add(take);
                    (
                        tat.wrapping_sub(a),
                        u.wrapping_sub(a).wrapping_add(s.tau(i)),
                    )
                });
                return refused::<S, false>(s, &need, t);
            }
            tat
        } else {
            u.wrapping_add(take)
        };
    }
    Verdict::Grant(u128::from(out[1]) << 64 | u128::from(out[0]))
}

/// The hot path of three or four limits (`n` in `1..=min_burst`, `t <= T_MAX`): each field
/// is its limit's offset from the anchor. A reading in the anchor's own grain (a word checked
/// again within the grain: a busy limiter) is its offset `r_i` from the anchor already, so
/// the offsets compare and pack as they are. Wrapping as [`check_wide`].
#[inline(always)]
fn check_anchored<const K: usize, S: Source>(s: &S, x: u128, t: u64, n: u32) -> Verdict {
    let w = (x >> FIELDS) as u64 & W_MASK;
    if t >> G_SHIFT != w {
        return check_moved::<K, S>(s, x, t, n, w);
    }
    let mask = (1u64 << field_bits(K)) - 1;
    let rj = (t & G_MASK) << J;
    let mut need = [(0u64, 0u64); K];
    for (i, need) in need.iter_mut().enumerate() {
        let (mul, one, tau) = s.hot(i);
        let r = hi(rj, mul);
        let d = (x >> field_at(i, K)) as u64 & mask;
        let tat = later(d, r).wrapping_add(u64::from(n).wrapping_mul(one));
        let limit = r.wrapping_add(tau);
        *need = (tat, limit);
    }
    if refuses(&need) {
        return refused::<S, true>(s, &need, t);
    }
    let mut out = Halves::of(x & !((1 << FIELDS) - 1));
    for (i, &(tat, _)) in need.iter().enumerate() {
        out.put(tat, field_at(i, K), field_bits(K));
    }
    Verdict::Grant(out.whole())
}

/// [`check_anchored`] at a reading outside the anchor's grain `w`: later (the anchor moves
/// to the reading's grain), or earlier (a stale reading; the anchor stays). Arrival times in
/// units from the base, then re-expressed from the anchor kept.
#[inline(always)]
fn check_moved<const K: usize, S: Source>(s: &S, x: u128, t: u64, n: u32, w: u64) -> Verdict {
    let mask = (1u64 << field_bits(K)) - 1;
    let wr = t >> G_SHIFT;
    let w2 = w.max(wr);
    let (wj, wrj, rj) = (w << (G_SHIFT + J), wr << (G_SHIFT + J), (t & G_MASK) << J);
    // Each limit's `tat'` and `u + tau` from the reading's anchor, and the kept anchor's
    // offset from it: decided first, packed only for a grant.
    let mut need = [(0u64, 0u64); K];
    let mut kept = [0u64; K];
    for i in 0..K {
        let (mul, one, tau) = s.hot(i);
        let (a, ar) = (hi(wj, mul), hi(wrj, mul));
        let d = (x >> field_at(i, K)) as u64 & mask;
        let u = ar.wrapping_add(hi(rj, mul));
        let tat = later(a.wrapping_add(d), u).wrapping_add(u64::from(n).wrapping_mul(one));
        let limit = u.wrapping_add(tau);
        need[i] = (tat.wrapping_sub(ar), limit.wrapping_sub(ar));
        kept[i] = if w2 == w { a.wrapping_sub(ar) } else { 0 };
    }
    if refuses(&need) {
        return refused::<S, true>(s, &need, t);
    }
    let mut out = Halves::of(u128::from(w2) << FIELDS | (x & !X_MASK));
    for i in 0..K {
        out.put(
            need[i].0.wrapping_sub(kept[i]),
            field_at(i, K),
            field_bits(K),
        );
    }
    Verdict::Grant(out.whole())
}

/// A word built as its two 64-bit halves: a field `put` whole into the half it lies in (or
/// split across both), where a `u128` shift of a `u64` would also carry the bits the field
/// never has into the high half.
struct Halves {
    lo: u64,
    hi: u64,
}

impl Halves {
    #[inline(always)]
    fn of(x: u128) -> Halves {
        Halves {
            lo: x as u64,
            hi: (x >> 64) as u64,
        }
    }

    /// Ors in `v`, which fits its `bits`, at bit `at` (constants once unrolled).
    #[inline(always)]
    fn put(&mut self, v: u64, at: u32, bits: u32) {
        if at >= 64 {
            self.hi |= v << (at - 64);
        } else {
            self.lo |= v << at;
            if at + bits > 64 {
                self.hi |= v >> (64 - at);
            }
        }
    }

    #[inline(always)]
    fn whole(&self) -> u128 {
        u128::from(self.hi) << 64 | u128::from(self.lo)
    }
}

/// Whether some limit refuses (`tat_i' > u_i + tau_i`): a branch per limit, not an or of
/// flags. A 128-bit CAS is issued only once every instruction before it has run, so a chain
/// of flags (with four limits, spilled to the stack) would delay every grant's CAS, where
/// predicted branches delay nothing ([`keep_branch`]).
#[inline(always)]
fn refuses(need: &[(u64, u64)]) -> bool {
    for &(tat, limit) in need {
        if tat > limit {
            keep_branch();
            return true;
        }
    }
    false
}

/// `max(tat, u)` by a branch ([`keep_branch`]). Which is later depends on the workload (a
/// limit that is full, or one being drained), which the branch predictor learns per limit;
/// predicted, a full limit's new `tat` waits only for the clock, not for the loaded word.
#[inline(always)]
fn later(tat: u64, u: u64) -> u64 {
    if tat > u {
        keep_branch();
        tat
    } else {
        u
    }
}

/// A refusal with `need[i] = (tat_i', u_i + tau_i)` for a check of at most every burst: the
/// limit that admits last and when, from the limits that refused (`tat_i' > u_i + tau_i`),
/// each of which admits once `u_i` reaches `tat_i' - tau_i`. Wide, the units count from the
/// base; anchored (`ANCHORED`), from the anchor of the reading's grain, where a reading is
/// exact up to the grain's end and counts up to one unit less past it (module docs), so a
/// retry past the grain waits one unit more.
#[inline(always)]
fn refused<S: Source, const ANCHORED: bool>(s: &S, need: &[(u64, u64)], t: u64) -> Verdict {
    let (mut by, mut latest) = (0, 0u64);
    let origin = if ANCHORED { t & !G_MASK } else { 0 };
    for (i, &(tat, limit)) in need.iter().enumerate() {
        if tat > limit {
            let (per, per_shift, _) = s.cold(i);
            let v = tat.wrapping_sub(s.hot(i).2).max(1);
            let mut ns = nanos_ceil_pos(v, per, per_shift).unwrap_or(u64::MAX);
            if ANCHORED && ns > G_MASK {
                ns = nanos_ceil_pos(v + 1, per, per_shift).unwrap_or(u64::MAX);
            }
            let ns = origin.saturating_add(ns);
            if ns >= latest {
                (by, latest) = (i, ns);
            }
        }
    }
    Verdict::Deny {
        by,
        retry: latest.max(t),
    }
}

/// The refusal of a check past some limit's burst: the first such limit, never.
#[cold]
fn never<S: Source>(s: &S, k: usize, n: u32) -> Verdict {
    let by = (0..k).find(|&i| n > s.cold(i).2).unwrap_or(0);
    Verdict::Deny { by, retry: NEVER }
}

impl Limits {
    /// The state of a word whose limits are all full at `t`.
    pub(crate) fn born(&self, t: u64) -> u128 {
        let t = t.min(T_MAX);
        self.pack(std::array::from_fn(|i| self.u(i, t)), t)
    }

    /// Limit `i`'s reading of `t <= T_MAX` in units: `u_i(t)` (wide), or the anchor of `t`'s
    /// grain plus the units since it (anchored, module docs).
    fn u(&self, i: usize, t: u64) -> u64 {
        let l = &self.lims[i];
        if i >= self.k {
            0
        } else if self.k <= WIDE {
            l.u(t)
        } else {
            l.a(t >> G_SHIFT) + l.u(t & G_MASK)
        }
    }

    /// How late limit `i` may admit: one grid unit (wide), two (anchored).
    pub(crate) fn precision(&self, i: usize) -> Duration {
        let unit = self.lims[i].unit();
        if self.k <= WIDE {
            unit
        } else {
            unit.saturating_mul(2)
        }
    }

    /// The word of each limit's `tat_i` at a reading `t` with `u_i(t) <= tat_i <= u_i(t) +
    /// tau_i`: fields of `tat_i` (wide), or of offsets from the anchor of `t` (anchored).
    fn pack(&self, tats: [u64; MAX_LIMITS], t: u64) -> u128 {
        let k = self.k;
        let w = t.min(T_MAX) >> G_SHIFT;
        let mut x = if k <= WIDE {
            0
        } else {
            u128::from(w) << FIELDS
        };
        for (i, (l, tat)) in self.lims[..k].iter().zip(tats).enumerate() {
            let d = if k <= WIDE { tat } else { tat - l.a(w) };
            x |= u128::from(d) << field_at(i, k);
        }
        x
    }

    /// A check of `n` at `t` ns past the base on the word `x` ([`check`]).
    #[cfg(feature = "keyed")] // the keyed map's; the bucket reads its slot's words instead
    #[inline(always)]
    pub(crate) fn check(&self, x: u128, t: u64, n: u32) -> Verdict {
        check(self, x, t, n)
    }

    /// Each limit's `tat_i` in its units.
    pub(crate) fn tats(&self, x: u128) -> [u64; MAX_LIMITS] {
        let k = self.k;
        let mask = (1u64 << field_bits(k)) - 1;
        let w = (x >> FIELDS) as u64 & W_MASK;
        std::array::from_fn(|i| match i {
            _ if i >= k => 0,
            _ if k <= WIDE => (x >> field_at(i, k)) as u64 & mask,
            _ => self.lims[i].a(w) + ((x >> field_at(i, k)) as u64 & mask),
        })
    }

    /// The reading a word's anchor says it has reached: a reading before it counts as it.
    fn floor(&self, x: u128) -> u64 {
        if self.k <= WIDE {
            0
        } else {
            ((x >> FIELDS) as u64 & W_MASK) << G_SHIFT
        }
    }

    /// Each limit's tokens at `t` (at most its burst).
    pub(crate) fn tokens(&self, x: u128, t: u64) -> [f64; MAX_LIMITS] {
        let t = t.min(T_MAX);
        let tats = self.tats(x);
        std::array::from_fn(|i| {
            if i >= self.k {
                return 0.0;
            }
            let l = &self.lims[i];
            let have = (self.u(i, t) + l.tau).saturating_sub(tats[i]).min(l.tau);
            have as f64 / l.one as f64
        })
    }

    /// Whether every limit is full at `t`: the word is as if new.
    pub(crate) fn idle(&self, x: u128, t: u64) -> bool {
        let t = t.min(T_MAX);
        let tats = self.tats(x);
        (0..self.k).all(|i| tats[i] <= self.u(i, t))
    }

    /// Each limit as a client may be told of it at `t`: its burst, the time it takes to
    /// refill, the whole tokens left and the time until it is full.
    pub(crate) fn status(&self, x: u128, t: u64) -> [QuotaStatus; MAX_LIMITS] {
        let t = t.min(T_MAX);
        let tats = self.tats(x);
        std::array::from_fn(|i| {
            if i >= self.k {
                return QuotaStatus {
                    quota: 0,
                    window: Duration::ZERO,
                    remaining: 0,
                    reset: Duration::ZERO,
                };
            }
            let l = &self.lims[i];
            let u = self.u(i, t);
            let have = (u + l.tau).saturating_sub(tats[i]).min(l.tau);
            let reset = tats[i].saturating_sub(u);
            QuotaStatus {
                quota: u64::from(l.burst),
                window: Duration::from_nanos(l.ns(l.tau).unwrap_or(u64::MAX)),
                remaining: have / l.one,
                reset: Duration::from_nanos(l.ns(reset).unwrap_or(u64::MAX)),
            }
        })
    }

    /// The word of `new` at `t` for a word `x` of `self`: each limit kept by index keeps its
    /// tokens (rounded down to the new grid, capped at the new burst), as rate.go's
    /// `SetLimit` and `SetBurst` keep them; a limit added starts full. A reading before the
    /// word's anchor counts as the anchor.
    pub(crate) fn convert(&self, x: u128, new: &Limits, t: u64) -> u128 {
        let t = t.min(T_MAX).max(self.floor(x));
        let tokens = self.tokens(x, t);
        new.pack(
            std::array::from_fn(|i| {
                let l = &new.lims[i];
                let keep = if i < self.k {
                    ((tokens[i] * l.one as f64) as u64).min(l.tau)
                } else {
                    l.tau
                };
                new.u(i, t) + l.tau - keep
            }),
            t,
        )
    }

    /// The retry time `retry` (ns past the base, or [`NEVER`]) as a reading no earlier than
    /// the check's, `now`.
    #[inline(always)]
    pub(crate) fn at(base: u64, retry: u64, now: Nanos) -> Option<Nanos> {
        (retry != NEVER).then(|| Nanos::new(base.saturating_add(retry)).max(now))
    }
}
