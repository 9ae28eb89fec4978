//! A lock-free token bucket with the semantics of Go's `golang.org/x/time/rate`.
//!
//! # The protocol
//!
//! **Representation.** A bucket of `burst` tokens refilling at `limit` tokens per second is
//! held as one number, `tat` ("theoretical arrival time", GCRA's name): the instant at which
//! the bucket was (or will be) empty, ignoring the cap. The tokens at time `t` are
//! `min(burst, (t - tat) * limit)`, which can be negative while reservations are outstanding.
//! Taking `n` tokens at `t` is `tat' = max(tat, t - tau) + n * T`, with `T = 1/limit` and
//! `tau = burst * T`; this is exactly rate.go's `advance` then `tokens -= n` (see
//! `reserve`). Time runs in ticks of 2^-32 ns, so `T` keeps ~10 significant digits even at a
//! billion events per second and repeated reservations do not drift.
//!
//! **The state word** (`state`, one `AtomicU128`, cache-padded):
//! ```text
//!  127                                   32 31          0
//! +---------------------------------------+-------------+
//! |  body: 96 bits                        | epoch: u32  |
//! +---------------------------------------+-------------+
//! ```
//! `epoch` names the configuration the body is expressed in. For a finite positive limit the
//! body is `tat` as a signed 96-bit tick count (`|tat| <= i64::MAX ns`). For a zero or
//! infinite limit, which have no `tat`, bits 64..128 hold the stored tokens as `f64` bits.
//!
//! **Configurations** (limit, burst and derived `T`, `tau`) live in two seqlock-validated
//! slots, one per epoch parity (`src/config_slots.rs` states that protocol). A slot also holds
//! the configuration's token-coordinate origin (see *Cancel* below), which only reserve,
//! cancel and reconfiguration read: a check reads just the first five words. Only
//! `set_limit`/`set_burst` write slots; they are serialized among themselves by a mutex that
//! the hot path never touches. A reconfiguration writes the *other* slot with epoch `e + 1`,
//! then converts the body (tokens at `now` under the old config, re-expressed under the new
//! one) and installs it with one CAS on the state word. So:
//!
//! * **Invariant:** the body of the state word is always expressed in the configuration of
//!   the word's own epoch, and that slot holds that configuration for as long as the word
//!   carries that epoch (the slot `e & 1` is next written for epoch `e + 2`, which needs the
//!   word to reach `e + 1` first).
//! * Every operation computes from one state word and the configuration of *its* epoch, and
//!   commits with a CAS on the whole word, so a reservation computed under the old
//!   configuration fails its CAS once a reconfiguration has committed: none is ever computed
//!   half under the old configuration (`set_limit` is linearizable with `reserve` and
//!   `cancel`). A 32-bit epoch would have to wrap during one CAS loop for this to fail.
//! * A denial, a zero-token request and everything under an infinite limit write nothing;
//!   they linearize at the load of the state word. (Where the CPU has no native 128-bit load,
//!   `portable_atomic` performs that load as a compare-exchange that writes back the value
//!   it read: no value changes, but the cache line is taken exclusive; see the crate docs.)
//!
//! **Orderings.** The state word is loaded with `Acquire`: it pairs with the `Release` of the
//! reconfiguring CAS, so the slot written before that CAS is visible to whoever sees the new
//! epoch. Hot-path CASes are `AcqRel`; being read-modify-writes they also extend the release
//! sequence of the reconfiguration, so later readers of their values still see the slot. The
//! slots' own seqlock orderings are argued in `src/config_slots.rs`; a failed slot read only
//! means the reader's state word was stale, and it reloads it: readers never wait for a
//! writer.
//!
//! # Deviations from rate.go
//! * **D1** a [`Reservation`] is cancelled at most once ([`Reservation::cancel`] takes it by
//!   value).
//! * **D2** an earlier time never creates tokens: over any history, grants never exceed
//!   `burst + limit * (latest time - earliest time)` plus one request.
//! * **D3** [`Limit`] is validated: no NaN or negative limits.
//! * **D4** with a zero limit and too few tokens, a reservation is not OK and waits fail at
//!   once with [`WaitError::Never`]; the same holds for any reservation whose wait would
//!   pass the end of representable time (~292 years), where rate.go returns `InfDuration`.
//! * **D5** `n` is unsigned.
//! * **Cancel** restores the reserved tokens minus the tokens reserved after them, as rate.go
//!   does, but counts those later tokens exactly: each reservation keeps the *token
//!   coordinate* of the instant it acts (a count that every take raises by its tokens and
//!   that refill and `set_limit`/`set_burst` leave alone; see `Config::coord`), and a cancel
//!   measures the distance to the state's coordinate now. rate.go measures it as
//!   `r.limit * (lastEvent - timeToAct)` from times truncated to whole nanoseconds, so:
//!   - the two agree, to the token, for the latest reservation (at any limit) and for one
//!     whose later reservations were made under its own limit, before or after a
//!     `set_limit` (the reproductions of issue #8 in `tests/token_bucket_semantics.rs`);
//!   - after an earlier cancel, rate.go's `lastEvent` still counts tokens that cancel gave
//!     back, so it restores less than later reservations left free (golang/go#56924,
//!     #69419); turnstile restores exactly that;
//!   - rate.go values reservations made under a *different* limit at the cancelled one's
//!     limit; turnstile counts their tokens;
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
//! * Limits above 2^32 × 10^9 per second act as that limit (one token per tick). A limit so
//!   small that refilling the burst would take longer than ~292 years never refills: it acts
//!   as a zero limit (rate.go would add one token every few centuries).

