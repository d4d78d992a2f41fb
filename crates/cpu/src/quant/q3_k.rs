//! Q3_K weights · Q8_K activations (scalar kernel on every ISA).
//!
//! `sum += (dy * d) * Σ_g sc_g Σ (q - off) y`, integers exact.

use super::QuantDot;
use minfer_gguf::quant::{BlockQ3K, BlockQ8K};

impl QuantDot for BlockQ3K {
    type Act = BlockQ8K;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        let x = x.map(|a| &a[..w.len()]);
        let mut acc = [0.0f32; NT];
        for (i, wb) in w.iter().enumerate() {
            let d = wb.d.to_f32();
            let mut levels = [0i8; 256];
            for (g, lv) in levels.chunks_exact_mut(16).enumerate() {
                let start = 16 * (g % 2);
                let q = &wb.qs[32 * (g / 8) + start..][..16];
                let hm = &wb.hmask[start..start + 16];
                let shift = 2 * ((g % 8) / 2);
                let bit = 1u8 << (g / 2);
                for ((l, &b), &h) in lv.iter_mut().zip(q).zip(hm) {
                    let off = if h & bit != 0 { 0 } else { 4 };
                    *l = ((b >> shift) & 3) as i8 - off;
                }
            }
            for t in 0..NT {
                let y = &x[t][i];
                let mut sumi = 0i32;
                for g in 0..16 {
                    let part: i32 = levels[16 * g..16 * g + 16]
                        .iter()
                        .zip(&y.qs[16 * g..16 * g + 16])
                        .map(|(&q, &v)| q as i32 * v as i32)
                        .sum();
                    sumi += wb.scale(g) as i32 * part;
                }
                acc[t] += (y.d * d) * sumi as f32;
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_kernel, check_length_error};

    #[test]
    fn kernels_agree_and_match_f32() {
        for (n, seed) in [(1, 91), (4, 92), (9, 93)] {
            check_kernel::<BlockQ3K>(n, seed);
        }
        check_length_error::<BlockQ3K>();
    }
}
