//! The crate's two error types: [`ConfigError`] for construction and reconfiguration,
//! [`WaitError`] for waiting.

/// A rate, burst, period or other setting that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The limit was NaN.
    #[error("limit is NaN; a limit must be a number of events per second")]
    LimitNotANumber,
    /// The limit was negative.
    #[error("limit {0} is negative; use Limit::ZERO to allow no refill")]
    NegativeLimit(f64),
    /// The limit was positive but subnormal: its interval between events overflows.
    #[error("limit {0} is subnormal; its interval between events is not a finite number")]
    SubnormalLimit(f64),
    /// A rate of permits was zero: a leaky bucket's (uber-go/ratelimit divides by it;
    /// deviation D6) or a Redis token bucket's (go-zero divides by it).
    #[error("rate is 0; the limiter needs at least one permit per period")]
    ZeroRate,
    /// A period was zero: a leaky bucket's `per` (deviation D6) or a window's length
    /// (deviation D14).
    #[error("period is 0; it must be positive")]
    ZeroPeriod,
    /// A smooth limiter's rate was zero, negative or NaN (Guava's "rate must be positive";
    /// deviation D11). `+inf` is a valid rate: no waits.
    #[error("rate {0} is not positive; a smooth limiter needs a rate > 0 (+inf for no limit)")]
    RateNotPositive(f64),
    /// A `SmoothWarmingUp`'s warm-up period was zero (deviation D9: Guava stops limiting).
    #[error("warm-up period {0:?} is zero; it must be positive (use SmoothBursty for no warm-up)")]
    ZeroWarmup(std::time::Duration),
    /// A `SmoothWarmingUp`'s cold factor was below 1, infinite or NaN.
    #[error("cold factor {0} is invalid; it must be a finite number >= 1")]
    InvalidColdFactor(f64),
    /// A `SmoothBursty`'s `max_burst_seconds` was negative, infinite or NaN.
    #[error("max burst seconds {0} is invalid; it must be a finite number >= 0")]
    InvalidBurstSeconds(f64),
    /// A `SmoothBursty`'s `initial_stored_permits` was negative or NaN.
    #[error("initial stored permits {0} is invalid; it must be a number >= 0")]
    InvalidStoredPermits(f64),
    /// A window limiter's quota was zero (go-zero accepts it and refuses everything;
    /// deviation D14).
    #[error("quota is 0; a window limiter needs a quota of at least 1")]
    ZeroQuota,
    /// A window's alignment offset from UTC was a day or more either way (deviation D14).
    #[error("UTC offset {0} s is out of range; it must be less than a day (86400 s) either way")]
    InvalidUtcOffset(i64),
    /// A capacity was zero: a leaky meter's (it could never hold a unit of water) or a Redis
    /// token bucket's burst (it could never grant a permit).
    #[error("capacity is 0; the limiter needs a capacity of at least 1")]
    ZeroCapacity,
    /// A keyed limiter's `max_keys` was zero: no key could ever be admitted.
    #[error("max_keys is 0; a keyed limiter needs room for at least one key")]
    ZeroMaxKeys,
    /// A Redis window's period was not a whole number of seconds (go-zero's unit, Redis's
    /// `EXPIRE`), or longer than `EXPIRE` takes.
    #[error("period {0:?} is not a whole number of seconds up to 9.2e15 s; a Redis window's period is whole seconds")]
    InvalidPeriod(std::time::Duration),
    /// A Redis fallback's timeout or health-check interval was zero.
    #[error("a timeout or interval of 0; it must be positive")]
    ZeroTimeout,
    /// A Redis fallback's share of the limit was outside `(0, 1]` (a fleet size of 0 is an
    /// infinite share).
    #[error("share {0} is out of range; it must be in (0, 1], e.g. 1 / fleet size")]
    InvalidShare(f64),
    /// A `KeyedTokenBucket` was given more quotas than its state word can name (at most
    /// `keyed_bucket::MAX_QUOTAS`, 15).
    #[error("{0} quotas; a keyed token bucket holds at most 15")]
    TooManyQuotas(usize),
    /// A `KeyedLeakyBucket` quota whose `slack + 1` paces (`(slack + 1) * per / rate`) are
    /// too long for its state word to keep 8.5 years of range (at most about 9.76 years).
    #[error(
        "slack + 1 paces last {0:?}; a keyed leaky bucket's word holds at most ~9.76 years of them"
    )]
    PacesTooLong(std::time::Duration),
    /// A `KeyedSmoothBursty` quota its state word cannot hold: more than `2^32 - 1` max
    /// permits (`rate * max_burst_seconds`), or `max(1, max permits)` stable intervals
    /// (`1 / rate` each) longer than 2^62 ns (146 years).
    #[error("rate {rate} with max burst seconds {max_burst_seconds} does not fit a keyed smooth limiter's word: at most 2^32 - 1 max permits, and max(1, max permits) intervals of 1 / rate within 146 years")]
    SmoothOutOfRange {
        /// The quota's rate, permits per second.
        rate: f64,
        /// The quota's `max_burst_seconds`.
        max_burst_seconds: f64,
    },
    /// A `KeyedWindow` quota too large for its period: the state word counts the quota in
    /// as many bits as it needs and keeps the window's end in the rest, in ticks that must
    /// be at most 1/256 of the period (a window then lasts at most 0.4 % longer). The
    /// period must be at least `min` for this quota (about 256 ns per unit of quota).
    #[error("period {period:?} is too short for the quota: a keyed window with this quota needs a period of at least {min:?}")]
    WindowTooShort {
        /// The quota's period.
        period: std::time::Duration,
        /// The shortest period the quota can have.
        min: std::time::Duration,
    },
    /// A `KeyedSlidingWindow` quota too large for its period: the state word holds the
    /// window index and two counts of the quota's bits in 59 bits, and the index must count
    /// 8.5 years of windows. `max` is the largest quota this period holds (0: none, a period
    /// of a nanosecond); longer periods hold larger quotas (about 2^15 per second, 2^18 per
    /// minute).
    #[error("quota {quota} is too large for a keyed sliding window of period {period:?}: at most {max} with this period")]
    SlidingQuotaTooLarge {
        /// The quota asked for.
        quota: u32,
        /// Its period.
        period: std::time::Duration,
        /// The largest quota this period holds.
        max: u32,
    },
    /// A `redis::Blocking` limiter was given a current-thread tokio runtime: it runs spawned
    /// tasks (the connection's driver, the fallback's health check) only while a call is
    /// blocked on it, so a fallback would never learn that Redis is back.
    #[error("a current-thread runtime runs no task between calls; a blocking Redis limiter needs a multi-thread runtime")]
    CurrentThreadRuntime,
    /// A sketch's cells per key were not 1 to 3.
    #[error("{0} cells per key; a sketch token bucket takes 1 to 3")]
    SketchCells(usize),
    /// A sketch's burst was above 2^15, what its cells hold.
    #[error("burst {0}; a sketch token bucket holds at most 32768 tokens a client")]
    SketchBurst(u32),
    /// A sketch's penalty was longer than its cells hold beside the burst: `burst + penalty *
    /// limit` above 2^15 tokens.
    #[error("penalty {penalty:?} with burst {burst}; a sketch token bucket's cells hold at most 32768 tokens of burst and penalty together")]
    SketchPenalty {
        /// The penalty asked for.
        penalty: std::time::Duration,
        /// The burst beside it.
        burst: u32,
    },
    /// A sketch's memory was below one 64-byte line or above 2^38 bytes.
    #[error(
        "memory of {0} bytes; a sketch token bucket takes 64 bytes (one line) to 2^38 (256 GiB)"
    )]
    SketchMemory(usize),
    /// A sketch sized for a false-refusal rate: the rate was not in (0, 1), or even 256 GiB
    /// do not reach it.
    #[error("no sketch of at most 256 GiB keeps the false-refusal rate with {abusers} abusers at {rate}; the rate must be in (0, 1)")]
    SketchSize {
        /// The clients at their limit it was sized for.
        abusers: u64,
        /// The false-refusal rate asked for.
        rate: f64,
    },
    /// A tower policy's near-limit fraction was NaN or outside `(0, 1]`.
    #[error("near-limit fraction {0} is not in (0, 1]; it is the share of the quota used at which a grant counts as near the limit")]
    NearLimitFraction(f64),
    /// A tower policy's enforced fraction of clients was NaN or outside `[0, 1]`.
    #[error("enforced fraction {0} is not in [0, 1]; it is the share of clients whose refusals are enforced")]
    EnforcedFraction(f64),
    /// A multi-limit bucket got no limits, or more than its word holds (4).
    #[error("{0} limits; a multi-limit token bucket takes 1 to 4")]
    LimitCount(usize),
    /// Limit `index` of a multi-limit bucket cannot be held: `why` says which bound it broke.
    #[error("limit {index} ({limit}/s, burst {burst}) cannot be held: {why}")]
    LimitOutOfRange {
        /// The limit's position in the list, from 0.
        index: usize,
        /// Its rate, in events per second.
        limit: f64,
        /// Its burst.
        burst: u32,
        /// The bound it broke.
        why: &'static str,
    },
    /// A lease larger than the bucket it is taken from (`redis::LeasedBuilder::max_lease`).
    #[error("a lease of {lease} permits, more than the burst of {burst}")]
    LeaseExceedsBurst {
        /// The lease size asked for.
        lease: u32,
        /// The bucket's burst.
        burst: u32,
    },
}

