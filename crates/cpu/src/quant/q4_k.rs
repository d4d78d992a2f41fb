//! Q4_K and Q5_K weights · Q8_K activations (one kernel; Q5_K adds the fifth bits).
//!
//! Per super-block the integer dot `Σ_j sc_j Σ_{i∈j} q_i y_i` and the min term
//! `Σ_j m_j (bsum_{2j} + bsum_{2j+1})` are exact, then
//! `sum += (dy * d) * sumi - (dy * dmin) * summ` in block order on every ISA.

use super::QuantDot;
use minfer_gguf::quant::{scale_min_k4, BlockQ4K, BlockQ5K, BlockQ8K};

/// What the shared kernel needs from a Q4_K-like block.
pub(super) trait K4Like: Copy {
    /// Whether `qh` supplies a fifth bit.
    const HIGH: bool;
    /// `(d, dmin)` bits, the packed scales, the low nibbles and the fifth bits.
    fn parts(&self) -> (u16, u16, &[u8; 12], &[u8; 128], &[u8; 32]);
}

const NO_HIGH: [u8; 32] = [0; 32];

impl K4Like for BlockQ4K {
    const HIGH: bool = false;
    fn parts(&self) -> (u16, u16, &[u8; 12], &[u8; 128], &[u8; 32]) {
        (
            self.d.to_bits(),
            self.dmin.to_bits(),
            &self.scales,
            &self.qs,
            &NO_HIGH,
        )
    }
}

impl K4Like for BlockQ5K {
    const HIGH: bool = true;
    fn parts(&self) -> (u16, u16, &[u8; 12], &[u8; 128], &[u8; 32]) {
        (
            self.d.to_bits(),
            self.dmin.to_bits(),
            &self.scales,
            &self.qs,
            &self.qh,
        )
    }
}

/// The eight 6-bit scales and mins of a block.
pub(super) fn scales_mins(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, packed);
    }
    (sc, m)
}

/// `Σ_j m_j (bsums[2j] + bsums[2j+1])`.
fn min_sum(m: &[u8; 8], bsums: &[i16; 16]) -> i32 {
    (0..8)
        .map(|j| m[j] as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32))
        .sum()
}

