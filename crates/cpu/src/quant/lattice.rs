//! AVX2 kernels of the lattice i-quants · Q8_K: IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS,
//! IQ1_M and IQ1_S, each bitwise equal to the scalar reference in `grouped`.
//!
//! A super-block is decoded 32 elements at a time into the level magnitudes (grid points
//! looked up one by one, as the indices are bit fields of varying width), a byte vector
//! carrying the levels' signs (±1, or the signed level itself) and the 16-bit scales of
//! the two 16-element halves. Per activation row the magnitudes meet the sign-adjusted
//! activations in `maddubs` (pair sums stay within ±2·62·127, no saturation), the pair
//! sums are weighed by the scales in `madd` and summed in i32 lanes: the exact integer
//! `sumi` of the scalar reference. The float step `sum += (f * dy) * sumi`, with `f`
//! formed as the reference forms it, runs in block order as there.

mod tile;

pub(super) use tile::rows8;

use super::simd::{bytes_from_bits_32, hsum_epi32, prefetch_ahead};
use minfer_gguf::quant::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockQ8K,
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use std::arch::x86_64::*;

/// [`KSIGNS_IQ2XS`] spelled as eight sign bytes per entry: byte `j` is -1 where bit `j` is
/// set and +1 elsewhere, ready for `_mm256_sign_epi8`.
static SIGNS_PM1: [i64; 128] = {
    let mut t = [0i64; 128];
    let mut i = 0;
    while i < 128 {
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let b: u64 = if KSIGNS_IQ2XS[i] & (1 << j) != 0 {
                0xff
            } else {
                0x01
            };
            v |= b << (8 * j);
            j += 1;
        }
        t[i] = v as i64;
        i += 1;
    }
    t
};

/// 32 decoded elements: `level = mag * sign(sign)` bytewise, and the scale of each half.
pub(super) struct Group {
    /// Level magnitudes (unsigned bytes).
    mag: __m256i,
    /// Bytes whose sign is the level's (never zero where the magnitude is not).
    sign: __m256i,
    /// Sixteen i16 scales: the low eight weigh elements 0..16, the high eight 16..32.
    scale: __m256i,
}

/// A lattice super-block decoded 32 elements at a time.
pub(super) trait Lattice: Copy {
    /// The factor `f` the scalar reference's decoder returns, computed the same way.
    fn factor(&self) -> f32;

    /// Elements `32ib..32ib+32`.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    unsafe fn group(&self, ib: usize) -> Group;
}

/// Sign bytes ±1 from 32 explicit sign bits (bit `j` negates element `j`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pm1_from_bits(bits: u32) -> __m256i {
    _mm256_or_si256(bytes_from_bits_32(bits), _mm256_set1_epi8(1))
}

/// The i32 at bytes `4k..4k+4` of `b`, little-endian.
#[inline]
fn word(b: &[u8], k: usize) -> u32 {
    u32::from_le_bytes([b[4 * k], b[4 * k + 1], b[4 * k + 2], b[4 * k + 3]])
}

/// One scale for all 32 elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_32(s: i32) -> __m256i {
    _mm256_set1_epi16(s as i16)
}

/// `lo` for elements 0..16, `hi` for 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_16(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// The 4-bit scales pair of IQ2_XS and IQ2_S (`2s + 1` for each half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_nibbles(b: u8) -> __m256i {
    scale_16(2 * (b & 0x0f) as i32 + 1, 2 * (b >> 4) as i32 + 1)
}

/// IQ1 levels `8 * g + delta` from grid bytes `g` (-1, 0 or 1) and `delta` bytes (±1):
/// odd, so never zero, and they carry their own sign.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_group(points: __m256i, delta: __m256i, scale: __m256i) -> Group {
    let level = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), points), delta);
    Group {
        mag: _mm256_abs_epi8(level),
        sign: level,
        scale,
    }
}

