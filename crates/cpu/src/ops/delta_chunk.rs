//! The gated delta rule a chunk of tokens at a time: the chunked form device engines
//! use for prefill, here for the CPU. Within a chunk of `c` tokens of one sequence the
//! state's reads, the tokens' corrections of each other and the state's update become
//! three small matrix products and a triangular solve, instead of two passes over the
//! state matrix per token.
//!
//! Per value head, with `G_t` the running sum of the chunk's log decays
//! (`g = softplus(alpha) * a`), `b_t = sigmoid(beta_t)` and `S` the state as it entered
//! the chunk (one row per value dimension):
//!
//! ```text
//! u_t = b_t (v_t - e^{G_t} S k_t) - sum_{s<t} b_t e^{G_t - G_s} (k_t . k_s) u_s
//! o_t = (e^{G_t} S q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) u_s) / sqrt(s_k)
//! S  <- e^{G_c} S + sum_s e^{G_c - G_s} u_s k_s^T
//! ```
//!
//! This is the token-by-token recurrence regrouped, so the two agree up to rounding
//! (bounded in the tests), not bit for bit. Every value here is one fixed sequence of
//! fused multiply-adds whatever the vector width, so the SIMD instantiations give the
//! portable one's bits, and no value depends on the thread count.

use super::vec::VecIsa;

/// A chunk's sizes: key and value head sizes, tokens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub sk: usize,
    pub sv: usize,
    pub c: usize,
}

/// One head's chunk: the inputs the caller fills, the output, and the intermediates,
/// kept across chunks and heads so a prompt allocates them once per thread.
#[derive(Default)]
pub(crate) struct ChunkScratch {
    /// `[2c][sk]`: the chunk's L2-normalised keys, then its queries (caller fills).
    pub kq: Vec<f32>,
    /// `[c][sv]`: the values (caller fills).
    pub v: Vec<f32>,
    /// `[c]`: each token's log decay `g` (caller fills; made running sums here).
    pub g: Vec<f32>,
    /// `[c]`: each token's write strength `b` (caller fills).
    pub b: Vec<f32>,
    /// `[c][sv]`: the outputs, scaled (read by the caller).
    pub o: Vec<f32>,
    /// `[sk][2c]`: `kq` transposed.
    xt: Vec<f32>,
    /// `[sv][2c]`: `S k_t`, then `S q_t`.
    p: Vec<f32>,
    /// `[2c][c]`: `k_t . k_s`, then `q_t . k_s`.
    m: Vec<f32>,
    /// `[c][c]`: `e^{G_t - G_s}` for `s <= t`.
    d: Vec<f32>,
    /// `[c][sv]`: the corrected writes `u_t`.
    u: Vec<f32>,
    /// `[sv][c]`: `e^{G_c - G_s} u_s`, transposed.
    uw: Vec<f32>,
}

impl ChunkScratch {
    /// Sizes the caller-filled parts for `d` (contents unspecified until filled).
    pub(crate) fn shape(&mut self, d: Dims) {
        self.kq.resize(2 * d.c * d.sk, 0.0);
        self.v.resize(d.c * d.sv, 0.0);
        self.g.resize(d.c, 0.0);
        self.b.resize(d.c, 0.0);
        self.o.resize(d.c * d.sv, 0.0);
    }
}

/// Advances `state` (`[sv][sk]`) over one chunk whose inputs `s` holds (see
/// [`ChunkScratch`]), leaving the chunk's outputs, times `scale`, in `s.o`.
pub(crate) fn chunk_step(
    isa: VecIsa,
    s: &mut ChunkScratch,
    d: Dims,
    scale: f32,
    state: &mut [f32],
) {
    assert!(
        d.c > 0 && state.len() == d.sv * d.sk && s.kq.len() == 2 * d.c * d.sk,
        "chunk_step shapes"
    );
    match isa {
        VecIsa::Scalar => body::<Portable>(s, d, scale, state),
        #[cfg(target_arch = "x86_64")]
        VecIsa::Avx2 => {
            if wide() {
                // SAFETY: AVX-512F was detected (and AVX2 and FMA, which `Avx2` implies).
                unsafe { body_avx512(s, d, scale, state) }
            } else {
                // SAFETY: `Avx2` exists only after AVX2 and FMA were detected.
                unsafe { body_avx2(s, d, scale, state) }
            }
        }
    }
}

