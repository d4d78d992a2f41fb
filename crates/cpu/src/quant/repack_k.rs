//! Row-interleaved ("x8") Q4_K tiles against Q8_K activations.
//!
//! A tile holds super-block `b` of eight consecutive weight rows. Sub-block `j` (elements
//! `32j..32j+32`) occupies bytes `128j..128j+128` of `qs` in the `repack` Q5_0 nibble
//! layout: byte `32m + 4r + i` holds row `r`, element `8m + i` in its low nibble and
//! element `8m + 4 + i` in its high nibble, so after masking, register `k` carries
//! elements `4k..4k+4` of all eight rows and one broadcast activation word feeds eight
//! rows. Scales and mins are unpacked from their 6-bit packing at load time, so the inner
//! loop is `maddubs` (four-nibble-pair sums) + `madd` by the per-row scale.
//!
//! Per tile and token each row's integer dot `sumi = Σ_j sc_j Σ_{e∈j} q_e y_e` and min
//! term `summ = Σ_j m_j (bsum_{2j} + bsum_{2j+1})` are exact; then, in super-block order,
//! `acc += (dy·d)·sumi - (dy·dmin)·summ` without fused operations on every ISA. That is the
//! unpacked Q4_K kernel's formula step for step, so results are bitwise equal to it (and
//! across ISAs), and a token's result does not depend on which tokens share the call.

use minfer_gguf::quant::{scale_min_k4, BlockQ4K, BlockQ8K};

/// Eight rows' Q4_K super-blocks, interleaved by groups of four elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct TileQ4K {
    /// Row scales of the sub-block scales (f16 bits).
    pub(crate) d: [u16; 8],
    /// Row scales of the sub-block mins (f16 bits).
    pub(crate) dmin: [u16; 8],
    /// Byte `8j + r`: the 6-bit scale of row `r`, sub-block `j`.
    pub(crate) sc: [u8; 64],
    /// Byte `16q + 2r + i`: the 6-bit min of row `r`, sub-block `2q + i`.
    pub(crate) mins: [u8; 64],
    /// Sub-block `j`, byte `32m + 4r + i` at offset `128j`: row `r`, elements `8m + i`
    /// (low nibble) and `8m + 4 + i` (high nibble).
    pub(crate) qs: [u8; 1024],
}

impl TileQ4K {
    /// Interleaves super-block `b` of the given rows (`None`: a padding row of zeros).
    pub(crate) fn pack(rows: [Option<&[BlockQ4K]>; 8], b: usize) -> Self {
        let mut t: TileQ4K = bytemuck::Zeroable::zeroed();
        for (r, row) in rows.iter().enumerate() {
            let Some(row) = row else { continue };
            let blk = &row[b];
            t.d[r] = blk.d.to_bits();
            t.dmin[r] = blk.dmin.to_bits();
            for j in 0..8 {
                let (sc, m) = scale_min_k4(j, &blk.scales);
                t.sc[8 * j + r] = sc;
                t.mins[16 * (j / 2) + 2 * r + j % 2] = m;
            }
            // Source: sub-block j's element l is the (j % 2) nibble of qs[32 (j / 2) + l].
            let level = |j: usize, l: usize| (blk.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
            for j in 0..8 {
                for m in 0..4 {
                    for i in 0..4 {
                        t.qs[128 * j + 32 * m + 4 * r + i] =
                            level(j, 8 * m + i) | (level(j, 8 * m + 4 + i) << 4);
                    }
                }
            }
        }
        t
    }

    /// The 4-bit level of row `r`, element `e` (`0..256`).
    pub(crate) fn level(&self, r: usize, e: usize) -> i32 {
        let (j, k, i) = (e / 32, (e % 32) / 4, e % 4);
        let byte = self.qs[128 * j + 32 * (k / 2) + 4 * r + i];
        ((byte >> (4 * (k % 2))) & 0x0f) as i32
    }

    /// Sub-block `j` (`0..8`) as eight registers of levels: register `k`, byte `4r + i`
    /// is row `r`, element `32j + 4k + i` (the AVX2 and VNNI kernels' operand).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn unpack_avx2(&self, j: usize) -> [std::arch::x86_64::__m256i; 8] {
        use std::arch::x86_64::*;
        let q = &self.qs[128 * j..128 * j + 128];
        let m4 = _mm256_set1_epi8(0x0f);
        let mut u = [_mm256_setzero_si256(); 8];
        for m in 0..4 {
            // SAFETY: 32 bytes at 32m + 32 <= 128.
            let n = unsafe { _mm256_loadu_si256(q.as_ptr().add(32 * m).cast()) };
            u[2 * m] = _mm256_and_si256(n, m4);
            u[2 * m + 1] = _mm256_and_si256(_mm256_srli_epi16(n, 4), m4);
        }
        u
    }

