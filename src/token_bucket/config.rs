//! One configuration of a token bucket, as read from its slot (`engine.rs`): the hot words
//! every check reads, the cold ones reservations and reconfigurations read, and the
//! arithmetic of a take, a cancel and a report under it.

use std::time::Duration;

use super::engine::*;
use super::reservation::Ticket;
use crate::clock::Nanos;
use crate::limit::Limit;
use crate::limiter::QuotaStatus;
use crate::scale::{Scale, D_MAX, TAU_MAX};

/// The words every check reads.
#[derive(Clone, Copy, Debug)]
pub(super) struct Hot {
    /// Nanoseconds at which `u = tau`.
    pub(super) base: u64,
    /// One more than the largest `now - base` the fast path converts; 0 under a zero or an
    /// infinite limit (everything goes to the slow path).
    pub(super) lim: u64,
    /// The scale's multiplier (0: nothing refills).
    pub(super) mul: u64,
    /// The burst in units.
    pub(super) tau: u64,
    /// Units per token: `2^k`, or a whole number of 1/16 ns below `2^31` (`src/scale.rs`).
    pub(super) one: u64,
    /// The scale's `per_shift` (0 where nothing refills), which shares a slot word with
    /// `one`: a refusal's retry time needs it.
    pub(super) per_shift: u32,
}

impl Hot {
    /// `units(d)` at this configuration's multiplier (see `scale::units`).
    #[inline(always)]
    pub(super) fn units(&self, d: u64) -> u64 {
        crate::scale::units(d, self.mul)
    }
}

/// The words only reservations, cancels and reconfigurations read.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Cold {
    /// The burst (low 32 bits), the infinite-limit flag (bit 40) and `per_shift` (bits 48..56).
    pub(super) shape: u64,
    /// The scale's inverse (ns per unit, fixed point).
    pub(super) per: u64,
    pub(super) per_shift: u32,
    /// How many infinite refills (an infinite limit with time passing, which fills the bucket)
    /// happened before this configuration. A reservation made before one took tokens that the
    /// refill has already given back, so cancelling it restores nothing.
    pub(super) inf_gen: u32,
    pub(super) limit: f64,
    /// Counts the configurations this bucket had (wrapping: a cancel would mistake a
    /// reservation 2^32 reconfigurations old for one of its own configuration).
    pub(super) epoch: u32,
    /// When this configuration took effect: rate.go's `last` for an infinite limit.
    pub(super) since: u64,
    /// The token coordinate's origin `K` (see [`Config::coord`]); `None` once overflowed.
    pub(super) origin: Option<i128>,
}

/// One configuration, as read from its slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct Config {
    pub(super) hot: Hot,
    pub(super) cold: Cold,
}

impl std::ops::Deref for Config {
    type Target = Cold;
    fn deref(&self) -> &Cold {
        &self.cold
    }
}

impl Config {
    pub(super) fn new(
        epoch: u32,
        limit: Limit,
        burst: u32,
        since: Nanos,
        inf_gen: u32,
        origin: Option<i128>,
    ) -> Config {
        let l = limit.as_f64();
        let scale = if limit.is_inf() || l == 0.0 {
            None
        } else {
            // None: refilling the burst would take longer than 146 years; acts as zero.
            Scale::new(limit, burst, FINE)
        };
        let since = since.as_u64();
        let one = scale.map_or(1 << stored_k(burst), |s| s.one);
        let cold = Cold {
            shape: u64::from(burst)
                | if limit.is_inf() { INF_BIT } else { 0 }
                | u64::from(scale.map_or(0, |s| s.per_shift)) << 48,
            per: scale.map_or(0, |s| s.per),
            per_shift: scale.map_or(0, |s| s.per_shift),
            inf_gen,
            limit: l,
            epoch,
            since,
            origin,
        };
        let hot = match scale {
            Some(s) => {
                let tau = u64::from(burst) * one;
                debug_assert!(tau <= TAU_MAX);
                let tau_ns = u64::try_from(s.nanos_ceil(tau)).unwrap_or(u64::MAX);
                let dmax = u64::try_from(s.nanos_floor(V_HOT))
                    .unwrap_or(u64::MAX)
                    .min(D_MAX);
                let base = since.saturating_sub(tau_ns.min(BASE_BACK));
                Hot {
                    base,
                    lim: (dmax + 1).min(wrap_free(base)),
                    mul: s.mul,
                    tau,
                    one,
                    per_shift: s.per_shift,
                }
            }
            // Nothing refills (a zero or an infinite limit): every check goes the slow way
            // (`lim = 0`), so that the inline paths may count on a limit that refills.
            None => Hot {
                base: since,
                lim: 0,
                mul: 0,
                tau: u64::from(burst) * one,
                one,
                per_shift: 0,
            },
        };
        Config { hot, cold }
    }