use std::fmt;
use std::time::Duration;

use crossbeam_utils::Backoff;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::config_slots::ConfigSlots;
use crate::error::WaitError;
use crate::limit::Limit;
use crate::limiter::{Compact, Denied, Idle, Layout, Limiter, Padded};
use crate::sync::{AtomicU128, Mutex, Ordering}; // Mutex: reconfiguration only, never the hot path

/// A lock-free token bucket: `limit` tokens per second, at most `burst` at once, with the API
/// and semantics of Go's `rate.Limiter` (deviations in the [module docs](self)).
///
/// The bucket starts full. `allow` takes tokens now or not at all; `reserve` always takes
/// them (when the request can ever be met) and says how long to wait; `wait_n_blocking` and
/// `wait_n` (feature `tokio`) sleep until then.
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
pub struct TokenBucket<C: Clock = QuantaClock, P: Layout = Padded> {
    /// Cache-padded unless `P` is [`Compact`] (for the many buckets of a keyed map).
    state: P::Cell<AtomicU128>,
    configs: ConfigSlots<CONFIG_WORDS, P>,
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
        let cfg = Config::new(0, limit, burst, Nanos::ZERO, 0);
        // The bucket starts full: rate.go's tokens = burst with last = the zero time.
        let body = cfg.body_from_tokens(f64::from(burst), Nanos::ZERO);
        TokenBucket {
            state: P::cell(AtomicU128::new(pack(body, 0))),
            configs: ConfigSlots::new(cfg.to_words(Some(0))),
            reconfig: Mutex::new(()), // see the field: reconfiguration only
            clock,
        }
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The current limit.
    pub fn limit(&self) -> Limit {
        Limit::from_valid(self.load().1.limit)
    }

    /// The current burst.
    pub fn burst(&self) -> u32 {
        self.load().1.burst
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
        let (word, cfg) = self.load();
        cfg.tokens(body(word), now)
    }

    /// Takes one token now if there is one.
    pub fn allow(&self) -> bool {
        self.allow_n_at(self.clock.now(), 1)
    }

    /// [`TokenBucket::allow`] at `now`.
    pub fn allow_at(&self, now: Nanos) -> bool {
        self.allow_n_at(now, 1)
    }

    /// Takes `n` tokens now if there are `n`.
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
    pub fn allow_n_at(&self, now: Nanos, n: u32) -> bool {
        matches!(
            self.take(now, n, Ticks::ZERO_WAIT),
            Decision::Granted { .. }
        )
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
        self.reserve_within(now, n, Ticks::UNBOUNDED_WAIT)
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
        self.reserve_within(now, n, Ticks::from_duration(max_wait))
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
        let (word, cfg) = self.load();
        let tokens = cfg.tokens(body(word), now);
        let available_at = match cfg.plan(body(word), now, n) {
            Plan::Free => Some(now),
            Plan::Never => None,
            Plan::Take { ready, .. } => Some(ready.max(Ticks::from_nanos(now)).ceil_nanos()),
        };
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
        self.reconfigure(now, |cfg| (limit, cfg.burst))
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
        self.reconfigure(now, |cfg| (Limit::from_valid(cfg.limit), burst))
    }

    /// Waits until `n` tokens are available and takes them, sleeping the thread; fails at
    /// once if that would pass `deadline`. The checks run in rate.go's order: more than the
    /// burst ([`WaitError::ExceedsBurst`]), deadline already passed
    /// ([`WaitError::DeadlinePassed`]), tokens that never arrive ([`WaitError::Never`],
    /// deviation D4), tokens that arrive after the deadline
    /// ([`WaitError::WouldExceedDeadline`]). With no wait needed it returns without sleeping.
    ///
    /// The sleep is [`crate::clock::sleep_until`] on the limiter's clock: a thread sleep, then
    /// a spin of at most [`crate::clock::SPIN_BEFORE_DEADLINE`] for a precise wake-up.
    ///
    /// ```
    /// use turnstile::{Limit, TokenBucket, WaitError};
    /// let tb = TokenBucket::new(Limit::per_second(1000.0).unwrap(), 1);
    /// tb.wait_n_blocking(1, None).unwrap();          // immediate: the bucket starts full
    /// assert_eq!(
    ///     tb.wait_n_blocking(2, None),
    ///     Err(WaitError::ExceedsBurst { n: 2, burst: 1 })
    /// );
    /// ```
    pub fn wait_n_blocking(&self, n: u32, deadline: Option<Nanos>) -> Result<(), WaitError> {
        let now = self.clock.now();
        let r = self.reserve_for_wait(now, n, deadline)?;
        if let Some(t) = r.time_to_act() {
            crate::clock::sleep_until(&self.clock, t);
        }
        Ok(())
    }

