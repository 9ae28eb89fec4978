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
//! and one CAS, nothing else (the README has the measured figures).
//!
//! The protocol (every atomic below is the slot's `state` unless named):
//!
//! * **Lookup** (lock-free, no write): pin an epoch (`crossbeam-epoch`), load the table
//!   pointer (`Acquire`), probe from `hash & mask`: load each state (`Acquire`); `EMPTY` ends
//!   the probe (the key is absent); any other state has its key written and published, so the
//!   key is compared.
//! * **Check** (lock-free, one CAS): on a live, unfrozen word, compute `x'`; deny from the load
//!   alone, or CAS the word to `x'` (`Relaxed`: the word is the whole state, so a CAS that
//!   succeeds on the value it decided from is linearizable; `Acquire` on failure, see
//!   revival). A failed CAS retries on the value it found.
//! * **Insert** (a key absent from the table; serialized by the map's `writer` mutex, which no
//!   check of an existing key takes): under the lock, probe again; claim the first `EMPTY`
//!   slot, write the key into it, then `store(live, Release)`. Only the lock holder turns an
//!   `EMPTY` slot into anything else, so the key is written exactly once, before any reader
//!   can see a non-`EMPTY` state (`Release`/`Acquire`), and never written again while the
//!   table lives: **a slot is never reused for another key** within a table.
//! * **Evict** (a sweep at `J`): publish `J` (`judged.fetch_max`), then for each live word
//!   with `x <= units(J)` CAS it to `DEAD(q)` (`Release`). No fence anywhere: the word is the
//!   only state, so the CAS succeeds only if no grant changed the word since the sweep judged
//!   it idle (a grant strictly increases `x`; a revival to an equal word is the same state),
//!   and a grant's CAS on a word that became `DEAD` fails, reloads `DEAD` and revives.
//! * **Revive** (a check finding its key `DEAD`): reserve room under `max_keys`, then CAS
//!   `DEAD(q) -> live(q, units(B))` with `B = max(now, judged)` read after the `Acquire` load
//!   that saw `DEAD`; then check on the new word. A returning key reuses its slot, its own key.
//! * **Resize** (grow, or rebuild to drop `DEAD` slots; under `writer`): hash and clone every
//!   key first (user code, which may panic, runs before anything changes). Freeze the `DEAD`
//!   words (CAS `s -> s | FROZEN`, `Acquire`: see step 2 below): a frozen dead word can no
//!   longer be revived, so what is left to copy is known, and the new table is sized for it.
//!   Store the new table in the old one's `next` (`Release`). Then, for each live word:
//!   **copy it** into the new table (the key, then its word, as an insert does), **then
//!   freeze it** (CAS from the copied value, `AcqRel`); if a grant, refund or eviction changed
//!   the word in between, the CAS fails, the newer word is copied over the first and the CAS
//!   retried. Publish the new table (`swap`, `Release`) and retire the old one to the epoch
//!   collector, which frees it (and its keys) once no pinned thread can still read it.
//! * **A check on a frozen word** goes on in the table the resize is filling: a live word was
//!   frozen only once its exact value was in the new table, and no thread writes the new
//!   slot before that freeze (only a frozen old slot leads to it; the table is not published
//!   yet), so the new slot is the word's continuation. The check loads `next` (its `Acquire`
//!   load of the frozen word, which the freeze's `Release` half published, makes `next` and
//!   the copy visible), finds the key there and runs its CAS loop on that word, following
//!   `next` again if a later resize has frozen that one too. **No check of a key the table
//!   holds waits for a resize**, nor for the thread doing it: it never needs the resizer to
//!   make progress. A frozen *dead* word was not copied: its check inserts the key again, and
//!   the insert (under `writer`) comes after the resize, as any new key's does. `EMPTY` slots
//!   need no freeze: only the lock holder fills them.
//!
//! loom checks the protocol in `loom-tests/tests/keyed_bucket.rs` (check ‖ evict with
//! revival, insert ‖ check ‖ evict, check ‖ growth, two grants ‖ growth, refund ‖ growth,
//! check ‖ purge, a stale reading across an eviction); a unit test parks a resize with every
//! word frozen and shows a grant on a held key completes.
//!
//! # Memory and the key bound
//! A slot is `8 + size_of::<K>()` bytes rounded up to `K`'s alignment (16 for `u64`, 32 for
//! [`IpAddr`](std::net::IpAddr), whose 17 bytes round up to 24 beside the word). The map holds
//! at most `max_keys` keys ([`DEFAULT_MAX_KEYS`], 2^20, unless the builder says otherwise),
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
//! it; here it is shorter, as the limiter *is* the word):
//!
//! 1. A grant is a CAS on the live word; an eviction is a CAS of the same word, from the
//!    value the sweep judged idle, to `DEAD`. Of two CASes on one word from one value, one
//!    fails: either the grant lands and the eviction fails, or the eviction lands, the grant's
//!    CAS fails, and the check revives the key and runs again. No grant is lost; none counts
//!    twice.
//! 2. The evicted word had `x <= units(J)`. The sweep published `J` before its `Release` CAS,
//!    and a reviver reads `judged` after an `Acquire` load that saw `DEAD`; a key purged by a
//!    resize and inserted again is inserted under the `writer` lock after that resize, which
//!    read `DEAD` with an `Acquire` CAS. Either way the new word is born at `B >= J`:
//!    `x = units(B) >= units(J) >=` the evicted `x`.
//! 3. So `x` never decreases over a key's whole history, across any number of evictions,
//!    and the budget above holds for every key as if one bucket had served it all along. The
//!    price is the one [`Keyed`](crate::Keyed) pays: a reading older than the last sweep that
//!    evicted its key is judged against a bucket born at the sweep (it holds
//!    `(B - t) * limit` tokens fewer than full at `t`).
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
//! [`KeyedTokenBucketBuilder::max_keys`] bounds how many it can hold. A faster hasher can be
//! chosen with [`KeyedTokenBucketBuilder::hasher`]: `foldhash::fast::RandomState` (randomly
//! seeded per map; no cryptographic claim, and its authors do not claim resistance to an
//! attacker who can time the map, but a flood shows up as a slower map, never as a wrong
//! answer) is ~20 ns faster per check here (std's SipHash of a `u64` is ~18 ns, foldhash's
//! ~1); a fixed, unseeded hasher is only for keys no client chooses.
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
use std::mem::MaybeUninit;
use std::time::Duration;

use crossbeam_utils::Backoff;

pub use crate::keyed::{WhenFull, DEFAULT_MAX_KEYS, DEFAULT_SWEEP_EVERY};

use crate::clock::{Clock, Nanos, QuantaClock};
use crate::error::ConfigError;
use crate::limit::Limit;
use crate::limiter::{Denied, QuotaStatus};
use crate::scale::{Scale, D_MAX, TAU_MAX};
use crate::sweeper::Sweeper;
use crate::sync::{AtomicU64, Mutex, Ordering}; // Mutex: inserts of new keys and resizes only, never a check of an existing key

#[cfg(not(loom))]
use std::sync::atomic::{AtomicPtr, AtomicUsize};

