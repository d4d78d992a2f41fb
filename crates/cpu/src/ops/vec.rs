//! f32 vector primitives for attention: dot product, `y += a * x` and `y *= a`, each as a
//! portable scalar reference beside an AVX2/FMA version chosen at run time.
//!
//! The AVX2 versions fuse multiply and add, so they differ from the scalar references by
//! rounding only (bounded in the tests). The choice depends on the CPU, never on the
//! thread count, so results stay identical for every `-t`.

use std::sync::OnceLock;

/// Which implementation the primitives use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VecIsa {
    /// The portable scalar references.
    Scalar,
    /// AVX2 + FMA (constructed only after runtime detection).
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl VecIsa {
    /// The best implementation this CPU supports, detected once.
    pub fn detect() -> VecIsa {
        static BEST: OnceLock<VecIsa> = OnceLock::new();
        *BEST.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    return VecIsa::Avx2;
                }
            }
            VecIsa::Scalar
        })
    }

    /// `Σ a[i] * b[i]` over the common length.
    #[inline]
    pub fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        match self {
            VecIsa::Scalar => dot_scalar(&a[..n], &b[..n]),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
            VecIsa::Avx2 => unsafe { avx2::dot(&a[..n], &b[..n]) },
        }
    }

    /// `y[i] += a * x[i]` over the common length.
    #[inline]
    pub fn axpy(self, y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        match self {
            VecIsa::Scalar => axpy_scalar(&mut y[..n], a, &x[..n]),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
            VecIsa::Avx2 => unsafe { avx2::axpy(&mut y[..n], a, &x[..n]) },
        }
    }

    /// `y[i] *= a`.
    #[inline]
    pub fn scale(self, y: &mut [f32], a: f32) {
        // A plain loop vectorizes well and rounds identically everywhere.
        for v in y {
            *v *= a;
        }
    }
}

/// Reference dot product: eight lane sums over blocks of eight, reduced pairwise, then
/// the tail in order.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        sum += x * y;
    }
    sum
}

/// Reference `y += a * x`.
pub fn axpy_scalar(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// # Safety
    /// AVX2 and FMA must be available; `a` and `b` have equal lengths.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        // SAFETY (all loads): every index read is below `n`.
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                _mm256_loadu_ps(pb.add(i + 8)),
                acc1,
            );
            i += 16;
        }
        if i + 8 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
        let acc = _mm256_add_ps(acc0, acc1);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
        let mut sum = _mm_cvtss_f32(s1);
        while i < n {
            sum += *pa.add(i) * *pb.add(i);
            i += 1;
        }
        sum
    }

    /// # Safety
    /// AVX2 and FMA must be available; `y` and `x` have equal lengths.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len();
        let (py, px) = (y.as_mut_ptr(), x.as_ptr());
        let va = _mm256_set1_ps(a);
        let mut i = 0;
        // SAFETY (all accesses): every index touched is below `n`.
        while i + 8 <= n {
            let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
            _mm256_storeu_ps(py.add(i), v);
            i += 8;
        }
        while i < n {
            *py.add(i) += a * *px.add(i);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::Rng;

    #[test]
    fn scalar_dot_matches_f64_and_simd_stays_within_rounding() {
        let mut r = Rng::new(1);
        for n in [0, 1, 7, 8, 15, 16, 17, 64, 100, 128] {
            let (a, b) = (r.vec(n), r.vec(n));
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let bound = 1e-6 * (n as f64 + 1.0);
            assert!((dot_scalar(&a, &b) as f64 - exact).abs() <= bound, "n={n}");
            let d = VecIsa::detect().dot(&a, &b) as f64;
            assert!((d - exact).abs() <= bound, "n={n}: {d} vs {exact}");
        }
    }

    #[test]
    fn axpy_matches_scalar_within_one_rounding() {
        let mut r = Rng::new(2);
        for n in [1, 5, 8, 9, 64, 67] {
            let x = r.vec(n);
            let y0 = r.vec(n);
            let mut ys = y0.clone();
            axpy_scalar(&mut ys, 0.37, &x);
            let mut yv = y0.clone();
            VecIsa::detect().axpy(&mut yv, 0.37, &x);
            for (a, b) in ys.iter().zip(&yv) {
                assert!(
                    (a - b).abs() <= 2.0 * f32::EPSILON * a.abs().max(1.0),
                    "{a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn scalar_isa_is_the_reference() {
        let mut r = Rng::new(3);
        let (a, b) = (r.vec(37), r.vec(37));
        assert_eq!(
            VecIsa::Scalar.dot(&a, &b).to_bits(),
            dot_scalar(&a, &b).to_bits()
        );
        let mut y = vec![1.0; 3];
        VecIsa::Scalar.scale(&mut y, 0.5);
        assert_eq!(y, vec![0.5; 3]);
    }
}
