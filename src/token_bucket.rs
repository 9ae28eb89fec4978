//! A lock-free token bucket with the semantics of Go's `golang.org/x/time/rate`.
//!
//! # The protocol
//!
//! **Representation.** A bucket of `burst` tokens refilling at `limit` tokens per second is
//! held as one number, `tat` ("theoretical arrival time", GCRA's name): the instant at which
//! the bucket was (or will be) empty, ignoring the cap. The tokens at time `t` are
//! `min(burst, (t - tat) * limit)`, which can be negative while reservations are outstanding.
//! Taking `n` tokens at `t` is `tat' = max(tat, t - tau) + n * T`, with `T = 1/limit` and
//! `tau = burst * T`; this is exactly rate.go's `advance` then `tokens -= n`.
//!
//! Time is counted in **units** (`src/scale.rs`): one token is exactly `one` units, so
//! grants never drift. A unit is exactly 1/16 ns when `T` is a whole number of 1/16 ns (every
//! whole-nanosecond interval: readings then convert without any rounding), and otherwise
//! `T / 2^k` with `k` the smallest making it at most 1/16 ns; below 7.5/s `k <= 31` (so that
//! `n * one < 2^63` for any `u32` `n`) makes it coarser, as does a burst so large that
//! `burst * one` would pass 2^55 (466 ns at 1e-3/s: still exact in whole tokens). A clock reading
//! `now` becomes `u(now) = tau + units(now - base)`, one shift and one multiply by a 64-bit
//! constant; `base` is the configuration's origin, `since - tau` in nanoseconds (at most 2^56
//! ns before `since`), so `u` reaches `tau` near `since` and the state is never negative.
//! Readings before `base` count as `base`: by then a state built at `since` holds no tokens,
//! so an earlier reading never finds more than a later one (D2).
//!
//! **The state word** (`state`, one `AtomicU64`, cache-padded):
//! ```text
//!  63 62   61    57 56                                                  0
//! +--+----+--------+-----------------------------------------------------+
//! |0 | gen: 6 bits | x: tat in units, 57 bits                            |
//! +--+----+--------+-----------------------------------------------------+
//! ```
//! `x` is `tat` in the units of configuration `gen`, offset so that the bucket is full at
//! `u(now)` exactly when `x <= u(now) - tau`. A check of `n` at `now` is, in integers:
//! `x' = max(x, u - tau) + n * one`, granted iff `x' <= u (+ the caller's maximum wait)`; as
//! `n * one < 2^63`, `x' <= u` also proves `n <= burst`, so the hot path has no branch for it.
//! Bit 62, the top bit of `gen`, is its parity (the slot): `gen` counts with that bit as its
//! lowest digit (`gen_after`). Bit 63 stays clear so that the hot path can compute in the
//! word's own coordinates, `gen` bits and all, with no sum reaching 2^64: it never masks `x`
//! out nor puts `gen` back, and a denial checks that the whole word is unchanged. Under a zero or infinite limit nothing refills (`u = tau` for
//! ever: the scale's multiplier is zero) and `x = tau - tokens * one` simply stores the tokens.
//!
//! **Precision and range.** A unit is at most 1/16 ns above 7.5/s, so a clock reading is
//! rounded by less than 1/16 ns (not at all for whole-nanosecond intervals), and a token is
//! exactly `one` units, so the count of grants over any span is exact up to that rounding of
//! the span's two ends (`tests/token_bucket_precision.rs`: every limit from 1e-3/s to 1e8/s,
//! an hour of grants, within one of exact; 90 days across rebases). Tokens are kept to
//! `1/one` of a token (1/16 at 1e9/s, finer below). `x` has 57 bits; the hot path accepts
//! readings up to 2^56 units past the base (at least 2^50 ns, 13 days, at the highest limits;
//! 52 days at 1e8/s, years at low limits), and a reading past that **rebases**: a
//! reconfiguration with the same limit and burst at that reading (off the hot path, once per
//! weeks of uptime, or after a jump of the caller's times), so a process may run for ever.
//! Outstanding reservations may reach 2^57 units (D4 beyond that). Limits above `2^6` tokens
//! per ns (6.4e10/s) act as that limit; a burst that takes longer than 146 years to refill
//! never refills (acts as a zero limit).
//!
//! **Configurations** live in two slots of plain atomic words beside the state word, one per
//! `gen` parity, 64 bytes each (`Slot`): the six hot words (the negated `base`, `lim`,
//! `mul`, `tau`, `one` with `per_shift` in its upper half, and the scale's inverse `per`) that a check and its refusal's retry time read, then the burst and flags and the
//! epoch; the cold ones (limit, since, and the token-coordinate origin) that only
//! reservations, cancels and reconfigurations read sit apart (`ColdSlot`). Only `set_limit` /
//! `set_burst` (and a rebase) write slots; they are serialized among themselves by a mutex the
//! hot path never touches. A reconfiguration writes the slot of `gen + 1`, then converts the
//! state (tokens at `now` under the old configuration, re-expressed in the new one) and
//! installs it with one CAS on the state word. The **state word is the slots' sequence
//! number**: no separate seqlock.
//!
//! * **Invariant:** while the word carries `gen`, slot `gen & 1` holds that generation's
//!   configuration: the writer next touches it for `gen + 2`, which needs the word to reach
//!   `gen + 1` first.
//! * A **grant** reads the slot of its word's `gen` and commits with a CAS on the whole word:
//!   if it succeeds, no reconfiguration committed in between, so the slot it read was its
//!   `gen`'s (a rewrite of that slot needs the word moved first). So no reservation is ever
//!   computed half under an old configuration: `set_limit` is linearizable with `reserve` and
//!   `cancel`.
//! * A **denial** (and a zero-token request, and everything under an infinite limit) writes
//!   nothing: after reading the slot it reloads the word and accepts its answer if `gen` has
//!   not moved. It then linearizes at its first load.
//! * **ABA bound.** `gen` has 6 bits: a grant could commit against a stale slot only if 64
//!   reconfigurations ran (each taking the mutex and a CAS) between its load and its CAS *and*
//!   left `x` bit-for-bit where it was. A reservation also keeps its 32-bit `epoch` (in the
//!   slot), so a cancel is confused only by 2^32 reconfigurations, not by `gen` wrapping.
//!
//! **Orderings.** The state word is loaded with `Acquire`: it pairs with the `Release` of the
//! reconfiguring CAS, so the slot written before that CAS is visible to whoever sees the new
//! `gen`. Hot-path CASes are `AcqRel` (failure `Acquire`, since the failed value is used as the
//! next word); being read-modify-writes they continue the release sequence, so later readers
//! still see the slot. Slot words are `Relaxed`: a writer issues a `Release` fence after it
//! has seen the word at `gen + 1` (the CAS that made the slot spare) and before writing the
//! slot for `gen + 2`; a denial's validation is an `Acquire` fence then a reload. If a reader
//! read any slot word of the later write, the two fences synchronize and its reload sees
//! `gen + 1` or later, so it retries (the seqlock argument, with the state word as sequence).
//! A grant needs no fence: its successful CAS is `Release`, and the writer's `Acquire` load
//! of any later word synchronizes with it, so the grant's slot reads happen before the
//! writer's slot writes. `loom-tests/tests/token_bucket.rs` model-checks take vs cancel vs
//! reconfiguration.
//!
//! **Refunds** (`Limiter::refund_n_at`, for a grant that a second, layered limit then
//! refused) are a third CAS protocol on the word, beside takes and cancels: load the word,
//! read the hot words of its slot, compute `x' = max(x - n * one, u(now) - tau)` (the tokens
//! plus `n`, capped at the burst), and CAS the whole word to `x'` with its `gen` kept; a
//! failed CAS retries from the word it returned. A refund that changes nothing (an infinite
//! limit, a full bucket) writes nothing and validates its load as a denial does. As a CAS on
//! the whole word it never mixes configurations, and it linearizes at its CAS: a take racing
//! it sees the tokens either before or after the refund, never a torn value, and no refund is
//! lost (`loom-tests/tests/token_bucket.rs`, `refund_vs_*`). Why the result is exact, and the
//! one case where it is not, is on `refund_n_at`.
//!
//! # Deviations from rate.go
//! * **D1** a [`Reservation`] (or [`OwnedReservation`]) is cancelled at most once
//!   ([`Reservation::cancel`] takes it by value).
//! * **D2** an earlier time never creates tokens: over any history, grants never exceed
//!   `burst + limit * (latest time - earliest time)` plus one request.
//! * **D3** [`Limit`] is validated: no NaN or negative limits.
//! * **D4** with a zero limit and too few tokens, a reservation is not OK and waits fail at
//!   once with [`WaitError::Never`]; the same holds for any reservation whose tokens would
//!   arrive past the state word's range (see *Precision and range*), where rate.go would wait.
//! * **D5** `n` is unsigned.
//! * **Cancel** restores the reserved tokens minus the tokens reserved after them, as rate.go
//!   does, but counts those later tokens exactly: each reservation keeps the unit at which it
//!   acts and the *token coordinate* of that instant (a count that every take raises by its
//!   tokens and that refill and `set_limit`/`set_burst` leave alone; see `Config::coord`),
//!   and a cancel measures the distance to the state's now. rate.go measures it as
//!   `r.limit * (lastEvent - timeToAct)` from times truncated to whole nanoseconds, so:
//!   - the two agree, to the token, for the latest reservation (at any limit) and for one
//!     whose later reservations were made under its own limit, before or after a
//!     `set_limit`, with no time spent under another limit in between (reproduced in
//!     `tests/token_bucket_semantics.rs`);
//!   - after an earlier cancel, rate.go's `lastEvent` still counts tokens that cancel gave
//!     back, so it restores less than later reservations left free (golang/go#56924,
//!     #69419); turnstile restores exactly that;
//!   - rate.go values reservations made under a *different* limit at the cancelled one's
//!     limit, and so also the refill of time spent under another limit before a later
//!     reservation (it moved that reservation's act time); turnstile counts their tokens;
//!   - turnstile never restores more than the reservation took, which rate.go does when
//!     `lastEvent` lies before the reservation's time (a zero-token reservation moves it
//!     there, or a raised limit lets a later take act earlier);
//!   - the two counts also part when a limit change or a burst cut sits between the
//!     reservation and its cancel *and* the bucket was full or cut in between: turnstile's
//!     count (tokens taken after it) ignores the cap; rate.go's (time between act times,
//!     at the reservation's limit) ignores it differently. Both stay within the burst;
//!   - a reservation made under an infinite limit took nothing and restores nothing, and
//!     one made before an infinite limit refilled the bucket restores nothing either (the
//!     refill already gave its tokens back; rate.go adds them on top).
//! * Precision: tokens are held to `1/one` of a token and times to a unit (above); rate.go holds
//!   tokens as `f64` and times in whole nanoseconds, so the two may part by a hair at a
//!   boundary (counted as `Borderline` by the differential tests).
//! * A reconfiguration that would carry more outstanding debt than the word's range (weeks of
//!   reservations, re-expressed at a much lower limit) keeps only the range's worth.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::deadline::Deadline;
use crate::error::WaitError;
use crate::limit::Limit;
use crate::limiter::{Compact, Denied, Idle, Layout, Limiter, Padded, QuotaStatus};
use crate::scale::{Scale, D_MAX, TAU_MAX};
use crate::sync::{fence, AtomicU64, Mutex, Ordering}; // Mutex: reconfiguration only, never the hot path
/// A lock-free token bucket: `limit` tokens per second, at most `burst` at once, with the API
/// and semantics of Go's `rate.Limiter` (deviations in the [module docs](self)).
///
/// The bucket starts full. `allow` takes tokens now or not at all; `reserve` always takes
/// them (when the request can ever be met) and says how long to wait; `wait_n_blocking` and
/// `wait_n` (feature `tokio`) sleep until then, or fail at once if that would pass their
/// [`Deadline`] (a timeout, an instant, or none). A [`Reservation`] borrows the bucket; in an
/// `Arc`, `reserve_owned` and friends return an [`OwnedReservation`] that can move into
/// another task.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
///
/// let clock = ManualClock::new(Nanos::ZERO);
/// let tb = TokenBucket::with_clock(Limit::per_second(10.0).unwrap(), 2, clock.clone());
/// assert!(tb.allow_n(2));          // the initial burst
/// assert!(!tb.allow());            // empty
/// let r = tb.reserve();            // pay now, act later
/// assert_eq!(r.delay(), Duration::from_millis(100));
/// r.cancel();                      // changed our mind: the token comes back
/// clock.advance(Duration::from_millis(100));
/// assert!(tb.allow());
/// ```
#[repr(C)] // the core first: in a keyed map's slot it then starts 8 bytes into a line
pub struct TokenBucket<C: Clock = QuantaClock, P: Layout = Padded> {
    /// The state word and both configurations, cache-padded unless `P` is [`Compact`] (for
    /// the many buckets of a keyed map).
    core: P::Cell<Core>,
    /// Each configuration's cold words, apart from the hot ones.
    colds: [ColdSlot; 2],
    /// Serializes `set_limit`/`set_burst` only; `allow`, `reserve` and `cancel` never take it.
    reconfig: Mutex<()>, // off the hot path: serializes reconfigurations only
    clock: C,
}

