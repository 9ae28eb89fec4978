//! Per-client token buckets in fixed memory: a count-min sketch of arrival times that never
//! forgives an abuser ([`SketchTokenBucket`]).
//!
//! # When to choose it over `KeyedTokenBucket`
//! [`KeyedTokenBucket`](super::KeyedTokenBucket) keeps each client's exact bucket, so its
//! memory follows the clients it holds: under a flood of new clients it grows to its
//! `max_keys` bound and then either refuses new clients or lets them through untracked.
//! `SketchTokenBucket` keeps no keys at all: its memory is fixed when it is built and never
//! grows, shrinks, resizes or sweeps, whatever the clients do. The price is a small, stated
//! rate of **false refusals** of well-behaved clients that share all their cells with
//! abusers ([`SketchTokenBucket::false_refusal_rate`]); it never errs the other way.
//!
//! # How it works
//! As Knot Resolver's KRU ("count-min sketch with aging"), with token buckets for counters:
//! each client's key hashes, with a secret key (the default hasher is std's `RandomState`,
//! SipHash-1-3 keyed at random per limiter, so no client can choose keys that collide with
//! another's), to one 128-bit word of the table and to `d` of its four **cells** (2 by
//! default). A cell is a GCRA arrival time, the state of a token bucket
//! ([`TokenBucket`](crate::TokenBucket)'s algorithm). A check runs the bucket on the
//! **smallest** of the client's cells; a refusal writes nothing (but one that starts a
//! penalty, if the limiter has one); a grant raises all the client's cells to the new arrival
//! time (conservative update) with one CAS on the word.
//! Time alone refills every cell, so nothing is ever evicted.
//!
//! # Guarantees
//! 1. **No client is ever granted beyond its own budget**: over any span of readings
//!    `[a, b]`, at most `burst + limit * (b - a)` tokens, exactly as one
//!    [`KeyedTokenBucket`](super::KeyedTokenBucket) bucket per client, whoever shares its
//!    cells and however many threads check it at once. Every cell stays at or above the
//!    arrival time of every client it serves, so the smallest of a client's cells is at
//!    least its own; concurrent grants are linearizable (the protocol and its proof:
//!    `cells.rs`, model-checked by loom).
//! 2. **A client at or over its limit is always limited**, and an abuser gains nothing from
//!    sharing cells with others: sharing only raises cells.
//! 3. **An innocent client is refused early only if all `d` of its cells are held by
//!    clients at their limit**: with `A` such clients in `L` lines, with the probability
//!    [`false_refusal_rate`](SketchTokenBucket::false_refusal_rate) gives (the formula:
//!    `sizing.rs`); a client alone in its cells is a token bucket, to the precision below.
//! 4. **Memory is fixed**: `lines * 64` bytes, allocated at construction. A check allocates
//!    nothing and touches one cache line of the table: one load, and for a grant (or a
//!    refusal that starts a penalty) one CAS.
//!
//! An optional **penalty** ([`SketchTokenBucketBuilder::penalty`]) shuts a client that goes
//! over its limit out for a set time, then refills it from empty. It only raises cells, so
//! guarantees 1, 2 and 4 stand; for 3, a penalized client counts as one at its limit.
//!
//! **Precision.** A cell counts time in units of at most `burst / limit / 2^14` (a whole burst
//! spans at most 2^15 units, so that an arrival time fits 16 bits beside its word's anchor,
//! and a token a power of two of them, so that grants never drift):
//! a reading is rounded down to a unit, so a grant may come up to one unit later than a token
//! bucket's, never earlier, and a refusal's retry time is never early. A burst is at most
//! 2^15 (32 768) tokens.
//!
//! A refusal's [`Denied::retry_at`] is when the smallest of the client's cells admits: for a
//! client alone in its cells, a token bucket's (to that precision); with shared cells, the
//! earliest time the sketch could admit it if no one else checks meanwhile.
//!
//! # Sizing
//! [`SketchTokenBucketBuilder::memory`] sets the size in bytes (4 MiB, 65 536 lines, by
//! default); [`SketchTokenBucketBuilder::sized_for`] picks the smallest table that keeps the
//! false-refusal rate at or below a target with a given number of clients at their limit.

