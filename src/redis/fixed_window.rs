//! A fixed-window counter on Redis, compatible with go-zero's `PeriodLimit`: `quota` requests
//! per `period` shared by every process that uses the same key.
//!
//! # Compatibility with go-zero (`core/limit/periodlimit.go`, `periodscript.lua`)
//! * **The key** is `prefix + key`, plain concatenation (no separator, no hash tag), holding
//!   one integer counter. A go-zero service configured with the same prefix, quota and period
//!   shares the limit with a turnstile one.
//! * **Every call counts**, over-quota ones included: the script `INCRBY`s the counter on
//!   every call, as go-zero's does, so Go and Rust services sharing a key count alike. The
//!   quota-th request is [`Outcome::HitQuota`] and **is still permitted**; the ones before
//!   it are [`Outcome::Allowed`], the ones after it [`Outcome::OverQuota`] (refused).
//!   quota 1 → the first request is `HitQuota` (go-zero#1581).
//! * **The window** is the key's TTL, set when the counter is created: by default `period`
//!   seconds from the first hit; with [`FixedWindowBuilder::align`], up to the next period boundary of
//!   UTC shifted by an explicit offset: `expire = period - ((now_unix + offset) % period)`,
//!   in `[1, period]` seconds (go-zero's `calcExpireSeconds`).
//! * **Periods are whole seconds**, go-zero's unit (its `EXPIRE`): a period with a fraction
//!   of a second, or longer than `EXPIRE` takes (2^63 ms), is refused with
//!   [`ConfigError::InvalidPeriod`] rather than silently rounded.
//! * **`take_n`** (an extension; go-zero only takes one at a time) is `INCRBY n`, counted
//!   like `n` go-zero calls *at once*: the outcome is the one of the last of them, and a
//!   refused `take_n` still counts all `n` (go-zero's every-call-counts rule, which the
//!   in-process [`crate::FixedWindow`] does not follow). With quota 5, `take_n(3)` is
//!   `Allowed` (count 3), `take_n(3)` is `OverQuota` (count 6), and then `take_n(2)` is
//!   `OverQuota` too (count 8), where the in-process limiter would answer `HitQuota`. A
//!   refused `take_n(2)` at count 4 also spends the window's last unit.
//!
//! * **Batches** ([`FixedWindow::take_batch`], and [`Coalesce`](super::Coalesce) through
//!   [`RedisBatch`]) are one `INCRBY` of the sum, by [`TAKE_SCRIPT`] unchanged: request `i`'s
//!   count is the count before the batch plus the sizes of requests `0..=i`, exactly the
//!   count its own `take_n` would have read, one after another at the batch's instant (every
//!   call counts, so each request adds its `n` whether granted or not). The outcomes, the
//!   counter, the TTL (set once, by the first increment of a window) and a denial's
//!   retry-after (the key's remaining TTL) are those of the same calls one by one.
//!
//! # Deviations (D14 and the script)
//! * A quota of 0 ([`ConfigError::ZeroQuota`]) and a period of 0
//!   ([`ConfigError::ZeroPeriod`]) are errors: go-zero refuses everything with quota 0, and
//!   with period 0 its `EXPIRE key 0` deletes the key (so nothing is ever limited) or, when
//!   aligned, divides by zero.
//! * Alignment takes an explicit UTC offset ([`FixedWindowBuilder::align`], in seconds east of UTC, less
//!   than a day either way, else [`ConfigError::InvalidUtcOffset`]), not the process's time
//!   zone: every process of a fleet aligns alike, whatever its `TZ`.
//! * The script ([`TAKE_SCRIPT`]) gives the key its TTL when it has none after the
//!   increment (`PTTL` is -1) rather than when the count is 1: the same thing on every key
//!   either script writes, and a counter left without a TTL by some other writer gets one
//!   instead of limiting forever. It returns the count and the key's remaining `PTTL`, and
//!   the outcome is decided here from the count, as go-zero's script does (`< quota`,
//!   `== quota`, `> quota`); the remaining TTL is the retry-after of a denial and the reset
//!   of [`FixedWindow::status`].
//!
//! # Time
//! Redis decides when a window ends (the key expires). The caller's clock matters only for
//! aligned windows, to compute how long the first hit's TTL is: each such method has an
//! `_at(.., now_unix_secs)` form; the plain form reads the system clock (`SystemTime`), as
//! go-zero's `time.Now()`.
//!
//! # Redis Cluster
//! Each call runs one script on one key, so the limiter works on a cluster unchanged, through
//! [`ClusterConnection`](::redis::cluster_async::ClusterConnection): keys spread over the
//! slots by their hash like any other key.
//!
//! # Example
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use turnstile::redis::FixedWindow;
//! use turnstile::Outcome;
//!
//! let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
//! // 1000 requests per calendar day in UTC+8, shared with go-zero's
//! // NewPeriodLimit(86400, 1000, store, "periodlimit:", Align()) running in UTC+8.
//! let limiter = FixedWindow::builder(1000, Duration::from_secs(86_400))
//!     .prefix("periodlimit:")
//!     .align(8 * 3600)
//!     .build(con)?;
//! match limiter.take("user-42").await? {
//!     Outcome::Allowed | Outcome::HitQuota => { /* serve */ }
//!     Outcome::OverQuota => { /* 429 */ }
//! }
//! let status = limiter.status("user-42").await?;
//! println!("RateLimit-Remaining: {}, RateLimit-Reset: {}", status.remaining, status.reset_secs());
//! # Ok(())
//! # }
//! ```

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::redis::aio::ConnectionLike;
use ::redis::Script;

