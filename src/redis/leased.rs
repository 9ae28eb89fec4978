//! [`Leased`]: a fleet-wide [`Gcra`] limit checked at in-process speed, from permits each
//! process leases ahead, with a stated bound.
//!
//! # How it works
//! * **Prepaid leases.** Each process holds, per key, a [`Lease`] of up to `k` permits taken
//!   from the key's bucket on Redis (the same key, value and GCRA as [`Gcra`]'s) by one script
//!   call that grants up to `k` at once. A check spends from the lease with one CAS, with no
//!   round trip.
//! * **Renewed in the background.** A grant that leaves the lease below half of `k` starts
//!   one renewal (a spawned task) that tops it up to `k`, all or nothing, so a hot key's
//!   checks do not wait for Redis in steady state. A check that finds the lease empty renews
//!   it in the foreground (one round trip, taking what the bucket has, up to `k`); checks that
//!   find a renewal in flight wait for it (at most the 250 ms deadline), unless the key was
//!   refused recently, when they are refused at once.
//! * **Adaptive `k`.** A key starts at `k = 1` (a cold key leases one permit per check: a
//!   plain `Gcra` round trip). Each renewal doubles `k` when the previous lease lasted less
//!   than the horizon ([`LeasedBuilder::horizon`], 50 ms), halves it when it lasted more than
//!   four, up to [`LeasedBuilder::max_lease`] (an eighth of the burst by default).
//! * **Refused until.** When Redis refuses a lease (a check's, because the bucket has no
//!   permit for it; a background top-up's, because it has fewer than `k`), the script's
//!   answer says when `k` permits will be there; once the lease is spent, checks of the key
//!   are refused in process until then, without a round trip (as Envoy's ratelimit service
//!   caches keys over the limit), and the process then leases `k` at once. A flood on one
//!   key costs Redis a few calls per `k` permits per process. The price is the bound's
//!   under-admission: a process may wait for `k` while fewer are in the bucket.
//! * **Returned.** A key unused for [`LeasedBuilder::idle_after`] (1 s) hands its unspent
//!   permits back (`tat -= r × T`, not below now); so does [`Leased::release`], and dropping
//!   the limiter inside a tokio runtime.
//!
//! # The bounds
//! Every permit a check is granted was taken from the fleet's bucket before. So, with `N`
//! processes each holding at most `k` (`max_lease`, or the `n` of a larger check) unspent:
//! * **never over the budget:** since the first check, the fleet admits at most the budget a
//!   single [`Gcra`] would (`burst + limit × elapsed`);
//! * **over any span `[a, b]`:** at most `burst + limit × (b − a)` plus the leased permits
//!   still unspent at `a`, at most `N × k`;
//! * **under-admission:** while every process is saturated (more checks than permits), the
//!   permits the fleet has not admitted are at most those held unspent in leases and those a
//!   refused process waits to lease at once, together at most `N × k`.
//!
//! A handed-back permit re-enters the bucket as if never leased, or is dropped if the bucket
//! refilled past it meanwhile, so returns never raise the first two bounds. A Redis restart
//! without persistence empties every key (a full bucket), as for [`Gcra`]: over a span
//! containing it the fleet may admit one more burst, besides the leases it held.
//!
//! # Failures
//! A check the lease answers needs no Redis. One that needs a round trip (an empty lease)
//! returns Redis's error, so under a [`Fallback`](super::Fallback) the fleet falls back as
//! with [`Gcra`], after spending the permits it already held; a background renewal that
//! fails is retried no sooner than 100 ms later, and its error is counted
//! ([`LeaseStats::errors`]). A lease call cancelled by a timeout loses its permits (an
//! under-admission), never a claim: the key's next check renews.
//!
//! # Headers
//! A check's answer carries no [`QuotaStatus`](crate::QuotaStatus)
//! ([`RedisLimiter::try_check_n_status`] answers `None`): what is left of the fleet's bucket
//! is not known in process, so the tower policy `fleet` over a `Leased` sends no `RateLimit`
//! fields, only `Retry-After` on a refusal.
//!
//! # Time
//! On the server's `TIME` by default, like [`Gcra`]: the process's clock
//! ([`LeasedBuilder::clock`], quanta's) only dates refusals and idleness. A manual clock makes
//! the scripts run at its time instead, for tests and simulations, where every client of a
//! key must share that clock, and the keys it writes get no TTL (Redis expires keys on its
//! own clock).
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use turnstile::redis::{Gcra, Leased, RedisLimiter};
//! use turnstile::Limit;
//!
//! let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
//! // 10 000 requests per second per tenant across the fleet, bursts of 2 000; each process
//! // leases at most 250 at a time.
//! let per_tenant = Gcra::new(con, Limit::per_second(10_000.0)?, 2_000)?;
//! let limiter = Leased::builder(per_tenant).max_lease(250).build()?;
//! if let Err(denied) = limiter.try_check_n("acme", 1).await? {
//!     println!("Retry-After: {}", denied.retry_after_secs().unwrap());
//! }
//! // On shutdown, hand back what this process holds.
//! limiter.release().await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::aio::ConnectionLike;
use tokio::sync::Notify;

