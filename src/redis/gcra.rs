//! [`Gcra`]: the precise fleet limiter, GCRA in one Redis key per limit on the Redis
//! server's clock, answering as redis-cell's `CL.THROTTLE` does.
//!
//! # The algorithm
//! A limit of `limit` permits per second with a burst (capacity) of `burst` permits is one
//! number, the key's *theoretical arrival time* `tat`: the instant at which the bucket is (or
//! will be) empty, ignoring the cap, as in [`TokenBucket`]. With the
//! emission interval `T = 1 / limit` and `tau = burst × T`, the permits available at `now`
//! are `(now + tau - max(tat, now)) / T` (at most `burst`); taking `n` at `now` is
//!
//! ```text
//! d     = max(tat, now) - now           (how far the bucket is below full, as time)
//! after = d + n × T
//! allowed  iff  after <= tau            then  tat' = now + after
//! ```
//!
//! A denial writes nothing; a peek (`n = 0`) writes nothing and is always allowed. All of it
//! runs in one Lua script ([`SCRIPT`]), so a check is one round trip and atomic on the server.
//!
//! # The server's clock
//! `now` is the Redis server's `TIME` (µs), read inside the script: every client of the fleet
//! measures against the same clock, so their clock skew does not matter, and neither do their
//! round-trip times. Calling `TIME` (a non-deterministic command) before a write is allowed
//! because Redis ≥ 5 replicates a script's *effects* (the `SET` with its value), not the
//! script itself; Redis 3.2 and 4 are switched to effects replication by the script's
//! `redis.replicate_commands()` call. Redis 7 only replicates effects.
//!
//! # The key, and expiry
//! One key per limit, `prefix + key` ([`GcraBuilder::prefix`], default `"turnstile:gcra:"`),
//! holding a plain string: `tat` in µs since the Unix epoch with twelve decimals, e.g.
//! `1764559341123456.000000500000`. A grant sets it with `PX` = the time until the bucket is
//! full again (`after`, rounded up to whole ms, at least 1 ms): an idle key disappears exactly
//! when it would read as a full bucket, so idle limits cost no memory. A denial and a peek
//! write nothing (the TTL is unchanged).
//!
//! # Redis Cluster
//! A call touches one key, so it runs on any master of a cluster unchanged (the key picks the
//! slot; `{hash tags}` in keys work as usual). The connection may be a
//! [`Connection`] (or any [`ConnectionManager`](super::ConnectionManager)) or a
//! [`ClusterConnection`](::redis::cluster_async::ClusterConnection); the script is run by
//! `EVALSHA` and loaded on `NOSCRIPT` (after `SCRIPT FLUSH`, a restart, a failover or a slot
//! moving to a node that never saw it) by redis-rs's [`Script`], whose
//! `SCRIPT LOAD` a cluster connection sends to every master. A key's state moves with its
//! slot (`MIGRATE` keeps the value and TTL), so a migration changes no answer.
//!
//! # The reply
//! [`Gcra::throttle`] answers a [`Throttle`], the fields of `CL.THROTTLE`'s reply
//! `[limited, limit, remaining, retry_after, reset_after]`, with durations instead of whole
//! seconds:
//!
//! | `CL.THROTTLE` | [`Throttle`] |
//! |---|---|
//! | `limited` (0/1) | `allowed` (its negation) |
//! | `limit` = `max_burst + 1`, the capacity | `limit` = `burst`, the capacity (same quantity) |
//! | `remaining` | `remaining`: whole permits left after this call (before it, if denied) |
//! | `retry_after` (s, `-1` if allowed) | `retry_after`: `None` if allowed, else when the same call would pass |
//! | `reset_after` (s) | `reset_after`: until the bucket is full again |
//!
//! redis-cell's `max_burst` counts permits *beyond* the first; turnstile's `burst` is the whole
//! capacity, as everywhere in the crate, so `Gcra::new(con, limit, b)` is
//! `CL.THROTTLE key b-1 ...` and reports `limit = b` where redis-cell reports `b` too.
//! Durations are exact to the nanosecond, rounded up (a retry at `retry_after` passes).
//!
//! # Precision and range
//! Time is counted in *units* of 10⁻¹⁸ s (10¹² units per µs). The increment `n × T` and
//! `tau` are computed in Rust with `u128` integers and sent as (µs, units) pairs; the script
//! adds and compares such pairs with a carry, in Lua numbers (doubles) that stay exact
//! integers: µs since the epoch (~1.8·10¹⁵) plus at most `tau` (< 2⁵² µs) is below 2⁵³, and
//! a sum of two unit parts is below 2·10¹². So nothing drifts: `T` is rounded once, to
//! 10⁻¹⁸ s from the `f64` limit (relative error below 10⁻⁹ up to 10⁹ permits/s, ~10⁻¹⁶
//! below 10⁶/s), and every grant adds exactly `n × T`. The only other rounding is the server
//! clock's whole µs, at the two ends of a span: a saturated limit grants over a span the
//! exact `burst + limit × span` to within one request plus `limit × 2 µs` permits, i.e.
//! **within one request for limits up to 5·10⁵/s** (finer than `max(1, 10⁻⁶ × expected)`
//! for any span); above that the µs clock adds up to `limit × 2 µs` permits per span, still
//! without drift (`tests/redis_gcra.rs`: `grants_add_exactly_n_times_t`).
//!
//! Limits: any positive finite [`Limit`] and `burst ≥ 1`. `T` is at least one unit (limits
//! above 10¹⁸/s act as 10¹⁸/s) and `tau` at most 2⁵² µs (142 years): a burst that would take
//! longer to refill refills in 142 years. [`Limit::ZERO`] is refused
//! ([`ConfigError::ZeroRate`]: nothing would ever refill a fleet-wide key), as is a zero burst
//! ([`ConfigError::ZeroCapacity`]: nothing could ever be granted). [`Limit::INF`] means no
//! limit, as everywhere in the crate: every call is allowed **without a round trip**, with
//! `remaining = burst` (asking for more than the burst is still bad input).
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use turnstile::redis::{Gcra, RedisLimiter};
//! use turnstile::Limit;
//!
//! let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
//! // 100 requests per second per user, bursts of 20, shared by every server of the fleet.
//! let per_user = Gcra::builder(Limit::per_second(100.0)?, 20)
//!     .prefix("api:user:")
//!     .build(con)?;
//!
//! let t = per_user.throttle("alice", 1).await?;
//! if t.allowed {
//!     println!("{} left, full again in {:?}", t.remaining, t.reset_after);
//! } else {
//!     println!("retry in {:?}", t.retry_after.unwrap());
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

