//! The smooth limiters' engine: the 128-bit state word, its configuration slots, and the
//! core both [`SmoothBursty`](super::SmoothBursty) and [`SmoothWarmingUp`](super::SmoothWarmingUp)
//! run (resync, charge, reconfigure). The user docs and Guava's model are on the front
//! (`mod.rs`).
//!
//! # The protocol
//!
//! **The state word** (`state`, one `AtomicU128`, cache-padded unless the layout is
//! [`Compact`]):
//! ```text
//!  127                          64 63                    24 23            0
//! +------------------------------+------------------------+---------------+
//! |  next_free: u64 nanoseconds  |  stored: 40-bit frac   |  epoch: 24    |
//! +------------------------------+------------------------+---------------+
//! ```
//! * `next_free` is unsigned: it starts at the construction time and only moves forward
//!   (resync sets it to a later `now`, a reservation adds a cost with a saturating add, as
//!   Guava's `LongMath.saturatedAdd`), so the whole `Nanos` range is representable.
//! * The stored permits are held as a **fraction of `max_permits`**: `stored = frac / 2^39 *
//!   max_permits`, `frac` in `0..=2^39` (the field has 40 bits so that "full", 2^39, is exact).
//!   This is what makes `set_rate` cheap and exact in Guava's terms: Guava rescales
//!   `stored * new_max / old_max`, which leaves the fraction unchanged, so only its special
//!   cases (old max 0 or `+inf`) write a new fraction. In fraction units Guava's resync is also
//!   free of the rate: idle time stores `idle / cool_down` permits, i.e. `idle /
//!   (max_burst_seconds * 1e9)` of a full store for `SmoothBursty` and `idle / warmup` for
//!   `SmoothWarmingUp`. So the hot path resyncs with one multiplication and serves a bursty
//!   request from storage in integer arithmetic (`frac -= n * 2^39 / max_permits`). (It also
//!   means that for finite rates resyncing at the old rate, as Guava's `setRate` does, or at the
//!   new one gives the same fraction.)
//! * Conversions into fraction units round to the nearest unit, so exact fractions stay exact
//!   (a half-full store rescales to exactly half full) and each conversion errs by at most half
//!   a unit, `max_permits * 2^-40` permits: for `SmoothBursty` at most `max_burst_seconds *
//!   2^-40` s of refill (~1 ps for a 1 s burst); for `SmoothWarmingUp`, whose stored permits
//!   cost up to `cold_interval` each, at most `max_permits * cold_interval * 2^-40` <=
//!   `1.5 * cold_factor * warmup * 2^-40` of wait (~3 ns for a 550 s warm-up with cold
//!   factor 10, ~10 ps for 4 s with 3).
//! * `epoch` names the configuration the word is expressed in.
//!
//! **Layout.** In the default [`Padded`] layout the state word and the two configuration
//! slots are each on cache lines of their own. In the [`Compact`] one (`build_compact`, for
//! the many limiters of a keyed map) nothing is padded and the limiter is `repr(C)` with the
//! state word first, then the slots: in a keyed map's slot (its own state word, then the
//! limiter 16 bytes in, the state word's alignment) a refusal, decided from the state word
//! alone, reads one cache line, and a charge reads the next one too (its configuration
//! words).
//!
//! **Configurations** (rate, stable interval, max permits, cool-down interval, threshold,
//! slope) live in the two seqlock-validated slots of `ConfigSlots`, one per epoch parity
//! (`src/config_slots.rs` states that protocol). Only
//! `set_rate` writes slots, serialized by a mutex that the hot path never touches. It resyncs
//! at the *old* rate, applies Guava's rescale, writes the other slot as epoch `e + 1`, and
//! installs `(next_free, frac, e + 1)` with one CAS. `next_free` is left as resynced, so the
//! debt already owed is repaid at the old rate, as in Guava.
//!
//! * **Invariant:** the word is always expressed in the configuration of its own epoch, and
//!   slot `e & 1` holds that configuration while the word carries epoch `e` (the slot is next
//!   written for `e + 2`, which needs the word to reach `e + 1` first).
//! * Every operation computes from one word and the configuration of *its* epoch and commits
//!   with a CAS on the whole word; a failed CAS retries from the word it returned (with
//!   `crossbeam_utils::Backoff`), first answering from that word alone if it can (below), then
//!   reading its epoch's configuration again (a few cache hits: the slot is not written while
//!   the epoch lasts). So stored permits and `next_free` always change together, and no
//!   reservation is computed half under an old rate: `set_rate` is linearizable with
//!   `reserve`, `acquire`, `try_acquire` and `check`.
//! * **The inline path.** Whatever stands on the loaded word alone is answered where the
//!   caller inlined the operation, from that one load: a refusal (`next_free > now`, or Guava's
//!   `canAcquire` with a timeout) with `next_free` as its retry time, "never" (D4), and a
//!   zero-permit request. Only a charge leaves it, for one out-of-line function that reads the
//!   configuration, prices the request and CASes; it is handed the loaded word, so a charge
//!   that meets no contention is one load and one CAS on the state word.
//! * **No ABA within an epoch:** `next_free` never decreases, and while it stays put the
//!   fraction only decreases (storing idle time needs `now > next_free` and moves it), so a
//!   word never recurs and a CAS cannot succeed on a recycled one. Across epochs, see below.
//! * A denied `try_acquire` (Guava's `canAcquire`: `next_free - timeout <= now`, the
//!   subtraction form, here a saturating subtraction) and everything under a `+inf` rate
//!   write nothing: they linearize at the load. A denial needs only `next_free`, so it does
//!   not even read the configuration. Under `+inf` every cost is zero, so a reservation only
//!   waits for the debt owed from before the switch (`next_free - now`), and the resync it
//!   would write (`next_free = now`, stored full) is unobservable: both `try_acquire` and the
//!   next `set_rate` treat a past `next_free` like `now`. (The 128-bit load is
//!   `crate::sync`'s: on x86_64 one `vmovdqa` where the processor has AVX, detected at
//!   run time; without AVX it is a `lock cmpxchg16b` that writes back the value it read,
//!   which changes nothing but takes the cache line exclusive.)
//! * **Epoch width.** 24 bits leave 40 for the fraction. A stale CAS could succeed only if the
//!   word were bit-for-bit equal again: the epoch advanced by an exact multiple of 2^24
//!   (16,777,216 `set_rate` calls) with `next_free` and the fraction at the loaded values
//!   (which `set_rate` calls during a debt do leave as they were), all between one thread's
//!   load and its CAS, a window of tens of nanoseconds unless that thread is preempted.
//!   `set_rate` calls are serialized by a mutex and each writes a slot and CASes the word
//!   (well over 100 ns), so that takes seconds of nothing but `set_rate` while the other
//!   thread sleeps mid-loop; rates are changed by control loops, a few times a second. The
//!   same holds for a slot read validated against a 24-bit epoch.
//!
//! **Orderings.** As in the token bucket: the word is loaded with `Acquire`, pairing with the
//! `Release` of the reconfiguring CAS, so the slot written before it is visible to whoever sees
//! the new epoch; hot-path CASes are `AcqRel` and, being read-modify-writes, extend that
//! release sequence. A failed slot read only means the loaded word was stale: reload it.
//!

