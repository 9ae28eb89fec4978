//! Per-key token buckets with the state **inline**: each key is its key and one 64-bit word in
//! an open-addressing table, nothing else. The general [`Keyed`](crate::Keyed) holds a whole
//! limiter per key (an `Arc` slot with its own configuration, ~250 bytes); this map shares the
//! configuration between keys, so a `u64` key costs a 16-byte slot.
//!
//! # The state word
//! Each key is a GCRA ("virtual scheduling") token bucket, the same bucket as
//! [`TokenBucket`](crate::TokenBucket)'s `allow`: `x` is the key's *theoretical arrival
//! time*, counted in the units of `src/scale.rs` (one token is exactly `one` units, so grants never
//! drift) from one fixed **base** for the whole map (the clock reading at construction).
//! Readings before the base count as the base.
//!
//! ```text
//!  63      62..59       58..0
//! [FROZEN][ tag (4) ][   x (59 bits)   ]
//!   tag 1..=15: a live key of quota `tag - 1`, x its arrival time in that quota's units
//!   tag 0:      x = 0 EMPTY (never used), x = 1 + q DEAD (evicted; quota q kept for revival)
//!   FROZEN:     set by a resize once the slot has been copied: no write lands here any more
//! ```
//!
//! A check of `n` tokens at `t`, with `u = units(t - base)`, `tau = burst * one`:
//! `x' = max(x, u) + n * one`, **granted iff `x' <= u + tau`** (one CAS from the loaded word
//! to `x'`); a denial writes nothing and reports `retry_at = base + nanos_ceil(x' - tau)`,
//! the first nanosecond at which the same check would pass. The tokens at `t` are
//! `min(burst, (u + tau - x) / one)`; a key is **idle** (full, as if new) when `x <= u`.
//!
//! **Range.** `u` is kept below `2^59 - 2^55` so that `x' <= u + tau` fits in 59 bits
//! (`tau <= 2^55`). Units are built with `fine = 0`: for a limit up to 1e9/s a unit is at
//! most 1 ns and, unless the burst is large enough to coarsen it (which only lengthens the
//! range), more than 0.5 ns, so the map runs for **at least 8.5 years from its base**. Above
//! 1e9/s a unit is one token, and the range is `2^59 - 2^55` tokens' worth of time (at
//! 1e10/s, 1.7 years). Past the range time stands still for the map: each key gets at most
//! its burst more and is then refused (it fails closed).
//!
//! **Budget.** `x` never decreases while a key lives, each grant adds its cost, and a grant at
//! `t` needs `x'` within `tau` of `u`; so for any readings `[a, b]` a key's grants total at most
//! `burst + limit * (b - a)` (plus the rounding of one unit), whatever the order in which the
//! readings arrive: a stale reading only finds a smaller `u`, so fewer tokens.
//!
//! # Quotas
//! The configurations (`limit`, `burst`, precomputed scale) live in a table of at most
//! [`MAX_QUOTAS`] entries shared by the whole map; a key's word names its quota in the 4-bit
//! tag, set once when the key is inserted by the builder's `classify` function. A per-key
//! configuration would cost a pointer per key; a table of 15 keeps the word self-describing
//! and a check's configuration read a load from a line every check shares (it stays in
//! cache). Fifteen covers tiered plans (anonymous, free, paid, internal, ...); keys that need
//! more distinct quotas want several maps, or the general [`Keyed`](crate::Keyed).
//!
//! # The table
//! An open-addressing table with linear probing: slots of `(state: AtomicU64, key)`, a power
//! of two of them, at most seven eighths used. Chosen by instruction counts per check against
//! `scc::HashIndex` and `DashMap` with the word inline and governor's keyed limiter
//! (`scripts/instructions`); a granted check is a clock read, the hash, an epoch pin, a probe
//! and one CAS, nothing else (BENCHMARKS.md has the measured figures).
//!
//! Lookups, checks and eviction take no lock and never wait for an insert, a resize or a
//! sweep: a check of a held key is one CAS on its word, a refusal a load; new keys are
//! inserted under a mutex no check of a held key takes; a resize copies each word before it
//! freezes it, and a check that finds its word frozen goes on in the new table. loom checks
//! the protocol in `loom-tests/tests/keyed_bucket.rs` (check ‖ evict with revival, insert ‖
//! check ‖ evict, check ‖ growth, two grants ‖ growth, refund ‖ growth, check ‖ purge, a
//! stale reading across an eviction).
//!
//! # Memory and the key bound
//! A slot is `8 + size_of::<K>()` bytes rounded up to `K`'s alignment (16 for `u64`, 32 for
//! [`IpAddr`](std::net::IpAddr), whose 17 bytes round up to 24 beside the word). The map holds
//! at most `max_keys` keys (2^20, 1 048 576, unless the builder says otherwise),
//! and its table never grows past what they need: the power of two above `max_keys * 8/7`
//! slots (2^21 for the default: 32 MiB with `u64` keys, 64 MiB with `IpAddr`). A resize
//! copies into a new table before it frees the old one, and clones every key first, so while
//! one runs the map briefly holds both tables and the clones (at the default bound with
//! `IpAddr` keys, up to 64 + 64 MiB of tables and 35 MiB of clones). At the bound, a table
//! with dead slots is rebuilt at the same size without them rather than grown.
//!
//! **What a flood costs.** A key is evicted by the first sweep after it is idle (full again:
//! `burst / limit` after its last check at most), so a flood of `r` new keys a second holds
//! about `r * (burst / limit + sweep_every)` keys, and `r` at or above
//! `max_keys / sweep_every` fills the map to its bound (and no further), at the bound's
//! memory: after that, a new key finds the map full and is
//! refused ([`WhenFull::Deny`]) or let through untracked ([`WhenFull::Allow`]) until a sweep
//! evicts idle keys; keys the map holds are never evicted to make room, so a flood cannot hand
//! anyone a fresh bucket. A held key's check does not wait for the flood: not for its
//! inserts (a check of a held key takes no lock), nor for the resizes they cause (above),
//! nor for the sweeps (off the request path when a sweeper thread runs, as under the tower
//! `per_key` policy). What it does pay is the flood's cache pressure on the shared machine.
//! A legitimate client *new* to the map (or evicted as idle) during a flood competes with
//! it for room, and its insert is serialized with the flood's under `writer`.

