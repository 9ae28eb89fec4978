//! [`MultiGcra`]: one to four GCRA limits ("20 per second with bursts of 40, and 10 000 per
//! day") in **one** Redis key per client, checked all-or-nothing in one script call on the
//! Redis server's clock: the fleet's [`MultiTokenBucket`].
//!
//! # The algorithm
//! Each limit `i` is [`Gcra`](super::Gcra)'s: a theoretical arrival time `tat_i`, the
//! emission interval `T_i = 1 / limit_i` and `tau_i = burst_i × T_i`. A check of `n` at `now`
//! is
//!
//! ```text
//! d_i     = max(tat_i, now) - now        (how far limit i is below full, as time)
//! after_i = d_i + n × T_i
//! allowed  iff  after_i <= tau_i for EVERY i     then  tat_i' = now + after_i for every i
//! ```
//!
//! **All or nothing**: a refusal writes nothing, so a check refused by the daily limit takes
//! nothing from the per-second one (checking two [`Gcra`](super::Gcra)s in turn would spend
//! the first's permit on a request the second refused). A peek (`n = 0`) writes nothing and
//! is always allowed. All of it runs in one Lua script ([`SCRIPT`]): a check is one round
//! trip, atomic on the server.
//!
//! A refusal names the limit that **admits last** ([`MultiThrottle::refused_by`]: the one
//! whose `after_i - tau_i` is largest; among equals the last given, as
//! [`MultiDenied::limit`](crate::multi_token_bucket::MultiDenied::limit)), and the earliest
//! time every limit admits the same check ([`MultiThrottle::retry_after`]: that largest
//! `after_i - tau_i`), if nobody else takes permits meanwhile.
//!
//! # The server's clock
//! As [`Gcra`](super::Gcra)'s: `now` is the server's `TIME` (µs), read in the script, so the
//! fleet's clock skew and round-trip times do not matter; the script replicates its effects
//! (the `SET`), not itself.
//!
//! # The key, and expiry
//! One key per client, `prefix + key` ([`MultiGcraBuilder::prefix`], default
//! `"turnstile:multi_gcra:"`), holding a string of `16 × k` bytes: every limit's `tat_i`, in
//! the order the limits were given, as two little-endian IEEE doubles, its µs since the Unix
//! epoch and its units (10⁻¹⁸ s) past that µs, both integers (exact in a double: below 2⁵³
//! and 10¹²), packed and unpacked by the scripting engine's `struct` library
//! ([`decode_tats`] reads it). One `GET` and one `SET` per check whatever the number of
//! limits, which a hash (`HMGET`, `HSET`, `PEXPIRE`) would not be; and one C call each way
//! for all the times, where [`Gcra`](super::Gcra)'s decimal text would be parsed and
//! formatted in Lua, limit by limit, on every check (`bench/examples/redis.rs` measures the
//! two-limit check beside the one-limit one). A grant sets
//! the key with `PX` = the time until **every** limit is full again (the largest `after_i`,
//! rounded up to whole ms, at least 1 ms): an idle key disappears exactly when it would read
//! as full buckets. A refusal and a peek write nothing (the TTL runs on).
//!
//! A key written under another list of limits (a rolling deploy that adds or removes one) is
//! read by position, as [`MultiTokenBucket::set_limits`] keeps its limits: limit `i` reads
//! the key's `i`-th time (as fewer permits where the old limit had taken more, never as an
//! error), a limit past the key's times reads as full, and times past the limits are dropped
//! at the next grant. A key that does not hold such times (another length, a value that is
//! no such integer) is a script error ([`RedisLimitError::Redis`], a misconfiguration).
//!
//! # Redis Cluster
//! A call touches one key, so it runs on any master of a cluster unchanged, with a
//! [`Connection`], any [`ConnectionManager`](super::ConnectionManager) or a
//! [`ClusterConnection`](::redis::cluster_async::ClusterConnection); the script is run by
//! `EVALSHA` and loaded again on `NOSCRIPT`, as [`Gcra`](super::Gcra)'s.
//!
//! # The reply
//! [`MultiGcra::throttle`] answers a [`MultiThrottle`]: whether the permits were taken, the
//! limit that refused and when to retry, the time until every limit is full (the key's TTL),
//! and every limit's [`QuotaStatus`] from the same reply ([`MultiThrottle::statuses`]: its
//! burst, the time it takes to refill from empty, the whole permits left and the time until
//! it is full: the fields of a `RateLimit` header per limit).
//! [`RedisLimiter::try_check_n_status`] answers the binding one ([`MultiThrottle::binding`]:
//! the fewest permits left, the longest reset among equals, as
//! [`Statuses::binding`](crate::multi_token_bucket::Statuses::binding)).
//!
//! # Precision and range
//! [`Gcra`](super::Gcra)'s, per limit: time in units of 10⁻¹⁸ s; each `n × T_i` and `tau_i`
//! computed in Rust with `u128` integers and sent as (µs, units) pairs, which the script adds
//! and compares with a carry in Lua numbers that stay exact integers (µs since the epoch plus
//! at most `tau_i` < 2⁵² µs is below 2⁵³). So nothing drifts: `T_i` is rounded once, to
//! 10⁻¹⁸ s from the `f64` limit (relative error below 10⁻⁹ up to 10⁹ permits/s), and every
//! grant adds exactly `n × T_i` to every limit. The only other rounding is the server clock's
//! whole µs at the two ends of a span: a saturated limit grants over a span its exact
//! `burst + limit × span` to within one request plus `limit × 2 µs` permits.
//!
//! Limits: one to four, each a positive finite rate with a burst of at least 1, within what a
//! [`MultiTokenBucket`] holds (its fallback twin; the two share one validation, so a
//! configuration valid for one is valid for the other): otherwise
//! [`ConfigError::LimitCount`] or [`ConfigError::LimitOutOfRange`] (a zero burst, a zero or
//! infinite rate, a burst or rate past the word's fields). As in [`Gcra`](super::Gcra),
//! `tau_i` is at most 2⁵² µs (142 years): a burst that would take longer to refill refills in
//! 142 years. A check of more permits than the smallest burst is refused before any round trip
//! ([`RedisLimitError::ExceedsBurst`] with that burst).
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use turnstile::multi_token_bucket::Bandwidth;
//! use turnstile::redis::{MultiGcra, RedisLimiter};
//!
//! let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
//! // 20 per second with bursts of 40, and 10 000 per day, per user, for the whole fleet.
//! let per_user = MultiGcra::builder(&[
//!     Bandwidth::per(20, Duration::from_secs(1)).burst_of(40),
//!     Bandwidth::per(10_000, Duration::from_secs(86_400)),
//! ])
//! .prefix("api:user:")
//! .build(con)?;
//!
//! let t = per_user.throttle("alice", 1).await?;
//! if t.allowed {
//!     for (i, s) in t.statuses().iter().enumerate() {
//!         println!("limit {i}: {} of {} left, full in {:?}", s.remaining, s.quota, s.reset);
//!     }
//! } else {
//!     println!("limit {:?} refused: retry in {:?}", t.refused_by, t.retry_after);
//! }
//! // The crate-wide shape: Ok(Ok(())), or Ok(Err(denied)) with its Retry-After.
//! if let Err(denied) = per_user.try_check_n("bob", 5).await? {
//!     println!("Retry-After: {}", denied.retry_after_secs().unwrap());
//! }
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use ::redis::Script;

