//! IQ3_XXS and IQ3_S: super-blocks of 256 whose groups of four magnitudes are points of a
//! fixed lattice grid, with sign bits and 4-bit scales per 32 elements. Decoding follows
//! ggml; so do the encoders (`quantize_row_iq3_xxs_impl` / `quantize_row_iq3_s_impl`, see
//! `iq_search`), byte for byte given the same weights.

use super::common::{f16_to_f32, f32_to_f16};
use super::iq2::KSIGNS_IQ2XS;
use super::iq_grids::{IQ3S_GRID, IQ3XXS_GRID};
use super::iq_search::{fit_sub_blocks, odd_level, Anchor, Fallback, Refit, Search};
use super::{lattice, Block, Quantize};
use crate::types::{GgmlType, QK_K};
use half::f16;

/// An IQ3_XXS super-block: 98 bytes, alignment 2.
///
/// `qs[..64]` are grid indices (one per 4 elements); `qs[64..]` are eight little-endian
/// `u32`, one per 32 elements, with four 7-bit sign indices into [`KSIGNS_IQ2XS`] (one per
/// 8 elements) and the group's 4-bit scale in the top bits (`db = d * (0.5 + s) / 2`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq3Xxs {
    /// Super-block scale.
    pub d: f16,
    /// Grid indices, then signs and scales.
    pub qs: [u8; 96],
}

const _: () = assert!(std::mem::size_of::<BlockIq3Xxs>() == 98);

/// An IQ3_S super-block: 110 bytes, alignment 2.
///
/// Grid index `k` (elements `4k..4k+4`) is `qs[k] | ((qh[k/8] >> k%8) & 1) << 8`; `signs[g]`
/// negates element `j` of the 8-element group `g` when bit `j` is set; `scales[ib/2]`
/// holds the 4-bit scale of 32-element group `ib` (low nibble for even `ib`) with
/// `db = d * (1 + 2s)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq3S {
    /// Super-block scale.
    pub d: f16,
    /// Low grid-index bytes.
    pub qs: [u8; 64],
    /// High grid-index bits.
    pub qh: [u8; 8],
    /// Sign bits.
    pub signs: [u8; 32],
    /// 4-bit scales.
    pub scales: [u8; 4],
}

const _: () = assert!(std::mem::size_of::<BlockIq3S>() == 110);

/// Writes `db * grid * ±1` for eight elements made of two four-element points.
#[inline]
fn put_pair(out: &mut [f32], db: f32, p0: u32, p1: u32, signs: u8) {
    let point = p0 as u64 | (p1 as u64) << 32;
    super::iq2::put_group(out, db, point, signs);
}

