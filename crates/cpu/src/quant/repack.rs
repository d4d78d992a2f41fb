//! Row-interleaved ("x8") layouts of the 32-element types and their kernels.
//!
//! A tile holds block `b` of eight consecutive weight rows, arranged so that one 32-byte
//! register `k` (`k` in `0..8`) carries elements `4k..4k+4` of all eight rows: byte
//! `4r + i` is row `r`, element `4k + i`. Broadcasting the four matching activation bytes
//! then lets one `maddubs`/`madd` pair produce eight per-row partial sums at once, so the
//! eight lanes of the accumulator are eight output rows and no horizontal sum is needed.
//!
//! Per tile and token the integer dot of each row is exact; then, in block order,
//! `acc[r] = fma(d_r * dy, isum_r, acc[r])` on every ISA, so the scalar reference and the
//! AVX2 kernel agree bitwise and a token's result does not depend on which tokens share the
//! call.
//!
//! Q5_0 tiles store the unsigned levels `q + 16` (low nibbles packed two registers per 32
//! bytes, fifth bits as a bit plane: bit `k` of byte `j` belongs to register `k`), so the
//! kernel needs no sign trick: `Σ (u - 16) y = Σ u y - 16 Σ y` with `Σ y` precomputed per
//! activation block. Tiles are exactly as large as the eight source blocks.

use minfer_gguf::quant::{Block, BlockQ5_0, BlockQ8_0};

/// Eight rows' Q8_0 blocks, interleaved by groups of four elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct TileQ8 {
    /// The eight row scales (f16 bits).
    pub(crate) d: [u16; 8],
    /// Register `k`, byte `4r + i`: row `r`, element `4k + i`.
    pub(crate) qs: [i8; 256],
}

/// Eight rows' Q5_0 blocks as unsigned levels `q + 16`.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct TileQ5 {
    /// The eight row scales (f16 bits).
    pub(crate) d: [u16; 8],
    /// Bytes `32m..32m+32`: low nibbles of register `2m`, high nibbles of register `2m+1`.
    pub(crate) nib: [u8; 128],
    /// Bit `k` of byte `j`: the fifth bit of register `k`, byte `j`.
    pub(crate) hb: [u8; 32],
}

/// A tile type: built from eight source rows' blocks, with a scalar and an AVX2 kernel.
pub(crate) trait Tile: bytemuck::Pod + Send + Sync {
    /// The source block type.
    type Src: Block + Sync;

    /// Interleaves block `b` of the given rows (`None`: a padding row of zeros).
    fn pack(rows: [Option<&[Self::Src]>; 8], b: usize) -> Self;

    /// The signed level of row `r`, element `e`.
    fn level(&self, r: usize, e: usize) -> i32;

    /// The scale of row `r`.
    fn scale(&self, r: usize) -> f32 {
        half::f16::from_bits(self.scale_bits()[r]).to_f32()
    }

    /// The eight row scales as f16 bits.
    fn scale_bits(&self) -> &[u16; 8];

    /// The AVX2 kernel; see [`gemv_scalar`] for the contract.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn gemv_avx2<const NT: usize>(w: &[Self], y: [Act<'_>; NT]) -> [[f32; 8]; NT];

    /// The VNNI kernel (bitwise equal to the AVX2 one).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI.
    #[cfg(target_arch = "x86_64")]
    unsafe fn gemv_vnni<const NT: usize>(w: &[Self], y: [Act<'_>; NT]) -> [[f32; 8]; NT];
}

/// One activation row: Q8_0 blocks with their scales widened to f32 and their level sums.
#[derive(Clone, Copy)]
pub(crate) struct Act<'a> {
    /// The quantized blocks.
    pub(crate) q: &'a [BlockQ8_0],
    /// `q[b].d` as f32.
    pub(crate) d: &'a [f32],
    /// `Σ q[b].qs`.
    pub(crate) s: &'a [i32],
}

impl<'a> Act<'a> {
    /// The first `n` blocks (panics if shorter: callers size activations to the weights).
    fn take(self, n: usize) -> Act<'a> {
        Act {
            q: &self.q[..n],
            d: &self.d[..n],
            s: &self.s[..n],
        }
    }
}

