//! IQ2_XXS, IQ2_XS and IQ2_S: super-blocks of 256 whose groups of eight magnitudes are points
//! of a fixed lattice grid, with separate sign bits and 4-bit scales
//! (`x = d * (0.5 + s) / 4 * grid[j] * ±1`). Decoding follows ggml; so do the encoders
//! (`quantize_row_iq2_*_impl`, see `iq_search`), byte for byte given the same weights.

use super::common::{f16_to_f32, f32_to_f16, GROUP_MAX_EPS};
use super::iq_grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
use super::iq_search::{fit_sub_blocks, odd_level, Anchor, Fallback, Fitted, Refit, Search};
use super::{lattice, Block, Quantize};
use crate::types::{GgmlType, QK_K};
use half::f16;

/// Sign patterns of the IQ2/IQ3 types (ggml's `ksigns_iq2xs`): entry `i` is the seven bits
/// of `i` plus an eighth that makes the number of set bits even, since the encoders only
/// store sign patterns with an even number of minus signs.
pub const KSIGNS_IQ2XS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = i as u8 | (((i as u8).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
};

/// An IQ2_XXS super-block: 66 bytes, alignment 2.
///
/// Each 32 elements take four `u16` pairs read as two little-endian `u32`: the first holds
/// four grid indices (one byte per 8 elements), the second four 7-bit sign indices into
/// [`KSIGNS_IQ2XS`] and, in its top four bits, the group scale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq2Xxs {
    /// Super-block scale.
    pub d: f16,
    /// Grid indices, signs and scales.
    pub qs: [u16; 32],
}

const _: () = assert!(std::mem::size_of::<BlockIq2Xxs>() == 66);

/// An IQ2_XS super-block: 74 bytes, alignment 2.
///
/// `qs[i]` holds a 9-bit grid index and, above it, a 7-bit sign index for elements
/// `8i..8i+8`; `scales[ib]` holds the 4-bit scales of elements `32ib..32ib+16` (low nibble)
/// and `32ib+16..32ib+32` (high nibble).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq2Xs {
    /// Super-block scale.
    pub d: f16,
    /// Grid and sign indices.
    pub qs: [u16; 32],
    /// 4-bit scales, two per 32 elements.
    pub scales: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<BlockIq2Xs>() == 74);

/// An IQ2_S super-block: 82 bytes, alignment 2.
///
/// `qs[..32]` are the low eight bits of the 10-bit grid indices (one per 8 elements), whose
/// top bits are `(qh[ib] >> 2l) & 3` for index `4ib + l`; `qs[32..]` are explicit sign bytes
/// (bit `j` negates element `j` of the group); `scales` as in IQ2_XS.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq2S {
    /// Super-block scale.
    pub d: f16,
    /// Low grid-index bytes, then sign bytes.
    pub qs: [u8; 64],
    /// High grid-index bits.
    pub qh: [u8; 8],
    /// 4-bit scales, two per 32 elements.
    pub scales: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<BlockIq2S>() == 82);

/// Writes `db * grid[j] * ±1` for the eight elements of one group.
#[inline]
pub(crate) fn put_group(out: &mut [f32], db: f32, point: u64, signs: u8) {
    for (j, y) in out[..8].iter_mut().enumerate() {
        let g = (point >> (8 * j)) as u8 as f32;
        *y = db * g * if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
    }
}

impl BlockIq2Xxs {
    /// The two words of group `ib` (0..8): grid indices, and signs plus scale.
    #[inline]
    pub fn words(&self, ib: usize) -> (u32, u32) {
        let q = &self.qs[4 * ib..4 * ib + 4];
        (
            q[0] as u32 | (q[1] as u32) << 16,
            q[2] as u32 | (q[3] as u32) << 16,
        )
    }
}

