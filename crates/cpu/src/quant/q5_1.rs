//! Q5_1 weights · Q8_0 activations.

use super::legacy::{dot_affine_scalar, AffineLevels};
use super::QuantDot;
use half::f16;
use minfer_gguf::quant::{BlockQ5_1, BlockQ8_0};

impl AffineLevels for BlockQ5_1 {
    fn scale_min(&self) -> (f16, f16) {
        (self.d, self.m)
    }

    fn levels(&self) -> [u8; 32] {
        let h = u32::from_le_bytes(self.qh);
        let mut q = [0u8; 32];
        for (j, &b) in self.qs.iter().enumerate() {
            q[j] = (b & 0x0f) | ((((h >> j) & 1) as u8) << 4);
            q[j + 16] = (b >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
        }
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn levels_avx2(&self) -> std::arch::x86_64::__m256i {
        use super::simd::{bytes_from_bits_32, nibbles_16};
        use std::arch::x86_64::*;
        // The fifth bit of element j is bit j of `qh`.
        let hi = _mm256_and_si256(
            bytes_from_bits_32(u32::from_le_bytes(self.qh)),
            _mm256_set1_epi8(0x10),
        );
        _mm256_or_si256(nibbles_16(&self.qs), hi)
    }
}

impl QuantDot for BlockQ5_1 {
    type Act = BlockQ8_0;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        dot_affine_scalar(w, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        super::legacy::dot_affine_avx2(w, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_kernel, check_length_error};

    #[test]
    fn kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 41), (7, 42), (28, 43)] {
            check_kernel::<BlockQ5_1>(n, seed);
        }
        check_length_error::<BlockQ5_1>();
    }
}
