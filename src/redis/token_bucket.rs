//! A token bucket shared by a fleet on Redis, compatible with go-zero's `TokenLimiter`.
//!
//! # Compatibility
//! [`TokenBucket`] keeps go-zero's state, in go-zero's keys, with go-zero's arithmetic, so a Go
//! service on go-zero's `limit.NewTokenLimiter(rate, burst, store, key)` and a Rust service on
//! `TokenBucket::new(con, rate, burst)` with the same `rate`, `burst` and key share **one**
//! limit:
//!
//! - **Keys** ([`TokenBucket::keys`]): `{key}.tokens` (the tokens left, an integer) and `{key}.ts` (the
//!   caller's clock in whole Unix seconds at the last call). The `{…}` hash tag puts both in one
//!   Redis Cluster slot. With a [prefix](TokenBucketBuilder::prefix) the tag holds `prefix + key`;
//!   without one the layout is exactly go-zero's.
//! - **Script** ([`SCRIPT`]): go-zero's `core/limit/tokenscript.lua` with the same arguments
//!   (`rate`, `burst`, `now`, `n`): a missing key reads as a full bucket, `rate` tokens are
//!   added per whole second of the callers' clocks since the stored timestamp (capped at
//!   `burst`), `n` are taken if there are that many, and **both keys are always rewritten by
//!   `SETEX`**, denials included, so idle keys expire by themselves.
//! - **Time**: the caller's clock, in whole Unix seconds (go-zero's `now.Unix()`), not Redis's
//!   `TIME`. [`TokenBucket::try_check_n_at`] takes that time explicitly.
//! - `n = 0` is allowed (and, as upstream, still refreshes the keys).
//!
//! # Deviations (from `seed-semantics.md`)
//! - **D12**: the keys' TTL is `max(1, floor(2·burst/rate))` seconds ([`TokenBucket::ttl`]). go-zero's
//!   `floor(2·burst/rate)` is 0 whenever `2·burst < rate` (e.g. rate 10, burst 4); `SETEX` then
//!   fails with "invalid expire time" and go-zero silently lives in its in-process rescue
//!   limiter forever. Here such limits work on Redis.
//! - **D13**: a clock that disagrees with the stored timestamp neither mints tokens nor
//!   freezes the key. go-zero stores every caller's time, so a caller whose clock is behind
//!   rewinds the stored timestamp and the next caller with the right time refills the gap
//!   again, and a caller an hour ahead is credited the hour. The keys expire `ttl` seconds
//!   after the last call, so while they exist no right clock is more than `W = ttl + 1`
//!   seconds (one more for whole-second rounding) from the stored timestamp `ts`. A call at
//!   `now`:
//!   - `ts ≤ now ≤ ts + W`: go-zero's refill, `(now − ts) × rate`, and `now` is stored;
//!   - `ts − W ≤ now < ts`: no refill, and `ts` is kept (never rewound by a clock a little
//!     behind);
//!   - `|now − ts| > W`: no refill, and `now` is stored: the gap is a wrong clock, not time,
//!     so the bucket goes on from the caller's present with no credit for the skipped span.
//!
//!   The invariant: tokens are only ever refilled for the stored timestamp moving forward to
//!   a caller's own clock, by at most `W`; it never moves back within `W`, and moves by more
//!   than `W`, either way, only with no refill. So a fleet whose clocks agree to within a
//!   second is never granted more than `burst + rate × (elapsed on its fastest clock)`, and a
//!   clock off by more than `W`, ahead or behind, earns nothing from its skew: its call
//!   refills nothing, nor does the next right-clock call, which puts the stored timestamp
//!   back in the present. A key is frozen for no longer than that one call, where storing the
//!   larger timestamp froze it for as long as the skew (an hour ahead: an hour of denials). A
//!   clock behind within `W` waits, at most `W` seconds, for its clock to pass the stored
//!   timestamp. What two keys and the callers' clocks cannot give: two groups of clocks more
//!   than `W` apart calling one key in turn reset each other, each reset refilling nothing,
//!   so they get less than the limit until the clocks are fixed. go-zero's own script in the
//!   same fleet still rewinds, and refills from a rewound time; calls of this one do neither.
//! - More than `burst` permits (`n > burst`) can never be granted: go-zero runs the script and
//!   denies (rewriting the keys); here it is [`RedisLimitError::ExceedsBurst`] before any round
//!   trip, as is an empty key ([`RedisLimitError::EmptyKey`]). A zero rate (go-zero divides by
//!   zero) or a zero burst is a [`ConfigError`] at construction.
//! - The script answers more than go-zero's boolean: also the tokens left and the stored
//!   timestamp, from which a denial's retry-after is computed (the time, in whole seconds of
//!   the caller's clock, at which `n` tokens will exist if nobody else takes any). What it
//!   stores is exactly what go-zero's script stores, apart from D12 and D13.
//!
//! Both fixes only ever matter where go-zero misbehaves, so Go services running go-zero's own
//! script and Rust services running this one on one key agree call by call while the callers'
//! clocks agree (the tests run go-zero's script text side by side with this limiter).
//!
//! # Batches
//! [`TokenBucket::try_check_batch_at`] decides several requests of one key in one round trip
//! with [`BATCH_SCRIPT`]: [`SCRIPT`]'s arithmetic run once per request at the same `now`, each
//! request seeing the tokens the previous ones left (a denied one takes nothing, so a later,
//! smaller one may still pass), the keys written once at the end. Every verdict, and the
//! stored state, is what the same calls of [`SCRIPT`] one after another at that `now` would
//! give. That is what [`Coalesce`](super::Coalesce) sends for concurrent checks of one key.
//! [`SCRIPT`] itself is unchanged, so a single check stays go-zero's script.
//!
//! # Granularity
//! As upstream, tokens arrive `rate` at a time at each whole second of the callers' clocks: a
//! client that drains the bucket just before a second boundary and again just after it gets up
//! to about `2 × burst` permits within a moment (go-zero#1451). For a limit that is smooth
//! within the second and immune to clock skew, use the GCRA on the Redis server's clock.
//!
//! # Cluster
//! Both keys of a call share their hash tag, hence their slot, so the limiter works unchanged
//! on a Redis Cluster through
//! [`ClusterConnection`](::redis::cluster_async::ClusterConnection), which follows `MOVED` and
//! `ASK` redirections when slots migrate. (A key whose hash tag would be empty, i.e.
//! `prefix + key` starting with `}`, hashes its two Redis keys to different slots and fails on a
//! cluster with `CROSSSLOT`, as it does in go-zero.)
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use turnstile::redis::{RedisLimiter, TokenBucket};
//!
//! let client = redis::Client::open("redis://127.0.0.1:6380/")?;
//! let con = client.get_connection_manager().await?;
//! // 100 permits per second, bursts of 200: go-zero's NewTokenLimiter(100, 200, store, key).
//! let limiter = TokenBucket::new(con, 100, 200)?;
//! match limiter.try_check("user:42").await? {
//!     Ok(()) => { /* serve */ }
//!     Err(denied) => println!("retry in {:?} s", denied.retry_after_secs()),
//! }
//! # Ok(()) }
//! ```

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::redis::aio::ConnectionLike;
use ::redis::Script;