use super::{Connection, RedisBatch, RedisLimitError, RedisLimiter};
use crate::{ConfigError, Outcome};

/// The script [`FixedWindow::take_n`] runs: go-zero's `periodscript.lua` for `n` requests at
/// once. `KEYS[1]` is `prefix + key`, `ARGV[1]` the `n` to add, `ARGV[2]` the TTL in seconds
/// a new window gets; it returns `{count, pttl}`: the counter after the increment and the
/// key's remaining time to live in milliseconds.
pub const TAKE_SCRIPT: &str = r#"-- turnstile::redis::FixedWindow: go-zero's PeriodLimit script for n requests at once.
-- KEYS[1] = prefix .. key; ARGV[1] = n; ARGV[2] = the TTL (s) of a new window.
-- Returns {count after the increment, remaining TTL in ms}.
-- KEYS[1] is not aliased to a local, as go-zero's script (for aliyun redis).
local current = redis.call("INCRBY", KEYS[1], ARGV[1])
local pttl = redis.call("PTTL", KEYS[1])
if pttl < 0 then
    redis.call("EXPIRE", KEYS[1], ARGV[2])
    pttl = tonumber(ARGV[2]) * 1000
end
return {current, pttl}
"#;

/// The script [`FixedWindow::status`] runs: the counter (`"0"` if there is none) and the
/// key's `PTTL` (-2 if there is no key, -1 if it has no TTL), read together.
pub const STATUS_SCRIPT: &str = r#"-- turnstile::redis::FixedWindow::status: {counter or "0", PTTL in ms}.
return {redis.call("GET", KEYS[1]) or "0", redis.call("PTTL", KEYS[1])}
"#;

static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(TAKE_SCRIPT));
static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(STATUS_SCRIPT));

/// A key's quota as a client should see it: what the `RateLimit-Limit`,
/// `RateLimit-Remaining` and `RateLimit-Reset` response headers carry. The Redis
/// counterpart of [`crate::WindowStatus`], with the reset as a duration (the key's remaining
/// TTL) rather than a reading of a process clock.
///
/// ```
/// use std::time::Duration;
/// use turnstile::redis::fixed_window::WindowStatus;
/// let s = WindowStatus { quota: 5, remaining: 0, resets_after: Duration::from_millis(1_001) };
/// assert_eq!(s.reset_secs(), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a status changes nothing: it is only worth its answer"]
pub struct WindowStatus {
    /// The quota per window.
    pub quota: u32,
    /// What is left of it now.
    pub remaining: u32,
    /// How long until the whole quota is available again if nothing more is taken: the
    /// key's remaining TTL, or, with no window open, the length of the window a request now
    /// would open.
    pub resets_after: Duration,
}

