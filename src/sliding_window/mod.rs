//! A lock-free sliding-window counter: at most `quota` requests per `period`, where the
//! previous window's count is weighted by how much of it the sliding window still overlaps
//! (the approximation Cloudflare described, kept instead of a log of every request).
//!
//! # The rule
//!
//! Time is cut into aligned windows `[kP, (k+1)P)` on the limiter's clock (`P` the period in
//! nanoseconds, `k = now / P`). The limiter remembers the counts granted in the current window
//! and the one before it, `(k, prev, curr)`. A check of `n` at `now`, in window `j` at offset
//! `e = now - jP`, first rolls the state forward:
//!
//! ```text
//! j == k      -> (prev, curr)           unchanged
//! j == k + 1  -> (curr, 0)              the current window became the previous one
//! j >  k + 1  -> (0, 0)                 both are long gone
//! ```
//!
//! and grants iff the weighted count stays within the quota,
//!
//! ```text
//! prev * (P - e) / P + curr + n <= quota,   computed exactly as
//! prev * (P - e) + (curr + n) * P <= quota * P     in u128 integers
//! ```
//!
//! then adds `n` to `curr`. There is no floating point anywhere, so the lock-free limiter and
//! its mutex twin (`reference::SlidingWindow`) agree to the request. A check of `n = 0`
//! is always granted and writes nothing; `n > quota` is never granted.
//!
//! **An earlier time never frees capacity.** A `now` before the start of the state's window
//! (a racing thread's clock read that lost the race to a thread already in a later window) is
//! judged as at the start of the state's window (`e = 0`), where the previous window weighs the
//! most: it is counted in the later window, never rolled back into an earlier one.
//!
//! **Denials** write nothing and carry the exact retry time: the smallest `t >= now` at which
//! the same check would pass if nothing else is taken. It is inside the current window if
//! `curr + n <= quota` and the previous window's weight decays enough before the window ends;
//! else in the next window (where `prev' = curr`, `curr' = 0`), as soon as `curr`'s weight
//! decays enough; else at the start of the window after (both counts 0). It is `None` if
//! `n > quota`, or if that time is past the end of representable time.
//!
//! # The exact guarantee
//!
//! People ask for "never more than `quota` in any period" (governor issue #219 is the usual
//! thread). This limiter promises less, and exactly this (`Q` = quota; times are the times
//! grants were judged at, see the clamp above):
//!
//! 1. **Each aligned window holds at most `Q` grants** (`curr <= Q` after every grant).
//! 2. **At every grant**, `prev * (P - e) / P + curr <= Q`.
//! 3. **Any span of length `P` holds at most `Q + prev * f` grants, `< 2Q`**, where `f` is the
//!    fraction of the later window the span covers. Derivation: a span `[s, s + P)` that is
//!    not aligned starts at offset `e` of some window `j - 1` and ends at offset `e` of window
//!    `j`. It holds the grants of window `j - 1` at offsets `>= e` (at most `prev`, all of
//!    them) and those of window `j` at offsets `< e`. The last of those, at offset `e_g < e`,
//!    passed rule 2: `curr <= Q - prev * (P - e_g) / P <= Q - prev * (P - e) / P`. Sum:
//!    `prev + Q - prev * (P - e) / P = Q + prev * e / P`, and `e < P`, `prev <= Q`, so at most
//!    `2Q - 1`. The worst case is real: all of window `j - 1`'s grants at its very end, then
//!    a window `j` that the rule lets fill almost to `Q` as `prev`'s weight decays.
//! 4. **Exactly `<= Q` in every span of length `P`** only if the previous window's grants were
//!    spread evenly over it: then about `prev * (P - e) / P` of them fall in the span, which is
//!    the weight rule 2 charged.
//!
//! Use the sliding window for what it is good at: a quota per period that a client can read
//! back ([`SlidingWindow::status`], the `RateLimit-*` headers), with no cliff at window
//! boundaries (a fixed window allows `2Q` back to back across every boundary; this one does
//! only for adversarial timing) and 16 bytes of state. When the bound must hold **strictly in
//! every span**, use a rate-based limiter instead: a [`crate::TokenBucket`] (GCRA, as in
//! governor) with burst `b` and rate `r` admits at most about `b + r * d` in any span `d`, so
//! `b + r * P <= Q` gives a strict bound of `Q` per span `P` (at the price of a smaller burst);
//! a [`crate::LeakyBucket`] without slack at `Q` per `P` spaces grants `P / Q` apart.
//!
//! # The protocol
//!
//! **The state word** (`state`, one `AtomicU128`, cache-padded unless the layout is
//! [`Compact`]):
//! ```text
//!  127                       64 63            32 31             0
//! +---------------------------+----------------+----------------+
//! | k: window index (now / P) | prev: u32      | curr: u32      |
//! +---------------------------+----------------+----------------+
//!   initial: k = 0, prev = 0, curr = 0 (a fresh limiter at any time rolls to (j, 0, 0))
//! ```
//! `k` fits: `k <= now <= u64::MAX`. A period longer than `2^64` ns (~584 years) is used as
//! `2^64` ns: either way no clock reading leaves window 0, so nothing changes.
//!
//! **Layout.** A check reads the state word and the rule (`P`, then the quota), nothing else,
//! and the limiter is `repr(C)` with those first: 36 bytes from the start of a [`Compact`]
//! limiter, so that in a keyed map's slot (its own state word, then the limiter 16 bytes in,
//! the state word's alignment) a check and its refusal's retry time read one cache line.
//! The period as configured and the clock, which no check reads, come after.
//!
//! **Invariant.** `prev <= Q` and `curr <= Q`, and the committed states form one sequence in
//! which `k` never decreases and, for one `k`, `curr` only grows: every committed state is the
//! roll of the state it replaced to `max(k, now / P)`, plus the grant. So the grants counted in
//! `curr` for window `k` are exactly the grants committed while the word held `k`, and each
//! was checked against the `prev` and `curr` it was added to.
//!
//! **The CAS loop.** A check loads the word, rolls it to its own `now`, decides, and on a
//! grant commits `(j, prev', curr' + n)` with one `compare_exchange_weak`; a failed CAS
//! retries from the value it returned (with a [`Backoff`]), keeping its `now`. A grant
//! linearizes at its CAS, judged at its `now` clamped up to the start of the window it read. A
//! denial (decided from one load, or from the value a failed CAS returned), a zero-permit
//! check and every read ([`SlidingWindow::status_at`], [`Idle::is_idle_at`], `Debug`) write
//! nothing and linearize at that load. Rolling is never written on its own: the rolled state
//! is equivalent to the stored one at every time from its window on. Rolling divides nothing
//! for a reading in the state's window or the next one (it is placed by its offset from the
//! window's start `k * P`); only a reading two or more windows on divides by `P`, and a
//! denial's retry time divides once, in `u64` whenever the numbers fit.
//!
//! **Orderings.** Every access is `Relaxed`, as in [`crate::leaky_bucket`]: the word
//! publishes no other memory (the quota and period are immutable and reach other threads with
//! the limiter itself). What the protocol needs is single-location coherence, which every
//! ordering provides: a CAS succeeds only against the latest value in the word's modification
//! order, so the committed states form the sequence the invariant speaks of and no grant is
//! lost or counted twice; a stale load only makes the CAS fail (the retry starts from the
//! current value) or yields a denial, which is the answer the limiter gave at that point of
//! the modification order; and a load returns at least the value of any write that
//! happens-before it, so a caller that synchronized with a grant sees that grant.

