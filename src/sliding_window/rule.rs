//! The sliding-window counter's arithmetic, shared by [`SlidingWindow`](super::SlidingWindow)
//! and the keyed map (`src/keyed/sliding_window.rs`): the counts of the state word, a reading's view of
//! them, and the rule that grants or refuses with the exact retry time.

use std::time::Duration;

use crate::clock::Nanos;
use crate::error::ConfigError;
use crate::fixed_window::WindowStatus;
use crate::limiter::QuotaStatus;

/// The largest period used in the arithmetic: `2^64` ns. No `Nanos` reaches the end of a
/// window that long, so a longer period behaves the same.
pub(super) const MAX_PERIOD_NS: u128 = 1 << 64;

/// The three fields of the state word (also a keyed sliding window's, packed its own way:
/// `src/keyed/sliding_window.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counts {
    /// The window index `k` the counts belong to.
    pub(crate) k: u64,
    /// Grants counted in window `k - 1`.
    pub(crate) prev: u32,
    /// Grants counted in window `k`.
    pub(crate) curr: u32,
}

impl Counts {
    #[inline]
    pub(super) fn pack(self) -> u128 {
        (u128::from(self.k) << 64) | (u128::from(self.prev) << 32) | u128::from(self.curr)
    }

    #[inline]
    pub(super) fn unpack(word: u128) -> Counts {
        Counts {
            k: (word >> 64) as u64,
            prev: (word >> 32) as u32,
            curr: word as u32,
        }
    }
}

/// The state as a check at some `now` sees it: rolled into `now`'s window (or clamped to the
/// state's own window), with the offset `e` into it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View {
    /// The window the check is judged in.
    pub(crate) j: u64,
    /// Offset into window `j`, `< P`; 0 when `now` was before the window (the clamp).
    pub(crate) e: u128,
    pub(crate) prev: u32,
    pub(crate) curr: u32,
}

/// The immutable arithmetic of one limiter (all in nanoseconds, u128: every product below is
/// at most `2^33 * 2^64`, far from overflow). `P` first: it needs the u128's alignment.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct Rule {
    /// `P`, in `1..=2^64`.
    pub(crate) p: u128,
    pub(crate) quota: u32,
}

impl Rule {
    pub(crate) fn new(quota: u32, period: Duration) -> Rule {
        Rule {
            quota,
            p: period.as_nanos().clamp(1, MAX_PERIOD_NS),
        }
    }

    /// `quota * P`, the weighted budget every check is held to.
    #[inline]
    fn budget(&self) -> u128 {
        u128::from(self.quota) * self.p
    }

    /// `s` rolled to the window of `now`, or clamped to `s`'s window if `now` is earlier.
    ///
    /// The hot path divides nothing: a reading in the state's window or the next one (every
    /// check of a limiter in use) is placed by its offset from the window's start `k * P`.
    /// Only a reading two or more windows on (after an idle stretch) divides.
    #[inline]
    pub(crate) fn view(&self, s: Counts, now: Nanos) -> View {
        if let Ok(p) = u64::try_from(self.p) {
            // `k * P` fits a u64 for every stored `k` (it came from `now / P` for some `now`);
            // a `k` that does not fit goes the long way.
            if let Some(start) = s.k.checked_mul(p) {
                let now = now.as_u64();
                if now < start {
                    return View {
                        j: s.k,
                        e: 0,
                        prev: s.prev,
                        curr: s.curr,
                    };
                }
                let e = now - start;
                if e < p {
                    return View {
                        j: s.k,
                        e: u128::from(e),
                        prev: s.prev,
                        curr: s.curr,
                    };
                }
                if e - p < p {
                    // (k + 1) * P <= now, so k + 1 does not overflow.
                    return View {
                        j: s.k + 1,
                        e: u128::from(e - p),
                        prev: s.curr,
                        curr: 0,
                    };
                }
            }
        }
        self.view_by_division(s, now)
    }

    /// [`Rule::view`] the long way, dividing the reading by the period.
    #[cold]
    pub(super) fn view_by_division(&self, s: Counts, now: Nanos) -> View {
        let now = now.as_u64();
        // In u64 (a u128 division is a library call): P = 2^64 is the only period that does
        // not fit, and then every time is in window 0.
        let j = match u64::try_from(self.p) {
            Ok(p) => now / p,
            Err(_) => 0,
        };
        if j < s.k {
            return View {
                j: s.k,
                e: 0,
                prev: s.prev,
                curr: s.curr,
            };
        }
        // < P, since j = floor(now / P).
        let e = u128::from(now) - u128::from(j) * self.p;
        let (prev, curr) = match j - s.k {
            0 => (s.prev, s.curr),
            1 => (s.curr, 0),
            _ => (0, 0),
        };
        View { j, e, prev, curr }
    }

    /// The weighted count times `P`: `prev * (P - e) + curr * P`.
    #[inline]
    pub(crate) fn load(&self, v: &View) -> u128 {
        u128::from(v.prev) * (self.p - v.e) + u128::from(v.curr) * self.p
    }

