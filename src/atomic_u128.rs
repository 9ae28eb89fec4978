//! The crate's 128-bit atomic outside loom (`crate::sync` re-exports it): portable-atomic's
//! `AtomicU128`, whose compare-exchange on x86_64 is a `lock cmpxchg16b` written inline
//! here.
//!
//! # Why not portable-atomic's alone
//! The default x86_64 targets do not assume `cmpxchg16b` (the first 64-bit AMD processors
//! lack it), so portable-atomic detects it at run time and calls its CAS through a function
//! pointer: an indirect call, and a function that saves and restores `rbx`, on every CAS of
//! a hot path whose whole cost is a few dozen instructions. Here the CAS is the same
//! instruction inline, behind a branch on the same detection (std's `is_x86_feature_detected`,
//! cached after its first call), so a processor without it still gets portable-atomic's
//! fallback. Loads stay portable-atomic's (its `vmovdqa` where AVX makes that atomic).
//! Under Miri, and on other architectures, every operation is portable-atomic's.
//!
//! # Safety of the inline CAS
//! `cmpxchg16b` needs its operand 16-byte aligned (`portable_atomic::AtomicU128` is), and
//! the processor to have it (checked first). It is an atomic read-modify-write with
//! sequential consistency, at least every ordering a caller passes. Every access to the word
//! is atomic (through this type), so no non-atomic access races it. `rbx`, which
//! `cmpxchg16b` reads and LLVM may reserve, is saved in a scratch register around it; every
//! operand is in a named register, none in one the allocator could make `rbx`.

use core::sync::atomic::Ordering;

/// A `u128` with atomic operations: see the module docs. Public in name only (this module is
/// private): the state word's atomic in a keyed map's rule.
#[derive(Debug)]
#[repr(transparent)]
pub struct AtomicU128(portable_atomic::AtomicU128);

impl AtomicU128 {
    pub const fn new(v: u128) -> Self {
        AtomicU128(portable_atomic::AtomicU128::new(v))
    }

    #[inline(always)]
    pub fn load(&self, order: Ordering) -> u128 {
        self.0.load(order)
    }

    #[inline(always)]
    #[allow(dead_code)] // the keyed maps' words only
    pub fn store(&self, v: u128, order: Ordering) {
        self.0.store(v, order)
    }

    #[inline(always)]
    pub fn compare_exchange(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        self.inline_cas(current, new)
            .unwrap_or_else(|| self.0.compare_exchange(current, new, success, failure))
    }

    /// As [`compare_exchange`](Self::compare_exchange): `cmpxchg16b` never fails spuriously.
    #[inline(always)]
    pub fn compare_exchange_weak(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        self.inline_cas(current, new)
            .unwrap_or_else(|| self.0.compare_exchange_weak(current, new, success, failure))
    }

    /// The inline CAS, or `None` where there is none (see the module docs).
    #[inline(always)]
    fn inline_cas(&self, current: u128, new: u128) -> Option<Result<u128, u128>> {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if has_cmpxchg16b() {
            // SAFETY: the module docs: aligned, atomic everywhere, and the processor has it.
            let (found, ok) = unsafe { cmpxchg16b(self.0.as_ptr(), current, new) };
            return Some(if ok { Ok(found) } else { Err(found) });
        }
        let _ = (current, new);
        None
    }
}

/// Whether the processor has `cmpxchg16b`: a constant where the target promises it, else
/// std's run-time detection (one load of its cache and a predicted branch after the first).
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
fn has_cmpxchg16b() -> bool {
    cfg!(target_feature = "cmpxchg16b") || std::is_x86_feature_detected!("cmpxchg16b")
}

/// `lock cmpxchg16b [dst]`: if `*dst == old`, stores `new`; returns the value found and
/// whether it stored.
///
/// # Safety
/// `dst` is valid for reads and writes, 16-byte aligned, accessed only atomically, and the
/// processor has `cmpxchg16b`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn cmpxchg16b(dst: *mut u128, old: u128, new: u128) -> (u128, bool) {
    debug_assert!(dst.addr().is_multiple_of(16));
    let (lo, hi): (u64, u64);
    let failed: u8;
    // SAFETY: the caller's contract. `rbx` is restored before the block ends; ZF (which
    // `cmpxchg16b` sets) is read by `setne` within it, so the flags are not preserved. The
    // pointer and the saved `rbx` are in named scratch registers: a `reg` operand may be
    // allocated to `rbx` itself (outside functions where LLVM reserves it), which the
    // `xchg` would overwrite.
    unsafe {
        core::arch::asm!(
            "xchg r8, rbx",
            "lock cmpxchg16b xmmword ptr [r11]",
            "setne cl",
            "mov rbx, r8",
            in("r11") dst,
            inout("r8") new as u64 => _,
            in("rcx") (new >> 64) as u64,
            inout("rax") old as u64 => lo,
            inout("rdx") (old >> 64) as u64 => hi,
            lateout("cl") failed,
            options(nostack),
        );
    }
    ((u128::from(hi) << 64) | u128::from(lo), failed == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inline CAS against portable-atomic's on the same words: a success stores and
    /// returns the old value, a failure stores nothing and returns the value found, whichever
    /// half differs.
    #[test]
    fn the_inline_cas_agrees_with_portable_atomic() {
        let words = [
            0u128,
            1,
            u128::MAX,
            1 << 64,
            (1 << 64) - 1,
            0x0123_4567_89ab_cdef << 32,
        ];
        for &a in &words {
            for &b in &words {
                let (ours, theirs) = (AtomicU128::new(a), portable_atomic::AtomicU128::new(a));
                let new = b ^ 0x5555;
                let r1 = ours.compare_exchange(b, new, Ordering::AcqRel, Ordering::Acquire);
                let r2 = theirs.compare_exchange(b, new, Ordering::AcqRel, Ordering::Acquire);
                assert_eq!(r1, r2, "{a:#x} vs {b:#x}");
                assert_eq!(ours.load(Ordering::Acquire), theirs.load(Ordering::Acquire));
                assert_eq!(r1.is_ok(), a == b);
            }
        }
    }

    /// Many threads adding through the CAS lose no update.
    #[test]
    fn concurrent_cas_loses_no_update() {
        let w = AtomicU128::new(0);
        let add = (1u128 << 64) | 1; // both halves, so a torn update shows
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let mut cur = w.load(Ordering::Relaxed);
                        while let Err(found) = w.compare_exchange_weak(
                            cur,
                            cur.wrapping_add(add),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        ) {
                            cur = found;
                        }
                    }
                });
            }
        });
        assert_eq!(w.load(Ordering::Acquire), 40_000 * add);
    }
}