#[cfg(loom)]
use loom::sync::atomic::{AtomicPtr, AtomicUsize};

/// The most quotas one map holds (the state word's 4-bit tag, with 0 for `EMPTY`/`DEAD`).
pub const MAX_QUOTAS: usize = 15;

const FROZEN: u64 = 1 << 63;
const X_BITS: u32 = 59;
const X_MASK: u64 = (1 << X_BITS) - 1;
const EMPTY: u64 = 0;
/// The largest `u`: a granted `x' <= u + tau <= U_MAX + TAU_MAX` still fits in 59 bits.
const U_MAX: u64 = X_MASK - TAU_MAX;
// A granted word fits its 59 bits.
const _: () = assert!(U_MAX + TAU_MAX <= X_MASK);

/// The smallest table (slots). Under loom, 4: a model then grows the table with its fourth
/// key.
const MIN_SLOTS: usize = if cfg!(loom) { 4 } else { 16 };
/// A sweep rebuilds the table when it leaves more `DEAD` slots than live keys, and at least
/// this many (smaller tables are left to the next insert-triggered resize). Under loom, 2.
const PURGE_MIN: usize = if cfg!(loom) { 2 } else { 32 };

#[inline(always)]
fn live(q: usize, x: u64) -> u64 {
    ((q as u64 + 1) << X_BITS) | x
}

#[inline(always)]
fn dead(q: usize) -> u64 {
    1 + q as u64
}

/// The tag: `0` for `EMPTY`/`DEAD`, else the quota plus one.
#[inline(always)]
fn tag(s: u64) -> usize {
    ((s & !FROZEN) >> X_BITS) as usize
}

/// The quota a live or dead word belongs to.
#[inline(always)]
fn quota_of(s: u64) -> usize {
    match tag(s) {
        0 => ((s & X_MASK) - 1) as usize,
        t => t - 1,
    }
}

/// The slots of a table that holds `keys` keys without growing (at most 7/8 used, a power of
/// two, at least [`MIN_SLOTS`]); saturates for absurd counts, which then fail to allocate as
/// any huge allocation does.
fn slots_for(keys: usize) -> usize {
    let need = keys.saturating_add(1).saturating_mul(8).div_ceil(7);
    need.checked_next_power_of_two()
        .unwrap_or(1 << (usize::BITS - 1))
        .max(MIN_SLOTS)
}

/// One configuration of the quota table, precomputed off the hot path.
#[derive(Clone, Copy, Debug)]
struct Quota {
    limit: Limit,
    burst: u32,
    scale: Scale,
    /// `burst * one`: the whole burst in units.
    tau: u64,
    /// `Limit::INF`: every check passes and nothing is written.
    inf: bool,
    /// No refill (`Limit::ZERO`, or a limit too low to refill its burst in 146 years): units
    /// never advance (`scale.mul == 0`), so the burst is all a key ever gets.
    zero: bool,
}

impl Quota {
    fn new(limit: Limit, burst: u32) -> Quota {
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
        Quota {
            limit,
            burst,
            scale,
            tau: u64::from(burst) * scale.one,
            inf,
            zero,
        }
    }

    /// Units at `now` (ns on the map's clock) past `base`, saturating at both ends.
    #[inline(always)]
    fn units(&self, base: u64, now: Nanos) -> u64 {
        let d = now.as_u64().saturating_sub(base).min(D_MAX);
        self.scale.units(d).min(U_MAX)
    }

