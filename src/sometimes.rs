//! [`Sometimes`]: run a closure on the first calls, on every n-th call, or at most once per
//! interval. The lock-free port of Go's `rate.Sometimes` (x/time/rate `sometimes.go`).
//!
//! # Protocol
//!
//! Two atomic words, each on its own cache line:
//!
//! * `count` — the number of calls so far. Every call takes its *ticket* (its 0-based call
//!   number) with one `fetch_add(1)`. The count-based filters depend on the ticket alone:
//!   ticket `k` runs `f` iff `k == 0 || k < first || (every > 0 && k % every == 0)`, exactly
//!   what Go decides for its `k`-th call.
//! * `last` — the time of the latest run of `f` that has been published, encoded as
//!   `nanos + 1` (saturating), with `0` (`NEVER`) meaning "no run published yet". Only
//!   touched when `interval > 0`.
//!
//! A call whose ticket passes a count filter publishes its time with `fetch_max(last, now)`
//! before it runs `f`. A call whose ticket fails every count filter may still run `f` for the
//! interval filter: it loads `last` and, if `now - last >= interval`, *claims the interval
//! slot* by CASing `last` from the value it read to `now`. Only the CAS winner runs `f`; a
//! loser re-reads `last` and re-checks, so it runs only if its own time is a whole interval past
//! the winner's. A claimant that reads `NEVER` does not run: `NEVER` with a ticket `> 0` means
//! that ticket 0 — which always runs `f` — is still between its `fetch_add` and its
//! `fetch_max`, i.e. a run is in progress right now.
//!
//! Invariants:
//!
//! 1. `last` never decreases: it is changed only by `fetch_max` and by a CAS to a value at
//!    least `interval > 0` above the value it replaces.
//! 2. Interval-triggered runs are spaced: if two calls run `f` by winning the CAS at times `t1`
//!    and then `t2` (in `last`'s modification order), then `t2 >= t1 + interval`, because the
//!    second CAS expected a value `>= t1` (invariant 1) and checked `t2 - expected >= interval`.
//!    An interval-triggered run is also at least `interval` after every run published before
//!    its CAS, and never happens before the first run is published.
//! 3. Count-triggered runs are exact: over any set of calls, the number of runs by the count
//!    filters is the number of tickets that pass them, whatever the interleaving.
//!
//! # Memory orderings
//!
//! Every operation is `Relaxed`, and that is enough:
//!
//! * `count`: a read-modify-write always reads the latest value in the location's modification
//!   order, so each ticket is handed out exactly once whatever the ordering. No other memory is
//!   published through `count`.
//! * `last`: the decision depends only on `last`'s own value, and single-location coherence
//!   gives what the protocol needs. A CAS succeeds only if no write came between the value it
//!   expected and its own write, so two claimants cannot both win from the same value. A stale
//!   plain load cannot let a call run wrongly: running still needs the CAS, which fails on a
//!   stale value. A stale load can only make a call skip, and because `last` is monotonic
//!   (invariant 1) a value that is "too recent" when stale is too recent now as well. A stale
//!   `NEVER` means the call cannot see ticket 0's publication; then the call and ticket 0 are
//!   concurrent, and the call treats the first run as still in progress.
//! * Sometimes publishes nothing about what `f` did. A call that skips `f` does not wait for a
//!   concurrent run, so it cannot rely on that run's effects (upstream, the mutex makes it
//!   wait). If callers need those effects, they synchronise on them (a `Once`, a lock, an
//!   acquire load); stronger orderings here would not help, because `f` may still be running.
//!
//! # Differences from upstream (also in the type's docs)
//!
//! * `f` runs outside any lock. Concurrent calls can run `f` concurrently, and calling `run`
//!   from inside `f` is fine (upstream deadlocks).
//! * The interval is measured from the time the previous run *started*. Upstream reads
//!   `time.Now()` again after `f` returns.
//! * `last` never moves backwards. Upstream sets `last = now` even when `now` is earlier (a
//!   caller-supplied time), which can make the next interval run come sooner.
//! * Under concurrency, an interval claim cannot see a count-triggered run that has taken its
//!   ticket but not yet published its time (the first run excepted: see `NEVER`), so such a
//!   run and an interval-triggered run can fall within one interval. Each filter keeps its own
//!   promise (invariants 2 and 3). With calls serialised and times non-decreasing, the runs are
//!   exactly upstream's.

