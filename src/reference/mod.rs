//! The mutex-based twins: literal ports of the upstream code, one file per algorithm, with the
//! same API as the lock-free limiters. They are the tests' oracle and the benchmarks' baseline;
//! they are correct and slow on purpose. Behind the `reference` feature.
//!
//! A twin takes its lock-free limiter's options, with the same validation: build them with the
//! limiter's builder and convert (`TryFrom`), or call the twin's `new`.
//!
//! ```
//! use turnstile::{reference, LeakyBucket, ManualClock, TokenBucket, Limit};
//!
//! let options = LeakyBucket::builder(100).slack(5).clock(ManualClock::default());
//! let twin = reference::LeakyBucket::try_from(options).unwrap();
//! assert_eq!(twin.slack(), 5);
//! let bucket = reference::TokenBucket::new(Limit::per_second(10.0).unwrap(), 3);
//! assert_eq!(bucket.burst(), 3);
//! ```

pub mod fixed_window;
pub mod leaky_bucket;
pub mod lease;
pub mod multi_token_bucket;
#[cfg(feature = "keyed")]
#[cfg_attr(docsrs, doc(cfg(feature = "keyed")))]
pub mod sketch_token_bucket;
pub mod sliding_window;
pub mod smooth;
pub mod token_bucket;

pub use fixed_window::FixedWindow;
pub use leaky_bucket::LeakyBucket;
pub use lease::Lease;
pub use multi_token_bucket::MultiTokenBucket;
#[cfg(feature = "keyed")]
pub use sketch_token_bucket::SketchTokenBucket;
pub use sliding_window::SlidingWindow;
pub use smooth::{SmoothBursty, SmoothWarmingUp};
pub use token_bucket::TokenBucket;