    /// The check of `n` (`1..=burst`) tokens on live word `s` at `u`: the new word, or the
    /// denial. Reads nothing but its arguments.
    #[inline(always)]
    fn step(&self, s: u64, u: u64, n: u32, base: u64, now: Nanos) -> Result<u64, Denied> {
        let x = s & X_MASK;
        let cost = u64::from(n) * self.scale.one;
        let x2 = x.max(u) + cost;
        if x2 <= u + self.tau {
            Ok((s & !X_MASK) | x2)
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
    fn denied(&self, x2: u64, base: u64, now: Nanos) -> Denied {
        let (per, per_shift) = (self.scale.per, self.scale.per_shift);
        match crate::scale::nanos_ceil_hot(x2 - self.tau, per, per_shift) {
            Some(ns) if !self.zero => match ns.checked_add(base) {
                Some(at) => Denied::new(now, Some(Nanos::new(at))),
                None => self.denied_slow(x2, base, now),
            },
            _ => self.denied_slow(x2, base, now),
        }
    }

    /// [`Quota::denied`]'s rare cases: a zero limit, and a retry time past the end of time.
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

/// Per-key token buckets, one 64-bit word per key in a table shared by all keys. See the
/// [module docs](self) for the word, the table, eviction and the hasher.
///
/// ```
/// use std::net::IpAddr;
/// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
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
/// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
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
pub struct KeyedTokenBucket<K, S = RandomState, C: Clock = QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
{
    /// The current table; replaced only by a resize, under `writer`.
    table: AtomicPtr<Table<K>>,
    /// The quota table indexed by **tag** (quota `q` at `q + 1`), so that a live word finds
    /// its configuration with one index that needs no bounds check (a tag is 4 bits). Tags
    /// past the configured quotas, and tag 0, hold quota 0 and are never a live word's.
    by_tag: Box<[Quota; 16]>,
    /// How many quotas were configured.
    quota_count: usize,
    classify: Box<dyn Fn(&K) -> usize + Send + Sync>,
    hasher: S,
    /// The base of every key's `x`: ns on `clock`.
    base: u64,
    /// Serializes inserts of absent keys and resizes; never taken by a check of a key the
    /// table holds (live, dead or frozen).
    writer: Mutex<()>, // inserts and resizes only, never a check of an existing key
    /// Live keys plus reservations for keys being inserted or revived.
    len: AtomicU64,
    max_keys: u64,
    when_full: WhenFull,
    sweep_every: u64,
    /// Whether checks sweep inline, or a thread of the map's own ([`Self::spawn_sweeper`]).
    sweeper: Sweeper,
    last_sweep: AtomicU64,
    /// The latest time any sweep judged at; only grows.
    judged: AtomicU64,
    /// Tables replaced so far (grown or purged); a metric.
    resizes: AtomicU64,
    /// The fewest slots a table has (from `KeyedTokenBucketBuilder::capacity`).
    min_slots: usize,
    clock: C,
}

/// One key: its state word and the key, written once before the word is published.
struct Slot<K> {
    state: AtomicU64,
    key: KeyCell<K>,
}

/// A power-of-two array of slots.
struct Table<K> {
    slots: Box<[Slot<K>]>,
    mask: usize,
    /// Non-`EMPTY` slots; changed only under `writer` (or before the table is published).
    used: AtomicUsize,
    /// The table a resize is copying this one into: set (`Release`) before the first live
    /// word is frozen, so a check that finds its word frozen finds the word's continuation
    /// there (module docs, "Resize"). Not owned: the map owns its current table, the epoch
    /// collector the retired ones.
    next: AtomicPtr<Table<K>>,
}

impl<K> Table<K> {
    fn new(slots: usize) -> Table<K> {
        debug_assert!(slots.is_power_of_two());
        Table {
            slots: (0..slots)
                .map(|_| Slot {
                    state: AtomicU64::new(EMPTY),
                    key: KeyCell::empty(),
                })
                .collect(),
            mask: slots - 1,
            used: AtomicUsize::new(0),
            next: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The table this one is being copied into, if a resize has started; valid while the
    /// guard that reached `self` is pinned (it is retired only after a later resize, which
    /// starts after this one has published it).
    #[inline]
    fn next(&self) -> Option<&Table<K>> {
        // SAFETY: set once, by a resize, to a table that is the map's current one or retired
        // to the epoch collector after every guard pinned before its own replacement (ours
        // included) is dropped. `Acquire` pairs with the resize's `Release` store.
        unsafe { self.next.load(Ordering::Acquire).as_ref() }
    }

    /// The slot holding `key` (live, dead or frozen), if any.
    #[inline(always)]
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<&Slot<K>>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let mut i = hash as usize & self.mask;
        // At most seven eighths of the slots are used, so an EMPTY slot ends every probe;
        // the bound is for safety only.
        for _ in 0..=self.mask {
            // SAFETY: `i <= mask` and `slots.len() == mask + 1`.
            let slot = unsafe { self.slots.get_unchecked(i) };
            let s = slot.state.load(Ordering::Acquire);
            if s == EMPTY {
                return None;
            }
            // SAFETY: `s != EMPTY` was loaded with `Acquire`, and the slot's key was written
            // before the `Release` store that first made its state non-`EMPTY` (`claim`);
            // keys are never written again while the table is reachable (module docs).
            if unsafe { slot.key.with(|k| k.borrow() == key) } {
                return Some(slot);
            }
            i = (i + 1) & self.mask;
        }
        None
    }

    /// Puts `key` with word `state` in the first `EMPTY` slot of its probe. Only under
    /// `writer` (or on a table not yet published), with room left ([`Table::has_room`]).
    fn claim(&self, hash: u64, key: K, state: u64) -> &Slot<K> {
        let mut i = hash as usize & self.mask;
        loop {
            let slot = &self.slots[i];
            // Relaxed: only the lock holder turns EMPTY into anything else.
            if slot.state.load(Ordering::Relaxed) == EMPTY {
                // SAFETY: the slot is EMPTY, so no reader reads its key (`find` compares keys
                // only after seeing a non-EMPTY state), and only we (holding `writer`) write
                // it; the `Release` store below publishes the key with the state.
                unsafe { slot.key.write(key) };
                slot.state.store(state, Ordering::Release);
                self.used.fetch_add(1, Ordering::Relaxed);
                return slot;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Whether one more key fits under the load bound, seven eighths (hashbrown's, which
    /// governor's dashmap shards use): at most 16 bytes per slot for `u64` keys against
    /// hashbrown's 17 per bucket, at the same load. Linear probing at 7/8 averages 4.5 probes
    /// for a key present (16-byte slots: 4 to a cache line) and ~32 for one absent, which
    /// only the first check of a new key pays.
    fn has_room(&self) -> bool {
        (self.used.load(Ordering::Relaxed) + 1) * 8 <= self.slots.len() * 7
    }
}

impl<K> Drop for Table<K> {
    fn drop(&mut self) {
        for slot in self.slots.iter_mut() {
            if slot.state.load(Ordering::Relaxed) != EMPTY {
                // SAFETY: a non-EMPTY slot's key was written (`claim`); `&mut self` means no
                // reader is left (the table was unpublished and its epoch has passed, or the
                // map itself is being dropped).
                unsafe { slot.key.drop_in_place() };
            }
        }
    }
}

/// A key written once (under the writer lock, while its slot is `EMPTY`) and then only read.
struct KeyCell<K>(Cell<MaybeUninit<K>>);

#[cfg(not(loom))]
type Cell<T> = std::cell::UnsafeCell<T>;
#[cfg(loom)]
type Cell<T> = loom::cell::UnsafeCell<T>;

// SAFETY: the cell is shared between threads only under the write-once protocol of
// `Table::claim` / `Table::find` (module docs): the one write happens-before every read.
// Keys are sent to the thread that frees the table, hence `K: Send`, and read by many
// threads, hence `K: Sync`.
unsafe impl<K: Send + Sync> Sync for KeyCell<K> {}
// SAFETY: as above; the cell owns its `K`.
unsafe impl<K: Send> Send for KeyCell<K> {}

impl<K> KeyCell<K> {
    fn empty() -> Self {
        KeyCell(Cell::new(MaybeUninit::uninit()))
    }

    /// # Safety
    /// The cell is uninitialized and nobody else reads or writes it until a `Release`
    /// publication that readers `Acquire` before reading.
    unsafe fn write(&self, key: K) {
        #[cfg(not(loom))]
        (*self.0.get()).write(key);
        #[cfg(loom)]
        self.0.with_mut(|p| {
            (*p).write(key);
        });
    }

    /// # Safety
    /// The key was written, and that write happens-before this call.
    #[inline(always)]
    unsafe fn with<R>(&self, f: impl FnOnce(&K) -> R) -> R {
        #[cfg(not(loom))]
        return f((*self.0.get()).assume_init_ref());
        #[cfg(loom)]
        return self.0.with(|p| f((*p).assume_init_ref()));
    }

    /// # Safety
    /// The key was written, and nobody else can read it any more.
    unsafe fn drop_in_place(&mut self) {
        #[cfg(not(loom))]
        self.0.get_mut().assume_init_drop();
        #[cfg(loom)]
        self.0.with_mut(|p| (*p).assume_init_drop());
    }
}

/// Epoch reclamation of retired tables: `crossbeam-epoch`, or under loom a stand-in that never
/// frees them (a model is short), so the models check the table protocol itself.
#[cfg(not(loom))]
mod reclaim {
    pub(super) use crossbeam_epoch::Guard;

    #[inline(always)]
    pub(super) fn pin() -> Guard {
        crossbeam_epoch::pin()
    }

    /// Frees `table` once no thread pinned now can still read it.
    ///
    /// # Safety
    /// `table` came from `Box::into_raw` and is no longer reachable from the map.
    pub(super) unsafe fn retire<T: Send + 'static>(guard: &Guard, table: *mut T) {
        // SAFETY (of the deferred drop): crossbeam runs it after every thread pinned at this
        // point has unpinned; any thread pinning later loads the new table pointer.
        guard.defer_unchecked(move || drop(Box::from_raw(table)));
        guard.flush();
    }
}

#[cfg(loom)]
mod reclaim {
    pub(super) struct Guard;

    pub(super) fn pin() -> Guard {
        Guard
    }

    /// Leaks: loom threads may still read the table, and a model is short.
    pub(super) unsafe fn retire<T>(_: &Guard, _: *mut T) {}
}

impl<K> KeyedTokenBucket<K, RandomState, QuantaClock>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    /// `limit` tokens per second per key, bursts of `burst`, on the shared quanta clock, with
    /// at most [`DEFAULT_MAX_KEYS`] keys and sweeps every 10 s.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
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
    /// [`KeyedTokenBucketBuilder::quota`] and pick one per key with
    /// [`KeyedTokenBucketBuilder::classify`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::keyed_bucket::{KeyedTokenBucket, WhenFull};
    /// use turnstile::Limit;
    /// let k = KeyedTokenBucket::<u32>::builder(Limit::per_second(5.0).unwrap(), 10)
    ///     .max_keys(100_000)
    ///     .when_full(WhenFull::Deny)
    ///     .sweep_every(Duration::from_secs(30))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.max_keys(), 100_000);
    /// ```
    pub fn builder(limit: Limit, burst: u32) -> KeyedTokenBucketBuilder<K> {
        KeyedTokenBucketBuilder {
            quotas: vec![(limit, burst)],
            capacity: 0,
            classify: Box::new(|_| 0),
            hasher: RandomState::new(),
            max_keys: DEFAULT_MAX_KEYS,
            when_full: WhenFull::Deny,
            sweep_every: DEFAULT_SWEEP_EVERY.as_nanos() as u64,
            clock: QuantaClock::new(),
        }
    }
}

/// How one check ended on the slot it found.
enum Outcome {
    Done(Result<(), Denied>),
    /// The slot is frozen by a resize. A live word was copied to the table the resize is
    /// filling before it was frozen: the check goes on there ([`Table::next`]). A dead one
    /// was not copied: the key is inserted again, after the resize.
    Frozen,
}

/// Where a check that found `slot` of `table` frozen goes on: the table the resize copies
/// into, if the word is live (copied there before it was frozen); `None` for a dead word,
/// which is not copied.
#[inline]
fn forward<'g, K>(table: &'g Table<K>, slot: &Slot<K>) -> Option<&'g Table<K>> {
    // `Acquire` pairs with the freeze's `AcqRel`: the copy and `next` are visible.
    if tag(slot.state.load(Ordering::Acquire)) == 0 {
        return None;
    }
    table.next()
}

impl<K, S, C> KeyedTokenBucket<K, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// The clock every check reads.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Clock, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8>::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .clock(ManualClock::new(Nanos::new(5)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.clock().now(), Nanos::new(5));
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The map's clock reading now: the time its plain (non-`_at`) checks use. An
    /// inherent method, so reading it needs no [`Clock`] import.
    ///
    /// ```
    /// use turnstile::{KeyedTokenBucket, Limit, ManualClock, Nanos};
    ///
    /// let l = KeyedTokenBucket::<u8>::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .clock(ManualClock::new(Nanos::new(7)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(l.now(), Nanos::new(7));
    /// ```
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// Keys currently held (evicted keys no longer count).
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// for ip in 0..5u32 {
    ///     let _ = k.check(&ip);
    /// }
    /// assert_eq!(k.len(), 5);
    /// ```
    pub fn len(&self) -> usize {
        usize::try_from(self.len.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    /// True if no key is held.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::<u32>::new(Limit::per_second(1.0).unwrap(), 1);
    /// assert!(k.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key bound ([`DEFAULT_MAX_KEYS`] unless the builder set one; `u64::MAX`: none).
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::<u32>::new(Limit::per_second(1.0).unwrap(), 1);
    /// assert_eq!(k.max_keys(), turnstile::keyed_bucket::DEFAULT_MAX_KEYS);
    /// ```
    pub fn max_keys(&self) -> u64 {
        self.max_keys
    }

    /// The table's slots (a power of two; each holds a key and its word): the memory the map
    /// holds is about `capacity() * size_of::<(u64, K)>()`.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::<u64>::new(Limit::per_second(1.0).unwrap(), 1);
    /// assert!(k.capacity().is_power_of_two());
    /// ```
    pub fn capacity(&self) -> usize {
        let guard = reclaim::pin();
        self.table(&guard).slots.len()
    }

    /// How many times the table has been replaced: grown by inserts, or rebuilt without its
    /// evicted keys. A metric: each replacement copies the live keys, under the lock that
    /// inserts of new keys take (checks of held keys go on meanwhile).
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// for key in 0..100u32 {
    ///     let _ = k.check(&key);
    /// }
    /// assert!(k.resizes() >= 3); // 16 slots at first, at most 7/8 used
    /// ```
    pub fn resizes(&self) -> u64 {
        self.resizes.load(Ordering::Relaxed)
    }

    /// One token for `key` now.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// assert!(k.check("alice").is_ok());
    /// assert!(k.check("alice").is_err());
    /// assert!(k.check("bob").is_ok());
    /// # let _: &KeyedTokenBucket<String> = &k;
    /// ```
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n_at(key, self.clock.now(), 1)
    }

    /// `n` tokens for `key` now.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 3);
    /// assert!(k.check_n(&1u8, 3).is_ok());
    /// assert_eq!(k.check_n(&1u8, 4).unwrap_err().retry_at(), None); // more than the burst
    /// ```
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_n_at(key, self.clock.now(), n)
    }

    /// `n` tokens for `key` at `now`, inserting the key if it is new. A denial writes nothing
    /// and says when the same check would pass (`None`: never, `n` is above the key's burst or
    /// its limit is zero); so does a refusal because the map is full ([`WhenFull::Deny`]).
    /// `n == 0` passes unless a stale reading finds the key in deficit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(4.0).unwrap(), 2)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n_at(&1, Nanos::ZERO, 2).is_ok());
    /// let d = k.check_n_at(&1, Nanos::new(100_000_000), 1).unwrap_err();
    /// assert_eq!(d.retry_after(), Some(Duration::from_millis(150)));
    /// ```
    #[inline]
    pub fn check_n_at<Q>(&self, key: &Q, now: Nanos, n: u32) -> Result<(), Denied>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.maybe_sweep(now, false);
        let hash = self.hasher.hash_one(key);
        loop {
            {
                let guard = reclaim::pin();
                let mut table = self.table(&guard);
                while let Some(slot) = table.find(hash, key) {
                    match self.on_slot(slot, now, n) {
                        Outcome::Done(r) => return r,
                        Outcome::Frozen => match forward(table, slot) {
                            Some(next) => table = next,
                            // A dead key in a table being copied, which drops it: inserted
                            // again below, under `writer`, so after the copy is out.
                            None => break,
                        },
                    }
                }
            }
            if !self.insert(key, hash, now) {
                return self.full(now);
            }
        }
    }

    /// The check on the slot holding the key: the CAS loop of the module docs.
    #[inline(always)]
    fn on_slot(&self, slot: &Slot<K>, now: Nanos, n: u32) -> Outcome {
        let mut s = slot.state.load(Ordering::Acquire);
        let backoff = Backoff::new();
        loop {
            let t = tag(s);
            if t == 0 {
                if s & FROZEN != 0 {
                    return Outcome::Frozen;
                }
                match self.revive(slot, s, now) {
                    Ok(new) => s = new,
                    Err(r) => return Outcome::Done(r),
                }
                continue;
            }
            let q = &self.by_tag[t];
            if q.inf {
                return Outcome::Done(Ok(()));
            }
            if n > q.burst {
                return Outcome::Done(Err(Denied::new(now, None)));
            }
            let u = q.units(self.base, now);
            let new = match q.step(s, u, n, self.base, now) {
                Ok(new) => new,
                Err(d) => return Outcome::Done(Err(d)),
            };
            if s & FROZEN != 0 {
                return Outcome::Frozen;
            }
            if n == 0 {
                return Outcome::Done(Ok(()));
            }
            match slot
                .state
                .compare_exchange_weak(s, new, Ordering::Relaxed, Ordering::Acquire)
            {
                Ok(_) => return Outcome::Done(Ok(())),
                Err(actual) => {
                    s = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// Brings back a key found `DEAD` (word `s`): a fresh word born at `max(now, judged)`.
    /// Returns the word now in the slot (ours or a racing reviver's), or the full-map answer.
    #[cold]
    fn revive(&self, slot: &Slot<K>, s: u64, now: Nanos) -> Result<u64, Result<(), Denied>> {
        if !self.reserve() {
            self.maybe_sweep(now, true);
            if !self.reserve() {
                return Err(self.full(now));
            }
        }
        let q = quota_of(s);
        // After the `Acquire` load that saw DEAD: at least the time of the sweep that wrote
        // it (module docs, step 2).
        let x = self.by_tag[q + 1].units(self.base, self.birth(now));
        match slot
            .state
            .compare_exchange(s, live(q, x), Ordering::Relaxed, Ordering::Acquire)
        {
            Ok(_) => Ok(live(q, x)),
            Err(actual) => {
                self.len.fetch_sub(1, Ordering::Relaxed);
                Ok(actual)
            }
        }
    }

    /// Inserts `key` (absent when looked up); false if the map is full. True also if another
    /// thread inserted it first.
    #[cold]
    fn insert<Q>(&self, key: &Q, hash: u64, now: Nanos) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if !self.reserve() {
            self.maybe_sweep(now, true);
            if !self.reserve() {
                return false;
            }
        }
        // Gives the room back unless the key goes in (another thread inserted it first, or
        // user code panicked).
        struct Room<'a>(&'a AtomicU64, bool);
        impl Drop for Room<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    self.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        let mut room = Room(&self.len, false);
        // User code (to_owned, classify) runs before the lock.
        let owned = key.to_owned();
        let q = (self.classify)(&owned);
        let q = if q < self.quota_count { q } else { 0 };
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let guard = reclaim::pin();
        let mut table = self.table(&guard);
        if table.find(hash, key).is_some() {
            return true;
        }
        if !table.has_room() {
            table = self.resize(table, 1, &guard);
        }
        // Under `writer`, after any resize that purged an earlier incarnation of the key:
        // the judged time of its eviction is visible here (module docs, step 2).
        let x = self.by_tag[q + 1].units(self.base, self.birth(now));
        table.claim(hash, owned, live(q, x));
        room.1 = true;
        true
    }

    /// Replaces `old` (the current table) by a new one holding its live keys, sized for them
    /// plus `extra` with room to grow. Only under `writer`. No check waits for it: each live
    /// word is copied into the new table *before* it is frozen in the old one, so a check
    /// that finds it frozen goes on in the new table at once (module docs, "Resize").
    fn resize<'g>(
        &self,
        old: &'g Table<K>,
        extra: usize,
        guard: &'g reclaim::Guard,
    ) -> &'g Table<K> {
        // User code first (Hash, Clone): if it panics, nothing has changed.
        let mut keys: Vec<(usize, u64, K)> = Vec::with_capacity(old.used.load(Ordering::Relaxed));
        for (i, slot) in old.slots.iter().enumerate() {
            if slot.state.load(Ordering::Relaxed) != EMPTY {
                // SAFETY: non-EMPTY, and we hold `writer`, under which it was written.
                let k = unsafe { slot.key.with(K::clone) };
                keys.push((i, self.hasher.hash_one(&k), k));
            }
        }
        // Dead words first: frozen, they cannot be revived any more, so what is left to copy
        // is known before the new table is sized. `Acquire` synchronizes with the eviction's
        // `Release`, so the sweep's `judged` is visible to every insert after us under
        // `writer` (module docs, step 2). A check that finds a dead word frozen inserts the
        // key again, under `writer`, after this resize.
        keys.retain(|&(i, _, _)| {
            let state = &old.slots[i].state;
            let mut s = state.load(Ordering::Relaxed);
            while tag(s) == 0 {
                match state.compare_exchange_weak(
                    s,
                    s | FROZEN,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return false,
                    Err(actual) => s = actual,
                }
            }
            true
        });
        // Room to grow (twice the keys), but never past the key bound's table: at the bound
        // a resize purges the dead slots and keeps the size, so memory stays the bound's.
        let need = slots_for(keys.len() + extra);
        let bound = slots_for(usize::try_from(self.max_keys).unwrap_or(usize::MAX));
        let grown = ((keys.len() + extra).max(1) * 2).next_power_of_two();
        let new = Box::into_raw(Box::new(Table::new(
            grown.min(bound).max(need).max(self.min_slots),
        )));
        // SAFETY: just allocated; published below, freed only by a later resize (after
        // `guard` unpins) or with the map.
        let new_ref: &'g Table<K> = unsafe { &*new };
        // Before any live word is frozen: a check that sees the freeze (`Acquire`, from the
        // freeze's `AcqRel`) sees this too.
        old.next.store(new, Ordering::Release);
        // Live words: copy, then freeze the word copied; if the word changed in between (a
        // grant, a refund, an eviction), copy the newer one and try again. The new slot is
        // read by no check until the freeze succeeds (only a frozen old slot leads there,
        // and the new table is not published yet), so the copy is the word's continuation.
        for (i, hash, k) in keys {
            let state = &old.slots[i].state;
            let mut s = state.load(Ordering::Acquire);
            let copy = new_ref.claim(hash, k, s);
            loop {
                match state.compare_exchange_weak(
                    s,
                    s | FROZEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(actual) => {
                        s = actual;
                        copy.state.store(s, Ordering::Release);
                    }
                }
            }
        }
        #[cfg(test)]
        tests::resize_hook();
        let old_ptr = self.table.swap(new, Ordering::AcqRel);
        self.resizes.fetch_add(1, Ordering::Relaxed);
        debug_assert!(std::ptr::eq(old_ptr, old));
        // SAFETY: `old_ptr` came from `Box::into_raw` and is unreachable from the map now;
        // threads pinned before the swap may still read it (and follow its `next`, the new
        // table, which outlives them), which the epoch waits for.
        unsafe { reclaim::retire(guard, old_ptr) };
        new_ref
    }

    /// The current table, valid while `guard` is pinned.
    #[inline(always)]
    fn table<'g>(&self, _guard: &'g reclaim::Guard) -> &'g Table<K> {
        // SAFETY: the pointer is always a live table from `Box::into_raw`; a replaced one is
        // retired to the epoch collector, which frees it only after every guard pinned before
        // the replacement (ours included) is dropped. `Acquire` pairs with the resize's
        // publication, so the table's contents are visible.
        unsafe { &*self.table.load(Ordering::Acquire) }
    }

