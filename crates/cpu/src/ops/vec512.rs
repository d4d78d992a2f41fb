//! 512-bit versions of the attention primitives of `vec`, used where the quantized
//! kernels run their AVX-512 VNNI path (so a cap to AVX2 turns these off too).
//!
//! Each computes every output with the operations of its AVX2 twin in the same order, so
//! the bits are the same: the weighted sum keeps one lane per output element (the lanes
//! are independent, only their count per register changes), and the two-row scores put
//! one query row in each 256-bit half of the registers, accumulate each half as the AVX2
//! kernel accumulates its row, and reduce each half by the AVX2 kernel's horizontal-add
//! tree (`hadd` rebuilt from two shuffles and an add, which is exact: float addition is
//! commutative).

use std::arch::x86_64::*;

use super::rows::{Rows, PREFETCH_ROWS};

/// Whether the 512-bit primitives run: the quantized kernels' ISA is the VNNI one (which
/// implies AVX-512 F/BW/VL, detected at run time, and no cap below it).
pub(super) fn enabled() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let isa = crate::quant::Isa::detect();
        crate::quant::Isa::vnni() == Some(isa)
    })
}

/// `hadd` of the AVX2 kernel in each 256-bit half: per 128-bit lane
/// `[a0+a1, a2+a3, b0+b1, b2+b3]`.
#[inline(always)]
fn hadd(a: __m512, b: __m512) -> __m512 {
    // SAFETY: register operations; the callers run with AVX-512 F enabled.
    unsafe {
        let even = _mm512_shuffle_ps::<0b10_00_10_00>(a, b);
        let odd = _mm512_shuffle_ps::<0b11_01_11_01>(a, b);
        _mm512_add_ps(even, odd)
    }
}

/// Query rows `a` and `b` side by side, chunk `c` (8 values) of `a` in the low half of
/// register `c`, of `b` in the high half.
///
/// # Safety
/// AVX-512 F; `qa`, `qb` hold `8 * q.len()` values at least.
#[inline(always)]
unsafe fn pair_rows(qa: &[f32], qb: &[f32], q: &mut [__m512]) {
    for (c, qc) in q.iter_mut().enumerate() {
        // SAFETY: 8c + 8 values of each row (caller). The 64-bit-lane forms of insert,
        // broadcast and extract move the same bits and need only AVX-512 F.
        *qc = unsafe {
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps(qa.as_ptr().add(8 * c)))),
                _mm256_castps_pd(_mm256_loadu_ps(qb.as_ptr().add(8 * c))),
            ))
        };
    }
}

/// The largest head size the score kernels take (Qwen3.5's and Gemma 3's 256): the
/// query rows' pairs are kept in a stack array of `MAX_HEAD / 8` registers' worth,
/// which the multiply-adds read from memory.
const MAX_HEAD: usize = 256;

/// The scores of eight keys for the pair of rows whose per-lane partial sums are in
/// `acc` (key `r` in `acc[r]`): each half reduced by the AVX2 kernel's tree, row `a`'s
/// eight scores in the low half of the result and row `b`'s in the high half.
#[inline(always)]
fn reduce_keys8(acc: &[__m512; 8]) -> __m512 {
    let s01 = hadd(acc[0], acc[1]);
    let s23 = hadd(acc[2], acc[3]);
    let s45 = hadd(acc[4], acc[5]);
    let s67 = hadd(acc[6], acc[7]);
    let s0123 = hadd(s01, s23);
    let s4567 = hadd(s45, s67);
    // SAFETY: register operations; the callers run with AVX-512 F enabled.
    unsafe {
        // Per half: the low 128-bit lanes of both, then the high ones (the AVX2 kernel's
        // permute2f128 pair), summed.
        let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(s0123, s4567);
        let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(s0123, s4567);
        // lo = [s0123.l0, s0123.l2, s4567.l0, s4567.l2]: reorder to row a then row b.
        let sum = _mm512_add_ps(lo, hi);
        _mm512_shuffle_f32x4::<0b11_01_10_00>(sum, sum)
    }
}

/// Stores the low half of `sum` at `a` and the high half at `b`.
///
/// # Safety
/// AVX-512 F; eight values writable at each of `a` and `b`.
#[inline(always)]
unsafe fn store_halves(sum: __m512, a: *mut f32, b: *mut f32) {
    // SAFETY: eight values at each (caller).
    unsafe {
        _mm256_storeu_ps(a, _mm512_castps512_ps256(sum));
        _mm256_storeu_ps(
            b,
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sum))),
        );
    }
}