impl TokenBucket<QuantaClock> {
    /// A full bucket of `burst` tokens refilling at `limit`, on the shared quanta clock.
    ///
    /// ```
    /// use turnstile::{Limit, TokenBucket};
    /// let tb = TokenBucket::new(Limit::per_second(5.0).unwrap(), 3);
    /// assert_eq!(tb.burst(), 3);
    /// ```
    pub fn new(limit: Limit, burst: u32) -> Self {
        Self::with_clock(limit, burst, QuantaClock::new())
    }
}

impl<C: Clock> TokenBucket<C> {
    /// A full bucket on the given clock.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::ZERO, 1, ManualClock::new(Nanos::ZERO));
    /// assert!(tb.allow());
    /// assert!(!tb.allow()); // a zero limit never refills
    /// ```
    pub fn with_clock(limit: Limit, burst: u32, clock: C) -> Self {
        Self::in_layout(limit, burst, clock)
    }
}

impl TokenBucket<QuantaClock, Compact> {
    /// [`TokenBucket::new`] in the [`Compact`] layout: the state word unpadded, next to the
    /// configuration, for the many buckets of a [`Keyed`](crate::Keyed) map (about a third of
    /// the bytes per key). Same behaviour.
    ///
    /// ```
    /// # #[cfg(feature = "keyed")] {
    /// use turnstile::{Keyed, Limit, TokenBucket};
    /// let limit = Limit::per_second(10.0).unwrap();
    /// let per_ip = Keyed::new(move |_: &u32| TokenBucket::compact(limit, 5));
    /// assert!(per_ip.check_n(&1, 5).is_ok());
    /// # }
    /// ```
    pub fn compact(limit: Limit, burst: u32) -> Self {
        Self::in_layout(limit, burst, QuantaClock::new())
    }
}

impl<C: Clock> TokenBucket<C, Compact> {
    /// [`TokenBucket::with_clock`] in the [`Compact`] layout.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, TokenBucket};
    /// let tb = TokenBucket::compact_with_clock(Limit::ZERO, 1, ManualClock::default());
    /// assert!(tb.allow() && !tb.allow());
    /// ```
    pub fn compact_with_clock(limit: Limit, burst: u32, clock: C) -> Self {
        Self::in_layout(limit, burst, clock)
    }
}

impl<C: Clock, P: Layout> TokenBucket<C, P> {
    /// A full bucket in layout `P`.
    fn in_layout(limit: Limit, burst: u32, clock: C) -> Self {
        let cfg = Config::new(0, limit, burst, Nanos::ZERO, 0, Some(0));
        // The bucket starts full: rate.go's tokens = burst with last = the zero time.
        let x = cfg.x_from_tokens(f64::from(burst), Nanos::ZERO);
        let slots = [Slot::default(), Slot::default()];
        let colds = [ColdSlot::default(), ColdSlot::default()];
        SlotRef {
            slot: &slots[0],
            cold: &colds[0],
        }
        .write(&cfg);
        TokenBucket {
            core: P::cell(Core {
                state: AtomicU64::new(x),
                slots,
            }),
            colds,
            reconfig: Mutex::new(()), // see the field: reconfiguration only
            clock,
        }
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The limiter's clock reading now: the time its plain (non-`_at`) methods use. An
    /// inherent method, so reading it needs no [`Clock`] import.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    ///
    /// let l = TokenBucket::with_clock(Limit::per_second(1.0).unwrap(), 1, ManualClock::new(Nanos::new(7)));
    /// assert_eq!(l.now(), Nanos::new(7));
    /// ```
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The current limit.
    pub fn limit(&self) -> Limit {
        Limit::from_valid(self.snapshot().1.limit)
    }

    /// The current burst.
    pub fn burst(&self) -> u32 {
        self.snapshot().1.burst()
    }

    /// Tokens in the bucket now; negative while reservations are outstanding.
    pub fn tokens(&self) -> f64 {
        self.tokens_at(self.clock.now())
    }

    /// Tokens in the bucket at `now` (rate.go's `TokensAt`); nothing changes.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(10.0).unwrap(), 5, ManualClock::default());
    /// assert!(tb.allow_n_at(Nanos::ZERO, 5));
    /// assert_eq!(tb.tokens_at(Nanos::new(200_000_000)), 2.0);
    /// ```
    pub fn tokens_at(&self, now: Nanos) -> f64 {
        let (word, cfg) = self.snapshot();
        cfg.tokens(x_of(word), now)
    }

    /// Takes one token now if there is one.
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow(&self) -> bool {
        self.allow_n_at(self.clock.now(), 1)
    }

    /// [`TokenBucket::allow`] at `now`.
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_at(&self, now: Nanos) -> bool {
        self.allow_n_at(now, 1)
    }

    /// Takes `n` tokens now if there are `n`.
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n(&self, n: u32) -> bool {
        self.allow_n_at(self.clock.now(), n)
    }

    /// Takes `n` tokens at `now` if there are `n`; otherwise changes nothing (and writes
    /// nothing).
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(1.0).unwrap(), 3, ManualClock::default());
    /// assert!(tb.allow_n_at(Nanos::ZERO, 3));
    /// assert!(!tb.allow_n_at(Nanos::ZERO, 1));
    /// assert!(tb.allow_n_at(Nanos::new(1_000_000_000), 1));
    /// ```
    #[must_use = "a denied request must not go ahead: check the result"]
    pub fn allow_n_at(&self, now: Nanos, n: u32) -> bool {
        matches!(self.take::<ALLOW>(now, n, 0), Decision::Granted { .. })
    }

