//! The legacy 32-blocks and the k-quants encoded with importance weights, as ggml's
//! `quantize_row_*_impl` do when llama-quantize passes an importance matrix: every scale
//! search weighs element `i` by `qw[i] · sqrt(sigma2 + x[i]²)` (`sigma2` the mean square of
//! the row for the 32-blocks, of the super-block for the k-quants, doubled for Q3_K..Q5_K),
//! and the k-quants' group scales are themselves fitted by the weighted `make_qp_quants`
//! / `make_qx_quants` instead of the reference's max-based rounding. Q6_K keeps its own
//! encoder with the weights passed through ([`super::BlockQ6K::quantize_weighted`]).

use super::common::{
    f16_to_f32, f32_to_f16, make_qkx2_quants, make_qx_quants, nearest_int, pack_2bit, Qkx2,
};
use super::iq_search::make_qp_quants_into;
use super::q4_k::{pack_scale_min_k4, scale_min_k4};
use super::q5_0::pack_q5;
use super::{
    quantize_to_vec, Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S,
    BlockIq3Xxs, BlockIq4Nl, BlockIq4Xs, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, QuantError,
};
use crate::types::{GgmlType, QK_K};

/// Whether ggml's encoder for `ty` reads importance weights (llama-quantize's imatrix) and
/// [`quantize_rows_weighted`] passes them on: the lattice i-quants (IQ1_S, IQ1_M, IQ2_XXS,
/// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), IQ4_NL, IQ4_XS, the k-quants Q2_K..Q6_K and Q4_0,
/// Q4_1, Q5_0, Q5_1. ggml ignores them for the others (Q8_0, TQ1_0, TQ2_0, MXFP4), which
/// are encoded as without weights.
pub fn uses_importance(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Iq4Nl
            | GgmlType::Iq4Xs
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Iq1S
            | GgmlType::Iq1M
            | GgmlType::Iq2Xxs
            | GgmlType::Iq2Xs
            | GgmlType::Iq2S
            | GgmlType::Iq3Xxs
            | GgmlType::Iq3S
    )
}

/// Encodes whole rows of `n_per_row` values into blocks, block `b` of a row from
/// `x[..ELEMS]` and the matching slice of the row's weights.
fn quantize_rows_blocks<B: Block>(
    src: &[f32],
    n_per_row: usize,
    qw: &[f32],
    enc: impl Fn(&[f32], &[f32]) -> B,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len() / B::ELEMS * std::mem::size_of::<B>());
    for row in src.chunks_exact(n_per_row) {
        for (x, w) in row.chunks_exact(B::ELEMS).zip(qw.chunks_exact(B::ELEMS)) {
            out.extend_from_slice(enc(x, w).as_bytes());
        }
    }
    out
}