impl BlockIq3Xxs {
    /// The signs-and-scale word of 32-element group `ib` (0..8).
    #[inline]
    pub fn aux(&self, ib: usize) -> u32 {
        let b = &self.qs[64 + 4 * ib..68 + 4 * ib];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Block for BlockIq3Xxs {
    const TYPE: GgmlType = GgmlType::Iq3Xxs;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (ib, y) in out[..QK_K].chunks_exact_mut(32).enumerate() {
            let aux = self.aux(ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for (l, g) in y.chunks_exact_mut(8).enumerate() {
                let k = 8 * ib + 2 * l;
                let s = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let (p0, p1) = (
                    IQ3XXS_GRID[self.qs[k] as usize],
                    IQ3XXS_GRID[self.qs[k + 1] as usize],
                );
                put_pair(g, db, p0, p1, s);
            }
        }
    }
}

impl BlockIq3S {
    /// The 9-bit grid index of four-element point `k` (0..64).
    #[inline]
    pub fn grid_index(&self, k: usize) -> usize {
        self.qs[k] as usize | (((self.qh[k / 8] >> (k % 8)) & 1) as usize) << 8
    }
}

impl Block for BlockIq3S {
    const TYPE: GgmlType = GgmlType::Iq3S;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (g, y) in out[..QK_K].chunks_exact_mut(8).enumerate() {
            let ib = g / 4;
            let sc = (self.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f;
            let db = d * (1 + 2 * sc as i32) as f32;
            let p0 = IQ3S_GRID[self.grid_index(2 * g)];
            let p1 = IQ3S_GRID[self.grid_index(2 * g + 1)];
            put_pair(y, db, p0, p1, self.signs[g]);
        }
    }
}

/// ggml's IQ3_XXS search: 32-element sub-blocks of eight 4-element points.
const IQ3XXS_SEARCH: Search = Search {
    kmax: 8,
    steps: 15,
    step: 0.2,
    anchor: Anchor::Max,
    refit: Refit::OffOnly,
    eps: 1e-8,
    even: true,
    fallback: Fallback::Square,
};

/// ggml's IQ3_S search: fewer trials, free signs, and every group re-rounded.
const IQ3S_SEARCH: Search = Search {
    steps: 9,
    refit: Refit::AllIfAnyOff,
    eps: 0.0,
    even: false,
    ..IQ3XXS_SEARCH
};

impl BlockIq3Xxs {
    /// Encodes `x[..256]` as ggml does, weighting elements by the importance weights `qw`
    /// (an imatrix row, same length) or, without them, by `x²` as ggml does.
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let (fits, max_scale) = fit_sub_blocks::<8>(&IQ3XXS_SEARCH, lattice::iq3xxs(), x, qw, 2.0);
        let mut b: Self = bytemuck::Zeroable::zeroed();
        if max_scale == 0.0 {
            return b;
        }
        let d = max_scale / 31.0;
        // ggml's fudge factor on the stored scale.
        b.d = f32_to_f16(d * 1.0125);
        let id = 1.0 / d;
        for (ib, f) in fits.iter().enumerate() {
            let mut aux = 0u32;
            if let Some(f) = f {
                for (k, &p) in f.points.iter().enumerate() {
                    b.qs[8 * ib + k] = p as u8;
                }
                for (k, &s) in f.signs.iter().enumerate() {
                    aux |= (s as u32) << (7 * k);
                }
            }
            aux |= (odd_level(id, f.as_ref().map_or(0.0, |f| f.scale), 15) as u32) << 28;
            b.qs[64 + 4 * ib..68 + 4 * ib].copy_from_slice(&aux.to_le_bytes());
        }
        b
    }
}

impl Quantize for BlockIq3Xxs {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

impl BlockIq3S {
    /// Encodes `x[..256]` as ggml does, weighting elements by the importance weights `qw`
    /// (an imatrix row, same length) or, without them, by `x²` as ggml does. (ggml
    /// misplaces the points after an all-zero sub-block; here each sits in its own place.)
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let (fits, max_scale) = fit_sub_blocks::<8>(&IQ3S_SEARCH, lattice::iq3s(), x, qw, 2.0);
        let mut b: Self = bytemuck::Zeroable::zeroed();
        for (ib, f) in fits.iter().enumerate() {
            let Some(f) = f else { continue };
            for (k, &p) in f.points.iter().enumerate() {
                b.qs[8 * ib + k] = p as u8;
                b.qh[ib] |= ((p >> 8) as u8) << k;
            }
            b.signs[4 * ib..4 * ib + 4].copy_from_slice(&f.signs);
        }
        if max_scale == 0.0 {
            return b;
        }
        let d = max_scale / 31.0;
        // ggml's fudge factor on the stored scale.
        b.d = f32_to_f16(d * 1.033);
        let id = 1.0 / d;
        for (ib, f) in fits.iter().enumerate() {
            let l = odd_level(id, f.as_ref().map_or(0.0, |f| f.scale), 15);
            b.scales[ib / 2] |= l << (4 * (ib % 2));
        }
        b
    }
}

impl Quantize for BlockIq3S {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn dequantize_known_iq3s_group() {
        let mut b: BlockIq3S = bytemuck::Zeroable::zeroed();
        b.d = f16::from_f32(0.5);
        b.scales[0] = 0x02; // group 0: db = 0.5 * 5
        b.qs[1] = 3;
        b.qh[0] = 0b10; // point 1 takes index 256 + 3
        b.signs[0] = 0b1000_0001;
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        let p0 = IQ3S_GRID[0];
        let p1 = IQ3S_GRID[259];
        assert_eq!(y[0], -2.5 * (p0 as u8) as f32);
        assert_eq!(y[4], 2.5 * (p1 as u8) as f32);
        assert_eq!(y[7], -2.5 * (p1 >> 24) as f32);
        // Group 4 (next 32 elements) uses the high nibble of scales[0]: 0 -> db = 0.5.
        assert_eq!(y[32], 0.5 * (p0 as u8) as f32);
    }

    #[test]
    fn iq3s_zero_sub_block_keeps_the_others_in_place() {
        // Sub-block 1 is exactly zero (ggml would shift the later points onto its slot).
        let x: Vec<f32> = (0..QK_K)
            .map(|i| {
                if (32..64).contains(&i) {
                    0.0
                } else {
                    ((i * 37 % 29) as f32 - 14.0) / 7.0
                }
            })
            .collect();
        let mut y = vec![0.0; QK_K];
        BlockIq3S::quantize(&x).dequantize(&mut y);
        // IQ3_S has no zero level: the zero sub-block decodes to its smallest magnitude,
        // `d` (sub-scale 0, point 0).
        let d = f16_to_f32(BlockIq3S::quantize(&x).d);
        assert!(y[32..64].iter().all(|&v| v == d), "{:?}", &y[32..64]);
        let (mut err, mut pow) = (0.0f32, 0.0f32);
        for (a, b) in x.iter().zip(&y) {
            err += (a - b) * (a - b);
            pow += a * a;
        }
        assert!(
            (err / pow).sqrt() < 0.2,
            "relative rms {}",
            (err / pow).sqrt()
        );
    }
}
