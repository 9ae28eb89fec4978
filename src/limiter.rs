//! The one trait every in-process limiter implements: a non-blocking check of `n` permits that,
//! on denial, says when a retry could succeed. Keyed limiters, the tower layer, the benchmarks
//! and the shootout are written against it.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Nanos;

/// A denied check, with the earliest time a retry could succeed (what `Retry-After` needs).
///
/// ```
/// use turnstile::{Limit, Limiter, TokenBucket};
/// use turnstile::clock::{ManualClock, Nanos};
///
/// let clock = ManualClock::new(Nanos::ZERO);
/// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 1).clock(clock).build();
/// assert!(tb.check_n_at(Nanos::ZERO, 1).is_ok());
/// let denied = tb.check_n_at(Nanos::ZERO, 1).unwrap_err();
/// assert_eq!(denied.retry_after(), Some(std::time::Duration::from_millis(100)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a denial says when to retry: answer the request with it (see `retry_after_secs`)"]
pub struct Denied {
    at: Nanos,
    retry_at: Option<Nanos>,
}

impl Denied {
    /// A denial decided at `at`; `retry_at` is `None` when no retry can ever succeed.
    pub fn new(at: Nanos, retry_at: Option<Nanos>) -> Denied {
        Denied { at, retry_at }
    }

    /// The time of the check that was denied.
    pub fn checked_at(&self) -> Nanos {
        self.at
    }

    /// The earliest time a retry of the same check could succeed if nobody else takes
    /// permits meanwhile; `None` if it never can (more than the burst, or a zero rate).
    pub fn retry_at(&self) -> Option<Nanos> {
        self.retry_at
    }

    /// How long after the check to retry; `None` if a retry can never succeed.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_at.map(|t| t.saturating_duration_since(self.at))
    }

    /// [`Denied::retry_after`] in whole seconds, rounded **up**: the value of an HTTP
    /// `Retry-After` header (RFC 9110 §10.2.3 takes whole seconds, and rounding down would
    /// send the client back before a retry can succeed). Any wait above a whole number of
    /// seconds counts as the next second: 1 ns is 1, exactly 2 s is 2, and no wait at all
    /// is 0. `None` if a retry can never succeed.
    ///
    /// ```
    /// use turnstile::{Denied, Nanos};
    ///
    /// let at = Nanos::new(5_000_000_000);
    /// assert_eq!(Denied::new(at, Some(Nanos::new(5_000_000_001))).retry_after_secs(), Some(1));
    /// assert_eq!(Denied::new(at, Some(Nanos::new(7_000_000_000))).retry_after_secs(), Some(2));
    /// assert_eq!(Denied::new(at, Some(at)).retry_after_secs(), Some(0));
    /// assert_eq!(Denied::new(at, None).retry_after_secs(), None);
    /// ```
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_at.map(|t| {
            t.as_u64()
                .saturating_sub(self.at.as_u64())
                .div_ceil(1_000_000_000)
        })
    }
}

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.retry_after() {
            Some(d) => write!(f, "rate limited; retry after {d:?}"),
            None => f.write_str("rate limited; a retry can never succeed"),
        }
    }
}

impl std::error::Error for Denied {}

/// A non-blocking check of `n` permits, implemented by every in-process turnstile limiter and
/// by its mutex twin.
///
/// ```
/// use turnstile::{Limit, Limiter, TokenBucket};
///
/// fn admit<L: Limiter>(l: &L) -> bool {
///     l.check().is_ok()
/// }
/// let tb = TokenBucket::new(Limit::per_second(100.0).unwrap(), 10);
/// assert!(admit(&tb));
/// ```
pub trait Limiter: Send + Sync {
    /// Takes `n` permits at `now` if they are available, changing nothing if they are not.
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied>;

    /// The limiter's clock reading.
    fn now(&self) -> Nanos;

    /// [`Limiter::check_n_at`] at the limiter's clock.
    #[inline]
    fn check_n(&self, n: u32) -> Result<(), Denied> {
        self.check_n_at(self.now(), n)
    }

