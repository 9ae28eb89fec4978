//! Placeholder: being written.
#![allow(missing_docs)]
/// Placeholder.
pub struct LeakyBucket;
