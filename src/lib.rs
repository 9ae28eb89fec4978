//! # turnstile
//!
//! Lock-free rate limiters with the semantics of the limiters people already know, for the
//! hottest path a server has. Each limiter keeps its state in atomic words updated by a CAS
//! loop: no mutex, no allocation and no syscall on `allow`, `reserve` or `cancel`, and a denial
//! is decided from a load alone, with no write to the limiter's state.
//!
//! One hardware caveat: [`SmoothBursty`]/[`SmoothWarmingUp`], [`FixedWindow`],
//! [`SlidingWindow`] and [`KeyedSmoothWarmingUp`] (one per key) keep a 128-bit word, and
//! `portable_atomic` implements a 128-bit atomic *load* with a read-modify-write on CPUs
//! without a native 128-bit load: a `cmpxchg16b` on x86-64 CPUs without AVX, and an
//! exclusive-pair or `casp` sequence on aarch64 without FEAT_LSE2. There a denial still
//! changes no value, but its load takes the cache line exclusive as a write does, so denials
//! on one limiter (or key) contend with each other.
//! [`TokenBucket`], [`LeakyBucket`] and [`Sometimes`] use 64-bit words and are unaffected.
//!
//! | limiter | upstream | module |
//! |---|---|---|
//! | [`TokenBucket`] | Go `golang.org/x/time/rate` | [`token_bucket`] |
//! | [`Sometimes`] | Go `rate.Sometimes` | [`sometimes`] |
//! | [`LeakyBucket`] | uber-go `ratelimit` | [`leaky_bucket`] |
//! | [`SmoothBursty`], [`SmoothWarmingUp`] | Guava `RateLimiter` | [`smooth`] |
//! | [`FixedWindow`] | go-zero `PeriodLimit` | [`fixed_window`] |
//! | [`SlidingWindow`] | the sliding-window counter | [`sliding_window`] |
//! | [`LeakyMeter`] | the water-level leaky bucket (a meter) | [`leaky_meter`] |
//! | [`Keyed`] | any of the above, per key (per IP, user, API key) | [`keyed`] |
//! | [`KeyedTokenBucket`] | a token bucket per key, its state inline (one word per key) | [`keyed::token_bucket`] |
//! | [`KeyedLeakyBucket`] | a leaky bucket (uber-go) per key, its state inline | [`keyed::leaky_bucket`] |
//! | [`KeyedLeakyMeter`] | a water-level meter per key, its state inline | [`keyed::leaky_meter`] |
//! | [`KeyedSmoothBursty`] | Guava's `SmoothBursty` per key, its state inline | [`keyed::smooth_bursty`] |
//! | [`KeyedSmoothWarmingUp`] | Guava's `SmoothWarmingUp` per key, its state inline (a 128-bit word) | [`keyed::smooth_warming_up`] |
//! | [`KeyedWindow`] | a fixed window (go-zero `PeriodLimit`) per key, its state inline | [`keyed::fixed_window`] |
//! | [`KeyedSlidingWindow`] | the sliding-window counter per key, its state inline | [`keyed::sliding_window`] |
//! | [`SketchTokenBucket`] | a token bucket per key in fixed memory, holding no keys (Knot Resolver's KRU) | [`keyed::sketch_token_bucket`] |
//!
//! The seven maps with their state inline are one type, [`keyed::InlineMap`], under their
//! algorithms' names: one set of map methods and settings, each algorithm's own constructors
//! and readings.
//!
//! Every limiter has a mutex-based twin in `reference` (feature `reference`) that follows the
//! upstream code literally; the tests compare the two on random operation sequences, and the
//! benchmarks race them. A twin is built from its limiter's builder:
//! `reference::LeakyBucket::try_from(LeakyBucket::builder(100).slack(5))`.
//!
//! ## Time
//! Every time-dependent method `foo` has a `foo_at(now, ..)` twin that takes the time as
//! [`Nanos`]; the plain form reads the limiter's [`Clock`] (by default the shared
//! [`QuantaClock`]). Tests use the `_at` forms or a [`ManualClock`]. A wait's deadline is a
//! [`Deadline`]: a `Duration` (a timeout from the start of the wait), an `Instant`, `None`, or
//! [`Deadline::at`] a reading of the limiter's clock.
//!
//! ## Quickstart
//! ```
//! use turnstile::{Limit, TokenBucket};
//!
//! // 100 requests per second, bursts of up to 20.
//! let limiter = TokenBucket::new(Limit::per_second(100.0).unwrap(), 20);
//! if limiter.allow() {
//!     // handle the request
//! }
//! // Or reserve, and learn how long to wait:
//! let r = limiter.reserve_n(5);
//! assert!(r.ok());
//! let _wait = r.delay();
//! ```
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Time: the clock every limiter reads, and the deadlines of the waits.
pub mod clock;
mod deadline;

