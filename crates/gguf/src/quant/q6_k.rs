//! Q6_K: 256 elements in 16 groups of 16; 6-bit levels offset by 32 with signed 8-bit
//! group scales and one f16 scale (`x = d * sc * (q - 32)`).

use super::common::{f16_to_f32, f32_to_f16, make_qx_quants, nearest_int, GROUP_MAX_EPS};
use super::Block;
use crate::types::{GgmlType, QK_K};
use half::f16;

/// A Q6_K block: 210 bytes, alignment 2.
///
/// Per 128-element half `n`, with `ql = ql[64n..]` and `qh = qh[32n..]`, element
/// `128n + 32k + l` (`k` in 0..4, `l` in 0..32) has low nibble from `ql[l + 32*(k%2)]`
/// (low half for `k < 2`, high half otherwise) and top two bits from `qh[l]` bits `2k`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the levels.
    pub ql: [u8; 128],
    /// High 2 bits of the levels.
    pub qh: [u8; 64],
    /// Signed group scales.
    pub scales: [i8; 16],
    /// Super-block scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::align_of::<BlockQ6K>() == 2);

impl Block for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6K;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (n, half) in out[..QK_K].chunks_exact_mut(128).enumerate() {
            let ql = &self.ql[64 * n..64 * n + 64];
            let qh = &self.qh[32 * n..32 * n + 32];
            let sc = &self.scales[8 * n..8 * n + 8];
            for (k, quarter) in half.chunks_exact_mut(32).enumerate() {
                let low = &ql[32 * (k % 2)..32 * (k % 2) + 32];
                let nibble_shift = 4 * (k / 2);
                for (l, y) in quarter.iter_mut().enumerate() {
                    let q = ((low[l] >> nibble_shift) & 0x0f) | (((qh[l] >> (2 * k)) & 3) << 4);
                    let s = sc[l / 16 + 2 * k];
                    *y = d * s as f32 * (q as i8 - 32) as f32;
                }
            }
        }
    }
}

impl super::Quantize for BlockQ6K {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

impl BlockQ6K {
    /// Encodes `x[..256]` as ggml's `quantize_row_q6_K_impl`: each 16-group's scale search
    /// weighted by the importance weights `qw` themselves (ggml does not mix in `x²` here),
    /// or by `x²` without (the reference encoder).
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let x = &x[..QK_K];
        let mut levels = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for (g, s) in scales.iter_mut().enumerate() {
            let r = 16 * g..16 * g + 16;
            *s = make_qx_quants(
                32,
                &x[r.clone()],
                &mut levels[r],
                qw.map(|q| &q[16 * g..16 * g + 16]),
            );
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = *s;
            }
        }
        let mut b: BlockQ6K = bytemuck::Zeroable::zeroed();
        if max_abs_scale < GROUP_MAX_EPS {
            return b;
        }

        let iscale = -128.0 / max_scale;
        b.d = f32_to_f16(1.0 / iscale);
        for (q, &s) in b.scales.iter_mut().zip(&scales) {
            *q = nearest_int(iscale * s).min(127) as i8;
        }
        let d_all = f16_to_f32(b.d);
        for g in 0..16 {
            let d = d_all * b.scales[g] as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * g..16 * g + 16 {
                levels[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as i8;
            }
        }

        for n in 0..2 {
            for l in 0..32 {
                let at = |k: usize| levels[128 * n + 32 * k + l] as u8 & 0x3f;
                let (q1, q2, q3, q4) = (at(0), at(1), at(2), at(3));
                b.ql[64 * n + l] = (q1 & 0x0f) | ((q3 & 0x0f) << 4);
                b.ql[64 * n + 32 + l] = (q2 & 0x0f) | ((q4 & 0x0f) << 4);
                b.qh[32 * n + l] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn dequantize_known_block() {
        let mut b: BlockQ6K = bytemuck::Zeroable::zeroed();
        b.d = f16::from_f32(0.5);
        b.scales[0] = -2;
        b.scales[14] = 4; // group 14: elements 224..240 (half 1, k = 3)
        b.ql[0] = 0x0f; // element 0 low nibble 15
        b.qh[0] = 0b0000_0010; // element 0 high bits 2 -> q = 47
        b.ql[64 + 32 + 1] = 0x30; // element 128 + 96 + 1 = 225 low nibble 3
        b.qh[32 + 1] = 0b1100_0000; // element 225 high bits 3 -> q = 51
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[0], 0.5 * -2.0 * 15.0);
        assert_eq!(y[1], 0.5 * -2.0 * -32.0);
        assert_eq!(y[225], 0.5 * 4.0 * 19.0);
        assert_eq!(y[16], 0.0);
    }

    #[test]
    fn round_trip_error_is_small() {
        let x: Vec<f32> = (0..QK_K).map(|i| (i as f32 * 0.77).sin() * 0.02).collect();
        let b = BlockQ6K::quantize(&x);
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        let err: f32 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>();
        let pow: f32 = x.iter().map(|a| a * a).sum::<f32>();
        assert!(
            (err / pow).sqrt() < 0.02,
            "relative rms {}",
            (err / pow).sqrt()
        );
    }

    #[test]
    fn zero_block_stays_zero() {
        let b = BlockQ6K::quantize(&[0.0; QK_K]);
        assert_eq!(b, bytemuck::Zeroable::zeroed());
    }
}