/// Quantizes whole rows of `n_per_row` values as ggml's `quantize_<type>` does when given
/// importance weights: `qw` holds one weight per column (`n_per_row` values, the same for
/// every row). Types that take no weights ([`uses_importance`]) are encoded as by
/// [`quantize_to_vec`].
pub fn quantize_rows_weighted(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    qw: &[f32],
) -> Result<Vec<u8>, QuantError> {
    let block = ty.block_size();
    if n_per_row == 0 || !n_per_row.is_multiple_of(block) || !src.len().is_multiple_of(n_per_row) {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n: src.len(),
            block,
        });
    }
    if qw.len() != n_per_row {
        return Err(QuantError::Weights {
            ty,
            got: qw.len(),
            expected: n_per_row,
        });
    }
    Ok(match ty {
        GgmlType::Iq2Xxs => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq2Xxs::quantize_weighted(x, Some(q))
        }),
        GgmlType::Iq2Xs => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq2Xs::quantize_weighted(x, Some(q))
        }),
        GgmlType::Iq2S => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq2S::quantize_weighted(x, Some(q))
        }),
        GgmlType::Iq3Xxs => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq3Xxs::quantize_weighted(x, Some(q))
        }),
        GgmlType::Iq3S => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq3S::quantize_weighted(x, Some(q))
        }),
        GgmlType::Iq1S => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq1S::quantize_weighted(x, Some(q))
        }),
        GgmlType::Iq1M => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq1M::quantize_weighted(x, Some(q))
        }),
        GgmlType::Iq4Nl => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq4Nl::quantize_weighted(x, Some(q))
        }),
        GgmlType::Iq4Xs => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockIq4Xs::quantize_weighted(x, Some(q))
        }),
        GgmlType::Q2K => quantize_rows_blocks(src, n_per_row, qw, q2_k),
        GgmlType::Q3K => quantize_rows_blocks(src, n_per_row, qw, q3_k),
        GgmlType::Q4K => quantize_rows_blocks(src, n_per_row, qw, q4_k),
        GgmlType::Q5K => quantize_rows_blocks(src, n_per_row, qw, q5_k),
        GgmlType::Q6K => quantize_rows_blocks(src, n_per_row, qw, |x, q| {
            BlockQ6K::quantize_weighted(x, Some(q))
        }),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let mut out = Vec::with_capacity(ty.bytes_for(src.len() as u64).unwrap_or(0) as usize);
            for row in src.chunks_exact(n_per_row) {
                legacy_row(ty, row, qw, &mut out);
            }
            out
        }
        _ => quantize_to_vec(ty, src)?,
    })
}

/// ggml's `make_qkx3_quants(.., -0.9, 0.05, 36, false)` with weights, which is the
/// weighted `make_qkx2_quants` over that range: `(scale, min)` of an affine fit.
fn qkx3(nmax: i32, x: &[f32], w: &[f32], levels: &mut [u8]) -> (f32, f32) {
    let p = Qkx2 {
        nmax,
        rmin: -0.9,
        rdelta: 0.05,
        nstep: 36,
        use_mad: false,
    };
    make_qkx2_quants(&p, x, w, levels, &mut [0u8; 32])
}

/// `qw[i] · sqrt(sigma2 + x[i]²)` for each element.
fn element_weights(x: &[f32], qw: &[f32], sigma2: f32, out: &mut [f32]) {
    for ((w, &v), &q) in out.iter_mut().zip(x).zip(qw) {
        *w = q * (sigma2 + v * v).sqrt();
    }
}

/// The mean square of `x` times `factor`, summed in order as ggml does.
fn mean_square(x: &[f32], factor: f32) -> f32 {
    let s = x.iter().fold(0.0f32, |s, v| s + v * v);
    factor * s / x.len() as f32
}

/// Encodes one row of the 32-blocks with weights, block by block; `enc` gets the block's
/// values, its element weights and its slice of the output.
fn rows_32<B: bytemuck::Pod>(
    row: &[f32],
    qw: &[f32],
    out: &mut Vec<u8>,
    enc: impl Fn(&[f32], &[f32]) -> B,
) {
    let sigma2 = mean_square(row, 1.0);
    let mut w = [0.0f32; 32];
    for (xb, qb) in row.chunks_exact(32).zip(qw.chunks_exact(32)) {
        element_weights(xb, qb, sigma2, &mut w);
        out.extend_from_slice(bytemuck::bytes_of(&enc(xb, &w)));
    }
}

/// Packs 32 four-bit levels, element `j` low and `j + 16` high.
fn pack_q4(l: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|j| l[j] | (l[j + 16] << 4))
}