use super::{Connection, RedisBatch, RedisLimitError, RedisLimiter};
use crate::{Compact, ConfigError, Denied, Limit, QuantaClock, QuotaStatus};

/// The limiter's Lua script: go-zero's `tokenscript.lua` (MIT, Copyright (c) 2022 zeromicro)
/// with D12 (`ttl` at least 1) and D13 (a clock behind never rewinds the stored timestamp
/// within `ttl + 1` s; a gap wider than that, either way, refills nothing), answering
/// `{allowed (1 or 0), tokens after the call, stored timestamp}` instead of go-zero's boolean.
///
/// `KEYS = [tokens key, timestamp key]` ([`TokenBucket::keys`]), `ARGV = [rate, burst, now (whole Unix
/// seconds), n]`, exactly as go-zero passes them.
///
/// ```
/// use turnstile::redis::token_bucket::SCRIPT;
/// assert!(SCRIPT.contains(r#"redis.call("setex", KEYS[2], ttl, ts)"#));
/// ```
pub const SCRIPT: &str = r#"-- turnstile::redis::TokenBucket: go-zero's core/limit/tokenscript.lua
-- (MIT, Copyright (c) 2022 zeromicro), the same state in the same keys, with
-- D12 (ttl >= 1) and D13 (no clock skew mints or freezes) fixed, answering
-- {allowed, tokens after, stored timestamp} for the caller's retry-after.
-- KEYS[1] as tokens_key
-- KEYS[2] as timestamp_key
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])
local fill_time = capacity/rate
-- D12: go-zero's floor(fill_time*2) is 0 when 2*capacity < rate, and SETEX fails
local ttl = math.max(1, math.floor(fill_time*2))
local last_tokens = tonumber(redis.call("get", KEYS[1]))
if last_tokens == nil then
    last_tokens = capacity
