//! The 256-element i-quants and ternary types · Q8_K activations (ggml's pairing):
//! IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, TQ1_0 and TQ2_0.
//!
//! Each type decodes a super-block to 256 signed integer levels, 16 integer group scales
//! (one per 16 elements; types with 32-element groups repeat theirs) and one f32 factor
//! `f`, with `x = f * scale_g * level` exactly as the reference dequantizes (the factor
//! folds ggml's power-of-two divisors, e.g. `d / 8` for `d * (0.5 + s) / 4` with scale
//! `2s + 1`, and IQ1's `grid ± 1/8` becomes the level `8 * grid ± 1`). Per super-block the
//! integer dot `Σ_g scale_g Σ_{i∈g} q_i y_i` is exact, then `sum += (f * dy) * sumi` in
//! block order on every ISA. IQ4_XS's AVX2 kernel is here, the lattice types' in `lattice`
//! and the ternary types' in `ternary`; all compute the same exact `sumi` and so agree
//! bitwise with this reference.

use super::QuantDot;
use minfer_gguf::quant::{
    BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockIq4Xs,
    BlockQ8K, BlockTq1_0, BlockTq2_0, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID,
    IQ3XXS_GRID, KSIGNS_IQ2XS, KVALUES_IQ4NL,
};
use minfer_gguf::QK_K;

/// A super-block that decodes to integer levels and group scales.
pub(super) trait Grouped: Copy {
    /// Fills `q` (element order) and `sc` (one per 16 elements); returns the factor `f`.
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32;
}

/// Writes the eight magnitudes of grid point `p` times the signs `s` (bit `j` negates `j`).
#[inline]
fn signed_point(q: &mut [i8], p: u64, s: u8) {
    for (j, v) in q[..8].iter_mut().enumerate() {
        let g = (p >> (8 * j)) as u8 as i8;
        *v = if s & (1 << j) != 0 { -g } else { g };
    }
}

impl Grouped for BlockIq4Xs {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        for ib in 0..8 {
            let s = self.sub_scale(ib) - 32;
            sc[2 * ib] = s;
            sc[2 * ib + 1] = s;
            for j in 0..16 {
                let b = self.qs[16 * ib + j];
                q[32 * ib + j] = KVALUES_IQ4NL[(b & 0x0f) as usize];
                q[32 * ib + j + 16] = KVALUES_IQ4NL[(b >> 4) as usize];
            }
        }
        self.d.to_f32()
    }
}

impl Grouped for BlockIq2Xxs {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        for ib in 0..8 {
            let (grid, signs) = self.words(ib);
            let s = 2 * (signs >> 28) as i32 + 1;
            sc[2 * ib] = s;
            sc[2 * ib + 1] = s;
            for l in 0..4 {
                let p = IQ2XXS_GRID[(grid >> (8 * l)) as u8 as usize];
                let sg = KSIGNS_IQ2XS[((signs >> (7 * l)) & 127) as usize];
                signed_point(&mut q[32 * ib + 8 * l..], p, sg);
            }
        }
        self.d.to_f32() * 0.125
    }
}

impl Grouped for BlockIq2Xs {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        for (g, s) in sc.iter_mut().enumerate() {
            *s = 2 * ((self.scales[g / 2] >> (4 * (g % 2))) & 0x0f) as i32 + 1;
        }
        for (i, &v) in self.qs.iter().enumerate() {
            let p = IQ2XS_GRID[(v & 511) as usize];
            signed_point(&mut q[8 * i..], p, KSIGNS_IQ2XS[(v >> 9) as usize]);
        }
        self.d.to_f32() * 0.125
    }
}

impl Grouped for BlockIq2S {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        for (g, s) in sc.iter_mut().enumerate() {
            *s = 2 * ((self.scales[g / 2] >> (4 * (g % 2))) & 0x0f) as i32 + 1;
        }
        for i in 0..32 {
            let hi = ((self.qh[i / 4] >> (2 * (i % 4))) & 3) as usize;
            let p = IQ2S_GRID[self.qs[i] as usize | hi << 8];
            signed_point(&mut q[8 * i..], p, self.qs[32 + i]);
        }
        self.d.to_f32() * 0.125
    }
}