    /// Reserves one token; see [`TokenBucket::reserve_n_at`].
    pub fn reserve(&self) -> Reservation<'_, C, P> {
        self.reserve_n_at(self.clock.now(), 1)
    }

    /// [`TokenBucket::reserve`] at `now`.
    pub fn reserve_at(&self, now: Nanos) -> Reservation<'_, C, P> {
        self.reserve_n_at(now, 1)
    }

    /// Reserves `n` tokens; see [`TokenBucket::reserve_n_at`].
    pub fn reserve_n(&self, n: u32) -> Reservation<'_, C, P> {
        self.reserve_n_at(self.clock.now(), n)
    }

    /// Reserves `n` tokens at `now`, however long they take to arrive. The reservation is not
    /// OK if `n` exceeds the burst or the tokens never arrive (deviation D4); otherwise the
    /// tokens are taken and [`Reservation::delay_from`] says how long to wait before acting.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(2.0).unwrap(), 1, ManualClock::default());
    /// let first = tb.reserve_n_at(Nanos::ZERO, 1);
    /// let second = tb.reserve_n_at(Nanos::ZERO, 1);
    /// assert_eq!(first.delay_from(Nanos::ZERO), Duration::ZERO);
    /// assert_eq!(second.delay_from(Nanos::ZERO), Duration::from_millis(500));
    /// assert!(!tb.reserve_n_at(Nanos::ZERO, 2).ok()); // more than the burst
    /// ```
    pub fn reserve_n_at(&self, now: Nanos, n: u32) -> Reservation<'_, C, P> {
        self.reserve_within(now, n, u64::MAX)
    }

    /// Reserves `n` tokens only if they arrive within `max_wait`; see
    /// [`TokenBucket::reserve_n_within_at`].
    pub fn reserve_n_within(&self, n: u32, max_wait: Duration) -> Reservation<'_, C, P> {
        self.reserve_n_within_at(self.clock.now(), n, max_wait)
    }

    /// Reserves `n` tokens at `now` only if they arrive within `max_wait`; otherwise the
    /// reservation is not OK and nothing changes. This is what the waits use with their
    /// deadline, and `allow` is this with a zero wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(1.0).unwrap(), 1, ManualClock::default());
    /// assert!(tb.allow_at(Nanos::ZERO));
    /// assert!(!tb.reserve_n_within_at(Nanos::ZERO, 1, Duration::from_millis(999)).ok());
    /// assert!(tb.reserve_n_within_at(Nanos::ZERO, 1, Duration::from_secs(1)).ok());
    /// ```
    pub fn reserve_n_within_at(
        &self,
        now: Nanos,
        n: u32,
        max_wait: Duration,
    ) -> Reservation<'_, C, P> {
        self.reserve_within(now, n, Nanos::from_duration(max_wait).as_u64())
    }

    /// [`TokenBucket::reserve`] through an `Arc`: the [`OwnedReservation`] holds a clone of
    /// the `Arc` rather than a borrow, so it can move into a spawned task or thread; see
    /// [`TokenBucket::reserve_n_owned_at`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use turnstile::{Limit, TokenBucket};
    /// let tb = Arc::new(TokenBucket::new(Limit::per_second(10.0).unwrap(), 1));
    /// let r = tb.reserve_owned();
    /// let worker = std::thread::spawn(move || {
    ///     std::thread::sleep(r.delay()); // zero: the bucket started full
    ///     // ... act ...
    /// });
    /// worker.join().unwrap();
    /// ```
    pub fn reserve_owned(self: &Arc<Self>) -> OwnedReservation<C, P> {
        self.reserve_n_owned_at(self.clock.now(), 1)
    }

    /// [`TokenBucket::reserve_owned`] at `now`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = Arc::new(TokenBucket::with_clock(Limit::ZERO, 1, ManualClock::default()));
    /// assert!(tb.reserve_owned_at(Nanos::ZERO).ok());
    /// assert!(!tb.reserve_owned_at(Nanos::ZERO).ok()); // a zero limit never refills
    /// ```
    pub fn reserve_owned_at(self: &Arc<Self>, now: Nanos) -> OwnedReservation<C, P> {
        self.reserve_n_owned_at(now, 1)
    }

    /// [`TokenBucket::reserve_n`] through an `Arc`; see [`TokenBucket::reserve_n_owned_at`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, TokenBucket};
    /// let limit = Limit::per_second(10.0).unwrap();
    /// let tb = Arc::new(TokenBucket::with_clock(limit, 5, ManualClock::default()));
    /// assert!(tb.allow_n(5));
    /// let r = tb.reserve_n_owned(3);
    /// assert_eq!(r.delay(), Duration::from_millis(300));
    /// std::thread::spawn(move || r.cancel()).join().unwrap(); // the 3 tokens come back
    /// assert_eq!(tb.tokens(), 0.0);
    /// ```
    pub fn reserve_n_owned(self: &Arc<Self>, n: u32) -> OwnedReservation<C, P> {
        self.reserve_n_owned_at(self.clock.now(), n)
    }

    /// [`TokenBucket::reserve_n_at`] through an `Arc`: the same reservation, holding a clone
    /// of the `Arc` instead of a borrow, so that it is `Send + 'static` (when the clock is)
    /// and can be acted on or cancelled from another task or thread.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    ///
    /// let clock = ManualClock::default();
    /// let tb = Arc::new(TokenBucket::with_clock(Limit::per_second(2.0).unwrap(), 1, clock));
    /// assert!(tb.allow_at(Nanos::ZERO));
    /// let r = tb.reserve_n_owned_at(Nanos::ZERO, 1);
    /// assert_eq!(r.delay_from(Nanos::ZERO), Duration::from_millis(500));
    /// // The task owns the reservation; it decides not to act and gives the token back.
    /// tokio::spawn(async move { r.cancel_at(Nanos::ZERO) }).await.unwrap();
    /// assert_eq!(tb.tokens_at(Nanos::ZERO), 0.0);
    /// # }
    /// ```
    pub fn reserve_n_owned_at(self: &Arc<Self>, now: Nanos, n: u32) -> OwnedReservation<C, P> {
        OwnedReservation {
            lim: Arc::clone(self),
            ticket: self.ticket_within(now, n, u64::MAX),
        }
    }

    /// [`TokenBucket::reserve_n_within`] through an `Arc`; see
    /// [`TokenBucket::reserve_n_owned_at`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{Limit, TokenBucket};
    /// let tb = Arc::new(TokenBucket::new(Limit::per_second(1.0).unwrap(), 1));
    /// assert!(tb.reserve_n_within_owned(1, Duration::ZERO).ok()); // the bucket starts full
    /// // The next token is about a second away.
    /// assert!(!tb.reserve_n_within_owned(1, Duration::from_millis(10)).ok());
    /// ```
    pub fn reserve_n_within_owned(
        self: &Arc<Self>,
        n: u32,
        max_wait: Duration,
    ) -> OwnedReservation<C, P> {
        self.reserve_n_within_owned_at(self.clock.now(), n, max_wait)
    }

    /// [`TokenBucket::reserve_n_within_at`] through an `Arc`; see
    /// [`TokenBucket::reserve_n_owned_at`].
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let limit = Limit::per_second(1.0).unwrap();
    /// let tb = Arc::new(TokenBucket::with_clock(limit, 1, ManualClock::default()));
    /// assert!(tb.allow_at(Nanos::ZERO));
    /// let (t, n) = (Nanos::ZERO, 1);
    /// assert!(!tb.reserve_n_within_owned_at(t, n, Duration::from_millis(999)).ok());
    /// assert!(tb.reserve_n_within_owned_at(t, n, Duration::from_secs(1)).ok());
    /// ```
    pub fn reserve_n_within_owned_at(
        self: &Arc<Self>,
        now: Nanos,
        n: u32,
        max_wait: Duration,
    ) -> OwnedReservation<C, P> {
        OwnedReservation {
            lim: Arc::clone(self),
            ticket: self.ticket_within(now, n, Nanos::from_duration(max_wait).as_u64()),
        }
    }

    /// What `n` tokens would cost now; see [`TokenBucket::peek_n_at`].
    pub fn peek_n(&self, n: u32) -> Peek {
        self.peek_n_at(self.clock.now(), n)
    }

    /// Reports the tokens at `now` and the earliest time `n` tokens will be available (if
    /// nobody else takes any), without taking anything.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(10.0).unwrap(), 4, ManualClock::default());
    /// assert!(tb.allow_n_at(Nanos::ZERO, 4));
    /// let p = tb.peek_n_at(Nanos::ZERO, 2);
    /// assert_eq!(p.tokens, 0.0);
    /// assert_eq!(p.available_at, Some(Nanos::new(200_000_000)));
    /// assert_eq!(tb.peek_n_at(Nanos::ZERO, 5).available_at, None); // > burst: never
    /// ```
    pub fn peek_n_at(&self, now: Nanos, n: u32) -> Peek {
        let (word, cfg) = self.snapshot();
        let tokens = cfg.tokens(x_of(word), now);
        let available_at = cfg.available_at(x_of(word), now, n);
        Peek {
            tokens,
            available_at,
        }
    }

    /// Changes the limit now; see [`TokenBucket::set_limit_at`].
    pub fn set_limit(&self, limit: Limit) {
        self.set_limit_at(self.clock.now(), limit)
    }

    /// Changes the limit at `now`: the tokens accrued up to `now` under the old limit are
    /// kept, and refill continues at the new one. Outstanding reservations keep their times.
    /// Linearizable with concurrent reservations and cancels.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(1.0).unwrap(), 10, ManualClock::default());
    /// assert!(tb.allow_n_at(Nanos::ZERO, 10));
    /// tb.set_limit_at(Nanos::ZERO, Limit::per_second(100.0).unwrap());
    /// assert_eq!(tb.tokens_at(Nanos::new(50_000_000)), 5.0);
    /// ```
    pub fn set_limit_at(&self, now: Nanos, limit: Limit) {
        self.reconfigure(now, None, |cfg| (limit, cfg.burst()))
    }

    /// Changes the burst now; see [`TokenBucket::set_burst_at`].
    pub fn set_burst(&self, burst: u32) {
        self.set_burst_at(self.clock.now(), burst)
    }

    /// Changes the burst at `now`. Tokens above a smaller burst are clamped on the next read,
    /// as in rate.go. Linearizable with concurrent reservations and cancels.
    ///
    /// ```
    /// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(10.0).unwrap(), 5, ManualClock::default());
    /// tb.set_burst_at(Nanos::ZERO, 2);
    /// assert_eq!(tb.tokens_at(Nanos::ZERO), 2.0);
    /// ```
    pub fn set_burst_at(&self, now: Nanos, burst: u32) {
        self.reconfigure(now, None, |cfg| (Limit::from_valid(cfg.limit), burst))
    }

    /// Waits until `n` tokens are available and takes them, sleeping the thread; fails at
    /// once if that would pass `deadline`: a [`Duration`] (a timeout from the start of this
    /// wait), a [`std::time::Instant`], `None` (no deadline), or any [`Deadline`] (such as
    /// [`Deadline::at`] a reading of this limiter's clock). The checks run in rate.go's
    /// order: more than the burst ([`WaitError::ExceedsBurst`]), deadline already passed
    /// ([`WaitError::DeadlinePassed`]), tokens that never arrive ([`WaitError::Never`],
    /// deviation D4), tokens that arrive after the deadline
    /// ([`WaitError::WouldExceedDeadline`]). A failed wait takes nothing. With no wait needed
    /// it returns without sleeping.
    ///
    /// The sleep is [`crate::clock::sleep_until`] on the limiter's clock: a thread sleep, then
    /// a spin of at most [`crate::clock::SPIN_BEFORE_DEADLINE`] for a precise wake-up.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, TokenBucket, WaitError};
    /// let tb = TokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// tb.wait_n_blocking(1, None).unwrap();          // immediate: the bucket starts full
    /// assert_eq!(
    ///     tb.wait_n_blocking(2, None),
    ///     Err(WaitError::ExceedsBurst { n: 2, burst: 1 })
    /// );
    /// // The next token is a second away: more than a 10 ms timeout.
    /// assert_eq!(
    ///     tb.wait_n_blocking(1, Duration::from_millis(10)),
    ///     Err(WaitError::WouldExceedDeadline { n: 1 })
    /// );
    /// ```
    pub fn wait_n_blocking(&self, n: u32, deadline: impl Into<Deadline>) -> Result<(), WaitError> {
        let now = self.clock.now();
        let r = self.reserve_for_wait(now, n, deadline.into().resolve(now))?;
        if let Some(t) = r.time_to_act() {
            crate::clock::sleep_until(&self.clock, t);
        }
        Ok(())
    }

    /// Waits (asynchronously, on tokio's timer) until `n` tokens are available and takes
    /// them; the deadline, checks and errors are those of [`TokenBucket::wait_n_blocking`],
    /// and the wait starts (its timeout counts, an instant is converted) when the future is
    /// first polled. A `tokio::time::Instant` is a deadline too, measured on tokio's clock.
    /// Dropping the future before it completes cancels its reservation, as rate.go does when
    /// the context is cancelled.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::time::Duration;
    /// use turnstile::{Limit, TokenBucket, WaitError};
    /// let tb = TokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// tb.wait_n(1, None).await.unwrap();
    /// let soon = tokio::time::Instant::now() + Duration::from_millis(10);
    /// assert_eq!(tb.wait_n(1, soon).await, Err(WaitError::WouldExceedDeadline { n: 1 }));
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn wait_n(&self, n: u32, deadline: impl Into<Deadline>) -> Result<(), WaitError> {
        let now = self.clock.now();
        let r = self.reserve_for_wait(now, n, deadline.into().resolve(now))?;
        let delay = r.delay_from(now);
        if delay.is_zero() {
            return Ok(());
        }
        // Dropped with the future while the sleep is pending: cancels the reservation.
        struct CancelOnDrop<'a, C: Clock, P: Layout>(Option<Reservation<'a, C, P>>);
        impl<C: Clock, P: Layout> Drop for CancelOnDrop<'_, C, P> {
            fn drop(&mut self) {
                if let Some(r) = self.0.take() {
                    r.cancel();
                }
            }
        }
        let mut guard = CancelOnDrop(Some(r));
        tokio::time::sleep(delay).await;
        guard.0 = None; // completed: keep the tokens
        Ok(())
    }

    // ---- internals -------------------------------------------------------------------------

    fn reserve_for_wait(
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

    fn reserve_within(&self, now: Nanos, n: u32, max_wait: u64) -> Reservation<'_, C, P> {
        Reservation {
            lim: self,
            ticket: self.ticket_within(now, n, max_wait),
        }
    }

    fn ticket_within(&self, now: Nanos, n: u32, max_wait: u64) -> Ticket {
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
    fn granted(now: Nanos, n: u32, x: u64, due: u64, took: bool, cfg: &Config) -> Ticket {
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

    /// The slot of `word`'s generation.
    #[inline(always)]
    fn slot(&self, word: u64) -> SlotRef<'_> {
        // A shift and a mask select the slot without a branch: the parity bit moved to 64,
        // the size of a slot.
        let off = (word >> (PARITY_SHIFT - 6)) as usize & 64;
        let i = off / 64;
        SlotRef {
            // SAFETY: `off` is 0 or 64, the offsets of the two slots of `[Slot; 2]`.
            slot: unsafe {
                &*std::ptr::from_ref(&self.core.slots)
                    .cast::<u8>()
                    .add(off)
                    .cast::<Slot>()
            },
            cold: &self.colds[i],
        }
    }

    /// Whether the configuration read for `word` is still that of the current generation: an
    /// `Acquire` fence, then a reload (see *Orderings* in the module docs). Used by every
    /// outcome that writes nothing.
    #[inline(always)]
    fn still_current(&self, word: u64) -> bool {
        fence(Ordering::Acquire);
        gen_of(self.core.state.load(Ordering::Relaxed)) == gen_of(word)
    }

    /// [`TokenBucket::still_current`] for the hot path: the whole word unchanged, which
    /// implies the same generation and costs one compare (a moved word goes the slow way).
    #[inline(always)]
    fn unchanged(&self, word: u64) -> bool {
        fence(Ordering::Acquire);
        self.core.state.load(Ordering::Relaxed) == word
    }

    /// The state word and the configuration of its generation, consistent with each other.
    fn snapshot(&self) -> (u64, Config) {
        loop {
            let word = self.core.state.load(Ordering::Acquire);
            let cfg = self.slot(word).config();
            if self.still_current(word) {
                return (word, cfg);
            }
        }
    }

    /// The take behind allow, check, reserve and wait: one attempt inline, for the common
    /// cases (in range, granted at once, CAS uncontended; or denied, for `allow`, and for
    /// `check` with its retry time when one exists), and
    /// everything else in [`TokenBucket::take_slow`]. `MODE` says what the caller needs
    /// beyond the verdict: `ALLOW` nothing, `CHECK` a denial's retry time, `RESERVE` the
    /// whole configuration (read before the CAS, so the CAS validates it).
    #[inline(always)]
    fn take<const MODE: u8>(&self, now: Nanos, n: u32, max_wait: u64) -> Decision {
        let word = self.core.state.load(Ordering::Acquire);
        let slot = self.slot(word);
        let hot = slot.hot();
        let d = now.as_u64().wrapping_sub(hot.base);
        // Also sends readings before the base, and every check under an infinite limit
        // (`lim = 0`), to the slow path.
        if d < hot.lim {
            let v = hot.units(d);
            // In the word's own coordinates (its generation bits on top), so that neither `x`
            // is masked out nor the generation put back: `new = gw + max(x, v) + n * one`
            // and `due_w = gw + due`. gw <= 2^63 - 2^57 (bit 63 clear), x < 2^57,
            // v + tau < 2^57, n * one < 2^63: no sum overflows, so `new <= due_w` is exactly
            // `x2 <= due`, which also implies n <= burst (n << k <= tau) and no carry out of x.
            let gw = word & GEN_MASK;
            let now_w = gw + v;
            let due_w = now_w + hot.tau;
            let new = word.max(now_w) + u64::from(n) * hot.one;
            let (x2, due) = (new - gw, due_w - gw);
            if new <= due_w && n != 0 {
                let cold = if MODE == RESERVE {
                    slot.cold()
                } else {
                    Cold::default()
                };
                if self
                    .core
                    .state
                    .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Decision::Granted {
                        x: x2,
                        due,
                        took: true,
                        cfg: Config { hot, cold },
                    };
                }
            } else if MODE == ALLOW && new > due_w && self.unchanged(word) {
                return Decision::Denied {
                    retry_at: None,
                    limit: 0.0,
                };
            } else if MODE == CHECK && new > due_w {
                // A refusal that can be retried: at most the burst and within the word's
                // range (a zero limit never gets here: `lim = 0`). Its retry time is when `u`
                // reaches `x2`, `SlotRef::time_of`; `None` there (past the end of time) and
                // every other refusal go the slow way, which says "never". (A refused
                // `n <= burst` has `x >= v`, since from `x < v` the take ends at
                // `v + n * one <= v + tau`, granted; so `x2 = x + n * one`.)
                if x2 <= X_MAX && u64::from(n) * hot.one <= hot.tau {
                    if let Some(retry_at) = slot.time_of(&hot, x2) {
                        if self.unchanged(word) {
                            return Decision::Denied {
                                retry_at: Some(retry_at),
                                limit: 0.0,
                            };
                        }
                    }
                }
            }
        }
        self.take_slow::<MODE>(now, n, max_wait)
    }

    /// Every case of a take, in a CAS loop with backoff: contention, waits, zero-token
    /// requests, infinite and zero limits, readings before the base, and rebasing.
    #[inline(never)]
    fn take_slow<const MODE: u8>(&self, now: Nanos, n: u32, max_wait: u64) -> Decision {
        let backoff = Backoff::new();
        let mut word = self.core.state.load(Ordering::Acquire);
        loop {
            let cfg = self.slot(word).config();
            match cfg.check(x_of(word), now, n, max_wait) {
                Check::Take { x, due } if n != 0 => {
                    match self.core.state.compare_exchange_weak(
                        word,
                        (word & GEN_MASK) | x,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => {
                            return Decision::Granted {
                                x,
                                due,
                                took: true,
                                cfg,
                            }
                        }
                        Err(current) => {
                            backoff.spin();
                            word = current;
                            continue;
                        }
                    }
                }
                // Nothing to take: the answer stands on the load alone.
                Check::Take { x, due } => {
                    if self.still_current(word) {
                        return Decision::Granted {
                            x,
                            due,
                            took: false,
                            cfg,
                        };
                    }
                }
                Check::Free => {
                    if self.still_current(word) {
                        let due = cfg.hot.tau;
                        return Decision::Granted {
                            x: due,
                            due,
                            took: false,
                            cfg,
                        };
                    }
                }
                Check::Wait { need } => {
                    if self.still_current(word) {
                        let retry_at = if MODE == ALLOW {
                            None
                        } else {
                            cfg.time_of(need)
                        };
                        return Decision::Denied {
                            retry_at,
                            limit: cfg.limit,
                        };
                    }
                }
                Check::Never => {
                    if self.still_current(word) {
                        return Decision::Denied {
                            retry_at: None,
                            limit: cfg.limit,
                        };
                    }
                }
                Check::Far => self.rebase(now),
            }
            // The configuration moved under us (or a rebase ran): start again from the word.
            word = self.core.state.load(Ordering::Acquire);
        }
    }

    fn cancel(&self, r: &Ticket, now: Nanos) {
        // rate.go's CancelAt checks, in its order (the limit check is inside the loop).
        if !r.ok || !r.took || r.tokens == 0 || r.time_to_act < now {
            return;
        }
        let backoff = Backoff::new();
        let mut word = self.core.state.load(Ordering::Acquire);
        loop {
            let cfg = self.slot(word).config();
            let x = x_of(word);
            let new = if cfg.is_inf() || r.inf_gen != cfg.inf_gen {
                // rate.go does nothing under an infinite limit; after an infinite refill the
                // bucket already holds what `r` took.
                None
            } else if cfg.is_far(now) {
                self.rebase(now);
                word = self.core.state.load(Ordering::Acquire);
                continue;
            } else {
                cfg.give_back(x, r)
                    .and_then(|back| cfg.restore(x, now, back))
            };
            match self.commit_x(word, new, &backoff) {
                None => return,
                Some(current) => word = current,
            }
        }
    }

    /// [`Limiter::refund_n_at`]: the CAS loop of *Refunds* (module docs). Reads only the hot
    /// words; like a grant, it commits with a CAS on the whole word, so the slot it read is
    /// its generation's; a refund that changes nothing (an infinite limit, a full bucket)
    /// writes nothing and validates its load like a denial.
    fn refund(&self, now: Nanos, n: u32) {
        if n == 0 {
            return;
        }
        let backoff = Backoff::new();
        let mut word = self.core.state.load(Ordering::Acquire);
        loop {
            let cfg = self.slot(word).config();
            let hot = cfg.hot;
            let new_x = if cfg.is_inf() {
                // An infinite limit: the check took nothing.
                None
            } else {
                let d = now.as_u64().saturating_sub(hot.base);
                if hot.mul != 0 && d >= hot.lim {
                    // Past the hot range (see *Precision and range*): rebase, then again.
                    self.rebase(now);
                    word = self.core.state.load(Ordering::Acquire);
                    continue;
                }
                // u(now) - tau: the state of a full bucket at `now` (0 units under a zero
                // limit, where nothing refills; a reading before the base counts as the base).
                let full = hot.units(d);
                let x = x_of(word);
                // tokens' = min(burst, tokens(now) + n)  <=>  x' = max(x - n * one, full).
                let x2 = x.saturating_sub(u64::from(n) * hot.one).max(full);
                (x2 < x).then_some(x2)
            };
            match self.commit_x(word, new_x, &backoff) {
                None => return,
                Some(current) => word = current,
            }
        }
    }

    /// The commit step `cancel` and `refund` share: writes `new_x` into `word` under its
    /// generation with one CAS or, when there is nothing to write, validates the load as a
    /// denial does (the slot it read must still be the word's). `None` when done; otherwise
    /// the word to run the loop again from.
    #[inline]
    fn commit_x(&self, word: u64, new_x: Option<u64>, backoff: &Backoff) -> Option<u64> {
        let Some(new_x) = new_x else {
            return if self.still_current(word) {
                None
            } else {
                Some(self.core.state.load(Ordering::Acquire))
            };
        };
        match self.core.state.compare_exchange_weak(
            word,
            (word & GEN_MASK) | new_x,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => None,
            Err(current) => {
                backoff.spin();
                Some(current)
            }
        }
    }

    /// Re-expresses the state in a configuration based at `now`, if `now` is past the hot
    /// range of the current one (see *Precision and range*). Off the hot path: at most once
    /// per ~two weeks of readings, or after a jump of the caller's times.
    #[cold]
    #[inline(never)]
    fn rebase(&self, now: Nanos) {
        let _writer = self.reconfig.lock().unwrap_or_else(|e| e.into_inner()); // off the hot path: a rebase is a rare reconfiguration
        let (_, cur) = self.snapshot();
        if cur.is_far(now) {
            self.reconfigure_locked(now, None, |cfg| (Limit::from_valid(cfg.limit), cfg.burst()));
        }
    }

    /// Installs the configuration `f` returns, at `now`; with `fill`, the bucket then holds
    /// that many tokens instead of the ones it had.
    fn reconfigure(&self, now: Nanos, fill: Option<f64>, f: impl Fn(&Config) -> (Limit, u32)) {
        // Off the hot path: serializes reconfigurations among themselves so that only one
        // writer ever touches the spare slot. allow/reserve/cancel never take this lock.
        let _writer = self.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        self.reconfigure_locked(now, fill, f)
    }

    fn reconfigure_locked(
        &self,
        now: Nanos,
        fill: Option<f64>,
        f: impl Fn(&Config) -> (Limit, u32),
    ) {
        let backoff = Backoff::new();
        let mut word = self.core.state.load(Ordering::Acquire);
        loop {
            // Only this writer changes generations, so the slot of `word` is intact.
            let cur = self.slot(word).config();
            let (limit, burst) = f(&cur);
            let x = x_of(word);
            let tokens = fill.unwrap_or_else(|| cur.tokens(x, now));
            let mut next = Config::new(
                cur.epoch.wrapping_add(1),
                limit,
                burst,
                now,
                cur.inf_gen_after(now),
                None,
            );
            next.fit(tokens);
            let new_x = next.x_from_tokens(tokens, now);
            // The new configuration's coordinates continue the old ones: the state keeps its
            // coordinate, so a cancel still counts exactly the tokens taken since a reservation.
            next.cold.origin = cur
                .coord(x)
                .and_then(|c| c.checked_sub(next.coord_offset(new_x)));
            let gen = gen_after(gen_of(word));
            // The slot of `gen` was last that of `gen - 2`; a reader still holding such a word
            // must see `gen - 1` on its validating reload if it reads any word written here.
            fence(Ordering::Release);
            // The slot of the word this CAS installs.
            self.slot(gen << GEN_SHIFT).write(&next);
            match self.core.state.compare_exchange_weak(
                word,
                (gen << GEN_SHIFT) | new_x,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(current) => {
                    backoff.spin();
                    word = current;
                }
            }
        }
    }
}