end

local last_refreshed = tonumber(redis.call("get", KEYS[2]))
local known = last_refreshed ~= nil
if last_refreshed == nil then
    last_refreshed = 0
end

local delta = math.max(0, now-last_refreshed)
local ts = now
-- D13: the keys expire ttl s after the last call, so no right clock is more than
-- ttl+1 s from a stored timestamp. Within that window a clock behind it keeps it
-- (never rewound: clocks that disagree mint nothing); beyond it the gap is a
-- wrong clock, not time: nothing is refilled and ts restarts at the caller's now.
if known then
    local window = ttl + 1
    if now > last_refreshed + window or now < last_refreshed - window then
        delta = 0
    elseif now < last_refreshed then
        ts = last_refreshed
    end
end
local filled_tokens = math.min(capacity, last_tokens+(delta*rate))
local allowed = filled_tokens >= requested
local new_tokens = filled_tokens
if allowed then
    new_tokens = filled_tokens - requested
end

redis.call("setex", KEYS[1], ttl, new_tokens)
redis.call("setex", KEYS[2], ttl, ts)

if allowed then
    return {1, new_tokens, ts}
end
return {0, new_tokens, ts}
"#;

/// [`SCRIPT`] for a batch of requests of one key at one `now` ([`TokenBucket::try_check_batch_at`],
/// [`Coalesce`](super::Coalesce)): the same arithmetic, with the same D12 and D13 fixes, run
/// once per requested count. `KEYS` as [`SCRIPT`]'s; `ARGV = [rate, burst, now, n₁, n₂, …]`.
///
/// A separate script rather than a loop in [`SCRIPT`], so that [`SCRIPT`] stays go-zero's
/// text line for line. Each request reads the tokens and timestamp the previous one left (at
/// the same `now` there is no refill between them), is allowed iff that many tokens are
/// there, and takes them only if allowed; both keys are written once, by `SETEX` with the
/// same TTL, after the last request, so the stored state is what the last of the same calls
/// of [`SCRIPT`] would leave. Returns `{allowed (1 or 0), tokens after, stored timestamp}`
/// per request, in order: each triple is [`SCRIPT`]'s reply for that request alone at that
/// instant. No request (`#ARGV < 4`) writes nothing and returns an empty list.
///
/// ```
/// use turnstile::redis::token_bucket::BATCH_SCRIPT;
/// assert!(BATCH_SCRIPT.contains("for i = 4, #ARGV do"));
/// ```
pub const BATCH_SCRIPT: &str = r#"-- turnstile::redis::TokenBucket, a batch: SCRIPT (go-zero's tokenscript.lua
-- with D12 and D13 fixed) run for ARGV[4], ARGV[5], ... in turn at the same now,
-- each request seeing what the previous one left; the keys are written once.
-- KEYS[1] as tokens_key
-- KEYS[2] as timestamp_key
if #ARGV < 4 then
    return {}
end
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local fill_time = capacity/rate
-- D12: go-zero's floor(fill_time*2) is 0 when 2*capacity < rate, and SETEX fails
local ttl = math.max(1, math.floor(fill_time*2))
local last_tokens = tonumber(redis.call("get", KEYS[1]))
if last_tokens == nil then
    last_tokens = capacity
end

local last_refreshed = tonumber(redis.call("get", KEYS[2]))
local known = last_refreshed ~= nil
if last_refreshed == nil then
    last_refreshed = 0
end

