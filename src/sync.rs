//! The atomics turnstile uses, in one place, so that `--cfg loom` swaps every one of them
#![allow(unused_imports)] // each limiter uses a subset
//! for loom's model-checked version (the tokio `loom` shim pattern).
//!
//! loom has no 128-bit atomic. Under loom, [`AtomicU128`] is a stand-in built on
//! `loom::sync::Mutex<u128>`: every operation is one modelled critical section, so loom still
//! explores each interleaving of loads and CASes on the word. It is as strong as `SeqCst`, so
//! the 128-bit word's own orderings are argued in each limiter's header comment, not by loom.

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use portable_atomic::AtomicU128;
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex; // for reconfiguration only, never the hot path

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex; // loom's, for the same reconfiguration-only uses

/// loom stand-in for `portable_atomic::AtomicU128` with the subset of its API we use.
#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct AtomicU128(loom::sync::Mutex<u128>); // loom models only

#[cfg(loom)]
impl AtomicU128 {
    pub(crate) fn new(v: u128) -> Self {
        Self(loom::sync::Mutex::new(v)) // loom models only
    }
    pub(crate) fn load(&self, _: Ordering) -> u128 {
        *self.0.lock().unwrap()
    }
    pub(crate) fn compare_exchange_weak(
        &self,
        current: u128,
        new: u128,
        _: Ordering,
        _: Ordering,
    ) -> Result<u128, u128> {
        let mut v = self.0.lock().unwrap();
        if *v == current {
            *v = new;
            Ok(current)
        } else {
            Err(*v)
        }
    }
}