/// Fills the f32 scales and level sums of Q8_0 blocks.
pub(crate) fn act_sidecar(q: &[BlockQ8_0], d: &mut [f32], s: &mut [i32]) {
    for ((b, d), s) in q.iter().zip(d).zip(s) {
        *d = b.d.to_f32();
        *s = b.qs.iter().map(|&v| v as i32).sum();
    }
}

impl Tile for TileQ8 {
    type Src = BlockQ8_0;

    fn pack(rows: [Option<&[BlockQ8_0]>; 8], b: usize) -> Self {
        let mut t: TileQ8 = bytemuck::Zeroable::zeroed();
        for (r, row) in rows.iter().enumerate() {
            if let Some(row) = row {
                let blk = &row[b];
                t.d[r] = blk.d.to_bits();
                for k in 0..8 {
                    t.qs[32 * k + 4 * r..32 * k + 4 * r + 4]
                        .copy_from_slice(&blk.qs[4 * k..4 * k + 4]);
                }
            }
        }
        t
    }

    fn level(&self, r: usize, e: usize) -> i32 {
        self.qs[32 * (e / 4) + 4 * r + e % 4] as i32
    }

    fn scale_bits(&self) -> &[u16; 8] {
        &self.d
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gemv_avx2<const NT: usize>(w: &[Self], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
        avx2::gemv_q8(w, y)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    unsafe fn gemv_vnni<const NT: usize>(w: &[Self], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
        // SAFETY: the caller guarantees the features.
        unsafe { vnni::gemv_q8(w, y) }
    }
}

impl TileQ5 {
    /// The block as eight registers of unsigned levels `q + 16`: register `k`, byte
    /// `4r + i` is row `r`, element `4k + i` (the AVX2 and VNNI kernels' operand).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn unpack_avx2(&self) -> [std::arch::x86_64::__m256i; 8] {
        use std::arch::x86_64::*;
        let (m4, b4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
        // SAFETY: `hb` is 32 bytes.
        let h = unsafe { _mm256_loadu_si256(self.hb.as_ptr().cast()) };
        // Bit k of each byte moved to bit 4 (16-bit shifts by at most 4 keep the moved bit
        // inside its byte).
        let hi = [
            _mm256_and_si256(_mm256_slli_epi16(h, 4), b4),
            _mm256_and_si256(_mm256_slli_epi16(h, 3), b4),
            _mm256_and_si256(_mm256_slli_epi16(h, 2), b4),
            _mm256_and_si256(_mm256_slli_epi16(h, 1), b4),
            _mm256_and_si256(h, b4),
            _mm256_and_si256(_mm256_srli_epi16(h, 1), b4),
            _mm256_and_si256(_mm256_srli_epi16(h, 2), b4),
            _mm256_and_si256(_mm256_srli_epi16(h, 3), b4),
        ];
        let mut u = [_mm256_setzero_si256(); 8];
        for m in 0..4 {
            // SAFETY: 32 bytes at 32m + 32 <= 128 of `nib`.
            let n = unsafe { _mm256_loadu_si256(self.nib.as_ptr().add(32 * m).cast()) };
            u[2 * m] = _mm256_or_si256(_mm256_and_si256(n, m4), hi[2 * m]);
            u[2 * m + 1] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n, 4), m4), hi[2 * m + 1]);
        }
        u
    }
}

impl Tile for TileQ5 {
    type Src = BlockQ5_0;

