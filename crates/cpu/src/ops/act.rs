//! The tanh-based activations of the Gemma family, vectorised over the exponential of
//! `exp`: GELU with the tanh approximation (ggml's `gelu`), GeGLU, and the soft-cap
//! `c * tanh(x / c)` of logits and attention scores.
//!
//! Both rest on `0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u))`: GELU is
//! `x / (1 + exp(-2u))` with `u = sqrt(2/pi) x (1 + 0.044715 x^2)`, which keeps its
//! relative accuracy in both tails (no `1 + tanh` cancellation), and
//! `tanh(x) = 2 / (1 + exp(-2x)) - 1`, whose error is absolute (at most a few units of
//! the last place of 1; bounds in the tests). Each step is one IEEE operation in a fixed
//! order, and the exponential gives the same bits on every ISA, so the AVX2 kernels
//! equal the scalar ones bit for bit.

use super::exp::expf;
use super::vec::VecIsa;

/// `sqrt(2/pi)` rounded once to f32, as ggml holds it.
const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_4_f64 as f32;
/// `2 sqrt(2/pi)` (an exact doubling), the GELU argument of the sigmoid form
/// (`2u = C * x * (1 + A x^2)`).
const GELU_2C: f32 = 2.0 * SQRT_2_OVER_PI;
/// ggml's cubic coefficient.
const GELU_A: f32 = 0.044_715;

/// Tanh-approximated GELU of one value.
#[inline]
pub fn gelu(x: f32) -> f32 {
    let p = GELU_A * (x * x) + 1.0;
    x / (1.0 + expf(-((GELU_2C * x) * p)))
}

/// `tanh(x)` through the exponential (absolute error below 4e-7, see the tests).
#[inline]
pub fn tanh(x: f32) -> f32 {
    2.0 / (1.0 + expf(-2.0 * x)) - 1.0
}

/// `c * tanh(x * inv_c)` with `inv_c = 1 / c`, as ggml scales, tanhs and scales back.
#[inline]
pub fn softcap(x: f32, c: f32, inv_c: f32) -> f32 {
    c * tanh(x * inv_c)
}

impl VecIsa {
    /// `y[i] = gelu(y[i])`.
    pub fn gelu(self, y: &mut [f32]) {
        match self {
            VecIsa::Scalar => y.iter_mut().for_each(|v| *v = gelu(*v)),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
            VecIsa::Avx2 => unsafe { avx2::gelu(y) },
        }
    }

    /// `out[i] = gelu(gate[i]) * up[i]` over the common length.
    pub fn geglu(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len().min(gate.len()).min(up.len());
        match self {
            VecIsa::Scalar => geglu_scalar(&gate[..n], &up[..n], &mut out[..n]),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
            VecIsa::Avx2 => unsafe { avx2::geglu(&gate[..n], &up[..n], &mut out[..n]) },
        }
    }

    /// `y[i] = c * tanh(y[i] / c)` (`c > 0`).
    pub fn softcap(self, y: &mut [f32], c: f32) {
        let inv = 1.0 / c;
        match self {
            VecIsa::Scalar => y.iter_mut().for_each(|v| *v = softcap(*v, c, inv)),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
            VecIsa::Avx2 => unsafe { avx2::softcap(y, c, inv) },
        }
    }
}

