//! The 512-bit two-group kernels of the 256-element (super-block) tiles: Q4_K, Q6_K and
//! IQ4_XS against Q8_K activations. Each lane repeats the steps of its type's 256-bit VNNI
//! kernel, so the outputs are those bits (see the parent module).

use super::super::repack_k::TileQ4K;
use super::super::repack_k6::TileQ6K;
use super::super::repack_xs::TileIq4Xs;
use super::{dot2, join, scales, store};
use minfer_gguf::quant::{BlockQ8K, KVALUES_IQ4NL};
use std::arch::x86_64::*;

/// A super-block tile type with a two-group kernel here.
pub(crate) trait WideK: Sized {
    /// The sixteen row results of `w0` then `w1` per token.
    ///
    /// # Safety
    /// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI; `w1` and every activation row hold at
    /// least `w0.len()` super-blocks.
    unsafe fn gemv2<const NT: usize>(
        w0: &[Self],
        w1: &[Self],
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; 16]; NT];
}

impl WideK for TileQ4K {
    unsafe fn gemv2<const NT: usize>(
        w0: &[Self],
        w1: &[Self],
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; 16]; NT] {
        // SAFETY: as the caller guarantees.
        unsafe { gemv2_q4k(w0, w1, y) }
    }
}

impl WideK for TileQ6K {
    unsafe fn gemv2<const NT: usize>(
        w0: &[Self],
        w1: &[Self],
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; 16]; NT] {
        // SAFETY: as the caller guarantees.
        unsafe { gemv2_q6k(w0, w1, y) }
    }
}

impl WideK for TileIq4Xs {
    unsafe fn gemv2<const NT: usize>(
        w0: &[Self],
        w1: &[Self],
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; 16]; NT] {
        // SAFETY: as the caller guarantees.
        unsafe { gemv2_iq4xs(w0, w1, y) }
    }
}

/// The two-group kernel of `T`: bitwise two calls of its one-group VNNI kernel. Panics
/// when `w1` or an activation row is shorter than `w0`.
#[inline]
pub(crate) fn gemv_wide_k<T: WideK, const NT: usize>(
    _: super::Wide,
    w0: &[T],
    w1: &[T],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 16]; NT] {
    // SAFETY: a `Wide` exists only after runtime detection of the kernels' features; the
    // kernels slice `w1` and the activations to `w0`'s length (panicking when shorter).
    unsafe { T::gemv2(w0, w1, y) }
}

/// Q4_K tiles `w0` and `w1` (two row groups, the same super-blocks) against `NT` Q8_K
/// activation rows: the sixteen row results per token, bitwise those of the 256-bit
/// kernels (`repack_k`: exact scaled level dots and min terms, then the same float steps).
///
/// # Safety
/// As [`super::gemv2_q8`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv2_q4k<const NT: usize>(
    w0: &[TileQ4K],
    w1: &[TileQ4K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 16]; NT] {
    let n = w0.len();
    let (w1, y) = (&w1[..n], y.map(|a| &a[..n]));
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); NT];
    for (b, (t0, t1)) in w0.iter().zip(w1).enumerate() {
        let dw = scales(&t0.d, &t1.d);
        let dm = scales(&t0.dmin, &t1.dmin);
        let mut sumi = [_mm512_setzero_si512(); NT];
        for j in 0..8 {
            // Row r's 6-bit scale of sub-block j in i32 lane r (rows 8..16 from `t1`).
            // SAFETY: 8 scale bytes at 8j < 64 of each tile.
            let s = _mm512_cvtepu8_epi32(unsafe {
                _mm_unpacklo_epi64(
                    _mm_loadl_epi64(t0.sc.as_ptr().add(8 * j).cast()),
                    _mm_loadl_epi64(t1.sc.as_ptr().add(8 * j).cast()),
                )
            });
            let mut u = [_mm512_setzero_si512(); 8];
            for m in 0..4 {
                // SAFETY: 32 bytes at 128j + 32m + 32 <= 1024 of each tile's `qs`.
                let q = unsafe {
                    join(
                        t0.qs.as_ptr().add(128 * j + 32 * m),
                        t1.qs.as_ptr().add(128 * j + 32 * m),
                    )
                };
                u[2 * m] = _mm512_and_si512(q, m4);
                u[2 * m + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
            }
            for t in 0..NT {
                // SAFETY: 32j + 32 <= 256 activation levels.
                let v = unsafe { dot2(&u, y[t][b].qs.as_ptr().add(32 * j), 0..8) };
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(v, s));
            }
        }
        for t in 0..NT {
            acc[t] = accumulate_q4k(acc[t], t0, t1, &y[t][b], sumi[t], dw, dm);
        }
    }
    store(acc)
}