    /// One permit at the limiter's clock.
    #[inline]
    fn check(&self) -> Result<(), Denied> {
        self.check_n(1)
    }

    /// Takes `n` permits at `now` for use up to `max_wait` later: `Ok(at)`, the instant from
    /// which they may be used (`now` if at once, at most `now + max_wait`); `Err` when they
    /// cannot be had within `max_wait`, changing nothing. A waiter that gives up gives them
    /// back with [`Limiter::refund_n_at`]. What a pacing middleware needs (x/time/rate's
    /// `ReserveN` with a deadline). The default reserves nothing ahead: it is
    /// [`Limiter::check_n_at`], at `now`.
    fn schedule_n_at(&self, now: Nanos, n: u32, max_wait: Duration) -> Result<Nanos, Denied> {
        let _ = max_wait;
        self.check_n_at(now, n).map(|()| now)
    }

    /// What a client may be told of this limit at `now`: the fields of the IETF `RateLimit`
    /// and `RateLimit-Policy` headers (quota, window, remaining, reset), from the limiter's
    /// own state. `None` (the default) when the limiter cannot say exactly.
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        let _ = now;
        None
    }

    /// Gives back `n` permits that a successful [`Limiter::check_n_at`] took, as if that check
    /// had not been made: for a request that another limit then refused (a per-client limit
    /// and a global one: the refused request must take nothing from either). Returns whether
    /// it did; `false` (the default) for a limiter that cannot undo a grant exactly, which then
    /// keeps what it gave. Never gives back more than was taken: calling it for permits that
    /// were not taken is a logic error that may let that many extra requests through.
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        let _ = (now, n);
        false
    }
}

/// A limiter whose [`Limiter::refund_n_at`] gives back what a check granted, so that a request
/// another limit refuses takes nothing from this one: [`TokenBucket`](crate::TokenBucket),
/// [`LeakyMeter`](crate::LeakyMeter), and the windows, [`FixedWindow`](crate::FixedWindow)
/// and [`SlidingWindow`](crate::SlidingWindow), which refund into the window the grant was
/// counted in while it lasts. The others ([`LeakyBucket`](crate::LeakyBucket), the smooth
/// limiters) keep what they give: their `refund_n_at` is `false`, and they do not implement
/// this. What the tower layer's `PolicyExt::and` (feature `tower`) requires of its first
/// policy's limiter.
///
/// ```
/// use turnstile::{Limit, Limiter, ManualClock, Nanos, Refund, TokenBucket};
///
/// fn check_both(a: &impl Refund, b: &impl Limiter, now: Nanos) -> bool {
///     if a.check_n_at(now, 1).is_err() {
///         return false;
///     }
///     if b.check_n_at(now, 1).is_err() {
///         a.refund_n_at(now, 1); // b refused: a gives its permit back
///         return false;
///     }
///     true
/// }
/// let limit = Limit::per_second(1.0).unwrap();
/// let a = TokenBucket::builder(limit, 1).clock(ManualClock::default()).build();
/// let b = TokenBucket::builder(Limit::ZERO, 0).clock(ManualClock::default()).build();
/// assert!(!check_both(&a, &b, Nanos::ZERO));
/// assert_eq!(a.tokens_at(Nanos::ZERO), 1.0); // still there
/// ```
pub trait Refund: Limiter {}

impl<L: Refund + ?Sized> Refund for Box<L> {}
impl<L: Refund + ?Sized> Refund for Arc<L> {}

/// A limit as a client may be told of it: the fields of the IETF RateLimit header fields
/// (draft-ietf-httpapi-ratelimit-headers): `RateLimit-Policy: "name";q=quota;w=window` and
/// `RateLimit: "name";r=remaining;t=reset`. What each field means for each limiter is in its
/// [`Limiter::quota_at`].
///
/// ```
/// use std::time::Duration;
/// use turnstile::QuotaStatus;
///
/// let s = QuotaStatus { quota: 10, window: Duration::from_secs(1), remaining: 3, reset: Duration::from_millis(700) };
/// assert_eq!((s.window_secs(), s.reset_secs()), (1, 1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaStatus {
    /// `q`: the most permits the limit grants at once (a bucket's burst, a window's quota).
    pub quota: u64,
    /// `w`: the span the quota is measured over (a window's length; for a bucket, the time it
    /// takes to refill from empty, `burst / rate`).
    pub window: Duration,
    /// `r`: permits that would be granted now.
    pub remaining: u64,
    /// `t`: until the quota is whole again (a bucket full, a window over).
    pub reset: Duration,
}

