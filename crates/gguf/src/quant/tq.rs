//! TQ1_0 and TQ2_0: ternary super-blocks of 256 (`x = d * t`, `t` in -1..=1) for models
//! trained ternary. TQ2_0 stores two bits per value; TQ1_0 packs five values per byte in
//! base 3 (1.6875 bits per weight with the scale). Both codecs follow ggml's and the `gguf`
//! Python package's.

use super::common::{f16_to_f32, f32_to_f16};
use super::Block;
use crate::types::{GgmlType, QK_K};
use half::f16;

/// A TQ1_0 super-block: 54 bytes, alignment 2.
///
/// `qs[..32]` hold elements `32m + j` (`m` in 0..5) of byte `j`, `qs[32..48]` elements
/// `160 + 16m + j`, and `qh` elements `240 + 4m + j` (`m` in 0..4); the `m`-th trit of a byte
/// is the top trit of `byte * 3^m` (mod 256) read as `(b * 3) >> 8`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTq1_0 {
    /// Five trits per byte.
    pub qs: [u8; 48],
    /// Four trits per byte.
    pub qh: [u8; 4],
    /// Scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockTq1_0>() == 54);

/// A TQ2_0 super-block: 66 bytes, alignment 2.
///
/// Element `128c + 32l + j` is `((qs[32c + j] >> 2l) & 3) - 1`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTq2_0 {
    /// Four 2-bit values per byte.
    pub qs: [u8; 64],
    /// Scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockTq2_0>() == 66);

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// The `m`-th trit (0..=2) of a base-3 packed byte.
#[inline]
pub fn trit(byte: u8, m: usize) -> i32 {
    let q = byte.wrapping_mul(POW3[m]);
    ((q as u16 * 3) >> 8) as i32
}

impl BlockTq1_0 {
    /// The 256 values `t + 1` in element order.
    pub fn trits(&self) -> [u8; QK_K] {
        let mut t = [0u8; QK_K];
        for m in 0..5 {
            for j in 0..32 {
                t[32 * m + j] = trit(self.qs[j], m) as u8;
            }
            for j in 0..16 {
                t[160 + 16 * m + j] = trit(self.qs[32 + j], m) as u8;
            }
        }
        for m in 0..4 {
            for j in 0..4 {
                t[240 + 4 * m + j] = trit(self.qh[j], m) as u8;
            }
        }
        t
    }
}

/// Ternary levels `round(x / amax) + 1` and the scale `amax`, as the reference does.
fn ternary(x: &[f32]) -> ([u8; QK_K], f32) {
    let d = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut t = [1u8; QK_K];
    for (q, &v) in t.iter_mut().zip(x) {
        // Round half away from zero; the clamp only matters for non-finite input.
        *q = ((v * id).round().clamp(-1.0, 1.0) as i32 + 1) as u8;
    }
    (t, d)
}

/// Packs up to five trits into one byte so that [`trit`] reads them back: the base-3
/// number `t0 t1 t2 t3 t4` scaled from `0..243` onto `0..256`, rounding up.
fn pack_trits(ts: impl Iterator<Item = u8>) -> u8 {
    let mut q: u16 = 0;
    let mut n = 0;
    for t in ts {
        q = q * 3 + t as u16;
        n += 1;
    }
    for _ in n..5 {
        q *= 3;
    }
    (q * 256).div_ceil(243) as u8
}

impl Block for BlockTq1_0 {
    const TYPE: GgmlType = GgmlType::Tq1_0;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (y, &t) in out[..QK_K].iter_mut().zip(&self.trits()) {
            *y = d * (t as i32 - 1) as f32;
        }
    }
}

impl super::Quantize for BlockTq1_0 {
    fn quantize(x: &[f32]) -> Self {
        let (t, d) = ternary(&x[..QK_K]);
        let mut b: BlockTq1_0 = bytemuck::Zeroable::zeroed();
        for j in 0..32 {
            b.qs[j] = pack_trits((0..5).map(|m| t[32 * m + j]));
        }
        for j in 0..16 {
            b.qs[32 + j] = pack_trits((0..5).map(|m| t[160 + 16 * m + j]));
        }
        for j in 0..4 {
            b.qh[j] = pack_trits((0..4).map(|m| t[240 + 4 * m + j]));
        }
        b.d = f32_to_f16(d);
        b
    }
}

impl Block for BlockTq2_0 {
    const TYPE: GgmlType = GgmlType::Tq2_0;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (i, y) in out[..QK_K].iter_mut().enumerate() {
            let (c, l, j) = (i / 128, (i / 32) % 4, i % 32);
            let q = (self.qs[32 * c + j] >> (2 * l)) & 3;
            *y = d * (q as i32 - 1) as f32;
        }
    }
}

impl super::Quantize for BlockTq2_0 {
    fn quantize(x: &[f32]) -> Self {
        let (t, d) = ternary(&x[..QK_K]);
        let mut b: BlockTq2_0 = bytemuck::Zeroable::zeroed();
        for (i, &q) in t.iter().enumerate() {
            let (c, l, j) = (i / 128, (i / 32) % 4, i % 32);
            b.qs[32 * c + j] |= q << (2 * l);
        }
        b.d = f32_to_f16(d);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn every_trit_pattern_round_trips_through_a_byte() {
        for v in 0..243u16 {
            let ts: Vec<u8> = (0..5).rev().map(|m| (v / 3u16.pow(m)) as u8 % 3).collect();
            let b = pack_trits(ts.iter().copied());
            let back: Vec<u8> = (0..5).map(|m| trit(b, m) as u8).collect();
            assert_eq!(back, ts, "{v}");
        }
    }

    #[test]
    fn ternary_values_round_trip() {
        let x: Vec<f32> = (0..QK_K).map(|i| ((i * 7) % 3) as f32 - 1.0).collect();
        for y in [
            {
                let mut y = vec![0.0; QK_K];
                BlockTq1_0::quantize(&x).dequantize(&mut y);
                y
            },
            {
                let mut y = vec![0.0; QK_K];
                BlockTq2_0::quantize(&x).dequantize(&mut y);
                y
            },
        ] {
            assert_eq!(y, x);
        }
    }
}