    fn pack(rows: [Option<&[BlockQ5_0]>; 8], b: usize) -> Self {
        let mut t: TileQ5 = bytemuck::Zeroable::zeroed();
        // u[r][e]: the stored five bits, which already are `q + 16` (element e < 16 takes
        // the low nibble of qs[e], element e + 16 the high one; bit e of qh is the fifth).
        let mut u = [[0u8; 32]; 8];
        for (r, row) in rows.iter().enumerate() {
            let Some(row) = row else { continue };
            let blk = &row[b];
            t.d[r] = blk.d.to_bits();
            let h = u32::from_le_bytes(blk.qh);
            for e in 0..16 {
                u[r][e] = (blk.qs[e] & 0x0f) | ((((h >> e) & 1) as u8) << 4);
                u[r][e + 16] = (blk.qs[e] >> 4) | ((((h >> (e + 16)) & 1) as u8) << 4);
            }
        }
        for (r, ur) in u.iter().enumerate() {
            for i in 0..4 {
                let j = 4 * r + i;
                for m in 0..4 {
                    let (a, c) = (ur[8 * m + i], ur[8 * m + 4 + i]);
                    t.nib[32 * m + j] = (a & 0x0f) | (c << 4);
                }
                t.hb[j] = (0..8).fold(0, |acc, k| acc | ((ur[4 * k + i] >> 4) << k));
            }
        }
        t
    }

    fn level(&self, r: usize, e: usize) -> i32 {
        let (k, j) = (e / 4, 4 * r + e % 4);
        let lo = (self.nib[32 * (k / 2) + j] >> (4 * (k % 2))) & 0x0f;
        let hi = (self.hb[j] >> k) & 1;
        (lo | (hi << 4)) as i32 - 16
    }