impl Lattice for BlockIq3S {
    fn factor(&self) -> f32 {
        self.d.to_f32()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(&self, ib: usize) -> Group {
        let qh = self.qh[ib] as usize;
        let g = |j: usize| IQ3S_GRID[self.qs[8 * ib + j] as usize | ((qh >> j) & 1) << 8] as i32;
        Group {
            mag: _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7)),
            sign: pm1_from_bits(word(&self.signs, ib)),
            scale: scale_32(1 + 2 * ((self.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32),
        }
    }
}

impl Lattice for BlockIq3Xxs {
    fn factor(&self) -> f32 {
        self.d.to_f32() * 0.25
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(&self, ib: usize) -> Group {
        let aux = self.aux(ib);
        let g = |j: usize| IQ3XXS_GRID[self.qs[8 * ib + j] as usize] as i32;
        let s = |l: u32| SIGNS_PM1[((aux >> (7 * l)) & 127) as usize];
        Group {
            mag: _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7)),
            sign: _mm256_setr_epi64x(s(0), s(1), s(2), s(3)),
            scale: scale_32(2 * (aux >> 28) as i32 + 1),
        }
    }
}

impl Lattice for BlockIq2S {
    fn factor(&self) -> f32 {
        self.d.to_f32() * 0.125
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(&self, ib: usize) -> Group {
        let qh = self.qh[ib] as usize;
        let g =
            |l: usize| IQ2S_GRID[self.qs[4 * ib + l] as usize | ((qh >> (2 * l)) & 3) << 8] as i64;
        Group {
            mag: _mm256_setr_epi64x(g(0), g(1), g(2), g(3)),
            sign: pm1_from_bits(word(&self.qs[32..], ib)),
            scale: scale_nibbles(self.scales[ib]),
        }
    }
}

impl Lattice for BlockIq2Xs {
    fn factor(&self) -> f32 {
        self.d.to_f32() * 0.125
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(&self, ib: usize) -> Group {
        let v = |l: usize| self.qs[4 * ib + l] as usize;
        let g = |l: usize| IQ2XS_GRID[v(l) & 511] as i64;
        let s = |l: usize| SIGNS_PM1[v(l) >> 9];
        Group {
            mag: _mm256_setr_epi64x(g(0), g(1), g(2), g(3)),
            sign: _mm256_setr_epi64x(s(0), s(1), s(2), s(3)),
            scale: scale_nibbles(self.scales[ib]),
        }
    }
}

impl Lattice for BlockIq2Xxs {
    fn factor(&self) -> f32 {
        self.d.to_f32() * 0.125
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(&self, ib: usize) -> Group {
        let (grid, signs) = self.words(ib);
        let g = |l: u32| IQ2XXS_GRID[(grid >> (8 * l)) as u8 as usize] as i64;
        let s = |l: u32| SIGNS_PM1[((signs >> (7 * l)) & 127) as usize];
        Group {
            mag: _mm256_setr_epi64x(g(0), g(1), g(2), g(3)),
            sign: _mm256_setr_epi64x(s(0), s(1), s(2), s(3)),
            scale: scale_32(2 * (signs >> 28) as i32 + 1),
        }
    }
}

/// Eight bytes of `+1` or, when `negative`, of `-1`.
#[inline]
fn delta8(negative: bool) -> i64 {
    if negative {
        -1
    } else {
        0x0101_0101_0101_0101
    }
}

impl Lattice for BlockIq1M {
    fn factor(&self) -> f32 {
        self.d().to_f32() * 0.125
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(&self, ib: usize) -> Group {
        // The nibble of point `4ib + l`: index bits 8..11, and bit 3 negates the shift.
        let nib = |l: usize| (self.qh[2 * ib + l / 2] >> (4 * (l % 2))) as usize & 0x0f;
        let g = |l: usize| IQ1S_GRID[self.qs[4 * ib + l] as usize | (nib(l) & 7) << 8] as i64;
        let dl = |l: usize| delta8(nib(l) & 8 != 0);
        let sc = |g: usize| 2 * ((self.scale_word(g / 4) >> (3 * (g % 4))) & 7) as i32 + 1;
        iq1_group(
            _mm256_setr_epi64x(g(0), g(1), g(2), g(3)),
            _mm256_setr_epi64x(dl(0), dl(1), dl(2), dl(3)),
            scale_16(sc(2 * ib), sc(2 * ib + 1)),
        )
    }
}

impl Lattice for BlockIq1S {
    fn factor(&self) -> f32 {
        self.d.to_f32() * 0.125
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(&self, ib: usize) -> Group {
        let qh = self.qh[ib] as usize;
        let g =
            |l: usize| IQ1S_GRID[self.qs[4 * ib + l] as usize | ((qh >> (3 * l)) & 7) << 8] as i64;
        iq1_group(
            _mm256_setr_epi64x(g(0), g(1), g(2), g(3)),
            _mm256_set1_epi64x(delta8(qh & 0x8000 != 0)),
            scale_32(2 * ((qh >> 12) & 7) as i32 + 1),
        )
    }
}

/// AVX2 version of the scalar reference for every [`Lattice`] type.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_lattice_avx2<W: Lattice, const NT: usize>(
    w: &[W],
    x: [&[BlockQ8K]; NT],
) -> [f32; NT] {
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [0.0f32; NT];
    for (i, wb) in w.iter().enumerate() {
        prefetch_ahead::<NT, W>(wb);
        let mut sums = [_mm256_setzero_si256(); NT];
        for ib in 0..8 {
            let g = wb.group(ib);
            for t in 0..NT {
                // SAFETY (of the load): bytes 32ib..32ib+32 of the 256 levels.
                let y = _mm256_loadu_si256(x[t][i].qs.as_ptr().add(32 * ib).cast());
                let p = _mm256_maddubs_epi16(g.mag, _mm256_sign_epi8(y, g.sign));
                sums[t] = _mm256_add_epi32(sums[t], _mm256_madd_epi16(p, g.scale));
            }
        }
        let f = wb.factor();
        for t in 0..NT {
            acc[t] += (f * x[t][i].d) * hsum_epi32(sums[t]) as f32;
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{
        check_kernel_on, check_rows, iq1m_valid_scale, random_blocks, small_f16,
    };
    use crate::quant::QuantDot;
    use minfer_gguf::quant::Quantize;

    #[test]
    fn sign_bytes_follow_the_sign_table() {
        for (i, &v) in SIGNS_PM1.iter().enumerate() {
            for j in 0..8 {
                let b = (v >> (8 * j)) as i8;
                let neg = KSIGNS_IQ2XS[i] & (1 << j) != 0;
                assert_eq!(b, if neg { -1 } else { 1 }, "{i} {j}");
            }
        }
    }

    /// Many random blocks (every byte pattern decodes to valid levels once the scale is
    /// finite): the generic checks, then batches of 3 and 8 rows.
    fn check_many<B: QuantDot>(fix: impl Fn(&mut B, u32) + Copy, seed: u64)
    where
        B::Act: Quantize,
    {
        for (n, s) in [(1, seed), (40, seed + 1)] {
            check_kernel_on(random_blocks(n, s, fix), s);
        }
        let w = random_blocks(23, seed + 2, fix);
        check_rows::<B, 3>(&w, seed + 3);
        check_rows::<B, 8>(&w, seed + 4);
    }

    #[test]
    fn iq3_kernels_agree_bitwise_on_many_blocks() {
        check_many(|b: &mut BlockIq3S, r| b.d = small_f16(r), 611);
        check_many(|b: &mut BlockIq3Xxs, r| b.d = small_f16(r), 621);
    }

    #[test]
    fn iq2_kernels_agree_bitwise_on_many_blocks() {
        check_many(|b: &mut BlockIq2S, r| b.d = small_f16(r), 631);
        check_many(|b: &mut BlockIq2Xs, r| b.d = small_f16(r), 641);
        check_many(|b: &mut BlockIq2Xxs, r| b.d = small_f16(r), 651);
    }

    #[test]
    fn iq1_kernels_agree_bitwise_on_many_blocks() {
        check_many(iq1m_valid_scale, 661);
        check_many(|b: &mut BlockIq1S, r| b.d = small_f16(r), 671);
    }
}
