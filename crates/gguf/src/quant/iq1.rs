//! IQ1_S and IQ1_M: super-blocks of 256 whose groups of eight values in -1..=1 are points
//! of a fixed 2048-point grid, shifted by ±1/8 and scaled per group
//! (`x = d * (2s + 1) * (grid[j] ± 0.125)`). Decoding follows ggml; so do the encoders
//! (`quantize_row_iq1_s_impl` / `quantize_row_iq1_m_impl`), byte for byte given the same
//! weights: an exhaustive search of the two cuts that split a sorted sub-block into the
//! levels -1, 0, 1 under each shift sign, then a snap of each group to the grid.

use super::common::{f16_to_f32, f32_to_f16};
use super::iq_grids::IQ1S_GRID;
use super::iq_search::{c_max, odd_level, sigma2, weights, Fallback};
use super::lattice::{self, Lattice};
use super::{Block, Quantize};
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

/// The three values a level stands for with the shift added (`+`) or subtracted (`-`).
const X_P: [f32; 3] = [-1.0 + IQ1S_DELTA, IQ1S_DELTA, 1.0 + IQ1S_DELTA];
const X_M: [f32; 3] = [-1.0 - IQ1S_DELTA, -IQ1S_DELTA, 1.0 - IQ1S_DELTA];

/// Indices of `x` in ascending order of value. ggml sorts (value, index) pairs by value
/// alone; equal values (−0 and +0 among them) keep index order here.
fn ascending<const N: usize>(x: &[f32]) -> [usize; N] {
    let mut idx: [usize; N] = std::array::from_fn(|i| i);
    idx.sort_by(|&a, &b| (x[a] + 0.0).total_cmp(&(x[b] + 0.0)));
    idx
}

/// Levels for the cuts `(i1, i2)` of the ascending order `idx`: 0 below `i1`, 1 up to
/// `i2`, 2 from there.
fn split_levels<const N: usize>(idx: &[usize; N], i1: usize, i2: usize) -> [u8; N] {
    let mut l = [0u8; N];
    for (j, &i) in idx.iter().enumerate() {
        l[i] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
    l
}

/// Puts each 8-element group of levels `l` on the grid (off it, the weighted best listed
/// neighbour at `scale` for the group's values `xx[k]`) into `points`; when some group
/// moved, refits the scale to the points, keeping it when the fit is not positive.
fn snap(
    lat: &Lattice,
    xb: &[f32],
    w: &[f32],
    l: &[u8],
    mut scale: f32,
    xx: &[&[f32; 3]],
    points: &mut [u16],
) -> f32 {
    let mut all_on = true;
    for (k, p) in points.iter_mut().enumerate() {
        let r = 8 * k..8 * k + 8;
        *p = match lat.locate(&l[r.clone()]) {
            Ok(p) => p,
            Err(cands) => {
                all_on = false;
                lat.nearest(cands, &xb[r.clone()], &w[r], scale, |l| xx[k][l as usize])
            }
        };
    }
    if !all_on {
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for (k, &p) in points.iter().enumerate() {
            for (j, &lv) in lat.point(p).iter().enumerate() {
                let (wi, q) = (w[8 * k + j], xx[k][lv as usize]);
                sumqx += wi * q * xb[8 * k + j];
                sumq2 += wi * q * q;
            }
        }
        if sumqx > 0.0 && sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    scale
}

/// The IQ1_S fit of one 32-element sub-block: `(scale, shift sign, grid points)`;
/// `None` for a zero sub-block or when no split fits.
fn fit_iq1s(lat: &Lattice, xb: &[f32], w: &[f32]) -> Option<(f32, i8, [u16; 4])> {
    let max = xb[1..].iter().fold(xb[0].abs(), |m, &v| c_max(m, v.abs()));
    if max < 1e-12 {
        return None;
    }
    let idx = ascending::<32>(xb);
    let (mut sumx, mut sumw) = ([0.0f32; 33], [0.0f32; 33]);
    for (j, &i) in idx.iter().enumerate() {
        sumx[j + 1] = sumx[j] + w[i] * xb[i];
        sumw[j + 1] = sumw[j] + w[i];
    }
    let (mut best_score, mut scale) = (-f32::MAX, max);
    let mut best: Option<(usize, usize, i8)> = None;
    for i1 in 0..=32 {
        for i2 in i1..=32 {
            for (xs, shift) in [(&X_P, 1i8), (&X_M, -1)] {
                let sumqx = (sumx[i1] - sumx[0]) * xs[0]
                    + (sumx[i2] - sumx[i1]) * xs[1]
                    + (sumx[32] - sumx[i2]) * xs[2];
                let sumq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0]
                    + (sumw[i2] - sumw[i1]) * xs[1] * xs[1]
                    + (sumw[32] - sumw[i2]) * xs[2] * xs[2];
                if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                    scale = sumqx / sumq2;
                    best_score = scale * sumqx;
                    best = Some((i1, i2, shift));
                }
            }
        }
    }
    let (i1, i2, mut shift) = best?;
    let mut l = split_levels(&idx, i1, i2);
    if scale < 0.0 {
        l = l.map(|v| 2 - v);
        scale = -scale;
        shift = -shift;
    }
    let xx = if shift == 1 { &X_P } else { &X_M };
    let mut points = [0u16; 4];
    let scale = snap(lat, xb, w, &l, scale, &[xx; 4], &mut points);
    Some((scale, shift, points))
}