impl Block for BlockIq2Xxs {
    const TYPE: GgmlType = GgmlType::Iq2Xxs;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (ib, y) in out[..QK_K].chunks_exact_mut(32).enumerate() {
            let (grid, signs) = self.words(ib);
            let db = d * (0.5 + (signs >> 28) as f32) * 0.25;
            for (l, g) in y.chunks_exact_mut(8).enumerate() {
                let point = IQ2XXS_GRID[(grid >> (8 * l)) as u8 as usize];
                let s = KSIGNS_IQ2XS[((signs >> (7 * l)) & 127) as usize];
                put_group(g, db, point, s);
            }
        }
    }
}

impl Block for BlockIq2Xs {
    const TYPE: GgmlType = GgmlType::Iq2Xs;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (i, g) in out[..QK_K].chunks_exact_mut(8).enumerate() {
            let sc = (self.scales[i / 4] >> (4 * ((i / 2) % 2))) & 0x0f;
            let db = d * (0.5 + sc as f32) * 0.25;
            let q = self.qs[i];
            put_group(
                g,
                db,
                IQ2XS_GRID[(q & 511) as usize],
                KSIGNS_IQ2XS[(q >> 9) as usize],
            );
        }
    }
}

impl Block for BlockIq2S {
    const TYPE: GgmlType = GgmlType::Iq2S;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (i, g) in out[..QK_K].chunks_exact_mut(8).enumerate() {
            let sc = (self.scales[i / 4] >> (4 * ((i / 2) % 2))) & 0x0f;
            let db = d * (0.5 + sc as f32) * 0.25;
            let hi = ((self.qh[i / 4] >> (2 * (i % 4))) & 3) as usize;
            let idx = self.qs[i] as usize | hi << 8;
            put_group(g, db, IQ2S_GRID[idx], self.qs[32 + i]);
        }
    }
}

/// ggml's IQ2_XXS search: 32-element sub-blocks anchored on a `make_qp_quants` fit.
const IQ2XXS_SEARCH: Search = Search {
    kmax: 3,
    steps: 6,
    step: 0.1,
    anchor: Anchor::QpQuants,
    refit: Refit::All,
    eps: GROUP_MAX_EPS,
    even: true,
    fallback: Fallback::Square,
};

/// ggml's IQ2_XS search: 16-element sub-blocks.
const IQ2XS_SEARCH: Search = Search {
    kmax: 3,
    steps: 9,
    step: 0.1,
    anchor: Anchor::Max,
    refit: Refit::OffOnly,
    eps: GROUP_MAX_EPS,
    even: true,
    fallback: Fallback::Square,
};

/// ggml's IQ2_S search: as IQ2_XS with free signs and its own weights.
const IQ2S_SEARCH: Search = Search {
    eps: 1e-8,
    even: false,
    fallback: Fallback::QuarterSigma,
    ..IQ2XS_SEARCH
};

impl BlockIq2Xxs {
    /// Encodes `x[..256]` as ggml does, weighting elements by the importance weights `qw`
    /// (an imatrix row, same length) or, without them, by `x²` (ggml requires them).
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let (fits, max_scale) = fit_sub_blocks::<8>(&IQ2XXS_SEARCH, lattice::iq2xxs(), x, qw, 1.0);
        let mut b: Self = bytemuck::Zeroable::zeroed();
        if max_scale == 0.0 {
            return b;
        }
        let d = max_scale / 31.0;
        b.d = f32_to_f16(d);
        let id = 1.0 / d;
        for (ib, f) in fits.iter().enumerate() {
            let (mut grid, mut signs) = (0u32, 0u32);
            if let Some(f) = f {
                for k in 0..4 {
                    grid |= (f.points[k] as u32) << (8 * k);
                    signs |= (f.signs[k] as u32) << (7 * k);
                }
            }
            let s = f.as_ref().map_or(0.0, |f| f.scale);
            signs |= (odd_level(id, s, 15) as u32) << 28;
            b.qs[4 * ib..4 * ib + 4].copy_from_slice(&[
                grid as u16,
                (grid >> 16) as u16,
                signs as u16,
                (signs >> 16) as u16,
            ]);
        }
        b
    }
}