    pub(super) fn burst(&self) -> u32 {
        self.shape as u32
    }

    /// Units per token.
    pub(super) fn one(&self) -> u64 {
        self.hot.one
    }

    /// Under a zero or infinite limit, lowers `k` until `tokens` (which may be a debt)
    /// fit the word. Nothing there ever deepens a debt (a take that would is refused), so the
    /// debt at the reconfiguration is the largest the configuration will hold.
    pub(super) fn fit(&mut self, tokens: f64) {
        if self.is_finite() {
            return;
        }
        let burst = self.burst();
        let mut k = stored_k(burst);
        while k > 0 && (f64::from(burst) - tokens) * (1u64 << k) as f64 >= (X_MAX / 2) as f64 {
            k -= 1;
        }
        self.hot.tau = u64::from(burst) << k;
        self.hot.one = 1 << k;
    }

    pub(super) fn is_inf(&self) -> bool {
        self.shape & INF_BIT != 0
    }

    pub(super) fn is_finite(&self) -> bool {
        self.hot.mul != 0
    }

    pub(super) fn scale(&self) -> Scale {
        Scale {
            one: self.one(),
            mul: self.hot.mul,
            per: self.per,
            per_shift: self.per_shift,
        }
    }

    /// Whether `now` is past the hot range (a rebase is due).
    pub(super) fn is_far(&self, now: Nanos) -> bool {
        self.is_finite() && now.as_u64().saturating_sub(self.hot.base) >= self.hot.lim
    }

    /// rate.go's `reserveN` arithmetic for `n` tokens at `now` on state `x`, with the wait
    /// bounded by `max_wait` ns: every case (the fast path in `take` is its common one).
    pub(super) fn check(&self, x: u64, now: Nanos, n: u32, max_wait: u64) -> Check {
        if self.is_inf() {
            return Check::Free;
        }
        if n > self.burst() {
            return Check::Never;
        }
        if self.is_far(now) {
            return Check::Far;
        }
        // Readings before the base count as the base (module docs).
        let v = self.hot.units(now.as_u64().saturating_sub(self.hot.base));
        // x <= X_MAX, v <= 2^56 + 1, cost <= tau <= 2^55: no overflow.
        let x2 = x.max(v) + u64::from(n) * self.hot.one;
        let due = v + self.hot.tau;
        if x2 <= due {
            return Check::Take { x: x2, due };
        }
        if !self.is_finite() || x2 > X_MAX || (self.near_end() && self.time_of(x2).is_none()) {
            // D4: a zero limit never refills; or the tokens come past the word's range, or
            // past the end of time.
            return Check::Never;
        }
        let slack = if max_wait == 0 {
            0
        } else if max_wait > D_MAX {
            u64::MAX
        } else {
            self.hot.units(max_wait)
        };
        if x2 - due <= slack {
            Check::Take { x: x2, due }
        } else {
            Check::Wait { need: x2 - slack }
        }
    }

    /// `u(now)` for any `now`, in `u128`.
    pub(super) fn u_wide(&self, now: Nanos) -> u128 {
        let d = now.as_u64().saturating_sub(self.hot.base);
        u128::from(self.hot.tau) + self.scale().units_wide(d)
    }

