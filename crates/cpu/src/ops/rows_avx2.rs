//! The AVX2 attention kernels over [`Rows`] views (f32 or packed rows): scores of one
//! query row against key rows and weighted sums of value rows, each with the operations
//! and order of the f32 slice kernels of `vec`, which call them, so a packed view gives
//! the bits of its decoded f32 rows.

use std::arch::x86_64::*;

use super::rows::{Rows, PREFETCH_ROWS};

/// `out[i] = q · k_{row0 + i}`, eight rows at a time: eight accumulators, reduced
/// together by a horizontal-add tree; the last rows one by one as [`dot`] takes them.
///
/// # Safety
/// AVX2, FMA and F16C must be available; the head size is a multiple of 8; rows
/// `row0..row0 + out.len()` of `k` are readable at the head size.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_in<R: Rows>(q: &[f32], k: R, row0: usize, out: &mut [f32]) {
    let (hd, n) = (q.len(), out.len());
    let pq = q.as_ptr();
    let mut i = 0;
    while i + 8 <= n {
        for r in 0..8 {
            k.prefetch(row0 + i + PREFETCH_ROWS + r, 0, hd);
        }
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut d = 0;
        // Whole blocks of 32 first, each row's four chunks loaded together: every
        // accumulator still takes its chunks in order, so the bits are the same.
        while R::BLOCK_LOADS && d + 32 <= hd {
            let qv: [__m256; 4] = std::array::from_fn(|j| _mm256_loadu_ps(pq.add(d + 8 * j)));
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: row row0 + i + r is in `k` (caller), d + 32 <= hd, d % 32 == 0.
                let kv = k.load32(row0 + i + r, d);
                for (qj, kj) in qv.iter().zip(kv) {
                    *a = _mm256_fmadd_ps(*qj, kj, *a);
                }
            }
            d += 32;
        }
        while d < hd {
            let qv = _mm256_loadu_ps(pq.add(d));
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: row row0 + i + r is in `k` (caller), d + 8 <= hd.
                let kv = k.load8(row0 + i + r, d);
                *a = _mm256_fmadd_ps(qv, kv, *a);
            }
            d += 8;
        }
        // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]: two
        // levels leave rows 0-3 (and 4-7) as partial sums split across the 128-bit lanes.
        let s01 = _mm256_hadd_ps(acc[0], acc[1]);
        let s23 = _mm256_hadd_ps(acc[2], acc[3]);
        let s45 = _mm256_hadd_ps(acc[4], acc[5]);
        let s67 = _mm256_hadd_ps(acc[6], acc[7]);
        let s0123 = _mm256_hadd_ps(s01, s23);
        let s4567 = _mm256_hadd_ps(s45, s67);
        let lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
        let hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_add_ps(lo, hi));
        i += 8;
    }
    while i < n {
        out[i] = dot_row(q, k, row0 + i);
        i += 1;
    }
}

/// [`dot`] of `q` with row `row` of `k`, for a head of whole registers: the same
/// operations in the same order (two chains over pairs of registers, one last
/// register, then the fold).
///
/// # Safety
/// As [`dot_rows_in`], for row `row`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_row<R: Rows>(q: &[f32], k: R, row: usize) -> f32 {
    let n = q.len();
    let pa = q.as_ptr();
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY (all loads): every index read is below `n`, a multiple of 8.
    while i + 16 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), k.load8(row, i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i + 8)), k.load8(row, i + 8), acc1);
        i += 16;
    }
    if i + 8 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), k.load8(row, i), acc0);
    }
    let acc = _mm256_add_ps(acc0, acc1);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    _mm_cvtss_f32(s1)
}

/// `o[c] += Σ_i p[i] * v_i[col0 + c]`: the output in chunks of up to 64 values held
/// in registers across all rows, loaded from `o` and stored back.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `o.len()` and `col0` are multiples of 8;
/// value rows `0..p.len()` of `v` are readable at columns `col0..col0 + o.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weighted_rows_acc_in<R: Rows>(p: &[f32], v: R, col0: usize, o: &mut [f32]) {
    let hd = o.len();
    let mut c0 = 0;
    // Whole chunks of 64 with a fixed count, so the eight accumulators stay in
    // registers (a variable count leaves them in memory: a load and a store per
    // multiply-add); the same operations in the same order as the general loop.
    while c0 + 64 <= hd {
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(o.as_ptr().add(c0 + 8 * j));
        }
        for (i, &pi) in p.iter().enumerate() {
            v.prefetch(i + PREFETCH_ROWS, col0 + c0, 64);
            let s = _mm256_set1_ps(pi);
            for (half, a4) in acc.chunks_exact_mut(4).enumerate() {
                // SAFETY: row i is in `v` (caller), c0 + 64 <= hd; a block load only
                // where col0 + c0 starts a block of 32 (the callers' col0 always does).
                let x = if R::BLOCK_LOADS && (col0 + c0).is_multiple_of(32) {
                    v.load32(i, col0 + c0 + 32 * half)
                } else {
                    std::array::from_fn(|j| v.load8(i, col0 + c0 + 32 * half + 8 * j))
                };
                for (a, xj) in a4.iter_mut().zip(x) {
                    *a = _mm256_fmadd_ps(s, xj, *a);
                }
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(o.as_mut_ptr().add(c0 + 8 * j), *a);
        }
        c0 += 64;
    }
    while c0 < hd {
        let w = (hd - c0).min(64) / 8;
        let mut acc = [_mm256_setzero_ps(); 8];
        for (j, a) in acc[..w].iter_mut().enumerate() {
            *a = _mm256_loadu_ps(o.as_ptr().add(c0 + 8 * j));
        }
        for (i, &pi) in p.iter().enumerate() {
            let s = _mm256_set1_ps(pi);
            for (j, a) in acc[..w].iter_mut().enumerate() {
                // SAFETY: row i is in `v` (caller), c0 + 8j + 8 <= hd.
                *a = _mm256_fmadd_ps(s, v.load8(i, col0 + c0 + 8 * j), *a);
            }
        }
        for (j, a) in acc[..w].iter().enumerate() {
            _mm256_storeu_ps(o.as_mut_ptr().add(c0 + 8 * j), *a);
        }
        c0 += 8 * w;
    }
}
