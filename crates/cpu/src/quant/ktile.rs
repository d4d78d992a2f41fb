//! Prefill of the K-quants without a repacked layout (Q2_K, Q3_K, Q5_K) from 8-row tiles
//! decoded once per call.
//!
//! Their row kernels unpack every super-block again for each four tokens. Here the eight
//! rows' super-block `b` is unpacked once into unsigned levels (`q + OFFSET`: Q3_K's
//! signed levels move to `0..8`), laid out as the Q4_K tiles are (register `k` holds
//! elements `4k..4k+4` of all eight rows, one broadcast activation word feeds eight
//! rows), with each 16-element half's integer scale and min. Per token the 16-element
//! half sums come from `maddubs` (four registers stay within i16: levels are at most 31)
//! weighed by the half's scale in `madd`, so
//!
//! `sumi = Σ_h s_h·(Σ (q + OFFSET)·y − OFFSET·bsum_h)`, `summ = Σ_h m_h·bsum_h`
//!
//! are the row kernels' integers, and the float step
//! `acc += (dy·d)·sumi − (dy·dmin)·summ` (without the min term for Q3_K) runs in block
//! order as there: every result keeps the row kernel's bits.

use super::q4_k::{scales_mins, K4Like};
use minfer_gguf::quant::{BlockQ2K, BlockQ3K, BlockQ5K, BlockQ8K};
use std::arch::x86_64::*;

/// One super-block unpacked: levels with the type's offset added, per 16-element half
/// the scale and min, and the two row scales.
pub(super) struct Unpacked {
    levels: [u8; 256],
    scales: [i16; 16],
    mins: [i16; 16],
    d: f32,
    dmin: f32,
}

impl Unpacked {
    /// Zero levels, scales and mins, and the row scales `d`, `dmin`.
    fn new(d: f32, dmin: f32) -> Self {
        Unpacked {
            levels: [0; 256],
            scales: [0; 16],
            mins: [0; 16],
            d,
            dmin,
        }
    }
}

/// A K-quant super-block the tiles can hold.
pub(super) trait KTile: Copy {
    /// Added to every level so it is a small unsigned byte.
    const OFFSET: i32;
    /// Whether the float step has the min term `- (dy·dmin)·summ`.
    const MINS: bool;
    /// The levels, scales and mins of this super-block.
    fn unpack(&self) -> Unpacked;
}

impl KTile for BlockQ2K {
    const OFFSET: i32 = 0;
    const MINS: bool = true;
    fn unpack(&self) -> Unpacked {
        let mut u = Unpacked::new(self.d.to_f32(), self.dmin.to_f32());
        for g in 0..16 {
            let q = &self.qs[32 * (g / 8) + 16 * (g % 2)..][..16];
            let shift = 2 * ((g % 8) / 2);
            for (l, &b) in u.levels[16 * g..16 * g + 16].iter_mut().zip(q) {
                *l = (b >> shift) & 3;
            }
            u.scales[g] = (self.scales[g] & 0x0f) as i16;
            u.mins[g] = (self.scales[g] >> 4) as i16;
        }
        u
    }
}

impl KTile for BlockQ3K {
    const OFFSET: i32 = 4;
    const MINS: bool = false;
    fn unpack(&self) -> Unpacked {
        let mut u = Unpacked::new(self.d.to_f32(), 0.0);
        for g in 0..16 {
            let start = 16 * (g % 2);
            let q = &self.qs[32 * (g / 8) + start..][..16];
            let hm = &self.hmask[start..start + 16];
            let shift = 2 * ((g % 8) / 2);
            let bit = 1u8 << (g / 2);
            for ((l, &b), &h) in u.levels[16 * g..16 * g + 16].iter_mut().zip(q).zip(hm) {
                // (level + 4) where level = q - (4 unless the high bit is set).
                *l = ((b >> shift) & 3) + if h & bit != 0 { 4 } else { 0 };
            }
            u.scales[g] = self.scale(g) as i16;
        }
        u
    }
}

impl KTile for BlockQ5K {
    const OFFSET: i32 = 0;
    const MINS: bool = true;
    fn unpack(&self) -> Unpacked {
        let (d, dmin, packed, qs, qh) = self.parts();
        let (sc, m) = scales_mins(packed);
        let mut u = Unpacked::new(
            half::f16::from_bits(d).to_f32(),
            half::f16::from_bits(dmin).to_f32(),
        );
        for c in 0..4 {
            for l in 0..32 {
                let (b, h) = (qs[32 * c + l], qh[l]);
                u.levels[64 * c + l] = (b & 0x0f) | (((h >> (2 * c)) & 1) << 4);
                u.levels[64 * c + 32 + l] = (b >> 4) | (((h >> (2 * c + 1)) & 1) << 4);
            }
        }
        for j in 0..8 {
            u.scales[2 * j] = sc[j] as i16;
            u.scales[2 * j + 1] = sc[j] as i16;
            u.mins[2 * j] = m[j] as i16;
            u.mins[2 * j + 1] = m[j] as i16;
        }
        u
    }
}