    /// The first nanosecond at which `u` reaches `x > tau`: a retry then succeeds, since
    /// the two conversions round up (`units(ceil(d * per)) >= d`). Absolute, from the base,
    /// so a reading's own rounding to a unit does not move it: a wait of exactly one second
    /// from a whole-nanosecond reading ends on a whole nanosecond.
    /// Whether some `x <= X_MAX` may lie past the end of time: only with a base within 2^58 ns
    /// of it, or units longer than 2 ns (`per < 2^(64 - per_shift)`).
    pub(super) fn near_end(&self) -> bool {
        self.hot.base > u64::MAX - (1 << 58) || self.per_shift < 63
    }

    /// `None` past the end of time.
    pub(super) fn time_of(&self, x: u64) -> Option<Nanos> {
        let ns = u64::try_from(self.scale().nanos_ceil(x - self.hot.tau)).ok()?;
        ns.checked_add(self.hot.base).map(Nanos::new)
    }

    /// rate.go's `advance(now)`: the tokens at `now`, capped at the burst.
    pub(super) fn tokens(&self, x: u64, now: Nanos) -> f64 {
        let burst = f64::from(self.burst());
        if self.is_inf() && now.as_u64() > self.since {
            // elapsed * MaxFloat64 overflows to +Inf when time has passed since `last`.
            return burst;
        }
        // Counted in units of the token, so that a full bucket holds exactly `burst` and
        // taking n leaves exactly n fewer.
        let diff = self.u_wide(now) as i128 - i128::from(x);
        let one = i128::from(self.one());
        let (whole, part) = (diff.div_euclid(one), diff.rem_euclid(one));
        (whole as f64 + part as f64 / one as f64).min(burst)
    }

    /// The IETF RateLimit fields of state `x` at `now` (see `quota_at` for `TokenBucket`),
    /// in units: whole tokens exactly, times rounded up to the nanosecond.
    pub(super) fn quota(&self, x: u64, now: Nanos) -> QuotaStatus {
        let burst = u64::from(self.burst());
        if self.is_inf() {
            return QuotaStatus {
                quota: burst,
                window: Duration::ZERO,
                remaining: burst,
                reset: Duration::ZERO,
            };
        }
        let u = self.u_wide(now);
        let tau = u128::from(self.hot.tau);
        // The units the bucket holds at `now`, capped at the burst (a debt is negative).
        let held = (u as i128 - i128::from(x)).min(tau as i128);
        let remaining = if held <= 0 {
            0
        } else {
            (held as u128 / u128::from(self.one())) as u64
        };
        let reset = if held == tau as i128 {
            Duration::ZERO
        } else if !self.is_finite() {
            Duration::MAX
        } else {
            // Full once u reaches x + tau (x + tau < 2^58: no overflow).
            self.time_of(x + self.hot.tau)
                .map_or(Duration::MAX, |t| t.saturating_duration_since(now))
        };
        let window = if self.is_finite() {
            u64::try_from(self.scale().nanos_ceil(self.hot.tau))
                .map_or(Duration::MAX, Duration::from_nanos)
        } else {
            Duration::MAX
        };
        QuotaStatus {
            quota: burst,
            window,
            remaining,
            reset,
        }
    }

    /// Whether the bucket holds its whole burst at `now` (see [`Idle`] for `TokenBucket`):
    /// compared in units, so "full" is exact rather than a float that rounded up.
    pub(super) fn is_full(&self, x: u64, now: Nanos) -> bool {
        (self.is_inf() && now.as_u64() > self.since)
            || u128::from(x) + u128::from(self.hot.tau) <= self.u_wide(now)
    }

    /// `tokens` as units of this configuration: whole tokens exactly, the fraction
    /// truncated. Saturates.
    pub(super) fn units_of_tokens(&self, tokens: f64) -> i128 {
        let one = self.one();
        let whole = tokens.trunc();
        let exact = (whole as i128).saturating_mul(i128::from(one));
        let part = ((tokens - whole) * one as f64) as i128;
        exact.saturating_add(part)
    }

    /// The state holding `tokens` at `now` under this configuration, within the word's range.
    pub(super) fn x_from_tokens(&self, tokens: f64, now: Nanos) -> u64 {
        let u = self.u_wide(now).min(X_MAX as u128) as i128;
        (u - self.units_of_tokens(tokens)).clamp(0, X_MAX as i128) as u64
    }

