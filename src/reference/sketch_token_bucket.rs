//! The twin of [`SketchTokenBucket`](crate::keyed::sketch_token_bucket::SketchTokenBucket): a
//! count-min sketch with conservative update as Estan and Varghese give it (and as Knot
//! Resolver's KRU keeps it), its counters token buckets, under one mutex. Each cell is one
//! `u64`, a theoretical arrival time in the bucket's units (0: full at the base reading); a
//! key has the same `d` cells as in the lock-free sketch (the same hash, the same placement).
//! A check reads the key's cells, runs the bucket on the smallest, and on a grant raises
//! every one of them to at least the new arrival time; a refusal that starts a penalty raises
//! them to its end. No word, no anchor, no 16-bit offsets: for readings that never go back,
//! its answers (decisions, retry times, tokens) are the lock-free sketch's exactly, since a
//! cell the packing lifts to its word's anchor was already full at every later reading.

use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::Mutex;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::sketch_token_bucket::{Placement, SketchTokenBucketBuilder, CELLS, WORDS};
use crate::keyed::token_bucket::TokenBucketQuota;
use crate::limiter::{Denied, QuotaStatus};
use crate::Limit;

/// A count-min sketch of token buckets under a mutex: see the [module docs](self).
///
/// ```
/// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
/// use turnstile::{reference, Limit, ManualClock, Nanos};
///
/// let options = SketchTokenBucket::<str, _, _>::builder(Limit::per_second(1.0).unwrap(), 2)
///     .memory(1 << 10)
///     .clock(ManualClock::default());
/// let twin = reference::SketchTokenBucket::try_from(options).unwrap();
/// assert!(twin.check_n_at("192.0.2.7", Nanos::ZERO, 2).is_ok());
/// assert!(twin.check_n_at("192.0.2.7", Nanos::ZERO, 1).is_err());
/// ```
pub struct SketchTokenBucket<K: ?Sized, S = std::hash::RandomState, C = QuantaClock> {
    cells: Mutex<Vec<u64>>,
    rule: TokenBucketQuota,
    penalty: u64,
    base: u64,
    placement: Placement,
    hasher: S,
    clock: C,
    _key: PhantomData<fn(&K)>,
}

impl<K: ?Sized, S: BuildHasher, C: Clock> TryFrom<SketchTokenBucketBuilder<K, S, C>>
    for SketchTokenBucket<K, S, C>
{
    type Error = ConfigError;

    /// The twin of what `options` builds, with the same validation; every key full.
    fn try_from(options: SketchTokenBucketBuilder<K, S, C>) -> Result<Self, ConfigError> {
        let p = options.parts()?;
        Ok(SketchTokenBucket {
            cells: Mutex::new(vec![0; p.lines * WORDS * CELLS]),
            rule: p.rule,
            penalty: p.penalty,
            base: p.clock.now().as_u64(),
            placement: p.placement,
            hasher: p.hasher,
            clock: p.clock,
            _key: PhantomData,
        })
    }
}

impl<K: Hash + ?Sized> SketchTokenBucket<K> {
    /// `limit` a second per key with bursts of `burst`, in the lock-free sketch's defaults.
    pub fn new(limit: Limit, burst: u32) -> Result<Self, ConfigError> {
        Self::try_from(crate::keyed::sketch_token_bucket::SketchTokenBucket::builder(limit, burst))
    }
}

impl<K: Hash + ?Sized, S: BuildHasher, C: Clock> SketchTokenBucket<K, S, C> {
    /// A check of one token for `key` at the twin's clock reading.
    pub fn check(&self, key: &K) -> Result<(), Denied> {
        self.check_n_at(key, self.clock.now(), 1)
    }

    /// A check of `n` tokens for `key` at the twin's clock reading.
    pub fn check_n(&self, key: &K, n: u32) -> Result<(), Denied> {
        self.check_n_at(key, self.clock.now(), n)
    }

    /// A check of `n` tokens for `key` at `now`: the bucket on the smallest of the key's
    /// cells; a grant raises each to at least the new arrival time.
    pub fn check_n_at(&self, key: &K, now: Nanos, n: u32) -> Result<(), Denied> {
        let mine = self.cells_of(key);
        let mut cells = self.lock();
        let m = mine.clone().map(|i| cells[i]).min().unwrap_or(0);
        let u = self.rule.units(self.base, now);
        let raise_to = match self.rule.check_units(m, u, self.base, now, n) {
            Ok(None) => return Ok(()),
            Ok(Some(x2)) => x2,
            Err(denied) => {
                // A penalty starts from a normal debt, never during one, and never for a
                // check that could not pass at any time.
                if self.penalty == 0 || m > u + self.rule.tau || denied.retry_at().is_none() {
                    return Err(denied);
                }
                u + self.rule.tau + self.penalty
            }
        };
        for i in mine {
            cells[i] = cells[i].max(raise_to);
        }
        if raise_to > u + self.rule.tau {
            let cost = u64::from(n) * self.rule.scale.one;
            return Err(self.rule.denied(raise_to + cost, self.base, now));
        }
        Ok(())
    }

    /// The tokens `key` could take at `now`, from the smallest of its cells.
    pub fn tokens_at(&self, key: &K, now: Nanos) -> f64 {
        self.rule.tokens(self.arrival(key), self.base, now)
    }

    /// `key`'s `RateLimit` fields at `now`, from the smallest of its cells.
    pub fn quota_at(&self, key: &K, now: Nanos) -> QuotaStatus {
        self.rule.status(Some(self.arrival(key)), self.base, now)
    }

    /// The twin's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    fn arrival(&self, key: &K) -> u64 {
        let cells = self.lock();
        self.cells_of(key).map(|i| cells[i]).min().unwrap_or(0)
    }

    /// The indices of `key`'s cells in the table (lines of words of cells): at most 3.
    fn cells_of(&self, key: &K) -> impl Iterator<Item = usize> + Clone {
        let spot = self.placement.spot(self.hasher.hash_one(key));
        let word = (spot.line * WORDS + spot.word) * CELLS;
        (0..CELLS)
            .filter(move |i| spot.cells >> i & 1 == 1)
            .map(move |i| word + i)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }
}