use super::gcra::{ceil_duration, intervals, split, UNITS_PER_US};
use super::{denied_after, Connection, RedisBatch, RedisLimitError, RedisLimiter};
use crate::multi_token_bucket::{limits_of, Bandwidth, MultiTokenBucket, MAX_LIMITS};
use crate::{ConfigError, Denied, Limit, QuotaStatus};

/// The multi-limit GCRA script. `KEYS[1]` the client's key; `ARGV[1]` a string of
/// little-endian IEEE doubles, all integers: `k` (the number of limits), then each limit's
/// `tau_i`, then for each request (a batch: [`Coalesce`](super::Coalesce)) each limit's
/// `n × T_i`; every duration as whole µs then the remaining units (10⁻¹⁸ s, below 10¹²). One
/// argument unpacked by one C call, where a decimal argument per number would cost Redis an
/// argument and the script a `tonumber` each. The requests are taken one after another at the
/// same `now`, each as if alone, each all-or-nothing over the `k` limits. Returns per request
/// `{allowed (1/0), d_1 µs, d_1 units, ..., d_k µs, d_k units}`, with
/// `d_i = max(tat_i, now) - now` before that request; the caller derives the refusing limit,
/// retry-after, remaining and reset from the `d_i`, `n × T_i` and `tau_i`.
pub const SCRIPT: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local F = 1000000000000
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local m = #ARGV[1] / 8
if m < 1 or m % 1 ~= 0 then
  return redis.error_reply('turnstile multi_gcra: ARGV[1] is no string of doubles')