//! # Eviction never loses a grant; stale readings never gain
//! Eviction keeps the guarantee of [`Keyed`](crate::Keyed) (its module docs state and prove
//! it): a grant and an eviction are two CASes on the same word from the same value, so one
//! of them fails and no grant is lost or counted twice; a key evicted by a sweep at `J` is
//! born again at `B >= J`, with `x = units(B) >= units(J) >=` the evicted `x`. So `x` never
//! decreases over a key's whole history, across any number of evictions, and the budget
//! above holds for every key as if one bucket had served it all along. The price is the one
//! [`Keyed`](crate::Keyed) pays: a reading older than the last sweep that evicted its key is
//! judged against a bucket born at the sweep (it holds `(B - t) * limit` tokens fewer than
//! full at `t`).
//!
//! `tests/keyed_bucket_stress.rs` forces the stale interleaving and races grants against a
//! sweeper that evicts and rebuilds the table, then checks every key's budget.
//!
//! # HashDoS
//! Keys are usually chosen by clients (IP addresses, API keys), and linear probing degrades
//! to linear scans if many keys collide. The default hasher is std's
//! [`RandomState`] (SipHash-1-3 with a random
//! per-process key, a keyed PRF): without the key an attacker cannot predict which slots its
//! keys land in, so it cannot build long probe chains however many keys it sends, and
//! [`max_keys`](InlineMapBuilder::max_keys) bounds how many it can hold. A faster hasher can be
//! chosen with [`hasher`](InlineMapBuilder::hasher): `foldhash::fast::RandomState` (randomly
//! seeded per map; no cryptographic claim, and its authors do not claim resistance to an
//! attacker who can time the map, but a flood shows up as a slower map, never as a wrong
//! answer) hashes a `u64` in a handful of instructions where SipHash takes over a hundred
//! (BENCHMARKS.md's foldhash rows); a fixed, unseeded hasher is only for keys no client
//! chooses.
//!
//! # Sweeps and the key bound
//! As for [`Keyed`](crate::Keyed): a sweep runs inline in the first check after
//! `sweep_every` (default 10 s), on a thread of its own with
//! [`KeyedTokenBucket::spawn_sweeper`] (the tower `per_key` policy starts one), or by hand
//! ([`KeyedTokenBucket::evict_idle`]). Sweeps judge at the map's clock. A new (or revived)
//! key that finds the map full asks for an early sweep (at most one per tenth of
//! `sweep_every`): inline, or by waking the sweeper thread when there is one, so that with a
//! sweeper no check ever sweeps; the key is then refused ([`WhenFull::Deny`]) or let through
//! untracked ([`WhenFull::Allow`]).

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