mod cells;
mod sizing;

pub(crate) use cells::{Spot, CELLS, WORDS};

use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::time::Duration;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::token_bucket::TokenBucketQuota;
use crate::limit::Limit;
use crate::limiter::{Denied, QuotaStatus};

use cells::{Cells, G_BITS};

/// The default table: 4 MiB.
const DEFAULT_MEMORY: usize = 4 << 20;
/// The largest table: 2^32 lines (256 GiB).
const MAX_LINES: usize = 1 << 32;
/// Bytes per line.
const LINE: usize = 64;

/// Per-client token buckets in a fixed-size table: see the [module docs](self) for the
/// guarantees, and when to choose it over
/// [`KeyedTokenBucket`](super::KeyedTokenBucket).
///
/// ```
/// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
/// use turnstile::{Limit, ManualClock, Nanos};
///
/// // 10 requests a second per client address, bursts of 2, in 1 MiB whatever the clients.
/// let per_ip = SketchTokenBucket::<str, _, _>::builder(Limit::per_second(10.0).unwrap(), 2)
///     .memory(1 << 20)
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert!(per_ip.check_n_at("192.0.2.7", Nanos::ZERO, 2).is_ok());
/// let denied = per_ip.check_n_at("192.0.2.7", Nanos::ZERO, 1).unwrap_err();
/// assert_eq!(denied.retry_after(), Some(std::time::Duration::from_millis(100)));
/// assert!(per_ip.check_n_at("198.51.100.1", Nanos::ZERO, 1).is_ok()); // another client
/// assert_eq!(per_ip.memory(), 1 << 20);
/// ```
pub struct SketchTokenBucket<K: ?Sized, S = std::hash::RandomState, C = QuantaClock> {
    cells: Cells,
    rule: TokenBucketQuota,
    /// [`SketchTokenBucketBuilder::penalty`] in units; 0 for none.
    penalty: u64,
    /// The clock reading every cell counts from.
    base: u64,
    placement: Placement,
    hasher: S,
    clock: C,
    _key: PhantomData<fn(&K)>,
}

impl<K: Hash + ?Sized> SketchTokenBucket<K> {
    /// `limit` tokens per second per client, bursts of `burst`, in the default 4 MiB with
    /// two cells per client, on the quanta clock.
    ///
    /// ```
    /// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
    /// use turnstile::Limit;
    /// let k = SketchTokenBucket::<u64>::new(Limit::per_second(5.0).unwrap(), 1);
    /// assert!(k.check(&42).is_ok());
    /// assert!(k.check(&42).is_err());
    /// assert_eq!(k.memory(), 4 << 20);
    /// ```
    pub fn new(limit: Limit, burst: u32) -> Self {
        Self::builder(limit, burst)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// A builder of `limit` per second per client with bursts of `burst`.
    ///
    /// ```
    /// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
    /// use turnstile::Limit;
    /// // At most one innocent refusal in 1 000 checks with 1 000 clients at their limit.
    /// let k = SketchTokenBucket::<u64>::builder(Limit::per_second(5.0).unwrap(), 10)
    ///     .sized_for(1_000, 1e-3)
    ///     .build()
    ///     .unwrap();
    /// assert!(k.false_refusal_rate(1_000) <= 1e-3);
    /// assert_eq!(k.memory(), 4 << 20);
    /// ```
    pub fn builder(limit: Limit, burst: u32) -> SketchTokenBucketBuilder<K> {
        SketchTokenBucketBuilder {
            limit,
            burst,
            size: Size::Memory(DEFAULT_MEMORY),
            d: 2,
            penalty: Duration::ZERO,
            hasher: std::hash::RandomState::new(),
            clock: QuantaClock::new(),
            _key: PhantomData,
        }
    }
}

impl<K: Hash + ?Sized, S: BuildHasher, C: Clock> SketchTokenBucket<K, S, C> {
    /// A check of one token for `key` at the limiter's clock reading.
    #[inline]
    pub fn check(&self, key: &K) -> Result<(), Denied> {
        self.check_n_at(key, self.clock.now(), 1)
    }

