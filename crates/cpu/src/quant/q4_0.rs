//! Q4_0 weights · Q8_0 activations.

use super::legacy::{dot_signed_scalar, SignedLevels};
use super::QuantDot;
use half::f16;
use minfer_gguf::quant::{BlockQ4_0, BlockQ8_0};

impl SignedLevels for BlockQ4_0 {
    fn scale(&self) -> f16 {
        self.d
    }

    fn levels(&self) -> [i8; 32] {
        let mut q = [0i8; 32];
        for (j, &b) in self.qs.iter().enumerate() {
            q[j] = (b & 0x0f) as i8 - 8;
            q[j + 16] = (b >> 4) as i8 - 8;
        }
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn levels_avx2(&self) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        _mm256_sub_epi8(super::simd::nibbles_16(&self.qs), _mm256_set1_epi8(8))
    }
}

impl QuantDot for BlockQ4_0 {
    type Act = BlockQ8_0;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        dot_signed_scalar(w, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        super::legacy::dot_signed_avx2(w, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_kernel, check_length_error};

    #[test]
    fn kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 11), (7, 12), (28, 13), (152, 14)] {
            check_kernel::<BlockQ4_0>(n, seed);
        }
        check_length_error::<BlockQ4_0>();
    }
}
