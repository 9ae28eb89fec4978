//! PLACEHOLDER while the lock-free implementation is written.
#![allow(missing_docs, dead_code)]
use crate::clock::Nanos;

/// What [`TokenBucket::peek_n_at`] reports: nothing is consumed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peek {
    /// Tokens in the bucket at the peek's time (negative while reservations are outstanding).
    pub tokens: f64,
    /// The earliest time `n` tokens will be available, if they ever will be.
    pub available_at: Option<Nanos>,
}
pub struct TokenBucket;
pub struct Reservation;
