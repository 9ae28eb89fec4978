//! The atomics turnstile uses, in one place, so that `--cfg loom` swaps every one of them
#![allow(unused_imports)] // each limiter uses a subset
//! for loom's model-checked version (the tokio `loom` shim pattern).
//!
//! # The loom stand-in for `AtomicU128`
//! loom has no 128-bit atomic. Under loom, [`AtomicU128`] is a loom `AtomicPtr` to an
//! immutable, leaked `Box<u128>` (for the smooth limiters' words and the 128-bit words of
//! the inline keyed map, `src/keyed/word_map.rs`):
//!
//! * **Values are immutable.** A value is boxed and fully written *before* its pointer is
//!   published by a CAS, and never written again (the boxes are leaked: a model is short). So
//!   reading the pointee is exactly as safe as the pointer atomic's ordering makes it, and the
//!   128-bit word has precisely the memory model of the pointer: loom tracks the causality of
//!   every load and CAS on it with the **caller's** orderings.
//! * `load(o)` is `*ptr.load(o)`: a load that may return any value loom's model allows for
//!   ordering `o` (a stale one included), not just the latest.
//! * `compare_exchange_weak(cur, new, s, f)` first reads the *newest* pointer with a
//!   read-modify-write that always fails (a CAS from null, with ordering `f`), as a hardware
//!   CAS reads the newest value; if its value is not `cur` that is the failure, seen with
//!   ordering `f`. Otherwise it CASes that pointer to a fresh box with orderings `s`/`f`; if
//!   another thread replaced the pointer in between, it compares the newer value and goes
//!   round again. So the CAS compares **values**, not box identities (two boxes holding equal
//!   words compare equal, as equal words do), its success is one loom RMW with ordering `s`
//!   (which also continues release sequences as loom models them), and it never fails
//!   spuriously (allowed, not required, of a weak CAS).
//! * Only one corner is stronger than the hardware: a failure ordering stronger than the
//!   success one (`Release`/`Acquire`) would acquire on success too. No limiter uses it.
//!
//! So the loom models check the 128-bit word's own `Acquire`/`Release`/`Relaxed` orderings
//! as written: an ordering a protocol needs, once weakened, makes some model fail, and one it
//! does not need survives (the mutation table in `loom-tests/src/lib.rs` lists both; e.g. the
//! token bucket's state-word `Acquire` is needed only if the configuration slot's own `seq`
//! publication is weakened too). A loom `Mutex` would be the obvious stand-in, but it
//! synchronizes every access as if `SeqCst`, so loom would prove nothing about these
//! orderings: under it, weakening both publications of a configuration survives every model.

#[cfg(not(loom))]
pub(crate) use crate::atomic_u128::{AtomicU128, HasInline, InlineU128};
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{
    fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::Mutex; // for reconfiguration only, never the hot path

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::Mutex; // loom's, for the same reconfiguration-only uses

/// `std::cell::UnsafeCell`, or under loom loom's, which reports an access that another
/// thread's write does not happen-before (or that races a later write): a key read before its
/// publication, a slot read after its free. Through [`UnsafeCell::with`] and
/// [`UnsafeCell::with_mut`], loom's interface, as a no-op wrapper outside loom.
#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// See the loom version above: the same interface over `std::cell::UnsafeCell`.
#[cfg(not(loom))]
#[derive(Debug)]
#[allow(dead_code)] // only the keyed maps use it, behind feature `keyed`
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
#[allow(dead_code)] // as the type
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }

    /// Runs `f` on a shared pointer to the contents.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` on a mutable pointer to the contents.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Tells loom that a retry loop is waiting for another thread (a slot being rewritten): after
/// it, loom stops offering this thread the stale values it has already read, as a processor
/// would eventually stop returning them. A no-op outside loom.
#[inline(always)]
pub(crate) fn retry_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Nothing, in a form the compiler may neither drop nor move. In one arm of a branch it keeps
/// the branch a branch, not a conditional move: a hot path that picks between a value it can
/// compute early (from the clock, from a constant address) and one that waits for the state
/// word branches, so that, predicted, what it hands the CAS waits only for the early value.
/// That matters for the 128-bit CAS (`cmpxchg16b`), which starts only once every input is
/// ready; a 64-bit CAS hides the wait.
#[inline(always)]
pub(crate) fn keep_branch() {
    #[cfg(all(not(miri), any(target_arch = "x86_64", target_arch = "aarch64")))]
    // SAFETY: an empty template: no instructions, operands, memory, stack or flags.
    unsafe {
        core::arch::asm!("", options(nomem, nostack, preserves_flags))
    }
}

/// A state word's load and CAS, as a hot path makes them. For a 128-bit word:
/// [`AtomicU128`]'s, which test for the processor's instructions at each use, or
/// [`InlineU128`]'s, which were tested for once, before ([`AtomicU128::inline`],
/// [`HasInline`]). A hot path generic over it makes that one test, for its loads and its CAS
/// together. Public in name only (this module is private), as the keyed maps' word traits
/// that extend it are.
pub trait WordOps<W> {
    fn load(&self, order: Ordering) -> W;
    fn compare_exchange_weak(
        &self,
        current: W,
        new: W,
        success: Ordering,
        failure: Ordering,
    ) -> Result<W, W>;
}