    /// Waits (asynchronously, on tokio's timer) until `n` tokens are available and takes
    /// them; the checks and errors are those of [`TokenBucket::wait_n_blocking`]. Dropping
    /// the future before it completes cancels its reservation, as rate.go does when the
    /// context is cancelled.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use turnstile::{Limit, TokenBucket};
    /// let tb = TokenBucket::new(Limit::per_second(1000.0).unwrap(), 1);
    /// tb.wait_n(1, None).await.unwrap();
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn wait_n(&self, n: u32, deadline: Option<Nanos>) -> Result<(), WaitError> {
        let now = self.clock.now();
        let r = self.reserve_for_wait(now, n, deadline)?;
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
        let (_, cfg) = self.load();
        if n > cfg.burst && cfg.mode != Mode::Inf {
            return Err(WaitError::ExceedsBurst {
                n,
                burst: cfg.burst,
            });
        }
        let max_wait = match deadline {
            Some(d) if d <= now => return Err(WaitError::DeadlinePassed { n }),
            Some(d) => Ticks::from_duration(d - now),
            None => Ticks::UNBOUNDED_WAIT,
        };
        match self.take(now, n, max_wait) {
            Decision::Granted {
                time_to_act,
                took,
                body,
                cfg,
            } => Ok(self.granted(now, n, time_to_act, took, body, &cfg)),
            Decision::Denied {
                retry_at: None,
                limit,
            } => Err(WaitError::Never { n, limit }),
            Decision::Denied { .. } => Err(WaitError::WouldExceedDeadline { n }),
        }
    }

