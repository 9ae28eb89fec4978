//! A finite limit's **scale**: clock nanoseconds to *units*, the integer time coordinate that
//! the 64-bit limiter words count in, and back.
//!
//! # Why units, not nanoseconds
//! A state word that counts time in nanoseconds (governor's choice) must round the interval
//! between tokens, `T = 1/limit`, to whole nanoseconds: at 3e7/s (`T` = 33.3 ns) that is a 1%
//! error, repeated on every grant. Finer time ticks trade range for precision: to keep `T`
//! within 1e-6 at 1e8/s a tick must be 2^-16 ns, and 57 bits of them last 39 hours. So the
//! words count in units of `T / 2^k` instead: **one token is exactly `2^k` units**, so grants
//! never drift however many there are, and the only rounding is in converting a clock
//! reading, which is one multiplication by a 64-bit constant per check (`m` units per ns,
//! rounded up, relative error below 2^-58).
//!
//! **Exact nanoseconds.** When `T` is a whole number of `2^-fine` ns (every limit whose
//! interval is a whole number of nanoseconds: 1000/s, 1e6/s, 3/s is not), a unit is exactly
//! `2^-fine` ns and a token `T * 2^fine` units: every reading converts without rounding, and
//! tokens are exact to the nanosecond's refill, as in rate.go. Otherwise:
//!
//! `k` is chosen per configuration so that a unit is at most `2^-fine` ns (finer than the
//! nanosecond clock, so no reading is rounded by more than a unit) and as coarse as that
//! allows (so the word's range is as long as possible): `m` is then in `[2^fine, 2^(fine+1))`.
//! Two cases bend that:
//! * **high limits** (above `2^fine` tokens per ns) have `k = 0`: one unit is one token, and
//!   `m = limit / 1e9` up to `2^J`; limits above that act as `2^J` tokens per ns (6.4e10/s);
//! * **low limits**: `k` is at most [`K_MAX`] (31) so that `n << k` never overflows, and the
//!   whole burst in units, `tau = burst << k`, is kept at most [`TAU_MAX`] (2^55), so
//!   `k <= 55 - bits(burst)`; the unit is then coarser than `2^-fine` ns (466 ns at 1e-3/s),
//!   which no such limit can notice. A
//!   burst that takes longer than [`TAU_NS_MAX`] (2^62 ns, 146 years) to refill never
//!   refills: [`Scale::new`] returns `None` and the limiter treats the limit as zero.
//!
//! # The conversion
//! `units(d) = floor(d * m)` for `d` ns past the configuration's base, computed as the high
//! half of `(d << J) * mul` with `mul = ceil(m * 2^(64 - J))`: one shift and one `mul`, and
//! exact for every `d < 2^(64 - J)` up to the rounding of `mul` (`d * 2^-(64-J)` units, below
//! one unit for the whole range). `mul` is rounded **up**, and so is the inverse `per` (ns per
//! unit) used for wake-up times: a time reported as "ready" always converts back to at least
//! the units it was computed from, so a retry at the reported time succeeds.
//!
//! `m` and `per` are computed exactly from the limit's `f64` value (an integer times a power
//! of two) with `u128` division, not from a rounded `1e9 / limit`: for a limit whose `T` is a
//! whole number of nanoseconds (10/s, 1000/s, 1e8/s) every multiple of `T` converts to
//! exactly the units of that many tokens, so grants fall due at the exact nanosecond.

use crate::limit::Limit;

/// Left shift applied to a nanosecond count before the multiplication; `m < 2^J`.
pub(crate) const J: u32 = 6;

/// The largest `d` (ns past the base) that [`Scale::units`] converts: `d << J` must fit.
pub(crate) const D_MAX: u64 = (1 << (64 - J)) - 1;

/// The largest `k`: `n << k` stays below 2^63 for every `u32` `n`, so a request for more
/// than the burst cannot overflow (it just exceeds `tau`). Limits below 2^27 ns per token
/// (7.5/s) therefore have units coarser than `2^-fine` ns (0.47 ns at 1/s, 466 ns at 1e-3/s):
/// still exact in whole tokens, and far below what such a limit can notice.
pub(crate) const K_MAX: u32 = 31;

/// The most units a burst may span (`tau = burst << k`).
pub(crate) const TAU_MAX: u64 = 1 << 55;

/// The longest refill of a whole burst, in ns, that a finite limit keeps (146 years); beyond
/// it the limit never refills.
pub(crate) const TAU_NS_MAX: f64 = (1u64 << 62) as f64;

/// How a finite positive limit maps nanoseconds to units. Built off the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scale {
    /// Units per token: `2^k`, or `16 * T` in the exact-nanosecond case; below 2^32.
    pub(crate) one: u64,
    /// Units per ns, times `2^(64 - J)`, rounded up.
    pub(crate) mul: u64,
    /// Nanoseconds per unit, times `2^per_shift`, rounded up; in `[2^63, 2^64)`.
    pub(crate) per: u64,
    pub(crate) per_shift: u32,
}