impl WindowStatus {
    /// [`WindowStatus::resets_after`] in whole seconds, rounded up (`RateLimit-Reset`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::fixed_window::WindowStatus;
    /// let s = WindowStatus { quota: 5, remaining: 5, resets_after: Duration::from_secs(60) };
    /// assert_eq!(s.reset_secs(), 60);
    /// ```
    pub fn reset_secs(&self) -> u64 {
        let d = self.resets_after;
        d.as_secs() + u64::from(d.subsec_nanos() > 0)
    }
}

/// go-zero's `PeriodLimit` on Redis: `quota` requests per `period` per key, shared by every
/// process using the same Redis (see the [module docs](self)).
///
/// `C` is the connection: a [`Connection`] (the default, from
/// [`connect`](super::connect)), redis-rs's [`ConnectionManager`](super::ConnectionManager) or a
/// [`ClusterConnection`](::redis::cluster_async::ClusterConnection); the limiter clones it
/// per call (both are handles to one multiplexed connection).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use turnstile::redis::FixedWindow;
/// use turnstile::Outcome;
///
/// let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
/// let w = FixedWindow::builder(5, Duration::from_secs(100)).prefix("pl:").build(con)?;
/// let outcomes = [
///     w.take("k").await?, w.take("k").await?, w.take("k").await?, w.take("k").await?,
///     w.take("k").await?, w.take("k").await?,
/// ];
/// assert_eq!(outcomes[4], Outcome::HitQuota); // the 5th of 5: still permitted
/// assert_eq!(outcomes[5], Outcome::OverQuota);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct FixedWindow<C = Connection> {
    con: C,
    quota: u32,
    /// Whole seconds, at least 1.
    period_secs: u64,
    /// Seconds east of UTC, less than a day either way; `None`: windows from the first hit.
    align: Option<i32>,
    prefix: String,
    max_key_len: usize,
}

/// The key prefix of a [`FixedWindow`] unless [`FixedWindowBuilder::prefix`] sets another.
pub(crate) const DEFAULT_PREFIX: &str = "turnstile:window:";

/// Builds a [`FixedWindow`] on Redis: [`FixedWindow::builder`], options
/// [`FixedWindowBuilder::prefix`], [`FixedWindowBuilder::max_key_len`] and
/// [`FixedWindowBuilder::align`], then [`FixedWindowBuilder::build`] on a connection. The
/// builder holds no connection, so one configuration builds a limiter per connection.
///
/// ```
/// use std::time::Duration;
/// use turnstile::redis::FixedWindow;
/// // Any value stands in for the connection where only the configuration matters.
/// let options = FixedWindow::builder(5, Duration::from_secs(60)).prefix("pl:");
/// let a = options.clone().build(()).unwrap();
/// let b = options.build(()).unwrap();
/// assert_eq!(a.redis_key("u1"), b.redis_key("u1"));
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct FixedWindowBuilder {
    quota: u32,
    period: Duration,
    prefix: String,
    align: Option<i64>,
    max_key_len: usize,
}

