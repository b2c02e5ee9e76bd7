//! Software prefetch for the per-step walks over the running requests: each row
//! reads a request record, then a KV sequence entry, then writes the ends of two
//! token lists, a chain of dependent loads that the out-of-order window cannot
//! overlap across rows by itself. Issuing the loads a few rows ahead keeps
//! several misses in flight. A no-op on targets without a prefetch instruction.

/// Ask for the cache line holding `p` (never faults, whatever the address).
#[inline(always)]
pub(crate) fn line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it reads nothing architecturally and never
    // faults, even for an invalid address; SSE is part of the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The lines of a value that spans `lines` cache lines from `p`.
#[inline(always)]
pub(crate) fn lines<T>(p: *const T, lines: usize) {
    for k in 0..lines {
        line(p.cast::<u8>().wrapping_add(64 * k));
    }
}