use std::fmt;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::sync::{AtomicU64, Ordering};

/// `last` before any run has published its time.
const NEVER: u64 = 0;

/// `now` as stored in `last`: `nanos + 1`, saturating, so that `0` can mean "never".
#[inline]
fn encode(now: Nanos) -> u64 {
    now.as_u64().saturating_add(1)
}

/// Runs a closure on the first calls, on every n-th call, or at most once per interval. This is
/// Go's `rate.Sometimes`, without a lock.
///
/// A call runs `f` if **any** of the configured filters lets it through:
///
/// * it is the first call ever (always, so the zero value [`Sometimes::new`] runs `f` exactly
///   once);
/// * [`first(n)`](Sometimes::first): it is one of the first `n` calls;
/// * [`every(n)`](Sometimes::every): its 0-based call number is a multiple of `n` (calls 1,
///   n+1, 2n+1, ...);
/// * [`interval(d)`](Sometimes::interval): at least `d` has passed since `f` last ran, by
///   whatever filter.
///
/// Every call counts, whether or not `f` runs. A filter set to zero is off.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Nanos, Sometimes};
///
/// // Log the first 3 errors, then every 100th, and at least one every 10 seconds.
/// let log = Sometimes::new()
///     .first(3)
///     .every(100)
///     .interval(Duration::from_secs(10));
/// let mut logged = 0;
/// for i in 0..1_000u64 {
///     log.run_at(Nanos::new(i * 1_000_000), || logged += 1); // one call per millisecond
/// }
/// // Calls 1, 2, 3, then 101, 201, ..., 901; the interval never elapses within one second.
/// assert_eq!(logged, 3 + 9);
/// assert_eq!(log.count(), 1_000);
/// ```
///
/// # Concurrency
///
/// `run` is lock-free: it takes a call number with one `fetch_add`, and an interval run
/// additionally claims its slot with a CAS. The count-based filters are exact under any
/// interleaving. N calls with `every(k)` run `f` exactly `ceil(N / k)` times. Two
/// interval-triggered runs are always at least `interval` apart, and concurrent calls cannot
/// both run `f` for the same interval.
///
/// Differences from Go, which runs `f` while holding a mutex:
///
/// * **`f` runs outside any lock.** Runs triggered by different filters can overlap in time,
///   and a call that skips `f` returns at once, without waiting for a concurrent run to finish.
///   In Go it would block on the mutex until that run had finished. So this is not a
///   `sync.Once`: the zero value runs `f` once, but other callers may return before that run
///   has finished.
/// * **Re-entrancy is fine.** Calling `run` on the same `Sometimes` from inside `f` counts as
///   another call; in Go it deadlocks.
/// * The interval is measured from the time the previous run started (Go reads the clock again
///   after `f` returns), and it never goes backwards: a run at an earlier explicit time than
///   the latest run does not move the interval's start back.
/// * Under concurrency, an interval-triggered run can fall within one interval of a
///   count-triggered run that is concurrent with it (ticket taken, time not yet published).
///   The first run is the exception: concurrent first calls never add an interval run.
///   Serialised calls with non-decreasing times behave exactly as in Go.
///
/// If `f` panics, the call still counts, and a run still sets the interval's start.
pub struct Sometimes<C: Clock = QuantaClock> {
    /// Run `f` on tickets `0..first` (0 = off).
    first: u64,
    /// Run `f` on tickets that are multiples of `every` (0 = off).
    every: u64,
    /// As configured, for `Debug`.
    interval: Duration,
    /// `interval` in nanoseconds, saturating at `u64::MAX` (0 = off).
    interval_nanos: u64,
    /// The number of calls so far; each call's ticket is its pre-increment value.
    count: CachePadded<AtomicU64>,
    /// The encoded time of the latest published run, or `NEVER` (see the module header).
    last: AtomicU64,
    clock: C,
}