use std::fmt;
use std::time::Duration;

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::fixed_window::WindowStatus;
use crate::layout::{Compact, Layout, Padded};
use crate::limiter::{Denied, Idle, Limiter, QuotaStatus};
use crate::sync::{AtomicU128, Ordering};

mod rule;

pub(crate) use rule::{quota_status, validate, Counts, Rule, View};

/// A lock-free sliding-window counter: at most `quota` per `period`, the previous window's
/// count weighted by how much of it the sliding window overlaps. What that guarantees, exactly
/// (at most `quota` per aligned window; under `2 * quota` in any span of one period), is in
/// the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ManualClock, Nanos, SlidingWindow};
///
/// let sw = SlidingWindow::builder(5, Duration::from_secs(1))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let t0 = Nanos::new(1_000_000_000);               // the start of window 1
/// for _ in 0..5 {
///     assert!(sw.allow_at(t0));
/// }
/// assert!(!sw.allow_at(t0));                        // the window's quota is spent
///
/// // Half-way through window 2 the 5 of window 1 weigh 2.5: 2 more fit (4.5), 3 do not.
/// let t1 = t0 + Duration::from_millis(1_500);
/// assert!(!sw.allow_n_at(t1, 3));
/// assert!(sw.allow_n_at(t1, 2));
/// assert!(!sw.allow_at(t1));
/// ```
#[repr(C)] // what a check reads first: one cache line in a keyed map's slot (module docs)
pub struct SlidingWindow<C: Clock = QuantaClock, P: Layout = Padded> {
    /// `(k, prev, curr)` packed; see the module docs.
    /// Cache-padded unless `P` is [`Compact`].
    state: P::Cell<AtomicU128>,
    rule: Rule,
    period: Duration,
    clock: C,
}

