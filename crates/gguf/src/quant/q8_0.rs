//! Q8_0: 32 elements, one f16 scale, signed 8-bit levels (`x = d * q`).

use super::common::{f16_to_f32, f32_to_f16};
use super::Block;
use crate::types::GgmlType;
use half::f16;

/// A Q8_0 block: 34 bytes, alignment 2.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Levels, element order.
    pub qs: [i8; 32],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::align_of::<BlockQ8_0>() == 2);

impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ELEMS: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (y, &q) in out[..32].iter_mut().zip(&self.qs) {
            *y = q as f32 * d;
        }
    }
}

impl super::Quantize for BlockQ8_0 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..32];
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; 32];
        for (q, &v) in qs.iter_mut().zip(x) {
            // Round half away from zero, as C `roundf`.
            *q = (v * id).round() as i8;
        }
        BlockQ8_0 {
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
        let mut qs = [0i8; 32];
        qs[0] = -128;
        qs[31] = 127;
        let b = BlockQ8_0 {
            d: f16::from_f32(0.25),
            qs,
        };
        let mut y = [1.0; 32];
        b.dequantize(&mut y);
        assert_eq!((y[0], y[1], y[31]), (-32.0, 0.0, 31.75));
    }

    #[test]
    fn round_trip_error_is_below_half_a_step() {
        let x: Vec<f32> = (0..32)
            .map(|i| ((i * 13) % 32) as f32 / 7.0 - 2.0)
            .collect();
        let b = BlockQ8_0::quantize(&x);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        let step = b.d.to_f32();
        assert!(step > 0.0);
        // Half a step of rounding plus up to 127 times the f16 rounding of the scale.
        for (a, e) in x.iter().zip(&y) {
            assert!((a - e).abs() <= 0.57 * step, "{a} {e}");
        }
        assert_eq!(b.qs.iter().map(|q| q.unsigned_abs()).max(), Some(127));
    }
}