use std::fmt;
use std::time::Duration;

use crossbeam_utils::Backoff;

use super::SmoothParams;
use crate::clock::{Clock, Nanos};
use crate::config_slots::ConfigSlots;
use crate::error::{ConfigError, WaitError};
use crate::layout::Layout;
use crate::limit::PerSec;
use crate::limiter::Denied;
use crate::sync::{AtomicU128, Mutex, Ordering}; // Mutex: set_rate only, never the hot path

pub(crate) const EPOCH_BITS: u32 = 24;
pub(super) const EPOCH_MASK: u32 = (1 << EPOCH_BITS) - 1;
pub(super) const FRAC_BITS: u32 = 40;
pub(super) const FRAC_MASK: u64 = (1 << FRAC_BITS) - 1;
/// A full store: `stored == max_permits`.
pub(crate) const FRAC_ONE: u64 = 1 << (FRAC_BITS - 1);
pub(super) const FRAC_SCALE: f64 = FRAC_ONE as f64;
pub(super) const NANOS_PER_SEC: f64 = 1e9;

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Kind {
    Bursty { max_burst_seconds: f64 },
    WarmingUp { warmup_ns: f64, cold_factor: f64 },
}

/// Words of a [`Config`] in its slot, the hot path's first: the stable interval, the two
/// factors a reservation multiplies by (fraction units per idle nanosecond and per permit, so
/// that it does no division), one permit in fraction units (the common request, so that it
/// does not even round), max permits, then the warm-up's threshold and slope, and last what
/// only reconfiguration and reporting read (the rate, the cool-down interval).
pub(super) const CONFIG_WORDS: usize = 9;
/// The words a charge reads: the first [`CHARGE_WORDS_BURSTY`] for [`SmoothBursty`], whose
/// stored permits are free, the first [`CHARGE_WORDS_WARMING`] for [`SmoothWarmingUp`].
pub(super) const CHARGE_WORDS_BURSTY: usize = 5;
pub(super) const CHARGE_WORDS_WARMING: usize = 7;

