//! Q3_K weights · Q8_K activations.
//!
//! `sum += (dy * d) * Σ_g sc_g Σ (q - off) y`, integers exact, so the AVX2 kernel (which
//! only computes the integers differently) gives the same bits.

use super::QuantDot;
use minfer_gguf::quant::{BlockQ3K, BlockQ8K};

impl QuantDot for BlockQ3K {
    type Act = BlockQ8K;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        let x = x.map(|a| &a[..w.len()]);
        let mut acc = [0.0f32; NT];
        for (i, wb) in w.iter().enumerate() {
            let d = wb.d.to_f32();
            let mut levels = [0i8; 256];
            for (g, lv) in levels.chunks_exact_mut(16).enumerate() {
                let start = 16 * (g % 2);
                let q = &wb.qs[32 * (g / 8) + start..][..16];
                let hm = &wb.hmask[start..start + 16];
                let shift = 2 * ((g % 8) / 2);
                let bit = 1u8 << (g / 2);
                for ((l, &b), &h) in lv.iter_mut().zip(q).zip(hm) {
                    let off = if h & bit != 0 { 0 } else { 4 };
                    *l = ((b >> shift) & 3) as i8 - off;
                }
            }
            for t in 0..NT {
                let y = &x[t][i];
                let mut sumi = 0i32;
                for g in 0..16 {
                    let part: i32 = levels[16 * g..16 * g + 16]
                        .iter()
                        .zip(&y.qs[16 * g..16 * g + 16])
                        .map(|(&q, &v)| q as i32 * v as i32)
                        .sum();
                    sumi += wb.scale(g) as i32 * part;
                }
                acc[t] += (y.d * d) * sumi as f32;
            }
        }
        acc
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        use super::simd::hsum_epi32;
        use std::arch::x86_64::*;
        let x = x.map(|a| &a[..w.len()]);
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let mut acc = [0.0f32; NT];
        for (i, wb) in w.iter().enumerate() {
            let d = wb.d.to_f32();
            // SAFETY: 32 bytes of `hmask`.
            let hm = _mm256_loadu_si256(wb.hmask.as_ptr().cast());
            // Chunk (n, j) as in Q2_K: groups 8n+2j and 8n+2j+1 in the two 128-bit halves;
            // both take bit 4n+j of `hmask` (set: no offset, clear: minus 4).
            let mut lv = [_mm256_setzero_si256(); 8];
            let mut sc = [_mm256_setzero_si256(); 8];
            for n in 0..2 {
                // SAFETY: 32 bytes at 32n < 64.
                let q = _mm256_loadu_si256(wb.qs.as_ptr().add(32 * n).cast());
                for j in 0..4 {
                    let g = 8 * n + 2 * j;
                    let l =
                        _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), m3);
                    let bit = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                    let clear =
                        _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
                    lv[4 * n + j] = _mm256_sub_epi8(l, _mm256_and_si256(clear, four));
                    sc[4 * n + j] = _mm256_set_m128i(
                        _mm_set1_epi16(wb.scale(g + 1) as i16),
                        _mm_set1_epi16(wb.scale(g) as i16),
                    );
                }
            }
            for t in 0..NT {
                let y = &x[t][i];
                let mut v = _mm256_setzero_si256();
                for (c, (l, s)) in lv.iter().zip(&sc).enumerate() {
                    // SAFETY: 32 activation levels at 32c < 256.
                    let yc = _mm256_loadu_si256(y.qs.as_ptr().add(32 * c).cast());
                    // |level| <= 4 moved onto the activation's sign: pair sums fit i16
                    // (activations in -127..=127).
                    let p =
                        _mm256_maddubs_epi16(_mm256_sign_epi8(*l, *l), _mm256_sign_epi8(yc, *l));
                    v = _mm256_add_epi32(v, _mm256_madd_epi16(p, *s));
                }
                acc[t] += (y.d * d) * hsum_epi32(v) as f32;
            }
        }
        acc
    }

    super::rows8_items!(super::ktile::rows8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_kernel, check_length_error};

    #[test]
    fn kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 91), (4, 92), (9, 93)] {
            check_kernel::<BlockQ3K>(n, seed);
        }
        check_length_error::<BlockQ3K>();
    }
}
