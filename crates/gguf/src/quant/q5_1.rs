//! Q5_1: 32 elements, f16 scale and f16 minimum, 5-bit levels (`x = d * q + m`).

use super::common::{f16_to_f32, f32_to_f16};
use super::q5_0::{pack_q5, unpack_q5};
use super::Block;
use crate::types::GgmlType;
use half::f16;

/// A Q5_1 block: 24 bytes, alignment 2. Level packing as in [`super::BlockQ5_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (added after scaling).
    pub m: f16,
    /// Fifth bits, one per element (little-endian u32).
    pub qh: [u8; 4],
    /// Packed low 4 bits.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::align_of::<BlockQ5_1>() == 2);

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ELEMS: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        let (lo, hi) = out[..32].split_at_mut(16);
        for (j, (a, b)) in lo.iter_mut().zip(hi).enumerate() {
            let (qa, qb) = unpack_q5(&self.qs, self.qh, j);
            *a = qa as f32 * d + m;
            *b = qb as f32 * d + m;
        }
    }
}

impl super::Quantize for BlockQ5_1 {
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
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut levels = [0u8; 32];
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = (((v - min) * id + 0.5) as u8).min(31);
        }
        let (qs, qh) = pack_q5(&levels);
        BlockQ5_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
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
        qs[15] = 0x1f;
        let qh = (1u32 << 31).to_le_bytes();
        let b = BlockQ5_1 {
            d: f16::from_f32(0.5),
            m: f16::from_f32(10.0),
            qh,
            qs,
        };
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(y[15], 10.0 + 7.5);
        assert_eq!(y[31], 10.0 + 0.5 * 17.0);
        assert_eq!(y[30], 10.0);
    }

    #[test]
    fn round_trip_is_exact_on_the_grid() {
        let x: Vec<f32> = (0..32)
            .map(|i| -3.0 + ((i * 5) % 32) as f32 * 0.25)
            .collect();
        let b = BlockQ5_1::quantize(&x);
        assert_eq!((b.d.to_f32(), b.m.to_f32()), (0.25, -3.0));
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(&y[..], &x[..]);
    }
}