impl SlidingWindow<QuantaClock> {
    /// `quota` per `period` on the shared quanta clock. A quota of 0 is
    /// [`ConfigError::ZeroQuota`], a period of 0 [`ConfigError::ZeroPeriod`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, SlidingWindow};
    ///
    /// let sw = SlidingWindow::new(100, Duration::from_secs(60)).unwrap();
    /// assert_eq!(sw.quota(), 100);
    /// assert_eq!(SlidingWindow::new(0, Duration::from_secs(1)).unwrap_err(), ConfigError::ZeroQuota);
    /// assert_eq!(SlidingWindow::new(1, Duration::ZERO).unwrap_err(), ConfigError::ZeroPeriod);
    /// ```
    pub fn new(quota: u32, period: Duration) -> Result<SlidingWindow, ConfigError> {
        SlidingWindowBuilder::new(quota, period).build()
    }

    /// A builder for `quota` per `period`, with the option `clock`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, ManualClock, Nanos, SlidingWindow};
    ///
    /// let sw = SlidingWindow::builder(3, Duration::from_millis(10))
    ///     .clock(ManualClock::new(Nanos::new(7)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(sw.clock().now(), Nanos::new(7));
    /// ```
    pub fn builder(quota: u32, period: Duration) -> SlidingWindowBuilder {
        SlidingWindowBuilder::new(quota, period)
    }
}

impl<C: Clock, P: Layout> SlidingWindow<C, P> {
    fn from_builder(b: SlidingWindowBuilder<C>) -> Result<SlidingWindow<C, P>, ConfigError> {
        b.validate()?;
        Ok(SlidingWindow {
            state: P::cell(AtomicU128::new(
                Counts {
                    k: 0,
                    prev: 0,
                    curr: 0,
                }
                .pack(),
            )),
            rule: Rule::new(b.quota, b.period),
            period: b.period,
            clock: b.clock,
        })
    }

    /// The limiter's clock. Its [`Clock::now`] is the time the plain (non-`_at`)
    /// methods use.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, ManualClock, Nanos, SlidingWindow};
    ///
    /// let clock = ManualClock::new(Nanos::new(9));
    /// let sw = SlidingWindow::builder(1, Duration::from_secs(1)).clock(clock).build().unwrap();
    /// assert_eq!(sw.clock().now(), Nanos::new(9));
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The most grants per aligned window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::SlidingWindow;
    /// assert_eq!(SlidingWindow::new(42, Duration::from_secs(1)).unwrap().quota(), 42);
    /// ```
    pub fn quota(&self) -> u32 {
        self.rule.quota
    }

    /// The window length, as configured.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::SlidingWindow;
    /// let sw = SlidingWindow::new(1, Duration::from_millis(250)).unwrap();
    /// assert_eq!(sw.period(), Duration::from_millis(250));
    /// ```
    pub fn period(&self) -> Duration {
        self.period
    }

    /// One request now; see [`SlidingWindow::allow_n_at`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::SlidingWindow;
    ///
    /// let sw = SlidingWindow::new(2, Duration::from_secs(3600)).unwrap();
    /// assert!(sw.allow());
    /// assert!(sw.allow());
    /// assert!(!sw.allow());
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow(&self) -> bool {
        self.allow_n_at(self.clock.now(), 1)
    }