impl Grouped for BlockIq3Xxs {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        for ib in 0..8 {
            let aux = self.aux(ib);
            let s = 2 * (aux >> 28) as i32 + 1;
            sc[2 * ib] = s;
            sc[2 * ib + 1] = s;
            for l in 0..4 {
                let k = 8 * ib + 2 * l;
                let p = IQ3XXS_GRID[self.qs[k] as usize] as u64
                    | (IQ3XXS_GRID[self.qs[k + 1] as usize] as u64) << 32;
                let sg = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                signed_point(&mut q[32 * ib + 8 * l..], p, sg);
            }
        }
        self.d.to_f32() * 0.25
    }
}

impl Grouped for BlockIq3S {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        for ib in 0..8 {
            let s = 1 + 2 * ((self.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32;
            sc[2 * ib] = s;
            sc[2 * ib + 1] = s;
        }
        for g in 0..32 {
            let p = IQ3S_GRID[self.grid_index(2 * g)] as u64
                | (IQ3S_GRID[self.grid_index(2 * g + 1)] as u64) << 32;
            signed_point(&mut q[8 * g..], p, self.signs[g]);
        }
        self.d.to_f32()
    }
}

/// Writes `8 * grid[j] + delta` for one IQ1 group (`delta` is ±1).
#[inline]
fn iq1_point(q: &mut [i8], p: u64, delta: i8) {
    for (j, v) in q[..8].iter_mut().enumerate() {
        *v = 8 * ((p >> (8 * j)) as u8 as i8) + delta;
    }
}

impl Grouped for BlockIq1S {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        for ib in 0..8 {
            let qh = self.qh[ib];
            let s = 2 * ((qh >> 12) & 7) as i32 + 1;
            sc[2 * ib] = s;
            sc[2 * ib + 1] = s;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            for l in 0..4 {
                let idx = self.qs[4 * ib + l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8;
                iq1_point(&mut q[32 * ib + 8 * l..], IQ1S_GRID[idx], delta);
            }
        }
        self.d.to_f32() * 0.125
    }
}

impl Grouped for BlockIq1M {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        for (g, s) in sc.iter_mut().enumerate() {
            *s = 2 * ((self.scale_word(g / 4) >> (3 * (g % 4))) & 7) as i32 + 1;
        }
        for k in 0..32 {
            let nib = (self.qh[k / 2] >> (4 * (k % 2))) & 0x0f;
            let delta = if nib & 8 != 0 { -1 } else { 1 };
            let idx = self.qs[k] as usize | ((nib & 7) as usize) << 8;
            iq1_point(&mut q[8 * k..], IQ1S_GRID[idx], delta);
        }
        self.d().to_f32() * 0.125
    }
}

impl Grouped for BlockTq1_0 {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        *sc = [1; 16];
        for (v, t) in q.iter_mut().zip(self.trits()) {
            *v = t as i8 - 1;
        }
        self.d.to_f32()
    }
}

impl Grouped for BlockTq2_0 {
    fn decode(&self, q: &mut [i8; QK_K], sc: &mut [i32; 16]) -> f32 {
        *sc = [1; 16];
        for (i, v) in q.iter_mut().enumerate() {
            let (c, l, j) = (i / 128, (i / 32) % 4, i % 32);
            *v = ((self.qs[32 * c + j] >> (2 * l)) & 3) as i8 - 1;
        }
        self.d.to_f32()
    }
}

/// Scalar reference of every type here.
fn dot_grouped_scalar<W: Grouped, const NT: usize>(w: &[W], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
    let x = x.map(|a| &a[..w.len()]);
    let mut acc = [0.0f32; NT];
    let (mut q, mut sc) = ([0i8; QK_K], [0i32; 16]);
    for (i, wb) in w.iter().enumerate() {
        let f = wb.decode(&mut q, &mut sc);
        for t in 0..NT {
            let y = &x[t][i];
            let mut sumi = 0i32;
            for (g, &s) in sc.iter().enumerate() {
                let dot: i32 = (16 * g..16 * g + 16)
                    .map(|e| q[e] as i32 * y.qs[e] as i32)
                    .sum();
                sumi += s * dot;
            }
            acc[t] += (f * y.d) * sumi as f32;
        }
    }
    acc
}

