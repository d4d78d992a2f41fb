//! Q3_K: 256 elements in 16 groups of 16; 3-bit levels (2 low bits plus a high bit)
//! with signed 6-bit group scales and one f16 scale (`x = d * (sc - 32) * (q - 4)`).

use super::common::{f16_to_f32, f32_to_f16, make_q3_quants, nearest_int, pack_2bit};
use super::Block;
use crate::types::{GgmlType, QK_K};
use half::f16;

/// A Q3_K block: 110 bytes, alignment 2.
///
/// A set bit in `hmask` means "no -4 offset": element `e` uses byte `e % 32`, bit `e / 32`.
/// Low bits are packed as in Q2_K. The sixteen 6-bit scales (stored with +32) sit in
/// `scales`: low nibbles of groups 0-7 in bytes 0-7 low halves, of groups 8-15 in bytes 0-7
/// high halves; the top two bits of group `g` in byte `8 + g % 4`, bits `2 * (g / 4)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ3K {
    /// High bit of each level.
    pub hmask: [u8; 32],
    /// Packed low 2 bits.
    pub qs: [u8; 64],
    /// Packed 6-bit group scales.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(std::mem::align_of::<BlockQ3K>() == 2);

impl BlockQ3K {
    /// Group `g`'s signed scale in `-32..32`.
    #[inline]
    pub fn scale(&self, g: usize) -> i8 {
        let low = if g < 8 {
            self.scales[g] & 0x0f
        } else {
            self.scales[g - 8] >> 4
        };
        let high = (self.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    }
}

impl Block for BlockQ3K {
    const TYPE: GgmlType = GgmlType::Q3K;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d_all = f16_to_f32(self.d);
        for (g, group) in out[..QK_K].chunks_exact_mut(16).enumerate() {
            let dl = d_all * self.scale(g) as f32;
            let start = 16 * (g % 2);
            let q = &self.qs[32 * (g / 8) + start..][..16];
            let hm = &self.hmask[start..start + 16];
            let shift = 2 * ((g % 8) / 2);
            let bit = 1u8 << (g / 2);
            for ((y, &b), &h) in group.iter_mut().zip(q).zip(hm) {
                let low = ((b >> shift) & 3) as i8;
                let off = if h & bit != 0 { 0 } else { 4 };
                *y = dl * (low - off) as f32;
            }
        }
    }
}

impl super::Quantize for BlockQ3K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut levels = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for (g, s) in scales.iter_mut().enumerate() {
            let r = 16 * g..16 * g + 16;
            *s = make_q3_quants(4, &x[r.clone()], &mut levels[r]);
            if s.abs() > amax {
                amax = s.abs();
                max_scale = *s;
            }
        }

        let mut b = BlockQ3K {
            hmask: [0; 32],
            qs: [0; 64],
            scales: [0; 12],
            d: f16::ZERO,
        };
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (g, &s) in scales.iter().enumerate() {
                let l = (nearest_int(iscale * s) as i8).clamp(-32, 31) + 32;
                if g < 8 {
                    b.scales[g] = (l & 0x0f) as u8;
                } else {
                    b.scales[g - 8] |= ((l & 0x0f) << 4) as u8;
                }
                b.scales[8 + g % 4] |= ((l >> 4) << (2 * (g / 4))) as u8;
            }
            b.d = f32_to_f16(1.0 / iscale);
        }

        let d_all = f16_to_f32(b.d);
        for g in 0..16 {
            let d = d_all * b.scale(g) as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * g..16 * g + 16 {
                levels[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
            }
        }

        // Levels are 0..8 here; the high bit moves to hmask.
        let mut low = [0u8; QK_K];
        for (j, (&l, lo)) in levels.iter().zip(low.iter_mut()).enumerate() {
            let l = l as u8 & 7;
            if l > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
            }
            *lo = l & 3;
        }
        pack_2bit(&low, &mut b.qs);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn scale_unpacking_matches_the_layout() {
        let mut b = BlockQ3K::zeroed_block();
        b.scales[2] = 0x5a; // group 2 low = 0xa, group 10 low = 0x5
        b.scales[10] = 0b11_00_00_01; // bits 0-1: group 2 high = 1; bits 6-7: group 14 high = 3
        assert_eq!(b.scale(2), (0x1a_u8 as i8) - 32);
        assert_eq!(b.scale(10), 0x05 - 32);
        assert_eq!(b.scale(14), 0x30 - 32); // byte 10, bits 6-7
        assert_eq!(b.scale(0), -32);
    }

    #[test]
    fn dequantize_known_block() {
        let mut b = BlockQ3K::zeroed_block();
        b.d = f16::from_f32(0.5);
        b.scales[0] = 0x02; // group 0 low nibble 2, high bits 0 -> 2 - 32 = -30
        b.scales[8] = 0x02 << 2; // group 4 high bits = 2 -> 32 - 32 = 0
        b.qs[0] = 0b00_00_00_11; // element 0 low bits 3
        b.hmask[0] = 0b0000_0001; // element 0 has no offset
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[0], 0.5 * -30.0 * 3.0);
        assert_eq!(y[1], 0.5 * -30.0 * -4.0);
        assert_eq!(y[64], 0.0);
    }

    #[test]
    fn round_trip_error_is_small() {
        let x: Vec<f32> = (0..QK_K)
            .map(|i| (i as f32 * 0.61).cos() * 2.0 - 0.3)
            .collect();
        let b = BlockQ3K::quantize(&x);
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        let err: f32 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>();
        let pow: f32 = x.iter().map(|a| a * a).sum::<f32>();
        assert!(
            (err / pow).sqrt() < 0.2,
            "relative rms {}",
            (err / pow).sqrt()
        );
    }

    impl BlockQ3K {
        fn zeroed_block() -> Self {
            bytemuck::Zeroable::zeroed()
        }
    }
}