impl Scale {
    /// The scale for `limit` (finite, positive) and `burst` with units of at most `2^-fine` ns
    /// (`fine <= J - 1`); `None` if refilling the burst would take longer than
    /// [`TAU_NS_MAX`] (such a limit acts as zero).
    pub(crate) fn new(limit: Limit, burst: u32, fine: u32) -> Option<Scale> {
        debug_assert!(fine < J);
        let l = limit.as_f64();
        debug_assert!(l > 0.0 && l.is_finite());
        // T in ns as rate.go computes it (`1e9 / limit` in f64): 1e-3/s is 1e12 ns exactly,
        // though 1e-3 is not a binary fraction. Limits above 2^J tokens per ns act as 2^J
        // (a hair less, so that `mul` fits).
        let t_ns = (1e9 / l).max((1.0 + 8.0 * f64::EPSILON) / (1u64 << J) as f64);
        if t_ns * f64::from(burst.max(1)) > TAU_NS_MAX {
            return None;
        }
        // T = mant * 2^exp exactly, so every quantity below is an exact ratio of integers.
        let (mant, exp) = decompose(t_ns);
        // The smallest k with 2^k >= T * 2^fine, i.e. a unit of at most 2^-fine ns.
        let mut k = 0u32;
        while k < 64 && !pow2_ge(k as i32 - fine as i32 - exp, mant) {
            k += 1;
        }
        // Keep the whole burst within TAU_MAX units, and `n << k` below 2^63 for any `n`.
        let bits = 32 - burst.leading_zeros();
        k = k.min(55 - bits).min(K_MAX);
        // Exact nanoseconds: if T is a whole number of `2^-fine` ns, a unit of exactly that
        // converts every reading without rounding, and a token is `T * 2^fine` units.
        let one = t_ns * f64::from(1u32 << fine);
        if one.fract() == 0.0
            && one < (1u64 << K_MAX) as f64
            && one * f64::from(burst) <= TAU_MAX as f64
        {
            return Some(Scale {
                one: one as u64,
                mul: 1 << (64 - J + fine),
                per: 1 << 63,
                per_shift: 63 + fine,
            });
        }
        Scale::power_of_two(mant, exp, k)
    }

    /// The scale for `limit` (finite, positive) whose token is exactly `2^k` units (`k <= 62`),
    /// however coarse or fine that makes a unit: for a word that must hold a burst in a given
    /// number of bits. `None` if the multiplier does not fit.
    pub(crate) fn with_k(limit: Limit, k: u32) -> Option<Scale> {
        debug_assert!(k <= 62);
        let t_ns = (1e9 / limit.as_f64()).max((1.0 + 8.0 * f64::EPSILON) / (1u64 << J) as f64);
        let (mant, exp) = decompose(t_ns);
        Scale::power_of_two(mant, exp, k)
    }

    /// The scale whose token `T = mant * 2^exp` ns is `2^k` units.
    fn power_of_two(mant: u128, exp: i32, k: u32) -> Option<Scale> {
        // mul = ceil(2^(k + 64 - J) / T) = ceil(2^(k + 64 - J - exp) / mant).
        let mul = ratio_ceil(1, k as i32 + (64 - J) as i32 - exp, mant, 0)?;
        let mul = u64::try_from(mul).ok()?;
        // per = T * 2^s / 2^k = mant * 2^(exp + s - k), with s the shift that puts it in
        // [2^63, 2^64): exact (T is a binary fraction with 53 significant bits).
        let mut per_shift = 0u32;
        let mut per = 0u128;
        for s in 0..=127u32 {
            per = ratio_ceil(mant, exp + s as i32 - k as i32, 1, 0)?;
            per_shift = s;
            if per >= 1 << 63 {
                break;
            }
        }
        Some(Scale {
            one: 1 << k,
            mul: mul.max(1),
            per: u64::try_from(per).ok()?,
            per_shift,
        })
    }

    /// Units in `d` nanoseconds (`d <= D_MAX`), rounded down.
    // Only KeyedTokenBucket calls it: without `keyed` it would be dead code (a warning).
    #[cfg(feature = "keyed")]
    #[inline(always)]
    pub(crate) fn units(&self, d: u64) -> u64 {
        units(d, self.mul)
    }

    /// Units in `d` nanoseconds for any `d`, as a `u128` (off the hot path).
    pub(crate) fn units_wide(&self, d: u64) -> u128 {
        ((d as u128) * (self.mul as u128)) >> (64 - J)
    }

    /// Nanoseconds in `u` units, rounded down.
    pub(crate) fn nanos_floor(&self, u: u64) -> u128 {
        (u as u128 * self.per as u128) >> self.per_shift
    }

