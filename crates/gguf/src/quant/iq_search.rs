//! The sub-block scale search the IQ2 and IQ3 encoders share, after ggml's
//! `quantize_row_iq2_*_impl` / `quantize_row_iq3_*_impl`.
//!
//! A sub-block's magnitudes are fitted as `scale · (2l + 1)` with each group of levels a
//! grid point: a sweep of trial scales rounds every group to the nearest levels (or, off
//! the grid, its best listed neighbour) and keeps the trial whose least-squares scale
//! explains most of the weighted data; then groups are re-rounded at that scale and the
//! scale refitted. Float operations keep ggml's order so the bytes match its encoders.
//! The weighting and rounding helpers here serve the IQ1 encoders too.

use super::common::nearest_int;
use super::lattice::Lattice;
use crate::types::QK_K;

/// C's `MAX(a, b)` (`a > b ? a : b`), which ggml's folds use; unlike `f32::max` it lets a
/// NaN through the way C does, so non-finite input takes ggml's path.
#[inline]
pub(crate) fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `Σ x²` over a super-block divided by its length, times `factor` (ggml's `sigma2`).
pub(crate) fn sigma2(x: &[f32], factor: f32) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    factor * s / x.len() as f32
}

/// The weights used without importance weights.
#[derive(Clone, Copy)]
pub(crate) enum Fallback {
    /// `x²` (ggml's choice for IQ3 and IQ1_M; for the types where ggml insists on an
    /// importance matrix, IQ2_XXS, IQ2_XS and IQ1_S, this crate's).
    Square,
    /// `sigma2 / 4 + x²` (ggml's for IQ2_S).
    QuarterSigma,
}

/// Element weights of a sub-block: `qw · sqrt(sigma2 + x²)` with importance weights, as
/// ggml; the type's fallback without.
pub(crate) fn weights(
    x: &[f32],
    qw: Option<&[f32]>,
    sigma2: f32,
    fallback: Fallback,
    out: &mut [f32],
) {
    match qw {
        Some(qw) => {
            for ((w, &v), &q) in out.iter_mut().zip(x).zip(qw) {
                *w = q * (sigma2 + v * v).sqrt();
            }
        }
        None => {
            for (w, &v) in out.iter_mut().zip(x) {
                *w = match fallback {
                    Fallback::Square => v * v,
                    Fallback::QuarterSigma => 0.25 * sigma2 + v * v,
                };
            }
        }
    }
}

/// Splits 8 values into magnitudes and a sign byte (bit `i` set for a negative value).
/// With `even`, a sign pattern with an odd count is made even by flipping the element of
/// least `w·x²`, whose magnitude then goes negative (the IQ2_XXS/XS and IQ3_XXS sign
/// tables only hold even patterns); the byte is then returned without its top bit.
fn split_signs(x: &[f32], w: &[f32], even: bool, xval: &mut [f32]) -> u8 {
    let mut s = 0u8;
    for (i, (&v, m)) in x[..8].iter().zip(xval.iter_mut()).enumerate() {
        if v >= 0.0 {
            *m = v;
        } else {
            *m = -v;
            s |= 1 << i;
        }
    }
    if !even {
        return s;
    }
    if s.count_ones() % 2 == 1 {
        let mut imin = 0;
        let mut min = w[0] * x[0] * x[0];
        for i in 1..8 {
            let ax = w[i] * x[i] * x[i];
            if ax < min {
                min = ax;
                imin = i;
            }
        }
        xval[imin] = -xval[imin];
        s ^= 1 << imin;
    }
    s & 127
}

/// How the trial scales are anchored.
#[derive(Clone, Copy)]
pub(crate) enum Anchor {
    /// On the largest magnitude, `max / (2·kmax − 1)` (IQ2_XS, IQ2_S, IQ3).
    Max,
    /// On ggml's `make_qp_quants` fit with `kmax + 1` levels (IQ2_XXS).
    QpQuants,
}

/// Which groups are re-rounded at the chosen scale.
#[derive(Clone, Copy)]
pub(crate) enum Refit {
    /// Every group, whenever the scale is positive (IQ2_XXS).
    All,
    /// Every group, when some group of the chosen trial was off the grid (IQ3_S; with no
    /// winning trial all count as off).
    AllIfAnyOff,
    /// Only the groups that were off the grid (IQ2_XS, IQ2_S, IQ3_XXS).
    OffOnly,
}

/// The search of one type.
pub(crate) struct Search {
    /// Levels `0..kmax` (magnitudes `1, 3, .., 2·kmax − 1`).
    pub kmax: i32,
    /// Trials `-steps..=steps`, moving the anchor by `step` levels each.
    pub steps: i32,
    /// Level step between trials.
    pub step: f32,
    /// The anchor of the trials.
    pub anchor: Anchor,
    /// The re-rounding policy.
    pub refit: Refit,
    /// Sub-blocks whose largest magnitude is below this are zero (ggml tests `!max`
    /// for IQ3_S: 0 there).
    pub eps: f32,
    /// Whether sign patterns must have an even count (see [`split_signs`]).
    pub even: bool,
    /// The weights without importance weights.
    pub fallback: Fallback,
}

