//! Q4_K: 256 elements in 8 groups of 32; 4-bit levels with 6-bit group scales and mins,
//! both scaled by f16 super-block factors (`x = d*sc*q - dmin*m`).

use super::common::{f16_to_f32, f32_to_f16, make_qkx2_quants, nearest_int, Qkx2};
use super::Block;
use crate::types::{GgmlType, QK_K};
use half::f16;

/// A Q4_K block: 144 bytes, alignment 2.
///
/// `scales` packs eight 6-bit scales and eight 6-bit mins (see [`scale_min_k4`]). Within
/// each 64-element chunk `c`, byte `l` of `qs[32c..32c+32]` holds element `64c + l` in its
/// low nibble and `64c + 32 + l` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the group scales.
    pub d: f16,
    /// Super-block scale of the group mins.
    pub dmin: f16,
    /// Packed 6-bit group scales and mins.
    pub scales: [u8; 12],
    /// Packed 4-bit levels.
    pub qs: [u8; 128],
}

const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::align_of::<BlockQ4K>() == 2);

/// Group `j`'s 6-bit (scale, min) from the 12-byte packing shared by Q4_K and Q5_K.
///
/// Groups 0-3 keep scale and min in the low 6 bits of bytes `j` and `j + 4`; groups 4-7
/// keep their low 4 bits in the nibbles of byte `j + 4` and their top 2 bits in the top
/// bits of bytes `j - 4` (scale) and `j` (min).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Inverse of [`scale_min_k4`] for values in `0..64`.
pub(super) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
    q
}

/// The shared Q4_K/Q5_K reference: per-group affine search weighted by `rms + |x|`, then
/// 6-bit group scales and mins, then levels re-derived against the stored scales.
/// Returns `(d, dmin, scales, levels)` with levels in `0..=nmax`.
pub(super) fn quantize_k4_like(x: &[f32], search: &Qkx2) -> (f16, f16, [u8; 12], [u8; QK_K]) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let mut aux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    for g in 0..8 {
        let xg = &x[32 * g..32 * g + 32];
        let sum_x2: f32 = xg.iter().fold(0.0, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xg) {
            *w = av_x + v.abs();
        }
        let lg = &mut levels[32 * g..32 * g + 32];
        (scales[g], mins[g]) = make_qkx2_quants(search, xg, &weights, lg, &mut aux);
        if scales[g] > max_scale {
            max_scale = scales[g];
        }
        if mins[g] > max_min {
            max_min = mins[g];
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for g in 0..8 {
        // Truncating to u8 before the clamp mirrors the reference's narrowing.
        ls[g] = (nearest_int(inv_scale * scales[g]) as u8).min(63);
        lm[g] = (nearest_int(inv_min * mins[g]) as u8).min(63);
    }
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);

    let nmax = search.nmax;
    for g in 0..8 {
        let (sc, m) = scale_min_k4(g, &packed);
        let dg = f16_to_f32(d) * sc as f32;
        if dg == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m as f32;
        for i in 32 * g..32 * g + 32 {
            levels[i] = nearest_int((x[i] + dm) / dg).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, levels)
}

impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4K;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        for (c, chunk) in out[..QK_K].chunks_exact_mut(64).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * c, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let q = &self.qs[32 * c..32 * c + 32];
            let (lo, hi) = chunk.split_at_mut(32);
            for ((&b, a), h) in q.iter().zip(lo).zip(hi) {
                *a = d1 * (b & 0x0f) as f32 - m1;
                *h = d2 * (b >> 4) as f32 - m2;
            }
        }
    }
}

impl super::Quantize for BlockQ4K {
    fn quantize(x: &[f32]) -> Self {
        let search = Qkx2 {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (d, dmin, scales, levels) = quantize_k4_like(&x[..QK_K], &search);
        BlockQ4K::from_parts(d, dmin, scales, &levels)
    }
}

impl BlockQ4K {
    /// The block of scales `d`/`dmin`, packed group scales and 4-bit `levels`.
    pub(super) fn from_parts(d: f16, dmin: f16, scales: [u8; 12], levels: &[u8; QK_K]) -> Self {
        let mut qs = [0u8; 128];
        for c in 0..4 {
            for l in 0..32 {
                qs[32 * c + l] = levels[64 * c + l] | (levels[64 * c + 32 + l] << 4);
            }
        }
        BlockQ4K {
            d,
            dmin,
            scales,
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn scale_min_packing_round_trips() {
        let ls = [0, 63, 17, 40, 1, 62, 33, 48];
        let lm = [5, 0, 63, 31, 32, 16, 7, 59];
        let q = pack_scale_min_k4(&ls, &lm);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &q), (ls[j], lm[j]), "group {j}");
        }
    }

    #[test]
    fn dequantize_known_block() {
        let ls = [1, 2, 0, 0, 0, 0, 0, 3];
        let lm = [0, 4, 0, 0, 0, 0, 0, 1];
        let mut b = BlockQ4K {
            d: f16::from_f32(0.5),
            dmin: f16::from_f32(0.25),
            scales: pack_scale_min_k4(&ls, &lm),
            qs: [0; 128],
        };
        b.qs[0] = 0x3a; // element 0 -> 10, element 32 -> 3
        b.qs[127] = 0xf0; // element 223 -> 0, element 255 -> 15
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[0], 0.5 * 10.0);
        assert_eq!(y[32], 1.0 * 3.0 - 1.0);
        assert_eq!(y[33], -1.0);
        assert_eq!(y[255], 1.5 * 15.0 - 0.25);
    }

    #[test]
    fn round_trip_error_is_small() {
        let x: Vec<f32> = (0..QK_K)
            .map(|i| (i as f32 * 0.23).sin() * 3.0 + 0.5)
            .collect();
        let b = BlockQ4K::quantize(&x);
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        let err: f32 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>();
        let pow: f32 = x.iter().map(|a| a * a).sum::<f32>();
        assert!(
            (err / pow).sqrt() < 0.06,
            "relative rms {}",
            (err / pow).sqrt()
        );
    }
}