/// One rate's derived constants, as read from its slot. Never NaN. A configuration read for
/// a charge ([`Core::charge_config`]) holds only what a reservation uses: its `rate` and
/// `cool_down_ns` are 0 (and so are `threshold` and `slope` for [`SmoothBursty`], as in every
/// bursty configuration).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Config {
    pub(super) epoch: u32,
    pub(super) rate: f64,
    pub(super) stable_ns: f64,
    pub(crate) max_permits: f64,
    pub(super) cool_down_ns: f64,
    pub(super) threshold: f64,
    pub(super) slope: f64,
    /// Fraction units stored per idle nanosecond: `2^39 / (cool_down_ns * max_permits)`, i.e.
    /// `2^39 / (max_burst_seconds * 1e9)` (bursty) or `2^39 / warmup_ns` (warming up),
    /// whatever the rate. Guava's `min(max, stored + idle / cool_down)` is
    /// `min(full, frac + idle * accrual)`.
    pub(super) accrual: f64,
    /// Fraction units per permit: `2^39 / max_permits`.
    pub(super) units_per_permit: f64,
    /// One permit in fraction units, `units_per_permit` rounded as every request's size is.
    pub(super) unit: u64,
    pub(super) warming: bool,
    /// `+inf` rate: every cost is zero.
    pub(crate) inf: bool,
    /// `max_permits / 2^39`: the permits one fraction unit stands for.
    pub(super) scale: f64,
}

impl Config {
    /// Guava's `doSetRate(pps, stableIntervalMicros)` for `kind`, without the stored permits.
    pub(super) fn new(kind: Kind, rate: f64, epoch: u32) -> Config {
        let inf = rate == f64::INFINITY;
        // A positive rate gives a positive interval (`check_rate` rejects subnormal ones,
        // whose interval would be +inf).
        let stable = if inf { 0.0 } else { NANOS_PER_SEC / rate };
        let (max, cool, threshold, slope) = match kind {
            Kind::Bursty { max_burst_seconds } => {
                let max = if max_burst_seconds == 0.0 {
                    0.0 // Guava: 0 * inf = NaN under +inf
                } else if inf {
                    f64::INFINITY
                } else {
                    (max_burst_seconds * rate).min(f64::MAX)
                };
                (max, stable, 0.0, 0.0)
            }
            Kind::WarmingUp { .. } if inf => (f64::INFINITY, 0.0, f64::INFINITY, 0.0),
            Kind::WarmingUp {
                warmup_ns,
                cold_factor,
            } => {
                let cold = stable * cold_factor;
                let threshold = (0.5 * warmup_ns / stable).min(f64::MAX);
                let max = (threshold + 2.0 * warmup_ns / (stable + cold)).min(f64::MAX);
                let slope = (cold - stable) / (max - threshold);
                // NaN or inf only where no stored permit lies above the threshold (a subnormal
                // rate: max 0; or max == threshold after capping): the slope is never used.
                let slope = if slope.is_finite() { slope } else { 0.0 };
                // max may be 0 (subnormal rate): +inf, and idling stores nothing.
                (max, warmup_ns / max, threshold, slope)
            }
        };
        // inf for a zero max (then every fraction stands for 0 permits), 0 for an infinite
        // one (only under +inf, where nothing is charged).
        let units_per_permit = FRAC_SCALE / max;
        // 0 * inf (an infinite cool-down with a zero max) stores nothing.
        let accrual = (1.0 / cool) * units_per_permit;
        let accrual = if accrual.is_nan() { 0.0 } else { accrual };
        Config {
            epoch,
            rate,
            stable_ns: stable,
            max_permits: max,
            cool_down_ns: cool,
            threshold,
            slope,
            accrual,
            units_per_permit,
            unit: round_u64(units_per_permit),
            warming: matches!(kind, Kind::WarmingUp { .. }),
            inf: stable == 0.0,
            scale: max / FRAC_SCALE,
        }
    }

    pub(super) fn to_words(self) -> [u64; CONFIG_WORDS] {
        let f = f64::to_bits;
        [
            f(self.stable_ns),
            f(self.accrual),
            f(self.units_per_permit),
            self.unit,
            f(self.max_permits),
            f(self.threshold),
            f(self.slope),
            f(self.rate),
            f(self.cool_down_ns),
        ]
    }