impl<C: Clock, P: Layout> Limiter for TokenBucket<C, P> {
    #[inline]
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        match self.take::<CHECK>(now, n, 0) {
            Decision::Granted { .. } => Ok(()),
            Decision::Denied { retry_at, .. } => Err(Denied::new(now, retry_at)),
        }
    }

    /// x/time/rate's `ReserveN` with a deadline: the tokens are taken at once (the bucket
    /// goes into debt) and may be used from the returned instant, at most `max_wait` on;
    /// [`Limiter::refund_n_at`] gives them back. A refusal's retry time is when the same call
    /// would succeed: when the wait is down to `max_wait`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, Limiter, ManualClock, Nanos, TokenBucket};
    ///
    /// let tb = TokenBucket::with_clock(Limit::per_second(2.0).unwrap(), 1, ManualClock::default());
    /// let wait = Duration::from_secs(1);
    /// assert_eq!(tb.schedule_n_at(Nanos::ZERO, 1, wait), Ok(Nanos::ZERO));
    /// assert_eq!(tb.schedule_n_at(Nanos::ZERO, 1, wait), Ok(Nanos::new(500_000_000)));
    /// assert_eq!(tb.schedule_n_at(Nanos::ZERO, 1, wait), Ok(Nanos::new(1_000_000_000)));
    /// // The next would be due 1.5 s on, past the 1 s allowed: refused, and the same call
    /// // succeeds once its wait is down to 1 s, in 0.5 s.
    /// let denied = tb.schedule_n_at(Nanos::ZERO, 1, wait).unwrap_err();
    /// assert_eq!(denied.retry_after(), Some(Duration::from_millis(500)));
    /// ```
    fn schedule_n_at(&self, now: Nanos, n: u32, max_wait: Duration) -> Result<Nanos, Denied> {
        let max_wait = Nanos::from_duration(max_wait).as_u64();
        match self.take::<RESERVE>(now, n, max_wait) {
            Decision::Granted { x, due, took, cfg } => {
                Ok(Self::granted(now, n, x, due, took, &cfg).time_to_act)
            }
            Decision::Denied { retry_at, .. } => Err(Denied::new(now, retry_at)),
        }
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The bucket's own state at `now`, exactly (counted in units, no float):
    ///
    /// * `q` (quota) = the burst;
    /// * `w` (window) = the time to refill from empty, `burst / limit`, rounded **up** to the
    ///   nanosecond;
    /// * `r` (remaining) = the whole tokens at `now`, `floor(min(burst, tokens))`, and 0 while
    ///   the bucket is in debt (reservations outstanding): a check of `n <= r` passes now;
    /// * `t` (reset) = until the bucket is full again if nothing more is taken, `(burst -
    ///   tokens) / limit` rounded **up** to the nanosecond (the first nanosecond at which it
    ///   is full: a client that waits `t` finds `r = q`); 0 when full.
    ///
    /// Under [`Limit::INF`] every check passes and nothing is counted: `r = q = burst`,
    /// `w = t = 0`. Under [`Limit::ZERO`] (or a limit so low that the burst would take more
    /// than 146 years to refill, which acts as zero) nothing ever refills: `w =
    /// Duration::MAX`, and `t` is 0 while the bucket is still full, else `Duration::MAX` (it
    /// is never whole again; [`QuotaStatus::reset_secs`] saturates). The same when the time
    /// it would be full lies past the end of [`Nanos`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Limit, Limiter, ManualClock, Nanos, QuotaStatus, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(4.0).unwrap(), 2, ManualClock::default());
    /// assert!(tb.check_n_at(Nanos::ZERO, 2).is_ok());
    /// let q = tb.quota_at(Nanos::new(300_000_000)).unwrap(); // 1.2 tokens
    /// assert_eq!(q, QuotaStatus {
    ///     quota: 2,
    ///     window: Duration::from_millis(500),
    ///     remaining: 1,
    ///     reset: Duration::from_millis(200),
    /// });
    /// ```
    fn quota_at(&self, now: Nanos) -> Option<QuotaStatus> {
        let (word, cfg) = self.snapshot();
        Some(cfg.quota(x_of(word), now))
    }

    /// Gives `n` tokens back at `now`: `tokens = min(burst, tokens(now) + n)`, one CAS on
    /// the state word (`x' = max(x - n * one, u(now) - tau)`; see *Refunds* below). Always
    /// `true`. `now` may be the reading of the grant or any later one.
    ///
    /// **Why it is exact.** Let the grant take `n` at `t0` from `T0` tokens and the refund
    /// come at `t1`, `dt = t1 - t0`. Without the grant the bucket would hold
    /// `min(b, T0 + limit * dt)`; with it and the refund it holds
    /// `min(b, min(b, T0 - n + limit * dt) + n)`, which is the same number (if the inner
    /// `min` takes `b`, then `T0 + limit * dt >= b + n` and both are `b`). So the tokens,
    /// the only state, are those of a history without the grant, and every later decision
    /// is the one that history makes. This holds whatever happened in between that did not
    /// **take** tokens (denials, refunds, reconfigurations, which carry the tokens over).
    ///
    /// **The one limit of that exactness.** A take by someone else between the grant and
    /// the refund is judged on `n` fewer tokens; if, without the grant, that take would have
    /// found the bucket *full* (so that refill since `t0` would have been lost to the cap),
    /// the refund gives back up to that lost refill (never more than `n`) beyond the history
    /// without the grant. That needs the clock to move between grant and refund while the
    /// bucket was within `n` of full; with the refund at the grant's own reading and every
    /// take in between at no later reading (a frozen clock, or one thread), it cannot happen.
    /// What always holds: **net grants** (grants minus refunds) over any span of readings
    /// stay within `burst + limit * span` (deviation D2's bound): a take raises `x` by at
    /// least its cost and a refund lowers it by at most its `n`, and a grant needs `x <=
    /// u(now)`.
    ///
    /// Under [`Limit::INF`] a check takes nothing, so the refund does nothing (as rate.go's
    /// `CancelAt`). Never more than the burst: a refund into a full bucket does nothing. Like
    /// every refund, it assumes the `n` tokens were taken (the trait's contract); a grant made
    /// under an infinite limit took nothing, so refunding it after a `set_limit` to a finite
    /// one gives `n` tokens that were never taken.
    ///
    /// ```
    /// use turnstile::{Limit, Limiter, ManualClock, Nanos, TokenBucket};
    /// let tb = TokenBucket::with_clock(Limit::per_second(1.0).unwrap(), 3, ManualClock::default());
    /// let before = tb.quota_at(Nanos::ZERO);
    /// assert!(tb.check_n_at(Nanos::ZERO, 2).is_ok());
    /// assert!(tb.refund_n_at(Nanos::ZERO, 2)); // a second limit refused the request
    /// assert_eq!(tb.quota_at(Nanos::ZERO), before);
    /// assert!(tb.refund_n_at(Nanos::ZERO, 1));  // a refund never fills past the burst
    /// assert_eq!(tb.tokens_at(Nanos::ZERO), 3.0);
    /// ```
    fn refund_n_at(&self, now: Nanos, n: u32) -> bool {
        self.refund(now, n);
        true
    }
}

