//! Q2_K: 256 elements in 16 groups of 16; 2-bit levels with a 4-bit scale and 4-bit min
//! per group, both scaled by f16 super-block factors (`x = d*sc*q - dmin*m`).

use super::common::{f16_to_f32, f32_to_f16, make_qkx2_quants, nearest_int, pack_2bit, Qkx2};
use super::Block;
use crate::types::{GgmlType, QK_K};
use half::f16;

/// A Q2_K block: 84 bytes, alignment 2.
///
/// `scales[g]` holds group `g`'s scale (low nibble) and min (high nibble). Levels are
/// packed 4 per byte: within each 128-element half, byte `l` holds elements `l`, `l+32`,
/// `l+64`, `l+96` in bit pairs 0-1, 2-3, 4-5, 6-7.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    /// Per-group 4-bit scale (low) and min (high).
    pub scales: [u8; 16],
    /// Packed 2-bit levels.
    pub qs: [u8; 64],
    /// Super-block scale of the group scales.
    pub d: f16,
    /// Super-block scale of the group mins.
    pub dmin: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(std::mem::align_of::<BlockQ2K>() == 2);

impl Block for BlockQ2K {
    const TYPE: GgmlType = GgmlType::Q2K;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let min = f16_to_f32(self.dmin);
        for (g, group) in out[..QK_K].chunks_exact_mut(16).enumerate() {
            let sc = self.scales[g];
            let dl = d * (sc & 0x0f) as f32;
            let ml = min * (sc >> 4) as f32;
            // Group g lies in half g/8, bit pair (g%8)/2, bytes 16*(g%2)..+16.
            let q = &self.qs[32 * (g / 8) + 16 * (g % 2)..][..16];
            let shift = 2 * ((g % 8) / 2);
            for (y, &b) in group.iter_mut().zip(q) {
                *y = dl * ((b >> shift) & 3) as f32 - ml;
            }
        }
    }
}

impl super::Quantize for BlockQ2K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        const Q4SCALE: f32 = 15.0;
        let search = Qkx2 {
            nmax: 3,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        let mut levels = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        let mut aux = [0u8; 16];
        let mut weights = [0.0f32; 16];
        for g in 0..16 {
            let xg = &x[16 * g..16 * g + 16];
            for (w, v) in weights.iter_mut().zip(xg) {
                *w = v.abs();
            }
            let lg = &mut levels[16 * g..16 * g + 16];
            (scales[g], mins[g]) = make_qkx2_quants(&search, xg, &weights, lg, &mut aux);
            if scales[g] > max_scale {
                max_scale = scales[g];
            }
            if mins[g] > max_min {
                max_min = mins[g];
            }
        }

        let mut b = BlockQ2K {
            scales: [0; 16],
            qs: [0; 64],
            d: f16::ZERO,
            dmin: f16::ZERO,
        };
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (s, &v) in b.scales.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * v) as u8;
            }
            b.d = f32_to_f16(max_scale / Q4SCALE);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (s, &v) in b.scales.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * v) << 4) as u8;
            }
            b.dmin = f32_to_f16(max_min / Q4SCALE);
        }

        // Re-derive levels against the scales actually stored.
        let (d_all, m_all) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        for g in 0..16 {
            let d = d_all * (b.scales[g] & 0x0f) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = m_all * (b.scales[g] >> 4) as f32;
            for i in 16 * g..16 * g + 16 {
                levels[i] = nearest_int((x[i] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&levels, &mut b.qs);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn dequantize_known_block() {
        let mut b = BlockQ2K {
            scales: [0; 16],
            qs: [0; 64],
            d: f16::from_f32(1.0),
            dmin: f16::from_f32(0.5),
        };
        b.scales[0] = 0x21; // scale 1, min 2
        b.scales[3] = 0x02; // scale 2, min 0
        b.scales[9] = 0x13; // scale 3, min 1
        b.qs[0] = 0b11_10_01_11; // elements 0, 32, 64, 96
        b.qs[16 + 2] = 0b00_00_10_00; // element 32 + 16 + 2 = 50 -> level 2 (group 3)
        b.qs[32 + 16] = 0b00_00_00_01; // element 128 + 16 = 144 -> level 1 (group 9)
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[0], 3.0 - 1.0);
        assert_eq!(y[1], -1.0);
        assert_eq!(y[50], 4.0);
        assert_eq!(y[144], 3.0 - 0.5);
        assert_eq!(y[32], 0.0); // group 2: scale and min 0
    }

    #[test]
    fn round_trip_error_is_small() {
        let x: Vec<f32> = (0..QK_K)
            .map(|i| (i as f32 * 0.37).sin() * 1.5 + 0.2)
            .collect();
        let b = BlockQ2K::quantize(&x);
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        let err: f32 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            / QK_K as f32;
        let pow: f32 = x.iter().map(|a| a * a).sum::<f32>() / QK_K as f32;
        assert!(
            (err / pow).sqrt() < 0.3,
            "relative rms {}",
            (err / pow).sqrt()
        );
    }
}