pub use crate::keyed::word_map::MAX_QUOTAS;
pub use crate::keyed::WhenFull;

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::keyed::word_map::WordMap;
use crate::keyed::word_rule::{WordRule, X_MASK};
use crate::keyed::{InlineMap, InlineMapBuilder};
use crate::limit::Limit;
use crate::limiter::{Denied, QuotaStatus};
use crate::scale::{Scale, D_MAX, TAU_MAX};

/// The largest `u`: a granted `x' <= u + tau <= U_MAX + TAU_MAX` still fits in 59 bits.
const U_MAX: u64 = X_MASK - TAU_MAX;
// A granted word fits its 59 bits.
const _: () = assert!(U_MAX + TAU_MAX <= X_MASK);

/// One quota of a [`KeyedTokenBucket`]: the rule its keys follow, its configuration
/// precomputed. The map's builder makes it (`builder`, `quota`); it is the map's type
/// parameter (`KeyedTokenBucket<K>` is `InlineMap<K, TokenBucketQuota>`), named only to name
/// the map's builder, `InlineMapBuilder<K, TokenBucketQuota>`.
#[derive(Clone, Copy, Debug)]
pub struct TokenBucketQuota {
    pub(crate) limit: Limit,
    pub(crate) burst: u32,
    pub(crate) scale: Scale,
    /// `burst * one`: the whole burst in units.
    pub(crate) tau: u64,
    /// `Limit::INF`: every check passes and nothing is written.
    pub(crate) inf: bool,
    /// No refill (`Limit::ZERO`, or a limit too low to refill its burst in 146 years): units
    /// never advance (`scale.mul == 0`), so the burst is all a key ever gets.
    pub(crate) zero: bool,
    /// A meter's quota ([`KeyedLeakyMeter`]): more than the burst
    /// is refused under [`Limit::INF`] too, where a token bucket grants any `n`.
    pub(crate) capped: bool,
}

impl TokenBucketQuota {
    pub(crate) fn new(limit: Limit, burst: u32) -> TokenBucketQuota {
        let inf = limit.is_inf();
        let scale = if inf || limit.as_f64() <= 0.0 {
            None
        } else {
            Scale::new(limit, burst, 0)
        };
        let zero = !inf && scale.is_none();
        let scale = scale.unwrap_or(Scale {
            one: 1,
            mul: 0,
            per: 0,
            per_shift: 0,
        });
        TokenBucketQuota {
            limit,
            burst,
            scale,
            tau: u64::from(burst) * scale.one,
            inf,
            zero,
            capped: false,
        }
    }

    /// The quota of `limit` and `burst` in units that fit a whole burst and `extra` tokens
    /// more in `2^bits` (one token is `2^k` units, `(burst + extra) << k <= 2^bits`): for a
    /// word whose fields hold an arrival time within that span of its anchor. `None` if the
    /// span has more than `2^bits` tokens.
    pub(crate) fn within(
        limit: Limit,
        burst: u32,
        extra: u64,
        bits: u32,
    ) -> Option<TokenBucketQuota> {
        let q = TokenBucketQuota::new(limit, burst);
        let span = u64::from(burst).checked_add(extra)?;
        if span > 1 << bits {
            return None;
        }
        if q.inf || q.zero {
            return Some(q); // a zero limit counts whole tokens: `one = 1`
        }
        let k_max = bits - (64 - span.leading_zeros()).min(bits);
        (0..=k_max).rev().find_map(|k| {
            let scale = Scale::with_k(limit, k)?;
            Some(TokenBucketQuota {
                scale,
                tau: u64::from(burst) << k,
                ..q
            })
        })
    }