/// `acc + (dy·d)·sumi - (dy·dmin)·summ` per row for sixteen rows: `repack_k`'s step
/// (`TileQ4K::accumulate_avx2`) in 512-bit lanes, without fused operations.
#[inline(always)]
fn accumulate_q4k(
    acc: __m512,
    t0: &TileQ4K,
    t1: &TileQ4K,
    yb: &BlockQ8K,
    sumi: __m512i,
    dw: __m512,
    dm: __m512,
) -> __m512 {
    // SAFETY: the callers run with AVX-512 F/BW and AVX2 enabled; the loads read the 32
    // bytes of bsums and 16 bytes at 16q + 16 <= 64 of each tile's `mins`.
    unsafe {
        let bs = _mm256_loadu_si256(yb.bsums.as_ptr().cast());
        // i16 lane j: bsum 2j + bsum 2j+1; i32 lane q: the pairs 2q, 2q+1.
        let pairs = _mm512_castsi128_si512(_mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256::<1>(bs),
        ));
        let mut summ = _mm512_setzero_si512();
        for q in 0..4 {
            // i16 lanes 2r, 2r + 1: row r's mins of sub-blocks 2q, 2q + 1.
            let mq = _mm512_cvtepu8_epi16(_mm256_set_m128i(
                _mm_loadu_si128(t1.mins.as_ptr().add(16 * q).cast()),
                _mm_loadu_si128(t0.mins.as_ptr().add(16 * q).cast()),
            ));
            let bq = _mm512_permutexvar_epi32(_mm512_set1_epi32(q as i32), pairs);
            summ = _mm512_add_epi32(summ, _mm512_madd_epi16(mq, bq));
        }
        let dy = _mm512_set1_ps(yb.d);
        let a = _mm512_mul_ps(_mm512_mul_ps(dy, dw), _mm512_cvtepi32_ps(sumi));
        let m = _mm512_mul_ps(_mm512_mul_ps(dy, dm), _mm512_cvtepi32_ps(summ));
        _mm512_add_ps(acc, _mm512_sub_ps(a, m))
    }
}

/// Q6_K tiles `w0` and `w1` against `NT` Q8_K activation rows, as [`gemv2_q4k`] (the
/// steps of `repack_k6`'s kernels).
///
/// # Safety
/// As [`super::gemv2_q8`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv2_q6k<const NT: usize>(
    w0: &[TileQ6K],
    w1: &[TileQ6K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 16]; NT] {
    let n = w0.len();
    let (w1, y) = (&w1[..n], y.map(|a| &a[..n]));
    let (m4, m30) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30));
    let mut acc = [_mm512_setzero_ps(); NT];
    for (b, (t0, t1)) in w0.iter().zip(w1).enumerate() {
        let dw = scales(&t0.d, &t1.d);
        let mut sumi = [_mm512_setzero_si512(); NT];
        let mut corr = [_mm512_setzero_si512(); NT];
        for j in 0..8 {
            // i16 lanes (2r, 2r+1): row r's scales of groups 2j and 2j+1 (rows 8..16 from
            // `t1`); as i32 lanes, the even group's scale low and the odd group's high.
            // SAFETY: 16 scale bytes at 16j < 128 of each tile.
            let sc = _mm512_cvtepi8_epi16(unsafe {
                _mm256_set_m128i(
                    _mm_loadu_si128(t1.sc.as_ptr().add(16 * j).cast()),
                    _mm_loadu_si128(t0.sc.as_ptr().add(16 * j).cast()),
                )
            });
            let s_ev = _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(sc));
            let s_od = _mm512_srai_epi32::<16>(sc);
            let (q0, q1) = (&t0.q[192 * j..], &t1.q[192 * j..]);
            let mut u = [_mm512_setzero_si512(); 8];
            for m in 0..4 {
                // SAFETY: 32 bytes at 32m + 32 <= 128 of each sub-block's 192.
                let q = unsafe { join(q0.as_ptr().add(32 * m), q1.as_ptr().add(32 * m)) };
                u[2 * m] = _mm512_and_si512(q, m4);
                u[2 * m + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
            }
            for h in 0..2 {
                // SAFETY: 32 bytes at 128 + 32h + 32 <= 192 of each sub-block.
                let t =
                    unsafe { join(q0.as_ptr().add(128 + 32 * h), q1.as_ptr().add(128 + 32 * h)) };
                // u | (bits & 0x30), one ternary-logic instruction (0xF8: a | (b & c)).
                let k = 4 * h;
                u[k] = _mm512_ternarylogic_epi32::<0xF8>(u[k], _mm512_slli_epi16::<4>(t), m30);
                u[k + 1] =
                    _mm512_ternarylogic_epi32::<0xF8>(u[k + 1], _mm512_slli_epi16::<2>(t), m30);
                u[k + 2] = _mm512_ternarylogic_epi32::<0xF8>(u[k + 2], t, m30);
                u[k + 3] =
                    _mm512_ternarylogic_epi32::<0xF8>(u[k + 3], _mm512_srli_epi16::<2>(t), m30);
            }
            for t in 0..NT {
                // SAFETY: 32j + 32 <= 256 activation levels.
                let qs = unsafe { y[t][b].qs.as_ptr().add(32 * j) };
                // SAFETY: `qs` points at 32 readable levels.
                let (ev, od) = unsafe { (dot2(&u, qs, 0..4), dot2(&u, qs, 4..8)) };
                let v =
                    _mm512_add_epi32(_mm512_mullo_epi32(ev, s_ev), _mm512_mullo_epi32(od, s_od));
                sumi[t] = _mm512_add_epi32(sumi[t], v);
                // The bsums of groups 2j and 2j + 1 as one i32, in every lane.
                // SAFETY: i32 j of the block's 16 bsums (32 bytes).
                let bj = _mm512_set1_epi32(unsafe {
                    y[t][b]
                        .bsums
                        .as_ptr()
                        .add(2 * j)
                        .cast::<i32>()
                        .read_unaligned()
                });
                corr[t] = _mm512_add_epi32(corr[t], _mm512_madd_epi16(sc, bj));
            }
        }
        for t in 0..NT {
            let s = _mm512_sub_epi32(sumi[t], _mm512_slli_epi32::<5>(corr[t]));
            let dy = _mm512_set1_ps(y[t][b].d);
            let v = _mm512_mul_ps(_mm512_mul_ps(dy, dw), _mm512_cvtepi32_ps(s));
            acc[t] = _mm512_add_ps(acc[t], v);
        }
    }
    store(acc)
}