    /// A check of `n` tokens for `key` at the limiter's clock reading.
    #[inline]
    pub fn check_n(&self, key: &K, n: u32) -> Result<(), Denied> {
        self.check_n_at(key, self.clock.now(), n)
    }

    /// A check of `n` tokens for `key` at `now`: granted (all `n`) or refused with the
    /// earliest time a retry could pass. More than the burst is refused with no retry time;
    /// `n = 0` is granted and takes nothing; under [`Limit::INF`] every check is granted.
    ///
    /// ```
    /// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
    /// use turnstile::{Limit, ManualClock, Nanos};
    /// let k = SketchTokenBucket::<u8, _, _>::builder(Limit::per_second(1.0).unwrap(), 3)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n_at(&1, Nanos::ZERO, 3).is_ok());
    /// assert!(k.check_n_at(&1, Nanos::ZERO, 1).is_err());
    /// assert!(k.check_n_at(&1, Nanos::new(1_000_000_000), 1).is_ok()); // a second later
    /// assert_eq!(k.check_n_at(&1, Nanos::ZERO, 4).unwrap_err().retry_at(), None);
    /// ```
    #[inline]
    pub fn check_n_at(&self, key: &K, now: Nanos, n: u32) -> Result<(), Denied> {
        let spot = self.spot(self.hasher.hash_one(key));
        self.cells
            .check(&self.rule, self.penalty, spot, self.base, now, n)
    }

    /// The tokens `key` could take at `now` as the sketch knows it (at most what its own
    /// bucket holds): between 0 and the burst.
    pub fn tokens_at(&self, key: &K, now: Nanos) -> f64 {
        let x = self.cells.arrival(self.spot(self.hasher.hash_one(key)));
        self.rule.tokens(x, self.base, now)
    }

    /// `key`'s `RateLimit` fields at `now`, as the sketch knows it: the burst, the time it
    /// takes to refill from empty, the whole tokens it could take and the time until it is
    /// full (the smallest of its cells'). Every key has them: a key never seen is full
    /// unless its cells are held by others.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
    /// use turnstile::{Limit, ManualClock, Nanos, QuotaStatus};
    /// let k = SketchTokenBucket::<u8, _, _>::builder(Limit::per_second(10.0).unwrap(), 5)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 5).unwrap();
    /// let s = k.quota_at(&1, Nanos::new(250_000_000)); // 2.5 tokens back
    /// assert_eq!(s, QuotaStatus {
    ///     quota: 5,
    ///     window: Duration::from_millis(500),
    ///     remaining: 2,
    ///     reset: Duration::from_millis(250),
    /// });
    /// ```
    pub fn quota_at(&self, key: &K, now: Nanos) -> QuotaStatus {
        let x = self.cells.arrival(self.spot(self.hasher.hash_one(key)));
        self.rule.status(Some(x), self.base, now)
    }

    #[inline(always)]
    fn spot(&self, h: u64) -> Spot {
        self.placement.spot(h)
    }
}

/// Where keys go: a key's hash picks its line, its word and its cells.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    /// `lines - 1` (a power of two).
    line_mask: u64,
    /// Every place a key may take in a line, `choices[..count]`, words first: its set of `d`
    /// of the word's cells (bits 0-3, a bit set), its word (bits 4-5), and its cells' bit
    /// offsets in the word's high half (`Spot::shifts`, from bit 8). Thirty-two entries, so
    /// that a pick is indexed with a mask.
    choices: [u32; 32],
    count: u64,
}