    /// One request at `now`; see [`SlidingWindow::allow_n_at`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Nanos, SlidingWindow};
    ///
    /// let sw = SlidingWindow::builder(1, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(sw.allow_at(Nanos::new(0)));
    /// assert!(!sw.allow_at(Nanos::new(999_999_999)));
    /// assert!(!sw.allow_at(Nanos::new(1_000_000_000))); // window 0's grant weighs fully
    /// assert!(sw.allow_at(Nanos::new(2_000_000_000)));  // and is forgotten a window later
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_at(&self, now: Nanos) -> bool {
        self.allow_n_at(now, 1)
    }

    /// `n` requests now; see [`SlidingWindow::allow_n_at`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::SlidingWindow;
    ///
    /// let sw = SlidingWindow::new(10, Duration::from_secs(3600)).unwrap();
    /// assert!(sw.allow_n(7));
    /// assert!(!sw.allow_n(4));
    /// assert!(sw.allow_n(3));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n(&self, n: u32) -> bool {
        self.allow_n_at(self.clock.now(), n)
    }

    /// Grants `n` requests at `now` iff `prev * (P - e) / P + curr + n <= quota` (see the
    /// [module docs](self)), all or nothing; a denial changes nothing. `n = 0` is always
    /// granted; `n > quota` never is. A `now` before the start of the window the limiter is
    /// in is judged as at that start.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Nanos, SlidingWindow};
    ///
    /// let sw = SlidingWindow::builder(4, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let ms = |m: u64| Nanos::new(m * 1_000_000);
    /// assert!(sw.allow_n_at(ms(900), 4));
    /// // At 1.25 s window 0's 4 weigh 3: one more fits.
    /// assert!(!sw.allow_n_at(ms(1250), 2));
    /// assert!(sw.allow_n_at(ms(1250), 1));
    /// // A stale reading from window 0 is judged at 1.0 s, where the 4 weigh fully.
    /// assert!(!sw.allow_at(ms(500)));
    /// assert!(sw.allow_n_at(ms(500), 0));
    /// assert!(!sw.allow_n_at(ms(9000), 5));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n_at(&self, now: Nanos, n: u32) -> bool {
        self.check(now, n, |_, _| ()).is_ok()
    }

    /// The quota as a client should see it now; see [`SlidingWindow::status_at`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::SlidingWindow;
    ///
    /// let sw = SlidingWindow::new(10, Duration::from_secs(3600)).unwrap();
    /// assert!(sw.allow_n(3));
    /// assert_eq!(sw.status().remaining, 7);
    /// ```
    pub fn status(&self) -> WindowStatus {
        self.status_at(self.clock.now())
    }

    /// The quota as a client should see it at `now` (the `RateLimit-*` headers):
    /// `remaining` is the most [`SlidingWindow::allow_n_at`] would grant at `now`, and
    /// `resets_at` is when the weighted count reaches 0 if nothing more is taken (`now` if it
    /// is 0 already; [`Nanos::MAX`] if that is past the end of time). Writes nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Nanos, SlidingWindow, WindowStatus};
    ///
    /// let sw = SlidingWindow::builder(5, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let ms = |m: u64| Nanos::new(m * 1_000_000);
    /// assert!(sw.allow_n_at(ms(200), 5));
    /// // At 1.5 s the 5 weigh 2.5: 2 remain; the weight is gone at 2.0 s.
    /// assert_eq!(
    ///     sw.status_at(ms(1500)),
    ///     WindowStatus { quota: 5, remaining: 2, resets_at: ms(2000) }
    /// );
    /// assert!(sw.allow_at(ms(1500)));
    /// // Now window 1 has a grant of its own, which weighs until the end of window 2.
    /// assert_eq!(sw.status_at(ms(1500)).resets_at, ms(3000));
    /// ```
    pub fn status_at(&self, now: Nanos) -> WindowStatus {
        let v = self.view(now);
        self.rule.status(&v, now)
    }

    /// The raw state word as `(window index, prev, curr)`, for the loom models only
    /// (`loom-tests/tests/sliding_window.rs` checks that racing checks end in the exact state of
    /// some sequential order; `Debug` shows the state rolled to the clock, which hides it).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn loom_state(&self) -> (u64, u32, u32) {
        let s = Counts::unpack(self.state.load(Ordering::Relaxed));
        (s.k, s.prev, s.curr)
    }

    /// The state rolled to `now`, from one load.
    fn view(&self, now: Nanos) -> View {
        self.rule
            .view(Counts::unpack(self.state.load(Ordering::Relaxed)), now)
    }

    /// The CAS loop of the module docs; on a denial, `denied` of the view it was decided on
    /// (the retry time for [`Limiter::check_n_at`], nothing for `allow_n_at`), computed
    /// where the view is, so that the view never leaves registers.
    #[inline]
    fn check<R>(
        &self,
        now: Nanos,
        n: u32,
        denied: impl FnOnce(&Rule, &View) -> R,
    ) -> Result<(), R> {
        if n == 0 {
            return Ok(());
        }
        let backoff = Backoff::new();
        let mut word = self.state.load(Ordering::Relaxed);
        loop {
            let v = self.rule.view(Counts::unpack(word), now);
            if !self.rule.fits(&v, n) {
                return Err(denied(&self.rule, &v));
            }
            // fits: curr + n <= quota, so the sum is a u32.
            let next = Counts {
                k: v.j,
                prev: v.prev,
                curr: v.curr + n,
            }
            .pack();
            match self
                .state
                .compare_exchange_weak(word, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(current) => {
                    backoff.spin();
                    word = current;
                }
            }
        }
    }
}

