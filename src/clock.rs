//! Time for every limiter: [`Nanos`], the [`Clock`] trait and its three clocks.
//!
//! A time point is plain nanoseconds since the clock's origin, as in governor: limiters do
//! integer arithmetic on it and never see an `Instant`. [`QuantaClock`] (the default) and
//! [`CoarseClock`] share one process-wide origin and one calibrated `quanta::Clock`, so
//! creating a million limiters calibrates the TSC once. [`ManualClock`] is for tests and
//! simulations.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Nanoseconds since a clock's origin. All arithmetic with [`Duration`] saturates.
///
/// ```
/// use std::time::Duration;
/// use turnstile::Nanos;
///
/// let t = Nanos::new(1_000);
/// assert_eq!(t + Duration::from_nanos(500), Nanos::new(1_500));
/// assert_eq!(t - Duration::from_secs(1), Nanos::ZERO); // saturates
/// assert_eq!(Nanos::MAX + Duration::MAX, Nanos::MAX);
/// assert_eq!(Nanos::new(3_000) - t, Duration::from_nanos(2_000));
/// assert_eq!(t - Nanos::new(3_000), Duration::ZERO);
/// ```
#[derive(Copy, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    /// The origin.
    pub const ZERO: Nanos = Nanos(0);
    /// The last representable time (about 584 years after the origin).
    pub const MAX: Nanos = Nanos(u64::MAX);

    /// `nanos` nanoseconds after the origin.
    pub const fn new(nanos: u64) -> Nanos {
        Nanos(nanos)
    }

    /// The time `d` after the origin, saturating at [`Nanos::MAX`].
    ///
    /// There is deliberately no `From<Duration>`: a `Duration` turned into a time point this
    /// way counts from the clock's origin, not from now, so it is spelled out. A wait's timeout
    /// is a [`Deadline`](crate::Deadline), which counts from the start of the wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::Nanos;
    /// assert_eq!(Nanos::from_duration(Duration::from_micros(3)), Nanos::new(3_000));
    /// assert_eq!(Nanos::from_duration(Duration::MAX), Nanos::MAX);
    /// ```
    pub fn from_duration(d: Duration) -> Nanos {
        Nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Nanoseconds since the origin.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// `self + d`, saturating at [`Nanos::MAX`].
    pub fn saturating_add(self, d: Duration) -> Nanos {
        Nanos(self.0.saturating_add(Nanos::from_duration(d).0))
    }

    /// `self - d`, saturating at [`Nanos::ZERO`].
    pub fn saturating_sub(self, d: Duration) -> Nanos {
        Nanos(self.0.saturating_sub(Nanos::from_duration(d).0))
    }

    /// The time from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Nanos) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Nanos {
    type Output = Nanos;
    fn add(self, d: Duration) -> Nanos {
        self.saturating_add(d)
    }
}

impl Sub<Duration> for Nanos {
    type Output = Nanos;
    fn sub(self, d: Duration) -> Nanos {
        self.saturating_sub(d)
    }
}

impl Sub<Nanos> for Nanos {
    type Output = Duration;
    fn sub(self, earlier: Nanos) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Debug for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

/// A source of time for limiters. Implementations must be monotonic.
///
/// ```
/// use turnstile::{Clock, ManualClock, Nanos};
///
/// fn elapsed_since<C: Clock>(c: &C, t: Nanos) -> u64 {
///     c.now().as_u64() - t.as_u64()
/// }
/// let c = ManualClock::new(Nanos::new(10));
/// c.set(Nanos::new(25));
/// assert_eq!(elapsed_since(&c, Nanos::new(10)), 15);
/// ```
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// The process-wide calibrated quanta clock and the origin that every [`QuantaClock`] and
/// [`CoarseClock`] measures from.
struct Shared {
    clock: quanta::Clock,
    origin_raw: u64,
    origin: quanta::Instant,
    /// Whether quanta's source is the TSC, which [`raw_now`] then reads inline (never under
    /// Miri, which cannot run `rdtsc`).
    #[cfg_attr(miri, allow(dead_code))]
    tsc: bool,
    /// Nanoseconds per TSC tick as a 0.64 fixed-point fraction (`ns = ticks * tsc_mul >>
    /// 64`), or 0 where the TSC is not the source or ticks slower than 1 GHz: then quanta's
    /// own conversion (`delta_as_nanos`), whose shift is a variable one.
    #[cfg_attr(any(miri, not(target_arch = "x86_64")), allow(dead_code))]
    tsc_mul: u64,
}

/// quanta's raw reading. Where its source is the TSC, the hot path executes `rdtsc` itself:
/// quanta's `Clock::raw` is an out-of-line call (through the GOT in a position-independent
/// binary) with a branch on the source, on every check of every limiter.
#[inline(always)]
fn raw_now(s: &Shared) -> u64 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if s.tsc {
        // SAFETY: every x86_64 CPU has RDTSC (quanta's own counter reads it the same way), and
        // the instruction only reads the counter.
        #[allow(unused_unsafe)] // a safe intrinsic in later toolchains, unsafe in the MSRV's
        return unsafe { core::arch::x86_64::_rdtsc() };
    }
    s.clock.raw()
}