/// Each word's own operations, std's, loom's or the processor's: its inherent methods (a
/// 128-bit word's test for the processor's instructions at each use).
macro_rules! own_ops {
    ($($w:ty => $atomic:ty),*) => {$(
        impl WordOps<$w> for $atomic {
            #[inline(always)]
            fn load(&self, order: Ordering) -> $w {
                <$atomic>::load(self, order)
            }

            #[inline(always)]
            fn compare_exchange_weak(
                &self,
                current: $w,
                new: $w,
                success: Ordering,
                failure: Ordering,
            ) -> Result<$w, $w> {
                <$atomic>::compare_exchange_weak(self, current, new, success, failure)
            }
        }
    )*};
}
own_ops!(u64 => AtomicU64, u128 => AtomicU128);

/// Under loom the word has no instructions to test for: [`AtomicU128::inline`] is the word
/// itself.
#[cfg(loom)]
pub(crate) type InlineU128 = AtomicU128;

/// Under loom, the proof that needs no test: a word is viewed as itself.
/// Public in name only, as the word is.
#[cfg(loom)]
#[derive(Clone, Copy, Debug)]
pub struct HasInline;

#[cfg(loom)]
impl HasInline {
    pub fn get() -> Option<HasInline> {
        Some(HasInline)
    }

    pub fn view(self, word: &AtomicU128) -> &InlineU128 {
        word
    }
}

/// loom stand-in for `portable_atomic::AtomicU128` with the subset of its API we use: an
/// atomic pointer to immutable boxed values (see the module docs).
/// Public in name only (this module is private): the state word's atomic in a keyed map's rule.
#[cfg(loom)]
#[derive(Debug)]
pub struct AtomicU128(loom::sync::atomic::AtomicPtr<u128>);

#[cfg(loom)]
impl AtomicU128 {
    /// A fresh box holding `v`, written before its pointer is ever published; leaked.
    fn boxed(v: u128) -> *mut u128 {
        Box::into_raw(Box::new(v))
    }

    /// The value behind a pointer this atomic holds or held.
    fn value(p: *mut u128) -> u128 {
        // SAFETY: every pointer stored here comes from `boxed`: a leaked box, fully written
        // before the pointer was published and never written or freed afterwards.
        unsafe { *p }
    }

    pub(crate) fn new(v: u128) -> Self {
        Self(loom::sync::atomic::AtomicPtr::new(Self::boxed(v)))
    }

    /// The word itself: loom's word has no instructions to test for.
    pub(crate) fn inline(&self) -> Option<&InlineU128> {
        Some(self)
    }

    pub(crate) fn load(&self, order: Ordering) -> u128 {
        Self::value(self.0.load(order))
    }

    /// A fresh box, published with `order` (the word map's `EMPTY` slots are filled so).
    pub(crate) fn store(&self, v: u128, order: Ordering) {
        self.0.store(Self::boxed(v), order);
    }

    /// The same as [`Self::compare_exchange_weak`], which never fails spuriously.
    pub(crate) fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        self.compare_exchange_weak(current, new, success, failure)
    }

    pub(crate) fn compare_exchange_weak(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        let null = std::ptr::null_mut();
        // The newest pointer, read as an RMW reads it (never null, so this never succeeds).
        let mut seen = match self.0.compare_exchange(null, null, failure, failure) {
            Ok(p) | Err(p) => p,
        };
        loop {
            let value = Self::value(seen);
            if value != current {
                return Err(value);
            }
            match self
                .0
                .compare_exchange(seen, Self::boxed(new), success, failure)
            {
                Ok(_) => return Ok(current),
                Err(newer) => seen = newer,
            }
        }
    }
}

/// Where a lock-free table's probe for a hash starts, kept beside the table pointer so that a
/// lookup can prefetch that cache line before it pins an epoch: the pin's locked instruction
/// (a full barrier) then overlaps the miss instead of delaying its start. A hint only, never
/// dereferenced: it is read with no ordering (a torn or stale pair only prefetches a line in
/// vain, and prefetching any address is harmless), so its atomics are std's even under loom,
/// and under loom and Miri `prefetch` does nothing.
#[allow(dead_code)] // only the keyed maps use it, behind feature `keyed`
pub(crate) struct ProbeHint<T> {
    entries: core::sync::atomic::AtomicPtr<T>,
    mask: core::sync::atomic::AtomicUsize,
}

#[allow(dead_code)] // as the type
impl<T> ProbeHint<T> {
    /// A hint at `entries`, `mask + 1` of them.
    pub(crate) fn new(entries: *const T, mask: usize) -> Self {
        let hint = ProbeHint {
            entries: core::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            mask: core::sync::atomic::AtomicUsize::new(0),
        };
        hint.set(entries, mask);
        hint
    }

    /// Points the hint at a newly published table.
    pub(crate) fn set(&self, entries: *const T, mask: usize) {
        use core::sync::atomic::Ordering::Relaxed;
        self.entries.store(entries.cast_mut(), Relaxed);
        self.mask.store(mask, Relaxed);
    }

    /// Starts loading the line of the entry where `hash`'s probe starts.
    #[inline(always)]
    pub(crate) fn prefetch(&self, hash: u64) {
        #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
        {
            use core::sync::atomic::Ordering::Relaxed;
            let i = hash as usize & self.mask.load(Relaxed);
            let at = self.entries.load(Relaxed).wrapping_add(i);
            // SAFETY: a prefetch is a hint that never faults and changes no memory, whatever
            // the address.
            #[allow(unused_unsafe)] // a safe intrinsic in later toolchains
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    at.cast::<i8>(),
                )
            };
        }
        #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
        let _ = hash;
    }
}