impl FixedWindowBuilder {
    /// Prepends `prefix` to every key (go-zero's `keyPrefix`, plain concatenation; default
    /// `"turnstile:window:"`, so that a key taken from a request cannot name another program's
    /// key in a shared database). To share a limit with go-zero services, set go-zero's own
    /// prefix here explicitly (go-zero has no default: its services pass one to
    /// `NewPeriodLimit`), `""` included.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    /// // Any value stands in for the connection where only the configuration matters.
    /// let w = FixedWindow::builder(5, Duration::from_secs(1)).prefix("pl:").build(()).unwrap();
    /// assert_eq!(w.redis_key("u1"), "pl:u1");
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest key a check accepts, in bytes, not counting the prefix (default 512): a
    /// longer one is [`RedisLimitError::KeyTooLong`], before any round trip.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use turnstile::redis::{FixedWindow, RedisLimitError, RedisLimiter};
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
    /// let w = FixedWindow::builder(5, Duration::from_secs(60)).max_key_len(64).build(con)?;
    /// assert_eq!(w.max_key_len(), 64);
    /// assert!(matches!(
    ///     w.take(&"k".repeat(65)).await,
    ///     Err(RedisLimitError::KeyTooLong { len: 65, max: 64 })
    /// ));
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// Ends windows on period boundaries of UTC shifted by `utc_offset_secs` (seconds east of
    /// UTC; go-zero's `Align()` with the offset explicit instead of the process's time zone,
    /// deviation D14). The offset must be less than a day either way.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    /// let w = FixedWindow::builder(5, Duration::from_secs(86_400))
    ///     .align(8 * 3600)
    ///     .build(())
    ///     .unwrap();
    /// // 2024-01-01 23:59:59 in UTC+8: one second to local midnight.
    /// assert_eq!(w.expire_secs_at(1_704_124_799), 1);
    /// assert_eq!(w.expire_secs_at(1_704_124_800), 86_400);
    /// ```
    pub fn align(mut self, utc_offset_secs: i64) -> Self {
        self.align = Some(utc_offset_secs);
        self
    }

    /// Aligned windows in UTC: `align(0)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    /// let w = FixedWindow::builder(1, Duration::from_secs(60)).align_utc().build(()).unwrap();
    /// assert_eq!(w.utc_offset_secs(), Some(0));
    /// ```
    pub fn align_utc(self) -> Self {
        self.align(0)
    }

    /// The limiter on `con`, or the first setting that cannot be used (deviation D14):
    /// [`ConfigError::ZeroQuota`], [`ConfigError::ZeroPeriod`] or
    /// [`ConfigError::InvalidUtcOffset`], or [`ConfigError::InvalidPeriod`] for a period that is
    /// not a whole number of seconds (or is longer than Redis's `EXPIRE` takes).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    /// use turnstile::ConfigError;
    /// let b = FixedWindow::builder;
    /// assert_eq!(b(0, Duration::from_secs(1)).build(()).unwrap_err(), ConfigError::ZeroQuota);
    /// assert_eq!(b(1, Duration::ZERO).build(()).unwrap_err(), ConfigError::ZeroPeriod);
    /// assert_eq!(
    ///     b(1, Duration::from_secs(1)).align(-86_400).build(()).unwrap_err(),
    ///     ConfigError::InvalidUtcOffset(-86_400)
    /// );
    /// assert_eq!(
    ///     b(1, Duration::from_millis(1_500)).build(()).unwrap_err(),
    ///     ConfigError::InvalidPeriod(Duration::from_millis(1_500))
    /// );
    /// ```
    pub fn build<C>(self, con: C) -> Result<FixedWindow<C>, ConfigError> {
        if self.quota == 0 {
            return Err(ConfigError::ZeroQuota);
        }
        if self.period.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        let align = match self.align {
            None => None,
            Some(offset) if offset.unsigned_abs() >= 86_400 => {
                return Err(ConfigError::InvalidUtcOffset(offset))
            }
            // |offset| < 86 400 fits an i32.
            Some(offset) => Some(offset as i32),
        };
        // EXPIRE takes seconds whose milliseconds fit an i64.
        if self.period.subsec_nanos() != 0 || self.period.as_secs() > i64::MAX as u64 / 1000 {
            return Err(ConfigError::InvalidPeriod(self.period));
        }
        let period_secs = self.period.as_secs();
        Ok(FixedWindow {
            con,
            quota: self.quota,
            period_secs,
            align,
            prefix: self.prefix,
            max_key_len: self.max_key_len,
        })
    }
}

impl FixedWindow<Connection> {
    /// A builder for `quota` requests per `period` per key, with options
    /// [`FixedWindowBuilder::prefix`], [`FixedWindowBuilder::max_key_len`],
    /// [`FixedWindowBuilder::align`] and [`FixedWindowBuilder::align_utc`]; `.build(con)` makes
    /// the limiter.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    /// let w = FixedWindow::builder(10, Duration::from_secs(60)).prefix("api:").build(()).unwrap();
    /// assert_eq!(w.prefix(), "api:");
    /// ```
    pub fn builder(quota: u32, period: Duration) -> FixedWindowBuilder {
        FixedWindowBuilder {
            quota,
            period,
            prefix: DEFAULT_PREFIX.to_string(),
            align: None,
            max_key_len: super::DEFAULT_MAX_KEY_LEN,
        }
    }
}