    /// Nanoseconds in `u` units, rounded up: the first whole nanosecond by which `u` units have
    /// passed.
    pub(crate) fn nanos_ceil(&self, u: u64) -> u128 {
        let p = u as u128 * self.per as u128;
        let one = 1u128 << self.per_shift;
        (p >> self.per_shift) + u128::from(p & (one - 1) != 0)
    }
}

/// [`Scale::nanos_ceil`] for a hot path that reads `per` and `per_shift` alone, where
/// `u * per >= 1` is known (a refusal's `u >= 1` units under a configuration that refills,
/// `per >= 2^63`): the same value, or `None` for a value past `u64`. For `p = u * per >= 1`,
/// `ceil(p / 2^s) = floor((p - 1) / 2^s) + 1`: one shift, no remainder test, and for
/// `s >= 64` (a unit under a nanosecond: most scales) a 64-bit shift of the high word.
#[inline(always)]
pub(crate) fn nanos_ceil_pos(u: u64, per: u64, per_shift: u32) -> Option<u64> {
    debug_assert!(u != 0 && per != 0);
    let floor = if per_shift >= 64 {
        nanos_ceil_pos_fine(u, per, per_shift) - 1
    } else {
        let p = (u as u128 * per as u128).wrapping_sub(1);
        u64::try_from(p >> per_shift).ok()?
    };
    floor.checked_add(1)
}

/// [`nanos_ceil_pos`] where a unit is under a nanosecond (`per_shift >= 64`), which never
/// passes `u64` there: `u < 2^64` units of at most 2^-4 ns are under 2^60 ns.
#[inline(always)]
pub(crate) fn nanos_ceil_pos_fine(u: u64, per: u64, per_shift: u32) -> u64 {
    debug_assert!(u != 0 && per != 0 && per_shift >= 64);
    let p = (u as u128 * per as u128).wrapping_sub(1);
    (((p >> 64) as u64) >> ((per_shift - 64) & 63)) + 1
}

/// Units in `d <= D_MAX` nanoseconds at multiplier `mul`, rounded down: the high half of
/// `(d << J) * mul`. The one conversion every 64-bit limiter word's hot path makes. With
/// `mul = 0` (a limit that never refills) any `d` gives 0.
#[inline(always)]
pub(crate) fn units(d: u64, mul: u64) -> u64 {
    debug_assert!(d <= D_MAX || mul == 0);
    (((d << J) as u128 * mul as u128) >> 64) as u64
}

/// `x = mant * 2^exp` exactly, for a finite positive `f64`.
fn decompose(x: f64) -> (u128, i32) {
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1 << 52) - 1);
    if e == 0 {
        (frac as u128, -1074)
    } else {
        ((frac | (1 << 52)) as u128, e - 1075)
    }
}

/// Whether `2^e >= mant`.
fn pow2_ge(e: i32, mant: u128) -> bool {
    e >= 127 || (e >= 0 && (1u128 << e) >= mant)
}