impl QuotaStatus {
    /// The window in whole seconds, rounded up (the headers carry integers), at least 1.
    pub fn window_secs(&self) -> u64 {
        ceil_secs(self.window).max(1)
    }

    /// The reset in whole seconds, rounded up: a client that waits that long finds the
    /// quota whole. Saturates at `u64::MAX` (a reset that never comes is `Duration::MAX`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::QuotaStatus;
    /// let never = QuotaStatus { quota: 1, window: Duration::MAX, remaining: 0, reset: Duration::MAX };
    /// assert_eq!((never.window_secs(), never.reset_secs()), (u64::MAX, u64::MAX));
    /// ```
    pub fn reset_secs(&self) -> u64 {
        ceil_secs(self.reset)
    }
}

/// Whole seconds, rounded up; saturates (a `Duration::MAX` reset, a bucket that never
/// refills, is `u64::MAX` seconds rather than an overflow).
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// A limiter that can tell when it has nothing left to remember, so that a keyed map may drop
/// it and build a fresh one the next time its key is seen (see `Keyed`, feature `keyed`).
///
/// `is_idle_at(now)` is true only when a freshly built limiter, put in this one's place at
/// `now`, would refuse everything this one would refuse from `now` on: dropping an idle limiter
/// never lets more through. For most limiters the two are then indistinguishable; where a
/// limiter banks credit while idle (a leaky bucket's slack, a `SmoothBursty`'s stored
/// permits), the fresh one is stricter, and its docs say so.
///
/// Idleness must persist: a limiter idle at `t` and not used since is idle at every later
/// time (every turnstile limiter's is).
///
/// [`Idle::born_at`] is the other half: it dates a fresh limiter, so that a clock reading
/// older than its birth cannot find it more generous than the limiter it replaced (the keyed
/// map's guarantee, stated and proved in `src/keyed/mod.rs`).
///
/// ```
/// use turnstile::{Idle, Limit, Limiter, TokenBucket};
/// use turnstile::clock::{ManualClock, Nanos};
///
/// let tb = TokenBucket::builder(Limit::per_second(10.0).unwrap(), 1).clock(ManualClock::default()).build();
/// assert!(tb.is_idle_at(Nanos::ZERO)); // full, as new
/// tb.check_n_at(Nanos::ZERO, 1).unwrap();
/// assert!(!tb.is_idle_at(Nanos::ZERO));
/// assert!(tb.is_idle_at(Nanos::new(100_000_000))); // refilled
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot tell when it is idle, so a keyed map cannot evict it",
    note = "for limiters of different types per key, use `Box<dyn PerKeyLimiter>` or \
            `Arc<dyn PerKeyLimiter>` (a `Limiter` that is also `Idle`), not `Box<dyn Limiter>`"
)]
pub trait Idle {
    /// True if replacing this limiter by a fresh one at `now` could not let more requests
    /// through.
    fn is_idle_at(&self, now: Nanos) -> bool;

