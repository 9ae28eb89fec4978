//! [`Deadline`]: when a wait gives up, in whichever form the caller has it.
//!
//! A limiter's clock counts [`Nanos`] from an origin of its own (the first use of the shared
//! quanta clock, or whatever a [`ManualClock`](crate::ManualClock) was set to), which no
//! caller should have to know. So the waits take `impl Into<Deadline>`: a [`Duration`] is a
//! timeout from the start of the wait, a [`std::time::Instant`] (or, with feature `tokio`, a
//! `tokio::time::Instant`) a point in that clock's time, and [`Deadline::at`] a reading of the
//! limiter's own clock, for callers of the `_at` forms and tests on a manual clock.

use std::time::{Duration, Instant};

use crate::clock::Nanos;

/// When a wait gives up: never ([`Deadline::NONE`]), after a timeout from the start of the
/// wait ([`Deadline::timeout`], or any [`Duration`]), at an [`Instant`] ([`Deadline::until`],
/// or any `Instant`; with feature `tokio` also a `tokio::time::Instant`), or at a reading of
/// the limiter's own clock ([`Deadline::at`]).
///
/// The waits ([`TokenBucket::wait_n_blocking`](crate::TokenBucket::wait_n_blocking) and, with
/// feature `tokio`, the async `TokenBucket::wait_n`) take `impl Into<Deadline>`, so
/// a `Duration`, an `Instant`, a `Deadline` and `None` (no deadline) can all be passed as they
/// are. `Option<Deadline>` converts too (`None` is [`Deadline::NONE`]); other options do not,
/// so that a bare `None` stays unambiguous: map them, as in
/// `timeout.map_or(Deadline::NONE, Deadline::timeout)`. A bare [`Nanos`] does not convert
/// either: [`Deadline::at`] says that it is a reading of the limiter's clock.
///
/// An instant is converted when the wait starts, by its distance from its own clock's present
/// added to the limiter clock's reading; an instant already past means the deadline has
/// passed ([`WaitError::DeadlinePassed`](crate::WaitError::DeadlinePassed)).
///
/// ```
/// use std::time::{Duration, Instant};
/// use turnstile::{Deadline, Limit, TokenBucket, WaitError};
///
/// // One token a second, three at once.
/// let tb = TokenBucket::new(Limit::per_second(1.0).unwrap(), 3);
/// tb.wait_n_blocking(1, Duration::from_secs(5)).unwrap();                 // a timeout
/// tb.wait_n_blocking(1, Instant::now() + Duration::from_secs(5)).unwrap(); // an instant
/// tb.wait_n_blocking(1, None).unwrap();                                    // no deadline
/// // The next token is a second away: a 10 ms timeout is too short, and nothing is taken.
/// assert_eq!(
///     tb.wait_n_blocking(1, Deadline::timeout(Duration::from_millis(10))),
///     Err(WaitError::WouldExceedDeadline { n: 1 })
/// );
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Deadline(Kind);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
enum Kind {
    /// No deadline.
    #[default]
    None,
    /// This long after the start of the wait.
    Timeout(Duration),
    /// A point in `std::time::Instant`'s time.
    Until(Instant),
    /// A point in tokio's time (which tokio's test utilities can pause and advance).
    #[cfg(feature = "tokio")]
    UntilTokio(tokio::time::Instant),
    /// A reading of the limiter's clock.
    At(Nanos),
}

impl Deadline {
    /// No deadline: wait as long as the tokens take (the `Default`, and what `None` converts
    /// to).
    ///
    /// ```
    /// use turnstile::{Deadline, Nanos};
    /// assert_eq!(Deadline::NONE, Deadline::default());
    /// assert_eq!(Deadline::from(None), Deadline::NONE);
    /// assert_eq!(Deadline::NONE.resolve(Nanos::new(5)), None);
    /// ```
    pub const NONE: Deadline = Deadline(Kind::None);

    /// `timeout` after the wait starts (Go's `context.WithTimeout`). A zero timeout has passed
    /// as soon as the wait starts; a timeout past the end of the clock's range saturates
    /// there. `Deadline::from(timeout)` is the same.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Deadline, Nanos};
    /// let d = Deadline::timeout(Duration::from_secs(2));
    /// assert_eq!(d, Duration::from_secs(2).into());
    /// // Relative to the clock's reading when the wait starts:
    /// assert_eq!(d.resolve(Nanos::new(10_000_000_000)), Some(Nanos::new(12_000_000_000)));
    /// assert_eq!(Deadline::timeout(Duration::MAX).resolve(Nanos::new(1)), Some(Nanos::MAX));
    /// ```
    pub const fn timeout(timeout: Duration) -> Deadline {
        Deadline(Kind::Timeout(timeout))
    }

    /// At `instant` (Go's `context.WithDeadline`). `Deadline::from(instant)` is the same.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use turnstile::{Deadline, Nanos};
    /// let now = Nanos::new(1_000);
    /// // An instant already past: the deadline is the wait's start, so it has passed.
    /// let past = Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
    /// assert_eq!(Deadline::until(past).resolve(now), Some(now));
    /// // An hour from now is about an hour after the limiter clock's reading.
    /// let later = Deadline::until(Instant::now() + Duration::from_secs(3600)).resolve(now);
    /// let left = later.unwrap() - now;
    /// assert!(left <= Duration::from_secs(3600) && left > Duration::from_secs(3590));
    /// ```
    pub const fn until(instant: Instant) -> Deadline {
        Deadline(Kind::Until(instant))
    }

