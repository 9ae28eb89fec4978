//! [`Coalesce`]: concurrent checks of one key in one process share one round trip.
//!
//! A busy key of a fleet limit is checked by many tasks of one process at once; each check is
//! a script call, and the server runs them one at a time. `Coalesce` sends the first check of
//! a key at once and queues the checks that arrive while it is in flight; when it returns,
//! the whole queue goes in **one** script call ([`RedisBatch::try_check_batch`]), and so on
//! while checks keep arriving. The idea is bucket4j's batching optimisation.
//!
//! # The error bound: none in the decisions, one call in the timing
//! A batch is not one request for the sum of its permits (which would deny all of them when
//! only some fit). The script takes the batch's requests **one after another at the same
//! instant** of the server's clock, each answered exactly as it would have been answered alone
//! at that instant: a denied request takes nothing, a later smaller one may still pass. So
//! coalescing admits neither more nor less than the same checks sent one by one in queue
//! order at the batch's instant: every limit bound holds unchanged (for [`Gcra`](super::Gcra):
//! granted ≤ `burst + limit × elapsed`), and a denial is never caused by a neighbour in the
//! batch asking for more. [`Gcra`](super::Gcra) and [`TokenBucket`](super::TokenBucket) run a
//! script that loops over the batch; [`FixedWindow`](super::FixedWindow), where every call
//! counts (go-zero's `PeriodLimit`), sends one `INCRBY` of the sum and classifies each request
//! on its own running count, which is what one-by-one calls would have counted. The one difference is *when* a check is decided: a check queued
//! behind a call in flight is sent when that call returns, so it is decided at most one call
//! later (one round trip plus the script's run) than it would have been alone, and it may see
//! up to that much more refill. `tests/redis_coalesce.rs` checks both: a forced batch of 200
//! checks decides exactly what the same requests decide one by one, and the shared-limit
//! bound holds under load; `tests/redis_coalesce_compat.rs` does the same for the go-zero
//! compatible limiters.
//!
//! # Cost
//! Under no contention a check is the inner limiter's own call plus two lookups of a
//! concurrent map (the key is held as a `String` while its call is in flight). A queued check
//! waits on a `tokio::sync::oneshot`; each batch after the first runs in a spawned task, so
//! a check whose future is dropped (a client gone, [`Fallback`](super::Fallback)'s timeout)
//! never strands the checks queued behind it. A check dropped while queued is left out of its
//! batch and takes nothing. `bench/examples/redis.rs` measures the checks per round trip.
//!
//! # Bounded: a deadline on every call, and on the queue
//! Every round trip a `Coalesce` sends (a check's own, and each batch) is bounded by a
//! deadline ([`CoalesceBuilder::deadline`], default 250 ms): past it the checks it carried
//! fail with [`RedisLimitError::Timeout`], so a stalled server holds no key for longer than
//! that. Checks waiting behind calls in flight are bounded too, over all keys
//! ([`CoalesceBuilder::max_queued`], default 16 384): a check that finds the bound reached is
//! answered at once with [`RedisLimitError::QueueFull`], an outage, which a
//! [`Fallback`](super::Fallback) (or the tower policy `fleet`) answers by its failure policy.
//! So what a stalled Redis and a flood of clients can hold is at most that many waiting checks
//! (each its queue entry and a oneshot channel, a few hundred bytes, plus its key while it
//! leads a call), however long the stall. A queued check waits at most one deadline for the
//! call ahead of it and one for its own batch; a call that ends in an outage answers the
//! checks queued behind it with the same error at once, rather than sending them to a server
//! that just failed.
//!
//! # No status
//! [`RedisLimiter::try_check_n_status`] keeps its default: a check, answered with no
//! [`QuotaStatus`](crate::QuotaStatus) (`None`), so the tower policy `fleet` over a
//! `Coalesce` sends no `RateLimit` fields for it. A batch's script answers verdicts
//! ([`RedisBatch::try_check_batch`]); a status per request would need each limiter's batch
//! reply turned into statuses as its single call's is, which this layer does not do yet.
//!
//! # Example
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use turnstile::redis::{Coalesce, Gcra, RedisLimiter};
//! use turnstile::Limit;
//!
//! let con = turnstile::redis::connect("redis://127.0.0.1:6380/").await?;
//! let api = Arc::new(Coalesce::new(Gcra::new(con, Limit::per_second(1000.0)?, 100)?));
//! let mut tasks = Vec::new();
//! for _ in 0..64 {
//!     let api = api.clone();
//!     tasks.push(tokio::spawn(async move { api.try_check_n("tenant-7", 1).await }));
//! }
//! for t in tasks {
//!     let _verdict = t.await??;
//! }
//! let s = api.stats();
//! println!("{} checks in {} round trips", s.checks, s.calls);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::mem;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tokio::sync::oneshot;