impl<C: Clock, P: Layout> Limiter for SlidingWindow<C, P> {
    /// [`SlidingWindow::allow_n_at`], with the denial's exact retry time: the earliest time
    /// the same check would pass if nothing else is taken (`None` if `n > quota`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limiter, ManualClock, Nanos, SlidingWindow};
    ///
    /// let sw = SlidingWindow::builder(5, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let ms = |m: u64| Nanos::new(m * 1_000_000);
    /// assert!(sw.check_n_at(ms(0), 5).is_ok());
    /// // Full until the end of window 0; at 1.2 s the 5 weigh 4, and 1 more fits.
    /// let denied = sw.check_n_at(ms(500), 1).unwrap_err();
    /// assert_eq!(denied.retry_at(), Some(ms(1200)));
    /// assert_eq!(sw.check_n_at(ms(500), 6).unwrap_err().retry_at(), None);
    /// ```
    #[inline]
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        self.check(now, n, |rule, v| Denied::new(now, rule.retry_at(v, n)))
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// [`SlidingWindow::status_at`] as the IETF fields, exactly (integers throughout):
    /// `q` = the quota, `w` = the period, `r` = the largest `n` a check at `now` would grant
    /// (`floor(quota - prev * (P - e) / P - curr)`), `t` = until the weighted count is 0 if
    /// nothing more is taken (0 if it is already; the end of the current window if only the
    /// previous one weighs; else the end of the next one).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limiter, Nanos, QuotaStatus, SlidingWindow};
    /// let sw = SlidingWindow::new(5, Duration::from_secs(1)).unwrap();
    /// assert!(sw.check_n_at(Nanos::ZERO, 5).is_ok());
    /// let s = sw.quota_at(Nanos::new(1_500_000_000)).unwrap(); // the 5 weigh 2.5
    /// assert_eq!(s, QuotaStatus {
    ///     quota: 5,
    ///     window: Duration::from_secs(1),
    ///     remaining: 2,
    ///     reset: Duration::from_millis(500),
    /// });
    /// ```
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        Some(quota_status(self.status_at(now), self.period, now))
    }

    /// Takes `n` back out of the count of the window the grant went into. **`now` must be
    /// the reading the grant was made at** (the tower layer passes the check's own `now`):
    /// windows are aligned (`now / P`), so that reading names the grant's window, unless the
    /// grant was a stale reading counted in a later window. One CAS loop, as a check's.
    ///
    /// * The stored window is `now`'s (`k == now / P`): `curr` drops by `n`. Exact: windows
    ///   do not depend on who opened them, and the grant is nowhere but in `curr` (the
    ///   previous window's count and every later weighting are the same without it).
    /// * The stored window is later than `now`'s: the grant is in `curr` (a stale reading)
    ///   or in `prev` or gone; the limiter cannot tell: **`false`**, nothing changes.
    /// * The stored window is earlier (a refund at a later reading than the grant): two or
    ///   more windows back, the grant weighs nothing any more: `true`, nothing to do;
    ///   exactly one back, the grant is in that window or an older one: `false`.
    /// * `curr < n` (permits never taken): `false`. `n = 0`: `true`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limiter, Nanos, SlidingWindow};
    /// let sw = SlidingWindow::new(2, Duration::from_secs(1)).unwrap();
    /// let t = Nanos::new(400_000_000);
    /// assert!(sw.check_n_at(t, 2).is_ok());
    /// assert!(sw.refund_n_at(t, 2));
    /// assert!(sw.check_n_at(t, 2).is_ok()); // as if the first had not been made
    /// ```
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        if n == 0 {
            return true;
        }
        let backoff = Backoff::new();
        let mut word = self.state.load(Ordering::Relaxed);
        loop {
            let s = Counts::unpack(word);
            let curr = match self.rule.refund_window(s.k, now) {
                Some(true) if s.curr >= n => s.curr - n,
                Some(true) => return false,
                Some(false) => return true,
                None => return false,
            };
            let new = Counts { curr, ..s }.pack();
            match self
                .state
                .compare_exchange_weak(word, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(current) => {
                    backoff.spin();
                    word = current;
                }
            }
        }
    }
}