    /// `acc + (dy·d)·sumi - (dy·dmin)·summ` per row, the step that ends one super-block
    /// for one token (`dw`, `dm`: the row scales widened; `sumi`: the rows' exact scaled
    /// level dots), shared by the AVX2 and VNNI kernels. No FMA: the roundings of the
    /// scalar reference.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn accumulate_avx2(
        &self,
        acc: std::arch::x86_64::__m256,
        yb: &BlockQ8K,
        sumi: std::arch::x86_64::__m256i,
        dw: std::arch::x86_64::__m256,
        dm: std::arch::x86_64::__m256,
    ) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the 16 bsums are 32 bytes.
        let bs = unsafe { _mm256_loadu_si256(yb.bsums.as_ptr().cast()) };
        // i16 lane j: bsum 2j + bsum 2j+1 (within ±4064); i32 lane q: pairs 2q, 2q+1.
        let pairs = _mm256_castsi128_si256(_mm_hadd_epi16(
            _mm256_castsi256_si128(bs),
            _mm256_extracti128_si256(bs, 1),
        ));
        let mut summ = _mm256_setzero_si256();
        for q in 0..4 {
            // SAFETY: 16 bytes at 16q + 16 <= 64 of `mins`.
            let mq = _mm256_cvtepu8_epi16(unsafe {
                _mm_loadu_si128(self.mins.as_ptr().add(16 * q).cast())
            });
            let bq = _mm256_permutevar8x32_epi32(pairs, _mm256_set1_epi32(q as i32));
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(mq, bq));
        }
        let dy = _mm256_set1_ps(yb.d);
        let a = _mm256_mul_ps(_mm256_mul_ps(dy, dw), _mm256_cvtepi32_ps(sumi));
        let m = _mm256_mul_ps(_mm256_mul_ps(dy, dm), _mm256_cvtepi32_ps(summ));
        _mm256_add_ps(acc, _mm256_sub_ps(a, m))
    }

    /// The 6-bit (scale, min) of row `r`, sub-block `j`.
    pub(crate) fn scale_min(&self, r: usize, j: usize) -> (i32, i32) {
        (
            self.sc[8 * j + r] as i32,
            self.mins[16 * (j / 2) + 2 * r + j % 2] as i32,
        )
    }
}

/// Scalar reference: for each of `NT` activation rows, the eight row results of the tile
/// sequence `w` (one row group); `y[t]` must hold at least `w.len()` super-blocks.
pub(crate) fn gemv_q4k_scalar<const NT: usize>(
    w: &[TileQ4K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    let y = y.map(|a| &a[..w.len()]);
    let mut acc = [[0.0f32; 8]; NT];
    for (b, tile) in w.iter().enumerate() {
        for t in 0..NT {
            let yb = &y[t][b];
            for (r, a) in acc[t].iter_mut().enumerate() {
                let (mut sumi, mut summ) = (0i32, 0i32);
                for j in 0..8 {
                    let (sc, m) = tile.scale_min(r, j);
                    let isum: i32 = (32 * j..32 * j + 32)
                        .map(|e| tile.level(r, e) * yb.qs[e] as i32)
                        .sum();
                    sumi += sc * isum;
                    summ += m * (yb.bsums[2 * j] as i32 + yb.bsums[2 * j + 1] as i32);
                }
                let d = half::f16::from_bits(tile.d[r]).to_f32();
                let dmin = half::f16::from_bits(tile.dmin[r]).to_f32();
                *a += (yb.d * d) * sumi as f32 - (yb.d * dmin) * summ as f32;
            }
        }
    }
    acc
}

/// AVX2 version of [`gemv_q4k_scalar`]: same exact integers, same float steps.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemv_q4k_avx2<const NT: usize>(
    w: &[TileQ4K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    use std::arch::x86_64::*;
    let y = y.map(|a| &a[..w.len()]);
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        // SAFETY (all loads below): offsets stay inside the tile's and the activation
        // block's arrays (16 bytes of each scale row, 8 of `sc`, 16 of `mins`, 32 of `qs`
        // at 128j + 32m < 1024, 4 of activation levels at 32j + 4k < 256, 32 of bsums).
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(tile.d.as_ptr().cast()));
        let dm = _mm256_cvtph_ps(_mm_loadu_si128(tile.dmin.as_ptr().cast()));
        let mut sumi = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            // Row r's scale in both i16 lanes of i32 lane r, to `madd` with pair sums.
            let s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(tile.sc.as_ptr().add(8 * j).cast()));
            let s = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
            let u = tile.unpack_avx2(j);
            for t in 0..NT {
                let qs = y[t][b].qs.as_ptr().add(32 * j);
                let mut p = [_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    let yk = _mm256_set1_epi32(qs.add(4 * k).cast::<i32>().read_unaligned());
                    p[k] = _mm256_maddubs_epi16(u[k], yk);
                }
                // q <= 15, |y| <= 127: eight pair sums reach at most 30480, inside i16.
                let s0 =
                    _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
                let s1 =
                    _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
                let v = _mm256_madd_epi16(_mm256_add_epi16(s0, s1), s);
                sumi[t] = _mm256_add_epi32(sumi[t], v);
            }
        }
        for t in 0..NT {
            acc[t] = tile.accumulate_avx2(acc[t], &y[t][b], sumi[t], dw, dm);
        }
    }
    let mut out = [[0.0f32; 8]; NT];
    for t in 0..NT {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
    out
}