use std::time::Duration;

use super::{RedisLimitError, RedisLimiter, DEFAULT_DEADLINE};
use crate::{ConfigError, Denied};

/// A Redis limiter that can decide several requests of one key in one round trip.
pub trait RedisBatch: RedisLimiter {
    /// The bad-input check of [`RedisLimiter::try_check_n`], made before a request is queued,
    /// so that one bad request never fails a batch.
    fn validate(&self, key: &str, n: u32) -> Result<(), RedisLimitError>;

    /// Takes `ns[0]`, then `ns[1]`, … permits for `key` in one round trip, each decided as
    /// [`RedisLimiter::try_check_n`] would decide it alone at the instant the batch runs; one
    /// verdict per request, in order.
    fn try_check_batch(
        &self,
        key: &str,
        ns: &[u32],
    ) -> impl Future<Output = Result<Vec<Result<(), Denied>>, RedisLimitError>> + Send;
}

/// The most requests one batch carries; the rest wait for the next call.
pub(crate) const DEFAULT_MAX_BATCH: usize = 512;

/// The most checks that wait behind calls in flight, over all keys, by default: a few
/// megabytes at most, and more than a process checking tens of thousands of times a second
/// keeps waiting within one deadline.
pub(crate) const DEFAULT_MAX_QUEUED: usize = 16_384;

/// Concurrent checks of one key coalesced into one round trip (see the
/// [module docs](self)). Wraps any [`RedisBatch`] limiter ([`Gcra`](super::Gcra),
/// [`TokenBucket`](super::TokenBucket), [`FixedWindow`](super::FixedWindow)) and is a
/// [`RedisLimiter`] itself, so a [`Fallback`](super::Fallback) can wrap it in turn.
///
/// Cheap to share: clone it (an `Arc`) or put it in one.
pub struct Coalesce<L> {
    shared: Arc<Shared<L>>,
}

impl<L> Clone for Coalesce<L> {
    fn clone(&self) -> Self {
        Coalesce {
            shared: self.shared.clone(),
        }
    }
}

/// How much coalescing happened: [`Coalesce::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CoalesceStats {
    /// Checks answered (or failed) by a round trip.
    pub checks: u64,
    /// Round trips (script calls) sent.
    pub calls: u64,
    /// Checks waiting right now behind a call in flight.
    pub queued: u64,
}

type Verdict = Result<Result<(), Denied>, RedisLimitError>;

struct Waiter {
    n: u32,
    tx: oneshot::Sender<Verdict>,
}

struct Shared<L> {
    limiter: L,
    /// A key is present while a call for it is in flight; its value holds the checks that
    /// arrived since, for the next call.
    in_flight: scc::HashMap<String, Vec<Waiter>>,
    max_batch: usize,
    max_queued: usize,
    deadline: Duration,
    checks: AtomicU64,
    calls: AtomicU64,
    queued: AtomicU64,
}

/// Configures a [`Coalesce`]: [`Coalesce::builder`].
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use turnstile::redis::{Coalesce, Gcra};
/// use turnstile::Limit;
///
/// let con = turnstile::redis::connect("redis://127.0.0.1:6379/").await?;
/// let api = Coalesce::builder(Gcra::new(con, Limit::per_second(1000.0)?, 100)?)
///     .max_queued(1_000)
///     .deadline(Duration::from_millis(80))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until .build()"]
pub struct CoalesceBuilder<L> {
    limiter: L,
    max_batch: usize,
    max_queued: usize,
    deadline: Duration,
}

impl<L: RedisBatch + 'static> CoalesceBuilder<L> {
    /// The most requests one batch carries (default 512; 0 counts as 1); the rest wait for
    /// the next call.
    pub fn max_batch(mut self, max_batch: usize) -> Self {
        self.max_batch = max_batch.max(1);
        self
    }

    /// The most checks waiting behind calls in flight, over all keys (default 16 384); one
    /// more is [`RedisLimitError::QueueFull`] at once. 0 queues nothing: a check of a key
    /// with a call in flight is refused so. The default is a few megabytes at most, and more
    /// than a process checking tens of thousands of times a second keeps waiting within one
    /// deadline.
    pub fn max_queued(mut self, max_queued: usize) -> Self {
        self.max_queued = max_queued;
        self
    }

    /// The most any round trip (a check's own, a batch) may take (default 250 ms); past it its
    /// checks fail with [`RedisLimitError::Timeout`]. Zero is refused by
    /// [`CoalesceBuilder::build`].
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The limiter.
    ///
    /// # Errors
    /// [`ConfigError::ZeroTimeout`] for a zero deadline.
    pub fn build(self) -> Result<Coalesce<L>, ConfigError> {
        if self.deadline.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        Ok(Coalesce {
            shared: Arc::new(Shared {
                limiter: self.limiter,
                in_flight: scc::HashMap::new(),
                max_batch: self.max_batch,
                max_queued: self.max_queued,
                deadline: self.deadline,
                checks: AtomicU64::new(0),
                calls: AtomicU64::new(0),
                queued: AtomicU64::new(0),
            }),
        })
    }
}