impl Sometimes<QuantaClock> {
    /// The zero value, on the default clock: runs `f` on the first call only, until filters
    /// are added with [`first`](Sometimes::first), [`every`](Sometimes::every) and
    /// [`interval`](Sometimes::interval).
    ///
    /// ```
    /// use turnstile::Sometimes;
    ///
    /// let once = Sometimes::new();
    /// assert!(once.run(|| println!("first call")));
    /// assert!(!once.run(|| unreachable!()));
    /// assert_eq!(once.count(), 2);
    /// ```
    #[must_use]
    pub fn new() -> Sometimes<QuantaClock> {
        Sometimes::with_clock(QuantaClock::new())
    }
}

impl Default for Sometimes<QuantaClock> {
    /// The same as [`Sometimes::new`].
    ///
    /// ```
    /// use turnstile::Sometimes;
    ///
    /// let s: Sometimes = Default::default();
    /// assert!(s.run(|| ()));
    /// assert!(!s.run(|| ()));
    /// ```
    fn default() -> Sometimes<QuantaClock> {
        Sometimes::new()
    }
}

impl<C: Clock> Sometimes<C> {
    /// The zero value (runs `f` on the first call only), reading time from `clock`. Only the
    /// interval filter reads the clock, and [`run_at`](Sometimes::run_at) never does.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{ManualClock, Nanos, Sometimes};
    ///
    /// let clock = ManualClock::new(Nanos::ZERO);
    /// let s = Sometimes::with_clock(clock.clone()).interval(Duration::from_secs(1));
    /// assert!(s.run(|| ()));
    /// assert!(!s.run(|| ()));
    /// clock.advance(Duration::from_secs(1));
    /// assert!(s.run(|| ()));
    /// ```
    #[must_use]
    pub fn with_clock(clock: C) -> Sometimes<C> {
        Sometimes {
            first: 0,
            every: 0,
            interval: Duration::ZERO,
            interval_nanos: 0,
            count: CachePadded::new(AtomicU64::new(0)),
            last: AtomicU64::new(NEVER),
            clock,
        }
    }

    /// Also runs `f` on each of the first `n` calls (Go's `First`; 0 turns the filter off).
    ///
    /// ```
    /// use turnstile::{Nanos, Sometimes};
    ///
    /// let s = Sometimes::new().first(2);
    /// let ran: Vec<bool> = (0..4).map(|_| s.run_at(Nanos::ZERO, || ())).collect();
    /// assert_eq!(ran, [true, true, false, false]);
    /// ```
    #[must_use]
    pub fn first(mut self, n: u64) -> Sometimes<C> {
        self.first = n;
        self
    }

    /// Also runs `f` on every `n`-th call: calls 1, n+1, 2n+1, ... (Go's `Every`; 0 turns the
    /// filter off).
    ///
    /// ```
    /// use turnstile::{Nanos, Sometimes};
    ///
    /// let s = Sometimes::new().every(2);
    /// let ran: Vec<bool> = (0..5).map(|_| s.run_at(Nanos::ZERO, || ())).collect();
    /// assert_eq!(ran, [true, false, true, false, true]);
    /// ```
    #[must_use]
    pub fn every(mut self, n: u64) -> Sometimes<C> {
        self.every = n;
        self
    }