impl<C> FixedWindow<C> {
    /// `quota` requests per `period` per key on `con`, windows from the first hit, the
    /// default prefix (`"turnstile:window:"`): `builder(quota, period).build(con)`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    /// let w = FixedWindow::new((), 100, Duration::from_secs(60)).unwrap();
    /// assert_eq!((w.quota(), w.period()), (100, Duration::from_secs(60)));
    /// assert_eq!(w.prefix(), "turnstile:window:");
    /// ```
    pub fn new(con: C, quota: u32, period: Duration) -> Result<FixedWindow<C>, ConfigError> {
        FixedWindow::builder(quota, period).build(con)
    }

    /// Requests permitted per window.
    pub fn quota(&self) -> u32 {
        self.quota
    }

    /// The window length (whole seconds).
    pub fn period(&self) -> Duration {
        Duration::from_secs(self.period_secs)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The UTC offset windows are aligned to, or `None` if windows start at the first hit.
    pub fn utc_offset_secs(&self) -> Option<i64> {
        self.align.map(i64::from)
    }

    /// The connection.
    pub fn connection(&self) -> &C {
        &self.con
    }

    /// The Redis key of `key`: `prefix + key`.
    pub fn redis_key(&self, key: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + key.len());
        k.push_str(&self.prefix);
        k.push_str(key);
        k
    }

    /// The TTL in seconds a window opened at `now_unix_secs` gets: the period, or aligned
    /// `period - ((now_unix_secs + offset) % period)`, in `[1, period]` (go-zero's
    /// `calcExpireSeconds`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    /// let day = FixedWindow::builder(1, Duration::from_secs(86_400)).align(8 * 3600).build(()).unwrap();
    /// assert_eq!(day.expire_secs_at(1_704_110_400), 14_400); // 20:00 in UTC+8
    /// let minute = FixedWindow::builder(1, Duration::from_secs(60)).align(8 * 3600).build(()).unwrap();
    /// assert_eq!(minute.expire_secs_at(1_704_110_400), 60);
    /// ```
    pub fn expire_secs_at(&self, now_unix_secs: u64) -> u64 {
        match self.align {
            None => self.period_secs,
            Some(offset) => {
                let period = i128::from(self.period_secs);
                let into = (i128::from(now_unix_secs) + i128::from(offset)).rem_euclid(period);
                // period - into is in [1, period].
                (period - into) as u64
            }
        }
    }

    /// Bad input, refused before any round trip: the one check of single takes, batches
    /// ([`RedisBatch::validate`]) and status reads.
    fn check_input(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        super::check_key(key, self.max_key_len)?;
        if n > self.quota {
            return Err(RedisLimitError::ExceedsBurst {
                n,
                burst: self.quota,
            });
        }
        Ok(())
    }
}

/// The system clock in whole Unix seconds (go-zero's `time.Now().Unix()`).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// go-zero's reply mapping, on the count after the increment.
fn outcome(count: i64, quota: u32) -> Outcome {
    match count.cmp(&i64::from(quota)) {
        std::cmp::Ordering::Less => Outcome::Allowed,
        std::cmp::Ordering::Equal => Outcome::HitQuota,
        std::cmp::Ordering::Greater => Outcome::OverQuota,
    }
}

/// The crate-wide verdict of an outcome: `OverQuota` is a denial that says to retry when the
/// key expires (`ttl`, its remaining time to live); `Allowed` and `HitQuota` pass.
fn verdict(o: Outcome, ttl: Duration) -> Result<(), crate::Denied> {
    match o {
        Outcome::OverQuota => Err(super::denied_after(Some(ttl))),
        _ => Ok(()),
    }
}