    fn reserve_within(&self, now: Nanos, n: u32, max_wait: Ticks) -> Reservation<'_, C, P> {
        match self.take(now, n, max_wait) {
            Decision::Granted {
                time_to_act,
                took,
                body,
                cfg,
            } => self.granted(now, n, time_to_act, took, body, &cfg),
            Decision::Denied { limit, .. } => Reservation {
                lim: self,
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

    /// The reservation for a granted take at `now` that left the state body at `body` under
    /// `cfg`. It keeps the exact tick at which it acts, `max(tat, now)` (not its time floored to
    /// whole nanoseconds), and what converts that tick into a token coordinate should the
    /// configuration change before it is cancelled (see [`Config::coord`]).
    fn granted(
        &self,
        now: Nanos,
        n: u32,
        time_to_act: Nanos,
        took: bool,
        body: i128,
        cfg: &Config,
    ) -> Reservation<'_, C, P> {
        // The coordinate's origin: one more read of the slot, on reserve paths only (a check
        // never builds a reservation). `None` if two reconfigurations already rewrote it (a
        // cancel across them then restores nothing) or the coordinate overflowed.
        let origin = if took && cfg.mode == Mode::Finite {
            self.refilled(cfg.epoch).flatten().map(|refilled| Origin {
                since: cfg.since,
                interval: cfg.interval,
                refilled,
            })
        } else {
            None
        };
        Reservation {
            lim: self,
            ok: true,
            tokens: n,
            time_to_act,
            took,
            limit: cfg.limit,
            epoch: cfg.epoch,
            inf_gen: cfg.inf_gen,
            act: body.max(Ticks::from_nanos(now).0),
            origin,
        }
    }

    /// Loads the state word and the configuration of its epoch.
    #[inline]
    fn load(&self) -> (u128, Config) {
        loop {
            let word = self.state.load(Ordering::Acquire);
            let epoch = word as u32;
            if let Some(words) = self.configs.read_first::<HOT_WORDS>(epoch) {
                return (word, Config::from_words(epoch, words));
            }
            // The slot was rewritten for epoch + 2: our word is stale, reload it.
        }
    }

    /// The coordinate origin `K` of epoch `epoch`'s configuration (the slot's cold words, which
    /// checks never read): `None` if the slot was rewritten since (the caller's word is stale),
    /// `Some(None)` if the coordinate has overflowed.
    fn refilled(&self, epoch: u32) -> Option<Option<i128>> {
        self.configs.read(epoch).map(refilled_of)
    }

    /// The tokens reserved after `r`, counted from the state `body` under `cfg` (rate.go's
    /// `r.limit * (lastEvent - r.timeToAct)`, exactly; see [`Config::restore`]). `Err` if the
    /// slot of `cfg` was rewritten (reload the word); `Ok(None)` if the count is unknown
    /// (overflow, or `r`'s origin was lost), in which case nothing is restored.
    fn held_after(
        &self,
        body: i128,
        cfg: &Config,
        r: &Reservation<'_, C, P>,
    ) -> Result<Option<f64>, ()> {
        if r.limit == 0.0 {
            // rate.go: a zero limit values every later span at zero tokens.
            return Ok(Some(0.0));
        }
        if r.epoch == cfg.epoch {
            // One configuration: the stretch of `tat` beyond r's tick, in exact ticks.
            return Ok(Some((body - r.act).max(0) as f64 / cfg.interval.0 as f64));
        }
        let now_k = self.refilled(cfg.epoch).ok_or(())?;
        let later = (|| {
            let o = r.origin?;
            let then = o
                .refilled
                .checked_add(coord_offset(r.act, o.since, o.interval)?)?;
            cfg.coord(body, now_k?)?.checked_sub(then)
        })();
        // Never more than the reservation took: a negative count restores just `n`.
        Ok(later.map(|c| c.max(0) as f64 / COORD_ONE))
    }

    /// The one CAS loop behind allow, reserve and wait. A failed CAS retries from the word it
    /// returned (reloading the configuration only if the epoch moved): under contention this
    /// halves the time per operation against reloading.
    #[inline(always)]
    fn take(&self, now: Nanos, n: u32, max_wait: Ticks) -> Decision {
        let backoff = Backoff::new();
        let (mut word, mut cfg) = self.load();
        loop {
            let new_body = match cfg.plan(body(word), now, n) {
                Plan::Free => {
                    return Decision::Granted {
                        time_to_act: now,
                        took: false,
                        body: body(word),
                        cfg,
                    }
                }
                Plan::Never => {
                    return Decision::Denied {
                        retry_at: None,
                        limit: cfg.limit,
                    }
                }
                Plan::Take { body: taken, ready } => {
                    // Both below 2^97, and max_wait < wait in the subtraction: no overflow.
                    let wait = Ticks(ready.0 - Ticks::from_nanos(now).0);
                    if wait > max_wait {
                        return Decision::Denied {
                            retry_at: Some(Ticks(ready.0 - max_wait.0).ceil_nanos()),
                            limit: cfg.limit,
                        };
                    }
                    if n == 0 {
                        // Nothing to take: the answer stands on the load alone.
                        return Decision::Granted {
                            time_to_act: ready.max(Ticks::from_nanos(now)).floor_nanos(),
                            took: false,
                            body: body(word),
                            cfg,
                        };
                    }
                    taken
                }
            };
            let new = pack(new_body, cfg.epoch);
            match self
                .state
                .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let ready = cfg.ready_after(new_body, now);
                    return Decision::Granted {
                        time_to_act: ready,
                        took: true,
                        body: new_body,
                        cfg,
                    };
                }
                Err(current) => {
                    backoff.spin();
                    word = current;
                    if word as u32 != cfg.epoch {
                        (word, cfg) = self.load();
                    }
                }
            }
        }
    }

    fn cancel(&self, r: &Reservation<'_, C, P>, now: Nanos) {
        // rate.go's CancelAt checks, in its order (the limit check is inside the loop).
        if !r.ok || !r.took || r.tokens == 0 || r.time_to_act < now {
            return;
        }
        let backoff = Backoff::new();
        let (mut word, mut cfg) = self.load();
        loop {
            if cfg.mode == Mode::Inf || r.inf_gen != cfg.inf_gen {
                // rate.go does nothing under an infinite limit; after an infinite refill the
                // bucket already holds what `r` took.
                return;
            }
            let held = match self.held_after(body(word), &cfg, r) {
                Ok(Some(held)) => held,
                Ok(None) => return,
                Err(()) => {
                    (word, cfg) = self.load();
                    continue;
                }
            };
            let Some(new_body) = cfg.restore(body(word), now, f64::from(r.tokens) - held) else {
                return;
            };
            let new = pack(new_body, cfg.epoch);
            match self
                .state
                .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(current) => {
                    backoff.spin();
                    word = current;
                    if word as u32 != cfg.epoch {
                        (word, cfg) = self.load();
                    }
                }
            }
        }
    }

    fn reconfigure(&self, now: Nanos, f: impl Fn(&Config) -> (Limit, u32)) {
        // Off the hot path: serializes reconfigurations among themselves so that only one
        // writer ever touches the spare slot. allow/reserve/cancel never take this lock.
        let _writer = self.reconfig.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let (word, cur) = self.load();
            // Only this writer changes epochs, so the slot of `cur` is intact.
            let Some(cur_k) = self.refilled(cur.epoch) else {
                continue;
            };
            let (limit, burst) = f(&cur);
            let tokens = cur.tokens(body(word), now);
            // The new configuration's coordinates continue the old ones: the state keeps its
            // coordinate, so a cancel still counts exactly the tokens taken since a reservation.
            let refilled = cur_k
                .and_then(|k| cur.coord(body(word), k))
                .and_then(|c| c.checked_add((tokens * COORD_ONE) as i128));
            let next = Config::new(
                cur.epoch.wrapping_add(1),
                limit,
                burst,
                now,
                cur.inf_gen_after(now),
            );
            let new = pack(next.body_from_tokens(tokens, now), next.epoch);
            self.configs.write(next.epoch, next.to_words(refilled));
            if self
                .state
                .compare_exchange_weak(word, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl<C: Clock, P: Layout> Limiter for TokenBucket<C, P> {
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        match self.take(now, n, Ticks::ZERO_WAIT) {
            Decision::Granted { .. } => Ok(()),
            Decision::Denied { retry_at, .. } => Err(Denied::new(now, retry_at)),
        }
    }

    fn now(&self) -> Nanos {
        self.clock.now()
    }
}

/// Idle exactly when the bucket is full at `now`: its tokens at `now` equal its burst, which
/// is what a fresh bucket holds, so the two are **identical** from `now` on (a full bucket
/// has no outstanding reservation holding tokens, and a cancel can never fill it past full).
///
/// * Finite limit: full means `tat <= now - tau`, compared in ticks (exact, no float).
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
/// One load of the state word; nothing is written.
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
        let (word, cfg) = self.load();
        cfg.is_full(body(word), now)
    }

    /// Full at `b` and not before: `tat = b - tau` under a finite limit, so a reading `t < b`
    /// finds `(t - b) * limit` tokens fewer than the burst. A bucket idle at `j <= b` has
    /// `tat <= j - tau <= b - tau`: this `tat` is at least its, which is all the budget proof
    /// (`grants in [x, y] <= burst + limit * (y - x)` plus one request) needs, as `tat` then
    /// never decreases over the key's whole history. Under a zero or infinite limit the
    /// stored tokens do not depend on time: the bucket stays as built (full).
    fn born_at(&mut self, b: Nanos) {
        born_at(&self.state, self.load(), b);
    }
}