use super::gcra::Gcra;
use super::{Connection, RedisLimitError, RedisLimiter, DEFAULT_DEADLINE};
use crate::lease::{Lease, Spend};
use crate::{Clock, ConfigError, Denied, Idle, Keyed, Limiter, Nanos, QuantaClock};

/// How long after a failed background renewal the next one may start.
const ERROR_QUIET: Duration = Duration::from_millis(100);

/// A [`Gcra`] limit spent from per-process leases (see the [module docs](self) for the
/// protocol and its bounds).
///
/// Cheap to clone (an `Arc`); calls take `&self`.
pub struct Leased<C = Connection, K: Clock = QuantaClock>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    inner: Arc<Inner<C, K>>,
}

impl<C, K> Clone for Leased<C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    fn clone(&self) -> Self {
        Leased {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<C, K: Clock + Clone + 'static>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    gcra: Gcra<C>,
    leases: Keyed<String, Entry, K>,
    clock: K,
    /// Pass the clock's time to the scripts (a manual clock) instead of the server's.
    manual_time: bool,
    max_lease: u32,
    horizon: Duration,
    idle_after: Duration,
    /// Woken when a renewal ends, for the checks waiting on one.
    renewed: Notify,
    /// The last lease call's round trip, ns: how long a check refused during a renewal
    /// should wait.
    last_rtt: AtomicU64,
    reaper_started: AtomicBool,
    stats: Counters,
}

/// One key's lease and what adapts its size.
struct Entry {
    key: Box<str>,
    lease: Lease,
    /// The lease size `k` the next renewal aims for.
    k: AtomicU32,
    /// When the last granted lease arrived (ns; 0 before the first).
    leased_at: AtomicU64,
    /// No background renewal before this (ns): set after one failed.
    quiet_until: AtomicU64,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    leased: AtomicU64,
    refused: AtomicU64,
    returned: AtomicU64,
    errors: AtomicU64,
}

/// What a [`Leased`] has done since it was built ([`Leased::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Lease and give-back script calls sent to Redis.
    pub redis_calls: u64,
    /// Permits leased from Redis.
    pub leased: u64,
    /// Lease calls Redis refused (each then answers the key's checks in process until the
    /// refusal ends).
    pub refused: u64,
    /// Permits handed back.
    pub returned: u64,
    /// Lease or give-back calls that failed.
    pub errors: u64,
    /// Permits held unspent in this process now.
    pub held: u64,
}

/// Builds a [`Leased`]: [`Leased::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct LeasedBuilder<C, K = QuantaClock> {
    gcra: Gcra<C>,
    clock: K,
    max_lease: Option<u32>,
    horizon: Duration,
    idle_after: Duration,
    max_keys: u64,
}

