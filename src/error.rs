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
    /// A leaky bucket's rate was zero (uber-go/ratelimit divides by it; deviation D6).
    #[error("rate is 0; a leaky bucket needs at least one permit per period")]
    ZeroRate,
    /// A leaky bucket's period (`per`) was zero (deviation D6).
    #[error("period (per) is 0; it must be positive")]
    ZeroPeriod,
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
}
