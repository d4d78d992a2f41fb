//! Row-interleaved ("x8") IQ4_XS tiles against Q8_K activations.
//!
//! A tile holds super-block `b` of eight consecutive weight rows: the eight f16 scales,
//! the signed sub-block scales `ls - 32` (byte `8j + r`: row `r`, sub-block `j`), and the
//! 4-bit codes of sub-block `j` at bytes `128j..128j+128` in the layout of `repack_nl`
//! (byte `32m + 4r + i`: row `r`, element `8m + i` low, `8m + 4 + i` high). The tile is
//! 16 bytes larger than its eight source blocks (the sub-scales unpacked to bytes).
//!
//! Per tile and token each row's integer dot `sumi = Σ_j s_j Σ_{e∈j} K[q_e] y_e` is exact
//! (levels by byte shuffle, the sign trick for `maddubs`, pairs times the scale by
//! `madd`), then `acc += (d · dy) · sumi` in super-block order without fused operations:
//! the unpacked IQ4_XS kernel's formula (`grouped`), so results are bitwise equal to it
//! and across ISAs. The VNNI kernel multiplies the unsigned levels `K + 128` by
//! `vpdpbusd` and subtracts `128 * Σ_j y` (from the activation's block sums) per
//! sub-block before scaling: the same exact integers.

use minfer_gguf::quant::{BlockIq4Xs, BlockQ8K, KVALUES_IQ4NL};

/// Eight rows' IQ4_XS super-blocks, interleaved by groups of four elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct TileIq4Xs {
    /// Row scales (f16 bits).
    pub(crate) d: [u16; 8],
    /// Byte `8j + r`: the signed scale `ls - 32` of row `r`, sub-block `j`.
    pub(crate) sc: [i8; 64],
    /// Sub-block `j`, byte `32m + 4r + i` at offset `128j`: codes of row `r`, elements
    /// `8m + i` (low nibble) and `8m + 4 + i` (high nibble).
    pub(crate) qs: [u8; 1024],
}

const _: () = assert!(std::mem::size_of::<TileIq4Xs>() == 8 * 136 + 16);

impl TileIq4Xs {
    /// Interleaves super-block `b` of the given rows (`None`: a padding row of zeros).
    pub(crate) fn pack(rows: [Option<&[BlockIq4Xs]>; 8], b: usize) -> Self {
        let mut t: TileIq4Xs = bytemuck::Zeroable::zeroed();
        for (r, row) in rows.iter().enumerate() {
            let Some(row) = row else { continue };
            let blk = &row[b];
            t.d[r] = blk.d.to_bits();
            for j in 0..8 {
                t.sc[8 * j + r] = (blk.sub_scale(j) - 32) as i8;
                let q = &blk.qs[16 * j..16 * j + 16];
                let code = |e: usize| if e < 16 { q[e] & 0x0f } else { q[e - 16] >> 4 };
                for m in 0..4 {
                    for i in 0..4 {
                        t.qs[128 * j + 32 * m + 4 * r + i] =
                            code(8 * m + i) | (code(8 * m + 4 + i) << 4);
                    }
                }
            }
        }
        t
    }

    /// The level `K[q]` of row `r`, element `e` (without the sub-block scale).
    pub(crate) fn level(&self, r: usize, e: usize) -> i32 {
        let (j, k, i) = (e / 32, (e % 32) / 4, e % 4);
        let byte = self.qs[128 * j + 32 * (k / 2) + 4 * r + i];
        KVALUES_IQ4NL[((byte >> (4 * (k % 2))) & 0x0f) as usize] as i32
    }
}

/// Scalar reference: for each of `NT` activation rows, the eight row results of the tile
/// sequence `w` (one row group); `y[t]` must hold at least `w.len()` super-blocks.
pub(crate) fn gemv_iq4xs_scalar<const NT: usize>(
    w: &[TileIq4Xs],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    let y = y.map(|a| &a[..w.len()]);
    let mut acc = [[0.0f32; 8]; NT];
    for (b, tile) in w.iter().enumerate() {
        for t in 0..NT {
            let yb = &y[t][b];
            for (r, a) in acc[t].iter_mut().enumerate() {
                let mut sumi = 0i32;
                for j in 0..8 {
                    let isum: i32 = (32 * j..32 * j + 32)
                        .map(|e| tile.level(r, e) * yb.qs[e] as i32)
                        .sum();
                    sumi += tile.sc[8 * j + r] as i32 * isum;
                }
                let d = half::f16::from_bits(tile.d[r]).to_f32();
                *a += (d * yb.d) * sumi as f32;
            }
        }
    }
    acc
}

