//! Placeholder: being written.
#![allow(missing_docs)]
/// Placeholder.
pub struct SmoothBursty;
/// Placeholder.
pub struct SmoothWarmingUp;
