//! Activation quantizers: f32 rows to Q8_0 or Q8_K blocks.
//!
//! Both follow ggml's reference quantizers exactly (Q8_0: `d = amax / 127`, `q =
//! roundf(x / d)` with ties away from zero; Q8_K: `iscale = -127 / max` for the signed
//! value of largest magnitude, ties to even). The AVX2 versions produce identical bytes:
//! they handle the finite case and hand any block holding a NaN or infinity (or whose
//! scale overflows) to the scalar reference. ggml's own AVX2 Q8_0 quantizer rounds ties
//! to even and multiplies by `127 / amax`, so its bytes can differ from these in the last
//! level on rare inputs.

use super::{Isa, IsaKind};
use minfer_gguf::quant::{BlockQ8K, BlockQ8_0, Quantize};

/// Errors of the activation quantizers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantizeError {
    /// The input does not fill the output blocks exactly.
    #[error("{elements} activations do not fill {blocks} blocks of {block_size}")]
    Length {
        /// Input element count.
        elements: usize,
        /// Output block count.
        blocks: usize,
        /// Elements per block.
        block_size: usize,
    },
}

fn check(x: usize, blocks: usize, block_size: usize) -> Result<(), QuantizeError> {
    if Some(x) != blocks.checked_mul(block_size) {
        return Err(QuantizeError::Length {
            elements: x,
            blocks,
            block_size,
        });
    }
    Ok(())
}

/// Quantizes `x` (`32 * out.len()` values) to Q8_0 with the detected ISA.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) -> Result<(), QuantizeError> {
    quantize_row_q8_0_with(Isa::detect(), x, out)
}

/// Quantizes `x` (`256 * out.len()` values) to Q8_K with the detected ISA.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) -> Result<(), QuantizeError> {
    quantize_row_q8_k_with(Isa::detect(), x, out)
}

/// [`quantize_row_q8_0`] with an explicit ISA (identical bytes on every ISA).
pub fn quantize_row_q8_0_with(
    isa: Isa,
    x: &[f32],
    out: &mut [BlockQ8_0],
) -> Result<(), QuantizeError> {
    check(x.len(), out.len(), 32)?;
    q8_0_into(isa, x, out);
    Ok(())
}