/// One fitted sub-block.
pub(crate) struct Fitted {
    /// Its scale (non-negative, or NaN for non-finite input).
    pub scale: f32,
    /// Its grid points, one per group.
    pub points: [u16; 8],
    /// Its sign bytes, one per 8 elements (7 bits for the even-pattern types).
    pub signs: [u8; 4],
}

/// Rounds each group of `xval` at inverse scale `id` to the grid: the levels go to `l`,
/// the chosen points to `points`, and whether each was on the grid to `on`.
#[allow(clippy::too_many_arguments)]
fn round_groups(
    lat: &Lattice,
    kmax: i32,
    xval: &[f32],
    waux: &[f32],
    id: f32,
    scale: f32,
    only: Option<&[bool]>,
    l: &mut [u8],
    points: &mut [u16],
    on: &mut [bool],
) {
    let g = lat.group();
    for (k, ((xg, wg), lg)) in xval
        .chunks_exact(g)
        .zip(waux.chunks_exact(g))
        .zip(l.chunks_exact_mut(g))
        .enumerate()
    {
        if only.is_some_and(|o| o[k]) {
            continue;
        }
        for (li, &v) in lg.iter_mut().zip(xg) {
            *li = nearest_int(0.5 * (id * v - 1.0)).clamp(0, kmax - 1) as u8;
        }
        let p = match lat.locate(lg) {
            Ok(p) => {
                on[k] = true;
                p
            }
            Err(cands) => {
                on[k] = false;
                lat.nearest(cands, xg, wg, scale, |l| (2 * l as i32 + 1) as f32)
            }
        };
        lg.copy_from_slice(lat.point(p));
        points[k] = p;
    }
}

