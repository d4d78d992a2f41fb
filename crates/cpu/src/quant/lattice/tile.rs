//! Prefill of the lattice i-quants from 8-row int8 tiles.
//!
//! The row kernel ([`super::dot_lattice_avx2`]) looks grid points up one by one for every
//! four tokens, so prefill spends its time decoding. Here each super-block of eight rows
//! is decoded once per call into a tile of offset levels (`level + 64`, in `2..=126`: the
//! largest level magnitude of every lattice grid is 62) laid out as the K-quant tiles
//! are, register `k` holding elements `4k..4k+4` of all eight rows, so one broadcast
//! activation word feeds eight rows. Per token and 16-element half `h` of group `g` the
//! integer dot is then
//!
//! `Σ (level + 64)·y − 64·bsum_h = Σ level·y`,
//!
//! exact in i32, weighed by the half's integer scale and summed over the super-block:
//! the row kernel's `sumi`, integer for integer. The float step `acc += (f·dy)·sumi`
//! runs in block order as there, so every result is bitwise the row kernel's (and the
//! scalar reference's), whatever the token count.

use super::Lattice;
use minfer_gguf::quant::BlockQ8K;
use std::arch::x86_64::*;

/// Added to every level so it is an unsigned byte for `maddubs` and `vpdpbusd`: levels
/// lie in `-64..=64` (checked against every grid by the tests), so `0..=128`.
const OFFSET: i8 = 64;

/// One super-block of eight rows, decoded.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct TileBlock {
    /// Group `g`, register `k`: bytes `4r..4r+4` are row `r`'s offset levels of elements
    /// `32g + 4k .. 32g + 4k + 4`.
    u: [[[u8; 32]; 8]; 8],
    /// Group `g`: each row's scale of elements `0..16` of the group.
    s_lo: [[i32; 8]; 8],
    /// Group `g`: each row's scale of elements `16..32`.
    s_hi: [[i32; 8]; 8],
    /// Each row's factor `f` (the reference decoder's).
    f: [f32; 8],
}

/// Decodes super-block `b` of the eight rows `w` into `t`.
///
/// # Safety
/// AVX2/FMA/F16C required; every row holds more than `b` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode<W: Lattice>(w: &[&[W]; 8], b: usize, t: &mut TileBlock) {
    for (r, row) in w.iter().enumerate() {
        let wb = &row[b];
        t.f[r] = wb.factor();
        for g in 0..8 {
            let grp = wb.group(g);
            let level = _mm256_sign_epi8(grp.mag, grp.sign);
            let mut bytes = [0u8; 32];
            _mm256_storeu_si256(
                bytes.as_mut_ptr().cast(),
                _mm256_add_epi8(level, _mm256_set1_epi8(OFFSET)),
            );
            for k in 0..8 {
                t.u[g][k][4 * r..4 * r + 4].copy_from_slice(&bytes[4 * k..4 * k + 4]);
            }
            let mut sc = [0i16; 16];
            _mm256_storeu_si256(sc.as_mut_ptr().cast(), grp.scale);
            t.s_lo[g][r] = sc[0] as i32;
            t.s_hi[g][r] = sc[8] as i32;
        }
    }
}

/// The i32 lanes of `u[ks] · y` (per row, its offset levels against four activation
/// bytes per register), with `maddubs` (pairs stay within ±2·126·127) and `madd` by ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_avx2(u: &[__m256i; 8], qs: *const i8, ks: std::ops::Range<usize>) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let mut a = _mm256_setzero_si256();
    for k in ks {
        let y = _mm256_set1_epi32(qs.add(4 * k).cast::<i32>().read_unaligned());
        a = _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], y), ones));
    }
    a
}