local out = {}
for i = 4, #ARGV do
    local requested = tonumber(ARGV[i])
    local delta = math.max(0, now-last_refreshed)
    local ts = now
    -- D13, as in SCRIPT: within ttl+1 s behind, ts is kept; beyond ttl+1 s either
    -- way, nothing is refilled and ts restarts at now
    if known then
        local window = ttl + 1
        if now > last_refreshed + window or now < last_refreshed - window then
            delta = 0
        elseif now < last_refreshed then
            ts = last_refreshed
        end
    end
    local filled_tokens = math.min(capacity, last_tokens+(delta*rate))
    local allowed = filled_tokens >= requested
    local new_tokens = filled_tokens
    if allowed then
        new_tokens = filled_tokens - requested
    end
    -- what SCRIPT's SETEX would leave for the next request
    last_tokens = new_tokens
    last_refreshed = ts
    known = true
    out[#out + 1] = allowed and 1 or 0
    out[#out + 1] = new_tokens
    out[#out + 1] = ts
end

redis.call("setex", KEYS[1], ttl, last_tokens)
redis.call("setex", KEYS[2], ttl, last_refreshed)

return out
"#;

static LOADED: LazyLock<Script> = LazyLock::new(|| Script::new(SCRIPT));
static LOADED_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(BATCH_SCRIPT));

/// The caller's clock: the system time since the Unix epoch (go-zero's `time.Now()`).
fn system_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// The two Redis keys of `key` under `prefix` ([`TokenBucket::keys`]).
fn keys(prefix: &str, key: &str) -> [String; 2] {
    [
        format!("{{{prefix}{key}}}.tokens"),
        format!("{{{prefix}{key}}}.ts"),
    ]
}

/// The keys' TTL in seconds for a limit ([`TokenBucket::ttl`]).
fn ttl(rate: u32, burst: u32) -> u64 {
    // Lua's `math.floor(capacity/rate*2)` in doubles, the same expression.
    let t = (f64::from(burst) / f64::from(rate) * 2.0).floor();
    if t.is_finite() && t >= 1.0 {
        t as u64
    } else {
        1
    }
}

/// A token bucket on Redis shared by every process that uses the same keys, compatible with
/// go-zero's `TokenLimiter` (see the [module docs](self) for the compatibility, the deviations
/// and the 1 s granularity).
///
/// Generic over the connection: a single server through the reconnecting
/// [`Connection`] (the default, from [`connect`](super::connect)) or a Redis Cluster through
/// [`ClusterConnection`](::redis::cluster_async::ClusterConnection). Cloning is cheap when the
/// connection's is (both are handles on one multiplexed connection).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use turnstile::redis::TokenBucket;
///
/// let nodes = vec!["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/"];
/// let con = redis::cluster::ClusterClient::new(nodes)?.get_async_connection().await?;
/// let limiter = TokenBucket::builder(10, 20).prefix("api:").build(con)?;
/// // Keys {api:alice}.tokens and {api:alice}.ts, at a time of the caller's choosing:
/// assert!(limiter.try_check_n_at("alice", 1_700_000_000, 20).await?.is_ok());
/// assert!(limiter.try_check_n_at("alice", 1_700_000_000, 1).await?.is_err());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TokenBucket<C = Connection> {
    con: C,
    rate: u32,
    burst: u32,
    prefix: String,
    max_key_len: usize,
}

/// Builds a [`TokenBucket`]: [`TokenBucket::builder`], options [`TokenBucketBuilder::prefix`]
/// and [`TokenBucketBuilder::max_key_len`], then [`TokenBucketBuilder::build`] on a
/// connection. The builder holds no connection, so one configuration builds a limiter per
/// connection.
///
/// ```
/// use turnstile::redis::TokenBucket;
/// // Any value stands in for the connection where only the configuration matters.
/// let options = TokenBucket::builder(10, 20).prefix("api:");
/// let a = options.clone().build(()).unwrap();
/// let b = options.build(()).unwrap();
/// assert_eq!(a.keys("bob"), b.keys("bob"));
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct TokenBucketBuilder {
    rate: u32,
    burst: u32,
    prefix: String,
    max_key_len: usize,
}

impl TokenBucketBuilder {
    /// Prefixes every key (default none, go-zero's layout): a call with `key` uses
    /// `{prefix+key}.tokens` and `{prefix+key}.ts`. A go-zero service shares the limit by
    /// passing `prefix + key` to `NewTokenLimiter`.
    ///
    /// ```
    /// use turnstile::redis::TokenBucket;
    /// let tb = TokenBucket::builder(5, 10).prefix("rl:").build(()).unwrap();
    /// assert_eq!(tb.keys("bob"), ["{rl:bob}.tokens".to_string(), "{rl:bob}.ts".to_string()]);
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest key a check accepts, in bytes, not counting the prefix (default 512): a
    /// longer one is [`RedisLimitError::KeyTooLong`], before any round trip.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use turnstile::redis::{RedisLimitError, RedisLimiter, TokenBucket};
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
    /// let tb = TokenBucket::builder(5, 10).max_key_len(64).build(con)?;
    /// assert_eq!(tb.max_key_len(), 64);
    /// let long = "k".repeat(65);
    /// assert!(matches!(
    ///     tb.try_check(&long).await,
    ///     Err(RedisLimitError::KeyTooLong { len: 65, max: 64 })
    /// ));
    /// # Ok(()) }
    /// ```
    pub fn max_key_len(mut self, max: usize) -> Self {
        self.max_key_len = max;
        self
    }

    /// The limiter on `con`. Nothing is sent to Redis until the first check.
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] for a zero rate (go-zero divides by it),
    /// [`ConfigError::ZeroCapacity`] for a zero burst (nothing could ever be granted).
    ///
    /// ```
    /// use turnstile::redis::TokenBucket;
    /// use turnstile::ConfigError;
    /// assert_eq!(TokenBucket::builder(0, 10).build(()).unwrap_err(), ConfigError::ZeroRate);
    /// assert_eq!(TokenBucket::builder(10, 0).build(()).unwrap_err(), ConfigError::ZeroCapacity);
    /// ```
    pub fn build<C>(self, con: C) -> Result<TokenBucket<C>, ConfigError> {
        if self.rate == 0 {
            return Err(ConfigError::ZeroRate);
        }
        if self.burst == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        Ok(TokenBucket {
            con,
            rate: self.rate,
            burst: self.burst,
            prefix: self.prefix,
            max_key_len: self.max_key_len,
        })
    }
}