impl<C> FixedWindow<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One request for `key` (go-zero's `Take`).
    pub async fn take(&self, key: &str) -> Result<Outcome, RedisLimitError> {
        self.take_n_at(key, 1, unix_now()).await
    }

    /// One request for `key` at `now_unix_secs` (which only aligned windows read).
    pub async fn take_at(&self, key: &str, now_unix_secs: u64) -> Result<Outcome, RedisLimitError> {
        self.take_n_at(key, 1, now_unix_secs).await
    }

    /// `n` requests for `key`, counted as `n` go-zero calls at once (see the
    /// [module docs](self): a refused `take_n` still counts all `n`).
    pub async fn take_n(&self, key: &str, n: u32) -> Result<Outcome, RedisLimitError> {
        self.take_n_at(key, n, unix_now()).await
    }

    /// `n` requests for `key` at `now_unix_secs`: `INCRBY n`, and a TTL of
    /// [`FixedWindow::expire_secs_at`]`(now_unix_secs)` if the key had none. The outcome is
    /// go-zero's for the last of them. An empty key ([`RedisLimitError::EmptyKey`]) and
    /// `n > quota` ([`RedisLimitError::ExceedsBurst`], never grantable) are refused before
    /// any round trip; `n = 0` is `Allowed` with no round trip, as in process.
    pub async fn take_n_at(
        &self,
        key: &str,
        n: u32,
        now_unix_secs: u64,
    ) -> Result<Outcome, RedisLimitError> {
        self.check_input(key, n)?;
        if n == 0 {
            return Ok(Outcome::Allowed);
        }
        let (count, _) = self.incr(key, u64::from(n), now_unix_secs).await?;
        Ok(outcome(count, self.quota))
    }

    /// `ns[0]`, then `ns[1]`, … requests for `key` in **one** round trip: one `INCRBY` of their
    /// sum, each request's outcome the one its own [`FixedWindow::take_n`] would get, the
    /// takes one after another at the same instant (see the [module docs](self)): request
    /// `i` is classified on the count before the batch plus `ns[0] + … + ns[i]`. One outcome
    /// per request, in order; an `n = 0` request is `Allowed`, as `take_n(0)` is.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    /// use turnstile::Outcome::{Allowed, HitQuota, OverQuota};
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
    /// let w = FixedWindow::new(con, 5, Duration::from_secs(60))?;
    /// // Counts 2, 5 and 6 after one INCRBY 6 on a fresh key.
    /// assert_eq!(w.take_batch("k", &[2, 3, 1]).await?, [Allowed, HitQuota, OverQuota]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`FixedWindow::take_n`], for any request of the batch (then none is sent). A batch
    /// with nothing to count (empty, or all zeros) makes no round trip.
    pub async fn take_batch(&self, key: &str, ns: &[u32]) -> Result<Vec<Outcome>, RedisLimitError> {
        self.take_batch_at(key, ns, unix_now()).await
    }

    /// [`FixedWindow::take_batch`] at `now_unix_secs` (which only aligned windows read, for
    /// the TTL of a window the batch opens), as [`FixedWindow::take_n_at`].
    pub async fn take_batch_at(
        &self,
        key: &str,
        ns: &[u32],
        now_unix_secs: u64,
    ) -> Result<Vec<Outcome>, RedisLimitError> {
        Ok(self.incr_batch(key, ns, now_unix_secs).await?.0)
    }

    /// The outcomes of a batch and the key's remaining TTL after it (zero if nothing was
    /// sent).
    async fn incr_batch(
        &self,
        key: &str,
        ns: &[u32],
        now_unix_secs: u64,
    ) -> Result<(Vec<Outcome>, Duration), RedisLimitError> {
        for &n in ns {
            self.check_input(key, n)?;
        }
        // Redis refuses an INCRBY beyond i64::MAX, so a sum that answered fits an i64.
        let sum: u64 = ns.iter().map(|&n| u64::from(n)).sum();
        if sum == 0 {
            return Ok((vec![Outcome::Allowed; ns.len()], Duration::ZERO));
        }
        let (count, ttl) = self.incr(key, sum, now_unix_secs).await?;
        // The count before the batch, then after each request in turn: what its own take_n
        // would have read.
        let mut running = count.saturating_sub(sum as i64);
        let outcomes = ns
            .iter()
            .map(|&n| {
                if n == 0 {
                    // take_n(0): no round trip, always Allowed.
                    return Outcome::Allowed;
                }
                running = running.saturating_add(i64::from(n));
                outcome(running, self.quota)
            })
            .collect();
        Ok((outcomes, ttl))
    }

    /// One run of [`TAKE_SCRIPT`]: the count after the increment and the remaining TTL.
    async fn incr(
        &self,
        key: &str,
        n: u64,
        now_unix_secs: u64,
    ) -> Result<(i64, Duration), RedisLimitError> {
        let mut con = self.con.clone();
        let (count, pttl): (i64, i64) = TAKE
            .key(self.redis_key(key))
            .arg(n)
            .arg(self.expire_secs_at(now_unix_secs))
            .invoke_async(&mut con)
            .await?;
        let pttl = u64::try_from(pttl)
            .map_err(|_| RedisLimitError::UnexpectedReply(format!("PTTL {pttl} after the take")))?;
        Ok((count, Duration::from_millis(pttl)))
    }

    /// `key`'s quota, what remains of it and when it resets, now.
    pub async fn status(&self, key: &str) -> Result<WindowStatus, RedisLimitError> {
        self.status_at(key, unix_now()).await
    }

    /// `key`'s quota, what remains of it and when it resets, at `now_unix_secs` (which only
    /// aligned windows read, for a key with no window open): `remaining` is the quota less
    /// the count (at least 0), `resets_after` the key's `PTTL`. With no key, the whole quota
    /// remains and `resets_after` is the window a request would open,
    /// [`FixedWindow::expire_secs_at`]; so it is for a counter without a TTL (written by
    /// something else), which the next take gives one. Reads only; an empty key is
    /// [`RedisLimitError::EmptyKey`].
    pub async fn status_at(
        &self,
        key: &str,
        now_unix_secs: u64,
    ) -> Result<WindowStatus, RedisLimitError> {
        self.check_input(key, 0)?;
        let mut con = self.con.clone();
        let (count, pttl): (String, i64) = STATUS
            .key(self.redis_key(key))
            .invoke_async(&mut con)
            .await?;
        let count: i64 = count
            .parse()
            .map_err(|_| RedisLimitError::UnexpectedReply(format!("counter {count:?}")))?;
        let spent = count.clamp(0, i64::from(self.quota)) as u32;
        let resets_after = match u64::try_from(pttl) {
            Ok(ms) => Duration::from_millis(ms),
            Err(_) => Duration::from_secs(self.expire_secs_at(now_unix_secs)),
        };
        Ok(WindowStatus {
            quota: self.quota,
            remaining: self.quota - spent,
            resets_after,
        })
    }
}

