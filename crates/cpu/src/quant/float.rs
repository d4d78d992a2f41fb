//! F32, F16 and BF16 weight rows · f32 activations.
//!
//! The scalar kernel sums in element order; the AVX2 kernel keeps 32 FMA accumulators and
//! reduces them at the end, so the two differ by float rounding only.

use super::{DotError, Isa, IsaKind};
use half::{bf16, f16};

/// A float weight element that widens to f32 exactly.
pub(crate) trait FloatWeight: Copy {
    /// The value as f32.
    fn widen(self) -> f32;
    /// Eight consecutive values from `p` as f32 lanes.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `p` must point to 8 readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl FloatWeight for f32 {
    fn widen(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl FloatWeight for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
}

impl FloatWeight for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
    }
}

/// Scalar reference: `Σ w_i x_i` in element order.
pub(crate) fn dot_float_scalar<W: FloatWeight>(w: &[W], x: &[f32]) -> f32 {
    w.iter()
        .zip(x)
        .fold(0.0f32, |s, (&a, &b)| s + a.widen() * b)
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_float_avx2<W: FloatWeight>(w: &[W], x: &[f32]) -> f32 {
    use super::simd::hsum_ps;
    use std::arch::x86_64::*;
    let n = w.len().min(x.len());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 8k + 8 <= n elements remain in both slices.
            let wv = W::load8(w.as_ptr().add(i + 8 * k));
            let xv = _mm256_loadu_ps(x.as_ptr().add(i + 8 * k));
            *a = _mm256_fmadd_ps(wv, xv, *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        let wv = W::load8(w.as_ptr().add(i));
        acc[0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.as_ptr().add(i)), acc[0]);
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum_ps(v);
    for j in i..n {
        s += w[j].widen() * x[j];
    }
    s
}

/// Unchecked dispatch for the matmul driver (lengths equal by construction).
#[inline]
pub(crate) fn dot_float<W: FloatWeight>(isa: Isa, w: &[W], x: &[f32]) -> f32 {
    match isa.0 {
        IsaKind::Scalar => dot_float_scalar(w, x),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2`/`Vnni` values exist only after runtime detection (`Isa::avx2`).
        IsaKind::Avx2 | IsaKind::Vnni => unsafe { dot_float_avx2(w, x) },
    }
}

fn checked<W: FloatWeight>(isa: Isa, w: &[W], x: &[f32]) -> Result<f32, DotError> {
    if w.len() != x.len() {
        return Err(DotError::Length {
            weights: w.len(),
            activations: x.len(),
        });
    }
    Ok(dot_float(isa, w, x))
}

/// `Σ w_i x_i` for an f32 weight row; rows must have equal length.
pub fn dot_f32(isa: Isa, w: &[f32], x: &[f32]) -> Result<f32, DotError> {
    checked(isa, w, x)
}

/// `Σ w_i x_i` for an f16 weight row; rows must have equal length.
pub fn dot_f16(isa: Isa, w: &[f16], x: &[f32]) -> Result<f32, DotError> {
    checked(isa, w, x)
}

/// `Σ w_i x_i` for a bf16 weight row; rows must have equal length.
pub fn dot_bf16(isa: Isa, w: &[bf16], x: &[f32]) -> Result<f32, DotError> {
    checked(isa, w, x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{isas, rand_f32};

    /// Any summation order of n products is within `n * 2^-24 * Σ|w x|` of the exact sum
    /// (FMA only removes roundings); the assertion allows twice that.
    type DotFn<W> = fn(Isa, &[W], &[f32]) -> Result<f32, DotError>;

    fn check<W: FloatWeight>(narrow: fn(f32) -> W, f: DotFn<W>) {
        for n in [0, 1, 7, 8, 31, 32, 33, 896, 4864 + 5] {
            let w: Vec<W> = rand_f32(n, n as u64 + 1, 2.0)
                .into_iter()
                .map(narrow)
                .collect();
            let x = rand_f32(n, n as u64 + 7, 3.0);
            let exact: f64 = w
                .iter()
                .zip(&x)
                .map(|(a, b)| a.widen() as f64 * *b as f64)
                .sum();
            let mag: f64 = w
                .iter()
                .zip(&x)
                .map(|(a, b)| (a.widen() as f64 * *b as f64).abs())
                .sum();
            let bound = 2.0 * n as f64 * f32::EPSILON as f64 / 2.0 * mag;
            for isa in isas() {
                let got = f(isa, &w, &x).unwrap() as f64;
                assert!(
                    (got - exact).abs() <= bound,
                    "{isa:?} n={n}: {got} vs {exact}"
                );
            }
        }
        let w: Vec<W> = vec![narrow(1.0); 3];
        assert!(matches!(
            f(Isa::SCALAR, &w, &[1.0; 4]),
            Err(DotError::Length {
                weights: 3,
                activations: 4
            })
        ));
    }

    #[test]
    fn float_rows_match_f64() {
        check::<f32>(|v| v, dot_f32);
        check::<f16>(f16::from_f32, dot_f16);
        check::<bf16>(bf16::from_f32, dot_bf16);
    }
}