/// Two i16 values in one i32 lane, `lo` in the low half (the `madd` operand layout).
fn pair(lo: i16, hi: i16) -> i32 {
    (lo as u16 as u32 | (hi as u16 as u32) << 16) as i32
}

/// Eight rows' super-block, unpacked and interleaved.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Tile {
    /// Group `g` (32 elements), register `k`: bytes `4r..4r+4` are row `r`'s levels of
    /// elements `32g + 4k .. 32g + 4k + 4`.
    u: [[[u8; 32]; 8]; 8],
    /// Half `h`: row `r`'s scale in both i16 halves of lane `r`.
    s: [[i32; 8]; 16],
    /// Halves `2p, 2p + 1`: row `r`'s two scales as an i16 pair in lane `r`.
    s_pair: [[i32; 8]; 8],
    /// Halves `2p, 2p + 1`: row `r`'s two mins as an i16 pair in lane `r`.
    m_pair: [[i32; 8]; 8],
    d: [f32; 8],
    dmin: [f32; 8],
}

fn tile<W: KTile>(w: &[&[W]; 8], b: usize) -> Tile {
    let mut t = Tile {
        u: [[[0; 32]; 8]; 8],
        s: [[0; 8]; 16],
        s_pair: [[0; 8]; 8],
        m_pair: [[0; 8]; 8],
        d: [0.0; 8],
        dmin: [0.0; 8],
    };
    for (r, row) in w.iter().enumerate() {
        let u = row[b].unpack();
        for g in 0..8 {
            for k in 0..8 {
                let e = 32 * g + 4 * k;
                t.u[g][k][4 * r..4 * r + 4].copy_from_slice(&u.levels[e..e + 4]);
            }
        }
        for h in 0..16 {
            t.s[h][r] = pair(u.scales[h], u.scales[h]);
        }
        for p in 0..8 {
            t.s_pair[p][r] = pair(u.scales[2 * p], u.scales[2 * p + 1]);
            t.m_pair[p][r] = pair(u.mins[2 * p], u.mins[2 * p + 1]);
        }
        t.d[r] = u.d;
        t.dmin[r] = u.dmin;
    }
    t
}

/// `Σ_p madd(pairs[p], (bsum_2p, bsum_2p+1))` per row: an exact i32 dot of the rows'
/// per-half values with the activation block's half sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn with_bsums(pairs: &[[i32; 8]; 8], y: &BlockQ8K) -> __m256i {
    let mut acc = _mm256_setzero_si256();
    for (p, v) in pairs.iter().enumerate() {
        let b = _mm256_set1_epi32(pair(y.bsums[2 * p], y.bsums[2 * p + 1]));
        acc = _mm256_add_epi32(
            acc,
            _mm256_madd_epi16(_mm256_loadu_si256(v.as_ptr().cast()), b),
        );
    }
    acc
}

