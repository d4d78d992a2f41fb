//! Q2_K weights · Q8_K activations (scalar kernel on every ISA).
//!
//! `sum += (dy * d) * Σ_g sc_g Σ q y - (dy * dmin) * Σ_g m_g bsum_g`, integers exact.

use super::QuantDot;
use minfer_gguf::quant::{BlockQ2K, BlockQ8K};

impl QuantDot for BlockQ2K {
    type Act = BlockQ8K;

    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[BlockQ8K]; NT]) -> [f32; NT] {
        let x = x.map(|a| &a[..w.len()]);
        let mut acc = [0.0f32; NT];
        for (i, wb) in w.iter().enumerate() {
            let (d, dmin) = (wb.d.to_f32(), wb.dmin.to_f32());
            for t in 0..NT {
                let y = &x[t][i];
                let (mut sumi, mut summ) = (0i32, 0i32);
                for g in 0..16 {
                    let q = &wb.qs[32 * (g / 8) + 16 * (g % 2)..][..16];
                    let shift = 2 * ((g % 8) / 2);
                    let part: i32 = q
                        .iter()
                        .zip(&y.qs[16 * g..16 * g + 16])
                        .map(|(&b, &v)| ((b >> shift) & 3) as i32 * v as i32)
                        .sum();
                    sumi += (wb.scales[g] & 0x0f) as i32 * part;
                    summ += (wb.scales[g] >> 4) as i32 * y.bsums[g] as i32;
                }
                acc[t] += (y.d * d) * sumi as f32 - (y.d * dmin) * summ as f32;
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
        for (n, seed) in [(1, 81), (4, 82), (9, 83)] {
            check_kernel::<BlockQ2K>(n, seed);
        }
        check_length_error::<BlockQ2K>();
    }
}