impl<C> Leased<C, QuantaClock>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A builder over `gcra`: its key prefix, limit and burst are the fleet's bucket.
    pub fn builder(gcra: Gcra<C>) -> LeasedBuilder<C, QuantaClock> {
        LeasedBuilder {
            gcra,
            clock: QuantaClock::new(),
            max_lease: None,
            horizon: Duration::from_millis(50),
            idle_after: Duration::from_secs(1),
            max_keys: 100_000,
        }
    }
}

impl<C, K> LeasedBuilder<C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    /// The most permits a process leases for one key at once, `k` (default: an eighth of
    /// the burst, at least 1): the bounds' `N × k`. At most the burst.
    pub fn max_lease(mut self, k: u32) -> Self {
        self.max_lease = Some(k);
        self
    }

    /// How long a lease should last at the key's local rate (default 50 ms): `k` doubles
    /// while leases run out sooner, halves when they last four times longer.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = horizon;
        self
    }

    /// A key whose lease granted nothing for this long hands its permits back (default 1 s).
    pub fn idle_after(mut self, idle: Duration) -> Self {
        self.idle_after = idle;
        self
    }

    /// The most keys holding a lease in this process (default 100 000): a key beyond it is
    /// checked with a plain round trip (a lease of exactly its permits), so a key flood costs
    /// no memory past the bound.
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The process's clock. A [`ManualClock`](crate::ManualClock) also becomes the scripts'
    /// time, replacing the server's `TIME` (for tests and simulations: every client of a key
    /// must then share the clock).
    pub fn clock<D: Clock + Clone + 'static>(self, clock: D) -> LeasedBuilder<C, D> {
        LeasedBuilder {
            gcra: self.gcra,
            clock,
            max_lease: self.max_lease,
            horizon: self.horizon,
            idle_after: self.idle_after,
            max_keys: self.max_keys,
        }
    }

    /// The limiter.
    ///
    /// # Errors
    /// [`ConfigError::ZeroCapacity`] for a zero `max_lease`, [`ConfigError::LeaseExceedsBurst`]
    /// for one above the burst, [`ConfigError::ZeroMaxKeys`] for zero keys,
    /// [`ConfigError::ZeroPeriod`] for a zero horizon or idle time.
    pub fn build(self) -> Result<Leased<C, K>, ConfigError> {
        let burst = self.gcra.burst();
        let max_lease = self.max_lease.unwrap_or((burst / 8).max(1));
        if max_lease == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        if max_lease > burst {
            return Err(ConfigError::LeaseExceedsBurst {
                lease: max_lease,
                burst,
            });
        }
        if self.horizon.is_zero() || self.idle_after.is_zero() {
            return Err(ConfigError::ZeroPeriod);
        }
        let leases = Keyed::builder(|key: &String| Entry::new(key))
            .max_keys(self.max_keys)
            .clock(self.clock.clone())
            .build()?;
        Ok(Leased {
            inner: Arc::new(Inner {
                gcra: self.gcra,
                leases,
                manual_time: (&self.clock as &dyn std::any::Any).is::<crate::ManualClock>(),
                clock: self.clock,
                max_lease,
                horizon: self.horizon,
                idle_after: self.idle_after,
                renewed: Notify::new(),
                last_rtt: AtomicU64::new(0),
                reaper_started: AtomicBool::new(false),
                stats: Counters::default(),
            }),
        })
    }
}