/// Idle exactly when the bucket is full at `now`: its tokens at `now` equal its burst, which
/// is what a fresh bucket holds, so the two are **identical** from `now` on (a full bucket
/// has no outstanding reservation holding tokens, and a cancel can never fill it past full).
///
/// * Finite limit: full means `x <= u(now) - tau`, compared in units (exact, no float).
/// * Zero limit: the stored tokens equal the burst (it never refills, so a bucket that ever
///   granted a token is never idle again: a fresh one would have its burst back).
/// * Infinite limit: every request is granted either way; the bucket is idle when its tokens
///   at `now` equal the burst, as a fresh infinite bucket's always do. After a switch to
///   `Limit::INF` at time `s` that is every `now > s` (rate.go's `advance` fills the bucket
///   once any time has passed); at `now <= s` the stored tokens must equal the burst, so the
///   tokens a later `set_limit` back to a finite limit would keep are a fresh bucket's.
///
/// The comparison is with a fresh bucket of the **current** configuration: a bucket whose
/// limit or burst was changed with [`TokenBucket::set_limit`] or [`TokenBucket::set_burst`]
/// is idle when full of its current burst. A keyed map rebuilds an evicted bucket from its
/// factory, so a per-key `set_limit`/`set_burst` does not survive eviction.
/// Nothing is written.
///
/// ```
/// use turnstile::{Idle, Limit, ManualClock, Nanos, TokenBucket};
/// let tb = TokenBucket::with_clock(Limit::per_second(10.0).unwrap(), 2, ManualClock::default());
/// assert!(tb.is_idle_at(Nanos::ZERO));                  // new: full
/// assert!(tb.allow_at(Nanos::ZERO));
/// assert!(!tb.is_idle_at(Nanos::new(99_999_999)));      // one token short of full
/// assert!(tb.is_idle_at(Nanos::new(100_000_000)));      // refilled
/// ```
impl<C: Clock, P: Layout> Idle for TokenBucket<C, P> {
    fn is_idle_at(&self, now: Nanos) -> bool {
        let (word, cfg) = self.snapshot();
        cfg.is_full(x_of(word), now)
    }

