//! IQ4_NL and IQ4_XS: 4-bit indices into one fixed non-linear table of 16 signed levels.
//!
//! IQ4_NL has blocks of 32 with one f16 scale (`x = d * K[q]`); IQ4_XS has super-blocks of
//! 256 with an f16 scale and a 6-bit signed scale per 32 elements
//! (`x = d * (ls - 32) * K[q]`). Dequantization follows ggml's; the quantizers follow the
//! search ggml's `quantize_iq4_nl`/`quantize_iq4_xs` run without an importance matrix (the
//! path llama-quantize takes), step for step, so they write llama-quantize's bytes
//! (checked file for file in the CLI's quantization test).

use super::common::{f16_to_f32, f32_to_f16, nearest_int, GROUP_MAX_EPS};
use super::Block;
use crate::types::{GgmlType, QK_K};
use half::f16;

/// The 16 levels both types index (ggml's `kvalues_iq4nl`), ascending.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// An IQ4_NL block: 18 bytes, alignment 2.
///
/// Byte `j` of `qs` indexes element `j` in its low nibble and element `j + 16` in its high one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq4Nl {
    /// Scale.
    pub d: f16,
    /// Packed 4-bit table indices.
    pub qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);
const _: () = assert!(std::mem::align_of::<BlockIq4Nl>() == 2);

/// An IQ4_XS super-block: 136 bytes, alignment 2.
///
/// Sub-block `ib` (elements `32ib..32ib+32`) has the 6-bit scale
/// `(scales_l[ib/2] >> 4(ib%2)) & 15 | ((scales_h >> 2ib) & 3) << 4`, offset by 32, and its
/// indices in `qs[16ib..16ib+16]` packed as in IQ4_NL.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockIq4Xs {
    /// Super-block scale.
    pub d: f16,
    /// High two bits of the eight sub-block scales.
    pub scales_h: u16,
    /// Low four bits of the eight sub-block scales.
    pub scales_l: [u8; 4],
    /// Packed 4-bit table indices.
    pub qs: [u8; 128],
}

const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);
const _: () = assert!(std::mem::align_of::<BlockIq4Xs>() == 2);

impl BlockIq4Xs {
    /// The 6-bit scale of sub-block `ib` (0..8), before the offset of 32.
    #[inline]
    pub fn sub_scale(&self, ib: usize) -> i32 {
        let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let hi = (self.scales_h >> (2 * ib)) & 3;
        (lo as i32) | ((hi as i32) << 4)
    }
}

/// Decodes 32 elements packed as in IQ4_NL with scale `d`.
#[inline]
fn dequantize_32(d: f32, qs: &[u8], out: &mut [f32]) {
    let (lo, hi) = out[..32].split_at_mut(16);
    for ((&q, a), b) in qs[..16].iter().zip(lo).zip(hi) {
        *a = d * KVALUES_IQ4NL[(q & 0x0f) as usize] as f32;
        *b = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
    }
}

