//! IQ1_S and IQ1_M: super-blocks of 256 whose groups of eight values in -1..=1 are points
//! of a fixed 2048-point grid, shifted by ±1/8 and scaled per group
//! (`x = d * (2s + 1) * (grid[j] ± 0.125)`). Decoding follows ggml; there is no quantizer.

use super::common::f16_to_f32;
use super::iq_grids::IQ1S_GRID;
use super::Block;
use crate::types::{GgmlType, QK_K};
use half::f16;

/// The shift both types add to every grid value (`IQ1S_DELTA` in ggml).
pub const IQ1S_DELTA: f32 = 0.125;

/// An IQ1_S super-block: 50 bytes, alignment 2.
///
/// Grid index `k` (elements `8k..8k+8`) is `qs[k] | ((qh[k/4] >> 3(k%4)) & 7) << 8`; for
/// each 32 elements `ib`, `qh[ib]` bits 12..15 hold the 3-bit scale and bit 15 the sign of
/// the shift.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq1S {
    /// Super-block scale.
    pub d: f16,
    /// Low grid-index bytes.
    pub qs: [u8; 32],
    /// High index bits, scales and shift signs.
    pub qh: [u16; 8],
}

const _: () = assert!(std::mem::size_of::<BlockIq1S>() == 50);

/// An IQ1_M super-block: 56 bytes, **alignment 1** (no field is wider than a byte; the f16
/// super-block scale is spread over the top nibbles of the four `u16` words in `scales`).
///
/// Grid index `k` is `qs[k] | ((qh[k/2] >> 4(k%2)) & 7) << 8`, and bit 3 of that nibble
/// negates the shift; the 3-bit scale of elements `16i..16i+16` is bits `3(i%4)..` of
/// scale word `i/4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq1M {
    /// Low grid-index bytes.
    pub qs: [u8; 32],
    /// High index bits and shift signs, a nibble per 8 elements.
    pub qh: [u8; 16],
    /// Four little-endian `u16`: 3-bit scales, and the f16 scale in the top nibbles.
    pub scales: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<BlockIq1M>() == 56);
const _: () = assert!(std::mem::align_of::<BlockIq1M>() == 1);

/// Writes `dl * (grid[j] + delta)` for the eight elements of one group.
#[inline]
fn put_group(out: &mut [f32], dl: f32, point: u64, delta: f32) {
    for (j, y) in out[..8].iter_mut().enumerate() {
        *y = dl * ((point >> (8 * j)) as u8 as i8 as f32 + delta);
    }
}

impl Block for BlockIq1S {
    const TYPE: GgmlType = GgmlType::Iq1S;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (k, y) in out[..QK_K].chunks_exact_mut(8).enumerate() {
            let qh = self.qh[k / 4];
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            };
            let idx = self.qs[k] as usize | (((qh >> (3 * (k % 4))) & 7) as usize) << 8;
            put_group(y, dl, IQ1S_GRID[idx], delta);
        }
    }
}

impl BlockIq1M {
    /// Scale word `i` (0..4).
    #[inline]
    pub fn scale_word(&self, i: usize) -> u16 {
        u16::from_le_bytes([self.scales[2 * i], self.scales[2 * i + 1]])
    }

    /// The super-block scale gathered from the top nibbles of the scale words.
    #[inline]
    pub fn d(&self) -> f16 {
        let w = |i| self.scale_word(i);
        f16::from_bits(
            (w(0) >> 12) | ((w(1) >> 8) & 0xf0) | ((w(2) >> 4) & 0xf00) | (w(3) & 0xf000),
        )
    }
}

impl Block for BlockIq1M {
    const TYPE: GgmlType = GgmlType::Iq1M;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d());
        for (k, y) in out[..QK_K].chunks_exact_mut(8).enumerate() {
            let i = k / 2; // 16-element scale group
            let s = (self.scale_word(i / 4) >> (3 * (i % 4))) & 7;
            let dl = d * (2 * s + 1) as f32;
            let nib = (self.qh[k / 2] >> (4 * (k % 2))) & 0x0f;
            let delta = if nib & 8 != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            };
            let idx = self.qs[k] as usize | ((nib & 7) as usize) << 8;
            put_group(y, dl, IQ1S_GRID[idx], delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq1m_gathers_its_scale_from_four_nibbles() {
        let mut b: BlockIq1M = bytemuck::Zeroable::zeroed();
        let bits = f16::from_f32(-3.25).to_bits();
        for i in 0..4 {
            let nib = (bits >> (4 * i)) & 0xf;
            b.scales[2 * i + 1] = (nib << 4) as u8;
        }
        assert_eq!(b.d().to_f32(), -3.25);
        // Scale 0 of word 0 = 2 -> dl = d * 5; grid point 0 is all -1, shift +1/8.
        b.scales[0] = 2;
        let mut y = [0.0; QK_K];
        b.dequantize(&mut y);
        assert_eq!(y[0], -3.25 * 5.0 * (-1.0 + 0.125));
        assert_eq!(y[16], -3.25 * (-1.0 + 0.125));
    }
}