/// [`Limiter::refund_n_at`] gives a grant back (see there).
impl<C: Clock, P: Layout> crate::limiter::Refund for SlidingWindow<C, P> {}

impl<C: Clock, P: Layout> Idle for SlidingWindow<C, P> {
    /// True when the weighted count at `now` is 0: both counts have rolled out, and a fresh
    /// limiter decides every check from `now` on exactly as this one would. (A `now` before
    /// the stored window is never idle: a stored window always holds a grant.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Idle, ManualClock, Nanos, SlidingWindow};
    ///
    /// let sw = SlidingWindow::builder(5, Duration::from_secs(1))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(sw.is_idle_at(Nanos::ZERO));
    /// assert!(sw.allow_at(Nanos::new(100)));
    /// assert!(!sw.is_idle_at(Nanos::new(1_999_999_999))); // still weighs in window 1
    /// assert!(sw.is_idle_at(Nanos::new(2_000_000_000)));
    /// ```
    fn is_idle_at(&self, now: Nanos) -> bool {
        self.rule.load(&self.view(now)) == 0
    }

    /// Rolled to `b`'s window: `(k, prev, curr) = (b / P, 0, 0)` for a fresh limiter, which is
    /// what its first check at `b` or later sees anyway (so from `b` on nothing changes). A
    /// reading `t` before that window is judged at the window's start, as this limiter
    /// judges every reading older than its state's window (rule 1-3 of the module docs are
    /// stated in judged times). A limiter idle at `j <= b` has no grant in window `j / P - 1`
    /// or later, so the key's windows from `b / P - 1` on hold only this limiter's grants:
    /// every window's count and every grant's weighted check is the one a single limiter
    /// would have made.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Idle, Limiter, Nanos, SlidingWindow};
    /// let mut sw = SlidingWindow::new(2, Duration::from_secs(1)).unwrap();
    /// sw.born_at(Nanos::new(5_500_000_000));
    /// assert!(sw.check_n_at(Nanos::new(1_000), 2).is_ok());           // judged at 5 s
    /// assert!(sw.check_n_at(Nanos::new(5_999_999_999), 1).is_err()); // window 5 is full
    /// ```
    fn born_at(&mut self, b: Nanos) {
        let mut word = self.state.load(Ordering::Relaxed);
        loop {
            let v = self.rule.view(Counts::unpack(word), b);
            let new = Counts {
                k: v.j,
                prev: v.prev,
                curr: v.curr,
            }
            .pack();
            match self
                .state
                .compare_exchange_weak(word, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }
}

impl<C: Clock, P: Layout> fmt::Debug for SlidingWindow<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // At the clock's reading, in the algorithm's terms: the counts of the previous and
        // the current window, and the status a response header would carry.
        let now = self.clock.now();
        let v = self.view(now);
        let status = self.rule.status(&v, now);
        f.debug_struct("SlidingWindow")
            .field("quota", &self.rule.quota)
            .field("period", &self.period)
            .field("previous", &v.prev)
            .field("current", &v.curr)
            .field("remaining", &status.remaining)
            .field("resets_at", &status.resets_at)
            .finish()
    }
}