impl<C> RedisLimiter for FixedWindow<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Local = crate::FixedWindow;

    /// An in-process [`crate::FixedWindow`] with quota `max(1, ceil(quota × share))` (at
    /// most the quota; a `share` that is not a positive number counts as the smallest), the
    /// same whole-second period and the same alignment.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{FixedWindow, RedisLimiter, ConnectionManager};
    /// fn local_quota(w: &FixedWindow<ConnectionManager>) -> u32 {
    ///     w.local(0.25).quota()
    /// }
    /// ```
    fn local(&self, share: f64) -> crate::FixedWindow {
        let scaled = (f64::from(self.quota) * share).ceil();
        let quota = if scaled >= 1.0 {
            // `as` saturates; the min keeps it within the quota.
            (scaled as u32).min(self.quota)
        } else {
            1
        };
        let mut b = crate::FixedWindow::builder(quota, self.period());
        if let Some(offset) = self.align {
            b = b.align(i64::from(offset));
        }
        b.build()
            .expect("validated: quota >= 1, period >= 1 s, |offset| < a day")
    }

    fn ping(&self) -> impl std::future::Future<Output = Result<(), RedisLimitError>> + Send {
        super::ping(&self.con)
    }

    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    /// Takes `n` permits for `key` (`Allowed` or `HitQuota`); a denial (`OverQuota`) says to
    /// retry when the key expires (its remaining TTL). As [`FixedWindow::take_n`], a denied
    /// call still counts its `n` (go-zero's rule).
    async fn try_check_n(
        &self,
        key: &str,
        n: u32,
    ) -> Result<Result<(), crate::Denied>, RedisLimitError> {
        self.check_input(key, n)?;
        if n == 0 {
            return Ok(Ok(()));
        }
        let (count, ttl) = self.incr(key, u64::from(n), unix_now()).await?;
        Ok(verdict(outcome(count, self.quota), ttl))
    }

    /// The check of [`RedisLimiter::try_check_n`] with the window's status after it, from
    /// [`TAKE_SCRIPT`]'s own reply (the count after the increment and the key's remaining
    /// TTL; no other command): `q` = the quota, `w` = the period, `r` = what the count leaves
    /// of the quota (`quota - count`, at least 0: a refused call still counts, go-zero's
    /// rule), `t` = the key's remaining TTL, when the window ends. `None` for `n = 0`, which
    /// makes no round trip. The `_at` form is [`FixedWindow::try_check_n_status_at`].
    async fn try_check_n_status(
        &self,
        key: &str,
        n: u32,
    ) -> Result<super::StatusVerdict, RedisLimitError> {
        self.try_check_n_status_at(key, unix_now(), n).await
    }
}