impl<C, K> Leased<C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    /// Takes `n` permits for `key`: from this process's lease when it holds them (no round
    /// trip), else from Redis (see the [module docs](self)).
    ///
    /// # Errors
    /// Bad input, before anything else: [`RedisLimitError::EmptyKey`],
    /// [`RedisLimitError::KeyTooLong`], [`RedisLimitError::ExceedsBurst`]. Redis's own
    /// errors when the lease could not answer; [`RedisLimitError::Timeout`] when a renewal
    /// this check waited for did not end within the 250 ms deadline.
    pub async fn check_n(&self, key: &str, n: u32) -> Result<Result<(), Denied>, RedisLimitError> {
        let inner = &self.inner;
        inner.gcra.validate(key, n)?;
        if n == 0 || inner.gcra.t == 0 {
            return Ok(Ok(())); // a peek, or Limit::INF
        }
        loop {
            let now = inner.clock.now();
            let step = inner.leases.with_at(key, now, |e| {
                e.lease.try_spend_at(now, n, e.renew_below(now))
            });
            match step {
                Some(Spend::Granted { claimed, .. }) => {
                    if claimed {
                        self.renew_in_background(key, now);
                    }
                    return Ok(Ok(()));
                }
                Some(Spend::Refused(denied)) => return Ok(Err(denied)),
                Some(Spend::Short { claimed: true }) => return self.renew_for(key, n, now).await,
                Some(Spend::Short { claimed: false }) => {
                    if let Some(denied) = self.wait_for_renewal(key, now).await? {
                        return Ok(Err(denied));
                    }
                }
                None => return inner.direct(key, n, now).await,
            }
        }
    }

    /// Hands every permit this process holds back to Redis now, and answers how many: for a
    /// graceful shutdown, once no more checks run (dropping the limiter inside a tokio
    /// runtime does the same in the background). A renewal still in flight deposits its
    /// permits after this call, to be handed back by the next one or by the drop.
    ///
    /// # Errors
    /// The first Redis error; the permits of the keys after it are handed back all the same
    /// where Redis answers.
    pub async fn release(&self) -> Result<u64, RedisLimitError> {
        let taken = self.inner.take_all(|_| true);
        let mut first = None;
        let mut total = 0;
        for (key, r) in taken {
            match self.inner.give_back(&key, r).await {
                Ok(()) => total += u64::from(r),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(total), Err)
    }

    /// What the limiter has done so far, and the permits it holds.
    pub fn stats(&self) -> LeaseStats {
        let s = &self.inner.stats;
        let mut held = 0;
        self.inner
            .leases
            .for_each(|e| held += u64::from(e.lease.held()));
        LeaseStats {
            redis_calls: s.calls.load(Ordering::Relaxed),
            leased: s.leased.load(Ordering::Relaxed),
            refused: s.refused.load(Ordering::Relaxed),
            returned: s.returned.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
            held,
        }
    }

    /// Renewals in flight now (background ones included): zero once every lease call this
    /// limiter started has ended.
    pub fn renewals_in_flight(&self) -> usize {
        let mut n = 0;
        self.inner
            .leases
            .for_each(|e| n += usize::from(e.lease.is_renewing()));
        n
    }

    /// The [`Gcra`] whose bucket the leases come from.
    pub fn gcra(&self) -> &Gcra<C> {
        &self.inner.gcra
    }

    /// The most permits a process leases for one key at once.
    pub fn max_lease(&self) -> u32 {
        self.inner.max_lease
    }

    /// The renewal this check claimed, in the foreground: a lease of at least `n`, of which
    /// this check keeps `n`. The first one starts the reaper: only a renewal makes a lease
    /// hold permits.
    async fn renew_for(
        &self,
        key: &str,
        n: u32,
        now: Nanos,
    ) -> Result<Result<(), Denied>, RedisLimitError> {
        self.start_reaper();
        self.inner.renew(key, now, n, false).await
    }

    /// The renewal a grant claimed, in a spawned task (ended at once without a runtime).
    fn renew_in_background(&self, key: &str, now: Nanos) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            Claim::new(&self.inner, key).end(now, 0, false, None);
            return;
        };
        let inner = self.inner.clone();
        let key = key.to_owned();
        runtime.spawn(async move {
            let _ = inner.renew(&key, now, 1, true).await;
        });
    }

    /// Another check's renewal of `key` is in flight. A key refused recently is saturated:
    /// refused at once, to retry when a renewal usually ends (whatever it brings, later
    /// checks spend it). Otherwise waits for the renewal to end (`None`: check again).
    async fn wait_for_renewal(
        &self,
        key: &str,
        now: Nanos,
    ) -> Result<Option<Denied>, RedisLimitError> {
        let inner = &self.inner;
        let mut renewed = pin!(inner.renewed.notified());
        renewed.as_mut().enable();
        let state = inner.leases.with_at(key, now, |e| {
            let recent = e.lease.refused_until().saturating_add(inner.horizon) > now;
            (e.lease.is_renewing(), recent)
        });
        match state {
            Some((true, true)) => {
                let rtt = Duration::from_nanos(inner.last_rtt.load(Ordering::Relaxed));
                Ok(Some(Denied::new(now, Some(now.saturating_add(rtt)))))
            }
            Some((true, false)) => match tokio::time::timeout(DEFAULT_DEADLINE, renewed).await {
                Ok(()) => Ok(None),
                Err(_) => Err(RedisLimitError::Timeout(DEFAULT_DEADLINE)),
            },
            _ => Ok(None),
        }
    }

    /// The reaper: hands back the permits of keys idle for `idle_after`, every half of it,
    /// while the limiter lives (started by the first foreground renewal inside a runtime).
    fn start_reaper(&self) {
        if self.inner.reaper_started.load(Ordering::Relaxed)
            || self.inner.reaper_started.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.reaper_started.store(false, Ordering::Relaxed);
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let every = (self.inner.idle_after / 2).max(Duration::from_millis(1));
        runtime.spawn(reap(weak, every));
    }
}