/// Whether quanta reads the TSC: it does not say which source it picked, so its raw reading
/// is bracketed by two TSC readings, three times. A monotonic clock in nanoseconds since boot
/// falls between two TSC readings taken a few hundred cycles apart only by a coincidence
/// that three brackets at different times rule out.
fn reads_tsc(clock: &quanta::Clock) -> bool {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        (0..3).all(|_| {
            // SAFETY: as in `raw_now`.
            #[allow(unused_unsafe)]
            let (a, q, b) = unsafe {
                let a = core::arch::x86_64::_rdtsc();
                let q = clock.raw();
                (a, q, core::arch::x86_64::_rdtsc())
            };
            a <= q && q <= b
        })
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = clock;
        false
    }
}

/// quanta's calibration as one 0.64 fixed-point multiplier, read off its own conversion of
/// `2^62` ticks: a reading converted with it is quanta's, or one nanosecond less once in a
/// while (the multiplier is short of quanta's fraction by less than `2^-62` ns a tick, under a
/// nanosecond in `2^62` ticks, decades). 0 if a tick is a nanosecond or longer, which the
/// fraction cannot hold.
fn tsc_mul(clock: &quanta::Clock) -> u64 {
    // A tick shorter than a nanosecond, checked on 2^32 ticks, whose conversion cannot wrap
    // (quanta's result is a `u64`); then 2^62 ticks convert to under 2^62 ns.
    if clock.delta_as_nanos(0, 1 << 32) >= 1 << 32 {
        return 0;
    }
    clock.delta_as_nanos(0, 1 << 62) << 2
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// The shared clock. On the hot path this is one load of a static (is it initialised?) and a
/// predicted branch, and every field after it sits at a fixed address: no load through the
/// limiter, which a `&'static Shared` field would put before the TSC read on every check.
#[inline]
fn shared() -> &'static Shared {
    match SHARED.get() {
        Some(s) => s,
        None => init_shared(),
    }
}

#[cold]
#[inline(never)]
fn init_shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        let clock = quanta::Clock::new();
        let tsc = reads_tsc(&clock);
        let origin_raw = clock.raw();
        let origin = clock.scaled(origin_raw);
        Shared {
            tsc_mul: if tsc { tsc_mul(&clock) } else { 0 },
            clock,
            origin_raw,
            origin,
            tsc,
        }
    })
}

/// The default clock: quanta's TSC-based monotonic clock, calibrated once
/// per process and shared by every limiter. Times count from the first use of any
/// `QuantaClock` or `CoarseClock` in the process.
///
/// ```
/// use turnstile::{Clock, QuantaClock};
///
/// let c = QuantaClock::new();
/// let a = c.now();
/// assert!(c.now() >= a);
/// ```
#[derive(Clone, Copy)]
pub struct QuantaClock(());

impl QuantaClock {
    /// A handle on the process-wide clock (calibrates the TSC on first use only).
    pub fn new() -> QuantaClock {
        // Under Miri the calibration waits for the first reading: it reads the TSC (inline
        // assembly, which Miri cannot run), and a builder's default clock that `.clock(…)`
        // replaces is never read.
        #[cfg(not(miri))]
        shared();
        QuantaClock(())
    }
}

impl Default for QuantaClock {
    fn default() -> QuantaClock {
        QuantaClock::new()
    }
}

impl fmt::Debug for QuantaClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("QuantaClock")
    }
}

impl Clock for QuantaClock {
    #[inline]
    fn now(&self) -> Nanos {
        let s = shared();
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if s.tsc_mul != 0 {
            // SAFETY: as in `raw_now`.
            #[allow(unused_unsafe)]
            let ticks = unsafe { core::arch::x86_64::_rdtsc() }.saturating_sub(s.origin_raw);
            return Nanos(((u128::from(ticks) * u128::from(s.tsc_mul)) >> 64) as u64);
        }
        Nanos(s.clock.delta_as_nanos(s.origin_raw, raw_now(s)))
    }
}

