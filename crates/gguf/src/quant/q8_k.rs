//! Q8_K: the activation type the k-quant dot products pair with. 256 signed 8-bit levels,
//! an f32 scale, and the sums of each 16 levels (`x = d * q`).

use super::common::nearest_int;
use super::Block;
use crate::types::{GgmlType, QK_K};

/// A Q8_K block: 292 bytes, **alignment 4** (its scale is an f32, unlike every other block).
///
/// `bsums[g]` is the sum of `qs[16g..16g+16]`; dequantization ignores it, dot-product
/// kernels use it to apply the k-quant minimums.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Levels, element order.
    pub qs: [i8; 256],
    /// Sums of each 16 consecutive levels.
    pub bsums: [i16; 16],
}

const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);
const _: () = assert!(std::mem::align_of::<BlockQ8K>() == 4);

impl Block for BlockQ8K {
    const TYPE: GgmlType = GgmlType::Q8K;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        for (y, &q) in out[..QK_K].iter_mut().zip(&self.qs) {
            *y = self.d * q as f32;
        }
    }
}

impl super::Quantize for BlockQ8K {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..QK_K];
        let mut b: BlockQ8K = bytemuck::Zeroable::zeroed();
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            return b;
        }
        // -127 rather than -128 keeps every level in -127..=127.
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, group) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = group.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
        b
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn quantize_fills_block_sums() {
        let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 100.0) / 37.0).collect();
        let b = BlockQ8K::quantize(&x);
        for g in 0..16 {
            let s: i32 = b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
            assert_eq!(b.bsums[g] as i32, s);
        }
        assert_eq!(b.qs.iter().map(|q| q.unsigned_abs()).max(), Some(127));
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        for (a, e) in x.iter().zip(&y) {
            assert!((a - e).abs() <= 0.5001 * b.d.abs(), "{a} {e}");
        }
    }

    #[test]
    fn dequantize_known_block() {
        let mut b: BlockQ8K = bytemuck::Zeroable::zeroed();
        b.d = -0.5;
        b.qs[0] = 10;
        b.qs[255] = -128;
        let mut y = [1.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!((y[0], y[255], y[7]), (-5.0, 64.0, -0.0));
    }

    #[test]
    fn zero_input_gives_zero_block() {
        assert_eq!(
            BlockQ8K::quantize(&[0.0; QK_K]),
            bytemuck::Zeroable::zeroed()
        );
    }
}
