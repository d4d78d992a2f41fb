//! AVX2 kernels of the ternary types · Q8_K: TQ2_0 and TQ1_0, each bitwise equal to the
//! scalar reference in `grouped`.
//!
//! A super-block decodes to its 256 stored values `u = t + 1` (0..=2 for valid blocks; a
//! TQ2_0 block may hold 3, which the reference reads as the level 2 and so does this
//! code). Per activation row, `maddubs(u, y)` pair sums (within ±2·3·127) add up over the
//! eight 32-element vectors in i16 lanes (within ±8·762), and the `-1` of every level is
//! taken back through the activation block's group sums: `sumi = Σ u·y - Σ bsums`, exact
//! since Q8_K's `bsums[g]` is the sum of its group's levels. The float step is the
//! reference's `sum += (d * dy) * sumi` in block order.

use super::simd::{hsum_epi32, prefetch_ahead};
use minfer_gguf::quant::{BlockQ8K, BlockTq1_0, BlockTq2_0};
use std::arch::x86_64::*;

/// A ternary super-block decoded to its stored values.
pub(super) trait Ternary: Copy {
    /// The super-block scale, widened exactly.
    fn factor(&self) -> f32;

    /// The 256 values `t + 1` in element order, 32 per vector.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn values(&self) -> [__m256i; 8];
}

impl Ternary for BlockTq2_0 {
    fn factor(&self) -> f32 {
        self.d.to_f32()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(&self) -> [__m256i; 8] {
        // SAFETY (of the loads): bytes 0..32 and 32..64 of the 64 packed bytes.
        let [a0, a1, a2, a3] = crumbs(_mm256_loadu_si256(self.qs.as_ptr().cast()));
        let [b0, b1, b2, b3] = crumbs(_mm256_loadu_si256(self.qs.as_ptr().add(32).cast()));
        [a0, a1, a2, a3, b0, b1, b2, b3]
    }
}

/// The four 2-bit fields of each byte, lowest first: element `128c + 32l + j` of TQ2_0 is
/// field `l` of byte `32c + j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn crumbs(v: __m256i) -> [__m256i; 4] {
    let m = _mm256_set1_epi8(3);
    [
        _mm256_and_si256(v, m),
        _mm256_and_si256(_mm256_srli_epi16::<2>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
        _mm256_and_si256(_mm256_srli_epi16::<6>(v), m),
    ]
}

/// `3 * v` in each byte, modulo 256.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn times3(v: __m256i) -> __m256i {
    _mm256_add_epi8(v, _mm256_add_epi8(v, v))
}

/// [`times3`] on 16 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn times3_128(v: __m128i) -> __m128i {
    _mm_add_epi8(v, _mm_add_epi8(v, v))
}

/// The top trit `(q * 3) >> 8` of each byte `q`: 0 below 86, 1 below 171, else 2, read
/// with two signed compares after moving the byte range to -128..=127.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn top_trits(q: __m256i) -> __m256i {
    let s = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
    // q >= 86 is s > 85 - 128, q >= 171 is s > 170 - 128.
    let ge86 = _mm256_cmpgt_epi8(s, _mm256_set1_epi8(-43));
    let ge171 = _mm256_cmpgt_epi8(s, _mm256_set1_epi8(42));
    // Each compare is -1 where it holds.
    _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge86, ge171))
}