impl BlockIq1S {
    /// Encodes `x[..256]` as ggml does, weighting elements by the importance weights `qw`
    /// (an imatrix row, same length) or, without them, by `x²` (ggml requires them).
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let x = &x[..QK_K];
        let qw = qw.map(|q| &q[..QK_K]);
        let lat = lattice::iq1s();
        let s2 = sigma2(x, 2.0);
        let mut b: Self = bytemuck::Zeroable::zeroed();
        let mut fits = [(0.0f32, 1i8); 8];
        let mut max_scale = 0.0f32;
        for (ib, xb) in x.chunks_exact(32).enumerate() {
            let mut w = [0.0f32; 32];
            let r = 32 * ib..32 * ib + 32;
            weights(xb, qw.map(|q| &q[r]), s2, Fallback::Square, &mut w);
            let Some((scale, shift, points)) = fit_iq1s(lat, xb, &w) else {
                continue;
            };
            for (k, &p) in points.iter().enumerate() {
                b.qs[4 * ib + k] = p as u8;
                b.qh[ib] |= (p >> 8) << (3 * k);
            }
            fits[ib] = (scale, shift);
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            return b;
        }
        let d = max_scale / 15.0;
        // ggml's fudge factor on the stored scale.
        b.d = f32_to_f16(d * 1.125);
        let id = 1.0 / d;
        for (qh, &(scale, shift)) in b.qh.iter_mut().zip(&fits) {
            let l = odd_level(id, scale, 7) as u16 | if shift == -1 { 8 } else { 0 };
            *qh |= l << 12;
        }
        b
    }
}

impl Quantize for BlockIq1S {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
    }
}

/// The shift values of IQ1_M's two groups for ggml's shift code `k` (bit 1: the first
/// group subtracts the shift, bit 0: the second).
fn iq1m_values(k: usize) -> [&'static [f32; 3]; 2] {
    let v = |minus: bool| if minus { &X_M } else { &X_P };
    [v(k >= 2), v(k % 2 == 1)]
}