    /// [`WordRule::check`] with the reading already in units, `u = units(base, now)`: for a
    /// caller that needs `u` itself (the sketch's anchor), so that it converts once.
    #[inline(always)]
    pub(crate) fn check_units(
        &self,
        x: u64,
        u: u64,
        base: u64,
        now: Nanos,
        n: u32,
    ) -> Result<Option<u64>, Denied> {
        if self.inf && !(self.capped && n > self.burst) {
            return Ok(None);
        }
        if n > self.burst {
            return Err(Denied::new(now, None));
        }
        let x2 = self.step(x, u, n, base, now)?;
        // A check of nothing takes nothing: not written (the rule's contract 2).
        Ok((n != 0).then_some(x2))
    }

    /// The tokens at `now` of a key whose arrival time is `x`: at most the burst (the burst
    /// under `Limit::INF`), below zero only for a reading older than the key's last grant.
    pub(crate) fn tokens(&self, x: u64, base: u64, now: Nanos) -> f64 {
        if self.inf {
            return f64::from(self.burst);
        }
        let units = (self.units(base, now) + self.tau) as f64 - x as f64;
        (units / self.scale.one as f64).min(f64::from(self.burst))
    }

    /// The `RateLimit` fields of a key whose arrival time is `x` (`None`: a key the map
    /// does not hold, full) at `now`.
    pub(crate) fn status(&self, x: Option<u64>, base: u64, now: Nanos) -> QuotaStatus {
        let burst = u64::from(self.burst);
        let window = if self.inf {
            Duration::ZERO
        } else if self.zero {
            Duration::MAX
        } else {
            u64::try_from(self.scale.nanos_ceil(self.tau))
                .map_or(Duration::MAX, Duration::from_nanos)
        };
        let full = QuotaStatus {
            quota: burst,
            window,
            remaining: burst,
            reset: Duration::ZERO,
        };
        let Some(x) = x.filter(|_| !self.inf) else {
            return full;
        };
        let u = self.units(base, now);
        // Units held at `now`, capped at the burst; negative in deficit.
        let held = (i128::from(u) + i128::from(self.tau) - i128::from(x)).min(i128::from(self.tau));
        if held == i128::from(self.tau) {
            return full;
        }
        let remaining = if held <= 0 {
            0
        } else {
            (held as u64) / self.scale.one
        };
        let reset = if self.zero {
            Duration::MAX
        } else {
            // Full once u reaches x: at base + nanos_ceil(x), as a denial's retry time.
            u64::try_from(u128::from(base) + self.scale.nanos_ceil(x)).map_or(Duration::MAX, |t| {
                Nanos::new(t).saturating_duration_since(now)
            })
        };
        QuotaStatus {
            quota: burst,
            window,
            remaining,
            reset,
        }
    }

    /// A water-level meter of `capacity` units leaking at `leak`: the bucket of `leak` and
    /// `burst = capacity`, refusing more than `capacity` under every leak.
    pub(crate) fn meter(capacity: u32, leak: Limit) -> TokenBucketQuota {
        TokenBucketQuota {
            capped: true,
            ..TokenBucketQuota::new(leak, capacity)
        }
    }

    /// Units at `now` (ns on the map's clock) past `base`, saturating at both ends.
    #[inline(always)]
    pub(crate) fn units(&self, base: u64, now: Nanos) -> u64 {
        let d = now.as_u64().saturating_sub(base).min(D_MAX);
        self.scale.units(d).min(U_MAX)
    }

    /// The check of `n` (`1..=burst`) tokens on state `x` at `u`: the new state, or the
    /// denial. Reads nothing but its arguments.
    #[inline(always)]
    fn step(&self, x: u64, u: u64, n: u32, base: u64, now: Nanos) -> Result<u64, Denied> {
        let cost = u64::from(n) * self.scale.one;
        let x2 = x.max(u) + cost;
        if x2 <= u + self.tau {
            Ok(x2)
        } else {
            // Refused with `n <= burst`, so `x >= u` (from `x < u` the check ends at
            // `u + cost <= u + tau`) and `x2 = x + cost`: the retry time, from the word
            // alone, need not wait for the clock reading's conversion.
            Err(self.denied(x + cost, base, now))
        }
    }