end
-- Formats are cut from one constant: a short string Lua already holds, where string.rep
-- would build and hash a new one on every call.
local D = '<dddddddddddddddddddddddddddddddd'
local p = {struct.unpack(m < 32 and string.sub(D, 1, m + 1) or string.rep('<d', m), ARGV[1])}
local step = 2 * p[1]
local fmt = string.sub(D, 1, step + 1)
local d
local s = redis.call('GET', KEYS[1])
if s then
  local n = #s / 8
  if n < 2 or n % 2 ~= 0 then
    return redis.error_reply('turnstile multi_gcra: ' .. KEYS[1] .. ' does not hold TATs')
  end
  -- d[j] becomes limit j's time below full (0 if full); times past the key's read as full.
  d = {struct.unpack(n == step and fmt or string.rep('<d', n), s)}
  for j = 1, n, 2 do
    local tu, tf = d[j], d[j + 1]
    if not (tu >= 0 and tu < 9007199254740992 and tu % 1 == 0
        and tf >= 0 and tf < F and tf % 1 == 0) then
      return redis.error_reply('turnstile multi_gcra: ' .. KEYS[1] .. ' does not hold TATs')
    end
    if tu >= now then
      d[j] = tu - now
    else
      d[j], d[j + 1] = 0, 0
    end
  end
  for j = n + 1, step do d[j] = 0 end
else
  d = {}
  for j = 1, step do d[j] = 0 end
end
local out, at, took = {}, 1, false
for r = 1 + step, m - step, step do
  local ok, takes = 1, false
  for j = 1, step, 2 do
    local inc_us, inc_f = p[r + j], p[r + j + 1]
    local du, df = d[j], d[j + 1]
    local x_us, x_f = du + inc_us, df + inc_f
    if x_f >= F then
      x_us, x_f = x_us + 1, x_f - F
    end
    if x_us > p[j + 1] or (x_us == p[j + 1] and x_f > p[j + 2]) then
      ok = 0
    end
    if inc_us > 0 or inc_f > 0 then
      takes = true
    end
    out[at + j], out[at + j + 1] = du, df
  end
  out[at] = ok
  if ok == 1 and takes then
    -- Recomputed rather than kept from the check: a table per request costs more.
    for j = 1, step, 2 do
      local x_us, x_f = d[j] + p[r + j], d[j + 1] + p[r + j + 1]
      if x_f >= F then
        x_us, x_f = x_us + 1, x_f - F
      end
      d[j], d[j + 1] = x_us, x_f
    end
    took = true
  end
  at = at + step + 1
end
if took then
  local up = 0
  for j = 1, step, 2 do
    local u = d[j]
    if d[j + 1] > 0 then u = u + 1 end
    if u > up then up = u end
    d[j] = now + d[j]
  end
  local ms = math.floor((up + 999) / 1000)
  if ms < 1 then ms = 1 end
  redis.call('SET', KEYS[1], struct.pack(fmt, unpack(d, 1, step)), 'PX', ms)