impl Placement {
    /// `lines` lines (a power of two), `d` cells a key.
    fn new(lines: usize, d: usize) -> Placement {
        let mut choices = [0u32; 32];
        let mut count = 0;
        for word in 0..WORDS as u32 {
            for set in (0u32..1 << CELLS).filter(|s| s.count_ones() as usize == d) {
                let shifts = (0..CELLS as u32)
                    .filter(|i| set >> i & 1 == 1)
                    .enumerate()
                    .fold(0, |acc, (j, i)| acc | (16 * i) << (6 * j));
                choices[count] = shifts << 8 | word << 4 | set;
                count += 1;
            }
        }
        Placement {
            line_mask: lines as u64 - 1,
            choices,
            count: count as u64,
        }
    }

    /// Where the key of hash `h` is: the line from the hash's high half, the word and the set
    /// of cells in it from its low half (by multiplication, not a modulo or a division: a
    /// uniform pick among the `count` choices, looked up).
    #[inline(always)]
    pub(crate) fn spot(&self, h: u64) -> Spot {
        let pick = (u64::from(h as u32) * self.count) >> 32;
        let choice = self.choices[pick as usize & 31];
        Spot {
            line: ((h >> 32) & self.line_mask) as usize,
            word: (choice >> 4 & 3) as usize,
            cells: (choice & 0xf) as u8,
            shifts: choice >> 8,
        }
    }
}

/// What a builder makes, before the table: for the sketch and its twin
/// ([`reference::SketchTokenBucket`](crate::reference::SketchTokenBucket)).
pub(crate) struct Parts<S, C> {
    pub(crate) rule: TokenBucketQuota,
    /// The penalty in the rule's units.
    pub(crate) penalty: u64,
    pub(crate) lines: usize,
    pub(crate) d: usize,
    pub(crate) placement: Placement,
    pub(crate) hasher: S,
    pub(crate) clock: C,
}

impl<K: ?Sized, S, C: Clock> SketchTokenBucket<K, S, C> {
    /// The table's size in bytes, fixed at construction.
    pub fn memory(&self) -> usize {
        self.cells.lines() * LINE
    }

    /// Cells per client.
    pub fn cells_per_key(&self) -> usize {
        self.cells.d()
    }

    /// The probability that a client well under its limit is refused because all its cells
    /// are held by `abusers` clients at their limit (the formula and its model: the module
    /// docs of `sizing.rs`, summarized in [the module docs](self)).
    ///
    /// ```
    /// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
    /// use turnstile::Limit;
    /// let k = SketchTokenBucket::<u64>::new(Limit::per_second(5.0).unwrap(), 10); // 4 MiB
    /// assert!(k.false_refusal_rate(1_000) < 1e-3);
    /// assert!(k.false_refusal_rate(1_000_000) > 0.1);
    /// ```
    pub fn false_refusal_rate(&self, abusers: u64) -> f64 {
        sizing::false_refusal_rate(self.cells.lines(), self.cells_per_key(), abusers)
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The limit per client.
    pub fn limit(&self) -> Limit {
        self.rule.limit
    }

    /// The burst per client.
    pub fn burst(&self) -> u32 {
        self.rule.burst
    }
}

impl<K: ?Sized, S, C: Clock> std::fmt::Debug for SketchTokenBucket<K, S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SketchTokenBucket")
            .field("limit", &self.rule.limit)
            .field("burst", &self.rule.burst)
            .field("memory", &self.memory())
            .field("cells_per_key", &self.cells_per_key())
            .finish_non_exhaustive()
    }
}

/// `penalty` in `rule`'s units, at most what the cells hold beside a burst (`2^G_BITS - tau`:
/// the offsets' bound, `cells.rs`).
fn penalty_units(rule: &TokenBucketQuota, penalty: Duration) -> u64 {
    let ns = u64::try_from(penalty.as_nanos()).unwrap_or(u64::MAX);
    let units = u64::try_from(rule.scale.units_wide(ns)).unwrap_or(u64::MAX);
    units.min((1 << G_BITS) - rule.tau)
}

/// How the builder sizes the table.
#[derive(Clone, Copy, Debug)]
enum Size {
    Memory(usize),
    For { abusers: u64, rate: f64 },
}

