//! The mutex-based twins: literal ports of the upstream code, one file per algorithm, with the
//! same API as the lock-free limiters. They are the tests' oracle and the benchmarks' baseline;
//! they are correct and slow on purpose.

pub mod leaky_bucket;
pub mod sliding_window;
pub mod smooth;
pub mod token_bucket;
pub mod window;

pub use leaky_bucket::LeakyBucket;
pub use sliding_window::SlidingWindow;
pub use smooth::{SmoothBursty, SmoothWarmingUp};
pub use token_bucket::TokenBucket;
pub use window::FixedWindow;