    /// The refusal of a check that left the word at `x2 > u + tau`, with its retry time:
    /// inline, as a check at its limit is mostly refusals.
    #[inline(always)]
    pub(crate) fn denied(&self, x2: u64, base: u64, now: Nanos) -> Denied {
        if self.zero {
            return self.denied_slow(x2, base, now);
        }
        // A limit that refills (`per >= 2^63`) and `x2 > tau`: `nanos_ceil_pos` applies.
        let (per, per_shift) = (self.scale.per, self.scale.per_shift);
        match crate::scale::nanos_ceil_pos(x2 - self.tau, per, per_shift) {
            Some(ns) => match ns.checked_add(base) {
                Some(at) => Denied::new(now, Some(Nanos::new(at))),
                None => self.denied_slow(x2, base, now),
            },
            None => self.denied_slow(x2, base, now),
        }
    }

    /// [`TokenBucketQuota::denied`]'s rare cases: a zero limit, and a retry time past the end
    /// of time.
    #[cold]
    fn denied_slow(&self, x2: u64, base: u64, now: Nanos) -> Denied {
        if self.zero {
            return Denied::new(now, None);
        }
        let ns = self.scale.nanos_ceil(x2 - self.tau);
        let at = u64::try_from(u128::from(base) + ns).unwrap_or(u64::MAX);
        Denied::new(now, Some(Nanos::new(at)))
    }
}

impl AsRef<TokenBucketQuota> for TokenBucketQuota {
    fn as_ref(&self) -> &TokenBucketQuota {
        self
    }
}

/// The map's rule: `x` is the key's theoretical arrival time in its quota's units (module
/// docs, "The state word").
impl WordRule for TokenBucketQuota {
    type Word = u64;
    /// `(limit, burst)` of each quota.
    type Quotas = Vec<(Limit, u32)>;
    const NAME: &'static str = "KeyedTokenBucket";

    fn rules(
        quotas: &Self::Quotas,
        _: impl FnOnce() -> Nanos,
    ) -> Result<Vec<TokenBucketQuota>, ConfigError> {
        Ok(quotas
            .iter()
            .map(|&(limit, burst)| TokenBucketQuota::new(limit, burst))
            .collect())
    }

    fn debug_quotas(rules: &[TokenBucketQuota], d: &mut fmt::DebugStruct<'_, '_>) {
        let quotas: Vec<_> = rules.iter().map(|q| (q.limit, q.burst)).collect();
        d.field("quotas", &quotas);
    }

    /// Full at `now`: `x = units(now)`.
    #[inline(always)]
    fn born(&self, base: u64, now: Nanos) -> u64 {
        self.units(base, now)
    }

    #[inline(always)]
    fn check(&self, x: u64, base: u64, now: Nanos, n: u32) -> Result<Option<u64>, Denied> {
        self.check_units(x, self.units(base, now), base, now, n)
    }

    /// Full again: `x <= units(now)`, the state a key born at `now` or later starts from,
    /// or one with more tokens.
    #[inline]
    fn idle(&self, x: u64, base: u64, now: Nanos) -> bool {
        x <= self.units(base, now)
    }
}