/// Index of the table level nearest to `v` (in level units), found as ggml finds it: by
/// bisection, a tie going to the upper level. NaN maps to a valid index (the top one).
#[inline]
pub(crate) fn nearest_level(v: f32) -> u8 {
    let k = |i: usize| KVALUES_IQ4NL[i] as f32;
    if v <= k(0) {
        return 0;
    }
    if v >= k(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if v < k(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if v - k(hi - 1) < k(hi) - v {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// ggml's search for one group's scale on the IQ4 table (weights `x²`, no importance
/// matrix): the scale that maps the extreme element onto the table's last level, then
/// the fifteen inverse scales `(t - 127) / max` for `t` in `-7..=7`, each with every
/// element at its nearest level, keeping the one whose optimal scale `Σwqx / Σwq²`
/// explains most of the data. Returns that scale (0 for an all-but-zero group).
fn fit_scale(x: &[f32], w: Option<&[f32]>) -> f32 {
    const NTRY: i32 = 7;
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    // `amax` is NaN-free (`>` never takes NaN); infinities would poison every sum.
    if amax < GROUP_MAX_EPS || !amax.is_finite() {
        return 0.0;
    }
    let k0 = KVALUES_IQ4NL[0] as f32;
    let sums = |id: f32| {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for (j, &v) in x.iter().enumerate() {
            let q = KVALUES_IQ4NL[nearest_level(id * v) as usize] as f32;
            let w = w.map_or(v * v, |w| w[j]);
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let (sumqx, sumq2) = sums(1.0 / (-max / k0));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for t in -NTRY..=NTRY {
        let (sumqx, sumq2) = sums((t as f32 + k0) / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs the nearest levels of `x[..32]` for the inverse scale `id` as IQ4_NL does.
fn pack_32(x: &[f32], id: f32, qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = nearest_level(id * x[j]) | (nearest_level(id * x[j + 16]) << 4);
    }
}

impl Block for BlockIq4Nl {
    const TYPE: GgmlType = GgmlType::Iq4Nl;
    const ELEMS: usize = 32;

    fn dequantize(&self, out: &mut [f32]) {
        dequantize_32(f16_to_f32(self.d), &self.qs, out);
    }
}

/// ggml's element weights with an importance matrix: `qw · sqrt(sigma2 + x²)`, `sigma2`
/// twice the mean square of the (super-)block `x`.
fn element_weights(x: &[f32], qw: &[f32]) -> Vec<f32> {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    let sigma2 = s * (2.0 / x.len() as f32);
    x.iter()
        .zip(qw)
        .map(|(&v, &q)| q * (sigma2 + v * v).sqrt())
        .collect()
}

impl super::Quantize for BlockIq4Nl {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

impl BlockIq4Nl {
    /// Encodes `x[..32]` weighting the scale fit by the importance weights `qw` as ggml's
    /// `quantize_row_iq4_nl_impl` does (by `x²` without them).
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 32.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let x = &x[..32];
        let w = qw.map(|q| element_weights(x, &q[..32]));
        let d = fit_scale(x, w.as_deref());
        let mut qs = [0u8; 16];
        // ggml picks the levels for the unrounded scale.
        pack_32(x, if d != 0.0 { 1.0 / d } else { 0.0 }, &mut qs);
        BlockIq4Nl {
            d: f32_to_f16(d),
            qs,
        }
    }
}

impl Block for BlockIq4Xs {
    const TYPE: GgmlType = GgmlType::Iq4Xs;
    const ELEMS: usize = QK_K;

    fn dequantize(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (ib, y) in out[..QK_K].chunks_exact_mut(32).enumerate() {
            let dl = d * (self.sub_scale(ib) - 32) as f32;
            dequantize_32(dl, &self.qs[16 * ib..], y);
        }
    }
}

impl super::Quantize for BlockIq4Xs {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

impl BlockIq4Xs {
    /// Encodes `x[..256]` weighting the sub-block scale fits by the importance weights `qw`
    /// as ggml's `quantize_row_iq4_nl_impl` does for IQ4_XS (by `x²` without them).
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let x = &x[..QK_K];
        let w = qw.map(|q| element_weights(x, &q[..QK_K]));
        let mut b: BlockIq4Xs = bytemuck::Zeroable::zeroed();
        let mut scales = [0.0f32; 8];
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for (ib, (s, xb)) in scales.iter_mut().zip(x.chunks_exact(32)).enumerate() {
            *s = fit_scale(xb, w.as_deref().map(|w| &w[32 * ib..32 * ib + 32]));
            if s.abs() > amax {
                amax = s.abs();
                max = *s;
            }
        }
        // The largest sub-scale maps to -32, the most negative 6-bit level. As in ggml,
        // the sub-scales and levels are found with the unrounded super-block scale (and an
        // all-zero block stores -0).
        let d = -max / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        for (ib, (xb, &s)) in x.chunks_exact(32).zip(&scales).enumerate() {
            let l = nearest_int(id * s).clamp(-32, 31);
            let ls = (l + 32) as u8;
            b.scales_l[ib / 2] |= (ls & 0x0f) << (4 * (ib % 2));
            b.scales_h |= ((ls >> 4) as u16) << (2 * ib);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            pack_32(xb, idl, &mut b.qs[16 * ib..16 * ib + 16]);
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantize;
    use super::*;

    #[test]
    fn nearest_level_picks_the_closest_table_entry() {
        for i in -200..=200 {
            let v = i as f32 * 0.7;
            let got = KVALUES_IQ4NL[nearest_level(v) as usize] as f32;
            let best = KVALUES_IQ4NL
                .iter()
                .map(|&k| (k as f32 - v).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((got - v).abs(), best, "{v}");
        }
        assert!(nearest_level(f32::NAN) < 16);
    }

    #[test]
    fn dequantize_known_blocks() {
        let mut b = BlockIq4Nl {
            d: f16::from_f32(0.5),
            qs: [0x88; 16],
        };
        b.qs[0] = 0xf0;
        let mut y = [0.0; 32];
        b.dequantize(&mut y);
        assert_eq!((y[0], y[16], y[1], y[17]), (-63.5, 56.5, 0.5, 0.5));

        let mut x: BlockIq4Xs = bytemuck::Zeroable::zeroed();
        x.d = f16::from_f32(0.25);
        // Sub-block 3: scale 0b10_0101 = 37, so dl = 0.25 * 5.
        x.scales_l[1] = 0x50;
        x.scales_h = 0b10 << 6;
        x.qs[48] = 0x0f;
        let mut y = [0.0; QK_K];
        x.dequantize(&mut y);
        assert_eq!(x.sub_scale(3), 37);
        assert_eq!((y[96], y[112]), (1.25 * 113.0, 1.25 * -127.0));
        assert_eq!(y[0], 0.25 * -32.0 * -127.0);
    }

    #[test]
    fn quantizers_reproduce_values_on_the_table() {
        // Values exactly on the table at scale 0.5, with the extreme present.
        let x: Vec<f32> = (0..QK_K)
            .map(|i| KVALUES_IQ4NL[(i * 7) % 16] as f32 * 0.5)
            .collect();
        let nl = BlockIq4Nl::quantize(&x);
        let mut y = [0.0; 32];
        nl.dequantize(&mut y);
        assert_eq!(&y[..], &x[..32]);
        let xs = BlockIq4Xs::quantize(&x);
        let mut y = vec![0.0; QK_K];
        xs.dequantize(&mut y);
        // Every sub-block fits the scale 0.5, which the 6-bit level -32 represents exactly.
        assert_eq!(y, x);
    }

    #[test]
    fn zero_and_tiny_blocks_quantize_to_zero() {
        let nl = BlockIq4Nl::quantize(&[0.0; 32]);
        assert_eq!(nl.d.to_f32(), 0.0);
        let xs = BlockIq4Xs::quantize(&[1e-20; QK_K]);
        let mut y = vec![1.0; QK_K];
        xs.dequantize(&mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }
}