impl TokenBucket<Connection> {
    /// A builder for a limiter of `rate` tokens per second and `burst` capacity, with options
    /// [`TokenBucketBuilder::prefix`] (default none) and [`TokenBucketBuilder::max_key_len`]
    /// (default 512); `.build(con)` makes the limiter.
    ///
    /// ```
    /// use turnstile::redis::TokenBucket;
    /// let tb = TokenBucket::builder(10, 20).prefix("api:").build(()).unwrap();
    /// assert_eq!((tb.rate(), tb.burst(), tb.prefix()), (10, 20, "api:"));
    /// ```
    pub fn builder(rate: u32, burst: u32) -> TokenBucketBuilder {
        TokenBucketBuilder {
            rate,
            burst,
            prefix: String::new(),
            max_key_len: super::DEFAULT_MAX_KEY_LEN,
        }
    }
}

impl<C> TokenBucket<C> {
    /// A limiter of `rate` tokens per second and `burst` capacity on `con`, with no key
    /// prefix: go-zero's `NewTokenLimiter(rate, burst, store, key)` for every key it is called
    /// with. The same as `TokenBucket::builder(rate, burst).build(con)`. Nothing is sent to
    /// Redis until the first check.
    ///
    /// # Errors
    /// [`ConfigError::ZeroRate`] for a zero rate (go-zero divides by it),
    /// [`ConfigError::ZeroCapacity`] for a zero burst (nothing could ever be granted).
    pub fn new(con: C, rate: u32, burst: u32) -> Result<Self, ConfigError> {
        TokenBucket::builder(rate, burst).build(con)
    }

    /// Tokens added per whole second.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// The bucket's capacity: the most permits one call can take.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The key prefix (empty by default).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The two Redis keys of `key`, with the prefix: `{prefix+key}.tokens` and
    /// `{prefix+key}.ts`, go-zero's `tokenFormat` and `timestampFormat`.
    ///
    /// ```
    /// use turnstile::redis::TokenBucket;
    /// // No connection is needed to name the keys: `()` stands for one here.
    /// let tb = TokenBucket::new((), 5, 10).unwrap();
    /// assert_eq!(tb.keys("api"), ["{api}.tokens".to_string(), "{api}.ts".to_string()]);
    /// let tb = TokenBucket::builder(5, 10).prefix("rl:").build(()).unwrap();
    /// assert_eq!(tb.keys("bob"), ["{rl:bob}.tokens".to_string(), "{rl:bob}.ts".to_string()]);
    /// ```
    pub fn keys(&self, key: &str) -> [String; 2] {
        keys(&self.prefix, key)
    }

