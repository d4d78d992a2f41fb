//! Q4_1: 32 elements, f16 scale and f16 minimum, 4-bit levels (`x = d * q + m`).

use super::common::{f16_to_f32, f32_to_f16};
use super::Block;
use crate::types::GgmlType;
use half::f16;

/// A Q4_1 block: 20 bytes, alignment 2.
///
/// Byte `j` of `qs` holds element `j` in its low nibble and element `j + 16` in its high one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (added after scaling).
    pub m: f16,
    /// Packed 4-bit levels.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::align_of::<BlockQ4_1>() == 2);

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMS: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let (lo, hi) = out[..32].split_at_mut(16);
        for ((&q, a), b) in self.qs.iter().zip(lo).zip(hi) {
            *a = (q & 0x0f) as f32 * d + m;
            *b = (q >> 4) as f32 * d + m;
        }
    }
}

impl super::Quantize for BlockQ4_1 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..32];
        let (mut min, mut max) = (f32::MAX, -f32::MAX);
        for &v in x {
            if v < min {
                min = v;
            }
            if v > max {
                max = v;
            }
        }
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let level = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = level(x[j]) | (level(x[j + 16]) << 4);
        }
        BlockQ4_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
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
        qs[2] = 0x3f;
        let b = BlockQ4_1 {
            d: f16::from_f32(2.0),
            m: f16::from_f32(-1.0),
            qs,
        };
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(y[2], 29.0);
        assert_eq!(y[18], 5.0);
        assert_eq!(y[0], -1.0);
    }

    #[test]
    fn round_trip_is_exact_on_the_grid() {
        let x: Vec<f32> = (0..32).map(|i| 1.0 + (i % 16) as f32 * 0.5).collect();
        let b = BlockQ4_1::quantize(&x);
        assert_eq!((b.d.to_f32(), b.m.to_f32()), (0.5, 1.0));
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(&y[..], &x[..]);
    }

    #[test]
    fn constant_block_keeps_its_value() {
        let b = BlockQ4_1::quantize(&[3.0; 32]);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert!(y.iter().all(|&v| v == 3.0));
    }
}
