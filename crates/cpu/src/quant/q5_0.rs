//! Q5_0 weights · Q8_0 activations.

use super::legacy::{dot_signed_scalar, SignedLevels};
use super::QuantDot;
use half::f16;
use minfer_gguf::quant::{BlockQ5_0, BlockQ8_0};

impl SignedLevels for BlockQ5_0 {
    fn scale(&self) -> f16 {
        self.d
    }

    fn levels(&self) -> [i8; 32] {
        let h = u32::from_le_bytes(self.qh);
        let mut q = [0i8; 32];
        for (j, &b) in self.qs.iter().enumerate() {
            let hi_a = ((h >> j) & 1) as u8;
            let hi_b = ((h >> (j + 16)) & 1) as u8;
            q[j] = ((b & 0x0f) | (hi_a << 4)) as i8 - 16;
            q[j + 16] = ((b >> 4) | (hi_b << 4)) as i8 - 16;
        }
        q
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn levels_avx2(&self) -> std::arch::x86_64::__m256i {
        use super::simd::{bytes_from_bits_32, nibbles_16};
        use std::arch::x86_64::*;
        // Where the fifth bit is clear, OR-ing 0xF0 turns nibble n into the byte n - 16;
        // where it is set, n + 16 - 16 = n is already right.
        let clear = _mm256_andnot_si256(
            bytes_from_bits_32(u32::from_le_bytes(self.qh)),
            _mm256_set1_epi8(0xf0u8 as i8),
        );
        _mm256_or_si256(nibbles_16(&self.qs), clear)
    }
}

impl QuantDot for BlockQ5_0 {
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
    use crate::quant::testutil::{check_kernel, check_length_error, isas};

    #[test]
    fn kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 21), (7, 22), (28, 23), (152, 24)] {
            check_kernel::<BlockQ5_0>(n, seed);
        }
        check_length_error::<BlockQ5_0>();
    }

    #[test]
    fn levels_match_the_reference_decoding() {
        let w = BlockQ5_0 {
            d: f16::ONE,
            qh: 0xa5f0_0f5au32.to_le_bytes(),
            qs: std::array::from_fn(|j| (j as u8).wrapping_mul(37)),
        };
        let mut deq = [0.0f32; 32];
        minfer_gguf::quant::Block::dequantize(&w, &mut deq);
        let q = w.levels();
        for j in 0..32 {
            assert_eq!(q[j] as f32, deq[j], "element {j}");
        }
        for isa in isas() {
            let x = BlockQ8_0 {
                d: f16::ONE,
                qs: std::array::from_fn(|j| (j % 7) as i8 - 3),
            };
            let want: f32 = (0..32).map(|j| deq[j] * x.qs[j] as f32).sum();
            assert_eq!(crate::quant::dot(isa, &[w], [&[x][..]]).unwrap()[0], want);
        }
    }
}
