//! Reservations: tokens taken from a [`TokenBucket`](super::TokenBucket) to act on later, or
//! give back with `cancel`; and [`Peek`], a take's answer without the take.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::config::Config;
use super::engine::*;
use super::TokenBucket;
use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::WaitError;
use crate::layout::{Layout, Padded};
use crate::limit::Limit;

/// What [`TokenBucket::peek_n_at`] reports: nothing is consumed.
#[derive(Debug, Clone, Copy, PartialEq)]
#[must_use = "a peek changes nothing: it is only worth its answer"]
pub struct Peek {
    /// Tokens in the bucket at the peek's time (negative while reservations are outstanding).
    pub tokens: f64,
    /// The earliest time `n` tokens will be available, if they ever will be.
    pub available_at: Option<Nanos>,
}

/// Tokens taken from a [`TokenBucket`], to act on at [`Reservation::time_to_act`] or give back
/// with [`Reservation::cancel`] (rate.go's `Reservation`). It borrows its bucket; to move one
/// into another task or thread, reserve through an `Arc` with
/// [`OwnedReservation::reserve_n`], which has the same methods.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
/// let tb = TokenBucket::builder(Limit::per_second(4.0).unwrap(), 1).clock(ManualClock::default()).build();
/// let _now = tb.reserve_at(Nanos::ZERO);
/// let later = tb.reserve_at(Nanos::ZERO);
/// assert!(later.ok());
/// assert_eq!(later.time_to_act(), Some(Nanos::new(250_000_000)));
/// later.cancel_at(Nanos::ZERO);
/// assert_eq!(tb.tokens_at(Nanos::ZERO), 0.0);
/// ```
#[must_use = "a reservation holds tokens: act at its time or cancel it"]
pub struct Reservation<'a, C: Clock = QuantaClock, P: Layout = Padded> {
    pub(super) lim: &'a TokenBucket<C, P>,
    pub(super) ticket: Ticket,
}

/// A [`Reservation`] that holds its bucket through an [`Arc`] instead of a borrow, so it is
/// `Send + 'static` (when the clock is) and can move into `tokio::spawn` or
/// `std::thread::spawn`: tokio's `Semaphore::acquire_owned` convention. Made by
/// [`OwnedReservation::reserve_n`] and [`OwnedReservation::try_reserve_n`] and their `_at`
/// forms, which take the `Arc`. Its methods and its
/// semantics are exactly a `Reservation`'s, including cancel at most once (cancelling
/// consumes it). It costs one reference count on the `Arc`, taken when it is made and
/// dropped with it; nothing else differs.
///
/// ```
/// use std::sync::Arc;
/// use turnstile::{Limit, ManualClock, Nanos, OwnedReservation, TokenBucket};
/// let limit = Limit::per_second(4.0).unwrap();
/// let tb = Arc::new(TokenBucket::builder(limit, 1).clock(ManualClock::default()).build());
/// let _now = OwnedReservation::reserve_n_at(&tb, Nanos::ZERO, 1);
/// let later = OwnedReservation::reserve_n_at(&tb, Nanos::ZERO, 1);
/// assert_eq!(later.time_to_act(), Some(Nanos::new(250_000_000)));
/// // The reservation outlives this scope's borrow of `tb`: cancel it on another thread.
/// std::thread::spawn(move || later.cancel_at(Nanos::ZERO)).join().unwrap();
/// assert_eq!(tb.tokens_at(Nanos::ZERO), 0.0);
/// ```
///
/// Cancelling consumes it, so a second cancel does not compile:
///
/// ```compile_fail,E0382
/// use std::sync::Arc;
/// use turnstile::{Limit, OwnedReservation, TokenBucket};
/// let tb = Arc::new(TokenBucket::new(Limit::per_second(4.0).unwrap(), 1));
/// let r = OwnedReservation::reserve_n(&tb, 1);
/// r.cancel();
/// r.cancel(); // error[E0382]: use of moved value: `r`
/// ```
#[must_use = "a reservation holds tokens: act at its time or cancel it"]
pub struct OwnedReservation<C: Clock = QuantaClock, P: Layout = Padded> {
    pub(super) lim: Arc<TokenBucket<C, P>>,
    pub(super) ticket: Ticket,
}