/// Q4_0, Q4_1, Q5_0 or Q5_1 rows (`ty` by block type) with weights.
fn legacy_row(ty: GgmlType, row: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    use GgmlType as T;
    let symmetric = |nmax: i32, xb: &[f32], w: &[f32]| {
        let mut l = [0i8; 32];
        let d = make_qx_quants(nmax, xb, &mut l, Some(w));
        (d, l.map(|v| v as u8))
    };
    let affine = |nmax: i32, xb: &[f32], w: &[f32]| {
        let mut l = [0u8; 32];
        let (d, min) = qkx3(nmax, xb, w, &mut l);
        (d, min, l)
    };
    match ty {
        T::Q4_0 => rows_32(row, qw, out, |xb, w| {
            let (d, l) = symmetric(8, xb, w);
            BlockQ4_0 {
                d: f32_to_f16(d),
                qs: pack_q4(&l),
            }
        }),
        T::Q5_0 => rows_32(row, qw, out, |xb, w| {
            let (d, l) = symmetric(16, xb, w);
            let (qs, qh) = pack_q5(&l);
            BlockQ5_0 {
                d: f32_to_f16(d),
                qh,
                qs,
            }
        }),
        T::Q4_1 => rows_32(row, qw, out, |xb, w| {
            let (d, min, l) = affine(15, xb, w);
            BlockQ4_1 {
                d: f32_to_f16(d),
                m: f32_to_f16(-min),
                qs: pack_q4(&l),
            }
        }),
        T::Q5_1 => rows_32(row, qw, out, |xb, w| {
            let (d, min, l) = affine(31, xb, w);
            let (qs, qh) = pack_q5(&l);
            BlockQ5_1 {
                d: f32_to_f16(d),
                m: f32_to_f16(-min),
                qh,
                qs,
            }
        }),
        _ => unreachable!("legacy_row is called for Q4_0, Q4_1, Q5_0 and Q5_1 only"),
    }
}