/// Builds a [`SketchTokenBucket`]: size, cells per client, hasher and clock.
#[derive(Debug)]
#[must_use = "a builder does nothing until `build`"]
pub struct SketchTokenBucketBuilder<K: ?Sized, S = std::hash::RandomState, C = QuantaClock> {
    limit: Limit,
    burst: u32,
    size: Size,
    d: usize,
    penalty: Duration,
    hasher: S,
    clock: C,
    _key: PhantomData<fn(&K)>,
}

impl<K: ?Sized, S: BuildHasher, C: Clock> SketchTokenBucketBuilder<K, S, C> {
    /// The table's size: `bytes` rounded down to a power of two of 64-byte lines, at least
    /// one line (64 bytes) and at most 2^38 bytes (256 GiB), else [`ConfigError::SketchMemory`].
    /// 4 MiB by default.
    ///
    /// ```
    /// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
    /// use turnstile::Limit;
    /// let k = SketchTokenBucket::<u64>::builder(Limit::per_second(5.0).unwrap(), 1)
    ///     .memory(3 << 20) // 3 MiB: 2 MiB of lines
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.memory(), 2 << 20);
    /// ```
    pub fn memory(mut self, bytes: usize) -> Self {
        self.size = Size::Memory(bytes);
        self
    }

    /// The smallest table that keeps [`false_refusal_rate`](SketchTokenBucket::false_refusal_rate)
    /// at or below `rate` with `abusers` clients at their limit; [`ConfigError::SketchSize`]
    /// if 256 GiB do not, or if `rate` is not in `(0, 1)`.
    pub fn sized_for(mut self, abusers: u64, rate: f64) -> Self {
        self.size = Size::For { abusers, rate };
        self
    }

    /// Cells per client, of its word's four: 1 to 3 ([`ConfigError::SketchCells`] otherwise); 2
    /// by default, which makes a false refusal rarest (a client's cells are then one of six
    /// pairs, against four single cells or four triples).
    pub fn cells_per_key(mut self, d: usize) -> Self {
        self.d = d;
        self
    }

    /// A penalty for a client that goes over its limit: a check refused while the client
    /// still had its normal debt (its bucket at most empty) gets nothing more for `penalty`,
    /// after which its bucket refills from empty. Checks refused during the penalty do not
    /// extend it; the first refusal after it (the client back at its limit at once) starts
    /// another. That refusal's [`Denied::retry_at`] is the penalty's end plus the tokens
    /// asked for. Zero (none) by default.
    ///
    /// The penalty raises the client's cells, so whoever shares **all** of them waits it out
    /// too (a false refusal, as with any cell an abuser holds); those who share some do not.
    /// The sketch cannot tell a client's own debt from its cells' other holders', so a client
    /// refused falsely is penalized as an abuser is: with a penalty, a false refusal lasts the
    /// penalty.
    /// That refusal writes (one CAS, as a grant); every other refusal is still one load.
    /// The cells must span the burst and the penalty, `burst + penalty * limit` at most 2^15
    /// tokens ([`ConfigError::SketchPenalty`] otherwise), and count in units of at most
    /// 1/2^14 of that span.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::sketch_token_bucket::SketchTokenBucket;
    /// use turnstile::{Limit, ManualClock, Nanos};
    /// let k = SketchTokenBucket::<str, _, _>::builder(Limit::per_second(1.0).unwrap(), 2)
    ///     .penalty(Duration::from_secs(10))
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n_at("abuser", Nanos::ZERO, 2).is_ok());
    /// let denied = k.check_n_at("abuser", Nanos::ZERO, 1).unwrap_err();
    /// // 10 s of nothing, then a token a second from empty.
    /// assert_eq!(denied.retry_after(), Some(Duration::from_secs(11)));
    /// // Refused during the penalty, which that does not extend.
    /// let denied = k.check_n_at("abuser", Nanos::new(5_000_000_000), 1).unwrap_err();
    /// assert_eq!(denied.retry_after(), Some(Duration::from_secs(6)));
    /// assert!(k.check_n_at("abuser", Nanos::new(11_000_000_000), 1).is_ok());
    /// // At once again: over its limit, so another penalty.
    /// let denied = k.check_n_at("abuser", Nanos::new(11_000_000_000), 1).unwrap_err();
    /// assert_eq!(denied.retry_after(), Some(Duration::from_secs(11)));
    /// ```
    pub fn penalty(mut self, penalty: Duration) -> Self {
        self.penalty = penalty;
        self
    }

    /// The hasher that places keys. It must be keyed with a secret for the guarantee that
    /// no client can pick keys that share another's cells (std's `RandomState`, the default,
    /// is); a fixed one suits tests.
    pub fn hasher<T: BuildHasher>(self, hasher: T) -> SketchTokenBucketBuilder<K, T, C> {
        SketchTokenBucketBuilder {
            limit: self.limit,
            burst: self.burst,
            size: self.size,
            d: self.d,
            penalty: self.penalty,
            hasher,
            clock: self.clock,
            _key: PhantomData,
        }
    }

    /// The clock (the quanta clock by default).
    pub fn clock<D: Clock>(self, clock: D) -> SketchTokenBucketBuilder<K, S, D> {
        SketchTokenBucketBuilder {
            limit: self.limit,
            burst: self.burst,
            size: self.size,
            d: self.d,
            penalty: self.penalty,
            hasher: self.hasher,
            clock,
            _key: PhantomData,
        }
    }

    /// The limiter, its table allocated and every client full; the clock's reading now is
    /// the base its cells count from.
    pub fn build(self) -> Result<SketchTokenBucket<K, S, C>, ConfigError> {
        let p = self.parts()?;
        Ok(SketchTokenBucket {
            cells: Cells::new(p.lines, p.d),
            rule: p.rule,
            penalty: p.penalty,
            base: p.clock.now().as_u64(),
            placement: p.placement,
            hasher: p.hasher,
            clock: p.clock,
            _key: PhantomData,
        })
    }

    /// The configuration, validated, without the table.
    pub(crate) fn parts(self) -> Result<Parts<S, C>, ConfigError> {
        let d = self.d;
        if !(1..=3).contains(&d) {
            return Err(ConfigError::SketchCells(d));
        }
        let rule = TokenBucketQuota::within(self.limit, self.burst, 0, G_BITS)
            .ok_or(ConfigError::SketchBurst(self.burst))?;
        // The penalty in tokens, rounded up, for the span the cells must hold; none where
        // nothing is ever refused for want of time (an infinite or a zero limit).
        let refills = !(rule.inf || rule.zero);
        let (rule, penalty) = if refills && !self.penalty.is_zero() {
            let tokens = (self.penalty.as_secs_f64() * self.limit.as_f64()).ceil();
            Some(tokens)
                .filter(|t| *t <= f64::from(1u32 << G_BITS))
                .and_then(|t| TokenBucketQuota::within(self.limit, self.burst, t as u64, G_BITS))
                .map(|r| (r, penalty_units(&r, self.penalty)))
                .ok_or(ConfigError::SketchPenalty {
                    penalty: self.penalty,
                    burst: self.burst,
                })?
        } else {
            (rule, 0)
        };
        let lines = match self.size {
            Size::Memory(bytes) => {
                if !(LINE..=MAX_LINES * LINE).contains(&bytes) {
                    return Err(ConfigError::SketchMemory(bytes));
                }
                1usize << (bytes / LINE).ilog2()
            }
            Size::For { abusers, rate } => {
                if !(rate > 0.0 && rate < 1.0) {
                    return Err(ConfigError::SketchSize { abusers, rate });
                }
                sizing::lines_for(abusers, d, rate, MAX_LINES)
                    .ok_or(ConfigError::SketchSize { abusers, rate })?
            }
        };
        Ok(Parts {
            rule,
            penalty,
            lines,
            d,
            placement: Placement::new(lines, d),
            hasher: self.hasher,
            clock: self.clock,
        })
    }
}
