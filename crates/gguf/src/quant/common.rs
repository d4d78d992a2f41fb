//! Scale searches shared by the k-quant reference quantizers.
//!
//! These follow ggml's `make_qx_quants`, `make_q3_quants` and `make_qkx2_quants` step for
//! step, keeping ggml's float operation order so results agree with its reference
//! quantizers on the same input.

use half::f16;

/// Groups whose largest magnitude is below this count as all zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Rounds to the nearest integer, ties to even (the default FPU rounding ggml relies on).
///
/// Saturates instead of failing for NaN or out-of-range input.
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// Widens an f16 scale.
#[inline]
pub(crate) fn f16_to_f32(h: f16) -> f32 {
    h.to_f32()
}

/// Narrows an f32 scale with round-to-nearest-even, as `GGML_FP32_TO_FP16`.
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// Symmetric scale search (ggml `make_qx_quants` with `rmse_type == 1`): levels `L[i]` in
/// `0..2*nmax` with `x[i] ≈ scale * (L[i] - nmax)`, weighting by `qw[i]` (by `x[i]²`
/// without), then trying 18 nearby scales and keeping the best weighted fit.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for (i, &v) in x.iter().enumerate() {
            let l = quant(iscale, v) as f32;
            let w = qw.map_or(v * v, |q| q[i]);
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let fill = |levels: &mut [i8], iscale: f32| {
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = (quant(iscale, v) + nmax) as i8;
        }
    };

    let iscale = -(nmax as f32) / max;
    fill(levels, iscale);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fill(levels, iscale);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric 3-bit scale search (ggml `make_q3_quants` with `do_rmse`): start from the
/// max-based levels, then move single levels while the `x²`-weighted fit improves (at most
/// five passes). Levels come back offset by `nmax` (in `0..2*nmax`).
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        levels.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (l, &v) in levels.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (l, &v) in levels.iter_mut().zip(x) {
            let w = v * v;
            let cur = *l as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *l as i32 {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l = new_l as i8;
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
    for l in levels.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of the affine scale search [`make_qkx2_quants`].
pub(crate) struct Qkx2 {
    /// Largest level.
    pub nmax: i32,
    /// First trial offset added to `nmax`.
    pub rmin: f32,
    /// Step between trial offsets.
    pub rdelta: f32,
    /// Number of trial steps after the first (`nstep + 1` trials).
    pub nstep: i32,
    /// Minimize weighted absolute error instead of squared error.
    pub use_mad: bool,
}

/// Affine scale search (ggml `make_qkx2_quants`): levels `L[i]` in `0..=nmax` with
/// `x[i] ≈ scale * L[i] - min`, fitted by weighted least squares over a range of trial
/// scales. Returns `(scale, min)` with `min >= 0` (the amount subtracted).
pub(crate) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    aux: &mut [u8],
) -> (f32, f32) {
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
        sum_w += w;
        sum_x += w * v;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let err = |d: f32| if p.use_mad { d.abs() } else { d * d };
    let level =
        |iscale: f32, v: f32, min: f32| nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;

    let iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        *l = level(iscale, v, min);
        best_error += w * err(scale * *l as f32 + min - v);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for ((a, &v), &w) in aux.iter_mut().zip(x).zip(weights) {
            *a = level(iscale, v, min);
            let l = *a as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for ((&a, &v), &w) in aux.iter().zip(x).zip(weights) {
                cur_error += w * err(this_scale * a as f32 + this_min - v);
            }
            if cur_error < best_error {
                levels.copy_from_slice(&aux[..levels.len()]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The element of largest magnitude (first one on ties) and that magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// Packs 2-bit levels the way Q2_K and Q3_K store them: within each 128-element half,
/// byte `l` holds elements `l`, `l+32`, `l+64`, `l+96` in bit pairs 0-1, 2-3, 4-5, 6-7.
pub(crate) fn pack_2bit(levels: &[u8; 256], qs: &mut [u8; 64]) {
    for half in 0..2 {
        let base = half * 128;
        for l in 0..32 {
            qs[half * 32 + l] = levels[base + l]
                | (levels[base + l + 32] << 2)
                | (levels[base + l + 64] << 4)
                | (levels[base + l + 96] << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(f32::NAN), 0);
    }

    #[test]
    fn make_qx_quants_reproduces_a_uniform_grid() {
        // Values on an exact grid of step 0.25 must be recovered exactly.
        let x: Vec<f32> = (0..16).map(|i| (i as f32 - 8.0) * 0.25).collect();
        let mut l = [0i8; 16];
        let scale = make_qx_quants(8, &x, &mut l, None);
        for (q, v) in l.iter().zip(&x) {
            assert!(
                (scale * (*q as f32 - 8.0) - v).abs() < 1e-6,
                "{scale} {q} {v}"
            );
        }
    }

    #[test]
    fn make_qkx2_quants_fits_an_affine_grid() {
        // Sixteen levels 0.1 apart starting at -0.8: representable with scale 0.1, min 0.8.
        let x: Vec<f32> = (0..32).map(|i| -0.8 + (i % 16) as f32 * 0.1).collect();
        let w = vec![1.0; 32];
        let (mut l, mut aux) = ([0u8; 32], [0u8; 32]);
        let p = Qkx2 {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (scale, min) = make_qkx2_quants(&p, &x, &w, &mut l, &mut aux);
        assert!(min >= 0.0);
        for (q, v) in l.iter().zip(&x) {
            assert!(
                (scale * *q as f32 - min - v).abs() < 0.01,
                "{scale} {min} {q} {v}"
            );
        }
    }

    #[test]
    fn make_q3_quants_keeps_levels_in_range() {
        let x: Vec<f32> = (0..16).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        let mut l = [0i8; 16];
        let scale = make_q3_quants(4, &x, &mut l);
        assert!(scale != 0.0);
        assert!(l.iter().all(|&q| (0..8).contains(&q)));
    }
}
