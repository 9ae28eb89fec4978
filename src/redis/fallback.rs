//! [`Fallback`]: any [`RedisLimiter`] that keeps answering when Redis does not (go-zero's
//! "rescue" limiter, improved).
//!
//! # What the caller sees
//! [`Fallback::check_n`] answers like the wrapped limiter's
//! [`try_check_n`](RedisLimiter::try_check_n), with one difference: **no Redis error
//! reaches the caller**; only bad input does (an empty or too long key, more permits than
//! the burst).
//!
//! * **Redis mode** (the normal one): the call goes to the wrapped limiter, bounded by the
//!   per-call timeout ([`FallbackBuilder::timeout`], default 100 ms). Its verdict (grant, or
//!   a [`Denied`] with the server's retry-after) is returned as is.
//! * **The switch**: an outage ([`RedisLimitError::is_outage`]: Redis unreachable, a
//!   timeout, or a server answering that it cannot serve now, such as `OOM`, `BUSY`,
//!   `LOADING`, `READONLY`) moves the limiter to **fallback mode**, and *that same call* is
//!   answered in process; a `tracing::warn!` event carries the error.
//! * **A misconfiguration** ([`RedisLimitError::is_misconfiguration`]: `NOPERM`,
//!   `WRONGTYPE`, a script error, an unexpected reply) is answered in process too, by the
//!   same failure policy, but leaves the mode alone: the next call tries Redis again, so the
//!   limiter is back on Redis as soon as an operator fixes the cause. Such errors last until
//!   someone acts, so they are logged with `tracing::error!` at most once a second per
//!   limiter (the event counts the ones it suppressed) and counted
//!   ([`FallbackStats::misconfigurations`]). Passing them on instead would turn every request
//!   into an error for as long as the misconfiguration lasts; switching to fallback mode
//!   would hide them behind a health check that passes (go-zero's rescue mode *flaps* so on
//!   a script that always fails, seed semantics §4.3, the ttl = 0 case).
//! * **Fallback mode**: every call is answered by an in-process limiter of the key
//!   ([`RedisLimiter::local`], built with the configured share, in a [`Keyed`] map), with no
//!   round trip: a grant, or a [`Denied`] with the local limiter's retry time. An empty key is
//!   still an error ([`RedisLimitError::EmptyKey`]), as in Redis mode. More permits than the
//!   local limiter's burst or quota is a denial that can never succeed
//!   ([`Denied::retry_after`] `None`), where Redis mode answers
//!   [`RedisLimitError::ExceedsBurst`].
//! * **The return**: a background task (one at a time, started by the switch) sends
//!   [`RedisLimiter::ping`] every 100 ms ([`FallbackBuilder::ping_every`]), each bounded by
//!   the same timeout; the first that passes switches back to Redis mode (a
//!   `tracing::info!` event with the outage's length) and ends the task. The crate's
//!   limiters probe with a script Redis treats as a write, so a server that answers `PING`
//!   but still cannot run the limiter (`OOM`, a read-only replica) keeps the limiter in
//!   fallback mode instead of flapping. Calls in flight when Redis comes
//!   back finish in fallback mode; the next ones go to Redis.
//!
//! A call that timed out was sent: a stalled Redis may still run it when it wakes, so the
//! shared count can include a few calls that were answered in process.
//!
//! Latency is bounded in every case: a call costs at most the timeout (the call that detects
//! the outage), usually one round trip, and nothing beyond an in-process check in fallback
//! mode. The wrapped limiter's connection should reconnect promptly, or the return waits for
//! it: [`connect`](super::connect) sets redis-rs's `ConnectionManager` to retry within
//! 100 ms (its default backoff can delay the first successful `PING` by seconds).
//!
//! # Example
//! A stand-in for a Redis limiter whose server is down (a real one is this module's token
//! bucket, fixed window or GCRA on a connection): every call is answered in process, with
//! this process's share of the limit.
//!
//! ```
//! use std::time::Duration;
//! use turnstile::redis::{Fallback, Mode, RedisLimitError, RedisLimiter};
//! use turnstile::{Denied, FixedWindow};
//!
//! struct Unreachable;
//!
//! impl RedisLimiter for Unreachable {
//!     type Local = FixedWindow;
//!     fn local(&self, share: f64) -> FixedWindow {
//!         // 10 a second for the whole fleet.
//!         FixedWindow::new((10.0 * share).ceil() as u32, Duration::from_secs(1)).unwrap()
//!     }
//!     async fn ping(&self) -> Result<(), RedisLimitError> {
//!         Err(RedisLimitError::Timeout(Duration::ZERO))
//!     }
//!     async fn try_check_n(&self, _: &str, _: u32) -> Result<Result<(), Denied>, RedisLimitError> {
//!         Err(RedisLimitError::Timeout(Duration::ZERO))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limiter = Fallback::builder(Unreachable)
//!     .timeout(Duration::from_millis(50))
//!     .fleet_size(2) // each of 2 processes admits half the limit while Redis is down
//!     .build()
//!     .unwrap();
//! let mut granted = 0;
//! for _ in 0..10 {
//!     // Never a connectivity error: answered in process.
//!     granted += limiter.check("client-42").await.unwrap().is_ok() as u32;
//! }
//! assert_eq!(granted, 5);
//! assert_eq!(limiter.mode(), Mode::Fallback);
//! assert_eq!(limiter.stats().switches_to_fallback, 1);
//! # }
//! ```
//!
//! # The error bound in fallback mode
//! While Redis is unreachable, each process admits what its own local limiter admits: the
//! limit times the **share** ([`FallbackBuilder::share`], or [`FallbackBuilder::fleet_size`]
//! for `1 / n`; the default is 1, go-zero's behaviour). Rates, quotas and bursts scale,
//! rounded up to at least one permit (see [`RedisLimiter::local`]), so a fleet of `n`
//! processes in fallback with share `1 / n` admits at most `n` local budgets of
//! `⌈limit / n⌉`: the one limit, plus less than one permit per process from the rounding. It
//! admits that much only when the load is spread evenly: a process that gets more than its
//! share of a key's traffic denies the excess even though others have room. With share 1 a
//! fleet admits up to `n` times the limit. What Redis had already counted before the outage
//! is not known to the local limiters: each starts fresh, so a key may get one more (local)
//! budget across the switch.
//!
//! # The local limiters persist across outages
//! As go-zero's rescue limiter does, the local limiters are **kept** when Redis comes back,
//! not cleared: a connection that flaps would otherwise hand every process a fresh budget at
//! each flap. They cost nothing while Redis answers, and the [`Keyed`] map evicts each one
//! once it is idle (a fresh one would be as strict), at its periodic sweeps.
//!
//! # The local map's bound
//! The map holds at most 100 000 keys unless [`FallbackBuilder::max_keys`] says otherwise: a
//! key flood during an outage cannot grow memory without bound. A new key that finds the map
//! full (and no idle key to sweep) is refused, with a retry time of the next sweep; keys
//! already in the map keep their limits. At the measured cost of a key in a [`Keyed`] map (its
//! docs: 302 bytes with a compact token bucket, the local limiter of [`Gcra`](super::Gcra) and
//! [`TokenBucket`](super::TokenBucket); 574 with the padded fixed window of
//! [`FixedWindow`](super::FixedWindow)) plus the key's own bytes, the default bound costs
//! about 35 MB (60 MB for a fixed window) with short keys such as an IP address, and at most
//! about 85 MB (110 MB) with keys at the default cap of 512 bytes
//! ([`RedisLimiter::max_key_len`]). Sweeps run **off the request path**, on a thread of the
//! map's own ([`Keyed::spawn_sweeper`], started by the first answer in process), so no check
//! pays for a sweep of the whole map.
//!
//! # Cost and design
//! The mode is one atomic byte. In Redis mode a call adds one `Acquire` load of it and the
//! timeout's timer to the wrapped limiter's call. The switch to fallback is a
//! compare-and-swap from Redis to fallback mode: the one call that wins it counts the switch,
//! logs it and spawns the health-check task, so there is only ever one task, however many
//! calls fail at once; only that task switches back, and it ends when it does. The task holds
//! the limiter only through a weak reference (upgraded for each ping), and dropping the last
//! [`Fallback`] handle aborts it: no task outlives its limiter by more than one ping.
//!
//! The health check needs a tokio runtime, as the wrapped limiter's connection and the
//! timeout already do: call [`Fallback::check_n`] from within one. If that runtime shuts down
//! during an outage the task goes with it and the limiter stays in fallback mode.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak}; // Mutex: mode switches and drop only, never a check
use std::time::{Duration, Instant};