/// [`Idle::born_at`] for a bucket nobody else sees yet: re-expresses a full burst at `b` in
/// the word's own configuration. One CAS, retried only if it fails spuriously (nobody else
/// can write the word).
fn born_at(state: &AtomicU128, (word, cfg): (u128, Config), b: Nanos) {
    let new = pack(cfg.body_from_tokens(f64::from(cfg.burst), b), cfg.epoch);
    let mut current = word;
    while let Err(actual) =
        state.compare_exchange_weak(current, new, Ordering::Relaxed, Ordering::Relaxed)
    {
        current = actual;
    }
}

impl<C: Clock, P: Layout> fmt::Debug for TokenBucket<C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (word, cfg) = self.load();
        f.debug_struct("TokenBucket")
            .field("limit", &Limit::from_valid(cfg.limit))
            .field("burst", &cfg.burst)
            .field("epoch", &cfg.epoch)
            .field("body", &body(word))
            .finish()
    }
}

/// What [`TokenBucket::peek_n_at`] reports: nothing is consumed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peek {
    /// Tokens in the bucket at the peek's time (negative while reservations are outstanding).
    pub tokens: f64,
    /// The earliest time `n` tokens will be available, if they ever will be.
    pub available_at: Option<Nanos>,
}

/// Tokens taken from a [`TokenBucket`], to act on at [`Reservation::time_to_act`] or give back
/// with [`Reservation::cancel`] (rate.go's `Reservation`).
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
    /// The exact tick at which it acts, `max(tat, now)`: a cancel counts the tokens reserved
    /// after it from there.
    act: i128,
    /// What places `act` on the token coordinate, for a cancel under another configuration.
    origin: Option<Origin>,
}

/// A finite configuration's coordinate origin, kept by a reservation (see [`Config::coord`]).
#[derive(Clone, Copy, Debug)]
struct Origin {
    since: Nanos,
    interval: Ticks,
    refilled: i128,
}

impl<C: Clock, P: Layout> Reservation<'_, C, P> {
    /// Whether the tokens were reserved. A reservation that is not OK took nothing.
    pub fn ok(&self) -> bool {
        self.ok
    }

    /// The number of tokens asked for.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// The limit when the reservation was made.
    pub fn limit(&self) -> Limit {
        Limit::from_valid(self.limit)
    }

    /// When the reserved tokens are available; `None` if the reservation is not OK.
    pub fn time_to_act(&self) -> Option<Nanos> {
        self.ok.then_some(self.time_to_act)
    }

    /// How long after `now` to wait before acting: zero if already due, `Duration::MAX` if
    /// the reservation is not OK (rate.go's `InfDuration`).
    pub fn delay_from(&self, now: Nanos) -> Duration {
        if self.ok {
            self.time_to_act.saturating_duration_since(now)
        } else {
            Duration::MAX
        }
    }

    /// [`Reservation::delay_from`] the limiter's clock reading.
    pub fn delay(&self) -> Duration {
        self.delay_from(self.lim.clock.now())
    }

    /// Gives the tokens back now; see [`Reservation::cancel_at`].
    pub fn cancel(self) {
        let now = self.lim.clock.now();
        self.cancel_at(now)
    }

    /// Gives back, at `now`, the reserved tokens that later reservations have not already
    /// been promised. Nothing happens if the reservation is not OK or its time has passed.
    /// It consumes the reservation, so it happens at most once (deviation D1).
    pub fn cancel_at(self, now: Nanos) {
        self.lim.cancel(&self, now)
    }
}

impl<C: Clock, P: Layout> fmt::Debug for Reservation<'_, C, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("ok", &self.ok)
            .field("tokens", &self.tokens)
            .field("time_to_act", &self.time_to_act)
            .field("limit", &self.limit)
            .finish()
    }
}

// ---- arithmetic helpers ---------------------------------------------------------------------

/// What a take decided.
enum Decision {
    Granted {
        time_to_act: Nanos,
        took: bool,
        /// The state body the take left (or found, if it took nothing) and its configuration.
        body: i128,
        cfg: Config,
    },
    Denied {
        retry_at: Option<Nanos>,
        limit: f64,
    },
}