    /// The earliest time `n` tokens are available at `now` on state `x` (peek).
    pub(super) fn available_at(&self, x: u64, now: Nanos, n: u32) -> Option<Nanos> {
        if self.is_inf() {
            return Some(now);
        }
        if n > self.burst() {
            return None;
        }
        let u = self.u_wide(now);
        let tau = u128::from(self.hot.tau);
        let x2 = u128::from(x).max(u - tau) + (u128::from(n) * u128::from(self.one()));
        if x2 <= u {
            Some(now)
        } else if !self.is_finite() || x2 > u128::from(X_MAX) {
            None
        } else {
            self.time_of(x2 as u64)
        }
    }

    /// The state after giving back `restore` tokens at `now` (not far), or `None` if nothing
    /// is restored.
    ///
    /// rate.go restores `n - r.limit * (lastEvent - r.timeToAct)`: the reserved tokens minus
    /// those reserved after `r` (which were promised times that assumed `r`'s tokens gone).
    /// turnstile counts those later tokens exactly ([`Config::held_after`]).
    pub(super) fn restore(&self, x: u64, now: Nanos, back: i128) -> Option<u64> {
        if back <= 0 || self.is_inf() {
            return None;
        }
        // tokens' = min(burst, tokens(now) + back)  <=>  x' = max(u(now) - tau, x - back)
        let floor = (self.u_wide(now) - u128::from(self.hot.tau)) as i128;
        Some((i128::from(x) - back).max(floor).clamp(0, X_MAX as i128) as u64)
    }

    /// The units a cancel of `r` gives back on state `x` under this configuration: `r`'s
    /// tokens minus the tokens reserved after it (rate.go's `r.limit * (lastEvent -
    /// r.timeToAct)`, exactly). Under `r`'s own configuration those are the stretch of `x`
    /// beyond `r`'s unit, in integers; across a `set_limit`/`set_burst` the distance between
    /// token coordinates. `None` if unknown (overflow), in which case nothing is restored.
    pub(super) fn give_back(&self, x: u64, r: &Ticket) -> Option<i128> {
        let one = i128::from(self.one());
        let took = i128::from(r.tokens) * one;
        if r.limit == 0.0 {
            // rate.go: a zero limit values every later span at zero tokens.
            return Some(took);
        }
        if r.epoch == self.epoch {
            return Some(took - i128::from(x.saturating_sub(r.act)));
        }
        let o = r.origin?;
        let then = o.k?.checked_add(coord_offset(r.act, o.tau, o.one))?;
        let later = self.coord(x)?.checked_sub(then)?;
        // Never more than the reservation took: a negative count restores just `n`.
        let held = later.max(0) as f64 / COORD_ONE;
        Some(self.units_of_tokens(f64::from(r.tokens) - held))
    }

    /// The **token coordinate** of the state `x`: a count, in units of 2^-32 token, that
    /// every take of `n` tokens raises by `n`, that refill does not move, and that
    /// reconfiguration keeps. With `K` = `origin`, chosen by each reconfiguration so that the
    /// state's coordinate carries over, it is `K + (x - tau) / one`: `K` minus the tokens the
    /// state holds at the base. The difference between two states' coordinates is the tokens
    /// taken between them (net of cancels), whatever limits applied in between, as long as no
    /// take found the bucket full (refill lost to the cap raises it too; while a reservation
    /// can still be cancelled, only a limit raised after it lets the bucket fill). `None` on
    /// overflow.
    pub(super) fn coord(&self, x: u64) -> Option<i128> {
        self.origin?
            .checked_add(self.coord_offset(x))
            .filter(|&c| c != i128::MIN)
    }

    /// `(x - tau) / one` in coordinate units.
    pub(super) fn coord_offset(&self, x: u64) -> i128 {
        coord_offset(x, self.hot.tau, self.hot.one)
    }

    /// `inf_gen` for a configuration that replaces this one at `now`: one more if an infinite
    /// limit has filled the bucket (rate.go's `advance` does once time has passed).
    pub(super) fn inf_gen_after(&self, now: Nanos) -> u32 {
        let filled = self.is_inf() && now.as_u64() > self.since;
        self.inf_gen.wrapping_add(u32::from(filled))
    }
}