/// Whether the CPU has 512-bit vectors (wider accumulator tiles; the same bits).
#[cfg(target_arch = "x86_64")]
fn wide() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| is_x86_feature_detected!("avx512f"))
}

/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn body_avx2(s: &mut ChunkScratch, d: Dims, scale: f32, state: &mut [f32]) {
    body::<x86::Avx2>(s, d, scale, state);
}

/// # Safety
/// AVX-512F, AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn body_avx512(s: &mut ChunkScratch, d: Dims, scale: f32, state: &mut [f32]) {
    body::<x86::Avx512>(s, d, scale, state);
}

/// The two primitives the chunk is made of, per instruction set; every implementation
/// gives [`Portable`]'s bits.
trait Kernels {
    /// `c[r][x] = (init * c[r][x], or 0) + sum_p a[r][p] * b[p][x]` for `[n, k, w]` =
    /// rows, inner length, columns, each value accumulated in `p` order by fused
    /// multiply-adds.
    fn gemm(a: Mat<'_>, b: Mat<'_>, c: MatMut<'_>, dims: [usize; 3], init: Option<f32>);
    /// `y[i] = a * x[i] + y[i]`, fused.
    fn axpy(y: &mut [f32], a: f32, x: &[f32]);
}

/// The portable kernels (and the scalar reference of the others).
struct Portable;

impl Kernels for Portable {
    fn gemm(a: Mat<'_>, b: Mat<'_>, c: MatMut<'_>, [n, k, w]: [usize; 3], init: Option<f32>) {
        for r in 0..n {
            edge(&a, &b, &mut *c.v, c.ld, r, 0..w, k, init);
        }
    }

    fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        for (y, &x) in y.iter_mut().zip(x) {
            *y = a.mul_add(x, *y);
        }
    }
}

/// The chunk's steps, compiled into each caller's instruction set.
#[inline(always)]
fn body<K: Kernels>(s: &mut ChunkScratch, d: Dims, scale: f32, state: &mut [f32]) {
    let Dims { sk, sv, c } = d;
    let c2 = 2 * c;
    // Running log decays, and the decay between every pair of the chunk's tokens.
    for t in 1..c {
        s.g[t] += s.g[t - 1];
    }
    s.d.clear();
    s.d.resize(c * c, 0.0);
    for t in 0..c {
        for u in 0..=t {
            s.d[t * c + u] = (s.g[t] - s.g[u]).exp();
        }
    }
    s.xt.resize(sk * c2, 0.0);
    for (r, row) in s.kq.chunks_exact(sk).enumerate() {
        for (i, &x) in row.iter().enumerate() {
            s.xt[i * c2 + r] = x;
        }
    }
    // S k_t and S q_t: [sv][sk] x [sk][2c].
    s.p.resize(sv * c2, 0.0);
    K::gemm(
        Mat::new(state, sk),
        Mat::new(&s.xt, c2),
        MatMut::new(&mut s.p, c2),
        [sv, sk, c2],
        None,
    );
    // k_t . k_s and q_t . k_s: [2c][sk] x [sk][c] (the keys' half of `xt`).
    s.m.resize(c2 * c, 0.0);
    K::gemm(
        Mat::new(&s.kq, sk),
        Mat::new(&s.xt, c2),
        MatMut::new(&mut s.m, c),
        [c2, sk, c],
        None,
    );
    // The corrected writes, by forward substitution in token order.
    s.u.resize(c * sv, 0.0);
    for t in 0..c {
        let (done, rest) = s.u.split_at_mut(t * sv);
        let ut = &mut rest[..sv];
        let (eg, bt) = (s.g[t].exp(), s.b[t]);
        for (j, x) in ut.iter_mut().enumerate() {
            *x = bt * (s.v[t * sv + j] - eg * s.p[j * c2 + t]);
        }
        for (u, us) in done.chunks_exact(sv).enumerate() {
            K::axpy(ut, -(bt * s.d[t * c + u] * s.m[t * c + u]), us);
        }
    }
    // The outputs.
    for t in 0..c {
        let ot = &mut s.o[t * sv..(t + 1) * sv];
        let eg = s.g[t].exp();
        for (j, x) in ot.iter_mut().enumerate() {
            *x = eg * s.p[j * c2 + c + t];
        }
        for (u, us) in s.u.chunks_exact(sv).take(t + 1).enumerate() {
            K::axpy(ot, s.d[t * c + u] * s.m[(c + t) * c + u], us);
        }
        ot.iter_mut().for_each(|x| *x *= scale);
    }
    // The state: e^{G_c} S + (weighted u)^T k.
    let last = s.g[c - 1];
    s.uw.resize(sv * c, 0.0);
    for (u, us) in s.u.chunks_exact(sv).enumerate() {
        let w = (last - s.g[u]).exp();
        for (j, &x) in us.iter().enumerate() {
            s.uw[j * c + u] = w * x;
        }
    }
    K::gemm(
        Mat::new(&s.uw, c),
        Mat::new(&s.kq, sk),
        MatMut::new(state, sk),
        [sv, c, sk],
        Some(last.exp()),
    );
}