/// The reaper's loop (see [`Leased::start_reaper`]).
async fn reap<C, K>(weak: Weak<Inner<C, K>>, every: Duration)
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = weak.upgrade() else { return };
        let now = inner.clock.now();
        let idle = inner.idle_after;
        // A key with a renewal in flight is in use, whatever its last grant says.
        let idle = |e: &Entry| !e.lease.is_renewing() && e.lease.unused_for(now, idle);
        for (key, r) in inner.take_all(idle) {
            let _ = inner.give_back(&key, r).await;
        }
    }
}

impl<C, K> Inner<C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    /// The scripts' time: the clock's, in µs, under a manual clock; else the server's.
    fn now_us(&self, now: Nanos) -> Option<u64> {
        self.manual_time.then_some(now.as_u64() / 1_000)
    }

    /// The renewal a claim on `key` holds, at `now`: leases up to what brings the lease to
    /// its `k` ([`Inner::plan`]) and deposits it, or records the refusal until `k` could be
    /// there, then ends the claim (whatever happens, a cancellation included: [`Claim`]).
    ///
    /// * A check's renewal (`background` false) needs the check's `n` permits and keeps
    ///   them: the answer is the check's verdict, refused until the refusal's end.
    /// * A background top-up is all or nothing: one that took what trickled in would cost a
    ///   round trip per few permits on a saturated key. Refused, the key is saturated: once
    ///   the lease is spent, its checks are refused until `k` could be there. After an
    ///   error, no background renewal for 100 ms (an empty lease asks in the foreground).
    async fn renew(
        &self,
        key: &str,
        now: Nanos,
        n: u32,
        background: bool,
    ) -> Result<Result<(), Denied>, RedisLimitError> {
        let mut claim = Claim::new(self, key);
        let want = self.plan(key, now, n);
        let (need, keep) = if background { (want, 0) } else { (n, n) };
        let reply = self.lease(key, need, want, now).await;
        let after = self.clock.now();
        match reply {
            // The script grants `need` or more, or nothing.
            Ok(r) if r.granted > 0 => {
                claim.end(after, r.granted - keep, true, None);
                Ok(Ok(()))
            }
            Ok(r) => {
                // Asked again no sooner than then, so that is the denial's retry time too.
                let until = after.saturating_add(r.retry_after(want));
                claim.end(after, 0, false, Some(until));
                Ok(Err(Denied::new(after, Some(until))))
            }
            Err(e) => {
                if background {
                    self.leases.with_at(key, after, |e| {
                        let quiet = after.saturating_add(ERROR_QUIET).as_u64();
                        e.quiet_until.store(quiet, Ordering::Relaxed);
                    });
                }
                claim.end(after, 0, false, None);
                Err(e)
            }
        }
    }

    /// One lease call, counted and timed.
    async fn lease(
        &self,
        key: &str,
        need: u32,
        want: u32,
        now: Nanos,
    ) -> Result<super::gcra_lease::LeaseReply, RedisLimitError> {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let sent = std::time::Instant::now();
        let reply = self.gcra.lease_at(key, need, want, self.now_us(now)).await;
        let rtt = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_rtt.store(rtt, Ordering::Relaxed);
        match &reply {
            Ok(r) if r.granted > 0 => {
                self.stats
                    .leased
                    .fetch_add(u64::from(r.granted), Ordering::Relaxed);
            }
            Ok(_) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        reply
    }

    /// A check of a key the map has no room for: a lease of exactly `n`, spent at once.
    async fn direct(
        &self,
        key: &str,
        n: u32,
        now: Nanos,
    ) -> Result<Result<(), Denied>, RedisLimitError> {
        let r = self.lease(key, n, n, now).await?;
        let after = self.clock.now();
        if r.granted >= n {
            Ok(Ok(()))
        } else {
            Ok(Err(Denied::new(
                after,
                Some(after.saturating_add(r.retry_after(n))),
            )))
        }
    }

    /// Hands `r` permits of `key` back, counted.
    async fn give_back(&self, key: &str, r: u32) -> Result<(), RedisLimitError> {
        self.stats.calls.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        let result = self.gcra.give_back_at(key, r, self.now_us(now)).await;
        match &result {
            Ok(()) => self
                .stats
                .returned
                .fetch_add(u64::from(r), Ordering::Relaxed),
            Err(_) => self.stats.errors.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    /// Takes the permits of every lease `pick` chooses: what a give-back then sends. A
    /// renewal in flight keeps its claim; its permits arrive after.
    fn take_all(&self, pick: impl Fn(&Entry) -> bool) -> Vec<(Box<str>, u32)> {
        let mut taken = Vec::new();
        self.leases.for_each(|e| {
            if pick(e) {
                let r = e.lease.take_all();
                if r > 0 {
                    taken.push((e.key.clone(), r));
                }
            }
        });
        taken
    }

    /// The claimant's plan: adapts `key`'s `k` to how long its last lease lasted, and answers
    /// how many to ask for (at least `n`, and enough to bring the lease to `k`).
    fn plan(&self, key: &str, now: Nanos, n: u32) -> u32 {
        let want = self.leases.with_at(key, now, |e| {
            let k = e.k.load(Ordering::Relaxed);
            let at = e.leased_at.load(Ordering::Relaxed);
            let lasted = now.saturating_duration_since(Nanos::new(at));
            let k = if at != 0 && lasted < self.horizon {
                k.saturating_mul(2).min(self.max_lease)
            } else if lasted > self.horizon * 4 {
                (k / 2).max(1)
            } else {
                k
            };
            e.k.store(k, Ordering::Relaxed);
            k.saturating_sub(e.lease.held()).max(n)
        });
        want.unwrap_or(n).min(self.gcra.burst())
    }
}

impl<C, K> Drop for Inner<C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    /// Hands every held permit back, in a task on the current runtime (none: they are lost,
    /// an under-admission).
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let taken = self.take_all(|_| true);
        if taken.is_empty() {
            return;
        }
        let gcra = self.gcra.clone();
        let now_us = self.now_us(self.clock.now());
        runtime.spawn(async move {
            for (key, r) in taken {
                let _ = gcra.give_back_at(&key, r, now_us).await;
            }
        });
    }
}