use super::{denied_after, Connection, RedisBatch, RedisLimitError, RedisLimiter};
use crate::{Compact, ConfigError, Denied, Limit, QuantaClock, QuotaStatus, TokenBucket};

/// Units of time per µs: a unit is 10⁻¹⁸ s.
pub(super) const UNITS_PER_US: u128 = 1_000_000_000_000;
/// Units per ns.
const UNITS_PER_NS: u128 = 1_000_000_000;
/// Units per second.
const UNITS_PER_SEC: f64 = 1e18;
/// The longest `tau`: 2⁵² µs (142 years), so that the script's sums stay below 2⁵³.
const MAX_TAU: u128 = (1u128 << 52) * UNITS_PER_US;

/// The Lua that reads a [`Gcra`] key's `tat` (µs, and units below a µs, from its
/// `"µs.units"` string) into `tat_us, tat_f`, both `nil` if the key is absent, or returns a
/// script error if it holds anything else: shared by [`SCRIPT`] and the lease scripts.
macro_rules! read_tat {
    () => {
        r#"
local tat_us, tat_f
local s = redis.call('GET', KEYS[1])
if s then
  local dot = string.find(s, '.', 1, true)
  if dot then
    tat_us, tat_f = tonumber(string.sub(s, 1, dot - 1)), tonumber(string.sub(s, dot + 1))
  else
    tat_us, tat_f = tonumber(s), 0
  end
  if not tat_us or not tat_f then
    return redis.error_reply('turnstile gcra: ' .. KEYS[1] .. ' does not hold a TAT')
  end
end"#
    };
}
pub(super) use read_tat;

