//! Q6_K weights · Q8_K activations.
//!
//! Levels are `q - 32` with `q` in `0..64`; the offset is applied through the activation
//! group sums: `Σ_g sc_g Σ (q - 32) y = Σ_g sc_g Σ q y - 32 Σ_g sc_g bsum_g`, exact in i32,
//! then `sum += (dy * d) * sumi` in block order on every ISA.

use super::QuantDot;
use minfer_gguf::quant::{BlockQ6K, BlockQ8K};

/// `Σ_g sc_g * bsums_g`.
fn scaled_bsum(sc: &[i8; 16], bsums: &[i16; 16]) -> i32 {
    sc.iter()
        .zip(bsums)
        .map(|(&s, &b)| s as i32 * b as i32)
        .sum()
}

fn dot_scalar_impl<const NT: usize>(w: &[BlockQ6K], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [0.0f32; NT];
    for (i, wb) in w.iter().enumerate() {
        let d = wb.d.to_f32();
        for t in 0..NT {
            let y = &x[t][i];
            let mut part = [0i32; 16];
            for n in 0..2 {
                let ql = &wb.ql[64 * n..64 * n + 64];
                let qh = &wb.qh[32 * n..32 * n + 32];
                for k in 0..4 {
                    for l in 0..32 {
                        let low = (ql[l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
                        let q = low | (((qh[l] >> (2 * k)) & 3) << 4);
                        part[8 * n + 2 * k + l / 16] +=
                            q as i32 * y.qs[128 * n + 32 * k + l] as i32;
                    }
                }
            }
            let sumi: i32 = wb
                .scales
                .iter()
                .zip(&part)
                .map(|(&s, &p)| s as i32 * p)
                .sum();
            let sumi = sumi - 32 * scaled_bsum(&wb.scales, &y.bsums);
            acc[t] += (y.d * d) * sumi as f32;
        }
    }
    acc
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2_impl<const NT: usize>(w: &[BlockQ6K], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
    use super::simd::{f16_to_f32, hsum_epi32};
    use std::arch::x86_64::*;
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [0.0f32; NT];
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    // Control k broadcasts i16 lane 2k to the low half and lane 2k + 1 to the high half.
    let pair: [__m256i; 4] = [
        _mm256_set_m128i(_mm_set1_epi16(0x0302), _mm_set1_epi16(0x0100)),
        _mm256_set_m128i(_mm_set1_epi16(0x0706), _mm_set1_epi16(0x0504)),
        _mm256_set_m128i(_mm_set1_epi16(0x0b0a), _mm_set1_epi16(0x0908)),
        _mm256_set_m128i(_mm_set1_epi16(0x0f0e), _mm_set1_epi16(0x0d0c)),
    ];
    for (i, wb) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(wb);
        let d = f16_to_f32(wb.d.to_bits());
        // SAFETY: 16 scale bytes.
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.scales.as_ptr().cast()));
        // Scales 8n..8n+8 in both 128-bit halves, for the per-group broadcasts below.
        let halves = [
            _mm256_permute4x64_epi64(sc16, 0b01_00_01_00),
            _mm256_permute4x64_epi64(sc16, 0b11_10_11_10),
        ];
        let mut sumi = [_mm256_setzero_si256(); NT];
        for (n, &half) in halves.iter().enumerate() {
            // SAFETY: offsets 64n, 64n + 32 (+32 bytes) lie within ql; 32n (+32) within qh.
            let qa = _mm256_loadu_si256(wb.ql.as_ptr().add(64 * n).cast());
            let qb = _mm256_loadu_si256(wb.ql.as_ptr().add(64 * n + 32).cast());
            let qh = _mm256_loadu_si256(wb.qh.as_ptr().add(32 * n).cast());
            let q = [
                _mm256_or_si256(
                    _mm256_and_si256(qa, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(qb, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(qa, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                ),
            ];
            for (k, &qk) in q.iter().enumerate() {
                // Group 8n + 2k scales the low half, group 8n + 2k + 1 the high half.
                let s = _mm256_shuffle_epi8(half, pair[k]);
                for t in 0..NT {
                    // SAFETY: 128n + 32k + 32 <= 256 levels.
                    let y = _mm256_loadu_si256(x[t][i].qs.as_ptr().add(128 * n + 32 * k).cast());
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qk, y), s);
                    sumi[t] = _mm256_add_epi32(sumi[t], p);
                }
            }
        }
        for t in 0..NT {
            let y = &x[t][i];
            // SAFETY: 16 i16 group sums.
            let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            let off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
            let si = hsum_epi32(_mm256_sub_epi32(sumi[t], off));
            acc[t] += (y.d * d) * si as f32;
        }
    }
    acc
}

impl QuantDot for BlockQ6K {
    type Act = BlockQ8K;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        dot_scalar_impl(w, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        dot_avx2_impl(w, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_kernel, check_length_error};

    #[test]
    fn kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 71), (4, 72), (19, 73)] {
            check_kernel::<BlockQ6K>(n, seed);
        }
        check_length_error::<BlockQ6K>();
    }
}
