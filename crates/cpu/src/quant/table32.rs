//! IQ4_NL and MXFP4 weights · Q8_0 activations: 32-element blocks whose 4-bit codes index
//! a table of 16 signed levels (`x = d * K[q]`), as ggml pairs them.
//!
//! The kernels keep the lane structure of the legacy types (see `legacy`): lane `l` takes
//! the exact integer dot of elements `4l..4l+4` and accumulates `acc[l] += (dw * dy) * s_l`,
//! reduced in the fixed order of [`super::hsum8_fixed`], so scalar and AVX2 agree bitwise.
//! The AVX2 code looks levels up with one byte shuffle; with `|K| <= 127` and activation
//! levels in `-127..=127` the sign trick and the pairwise i16 sums stay exact.

use super::{hsum8_fixed, QuantDot};
use minfer_gguf::quant::{
    e8m0_to_f32_half, BlockIq4Nl, BlockMxfp4, BlockQ8_0, KVALUES_IQ4NL, KVALUES_MXFP4,
};

/// A 32-element block of table indices.
pub(super) trait TableLevels: Copy {
    /// The level table.
    const TABLE: [i8; 16];
    /// The block scale, widened exactly.
    fn scale_f32(&self) -> f32;
    /// Packed codes: byte `j` holds element `j` (low nibble) and `j + 16` (high nibble).
    fn codes(&self) -> &[u8; 16];
}

impl TableLevels for BlockIq4Nl {
    const TABLE: [i8; 16] = KVALUES_IQ4NL;
    fn scale_f32(&self) -> f32 {
        self.d.to_f32()
    }
    fn codes(&self) -> &[u8; 16] {
        &self.qs
    }
}

impl TableLevels for BlockMxfp4 {
    const TABLE: [i8; 16] = KVALUES_MXFP4;
    fn scale_f32(&self) -> f32 {
        e8m0_to_f32_half(self.e)
    }
    fn codes(&self) -> &[u8; 16] {
        &self.qs
    }
}

/// Scalar reference: the lane-structured sum the AVX2 kernel computes.
fn dot_table_scalar<W: TableLevels, const NT: usize>(w: &[W], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [[0.0f32; 8]; NT];
    for (i, wb) in w.iter().enumerate() {
        let mut q = [0i32; 32];
        for (j, &b) in wb.codes().iter().enumerate() {
            q[j] = W::TABLE[(b & 0x0f) as usize] as i32;
            q[j + 16] = W::TABLE[(b >> 4) as usize] as i32;
        }
        let dw = wb.scale_f32();
        for (t, acc) in acc.iter_mut().enumerate() {
            let xb = &x[t][i];
            let d = dw * xb.d.to_f32();
            for (l, a) in acc.iter_mut().enumerate() {
                let s: i32 = (4 * l..4 * l + 4).map(|e| q[e] * xb.qs[e] as i32).sum();
                *a += d * s as f32;
            }
        }
    }
    acc.map(hsum8_fixed)
}

/// AVX2 version of [`dot_table_scalar`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_table_avx2<W: TableLevels, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8_0]; NT],
) -> [f32; NT] {
    use super::simd::{dot_u8i8_epi32, f16_to_f32, hsum_ps, load32, nibbles_16, prefetch_ahead};
    use std::arch::x86_64::*;
    let x = x.map(|a| &a[..w.len()]);
    let t16 = W::TABLE;
    // SAFETY (of the load): `t16` is 16 readable bytes.
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(t16.as_ptr().cast()));
    let mut acc = [_mm256_setzero_ps(); NT];
    for (i, wb) in w.iter().enumerate() {
        prefetch_ahead::<NT, W>(wb);
        let q = _mm256_shuffle_epi8(table, nibbles_16(wb.codes()));
        let aq = _mm256_sign_epi8(q, q);
        let dw = wb.scale_f32();
        for t in 0..NT {
            let xb = &x[t][i];
            let y = _mm256_sign_epi8(load32(&xb.qs), q);
            let s = _mm256_cvtepi32_ps(dot_u8i8_epi32(aq, y));
            let d = _mm256_set1_ps(dw * f16_to_f32(xb.d.to_bits()));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(d, s));
        }
    }
    let mut out = [0.0; NT];
    for t in 0..NT {
        out[t] = hsum_ps(acc[t]);
    }
    out
}

impl QuantDot for BlockIq4Nl {
    type Act = BlockQ8_0;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        dot_table_scalar(w, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        dot_table_avx2(w, x)
    }
}

impl QuantDot for BlockMxfp4 {
    type Act = BlockQ8_0;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        dot_table_scalar(w, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        dot_table_avx2(w, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_kernel, check_length_error};

    #[test]
    fn iq4_nl_kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 211), (7, 212), (28, 213), (152, 214)] {
            check_kernel::<BlockIq4Nl>(n, seed);
        }
        check_length_error::<BlockIq4Nl>();
    }

    #[test]
    fn mxfp4_kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 221), (7, 222), (41, 223)] {
            check_kernel::<BlockMxfp4>(n, seed);
        }
        check_length_error::<BlockMxfp4>();
    }
}