/// What taking `n` tokens would do, before the wait is compared with the caller's maximum.
enum Plan {
    /// No state change needed: granted now (infinite limit).
    Free,
    /// Can never be granted (more than the burst, a zero limit with too few tokens, or a wait
    /// past the end of representable time).
    Never,
    /// Granted at `ready` with the state body becoming `body`.
    Take { body: i128, ready: Ticks },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Finite,
    Zero,
    Inf,
}

/// Time in 2^-32 ns ticks, as a signed 96-bit quantity held in an `i128`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Ticks(i128);

const FRAC_BITS: u32 = 32;
const TICKS_PER_NS: f64 = (1u64 << FRAC_BITS) as f64;
const TICKS_PER_SEC: f64 = TICKS_PER_NS * 1e9;

impl Ticks {
    /// The latest `tat` the state can hold: i64::MAX ns.
    const MAX: Ticks = Ticks((i64::MAX as i128) << FRAC_BITS);
    const MIN: Ticks = Ticks(-((i64::MAX as i128) << FRAC_BITS));
    const ZERO_WAIT: Ticks = Ticks(0);
    const UNBOUNDED_WAIT: Ticks = Ticks(i128::MAX);

    #[inline]
    fn from_nanos(t: Nanos) -> Ticks {
        Ticks((t.as_u64() as i128) << FRAC_BITS)
    }

    #[inline]
    fn from_duration(d: Duration) -> Ticks {
        let ns = i128::try_from(d.as_nanos()).unwrap_or(i128::MAX);
        Ticks(ns.saturating_mul(1 << FRAC_BITS))
    }

    /// `x` as ticks, saturating into `[MIN, MAX]` (`as` saturates and maps NaN to 0).
    #[inline]
    fn from_f64(x: f64) -> Ticks {
        Ticks(x as i128).clamp(Ticks::MIN, Ticks::MAX)
    }

    #[inline]
    fn saturating_sub(self, o: Ticks) -> Ticks {
        Ticks(self.0.saturating_sub(o.0))
    }

    /// Truncated to whole nanoseconds (rate.go truncates durations), clamped to `Nanos`.
    #[inline]
    fn floor_nanos(self) -> Nanos {
        Nanos::new((self.0 >> FRAC_BITS).clamp(0, u64::MAX as i128) as u64)
    }

    /// Rounded up to whole nanoseconds: the first nanosecond at which the time has passed.
    #[inline]
    fn ceil_nanos(self) -> Nanos {
        let ns = (self.0 + ((1 << FRAC_BITS) - 1)) >> FRAC_BITS;
        Nanos::new(ns.clamp(0, u64::MAX as i128) as u64)
    }
}

#[inline]
fn pack(body: i128, epoch: u32) -> u128 {
    ((body as u128) << 32) | u128::from(epoch)
}

#[inline]
fn body(word: u128) -> i128 {
    (word as i128) >> 32
}

/// Zero and infinite limits store tokens, as f64 bits, in the body's top 64 bits.
#[inline]
fn tokens_body(tokens: f64) -> i128 {
    i128::from(tokens.to_bits() as i64) << 32
}

#[inline]
fn body_tokens(body: i128) -> f64 {
    f64::from_bits((body >> 32) as u64)
}

/// Words of a [`Config`] in its slot: limit, burst and inf_gen, since, interval (2) (the
/// `HOT_WORDS` every check reads; `tau = interval * burst` is recomputed, so that two slots
/// of seven words still fit one 128-byte line pair), then the coordinate origin `K` (2), which
/// only reserve, cancel and reconfiguration read.
const CONFIG_WORDS: usize = 7;
const HOT_WORDS: usize = 5;

/// The coordinate origin `K` from a slot's words (`None`: overflowed).
fn refilled_of(w: [u64; CONFIG_WORDS]) -> Option<i128> {
    let k = ((u128::from(w[6]) << 64) | u128::from(w[5])) as i128;
    (k != i128::MIN).then_some(k)
}

/// One configuration, as read from its slot.
#[derive(Clone, Copy, Debug)]
struct Config {
    epoch: u32,
    limit: f64,
    burst: u32,
    /// When this configuration took effect: rate.go's `last` for an infinite limit, under
    /// which nothing else moves it.
    since: Nanos,
    mode: Mode,
    /// Ticks per token (`T`), at least 1.
    interval: Ticks,
    /// Ticks to refill the whole burst (`tau`).
    tau: Ticks,
    /// How many infinite refills (an infinite limit with time passing, which fills the bucket)
    /// happened before this configuration. A reservation made before one took tokens that the
    /// refill has already given back, so cancelling it restores nothing.
    inf_gen: u32,
}

impl Config {
    #[inline]
    fn new(epoch: u32, limit: Limit, burst: u32, since: Nanos, inf_gen: u32) -> Config {
        let l = limit.as_f64();
        // Zero, infinite and too-small limits keep no interval; `from_parts` reads the mode
        // back from that, as a slot reader does.
        let (mut interval, mut tau) = (Ticks(0), Ticks(0));
        if !limit.is_inf() && l != 0.0 {
            let t = Ticks::from_f64(TICKS_PER_SEC / l).max(Ticks(1));
            // If refilling the burst would take past the end of representable time (~292
            // years), the limit never refills, exactly like a zero limit.
            if matches!(t.0.checked_mul(i128::from(burst.max(1))), Some(full) if full < Ticks::MAX.0)
            {
                (interval, tau) = (t, Ticks(t.0 * i128::from(burst)));
            }
        }
        Config::from_parts(epoch, l, burst, since, interval, tau, inf_gen)
    }