end
return out
"#;

/// The arrival times a [`MultiGcra`] key holds (the raw bytes of its value), each as (µs
/// since the Unix epoch, units of 10⁻¹⁸ s past that µs), in the order of the limits; `None`
/// if the bytes are not such times (see the [module docs](self#the-key-and-expiry)).
///
/// ```
/// use turnstile::redis::multi_gcra::decode_tats;
///
/// let mut value = Vec::new();
/// for x in [1_764_559_341_123_456.0f64, 500_000.0, 1_764_559_398_000_000.0, 0.0] {
///     value.extend_from_slice(&x.to_le_bytes());
/// }
/// assert_eq!(
///     decode_tats(&value),
///     Some(vec![(1_764_559_341_123_456, 500_000), (1_764_559_398_000_000, 0)])
/// );
/// assert_eq!(decode_tats(b"hello"), None);
/// ```
pub fn decode_tats(value: &[u8]) -> Option<Vec<(u64, u64)>> {
    if value.is_empty() || !value.len().is_multiple_of(16) {
        return None;
    }
    let exact =
        |x: f64, below: f64| (x >= 0.0 && x < below && x.fract() == 0.0).then_some(x as u64);
    value
        .chunks_exact(16)
        .map(|c| {
            let us = f64::from_le_bytes(c[..8].try_into().ok()?);
            let units = f64::from_le_bytes(c[8..].try_into().ok()?);
            Some((exact(us, 9_007_199_254_740_992.0)?, exact(units, 1e12)?))
        })
        .collect()
}

/// A status for the slots past the last limit.
const NO_STATUS: QuotaStatus = QuotaStatus {
    quota: 0,
    window: Duration::ZERO,
    remaining: 0,
    reset: Duration::ZERO,
};

/// The answer of [`MultiGcra::throttle`]: the verdict over every limit, and each limit's
/// status from the same reply (see the [module docs](self#the-reply)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultiThrottle {
    /// Whether the permits were taken from every limit (always `true` for a peek); if not,
    /// nothing was taken from any.
    pub allowed: bool,
    /// `None` if allowed; otherwise the index (in the order given, from 0) of the limit that
    /// admits the same check last: the one whose `Retry-After` this is.
    pub refused_by: Option<usize>,
    /// `None` if allowed; otherwise how long until every limit admits the same check (if
    /// nobody else takes permits meanwhile), rounded up to the nanosecond.
    pub retry_after: Option<Duration>,
    /// How long until every limit is full again (and the key expires), rounded up to the
    /// nanosecond; zero when all are full.
    pub reset_after: Duration,
    k: usize,
    statuses: [QuotaStatus; MAX_LIMITS],
}

impl MultiThrottle {
    /// Every limit's status right after the check (its `remaining` counts this check's
    /// permits out if allowed, as they were if refused), in the order the limits were given:
    /// `quota` its burst, `window` `burst × T` (the time it takes to refill from empty),
    /// `remaining` its whole permits, `reset` the time until it is full.
    pub fn statuses(&self) -> &[QuotaStatus] {
        &self.statuses[..self.k]
    }

    /// The status a single-limit header shows: the limit with the fewest permits left (the
    /// longest reset among equals, the first given among those), the one that refuses first.
    pub fn binding(&self) -> QuotaStatus {
        let mut b = self.statuses[0];
        for s in &self.statuses()[1..] {
            if (s.remaining, std::cmp::Reverse(s.reset)) < (b.remaining, std::cmp::Reverse(b.reset))
            {
                b = *s;
            }
        }
        b
    }
}