/// Per-key token buckets, one 64-bit word per key in a table shared by all keys. See the
/// [module docs](self) for the word, the table, eviction and the hasher.
///
/// ```
/// use std::net::IpAddr;
/// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit};
///
/// // 10 requests per second per client IP, bursts of 20.
/// let per_ip = KeyedTokenBucket::new(Limit::per_second(10.0).unwrap(), 20);
/// let client: IpAddr = "192.0.2.7".parse().unwrap();
/// assert!(per_ip.check(&client).is_ok());
/// assert_eq!(per_ip.len(), 1);
/// ```
///
/// Quotas per key: a small table of configurations, and a function that picks one for each
/// new key.
///
/// ```
/// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
///
/// let per_user = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1) // quota 0
///     .quota(Limit::per_second(100.0).unwrap(), 100) // quota 1
///     .classify(|user: &String| usize::from(user.starts_with("staff:")))
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert!(per_user.check_n_at("alice", Nanos::ZERO, 1).is_ok());
/// let denied = per_user.check_n_at("alice", Nanos::ZERO, 1).unwrap_err();
/// assert_eq!(denied.retry_at(), Some(Nanos::new(1_000_000_000)));
/// assert!(per_user.check_n_at("staff:bob", Nanos::ZERO, 100).is_ok());
/// ```
///
/// # A check
/// `check_n_at(key, now, n)` takes `n` tokens for `key` at `now`, inserting the key if it is
/// new. A denial writes nothing and says when the same check would pass (`None`: never, `n`
/// is above the key's burst or its limit is zero); so does a refusal because the map is full
/// ([`WhenFull::Deny`]). `n == 0` passes unless a stale reading finds the key in deficit.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
/// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(4.0).unwrap(), 2)
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// assert!(k.check_n_at(&1, Nanos::ZERO, 2).is_ok());
/// let d = k.check_n_at(&1, Nanos::new(100_000_000), 1).unwrap_err();
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(150)));
/// ```
///
/// # Idle keys
/// `evict_idle_at(now)` evicts every key whose bucket is full at `now`; returns how many went.
/// Afterwards, if the table holds more evicted slots than live keys, rebuilds it without them (the
/// memory comes back once no thread still reads the old table).
///
/// `now` may be any time and no key ever grants more for it (keys revived or inserted
/// after this call are born at `now` or later); a `now` ahead of the clock only makes
/// their next buckets stricter until the clock gets there.
///
/// ```
/// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
/// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(2.0).unwrap(), 1)
///     .clock(ManualClock::default())
///     .build()
///     .unwrap();
/// let _ = k.check_n_at(&1, Nanos::ZERO, 1);
/// let _ = k.check_n_at(&2, Nanos::new(400_000_000), 1);
/// assert_eq!(k.evict_idle_at(Nanos::new(500_000_000)), 1); // key 1 is full again
/// assert_eq!(k.len(), 1);
/// ```
pub type KeyedTokenBucket<K, S = RandomState, C = QuantaClock> =
    InlineMap<K, TokenBucketQuota, S, C>;

impl<K> InlineMap<K, TokenBucketQuota, RandomState, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// `limit` tokens per second per key, bursts of `burst`, on the shared quanta clock, with
    /// at most 2^20 (1 048 576) keys and sweeps every 10 s.
    ///
    /// ```
    /// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(5.0).unwrap(), 1);
    /// assert!(k.check(&42u64).is_ok());
    /// assert!(k.check(&42u64).is_err());
    /// ```
    pub fn new(limit: Limit, burst: u32) -> Self {
        Self::builder(limit, burst)
            .build()
            .unwrap_or_else(|_| unreachable!("the defaults are valid"))
    }

    /// A builder whose quota 0 is `limit`/`burst`: add quotas with
    /// `quota` and pick one per key with
    /// [`classify`](InlineMapBuilder::classify).
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed::token_bucket::{KeyedTokenBucket, WhenFull};
    /// use turnstile::Limit;
    /// let k = KeyedTokenBucket::<u32>::builder(Limit::per_second(5.0).unwrap(), 10)
    ///     .max_keys(100_000)
    ///     .when_full(WhenFull::Deny)
    ///     .sweep_every(Duration::from_secs(30))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(limit: Limit, burst: u32) -> InlineMapBuilder<K, TokenBucketQuota> {
        InlineMapBuilder::with_quotas(vec![(limit, burst)])
    }
}

