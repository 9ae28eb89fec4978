//! The algorithm half of a keyed map with its state **inline**: how one key's state word
//! moves. The map half (the table, its lock-free lookup, inserts, eviction, revival and
//! resizes) is the word map (`src/word_map.rs`), shared by every such map; a rule only computes.
//!
//! # The contract
//! A key's state is `x`, at most [`X_MASK`] (59 bits); the map keeps the quota's tag and its
//! own flags in the word's other bits. `base` is the map's base reading (ns on its clock,
//! taken at construction); a rule counts time from it, so that 59 bits last.
//!
//! 1. **`check` reads nothing but its arguments and `self`**, and writes nothing: the map
//!    applies a grant with one CAS from the `x` it was computed from, and retries on the
//!    value a failed CAS found.
//! 2. **A grant that consumes anything changes `x`.** An eviction is a CAS from the `x` the
//!    sweep judged idle, so a grant that left `x` as it was could be lost to it. A grant
//!    that consumes nothing (`n == 0`, an unlimited quota) returns `Ok(None)` and is not
//!    written.
//! 3. **`idle(x, J)` means evicting hands a key nothing**: for every `B >= J`, the budget
//!    the rule states for one key's history (its front's header) holds for a history that
//!    runs on `x` up to the eviction and on `born(B)` after it, whatever its readings (stale
//!    ones, earlier than `B` or `J`, included). Per reading, the newborn is at least as
//!    strict: a check that `born(B)` grants, `x` grants too, at every reading for the
//!    bucket, leaky, smooth and fixed-window rules, and for the sliding window's at every
//!    reading from the start of `J`'s window on. (An older reading is judged by the sliding
//!    window's `x` in its own, older windows, where its grants may refuse it, and by
//!    `born(B)` at the start of `B`'s window: its budget is stated in judged times, and is
//!    what holds. Check by check the two may also part after a stale reading that `x` would
//!    have granted and `born(B)` refuses: then `x` has spent what the newborn still holds.)
//!    A revived key is born at `B = max(now, J)` of the sweep that evicted it. The map runs
//!    no check on a key between the sweep's judgement and its CAS, and the CAS fails if one
//!    landed.
//! 4. **`born` never panics and saturates**; so does every time computation of a rule.
use crate::clock::Nanos;
use crate::limiter::Denied;

/// The bits of a key's state `x`: the map keeps its quota's tag and its flags in the other
/// five.
pub(crate) const X_MASK: u64 = (1 << 59) - 1;

/// 8.5 years (of 365.25 days) in nanoseconds: the least range of readings past the base
/// that every rule's word holds, whatever its configuration.
pub(crate) const RANGE_MIN: u64 = 85 * 36_525 * 86_400 * 1_000_000; // 8.5 * 365.25 days
const _: () = assert!(RANGE_MIN == 268_239_600_000_000_000);

/// One configuration of a keyed map with inline state: see the [module docs](self).
pub(crate) trait WordRule: Copy + Send + Sync + 'static {
    /// The state of a key born at `now`: inserted, or revived after an eviction judged at
    /// or before `now`. At most [`X_MASK`].
    fn born(&self, base: u64, now: Nanos) -> u64;

    /// A check of `n` at `now` on state `x`: `Ok(Some(x2))` grants by writing `x2` (at most
    /// [`X_MASK`], and `!= x`), `Ok(None)` grants without a write, `Err` refuses (nothing
    /// written) with the denial's retry time.
    fn check(&self, x: u64, base: u64, now: Nanos, n: u32) -> Result<Option<u64>, Denied>;

    /// Whether evicting a key in state `x` at `now` changes nothing it could be granted
    /// (contract 3).
    fn idle(&self, x: u64, base: u64, now: Nanos) -> bool;
}