/// One to four GCRA limits shared through Redis, checked all-or-nothing: one key per client,
/// on the server's clock (see the [module docs](self)).
///
/// `C` is the connection, as [`Gcra`](super::Gcra)'s: a [`Connection`] (the default), a
/// [`ConnectionManager`](super::ConnectionManager) or a
/// [`ClusterConnection`](::redis::cluster_async::ClusterConnection). Calls take `&self` and
/// clone the (multiplexed) connection handle; cloning the limiter clones that handle too.
#[derive(Clone)]
pub struct MultiGcra<C = Connection> {
    con: C,
    script: Script,
    prefix: String,
    max_key_len: usize,
    limits: Vec<Bandwidth>,
    /// The smallest burst: a check of more can never pass.
    min_burst: u32,
    /// Each limit's emission interval `T_i` in units (10⁻¹⁸ s), the first `limits.len()`.
    t: [u128; MAX_LIMITS],
    /// Each limit's `burst_i × T_i` in units.
    tau: [u128; MAX_LIMITS],
}

/// Builds a [`MultiGcra`]: [`MultiGcra::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct MultiGcraBuilder {
    limits: Vec<Bandwidth>,
    prefix: String,
    max_key_len: usize,
}

impl MultiGcraBuilder {
    /// The prefix of every key (default `"turnstile:multi_gcra:"`): the Redis key of `key` is
    /// `prefix + key`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest key a check accepts, in bytes, not counting the prefix (default 512): a
    /// longer one is [`RedisLimitError::KeyTooLong`], before any round trip.
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// The limiter on `con`.
    ///
    /// # Errors
    /// [`ConfigError::LimitCount`] for no limits or more than four;
    /// [`ConfigError::LimitOutOfRange`] for a limit with a zero burst, a zero or infinite
    /// rate, or one its in-process twin ([`MultiTokenBucket`]) cannot hold, naming the first
    /// such limit.
    pub fn build<C>(self, con: C) -> Result<MultiGcra<C>, ConfigError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let checked = limits_of(&self.limits)?;
        let mut t = [0; MAX_LIMITS];
        let mut tau = [0; MAX_LIMITS];
        for (i, b) in self.limits.iter().enumerate() {
            (t[i], tau[i]) = intervals(b.limit(), b.burst())?;
        }
        Ok(MultiGcra {
            con,
            script: Script::new(SCRIPT),
            prefix: self.prefix,
            max_key_len: self.max_key_len,
            limits: self.limits,
            min_burst: checked.min_burst,
            t,
            tau,
        })
    }
}

impl MultiGcra<Connection> {
    /// A builder for `limits` (one to four, in the order answers name them); `.build(con)`
    /// checks them and makes the limiter.
    pub fn builder(limits: &[Bandwidth]) -> MultiGcraBuilder {
        MultiGcraBuilder {
            limits: limits.to_vec(),
            prefix: "turnstile:multi_gcra:".to_string(),
            max_key_len: super::DEFAULT_MAX_KEY_LEN,
        }
    }
}

