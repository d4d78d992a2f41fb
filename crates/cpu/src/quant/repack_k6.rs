//! Row-interleaved ("x8") Q6_K tiles against Q8_K activations.
//!
//! A tile holds super-block `b` of eight consecutive weight rows as unsigned levels `q`
//! (`0..64`, the stored value; the weight level is `q - 32`). Sub-block `j` (elements
//! `32j..32j+32`) occupies the 192 bytes `q[192j..192j+192]`: first its low nibbles in the
//! `repack_k` layout (byte `32m + 4r + i`: row `r`, element `8m + i` low, `8m + 4 + i`
//! high), then its top two bits (byte `128 + 32h + 4r + i`: bits `2i'..2i'+2` belong to row
//! `r`, element `4(4h + i') + i`). After unpacking, register `k` carries elements
//! `4k..4k+4` of all eight rows, so one broadcast activation word feeds eight rows.
//!
//! Keeping each sub-block's bytes together makes a decode pass read every tile front to
//! back. With the low nibbles and the top bits in two separate arrays, the reads alternated
//! between two places 1 KiB apart, which the hardware prefetcher did not follow: decode ran
//! at about 7.5 GB/s on one thread instead of streaming.
//!
//! Per tile and token each row's integer dot
//! `sumi = Σ_g sc_g Σ_{e∈g} q_e y_e - 32 Σ_g sc_g bsum_g` is exact, then
//! `acc += (dy·d)·sumi` in super-block order without fused operations on every ISA: the
//! unpacked Q6_K kernel's formula step for step, so results are bitwise equal to it (and
//! across ISAs) and a token's result does not depend on which tokens share the call.

use minfer_gguf::quant::{BlockQ6K, BlockQ8K};

/// Eight rows' Q6_K super-blocks, interleaved by groups of four elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct TileQ6K {
    /// The eight row scales (f16 bits).
    pub(crate) d: [u16; 8],
    /// Byte `16q + 2r + i`: the signed scale of row `r`, 16-element group `2q + i`.
    pub(crate) sc: [i8; 128],
    /// Per sub-block `j`, 192 bytes at `192j`: 128 of low nibbles, then 64 of top bits;
    /// see the module docs.
    pub(crate) q: [u8; 1536],
}