/// Scalar [`VecIsa::geglu`] over equal-length slices.
pub fn geglu_scalar(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((y, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *y = gelu(g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::ops::exp::exp8;
    use std::arch::x86_64::*;

    /// Eight lanes of [`gelu`].
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn gelu8(x: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let p = _mm256_add_ps(
            _mm256_mul_ps(_mm256_set1_ps(GELU_A), _mm256_mul_ps(x, x)),
            one,
        );
        let t = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_2C), x), p);
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), t));
        _mm256_div_ps(x, _mm256_add_ps(one, e))
    }

    /// Eight lanes of [`softcap`].
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn softcap8(x: __m256, c: __m256, inv: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let two = _mm256_set1_ps(2.0);
        let z = _mm256_mul_ps(_mm256_set1_ps(-2.0), _mm256_mul_ps(x, inv));
        let th = _mm256_sub_ps(_mm256_div_ps(two, _mm256_add_ps(one, exp8(z))), one);
        _mm256_mul_ps(c, th)
    }

    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gelu(y: &mut [f32]) {
        let mut chunks = y.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` holds eight f32.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), gelu8(_mm256_loadu_ps(c.as_ptr()))) };
        }
        for v in chunks.into_remainder() {
            *v = super::gelu(*v);
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; the slices have equal lengths.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n values of each slice.
            unsafe {
                let g = gelu8(_mm256_loadu_ps(gate.as_ptr().add(i)));
                let y = _mm256_mul_ps(g, _mm256_loadu_ps(up.as_ptr().add(i)));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            }
            i += 8;
        }
        geglu_scalar(&gate[i..n], &up[i..n], &mut out[i..n]);
    }

    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softcap(y: &mut [f32], c: f32, inv: f32) {
        let (cv, iv) = (_mm256_set1_ps(c), _mm256_set1_ps(inv));
        let mut chunks = y.chunks_exact_mut(8);
        for ch in &mut chunks {
            // SAFETY: `ch` holds eight f32.
            unsafe {
                let v = softcap8(_mm256_loadu_ps(ch.as_ptr()), cv, iv);
                _mm256_storeu_ps(ch.as_mut_ptr(), v);
            }
        }
        for v in chunks.into_remainder() {
            *v = super::softcap(*v, c, inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    fn gelu_f64(x: f64) -> f64 {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        0.5 * x * (1.0 + u.tanh())
    }

    /// The stated bounds: tanh within 4e-7 absolute of the exact value; GELU within
    /// 3e-7 relative to `max(|x|, 1)` (the sigmoid form's error scales with `x`).
    #[test]
    fn tanh_and_gelu_error_bounds() {
        let (mut worst_tanh, mut worst_gelu) = (0.0f64, 0.0f64);
        let mut x = -30.0f32;
        while x < 30.0 {
            let xd = f64::from(x);
            worst_tanh = worst_tanh.max((f64::from(tanh(x)) - xd.tanh()).abs());
            let e = (f64::from(gelu(x)) - gelu_f64(xd)).abs() / xd.abs().max(1.0);
            worst_gelu = worst_gelu.max(e);
            x += 0.000_37;
        }
        assert!(worst_tanh < 4e-7, "tanh error {worst_tanh:e}");
        assert!(worst_gelu < 3e-7, "gelu error {worst_gelu:e}");
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
        assert_eq!(gelu(-100.0), 0.0);
        assert_eq!(gelu(100.0), 100.0);
        assert!(gelu(f32::NAN).is_nan());
        // The cap keeps small values nearly unchanged and bounds large ones by c.
        let inv = 1.0 / 30.0;
        assert!((softcap(0.3, 30.0, inv) - 0.3).abs() < 2e-5);
        assert!(softcap(1e4, 30.0, inv) <= 30.0 && softcap(-1e4, 30.0, inv) >= -30.0);
    }

    /// The SIMD kernels give the scalar bits, including the saturated lanes.
    #[test]
    fn simd_matches_scalar_bitwise() {
        let mut r = Rng::new(23);
        let mut xs: Vec<f32> = (0..1003).map(|_| r.f32() * 60.0).collect();
        xs.extend([0.0, -0.0, 1e-30, -200.0, 200.0, 1e20, -1e20, f32::NAN]);
        let isa = VecIsa::detect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();

        let mut a = xs.clone();
        VecIsa::Scalar.gelu(&mut a);
        let mut b = xs.clone();
        isa.gelu(&mut b);
        assert_eq!(bits(&a), bits(&b));

        let mut a = xs.clone();
        VecIsa::Scalar.softcap(&mut a, 30.0);
        let mut b = xs.clone();
        isa.softcap(&mut b, 30.0);
        assert_eq!(bits(&a), bits(&b));

        let up: Vec<f32> = (0..xs.len()).map(|_| r.f32()).collect();
        let (mut a, mut b) = (vec![0.0; xs.len()], vec![0.0; xs.len()]);
        geglu_scalar(&xs, &up, &mut a);
        isa.geglu(&xs, &up, &mut b);
        assert_eq!(bits(&a), bits(&b));
    }
}