    #[inline]
    fn from_parts(
        epoch: u32,
        limit: f64,
        burst: u32,
        since: Nanos,
        interval: Ticks,
        tau: Ticks,
        inf_gen: u32,
    ) -> Config {
        let mode = if limit == f64::MAX {
            Mode::Inf
        } else if interval.0 == 0 {
            Mode::Zero
        } else {
            Mode::Finite
        };
        Config {
            epoch,
            limit,
            burst,
            since,
            mode,
            interval,
            tau,
            inf_gen,
        }
    }

    /// The configuration as slot words (see [`ConfigSlots`]).
    /// The configuration and its coordinate origin `K` (`refilled`; `None` once it has
    /// overflowed `i128`, after ~2^95 tokens) as slot words.
    fn to_words(self, refilled: Option<i128>) -> [u64; CONFIG_WORDS] {
        let i = self.interval.0;
        // i128::MIN stands for "overflowed": no coordinate reaches it (see `coord`).
        let k = refilled.unwrap_or(i128::MIN);
        [
            self.limit.to_bits(),
            u64::from(self.burst) | (u64::from(self.inf_gen) << 32),
            self.since.as_u64(),
            i as u64,
            (i >> 64) as u64,
            k as u64,
            (k >> 64) as u64,
        ]
    }

    #[inline]
    fn from_words(epoch: u32, w: [u64; HOT_WORDS]) -> Config {
        let interval = ((u128::from(w[4]) << 64) | u128::from(w[3])) as i128;
        let burst = w[1] as u32;
        // `tau` is not stored: `Config::new` keeps `interval * burst` below `Ticks::MAX`
        // (and both are 0 for a zero or infinite limit), so this product cannot overflow.
        Config::from_parts(
            epoch,
            f64::from_bits(w[0]),
            burst,
            Nanos::new(w[2]),
            Ticks(interval),
            Ticks(interval * i128::from(burst)),
            (w[1] >> 32) as u32,
        )
    }

    /// rate.go's `advance(now)`: the tokens at `now`, capped at the burst.
    #[inline]
    fn tokens(&self, body: i128, now: Nanos) -> f64 {
        let burst = f64::from(self.burst);
        match self.mode {
            Mode::Finite => {
                // Counted in intervals, the unit `plan` spends, so that a full bucket holds
                // exactly `burst` and taking n leaves exactly n fewer.
                let elapsed = Ticks::from_nanos(now).saturating_sub(Ticks(body));
                if elapsed >= self.tau {
                    burst
                } else {
                    let (whole, part) = (elapsed.0 / self.interval.0, elapsed.0 % self.interval.0);
                    whole as f64 + part as f64 / self.interval.0 as f64
                }
            }
            Mode::Zero => body_tokens(body).min(burst),
            // elapsed * MaxFloat64 overflows to +Inf when time has passed since `last`.
            Mode::Inf if now > self.since => burst,
            Mode::Inf => body_tokens(body).min(burst),
        }
    }

    /// Whether the bucket holds its whole burst at `now` (see [`Idle`] for `TokenBucket`).
    /// Finite limits compare ticks, so "full" is exact rather than a float that rounded up.
    #[inline]
    fn is_full(&self, body: i128, now: Nanos) -> bool {
        match self.mode {
            Mode::Finite => Ticks::from_nanos(now).saturating_sub(Ticks(body)) >= self.tau,
            Mode::Zero | Mode::Inf => self.tokens(body, now) >= f64::from(self.burst),
        }
    }

    /// Re-expresses `tokens` at `now` as a body under this configuration.
    #[inline]
    fn body_from_tokens(&self, tokens: f64, now: Nanos) -> i128 {
        match self.mode {
            Mode::Finite => {
                let held = self.ticks_for(tokens);
                Ticks::from_nanos(now)
                    .saturating_sub(held)
                    .clamp(Ticks::MIN, Ticks::MAX)
                    .0
            }
            Mode::Zero | Mode::Inf => tokens_body(tokens),
        }
    }

    /// Ticks that `n <= burst` tokens cost: at most `tau`, which `Config::new` keeps below
    /// `Ticks::MAX`, so no arithmetic on it can overflow an `i128`.
    #[inline]
    fn cost(&self, n: u32) -> i128 {
        self.interval.0 * i128::from(n)
    }

    /// The time `tokens` take to refill. Whole tokens are multiplied exactly, so integral token
    /// counts convert without rounding (a full bucket stays exactly full across a change).
    #[inline]
    fn ticks_for(&self, tokens: f64) -> Ticks {
        let whole = tokens.trunc();
        let exact = (whole as i128).saturating_mul(self.interval.0);
        let part = ((tokens - whole) * self.interval.0 as f64) as i128;
        Ticks(exact.saturating_add(part)).clamp(Ticks::MIN, Ticks::MAX)
    }