/// The IQ1_M fit of one 16-element sub-block: `(scale, shift code, grid points)`; `None`
/// for a zero sub-block or when no split fits. Each half of the sub-block has its own
/// shift sign, so the prefix sums are kept per half.
fn fit_iq1m(lat: &Lattice, xb: &[f32], w: &[f32]) -> Option<(f32, usize, [u16; 2])> {
    let max = xb[1..].iter().fold(xb[0].abs(), |m, &v| c_max(m, v.abs()));
    if max < 1e-7 {
        return None;
    }
    let idx = ascending::<16>(xb);
    let (mut px, mut pw) = ([[0.0f32; 17]; 2], [[0.0f32; 17]; 2]);
    for (j, &i) in idx.iter().enumerate() {
        let h = usize::from(i >= 8);
        px[h][j + 1] = px[h][j] + w[i] * xb[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + w[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    let (p2, m2) = (X_P[2], X_M[2]);
    let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
    let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
    let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
    let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
    let (mut best_score, mut scale) = (-f32::MAX, max);
    let mut best: Option<(usize, usize, usize)> = None;
    for i1 in 0..=16 {
        for i2 in i1..=16 {
            // Per half, with the shift added (p) or subtracted (m): Σwxq and Σwq².
            let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) =
                ([0.0f32; 2], [0.0f32; 2], [0.0f32; 2], [0.0f32; 2]);
            for h in 0..2 {
                let (tx, tw) = (px[h][16], pw[h][16]);
                let sx = px[h][i1] + px[h][i2];
                qx_p[h] = tx * p2 - sx;
                qx_m[h] = tx * m2 - sx;
                q2_p[h] = tw * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                q2_m[h] = tw * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
            }
            let sumqx = [
                qx_p[0] + qx_p[1],
                qx_p[0] + qx_m[1],
                qx_m[0] + qx_p[1],
                qx_m[0] + qx_m[1],
            ];
            let sumq2 = [
                q2_p[0] + q2_p[1],
                q2_p[0] + q2_m[1],
                q2_m[0] + q2_p[1],
                q2_m[0] + q2_m[1],
            ];
            for k in 0..4 {
                if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                    scale = sumqx[k] / sumq2[k];
                    best_score = scale * sumqx[k];
                    best = Some((i1, i2, k));
                }
            }
        }
    }
    let (i1, i2, mut k) = best?;
    let mut l = split_levels(&idx, i1, i2);
    if scale < 0.0 {
        l = l.map(|v| 2 - v);
        scale = -scale;
        k = 3 - k;
    }
    let mut points = [0u16; 2];
    let scale = snap(lat, xb, w, &l, scale, &iq1m_values(k), &mut points);
    Some((scale, k, points))
}

impl BlockIq1M {
    /// Encodes `x[..256]` as ggml does, weighting elements by the importance weights `qw`
    /// (an imatrix row, same length) or, without them, by `x²` as ggml does.
    ///
    /// # Panics
    /// If `x` or `qw` is shorter than 256.
    pub fn quantize_weighted(x: &[f32], qw: Option<&[f32]>) -> Self {
        let x = &x[..QK_K];
        let qw = qw.map(|q| &q[..QK_K]);
        let lat = lattice::iq1s();
        let s2 = sigma2(x, 2.0);
        let mut b: Self = bytemuck::Zeroable::zeroed();
        let mut w = [[0.0f32; 16]; 16];
        // Zero sub-blocks keep scale 0, shift code 0 and grid point 0, as in ggml.
        let mut fits = [(0.0f32, 0usize, [0u16; 2]); 16];
        let mut max_scale = 0.0f32;
        for (ib, xb) in x.chunks_exact(16).enumerate() {
            let r = 16 * ib..16 * ib + 16;
            weights(xb, qw.map(|q| &q[r]), s2, Fallback::Square, &mut w[ib]);
            let Some(fit) = fit_iq1m(lat, xb, &w[ib]) else {
                continue;
            };
            let p = fit.2;
            b.qs[2 * ib] = p[0] as u8;
            b.qs[2 * ib + 1] = p[1] as u8;
            b.qh[ib] = (p[0] >> 8) as u8 | ((p[1] >> 8) as u8) << 4;
            fits[ib] = fit;
            max_scale = c_max(max_scale, fit.0);
        }
        if max_scale == 0.0 {
            return b;
        }
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let mut sc = [0u16; 4];
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        // The super-block scale is refitted to the rounded sub-scales and the points.
        for (ib, xb) in x.chunks_exact(16).enumerate() {
            let (scale, k, points) = fits[ib];
            let l = odd_level(id, scale, 7);
            sc[ib / 4] |= (l as u16) << (3 * (ib % 4));
            b.qh[ib] |= [0x00, 0x80, 0x08, 0x88][k];
            let xx = iq1m_values(k);
            for (g, &p) in points.iter().enumerate() {
                for (j, &lv) in lat.point(p).iter().enumerate() {
                    let wi = w[ib][8 * g + j];
                    let q = xx[g][lv as usize] * (2 * l as i32 + 1) as f32;
                    sumqx += wi * q * xb[8 * g + j];
                    sumq2 += wi * q * q;
                }
            }
        }
        if sumq2 > 0.0 {
            d = sumqx / sumq2;
        }
        // ggml's fudge factor on the stored scale.
        let bits = f32_to_f16(d * 1.1125).to_bits();
        sc[0] |= (bits & 0x000f) << 12;
        sc[1] |= (bits & 0x00f0) << 8;
        sc[2] |= (bits & 0x0f00) << 4;
        sc[3] |= bits & 0xf000;
        for (i, v) in sc.iter().enumerate() {
            b.scales[2 * i..2 * i + 2].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

impl Quantize for BlockIq1M {
    fn quantize(x: &[f32]) -> Self {
        Self::quantize_weighted(x, None)
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