/// Builds a [`SlidingWindow`]. With the `reference` feature, the mutex twin is built from the
/// same options, with the same validation (`reference::SlidingWindow::try_from(builder)`).
///
/// ```
/// use std::time::Duration;
/// use turnstile::{ConfigError, ManualClock, SlidingWindow};
///
/// let sw = SlidingWindow::builder(10, Duration::from_secs(1))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert_eq!(sw.quota(), 10);
/// assert_eq!(
///     SlidingWindow::builder(0, Duration::ZERO).build().unwrap_err(),
///     ConfigError::ZeroQuota // the quota is checked first
/// );
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct SlidingWindowBuilder<C: Clock = QuantaClock> {
    pub(crate) quota: u32,
    pub(crate) period: Duration,
    pub(crate) clock: C,
}

impl SlidingWindowBuilder<QuantaClock> {
    /// The defaults, on the quanta clock: what `SlidingWindow::builder` starts from.
    pub(crate) fn new(quota: u32, period: Duration) -> SlidingWindowBuilder {
        SlidingWindowBuilder {
            quota,
            period,
            clock: QuantaClock::new(),
        }
    }
}

impl<C: Clock> SlidingWindowBuilder<C> {
    /// Reads time from `clock`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Clock, ManualClock, Nanos, SlidingWindow};
    /// let sw = SlidingWindow::builder(2, Duration::from_secs(1))
    ///     .clock(ManualClock::new(Nanos::new(3)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(sw.clock().now(), Nanos::new(3));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> SlidingWindowBuilder<D> {
        SlidingWindowBuilder {
            quota: self.quota,
            period: self.period,
            clock,
        }
    }

    /// The settings' checks, shared with the twin's builder: quota 0, then period 0.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        validate(self.quota, self.period)
    }

    /// The limiter, or the first setting that cannot be used: a quota of 0
    /// ([`ConfigError::ZeroQuota`]) or a period of 0 ([`ConfigError::ZeroPeriod`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ConfigError, SlidingWindow};
    /// assert!(SlidingWindow::builder(1, Duration::from_nanos(1)).build().is_ok());
    /// assert_eq!(
    ///     SlidingWindow::builder(1, Duration::ZERO).build().unwrap_err(),
    ///     ConfigError::ZeroPeriod
    /// );
    /// ```
    pub fn build(self) -> Result<SlidingWindow<C>, ConfigError> {
        SlidingWindow::from_builder(self)
    }

    /// The limiter in the [`Compact`] layout (its state word unpadded, next to its
    /// configuration), for the many per-key limiters of a [`Keyed`](crate::Keyed) map.
    ///
    /// ```
    /// # #[cfg(feature = "keyed")] {
    /// use std::time::Duration;
    /// use turnstile::{Keyed, SlidingWindow};
    /// let per_user = Keyed::new(|_: &String| {
    ///     SlidingWindow::builder(100, Duration::from_secs(60)).build_compact().unwrap()
    /// });
    /// assert!(per_user.check("alice").is_ok());
    /// # }
    /// ```
    pub fn build_compact(self) -> Result<SlidingWindow<C, Compact>, ConfigError> {
        SlidingWindow::from_builder(self)
    }
}

/// [`SlidingWindowBuilder::build`] as a conversion, the form the mutex twin is built by too
/// (`reference::SlidingWindow`, feature `reference`): code generic over the two builds either.
impl<C: Clock> TryFrom<SlidingWindowBuilder<C>> for SlidingWindow<C> {
    type Error = ConfigError;

    fn try_from(options: SlidingWindowBuilder<C>) -> Result<SlidingWindow<C>, ConfigError> {
        options.build()
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
