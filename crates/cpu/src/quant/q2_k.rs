//! Q2_K weights · Q8_K activations.
//!
//! `sum += (dy * d) * Σ_g sc_g Σ q y - (dy * dmin) * Σ_g m_g bsum_g`, integers exact, so
//! the AVX2 kernel (which only computes the integers differently) gives the same bits.

use super::QuantDot;
use minfer_gguf::quant::{BlockQ2K, BlockQ8K};

impl QuantDot for BlockQ2K {
    type Act = BlockQ8K;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        let x = x.map(|a| &a[..w.len()]);
        let mut acc = [0.0f32; NT];
        for (i, wb) in w.iter().enumerate() {
            let (d, dmin) = (wb.d.to_f32(), wb.dmin.to_f32());
            for t in 0..NT {
                let y = &x[t][i];
                let (mut sumi, mut summ) = (0i32, 0i32);
                for g in 0..16 {
                    let q = &wb.qs[32 * (g / 8) + 16 * (g % 2)..][..16];
                    let shift = 2 * ((g % 8) / 2);
                    let part: i32 = q
                        .iter()
                        .zip(&y.qs[16 * g..16 * g + 16])
                        .map(|(&b, &v)| ((b >> shift) & 3) as i32 * v as i32)
                        .sum();
                    sumi += (wb.scales[g] & 0x0f) as i32 * part;
                    summ += (wb.scales[g] >> 4) as i32 * y.bsums[g] as i32;
                }
                acc[t] += (y.d * d) * sumi as f32 - (y.d * dmin) * summ as f32;
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
        let mut acc = [0.0f32; NT];
        for (i, wb) in w.iter().enumerate() {
            let (d, dmin) = (wb.d.to_f32(), wb.dmin.to_f32());
            // Chunk (n, j): bytes qs[32n..32n+32] shifted by 2j hold groups 8n+2j (first
            // 16 elements) and 8n+2j+1; each 128-bit half of a register is one group.
            let mut lv = [_mm256_setzero_si256(); 8];
            let mut sc = [_mm256_setzero_si256(); 8];
            for n in 0..2 {
                // SAFETY: 32 bytes at 32n < 64.
                let q = _mm256_loadu_si256(wb.qs.as_ptr().add(32 * n).cast());
                for j in 0..4 {
                    let g = 8 * n + 2 * j;
                    lv[4 * n + j] =
                        _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), m3);
                    sc[4 * n + j] = _mm256_set_m128i(
                        _mm_set1_epi16((wb.scales[g + 1] & 0x0f) as i16),
                        _mm_set1_epi16((wb.scales[g] & 0x0f) as i16),
                    );
                }
            }
            for t in 0..NT {
                let y = &x[t][i];
                let mut v = _mm256_setzero_si256();
                for (c, (l, s)) in lv.iter().zip(&sc).enumerate() {
                    // SAFETY: 32 activation levels at 32c < 256.
                    let yc = _mm256_loadu_si256(y.qs.as_ptr().add(32 * c).cast());
                    // Levels <= 3 against |y| <= 127: pair sums fit i16.
                    v = _mm256_add_epi32(v, _mm256_madd_epi16(_mm256_maddubs_epi16(*l, yc), *s));
                }
                let sumi = hsum_epi32(v);
                let summ: i32 = (0..16)
                    .map(|g| (wb.scales[g] >> 4) as i32 * y.bsums[g] as i32)
                    .sum();
                acc[t] += (y.d * d) * sumi as f32 - (y.d * dmin) * summ as f32;
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
        for (n, seed) in [(1, 81), (4, 82), (9, 83)] {
            check_kernel::<BlockQ2K>(n, seed);
        }
        check_length_error::<BlockQ2K>();
    }
}