impl Ternary for BlockTq1_0 {
    fn factor(&self) -> f32 {
        self.d.to_f32()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(&self) -> [__m256i; 8] {
        // Trit m of a byte is the top trit of `byte * 3^m`. Bytes 0..32 hold elements
        // 32m + j, so each power is one vector.
        // SAFETY (of the load): bytes 0..32 of the 48.
        let a0 = _mm256_loadu_si256(self.qs.as_ptr().cast());
        let a1 = times3(a0);
        let a2 = times3(a1);
        let a3 = times3(a2);
        let a4 = times3(a3);
        // Bytes 32..48 hold elements 160 + 16m + j: powers (0, 1), (2, 3) and 4 pair into
        // vectors, the last with the 16 elements 240 + 4m + j of the four `qh` bytes, whose
        // lanes take power m in dword m.
        // SAFETY (of the load): bytes 32..48 of the 48.
        let b = _mm_loadu_si128(self.qs.as_ptr().add(32).cast());
        let b01 = _mm256_set_m128i(times3_128(b), b);
        let b23 = times3(times3(b01));
        let b4 = times3_128(_mm256_extracti128_si256::<1>(b23));
        let h0 = _mm_set1_epi32(i32::from_le_bytes(self.qh));
        let h1 = times3_128(h0);
        let h2 = times3_128(h1);
        let h3 = times3_128(h2);
        let h = _mm_blend_epi32::<0b1000>(
            _mm_blend_epi32::<0b0100>(_mm_blend_epi32::<0b0010>(h0, h1), h2),
            h3,
        );
        [
            top_trits(a0),
            top_trits(a1),
            top_trits(a2),
            top_trits(a3),
            top_trits(a4),
            top_trits(b01),
            top_trits(b23),
            top_trits(_mm256_set_m128i(h, b4)),
        ]
    }
}

/// AVX2 version of the scalar reference for both ternary types.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_ternary_avx2<W: Ternary, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8K]; NT],
) -> [f32; NT] {
    let x = x.map(|a| &a[..w.len()]);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [0.0f32; NT];
    for (i, wb) in w.iter().enumerate() {
        prefetch_ahead::<NT, W>(wb);
        let u = wb.values();
        let f = wb.factor();
        for t in 0..NT {
            let y = &x[t][i];
            let mut s16 = _mm256_setzero_si256();
            for (ib, &v) in u.iter().enumerate() {
                // SAFETY (of the load): bytes 32ib..32ib+32 of the 256 levels.
                let yv = _mm256_loadu_si256(y.qs.as_ptr().add(32 * ib).cast());
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(v, yv));
            }
            // SAFETY (of the load): the 16 i16 group sums.
            let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            let s = _mm256_sub_epi32(_mm256_madd_epi16(s16, ones), _mm256_madd_epi16(bs, ones));
            acc[t] += (f * y.d) * hsum_epi32(s) as f32;
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{
        check_kernel, check_kernel_on, check_rows, random_blocks, small_f16,
    };
    use crate::quant::Isa;

    #[test]
    fn top_trits_match_the_reference_for_every_byte() {
        if Isa::avx2().is_none() {
            return;
        }
        for m in 0..5u32 {
            let bytes: [u8; 256] = std::array::from_fn(|b| b as u8);
            let mut got = [0u8; 256];
            for (src, dst) in bytes.chunks_exact(32).zip(got.chunks_exact_mut(32)) {
                // SAFETY: AVX2 is present (checked above); the loads and stores cover 32
                // bytes of 32-byte chunks.
                unsafe {
                    let mut v = _mm256_loadu_si256(src.as_ptr().cast());
                    for _ in 0..m {
                        v = times3(v);
                    }
                    _mm256_storeu_si256(dst.as_mut_ptr().cast(), top_trits(v));
                }
            }
            for (b, &g) in got.iter().enumerate() {
                // The reference's reading: the top trit of `byte * 3^m` (mod 256).
                let q = (b as u8).wrapping_mul(3u8.pow(m)) as u16;
                assert_eq!(g as u16, (q * 3) >> 8, "byte {b} trit {m}");
            }
        }
    }

    #[test]
    fn ternary_kernels_agree_bitwise_on_many_blocks() {
        for (n, seed) in [(33, 711), (64, 712)] {
            check_kernel::<BlockTq1_0>(n, seed);
            check_kernel::<BlockTq2_0>(n, seed);
        }
        // Random bytes: every TQ1_0 byte decodes, and TQ2_0's value 3 reads as level 2 on
        // both paths.
        let fix1 = |b: &mut BlockTq1_0, r| b.d = small_f16(r);
        let fix2 = |b: &mut BlockTq2_0, r| b.d = small_f16(r);
        check_kernel_on(random_blocks(29, 713, fix1), 713);
        check_kernel_on(random_blocks(29, 714, fix2), 714);
        let (w1, w2) = (random_blocks(17, 715, fix1), random_blocks(17, 716, fix2));
        check_rows::<BlockTq1_0, 3>(&w1, 717);
        check_rows::<BlockTq1_0, 8>(&w1, 718);
        check_rows::<BlockTq2_0, 3>(&w2, 719);
        check_rows::<BlockTq2_0, 8>(&w2, 720);
    }
}