impl<L: RedisBatch + 'static> Coalesce<L> {
    /// Coalesces `limiter`'s checks with the defaults: at most 512 per round trip, 16 384
    /// waiting, each call within 250 ms.
    pub fn new(limiter: L) -> Self {
        Coalesce::builder(limiter)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// A builder, for the batch size, the queue bound and the deadline.
    pub fn builder(limiter: L) -> CoalesceBuilder<L> {
        CoalesceBuilder {
            limiter,
            max_batch: DEFAULT_MAX_BATCH,
            max_queued: DEFAULT_MAX_QUEUED,
            deadline: DEFAULT_DEADLINE,
        }
    }

    /// The wrapped limiter.
    pub fn limiter(&self) -> &L {
        &self.shared.limiter
    }

    /// Checks and round trips so far, and checks queued now.
    pub fn stats(&self) -> CoalesceStats {
        CoalesceStats {
            checks: self.shared.checks.load(Relaxed),
            calls: self.shared.calls.load(Relaxed),
            queued: self.shared.queued.load(Relaxed),
        }
    }

    async fn check(&self, key: &str, n: u32) -> Verdict {
        let shared = &self.shared;
        shared.limiter.validate(key, n)?;
        let rx = match shared.in_flight.entry_sync(key.to_owned()) {
            scc::hash_map::Entry::Occupied(mut queue) => {
                // Counted before it is queued, so the bound holds however many race here.
                if shared.queued.fetch_add(1, Relaxed) >= shared.max_queued as u64 {
                    shared.queued.fetch_sub(1, Relaxed);
                    return Err(RedisLimitError::QueueFull {
                        max: shared.max_queued,
                    });
                }
                let (tx, rx) = oneshot::channel();
                queue.get_mut().push(Waiter { n, tx });
                rx
            }
            scc::hash_map::Entry::Vacant(slot) => {
                slot.insert_entry(Vec::new());
                // Whatever happens to this future from here, the queue is handed on.
                let mut lead = Lead {
                    shared: shared.clone(),
                    key,
                    outage: None,
                };
                shared.calls.fetch_add(1, Relaxed);
                let verdict = shared
                    .within_deadline(shared.limiter.try_check_n(key, n))
                    .await;
                shared.checks.fetch_add(1, Relaxed);
                if let Err(e) = &verdict {
                    if e.is_outage() {
                        lead.outage = Some(e.clone());
                    }
                }
                return verdict;
            }
        };
        rx.await.unwrap_or(Err(RedisLimitError::Abandoned))
    }
}

/// The check whose call is in flight for `key`. Dropped when the call returns, or when the
/// check's future is dropped mid-call: either way, the checks queued meanwhile go next.
struct Lead<'k, L: RedisBatch + 'static> {
    shared: Arc<Shared<L>>,
    key: &'k str,
    /// The outage the call ended with, if it did: the queued checks get it at once rather
    /// than one more deadline of waiting on a server that just failed.
    outage: Option<RedisLimitError>,
}

impl<L: RedisBatch + 'static> Drop for Lead<'_, L> {
    fn drop(&mut self) {
        if let Some(e) = &self.outage {
            self.shared.fail_queued(self.key, e);
            return;
        }
        let Some(batch) = self.shared.next_batch(self.key) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(drain(self.shared.clone(), self.key.to_owned(), batch));
            }
            // Dropped outside any runtime: nothing can send the queue. Its checks fail with
            // `Abandoned` (an outage, which a `Fallback` answers), and the key is
            // freed for the next check.
            Err(_) => {
                self.shared.queued.fetch_sub(batch.len() as u64, Relaxed);
                drop(batch);
                self.shared.abandon(self.key);
            }
        }
    }
}