impl<C> MultiGcra<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// `limits` (one to four) on `con`, with the default prefix (`"turnstile:multi_gcra:"`).
    ///
    /// # Errors
    /// As [`MultiGcraBuilder::build`].
    pub fn new(con: C, limits: &[Bandwidth]) -> Result<Self, ConfigError> {
        MultiGcra::builder(limits).build(con)
    }

    /// The limits, in the order given.
    pub fn limits(&self) -> &[Bandwidth] {
        &self.limits
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of `key`: `prefix + key`.
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Takes `n` permits for `key` from every limit if each has them, and none otherwise
    /// (`n = 0`: a peek, which takes nothing), in one round trip.
    ///
    /// # Errors
    /// Before any round trip: [`RedisLimitError::EmptyKey`],
    /// [`RedisLimitError::KeyTooLong`] ([`MultiGcraBuilder::max_key_len`]), and
    /// [`RedisLimitError::ExceedsBurst`] for `n` above the smallest burst. Then Redis's own
    /// errors ([`RedisLimitError::Redis`]) and [`RedisLimitError::UnexpectedReply`].
    pub async fn throttle(&self, key: &str, n: u32) -> Result<MultiThrottle, RedisLimitError> {
        let mut answers = self.throttle_batch(key, &[n]).await?;
        answers
            .pop()
            .ok_or_else(|| RedisLimitError::UnexpectedReply("no answer".into()))
    }

    /// What `key` has now, taking nothing: [`MultiGcra::throttle`] with `n = 0` (always
    /// allowed).
    pub async fn peek(&self, key: &str) -> Result<MultiThrottle, RedisLimitError> {
        self.throttle(key, 0).await
    }

    /// Takes `ns[0]`, then `ns[1]`, … permits for `key` in **one** round trip: the requests
    /// are taken one after another at the same instant of the server's clock, each answered
    /// exactly as [`MultiGcra::throttle`] would have answered it alone at that instant (a
    /// refused request takes nothing). What [`Coalesce`](super::Coalesce) sends for
    /// concurrent checks of one key.
    ///
    /// # Errors
    /// As [`MultiGcra::throttle`], for any request of the batch (then none is sent).
    pub async fn throttle_batch(
        &self,
        key: &str,
        ns: &[u32],
    ) -> Result<Vec<MultiThrottle>, RedisLimitError> {
        for &n in ns {
            self.validate(key, n)?;
        }
        if ns.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.limits.len();
        // The script's one argument: the doubles Lua would have read the numbers as anyway.
        let mut packed = Vec::with_capacity(8 * (1 + 2 * k * (1 + ns.len())));
        let mut put = |x: u64| packed.extend_from_slice(&(x as f64).to_le_bytes());
        put(k as u64);
        for &tau in &self.tau[..k] {
            let (us, f) = split(tau);
            put(us);
            put(f);
        }
        for &n in ns {
            for &t in &self.t[..k] {
                let (us, f) = split(t * u128::from(n));
                put(us);
                put(f);
            }
        }
        let mut invocation = self.script.key(self.redis_key(key));
        invocation.arg(packed);
        let mut con = self.con.clone();
        let reply: Vec<i64> = invocation.invoke_async(&mut con).await?;
        let per = 1 + 2 * k;
        if reply.len() != per * ns.len() {
            return Err(RedisLimitError::UnexpectedReply(format!("{reply:?}")));
        }
        reply
            .chunks_exact(per)
            .zip(ns)
            .map(|(r, &n)| self.answer(r, n))
            .collect()
    }

    /// Bad input, refused before any round trip.
    fn validate(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        super::check_key(key, self.max_key_len)?;
        if n > self.min_burst {
            return Err(RedisLimitError::ExceedsBurst {
                n,
                burst: self.min_burst,
            });
        }
        Ok(())
    }

    /// The [`MultiThrottle`] of a check of `n` from the script's reply
    /// `{allowed, d_1 µs, d_1 units, ...}`.
    fn answer(&self, reply: &[i64], n: u32) -> Result<MultiThrottle, RedisLimitError> {
        let bad = || RedisLimitError::UnexpectedReply(format!("{reply:?}"));
        let k = self.limits.len();
        let Some((&allowed, ds)) = reply.split_first() else {
            return Err(bad());
        };
        if !(0..=1).contains(&allowed) || ds.len() != 2 * k {
            return Err(bad());
        }
        let allowed = allowed == 1;
        let mut statuses = [NO_STATUS; MAX_LIMITS];
        // The limit admitting last, and by how much it is over.
        let mut over: Option<(usize, u128)> = None;
        let mut reset = 0u128;
        for (i, d) in ds.chunks_exact(2).enumerate() {
            let (d_us, d_f) = (d[0], d[1]);
            // d may pass tau: the key may have been written under other limits; it then
            // reads as fewer permits, not as an error.
            if d_us < 0 || !(0..UNITS_PER_US as i64).contains(&d_f) {
                return Err(bad());
            }
            let d = d_us as u128 * UNITS_PER_US + d_f as u128;
            let (t, tau) = (self.t[i], self.tau[i]);
            let after = d + t * u128::from(n);
            if after > tau && over.is_none_or(|(_, o)| after - tau >= o) {
                over = Some((i, after - tau));
            }
            let used = if allowed { after } else { d };
            let burst = self.limits[i].burst();
            let remaining = u32::try_from(tau.saturating_sub(used) / t)
                .unwrap_or(u32::MAX)
                .min(burst);
            statuses[i] = QuotaStatus {
                quota: u64::from(burst),
                window: ceil_duration(tau),
                remaining: u64::from(remaining),
                reset: ceil_duration(used),
            };
            reset = reset.max(used);
        }
        // The script decides with the same integers: a disagreement is not its reply.
        if allowed == over.is_some() {
            return Err(bad());
        }
        Ok(MultiThrottle {
            allowed,
            refused_by: over.map(|(i, _)| i),
            retry_after: over.map(|(_, o)| ceil_duration(o)),
            reset_after: ceil_duration(reset),
            k,
            statuses,
        })
    }
}

