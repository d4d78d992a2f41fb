//! VNNI versions of the repacked tile kernels (`repack`, `repack_k`, `repack_k6`).
//!
//! Each kernel is its AVX2 twin with the integer dot products done by `vpdpbusd` (four
//! u8 x i8 products summed into an i32 lane in one instruction) instead of the
//! `maddubs` + `add` + `madd` chains. The per-block integer sums are exact on both paths
//! (no intermediate saturates: the AVX2 kernels document their i16 bounds, and i32 holds
//! every sum here), and the float steps are the AVX2 kernel's, in the same order, so the
//! results are bitwise equal to the scalar references. Only the 256-bit (VL) forms are
//! used: the machines that have them run 512-bit integer ops at the same element rate.
//!
//! Each token keeps two independent `vpdpbusd` chains per block, so the four tokens of a
//! call give eight chains in flight against the instruction's latency.

use super::repack::{Act, TileQ5, TileQ8};
use super::repack_k::TileQ4K;
use super::repack_k6::TileQ6K;
use minfer_gguf::quant::BlockQ8K;
use std::arch::x86_64::*;

/// The four activation bytes at `p`, broadcast to every i32 lane.
///
/// # Safety
/// `p` must point to four readable bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bcast4(p: *const i8) -> __m256i {
    // SAFETY: the caller guarantees four readable bytes; unaligned read.
    _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// Stores the accumulators as row results.
#[inline]
#[target_feature(enable = "avx2")]
fn store<const NT: usize>(acc: [__m256; NT]) -> [[f32; 8]; NT] {
    let mut out = [[0.0f32; 8]; NT];
    for t in 0..NT {
        // SAFETY: `out[t]` holds eight f32.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
    out
}

/// Σ over registers `ks` of `u[k] · y[4k..4k+4]` per i32 lane, in two chains.
///
/// # Safety
/// `qs` must point to at least `4 * ks.end` readable bytes.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_regs(u: &[__m256i; 8], qs: *const i8, ks: std::ops::Range<usize>) -> __m256i {
    let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    let mut k = ks.start;
    while k + 1 < ks.end {
        // SAFETY: 4k + 8 <= 4 * ks.end bytes of `qs`.
        unsafe {
            a = _mm256_dpbusd_epi32(a, u[k], bcast4(qs.add(4 * k)));
            b = _mm256_dpbusd_epi32(b, u[k + 1], bcast4(qs.add(4 * k + 4)));
        }
        k += 2;
    }
    _mm256_add_epi32(a, b)
}

/// VNNI [`super::repack::Tile::gemv_avx2`] for Q8_0 tiles.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI required.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemv_q8<const NT: usize>(w: &[TileQ8], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
    let n = w.len();
    let y = y.map(|a| (&a.q[..n], &a.d[..n]));
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        // SAFETY (loads): 16 bytes of scales; register k is bytes 32k..32k+32 of 256.
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(tile.d.as_ptr().cast()) });
        let mut sum = [[_mm256_setzero_si256(); 2]; NT];
        for k in 0..8 {
            let wk = unsafe { _mm256_loadu_si256(tile.qs.as_ptr().add(32 * k).cast()) };
            // |w| as unsigned bytes (-128 gives 128), the sign moved onto the activation:
            // exact for activations in -127..=127.
            let ak = _mm256_sign_epi8(wk, wk);
            for t in 0..NT {
                // SAFETY: 4k + 4 <= 32 bytes of the block's levels.
                let yk = unsafe { bcast4(y[t].0[b].qs.as_ptr().add(4 * k)) };
                let s = &mut sum[t][k % 2];
                *s = _mm256_dpbusd_epi32(*s, ak, _mm256_sign_epi8(yk, wk));
            }
        }
        for t in 0..NT {
            let s = _mm256_add_epi32(sum[t][0], sum[t][1]);
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t].1[b]));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    store(acc)
}

/// VNNI [`super::repack::Tile::gemv_avx2`] for Q5_0 tiles.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI required.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemv_q5<const NT: usize>(w: &[TileQ5], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
    let n = w.len();
    let y = y.map(|a| (&a.q[..n], &a.d[..n], &a.s[..n]));
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        // SAFETY: 16 bytes of scales.
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(tile.d.as_ptr().cast()) });
        let u = tile.unpack_avx2();
        for t in 0..NT {
            // SAFETY: the block's 32 levels.
            let s = unsafe { dot_regs(&u, y[t].0[b].qs.as_ptr(), 0..8) };
            let s = _mm256_sub_epi32(s, _mm256_set1_epi32(16 * y[t].2[b]));
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t].1[b]));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    store(acc)
}