    /// The configuration from the first `M` words of its slot (all [`CONFIG_WORDS`], or
    /// the charge's prefix); the words not read are 0.
    #[inline(always)]
    pub(super) fn from_words<const M: usize>(epoch: u32, w: [u64; M], warming: bool) -> Config {
        let word = |i: usize| if i < M { w[i] } else { 0 };
        let f = |i: usize| f64::from_bits(word(i));
        let (stable_ns, max_permits) = (f(0), f(4));
        Config {
            epoch,
            stable_ns,
            accrual: f(1),
            units_per_permit: f(2),
            unit: word(3),
            max_permits,
            threshold: f(5),
            slope: f(6),
            rate: f(7),
            cool_down_ns: f(8),
            warming,
            inf: stable_ns == 0.0,
            scale: max_permits / FRAC_SCALE,
        }
    }

    /// The stored permits a fraction stands for.
    #[inline(always)]
    pub(crate) fn stored(&self, frac: u64) -> f64 {
        if frac == 0 {
            0.0 // not 0 * inf
        } else if frac >= FRAC_ONE {
            self.max_permits
        } else {
            // frac < 2^39: a signed conversion is exact and one instruction.
            frac as i64 as f64 * self.scale
        }
    }

    /// The fraction for `stored` permits (construction only).
    pub(super) fn frac_of(&self, stored: f64) -> u64 {
        if stored.is_nan() || stored <= 0.0 {
            0
        } else if stored >= self.max_permits {
            FRAC_ONE
        } else {
            round_u64(stored * self.units_per_permit).min(FRAC_ONE)
        }
    }

    /// Guava's `resync(now)`, without mutation: `(next_free, frac)` at `now`.
    #[inline(always)]
    pub(crate) fn resync(&self, word: u128, now: u64) -> (u64, u64) {
        let (next, frac) = (next_free(word), frac(word));
        if now > next {
            let accrued = round_u64(u64_to_f64(now - next) * self.accrual);
            (now, frac.saturating_add(accrued).min(FRAC_ONE))
        } else {
            (next, frac)
        }
    }

    /// Guava's `storedPermitsToWaitTime(stored, take)` in ns: 0 for bursty; for warming up,
    /// the trapezoid over the `t = min(stored - threshold, take)` permits above the threshold,
    /// `t * (permitsToTime(above) + permitsToTime(above - t)) / 2` with `permitsToTime(p) =
    /// stable + p * slope`, plus `stable * (take - t)` for the flat part below it. Summed
    /// algebraically, that is `stable * take + slope * t * (above - t / 2)`: the same integral
    /// with a shorter dependency chain, rounded once (Guava truncates each part to whole µs).
    #[inline(always)]
    pub(super) fn stored_cost(&self, stored: f64, take: f64) -> u64 {
        if !self.warming {
            return 0;
        }
        let above = stored - self.threshold;
        let flat = self.stable_ns * take;
        if above <= 0.0 {
            // No stored permit above the threshold (t = 0, whose term is a zero): the warm
            // limiter's common case, in one multiplication.
            return round_u64(flat);
        }
        // `above.min(take).max(0.0)` without `min`'s NaN fix-ups (above > 0 here; a NaN, which
        // the store never holds, takes `take` as `min` would).
        let t = if above < take { above } else { take };
        round_u64(flat + self.slope * t * (above - 0.5 * t))
    }

    /// Guava's `reserveEarliestAvailable(n, now)` on `word`, for a finite rate: returns the
    /// time the request may act (the resynced `next_free`) and the new word. The comparison
    /// `min(n, stored)` is made in fraction units, so that a bursty request served from
    /// storage is integer arithmetic only.
    #[inline(always)]
    pub(crate) fn reserve(&self, word: u128, now: u64, n: u32) -> (u64, u128) {
        let need = if n == 1 {
            self.unit
        } else {
            round_u64(f64::from(n) * self.units_per_permit)
        };
        let (next, frac) = self.resync(word, now);
        let (wait, left) = if frac >= need {
            // All n from storage (free when bursty).
            let cost = if self.warming {
                self.stored_cost(self.stored(frac), f64::from(n))
            } else {
                0
            };
            (cost, frac - need)
        } else if frac == 0 {
            // The store empty, as at the limit: n fresh permits (the branch below, without
            // its zero terms).
            (round_u64(f64::from(n) * self.stable_ns), 0)
        } else {
            // All the stored permits, and n - stored fresh ones.
            let stored = self.stored(frac);
            let fresh = f64::from(n) - stored;
            let cost = self.stored_cost(stored, stored);
            (cost.saturating_add(round_u64(fresh * self.stable_ns)), 0)
        };
        (next, pack(next.saturating_add(wait), left, self.epoch))
    }