impl<K, S, C> InlineMap<K, TokenBucketQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// The IETF RateLimit fields of `key`'s bucket at `now`, exactly as
    /// [`TokenBucket`](crate::TokenBucket)'s `quota_at` (same units, same rounding): `q` = its
    /// quota's burst, `w` = `burst / limit` rounded up to the nanosecond, `r` = the whole
    /// tokens at `now` (0 in deficit, which only a reading older than the key's last grant
    /// finds), `t` = until the bucket is full, rounded up (the first nanosecond at which
    /// it is). Infinite limit: `r = q`, `w = t = 0`; zero limit: `w = Duration::MAX` and `t`
    /// 0 if full, else `Duration::MAX`. A key the map does not hold (new, or evicted as
    /// idle) gets a fresh bucket's fields, full, of the quota `classify` picks for it (an
    /// evicted key keeps its quota). Always `Some`: the `Option` is `Keyed::quota_at`'s
    /// shape, for code written against both.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos, QuotaStatus};
    /// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(10.0).unwrap(), 5)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 5).unwrap();
    /// let s = k.quota_at(&1, Nanos::new(250_000_000)).unwrap(); // 2.5 tokens
    /// assert_eq!(s, QuotaStatus {
    ///     quota: 5,
    ///     window: Duration::from_millis(500),
    ///     remaining: 2,
    ///     reset: Duration::from_millis(250),
    /// });
    /// assert_eq!(k.quota_at(&2, Nanos::ZERO).unwrap().remaining, 5); // a new key: full
    /// ```
    pub fn quota_at<Q>(&self, key: &Q, now: Nanos) -> Option<QuotaStatus>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (quota, x) = match self.map.read(key) {
            Some((quota, x)) => (quota, x),
            None => (self.map.classify(&key.to_owned()), None),
        };
        Some(quota.status(x, self.map.base(), now))
    }

    /// Gives `n` tokens back to `key` at `now`, for a grant that a second, layered limit then
    /// refused: `tokens = min(burst, tokens(now) + n)`, one CAS on the key's word
    /// (`x' = max(x - n * one, u(now))`), exactly [`TokenBucket`](crate::TokenBucket)'s
    /// `refund_n_at`, where why it is exact (and the one race where a take in between can
    /// make it give back up to the refill that take would have lost to the cap) is spelled
    /// out. `now` may be the grant's reading or any later one. Returns `true`.
    ///
    /// A key the map no longer holds live (evicted, so it was full at the sweep's time, which
    /// is after the grant) has nothing to give back: `true`, nothing written; a key the
    /// map never held (permits never taken) too. A frozen word (a resize copying the key)
    /// waits for the new table, as a grant does. Eviction stays exact: a refund lowers `x`
    /// and so changes the word, which makes a racing sweep's CAS fail; the budget of the
    /// module docs holds for **net** grants (grants minus refunds).
    ///
    /// ```
    /// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(1.0).unwrap(), 2)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 2).unwrap();
    /// assert!(k.refund_n_at(&1, Nanos::ZERO, 2));
    /// assert_eq!(k.tokens_at(&1, Nanos::ZERO), 2.0);
    /// ```
    pub fn refund_n_at<Q>(&self, key: &Q, now: Nanos, n: u32) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if n == 0 {
            return true;
        }
        let base = self.map.base();
        self.map.update(key, |q, x| {
            let x2 = x
                .saturating_sub(u64::from(n) * q.scale.one)
                .max(q.units(base, now));
            // Nothing taken (infinite limit) or the bucket is full at `now`: no write.
            (!q.inf && x2 < x).then_some(x2)
        });
        true
    }

    /// The tokens `key` holds at `now` (quota 0's burst if the key is absent or evicted); may be
    /// negative for a reading older than the key's last grant.
    ///
    /// ```
    /// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(10.0).unwrap(), 5)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// k.check_n_at(&1, Nanos::ZERO, 5).unwrap();
    /// assert_eq!(k.tokens_at(&1, Nanos::new(250_000_000)), 2.5);
    /// ```
    pub fn tokens_at<Q>(&self, key: &Q, now: Nanos) -> f64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        held(&self.map, key, now).map_or(f64::from(self.map.rules()[0].burst), |(_, t)| t)
    }
}

