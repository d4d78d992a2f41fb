//! Shared kernels for the 32-element block types against Q8_0 activations.
//!
//! Every block contributes per lane: lane `l` takes the integer dot of elements `4l..4l+4`
//! and accumulates `acc[l] += d * s_l` (for the affine types also `m * dy * Σy` into a
//! separate scalar sum). The scalar code below replays exactly what the AVX2 code does, so
//! both give identical bits.

use super::hsum8_fixed;
use half::f16;
use minfer_gguf::quant::BlockQ8_0;

/// A block that decodes to 32 signed levels with `x = d * q`.
pub(super) trait SignedLevels: Copy {
    /// The block scale.
    fn scale(&self) -> f16;
    /// The 32 signed levels, element order.
    fn levels(&self) -> [i8; 32];
    /// The 32 signed levels in one register.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn levels_avx2(&self) -> std::arch::x86_64::__m256i;
}

/// A block that decodes to 32 unsigned levels with `x = d * q + m`.
pub(super) trait AffineLevels: Copy {
    /// The block scale and offset.
    fn scale_min(&self) -> (f16, f16);
    /// The 32 unsigned levels, element order.
    fn levels(&self) -> [u8; 32];
    /// The 32 unsigned levels in one register.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn levels_avx2(&self) -> std::arch::x86_64::__m256i;
}

/// Scalar replay of the lane-structured signed kernel.
pub(super) fn dot_signed_scalar<W: SignedLevels, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8_0]; NT],
) -> [f32; NT] {
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [[0.0f32; 8]; NT];
    for (i, wb) in w.iter().enumerate() {
        let q = wb.levels();
        let dw = wb.scale().to_f32();
        for (t, acc) in acc.iter_mut().enumerate() {
            let xb = &x[t][i];
            let d = dw * xb.d.to_f32();
            for (l, a) in acc.iter_mut().enumerate() {
                let s: i32 = (4 * l..4 * l + 4)
                    .map(|e| q[e] as i32 * xb.qs[e] as i32)
                    .sum();
                *a += d * s as f32;
            }
        }
    }
    acc.map(hsum8_fixed)
}

/// Scalar kernel of the affine types: lanes for `d * Σ q y`, one sum for `m * dy * Σ y`.
pub(super) fn dot_affine_scalar<W: AffineLevels, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8_0]; NT],
) -> [f32; NT] {
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [[0.0f32; 8]; NT];
    let mut mins = [0.0f32; NT];
    for (i, wb) in w.iter().enumerate() {
        let q = wb.levels();
        let (dw, mw) = wb.scale_min();
        let (dw, mw) = (dw.to_f32(), mw.to_f32());
        for t in 0..NT {
            let xb = &x[t][i];
            let dy = xb.d.to_f32();
            let d = dw * dy;
            for (l, a) in acc[t].iter_mut().enumerate() {
                let s: i32 = (4 * l..4 * l + 4)
                    .map(|e| q[e] as i32 * xb.qs[e] as i32)
                    .sum();
                *a += d * s as f32;
            }
            let sy: i32 = xb.qs.iter().map(|&v| v as i32).sum();
            mins[t] += (mw * dy) * sy as f32;
        }
    }
    let mut out = [0.0; NT];
    for t in 0..NT {
        out[t] = hsum8_fixed(acc[t]) + mins[t];
    }
    out
}

/// AVX2 version of [`dot_signed_scalar`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_signed_avx2<W: SignedLevels, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8_0]; NT],
) -> [f32; NT] {
    use super::simd::{dot_u8i8_epi32, hsum_ps, load32};
    use std::arch::x86_64::*;
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [_mm256_setzero_ps(); NT];
    for (i, wb) in w.iter().enumerate() {
        let q = wb.levels_avx2();
        let aq = _mm256_sign_epi8(q, q);
        let dw = _mm_cvtsi32_si128(wb.scale().to_bits() as i32);
        for t in 0..NT {
            let xb = &x[t][i];
            let y = _mm256_sign_epi8(load32(&xb.qs), q);
            let s = _mm256_cvtepi32_ps(dot_u8i8_epi32(aq, y));
            // Both scales widened by one conversion, then multiplied in f32.
            let dd = _mm_cvtph_ps(_mm_insert_epi16(dw, xb.d.to_bits() as i32, 1));
            let d = _mm256_broadcastss_ps(_mm_mul_ss(dd, _mm_movehdup_ps(dd)));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(d, s));
        }
    }
    let mut out = [0.0; NT];
    for t in 0..NT {
        out[t] = hsum_ps(acc[t]);
    }
    out
}

/// AVX2 version of [`dot_affine_scalar`]: the same exact integers and float steps.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_affine_avx2<W: AffineLevels, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8_0]; NT],
) -> [f32; NT] {
    use super::simd::{dot_u8i8_epi32, f16_to_f32, hsum_epi32, hsum_ps, load32};
    use std::arch::x86_64::*;
    let x = x.map(|a| &a[..w.len()]);
    let ones = _mm256_set1_epi8(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    let mut mins = [0.0f32; NT];
    for (i, wb) in w.iter().enumerate() {
        // Levels <= 31 against |y| <= 127: pair sums stay far inside i16.
        let q = wb.levels_avx2();
        let (dw, mw) = wb.scale_min();
        let (dw, mw) = (f16_to_f32(dw.to_bits()), f16_to_f32(mw.to_bits()));
        for t in 0..NT {
            let xb = &x[t][i];
            let y = load32(&xb.qs);
            let dy = f16_to_f32(xb.d.to_bits());
            let s = _mm256_cvtepi32_ps(dot_u8i8_epi32(q, y));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_set1_ps(dw * dy), s));
            let sy = hsum_epi32(dot_u8i8_epi32(ones, y));
            mins[t] += (mw * dy) * sy as f32;
        }
    }
    let mut out = [0.0; NT];
    for t in 0..NT {
        out[t] = hsum_ps(acc[t]) + mins[t];
    }
    out
}