    pub(super) fn params(&self, kind: Kind) -> SmoothParams {
        let cold = match kind {
            Kind::WarmingUp { cold_factor, .. } => self.stable_ns * cold_factor,
            Kind::Bursty { .. } => 0.0,
        };
        SmoothParams {
            rate: self.rate,
            stable_interval_ns: self.stable_ns,
            cold_interval_ns: cold,
            max_permits: self.max_permits,
            threshold_permits: self.threshold,
            slope_ns: self.slope,
            cool_down_interval_ns: self.cool_down_ns,
        }
    }
}

/// `u as f64`, in one signed conversion below 2^63 (the unsigned one is a longer sequence,
/// kept out of line so that the compiler does not merge the two into it).
#[inline(always)]
pub(super) fn u64_to_f64(u: u64) -> f64 {
    match i64::try_from(u) {
        Ok(i) => i as f64,
        Err(_) => wide_u64_to_f64(u),
    }
}

#[cold]
#[inline(never)]
pub(super) fn wide_u64_to_f64(u: u64) -> f64 {
    u as f64
}

/// `x` (nanoseconds or fraction units) rounded to the nearest, saturating; NaN (only ever
/// `0 * inf`) is 0.
#[inline(always)]
pub(super) fn round_u64(x: f64) -> u64 {
    let x = x + 0.5;
    if (0.0..9.0e18).contains(&x) {
        // The common case, in one conversion instruction: `as` would add the saturation and
        // NaN fix-ups that this range already excludes.
        // SAFETY: `x` is finite and within `i64`'s range, where the conversion truncates.
        unsafe { x.to_int_unchecked::<i64>() as u64 }
    } else {
        saturate_u64(x)
    }
}

/// `x as u64` (negatives and NaN 0, past `u64::MAX` saturated), out of line so that the
/// compiler does not fold `round_u64`'s common case into this longer sequence.
#[cold]
#[inline(never)]
pub(super) fn saturate_u64(x: f64) -> u64 {
    x as u64
}

#[inline(always)]
pub(crate) fn pack(next_free: u64, frac: u64, epoch: u32) -> u128 {
    (u128::from(next_free) << 64) | (u128::from(frac) << EPOCH_BITS) | u128::from(epoch)
}

#[inline(always)]
pub(crate) fn next_free(word: u128) -> u64 {
    (word >> 64) as u64
}

#[inline(always)]
pub(super) fn frac(word: u128) -> u64 {
    ((word as u64) >> EPOCH_BITS) & FRAC_MASK
}

#[inline(always)]
pub(super) fn epoch(word: u128) -> u32 {
    (word as u32) & EPOCH_MASK
}

/// What `take` answers from `word` alone, before any charge: "never" if the debt ends past
/// the end of representable time; with a `timeout`, Guava's `canAcquire` denial
/// (`next_free - timeout > now`, a saturating subtraction); for zero permits, the wait for
/// the debt. `None`: a charge is to be computed.
#[inline(always)]
pub(super) fn decide(word: u128, now: u64, n: u32, timeout: Option<u64>) -> Option<Take> {
    let next = next_free(word);
    if next > now {
        // A debt: one comparison answers the common case, a refusal, and leads to the rarer.
        if next == u64::MAX {
            // As TokenBucket's D4: a wait past the end of time is "never", not 584 years.
            return Some(Take::Never);
        }
        if let Some(t) = timeout {
            if next.saturating_sub(t) > now {
                return Some(Take::Denied(next));
            }
        }
    }
    if n == 0 {
        // Nothing to charge: the answer stands on the load alone.
        return Some(Take::Granted(next.saturating_sub(now)));
    }
    None
}

/// The warming-up options' errors, the rate's first: the rate, as [`check_rate`].
pub(super) fn check_warming(
    rate: f64,
    warmup: Duration,
    cold_factor: f64,
) -> Result<f64, ConfigError> {
    let rate = check_rate(rate)?;
    if warmup.is_zero() {
        return Err(ConfigError::ZeroWarmup(warmup));
    }
    if !(cold_factor >= 1.0 && cold_factor.is_finite()) {
        return Err(ConfigError::InvalidColdFactor(cold_factor));
    }
    Ok(rate)
}

