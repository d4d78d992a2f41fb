//! The single-precision exponential of softmax and SiLU, vectorised, giving the bits of
//! the C library's `expf` on x86-64 glibc (which `f32::exp` calls there).
//!
//! That `expf` (from Arm's optimized routines, FMA build) works in double precision:
//! `z = x · 32/ln 2`, `k = round(z)` (by adding and subtracting `1.5 · 2^52`),
//! `r = z - k`, `s = 2^(k/32)` from a 32-entry table plus `k`'s high bits in the exponent,
//! and `exp(x) = s · (1 + c2 r + r² (c1 + c0 r))` with two fused multiply-adds, rounded
//! once to f32. [`expf`] replays those steps exactly, and the AVX2 kernel does them four
//! doubles at a time; inputs with `|x| >= 88` or NaN (the library's special-case branch)
//! go to `f32::exp` itself. So the vectorised softmax and SwiGLU give the same bits as the
//! scalar loops they replaced, and the outputs of the model do not move. (llama.cpp's own
//! vectorised exponential differs from the library's in the last bit often enough that,
//! used here, it moved near-tied top-1 choices against llama.cpp's reference logits.)

use super::exp_table::{fix_special, special, C0, C1, C2, INV_LN2_N, SHIFT, TAB};
use super::vec::VecIsa;

/// `exp(x)` in f32 by the algorithm of the module docs (the reference for the SIMD
/// kernel; equal to `f32::exp` on x86-64 glibc).
#[inline]
pub fn expf(x: f32) -> f32 {
    if special(x) {
        return x.exp();
    }
    let z = INV_LN2_N * f64::from(x);
    let kd = z + SHIFT;
    let ki = kd.to_bits();
    let kd = kd - SHIFT;
    let r = z - kd;
    let t = TAB[(ki % 32) as usize].wrapping_add(ki << 47);
    let s = f64::from_bits(t);
    let p = C0.mul_add(r, C1);
    let y = C2.mul_add(r, 1.0);
    let y = p.mul_add(r * r, y);
    (y * s) as f32
}

/// `x · sigmoid(x)` as `x / (1 + exp(-x))` with [`expf`].
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(-x))
}