impl Quantize for BlockIq2Xxs {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

/// Packs the 4-bit sub-scales of 16 sub-blocks two to a byte, as IQ2_XS and IQ2_S store
/// them; zero sub-blocks take scale 0 before rounding, as in ggml.
fn pack_scales(fits: &[Option<Fitted>; 16], id: f32, scales: &mut [u8; 8]) {
    for (ib, f) in fits.iter().enumerate() {
        let l = odd_level(id, f.as_ref().map_or(0.0, |f| f.scale), 15);
        scales[ib / 2] |= l << (4 * (ib % 2));
    }
}

impl BlockIq2Xs {
    /// Encodes `x[..256]` as ggml does, weighting elements by the importance weights `qw`
    /// (an imatrix row, same length) or, without them, by `x²` (ggml requires them).
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let (fits, max_scale) = fit_sub_blocks::<16>(&IQ2XS_SEARCH, lattice::iq2xs(), x, qw, 1.0);
        let mut b: Self = bytemuck::Zeroable::zeroed();
        if max_scale == 0.0 {
            return b;
        }
        for (ib, f) in fits.iter().enumerate() {
            if let Some(f) = f {
                for k in 0..2 {
                    b.qs[2 * ib + k] = f.points[k] | (f.signs[k] as u16) << 9;
                }
            }
        }
        let d = max_scale / 31.0;
        b.d = f32_to_f16(d);
        pack_scales(&fits, 1.0 / d, &mut b.scales);
        b
    }
}

impl Quantize for BlockIq2Xs {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

impl BlockIq2S {
    /// Encodes `x[..256]` as ggml does, weighting elements by the importance weights `qw`
    /// (an imatrix row, same length) or, without them, as ggml does (`sigma2/4 + x²`).
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let (fits, max_scale) = fit_sub_blocks::<16>(&IQ2S_SEARCH, lattice::iq2s(), x, qw, 2.0);
        let mut b: Self = bytemuck::Zeroable::zeroed();
        for (ib, f) in fits.iter().enumerate() {
            let Some(f) = f else { continue };
            for k in 0..2 {
                let i8 = 2 * ib + k;
                let p = f.points[k];
                b.qs[i8] = p as u8;
                b.qh[i8 / 4] |= ((p >> 8) as u8) << (2 * (i8 % 4));
                b.qs[QK_K / 8 + i8] = f.signs[k];
            }
        }
        if max_scale == 0.0 {
            return b;
        }
        let d = max_scale / 31.0;
        b.d = f32_to_f16(d * 0.9875);
        pack_scales(&fits, 1.0 / d, &mut b.scales);
        b
    }
}

impl Quantize for BlockIq2S {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_table_has_even_parity() {
        assert_eq!(&KSIGNS_IQ2XS[..4], &[0x00, 0x81, 0x82, 0x03]);
        assert!(KSIGNS_IQ2XS.iter().all(|s| s.count_ones() % 2 == 0));
    }

    #[test]
    fn dequantize_known_iq2xxs_group() {
        let mut b: BlockIq2Xxs = bytemuck::Zeroable::zeroed();
        b.d = f16::from_f32(1.0);
        // Group 0: grid point 1 for its first 8 elements, sign index 1 (negates element 0
        // and 7), scale 3 -> db = (0.5 + 3) / 4.
        b.qs[0] = 1;
        b.qs[2] = 1;
        b.qs[3] = 3 << 12;
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        let db = 3.5 * 0.25;
        let p = IQ2XXS_GRID[1];
        for (j, &v) in y[..8].iter().enumerate() {
            let s = if j == 0 || j == 7 { -1.0 } else { 1.0 };
            assert_eq!(v, db * ((p >> (8 * j)) as u8 as f32) * s, "{j}");
        }
        assert_eq!(y[8], db * 8.0);
    }
}