/// A [`SmoothWarmingUp`]'s derived constants at epoch 0 (with its rate), validated as its
/// builder validates them: for the inline keyed map (`src/keyed/smooth_warming_up.rs`), which runs
/// this arithmetic on words of its own.
#[cfg(feature = "keyed")]
pub(crate) fn warming_config(
    rate: f64,
    warmup: Duration,
    cold_factor: f64,
) -> Result<(f64, Config), ConfigError> {
    let rate = check_warming(rate, warmup, cold_factor)?;
    let kind = Kind::WarmingUp {
        warmup_ns: Nanos::from_duration(warmup).as_u64() as f64,
        cold_factor,
    };
    Ok((rate, Config::new(kind, rate, 0)))
}

pub(crate) fn check_rate(rate: f64) -> Result<f64, ConfigError> {
    if rate.is_nan() || rate <= 0.0 {
        Err(ConfigError::RateNotPositive(rate)) // NaN, zeros and negatives
    } else if rate.is_finite() && !rate.is_normal() {
        // As `Limit` (D3): a subnormal rate's interval, 1/rate, is not a finite number.
        Err(ConfigError::SubnormalLimit(rate))
    } else {
        Ok(rate) // includes +inf
    }
}

/// The blocking wait: until `now + d` on the limiter's clock, with
/// [`crate::clock::sleep_until`] (a thread sleep, then a short bounded spin).
pub(super) fn sleep<C: Clock>(clock: &C, now: Nanos, d: Duration) {
    if !d.is_zero() {
        crate::clock::sleep_until(clock, now + d);
    }
}

// ---- the shared core ----------------------------------------------------------------------

/// `WARMING`: the kind, [`SmoothWarmingUp`] or [`SmoothBursty`], known when compiling, so that
/// a bursty charge carries no branch or read for the warm-up's integral. The state word first
/// (see *Layout* in the module docs).
#[repr(C)]
pub(super) struct Core<C, const WARMING: bool, P: Layout> {
    pub(super) state: P::Cell<AtomicU128>,
    pub(super) configs: ConfigSlots<CONFIG_WORDS, P>,
    /// Serializes `set_rate` only; the hot path never takes it.
    pub(super) reconfig: Mutex<()>, // off the hot path: serializes reconfigurations only
    pub(super) kind: Kind,
    pub(super) clock: C,
}

/// Why a charge's attempt must be retried, with the word to retry from.
pub(super) enum Retry {
    /// The CAS failed; the word it returned.
    Lost(u128),
    /// The word's slot had been rewritten for a later epoch; a fresh load.
    Stale(u128),
}

/// What a take decided.
pub(super) enum Take {
    /// Reserved: wait this many ns before acting.
    Granted(u64),
    /// `try_acquire` denied with nothing changed; `next_free` was this.
    Denied(u64),
    /// The debt ends past the end of representable time (`next_free` saturated at
    /// `u64::MAX` ns, ~584 years from the clock's origin): the permits never come. Nothing
    /// changed.
    Never,
}

impl<C: Clock, const WARMING: bool, P: Layout> Core<C, WARMING, P> {
    /// A limiter whose first rate is set at `now` (Guava's constructor then `setRate`: the
    /// resync at creation puts `next_free` at `now`) with `initial` stored permits, capped.
    pub(super) fn new(kind: Kind, rate: f64, initial: f64, clock: C) -> Core<C, WARMING, P> {
        debug_assert_eq!(matches!(kind, Kind::WarmingUp { .. }), WARMING);
        let now = clock.now().as_u64();
        let cfg = Config::new(kind, rate, 0);
        let frac = if cfg.inf {
            FRAC_ONE
        } else {
            cfg.frac_of(initial)
        };
        Core {
            state: P::cell(AtomicU128::new(pack(now, frac, 0))),
            configs: ConfigSlots::new(cfg.to_words()),
            reconfig: Mutex::new(()), // reconfiguration only
            kind,
            clock,
        }
    }

    #[inline]
    pub(super) fn warming(&self) -> bool {
        WARMING
    }

    /// Epoch `e`'s configuration, or `None` if its slot has been rewritten since (the word
    /// that named `e` is stale).
    #[inline]
    pub(super) fn config(&self, e: u32) -> Option<Config> {
        let words = self.configs.read(e)?;
        Some(Config::from_words(e, words, self.warming()))
    }