// The vocabulary every limiter shares: the rate, the check, the errors, the layout.
mod error;
mod layout;
mod limit;
mod limiter;

// The limiters, one module each.
pub mod fixed_window;
pub mod leaky_bucket;
pub mod leaky_meter;
pub mod multi_token_bucket;
pub mod sliding_window;
pub mod smooth;
pub mod sometimes;
pub mod token_bucket;

// Permits paid for elsewhere and spent here: the in-process half of `redis::Leased`.
pub mod lease;

// Per-key limiting: `Keyed` over any limiter, and a map per limiter with its state inline.
#[cfg(feature = "keyed")]
#[cfg_attr(docsrs, doc(cfg(feature = "keyed")))]
pub mod keyed;

// Integrations: a fleet on Redis, and tower middleware.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
// What the limiters count, published through the `metrics` facade.
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;

// The mutex twins: the tests' oracle and the benchmarks' baseline.
#[cfg(feature = "reference")]
#[cfg_attr(docsrs, doc(cfg(feature = "reference")))]
pub mod reference;

// Internals the limiters share: configuration slots, fixed-point scales, the atomics (loom's
// under `cfg(loom)`).
#[cfg(not(loom))]
mod atomic_u128;
mod config_slots;
mod scale;
#[cfg(feature = "tower")]
mod striped_counters;
mod sync;

pub use clock::{Clock, CoarseClock, ManualClock, Nanos, QuantaClock};
pub use deadline::Deadline;
pub use error::{ConfigError, WaitError};
pub use layout::{Compact, Layout, Padded};
pub use limit::Limit;
pub use limiter::{Denied, Idle, Limiter, PerKeyLimiter, QuotaStatus, Refund};

pub use fixed_window::{FixedWindow, Outcome, WindowStatus};
pub use leaky_bucket::LeakyBucket;
pub use leaky_meter::LeakyMeter;
pub use multi_token_bucket::MultiTokenBucket;
pub use sliding_window::SlidingWindow;
pub use smooth::{SmoothBursty, SmoothWarmingUp};
pub use sometimes::Sometimes;
pub use token_bucket::{OwnedReservation, Peek, Reservation, TokenBucket};

#[cfg(feature = "keyed")]
#[cfg_attr(docsrs, doc(cfg(feature = "keyed")))]
pub use keyed::{
    Keyed, KeyedLeakyBucket, KeyedLeakyMeter, KeyedMultiTokenBucket, KeyedSlidingWindow,
    KeyedSmoothBursty, KeyedSmoothWarmingUp, KeyedTokenBucket, KeyedWindow, SketchTokenBucket,
};

/// The README's Rust blocks, run as doc tests (`cargo test --doc --all-features`, as
/// `./scripts/test` does), so that a snippet in it can never again fail to compile. Its
/// snippets use every feature, hence the gate.
#[cfg(all(
    doctest,
    feature = "redis",
    feature = "tokio",
    feature = "keyed",
    feature = "tower",
    feature = "axum"
))]
#[doc = include_str!("../README.md")]
#[allow(dead_code)] // it only carries the README for rustdoc
struct ReadmeDoctests;