/// AVX2 kernel of IQ4_XS: levels by byte shuffle, exact integer sums per super-block, then
/// the scalar formula.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_iq4_xs_avx2<const NT: usize>(w: &[BlockIq4Xs], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
    use super::simd::{dot_u8i8_epi32, hsum_epi32, nibbles_16, prefetch_ahead};
    use std::arch::x86_64::*;
    let x = x.map(|a| &a[..w.len()]);
    // SAFETY (of the load): the table is 16 readable bytes.
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let mut acc = [0.0f32; NT];
    for (i, wb) in w.iter().enumerate() {
        prefetch_ahead::<NT, BlockIq4Xs>(wb);
        let mut sums = [_mm256_setzero_si256(); NT];
        for ib in 0..8 {
            let codes: &[u8; 16] = wb.qs[16 * ib..16 * ib + 16].try_into().expect("16 bytes");
            let q = _mm256_shuffle_epi8(table, nibbles_16(codes));
            let aq = _mm256_sign_epi8(q, q);
            let s = _mm256_set1_epi32(wb.sub_scale(ib) - 32);
            for t in 0..NT {
                // SAFETY (of the load): bytes 32ib..32ib+32 of the 256 levels.
                let yv = _mm256_loadu_si256(x[t][i].qs.as_ptr().add(32 * ib).cast());
                let p = dot_u8i8_epi32(aq, _mm256_sign_epi8(yv, q));
                sums[t] = _mm256_add_epi32(sums[t], _mm256_mullo_epi32(p, s));
            }
        }
        let f = wb.d.to_f32();
        for t in 0..NT {
            acc[t] += (f * x[t][i].d) * hsum_epi32(sums[t]) as f32;
        }
    }
    acc
}

/// Implements [`QuantDot`] with this file's scalar reference and the AVX2 kernel `$avx2`,
/// and with the 8-row prefill tiles `$rows8` where given.
macro_rules! grouped_dot {
    (@one $t:ty, $avx2:path, [$($extra:tt)*]) => {
        impl QuantDot for $t {
            type Act = BlockQ8K;

            fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
                dot_grouped_scalar(w, x)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
                $avx2(w, x)
            }

            $($extra)*
        }
    };
    ($avx2:path: $($t:ty),*) => {$(grouped_dot!(@one $t, $avx2, []);)*};
    ($avx2:path, $rows8:path: $($t:ty),*) => {
        $(grouped_dot!(@one $t, $avx2, [super::rows8_items!($rows8);]);)*
    };
}

#[cfg(target_arch = "x86_64")]
use super::{lattice::dot_lattice_avx2, ternary::dot_ternary_avx2};

grouped_dot!(
    dot_lattice_avx2, super::lattice::rows8:
    BlockIq2Xxs,
    BlockIq2Xs,
    BlockIq2S,
    BlockIq3Xxs,
    BlockIq3S,
    BlockIq1S,
    BlockIq1M
);
grouped_dot!(dot_ternary_avx2: BlockTq1_0, BlockTq2_0);

impl QuantDot for BlockIq4Xs {
    type Act = BlockQ8K;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        dot_grouped_scalar(w, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        dot_iq4_xs_avx2(w, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{
        check_kernel, check_kernel_on, check_length_error, iq1m_valid_scale, random_blocks,
        small_f16 as scale,
    };

    #[test]
    fn iq4_xs_kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 231), (4, 232), (19, 233)] {
            check_kernel::<BlockIq4Xs>(n, seed);
        }
        check_length_error::<BlockIq4Xs>();
    }

    #[test]
    fn ternary_kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 241), (9, 242)] {
            check_kernel::<BlockTq1_0>(n, seed);
            check_kernel::<BlockTq2_0>(n, seed);
        }
    }

    #[test]
    fn lattice_kernels_agree_and_match_f32() {
        // Random bytes with a sane scale reach bit patterns an encoder would never write.
        for (n, seed) in [(1, 251u64), (6, 252)] {
            check_kernel_on(
                random_blocks(n, seed, |b: &mut BlockIq2Xxs, r| b.d = scale(r)),
                seed,
            );
            check_kernel_on(
                random_blocks(n, seed, |b: &mut BlockIq2Xs, r| b.d = scale(r)),
                seed,
            );
            check_kernel_on(
                random_blocks(n, seed, |b: &mut BlockIq2S, r| b.d = scale(r)),
                seed,
            );
            check_kernel_on(
                random_blocks(n, seed, |b: &mut BlockIq3Xxs, r| b.d = scale(r)),
                seed,
            );
            check_kernel_on(
                random_blocks(n, seed, |b: &mut BlockIq3S, r| b.d = scale(r)),
                seed,
            );
            check_kernel_on(
                random_blocks(n, seed, |b: &mut BlockIq1S, r| b.d = scale(r)),
                seed,
            );
            check_kernel_on(random_blocks(n, seed, iq1m_valid_scale), seed);
        }
    }
}
