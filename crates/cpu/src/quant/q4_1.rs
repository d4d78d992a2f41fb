//! Q4_1 weights · Q8_0 activations.

use super::legacy::{dot_affine_scalar, AffineLevels};
use super::QuantDot;
use half::f16;
use minfer_gguf::quant::{BlockQ4_1, BlockQ8_0};

impl AffineLevels for BlockQ4_1 {
    fn scale_min(&self) -> (f16, f16) {
        (self.d, self.m)
    }

    fn levels(&self) -> [u8; 32] {
        let mut q = [0u8; 32];
        for (j, &b) in self.qs.iter().enumerate() {
            q[j] = b & 0x0f;
            q[j + 16] = b >> 4;
        }
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn levels_avx2(&self) -> std::arch::x86_64::__m256i {
        super::simd::nibbles_16(&self.qs)
    }
}

impl QuantDot for BlockQ4_1 {
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
        for (n, seed) in [(1, 31), (7, 32), (28, 33)] {
            check_kernel::<BlockQ4_1>(n, seed);
        }
        check_length_error::<BlockQ4_1>();
    }
}