    /// rate.go's `reserveN` arithmetic for `n` tokens at `now`, without the wait check.
    #[inline]
    fn plan(&self, body: i128, now: Nanos, n: u32) -> Plan {
        match self.mode {
            Mode::Inf => Plan::Free,
            _ if n > self.burst => Plan::Never,
            Mode::Zero => {
                let left = body_tokens(body).min(f64::from(self.burst)) - f64::from(n);
                if left < 0.0 {
                    Plan::Never // deviation D4: a zero limit never refills
                } else {
                    Plan::Take {
                        body: tokens_body(left),
                        ready: Ticks::from_nanos(now),
                    }
                }
            }
            Mode::Finite => {
                // |body|, t, tau and cost are all below 2^97: plain i128 arithmetic is exact.
                let t = Ticks::from_nanos(now);
                let base = body.max(t.0 - self.tau.0);
                let tat = base + self.cost(n);
                if tat >= Ticks::MAX.0 {
                    Plan::Never // D4: the tokens would come after the end of time
                } else {
                    Plan::Take {
                        body: tat,
                        ready: Ticks(tat),
                    }
                }
            }
        }
    }

    /// When a reservation that left the body at `body` may act.
    #[inline]
    fn ready_after(&self, body: i128, now: Nanos) -> Nanos {
        match self.mode {
            Mode::Finite if body > Ticks::from_nanos(now).0 => Ticks(body).floor_nanos(),
            _ => now,
        }
    }

    /// The body after giving back `restore` tokens at `now`, or `None` if nothing is restored.
    ///
    /// rate.go restores `n - r.limit * (lastEvent - r.timeToAct)`: the reserved tokens minus
    /// those reserved after `r` (which were promised times that assumed `r`'s tokens gone).
    /// turnstile counts those later tokens exactly (`TokenBucket::held_after`): under `r`'s own
    /// configuration as the stretch of `tat` beyond `r`'s exact tick, across a
    /// `set_limit`/`set_burst` as the distance between token coordinates, which
    /// reconfiguration keeps. It equals rate.go's count whenever rate.go's `lastEvent` is the
    /// latest reservation's time and the later reservations were made under `r`'s limit (rate.go
    /// values them at `r.limit` even if the limit has changed).
    #[inline]
    fn restore(&self, body: i128, now: Nanos, restore: f64) -> Option<i128> {
        if restore.is_nan() || restore <= 0.0 {
            return None;
        }
        match self.mode {
            Mode::Inf => None,
            Mode::Zero => {
                let burst = f64::from(self.burst);
                Some(tokens_body(
                    (body_tokens(body).min(burst) + restore).min(burst),
                ))
            }
            Mode::Finite => {
                // tokens' = min(burst, tokens(now) + restore)  <=>  tat' = max(now - tau, tat - restore*T)
                let back = self.ticks_for(restore);
                let floor = Ticks::from_nanos(now).0 - self.tau.0;
                Some(body.saturating_sub(back.0).max(floor))
            }
        }
    }

    /// The **token coordinate** of the state `body`: a count, in units of 2^-32 token, that
    /// every take of `n` tokens raises by `n`, that refill does not move, and that
    /// reconfiguration keeps. With `K` = `refilled`, the configuration's origin (kept in its
    /// slot's cold words, and chosen by the reconfiguration so that the state's coordinate
    /// carries over), it is `K + (tat - since) / T` for a finite limit and `K - tokens` for the
    /// stored-token modes, i.e. `K` minus the tokens the state holds at `since`. The
    /// difference between two states' coordinates is the tokens taken between them (net of
    /// cancels), whatever limits applied in between, as long as no take found the bucket full
    /// (refill lost to the cap raises it too; while a reservation can still be cancelled, only
    /// a limit raised after it lets the bucket fill). `None` on `i128` overflow.
    fn coord(&self, body: i128, refilled: i128) -> Option<i128> {
        let offset = match self.mode {
            Mode::Finite => coord_offset(body, self.since, self.interval)?,
            Mode::Zero | Mode::Inf => -((body_tokens(body) * COORD_ONE) as i128),
        };
        refilled.checked_add(offset).filter(|&c| c != i128::MIN)
    }

    /// `inf_gen` for a configuration that replaces this one at `now`: one more if an infinite
    /// limit has filled the bucket (rate.go's `advance` does once time has passed).
    fn inf_gen_after(&self, now: Nanos) -> u32 {
        let filled = self.mode == Mode::Inf && now > self.since;
        self.inf_gen.wrapping_add(u32::from(filled))
    }
}

/// Fractional bits of a token coordinate.
const COORD_BITS: u32 = 32;
const COORD_ONE: f64 = (1u64 << COORD_BITS) as f64;

/// `(tat - since) / interval` in coordinate units (2^-32 token): the tokens a finite
/// configuration's state holds below `since`, negated. Exact in whole tokens, the fraction
/// from an f64 division. `None` on overflow.
fn coord_offset(tat: i128, since: Nanos, interval: Ticks) -> Option<i128> {
    let d = tat.checked_sub(Ticks::from_nanos(since).0)?;
    let t = interval.0;
    let (whole, part) = (d.div_euclid(t), d.rem_euclid(t));
    let frac = (part as f64 / t as f64 * COORD_ONE) as i128;
    whole.checked_mul(1 << COORD_BITS)?.checked_add(frac)
}