impl TileQ6K {
    /// Interleaves super-block `b` of the given rows (`None`: a padding row of zeros).
    pub(crate) fn pack(rows: [Option<&[BlockQ6K]>; 8], b: usize) -> Self {
        let mut t: TileQ6K = bytemuck::Zeroable::zeroed();
        for (r, row) in rows.iter().enumerate() {
            let Some(row) = row else { continue };
            let blk = &row[b];
            t.d[r] = blk.d.to_bits();
            for g in 0..16 {
                t.sc[16 * (g / 2) + 2 * r + g % 2] = blk.scales[g];
            }
            // Source element 128n + 32k + l: see `BlockQ6K`.
            let level = |e: usize| {
                let (n, k, l) = (e / 128, (e % 128) / 32, e % 32);
                let low = (blk.ql[64 * n + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
                low | (((blk.qh[32 * n + l] >> (2 * k)) & 3) << 4)
            };
            for j in 0..8 {
                for i in 0..4 {
                    for m in 0..4 {
                        let (a, c) = (level(32 * j + 8 * m + i), level(32 * j + 8 * m + 4 + i));
                        t.q[192 * j + 32 * m + 4 * r + i] = (a & 0x0f) | ((c & 0x0f) << 4);
                    }
                    for h in 0..2 {
                        t.q[192 * j + 128 + 32 * h + 4 * r + i] = (0..4).fold(0, |acc, ii| {
                            acc | ((level(32 * j + 4 * (4 * h + ii) + i) >> 4) << (2 * ii))
                        });
                    }
                }
            }
        }
        t
    }

    /// The unsigned level (`0..64`) of row `r`, element `e` (`0..256`).
    pub(crate) fn level(&self, r: usize, e: usize) -> i32 {
        let (j, k, i) = (e / 32, (e % 32) / 4, e % 4);
        let lo = (self.q[192 * j + 32 * (k / 2) + 4 * r + i] >> (4 * (k % 2))) & 0x0f;
        let hi = (self.q[192 * j + 128 + 32 * (k / 4) + 4 * r + i] >> (2 * (k % 4))) & 3;
        (lo | (hi << 4)) as i32
    }

    /// The signed scale of row `r`, group `g` (`0..16`).
    pub(crate) fn scale(&self, r: usize, g: usize) -> i32 {
        self.sc[16 * (g / 2) + 2 * r + g % 2] as i32
    }

    /// Sub-block `j` (`0..8`) as eight registers of unsigned levels: register `k`, byte
    /// `4r + i` is row `r`, element `32j + 4k + i` (the AVX2 and VNNI kernels' operand).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) fn unpack_avx2(&self, j: usize) -> [std::arch::x86_64::__m256i; 8] {
        use std::arch::x86_64::*;
        let q = &self.q[192 * j..192 * j + 192];
        let (m4, m30) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
        let mut u = [_mm256_setzero_si256(); 8];
        for m in 0..4 {
            // SAFETY: 32 bytes at 32m + 32 <= 128 of the sub-block's 192.
            let n = unsafe { _mm256_loadu_si256(q.as_ptr().add(32 * m).cast()) };
            u[2 * m] = _mm256_and_si256(n, m4);
            u[2 * m + 1] = _mm256_and_si256(_mm256_srli_epi16(n, 4), m4);
        }
        for h in 0..2 {
            // SAFETY: 32 bytes at 128 + 32h + 32 <= 192.
            let t = unsafe { _mm256_loadu_si256(q.as_ptr().add(128 + 32 * h).cast()) };
            // Bits 2i'..2i'+2 moved to bits 4..6 (16-bit shifts by at most 4 only carry
            // bits the mask removes).
            let k = 4 * h;
            u[k] = _mm256_or_si256(u[k], _mm256_and_si256(_mm256_slli_epi16(t, 4), m30));
            u[k + 1] = _mm256_or_si256(u[k + 1], _mm256_and_si256(_mm256_slli_epi16(t, 2), m30));
            u[k + 2] = _mm256_or_si256(u[k + 2], _mm256_and_si256(t, m30));
            u[k + 3] = _mm256_or_si256(u[k + 3], _mm256_and_si256(_mm256_srli_epi16(t, 2), m30));
        }
        u
    }
}

/// Scalar reference: for each of `NT` activation rows, the eight row results of the tile
/// sequence `w` (one row group); `y[t]` must hold at least `w.len()` super-blocks.
pub(crate) fn gemv_q6k_scalar<const NT: usize>(
    w: &[TileQ6K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    let y = y.map(|a| &a[..w.len()]);
    let mut acc = [[0.0f32; 8]; NT];
    for (b, tile) in w.iter().enumerate() {
        for t in 0..NT {
            let yb = &y[t][b];
            for (r, a) in acc[t].iter_mut().enumerate() {
                let mut sumi = 0i32;
                for g in 0..16 {
                    let sc = tile.scale(r, g);
                    let part: i32 = (16 * g..16 * g + 16)
                        .map(|e| tile.level(r, e) * yb.qs[e] as i32)
                        .sum();
                    sumi += sc * part - 32 * sc * yb.bsums[g] as i32;
                }
                let d = half::f16::from_bits(tile.d[r]).to_f32();
                *a += (yb.d * d) * sumi as f32;
            }
        }
    }
    acc
}

/// AVX2 version of [`gemv_q6k_scalar`]: same exact integers, same float steps.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemv_q6k_avx2<const NT: usize>(
    w: &[TileQ6K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    use std::arch::x86_64::*;
    let y = y.map(|a| &a[..w.len()]);
    // Duplicate the even (odd) i16 lane of each i32 lane into both of its halves.
    let even = _mm256_setr_epi8(
        0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12,
        13, 12, 13,
    );
    let odd = _mm256_add_epi8(even, _mm256_set1_epi8(2));
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        // SAFETY (all loads below): offsets stay inside the tile's and the activation
        // block's arrays (16 bytes of `d` and of `sc` at 16j < 128, 32 of `q` at
        // 192j + 32m + 32 <= 1536 and at 192j + 128 + 32h + 32 <= 1536, 4 activation levels at
        // 32j + 4k < 256, 32 of bsums).
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(tile.d.as_ptr().cast()));
        let mut sumi = [_mm256_setzero_si256(); NT];
        let mut corr = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            // i16 lanes (2r, 2r+1): row r's scales of groups 2j and 2j+1.
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(tile.sc.as_ptr().add(16 * j).cast()));
            let (s_ev, s_od) = (_mm256_shuffle_epi8(sc, even), _mm256_shuffle_epi8(sc, odd));
            let u = tile.unpack_avx2(j);
            for t in 0..NT {
                let qs = y[t][b].qs.as_ptr().add(32 * j);
                let mut p = [_mm256_setzero_si256(); 8];
                for k in 0..8 {
                    let yk = _mm256_set1_epi32(qs.add(4 * k).cast::<i32>().read_unaligned());
                    p[k] = _mm256_maddubs_epi16(u[k], yk);
                }
                // q <= 63, |y| <= 127: two pair sums reach at most 32004, inside i16.
                let a = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), s_ev),
                    _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), s_ev),
                );
                let c = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_add_epi16(p[4], p[5]), s_od),
                    _mm256_madd_epi16(_mm256_add_epi16(p[6], p[7]), s_od),
                );
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(a, c));
                // i32 lane j of the bsums: groups 2j and 2j+1.
                let bs = _mm256_loadu_si256(y[t][b].bsums.as_ptr().cast());
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
    let mut out = [[0.0f32; 8]; NT];
    for t in 0..NT {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
    out
}