use super::{ErrorLog, RedisLimitError, RedisLimiter};
use crate::{Clock, ConfigError, Denied, Keyed, Limiter};

// The mode lives in a std atomic rather than `crate::sync`'s: the Redis module is not
// model-checked under loom (it is async and talks to a server), and the word is a flag, not
// a CAS protocol over limiter state.
const REDIS: u8 = 0;
const FALLBACK: u8 = 1;

/// The default per-call timeout of [`Fallback`].
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// The default interval of [`Fallback`]'s health-check `PING`s (go-zero's `pingInterval`).
pub(crate) const DEFAULT_PING_EVERY: Duration = Duration::from_millis(100);

/// The default bound on [`Fallback`]'s local map ([`FallbackBuilder::max_keys`]); see the
/// [module docs](self#the-local-maps-bound) for the memory it implies.
pub(crate) const DEFAULT_MAX_LOCAL_KEYS: u64 = 100_000;

/// Where a [`Fallback`]'s answers come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// From Redis, through the wrapped limiter: the fleet's one limit.
    Redis,
    /// From this process's local limiters, while Redis is unreachable.
    Fallback,
}

/// What a [`Fallback`] has done so far: [`Fallback::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FallbackStats {
    /// How many times the limiter has switched from Redis to fallback mode.
    pub switches_to_fallback: u64,
    /// How many times it has switched back from fallback to Redis mode.
    pub switches_to_redis: u64,
    /// When the mode last changed (either way); `None` if it never has.
    pub last_switch: Option<Instant>,
    /// How many checks Redis answered with a misconfiguration
    /// ([`RedisLimitError::is_misconfiguration`]), each answered in process (and logged, at
    /// most once a second).
    pub misconfigurations: u64,
}

