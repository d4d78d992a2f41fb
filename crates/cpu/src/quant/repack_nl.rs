//! Row-interleaved ("x8") IQ4_NL tiles and their kernels, in the layout of `repack`'s
//! Q5_0 tiles without the fifth-bit plane: register `k` (`k` in `0..8`), byte `4r + i`
//! holds the 4-bit code of row `r`, element `4k + i`, two registers' codes per 32 bytes.
//! A tile is exactly as large as its eight source blocks.
//!
//! The kernels turn codes into levels with one byte shuffle per register. AVX2 multiplies
//! the signed levels with the sign trick (`|K| <= 127`, activations in `-127..=127`, so the
//! i16 pair sums are exact); VNNI multiplies the unsigned levels `K + 128` with
//! `vpdpbusd` and subtracts `128 * Σ y`. Both integer sums are exact, and the float step is
//! `repack`'s (`acc[r] = fma(d_r * dy, isum_r, acc[r])` in block order), so the scalar
//! reference ([`super::repack::gemv_scalar`]), AVX2 and VNNI agree bitwise.

use super::repack::{Act, Tile};
use minfer_gguf::quant::{BlockIq4Nl, KVALUES_IQ4NL};

/// Eight rows' IQ4_NL blocks as interleaved codes.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct TileIq4Nl {
    /// The eight row scales (f16 bits).
    pub(crate) d: [u16; 8],
    /// Bytes `32m..32m+32`: codes of register `2m` (low nibbles) and `2m+1` (high).
    pub(crate) nib: [u8; 128],
}

const _: () = assert!(std::mem::size_of::<TileIq4Nl>() == 8 * 18);

impl Tile for TileIq4Nl {
    type Src = BlockIq4Nl;

    fn pack(rows: [Option<&[BlockIq4Nl]>; 8], b: usize) -> Self {
        let mut t: TileIq4Nl = bytemuck::Zeroable::zeroed();
        for (r, row) in rows.iter().enumerate() {
            let Some(row) = row else {
                // Padding rows: scale 0, codes 0 (level -127 times 0).
                continue;
            };
            let blk = &row[b];
            t.d[r] = blk.d.to_bits();
            let code = |e: usize| {
                if e < 16 {
                    blk.qs[e] & 0x0f
                } else {
                    blk.qs[e - 16] >> 4
                }
            };
            for m in 0..4 {
                for i in 0..4 {
                    t.nib[32 * m + 4 * r + i] = code(8 * m + i) | (code(8 * m + 4 + i) << 4);
                }
            }
        }
        t
    }

    fn level(&self, r: usize, e: usize) -> i32 {
        let (k, j) = (e / 4, 4 * r + e % 4);
        let c = (self.nib[32 * (k / 2) + j] >> (4 * (k % 2))) & 0x0f;
        KVALUES_IQ4NL[c as usize] as i32
    }

    fn scale_bits(&self) -> &[u16; 8] {
        &self.d
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gemv_avx2<const NT: usize>(w: &[Self], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
        gemv_avx2(w, y)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    unsafe fn gemv_vnni<const NT: usize>(w: &[Self], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
        // SAFETY: the caller guarantees the features.
        unsafe { gemv_vnni(w, y) }
    }
}

/// The eight registers of levels looked up in `table` (16 bytes, broadcast to both lanes).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn levels(
    tile: &TileIq4Nl,
    table: std::arch::x86_64::__m256i,
) -> [std::arch::x86_64::__m256i; 8] {
    use std::arch::x86_64::*;
    let m4 = _mm256_set1_epi8(0x0f);
    let mut w = [_mm256_setzero_si256(); 8];
    for m in 0..4 {
        // SAFETY: 32 bytes at 32m + 32 <= 128 of `nib`.
        let n = unsafe { _mm256_loadu_si256(tile.nib.as_ptr().add(32 * m).cast()) };
        w[2 * m] = _mm256_shuffle_epi8(table, _mm256_and_si256(n, m4));
        w[2 * m + 1] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(n, 4), m4));
    }
    w
}

/// The four activation bytes `4k..4k+4` of `qs`, broadcast to every i32 lane.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn bcast4(qs: &[i8; 32], k: usize) -> std::arch::x86_64::__m256i {
    let b = &qs[4 * k..4 * k + 4];
    std::arch::x86_64::_mm256_set1_epi32(i32::from_le_bytes([
        b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8,
    ]))
}

/// AVX2 kernel: signed levels with the sign trick.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gemv_avx2<const NT: usize>(w: &[TileIq4Nl], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
    use std::arch::x86_64::*;
    let n = w.len();
    let y = y.map(|a| (&a.q[..n], &a.d[..n]));
    // SAFETY (of the load): the table is 16 readable bytes.
    let table =
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()) });
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        // SAFETY (of the load): 16 bytes of scales.
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(tile.d.as_ptr().cast()) });
        // SAFETY: AVX2 is enabled here.
        let wl = unsafe { levels(tile, table) };
        let mut sum = [_mm256_setzero_si256(); NT];
        for (k, &wk) in wl.iter().enumerate() {
            let ak = _mm256_sign_epi8(wk, wk);
            for t in 0..NT {
                let yk = _mm256_sign_epi8(bcast4(&y[t].0[b].qs, k), wk);
                // |w| <= 127 and |y| <= 127: pair sums fit i16.
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ak, yk), ones);
                sum[t] = _mm256_add_epi32(sum[t], p);
            }
        }
        for t in 0..NT {
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t].1[b]));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum[t]), acc[t]);
        }
    }
    let mut out = [[0.0f32; 8]; NT];
    for t in 0..NT {
        // SAFETY: `out[t]` holds eight f32.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
    out
}

/// VNNI kernel: unsigned levels `K + 128` by `vpdpbusd`, minus `128 * Σ y`.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv_vnni<const NT: usize>(w: &[TileIq4Nl], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
    use std::arch::x86_64::*;
    let n = w.len();
    let y = y.map(|a| (&a.q[..n], &a.d[..n], &a.s[..n]));
    let shifted: [u8; 16] = KVALUES_IQ4NL.map(|k| (k as i32 + 128) as u8);
    // SAFETY (of the load): the table is 16 readable bytes.
    let table = _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(shifted.as_ptr().cast()) });
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        // SAFETY (of the load): 16 bytes of scales.
        let dw = _mm256_cvtph_ps(unsafe { _mm_loadu_si128(tile.d.as_ptr().cast()) });
        // SAFETY: AVX2 is enabled here.
        let u = unsafe { levels(tile, table) };
        for t in 0..NT {
            let qs = &y[t].0[b].qs;
            // Two chains against the instruction's latency; u <= 241 and |y| <= 127 keep
            // every i32 sum far from overflow.
            let (mut s0, mut s1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for k in (0..8).step_by(2) {
                s0 = _mm256_dpbusd_epi32(s0, u[k], bcast4(qs, k));
                s1 = _mm256_dpbusd_epi32(s1, u[k + 1], bcast4(qs, k + 1));
            }
            let s = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_set1_epi32(128 * y[t].2[b]));
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t].1[b]));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
    let mut out = [[0.0f32; 8]; NT];
    for t in 0..NT {
        // SAFETY: `out[t]` holds eight f32.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
    out
}