/// Sends `batch`, then every batch queued meanwhile, until the key's queue is empty.
async fn drain<L: RedisBatch + 'static>(
    shared: Arc<Shared<L>>,
    key: String,
    mut batch: Vec<Waiter>,
) {
    loop {
        shared.queued.fetch_sub(batch.len() as u64, Relaxed);
        // A check whose future was dropped while queued takes nothing.
        batch.retain(|w| !w.tx.is_closed());
        if !batch.is_empty() {
            let ns: Vec<u32> = batch.iter().map(|w| w.n).collect();
            shared.calls.fetch_add(1, Relaxed);
            let verdicts = shared
                .within_deadline(shared.limiter.try_check_batch(&key, &ns))
                .await;
            shared.checks.fetch_add(batch.len() as u64, Relaxed);
            let verdicts = verdicts.and_then(|vs| {
                if vs.len() == batch.len() {
                    Ok(vs)
                } else {
                    Err(RedisLimitError::UnexpectedReply(format!(
                        "{} verdicts for a batch of {}",
                        vs.len(),
                        batch.len()
                    )))
                }
            });
            match verdicts {
                Ok(vs) => {
                    for (w, v) in batch.drain(..).zip(vs) {
                        let _ = w.tx.send(Ok(v));
                    }
                }
                Err(e) => {
                    for w in batch.drain(..) {
                        let _ = w.tx.send(Err(e.clone()));
                    }
                    if e.is_outage() {
                        shared.fail_queued(&key, &e);
                        return;
                    }
                }
            }
        }
        // The checks just answered usually check again at once: one yield lets those woken on
        // this worker queue up, so that the next call carries them too instead of leaving
        // them for the one after (without it, batches alternate between the checks that
        // were in flight and the rest).
        tokio::task::yield_now().await;
        match shared.next_batch(&key) {
            Some(next) => batch = next,
            None => return,
        }
    }
}

impl<L> Shared<L> {
    /// `call`'s answer, or [`RedisLimitError::Timeout`] past the deadline.
    async fn within_deadline<T>(
        &self,
        call: impl Future<Output = Result<T, RedisLimitError>>,
    ) -> Result<T, RedisLimitError> {
        match tokio::time::timeout(self.deadline, call).await {
            Ok(answer) => answer,
            Err(_elapsed) => Err(RedisLimitError::Timeout(self.deadline)),
        }
    }

    /// Up to `max_batch` checks queued for `key`, or `None` after removing the key (no call
    /// in flight any more) when none are.
    fn next_batch(&self, key: &str) -> Option<Vec<Waiter>> {
        let scc::hash_map::Entry::Occupied(mut queue) = self.in_flight.entry_sync(key.to_owned())
        else {
            return None;
        };
        let waiting = queue.get_mut();
        if waiting.is_empty() {
            let _ = queue.remove_entry();
            return None;
        }
        if waiting.len() <= self.max_batch {
            return Some(mem::take(waiting));
        }
        let rest = waiting.split_off(self.max_batch);
        Some(mem::replace(waiting, rest))
    }

    /// Answers every check queued for `key` with `e`, until none is left (which frees the
    /// key for the next check's own call).
    fn fail_queued(&self, key: &str, e: &RedisLimitError) {
        while let Some(batch) = self.next_batch(key) {
            self.queued.fetch_sub(batch.len() as u64, Relaxed);
            for w in batch {
                let _ = w.tx.send(Err(e.clone()));
            }
        }
    }

    /// Frees `key` and fails whatever is queued for it.
    fn abandon(&self, key: &str) {
        if let Some((_, waiting)) = self.in_flight.remove_sync(key) {
            self.queued.fetch_sub(waiting.len() as u64, Relaxed);
        }
    }
}

impl<L: RedisBatch + 'static> RedisLimiter for Coalesce<L> {
    type Local = L::Local;

    /// Its own [`Coalesce::stats`].
    fn coalesce_stats(&self) -> Option<CoalesceStats> {
        Some(self.stats())
    }

    /// The wrapped limiter's.
    fn fallback_state(&self) -> Option<(super::Mode, super::FallbackStats)> {
        self.shared.limiter.fallback_state()
    }

    fn local(&self, share: f64) -> Self::Local {
        self.shared.limiter.local(share)
    }

    fn ping(&self) -> impl Future<Output = Result<(), RedisLimitError>> + Send {
        self.shared.limiter.ping()
    }

    fn max_key_len(&self) -> usize {
        self.shared.limiter.max_key_len()
    }

    fn try_check_n(&self, key: &str, n: u32) -> impl Future<Output = Verdict> + Send {
        self.check(key, n)
    }
}

impl<L: std::fmt::Debug> std::fmt::Debug for Coalesce<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalesce")
            .field("limiter", &self.shared.limiter)
            .field("max_batch", &self.shared.max_batch)
            .field("max_queued", &self.shared.max_queued)
            .field("deadline", &self.shared.deadline)
            .finish_non_exhaustive()
    }
}