/// The tokens a key the map holds live has at `now`, capped at its burst (negative in
/// deficit), with its quota; `None` for a key absent or evicted.
pub(crate) fn held<'m, K, R, S, C, Q>(
    map: &'m WordMap<K, R, S, C>,
    key: &Q,
    now: Nanos,
) -> Option<(&'m TokenBucketQuota, f64)>
where
    K: Eq + Hash + Clone + Send + Sync + 'static + Borrow<Q>,
    R: WordRule<Word = u64> + AsRef<TokenBucketQuota>,
    Q: Hash + Eq + ?Sized,
    S: BuildHasher,
    C: Clock,
{
    let (q, x) = map.read(key)?;
    let q = q.as_ref();
    Some((q, q.tokens(x?, map.base(), now)))
}

impl<K, S, C> InlineMapBuilder<K, TokenBucketQuota, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Adds a quota: the first call adds quota 1 (quota 0 is the builder's), and so on, up to
    /// [`MAX_QUOTAS`] in all (more is [`ConfigError::TooManyQuotas`]).
    ///
    /// ```
    /// use turnstile::{keyed::token_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .quota(Limit::INF, 1) // quota 1: unlimited
    ///     .classify(|ip: &[u8; 4]| usize::from(ip[0] == 10))
    ///     .build()
    ///     .unwrap();
    /// for _ in 0..100 {
    ///     assert!(k.check(&[10, 0, 0, 1]).is_ok());
    /// }
    /// ```
    pub fn quota(mut self, limit: Limit, burst: u32) -> Self {
        self.quotas.push((limit, burst));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};

    use crate::ManualClock;

    /// A resize parked with every word of the old table frozen: a grant on a key it holds
    /// completes meanwhile, and lands in the new table.
    #[test]
    fn a_grant_does_not_wait_for_a_resize_in_progress() {
        let k = Arc::new(
            KeyedTokenBucket::<u64, _, _>::builder(Limit::per_second(1.0).unwrap(), 2)
                .clock(ManualClock::default())
                .build()
                .unwrap(),
        );
        // 16 slots, at most 14 used: the 15th key resizes.
        for key in 0..14u64 {
            k.check_n_at(&key, Nanos::ZERO, 1).unwrap();
        }
        assert_eq!(k.resizes(), 0);
        let (parked_tx, parked) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let resizer = {
            let k = k.clone();
            std::thread::spawn(move || {
                crate::keyed::word_map::tests::RESIZE_HOOK.with(|h| {
                    *h.borrow_mut() = Some(Box::new(move || {
                        parked_tx.send(()).unwrap();
                        let _ = go_rx.recv();
                    }))
                });
                k.check_n_at(&100, Nanos::ZERO, 1)
            })
        };
        parked
            .recv_timeout(Duration::from_secs(10))
            .expect("the resize reached its hook");
        let (done_tx, done) = mpsc::channel();
        let checker = {
            let k = k.clone();
            std::thread::spawn(move || done_tx.send(k.check_n_at(&0, Nanos::ZERO, 1)).unwrap())
        };
        let granted = done.recv_timeout(Duration::from_secs(10));
        go.send(()).unwrap();
        assert!(resizer.join().unwrap().is_ok());
        checker.join().unwrap();
        assert!(granted
            .expect("a check of a held key waited for the resize")
            .is_ok());
        assert_eq!(k.resizes(), 1);
        // The grant made during the resize is the new table's: key 0's burst of 2 is spent.
        assert!(k.check_n_at(&0, Nanos::ZERO, 1).is_err());
        assert_eq!(k.len(), 15);
    }

    #[test]
    fn the_range_is_at_least_eight_and_a_half_years_up_to_1e9() {
        const YEAR: f64 = 365.25 * 86_400e9;
        for l in [1e-3, 1.0, 7.0, 1e3, 3e7, 1e8, 1e9] {
            for burst in [1, 1000, u32::MAX] {
                let q = TokenBucketQuota::new(Limit::per_second(l).unwrap(), burst);
                if q.zero {
                    continue;
                }
                // The first reading at which units saturate.
                let mut lo = 0u64;
                let mut hi = D_MAX;
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if q.units(0, Nanos::new(mid)) >= U_MAX {
                        hi = mid;
                    } else {
                        lo = mid + 1;
                    }
                }
                assert!(lo as f64 >= 8.5 * YEAR, "limit {l}, burst {burst}: {lo} ns");
            }
        }
    }
}
