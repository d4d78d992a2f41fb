//! The gated delta rule's per-row steps in two passes over a state row instead of four:
//! `decay then dot with k`, and `add delta * k then dot with q`. Each fused step gives
//! the bits of the two [`VecIsa`] primitives it replaces, run one after the other (the
//! same products, the same accumulators in the same order, the same tails), so the
//! recurrence's results do not change; only the row is loaded and stored half as often.

use super::vec::VecIsa;

impl VecIsa {
    /// `y[i] *= a`, then returns `Σ y[i] * x[i]`: the bits of [`VecIsa::scale`] followed
    /// by [`VecIsa::dot`]. `y` and `x` have equal lengths.
    #[inline]
    pub fn scale_dot(self, y: &mut [f32], a: f32, x: &[f32]) -> f32 {
        assert_eq!(y.len(), x.len(), "scale_dot lengths");
        match self {
            VecIsa::Scalar => {
                self.scale(y, a);
                self.dot(y, x)
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected; lengths checked.
            VecIsa::Avx2 => unsafe { avx2::scale_dot(y, a, x) },
        }
    }

    /// `y[i] += a * x[i]`, then returns `Σ y[i] * z[i]`: the bits of [`VecIsa::axpy`]
    /// followed by [`VecIsa::dot`]. `y`, `x` and `z` have equal lengths.
    #[inline]
    pub fn axpy_dot(self, y: &mut [f32], a: f32, x: &[f32], z: &[f32]) -> f32 {
        assert!(y.len() == x.len() && y.len() == z.len(), "axpy_dot lengths");
        match self {
            VecIsa::Scalar => {
                self.axpy(y, a, x);
                self.dot(y, z)
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected; lengths checked.
            VecIsa::Avx2 => unsafe { avx2::axpy_dot(y, a, x, z) },
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// The horizontal sum of [`super::super::vec`]'s AVX2 dot: `acc0 + acc1`, then halves.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(acc0: __m256, acc1: __m256) -> f32 {
        let acc = _mm256_add_ps(acc0, acc1);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        _mm_cvtss_f32(s1)
    }

    /// # Safety
    /// AVX2 and FMA must be available; `y` and `x` have equal lengths.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_dot(y: &mut [f32], a: f32, x: &[f32]) -> f32 {
        let n = y.len();
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(a);
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // SAFETY (all accesses): every index touched is below `n`.
        unsafe {
            while i + 16 <= n {
                let y0 = _mm256_mul_ps(_mm256_loadu_ps(py.add(i)), va);
                let y1 = _mm256_mul_ps(_mm256_loadu_ps(py.add(i + 8)), va);
                _mm256_storeu_ps(py.add(i), y0);
                _mm256_storeu_ps(py.add(i + 8), y1);
                acc0 = _mm256_fmadd_ps(y0, _mm256_loadu_ps(px.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(y1, _mm256_loadu_ps(px.add(i + 8)), acc1);
                i += 16;
            }
            if i + 8 <= n {
                let y0 = _mm256_mul_ps(_mm256_loadu_ps(py.add(i)), va);
                _mm256_storeu_ps(py.add(i), y0);
                acc0 = _mm256_fmadd_ps(y0, _mm256_loadu_ps(px.add(i)), acc0);
                i += 8;
            }
            let mut sum = hsum(acc0, acc1);
            while i < n {
                *py.add(i) *= a;
                sum += *py.add(i) * *px.add(i);
                i += 1;
            }
            sum
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; `y`, `x` and `z` have equal lengths.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy_dot(y: &mut [f32], a: f32, x: &[f32], z: &[f32]) -> f32 {
        let n = y.len();
        let (py, px, pz) = (y.as_mut_ptr(), x.as_ptr(), z.as_ptr());
        let va = _mm256_set1_ps(a);
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // SAFETY (all accesses): every index touched is below `n`.
        unsafe {
            while i + 16 <= n {
                let y0 =
                    _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                let y1 = _mm256_fmadd_ps(
                    va,
                    _mm256_loadu_ps(px.add(i + 8)),
                    _mm256_loadu_ps(py.add(i + 8)),
                );
                _mm256_storeu_ps(py.add(i), y0);
                _mm256_storeu_ps(py.add(i + 8), y1);
                acc0 = _mm256_fmadd_ps(y0, _mm256_loadu_ps(pz.add(i)), acc0);
                acc1 = _mm256_fmadd_ps(y1, _mm256_loadu_ps(pz.add(i + 8)), acc1);
                i += 16;
            }
            if i + 8 <= n {
                let y0 =
                    _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
                _mm256_storeu_ps(py.add(i), y0);
                acc0 = _mm256_fmadd_ps(y0, _mm256_loadu_ps(pz.add(i)), acc0);
                i += 8;
            }
            let mut sum = hsum(acc0, acc1);
            while i < n {
                *py.add(i) += a * *px.add(i);
                sum += *py.add(i) * *pz.add(i);
                i += 1;
            }
            sum
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    /// Each fused step gives the bits (result and row) of the two primitives it replaces,
    /// on every ISA, for lengths that exercise every loop and tail.
    #[test]
    fn fused_steps_give_the_bits_of_the_primitives() {
        let mut r = Rng::new(9);
        let isas = [VecIsa::Scalar, VecIsa::detect()];
        for n in [0, 1, 7, 8, 9, 15, 16, 17, 24, 31, 64, 100, 128] {
            let (x, z, y0) = (r.vec(n, 1.0), r.vec(n, 1.0), r.vec(n, 1.0));
            for isa in isas {
                let mut want = y0.clone();
                isa.scale(&mut want, 0.83);
                let d = isa.dot(&want, &x);
                let mut got = y0.clone();
                assert_eq!(
                    isa.scale_dot(&mut got, 0.83, &x).to_bits(),
                    d.to_bits(),
                    "{n}"
                );
                assert_eq!(got, want, "scale_dot row, n {n}");

                let mut want = y0.clone();
                isa.axpy(&mut want, -0.41, &x);
                let d = isa.dot(&want, &z);
                let mut got = y0.clone();
                let e = isa.axpy_dot(&mut got, -0.41, &x, &z);
                assert_eq!(e.to_bits(), d.to_bits(), "axpy_dot n {n}");
                assert_eq!(got, want, "axpy_dot row, n {n}");
            }
        }
    }
}
