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
//! `k` is chosen per configuration so that a unit is at most `2^-fine` ns (finer than the
//! nanosecond clock, so no reading is rounded by more than a unit) and as coarse as that
//! allows (so the word's range is as long as possible): `m` is then in `[2^fine, 2^(fine+1))`.
//! Two cases bend that:
//! * **high limits** (above `2^fine` tokens per ns) have `k = 0`: one unit is one token, and
//!   `m = limit / 1e9` up to `2^J`; limits above that act as `2^J` tokens per ns (6.4e10/s);
//! * **large bursts at low limits**: the whole burst in units, `tau = burst << k`, is kept at
//!   most [`TAU_MAX`] (2^55), so `k <= 55 - bits(burst)`; the unit is then coarser than
//!   `2^-fine` ns (at 1e-3/s and a burst of 1e6, 29 ns), which no such limit can notice. A
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

#![allow(dead_code)] // used by the 64-bit limiters landing next (issue #9)
use crate::limit::Limit;

/// Left shift applied to a nanosecond count before the multiplication; `m < 2^J`.
pub(crate) const J: u32 = 6;

/// The largest `d` (ns past the base) that [`Scale::units`] converts: `d << J` must fit.
pub(crate) const D_MAX: u64 = (1 << (64 - J)) - 1;

/// The most units a burst may span (`tau = burst << k`).
pub(crate) const TAU_MAX: u64 = 1 << 55;

/// The longest refill of a whole burst, in ns, that a finite limit keeps (146 years); beyond
/// it the limit never refills.
pub(crate) const TAU_NS_MAX: f64 = (1u64 << 62) as f64;

/// How a finite positive limit maps nanoseconds to units. Built off the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scale {
    /// Units per token is `2^k`.
    pub(crate) k: u32,
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
        let t_ns = 1e9 / l;
        if t_ns * f64::from(burst.max(1)) > TAU_NS_MAX {
            return None;
        }
        // Limits above 2^J tokens per ns act as 2^J (minus a hair, so that `mul` fits).
        let max = ((1u64 << J) as f64) * 1e9 * (1.0 - f64::EPSILON * 4.0);
        let (mant, exp) = decompose(l.min(max));
        // The smallest k with 2^k >= T * 2^fine, i.e. a unit of at most 2^-fine ns.
        let mut k = 0u32;
        while k < 64 && !ge_pow2_times(mant, exp + k as i32, fine) {
            k += 1;
        }
        // Keep the whole burst within TAU_MAX units.
        let bits = 32 - burst.leading_zeros();
        k = k.min(55 - bits);
        // mul = ceil(2^(k + 64 - J) * l / 1e9) = ceil(mant * 2^(k + 64 - J + exp) / 1e9).
        let mul = ratio_ceil(mant, exp + (k + 64 - J) as i32, 1_000_000_000, 0)?;
        let mul = u64::try_from(mul).ok()?;
        // per = ceil(1e9 * 2^s / (l * 2^k)) = ceil(1e9 * 2^(s - exp - k) / mant), with s the
        // shift that puts it in [2^63, 2^64).
        let mut per_shift = 0u32;
        let mut per = 0u128;
        for s in 0..=127u32 {
            per = ratio_ceil(1_000_000_000, s as i32 - exp - k as i32, mant, 0)?;
            per_shift = s;
            if per >= 1 << 63 {
                break;
            }
        }
        Some(Scale {
            k,
            mul: mul.max(1),
            per: u64::try_from(per).ok()?,
            per_shift,
        })
    }

    /// Units in `d` nanoseconds (`d <= D_MAX`), rounded down.
    #[inline(always)]
    pub(crate) fn units(&self, d: u64) -> u64 {
        debug_assert!(d <= D_MAX);
        (((d << J) as u128 * self.mul as u128) >> 64) as u64
    }

    /// Units in `d` nanoseconds for any `d`, as a `u128` (off the hot path).
    pub(crate) fn units_wide(&self, d: u64) -> u128 {
        ((d as u128) * (self.mul as u128)) >> (64 - J)
    }

    /// Units in `d` nanoseconds, saturating at `u64::MAX`.
    pub(crate) fn units_saturating(&self, d: u64) -> u64 {
        u64::try_from(self.units_wide(d)).unwrap_or(u64::MAX)
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

    /// `2^k`, the units in one token.
    #[inline(always)]
    pub(crate) fn unit_per_token(&self) -> u64 {
        1 << self.k
    }
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

/// Whether `mant * 2^e >= 1e9 * 2^fine`.
fn ge_pow2_times(mant: u128, e: i32, fine: u32) -> bool {
    // Compare mant * 2^(e - fine) with 1e9; both sides kept in u128.
    let e = e - fine as i32;
    if e >= 0 {
        e >= 40 || (mant << e) >= 1_000_000_000
    } else {
        let s = (-e) as u32;
        s < 98 && mant >= (1_000_000_000u128 << s)
    }
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

    fn scale(l: f64, burst: u32) -> Scale {
        Scale::new(Limit::per_second(l).unwrap(), burst, 4).unwrap()
    }

    #[test]
    fn whole_nanosecond_intervals_convert_exactly() {
        for l in [1.0, 2.0, 10.0, 1e3, 1e6, 1e8, 1e9, 4e9] {
            let s = scale(l, 10);
            let t_ns = (1e9 / l) as u64;
            if (t_ns as f64) * l != 1e9 {
                continue;
            }
            for n in [1u64, 3, 1000, 1_000_000] {
                let d = t_ns * n;
                if d > D_MAX {
                    continue;
                }
                assert_eq!(s.units(d), n << s.k, "limit {l}, {n} tokens");
                assert_eq!(s.nanos_ceil(n << s.k), d as u128, "limit {l}, {n} tokens");
                assert_eq!(s.nanos_floor(n << s.k), d as u128, "limit {l}, {n} tokens");
                assert!(s.units(d - 1) < n << s.k, "limit {l}, {n} tokens");
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
                unit_ns <= 1.0 / 16.0 + 1e-12 || s.k == 0,
                "limit {l}: unit {unit_ns}"
            );
            if s.k > 0 {
                assert!(unit_ns > 1.0 / 32.0 - 1e-12, "limit {l}: unit {unit_ns}");
            }
        }
    }

    #[test]
    fn a_ready_time_converts_back_to_at_least_its_units() {
        for l in [1e-3, 0.37, 3.0, 7.0, 3e7, 9.99e7, 1.5e9] {
            let s = scale(l, 1000);
            for u in [1u64, 7, 1 << s.k, 12345 << s.k, (1 << 40) + 3] {
                let ns = s.nanos_ceil(u) as u64;
                assert!(s.units(ns) >= u, "limit {l}, u {u}");
                // At most one nanosecond later than the first that holds `u` units.
                assert!(ns < 2 || s.units(ns - 2) < u, "limit {l}, u {u}");
            }
        }
    }

    #[test]
    fn large_bursts_at_low_limits_stay_within_tau_max() {
        let s = scale(1e-3, 1_000_000);
        assert!((1_000_000u64 << s.k) <= TAU_MAX);
        let s = scale(1.0, u32::MAX);
        assert!((u64::from(u32::MAX) << s.k) <= TAU_MAX);
        assert!(Scale::new(Limit::per_second(1e-9).unwrap(), 1 << 20, 4).is_none());
    }
}
