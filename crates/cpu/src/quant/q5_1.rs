//! Q5_1 weights · Q8_0 activations (scalar kernel on every ISA).

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
}

impl QuantDot for BlockQ5_1 {
    type Act = BlockQ8_0;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8_0]; NT]) -> [f32; NT] {
        dot_affine_scalar(w, x)
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
