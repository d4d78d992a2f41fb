//! Q5_K: as Q4_K with a fifth bit per level (`x = d*sc*q - dmin*m`, `q` in `0..32`).

use super::common::{f16_to_f32, Qkx2};
use super::q4_k::{quantize_k4_like, scale_min_k4};
use super::Block;
use crate::types::{GgmlType, QK_K};
use half::f16;

/// A Q5_K block: 176 bytes, alignment 2.
///
/// Scales and low nibbles are laid out as in [`super::BlockQ4K`]; element `e` of chunk
/// `c = e / 64` takes its fifth bit from `qh[e % 32]`, bit `2c` (first 32 of the chunk) or
/// `2c + 1` (last 32).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the group scales.
    pub d: f16,
    /// Super-block scale of the group mins.
    pub dmin: f16,
    /// Packed 6-bit group scales and mins.
    pub scales: [u8; 12],
    /// Fifth bits.
    pub qh: [u8; 32],
    /// Packed low 4 bits.
    pub qs: [u8; 128],
}

const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::align_of::<BlockQ5K>() == 2);

impl Block for BlockQ5K {
    const TYPE: GgmlType = GgmlType::Q5K;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        for (c, chunk) in out[..QK_K].chunks_exact_mut(64).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * c, &self.scales);
            let (sc2, m2) = scale_min_k4(2 * c + 1, &self.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            let q = &self.qs[32 * c..32 * c + 32];
            let (lo, hi) = chunk.split_at_mut(32);
            for (((&b, &h), a), z) in q.iter().zip(&self.qh).zip(lo).zip(hi) {
                let qa = (b & 0x0f) + if h & u1 != 0 { 16 } else { 0 };
                let qb = (b >> 4) + if h & u2 != 0 { 16 } else { 0 };
                *a = d1 * qa as f32 - m1;
                *z = d2 * qb as f32 - m2;
            }
        }
    }
}

impl super::Quantize for BlockQ5K {
    fn quantize(x: &[f32]) -> Self {
        let search = Qkx2 {
            nmax: 31,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: false,
        };
        let (d, dmin, scales, levels) = quantize_k4_like(&x[..QK_K], &search);
        BlockQ5K::from_parts(d, dmin, scales, &levels)
    }
}

impl BlockQ5K {
    /// The block of scales `d`/`dmin`, packed group scales and 5-bit `levels`.
    pub(super) fn from_parts(d: f16, dmin: f16, scales: [u8; 12], levels: &[u8; QK_K]) -> Self {
        let mut qs = [0u8; 128];
        let mut qh = [0u8; 32];
        for c in 0..4 {
            let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for j in 0..32 {
                let (mut l1, mut l2) = (levels[64 * c + j], levels[64 * c + 32 + j]);
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                qs[32 * c + j] = l1 | (l2 << 4);
            }
        }
        BlockQ5K {
            d,
            dmin,
            scales,
            qh,
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;
    use crate::quant::q4_k::pack_scale_min_k4;

    #[test]
    fn dequantize_known_block() {
        let mut b = BlockQ5K {
            d: f16::from_f32(1.0),
            dmin: f16::from_f32(1.0),
            scales: pack_scale_min_k4(&[1, 1, 1, 1, 1, 2, 1, 1], &[0, 0, 0, 0, 0, 3, 0, 0]),
            qh: [0; 32],
            qs: [0; 128],
        };
        b.qs[64 + 4] = 0xf1; // element 128 + 4 -> 1, element 160 + 4 -> 15
        b.qh[4] = 1 << 4 | 1 << 5; // fifth bits for both (chunk 2)
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[132], 17.0);
        assert_eq!(y[164], 2.0 * 31.0 - 3.0);
        assert_eq!(y[4], 0.0);
    }

    #[test]
    fn round_trip_error_is_small() {
        let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 * 0.41).cos() - 0.7).collect();
        let b = BlockQ5K::quantize(&x);
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        let err: f32 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>();
        let pow: f32 = x.iter().map(|a| a * a).sum::<f32>();
        assert!(
            (err / pow).sqrt() < 0.03,
            "relative rms {}",
            (err / pow).sqrt()
        );
    }
}
