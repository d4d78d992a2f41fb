//! Q5_0: 32 elements, one f16 scale, 5-bit levels offset by 16 (`x = d * (q - 16)`).

use super::common::{f16_to_f32, f32_to_f16};
use super::Block;
use crate::types::GgmlType;
use half::f16;

/// A Q5_0 block: 22 bytes, alignment 2.
///
/// Low nibbles are packed as in Q4_0; bit `j` of the little-endian `qh` word is the fifth
/// bit of element `j`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits, one per element (little-endian u32).
    pub qh: [u8; 4],
    /// Packed low 4 bits.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::align_of::<BlockQ5_0>() == 2);

/// Splits 32 five-bit levels into the low-nibble bytes and the high-bit word.
pub(super) fn pack_q5(levels: &[u8; 32]) -> ([u8; 16], [u8; 4]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        let (a, b) = (levels[j], levels[j + 16]);
        qs[j] = (a & 0x0f) | ((b & 0x0f) << 4);
        qh |= (((a & 0x10) >> 4) as u32) << j;
        qh |= (((b & 0x10) >> 4) as u32) << (j + 16);
    }
    (qs, qh.to_le_bytes())
}

/// Unpacks element `j` and `j + 16` of a Q5 block as 5-bit levels.
#[inline]
pub(super) fn unpack_q5(qs: &[u8; 16], qh: [u8; 4], j: usize) -> (u8, u8) {
    let h = u32::from_le_bytes(qh);
    let a = (qs[j] & 0x0f) | ((((h >> j) << 4) & 0x10) as u8);
    let b = (qs[j] >> 4) | (((h >> (j + 12)) & 0x10) as u8);
    (a, b)
}

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ELEMS: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let (lo, hi) = out[..32].split_at_mut(16);
        for (j, (a, b)) in lo.iter_mut().zip(hi).enumerate() {
            let (qa, qb) = unpack_q5(&self.qs, self.qh, j);
            *a = (qa as i32 - 16) as f32 * d;
            *b = (qb as i32 - 16) as f32 * d;
        }
    }
}

impl super::Quantize for BlockQ5_0 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..32];
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut levels = [0u8; 32];
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = ((v * id + 16.5) as i8).min(31) as u8;
        }
        let (qs, qh) = pack_q5(&levels);
        BlockQ5_0 {
            d: f32_to_f16(d),
            qh,
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn dequantize_known_block() {
        let mut qs = [0u8; 16];
        qs[1] = 0xf0;
        // Fifth bit set for element 1 and element 17.
        let qh = ((1u32 << 1) | (1u32 << 17)).to_le_bytes();
        let b = BlockQ5_0 {
            d: f16::from_f32(1.0),
            qh,
            qs,
        };
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(y[1], 0.0); // 0 | 16 - 16
        assert_eq!(y[17], 15.0); // 15 | 16 - 16
        assert_eq!(y[0], -16.0);
    }

    #[test]
    fn round_trip_is_exact_on_the_grid() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.125).collect();
        let b = BlockQ5_0::quantize(&x);
        assert_eq!(b.d.to_f32(), 0.125);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(&y[..], &x[..]);
    }
}