    /// Dates this **fresh, not yet shared** limiter to its birth at `b` (a keyed map calls it
    /// on the factory's limiter before publishing it). Afterwards:
    ///
    /// * from `b` on it behaves as a limiter built at `b` and first used then (the leaky
    ///   bucket, which has no clock reading of its own before its first permit, as one whose
    ///   last permit was one pace before `b`: see its impl);
    /// * its state is at least as restrictive as the state of *any* limiter of the same
    ///   configuration that was idle at some `j <= b`, advanced to `b`: the quantity each
    ///   limiter's budget proof counts from (a token bucket's `tat`, a leaky bucket's `next`,
    ///   a smooth limiter's `next_free`, a window's end or index) is at least that limiter's.
    ///   So a reading `t < b` (a clock read by a thread that then stalled) gets no more than
    ///   the replaced limiter's history allows: the key's grants keep the limiter's own bound
    ///   over every span, across any number of replacements.
    ///
    /// Limiters whose decisions do not depend on time (or that keep no state) do nothing.
    ///
    /// ```
    /// use turnstile::{Idle, Limit, Limiter, ManualClock, Nanos, TokenBucket};
    ///
    /// let limit = Limit::per_second(10.0).unwrap();
    /// let mut tb = TokenBucket::builder(limit, 2).clock(ManualClock::default()).build();
    /// tb.born_at(Nanos::new(1_000_000_000));
    /// assert!(tb.is_idle_at(Nanos::new(1_000_000_000)));                // full at its birth
    /// assert_eq!(tb.tokens_at(Nanos::new(900_000_000)), 1.0);           // and not before
    /// assert!(tb.check_n_at(Nanos::new(900_000_000), 2).is_err());      // a stale reading
    /// ```
    fn born_at(&mut self, b: Nanos);
}

/// A pointer to a limiter is a limiter: every method forwards, so a limiter's own overrides
/// (a `check_n` that reads its clock once) are kept.
macro_rules! forward_limiter {
    ($(#[$doc:meta])* $ptr:ident) => {
        $(#[$doc])*
        impl<L: Limiter + ?Sized> Limiter for $ptr<L> {
            #[inline]
            fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
                (**self).check_n_at(now, n)
            }

            #[inline]
            fn now(&self) -> Nanos {
                (**self).now()
            }

            #[inline]
            fn check_n(&self, n: u32) -> Result<(), Denied> {
                (**self).check_n(n)
            }

            #[inline]
            fn check(&self) -> Result<(), Denied> {
                (**self).check()
            }

            #[inline]
            fn schedule_n_at(
                &self,
                now: Nanos,
                n: u32,
                max_wait: Duration,
            ) -> Result<Nanos, Denied> {
                (**self).schedule_n_at(now, n, max_wait)
            }

            #[inline]
            fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
                (**self).quota_at(now)
            }

            #[inline]
            fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
                (**self).refund_n_at(now, n)
            }
        }
    };
}

forward_limiter!(
    /// A boxed limiter is a limiter: so is `Box<dyn PerKeyLimiter>`, which lets one
    /// [`Keyed`](crate::Keyed) map hold different limiter types for different keys (see
    /// [`PerKeyLimiter`]). Every method forwards, including the provided ones, so a limiter that
    /// overrides them keeps its overrides.
    ///
    /// ```
    /// use turnstile::{Limit, Limiter, TokenBucket};
    ///
    /// let l: Box<dyn Limiter> = Box::new(TokenBucket::new(Limit::per_second(1.0).unwrap(), 1));
    /// assert!(l.check().is_ok());
    /// assert!(l.check().is_err());
    /// ```
    Box
);

forward_limiter!(
    /// A shared limiter is a limiter: `Arc<dyn Limiter>`, or one limiter shared by several keys
    /// of a [`Keyed`](crate::Keyed) map (a group quota), or by a map and other code.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use turnstile::{Limit, Limiter, TokenBucket};
    ///
    /// let shared = Arc::new(TokenBucket::new(Limit::per_second(1.0).unwrap(), 1));
    /// let l: Arc<dyn Limiter> = shared.clone();
    /// assert!(l.check().is_ok());
    /// assert!(shared.check().is_err()); // one bucket
    /// ```
    Arc
);