/// Dispatches to the scalar, AVX2 or VNNI Q4_K tile kernel.
#[inline]
pub(crate) fn gemv_q4k<const NT: usize>(
    isa: super::Isa,
    w: &[TileQ4K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    match isa.0 {
        super::IsaKind::Scalar => gemv_q4k_scalar(w, y),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an `Avx2` value exists only after runtime detection of AVX2, FMA, F16C.
        super::IsaKind::Avx2 => unsafe { gemv_q4k_avx2(w, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Vnni` value exists only after runtime detection of its features.
        super::IsaKind::Vnni => unsafe { vnni::gemv_q4k(w, y) },
    }
}

#[cfg(target_arch = "x86_64")]
/// The AVX-512 VNNI kernels of these tiles: the AVX2 ones with the integer dots done by
/// `vpdpbusd` (the shared steps, and why the bits stay equal, are in `quant::vnni`).
mod vnni {
    use super::TileQ4K;
    use crate::quant::vnni::{dot_regs, store};
    use minfer_gguf::quant::BlockQ8K;
    use std::arch::x86_64::*;

    /// VNNI [`super::gemv_q4k_avx2`].
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
            crate::quant::simd::prefetch_ahead::<NT, _>(tile);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::quant::Quantize;

    fn blocks(n: usize, seed: u64) -> Vec<BlockQ4K> {
        let x = super::super::testutil::rand_f32(256 * n, seed, 1.0);
        x.chunks_exact(256).map(BlockQ4K::quantize).collect()
    }

    /// Packing keeps every level, scale and min of every row, and padding rows are zero.
    #[test]
    fn pack_round_trips() {
        let rows: Vec<Vec<BlockQ4K>> = (0..7).map(|r| blocks(2, 40 + r)).collect();
        let refs: [Option<&[BlockQ4K]>; 8] = std::array::from_fn(|r| rows.get(r).map(|v| &v[..]));
        for b in 0..2 {
            let t = TileQ4K::pack(refs, b);
            for (r, row) in rows.iter().enumerate() {
                let blk = &row[b];
                assert_eq!((t.d[r], t.dmin[r]), (blk.d.to_bits(), blk.dmin.to_bits()));
                for j in 0..8 {
                    let (sc, m) = scale_min_k4(j, &blk.scales);
                    assert_eq!(t.scale_min(r, j), (sc as i32, m as i32));
                    for l in 0..32 {
                        let want = (blk.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
                        assert_eq!(t.level(r, 32 * j + l), want as i32, "r={r} j={j} l={l}");
                    }
                }
            }
            assert!((0..256).all(|e| t.level(7, e) == 0) && t.d[7] == 0 && t.dmin[7] == 0);
        }
    }

    /// The AVX2 kernel replays the scalar reference bitwise, for every token count.
    #[test]
    fn kernels_agree_bitwise() {
        let rows: Vec<Vec<BlockQ4K>> = (0..8).map(|r| blocks(3, 60 + r)).collect();
        let refs: [Option<&[BlockQ4K]>; 8] = std::array::from_fn(|r| Some(&rows[r][..]));
        let tiles: Vec<TileQ4K> = (0..3).map(|b| TileQ4K::pack(refs, b)).collect();
        let acts: Vec<Vec<BlockQ8K>> = (0..4)
            .map(|t| {
                let x = super::super::testutil::rand_f32(768, 70 + t, 3.0);
                x.chunks_exact(256).map(BlockQ8K::quantize).collect()
            })
            .collect();
        let y4 = [&acts[0][..], &acts[1][..], &acts[2][..], &acts[3][..]];
        let want = gemv_q4k_scalar(&tiles, y4);
        for isa in super::super::testutil::isas() {
            let got = gemv_q4k(isa, &tiles, y4);
            assert_eq!(
                got.map(|r| r.map(f32::to_bits)),
                want.map(|r| r.map(f32::to_bits))
            );
            let one = gemv_q4k(isa, &tiles, [y4[2]]);
            assert_eq!(
                one[0].map(f32::to_bits),
                want[2].map(f32::to_bits),
                "{isa:?}"
            );
        }
    }
}