    /// Also runs `f` when at least `d` has passed since `f` last ran, by whatever filter (Go's
    /// `Interval`; zero turns the filter off). Durations longer than `u64::MAX` nanoseconds
    /// (about 584 years) saturate, so `Duration::MAX` means "never again by interval".
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Nanos, Sometimes};
    ///
    /// let s = Sometimes::new().interval(Duration::from_secs(1));
    /// assert!(s.run_at(Nanos::ZERO, || ()));
    /// assert!(!s.run_at(Nanos::new(999_999_999), || ()));
    /// assert!(s.run_at(Nanos::new(1_000_000_000), || ()));
    /// ```
    #[must_use]
    pub fn interval(mut self, d: Duration) -> Sometimes<C> {
        self.interval = d;
        self.interval_nanos = Nanos::from_duration(d).as_u64();
        self
    }

    /// Counts a call and runs `f` if a filter lets this call through, reading the time from
    /// the clock (only if the interval filter is on). Returns whether `f` ran.
    ///
    /// `f` runs on the calling thread, outside any lock: it may call `run` again.
    ///
    /// ```
    /// use turnstile::Sometimes;
    ///
    /// let s = Sometimes::new().every(3);
    /// let mut runs = 0;
    /// for _ in 0..7 {
    ///     s.run(|| runs += 1); // calls 1, 4, 7
    /// }
    /// assert_eq!(runs, 3);
    /// ```
    pub fn run(&self, f: impl FnOnce()) -> bool {
        let ran = self.decide(|| self.clock.now());
        if ran {
            f();
        }
        ran
    }

    /// [`run`](Sometimes::run) at the explicit time `now` instead of the clock's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{Nanos, Sometimes};
    ///
    /// let s = Sometimes::new().interval(Duration::from_millis(10));
    /// let t = Nanos::new(5_000_000);
    /// assert!(s.run_at(t, || ()));
    /// assert!(!s.run_at(t + Duration::from_millis(9), || ()));
    /// assert!(s.run_at(t + Duration::from_millis(10), || ()));
    /// ```
    pub fn run_at(&self, now: Nanos, f: impl FnOnce()) -> bool {
        let ran = self.decide(|| now);
        if ran {
            f();
        }
        ran
    }

    /// The number of calls so far, whether or not they ran `f`. Includes calls still in
    /// progress on other threads.
    ///
    /// ```
    /// use turnstile::Sometimes;
    ///
    /// let s = Sometimes::new();
    /// s.run(|| ());
    /// s.run(|| ());
    /// assert_eq!(s.count(), 2);
    /// ```
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The clock this `Sometimes` reads.
    ///
    /// ```
    /// use turnstile::{Clock, ManualClock, Nanos, Sometimes};
    ///
    /// let s = Sometimes::with_clock(ManualClock::new(Nanos::new(7)));
    /// assert_eq!(s.clock().now(), Nanos::new(7));
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Counts the call and decides whether it runs `f`; `now` is read only if the interval
    /// filter is on. See the module header for the protocol.
    #[inline]
    fn decide(&self, now: impl FnOnce() -> Nanos) -> bool {
        // Relaxed: the ticket's uniqueness comes from the RMW, not from the ordering.
        let ticket = self.count.fetch_add(1, Ordering::Relaxed);
        let by_count = ticket == 0
            || ticket < self.first
            || (self.every > 0 && ticket.is_multiple_of(self.every));
        if self.interval_nanos == 0 {
            return by_count;
        }
        let now = encode(now());
        if by_count {
            // Publish this run's time so that interval claims measure from it; never
            // move `last` backwards (invariant 1).
            self.last.fetch_max(now, Ordering::Relaxed);
            return true;
        }
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            // NEVER: ticket 0 is running `f` right now and has not published yet.
            if last == NEVER || now.saturating_sub(last) < self.interval_nanos {
                return false;
            }
            match self
                .last
                .compare_exchange_weak(last, now, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => last = actual,
            }
        }
    }
}

impl<C: Clock> fmt::Debug for Sometimes<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let last = match self.last.load(Ordering::Relaxed) {
            NEVER => None,
            s => Some(Nanos::new(s - 1)),
        };
        f.debug_struct("Sometimes")
            .field("first", &self.first)
            .field("every", &self.every)
            .field("interval", &self.interval)
            .field("count", &self.count())
            .field("last", &last)
            .finish_non_exhaustive()
    }
}
