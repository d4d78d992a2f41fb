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
use super::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1};
use crate::types::QK_K;

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
pub(super) fn legacy_row(ty: crate::GgmlType, row: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    use crate::GgmlType as T;
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
pub(super) fn q2_k(x: &[f32], qw: &[f32]) -> BlockQ2K {
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
pub(super) fn q3_k(x: &[f32], qw: &[f32]) -> BlockQ3K {
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
pub(super) fn q4_k(x: &[f32], qw: &[f32]) -> BlockQ4K {
    let (d, dmin, scales, levels) = k4_like(x, qw, 15, false);
    BlockQ4K::from_parts(f32_to_f16(d), f32_to_f16(dmin), scales, &levels)
}

/// Q5_K with weights.
pub(super) fn q5_k(x: &[f32], qw: &[f32]) -> BlockQ5K {
    let (d, dmin, scales, levels) = k4_like(x, qw, 31, true);
    BlockQ5K::from_parts(f32_to_f16(d), f32_to_f16(dmin), scales, &levels)
}