/// Q8_0 quantization without the length check (extra input or output is ignored).
pub(crate) fn q8_0_into(isa: Isa, x: &[f32], out: &mut [BlockQ8_0]) {
    for (xb, o) in x.chunks_exact(32).zip(out.iter_mut()) {
        *o = match isa.0 {
            IsaKind::Scalar => BlockQ8_0::quantize(xb),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2`/`Vnni` exist only after runtime detection; `xb` has 32 elements.
            IsaKind::Avx2 | IsaKind::Vnni => unsafe { avx2::q8_0_block(xb) },
        };
    }
}

/// [`quantize_row_q8_k`] with an explicit ISA (identical bytes on every ISA).
pub fn quantize_row_q8_k_with(
    isa: Isa,
    x: &[f32],
    out: &mut [BlockQ8K],
) -> Result<(), QuantizeError> {
    check(x.len(), out.len(), 256)?;
    q8_k_into(isa, x, out);
    Ok(())
}

/// Q8_K quantization without the length check (extra input or output is ignored).
pub(crate) fn q8_k_into(isa: Isa, x: &[f32], out: &mut [BlockQ8K]) {
    for (xb, o) in x.chunks_exact(256).zip(out.iter_mut()) {
        match isa.0 {
            IsaKind::Scalar => *o = BlockQ8K::quantize(xb),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2`/`Vnni` exist only after runtime detection; `xb` has 256 elements.
            IsaKind::Avx2 | IsaKind::Vnni => unsafe { avx2::q8_k_block(xb, o) },
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use minfer_gguf::quant::{BlockQ8K, BlockQ8_0, Quantize};
    use std::arch::x86_64::*;

    /// Packs four vectors of eight i32 (each in -128..=127) into 32 bytes, element order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pack_i32x32(v: [__m256i; 4], out: *mut i8) {
        let ab = _mm256_packs_epi32(v[0], v[1]);
        let cd = _mm256_packs_epi32(v[2], v[3]);
        let abcd = _mm256_packs_epi16(ab, cd);
        // packs interleave 128-bit lanes; restore element order by 4-byte groups.
        let fixed = _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(out.cast(), fixed);
    }

    /// Whether any lane is NaN or infinite.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn non_finite(v: __m256) -> __m256 {
        let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
        // NaN compares unordered (true here), infinity compares equal.
        _mm256_cmp_ps(abs, _mm256_set1_ps(f32::INFINITY), _CMP_NLT_UQ)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hmin(v: __m256) -> f32 {
        let m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps(m, m, 1)))
    }

    /// One Q8_0 block, bitwise equal to `BlockQ8_0::quantize`.
    ///
    /// # Safety
    /// AVX2/FMA/F16C required; `x.len() >= 32`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_block(x: &[f32]) -> BlockQ8_0 {
        let x = &x[..32];
        let sign = _mm256_set1_ps(-0.0);
        let v: [__m256; 4] = std::array::from_fn(|k| _mm256_loadu_ps(x.as_ptr().add(8 * k)));
        let mut bad = _mm256_setzero_ps();
        let mut amax = _mm256_setzero_ps();
        for &vk in &v {
            bad = _mm256_or_ps(bad, non_finite(vk));
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, vk));
        }
        if _mm256_movemask_ps(bad) != 0 {
            return BlockQ8_0::quantize(x);
        }
        let amax = hmax(amax);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        if !id.is_finite() {
            return BlockQ8_0::quantize(x);
        }
        let idv = _mm256_set1_ps(id);
        let half = _mm256_set1_ps(0.5);
        let one = _mm256_set1_ps(1.0);
        let q: [__m256i; 4] = std::array::from_fn(|k| {
            let p = _mm256_mul_ps(v[k], idv);
            // roundf: truncate, then step away from zero when the dropped part is >= 0.5
            // (p - trunc(p) is exact).
            let t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(p, t));
            let step = _mm256_and_ps(
                _mm256_cmp_ps(frac, half, _CMP_GE_OQ),
                _mm256_or_ps(one, _mm256_and_ps(sign, p)),
            );
            _mm256_cvtps_epi32(_mm256_add_ps(t, step))
        });
        let mut b = BlockQ8_0 {
            d: half::f16::from_f32(d),
            qs: [0; 32],
        };
        pack_i32x32(q, b.qs.as_mut_ptr());
        b
    }

    /// One Q8_K block into `out`, bitwise equal to `BlockQ8K::quantize`.
    ///
    /// # Safety
    /// AVX2/FMA/F16C required; `x.len() >= 256`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_k_block(x: &[f32], out: &mut BlockQ8K) {
        let x = &x[..256];
        let mut bad = _mm256_setzero_ps();
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut vmin = _mm256_set1_ps(f32::INFINITY);
        for k in 0..32 {
            let v = _mm256_loadu_ps(x.as_ptr().add(8 * k));
            bad = _mm256_or_ps(bad, non_finite(v));
            vmax = _mm256_max_ps(vmax, v);
            vmin = _mm256_min_ps(vmin, v);
        }
        if _mm256_movemask_ps(bad) != 0 {
            *out = BlockQ8K::quantize(x);
            return;
        }
        let (hi, lo) = (hmax(vmax), -hmin(vmin));
        // The reference keeps the first element of largest magnitude, sign included.
        let max = if hi > lo {
            hi
        } else if lo > hi {
            -lo
        } else {
            match x.iter().find(|v| v.abs() == hi) {
                Some(&v) => v,
                None => 0.0,
            }
        };
        if max == 0.0 {
            *out = bytemuck::Zeroable::zeroed();
            return;
        }
        let iscale = -127.0 / max;
        if !iscale.is_finite() {
            *out = BlockQ8K::quantize(x);
            return;
        }
        let is = _mm256_set1_ps(iscale);
        let cap = _mm256_set1_epi32(127);
        let ones = _mm256_set1_epi8(1);
        let ones16 = _mm256_set1_epi16(1);
        for c in 0..8 {
            let q: [__m256i; 4] = std::array::from_fn(|k| {
                let v = _mm256_loadu_ps(x.as_ptr().add(32 * c + 8 * k));
                let r = _mm256_round_ps(
                    _mm256_mul_ps(is, v),
                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
                );
                _mm256_min_epi32(_mm256_cvtps_epi32(r), cap)
            });
            let dst = out.qs.as_mut_ptr().add(32 * c);
            pack_i32x32(q, dst);
            // Group sums: pairs, then quads; lanes 0-3 hold group 2c, lanes 4-7 group 2c+1.
            let packed = _mm256_loadu_si256(dst.cast());
            let quads = _mm256_madd_epi16(_mm256_maddubs_epi16(ones, packed), ones16);
            let mut lanes = [0i32; 8];
            _mm256_storeu_si256(lanes.as_mut_ptr().cast(), quads);
            out.bsums[2 * c] = lanes[..4].iter().sum::<i32>() as i16;
            out.bsums[2 * c + 1] = lanes[4..].iter().sum::<i32>() as i16;
        }
        out.d = 1.0 / iscale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{isas, rand_f32};

    fn inputs(n: usize) -> Vec<Vec<f32>> {
        let mut v: Vec<Vec<f32>> = (0..40).map(|s| rand_f32(n, s, 1.0 + s as f32)).collect();
        // Exact ties: values that land on k + 0.5 after scaling.
        v.push(
            (0..n)
                .map(|i| (i % 255) as f32 - 127.0 + if i % 3 == 0 { 0.5 } else { 0.0 })
                .collect(),
        );
        v.push((0..n).map(|i| ((i % 11) as f32 - 5.0) * 0.5).collect());
        let mut tie = vec![0.25f32; n];
        tie[3] = -2.0;
        tie[9] = 2.0; // equal magnitudes: the first (negative) one sets the sign
        v.push(tie);
        v.push(vec![0.0; n]);
        v.push(vec![-0.0; n]);
        let mut special = rand_f32(n, 99, 1.0);
        special[1] = f32::NAN;
        special[40] = f32::INFINITY;
        special[n - 1] = f32::NEG_INFINITY;
        v.push(special);
        let mut nan_only = rand_f32(n, 98, 1.0);
        nan_only[5] = f32::NAN;
        v.push(nan_only);
        v.push(vec![1e-44; n]);
        v.push(rand_f32(n, 97, 1e-36));
        v.push(rand_f32(n, 96, 3e38));
        v
    }

    #[test]
    fn q8_0_matches_the_reference_bitwise() {
        let n = 32 * 24;
        for x in inputs(n) {
            let want: Vec<BlockQ8_0> = x.chunks_exact(32).map(BlockQ8_0::quantize).collect();
            for isa in isas() {
                let mut got = vec![
                    BlockQ8_0 {
                        d: half::f16::ZERO,
                        qs: [0; 32]
                    };
                    24
                ];
                quantize_row_q8_0_with(isa, &x, &mut got).unwrap();
                for (g, w) in got.iter().zip(&want) {
                    assert_eq!(bytemuck::bytes_of(g), bytemuck::bytes_of(w), "{isa:?}");
                }
            }
        }
    }

    #[test]
    fn q8_k_matches_the_reference_bitwise() {
        let n = 256 * 3;
        for x in inputs(n) {
            let want: Vec<BlockQ8K> = x.chunks_exact(256).map(BlockQ8K::quantize).collect();
            for isa in isas() {
                let mut got = vec![bytemuck::Zeroable::zeroed(); 3];
                quantize_row_q8_k_with(isa, &x, &mut got).unwrap();
                for (g, w) in got.iter().zip(&want) {
                    let (g, w): (&BlockQ8K, &BlockQ8K) = (g, w);
                    assert_eq!(bytemuck::bytes_of(g), bytemuck::bytes_of(w), "{isa:?}");
                }
            }
        }
    }

    #[test]
    fn lengths_are_checked() {
        let mut out = vec![bytemuck::Zeroable::zeroed(); 2];
        assert_eq!(
            quantize_row_q8_k(&[0.0; 300], &mut out),
            Err(QuantizeError::Length {
                elements: 300,
                blocks: 2,
                block_size: 256
            })
        );
        let mut out = vec![
            BlockQ8_0 {
                d: half::f16::ZERO,
                qs: [0; 32]
            };
            1
        ];
        assert!(quantize_row_q8_0(&[0.0; 31], &mut out).is_err());
    }
}