/// The GCRA script. `KEYS[1]` the limit's key; `ARGV` = `tau`, then one `n × T` per request
/// (a batch: [`Coalesce`](super::Coalesce)), each as whole µs then the remaining units
/// (10⁻¹⁸ s, below 10¹²). The requests are taken one after another at the same `now`, each
/// as if alone. Returns `{allowed (1/0), d_us, d_units}` per request, with
/// `d = max(tat, now) - now` before that request; the caller derives remaining, retry-after
/// and reset-after from `d`, `n × T`, `T` and `tau`.
pub const SCRIPT: &str = concat!(
    r#"
if redis.replicate_commands then redis.replicate_commands() end
local F = 1000000000000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tau_us, tau_f = tonumber(ARGV[1]), tonumber(ARGV[2])
local d_us, d_f = 0, 0
"#,
    read_tat!(),
    r#"
if tat_us and tat_us >= now then
  d_us, d_f = tat_us - now, tat_f
end
local out, took = {}, false
for i = 3, #ARGV - 1, 2 do
  local inc_us, inc_f = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local a_us, a_f = d_us + inc_us, d_f + inc_f
  if a_f >= F then
    a_us, a_f = a_us + 1, a_f - F
  end
  local ok = a_us < tau_us or (a_us == tau_us and a_f <= tau_f)
  out[#out + 1] = ok and 1 or 0
  out[#out + 1] = d_us
  out[#out + 1] = d_f
  if ok and (inc_us > 0 or inc_f > 0) then
    d_us, d_f, took = a_us, a_f, true
  end
end
if took then
  local up = d_us
  if d_f > 0 then up = up + 1 end
  local ms = math.floor((up + 999) / 1000)
  if ms < 1 then ms = 1 end
  redis.call('SET', KEYS[1], string.format('%d.%012d', now + d_us, d_f), 'PX', ms)
end
return out
"#
);

/// The answer of [`Gcra::throttle`]: redis-cell's `CL.THROTTLE` reply (see the
/// [module docs](self#the-reply)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Throttle {
    /// Whether the permits were taken (always `true` for a peek).
    pub allowed: bool,
    /// The capacity: the most permits granted at once (the limiter's burst; redis-cell's
    /// `max_burst + 1`).
    pub limit: u32,
    /// Whole permits left: after this call if allowed, as they were if denied.
    pub remaining: u32,
    /// `None` if allowed; otherwise how long until the same call would be allowed (if
    /// nobody else takes permits meanwhile), rounded up to the nanosecond.
    pub retry_after: Option<Duration>,
    /// How long until the bucket is full again (and the key expires), rounded up to the
    /// nanosecond; zero for a full bucket.
    pub reset_after: Duration,
}

/// A GCRA limit shared through Redis: one key per limit, on the server's clock (see the
/// [module docs](self)).
///
/// `C` is the connection: a [`Connection`] (the default, from [`connect`](super::connect)), a
/// [`ConnectionManager`](super::ConnectionManager) or a
/// [`ClusterConnection`](::redis::cluster_async::ClusterConnection). Cheap to share: calls
/// take `&self` and clone the (multiplexed) connection handle; cloning the limiter clones
/// that handle too.
#[derive(Clone)]
pub struct Gcra<C = Connection> {
    pub(super) con: C,
    script: Script,
    prefix: String,
    max_key_len: usize,
    limit: Limit,
    burst: u32,
    /// The emission interval `T` in units (10⁻¹⁸ s); 0 under [`Limit::INF`].
    pub(super) t: u128,
    /// `burst × T` in units.
    pub(super) tau: u128,
}

/// Builds a [`Gcra`]: [`Gcra::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct GcraBuilder {
    limit: Limit,
    burst: u32,
    prefix: String,
    max_key_len: usize,
}

impl GcraBuilder {
    /// The prefix of every key (default `"turnstile:gcra:"`): the Redis key of `key` is
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
    /// [`ConfigError::ZeroRate`] for [`Limit::ZERO`], [`ConfigError::ZeroCapacity`] for a
    /// zero burst.
    pub fn build<C>(self, con: C) -> Result<Gcra<C>, ConfigError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let (t, tau) = intervals(self.limit, self.burst)?;
        Ok(Gcra {
            con,
            script: Script::new(SCRIPT),
            prefix: self.prefix,
            max_key_len: self.max_key_len,
            limit: self.limit,
            burst: self.burst,
            t,
            tau,
        })
    }
}