/// An opt-in coarse clock: reads quanta's "recent" time, which a background upkeep thread
/// refreshes every `interval`. A read costs about a nanosecond; the price is that time moves in
/// steps of `interval` (default 1 ms), so limiters see bursts at step edges. The upkeep thread
/// is started on first use and runs for the rest of the process.
///
/// ```
/// use turnstile::{Clock, CoarseClock};
///
/// let c = CoarseClock::new();
/// let a = c.now();
/// assert!(c.now() >= a);
/// ```
#[derive(Clone, Copy)]
pub struct CoarseClock(());

impl CoarseClock {
    /// The coarse clock with a 1 ms upkeep interval.
    pub fn new() -> CoarseClock {
        CoarseClock::with_interval(Duration::from_millis(1))
    }

    /// The coarse clock, starting the upkeep thread with `interval` if no coarse clock has
    /// started it yet (the first caller's interval wins: quanta allows one upkeep thread per
    /// process). If another library already runs quanta's upkeep thread, that one is used.
    pub fn with_interval(interval: Duration) -> CoarseClock {
        static UPKEEP: OnceLock<Option<quanta::Handle>> = OnceLock::new();
        let shared = shared();
        UPKEEP.get_or_init(|| {
            quanta::Upkeep::new_with_clock(interval, shared.clock.clone())
                .start()
                .ok()
        });
        CoarseClock(())
    }
}

impl Default for CoarseClock {
    fn default() -> CoarseClock {
        CoarseClock::new()
    }
}

impl fmt::Debug for CoarseClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CoarseClock")
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> Nanos {
        let s = shared();
        let d = s.clock.recent().saturating_duration_since(s.origin);
        Nanos::from_duration(d)
    }
}

