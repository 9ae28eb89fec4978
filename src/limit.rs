//! [`Limit`]: a validated rate of events per second, shared by every limiter.

use std::fmt;
use std::time::Duration;

use crate::ConfigError;

/// A rate of events per second (x/time/rate's `Limit`), validated on construction.
///
/// A `Limit` is never NaN, never negative and never subnormal (deviation D3: upstream accepts
/// any float and then computes nonsense). [`Limit::ZERO`] allows no refill, and [`Limit::INF`]
/// allows everything, exactly as upstream's `0` and `Inf`.
///
/// ```
/// use std::time::Duration;
/// use turnstile::Limit;
///
/// let ten = Limit::per_second(10.0).unwrap();
/// assert_eq!(ten.as_f64(), 10.0);
/// assert_eq!(Limit::every(Duration::from_millis(250)).as_f64(), 4.0);
/// assert!(Limit::every(Duration::ZERO).is_inf());
/// assert!(Limit::per_second(f64::NAN).is_err());
/// ```
#[derive(Copy, Clone, PartialEq, PartialOrd)]
pub struct Limit(f64);

impl Limit {
    /// No limit: every request is allowed at once, whatever the burst (x/time/rate's `Inf`,
    /// which is `f64::MAX`, not IEEE infinity).
    pub const INF: Limit = Limit(f64::MAX);
    /// No refill: only the tokens already in the bucket can be spent.
    pub const ZERO: Limit = Limit(0.0);

    /// `events` per second. `+∞` and `f64::MAX` give [`Limit::INF`].
    ///
    /// # Errors
    /// [`ConfigError::LimitNotANumber`], [`ConfigError::NegativeLimit`] and
    /// [`ConfigError::SubnormalLimit`] (a positive limit so small that its interval between
    /// events is not a finite `f64`).
    pub fn per_second(events: f64) -> Result<Limit, ConfigError> {
        if events.is_nan() {
            Err(ConfigError::LimitNotANumber)
        } else if events < 0.0 {
            Err(ConfigError::NegativeLimit(events))
        } else if events >= f64::MAX {
            Ok(Limit::INF)
        } else if events == 0.0 {
            Ok(Limit::ZERO) // also folds -0.0
        } else if events != 0.0 && !events.is_normal() {
            Err(ConfigError::SubnormalLimit(events))
        } else {
            Ok(Limit(events))
        }
    }

    /// One event every `interval` (x/time/rate's `Every`): a zero interval is [`Limit::INF`].
    pub fn every(interval: Duration) -> Limit {
        if interval.is_zero() {
            Limit::INF
        } else {
            // Duration::MAX is ~1.8e19 s, so 1/secs stays a normal float.
            Limit(1.0 / interval.as_secs_f64())
        }
    }

    /// The rate in events per second (`f64::MAX` for [`Limit::INF`]).
    pub const fn as_f64(self) -> f64 {
        self.0
    }

    /// Whether this is [`Limit::INF`].
    pub fn is_inf(self) -> bool {
        self.0 == f64::MAX
    }

    /// Rebuilds a limit from a value that came out of [`Limit::as_f64`].
    pub(crate) const fn from_valid(v: f64) -> Limit {
        Limit(v)
    }
}

/// `inf`, or the rate per second in the shortest form that reads back to the same `f64`:
/// plain digits from `1e-4` up to `1e16` (`10/s`, `0.5/s`, `0/s`), scientific notation
/// outside that range (`1e300/s` rather than 301 digits, `2.5e-7/s`). Debug prints the same,
/// so a limiter's Debug reads `limit: 10/s`.
///
/// ```
/// use std::time::Duration;
/// use turnstile::Limit;
///
/// assert_eq!(Limit::per_second(10.0).unwrap().to_string(), "10/s");
/// assert_eq!(Limit::every(Duration::from_secs(2)).to_string(), "0.5/s");
/// assert_eq!(Limit::per_second(1e300).unwrap().to_string(), "1e300/s");
/// assert_eq!(Limit::ZERO.to_string(), "0/s");
/// assert_eq!(Limit::INF.to_string(), "inf");
/// assert_eq!(format!("{:?}", Limit::INF), "inf");
/// ```
impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_inf() {
            f.write_str("inf")
        } else {
            fmt::Display::fmt(&PerSec(self.0), f)
        }
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl TryFrom<f64> for Limit {
    type Error = ConfigError;
    fn try_from(events: f64) -> Result<Limit, ConfigError> {
        Limit::per_second(events)
    }
}

/// A rate in events per second, printed as [`Limit`] prints (`10/s`, `1e300/s`; `inf` for
/// `+∞`): for the Debug of limiters whose rate is a plain `f64` (the smooth limiters).
#[derive(Clone, Copy)]
pub(crate) struct PerSec(pub(crate) f64);

impl fmt::Display for PerSec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        if v == f64::INFINITY {
            f.write_str("inf")
        } else if v == 0.0 || (1e-4..1e16).contains(&v.abs()) {
            write!(f, "{v}/s")
        } else {
            write!(f, "{v:e}/s")
        }
    }
}

impl fmt::Debug for PerSec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