/// `ceil(a * 2^e / (b * 2^f))`, or `None` if it does not fit a `u128`.
fn ratio_ceil(a: u128, e: i32, b: u128, f: i32) -> Option<u128> {
    let s = e - f;
    let (num, den) = if s >= 0 {
        let s = s as u32;
        if s >= 128 || a.leading_zeros() < s {
            return None;
        }
        (a << s, b)
    } else {
        let s = (-s) as u32;
        if s >= 128 || b.leading_zeros() < s {
            // The quotient is below one: round up to one (a > 0).
            return Some(1);
        }
        (a, b << s)
    };
    Some(num.div_ceil(den))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift64 stream from `seed`.
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    fn scale(l: f64, burst: u32) -> Scale {
        Scale::new(Limit::per_second(l).unwrap(), burst, 4).unwrap()
    }

    #[test]
    fn whole_nanosecond_intervals_convert_exactly() {
        for l in [1e-3, 0.1, 1.0, 2.0, 10.0, 1e3, 1e6, 1e8, 1e9, 4e9] {
            let s = scale(l, 10);
            let t_ns = (1e9 / l) as u64;
            if t_ns as f64 != 1e9 / l {
                continue;
            }
            for n in [1u64, 3, 1000, 1_000_000] {
                let d = t_ns * n;
                if d > D_MAX {
                    continue;
                }
                assert_eq!(s.units(d), n * s.one, "limit {l}, {n} tokens");
                assert_eq!(s.nanos_ceil(n * s.one), d as u128, "limit {l}, {n} tokens");
                assert_eq!(s.nanos_floor(n * s.one), d as u128, "limit {l}, {n} tokens");
                // A nanosecond before the boundary is before it, where a unit is at most a
                // nanosecond; coarser units (low limits) round a reading within
                // `d * 2^-58` units of a boundary up to it.
                let fine = s.mul >= 1 << (64 - J);
                assert!(!fine || s.units(d - 1) < n * s.one, "limit {l}, {n} tokens");
                assert!(s.units(d - 1) <= n * s.one, "limit {l}, {n} tokens");
            }
        }
    }

    #[test]
    fn units_are_fine_and_m_in_range() {
        for l in [1e-3, 0.37, 1.0, 3.0, 1e4, 3e7, 1e8, 1e9, 1.5e9, 1e10, 3e10] {
            let s = scale(l, 100);
            let m = s.mul as f64 / (1u64 << (64 - J)) as f64;
            assert!(m < (1u64 << J) as f64, "limit {l}: m {m}");
            let unit_ns = 1.0 / m;
            assert!(
                unit_ns <= 1.0 / 16.0 + 1e-12 || s.one == 1 || s.one == 1 << K_MAX,
                "limit {l}: unit {unit_ns}"
            );
            if s.one > 1 && s.one < 1 << K_MAX {
                assert!(unit_ns > 1.0 / 32.0 - 1e-12, "limit {l}: unit {unit_ns}");
            }
        }
    }

    /// The token bucket refuses a check from its retry time alone when the reading is two
    /// nanoseconds or more before it: that needs such a reading to hold fewer units than the
    /// retry time's, wherever a unit is under a nanosecond (`per_shift >= 64`).
    #[test]
    fn two_nanoseconds_before_a_ceiling_hold_fewer_units() {
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        let mut checked = 0;
        for i in 0..200_000u32 {
            let l = if i % 4 == 0 {
                [7.5, 10.0, 1e3, 3e5, 1e6, 1e9, 3e9][i as usize / 4 % 7]
            } else {
                10f64.powf(0.8 + (next() % 9_200) as f64 / 1000.0)
            };
            let s = scale(l, 1 + (next() % 5000) as u32);
            if s.per_shift < 64 {
                continue;
            }
            let u = (next() >> (7 + i % 50)).max(1);
            let ns = s.nanos_ceil(u);
            if ns < 2 || ns - 2 > 1 << 56 {
                continue;
            }
            checked += 1;
            assert!(units(ns as u64 - 2, s.mul) < u, "limit {l}, u {u}");
        }
        assert!(checked > 100_000, "checked {checked}");
    }

    #[test]
    fn a_ready_time_converts_back_to_at_least_its_units() {
        for l in [1e-3, 0.37, 3.0, 7.0, 3e7, 9.99e7, 1.5e9] {
            let s = scale(l, 1000);
            for u in [1u64, 7, s.one, 12345 * s.one, (1 << 40) + 3] {
                let ns = s.nanos_ceil(u) as u64;
                assert!(s.units(ns) >= u, "limit {l}, u {u}");
                // At most one nanosecond later than the first that holds `u` units (where a
                // unit is at most a nanosecond; see above).
                let fine = s.mul >= 1 << (64 - J);
                assert!(!fine || ns < 2 || s.units(ns - 2) < u, "limit {l}, u {u}");
            }
        }
    }

    #[test]
    fn the_hot_ceiling_is_the_ceiling_where_it_answers() {
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        let mut answered = 0;
        for i in 0..200_000u32 {
            let u = (next() >> (i % 64)).max(1);
            let per = next() | 1 << 63;
            let per_shift = (next() % 128) as u32;
            let hot = nanos_ceil_pos(u, per, per_shift);
            let exact = Scale {
                one: 1,
                mul: 1,
                per,
                per_shift,
            }
            .nanos_ceil(u);
            match hot {
                Some(ns) => {
                    answered += 1;
                    assert_eq!(u128::from(ns), exact, "u {u} per {per} shift {per_shift}");
                }
                None => assert!(
                    exact > u128::from(u64::MAX),
                    "u {u} per {per} shift {per_shift}: left to the slow path"
                ),
            }
        }
        assert!(answered > 50_000, "answered {answered}");
        for l in [1e-3, 0.6, 3.0, 1e3, 1e6, 1e9, 3e10] {
            let s = scale(l, 1000);
            assert_eq!(
                nanos_ceil_pos(s.one, s.per, s.per_shift).map(u128::from),
                Some(s.nanos_ceil(s.one)),
                "limit {l}"
            );
        }
    }

    #[test]
    fn large_bursts_at_low_limits_stay_within_tau_max() {
        let s = scale(1e-3, 1_000_000);
        assert!((1_000_000u64 * s.one) <= TAU_MAX);
        let s = scale(1.0, u32::MAX);
        assert!((u64::from(u32::MAX) * s.one) <= TAU_MAX);
        assert!(Scale::new(Limit::per_second(1e-9).unwrap(), 1 << 20, 4).is_none());
    }
}
