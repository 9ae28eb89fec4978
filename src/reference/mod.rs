//! The mutex-based twins: literal ports of the upstream code, one file per algorithm, with the
//! same API as the lock-free limiters. They are the tests' oracle and the benchmarks' baseline;
//! they are correct and slow on purpose.

pub mod token_bucket;

pub use token_bucket::TokenBucket;