impl<C> RedisLimiter for MultiGcra<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Local = MultiTokenBucket;

    /// A [`MultiTokenBucket`] of the same limits, each at `limit × share` with a burst of
    /// `max(1, ceil(burst × share))`; `share` outside `(0, 1]` (or NaN) counts as 1. A scaled
    /// limit the in-process word cannot hold (a share so small that refilling its burst would
    /// take over 146 years) keeps its whole configuration.
    fn local(&self, share: f64) -> MultiTokenBucket {
        let share = if share > 0.0 && share <= 1.0 {
            share
        } else {
            1.0
        };
        let mut scaled: Vec<Bandwidth> = self
            .limits
            .iter()
            .map(|b| {
                let limit = Limit::per_second(b.limit().as_f64() * share).unwrap_or(Limit::ZERO);
                let burst = (f64::from(b.burst()) * share).ceil().max(1.0) as u32;
                Bandwidth::new(limit, burst)
            })
            .collect();
        // Each round puts one limit back to its whole configuration: at most k rounds.
        loop {
            match MultiTokenBucket::new(&scaled) {
                Ok(local) => return local,
                Err(ConfigError::LimitOutOfRange { index, .. })
                    if scaled[index] != self.limits[index] =>
                {
                    scaled[index] = self.limits[index];
                }
                Err(_) => break,
            }
        }
        MultiTokenBucket::new(&self.limits).expect("the limits were checked at build")
    }

    async fn ping(&self) -> Result<(), RedisLimitError> {
        super::ping(&self.con).await
    }

    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    async fn try_check_n(&self, key: &str, n: u32) -> Result<Result<(), Denied>, RedisLimitError> {
        Ok(verdict(&self.throttle(key, n).await?))
    }

    /// The check's [`MultiThrottle::binding`] status, from the same script call as
    /// [`RedisLimiter::try_check_n`] (always `Some`): the limit with the fewest permits left
    /// after the check (before it, if refused), `q` its burst, `w` its `burst × T`, `t` the
    /// time until it is full. [`MultiGcra::throttle`] gives every limit's.
    async fn try_check_n_status(
        &self,
        key: &str,
        n: u32,
    ) -> Result<super::StatusVerdict, RedisLimitError> {
        let t = self.throttle(key, n).await?;
        Ok(super::StatusVerdict {
            result: verdict(&t),
            status: Some(t.binding()),
        })
    }
}

impl<C> RedisBatch for MultiGcra<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn validate(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        MultiGcra::validate(self, key, n)
    }

    async fn try_check_batch(
        &self,
        key: &str,
        ns: &[u32],
    ) -> Result<Vec<Result<(), Denied>>, RedisLimitError> {
        Ok(self
            .throttle_batch(key, ns)
            .await?
            .iter()
            .map(verdict)
            .collect())
    }
}

/// The crate-wide verdict of a [`MultiThrottle`].
fn verdict(t: &MultiThrottle) -> Result<(), Denied> {
    if t.allowed {
        Ok(())
    } else {
        Err(denied_after(t.retry_after))
    }
}

impl<C> fmt::Debug for MultiGcra<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiGcra")
            .field("prefix", &self.prefix)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}
