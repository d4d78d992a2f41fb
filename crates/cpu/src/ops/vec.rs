//! f32 vector primitives for attention: dot product, `y += a * x` and `y *= a`, each as a
//! portable scalar reference beside an AVX2/FMA version chosen at run time.
//!
//! The AVX2 versions fuse multiply and add, so they differ from the scalar references by
//! rounding only (bounded in the tests). The choice depends on the CPU, never on the
//! thread count, so results stay identical for every `-t`.

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::row_isa::RowIsa;
#[cfg(target_arch = "x86_64")]
use super::rows::F32Rows;

/// Which implementation the primitives use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VecIsa {
    /// The portable scalar references.
    Scalar,
    /// AVX2 + FMA + F16C (constructed only after runtime detection; every AVX2 CPU
    /// has F16C, which the kernels over packed K/V rows widen halves with).
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
                if is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                {
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

    /// `out[i] = q · k[first + i*stride ..][..q.len()]` for every `i` (attention scores).
    /// `k` must hold every row read.
    #[inline]
    pub fn dot_rows(self, q: &[f32], k: &[f32], stride: usize, first: usize, out: &mut [f32]) {
        check_rows(q.len(), k.len(), stride, first, out.len());
        match self {
            VecIsa::Scalar => dot_rows_scalar(q, k, stride, first, out),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected; rows are in bounds.
            VecIsa::Avx2 => unsafe { avx2::dot_rows(q, k, stride, first, out) },
        }
    }

    /// [`Self::dot_rows`] for two query rows `qa`, `qb` of one length against the same
    /// keys, into `out_a` and `out_b` (of one length): bitwise two `dot_rows` calls, with
    /// each key loaded once for both rows where 512-bit registers allow.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn dot_rows2(
        self,
        qa: &[f32],
        qb: &[f32],
        k: &[f32],
        stride: usize,
        first: usize,
        out_a: &mut [f32],
        out_b: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if let Some(x) = RowIsa::new(self == VecIsa::Avx2, qa.len()) {
            if qa.len() == qb.len() && out_a.len() == out_b.len() {
                check_rows(qa.len(), k.len(), stride, first, out_a.len());
                // The rows are in bounds (checked above).
                let k = F32Rows::new(k, stride, first, out_a.len(), qa.len());
                x.dot_rows2(qa, qb, k, out_a, out_b);
                return;
            }
        }
        self.dot_rows(qa, k, stride, first, out_a);
        self.dot_rows(qb, k, stride, first, out_b);
    }

    /// [`Self::dot_rows`] for four query rows (of one length) against the same keys, into
    /// four outputs (of one length): bitwise four `dot_rows` calls, with each key loaded
    /// once for all four where 512-bit registers allow.
    #[inline]
    pub fn dot_rows4(
        self,
        q: [&[f32]; 4],
        k: &[f32],
        stride: usize,
        first: usize,
        out: [&mut [f32]; 4],
    ) {
        #[cfg(target_arch = "x86_64")]
        if let Some(x) = RowIsa::new(self == VecIsa::Avx2, q[0].len()) {
            if q.iter().all(|r| r.len() == q[0].len())
                && out.iter().all(|r| r.len() == out[0].len())
            {
                check_rows(q[0].len(), k.len(), stride, first, out[0].len());
                // The rows are in bounds (checked above).
                x.dot_rows4(
                    q,
                    F32Rows::new(k, stride, first, out[0].len(), q[0].len()),
                    out,
                );
                return;
            }
        }
        let [o0, o1, o2, o3] = out;
        self.dot_rows2(q[0], q[1], k, stride, first, o0, o1);
        self.dot_rows2(q[2], q[3], k, stride, first, o2, o3);
    }

    /// `o = Σ_i p[i] * v[first + i*stride ..][..o.len()]`, summed in `i` order from zero.
    /// `v` must hold every row read.
    #[inline]
    pub fn weighted_rows(self, p: &[f32], v: &[f32], stride: usize, first: usize, o: &mut [f32]) {
        o.fill(0.0);
        self.weighted_rows_acc(p, v, stride, first, o);
    }

    /// `o += Σ_i p[i] * v[first + i*stride ..][..o.len()]`, continuing each element's sum
    /// in `i` order: splitting the rows over consecutive calls gives the bits of one call.
    /// `v` must hold every row read.
    #[inline]
    pub fn weighted_rows_acc(
        self,
        p: &[f32],
        v: &[f32],
        stride: usize,
        first: usize,
        o: &mut [f32],
    ) {
        check_rows(o.len(), v.len(), stride, first, p.len());
        #[cfg(target_arch = "x86_64")]
        if let Some(x) = RowIsa::new(self == VecIsa::Avx2, o.len()) {
            // The rows are in bounds (checked above).
            x.weighted_rows_acc(p, F32Rows::new(v, stride, first, p.len(), o.len()), o);
            return;
        }
        match self {
            VecIsa::Scalar => weighted_rows_acc_scalar(p, v, stride, first, o),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected; rows are in bounds.
            VecIsa::Avx2 => unsafe { avx2::weighted_rows_acc(p, v, stride, first, o) },
        }
    }

    /// [`Self::weighted_rows_acc`] for two weight rows `pa`, `pb` (of one length) over the
    /// same value rows, into `oa` and `ob` (of one length): bitwise two calls, with each
    /// value row loaded once for both where 512-bit registers allow.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn weighted_rows_acc2(
        self,
        pa: &[f32],
        pb: &[f32],
        v: &[f32],
        stride: usize,
        first: usize,
        oa: &mut [f32],
        ob: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if let Some(x) = RowIsa::new(self == VecIsa::Avx2, oa.len()) {
            if pa.len() == pb.len() && oa.len() == ob.len() {
                check_rows(oa.len(), v.len(), stride, first, pa.len());
                // The rows are in bounds (checked above).
                let v = F32Rows::new(v, stride, first, pa.len(), oa.len());
                x.weighted_rows_acc2(pa, pb, v, oa, ob);
                return;
            }
        }
        self.weighted_rows_acc(pa, v, stride, first, oa);
        self.weighted_rows_acc(pb, v, stride, first, ob);
    }

    /// [`Self::weighted_rows_acc`] for four weight rows (of one length) over the same
    /// value rows, into four outputs (of one length): bitwise four calls, with each value
    /// row loaded once for all four where 512-bit registers allow (and four rows of
    /// accumulators fill both multiply-add ports where two wait on their latency).
    #[inline]
    pub fn weighted_rows_acc4(
        self,
        p: [&[f32]; 4],
        v: &[f32],
        stride: usize,
        first: usize,
        o: [&mut [f32]; 4],
    ) {
        #[cfg(target_arch = "x86_64")]
        if let Some(x) = RowIsa::new(self == VecIsa::Avx2, o[0].len()) {
            if p.iter().all(|r| r.len() == p[0].len()) && o.iter().all(|r| r.len() == o[0].len()) {
                check_rows(o[0].len(), v.len(), stride, first, p[0].len());
                // The rows are in bounds (checked above).
                x.weighted_rows_acc4(p, F32Rows::new(v, stride, first, p[0].len(), o[0].len()), o);
                return;
            }
        }
        let [o0, o1, o2, o3] = o;
        self.weighted_rows_acc2(p[0], p[1], v, stride, first, o0, o1);
        self.weighted_rows_acc2(p[2], p[3], v, stride, first, o2, o3);
    }

    /// `s[i] *= scale`, returning the largest result (NaN entries are passed over, as
    /// `f32::max` passes them; the maximum is exact in any order).
    #[inline]
    pub fn scale_max(self, s: &mut [f32], scale: f32) -> f32 {
        match self {
            VecIsa::Scalar => scale_max_scalar(s, scale),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
            VecIsa::Avx2 => unsafe { avx2::scale_max(s, scale) },
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

/// Reference [`VecIsa::scale_max`].
pub fn scale_max_scalar(s: &mut [f32], scale: f32) -> f32 {
    let mut mx = f32::NEG_INFINITY;
    for x in s {
        *x *= scale;
        mx = mx.max(*x);
    }
    mx
}

/// Panics unless rows `first + i*stride .. + width` for `i < n` lie inside `len`; callers
/// validate shapes first, so a failure here is a bug in the caller, not bad input.
#[inline]
fn check_rows(width: usize, len: usize, stride: usize, first: usize, n: usize) {
    let end = n.checked_sub(1).map_or(Some(0), |last| {
        last.checked_mul(stride)?
            .checked_add(first)?
            .checked_add(width)
    });
    assert!(end.is_some_and(|e| e <= len), "vector rows out of bounds");
}

/// Reference scores: one [`dot_scalar`] per row.
pub fn dot_rows_scalar(q: &[f32], k: &[f32], stride: usize, first: usize, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        let b = first + i * stride;
        *o = dot_scalar(q, &k[b..b + q.len()]);
    }
}

/// Reference weighted sum: zero, then one [`axpy_scalar`] per row in order.
pub fn weighted_rows_scalar(p: &[f32], v: &[f32], stride: usize, first: usize, o: &mut [f32]) {
    o.fill(0.0);
    weighted_rows_acc_scalar(p, v, stride, first, o);
}

/// Reference accumulating weighted sum: one [`axpy_scalar`] per row in order.
pub fn weighted_rows_acc_scalar(p: &[f32], v: &[f32], stride: usize, first: usize, o: &mut [f32]) {
    let hd = o.len();
    for (i, &w) in p.iter().enumerate() {
        let b = first + i * stride;
        axpy_scalar(o, w, &v[b..b + hd]);
    }
}

/// Reference `y += a * x`.
pub fn axpy_scalar(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::super::rows::F32Rows;
    use super::super::rows_avx2::{dot_rows_in, weighted_rows_acc_in};

    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_max(s: &mut [f32], scale: f32) -> f32 {
        let (n, p) = (s.len(), s.as_mut_ptr());
        let sc = _mm256_set1_ps(scale);
        let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n.
            unsafe {
                let x = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), sc);
                _mm256_storeu_ps(p.add(i), x);
                // `max(x, mx)` yields `mx` where `x` is NaN, as `f32::max` does.
                mx = _mm256_max_ps(x, mx);
            }
            i += 8;
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: eight lanes into eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), mx) };
        let mut m = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        for x in &mut s[i..] {
            *x *= scale;
            m = m.max(*x);
        }
        m
    }

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

    /// Scores of `q` against key rows `first + i*stride`: [`dot_rows_in`] where the head
    /// is whole registers, else one [`dot`] per row.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; every row read lies inside `k`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_rows(q: &[f32], k: &[f32], stride: usize, first: usize, out: &mut [f32]) {
        let hd = q.len();
        if hd.is_multiple_of(8) {
            // SAFETY: the rows are inside `k` (caller).
            unsafe { dot_rows_in(q, F32Rows::new(k, stride, first, out.len(), hd), 0, out) };
            return;
        }
        for (i, o) in out.iter_mut().enumerate() {
            let b = first + i * stride;
            *o = dot(q, &k[b..b + hd]);
        }
    }

    /// `o += Σ_i p[i] * v[first + i*stride ..][..o.len()]`: [`weighted_rows_acc_in`]
    /// where the head is whole registers, else the scalar reference.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; every row read lies inside `v`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn weighted_rows_acc(
        p: &[f32],
        v: &[f32],
        stride: usize,
        first: usize,
        o: &mut [f32],
    ) {
        if !o.len().is_multiple_of(8) {
            super::weighted_rows_acc_scalar(p, v, stride, first, o);
            return;
        }
        // SAFETY: the rows are inside `v` (caller).
        unsafe { weighted_rows_acc_in(p, F32Rows::new(v, stride, first, p.len(), o.len()), 0, o) };
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
    use minfer_testkit::Rng;

    #[test]
    fn scalar_dot_matches_f64_and_simd_stays_within_rounding() {
        let mut r = Rng::new(1);
        for n in [0, 1, 7, 8, 15, 16, 17, 64, 100, 128] {
            let (a, b) = (r.vec(n, 1.0), r.vec(n, 1.0));
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
            let x = r.vec(n, 1.0);
            let y0 = r.vec(n, 1.0);
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
    fn row_primitives_match_their_references() {
        let mut r = Rng::new(4);
        for (hd, n) in [(64, 19), (128, 8), (16, 3), (12, 9), (64, 0)] {
            let stride = hd * 2 + 5;
            let k = r.vec(stride * n + hd, 1.0);
            let q = r.vec(hd, 1.0);
            let p = r.vec(n, 1.0);
            let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
            dot_rows_scalar(&q, &k, stride, 3, &mut a);
            VecIsa::detect().dot_rows(&q, &k, stride, 3, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-5 * hd as f32, "hd {hd}: {x} vs {y}");
            }
            let (mut oa, mut ob) = (vec![9.0; hd], vec![9.0; hd]);
            weighted_rows_scalar(&p, &k, stride, 3, &mut oa);
            VecIsa::detect().weighted_rows(&p, &k, stride, 3, &mut ob);
            for (x, y) in oa.iter().zip(&ob) {
                assert!(
                    (x - y).abs() <= 1e-5 * n.max(1) as f32,
                    "hd {hd}: {x} vs {y}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn rows_past_the_end_are_caught() {
        let mut out = [0.0; 2];
        VecIsa::detect().dot_rows(&[0.0; 8], &[0.0; 15], 8, 0, &mut out);
    }

    #[test]
    fn scalar_isa_is_the_reference() {
        let mut r = Rng::new(3);
        let (a, b) = (r.vec(37, 1.0), r.vec(37, 1.0));
        assert_eq!(
            VecIsa::Scalar.dot(&a, &b).to_bits(),
            dot_scalar(&a, &b).to_bits()
        );
        let mut y = vec![1.0; 3];
        VecIsa::Scalar.scale(&mut y, 0.5);
        assert_eq!(y, vec![0.5; 3]);
    }

    /// The detected ISA scales and finds the maximum with the reference's bits, for
    /// lengths with and without a tail, with a NaN passed over and all-negative rows.
    #[test]
    fn scale_max_matches_the_reference() {
        let mut r = Rng::new(9);
        for n in [1, 7, 8, 13, 64] {
            for nan in [None, Some(0), Some(n - 1)] {
                let mut a = r.vec(n, 4.0);
                a.iter_mut().for_each(|x| *x -= 10.0);
                if let Some(i) = nan {
                    a[i] = f32::NAN;
                }
                let mut b = a.clone();
                let ma = VecIsa::detect().scale_max(&mut a, 0.125);
                let mb = scale_max_scalar(&mut b, 0.125);
                assert_eq!(ma.to_bits(), mb.to_bits(), "n {n}, nan at {nan:?}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b));
                assert!(n == 1 && nan.is_some() || ma.is_finite() && ma < 0.0);
            }
        }
    }
}

/// The 512-bit attention primitives (`vec512`) against the AVX2 ones, bit for bit.
#[cfg(all(test, target_arch = "x86_64"))]
mod tests512 {
    use super::{avx2, VecIsa};
    use crate::quant::testutil::rand_f32;

    /// Two- and four-row scores equal AVX2 `dot_rows` calls bit for bit, for head sizes
    /// with and without the 512-bit path, key counts with and without a tail, and strided rows.
    #[test]
    fn multi_row_scores_are_the_avx2_bits() {
        if !super::super::vec512::enabled() {
            return;
        }
        for hd in [8, 64, 128, 256, 264, 72, 12] {
            for n in [1, 7, 8, 13, 64] {
                let stride = hd + 16;
                let k = rand_f32(stride * (n + 2), hd as u64 + n as u64, 1.0);
                let (qa, qb) = (rand_f32(hd, 1, 1.0), rand_f32(hd, 2, 1.0));
                let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
                VecIsa::Avx2.dot_rows2(&qa, &qb, &k, stride, 5, &mut a, &mut b);
                let (mut wa, mut wb) = (vec![0.0; n], vec![0.0; n]);
                // SAFETY: `enabled` implies AVX2 and FMA; rows are in bounds.
                unsafe {
                    avx2::dot_rows(&qa, &k, stride, 5, &mut wa);
                    avx2::dot_rows(&qb, &k, stride, 5, &mut wb);
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&wa), "row a, hd={hd} n={n}");
                assert_eq!(bits(&b), bits(&wb), "row b, hd={hd} n={n}");
                // Four rows at once: each the bits of its own AVX2 call.
                let qs: Vec<Vec<f32>> = (0..4).map(|r| rand_f32(hd, 7 + r, 1.0)).collect();
                let mut outs = [(); 4].map(|()| vec![0.0; n]);
                let [o0, o1, o2, o3] = outs.each_mut().map(|o| o.as_mut_slice());
                let q4 = [&qs[0][..], &qs[1][..], &qs[2][..], &qs[3][..]];
                VecIsa::Avx2.dot_rows4(q4, &k, stride, 5, [o0, o1, o2, o3]);
                for (r, (qr, got)) in qs.iter().zip(&outs).enumerate() {
                    let mut want = vec![0.0; n];
                    // SAFETY: as above.
                    unsafe { avx2::dot_rows(qr, &k, stride, 5, &mut want) };
                    assert_eq!(bits(got), bits(&want), "four rows, row {r}, hd={hd} n={n}");
                }
            }
        }
    }

    /// The 512-bit weighted sum equals the AVX2 one bit for bit.
    #[test]
    fn weighted_sums_are_the_avx2_bits() {
        if !super::super::vec512::enabled() {
            return;
        }
        for hd in [8, 64, 128, 256, 72, 136] {
            for n in [1, 9, 64] {
                let stride = hd + 8;
                let v = rand_f32(stride * (n + 1), hd as u64 * 7 + n as u64, 1.0);
                let p = rand_f32(n, 3, 1.0);
                let start = rand_f32(hd, 4, 1.0);
                let (mut a, mut b) = (start.clone(), start.clone());
                VecIsa::Avx2.weighted_rows_acc(&p, &v, stride, 3, &mut a);
                // SAFETY: `enabled` implies AVX2 and FMA; rows are in bounds.
                unsafe { avx2::weighted_rows_acc(&p, &v, stride, 3, &mut b) };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&b), "hd={hd} n={n}");
                // Two rows at once: each the bits of its own AVX2 call.
                let p2 = rand_f32(n, 5, 1.0);
                let (mut c, mut d) = (start.clone(), start.clone());
                VecIsa::Avx2.weighted_rows_acc2(&p, &p2, &v, stride, 3, &mut c, &mut d);
                let mut e = start.clone();
                // SAFETY: as above.
                unsafe { avx2::weighted_rows_acc(&p2, &v, stride, 3, &mut e) };
                assert_eq!(bits(&c), bits(&b), "pair row a, hd={hd} n={n}");
                assert_eq!(bits(&d), bits(&e), "pair row b, hd={hd} n={n}");
                // Four rows at once: each the bits of its own AVX2 call.
                let ps: Vec<Vec<f32>> = (0..4).map(|r| rand_f32(n, 11 + r, 1.0)).collect();
                let mut outs = [(); 4].map(|()| start.clone());
                let [o0, o1, o2, o3] = outs.each_mut().map(|o| o.as_mut_slice());
                let p4 = [&ps[0][..], &ps[1][..], &ps[2][..], &ps[3][..]];
                VecIsa::Avx2.weighted_rows_acc4(p4, &v, stride, 3, [o0, o1, o2, o3]);
                for (r, (pr, got)) in ps.iter().zip(&outs).enumerate() {
                    let mut want = start.clone();
                    // SAFETY: as above.
                    unsafe { avx2::weighted_rows_acc(pr, &v, stride, 3, &mut want) };
                    assert_eq!(bits(got), bits(&want), "four rows, row {r}, hd={hd} n={n}");
                }
            }
        }
    }
}