/// `T` and `tau` in units, for a valid configuration (also [`MultiGcra`](super::MultiGcra)'s,
/// per limit).
pub(super) fn intervals(limit: Limit, burst: u32) -> Result<(u128, u128), ConfigError> {
    if limit == Limit::ZERO {
        return Err(ConfigError::ZeroRate);
    }
    if burst == 0 {
        return Err(ConfigError::ZeroCapacity);
    }
    if limit.is_inf() {
        return Ok((0, 0));
    }
    // Limit is normal and positive, so the quotient is finite; `as` saturates.
    let t = ((UNITS_PER_SEC / limit.as_f64()).round() as u128).clamp(1, MAX_TAU);
    let t = t.min(MAX_TAU / u128::from(burst)).max(1);
    Ok((t, t * u128::from(burst)))
}

/// A span in units as whole ns, rounded up.
pub(super) fn ceil_duration(units: u128) -> Duration {
    let ns = units.div_ceil(UNITS_PER_NS);
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// Splits units into the script's (µs, units below a µs) pair.
pub(super) fn split(units: u128) -> (u64, u64) {
    // Below 2⁵³ µs by construction (at most MAX_TAU).
    ((units / UNITS_PER_US) as u64, (units % UNITS_PER_US) as u64)
}

impl Gcra<Connection> {
    /// A builder for a limit of `limit` permits per second with a capacity of `burst`
    /// permits; `.build(con)` makes the limiter.
    pub fn builder(limit: Limit, burst: u32) -> GcraBuilder {
        GcraBuilder {
            limit,
            burst,
            prefix: "turnstile:gcra:".to_string(),
            max_key_len: super::DEFAULT_MAX_KEY_LEN,
        }
    }
}

impl<C> Gcra<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A limit of `limit` permits per second with a capacity of `burst` permits, on `con`,
    /// with the default prefix (`"turnstile:gcra:"`).
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] for [`Limit::ZERO`], [`ConfigError::ZeroCapacity`] for a
    /// zero burst.
    pub fn new(con: C, limit: Limit, burst: u32) -> Result<Self, ConfigError> {
        Gcra::builder(limit, burst).build(con)
    }

    /// The limit (permits per second).
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The capacity: the most permits granted at once.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of `key`: `prefix + key`.
    pub fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Takes `n` permits for `key` if the shared limit has them (`n = 0`: a peek, which takes
    /// nothing), in one round trip, and answers as `CL.THROTTLE` does.
    ///
    /// # Errors
    /// Before any round trip: [`RedisLimitError::EmptyKey`],
    /// [`RedisLimitError::KeyTooLong`] ([`GcraBuilder::max_key_len`]), and
    /// [`RedisLimitError::ExceedsBurst`] for `n > burst`. Then Redis's own errors
    /// ([`RedisLimitError::Redis`]) and [`RedisLimitError::UnexpectedReply`].
    pub async fn throttle(&self, key: &str, n: u32) -> Result<Throttle, RedisLimitError> {
        let mut answers = self.throttle_batch(key, &[n]).await?;
        answers
            .pop()
            .ok_or_else(|| RedisLimitError::UnexpectedReply("no answer".into()))
    }

    /// Takes `ns[0]`, then `ns[1]`, … permits for `key` in **one** round trip: the requests
    /// are taken one after another at the same instant of the server's clock, each answered
    /// exactly as [`Gcra::throttle`] would have answered it alone at that instant (a denied
    /// request takes nothing, so a later, smaller one may still pass). What
    /// [`Coalesce`](super::Coalesce) sends for concurrent checks of one key.
    ///
    /// # Errors
    /// As [`Gcra::throttle`], for any request of the batch (then none is sent).
    pub async fn throttle_batch(
        &self,
        key: &str,
        ns: &[u32],
    ) -> Result<Vec<Throttle>, RedisLimitError> {
        for &n in ns {
            self.validate(key, n)?;
        }
        if ns.is_empty() {
            return Ok(Vec::new());
        }
        if self.t == 0 {
            // Limit::INF: no limit, no round trip.
            let full = Throttle {
                allowed: true,
                limit: self.burst,
                remaining: self.burst,
                retry_after: None,
                reset_after: Duration::ZERO,
            };
            return Ok(vec![full; ns.len()]);
        }
        let (tau_us, tau_f) = split(self.tau);
        let mut invocation = self.script.key(self.redis_key(key));
        invocation.arg(tau_us).arg(tau_f);
        for &n in ns {
            let (inc_us, inc_f) = split(self.t * u128::from(n));
            invocation.arg(inc_us).arg(inc_f);
        }
        let mut con = self.con.clone();
        let reply: Vec<i64> = invocation.invoke_async(&mut con).await?;
        if reply.len() != 3 * ns.len() {
            return Err(RedisLimitError::UnexpectedReply(format!("{reply:?}")));
        }
        reply
            .chunks_exact(3)
            .zip(ns)
            .map(|(r, &n)| self.answer(r, self.t * u128::from(n)))
            .collect()
    }

    /// Bad input, refused before any round trip.
    pub(super) fn validate(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        super::check_key(key, self.max_key_len)?;
        if n > self.burst {
            return Err(RedisLimitError::ExceedsBurst {
                n,
                burst: self.burst,
            });
        }
        Ok(())
    }

    /// What `key` has now, taking nothing: [`Gcra::throttle`] with `n = 0` (always allowed;
    /// `remaining` is the whole permits available).
    pub async fn peek(&self, key: &str) -> Result<Throttle, RedisLimitError> {
        self.throttle(key, 0).await
    }

    /// The [`Throttle`] from the script's reply `{allowed, d_us, d_units}`.
    fn answer(&self, reply: &[i64], inc: u128) -> Result<Throttle, RedisLimitError> {
        let bad = || RedisLimitError::UnexpectedReply(format!("{reply:?}"));
        let &[allowed, d_us, d_f] = reply else {
            return Err(bad());
        };
        // d may pass tau: the key may have been written under another configuration (a
        // rolling deploy with a new limit); it then reads as fewer permits, not as an error.
        if !(0..=1).contains(&allowed) || d_us < 0 || !(0..UNITS_PER_US as i64).contains(&d_f) {
            return Err(bad());
        }
        let d = d_us as u128 * UNITS_PER_US + d_f as u128;
        let remaining = |used: u128| {
            let r = self.tau.saturating_sub(used) / self.t;
            u32::try_from(r).unwrap_or(u32::MAX).min(self.burst)
        };
        if allowed == 1 {
            let after = d + inc;
            Ok(Throttle {
                allowed: true,
                limit: self.burst,
                remaining: remaining(after),
                retry_after: None,
                reset_after: ceil_duration(after),
            })
        } else {
            Ok(Throttle {
                allowed: false,
                limit: self.burst,
                remaining: remaining(d),
                retry_after: Some(ceil_duration((d + inc).saturating_sub(self.tau))),
                reset_after: ceil_duration(d),
            })
        }
    }
}

