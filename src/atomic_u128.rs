//! The crate's 128-bit atomic outside loom (`crate::sync` re-exports it): portable-atomic's
//! `AtomicU128`, whose load and compare-exchange on x86_64 are a `vmovdqa` and a
//! `lock cmpxchg16b` written inline here.
//!
//! # Why not portable-atomic's alone
//! The default x86_64 targets assume neither `cmpxchg16b` (the first 64-bit AMD processors
//! lack it) nor AVX (which makes a 16-byte `vmovdqa` atomic), so portable-atomic detects them
//! at run time and calls its load and CAS through function pointers: an indirect call each,
//! and for the CAS a function that saves and restores `rbx`, on a hot path whose whole cost is
//! a few dozen instructions. Here each is the same instruction inline, behind a test of one
//! byte that caches std's detection ([`FEATURES`]), so a processor without them still gets
//! portable-atomic's fallback. Stores, rare, stay portable-atomic's. Under Miri, and on other
//! architectures, every operation is portable-atomic's.
//!
//! # Safety
//! Both instructions need their operand 16-byte aligned (`portable_atomic::AtomicU128` is),
//! and the processor to have them (tested first). `lock cmpxchg16b` is an atomic
//! read-modify-write with sequential consistency, at least every ordering a caller passes. A
//! `vmovdqa` load is atomic where the processor has AVX, and used only where it also has
//! `cmpxchg16b`, so that every write it can race is a 16-byte atomic too (portable-atomic's
//! store is then `vmovdqa` or `cmpxchg16b`, never its lock-based fallback); as any x86 load it
//! is an acquire, and a sequentially consistent store pays for its own fence, so it serves
//! every ordering. Every access to the word is atomic (through this type), so no non-atomic
//! access races it. `rbx`, which `cmpxchg16b` reads and LLVM may reserve, is saved in a
//! scratch register around it; every operand of that block is in a named register, none in
//! one the allocator could make `rbx`.

use core::sync::atomic::Ordering;

use crate::sync::WordOps;

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
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if has(ATOMIC_VMOVDQA) {
            // SAFETY: the module docs: aligned, atomic everywhere, and the processor makes
            // this load atomic.
            return unsafe { vmovdqa(self.0.as_ptr()) };
        }
        self.0.load(order)
    }

    #[inline(always)]
    #[allow(dead_code)] // the keyed maps' words only
    pub fn store(&self, v: u128, order: Ordering) {
        self.0.store(v, order)
    }

    #[inline(always)]
    #[cfg_attr(not(feature = "keyed"), allow(dead_code))] // the keyed maps' words only
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

    /// This word as an [`InlineU128`], whose load and CAS test for nothing, where the
    /// processor has both instructions: one test for a check's load and CAS together.
    #[inline(always)]
    pub fn inline(&self) -> Option<&InlineU128> {
        HasInline::get().map(|has| has.view(self))
    }

    /// The inline CAS, or `None` where there is none (see the module docs).
    #[inline(always)]
    fn inline_cas(&self, current: u128, new: u128) -> Option<Result<u128, u128>> {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if has(CMPXCHG16B) {
            // SAFETY: the module docs: aligned, atomic everywhere, and the processor has it.
            let (found, ok) = unsafe { cmpxchg16b(self.0.as_ptr(), current, new) };
            return Some(if ok { Ok(found) } else { Err(found) });
        }
        let _ = (current, new);
        None
    }
}

/// Proof that the processor has the instructions an [`InlineU128`] issues, made only where it
/// does: a path that touches several words (a keyed map's probe, then its CAS) tests once and
/// views each word through it.
#[derive(Clone, Copy, Debug)]
pub struct HasInline(());

impl HasInline {
    /// The proof, where the processor has `cmpxchg16b` and an atomic `vmovdqa`.
    #[inline(always)]
    pub fn get() -> Option<HasInline> {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if has(ATOMIC_VMOVDQA) {
            return Some(HasInline(()));
        }
        None
    }

    /// `word` as an [`InlineU128`].
    #[inline(always)]
    pub fn view(self, word: &AtomicU128) -> &InlineU128 {
        // SAFETY: both types are `repr(transparent)` over the same field, so the reference is
        // to a valid `InlineU128`; `self` exists only where `ATOMIC_VMOVDQA` is set, which it
        // is only with `CMPXCHG16B`: what its methods need (their safety notes).
        unsafe { &*(word as *const AtomicU128).cast::<InlineU128>() }
    }
}

/// An [`AtomicU128`] on a processor with `cmpxchg16b` and an atomic `vmovdqa`: a reference
/// to one is made only there ([`AtomicU128::inline`]), so its load and CAS are the two
/// instructions with no test before them.
#[derive(Debug)]
#[repr(transparent)]
pub struct InlineU128(portable_atomic::AtomicU128);

impl WordOps<u128> for InlineU128 {
    #[inline(always)]
    fn load(&self, order: Ordering) -> u128 {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            let _ = order;
            // SAFETY: the module docs: aligned, atomic everywhere, and the processor makes
            // this load atomic (the type's invariant).
            unsafe { vmovdqa(self.0.as_ptr()) }
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        self.0.load(order)
    }