    /// Full at `b` and not before: the bucket is rebuilt with its configuration based at `b`
    /// and a full burst there, so a reading `t < b` finds `(b - t) * limit` tokens fewer than
    /// the burst (none at all before `b - tau`). A bucket idle at `j <= b` has
    /// `tat <= j - tau <= b - tau`: this `tat` is at least its, which is all the budget proof
    /// (`grants in [x, y] <= burst + limit * (y - x)` plus one request) needs, as `tat` then
    /// never decreases over the key's whole history. Under a zero or infinite limit the
    /// stored tokens do not depend on time: the bucket stays as built (full).
    fn born_at(&mut self, b: Nanos) {
        let (_, cfg) = self.snapshot();
        let burst = cfg.burst();
        self.reconfigure(b, Some(f64::from(burst)), |cfg| {
            (Limit::from_valid(cfg.limit), cfg.burst())
        });
        // A keyed map's checks read parity 0's slot from the line that holds the map's slot
        // state and this state word (`Core`); the reconfiguration installed the other one.
        // Nothing can read this bucket (`&mut self`), so the configuration moves back, one
        // generation on, with the same words and the same `x`.
        let word = self.core.state.load(Ordering::Relaxed);
        if (word >> PARITY_SHIFT) & 1 == 1 {
            let cfg = self.slot(word).config();
            let gen = gen_after(gen_of(word));
            self.slot(gen << GEN_SHIFT).write(&cfg);
            self.core
                .state
                .store((gen << GEN_SHIFT) | x_of(word), Ordering::Relaxed);
        }
    }
}

impl<C: Clock, P: Layout> fmt::Debug for TokenBucket<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (word, cfg) = self.snapshot();
        f.debug_struct("TokenBucket")
            .field("limit", &Limit::from_valid(cfg.limit))
            .field("burst", &cfg.burst())
            .field("tokens", &cfg.tokens(x_of(word), self.clock.now()))
            .finish()
    }
}
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
/// [`TokenBucket::reserve_owned`] and friends, which return an [`OwnedReservation`] with the
/// same methods.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
/// let tb = TokenBucket::with_clock(Limit::per_second(4.0).unwrap(), 1, ManualClock::default());
/// let _now = tb.reserve_at(Nanos::ZERO);
/// let later = tb.reserve_at(Nanos::ZERO);
/// assert!(later.ok());
/// assert_eq!(later.time_to_act(), Some(Nanos::new(250_000_000)));
/// later.cancel_at(Nanos::ZERO);
/// assert_eq!(tb.tokens_at(Nanos::ZERO), 0.0);
/// ```
#[must_use = "a reservation holds tokens: act at its time or cancel it"]
pub struct Reservation<'a, C: Clock = QuantaClock, P: Layout = Padded> {
    lim: &'a TokenBucket<C, P>,
    ticket: Ticket,
}

/// A [`Reservation`] that holds its bucket through an [`Arc`] instead of a borrow, so it is
/// `Send + 'static` (when the clock is) and can move into `tokio::spawn` or
/// `std::thread::spawn`: tokio's `Semaphore::acquire_owned` convention. Made by
/// [`TokenBucket::reserve_owned`], [`TokenBucket::reserve_n_owned`],
/// [`TokenBucket::reserve_n_within_owned`] and their `_at` forms. Its methods and its
/// semantics are exactly a `Reservation`'s, including cancel at most once (cancelling
/// consumes it). It costs one reference count on the `Arc`, taken when it is made and
/// dropped with it; nothing else differs.
///
/// ```
/// use std::sync::Arc;
/// use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
/// let tb = Arc::new(TokenBucket::with_clock(
///     Limit::per_second(4.0).unwrap(),
///     1,
///     ManualClock::default(),
/// ));
/// let _now = tb.reserve_owned_at(Nanos::ZERO);
/// let later = tb.reserve_owned_at(Nanos::ZERO);
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
/// use turnstile::{Limit, TokenBucket};
/// let tb = Arc::new(TokenBucket::new(Limit::per_second(4.0).unwrap(), 1));
/// let r = tb.reserve_owned();
/// r.cancel();
/// r.cancel(); // error[E0382]: use of moved value: `r`
/// ```
#[must_use = "a reservation holds tokens: act at its time or cancel it"]
pub struct OwnedReservation<C: Clock = QuantaClock, P: Layout = Padded> {
    lim: Arc<TokenBucket<C, P>>,
    ticket: Ticket,
}