/// What a reservation knows, whichever way it holds its bucket: [`Reservation`] and
/// [`OwnedReservation`] are this and a handle on the bucket.
pub(super) struct Ticket {
    pub(super) ok: bool,
    pub(super) tokens: u32,
    pub(super) time_to_act: Nanos,
    /// Whether tokens were taken from the bucket (not under an infinite limit, not n = 0).
    pub(super) took: bool,
    pub(super) limit: f64,
    /// The configuration epoch it was made in, and that configuration's count of infinite
    /// refills.
    pub(super) epoch: u32,
    pub(super) inf_gen: u32,
    /// The exact unit at which it acts, `max(tat, now)`: a cancel under the same
    /// configuration counts the tokens reserved after it from there.
    pub(super) act: u64,
    /// What places `act` on the token coordinate, for a cancel under another configuration
    /// (`None` if it took nothing).
    pub(super) origin: Option<Origin>,
}

/// A configuration's coordinate origin and scale, kept by a reservation (see
/// `Config::coord`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Origin {
    pub(super) k: Option<i128>,
    pub(super) tau: u64,
    pub(super) one: u64,
}

impl Ticket {
    pub(super) fn delay_from(&self, now: Nanos) -> Duration {
        if self.ok {
            self.time_to_act.saturating_duration_since(now)
        } else {
            Duration::MAX
        }
    }

    pub(super) fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("ok", &self.ok)
            .field("tokens", &self.tokens)
            .field("time_to_act", &self.time_to_act)
            .field("limit", &self.limit)
            .finish()
    }
}

/// The public methods of [`Reservation`] and [`OwnedReservation`], written once: each type
/// has a `lim` (a `&TokenBucket` or an `Arc<TokenBucket>`) and a `ticket`. `$setup` is the
/// start of each method's example: hidden lines that make `tb`, a bucket of 2 tokens a second
/// and burst 1 on a manual clock reading zero, drained, and a shown line that reserves `r`,
/// one token acting at 500 ms.
macro_rules! reservation_methods {
    ($setup:literal) => {
        /// Whether the tokens were reserved. A reservation that is not OK took nothing.
        ///
        #[doc = concat!("```\n", $setup, "assert!(r.ok());\n```")]
        pub fn ok(&self) -> bool {
            self.ticket.ok
        }

        /// The number of tokens asked for.
        ///
        #[doc = concat!("```\n", $setup, "assert_eq!(r.tokens(), 1);\n```")]
        pub fn tokens(&self) -> u32 {
            self.ticket.tokens
        }

        /// The limit when the reservation was made.
        ///
        #[doc = concat!("```\n", $setup, "assert_eq!(r.limit(), Limit::per_second(2.0).unwrap());\n```")]
        pub fn limit(&self) -> Limit {
            Limit::from_valid(self.ticket.limit)
        }

        /// When the reserved tokens are available; `None` if the reservation is not OK.
        ///
        #[doc = concat!("```\n", $setup, "assert_eq!(r.time_to_act(), Some(Nanos::new(500_000_000)));\n```")]
        pub fn time_to_act(&self) -> Option<Nanos> {
            self.ticket.ok.then_some(self.ticket.time_to_act)
        }

        /// How long after `now` to wait before acting: zero if already due, `Duration::MAX` if
        /// the reservation is not OK (rate.go's `InfDuration`).
        ///
        #[doc = concat!("```\n", $setup, "let later = Nanos::new(100_000_000);\n",
            "assert_eq!(r.delay_from(later), Duration::from_millis(400));\n```")]
        pub fn delay_from(&self, now: Nanos) -> Duration {
            self.ticket.delay_from(now)
        }

        /// [`Self::delay_from`] the limiter's clock reading.
        ///
        #[doc = concat!("```\n", $setup, "assert_eq!(r.delay(), Duration::from_millis(500));\n```")]
        pub fn delay(&self) -> Duration {
            self.ticket.delay_from(self.lim.clock.now())
        }

        /// Gives the tokens back now; see [`Self::cancel_at`].
        ///
        #[doc = concat!("```\n", $setup, "r.cancel();\nassert_eq!(tb.tokens_at(Nanos::ZERO), 0.0);\n```")]
        pub fn cancel(self) {
            let now = self.lim.clock.now();
            self.cancel_at(now)
        }

        /// Gives back, at `now`, the reserved tokens that later reservations have not already
        /// been promised. Nothing happens if the reservation is not OK or its time has passed.
        /// It consumes the reservation, so it happens at most once (deviation D1).
        ///
        #[doc = concat!("```\n", $setup, "r.cancel_at(Nanos::ZERO);\n",
            "assert_eq!(tb.tokens_at(Nanos::ZERO), 0.0);\n```")]
        pub fn cancel_at(self, now: Nanos) {
            self.lim.cancel(&self.ticket, now)
        }
    };
}