/// Q2_K with weights (`quantize_row_q2_K_impl`).
fn q2_k(x: &[f32], qw: &[f32]) -> BlockQ2K {
    let sigma2 = mean_square(&x[..QK_K], 1.0);
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 16], [0.0f32; 16], [0.0f32; 16]);
    let mut w = [0.0f32; 16];
    for j in 0..16 {
        let r = 16 * j..16 * j + 16;
        element_weights(&x[r.clone()], &qw[r.clone()], sigma2, &mut w);
        sw[j] = w.iter().fold(0.0, |s, v| s + v);
        (scales[j], mins[j]) = qkx3(3, &x[r.clone()], &w, &mut levels[r]);
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    let dm = make_qp_quants_into(15, &scales, &sw, &mut ls);
    let mm = make_qp_quants_into(15, &mins, &sw, &mut lm);
    let mut b = BlockQ2K {
        scales: std::array::from_fn(|j| ls[j] | (lm[j] << 4)),
        qs: [0; 64],
        d: f32_to_f16(dm),
        dmin: f32_to_f16(mm),
    };
    let (dm, mm) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
    for j in 0..16 {
        let d = dm * (b.scales[j] & 0x0f) as f32;
        if d == 0.0 {
            continue;
        }
        let m = mm * (b.scales[j] >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            levels[i] = nearest_int((x[i] + m) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&levels, &mut b.qs);
    b
}

/// Q3_K with weights (`quantize_row_q3_K_impl`).
fn q3_k(x: &[f32], qw: &[f32]) -> BlockQ3K {
    let sigma2 = mean_square(&x[..QK_K], 2.0);
    let mut levels = [0i8; QK_K];
    let (mut scales, mut sw) = ([0.0f32; 16], [0.0f32; 16]);
    let mut w = [0.0f32; 16];
    for j in 0..16 {
        let r = 16 * j..16 * j + 16;
        element_weights(&x[r.clone()], &qw[r.clone()], sigma2, &mut w);
        sw[j] = w.iter().fold(0.0, |s, v| s + v);
        scales[j] = make_qx_quants(4, &x[r.clone()], &mut levels[r], Some(&w));
    }
    let mut ls = [0i8; 16];
    let d_block = make_qx_quants(32, &scales, &mut ls, Some(&sw));
    let mut b: BlockQ3K = bytemuck::Zeroable::zeroed();
    for (j, &l) in ls.iter().enumerate() {
        let l = l as u8;
        if j < 8 {
            b.scales[j] = l & 0x0f;
        } else {
            b.scales[j - 8] |= (l & 0x0f) << 4;
        }
        b.scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
    b.d = f32_to_f16(d_block);
    let d_all = f16_to_f32(b.d);
    for j in 0..16 {
        let lo = if j < 8 {
            b.scales[j] & 0x0f
        } else {
            b.scales[j - 8] >> 4
        };
        let sc = (lo | (((b.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32 - 32;
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            levels[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    // High bits: bit `k` of hmask byte `m` for element `32k + m`.
    let mut low = [0u8; QK_K];
    for (j, &l) in levels.iter().enumerate() {
        let mut l = l as u8;
        if l > 3 {
            b.hmask[j % 32] |= 1 << (j / 32);
            l -= 4;
        }
        low[j] = l;
    }
    pack_2bit(&low, &mut b.qs);
    b
}

/// The shared Q4_K/Q5_K search with weights (`quantize_row_q4_K_impl` and `q5_K`):
/// `(d, dmin, packed scales, levels)`; Q5_K caps the 6-bit scales at 63, Q4_K does not.
fn k4_like(x: &[f32], qw: &[f32], nmax: i32, cap: bool) -> (f32, f32, [u8; 12], [u8; QK_K]) {
    let sigma2 = mean_square(&x[..QK_K], 2.0);
    let mut levels = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
    let mut w = [0.0f32; 32];
    for j in 0..8 {
        let r = 32 * j..32 * j + 32;
        element_weights(&x[r.clone()], &qw[r.clone()], sigma2, &mut w);
        sw[j] = w.iter().fold(0.0, |s, v| s + v);
        (scales[j], mins[j]) = qkx3(nmax, &x[r.clone()], &w, &mut levels[r]);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants_into(63, &scales, &sw, &mut ls);
    let m_block = make_qp_quants_into(63, &mins, &sw, &mut lm);
    if cap {
        ls = ls.map(|l| l.min(63));
        lm = lm.map(|l| l.min(63));
    }
    let packed = pack_scale_min_k4(&ls, &lm);
    let (d, dmin) = (f32_to_f16(d_block), f32_to_f16(m_block));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = f16_to_f32(d) * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m as f32;
        for i in 32 * j..32 * j + 32 {
            levels[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d_block, m_block, packed, levels)
}

/// Q4_K with weights.
fn q4_k(x: &[f32], qw: &[f32]) -> BlockQ4K {
    let (d, dmin, scales, levels) = k4_like(x, qw, 15, false);
    BlockQ4K::from_parts(f32_to_f16(d), f32_to_f16(dmin), scales, &levels)
}

/// Q5_K with weights.
fn q5_k(x: &[f32], qw: &[f32]) -> BlockQ5K {
    let (d, dmin, scales, levels) = k4_like(x, qw, 31, true);
    BlockQ5K::from_parts(f32_to_f16(d), f32_to_f16(dmin), scales, &levels)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The weights reach every encoder that takes them (uneven weights move some level)
    /// and no other (those encode as without weights); lengths are checked.
    #[test]
    fn weights_reach_exactly_the_weighting_encoders() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0).powi(3))
            .collect();
        let qw: Vec<f32> = (0..256)
            .map(|i| if i % 3 == 0 { 50.0 } else { 0.01 })
            .collect();
        for ty in crate::types::ALL_TYPES {
            if ty == GgmlType::Q8K || !256usize.is_multiple_of(ty.block_size()) {
                continue;
            }
            let plain = quantize_to_vec(ty, &x).unwrap();
            let weighted = quantize_rows_weighted(ty, &x, 256, &qw).unwrap();
            assert_eq!(weighted.len(), plain.len(), "{ty}");
            assert_eq!(weighted != plain, uses_importance(ty), "{ty}");
        }
        let e = quantize_rows_weighted(GgmlType::Q4K, &x, 256, &qw[..128]).unwrap_err();
        assert!(e.to_string().contains("128 importance weights"), "{e}");
        assert!(quantize_rows_weighted(GgmlType::Q4K, &x, 100, &qw[..100]).is_err());
    }
}