impl<C> RedisLimiter for Gcra<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Local = TokenBucket<QuantaClock, Compact>;

    /// A [`TokenBucket`] (compact) at `limit × share` with a burst of
    /// `max(1, ceil(burst × share))`; `share` outside `(0, 1]` (or NaN) counts as 1.
    fn local(&self, share: f64) -> Self::Local {
        let share = if share > 0.0 && share <= 1.0 {
            share
        } else {
            1.0
        };
        let limit = if self.limit.is_inf() {
            Limit::INF
        } else {
            Limit::per_second(self.limit.as_f64() * share).unwrap_or(Limit::ZERO)
        };
        let burst = (f64::from(self.burst) * share).ceil().max(1.0) as u32;
        TokenBucket::builder(limit, burst).build_compact()
    }

    async fn ping(&self) -> Result<(), RedisLimitError> {
        super::ping(&self.con).await
    }

    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    async fn try_check_n(&self, key: &str, n: u32) -> Result<Result<(), Denied>, RedisLimitError> {
        Ok(verdict(self.throttle(key, n).await?))
    }

    /// The check's [`Throttle`] as the IETF fields, exactly, from the same script call as
    /// [`RedisLimiter::try_check_n`] (always `Some`): `q` = the burst, `w` = the time the
    /// bucket takes to refill from empty, `burst × T` (the `tau` the script compares
    /// against, rounded up to the nanosecond; `burst / limit`), `r` = the throttle's
    /// `remaining` (after this check if granted, as they were if denied) and `t` = its
    /// `reset_after`. Under [`Limit::INF`], no round trip: `r = q = burst`, `w = t = 0`, as
    /// the in-process [`TokenBucket`]'s.
    async fn try_check_n_status(
        &self,
        key: &str,
        n: u32,
    ) -> Result<super::StatusVerdict, RedisLimitError> {
        let t = self.throttle(key, n).await?;
        Ok(super::StatusVerdict {
            result: verdict(t),
            status: Some(self.quota_status(&t)),
        })
    }
}