/// A renewal claim: ended exactly once, by [`Claim::end`] or, if the check's future is
/// dropped first (a caller's timeout), by its drop, with nothing deposited (what the call
/// would have leased is lost: an under-admission, never a claim left held).
struct Claim<'a, C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    inner: &'a Inner<C, K>,
    key: &'a str,
    open: bool,
}

impl<'a, C, K> Claim<'a, C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    fn new(inner: &'a Inner<C, K>, key: &'a str) -> Self {
        Claim {
            inner,
            key,
            open: true,
        }
    }

    /// Deposits `permits` (`granted`: a lease arrived, for the adaptation), records a
    /// refusal, releases the claim and wakes the waiting checks.
    fn end(&mut self, now: Nanos, permits: u32, granted: bool, refused_until: Option<Nanos>) {
        self.open = false;
        let ended = self.inner.leases.with_at(self.key, now, |e| {
            if granted {
                e.leased_at.store(now.as_u64().max(1), Ordering::Relaxed);
            }
            e.lease.end_renewal(permits, refused_until);
        });
        if ended.is_none() && permits > 0 {
            // No entry (the map is full and the claimed one is gone, which a claim prevents):
            // the permits are not spent, an under-admission.
            self.inner.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.renewed.notify_waiters();
    }
}

impl<C, K> Drop for Claim<'_, C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    fn drop(&mut self) {
        if self.open {
            let now = self.inner.clock.now();
            self.end(now, 0, false, None);
        }
    }
}