    /// The keys' TTL in seconds: `max(1, floor(2·burst/rate))`, computed as the script does
    /// (D12: go-zero's is 0 when `2·burst < rate`).
    ///
    /// ```
    /// use turnstile::redis::TokenBucket;
    /// let ttl = |rate, burst| TokenBucket::new((), rate, burst).unwrap().ttl();
    /// assert_eq!(ttl(5, 10), 4);
    /// assert_eq!(ttl(3, 4), 2);
    /// assert_eq!(ttl(10, 4), 1); // go-zero: 0, and every SETEX fails
    /// ```
    pub fn ttl(&self) -> u64 {
        ttl(self.rate, self.burst)
    }

    /// The connection the limiter uses.
    pub fn connection(&self) -> &C {
        &self.con
    }
}

impl<C> TokenBucket<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One permit for `key` now: [`RedisLimiter::try_check_n`] with `n = 1`.
    pub async fn try_check(&self, key: &str) -> Result<Result<(), Denied>, RedisLimitError> {
        self.try_check_n(key, 1).await
    }

    /// Takes `n` permits for `key` at `now_unix_secs` (the caller's clock in whole Unix
    /// seconds, go-zero's `now.Unix()`) if the shared bucket has them. A denial's retry-after
    /// counts from the start of that second.
    ///
    /// # Errors
    /// [`RedisLimitError::EmptyKey`], [`RedisLimitError::KeyTooLong`]
    /// ([`TokenBucketBuilder::max_key_len`]) and [`RedisLimitError::ExceedsBurst`] before any
    /// round trip; [`RedisLimitError::Redis`] when Redis fails.
    pub async fn try_check_n_at(
        &self,
        key: &str,
        now_unix_secs: u64,
        n: u32,
    ) -> Result<Result<(), Denied>, RedisLimitError> {
        self.check(key, Duration::from_secs(now_unix_secs), n).await
    }

    /// Takes `ns[0]`, then `ns[1]`, … permits for `key` at `now_unix_secs` in **one** round
    /// trip ([`BATCH_SCRIPT`]): the requests are decided one after another at that second, each
    /// exactly as [`TokenBucket::try_check_n_at`] would decide it alone there (a denied request
    /// takes nothing, so a later, smaller one may still pass), and the keys end as those calls
    /// would leave them. One verdict per request, in order; a denial's retry-after is the one
    /// that call would give. What [`Coalesce`](super::Coalesce) sends for concurrent checks.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use turnstile::redis::TokenBucket;
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
    /// let limiter = TokenBucket::new(con, 1, 5)?;
    /// // A full bucket of 5: 3 pass, 4 would need more than the 2 left, 2 still pass.
    /// let verdicts = limiter.try_check_batch_at("bob", 1_700_000_000, &[3, 4, 2]).await?;
    /// assert!(verdicts[0].is_ok() && verdicts[1].is_err() && verdicts[2].is_ok());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`TokenBucket::try_check_n_at`], for any request of the batch (then none is sent).
    /// An empty batch makes no round trip.
    pub async fn try_check_batch_at(
        &self,
        key: &str,
        now_unix_secs: u64,
        ns: &[u32],
    ) -> Result<Vec<Result<(), Denied>>, RedisLimitError> {
        self.check_batch(key, Duration::from_secs(now_unix_secs), ns)
            .await
    }

    /// Bad input, refused before any round trip (single checks and batches alike).
    fn validate(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        super::check_key(key, self.max_key_len)?;
        if n > self.burst {
            return Err(RedisLimitError::ExceedsBurst {
                n,
                burst: self.burst,
            });
        }
        Ok(())
    }

    /// The batch at `now` since the Unix epoch; the script sees its whole seconds.
    async fn check_batch(
        &self,
        key: &str,
        now: Duration,
        ns: &[u32],
    ) -> Result<Vec<Result<(), Denied>>, RedisLimitError> {
        for &n in ns {
            self.validate(key, n)?;
        }
        if ns.is_empty() {
            return Ok(Vec::new());
        }
        let [tokens_key, ts_key] = self.keys(key);
        let mut invocation = LOADED_BATCH.key(tokens_key);
        invocation
            .key(ts_key)
            .arg(self.rate)
            .arg(self.burst)
            .arg(now.as_secs());
        for &n in ns {
            invocation.arg(n);
        }
        let mut con = self.con.clone();
        let reply: Vec<i64> = invocation.invoke_async(&mut con).await?;
        if reply.len() != 3 * ns.len() {
            return Err(RedisLimitError::UnexpectedReply(format!("{reply:?}")));
        }
        reply
            .chunks_exact(3)
            .zip(ns)
            .map(|(r, &n)| self.verdict(now, n, r))
            .collect()
    }

    /// The verdict of a script's reply `{allowed, tokens, ts}` for a request of `n` at `now`.
    fn verdict(
        &self,
        now: Duration,
        n: u32,
        reply: &[i64],
    ) -> Result<Result<(), Denied>, RedisLimitError> {
        match *reply {
            [1, _, _] => Ok(Ok(())),
            [0, tokens, ts] => Ok(Err(super::denied_after(Some(
                self.retry_after(now, n, tokens, ts),
            )))),
            _ => Err(RedisLimitError::UnexpectedReply(format!("{reply:?}"))),
        }
    }

    /// The check at `now` since the Unix epoch; the script sees its whole seconds.
    async fn check(
        &self,
        key: &str,
        now: Duration,
        n: u32,
    ) -> Result<Result<(), Denied>, RedisLimitError> {
        let reply = self.run(key, now, n).await?;
        self.verdict(now, n, &reply)
    }

    /// The check at `now` with the status its reply tells.
    async fn check_status(
        &self,
        key: &str,
        now: Duration,
        n: u32,
    ) -> Result<super::StatusVerdict, RedisLimitError> {
        let reply = self.run(key, now, n).await?;
        Ok(super::StatusVerdict {
            result: self.verdict(now, n, &reply)?,
            status: Some(self.status(now, reply[1], reply[2])),
        })
    }

    /// [`RedisLimiter::try_check_n_status`] at `now_unix_secs` (the caller's clock in whole
    /// Unix seconds), as [`TokenBucket::try_check_n_at`] checks: the verdict, and the bucket's
    /// status after the check from [`SCRIPT`]'s own reply (the tokens left and the stored
    /// timestamp; see [`RedisLimiter::try_check_n_status`] for this limiter).
    ///
    /// # Errors
    /// As [`TokenBucket::try_check_n_at`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use turnstile::redis::TokenBucket;
    ///
    /// let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
    /// let limiter = TokenBucket::new(con, 2, 5)?; // 2 a second, bursts of 5
    /// let answer = limiter.try_check_n_status_at("carol", 1_700_000_000, 4).await?;
    /// assert!(answer.result.is_ok());
    /// let s = answer.status.unwrap();
    /// // 1 token left; 4 more arrive at the next 2 whole seconds; empty to full in 3 s.
    /// assert_eq!((s.quota, s.remaining, s.reset, s.window), (5, 1, Duration::from_secs(2), Duration::from_secs(3)));
    /// # Ok(()) }
    /// ```
    pub async fn try_check_n_status_at(
        &self,
        key: &str,
        now_unix_secs: u64,
        n: u32,
    ) -> Result<super::StatusVerdict, RedisLimitError> {
        self.check_status(key, Duration::from_secs(now_unix_secs), n)
            .await
    }

    /// The bucket's IETF fields after a call at `now` that left `tokens` with the stored
    /// timestamp `ts` (see [`RedisLimiter::try_check_n_status`] for this limiter).
    fn status(&self, now: Duration, tokens: i64, ts: i64) -> QuotaStatus {
        let burst = i64::from(self.burst);
        let tokens = tokens.clamp(0, burst);
        let missing = (burst - tokens) as u64;
        let reset = if missing == 0 {
            Duration::ZERO
        } else {
            // `rate` arrive at each whole second after `ts`, as `retry_after` counts.
            let seconds = missing.div_ceil(u64::from(self.rate));
            Duration::from_secs((ts.max(0) as u64).saturating_add(seconds)).saturating_sub(now)
        };
        QuotaStatus {
            quota: u64::from(self.burst),
            window: Duration::from_secs(u64::from(self.burst.div_ceil(self.rate))),
            remaining: tokens as u64,
            reset,
        }
    }

    /// One run of [`SCRIPT`] at `now`'s whole second: its reply `{allowed, tokens, ts}`.
    async fn run(&self, key: &str, now: Duration, n: u32) -> Result<Vec<i64>, RedisLimitError> {
        self.validate(key, n)?;
        let secs = now.as_secs();
        let [tokens_key, ts_key] = self.keys(key);
        let mut con = self.con.clone();
        let reply: Vec<i64> = LOADED
            .key(tokens_key)
            .key(ts_key)
            .arg(self.rate)
            .arg(self.burst)
            .arg(secs)
            .arg(n)
            .invoke_async(&mut con)
            .await?;
        if reply.len() != 3 {
            return Err(RedisLimitError::UnexpectedReply(format!("{reply:?}")));
        }
        Ok(reply)
    }

    /// When `n` tokens will exist after a denial that left `tokens` with the timestamp `ts`:
    /// `rate` arrive at each whole second after `ts`, so at second `ts + ceil((n - tokens) /
    /// rate)` of the caller's clock. Counted from `now` (which `ts` is never behind, unless
    /// the stored timestamp is ahead of the caller's clock, by at most `ttl + 1` s (D13), in
    /// which case the wait includes the difference).
    fn retry_after(&self, now: Duration, n: u32, tokens: i64, ts: i64) -> Duration {
        let missing = i64::from(n).saturating_sub(tokens).max(1) as u64;
        let seconds = missing.div_ceil(u64::from(self.rate));
        let at = Duration::from_secs((ts.max(0) as u64).saturating_add(seconds));
        at.saturating_sub(now)
    }
}

