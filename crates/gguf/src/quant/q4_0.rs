//! Q4_0: 32 elements, one f16 scale, 4-bit levels offset by 8 (`x = d * (q - 8)`).

use super::common::{f16_to_f32, f32_to_f16};
use super::Block;
use crate::types::GgmlType;
use half::f16;

/// A Q4_0 block: 18 bytes, alignment 2.
///
/// Byte `j` of `qs` holds element `j` in its low nibble and element `j + 16` in its high one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Packed 4-bit levels.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 2);

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ELEMS: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let (lo, hi) = out[..32].split_at_mut(16);
        for ((&q, a), b) in self.qs.iter().zip(lo).zip(hi) {
            *a = ((q & 0x0f) as i32 - 8) as f32 * d;
            *b = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl super::Quantize for BlockQ4_0 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..32];
        // The signed value of largest magnitude maps to level 0 (i.e. -8).
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let level = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = level(x[j]) | (level(x[j + 16]) << 4);
        }
        BlockQ4_0 {
            d: f32_to_f16(d),
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
        qs[0] = 0xf0; // element 0 -> level 0, element 16 -> level 15
        qs[5] = 0x98;
        let b = BlockQ4_0 {
            d: f16::from_f32(0.5),
            qs,
        };
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(y[0], -4.0);
        assert_eq!(y[16], 3.5);
        assert_eq!(y[5], 0.0);
        assert_eq!(y[21], 0.5);
        assert_eq!(y[1], -4.0);
    }

    #[test]
    fn round_trip_is_exact_on_the_grid() {
        // Levels -8..=7 times 0.25, with -2.0 as the extreme so d = 0.25 exactly.
        let x: Vec<f32> = (0..32).map(|i| ((i % 16) as f32 - 8.0) * 0.25).collect();
        let b = BlockQ4_0::quantize(&x);
        assert_eq!(b.d.to_f32(), 0.25);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(&y[..], &x[..]);
        assert_eq!(BlockQ4_0::from_bytes(b.as_bytes()), Some(b));
        assert_eq!(BlockQ4_0::from_bytes(&b.as_bytes()[1..]), None);
    }

    #[test]
    fn zero_block_quantizes_to_level_eight() {
        let b = BlockQ4_0::quantize(&[0.0; 32]);
        assert_eq!(b.d.to_f32(), 0.0);
        assert!(b.qs.iter().all(|&q| q == 0x88));
    }
}