    /// At the reading `t` of the limiter's own clock (what its `_at` methods take and its
    /// [`Clock::now`](crate::Clock::now) returns): for code that already works in the
    /// limiter's time, such as tests on a [`ManualClock`](crate::ManualClock).
    ///
    /// ```
    /// use turnstile::{Deadline, Limit, ManualClock, Nanos, TokenBucket, WaitError};
    /// let clock = ManualClock::new(Nanos::new(5_000));
    /// let tb = TokenBucket::builder(Limit::per_second(1.0).unwrap(), 1).clock(clock).build();
    /// assert_eq!(Deadline::at(Nanos::new(7)).resolve(Nanos::new(5_000)), Some(Nanos::new(7)));
    /// assert_eq!(
    ///     tb.wait_n_blocking(1, Deadline::at(Nanos::new(5_000))),
    ///     Err(WaitError::DeadlinePassed { n: 1 })
    /// );
    /// tb.wait_n_blocking(1, Deadline::at(Nanos::new(5_001))).unwrap();
    /// ```
    pub const fn at(t: Nanos) -> Deadline {
        Deadline(Kind::At(t))
    }

    /// The deadline as a reading of the limiter's clock, given that clock's reading `now`
    /// taken at the start of the wait; `None` for no deadline. A timeout counts from `now`;
    /// an instant counts its distance from the present of its own clock (read by this call)
    /// from `now`, so an instant already past gives `now` (a deadline that has passed). Sums
    /// saturate at [`Nanos::MAX`].
    ///
    /// The waits call this; it is public for code that builds its own waits on the `_at`
    /// forms, e.g. with
    /// [`TokenBucket::try_reserve_n_at`](crate::TokenBucket::try_reserve_n_at).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Deadline, Nanos};
    /// let now = Nanos::new(1_000);
    /// assert_eq!(Deadline::NONE.resolve(now), None);
    /// let soon = Deadline::timeout(Duration::from_nanos(5));
    /// assert_eq!(soon.resolve(now), Some(Nanos::new(1_005)));
    /// assert_eq!(Deadline::at(Nanos::new(3)).resolve(now), Some(Nanos::new(3)));
    /// ```
    pub fn resolve(self, now: Nanos) -> Option<Nanos> {
        match self.0 {
            Kind::None => None,
            Kind::Timeout(d) => Some(now + d),
            Kind::Until(i) => Some(now + i.saturating_duration_since(Instant::now())),
            #[cfg(feature = "tokio")]
            Kind::UntilTokio(i) => {
                Some(now + i.saturating_duration_since(tokio::time::Instant::now()))
            }
            Kind::At(t) => Some(t),
        }
    }
}

/// [`Deadline::timeout`]: `timeout` after the wait starts.
///
/// ```
/// use std::time::Duration;
/// use turnstile::Deadline;
/// assert_eq!(Deadline::from(Duration::from_secs(1)), Deadline::timeout(Duration::from_secs(1)));
/// ```
impl From<Duration> for Deadline {
    fn from(timeout: Duration) -> Deadline {
        Deadline::timeout(timeout)
    }
}

/// [`Deadline::until`]: at `instant`.
///
/// ```
/// use std::time::Instant;
/// use turnstile::Deadline;
/// let i = Instant::now();
/// assert_eq!(Deadline::from(i), Deadline::until(i));
/// ```
impl From<Instant> for Deadline {
    fn from(instant: Instant) -> Deadline {
        Deadline::until(instant)
    }
}

/// At a `tokio::time::Instant`, measured against tokio's clock (so a paused and advanced
/// test clock counts as tokio counts it).
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use turnstile::{Deadline, Nanos};
/// let deadline = Deadline::from(tokio::time::Instant::now() + Duration::from_secs(2));
/// tokio::time::advance(Duration::from_secs(1)).await;
/// assert_eq!(deadline.resolve(Nanos::ZERO), Some(Nanos::new(1_000_000_000)));
/// # }
/// ```
#[cfg(feature = "tokio")]
impl From<tokio::time::Instant> for Deadline {
    fn from(instant: tokio::time::Instant) -> Deadline {
        Deadline(Kind::UntilTokio(instant))
    }
}

/// `None` is [`Deadline::NONE`], `Some(d)` is `d`: the one `Option` that converts, so that a
/// bare `None` passed to a wait needs no type annotation.
///
/// ```
/// use std::time::Duration;
/// use turnstile::Deadline;
/// let timeout: Option<Duration> = Some(Duration::from_secs(1));
/// let deadline = Deadline::from(timeout.map(Deadline::timeout));
/// assert_eq!(deadline, Deadline::timeout(Duration::from_secs(1)));
/// assert_eq!(Deadline::from(None), Deadline::NONE);
/// // `Some(d.into())` makes an `Option<Deadline>`: a timeout, not a time since an origin.
/// let some: Deadline = Some(Duration::from_secs(1).into()).into();
/// assert_eq!(some, Deadline::timeout(Duration::from_secs(1)));
/// ```
impl From<Option<Deadline>> for Deadline {
    fn from(deadline: Option<Deadline>) -> Deadline {
        deadline.unwrap_or(Deadline::NONE)
    }
}