/// VNNI [`super::repack_k::gemv_q4k_avx2`].
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI required.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemv_q4k<const NT: usize>(
    w: &[TileQ4K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    let y = y.map(|a| &a[..w.len()]);
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        // SAFETY (all loads below): offsets stay inside the tile's and the activation
        // block's arrays (16 bytes of each scale row, 8 of `sc`, 16 of `mins`, 32 of `qs`
        // at 128j + 32m < 1024, 32 activation levels at 32j < 256, 32 of bsums).
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(tile.d.as_ptr().cast()) });
        let dm = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(tile.dmin.as_ptr().cast()) });
        let mut sumi = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            // SAFETY: 8 scale bytes at 8j < 64.
            let s = _mm256_cvtepu8_epi32(unsafe {
                _mm_loadl_epi64(tile.sc.as_ptr().add(8 * j).cast())
            });
            let u = tile.unpack_avx2(j);
            for t in 0..NT {
                // Row sums over the sub-block's 32 elements (|sum| <= 60960), times the
                // row's 6-bit scale.
                // SAFETY: 32j + 32 <= 256 activation levels.
                let qs = unsafe { y[t][b].qs.as_ptr().add(32 * j) };
                // SAFETY: `qs` points at 32 readable levels.
                let v = unsafe { dot_regs(&u, qs, 0..8) };
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_mullo_epi32(v, s));
            }
        }
        for t in 0..NT {
            acc[t] = tile.accumulate_avx2(acc[t], &y[t][b], sumi[t], dw, dm);
        }
    }
    store(acc)
}

/// VNNI [`super::repack_k6::gemv_q6k_avx2`].
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI required.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemv_q6k<const NT: usize>(
    w: &[TileQ6K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    let y = y.map(|a| &a[..w.len()]);
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        // SAFETY (all loads below): offsets stay inside the tile's and the activation
        // block's arrays (16 bytes of `d` and of `sc` at 16j < 128, 32 of `q` at
        // 192j + 32m + 32 <= 1536 and at 192j + 128 + 32h + 32 <= 1536, 32 activation levels at
        // 32j < 256, 32 of bsums).
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(tile.d.as_ptr().cast()) });
        let mut sumi = [_mm256_setzero_si256(); NT];
        let mut corr = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            // i16 lanes (2r, 2r+1): row r's scales of groups 2j and 2j+1; as i32 lanes,
            // the even group's scale in the low half and the odd group's in the high.
            // SAFETY: 16 scale bytes at 16j < 128.
            let sc = _mm256_cvtepi8_epi16(unsafe {
                _mm_loadu_si128(tile.sc.as_ptr().add(16 * j).cast())
            });
            let s_ev = _mm256_srai_epi32(_mm256_slli_epi32(sc, 16), 16);
            let s_od = _mm256_srai_epi32(sc, 16);
            let u = tile.unpack_avx2(j);
            for t in 0..NT {
                // SAFETY: 32j + 32 <= 256 activation levels.
                let qs = unsafe { y[t][b].qs.as_ptr().add(32 * j) };
                // Group sums over 16 elements (|sum| <= 129024), times the signed scales.
                // SAFETY: `qs` points at 32 readable levels.
                let ev = unsafe { dot_regs(&u, qs, 0..4) };
                // SAFETY: `qs` points at 32 readable levels.
                let od = unsafe { dot_regs(&u, qs, 4..8) };
                let v =
                    _mm256_add_epi32(_mm256_mullo_epi32(ev, s_ev), _mm256_mullo_epi32(od, s_od));
                sumi[t] = _mm256_add_epi32(sumi[t], v);
                // i32 lane j of the bsums: groups 2j and 2j+1.
                // SAFETY: the block's 16 bsums are 32 bytes.
                let bs = unsafe { _mm256_loadu_si256(y[t][b].bsums.as_ptr().cast()) };
                let bj = _mm256_permutevar8x32_epi32(bs, _mm256_set1_epi32(j as i32));
                corr[t] = _mm256_add_epi32(corr[t], _mm256_madd_epi16(sc, bj));
            }
        }
        for t in 0..NT {
            let s = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(corr[t], 5));
            let dy = _mm256_set1_ps(y[t][b].d);
            let v = _mm256_mul_ps(_mm256_mul_ps(dy, dw), _mm256_cvtepi32_ps(s));
            acc[t] = _mm256_add_ps(acc[t], v);
        }
    }
    store(acc)
}