impl<C> RedisLimiter for TokenBucket<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    type Local = crate::TokenBucket<QuantaClock, Compact>;

    /// An in-process [`TokenBucket`](crate::TokenBucket) (compact layout, starting full as
    /// go-zero's rescue limiter does) with `rate × share` tokens per second and a burst of
    /// `max(1, ceil(burst × share))`. A `share` outside `(0, 1]` (or NaN) counts as 1.
    fn local(&self, share: f64) -> Self::Local {
        let share = if share > 0.0 && share <= 1.0 {
            share
        } else {
            1.0
        };
        let limit = Limit::per_second(f64::from(self.rate) * share).unwrap_or(Limit::ZERO);
        let burst = (f64::from(self.burst) * share).ceil().max(1.0) as u32;
        crate::TokenBucket::builder(limit, burst).build_compact()
    }

    fn ping(&self) -> impl std::future::Future<Output = Result<(), RedisLimitError>> + Send {
        super::ping(&self.con)
    }

    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    /// Takes `n` permits for `key` at the caller's clock (the system time, whole Unix
    /// seconds, as go-zero's `time.Now().Unix()`); a denial's retry-after counts from the
    /// exact time of the call.
    fn try_check_n(
        &self,
        key: &str,
        n: u32,
    ) -> impl std::future::Future<Output = Result<Result<(), Denied>, RedisLimitError>> + Send {
        self.check(key, system_now(), n)
    }

    /// The check of [`RedisLimiter::try_check_n`] with the bucket's status after it, from
    /// [`SCRIPT`]'s own reply (go-zero's script is unchanged: it already answers the tokens
    /// left and the stored timestamp), always `Some`, in go-zero's whole-second arithmetic:
    /// `q` = the burst; `w` = `ceil(burst / rate)` s, the whole seconds an empty bucket takes
    /// to fill; `r` = the tokens left (after this check if granted); `t` = until the second
    /// of the callers' clock at which the bucket is full again, `ts + ceil((burst - tokens)
    /// / rate)`, counted from the exact time of the call (0 when full). The `_at` form is
    /// [`TokenBucket::try_check_n_status_at`].
    fn try_check_n_status(
        &self,
        key: &str,
        n: u32,
    ) -> impl std::future::Future<Output = Result<super::StatusVerdict, RedisLimitError>> + Send
    {
        self.check_status(key, system_now(), n)
    }
}

/// Batches for [`Coalesce`](super::Coalesce): [`BATCH_SCRIPT`] at the caller's clock, as
/// [`RedisLimiter::try_check_n`] reads it.
impl<C> RedisBatch for TokenBucket<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn validate(&self, key: &str, n: u32) -> Result<(), RedisLimitError> {
        TokenBucket::validate(self, key, n)
    }

    /// [`TokenBucket::try_check_batch_at`] at the system time (whole Unix seconds for the
    /// script; a denial's retry-after counts from the exact time of the call, as
    /// [`RedisLimiter::try_check_n`]'s).
    fn try_check_batch(
        &self,
        key: &str,
        ns: &[u32],
    ) -> impl std::future::Future<Output = Result<Vec<Result<(), Denied>>, RedisLimitError>> + Send
    {
        self.check_batch(key, system_now(), ns)
    }
}

impl<C> std::fmt::Debug for TokenBucket<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("redis::TokenBucket")
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