/// AVX2 version of [`gemv_iq4xs_scalar`]: same exact integers, same float steps.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn gemv_iq4xs_avx2<const NT: usize>(
    w: &[TileIq4Xs],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    use std::arch::x86_64::*;
    let y = y.map(|a| &a[..w.len()]);
    // SAFETY (all loads below): offsets stay inside the table (16 bytes), the tile's
    // arrays (16 bytes of scales, 8 of `sc` at 8j, 32 of `qs` at 128j + 32m < 1024) and the
    // activation levels (4 at 32j + 4k < 256).
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(tile.d.as_ptr().cast()));
        let mut sumi = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            // Row r's scale in both i16 halves of i32 lane r, to `madd` with pair sums.
            let s = _mm256_cvtepi8_epi32(_mm_loadl_epi64(tile.sc.as_ptr().add(8 * j).cast()));
            let s = _mm256_or_si256(
                _mm256_and_si256(s, _mm256_set1_epi32(0xffff)),
                _mm256_slli_epi32(s, 16),
            );
            let mut wl = [_mm256_setzero_si256(); 8];
            for m in 0..4 {
                let n = _mm256_loadu_si256(tile.qs.as_ptr().add(128 * j + 32 * m).cast());
                wl[2 * m] = _mm256_shuffle_epi8(table, _mm256_and_si256(n, m4));
                wl[2 * m + 1] =
                    _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(n, 4), m4));
            }
            for t in 0..NT {
                let qs = y[t][b].qs.as_ptr().add(32 * j);
                let mut v = _mm256_setzero_si256();
                for (k, &wk) in wl.iter().enumerate() {
                    let yk = _mm256_set1_epi32(qs.add(4 * k).cast::<i32>().read_unaligned());
                    // |w| <= 127, |y| <= 127: each pair sum fits i16; times |s| <= 32 and
                    // summed over the sub-block it stays far inside i32.
                    let p =
                        _mm256_maddubs_epi16(_mm256_sign_epi8(wk, wk), _mm256_sign_epi8(yk, wk));
                    v = _mm256_add_epi32(v, _mm256_madd_epi16(p, s));
                }
                sumi[t] = _mm256_add_epi32(sumi[t], v);
            }
        }
        for t in 0..NT {
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t][b].d));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi[t])));
        }
    }
    let mut out = [[0.0f32; 8]; NT];
    for t in 0..NT {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
    out
}

/// VNNI version of [`gemv_iq4xs_scalar`]: same exact integers, same float steps.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemv_iq4xs_vnni<const NT: usize>(
    w: &[TileIq4Xs],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    use std::arch::x86_64::*;
    let y = y.map(|a| &a[..w.len()]);
    let shifted: [u8; 16] = KVALUES_IQ4NL.map(|k| (k as i32 + 128) as u8);
    // SAFETY (all loads below): as in `gemv_iq4xs_avx2`.
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(shifted.as_ptr().cast()));
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); NT];
    for (b, tile) in w.iter().enumerate() {
        super::simd::prefetch_ahead::<NT, _>(tile);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(tile.d.as_ptr().cast()));
        let mut sumi = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            let s = _mm256_cvtepi8_epi32(_mm_loadl_epi64(tile.sc.as_ptr().add(8 * j).cast()));
            let mut u = [_mm256_setzero_si256(); 8];
            for m in 0..4 {
                let n = _mm256_loadu_si256(tile.qs.as_ptr().add(128 * j + 32 * m).cast());
                u[2 * m] = _mm256_shuffle_epi8(table, _mm256_and_si256(n, m4));
                u[2 * m + 1] =
                    _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(n, 4), m4));
            }
            for t in 0..NT {
                let yb = &y[t][b];
                let qs = yb.qs.as_ptr().add(32 * j);
                // Two chains against the instruction's latency; u <= 241 and |y| <= 127
                // keep every i32 sum far from overflow.
                let (mut a0, mut a1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for k in (0..8).step_by(2) {
                    let y0 = _mm256_set1_epi32(qs.add(4 * k).cast::<i32>().read_unaligned());
                    let y1 = _mm256_set1_epi32(qs.add(4 * k + 4).cast::<i32>().read_unaligned());
                    a0 = _mm256_dpbusd_epi32(a0, u[k], y0);
                    a1 = _mm256_dpbusd_epi32(a1, u[k + 1], y1);
                }
                let sy = yb.bsums[2 * j] as i32 + yb.bsums[2 * j + 1] as i32;
                let isum = _mm256_sub_epi32(_mm256_add_epi32(a0, a1), _mm256_set1_epi32(128 * sy));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_mullo_epi32(isum, s));
            }
        }
        for t in 0..NT {
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(y[t][b].d));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sumi[t])));
        }
    }
    let mut out = [[0.0f32; 8]; NT];
    for t in 0..NT {
        _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]);
    }
    out
}

/// Dispatches to the scalar, AVX2 or VNNI IQ4_XS tile kernel.
#[inline]
pub(crate) fn gemv_iq4xs<const NT: usize>(
    isa: super::Isa,
    w: &[TileIq4Xs],
    y: [&[BlockQ8K]; NT],
) -> [[f32; 8]; NT] {
    match isa.0 {
        super::IsaKind::Scalar => gemv_iq4xs_scalar(w, y),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an `Avx2` value exists only after runtime detection of AVX2, FMA, F16C.
        super::IsaKind::Avx2 => unsafe { gemv_iq4xs_avx2(w, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a `Vnni` value exists only after runtime detection of its features.
        super::IsaKind::Vnni => unsafe { gemv_iq4xs_vnni(w, y) },
    }
}