/// IQ4_XS tiles `w0` and `w1` against `NT` Q8_K activation rows, as [`gemv2_q4k`] (the
/// steps of `repack_xs`'s VNNI kernel: levels `K + 128` by byte shuffle, `128 · Σ y` taken
/// off each sub-block's sum).
///
/// # Safety
/// As [`super::gemv2_q8`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv2_iq4xs<const NT: usize>(
    w0: &[TileIq4Xs],
    w1: &[TileIq4Xs],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 16]; NT] {
    let n = w0.len();
    let (w1, y) = (&w1[..n], y.map(|a| &a[..n]));
    let shifted: [u8; 16] = KVALUES_IQ4NL.map(|k| (k as i32 + 128) as u8);
    // SAFETY: 16 bytes.
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(shifted.as_ptr().cast()) });
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); NT];
    for (b, (t0, t1)) in w0.iter().zip(w1).enumerate() {
        let dw = scales(&t0.d, &t1.d);
        let mut sumi = [_mm512_setzero_si512(); NT];
        for j in 0..8 {
            // Row r's signed sub-block scale in i32 lane r (rows 8..16 from `t1`).
            // SAFETY: 8 scale bytes at 8j < 64 of each tile.
            let s = _mm512_cvtepi8_epi32(unsafe {
                _mm_unpacklo_epi64(
                    _mm_loadl_epi64(t0.sc.as_ptr().add(8 * j).cast()),
                    _mm_loadl_epi64(t1.sc.as_ptr().add(8 * j).cast()),
                )
            });
            let mut u = [_mm512_setzero_si512(); 8];
            for m in 0..4 {
                // SAFETY: 32 bytes at 128j + 32m + 32 <= 1024 of each tile's `qs`.
                let q = unsafe {
                    join(
                        t0.qs.as_ptr().add(128 * j + 32 * m),
                        t1.qs.as_ptr().add(128 * j + 32 * m),
                    )
                };
                u[2 * m] = _mm512_shuffle_epi8(table, _mm512_and_si512(q, m4));
                u[2 * m + 1] =
                    _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
            }
            for t in 0..NT {
                let yb = &y[t][b];
                // SAFETY: 32j + 32 <= 256 activation levels.
                let v = unsafe { dot2(&u, yb.qs.as_ptr().add(32 * j), 0..8) };
                let sy = yb.bsums[2 * j] as i32 + yb.bsums[2 * j + 1] as i32;
                let isum = _mm512_sub_epi32(v, _mm512_set1_epi32(128 * sy));
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(isum, s));
            }
        }
        for t in 0..NT {
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(y[t][b].d));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sumi[t])));
        }
    }
    store(acc)
}
