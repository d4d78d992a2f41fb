//! Test support every crate can reach: the project's deterministic random generators.
//!
//! The crate depends on nothing, so the lowest crates (gguf, tokenizer) use it as a
//! dev-dependency and the `testing` modules of graph and models as a normal one, without
//! dependency cycles. Tiny random-weight models live in `minfer_models::testing` and the op-case
//! table every backend runs in `minfer_graph::testing::cases`; both draw their values here.

mod splitmix;

pub use splitmix::SplitMix64;

/// A deterministic xorshift64 generator: the one random source of the project's tests.
///
/// The same seed gives the same stream on every platform; only shifts, xors and one
/// multiplication of the seed, so no float rounding is involved before the final scaling.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`; every seed (0 included) gives a distinct non-degenerate stream.
    pub fn new(seed: u64) -> Self {
        // Spread small seeds over the state and keep it non-zero (xorshift's fixed point).
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 raw bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[0, 1)`, a multiple of 2^-24 (exact in f32).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[-1, 1)`, a multiple of 2^-23 (exact in f32).
    pub fn f32(&mut self) -> f32 {
        self.unit() * 2.0 - 1.0
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }

    /// Uniform in `0..n` (`0` when `n == 0`); `n` is meant to stay well below 2^24.
    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f32) as usize % n.max(1)
    }

    /// Roughly N(0, 1): the sum of four uniforms in `[-1, 1)`, scaled to unit variance.
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.f32()).sum();
        // Each uniform on [-1, 1) has variance 1/3; four of them 4/3.
        s * 0.866_025_4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_repeat_per_seed_and_differ_across_seeds() {
        let a = Rng::new(7).vec(64, 1.0);
        assert_eq!(a, Rng::new(7).vec(64, 1.0));
        assert_ne!(a, Rng::new(8).vec(64, 1.0));
        assert_ne!(Rng::new(0).next_u64(), 0);
    }

    #[test]
    fn ranges_hold() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            let f = r.f32();
            assert!((-1.0..1.0).contains(&f));
            assert!(r.below(7) < 7);
        }
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn normals_have_unit_variance() {
        let mut r = Rng::new(3);
        let v: Vec<f64> = (0..20_000).map(|_| f64::from(r.normal())).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
    }
}