/// A clock that moves only when told to. Clones share one time, so a test can keep a handle
/// while the limiter owns another.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Clock, ManualClock, Nanos};
///
/// let clock = ManualClock::default();
/// let handle = clock.clone();
/// handle.advance(Duration::from_millis(5));
/// assert_eq!(clock.now(), Nanos::new(5_000_000));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A manual clock reading `start`.
    pub fn new(start: Nanos) -> ManualClock {
        ManualClock {
            now: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Sets the time. Setting it backwards is allowed (to test how limiters cope).
    pub fn set(&self, t: Nanos) {
        self.now.store(t.0, Ordering::Release);
    }

    /// Moves the time forward by `d`, saturating.
    pub fn advance(&self, d: Duration) {
        let d = Nanos::from_duration(d).0;
        // A CAS loop of its own: `fetch_update` is deprecated on nightly for `try_update`,
        // which the MSRV does not have.
        let mut t = self.now.load(Ordering::Acquire);
        while let Err(current) = self.now.compare_exchange_weak(
            t,
            t.saturating_add(d),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            t = current;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        Nanos(self.now.load(Ordering::Acquire))
    }
}

/// How long before its deadline [`sleep_until`] stops sleeping and starts spinning.
///
/// A thread sleep on Linux wakes up late by the thread's timer slack (50 µs by default) plus
/// the scheduler's wake-up latency, typically 50–100 µs in all. Sleeping until this much
/// before the deadline and spinning the rest makes the wake-up precise to a few microseconds,
/// at the cost of up to this much busy CPU per wait (`examples/pacing.rs` measures both).
pub(crate) const SPIN_BEFORE_DEADLINE: Duration = Duration::from_micros(80);

/// The longest single `std::thread::sleep` in [`sleep_until`]: a long wait sleeps in slices
/// so that it looks at the clock at least this often (a [`ManualClock`] moved past the
/// deadline releases the sleeper within a slice). 100 wake-ups a second cost nothing
/// measurable.
pub(crate) const MAX_SLEEP_SLICE: Duration = Duration::from_millis(10);

/// Blocks the thread until `clock` reads `deadline` or later: `std::thread::sleep` (in slices
/// of at most 10 ms) until 80 µs before it, then a spin (`std::hint::spin_loop`, re-reading
/// the clock) for the rest. Returns at once if the deadline has passed.
///
/// A thread sleep wakes up late by the timer slack plus the scheduler's wake-up latency
/// (typically 50–100 µs on Linux); the spin makes the wake-up precise to a few microseconds,
/// at the cost of up to 80 µs of busy CPU per wait. The slices make a long wait look at the
/// clock at least every 10 ms, so a [`ManualClock`] moved past the deadline releases the
/// sleeper within one.
///
/// The wait is also bounded in real time by the wait the clock showed at the call, plus a
/// grace of 1 ms or 1/64 of the wait, whichever is longer: a [`ManualClock`] that nobody
/// advances releases the thread after that long (like a plain sleep for the delay), and one
/// that is advanced past the deadline releases it sooner. The grace is what keeps a running
/// clock whose rate differs a little from std's `Instant` (the TSC clock's calibration is good
/// to a small fraction of a percent) from being given up on just before it reaches the
/// deadline: such a clock always returns at or after its deadline.
///
/// ```
/// use std::time::{Duration, Instant};
/// use turnstile::clock::{sleep_until, QuantaClock};
/// use turnstile::Clock;
///
/// let clock = QuantaClock::new();
/// let deadline = clock.now() + Duration::from_millis(2);
/// let start = Instant::now();
/// sleep_until(&clock, deadline);
/// assert!(clock.now() >= deadline);
/// assert!(start.elapsed() >= Duration::from_micros(1_900));
/// ```
pub fn sleep_until<C: Clock + ?Sized>(clock: &C, deadline: Nanos) {
    let now = clock.now();
    if now >= deadline {
        return;
    }
    // The real-time bound; `None` (beyond what `Instant` can hold) means no bound.
    let wait = deadline - now;
    let grace = (wait / 64).max(Duration::from_millis(1));
    let end = std::time::Instant::now().checked_add(wait.saturating_add(grace));
    loop {
        let now = clock.now();
        if now >= deadline {
            return;
        }
        let mut left = deadline - now;
        if let Some(end) = end {
            let real_left = end.saturating_duration_since(std::time::Instant::now());
            if real_left.is_zero() {
                return;
            }
            left = left.min(real_left);
        }
        if left > SPIN_BEFORE_DEADLINE {
            std::thread::sleep((left - SPIN_BEFORE_DEADLINE).min(MAX_SLEEP_SLICE));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Test-only: a reproducible random walk of `steps` readings from 1 s, each under
/// `max_step` ns after the last, with the xorshift word that chose it (for the test's own
/// random choices): one schedule the limiters' unit tests share.
#[cfg(test)]
pub(crate) fn random_readings(steps: usize, max_step: u64) -> impl Iterator<Item = (Nanos, u64)> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut now = 1_000_000_000u64;
    (0..steps).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        now = now.saturating_add(x % max_step);
        (Nanos::new(now), x)
    })
}

/// Test-only: the words of [`random_readings`] as draws below a bound (a bound of 0 draws
/// 0), for the tests' random choices.
#[cfg(test)]
pub(crate) fn random_below() -> impl FnMut(u64) -> u64 {
    let mut words = random_readings(usize::MAX, u64::MAX).map(|(_, x)| x);
    move |n| words.next().unwrap_or(0) % n.max(1)
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    /// The fixed-point multiplier converts as quanta does, give or take a nanosecond, from a
    /// tick to `2^62` of them.
    #[test]
    fn the_multiplier_converts_as_quanta_does() {
        let s = shared();
        if s.tsc_mul == 0 {
            return; // quanta's conversion is used as it is
        }
        for log2 in 0..62 {
            for t in [1u64 << log2, (1 << log2) + (1 << log2) / 3] {
                let ours = ((u128::from(t) * u128::from(s.tsc_mul)) >> 64) as u64;
                let quanta = s.clock.delta_as_nanos(0, t);
                assert!(
                    ours <= quanta && quanta - ours <= 1,
                    "{t} ticks: {ours} vs {quanta}"
                );
            }
        }
    }

    /// The hot path's reading (inline `rdtsc` where quanta's source is the TSC, converted with
    /// one multiply) is quanta's: bracketed by two readings of quanta's own, in the same
    /// nanoseconds, give or take the one the fixed-point multiplier may round away.
    #[test]
    fn the_inline_reading_is_quantas() {
        let s = shared();
        let quanta_now = || s.clock.delta_as_nanos(s.origin_raw, s.clock.raw());
        for _ in 0..10_000 {
            let before = quanta_now();
            let ours = QuantaClock::new().now().as_u64();
            let after = quanta_now();
            assert!(
                before <= ours + 1 && ours <= after,
                "quanta {before}, ours {ours}, quanta {after} (tsc {})",
                s.tsc
            );
        }
    }
}