/// What a reservation knows, whichever way it holds its bucket: [`Reservation`] and
/// [`OwnedReservation`] are this and a handle on the bucket.
struct Ticket {
    ok: bool,
    tokens: u32,
    time_to_act: Nanos,
    /// Whether tokens were taken from the bucket (not under an infinite limit, not n = 0).
    took: bool,
    limit: f64,
    /// The configuration epoch it was made in, and that configuration's count of infinite
    /// refills.
    epoch: u32,
    inf_gen: u32,
    /// The exact unit at which it acts, `max(tat, now)`: a cancel under the same
    /// configuration counts the tokens reserved after it from there.
    act: u64,
    /// What places `act` on the token coordinate, for a cancel under another configuration
    /// (`None` if it took nothing).
    origin: Option<Origin>,
}

/// A configuration's coordinate origin and scale, kept by a reservation (see
/// `Config::coord`).
#[derive(Clone, Copy, Debug)]
struct Origin {
    k: Option<i128>,
    tau: u64,
    one: u64,
}

impl Ticket {
    fn delay_from(&self, now: Nanos) -> Duration {
        if self.ok {
            self.time_to_act.saturating_duration_since(now)
        } else {
            Duration::MAX
        }
    }

    fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
# let tb = TokenBucket::with_clock(limit, 1, ManualClock::default());
# assert!(tb.allow_at(Nanos::ZERO));
let r = tb.reserve_n_at(Nanos::ZERO, 1);
"
    );
}