/// Scalar reference of the shared kernel.
pub(super) fn dot_k4_scalar<W: K4Like, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8K]; NT],
) -> [f32; NT] {
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [0.0f32; NT];
    for (i, wb) in w.iter().enumerate() {
        let (d, dmin, packed, qs, qh) = wb.parts();
        let (d, dmin) = (
            half::f16::from_bits(d).to_f32(),
            half::f16::from_bits(dmin).to_f32(),
        );
        let (sc, m) = scales_mins(packed);
        for t in 0..NT {
            let y = &x[t][i];
            let mut sumi = 0i32;
            for c in 0..4 {
                let (mut lo, mut hi) = (0i32, 0i32);
                for l in 0..32 {
                    let b = qs[32 * c + l];
                    let h = qh[l];
                    let ql = (b & 0x0f) | (((h >> (2 * c)) & 1) << 4);
                    let qh_ = (b >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
                    lo += ql as i32 * y.qs[64 * c + l] as i32;
                    hi += qh_ as i32 * y.qs[64 * c + 32 + l] as i32;
                }
                sumi += sc[2 * c] as i32 * lo + sc[2 * c + 1] as i32 * hi;
            }
            let summ = min_sum(&m, &y.bsums);
            acc[t] += (y.d * d) * sumi as f32 - (y.d * dmin) * summ as f32;
        }
    }
    acc
}

/// The eight 6-bit scales and mins as little-endian byte lanes of two u64s, unpacked with
/// word operations: bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of scales 4-7,
/// bytes 4-7 the same for the mins, bytes 8-11 the low nibbles of scales 4-7 (low half)
/// and of mins 4-7 (high half).
#[cfg(target_arch = "x86_64")]
#[inline]
fn scales_mins_u64(p: &[u8; 12]) -> (u64, u64) {
    let w = |k: usize| u32::from_le_bytes([p[4 * k], p[4 * k + 1], p[4 * k + 2], p[4 * k + 3]]);
    let (a0, a1, a2) = (w(0), w(1), w(2));
    let lo6 = 0x3f3f_3f3f;
    let sc_hi = (a2 & 0x0f0f_0f0f) | ((a0 >> 2) & 0x3030_3030);
    let m_hi = ((a2 >> 4) & 0x0f0f_0f0f) | ((a1 >> 2) & 0x3030_3030);
    (
        (a0 & lo6) as u64 | (sc_hi as u64) << 32,
        (a1 & lo6) as u64 | (m_hi as u64) << 32,
    )
}

/// AVX2 version of [`dot_k4_scalar`]: same exact integers, same float formula.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_k4_avx2<W: K4Like, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8K]; NT],
) -> [f32; NT] {
    use std::arch::x86_64::*;
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [0.0f32; NT];
    let nib = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    // Control j broadcasts i16 lane j of a 128-bit half to all its lanes.
    let bcast: [__m256i; 8] = [
        _mm256_set1_epi16(0x0100),
        _mm256_set1_epi16(0x0302),
        _mm256_set1_epi16(0x0504),
        _mm256_set1_epi16(0x0706),
        _mm256_set1_epi16(0x0908),
        _mm256_set1_epi16(0x0b0a),
        _mm256_set1_epi16(0x0d0c),
        _mm256_set1_epi16(0x0f0e),
    ];
    for (i, wb) in w.iter().enumerate() {
        let (d, dmin, packed, qs, qh) = wb.parts();
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128((d as u32 | (dmin as u32) << 16) as i32));
        let (d, dmin) = (_mm_cvtss_f32(dd), _mm_cvtss_f32(_mm_movehdup_ps(dd)));
        let (sc, m) = scales_mins_u64(packed);
        let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(m as i64));
        let hbits = if W::HIGH {
            _mm256_loadu_si256(qh.as_ptr().cast())
        } else {
            _mm256_setzero_si256()
        };
        let mut sumi = [_mm256_setzero_si256(); NT];
        for c in 0..4 {
            // SAFETY: 32 bytes at offset 32c < 128 lie inside `qs`.
            let q = _mm256_loadu_si256(qs.as_ptr().add(32 * c).cast());
            let mut lo = _mm256_and_si256(q, nib);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), nib);
            if W::HIGH {
                let shift = _mm_cvtsi32_si128(2 * c as i32);
                let h = _mm256_srl_epi16(hbits, shift);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(h, one), 4));
                let h = _mm256_srli_epi16(h, 1);
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(h, one), 4));
            }
            let s_lo = _mm256_shuffle_epi8(sc16, bcast[2 * c]);
            let s_hi = _mm256_shuffle_epi8(sc16, bcast[2 * c + 1]);
            for t in 0..NT {
                let yq = x[t][i].qs.as_ptr();
                // SAFETY: offsets 64c and 64c + 32 plus 32 bytes stay within the 256 levels.
                let y_lo = _mm256_loadu_si256(yq.add(64 * c).cast());
                let y_hi = _mm256_loadu_si256(yq.add(64 * c + 32).cast());
                let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, y_lo), s_lo);
                let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, y_hi), s_hi);
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p_lo, p_hi));
            }
        }
        for t in 0..NT {
            let y = &x[t][i];
            // SAFETY: 16 i16 group sums.
            let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            // Pair sums of two 16-level groups stay within ±4064.
            let pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            let mm = _mm_madd_epi16(pairs, m16);
            let v = _mm_add_epi32(
                _mm256_castsi256_si128(sumi[t]),
                _mm256_extracti128_si256(sumi[t], 1),
            );
            let h = _mm_hadd_epi32(v, mm);
            let h = _mm_hadd_epi32(h, h);
            let (si, summ) = (_mm_cvtsi128_si32(h), _mm_extract_epi32(h, 1));
            acc[t] += (y.d * d) * si as f32 - (y.d * dmin) * summ as f32;
        }
    }
    acc
}

impl QuantDot for BlockQ4K {
    type Act = BlockQ8K;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        dot_k4_scalar(w, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        dot_k4_avx2(w, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_kernel, check_length_error};

    #[test]
    fn kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 51), (4, 52), (19, 53)] {
            check_kernel::<BlockQ4K>(n, seed);
        }
        check_length_error::<BlockQ4K>();
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn word_unpacking_matches_scale_min_k4() {
        let mut p = [0u8; 12];
        for seed in 0..200u32 {
            for (k, b) in p.iter_mut().enumerate() {
                *b = (seed.wrapping_mul(2_654_435_761).rotate_left(k as u32 * 3) >> 7) as u8;
            }
            let (sc, m) = scales_mins(&p);
            let (sc64, m64) = scales_mins_u64(&p);
            assert_eq!(sc64.to_le_bytes(), sc, "{p:?}");
            assert_eq!(m64.to_le_bytes(), m, "{p:?}");
        }
    }
}