    /// True if `key` is held (live).
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// assert!(!k.contains(&1u8));
    /// let _ = k.check(&1u8);
    /// assert!(k.contains(&1u8));
    /// ```
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = reclaim::pin();
        let hash = self.hasher.hash_one(key);
        self.table(&guard)
            .find(hash, key)
            .is_some_and(|slot| tag(slot.state.load(Ordering::Acquire)) != 0)
    }

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
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos, QuotaStatus};
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
        let s = {
            let guard = reclaim::pin();
            let hash = self.hasher.hash_one(key);
            self.table(&guard)
                .find(hash, key)
                .map_or(EMPTY, |slot| slot.state.load(Ordering::Acquire))
        };
        let q = match s {
            EMPTY => {
                let q = (self.classify)(&key.to_owned());
                if q < self.quota_count {
                    q
                } else {
                    0
                }
            }
            s => quota_of(s),
        };
        let quota = &self.by_tag[q + 1];
        let burst = u64::from(quota.burst);
        let window = if quota.inf {
            Duration::ZERO
        } else if quota.zero {
            Duration::MAX
        } else {
            u64::try_from(quota.scale.nanos_ceil(quota.tau))
                .map_or(Duration::MAX, Duration::from_nanos)
        };
        let full = QuotaStatus {
            quota: burst,
            window,
            remaining: burst,
            reset: Duration::ZERO,
        };
        if tag(s) == 0 || quota.inf {
            return Some(full);
        }
        let x = s & X_MASK;
        let u = quota.units(self.base, now);
        // Units held at `now`, capped at the burst; negative in deficit.
        let held =
            (i128::from(u) + i128::from(quota.tau) - i128::from(x)).min(i128::from(quota.tau));
        if held == i128::from(quota.tau) {
            return Some(full);
        }
        let remaining = if held <= 0 {
            0
        } else {
            (held as u64) / quota.scale.one
        };
        let reset = if quota.zero {
            Duration::MAX
        } else {
            // Full once u reaches x: at base + nanos_ceil(x), as a denial's retry time.
            u64::try_from(u128::from(self.base) + quota.scale.nanos_ceil(x))
                .map_or(Duration::MAX, |t| {
                    Nanos::new(t).saturating_duration_since(now)
                })
        };
        Some(QuotaStatus {
            quota: burst,
            window,
            remaining,
            reset,
        })
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
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
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
        let hash = self.hasher.hash_one(key);
        let guard = reclaim::pin();
        let mut table = self.table(&guard);
        loop {
            match table.find(hash, key) {
                None => return true,
                Some(slot) => {
                    if self.refund_on_slot(slot, now, n) {
                        return true;
                    }
                    // Frozen, so live (a dead word returns above): its continuation is in the
                    // table being filled.
                    match forward(table, slot) {
                        Some(next) => table = next,
                        None => return true,
                    }
                }
            }
        }
    }

    /// The refund's CAS loop on the key's slot; false if the word is frozen.
    fn refund_on_slot(&self, slot: &Slot<K>, now: Nanos, n: u32) -> bool {
        let mut s = slot.state.load(Ordering::Acquire);
        let backoff = Backoff::new();
        loop {
            let t = tag(s);
            if t == 0 {
                // Dead (evicted full): nothing to give back.
                return true;
            }
            let q = &self.by_tag[t];
            let x = s & X_MASK;
            let x2 = x
                .saturating_sub(u64::from(n) * q.scale.one)
                .max(q.units(self.base, now));
            if q.inf || x2 >= x {
                // Nothing taken (infinite limit) or the bucket is full at `now`.
                return true;
            }
            if s & FROZEN != 0 {
                return false;
            }
            match slot.state.compare_exchange_weak(
                s,
                (s & !X_MASK) | x2,
                Ordering::Relaxed,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => {
                    s = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// The tokens `key` holds at `now` (quota 0's burst if the key is absent or evicted); may be
    /// negative for a reading older than the key's last grant.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
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
        let guard = reclaim::pin();
        let hash = self.hasher.hash_one(key);
        let s = self
            .table(&guard)
            .find(hash, key)
            .map_or(EMPTY, |slot| slot.state.load(Ordering::Acquire));
        if tag(s) == 0 {
            return f64::from(self.by_tag[1].burst);
        }
        let q = &self.by_tag[tag(s)];
        if q.inf {
            return f64::from(q.burst);
        }
        let u = q.units(self.base, now);
        let units = (u + q.tau) as f64 - (s & X_MASK) as f64;
        (units / q.scale.one as f64).min(f64::from(q.burst))
    }

    /// Moves sweeping off the request path, as [`Keyed::spawn_sweeper`](crate::Keyed::spawn_sweeper):
    /// a thread sweeps every half `sweep_every`, and early when a new key finds the map full
    /// (a check wakes it rather than sweeping); no check sweeps any more. The thread holds
    /// only a weak reference and ends when the map is dropped. With a `sweep_every` of
    /// `Duration::MAX` it ends at once and nothing changes. The tower `per_key` policy
    /// starts one for its map.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    ///
    /// let k = Arc::new(
    ///     KeyedTokenBucket::<u32>::builder(Limit::per_second(5.0).unwrap(), 5)
    ///         .sweep_every(Duration::from_millis(20))
    ///         .build()
    ///         .unwrap(),
    /// );
    /// let sweeper = k.spawn_sweeper();
    /// assert!(k.check(&1).is_ok());
    /// drop(k);
    /// sweeper.join().unwrap();
    /// ```
    #[cfg(not(loom))]
    pub fn spawn_sweeper(self: &std::sync::Arc<Self>) -> std::thread::JoinHandle<()>
    where
        S: Send + Sync + 'static,
        C: 'static,
    {
        Sweeper::spawn(
            self,
            self.sweep_every,
            |k| &k.sweeper,
            |k| {
                let now = k.clock.now();
                k.last_sweep.store(now.as_u64(), Ordering::Relaxed);
                k.evict_idle_at(now);
            },
        )
    }

    /// Evicts every key idle (full) at the map's clock reading; returns how many went.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::new(Limit::per_second(1.0).unwrap(), 1);
    /// let _ = k.check(&1u8);
    /// assert_eq!(k.evict_idle(), 0); // its token is not back yet
    /// ```
    pub fn evict_idle(&self) -> usize {
        self.evict_idle_at(self.clock.now())
    }

    /// Evicts every key whose bucket is full at `now`; returns how many went. Afterwards, if
    /// the table holds more evicted slots than live keys, rebuilds it without them (the
    /// memory comes back once no thread still reads the old table).
    ///
    /// `now` may be any time and no key ever grants more for it (keys revived or inserted
    /// after this call are born at `now` or later); a `now` ahead of the clock only makes
    /// their next buckets stricter until the clock gets there.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8, _, _>::builder(Limit::per_second(2.0).unwrap(), 1)
    ///     .clock(ManualClock::default())
    ///     .build()
    ///     .unwrap();
    /// let _ = k.check_n_at(&1, Nanos::ZERO, 1);
    /// let _ = k.check_n_at(&2, Nanos::new(400_000_000), 1);
    /// assert_eq!(k.evict_idle_at(Nanos::new(500_000_000)), 1); // key 1 is full again
    /// assert_eq!(k.len(), 1);
    /// ```
    pub fn evict_idle_at(&self, now: Nanos) -> usize {
        // Published before any eviction's `Release` CAS (module docs, step 2).
        self.judged.fetch_max(now.as_u64(), Ordering::Relaxed);
        let guard = reclaim::pin();
        let table = self.table(&guard);
        let (mut evicted, mut live_keys, mut dead_slots) = (0, 0, 0);
        for slot in table.slots.iter() {
            let s = slot.state.load(Ordering::Relaxed);
            if s == EMPTY || s & FROZEN != 0 {
                continue;
            }
            let q = quota_of(s);
            if tag(s) == 0 {
                dead_slots += 1;
                continue;
            }
            let quota = &self.by_tag[q + 1];
            if s & X_MASK <= quota.units(self.base, now)
                && slot
                    .state
                    .compare_exchange(s, dead(q), Ordering::Release, Ordering::Relaxed)
                    .is_ok()
            {
                evicted += 1;
                dead_slots += 1;
                self.len.fetch_sub(1, Ordering::Relaxed);
            } else {
                live_keys += 1;
            }
        }
        if dead_slots > live_keys && dead_slots >= PURGE_MIN {
            let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let current = self.table(&guard);
            if std::ptr::eq(current, table) {
                self.resize(current, 0, &guard);
            }
        }
        evicted
    }

    /// The birth time of a key inserted or revived by a check at `now`.
    fn birth(&self, now: Nanos) -> Nanos {
        now.max(Nanos::new(self.judged.load(Ordering::Relaxed)))
    }

    /// Reserves room for one more key under `max_keys`.
    fn reserve(&self) -> bool {
        let mut len = self.len.load(Ordering::Relaxed);
        loop {
            if len >= self.max_keys {
                return false;
            }
            match self
                .len
                .compare_exchange_weak(len, len + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => len = actual,
            }
        }
    }

    /// The full-map policy's answer.
    fn full(&self, now: Nanos) -> Result<(), Denied> {
        match self.when_full {
            WhenFull::Allow => Ok(()),
            WhenFull::Deny => {
                let next = self
                    .last_sweep
                    .load(Ordering::Relaxed)
                    .saturating_add(self.early_sweep_gap())
                    .max(now.as_u64().saturating_add(1));
                Err(Denied::new(now, Some(Nanos::new(next))))
            }
        }
    }

    fn early_sweep_gap(&self) -> u64 {
        (self.sweep_every / 10).max(1_000_000)
    }

    /// Sweeps if one is due, judged on the map's clock (as [`Keyed`](crate::Keyed) does).
    #[inline(always)]
    fn maybe_sweep(&self, hint: Nanos, early: bool) {
        let last = self.last_sweep.load(Ordering::Relaxed);
        let gap = if early {
            self.early_sweep_gap()
        } else {
            self.sweeper.inline_every()
        };
        let due = last.saturating_add(gap);
        if hint.as_u64() < due {
            return;
        }
        self.sweep_due(last, due);
    }

    #[cold]
    fn sweep_due(&self, last: u64, due: u64) {
        let now = self.clock.now();
        if now.as_u64() < due {
            return;
        }
        if self
            .last_sweep
            .compare_exchange(last, now.as_u64(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && !self.sweeper.wake()
        {
            self.evict_idle_at(now);
        }
    }
}

impl<K, S, C> Drop for KeyedTokenBucket<K, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    fn drop(&mut self) {
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: `&mut self`: no check is running; the current table is ours alone (retired
        // ones belong to the collector).
        drop(unsafe { Box::from_raw(table) });
    }
}

impl<K, S, C> fmt::Debug for KeyedTokenBucket<K, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedTokenBucket")
            .field("len", &self.len())
            .field(
                "quotas",
                &self.by_tag[1..=self.quota_count]
                    .iter()
                    .map(|q| (q.limit, q.burst))
                    .collect::<Vec<_>>(),
            )
            // `None`: no key bound (u64::MAX).
            .field(
                "max_keys",
                &(self.max_keys != u64::MAX).then_some(self.max_keys),
            )
            .field("when_full", &self.when_full)
            .field("sweep_every", &Duration::from_nanos(self.sweep_every))
            .finish()
    }
}

/// Options for a [`KeyedTokenBucket`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct KeyedTokenBucketBuilder<K, S = RandomState, C: Clock = QuantaClock> {
    quotas: Vec<(Limit, u32)>,
    capacity: usize,
    classify: Box<dyn Fn(&K) -> usize + Send + Sync>,
    hasher: S,
    max_keys: u64,
    when_full: WhenFull,
    sweep_every: u64,
    clock: C,
}

impl<K, S, C> KeyedTokenBucketBuilder<K, S, C>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    S: BuildHasher,
    C: Clock,
{
    /// Adds a quota: the first call adds quota 1 (quota 0 is the builder's), and so on, up to
    /// [`MAX_QUOTAS`] in all (more is [`ConfigError::TooManyQuotas`]).
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
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

    /// Picks each new key's quota (an index into the quotas in the order they were added; one
    /// past them means quota 0). Called once per key insertion, not per check: a key keeps
    /// its quota until it is evicted.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .quota(Limit::per_second(1.0).unwrap(), 3)
    ///     .classify(|user: &u32| if *user < 100 { 1 } else { 0 })
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check_n(&7, 3).is_ok());
    /// assert!(k.check_n(&700, 3).is_err());
    /// ```
    pub fn classify(mut self, classify: impl Fn(&K) -> usize + Send + Sync + 'static) -> Self {
        self.classify = Box::new(classify);
        self
    }

    /// Sizes the table for `keys` keys from the start, and never shrinks it below that: up
    /// to `keys` keys, no insert grows the table, so new keys never pay for copying it
    /// (checks of held keys never wait for a resize either way: module docs, "Resize"), at
    /// the price of holding the memory (`~16 * 8/7 * keys` bytes for `u64` keys, rounded up
    /// to a power of two) while empty. Default 0: the table starts at 16 slots and follows
    /// the keys, up to what `max_keys` needs.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .capacity(1000)
    ///     .build()
    ///     .unwrap();
    /// for key in 0..1000u32 {
    ///     assert!(k.check(&key).is_ok());
    /// }
    /// assert_eq!(k.resizes(), 0);
    /// ```
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = keys;
        self
    }

    /// Holds at most `max_keys` keys (default [`DEFAULT_MAX_KEYS`]; `u64::MAX`: no bound;
    /// 0 is [`ConfigError::ZeroMaxKeys`]). The table never grows past what `max_keys` keys
    /// need (module docs, "Memory and the key bound").
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .max_keys(1)
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1u8).is_ok());
    /// assert!(k.check(&2u8).is_err()); // full, and key 1 is busy
    /// ```
    pub fn max_keys(mut self, max_keys: u64) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// What a new key gets when the map is full: [`WhenFull::Deny`] (default) or
    /// [`WhenFull::Allow`].
    ///
    /// ```
    /// use turnstile::keyed_bucket::{KeyedTokenBucket, WhenFull};
    /// use turnstile::Limit;
    /// let k = KeyedTokenBucket::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .max_keys(1)
    ///     .when_full(WhenFull::Allow)
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1u8).is_ok());
    /// assert!(k.check(&2u8).is_ok()); // untracked
    /// assert_eq!(k.len(), 1);
    /// ```
    pub fn when_full(mut self, policy: WhenFull) -> Self {
        self.when_full = policy;
        self
    }

    /// How often idle keys are swept (default 10 s); `Duration::MAX` leaves sweeping to
    /// [`KeyedTokenBucket::evict_idle`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::<u8>::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .sweep_every(Duration::from_secs(1))
    ///     .build()
    ///     .unwrap();
    /// assert!(k.is_empty());
    /// ```
    pub fn sweep_every(mut self, every: Duration) -> Self {
        self.sweep_every = Nanos::from_duration(every).as_u64();
        self
    }

    /// Hashes keys with `hasher` instead of std's `RandomState` (module docs, "HashDoS").
    ///
    /// ```
    /// use std::hash::BuildHasherDefault;
    /// use std::collections::hash_map::DefaultHasher;
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Limit};
    /// let k = KeyedTokenBucket::<u64>::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .hasher(BuildHasherDefault::<DefaultHasher>::default())
    ///     .build()
    ///     .unwrap();
    /// assert!(k.check(&1).is_ok());
    /// ```
    pub fn hasher<T: BuildHasher>(self, hasher: T) -> KeyedTokenBucketBuilder<K, T, C> {
        KeyedTokenBucketBuilder {
            quotas: self.quotas,
            capacity: self.capacity,
            classify: self.classify,
            hasher,
            max_keys: self.max_keys,
            when_full: self.when_full,
            sweep_every: self.sweep_every,
            clock: self.clock,
        }
    }

    /// Reads time from `clock`; the map's base is its reading at `build`.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, Clock, Limit, ManualClock, Nanos};
    /// let k = KeyedTokenBucket::<u8>::builder(Limit::per_second(1.0).unwrap(), 1)
    ///     .clock(ManualClock::new(Nanos::new(2)))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(k.clock().now(), Nanos::new(2));
    /// ```
    pub fn clock<D: Clock>(self, clock: D) -> KeyedTokenBucketBuilder<K, S, D> {
        KeyedTokenBucketBuilder {
            quotas: self.quotas,
            capacity: self.capacity,
            classify: self.classify,
            hasher: self.hasher,
            max_keys: self.max_keys,
            when_full: self.when_full,
            sweep_every: self.sweep_every,
            clock,
        }
    }

    /// The map; [`ConfigError::ZeroMaxKeys`] or [`ConfigError::TooManyQuotas`] if those are
    /// out of range.
    ///
    /// ```
    /// use turnstile::{keyed_bucket::KeyedTokenBucket, ConfigError, Limit};
    /// let l = Limit::per_second(1.0).unwrap();
    /// let mut b = KeyedTokenBucket::<u8>::builder(l, 1);
    /// for _ in 0..15 {
    ///     b = b.quota(l, 1);
    /// }
    /// assert_eq!(b.build().unwrap_err(), ConfigError::TooManyQuotas(16));
    /// ```
    pub fn build(self) -> Result<KeyedTokenBucket<K, S, C>, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::ZeroMaxKeys);
        }
        if self.quotas.len() > MAX_QUOTAS {
            return Err(ConfigError::TooManyQuotas(self.quotas.len()));
        }
        let now = self.clock.now().as_u64();
        let min_slots = slots_for(self.capacity);
        let table = Box::into_raw(Box::new(Table::new(min_slots)));
        Ok(KeyedTokenBucket {
            table: AtomicPtr::new(table),
            by_tag: {
                let quotas: Vec<Quota> = self
                    .quotas
                    .iter()
                    .map(|&(limit, burst)| Quota::new(limit, burst))
                    .collect();
                // Tag t is quota t - 1; tag 0 and unused tags repeat quota 0 (the builder
                // always has it), never read for a live word.
                Box::new(std::array::from_fn(|t| {
                    if (1..=quotas.len()).contains(&t) {
                        quotas[t - 1]
                    } else {
                        quotas[0]
                    }
                }))
            },
            quota_count: self.quotas.len(),
            classify: self.classify,
            hasher: self.hasher,
            base: now,
            writer: Mutex::new(()), // inserts and resizes only
            len: AtomicU64::new(0),
            max_keys: self.max_keys,
            when_full: self.when_full,
            sweep_every: self.sweep_every,
            sweeper: Sweeper::new(self.sweep_every),
            last_sweep: AtomicU64::new(now),
            judged: AtomicU64::new(0),
            resizes: AtomicU64::new(0),
            min_slots,
            clock: self.clock,
        })
    }
}