    /// Epoch `e`'s configuration as a charge needs it (see [`Config`]): only the slot's first
    /// words, under the same validation.
    #[inline]
    pub(super) fn charge_config(&self, e: u32) -> Option<Config> {
        let warming = self.warming();
        if warming {
            let words = self.configs.read_first::<CHARGE_WORDS_WARMING>(e)?;
            Some(Config::from_words(e, words, warming))
        } else {
            let words = self.configs.read_first::<CHARGE_WORDS_BURSTY>(e)?;
            Some(Config::from_words(e, words, warming))
        }
    }

    /// Loads the state word and the configuration of its epoch.
    #[inline]
    pub(super) fn load(&self) -> (u128, Config) {
        loop {
            let word = self.state.load(Ordering::Acquire);
            if let Some(cfg) = self.config(epoch(word)) {
                return (word, cfg);
            }
            // The slot was rewritten for epoch + 2: our word is stale, reload it.
        }
    }

    /// The one CAS loop behind reserve, acquire, try_acquire and check. With a `timeout`,
    /// Guava's `canAcquire` runs first on each word, and a denial writes nothing. Every
    /// answer that stands on the loaded word alone (a denial with its `next_free`, "never",
    /// a zero-permit request) is given inline, from that one load; only a charge, which needs
    /// the configuration and a CAS, goes on to [`Core::charge`].
    #[inline]
    pub(super) fn take(&self, now: u64, n: u32, timeout: Option<u64>) -> Take {
        let word = self.state.load(Ordering::Acquire);
        match decide(word, now, n, timeout) {
            Some(answer) => answer,
            None => self.charge(word, now, n, timeout),
        }
    }

    /// The charge of `n` permits at `now`, from `word` (loaded by [`Core::take`], which found
    /// nothing to answer from it alone): the configuration of its epoch is read (only the
    /// words a reservation uses), the reservation computed and committed with one CAS. A
    /// failed CAS, or a stale word, goes on to [`Core::charge_contended`], out of this
    /// function so that the uncontended charge carries no loop.
    #[inline(never)]
    pub(super) fn charge(&self, word: u128, now: u64, n: u32, timeout: Option<u64>) -> Take {
        match self.try_charge(word, now, n) {
            Ok(taken) => taken,
            Err(retry) => self.charge_contended(retry, now, n, timeout),
        }
    }

