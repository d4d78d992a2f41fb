//! Q8_0 weights · Q8_0 activations.

use super::legacy::{dot_signed_scalar, SignedLevels};
use super::QuantDot;
use half::f16;
use minfer_gguf::quant::BlockQ8_0;

impl SignedLevels for BlockQ8_0 {
    fn scale(&self) -> f16 {
        self.d
    }

    fn levels(&self) -> [i8; 32] {
        self.qs
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn levels_avx2(&self) -> std::arch::x86_64::__m256i {
        super::simd::load32(&self.qs)
    }
}

impl QuantDot for BlockQ8_0 {
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
        for (n, seed) in [(1, 1), (7, 2), (28, 3), (152, 4)] {
            check_kernel::<BlockQ8_0>(n, seed);
        }
        check_length_error::<BlockQ8_0>();
    }

    #[test]
    fn extreme_weight_level_is_exact() {
        // -128 weights go through the sign trick as |w| = 128.
        let mut w = BlockQ8_0 {
            d: f16::ONE,
            qs: [-128; 32],
        };
        w.qs[5] = 127;
        let x = BlockQ8_0 {
            d: f16::ONE,
            qs: [-127; 32],
        };
        let want = (31 * 128 * 127 - 127 * 127) as f32;
        for isa in crate::quant::testutil::isas() {
            assert_eq!(crate::quant::dot(isa, &[w], [&[x][..]]).unwrap()[0], want);
        }
    }
}