/// A row-major matrix view: values and row stride.
struct Mat<'a> {
    v: &'a [f32],
    ld: usize,
}

impl<'a> Mat<'a> {
    fn new(v: &'a [f32], ld: usize) -> Self {
        Mat { v, ld }
    }

    /// `n` values of row `r` from column `x`.
    #[inline(always)]
    fn row(&self, r: usize, x: usize, n: usize) -> &'a [f32] {
        &self.v[r * self.ld + x..r * self.ld + x + n]
    }
}

/// A mutable row-major matrix view.
struct MatMut<'a> {
    v: &'a mut [f32],
    ld: usize,
}

impl<'a> MatMut<'a> {
    fn new(v: &'a mut [f32], ld: usize) -> Self {
        MatMut { v, ld }
    }
}

/// The gemm's values of row `r` in columns `xs`, one at a time.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn edge(
    a: &Mat<'_>,
    b: &Mat<'_>,
    c: &mut [f32],
    ld: usize,
    r: usize,
    xs: std::ops::Range<usize>,
    k: usize,
    init: Option<f32>,
) {
    let row = a.row(r, 0, k);
    for x in xs {
        let mut acc = init.map_or(0.0, |f| f * c[r * ld + x]);
        for (p, &av) in row.iter().enumerate() {
            acc = av.mul_add(b.v[p * b.ld + x], acc);
        }
        c[r * ld + x] = acc;
    }
}

