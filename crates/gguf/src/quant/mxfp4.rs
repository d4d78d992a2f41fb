//! MXFP4 (OCP microscaling FP4): 32 E2M1 values sharing one E8M0 power-of-two scale.
//!
//! ggml stores the E2M1 values doubled (as the integers of [`KVALUES_MXFP4`]) and halves
//! the scale instead, so `x = e8m0_half(e) * K[q]`. Dequantization follows ggml; the
//! quantizer follows the `gguf` Python package's (nearest value for the scale
//! `2^(floor(log2 amax) - 2)`).

use super::Block;
use crate::types::GgmlType;

/// The E2M1 values times two, by 4-bit code (ggml's `kvalues_mxfp4`).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An MXFP4 block: 17 bytes, **alignment 1**.
///
/// Byte `j` of `qs` holds element `j` in its low nibble and element `j + 16` in its high one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockMxfp4 {
    /// E8M0 scale exponent (biased by 127).
    pub e: u8,
    /// Packed 4-bit codes.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);
const _: () = assert!(std::mem::align_of::<BlockMxfp4>() == 1);

/// Half the E8M0 scale `2^(e - 127)`, exactly (ggml's `ggml_e8m0_to_fp32_half`): the two
/// smallest exponents give f32 subnormals.
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e - 1) as u32) << 23
    };
    f32::from_bits(bits)
}

impl Block for BlockMxfp4 {
    const TYPE: GgmlType = GgmlType::Mxfp4;
    const ELEMS: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        let d = e8m0_to_f32_half(self.e);
        let (lo, hi) = out[..32].split_at_mut(16);
        for ((&q, a), b) in self.qs.iter().zip(lo).zip(hi) {
            *a = d * KVALUES_MXFP4[(q & 0x0f) as usize] as f32;
            *b = d * KVALUES_MXFP4[(q >> 4) as usize] as f32;
        }
    }
}

impl super::Quantize for BlockMxfp4 {
    fn quantize(x: &[f32]) -> Self {
        let x = &x[..32];
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // `as u8` saturates for exponents outside E8M0's range instead of wrapping.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        let code = |v: f32| {
            let mut best = (0u8, f32::INFINITY);
            for (i, &k) in KVALUES_MXFP4.iter().enumerate() {
                let err = (d * k as f32 - v).abs();
                // Strictly smaller keeps the first minimum, as `argmin` does.
                if err < best.1 {
                    best = (i as u8, err);
                }
            }
            best.0
        };
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = code(x[j]) | (code(x[j + 16]) << 4);
        }
        BlockMxfp4 { e, qs }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn scale_is_half_a_power_of_two() {
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(130), 4.0);
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
    }

    #[test]
    fn round_trip_is_exact_on_e2m1_values() {
        // amax 6 gives the exponent floor(log2 6) - 2 = 0, so the scale is 0.5.
        let x: Vec<f32> = (0..32)
            .map(|i| KVALUES_MXFP4[i % 16] as f32 * 0.5)
            .collect();
        let b = BlockMxfp4::quantize(&x);
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!(&y[..], &x[..]);
    }
}