    /// One attempt on `word`: the answer, or the word to retry from.
    #[inline(always)]
    pub(super) fn try_charge(&self, word: u128, now: u64, n: u32) -> Result<Take, Retry> {
        let Some(c) = self.charge_config(epoch(word)) else {
            // Stale word (its slot was rewritten for epoch + 2): reload it.
            return Err(Retry::Stale(self.state.load(Ordering::Acquire)));
        };
        if c.inf {
            // Every cost is zero: nothing to write (see the module docs).
            return Ok(Take::Granted(next_free(word).saturating_sub(now)));
        }
        let (act, new) = c.reserve(word, now, n);
        match self
            .state
            .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(Take::Granted(act.saturating_sub(now))),
            Err(current) => Err(Retry::Lost(current)),
        }
    }

    /// The retry loop after a failed attempt: `Backoff` after each lost CAS (not after a
    /// reload), then, from the word to retry from, an answer from that word alone if there is
    /// one, exactly as `take` gives it, else another attempt (which reads the configuration
    /// of the word's epoch again: the slot is not written while that epoch lasts, so a re-read
    /// is a few hits in the cache).
    #[cold]
    #[inline(never)]
    pub(super) fn charge_contended(
        &self,
        mut retry: Retry,
        now: u64,
        n: u32,
        timeout: Option<u64>,
    ) -> Take {
        let backoff = Backoff::new();
        loop {
            let word = match retry {
                Retry::Lost(current) => {
                    backoff.spin();
                    current
                }
                Retry::Stale(reloaded) => reloaded,
            };
            if let Some(answer) = decide(word, now, n, timeout) {
                return answer;
            }
            match self.try_charge(word, now, n) {
                Ok(taken) => return taken,
                Err(again) => retry = again,
            }
        }
    }

    pub(super) fn reserve(&self, now: Nanos, n: u32) -> Result<Duration, WaitError> {
        if n == 0 {
            return Err(WaitError::ZeroPermits);
        }
        // Only a timeout can deny; there is none here.
        match self.take(now.as_u64(), n, None) {
            Take::Granted(ns) | Take::Denied(ns) => Ok(Duration::from_nanos(ns)),
            Take::Never => Err(self.never(n)),
        }
    }

    pub(super) fn never(&self, n: u32) -> WaitError {
        WaitError::Never {
            n,
            limit: self.load().1.rate,
        }
    }

    pub(super) fn try_acquire(
        &self,
        now: Nanos,
        n: u32,
        timeout: Duration,
    ) -> Result<Option<Duration>, WaitError> {
        if n == 0 {
            return Err(WaitError::ZeroPermits);
        }
        Ok(
            match self.take(
                now.as_u64(),
                n,
                Some(Nanos::from_duration(timeout).as_u64()),
            ) {
                Take::Granted(ns) => Some(Duration::from_nanos(ns)),
                Take::Denied(_) => None,
                Take::Never => return Err(self.never(n)),
            },
        )
    }

    #[inline]
    pub(super) fn check(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        match self.take(now.as_u64(), n, Some(0)) {
            Take::Granted(_) => Ok(()),
            Take::Denied(next) => Err(Denied::new(now, Some(Nanos::new(next)))),
            Take::Never => Err(Denied::new(now, None)),
        }
    }

    pub(super) fn stored_permits_at(&self, now: Nanos) -> f64 {
        let (word, cfg) = self.load();
        if cfg.inf {
            cfg.max_permits
        } else {
            cfg.stored(cfg.resync(word, now.as_u64()).1)
        }
    }

    /// Guava's `doSetRate(pps, now)`: resync at the old rate, rescale the stored permits,
    /// keep `next_free`; one CAS installs the new epoch.
    pub(super) fn set_rate(&self, now: Nanos, rate: f64) -> Result<(), ConfigError> {
        let rate = check_rate(rate)?;
        let now = now.as_u64();
        // Off the hot path: only one writer ever touches the spare slot.
        let _writer = self.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let (word, cur) = self.load();
            let next_cfg = Config::new(self.kind, rate, (cur.epoch + 1) & EPOCH_MASK);
            let (next, frac) = if cur.inf {
                (next_free(word).max(now), frac(word))
            } else {
                cur.resync(word, now)
            };
            let bursty = !self.warming();
            let frac = if next_cfg.inf {
                FRAC_ONE // D9: +inf stored, never NaN
            } else if cur.max_permits == f64::INFINITY {
                if bursty {
                    FRAC_ONE
                } else {
                    0
                }
            } else if cur.max_permits == 0.0 {
                if bursty {
                    0
                } else {
                    FRAC_ONE
                }
            } else {
                frac // stored * new_max / old_max: the same fraction
            };
            self.configs.write(next_cfg.epoch, next_cfg.to_words());
            let new = pack(next, frac, next_cfg.epoch);
            if self
                .state
                .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Ok(());
            }
        }
    }

    pub(super) fn fmt(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // User terms: the rate, the store's capacity and its level now (resynced to the
        // clock, as `stored_permits()` reports it), and when the next permit is free.
        let (word, cfg) = self.load();
        f.debug_struct(name)
            .field("rate", &PerSec(cfg.rate))
            .field("max_permits", &cfg.max_permits)
            .field("stored_permits", &self.stored_permits_at(self.clock.now()))
            .field("next_free", &Nanos::new(next_free(word)))
            .finish()
    }
}

impl<C: Clock, const WARMING: bool, P: Layout> Core<C, WARMING, P> {
    /// [`Idle::born_at`] for both smooth limiters: `next_free = b`, the store as built (a
    /// fresh limiter's, whose construction resyncs `next_free` to its clock reading). One
    /// CAS, retried only if it fails spuriously (nobody else sees the limiter yet).
    pub(super) fn born_at(&self, b: Nanos) {
        let mut word = self.state.load(Ordering::Relaxed);
        loop {
            let new = pack(b.as_u64(), frac(word), epoch(word));
            match self
                .state
                .compare_exchange_weak(word, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    /// From one load of the state word: `None` if a debt is owed at `now` (`next_free > now`);
    /// otherwise the configuration and the stored permits at `now` (`+inf` under a `+inf`
    /// rate), the two things a fresh limiter's state is compared with.
    pub(super) fn idle_view(&self, now: Nanos) -> Option<(Config, f64)> {
        let (word, cfg) = self.load();
        let now = now.as_u64();
        if next_free(word) > now {
            return None;
        }
        let stored = if cfg.inf {
            cfg.max_permits
        } else {
            cfg.stored(cfg.resync(word, now).1)
        };
        Some((cfg, stored))
    }
}