/// Forwards to the boxed limiter, [`Idle::born_at`] included (a box returned by a keyed map's
/// factory is the sole owner of a fresh limiter).
///
/// ```
/// use turnstile::{Idle, Limit, Limiter, ManualClock, Nanos, TokenBucket};
///
/// let tb = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1).clock(ManualClock::default()).build();
/// let mut l: Box<TokenBucket<ManualClock>> = Box::new(tb);
/// l.born_at(Nanos::new(1_000_000_000));
/// assert!(l.check_n_at(Nanos::new(500_000_000), 1).is_err()); // dated: a stale reading
/// ```
impl<L: Idle + ?Sized> Idle for Box<L> {
    #[inline]
    fn is_idle_at(&self, now: Nanos) -> bool {
        (**self).is_idle_at(now)
    }

    fn born_at(&mut self, b: Nanos) {
        (**self).born_at(b)
    }
}

/// Forwards [`Idle::is_idle_at`]; [`Idle::born_at`] dates the limiter only if this `Arc` is
/// its sole owner ([`Arc::get_mut`]), as a freshly built one is. A limiter the factory
/// shares (the same `Arc` cloned into several keys, a group quota) is not fresh: it keeps its
/// state across an eviction of any key that holds it, because the key's next entry is the
/// same limiter, so there is nothing to date and the keyed map's guarantee holds as is.
///
/// ```
/// use std::sync::Arc;
/// use turnstile::{Idle, Limit, Limiter, ManualClock, Nanos, TokenBucket};
///
/// let limit = Limit::per_second(1.0).unwrap();
/// let mut fresh = Arc::new(TokenBucket::builder(limit, 1).clock(ManualClock::default()).build());
/// fresh.born_at(Nanos::new(1_000_000_000)); // sole owner: dated
/// assert!(fresh.check_n_at(Nanos::new(500_000_000), 1).is_err());
///
/// let mut shared = Arc::new(TokenBucket::builder(limit, 1).clock(ManualClock::default()).build());
/// let other = shared.clone();
/// shared.born_at(Nanos::new(1_000_000_000)); // shared: left as it is
/// assert!(other.check_n_at(Nanos::new(500_000_000), 1).is_ok());
/// ```
impl<L: Idle + ?Sized> Idle for Arc<L> {
    #[inline]
    fn is_idle_at(&self, now: Nanos) -> bool {
        (**self).is_idle_at(now)
    }

    fn born_at(&mut self, b: Nanos) {
        if let Some(l) = Arc::get_mut(self) {
            l.born_at(b);
        }
    }
}

/// A limiter a [`Keyed`](crate::Keyed) map holds for one key: [`Limiter`] and [`Idle`] in one
/// object-safe trait, for the trait objects such a map can hold: `Box<dyn PerKeyLimiter>` (or `Arc<dyn PerKeyLimiter>`)
/// is a `Limiter + Idle`, so a map whose factory builds a different limiter type for
/// different keys is `Keyed<K, Box<dyn PerKeyLimiter>>`. (Rust allows only one non-auto trait
/// in a `dyn` type, so `dyn Limiter + Idle` cannot be written.) Every `Limiter + Idle`
/// implements it; nothing to implement by hand.
///
/// The price of the box is one allocation per key, made when the key's limiter is built
/// (not on checks), and a virtual call per check.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{FixedWindow, Keyed, PerKeyLimiter, Limit, TokenBucket};
///
/// // Paying users get a token bucket, everyone else 2 requests a minute.
/// let per_user: Keyed<String, Box<dyn PerKeyLimiter>> =
///     Keyed::new(|user: &String| -> Box<dyn PerKeyLimiter> {
///         if user.starts_with("paid:") {
///             Box::new(TokenBucket::new(Limit::per_second(100.0).unwrap(), 10))
///         } else {
///             Box::new(FixedWindow::new(2, Duration::from_secs(60)).unwrap())
///         }
///     });
/// for _ in 0..10 {
///     assert!(per_user.check("paid:ada").is_ok());
/// }
/// assert!(per_user.check("free:bob").is_ok());
/// assert!(per_user.check("free:bob").is_ok());
/// assert!(per_user.check("free:bob").is_err());
/// ```
pub trait PerKeyLimiter: Limiter + Idle {}

impl<L: Limiter + Idle + ?Sized> PerKeyLimiter for L {}