/// The per-token step of one tile block, generic over the integer dot of a half.
macro_rules! tile_block {
    ($name:ident, $dot:path, $($feat:literal),*) => {
        /// Adds tile block `t` against activation blocks `y` to `acc`, one lane per row.
        ///
        /// # Safety
        /// The CPU features of the attribute are required.
        #[inline]
        #[target_feature(enable = $($feat),*)]
        unsafe fn $name<const NT: usize>(t: &TileBlock, y: [&BlockQ8K; NT], acc: &mut [__m256; NT]) {
            let mut sumi = [_mm256_setzero_si256(); NT];
            for g in 0..8 {
                let u: [__m256i; 8] =
                    std::array::from_fn(|k| _mm256_load_si256(t.u[g][k].as_ptr().cast()));
                let s_lo = _mm256_loadu_si256(t.s_lo[g].as_ptr().cast());
                let s_hi = _mm256_loadu_si256(t.s_hi[g].as_ptr().cast());
                for (tt, yb) in y.iter().enumerate() {
                    let qs = yb.qs.as_ptr().add(32 * g);
                    let off = |h: usize| _mm256_set1_epi32(OFFSET as i32 * yb.bsums[2 * g + h] as i32);
                    let lo = _mm256_sub_epi32($dot(&u, qs, 0..4), off(0));
                    let hi = _mm256_sub_epi32($dot(&u, qs, 4..8), off(1));
                    sumi[tt] = _mm256_add_epi32(
                        sumi[tt],
                        _mm256_add_epi32(_mm256_mullo_epi32(lo, s_lo), _mm256_mullo_epi32(hi, s_hi)),
                    );
                }
            }
            let f = _mm256_loadu_ps(t.f.as_ptr());
            for (tt, yb) in y.iter().enumerate() {
                // No FMA: the reference's two roundings, `(f * dy) * sumi`, then the add.
                let p = _mm256_mul_ps(_mm256_mul_ps(f, _mm256_set1_ps(yb.d)), _mm256_cvtepi32_ps(sumi[tt]));
                acc[tt] = _mm256_add_ps(acc[tt], p);
            }
        }
    };
}

tile_block!(block_avx2, dot_avx2, "avx2,fma,f16c");
tile_block!(
    block_vnni,
    crate::quant::vnni::dot_regs,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);