impl<C> FixedWindow<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// [`RedisLimiter::try_check_n_status`] at `now_unix_secs` (which only an aligned window
    /// opened by this call reads, for its TTL, as [`FixedWindow::take_n_at`]): the verdict
    /// of [`RedisLimiter::try_check_n`] and the window's status after the check.
    ///
    /// # Errors
    /// As [`FixedWindow::take_n_at`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use turnstile::redis::FixedWindow;
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
    /// let limiter = FixedWindow::builder(5, Duration::from_secs(60)).build(con)?;
    /// let answer = limiter.try_check_n_status_at("dave", 1_700_000_000, 2).await?;
    /// assert!(answer.result.is_ok());
    /// let s = answer.status.unwrap();
    /// assert_eq!((s.quota, s.window, s.remaining), (5, Duration::from_secs(60), 3));
    /// assert!(s.reset <= Duration::from_secs(60)); // the key's TTL
    /// # Ok(()) }
    /// ```
    pub async fn try_check_n_status_at(
        &self,
        key: &str,
        now_unix_secs: u64,
        n: u32,
    ) -> Result<super::StatusVerdict, RedisLimitError> {
        self.check_input(key, n)?;
        if n == 0 {
            return Ok(super::StatusVerdict {
                result: Ok(()),
                status: None,
            });
        }
        let (count, ttl) = self.incr(key, u64::from(n), now_unix_secs).await?;
        let status = crate::QuotaStatus {
            quota: u64::from(self.quota),
            window: self.period(),
            remaining: i64::from(self.quota).saturating_sub(count).max(0) as u64,
            reset: ttl,
        };
        Ok(super::StatusVerdict {
            result: verdict(outcome(count, self.quota), ttl),
            status: Some(status),
        })
    }
}

/// Batches for [`Coalesce`](super::Coalesce): one `INCRBY` of the sum
/// ([`FixedWindow::take_batch`]), each request answered as [`RedisLimiter::try_check_n`]
/// answers it alone.
impl<C> RedisBatch for FixedWindow<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn validate(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        self.check_input(key, n)
    }

    /// [`FixedWindow::take_batch`], each `OverQuota` a denial that says to retry when the key
    /// expires, as [`RedisLimiter::try_check_n`]'s.
    async fn try_check_batch(
        &self,
        key: &str,
        ns: &[u32],
    ) -> Result<Vec<Result<(), crate::Denied>>, RedisLimitError> {
        let (outcomes, ttl) = self.incr_batch(key, ns, unix_now()).await?;
        Ok(outcomes.into_iter().map(|o| verdict(o, ttl)).collect())
    }
}

impl<C> std::fmt::Debug for FixedWindow<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedWindow")
            .field("quota", &self.quota)
            .field("period", &self.period())
            .field("utc_offset_secs", &self.utc_offset_secs())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