    #[inline(always)]
    fn compare_exchange_weak(
        &self,
        current: u128,
        new: u128,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u128, u128> {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        {
            let _ = (success, failure);
            // SAFETY: the module docs: aligned, atomic everywhere, and the processor has it
            // (the type's invariant).
            let (found, ok) = unsafe { cmpxchg16b(self.0.as_ptr(), current, new) };
            if ok {
                Ok(found)
            } else {
                Err(found)
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        self.0.compare_exchange_weak(current, new, success, failure)
    }
}

/// [`FEATURES`] bit: the processor has `cmpxchg16b`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
const CMPXCHG16B: u8 = 1 << 1;
/// [`FEATURES`] bit: a 16-byte `vmovdqa` from an aligned address is atomic, which holds where
/// the processor has AVX (Intel, AMD and Zhaoxin document it; LLVM and Boost rely on it, as
/// portable-atomic does). Set only with [`CMPXCHG16B`], so that every write to a word read
/// this way is a 16-byte atomic too, never portable-atomic's lock-based fallback.
#[cfg(all(target_arch = "x86_64", not(miri)))]
const ATOMIC_VMOVDQA: u8 = 1 << 2;

/// What the processor offers, from std's detection, kept in one byte (bit 0: detected):
/// testing a bit here is one instruction, where `is_x86_feature_detected!("avx")` is a dozen
/// (its bit sits in the second word of std's cache, which LLVM reaches with a generic shift).
#[cfg(all(target_arch = "x86_64", not(miri)))]
static FEATURES: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);

/// Whether the processor has `feature` (a [`FEATURES`] bit): a constant where the target
/// promises it, else one load of [`FEATURES`] and a predicted branch after the first call.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
fn has(feature: u8) -> bool {
    let compiled = match feature {
        CMPXCHG16B => cfg!(target_feature = "cmpxchg16b"),
        _ => cfg!(all(target_feature = "cmpxchg16b", target_feature = "avx")),
    };
    // Relaxed: the byte is a pure function of the processor; a thread that reads 0 detects
    // again and stores the same value.
    compiled || FEATURES.load(Ordering::Relaxed) & feature != 0 || detect() & feature != 0
}

/// Fills [`FEATURES`] on first use; afterwards only reached for a feature the processor lacks.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[cold]
fn detect() -> u8 {
    let cas = std::is_x86_feature_detected!("cmpxchg16b");
    let avx = std::is_x86_feature_detected!("avx");
    let f = match (cas, avx) {
        (true, true) => 1 | CMPXCHG16B | ATOMIC_VMOVDQA,
        (true, false) => 1 | CMPXCHG16B,
        (false, _) => 1,
    };
    FEATURES.store(f, Ordering::Relaxed);
    f
}

/// `vmovdqa` of `[src]`, split into the two halves in general registers.
///
/// # Safety
/// `src` is valid for reads, 16-byte aligned, accessed only atomically, and the processor
/// has [`ATOMIC_VMOVDQA`].
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[inline(always)]
unsafe fn vmovdqa(src: *mut u128) -> u128 {
    debug_assert!(src.addr().is_multiple_of(16));
    let (lo, hi): (u64, u64);
    // SAFETY: the caller's contract; a load (x86 loads are acquire; a sequentially consistent
    // store pays for its own fence), touching no flags and no stack.
    unsafe {
        core::arch::asm!(
            "vmovdqa {x}, xmmword ptr [{src}]",
            "vmovq {lo}, {x}",
            "vpextrq {hi}, {x}, 1",
            src = in(reg) src,
            x = out(xmm_reg) _,
            lo = out(reg) lo,
            hi = out(reg) hi,
            options(nostack, preserves_flags, readonly),
        );
    }
    (u128::from(hi) << 64) | u128::from(lo)
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
    // low half of `new` swaps places with `rbx`, wherever the allocator put it: in `rbx`
    // itself (a `reg` operand may be, outside functions where LLVM reserves it) the swaps
    // change nothing, and `rbx` is that operand's, declared clobbered. The pointer is in a
    // named register, never `rbx`, which the swap overwrites.
    unsafe {
        core::arch::asm!(
            "xchg {lo}, rbx",
            "lock cmpxchg16b xmmword ptr [r11]",
            "setne cl",
            "mov rbx, {lo}",
            in("r11") dst,
            lo = inout(reg) new as u64 => _,
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

    /// The inline load reads what portable-atomic's reads, both halves in place.
    #[test]
    fn the_inline_load_agrees_with_portable_atomic() {
        for v in [
            0u128,
            1,
            u128::MAX,
            1 << 64,
            (1 << 64) - 1,
            0x0123 << 100 | 0x4567,
        ] {
            let w = AtomicU128::new(v);
            assert_eq!(w.load(Ordering::Acquire), v);
            assert_eq!(w.load(Ordering::Acquire), w.0.load(Ordering::Acquire));
        }
    }

    /// A load racing CASes sees one whole value or another, never halves of two: each value
    /// written has equal halves.
    #[test]
    fn a_load_is_never_torn() {
        let w = AtomicU128::new(0);
        let done = core::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 1..=200_000u128 {
                    let cur = w.load(Ordering::Relaxed);
                    let next = i << 64 | i;
                    let _ = w.compare_exchange(cur, next, Ordering::AcqRel, Ordering::Relaxed);
                }
                done.store(true, Ordering::Release);
            });
            let mut seen = 0u64;
            while !done.load(Ordering::Acquire) || seen == 0 {
                let v = w.load(Ordering::Acquire);
                assert_eq!(v >> 64, v & u128::from(u64::MAX), "torn: {v:#x}");
                seen += 1;
            }
        });
    }

    /// The feature byte agrees with std's detection.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    #[test]
    fn the_feature_byte_is_std_detection() {
        let cas = std::is_x86_feature_detected!("cmpxchg16b");
        let avx = std::is_x86_feature_detected!("avx");
        assert_eq!(has(CMPXCHG16B), cas);
        assert_eq!(has(ATOMIC_VMOVDQA), cas && avx);
        assert_eq!(FEATURES.load(Ordering::Relaxed) & 1, 1);
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
