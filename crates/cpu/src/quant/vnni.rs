//! Steps shared by the AVX-512 VNNI versions of the repacked tile kernels (each kernel
//! sits beside its tile type and AVX2 twin in `repack`, `repack_k` and `repack_k6`).
//!
//! Each kernel is its AVX2 twin with the integer dot products done by `vpdpbusd` (four
//! u8 x i8 products summed into an i32 lane in one instruction) instead of the
//! `maddubs` + `add` + `madd` chains. The per-block integer sums are exact on both paths
//! (no intermediate saturates: the AVX2 kernels document their i16 bounds, and i32 holds
//! every sum here), and the float steps are the AVX2 kernel's, in the same order, so the
//! results are bitwise equal to the scalar references. Only the 256-bit (VL) forms are
//! used: the machines that have them run 512-bit integer ops at the same element rate.
//!
//! Each token keeps two independent `vpdpbusd` chains per block, so the four tokens of a
//! call give eight chains in flight against the instruction's latency.
//!
//! This module imports no tile type: the kernels depend on it, never the reverse.

use std::arch::x86_64::*;

/// The four activation bytes at `p`, broadcast to every i32 lane.
///
/// # Safety
/// `p` must point to four readable bytes.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn bcast4(p: *const i8) -> __m256i {
    // SAFETY: the caller guarantees four readable bytes; unaligned read.
    _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// Stores the accumulators as row results.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn store<const NT: usize>(acc: [__m256; NT]) -> [[f32; 8]; NT] {
    let mut out = [[0.0f32; 8]; NT];
    for t in 0..NT {
        // SAFETY: `out[t]` holds eight f32.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
    out
}

/// Σ over registers `ks` of `u[k] · y[4k..4k+4]` per i32 lane, in two chains.
///
/// # Safety
/// `qs` must point to at least `4 * ks.end` readable bytes.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_regs(
    u: &[__m256i; 8],
    qs: *const i8,
    ks: std::ops::Range<usize>,
) -> __m256i {
    let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let mut k = ks.start;
    while k + 1 < ks.end {
        // SAFETY: 4k + 8 <= 4 * ks.end bytes of `qs`.
        unsafe {
            a = _mm256_dpbusd_epi32(a, u[k], bcast4(qs.add(4 * k)));
            b = _mm256_dpbusd_epi32(b, u[k + 1], bcast4(qs.add(4 * k + 4)));
        }
        k += 2;
    }
    _mm256_add_epi32(a, b)
}