/// Why a wait did not (or will not) end with the requested tokens.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// More tokens were asked for than the bucket can ever hold (checked first, as upstream).
    #[error("wait(n={n}) exceeds the limiter's burst {burst}")]
    ExceedsBurst {
        /// Tokens asked for.
        n: u32,
        /// The limiter's burst.
        burst: u32,
    },
    /// The deadline had already passed when the wait began.
    #[error("wait(n={n}): the deadline has already passed")]
    DeadlinePassed {
        /// Tokens asked for.
        n: u32,
    },
    /// The tokens would arrive only after the deadline; nothing was reserved.
    #[error("wait(n={n}) would exceed the deadline")]
    WouldExceedDeadline {
        /// Tokens asked for.
        n: u32,
    },
    /// The tokens will never arrive: the limit is zero and the bucket holds too few
    /// (deviation D4), or the wait would be longer than any representable time.
    #[error("wait(n={n}): the tokens will never be available (limit {limit})")]
    Never {
        /// Tokens asked for.
        n: u32,
        /// The limit at the time of the wait, in events per second.
        limit: f64,
    },
    /// Zero permits were requested from a smooth limiter (Guava's "Requested permits (0) must
    /// be positive"; deviation D11). Nothing was reserved.
    #[error("requested permits (0) must be positive")]
    ZeroPermits,
}