    /// Whether `n` more fit at `v`: `prev * (P - e) + (curr + n) * P <= quota * P`, i.e.
    /// `curr + n <= quota` and `prev * (P - e) <= (quota - curr - n) * P`.
    #[inline]
    pub(crate) fn fits(&self, v: &View, n: u32) -> bool {
        match self.left(v.curr, n) {
            Some(left) => u128::from(v.prev) * (self.p - v.e) <= u128::from(left) * self.p,
            None => false,
        }
    }

    /// `quota - curr - n`, if `curr + n <= quota`.
    #[inline]
    fn left(&self, curr: u32, n: u32) -> Option<u32> {
        self.quota.checked_sub(curr)?.checked_sub(n)
    }

    /// How many more fit at `v`: the largest `n` with `fits(v, n)`.
    fn remaining(&self, v: &View) -> u32 {
        // <= quota, so it fits a u32.
        (self.budget().saturating_sub(self.load(v)) / self.p) as u32
    }

    /// The smallest offset `e` in `[0, P)` at which `n` fit into a window whose counts are
    /// `(prev, curr)`, if any. The condition `prev * (P - e) <= quota * P - (curr + n) * P`
    /// only gets easier as `e` grows.
    #[inline]
    fn first_fit(&self, prev: u32, curr: u32, n: u32) -> Option<u128> {
        let rest = u128::from(self.left(curr, n)?) * self.p;
        if prev == 0 {
            return Some(0);
        }
        // prev * (P - e) <= rest  <=>  P - e <= rest / prev (floor). In u64 when it fits (a
        // u128 division is a library call).
        let room = match u64::try_from(rest) {
            Ok(rest) => u128::from(rest / u64::from(prev)),
            Err(_) => rest / u128::from(prev),
        };
        if room == 0 {
            None
        } else {
            Some(self.p.saturating_sub(room))
        }
    }

    /// The smallest time `>= now` at which a check of `n`, denied at `v`, would pass if
    /// nothing else is taken; `None` if `n > quota` or past the end of time.
    #[inline]
    pub(crate) fn retry_at(&self, v: &View, n: u32) -> Option<Nanos> {
        if n > self.quota {
            return None;
        }
        let start = u128::from(v.j) * self.p;
        let t = if let Some(e) = self.first_fit(v.prev, v.curr, n) {
            // Denied at v.e and the condition is monotone in e: e > v.e.
            start + e
        } else if let Some(e) = self.first_fit(v.curr, 0, n) {
            start + self.p + e
        } else {
            // Both counts 0 and n <= quota: the start of the window after the next.
            start + 2 * self.p
        };
        u64::try_from(t).ok().map(Nanos::new)
    }

    /// When the weighted count at `v` reaches 0 if nothing more is taken: `now` if it is 0
    /// already, the end of window `j` if only `prev` weighs, else the end of window `j + 1`
    /// (`curr` weighs on until then). Saturates at [`Nanos::MAX`].
    pub(super) fn resets_at(&self, v: &View, now: Nanos) -> Nanos {
        let windows = if v.curr > 0 {
            2
        } else if v.prev > 0 {
            1
        } else {
            return now;
        };
        let t = (u128::from(v.j) + windows) * self.p;
        Nanos::new(u64::try_from(t).unwrap_or(u64::MAX))
    }

    /// Where a refund at the grant's reading `now` finds the grant, given the stored
    /// window `k` (see `refund_n_at` for `SlidingWindow`): `Some(true)` in `curr`,
    /// `Some(false)` nowhere any more (two or more windows back), `None` unknown.
    pub(super) fn refund_window(&self, k: u64, now: Nanos) -> Option<bool> {
        let j = match u64::try_from(self.p) {
            Ok(p) => now.as_u64() / p,
            Err(_) => 0,
        };
        if k == j {
            Some(true)
        } else if k < j && j - k >= 2 {
            Some(false)
        } else {
            None
        }
    }

    pub(crate) fn status(&self, v: &View, now: Nanos) -> WindowStatus {
        WindowStatus {
            quota: self.quota,
            remaining: self.remaining(v),
            resets_at: self.resets_at(v, now),
        }
    }
}

/// The checks of a sliding window's quota and period, shared with the keyed sliding window:
/// [`ConfigError::ZeroQuota`], then [`ConfigError::ZeroPeriod`].
pub(crate) fn validate(quota: u32, period: Duration) -> Result<(), ConfigError> {
    if quota == 0 {
        return Err(ConfigError::ZeroQuota);
    }
    if period.is_zero() {
        return Err(ConfigError::ZeroPeriod);
    }
    Ok(())
}

/// A status as the IETF `RateLimit` fields: `quota_at` of [`SlidingWindow`] and of the keyed
/// sliding window.
pub(crate) fn quota_status(s: WindowStatus, period: Duration, now: Nanos) -> QuotaStatus {
    QuotaStatus {
        quota: u64::from(s.quota),
        window: period,
        remaining: u64::from(s.remaining),
        reset: s.resets_after(now),
    }
}
