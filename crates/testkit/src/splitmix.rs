//! The tiny-model weight generator, pinned by the committed llama.cpp reference outputs.

/// splitmix64 with an Irwin–Hall normal (sum of four uniforms): only adds, multiplies
/// and `sqrt`, all correctly rounded, so results are identical on every platform.
///
/// Kept apart from [`crate::Rng`] because `minfer_models::testing`'s golden models are
/// byte-identical to the files llama.cpp's reference outputs were computed from (their
/// sha256 is recorded); changing this stream means regenerating that reference.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 raw bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Approximately N(0, 1): four uniforms have variance 1/3 around 2.
    pub fn normal(&mut self) -> f64 {
        let s: f64 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 3f64.sqrt()
    }

    /// `n` approximately normal values with standard deviation `std`.
    pub fn normal_vec(&mut self, n: usize, std: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * std) as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_unit_variance_and_repeat_per_seed() {
        let v = SplitMix64::new(3).normal_vec(20000, 1.0);
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / v.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
        assert_eq!(v, SplitMix64::new(3).normal_vec(20000, 1.0));
        assert_ne!(v, SplitMix64::new(4).normal_vec(20000, 1.0));
    }
}