/// `(Σ w·x·q, Σ w·q²)` for `q = 2l + 1`.
fn sums(xval: &[f32], w: &[f32], l: &[u8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for ((&x, &w), &l) in xval.iter().zip(w).zip(l) {
        let q = (2 * l as i32 + 1) as f32;
        sumqx += w * x * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

impl Search {
    /// Weighs, splits into signs and magnitudes, and fits the sub-block `xb` (16 or 32
    /// values; `qw` its importance weights); a negative scale is made positive by flipping
    /// every sign, as ggml does. `None` for a zero sub-block.
    pub(crate) fn encode(
        &self,
        lat: &Lattice,
        xb: &[f32],
        qw: Option<&[f32]>,
        sigma2: f32,
    ) -> Option<Fitted> {
        let n = xb.len();
        let mut weight = [0.0f32; 32];
        weights(xb, qw, sigma2, self.fallback, &mut weight[..n]);
        let waux = weight.map(f32::sqrt);
        let mut xval = [0.0f32; 32];
        let mut signs = [0u8; 4];
        for (k, s) in signs.iter_mut().take(n / 8).enumerate() {
            let r = 8 * k..8 * k + 8;
            *s = split_signs(&xb[r.clone()], &weight[r.clone()], self.even, &mut xval[r]);
        }
        let mut points = [0u16; 8];
        let mut scale = self.fit(lat, &xval[..n], &weight[..n], &waux[..n], &mut points)?;
        if scale < 0.0 {
            scale = -scale;
            let mask = if self.even { 127 } else { 255 };
            for s in &mut signs {
                *s = !*s & mask;
            }
        }
        Some(Fitted {
            scale,
            points,
            signs,
        })
    }

    /// Fits one sub-block: returns its scale (possibly negative, which the caller handles
    /// by flipping signs) and writes its grid points to `points` (one per group); `None`
    /// for a zero sub-block, which ggml leaves all zero (points, signs and scale).
    fn fit(
        &self,
        lat: &Lattice,
        xval: &[f32],
        weight: &[f32],
        waux: &[f32],
        points: &mut [u16],
    ) -> Option<f32> {
        let n = xval.len();
        let groups = n / lat.group();
        points[..groups].fill(0);
        let max = xval[1..].iter().fold(xval[0], |m, &v| c_max(m, v));
        // `!(max >= eps)` would also zero NaN; ggml's `<` lets NaN through, and so do we.
        if max < self.eps || max == 0.0 {
            return None;
        }
        let top = (2 * self.kmax - 1) as f32;
        let (mut scale, eff_max) = match self.anchor {
            Anchor::Max => (max / top, max),
            Anchor::QpQuants => {
                let s = make_qp_quants(self.kmax + 1, xval, weight);
                let eff = s * self.kmax as f32;
                if eff <= 0.0 {
                    return None;
                }
                (s, eff)
            }
        };
        let mut l = [0u8; 32];
        let mut laux = [0u8; 32];
        let mut paux = [0u16; 8];
        let initially_on = matches!(self.refit, Refit::OffOnly);
        let mut on = [initially_on; 8];
        let mut on_aux = [false; 8];
        let mut best = 0.0f32;
        for is in -self.steps..=self.steps {
            let id = (top + is as f32 * self.step) / eff_max;
            let this_scale = 1.0 / id;
            round_groups(
                lat,
                self.kmax,
                xval,
                waux,
                id,
                this_scale,
                None,
                &mut laux[..n],
                &mut paux,
                &mut on_aux,
            );
            let (sumqx, sumq2) = sums(xval, weight, &laux[..n]);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                l[..n].copy_from_slice(&laux[..n]);
                points[..groups].copy_from_slice(&paux[..groups]);
                on[..groups].copy_from_slice(&on_aux[..groups]);
            }
        }
        let refit = match self.refit {
            Refit::All => true,
            Refit::AllIfAnyOff | Refit::OffOnly => on[..groups].iter().any(|&o| !o),
        };
        if refit && scale > 0.0 {
            let only = matches!(self.refit, Refit::OffOnly).then_some(&on[..groups]);
            let mut on_now = [false; 8];
            round_groups(
                lat,
                self.kmax,
                xval,
                waux,
                1.0 / scale,
                scale,
                only,
                &mut l[..n],
                points,
                &mut on_now,
            );
            let (sumqx, sumq2) = sums(xval, weight, &l[..n]);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        Some(scale)
    }
}

/// Fits the `N` sub-blocks of a 256-element super-block; returns the fits (`None` for
/// zero sub-blocks) and the largest scale, ggml's `max_scale` (0 when all are zero).
pub(crate) fn fit_sub_blocks<const N: usize>(
    search: &Search,
    lat: &Lattice,
    x: &[f32],
    qw: Option<&[f32]>,
    sigma2_factor: f32,
) -> ([Option<Fitted>; N], f32) {
    let x = &x[..QK_K];
    let qw = qw.map(|q| &q[..QK_K]);
    let len = QK_K / N;
    let s2 = sigma2(x, sigma2_factor);
    let mut max_scale = 0.0f32;
    let fits = std::array::from_fn(|ib| {
        let r = len * ib..len * (ib + 1);
        let f = search.encode(lat, &x[r.clone()], qw.map(|q| &q[r]), s2);
        if let Some(f) = &f {
            max_scale = c_max(max_scale, f.scale);
        }
        f
    });
    (fits, max_scale)
}

/// ggml's `make_qp_quants`: the weighted scale for levels `0..=nmax` of non-negative
/// `x`, from a sweep of nine scales and up to five rounds of single-level changes. Only
/// the scale is kept; the levels live in ggml's `uint8_t` array, whose wrap-around for
/// the (rare) negative level is kept too because it steers the refinement.
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], w: &[f32]) -> f32 {
    make_qp_quants_into(nmax, x, w, &mut [0u8; 32])
}

/// [`make_qp_quants`] keeping the levels (`x.len()` of them, at most 32) in `big_l`.
pub(crate) fn make_qp_quants_into(nmax: i32, x: &[f32], w: &[f32], big_l: &mut [u8]) -> f32 {
    let max = x.iter().fold(0.0f32, |m, &v| c_max(m, v));
    if max < super::common::GROUP_MAX_EPS {
        big_l.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (li, &v) in big_l.iter_mut().zip(x) {
        *li = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for ((&v, &wi), &li) in x.iter().zip(w).zip(big_l.iter()) {
        let diff = v - scale * li as f32;
        best_mse += wi * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for (&v, &wi) in x.iter().zip(w) {
            let l = nearest_int(iscale_is * v).min(nmax);
            let diff = v - scale_is * l as f32;
            mse += wi * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for ((li, &v), &wi) in big_l.iter_mut().zip(x).zip(w) {
        let l = nearest_int(iscale * v).min(nmax);
        *li = l as u8;
        sumlx += wi * v * l as f32;
        suml2 += wi * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for ((li, &v), &wi) in big_l.iter_mut().zip(x).zip(w) {
            let cur = *li as f32;
            let mut slx = sumlx - wi * v * cur;
            let mut sl2 = suml2 - wi * cur * cur;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(v * sl2 / slx).min(nmax);
                if new_l != *li as i32 {
                    slx += wi * v * new_l as f32;
                    sl2 += wi * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The 4-bit sub-scale `l` with `scale ≈ d·(2l + 1)` (`id = 1/d`), as ggml rounds it.
#[inline]
pub(crate) fn odd_level(id: f32, scale: f32, top: i32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, top) as u8
}