/// Results of the eight weight rows `w` against the `nt` activation rows of `x` (each
/// `w[r].len()` blocks, one after another), handed to `emit(token, row, value)`: bitwise
/// the row kernel's.
///
/// # Safety
/// AVX2/FMA/F16C required, and AVX-512 F/BW/VL/VNNI with `vnni`; the rows have equal
/// lengths and `x` holds `nt` rows of that many blocks.
pub(crate) unsafe fn rows8<W: Lattice>(
    vnni: bool,
    w: [&[W]; 8],
    x: &[BlockQ8K],
    nt: usize,
    emit: &mut dyn FnMut(usize, usize, f32),
) {
    let bpr = w[0].len();
    let mut tiles = vec![
        TileBlock {
            u: [[[0; 32]; 8]; 8],
            s_lo: [[0; 8]; 8],
            s_hi: [[0; 8]; 8],
            f: [0.0; 8],
        };
        bpr
    ];
    for (b, t) in tiles.iter_mut().enumerate() {
        decode(&w, b, t);
    }
    let mut t0 = 0;
    while t0 < nt {
        // Two tokens per pass share each loaded register; an odd last token goes alone.
        let two = nt - t0 >= 2;
        let mut acc = [_mm256_setzero_ps(); 2];
        for (b, tile) in tiles.iter().enumerate() {
            let y0 = &x[t0 * bpr + b];
            if two {
                let y1 = &x[(t0 + 1) * bpr + b];
                if vnni {
                    block_vnni(tile, [y0, y1], &mut acc);
                } else {
                    block_avx2(tile, [y0, y1], &mut acc);
                }
            } else {
                let mut one = [acc[0]];
                if vnni {
                    block_vnni(tile, [y0], &mut one);
                } else {
                    block_avx2(tile, [y0], &mut one);
                }
                acc[0] = one[0];
            }
        }
        for (k, a) in acc.iter().enumerate().take(if two { 2 } else { 1 }) {
            let mut v = [0.0f32; 8];
            _mm256_storeu_ps(v.as_mut_ptr(), *a);
            for (r, &val) in v.iter().enumerate() {
                emit(t0 + k, r, val);
            }
        }
        t0 += if two { 2 } else { 1 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{
        check_rows8, iq1m_valid_scale, rand_f32, random_blocks, small_f16,
    };
    use crate::quant::{Isa, QuantDot};
    use minfer_gguf::quant::{
        BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, Quantize,
    };

    /// Eight rows of `bpr` random blocks against `nt` activation rows: the tile results
    /// equal the row kernel's bit for bit on every ISA that has them.
    fn check<W: Lattice + QuantDot<Act = BlockQ8K>>(fix: impl Fn(&mut W, u32) + Copy, seed: u64) {
        for (bpr, nt) in [(1, 1), (3, 2), (2, 7), (4, 9)] {
            let blocks: Vec<W> = random_blocks(8 * bpr, seed + bpr as u64, fix);
            let rows: [&[W]; 8] = std::array::from_fn(|r| &blocks[r * bpr..(r + 1) * bpr]);
            let xf = rand_f32(nt * bpr * 256, seed + 7, 2.0);
            let x: Vec<BlockQ8K> = xf.chunks_exact(256).map(BlockQ8K::quantize).collect();
            check_rows8(rows, &x, nt);
        }
    }

    #[test]
    fn tiles_give_the_row_kernels_bits_for_every_lattice_type() {
        check(|b: &mut BlockIq3S, r| b.d = small_f16(r), 701);
        check(|b: &mut BlockIq3Xxs, r| b.d = small_f16(r), 711);
        check(|b: &mut BlockIq2S, r| b.d = small_f16(r), 721);
        check(|b: &mut BlockIq2Xs, r| b.d = small_f16(r), 731);
        check(|b: &mut BlockIq2Xxs, r| b.d = small_f16(r), 741);
        check(|b: &mut BlockIq1S, r| b.d = small_f16(r), 751);
        check(iq1m_valid_scale, 761);
    }

    #[test]
    fn every_grid_level_fits_the_offset() {
        use minfer_gguf::quant::{
            IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
        };
        let bytes64 = IQ2S_GRID
            .iter()
            .chain(&IQ2XS_GRID)
            .chain(&IQ2XXS_GRID)
            .flat_map(|g| g.to_le_bytes());
        let bytes32 = IQ3S_GRID
            .iter()
            .chain(&IQ3XXS_GRID)
            .flat_map(|g| g.to_le_bytes());
        for b in bytes64.chain(bytes32) {
            assert!(b as i32 <= OFFSET as i32, "grid level {b}");
        }
        // IQ1 levels are 8·g ± 1 for grid bytes g in -1..=1.
        for g in IQ1S_GRID.iter().flat_map(|g| g.to_le_bytes()) {
            assert!((8 * (g as i8).unsigned_abs() as i32) < OFFSET as i32);
        }
    }

    #[test]
    fn tile_results_are_the_dot_products() {
        let Some(_) = Isa::avx2() else { return };
        let blocks: Vec<BlockIq2Xxs> =
            random_blocks(8, 9, |b: &mut BlockIq2Xxs, r| b.d = small_f16(r));
        let rows: [&[BlockIq2Xxs]; 8] = std::array::from_fn(|r| &blocks[r..r + 1]);
        let x = [BlockQ8K::quantize(&rand_f32(256, 3, 1.0))];
        let mut got = [0f32; 8];
        // SAFETY: AVX2 was detected; one block per row and one activation row.
        unsafe { rows8(false, rows, &x, 1, &mut |_, r, v| got[r] = v) };
        for (r, blk) in blocks.iter().enumerate() {
            let mut w = [0f32; 256];
            minfer_gguf::quant::Block::dequantize(blk, &mut w);
            let terms = w
                .iter()
                .zip(x[0].qs.iter())
                .map(|(a, &b)| *a as f64 * b as f64 * x[0].d as f64);
            let (want, mag) = terms.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
            assert!(
                (got[r] as f64 - want).abs() <= 1e-5 * mag,
                "row {r}: {} vs {want}",
                got[r]
            );
        }
    }
}