impl<C> Gcra<C> {
    /// The IETF fields of a [`Throttle`] of this limiter: the window is `tau`, the span the
    /// script measures the burst over.
    fn quota_status(&self, t: &Throttle) -> QuotaStatus {
        QuotaStatus {
            quota: u64::from(t.limit),
            window: ceil_duration(self.tau),
            remaining: u64::from(t.remaining),
            reset: t.reset_after,
        }
    }
}

impl<C> RedisBatch for Gcra<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn validate(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        Gcra::validate(self, key, n)
    }

    async fn try_check_batch(
        &self,
        key: &str,
        ns: &[u32],
    ) -> Result<Vec<Result<(), Denied>>, RedisLimitError> {
        Ok(self
            .throttle_batch(key, ns)
            .await?
            .into_iter()
            .map(verdict)
            .collect())
    }
}

/// The crate-wide verdict of a [`Throttle`].
fn verdict(t: Throttle) -> Result<(), Denied> {
    if t.allowed {
        Ok(())
    } else {
        Err(denied_after(t.retry_after))
    }
}

impl<C> fmt::Debug for Gcra<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gcra")
            .field("prefix", &self.prefix)
            .field("limit", &self.limit)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_are_exact_and_clamped() {
        let (t, tau) = intervals(Limit::per_second(3.0).unwrap(), 7).unwrap();
        // 1e18 / 3 in f64: within 2^-52 relative of exact.
        assert!(t.abs_diff(333_333_333_333_333_333) < 100, "{t}");
        assert_eq!(tau, 7 * t);
        let (t, _) = intervals(Limit::per_second(1e9).unwrap(), 1).unwrap();
        assert_eq!(t, 1_000_000_000);
        let (_, tau) = intervals(Limit::per_second(1e-9).unwrap(), 1000).unwrap();
        assert!(tau <= MAX_TAU);
        assert_eq!(intervals(Limit::INF, 3).unwrap(), (0, 0));
        assert_eq!(intervals(Limit::ZERO, 3), Err(ConfigError::ZeroRate));
        let one = Limit::per_second(1.0).unwrap();
        assert_eq!(intervals(one, 0), Err(ConfigError::ZeroCapacity));
        assert_eq!(split(3 * UNITS_PER_US + 5), (3, 5));
        assert_eq!(ceil_duration(1), Duration::from_nanos(1));
        assert_eq!(ceil_duration(UNITS_PER_NS), Duration::from_nanos(1));
    }
}