impl<C: Clock, P: Layout> Reservation<'_, C, P> {
    reservation_methods!(
        "# use std::time::Duration;
# use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
# let limit = Limit::per_second(2.0).unwrap();
# let tb = TokenBucket::builder(limit, 1).clock(ManualClock::default()).build();
# assert!(tb.allow_at(Nanos::ZERO));
let r = tb.reserve_n_at(Nanos::ZERO, 1);
"
    );
}

impl<C: Clock, P: Layout> OwnedReservation<C, P> {
    /// [`TokenBucket::reserve_n`] through an `Arc`; see [`OwnedReservation::reserve_n_at`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, OwnedReservation, TokenBucket};
    /// let limit = Limit::per_second(10.0).unwrap();
    /// let tb = Arc::new(TokenBucket::builder(limit, 5).clock(ManualClock::default()).build());
    /// assert!(tb.allow_n(5));
    /// let r = OwnedReservation::reserve_n(&tb, 3);
    /// assert_eq!(r.delay(), Duration::from_millis(300));
    /// std::thread::spawn(move || r.cancel()).join().unwrap(); // the 3 tokens come back
    /// assert_eq!(tb.tokens(), 0.0);
    /// ```
    pub fn reserve_n(lim: &Arc<TokenBucket<C, P>>, n: u32) -> Self {
        Self::reserve_n_at(lim, lim.clock.now(), n)
    }

    /// [`TokenBucket::reserve_n_at`] through an `Arc`: the same reservation, holding a clone
    /// of the `Arc` instead of a borrow, so that it is `Send + 'static` (when the clock is)
    /// and can be acted on or cancelled from another task or thread (tokio's
    /// `Semaphore::acquire_owned`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, Nanos, OwnedReservation, TokenBucket};
    ///
    /// let limit = Limit::per_second(2.0).unwrap();
    /// let tb = Arc::new(TokenBucket::builder(limit, 1).clock(ManualClock::default()).build());
    /// assert!(tb.allow_at(Nanos::ZERO));
    /// let r = OwnedReservation::reserve_n_at(&tb, Nanos::ZERO, 1);
    /// assert_eq!(r.delay_from(Nanos::ZERO), Duration::from_millis(500));
    /// // The task owns the reservation; it decides not to act and gives the token back.
    /// tokio::spawn(async move { r.cancel_at(Nanos::ZERO) }).await.unwrap();
    /// assert_eq!(tb.tokens_at(Nanos::ZERO), 0.0);
    /// # }
    /// ```
    pub fn reserve_n_at(lim: &Arc<TokenBucket<C, P>>, now: Nanos, n: u32) -> Self {
        OwnedReservation {
            lim: Arc::clone(lim),
            ticket: lim.ticket_within(now, n, u64::MAX),
        }
    }

    /// [`TokenBucket::try_reserve_n`] through an `Arc`; see
    /// [`OwnedReservation::try_reserve_n_at`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{Limit, OwnedReservation, TokenBucket};
    /// let tb = Arc::new(TokenBucket::new(Limit::per_second(1.0).unwrap(), 1));
    /// assert!(OwnedReservation::try_reserve_n(&tb, 1, Duration::ZERO).ok()); // starts full
    /// // The next token is about a second away.
    /// assert!(!OwnedReservation::try_reserve_n(&tb, 1, Duration::from_millis(10)).ok());
    /// ```
    pub fn try_reserve_n(lim: &Arc<TokenBucket<C, P>>, n: u32, max_wait: Duration) -> Self {
        Self::try_reserve_n_at(lim, lim.clock.now(), n, max_wait)
    }