/// The x86 kernels: tiles of four rows by 16 (AVX2) or 32 (AVX-512) columns held in
/// registers, one broadcast of `a` and one fused multiply-add per row and vector.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{edge, Kernels, Mat, MatMut};
    use std::arch::x86_64::*;

    /// Rows per tile.
    const R: usize = 4;

    pub(super) struct Avx2;
    pub(super) struct Avx512;

    impl Kernels for Avx2 {
        #[inline(always)]
        fn gemm(a: Mat<'_>, b: Mat<'_>, c: MatMut<'_>, dims: [usize; 3], init: Option<f32>) {
            // SAFETY: `Avx2` is used only inside functions compiled after AVX2 and FMA
            // were detected (`body_avx2`, `body_avx512`).
            unsafe { gemm(a, b, c, dims, init, false) }
        }

        #[inline(always)]
        fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
            // SAFETY: as above.
            unsafe { axpy(y, a, x) }
        }
    }

    impl Kernels for Avx512 {
        #[inline(always)]
        fn gemm(a: Mat<'_>, b: Mat<'_>, c: MatMut<'_>, dims: [usize; 3], init: Option<f32>) {
            // SAFETY: `Avx512` is used only inside `body_avx512`, reached after AVX-512F,
            // AVX2 and FMA were detected.
            unsafe { gemm(a, b, c, dims, init, true) }
        }

        #[inline(always)]
        fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
            // SAFETY: as above.
            unsafe { axpy(y, a, x) }
        }
    }

    /// # Safety
    /// AVX2 and FMA must be available; `y` and `x` have equal lengths.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
        let n = y.len().min(x.len());
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n values of both.
            unsafe {
                let yv = _mm256_loadu_ps(y.as_ptr().add(i));
                let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(x.as_ptr().add(i)), yv);
                _mm256_storeu_ps(y.as_mut_ptr().add(i), r);
            }
            i += 8;
        }
        for j in i..n {
            y[j] = a.mul_add(x[j], y[j]);
        }
    }

    /// Tiles of `R` rows: 32-column tiles first when `wide`, then 16-column ones, then
    /// the values one at a time (every value the same steps).
    ///
    /// # Safety
    /// AVX2 and FMA must be available, and AVX-512F when `wide`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn gemm(
        a: Mat<'_>,
        b: Mat<'_>,
        c: MatMut<'_>,
        [n, k, w]: [usize; 3],
        init: Option<f32>,
        wide: bool,
    ) {
        let ld = c.ld;
        assert!(
            n == 0 || (a.v.len() >= (n - 1) * a.ld + k && c.v.len() >= (n - 1) * ld + w),
            "gemm rows"
        );
        assert!(k == 0 || b.v.len() >= (k - 1) * b.ld + w, "gemm columns");
        let mut r0 = 0;
        while r0 + R <= n {
            let mut x0 = 0;
            if wide {
                while x0 + 32 <= w {
                    // SAFETY: AVX-512F (caller); rows r0..r0+R and columns x0..x0+32 of
                    // `a`, `b` and `c` are in bounds (asserted above).
                    unsafe { tile512(&a, &b, c.v.as_mut_ptr(), ld, r0, x0, k, init) };
                    x0 += 32;
                }
            }
            while x0 + 16 <= w {
                // SAFETY: as above, for 16 columns.
                unsafe { tile256(&a, &b, c.v.as_mut_ptr(), ld, r0, x0, k, init) };
                x0 += 16;
            }
            for r in r0..r0 + R {
                edge(&a, &b, &mut *c.v, ld, r, x0..w, k, init);
            }
            r0 += R;
        }
        for r in r0..n {
            edge(&a, &b, &mut *c.v, ld, r, 0..w, k, init);
        }
    }

    /// One tile of `R` rows by two vectors of columns (`$lanes` each): `$name(a, b, c,
    /// ld, r0, x0, k, init)`.
    ///
    /// # Safety
    /// The named target features; the tile's rows and columns lie inside `a`, `b` and
    /// `c`.
    macro_rules! tile {
        ($name:ident, $features:literal, $lanes:literal, $zero:ident, $set1:ident,
         $load:ident, $store:ident, $mul:ident, $fmadd:ident) => {
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            unsafe fn $name(
                a: &Mat<'_>,
                b: &Mat<'_>,
                c: *mut f32,
                ld: usize,
                r0: usize,
                x0: usize,
                k: usize,
                init: Option<f32>,
            ) {
                let mut acc = [[$zero(); 2]; R];
                if let Some(f) = init {
                    let fv = $set1(f);
                    for (i, ai) in acc.iter_mut().enumerate() {
                        for (h, v) in ai.iter_mut().enumerate() {
                            // SAFETY: inside `c` (caller).
                            *v = $mul(fv, unsafe { $load(c.add((r0 + i) * ld + x0 + $lanes * h)) });
                        }
                    }
                }
                let (pa, pb) = (a.v.as_ptr(), b.v.as_ptr());
                for p in 0..k {
                    // SAFETY: row p, the tile's columns of `b` (caller).
                    let bv = unsafe {
                        let at = pb.add(p * b.ld + x0);
                        [$load(at), $load(at.add($lanes))]
                    };
                    for (i, ai) in acc.iter_mut().enumerate() {
                        // SAFETY: row r0 + i, column p of `a` (caller).
                        let av = $set1(unsafe { *pa.add((r0 + i) * a.ld + p) });
                        ai[0] = $fmadd(av, bv[0], ai[0]);
                        ai[1] = $fmadd(av, bv[1], ai[1]);
                    }
                }
                for (i, ai) in acc.iter().enumerate() {
                    for (h, v) in ai.iter().enumerate() {
                        // SAFETY: inside `c` (caller).
                        unsafe { $store(c.add((r0 + i) * ld + x0 + $lanes * h), *v) };
                    }
                }
            }
        };
    }

    tile!(
        tile256,
        "avx2,fma",
        8,
        _mm256_setzero_ps,
        _mm256_set1_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_mul_ps,
        _mm256_fmadd_ps
    );
    tile!(
        tile512,
        "avx512f,avx2,fma",
        16,
        _mm512_setzero_ps,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_mul_ps,
        _mm512_fmadd_ps
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    /// Random normalised keys and queries, values, decays and strengths for `d`.
    fn inputs(d: Dims, seed: u64) -> ChunkScratch {
        let mut r = Rng::new(seed);
        let mut s = ChunkScratch::default();
        s.shape(d);
        for row in s.kq.chunks_exact_mut(d.sk) {
            row.copy_from_slice(&r.vec(d.sk, 1.0));
            let n = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            row.iter_mut().for_each(|x| *x /= n);
        }
        s.v = r.vec(d.c * d.sv, 1.0);
        s.g = r
            .vec(d.c, 1.0)
            .iter()
            .map(|x| -0.05 - 0.3 * x.abs())
            .collect();
        s.b = r.vec(d.c, 1.0).iter().map(|x| 0.5 + 0.45 * x).collect();
        s
    }

    /// The token-by-token recurrence in f64: outputs `[c][sv]` and the final state.
    fn sequential(s: &ChunkScratch, d: Dims, scale: f32, state: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let Dims { sk, sv, c } = d;
        let mut st: Vec<f64> = state.iter().map(|&x| f64::from(x)).collect();
        let mut out = vec![0.0; c * sv];
        for t in 0..c {
            let k = &s.kq[t * sk..(t + 1) * sk];
            let q = &s.kq[(c + t) * sk..(c + t + 1) * sk];
            let decay = f64::from(s.g[t]).exp();
            for j in 0..sv {
                let r = &mut st[j * sk..(j + 1) * sk];
                r.iter_mut().for_each(|x| *x *= decay);
                let sk_j: f64 = r.iter().zip(k).map(|(x, &y)| x * f64::from(y)).sum();
                let delta = (f64::from(s.v[t * sv + j]) - sk_j) * f64::from(s.b[t]);
                r.iter_mut()
                    .zip(k)
                    .for_each(|(x, &y)| *x += f64::from(y) * delta);
                let o: f64 = r.iter().zip(q).map(|(x, &y)| x * f64::from(y)).sum();
                out[t * sv + j] = o * f64::from(scale);
            }
        }
        (out, st)
    }

    fn max_err(got: &[f32], want: &[f64]) -> f64 {
        got.iter()
            .zip(want)
            .map(|(&g, &w)| (f64::from(g) - w).abs())
            .fold(0.0, f64::max)
    }

    /// The chunked form equals the recurrence (in f64) within 2e-5 of values of order
    /// one, at chunk sizes that leave tile edges (5, 17) and whole tiles (64).
    #[test]
    fn the_chunk_equals_the_token_by_token_recurrence() {
        for (c, sk) in [(5, 16), (17, 32), (64, 128)] {
            let d = Dims { sk, sv: sk, c };
            let mut r = Rng::new(9);
            let state0 = r.vec(d.sv * d.sk, 0.2);
            let scale = 1.0 / (sk as f32).sqrt();
            let mut s = inputs(d, c as u64);
            let (want_o, want_s) = sequential(&s, d, scale, &state0);
            let mut state = state0.clone();
            chunk_step(VecIsa::detect(), &mut s, d, scale, &mut state);
            let (eo, es) = (max_err(&s.o, &want_o), max_err(&state, &want_s));
            assert!(eo < 2e-5 && es < 2e-5, "c {c}: output {eo:e}, state {es:e}");
        }
    }

    /// The AVX2 and AVX-512 kernels give the portable ones' bits, at sizes whose
    /// products leave 32-, 16-column and single-value edges.
    #[test]
    fn the_vector_kernels_give_the_portable_bits() {
        for (c, sk) in [(7, 16), (12, 16), (40, 32), (64, 64)] {
            let d = Dims { sk, sv: sk, c };
            let state0 = Rng::new(3).vec(d.sv * d.sk, 0.2);
            let run = |f: &dyn Fn(&mut ChunkScratch, &mut [f32])| {
                let mut s = inputs(d, 11);
                let mut state = state0.clone();
                f(&mut s, &mut state);
                (s.o, state)
            };
            let want = run(&|s, st| body::<Portable>(s, d, 0.25, st));
            #[cfg(target_arch = "x86_64")]
            {
                if VecIsa::detect() == VecIsa::Avx2 {
                    // SAFETY: AVX2 and FMA were detected.
                    let got = run(&|s, st| unsafe { body_avx2(s, d, 0.25, st) });
                    assert!(got == want, "avx2, c {c}");
                    if wide() {
                        // SAFETY: AVX-512F was detected too.
                        let got = run(&|s, st| unsafe { body_avx512(s, d, 0.25, st) });
                        assert!(got == want, "avx-512, c {c}");
                    }
                }
            }
            assert!(run(&|s, st| chunk_step(VecIsa::detect(), s, d, 0.25, st)) == want);
        }
    }
}