/// A [`RedisLimiter`] that answers from in-process limiters while Redis is unreachable, and
/// goes back to Redis as soon as it answers `PING` again. See the [module docs](self) for
/// what the caller sees in each mode and the error bound in fallback mode.
///
/// Cloning is cheap and shares everything: the mode, the local limiters and the wrapped
/// limiter.
pub struct Fallback<L>
where
    L: RedisLimiter + 'static,
{
    inner: Arc<Inner<L>>,
}

struct Inner<L>
where
    L: RedisLimiter + 'static,
{
    mode: AtomicU8,
    limiter: Arc<L>,
    local: Arc<Keyed<String, L::Local>>,
    /// Whether the local map's sweeper thread runs (started by the first local answer).
    sweeping: AtomicBool,
    misconfigured: ErrorLog,
    timeout: Duration,
    ping_every: Duration,
    share: f64,
    to_fallback: AtomicU64,
    to_redis: AtomicU64,
    // The two mutexes below are off the hot path: a check reads only `mode` (one atomic
    // load); they are taken only by the one call that wins the switch's CAS, by the health
    // check when it switches back, and by `stats()` and drop, so a handful of times per
    // outage, never per check.
    /// When the mode last changed.
    last_switch: Mutex<Option<Instant>>, // off the hot path: taken on a mode switch only
    /// The running health check, aborted when the last handle goes.
    monitor: Mutex<Option<tokio::task::AbortHandle>>, // off the hot path: switch and drop only
}

impl<L: RedisLimiter + 'static> Drop for Inner<L> {
    fn drop(&mut self) {
        let handle = match self.monitor.get_mut() {
            Ok(m) => m.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(h) = handle {
            h.abort();
        }
    }
}

