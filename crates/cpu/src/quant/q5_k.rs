//! Q5_K weights · Q8_K activations: the Q4_K kernel with fifth bits (see `q4_k`).

use super::q4_k::dot_k4_scalar;
use super::QuantDot;
use minfer_gguf::quant::{BlockQ5K, BlockQ8K};

impl QuantDot for BlockQ5K {
    type Act = BlockQ8K;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        dot_k4_scalar(w, x)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        super::q4_k::dot_k4_avx2(w, x)
    }

    super::rows8_items!(super::ktile::rows8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_kernel, check_length_error};

    #[test]
    fn kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 61), (4, 62), (19, 63)] {
            check_kernel::<BlockQ5K>(n, seed);
        }
        check_length_error::<BlockQ5K>();
    }
}