impl VecIsa {
    /// `s[i] = exp(s[i] - mx)` with [`expf`] (the same bits on every ISA).
    pub fn exp_sub(self, s: &mut [f32], mx: f32) {
        match self {
            VecIsa::Scalar => exp_sub_scalar(s, mx),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `enabled` implies AVX-512 F was detected.
            VecIsa::Avx2 if super::vec512::enabled() => {
                let done = unsafe { super::exp512::exp_sub(s, mx) };
                exp_sub_scalar(&mut s[done..], mx);
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
            VecIsa::Avx2 => unsafe { avx2::exp_sub(s, mx) },
        }
    }

    /// `y[i] = silu(y[i])`, with the bits of [`silu`].
    pub fn silu_in_place(self, y: &mut [f32]) {
        match self {
            VecIsa::Scalar => y.iter_mut().for_each(|v| *v = silu(*v)),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected; source and
            // destination are the same `y.len()` values.
            VecIsa::Avx2 => unsafe { avx2::silu(y.as_ptr(), y.as_mut_ptr(), y.len()) },
        }
    }

    /// `out[i] = silu(x[i])` over the common length, with the bits of [`silu`].
    pub fn silu(self, x: &[f32], out: &mut [f32]) {
        let n = out.len().min(x.len());
        match self {
            VecIsa::Scalar => {
                for (o, &v) in out[..n].iter_mut().zip(&x[..n]) {
                    *o = silu(v);
                }
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected; both slices
            // hold `n` values.
            VecIsa::Avx2 => unsafe { avx2::silu(x.as_ptr(), out.as_mut_ptr(), n) },
        }
    }

    /// `out[i] = silu(gate[i]) * up[i]` over the common length, with [`silu`].
    pub fn swiglu(self, gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len().min(gate.len()).min(up.len());
        match self {
            VecIsa::Scalar => swiglu_scalar(&gate[..n], &up[..n], &mut out[..n]),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `enabled` implies AVX-512 F was detected.
            VecIsa::Avx2 if super::vec512::enabled() => {
                let done = unsafe { super::exp512::swiglu(&gate[..n], &up[..n], &mut out[..n]) };
                swiglu_scalar(&gate[done..n], &up[done..n], &mut out[done..n]);
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
            VecIsa::Avx2 => unsafe { avx2::swiglu(&gate[..n], &up[..n], &mut out[..n]) },
        }
    }
}

/// Scalar [`VecIsa::exp_sub`].
pub fn exp_sub_scalar(s: &mut [f32], mx: f32) {
    for v in s.iter_mut() {
        *v = expf(*v - mx);
    }
}

/// Scalar [`VecIsa::swiglu`] over equal-length slices.
pub fn swiglu_scalar(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((y, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *y = silu(g) * u;
    }
}

/// The eight-lane exponential, for the other vectorised activations.
#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::exp8;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// Four lanes of [`expf`] in double precision (no special-case inputs).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn exp4(x: __m128) -> __m128 {
        let shift = _mm256_set1_pd(SHIFT);
        let z = _mm256_mul_pd(_mm256_set1_pd(INV_LN2_N), _mm256_cvtps_pd(x));
        let kd = _mm256_add_pd(z, shift);
        let ki = _mm256_castpd_si256(kd);
        let r = _mm256_sub_pd(z, _mm256_sub_pd(kd, shift));
        let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        // SAFETY: every index is below 32, the table's length.
        let tab = unsafe { _mm256_i64gather_epi64::<8>(TAB.as_ptr().cast(), idx) };
        let s = _mm256_castsi256_pd(_mm256_add_epi64(tab, _mm256_slli_epi64::<47>(ki)));
        let p = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
        let y = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
        let y = _mm256_fmadd_pd(p, _mm256_mul_pd(r, r), y);
        _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
    }

    /// Eight lanes of [`expf`]; lanes with special inputs go to `f32::exp`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn exp8(x: __m256) -> __m256 {
        // |x| >= 88, infinities and NaN: the top 12 bits without the sign at or above 88's.
        let top = _mm256_and_si256(
            _mm256_srli_epi32::<20>(_mm256_castps_si256(x)),
            _mm256_set1_epi32(0x7ff),
        );
        let big = _mm256_cmpgt_epi32(top, _mm256_set1_epi32((88f32.to_bits() >> 20) as i32 - 1));
        let lo = exp4(_mm256_castps256_ps128(x));
        let hi = exp4(_mm256_extractf128_ps::<1>(x));
        let e = _mm256_set_m128(hi, lo);
        if _mm256_testz_si256(big, big) == 1 {
            return e;
        }
        let (mut v, mut xs) = ([0.0f32; 8], [0.0f32; 8]);
        // SAFETY: both arrays hold eight f32.
        unsafe {
            _mm256_storeu_ps(v.as_mut_ptr(), e);
            _mm256_storeu_ps(xs.as_mut_ptr(), x);
        }
        fix_special(&mut v, &xs);
        // SAFETY: as above.
        unsafe { _mm256_loadu_ps(v.as_ptr()) }
    }

    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_sub(s: &mut [f32], mx: f32) {
        let n = s.len();
        let p = s.as_mut_ptr();
        let m = _mm256_set1_ps(mx);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n values of `s`.
            unsafe {
                _mm256_storeu_ps(p.add(i), exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), m)))
            };
            i += 8;
        }
        exp_sub_scalar(&mut s[i..], mx);
    }

    /// `dst[i] = silu(src[i])` for `i < n`, the steps of [`super::silu`]: `-x` (exact),
    /// [`exp8`], `1 + e` and the division, each rounded as the scalar code rounds it.
    /// `src` may equal `dst` (each value is read before it is written).
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `src` and `dst` hold `n` values each.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu(src: *const f32, dst: *mut f32, n: usize) {
        let one = _mm256_set1_ps(1.0);
        let sign = _mm256_set1_ps(-0.0);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n values at both pointers.
            unsafe {
                let x = _mm256_loadu_ps(src.add(i));
                let e = exp8(_mm256_xor_ps(x, sign));
                _mm256_storeu_ps(dst.add(i), _mm256_div_ps(x, _mm256_add_ps(one, e)));
            }
            i += 8;
        }
        while i < n {
            // SAFETY: i < n.
            unsafe { *dst.add(i) = super::silu(*src.add(i)) };
            i += 1;
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; the slices have equal lengths.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        let one = _mm256_set1_ps(1.0);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n values of each slice.
            unsafe {
                let g = _mm256_loadu_ps(gate.as_ptr().add(i));
                let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
                let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
                let y = _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i)));
                _mm256_storeu_ps(out.as_mut_ptr().add(i), y);
            }
            i += 8;
        }
        swiglu_scalar(&gate[i..n], &up[i..n], &mut out[i..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    fn ulps(a: f32, b: f64) -> f64 {
        let ulp = f64::from(f32::EPSILON) * b.abs().max(f64::from(f32::MIN_POSITIVE));
        (f64::from(a) - b).abs() / ulp
    }

    /// Within one ulp of the exact exponential over the finite range; the edges saturate.
    #[test]
    fn expf_is_accurate_and_saturates() {
        let mut x = -103.0f32;
        let mut worst = 0.0f64;
        while x < 88.7 {
            worst = worst.max(ulps(expf(x), f64::from(x).exp()));
            x += 0.000_97;
        }
        assert!(worst <= 1.0, "worst error {worst} ulp");
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(200.0), f32::INFINITY);
        assert_eq!(expf(f32::INFINITY), f32::INFINITY);
        assert!(expf(f32::NAN).is_nan());
        let sub = expf(-100.0);
        assert!(sub > 0.0 && sub < f32::MIN_POSITIVE);
    }

    /// On x86-64 glibc with FMA (the library `f32::exp` calls there), [`expf`] is that
    /// function bit for bit: sampled over every 61st f32 below 88 in magnitude.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    fn expf_equals_the_c_library() {
        if !is_x86_feature_detected!("fma") {
            return;
        }
        let limit = 88f32.to_bits();
        let mut checked = 0u64;
        for sign in [0u32, 0x8000_0000] {
            for bits in (0..limit).step_by(61) {
                let x = f32::from_bits(bits | sign);
                assert_eq!(expf(x).to_bits(), x.exp().to_bits(), "x = {x:e}");
                checked += 1;
            }
        }
        assert!(checked > 30_000_000);
    }

    /// The SiLU kernels (in place and not) give [`silu`]'s bits, specials and tails too.
    #[test]
    fn silu_kernels_give_the_scalar_bits() {
        let mut r = Rng::new(23);
        let mut xs: Vec<f32> = (0..1003).map(|_| r.f32() * 60.0 - 30.0).collect();
        xs.extend([
            0.0,
            -0.0,
            88.5,
            -95.0,
            -200.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        let want: Vec<u32> = xs.iter().map(|&x| silu(x).to_bits()).collect();
        for isa in [VecIsa::Scalar, VecIsa::detect()] {
            for n in [0, 5, 8, 13, xs.len()] {
                let mut out = vec![f32::NAN; n];
                isa.silu(&xs[..n], &mut out);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want[..n], "{isa:?} n {n}");
                let mut y = xs[..n].to_vec();
                isa.silu_in_place(&mut y);
                let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want[..n], "{isa:?} in place, n {n}");
            }
        }
    }

    /// The SIMD kernels give the scalar bits, on the fast path and on lanes that leave it.
    #[test]
    fn simd_matches_scalar_bitwise() {
        let mut r = Rng::new(17);
        let mut xs: Vec<f32> = (0..1003).map(|_| r.f32() * 40.0).collect();
        xs.extend([
            -87.9,
            -88.0,
            -103.9,
            -150.0,
            f32::NEG_INFINITY,
            f32::NAN,
            90.0,
            0.0,
            -0.0,
            88.5,
            87.9,
        ]);
        let isa = VecIsa::detect();
        for mx in [0.0f32, 3.5, -2.0] {
            let mut a = xs.clone();
            let mut b = xs.clone();
            exp_sub_scalar(&mut a, mx);
            isa.exp_sub(&mut b, mx);
            for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                assert_eq!(p.to_bits(), q.to_bits(), "x = {} mx {mx}", xs[i]);
                assert_eq!(p.to_bits(), (xs[i] - mx).exp().to_bits());
            }
            // The AVX2 kernel too where the detected ISA runs the 512-bit one instead.
            #[cfg(target_arch = "x86_64")]
            if isa == VecIsa::Avx2 {
                let mut c = xs.clone();
                // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
                unsafe { avx2::exp_sub(&mut c, mx) };
                assert!(a.iter().zip(&c).all(|(p, q)| p.to_bits() == q.to_bits()));
            }
        }
        let up: Vec<f32> = (0..xs.len()).map(|_| r.f32()).collect();
        let gate: Vec<f32> = xs.iter().map(|x| x.clamp(-100.0, 100.0)).collect();
        let mut a = vec![0.0; xs.len()];
        let mut b = vec![0.0; xs.len()];
        swiglu_scalar(&gate, &up, &mut a);
        isa.swiglu(&gate, &up, &mut b);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn silu_values() {
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((silu(-20.0) + 20.0 * (-20f32).exp() / (1.0 + (-20f32).exp())).abs() < 1e-12);
        assert_eq!(silu(100.0), 100.0);
    }
}