    /// [`TokenBucket::try_reserve_n_at`] through an `Arc`: not OK, and nothing taken, unless
    /// the tokens arrive within `max_wait`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, Nanos, OwnedReservation, TokenBucket};
    /// let limit = Limit::per_second(1.0).unwrap();
    /// let tb = Arc::new(TokenBucket::builder(limit, 1).clock(ManualClock::default()).build());
    /// assert!(tb.allow_at(Nanos::ZERO));
    /// let (t, n) = (Nanos::ZERO, 1);
    /// assert!(!OwnedReservation::try_reserve_n_at(&tb, t, n, Duration::from_millis(999)).ok());
    /// assert!(OwnedReservation::try_reserve_n_at(&tb, t, n, Duration::from_secs(1)).ok());
    /// ```
    pub fn try_reserve_n_at(
        lim: &Arc<TokenBucket<C, P>>,
        now: Nanos,
        n: u32,
        max_wait: Duration,
    ) -> Self {
        OwnedReservation {
            lim: Arc::clone(lim),
            ticket: lim.ticket_within(now, n, Nanos::from_duration(max_wait).as_u64()),
        }
    }

    reservation_methods!(
        "# use std::sync::Arc;
# use std::time::Duration;
# use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
# let limit = Limit::per_second(2.0).unwrap();
# let tb = Arc::new(TokenBucket::builder(limit, 1).clock(ManualClock::default()).build());
# assert!(tb.allow_at(Nanos::ZERO));
let r = turnstile::OwnedReservation::reserve_n_at(&tb, Nanos::ZERO, 1);
"
    );
}

impl<C: Clock, P: Layout> fmt::Debug for Reservation<'_, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ticket.debug("Reservation", f)
    }
}

impl<C: Clock, P: Layout> fmt::Debug for OwnedReservation<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ticket.debug("OwnedReservation", f)
    }
}

impl<C: Clock, P: Layout> TokenBucket<C, P> {
    pub(super) fn reserve_for_wait(
        &self,
        now: Nanos,
        n: u32,
        deadline: Option<Nanos>,
    ) -> Result<Reservation<'_, C, P>, WaitError> {
        let (_, cfg) = self.snapshot();
        if n > cfg.burst() && !cfg.is_inf() {
            return Err(WaitError::ExceedsBurst {
                n,
                burst: cfg.burst(),
            });
        }
        let max_wait = match deadline {
            Some(d) if d <= now => return Err(WaitError::DeadlinePassed { n }),
            Some(d) => d.as_u64() - now.as_u64(),
            None => u64::MAX,
        };
        match self.take::<RESERVE>(now, n, max_wait) {
            Decision::Granted { x, due, took, cfg } => Ok(Reservation {
                lim: self,
                ticket: Self::granted(now, n, x, due, took, &cfg),
            }),
            Decision::Denied {
                retry_at: None,
                limit,
            } => Err(WaitError::Never { n, limit }),
            Decision::Denied { .. } => Err(WaitError::WouldExceedDeadline { n }),
        }
    }

    pub(super) fn reserve_within(
        &self,
        now: Nanos,
        n: u32,
        max_wait: u64,
    ) -> Reservation<'_, C, P> {
        Reservation {
            lim: self,
            ticket: self.ticket_within(now, n, max_wait),
        }
    }

    pub(super) fn ticket_within(&self, now: Nanos, n: u32, max_wait: u64) -> Ticket {
        match self.take::<RESERVE>(now, n, max_wait) {
            Decision::Granted { x, due, took, cfg } => Self::granted(now, n, x, due, took, &cfg),
            Decision::Denied { limit, .. } => Ticket {
                ok: false,
                tokens: n,
                time_to_act: now,
                took: false,
                limit,
                epoch: 0,
                inf_gen: 0,
                act: 0,
                origin: None,
            },
        }
    }

    /// The reservation for a granted take at `now` that left the state at `x` (or found it
    /// there, if it took nothing) under `cfg`, with `due = u(now)`. It keeps the exact unit
    /// at which it acts, `max(x, due)`, and that unit's token coordinate, for a cancel under a
    /// later configuration.
    pub(super) fn granted(
        now: Nanos,
        n: u32,
        x: u64,
        due: u64,
        took: bool,
        cfg: &Config,
    ) -> Ticket {
        let act = x.max(due);
        Ticket {
            ok: true,
            tokens: n,
            time_to_act: if x > due {
                cfg.time_of(x).unwrap_or(Nanos::MAX)
            } else {
                now
            },
            took,
            limit: cfg.limit,
            epoch: cfg.epoch,
            inf_gen: cfg.inf_gen,
            act,
            // What places `act` on the token coordinate, should a cancel come under another
            // configuration; the coordinate itself (a 128-bit division) waits for that cancel.
            origin: (took && cfg.is_finite()).then_some(Origin {
                k: cfg.origin,
                tau: cfg.hot.tau,
                one: cfg.hot.one,
            }),
        }
    }
}