/// Dispatches to the scalar, AVX2 or VNNI Q6_K tile kernel.
#[inline]
pub(crate) fn gemv_q6k<const NT: usize>(
    isa: super::Isa,
    w: &[TileQ6K],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    match isa.0 {
        super::IsaKind::Scalar => gemv_q6k_scalar(w, y),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an `Avx2` value exists only after runtime detection of AVX2, FMA, F16C.
        super::IsaKind::Avx2 => unsafe { gemv_q6k_avx2(w, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Vnni` value exists only after runtime detection of its features.
        super::IsaKind::Vnni => unsafe { vnni::gemv_q6k(w, y) },
    }
}

#[cfg(target_arch = "x86_64")]
/// The AVX-512 VNNI kernels of these tiles: the AVX2 ones with the integer dots done by
/// `vpdpbusd` (the shared steps, and why the bits stay equal, are in `quant::vnni`).
mod vnni {
    use super::TileQ6K;
    use crate::quant::vnni::{dot_regs, store};
    use minfer_gguf::quant::BlockQ8K;
    use std::arch::x86_64::*;

    /// VNNI [`super::gemv_q6k_avx2`].
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
            crate::quant::simd::prefetch_ahead::<NT, _>(tile);
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
                    let v = _mm256_add_epi32(
                        _mm256_mullo_epi32(ev, s_ev),
                        _mm256_mullo_epi32(od, s_od),
                    );
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::quant::Quantize;

    fn blocks(n: usize, seed: u64) -> Vec<BlockQ6K> {
        let x = super::super::testutil::rand_f32(256 * n, seed, 1.0);
        x.chunks_exact(256).map(BlockQ6K::quantize).collect()
    }

    /// Packing keeps every level and scale of every row, and padding rows are zero.
    #[test]
    fn pack_round_trips() {
        let rows: Vec<Vec<BlockQ6K>> = (0..7).map(|r| blocks(2, 80 + r)).collect();
        let refs: [Option<&[BlockQ6K]>; 8] = std::array::from_fn(|r| rows.get(r).map(|v| &v[..]));
        for b in 0..2 {
            let t = TileQ6K::pack(refs, b);
            for (r, row) in rows.iter().enumerate() {
                let blk = &row[b];
                assert_eq!(t.d[r], blk.d.to_bits());
                for g in 0..16 {
                    assert_eq!(t.scale(r, g), blk.scales[g] as i32);
                }
                for e in 0..256 {
                    let (n, k, l) = (e / 128, (e % 128) / 32, e % 32);
                    let low = (blk.ql[64 * n + l + 32 * (k % 2)] >> (4 * (k / 2))) & 0x0f;
                    let want = low | (((blk.qh[32 * n + l] >> (2 * k)) & 3) << 4);
                    assert_eq!(t.level(r, e), want as i32, "r={r} e={e}");
                }
            }
            assert!((0..256).all(|e| t.level(7, e) == 0) && t.d[7] == 0);
        }
    }

    /// The AVX2 kernel replays the scalar reference bitwise, for every token count.
    #[test]
    fn kernels_agree_bitwise() {
        let rows: Vec<Vec<BlockQ6K>> = (0..8).map(|r| blocks(3, 90 + r)).collect();
        let refs: [Option<&[BlockQ6K]>; 8] = std::array::from_fn(|r| Some(&rows[r][..]));
        let tiles: Vec<TileQ6K> = (0..3).map(|b| TileQ6K::pack(refs, b)).collect();
        let acts: Vec<Vec<BlockQ8K>> = (0..4)
            .map(|t| {
                let x = super::super::testutil::rand_f32(768, 100 + t, 3.0);
                x.chunks_exact(256).map(BlockQ8K::quantize).collect()
            })
            .collect();
        let y4 = [&acts[0][..], &acts[1][..], &acts[2][..], &acts[3][..]];
        let want = gemv_q6k_scalar(&tiles, y4);
        for isa in super::super::testutil::isas() {
            let got = gemv_q6k(isa, &tiles, y4);
            assert_eq!(
                got.map(|r| r.map(f32::to_bits)),
                want.map(|r| r.map(f32::to_bits))
            );
            let one = gemv_q6k(isa, &tiles, [y4[2]]);
            assert_eq!(
                one[0].map(f32::to_bits),
                want[2].map(f32::to_bits),
                "{isa:?}"
            );
        }
    }
}