impl<L: RedisLimiter + 'static> Clone for Fallback<L> {
    fn clone(&self) -> Self {
        Fallback {
            inner: self.inner.clone(),
        }
    }
}

impl<L: RedisLimiter + 'static> std::fmt::Debug for Fallback<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fallback")
            .field("mode", &self.mode())
            .field("timeout", &self.inner.timeout)
            .field("ping_every", &self.inner.ping_every)
            .field("share", &self.inner.share)
            .field("stats", &self.stats())
            .field("local_keys", &self.inner.local.len())
            .finish_non_exhaustive()
    }
}

impl<L: RedisLimiter + 'static> Fallback<L> {
    /// Wraps `limiter` with the defaults: a 100 ms timeout per call, a `PING` every 100 ms
    /// while in fallback, a share of 1 (each process in fallback admits the whole limit) and
    /// at most 100 000 local keys.
    pub fn new(limiter: L) -> Fallback<L> {
        Fallback::builder(limiter)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// A builder, for the timeout, the share, the ping interval and the local map's bound.
    pub fn builder(limiter: L) -> FallbackBuilder<L> {
        FallbackBuilder {
            limiter,
            timeout: DEFAULT_TIMEOUT,
            ping_every: DEFAULT_PING_EVERY,
            share: 1.0,
            max_keys: DEFAULT_MAX_LOCAL_KEYS,
            invalid: None,
        }
    }

    /// One permit for `key`: [`Fallback::check_n`] with `n = 1`.
    pub async fn check(&self, key: &str) -> Result<Result<(), Denied>, RedisLimitError> {
        self.check_n(key, 1).await
    }

    /// Takes `n` permits for `key`: from Redis through the wrapped limiter (within the
    /// timeout), or from the key's local limiter while Redis cannot serve (or answers a
    /// misconfiguration). The outer error is only ever bad input (see the
    /// [module docs](self)); the inner `Err` is a denial with its retry time.
    pub async fn check_n(&self, key: &str, n: u32) -> Result<Result<(), Denied>, RedisLimitError> {
        self.answer(
            key,
            || self.inner.limiter.try_check_n(key, n),
            |local| local.check_n(key, n),
        )
        .await
    }

    /// [`Fallback::check_n`] with the key's [`QuotaStatus`](crate::QuotaStatus) after the check
    /// ([`RedisLimiter::try_check_n_status`]): while Redis answers, the wrapped limiter's
    /// (`None` if it cannot say); in fallback mode, the key's local limiter's
    /// [`Limiter::quota_at`], read in the same visit to that limiter as the check and at the
    /// same clock reading: the numbers the in-process tower policy `per_key` over the same
    /// limiters would show. `None` there only if the local limiter cannot say, or the local
    /// map is full ([`FallbackBuilder::max_keys`]) and the key new.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::redis::{Fallback, RedisLimitError, RedisLimiter};
    /// use turnstile::{Denied, FixedWindow};
    ///
    /// struct Unreachable;
    ///
    /// impl RedisLimiter for Unreachable {
    ///     type Local = FixedWindow;
    ///     fn local(&self, share: f64) -> FixedWindow {
    ///         FixedWindow::new((10.0 * share).ceil() as u32, Duration::from_secs(60)).unwrap()
    ///     }
    ///     async fn ping(&self) -> Result<(), RedisLimitError> {
    ///         Err(RedisLimitError::Timeout(Duration::ZERO))
    ///     }
    ///     async fn try_check_n(&self, _: &str, _: u32) -> Result<Result<(), Denied>, RedisLimitError> {
    ///         Err(RedisLimitError::Timeout(Duration::ZERO))
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Fallback::builder(Unreachable).fleet_size(2).build().unwrap();
    /// let answer = limiter.check_n_status("client-42", 2).await.unwrap();
    /// assert!(answer.result.is_ok());
    /// // The local window: half of the 10 a minute, 2 of them taken.
    /// let status = answer.status.unwrap();
    /// assert_eq!((status.quota, status.remaining), (5, 3));
    /// assert_eq!((status.window_secs(), status.reset_secs()), (60, 60));
    /// # }
    /// ```
    pub async fn check_n_status(
        &self,
        key: &str,
        n: u32,
    ) -> Result<super::StatusVerdict, RedisLimitError> {
        self.answer(
            key,
            || self.inner.limiter.try_check_n_status(key, n),
            |local| {
                let now = local.clock().now();
                // One visit to the key's limiter for the permits and the status (as the
                // in-process per-key policy reads them), at one reading, which also dates a
                // new key's limiter; a full map with a new key is answered as `check_n`
                // answers it, with nothing to report.
                local
                    .with_at(key, now, |l| super::StatusVerdict {
                        result: l.check_n_at(now, n),
                        status: l.quota_at(now),
                    })
                    .unwrap_or_else(|| super::StatusVerdict {
                        result: local.check_n_at(key, now, n),
                        status: None,
                    })
            },
        )
        .await
    }

    /// What [`Fallback::check_n`] and [`Fallback::check_n_status`] share: `redis()` within
    /// the timeout while in Redis mode (its answer returned unless it is an outage, which
    /// switches to fallback mode, or a misconfiguration, logged), else `local()` on the
    /// local map.
    async fn answer<T, F>(
        &self,
        key: &str,
        redis: impl FnOnce() -> F,
        local: impl FnOnce(&Keyed<String, L::Local>) -> T,
    ) -> Result<T, RedisLimitError>
    where
        F: std::future::Future<Output = Result<T, RedisLimitError>>,
    {
        let inner = &*self.inner;
        if inner.mode.load(Ordering::Acquire) == REDIS {
            match tokio::time::timeout(inner.timeout, redis()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) if e.is_outage() => self.switch_to_fallback(&e),
                Ok(Err(e)) if e.is_misconfiguration() => inner
                    .misconfigured
                    .report(&e, "the fallback's local limiter"),
                Ok(Err(e)) => return Err(e),
                Err(_elapsed) => self.switch_to_fallback(&RedisLimitError::Timeout(inner.timeout)),
            }
        }
        super::check_key(key, inner.limiter.max_key_len())?;
        if !inner.sweeping.load(Ordering::Relaxed) {
            self.start_sweeper();
        }
        Ok(local(&inner.local))
    }

    /// Where answers come from now.
    pub fn mode(&self) -> Mode {
        if self.inner.mode.load(Ordering::Acquire) == REDIS {
            Mode::Redis
        } else {
            Mode::Fallback
        }
    }

    /// What this limiter has done so far: its mode switches, when it last switched and the
    /// misconfigurations it answered in process. A snapshot: each field is read once,
    /// separately, so a switch racing the call may show in one field and not yet in another.
    ///
    /// With [`Fallback::mode`], what a health endpoint reports: "in fallback since".
    pub fn stats(&self) -> FallbackStats {
        FallbackStats {
            switches_to_fallback: self.inner.to_fallback.load(Ordering::Relaxed),
            switches_to_redis: self.inner.to_redis.load(Ordering::Relaxed),
            last_switch: *self
                .inner
                .last_switch
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            misconfigurations: self.inner.misconfigured.total(),
        }
    }

    /// The wrapped Redis limiter.
    pub fn limiter(&self) -> &L {
        &self.inner.limiter
    }

    /// The local limiters, one per key that was checked in fallback mode: for
    /// [`Keyed::len`], [`Keyed::evict_idle`] or a key's limiter ([`Keyed::with`]).
    pub fn local(&self) -> &Keyed<String, L::Local> {
        &self.inner.local
    }

    /// The per-call timeout (100 ms unless set with [`FallbackBuilder::timeout`]).
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The share of the limit each local limiter gets.
    pub fn share(&self) -> f64 {
        self.inner.share
    }

    /// Starts the local map's sweeper thread, once.
    #[cold]
    fn start_sweeper(&self) {
        if !self.inner.sweeping.swap(true, Ordering::Relaxed) {
            // Detached: it holds the map weakly and ends soon after the limiter is dropped.
            drop(self.inner.local.spawn_sweeper());
        }
    }

    /// Moves to fallback mode after `e`, unless another call already did; the call that
    /// moves it starts the health check.
    #[cold]
    fn switch_to_fallback(&self, e: &RedisLimitError) {
        let inner = &*self.inner;
        if inner
            .mode
            .compare_exchange(REDIS, FALLBACK, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        inner.to_fallback.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        *inner.last_switch.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
        tracing::warn!(
            error = %e,
            timeout = ?inner.timeout,
            share = inner.share,
            "turnstile: Redis unreachable; answering rate-limit checks in process until it answers PING"
        );
        let task = tokio::spawn(monitor(Arc::downgrade(&self.inner), now));
        let mut slot = inner.monitor.lock().unwrap_or_else(|p| p.into_inner());
        // Any previous task has switched back (only a task leaves fallback mode) and ends. In
        // a race with a task that ends and a new switch, this may keep the older handle: the
        // abort is only a prompt stop on drop; the weak reference is what ends every task.
        *slot = Some(task.abort_handle());
    }
}