/// Scores of two query rows against the same keys: `out_a[i] = qa · k_i` and
/// `out_b[i] = qb · k_i`, bitwise the AVX2 `dot_rows` of each row, for the keys of whole
/// groups of eight (none where the head size has no 512-bit path); returns how many keys
/// it did, the caller takes the rest as the AVX2 kernel does.
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F; `qa`, `qb` of one length; key rows `0..out_a.len()`
/// of `k` are readable at that length; `out_a` and `out_b` of one length.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn dot_rows2<R: Rows>(
    qa: &[f32],
    qb: &[f32],
    k: R,
    out_a: &mut [f32],
    out_b: &mut [f32],
) -> usize {
    let (hd, n) = (qa.len(), out_a.len());
    if !hd.is_multiple_of(8) || hd > MAX_HEAD {
        return 0;
    }
    let mut q = [_mm512_setzero_ps(); MAX_HEAD / 8];
    // SAFETY: hd values in each row.
    unsafe { pair_rows(qa, qb, &mut q[..hd / 8]) };
    let mut i = 0;
    while i + 8 <= n {
        for r in 0..8 {
            k.prefetch(i + PREFETCH_ROWS + r, 0, hd);
        }
        let mut acc = [_mm512_setzero_ps(); 8];
        if R::BLOCK_LOADS && hd.is_multiple_of(32) {
            // A block of four chunks per row load, each accumulator still taking its
            // chunks in order (the same bits).
            for (b, q4) in q[..hd / 8].chunks_exact(4).enumerate() {
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: row i + r is inside `k` (caller), 32b + 32 <= hd.
                    let kv = unsafe { k.load32_both(i + r, 32 * b) };
                    for (qc, kc) in q4.iter().zip(kv) {
                        *a = _mm512_fmadd_ps(*qc, kc, *a);
                    }
                }
            }
        } else {
            for (c, qc) in q[..hd / 8].iter().enumerate() {
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: row i + r is inside `k` (caller), 8c + 8 <= hd.
                    let kv = unsafe { k.load8_both(i + r, 8 * c) };
                    *a = _mm512_fmadd_ps(*qc, kv, *a);
                }
            }
        }
        // SAFETY: i + 8 <= n outputs in each row.
        unsafe {
            let (pa, pb) = (out_a.as_mut_ptr().add(i), out_b.as_mut_ptr().add(i));
            store_halves(reduce_keys8(&acc), pa, pb);
        }
        i += 8;
    }
    i
}

/// [`dot_rows2`] for four query rows (two pairs) against the same keys, bitwise the AVX2
/// `dot_rows` of each row: every key chunk is loaded once for all four, and the two
/// pairs' sixteen accumulator chains keep both multiply-add ports busy. Returns how many
/// keys it did (whole groups of eight; the caller takes the rest).
///
/// # Safety
/// As [`dot_rows2`], for four query rows of one length and four outputs of one length.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn dot_rows4<R: Rows>(q: [&[f32]; 4], k: R, out: [&mut [f32]; 4]) -> usize {
    let (hd, n) = (q[0].len(), out[0].len());
    if !hd.is_multiple_of(8) || hd > MAX_HEAD {
        return 0;
    }
    let po = out.map(|o| o.as_mut_ptr());
    // Chunk c of each pair (read from memory by the multiply-adds, which leaves the
    // registers to the accumulators).
    let (mut qab, mut qcd) = (
        [_mm512_setzero_ps(); MAX_HEAD / 8],
        [_mm512_setzero_ps(); MAX_HEAD / 8],
    );
    // SAFETY: hd values in each row.
    unsafe {
        pair_rows(q[0], q[1], &mut qab[..hd / 8]);
        pair_rows(q[2], q[3], &mut qcd[..hd / 8]);
    }
    let mut i = 0;
    while i + 8 <= n {
        for r in 0..8 {
            k.prefetch(i + PREFETCH_ROWS + r, 0, hd);
        }
        let mut ab = [_mm512_setzero_ps(); 8];
        let mut cd = [_mm512_setzero_ps(); 8];
        if R::BLOCK_LOADS && hd.is_multiple_of(32) {
            // A block of four chunks per row load, each accumulator still taking its
            // chunks in order (the same bits).
            for b in 0..hd / 32 {
                for r in 0..8 {
                    // SAFETY: row i + r is inside `k` (caller), 32b + 32 <= hd.
                    let kv = unsafe { k.load32_both(i + r, 32 * b) };
                    for (j, kc) in kv.into_iter().enumerate() {
                        ab[r] = _mm512_fmadd_ps(qab[4 * b + j], kc, ab[r]);
                        cd[r] = _mm512_fmadd_ps(qcd[4 * b + j], kc, cd[r]);
                    }
                }
            }
        } else {
            for c in 0..hd / 8 {
                for r in 0..8 {
                    // SAFETY: row i + r is inside `k` (caller), 8c + 8 <= hd.
                    let kv = unsafe { k.load8_both(i + r, 8 * c) };
                    ab[r] = _mm512_fmadd_ps(qab[c], kv, ab[r]);
                    cd[r] = _mm512_fmadd_ps(qcd[c], kv, cd[r]);
                }
            }
        }
        // SAFETY: i + 8 <= n outputs in each row.
        unsafe {
            store_halves(reduce_keys8(&ab), po[0].add(i), po[1].add(i));
            store_halves(reduce_keys8(&cd), po[2].add(i), po[3].add(i));
        }
        i += 8;
    }
    i
}