impl Entry {
    fn new(key: &str) -> Entry {
        Entry {
            key: key.into(),
            lease: Lease::new(),
            k: AtomicU32::new(1),
            leased_at: AtomicU64::new(0),
            quiet_until: AtomicU64::new(0),
        }
    }

    /// The low-water mark: a grant that leaves fewer than half of `k` renews in the
    /// background (never at `k = 1`, nor while quiet after an error).
    fn renew_below(&self, now: Nanos) -> u32 {
        if now.as_u64() < self.quiet_until.load(Ordering::Relaxed) {
            0
        } else {
            self.k.load(Ordering::Relaxed) / 2
        }
    }
}

/// The map's view of a lease: it checks nothing itself (the limiter spends through
/// [`Lease::try_spend_at`]); idle when a fresh one would be the same: nothing held, no
/// renewal in flight, no refusal in force.
impl Limiter for Entry {
    fn check_n_at(&self, now: Nanos, n: u32) -> Result<(), Denied> {
        match self.lease.try_spend_at(now, n, 0) {
            Spend::Granted { .. } => Ok(()),
            Spend::Refused(denied) => Err(denied),
            Spend::Short { claimed } => {
                if claimed {
                    self.lease.end_renewal(0, None);
                }
                Err(Denied::new(now, Some(now)))
            }
        }
    }

    fn now(&self) -> Nanos {
        QuantaClock::new().now()
    }
}

impl Idle for Entry {
    fn is_idle_at(&self, now: Nanos) -> bool {
        self.lease.held() == 0 && !self.lease.is_renewing() && self.lease.refused_until() <= now
    }

    fn born_at(&mut self, _: Nanos) {}
}

impl<C, K> RedisLimiter for Leased<C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    type Local = <Gcra<C> as RedisLimiter>::Local;

    /// [`Gcra`]'s: a token bucket at the limit times `share`.
    fn local(&self, share: f64) -> Self::Local {
        self.inner.gcra.local(share)
    }

    async fn ping(&self) -> Result<(), RedisLimitError> {
        self.inner.gcra.ping().await
    }

    fn max_key_len(&self) -> usize {
        self.inner.gcra.max_key_len()
    }

    async fn try_check_n(&self, key: &str, n: u32) -> Result<Result<(), Denied>, RedisLimitError> {
        self.check_n(key, n).await
    }
}

impl<C, K> fmt::Debug for Leased<C, K>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    K: Clock + Clone + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leased")
            .field("gcra", &self.inner.gcra)
            .field("max_lease", &self.inner.max_lease)
            .field("horizon", &self.inner.horizon)
            .field("idle_after", &self.inner.idle_after)
            .finish_non_exhaustive()
    }
}