    fn scale_bits(&self) -> &[u16; 8] {
        &self.d
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gemv_avx2<const NT: usize>(w: &[Self], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
        avx2::gemv_q5(w, y)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    unsafe fn gemv_vnni<const NT: usize>(w: &[Self], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
        // SAFETY: the caller guarantees the features.
        unsafe { vnni::gemv_q5(w, y) }
    }
}

/// Scalar reference: for each of `NT` activation rows, the eight row results of the tile
/// sequence `w` (one row group); `y[t]` must hold at least `w.len()` blocks.
pub(crate) fn gemv_scalar<T: Tile, const NT: usize>(w: &[T], y: [Act<'_>; NT]) -> [[f32; 8]; NT] {
    let y = y.map(|a| a.take(w.len()));
    let mut acc = [[0.0f32; 8]; NT];
    for (b, tile) in w.iter().enumerate() {
        for t in 0..NT {
            let yb = &y[t].q[b];
            for (r, a) in acc[t].iter_mut().enumerate() {
                let isum: i32 = (0..32).map(|e| tile.level(r, e) * yb.qs[e] as i32).sum();
                *a = (tile.scale(r) * y[t].d[b]).mul_add(isum as f32, *a);
            }
        }
    }
    acc
}

#[cfg(target_arch = "x86_64")]
/// The AVX-512 VNNI kernels of these tiles: the AVX2 ones with the integer dots done by
/// `vpdpbusd` (the shared steps, and why the bits stay equal, are in `quant::vnni`).
mod vnni {
    use super::{Act, TileQ5, TileQ8};
    use crate::quant::vnni::{bcast4, dot_regs, store};
    use std::arch::x86_64::*;

    /// VNNI [`super::Tile::gemv_avx2`] for Q8_0 tiles.
    ///
    /// # Safety
    /// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI required.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn gemv_q8<const NT: usize>(
        w: &[TileQ8],
        y: [Act<'_>; NT],
    ) -> [[f32; 8]; NT] {
        let n = w.len();
        let y = y.map(|a| (&a.q[..n], &a.d[..n]));
        let mut acc = [_mm256_setzero_ps(); NT];
        for (b, tile) in w.iter().enumerate() {
            crate::quant::simd::prefetch_ahead::<NT, _>(tile);
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

    /// VNNI [`super::Tile::gemv_avx2`] for Q5_0 tiles.
    ///
    /// # Safety
    /// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI required.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(crate) unsafe fn gemv_q5<const NT: usize>(
        w: &[TileQ5],
        y: [Act<'_>; NT],
    ) -> [[f32; 8]; NT] {
        let n = w.len();
        let y = y.map(|a| (&a.q[..n], &a.d[..n], &a.s[..n]));
        let mut acc = [_mm256_setzero_ps(); NT];
        for (b, tile) in w.iter().enumerate() {
            crate::quant::simd::prefetch_ahead::<NT, _>(tile);
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
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Act, TileQ5, TileQ8};
    use std::arch::x86_64::*;

    /// The four activation bytes `4k..4k+4` of `qs`, broadcast to every lane.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bcast4(qs: &[i8; 32], k: usize) -> __m256i {
        debug_assert!(k < 8);
        // SAFETY: 4k + 4 <= 32 bytes of `qs`; unaligned read.
        _mm256_set1_epi32(qs.as_ptr().add(4 * k).cast::<i32>().read_unaligned())
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store<const NT: usize>(acc: [__m256; NT]) -> [[f32; 8]; NT] {
        let mut out = [[0.0f32; 8]; NT];
        for t in 0..NT {
            _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
        }
        out
    }

    /// # Safety
    /// AVX2/FMA/F16C required.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gemv_q8<const NT: usize>(
        w: &[TileQ8],
        y: [Act<'_>; NT],
    ) -> [[f32; 8]; NT] {
        let y = y.map(|a| a.take(w.len()));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); NT];
        for (b, tile) in w.iter().enumerate() {
            crate::quant::simd::prefetch_ahead::<NT, _>(tile);
            // SAFETY: 16 bytes of scales.
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(tile.d.as_ptr().cast()));
            let mut sum = [_mm256_setzero_si256(); NT];
            for k in 0..8 {
                // SAFETY: register k is bytes 32k..32k+32 of the 256.
                let wk = _mm256_loadu_si256(tile.qs.as_ptr().add(32 * k).cast());
                let ak = _mm256_sign_epi8(wk, wk);
                for t in 0..NT {
                    let yk = _mm256_sign_epi8(bcast4(&y[t].q[b].qs, k), wk);
                    // |w| <= 128 and |y| <= 127: pair sums fit i16.
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ak, yk), ones);
                    sum[t] = _mm256_add_epi32(sum[t], p);
                }
            }
            for t in 0..NT {
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t].d[b]));
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum[t]), acc[t]);
            }
        }
        store(acc)
    }

    /// # Safety
    /// AVX2/FMA/F16C required.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn gemv_q5<const NT: usize>(
        w: &[TileQ5],
        y: [Act<'_>; NT],
    ) -> [[f32; 8]; NT] {
        let y = y.map(|a| a.take(w.len()));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); NT];
        for (b, tile) in w.iter().enumerate() {
            crate::quant::simd::prefetch_ahead::<NT, _>(tile);
            // SAFETY: 16 bytes of scales, 32 of fifth bits, 4 x 32 of nibbles.
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(tile.d.as_ptr().cast()));
            let u = tile.unpack_avx2();
            for t in 0..NT {
                let qs = &y[t].q[b].qs;
                // (A loop, not `array::from_fn`: closures do not inherit target features.)
                let mut p = [_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    p[k] = _mm256_maddubs_epi16(u[k], bcast4(qs, k));
                }
                // u <= 31, |y| <= 127: four pair sums reach at most 31496, inside i16.
                let s0 =
                    _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
                let s1 =
                    _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
                let s = _mm256_add_epi32(_mm256_madd_epi16(s0, ones), _mm256_madd_epi16(s1, ones));
                let s = _mm256_sub_epi32(s, _mm256_set1_epi32(16 * y[t].s[b]));
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t].d[b]));
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[t]);
            }
        }
        store(acc)
    }
}

/// Dispatches to the scalar, AVX2 or VNNI kernel of `T`.
#[inline]
pub(crate) fn gemv<T: Tile, const NT: usize>(
    isa: super::Isa,
    w: &[T],
    y: [Act<'_>; NT],
) -> [[f32; 8]; NT] {
    match isa.0 {
        super::IsaKind::Scalar => gemv_scalar(w, y),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an `Avx2` value exists only after runtime detection of AVX2, FMA, F16C.
        super::IsaKind::Avx2 => unsafe { T::gemv_avx2(w, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Vnni` value exists only after runtime detection of its features.
        super::IsaKind::Vnni => unsafe { T::gemv_vnni(w, y) },
    }
}