/// `o += Σ_i p[i] * v_i[..o.len()]`, bitwise the AVX2 `weighted_rows_acc` (one FMA per
/// element and row, rows in order), for the elements of whole chunks of 64; returns how
/// many elements it did (the caller takes the rest).
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F; value rows `0..p.len()` of `v` are readable at
/// `o.len()`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn weighted_rows_acc<R: Rows>(p: &[f32], v: R, o: &mut [f32]) -> usize {
    let hd = o.len();
    let mut c0 = 0;
    // Whole chunks of 64 in four registers with a fixed count (kept in registers).
    while c0 + 64 <= hd {
        let mut acc = [_mm512_setzero_ps(); 4];
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: c0 + 16j + 16 <= hd.
            *a = unsafe { _mm512_loadu_ps(o.as_ptr().add(c0 + 16 * j)) };
        }
        for (i, &pi) in p.iter().enumerate() {
            v.prefetch(i + PREFETCH_ROWS, c0, 64);
            let s = _mm512_set1_ps(pi);
            // SAFETY: row i is inside `v` (caller), c0 + 64 <= hd, c0 % 64 == 0.
            let x = unsafe { v.load64(i, c0) };
            for (a, xj) in acc.iter_mut().zip(x) {
                *a = _mm512_fmadd_ps(s, xj, *a);
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: c0 + 16j + 16 <= hd.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(c0 + 16 * j), *a) };
        }
        c0 += 64;
    }
    c0
}

/// `o[h] += Σ_i p[h][i] * v_i` for `N` weight rows over the same
/// value rows: bitwise `N` calls of [`weighted_rows_acc`] (one FMA per element and row,
/// rows in order), each value chunk loaded once for all `N`, for the elements of whole
/// chunks of 64; returns how many it did (the caller takes the rest). Two rows give
/// eight independent accumulator chains, four give sixteen, enough to keep both
/// multiply-add ports busy through their latency; `N` up to 4 keeps every accumulator
/// in a register.
///
/// # Safety
/// As [`weighted_rows_acc`]; the weight rows have one length and the outputs another.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(super) unsafe fn weighted_rows_accn<R: Rows, const N: usize>(
    p: [&[f32]; N],
    v: R,
    mut o: [&mut [f32]; N],
) -> usize {
    let hd = o[0].len();
    let n = p[0].len();
    let mut c0 = 0;
    while c0 + 64 <= hd {
        let mut acc = [[_mm512_setzero_ps(); 4]; N];
        for (a, oh) in acc.iter_mut().zip(&o) {
            for (j, x) in a.iter_mut().enumerate() {
                // SAFETY: c0 + 16j + 16 <= hd in each output.
                *x = unsafe { _mm512_loadu_ps(oh.as_ptr().add(c0 + 16 * j)) };
            }
        }
        // `i` indexes all N weight rows at once, which no single iterator does.
        #[allow(clippy::needless_range_loop)]
        for i in 0..n {
            v.prefetch(i + PREFETCH_ROWS, c0, 64);
            let w: [__m512; N] = std::array::from_fn(|h| _mm512_set1_ps(p[h][i]));
            // SAFETY: row i is inside `v` (caller), c0 + 64 <= hd, c0 % 64 == 0.
            let x4 = unsafe { v.load64(i, c0) };
            for (j, x) in x4.into_iter().enumerate() {
                for (a, &wh) in acc.iter_mut().zip(&w) {
                    a[j] = _mm512_fmadd_ps(wh, x, a[j]);
                }
            }
        }
        for (a, oh) in acc.iter().zip(o.iter_mut()) {
            for (j, x) in a.iter().enumerate() {
                // SAFETY: c0 + 16j + 16 <= hd in each output.
                unsafe { _mm512_storeu_ps(oh.as_mut_ptr().add(c0 + 16 * j), *x) };
            }
        }
        c0 += 64;
    }
    c0
}
