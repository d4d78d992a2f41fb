//! The float types F32, F16 and BF16: block size 1, little-endian scalars.
//!
//! F16 widens through [`half::f16`] (exact; NaNs come out quiet). BF16 widens by shifting
//! the 16 bits into the top of an f32, and narrows with round-to-nearest-even and quieted
//! NaNs, as ggml's `ggml_compute_fp32_to_bf16`.

use half::f16;

/// Reads little-endian f32 values.
pub(super) fn f32_from_bytes(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(4).zip(dst) {
        *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Writes little-endian f32 values.
pub(super) fn f32_to_bytes(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}

/// Widens little-endian f16 values.
pub(super) fn f16_from_bytes(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst) {
        *y = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// Narrows to f16 with round-to-nearest-even.
pub(super) fn f16_to_bytes(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f16::from_f32(*x).to_bits().to_le_bytes());
    }
}

/// Widens one bf16 bit pattern: the bits become the top half of an f32.
#[inline]
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Narrows an f32 to bf16 bits: NaNs keep their sign and top payload and are made quiet,
/// everything else rounds to nearest, ties to even (overflowing to infinity).
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 0x0040) as u16;
    }
    // Cannot overflow: the largest non-NaN pattern is 0xff80_0000.
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// Widens little-endian bf16 values.
pub(super) fn bf16_from_bytes(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst) {
        *y = bf16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Narrows to bf16.
pub(super) fn bf16_to_bytes(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_bf16_bits(*x).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_to_vec, quantize_to_vec};
    use crate::types::GgmlType;

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nans() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0xff81_2345)), 0xffc1);
        assert_eq!(bf16_bits_to_f32(0xc040).to_bits(), 0xc040_0000);
    }

    #[test]
    fn float_types_round_trip_representable_values() {
        let x = [
            0.0f32,
            -0.0,
            1.5,
            -2.25,
            65504.0,
            1.0 + 1.0 / 1024.0,
            f32::INFINITY,
        ];
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let q = quantize_to_vec(ty, &x).unwrap();
            assert_eq!(q.len(), x.len() * ty.type_size());
            let y = dequantize_to_vec(ty, &q, x.len()).unwrap();
            let same: Vec<bool> = x
                .iter()
                .zip(&y)
                .map(|(a, b)| a.to_bits() == b.to_bits())
                .collect();
            if ty == GgmlType::BF16 {
                // 65504 and 1 + 2^-10 need more than bf16's 8 significant bits.
                assert_eq!(same, [true, true, true, true, false, false, true]);
                assert_eq!(y[4], 65536.0);
            } else {
                assert!(same.iter().all(|&s| s), "{ty}: {y:?}");
            }
        }
    }

    #[test]
    fn f16_narrowing_rounds_and_overflows() {
        let q = quantize_to_vec(GgmlType::F16, &[1.0 + 1.0 / 4096.0, 1e6, -1e-9]).unwrap();
        let y = dequantize_to_vec(GgmlType::F16, &q, 3).unwrap();
        assert_eq!(y[0], 1.0);
        assert_eq!(y[1], f32::INFINITY);
        assert_eq!(y[2].to_bits(), (-0.0f32).to_bits());
    }
}