/// Adds tile `t` against activation blocks `y` to `acc`, one lane per row.
///
/// # Safety
/// AVX2/FMA/F16C required.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<W: KTile, const NT: usize>(t: &Tile, y: [&BlockQ8K; NT], acc: &mut [__m256; NT]) {
    let mut sumi = [_mm256_setzero_si256(); NT];
    for g in 0..8 {
        let u: [__m256i; 8] = std::array::from_fn(|k| _mm256_load_si256(t.u[g][k].as_ptr().cast()));
        let s = [
            _mm256_loadu_si256(t.s[2 * g].as_ptr().cast()),
            _mm256_loadu_si256(t.s[2 * g + 1].as_ptr().cast()),
        ];
        for (tt, yb) in y.iter().enumerate() {
            let qs = yb.qs.as_ptr().add(32 * g);
            for (h, &sh) in s.iter().enumerate() {
                let mut p = _mm256_setzero_si256();
                for (k, &uk) in u.iter().enumerate().skip(4 * h).take(4) {
                    let yk = _mm256_set1_epi32(qs.add(4 * k).cast::<i32>().read_unaligned());
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(uk, yk));
                }
                sumi[tt] = _mm256_add_epi32(sumi[tt], _mm256_madd_epi16(p, sh));
            }
        }
    }
    let d = _mm256_loadu_ps(t.d.as_ptr());
    let dmin = _mm256_loadu_ps(t.dmin.as_ptr());
    for (tt, yb) in y.iter().enumerate() {
        let mut si = sumi[tt];
        if W::OFFSET != 0 {
            let off = _mm256_mullo_epi32(_mm256_set1_epi32(W::OFFSET), with_bsums(&t.s_pair, yb));
            si = _mm256_sub_epi32(si, off);
        }
        let dy = _mm256_set1_ps(yb.d);
        // No FMA: the row kernels' roundings.
        let a = _mm256_mul_ps(_mm256_mul_ps(dy, d), _mm256_cvtepi32_ps(si));
        acc[tt] = if W::MINS {
            let summ = with_bsums(&t.m_pair, yb);
            let m = _mm256_mul_ps(_mm256_mul_ps(dy, dmin), _mm256_cvtepi32_ps(summ));
            _mm256_add_ps(acc[tt], _mm256_sub_ps(a, m))
        } else {
            _mm256_add_ps(acc[tt], a)
        };
    }
}

/// Results of the eight weight rows `w` against the `nt` activation rows of `x` (each
/// `w[r].len()` blocks, one after another), handed to `emit(token, row, value)`: bitwise
/// the row kernel's. `_vnni` is [`super::QuantDot::rows8_avx2`]'s flag: these tiles run
/// `maddubs` on every ISA (their levels are too small for `vpdpbusd` to pay).
///
/// # Safety
/// AVX2/FMA/F16C required; the rows have equal lengths and `x` holds `nt` rows of that
/// many blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows8<W: KTile>(
    _vnni: bool,
    w: [&[W]; 8],
    x: &[BlockQ8K],
    nt: usize,
    emit: &mut dyn FnMut(usize, usize, f32),
) {
    let bpr = w[0].len();
    let tiles: Vec<Tile> = (0..bpr).map(|b| tile(&w, b)).collect();
    let mut t0 = 0;
    while t0 < nt {
        // Two tokens per pass share each loaded register; an odd last token goes alone.
        let n = (nt - t0).min(2);
        let mut acc = [_mm256_setzero_ps(); 2];
        for (b, tile) in tiles.iter().enumerate() {
            let y0 = &x[t0 * bpr + b];
            if n == 2 {
                block::<W, 2>(tile, [y0, &x[(t0 + 1) * bpr + b]], &mut acc);
            } else {
                let mut one = [acc[0]];
                block::<W, 1>(tile, [y0], &mut one);
                acc[0] = one[0];
            }
        }
        for (k, a) in acc.iter().enumerate().take(n) {
            let mut v = [0.0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), *a);
            for (r, &val) in v.iter().enumerate() {
                emit(t0 + k, r, val);
            }
        }
        t0 += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{check_rows8, quantize_blocks, rand_f32};
    use crate::quant::QuantDot;
    use minfer_gguf::quant::Quantize;

    /// Eight rows against `nt` activation rows: the tile results equal the row kernel's
    /// bit for bit, on real encoder output and on rows with extreme levels and scales.
    fn check<W: KTile + QuantDot<Act = BlockQ8K> + Quantize>(seed: u64) {
        for (bpr, nt) in [(1, 1), (3, 2), (2, 7), (4, 9)] {
            let mut xf = rand_f32(8 * bpr * 256, seed + bpr as u64, 1.5);
            // Row 0 a constant (every level at its top), row 1 alternating extremes.
            xf[..256 * bpr].iter_mut().for_each(|v| *v = 1.0);
            for (i, v) in xf[256 * bpr..512 * bpr].iter_mut().enumerate() {
                *v = if i % 2 == 0 { 3.0 } else { -3.0 };
            }
            let blocks: Vec<W> = quantize_blocks(&xf);
            let rows: [&[W]; 8] = std::array::from_fn(|r| &blocks[r * bpr..(r + 1) * bpr]);
            let yf = rand_f32(nt * bpr * 256, seed + 7, 2.0);
            let x: Vec<BlockQ8K> = yf.chunks_exact(256).map(BlockQ8K::quantize).collect();
            check_rows8(rows, &x, nt);
        }
    }

    #[test]
    fn tiles_give_the_row_kernels_bits() {
        check::<BlockQ2K>(801);
        check::<BlockQ3K>(811);
        check::<BlockQ5K>(821);
    }
}