/// A [`Fallback`] is a Redis limiter itself, so what takes any Redis limiter
/// ([`Blocking`](super::Blocking), for one) takes it too: its checks are
/// [`Fallback::check_n`]'s (never a Redis error), its `PING` is the wrapped limiter's
/// within the timeout, and its local limiter is the wrapped limiter's.
impl<L: RedisLimiter + 'static> RedisLimiter for Fallback<L> {
    type Local = L::Local;

    /// Its own [`Fallback::mode`] and [`Fallback::stats`].
    fn fallback_state(&self) -> Option<(Mode, FallbackStats)> {
        Some((self.mode(), self.stats()))
    }

    /// The wrapped limiter's.
    fn coalesce_stats(&self) -> Option<super::CoalesceStats> {
        self.inner.limiter.coalesce_stats()
    }

    /// The wrapped limiter's [`RedisLimiter::local`].
    fn local(&self, share: f64) -> L::Local {
        self.inner.limiter.local(share)
    }

    /// The wrapped limiter's [`RedisLimiter::ping`], within the per-call timeout
    /// ([`RedisLimitError::Timeout`] past it). It does not change the mode: only the health
    /// check switches back to Redis.
    async fn ping(&self) -> Result<(), RedisLimitError> {
        let timeout = self.inner.timeout;
        match tokio::time::timeout(timeout, self.inner.limiter.ping()).await {
            Ok(answer) => answer,
            Err(_elapsed) => Err(RedisLimitError::Timeout(timeout)),
        }
    }

    /// The wrapped limiter's.
    fn max_key_len(&self) -> usize {
        self.inner.limiter.max_key_len()
    }

    /// [`Fallback::check_n`].
    async fn try_check_n(&self, key: &str, n: u32) -> Result<Result<(), Denied>, RedisLimitError> {
        self.check_n(key, n).await
    }

    /// [`Fallback::check_n_status`].
    async fn try_check_n_status(
        &self,
        key: &str,
        n: u32,
    ) -> Result<super::StatusVerdict, RedisLimitError> {
        self.check_n_status(key, n).await
    }
}