impl<K, S, C: Clock> fmt::Debug for KeyedTokenBucketBuilder<K, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedTokenBucketBuilder")
            .field("quotas", &self.quotas)
            // `None`: no key bound (u64::MAX).
            .field(
                "max_keys",
                &(self.max_keys != u64::MAX).then_some(self.max_keys),
            )
            .field("when_full", &self.when_full)
            .field("sweep_every", &Duration::from_nanos(self.sweep_every))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::sync::{mpsc, Arc};

    use crate::ManualClock;

    thread_local! {
        /// Run by a resize on this thread after it has frozen every word of the old table
        /// and before it publishes the new one.
        static RESIZE_HOOK: RefCell<Option<Box<dyn Fn()>>> = const { RefCell::new(None) };
    }

    pub(super) fn resize_hook() {
        RESIZE_HOOK.with(|h| {
            if let Some(hook) = h.borrow().as_ref() {
                hook();
            }
        });
    }

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
                RESIZE_HOOK.with(|h| {
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
    fn word_layout_round_trips() {
        for q in 0..MAX_QUOTAS {
            let s = live(q, X_MASK);
            assert_eq!(tag(s), q + 1);
            assert_eq!(quota_of(s), q);
            assert_eq!(s & FROZEN, 0);
            assert_eq!(quota_of(s | FROZEN), q);
            let d = dead(q);
            assert_eq!(tag(d), 0);
            assert_ne!(d, EMPTY);
            assert_eq!(quota_of(d), q);
            assert_eq!(quota_of(d | FROZEN), q);
        }
    }

    #[test]
    fn the_range_is_at_least_eight_and_a_half_years_up_to_1e9() {
        const YEAR: f64 = 365.25 * 86_400e9;
        for l in [1e-3, 1.0, 7.0, 1e3, 3e7, 1e8, 1e9] {
            for burst in [1, 1000, u32::MAX] {
                let q = Quota::new(Limit::per_second(l).unwrap(), burst);
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