impl<C: Clock, P: Layout> OwnedReservation<C, P> {
    reservation_methods!(
        "# use std::sync::Arc;
# use std::time::Duration;
# use turnstile::{Limit, ManualClock, Nanos, TokenBucket};
# let limit = Limit::per_second(2.0).unwrap();
# let tb = Arc::new(TokenBucket::with_clock(limit, 1, ManualClock::default()));
# assert!(tb.allow_at(Nanos::ZERO));
let r = tb.reserve_n_owned_at(Nanos::ZERO, 1);
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

// ---- arithmetic helpers ---------------------------------------------------------------------

/// What a take decided.
enum Decision {
    Granted {
        /// The state the take left (or found, if it took nothing), and `u(now)`.
        x: u64,
        due: u64,
        took: bool,
        /// Its configuration: the hot words always, the cold ones only for `RESERVE`.
        cfg: Config,
    },
    Denied {
        retry_at: Option<Nanos>,
        /// The limit, for `WaitError::Never` (`RESERVE` only).
        limit: f64,
    },
}

/// What `take` needs beyond the verdict (its `MODE`).
const ALLOW: u8 = 0;
const CHECK: u8 = 1;
const RESERVE: u8 = 2;

/// The verdict of [`Hot::check`] on one state word.
enum Check {
    /// Granted at `u(now) = due`, leaving the state at `x`.
    Take { x: u64, due: u64 },
    /// Granted with no state change (infinite limit).
    Free,
    /// Denied: it would be granted once `u(t)` reaches `need`.
    Wait { need: u64 },
    /// Never granted (more than the burst, a zero limit, or past the word's range).
    Never,
    /// `now` is past the configuration's hot range: rebase, then check again.
    Far,
}

/// Bits of the state word.
const GEN_SHIFT: u32 = 57;
const X_MAX: u64 = (1 << GEN_SHIFT) - 1;
/// `gen`'s six bits, 57..=62; bit 63 is always clear (see *The state word*).
const GEN_MASK: u64 = 63 << GEN_SHIFT;
/// The word's bit that is `gen`'s parity (the slot).
const PARITY_SHIFT: u32 = 62;

/// The generation after `gen` (6 bits, as `gen_of` returns them). The slot parity is the top
/// bit (bit 62 of the word), so the count runs with that bit as its lowest digit: the
/// parity alternates on every step and the whole field repeats after 64.
fn gen_after(gen: u64) -> u64 {
    let parity = gen >> 5;
    let high = gen & 31;
    if parity == 0 {
        gen | 32
    } else {
        (high + 1) & 31
    }
}

#[inline(always)]
fn x_of(word: u64) -> u64 {
    word & X_MAX
}

#[inline(always)]
fn gen_of(word: u64) -> u64 {
    word >> GEN_SHIFT
}

/// A unit is at most `2^-FINE` ns (see [`crate::scale`]).
const FINE: u32 = 4;
/// Units per token under a zero or infinite limit (stored tokens): as many as keep the
/// whole burst within `TAU_MAX` units and `n << k` below 2^63 (2^-23 of a token for the
/// largest burst, 2^-31 up to a burst of 16M).
fn stored_k(burst: u32) -> u32 {
    (55 - (32 - burst.leading_zeros())).min(crate::scale::K_MAX)
}

/// Readings up to this many units past the base take the hot path (see *Precision and
/// range*); `tau <= TAU_MAX` is half of it, so a rebased configuration is always in range.
const V_HOT: u64 = 1 << 56;
/// How far before `since` a configuration's base lies at most (2^56 ns, 2.3 years).
const BASE_BACK: u64 = 1 << 56;

/// `shape` bits: the burst (low 32), `k` (bits 32..38) and the infinite-limit flag.
const INF_BIT: u64 = 1 << 40;

/// The scale's `per_shift`, bits 48..56 of `shape`.
#[inline(always)]
fn per_shift_of(shape: u64) -> u32 {
    ((shape >> 48) & 0xff) as u32
}

/// Fractional bits of a token coordinate.
const COORD_BITS: u32 = 32;
const COORD_ONE: f64 = (1u64 << COORD_BITS) as f64;

/// `(x - tau) / one` in coordinate units (2^-32 token). `|x - tau| < 2^58`, so the product
/// stays below 2^90; floored, so that equal unit counts give equal coordinates.
fn coord_offset(x: u64, tau: u64, one: u64) -> i128 {
    let d = i128::from(x) - i128::from(tau);
    if one.is_power_of_two() {
        (d << COORD_BITS) >> one.trailing_zeros()
    } else {
        (d << COORD_BITS).div_euclid(i128::from(one))
    }
}

/// The largest `lim` for `base` such that `now.wrapping_sub(base) < lim` holds only for
/// `now >= base`: a reading before the base wraps to at least `2^64 - base`.
fn wrap_free(base: u64) -> u64 {
    (u64::MAX - base).saturating_add(1)
}

/// The words every check reads.
#[derive(Clone, Copy, Debug)]
struct Hot {
    /// Nanoseconds at which `u = tau`.
    base: u64,
    /// One more than the largest `now - base` the fast path converts; 0 under a zero or an
    /// infinite limit (everything goes to the slow path).
    lim: u64,
    /// The scale's multiplier (0: nothing refills).
    mul: u64,
    /// The burst in units.
    tau: u64,
    /// Units per token: `2^k`, or a whole number of 1/16 ns below `2^31` (`src/scale.rs`).
    one: u64,
    /// The scale's `per_shift` (0 where nothing refills), which shares a slot word with
    /// `one`: a refusal's retry time needs it.
    per_shift: u32,
}

impl Hot {
    /// `units(d)` at this configuration's multiplier (see `scale::units`).
    #[inline(always)]
    fn units(&self, d: u64) -> u64 {
        crate::scale::units(d, self.mul)
    }
}

/// The words only reservations, cancels and reconfigurations read.
#[derive(Clone, Copy, Debug, Default)]
struct Cold {
    /// The burst (low 32 bits), the infinite-limit flag (bit 40) and `per_shift` (bits 48..56).
    shape: u64,
    /// The scale's inverse (ns per unit, fixed point).
    per: u64,
    per_shift: u32,
    /// How many infinite refills (an infinite limit with time passing, which fills the bucket)
    /// happened before this configuration. A reservation made before one took tokens that the
    /// refill has already given back, so cancelling it restores nothing.
    inf_gen: u32,
    limit: f64,
    /// Counts the configurations this bucket had (wrapping: a cancel would mistake a
    /// reservation 2^32 reconfigurations old for one of its own configuration).
    epoch: u32,
    /// When this configuration took effect: rate.go's `last` for an infinite limit.
    since: u64,
    /// The token coordinate's origin `K` (see [`Config::coord`]); `None` once overflowed.
    origin: Option<i128>,
}

/// One configuration, as read from its slot.
#[derive(Clone, Copy, Debug)]
struct Config {
    hot: Hot,
    cold: Cold,
}

impl std::ops::Deref for Config {
    type Target = Cold;
    fn deref(&self) -> &Cold {
        &self.cold
    }
}

impl Config {
    fn new(
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

    fn burst(&self) -> u32 {
        self.shape as u32
    }

    /// Units per token.
    fn one(&self) -> u64 {
        self.hot.one
    }

    /// Under a zero or infinite limit, lowers `k` until `tokens` (which may be a debt)
    /// fit the word. Nothing there ever deepens a debt (a take that would is refused), so the
    /// debt at the reconfiguration is the largest the configuration will hold.
    fn fit(&mut self, tokens: f64) {
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

    fn is_inf(&self) -> bool {
        self.shape & INF_BIT != 0
    }

    fn is_finite(&self) -> bool {
        self.hot.mul != 0
    }

    fn scale(&self) -> Scale {
        Scale {
            one: self.one(),
            mul: self.hot.mul,
            per: self.per,
            per_shift: self.per_shift,
        }
    }

    /// Whether `now` is past the hot range (a rebase is due).
    fn is_far(&self, now: Nanos) -> bool {
        self.is_finite() && now.as_u64().saturating_sub(self.hot.base) >= self.hot.lim
    }

    /// rate.go's `reserveN` arithmetic for `n` tokens at `now` on state `x`, with the wait
    /// bounded by `max_wait` ns: every case (the fast path in `take` is its common one).
    fn check(&self, x: u64, now: Nanos, n: u32, max_wait: u64) -> Check {
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
    fn u_wide(&self, now: Nanos) -> u128 {
        let d = now.as_u64().saturating_sub(self.hot.base);
        u128::from(self.hot.tau) + self.scale().units_wide(d)
    }

    /// The first nanosecond at which `u` reaches `x > tau`: a retry then succeeds, since
    /// the two conversions round up (`units(ceil(d * per)) >= d`). Absolute, from the base,
    /// so a reading's own rounding to a unit does not move it: a wait of exactly one second
    /// from a whole-nanosecond reading ends on a whole nanosecond.
    /// Whether some `x <= X_MAX` may lie past the end of time: only with a base within 2^58 ns
    /// of it, or units longer than 2 ns (`per < 2^(64 - per_shift)`).
    fn near_end(&self) -> bool {
        self.hot.base > u64::MAX - (1 << 58) || self.per_shift < 63
    }

    /// `None` past the end of time.
    fn time_of(&self, x: u64) -> Option<Nanos> {
        let ns = u64::try_from(self.scale().nanos_ceil(x - self.hot.tau)).ok()?;
        ns.checked_add(self.hot.base).map(Nanos::new)
    }

    /// rate.go's `advance(now)`: the tokens at `now`, capped at the burst.
    fn tokens(&self, x: u64, now: Nanos) -> f64 {
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
    fn quota(&self, x: u64, now: Nanos) -> QuotaStatus {
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
    fn is_full(&self, x: u64, now: Nanos) -> bool {
        (self.is_inf() && now.as_u64() > self.since)
            || u128::from(x) + u128::from(self.hot.tau) <= self.u_wide(now)
    }

    /// `tokens` as units of this configuration: whole tokens exactly, the fraction
    /// truncated. Saturates.
    fn units_of_tokens(&self, tokens: f64) -> i128 {
        let one = self.one();
        let whole = tokens.trunc();
        let exact = (whole as i128).saturating_mul(i128::from(one));
        let part = ((tokens - whole) * one as f64) as i128;
        exact.saturating_add(part)
    }

    /// The state holding `tokens` at `now` under this configuration, within the word's range.
    fn x_from_tokens(&self, tokens: f64, now: Nanos) -> u64 {
        let u = self.u_wide(now).min(X_MAX as u128) as i128;
        (u - self.units_of_tokens(tokens)).clamp(0, X_MAX as i128) as u64
    }

    /// The earliest time `n` tokens are available at `now` on state `x` (peek).
    fn available_at(&self, x: u64, now: Nanos, n: u32) -> Option<Nanos> {
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
    fn restore(&self, x: u64, now: Nanos, back: i128) -> Option<u64> {
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
    fn give_back(&self, x: u64, r: &Ticket) -> Option<i128> {
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
    fn coord(&self, x: u64) -> Option<i128> {
        self.origin?
            .checked_add(self.coord_offset(x))
            .filter(|&c| c != i128::MIN)
    }

    /// `(x - tau) / one` in coordinate units.
    fn coord_offset(&self, x: u64) -> i128 {
        coord_offset(x, self.hot.tau, self.hot.one)
    }

    /// `inf_gen` for a configuration that replaces this one at `now`: one more if an infinite
    /// limit has filled the bucket (rate.go's `advance` does once time has passed).
    fn inf_gen_after(&self, now: Nanos) -> u32 {
        let filled = self.is_inf() && now.as_u64() > self.since;
        self.inf_gen.wrapping_add(u32::from(filled))
    }
}

/// The state word and, beside it, both configurations' slots. A check reads the word and the
/// six hot words of its slot: for parity 0 (every bucket until its first reconfiguration) the
/// first 56 bytes, one cache line when the core starts a line or, in a keyed map's
/// [`Compact`] slot, 8 bytes past one (`Keyed`'s slot state comes first). A grant's CAS takes
/// the word's line exclusive, but every check needs that line anyway; the configuration words
/// in it change only on reconfiguration.
#[repr(C)]
struct Core {
    state: AtomicU64,
    slots: [Slot; 2],
}

/// One configuration's words (see *Configurations* in the module docs), eight to a cache
/// line's worth so that a word's slot is its parity bit shifted to a multiple of 64: the six
/// that every check reads first (its refusal's retry time included), then the two only
/// reservations, cancels and reconfigurations read.
#[derive(Default)]
#[repr(C)]
struct Slot {
    /// `base`, negated: the hot path's `now - base` is then one add, not a copy and a
    /// subtract.
    neg_base: AtomicU64,
    lim: AtomicU64,
    mul: AtomicU64,
    tau: AtomicU64,
    /// `one | per_shift << 32` (`one <= 2^31`, `src/scale.rs`): two words in one, so that
    /// the hot words stay six.
    one_shift: AtomicU64,
    per: AtomicU64,
    shape: AtomicU64,
    /// `epoch | inf_gen << 32`.
    meta: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 64);

/// The rest of a configuration's words: only reconfigurations, cancels and reports read them.
#[derive(Default)]
struct ColdSlot {
    limit: AtomicU64,
    since: AtomicU64,
    origin_lo: AtomicU64,
    origin_hi: AtomicU64,
}

/// The two halves of one configuration's slot.
#[derive(Clone, Copy)]
struct SlotRef<'a> {
    slot: &'a Slot,
    cold: &'a ColdSlot,
}

impl SlotRef<'_> {
    #[inline(always)]
    fn hot(&self) -> Hot {
        let s = self.slot;
        let one_shift = s.one_shift.load(Ordering::Relaxed);
        Hot {
            base: s.neg_base.load(Ordering::Relaxed).wrapping_neg(),
            lim: s.lim.load(Ordering::Relaxed),
            mul: s.mul.load(Ordering::Relaxed),
            tau: s.tau.load(Ordering::Relaxed),
            one: one_shift & u64::from(u32::MAX),
            per_shift: (one_shift >> 32) as u32,
        }
    }

    fn cold(&self) -> Cold {
        let (s, c) = (self.slot, self.cold);
        let meta = s.meta.load(Ordering::Relaxed);
        let origin = (u128::from(c.origin_hi.load(Ordering::Relaxed)) << 64
            | u128::from(c.origin_lo.load(Ordering::Relaxed))) as i128;
        let shape = s.shape.load(Ordering::Relaxed);
        Cold {
            shape,
            per: s.per.load(Ordering::Relaxed),
            per_shift: per_shift_of(shape),
            epoch: meta as u32,
            inf_gen: (meta >> 32) as u32,
            limit: f64::from_bits(c.limit.load(Ordering::Relaxed)),
            since: c.since.load(Ordering::Relaxed),
            // i128::MIN stands for "overflowed": no coordinate reaches it (see `coord`).
            origin: (origin != i128::MIN).then_some(origin),
        }
    }

    /// [`Config::time_of`] from the hot words (`per` and `per_shift` among them), for the
    /// inline refusal of a check (`x > tau`, under a limit that refills): the same instant,
    /// or `None` past the end of time.
    #[inline(always)]
    fn time_of(&self, hot: &Hot, x: u64) -> Option<Nanos> {
        let per = self.slot.per.load(Ordering::Relaxed);
        let ns = crate::scale::nanos_ceil_pos(x - hot.tau, per, hot.per_shift)?;
        ns.checked_add(hot.base).map(Nanos::new)
    }

    fn config(&self) -> Config {
        Config {
            hot: self.hot(),
            cold: self.cold(),
        }
    }

    /// Relaxed stores: the writer's fence and CAS order them (module docs, *Orderings*).
    fn write(&self, c: &Config) {
        let (s, d, h) = (self.slot, self.cold, &c.hot);
        // `one` shares a word with `per_shift`; a check's refusal relies on `per = 0` for a
        // limit that never refills.
        debug_assert!(h.one <= 1 << 31 && (h.mul == 0) == (c.per == 0));
        s.neg_base.store(h.base.wrapping_neg(), Ordering::Relaxed);
        s.lim.store(h.lim, Ordering::Relaxed);
        s.mul.store(h.mul, Ordering::Relaxed);
        s.tau.store(h.tau, Ordering::Relaxed);
        s.one_shift
            .store(h.one | u64::from(c.per_shift) << 32, Ordering::Relaxed);
        s.shape.store(c.shape, Ordering::Relaxed);
        s.per.store(c.per, Ordering::Relaxed);
        s.meta.store(
            u64::from(c.epoch) | (u64::from(c.inf_gen) << 32),
            Ordering::Relaxed,
        );
        d.limit.store(c.limit.to_bits(), Ordering::Relaxed);
        d.since.store(c.since, Ordering::Relaxed);
        let origin = c.origin.unwrap_or(i128::MIN) as u128;
        d.origin_lo.store(origin as u64, Ordering::Relaxed);
        d.origin_hi.store((origin >> 64) as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `born_at` (a keyed map's new bucket) leaves the configuration in slot 0, the one in
    /// the line a keyed map's check loads first, and the bucket as a reconfiguration at the
    /// birth time leaves it.
    #[test]
    fn born_at_leaves_the_configuration_in_slot_zero() {
        let limit = Limit::per_second(10.0).unwrap();
        let mut tb = TokenBucket::compact_with_clock(limit, 2, crate::ManualClock::default());
        let born = Nanos::new(5_000_000_000);
        tb.born_at(born);
        let word = tb.core.state.load(Ordering::Relaxed);
        assert_eq!((word >> PARITY_SHIFT) & 1, 0, "word {word:#x}");
        let cfg = tb.slot(word).config();
        assert_eq!(
            (cfg.since, cfg.burst(), cfg.limit),
            (born.as_u64(), 2, 10.0)
        );
        assert!(tb.check_n_at(born, 2).is_ok() && tb.check_n_at(born, 1).is_err());
    }

    /// The generation count visits all 64 values before it repeats, its parity (the slot)
    /// alternates on every step, and a word built from any of them keeps bit 63 clear.
    #[test]
    fn generations_cycle_through_64_with_alternating_parity() {
        let mut seen = [false; 64];
        let mut gen = 0;
        for step in 0..64 {
            assert!(
                !seen[gen as usize],
                "generation {gen} repeats at step {step}"
            );
            seen[gen as usize] = true;
            let word = (gen << GEN_SHIFT) | X_MAX;
            assert_eq!(word >> 63, 0, "generation {gen} sets bit 63");
            assert_eq!(word & GEN_MASK, gen << GEN_SHIFT);
            let next = gen_after(gen);
            assert_ne!(next >> 5, gen >> 5, "parity stays at {gen} -> {next}");
            assert_eq!((word >> PARITY_SHIFT) & 1, gen >> 5);
            gen = next;
        }
        assert_eq!(gen, 0);
    }
}