/// The health check: a `PING` every `ping_every`, each within the timeout, until one
/// answers; then back to Redis mode. Ends early when the limiter is dropped.
async fn monitor<L: RedisLimiter + 'static>(weak: Weak<Inner<L>>, since: Instant) {
    let Some(every) = weak.upgrade().map(|i| i.ping_every) else {
        return;
    };
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        if let Ok(Ok(())) = tokio::time::timeout(inner.timeout, inner.limiter.ping()).await {
            inner.to_redis.fetch_add(1, Ordering::Relaxed);
            *inner.last_switch.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            inner.mode.store(REDIS, Ordering::Release);
            tracing::info!(
                outage = ?since.elapsed(),
                "turnstile: Redis answers PING again; rate-limit checks go to Redis"
            );
            return;
        }
    }
}

/// Configures a [`Fallback`]: [`Fallback::builder`].
#[must_use = "a builder does nothing until .build()"]
pub struct FallbackBuilder<L>
where
    L: RedisLimiter + 'static,
{
    limiter: L,
    timeout: Duration,
    ping_every: Duration,
    share: f64,
    max_keys: u64,
    /// The first invalid setting, returned by `build` (a typed error, never a panic).
    invalid: Option<ConfigError>,
}

impl<L: RedisLimiter + 'static> std::fmt::Debug for FallbackBuilder<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FallbackBuilder")
            .field("timeout", &self.timeout)
            .field("ping_every", &self.ping_every)
            .field("share", &self.share)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl<L: RedisLimiter + 'static> FallbackBuilder<L> {
    /// The most a call waits for Redis (default 100 ms) before it is answered in process
    /// and the limiter switches to fallback mode; also bounds each health-check `PING`. Zero
    /// is refused by [`FallbackBuilder::build`] ([`ConfigError::ZeroTimeout`]): every call
    /// would time out.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        if timeout.is_zero() {
            self.refuse(ConfigError::ZeroTimeout);
        }
        self.timeout = timeout;
        self
    }

    /// The interval of the health-check `PING`s while in fallback mode (default 100 ms).
    /// Zero is refused by [`FallbackBuilder::build`] ([`ConfigError::ZeroTimeout`]).
    pub fn ping_every(mut self, every: Duration) -> Self {
        if every.is_zero() {
            self.refuse(ConfigError::ZeroTimeout);
        }
        self.ping_every = every;
        self
    }

    /// The share of the limit each process admits in fallback mode, in `(0, 1]` (default 1):
    /// `1 / fleet size` keeps a fleet in fallback near the one limit. Anything else (NaN
    /// included) is refused by [`FallbackBuilder::build`] ([`ConfigError::InvalidShare`]).
    pub fn share(mut self, share: f64) -> Self {
        if !(share > 0.0 && share <= 1.0) {
            self.refuse(ConfigError::InvalidShare(share));
        }
        self.share = share;
        self
    }

    /// The share for a fleet of `n` processes: `1 / n`. Zero is refused by
    /// [`FallbackBuilder::build`] ([`ConfigError::InvalidShare`]).
    pub fn fleet_size(self, n: u32) -> Self {
        self.share(if n == 0 {
            f64::INFINITY
        } else {
            1.0 / f64::from(n)
        })
    }

    /// Records the first invalid setting for `build` to return.
    fn refuse(&mut self, e: ConfigError) {
        self.invalid.get_or_insert(e);
    }

    /// The most keys the local map holds ([`crate::keyed::KeyedBuilder::max_keys`]; a new
    /// key that finds it full is denied with the next sweep's time): default 100 000 (the
    /// [module docs](self#the-local-maps-bound) give the memory it implies); `u64::MAX` for no
    /// bound.
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The limiter, in Redis mode.
    ///
    /// # Errors
    /// The first invalid setting: [`ConfigError::ZeroTimeout`], [`ConfigError::InvalidShare`],
    /// or [`ConfigError::ZeroMaxKeys`] for `max_keys(0)`.
    pub fn build(self) -> Result<Fallback<L>, ConfigError> {
        if let Some(e) = self.invalid {
            return Err(e);
        }
        let limiter = Arc::new(self.limiter);
        let share = self.share;
        let factory = {
            let limiter = limiter.clone();
            move |_: &String| limiter.local(share)
        };
        let local = Keyed::builder(factory).max_keys(self.max_keys).build()?;
        Ok(Fallback {
            inner: Arc::new(Inner {
                mode: AtomicU8::new(REDIS),
                limiter,
                local: Arc::new(local),
                sweeping: AtomicBool::new(false),
                misconfigured: ErrorLog::new(),
                timeout: self.timeout,
                ping_every: self.ping_every,
                share,
                to_fallback: AtomicU64::new(0),
                to_redis: AtomicU64::new(0),
                last_switch: Mutex::new(None), // built once, at construction
                monitor: Mutex::new(None),     // built once, at construction
            }),
        })
    }
}
