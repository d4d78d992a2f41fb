//! Rotary position embedding, in place.
//!
//! The angles follow ggml's cache construction: `theta_scale = base^(-2 / n_dims)` once,
//! then per token `theta_0 = pos` and `theta_{i+1} = theta_i * theta_scale` (an f32
//! running product), each pair rotated by `freq_scale * theta_i` with `cos`/`sin` in f32.
//! Pairs are `(2i, 2i+1)` for [`RopeStyle::Interleaved`] (ggml "normal") and
//! `(i, i + n_dims/2)` for [`RopeStyle::NonInterleaved`] (NEOX); dimensions from `n_dims`
//! to `hd` pass through unchanged. With frequency factors (Llama 3 scaling) pair `i` turns by
//! `freq_scale * theta_i / factor_i`, as ggml's `rope_ext` does. With YaRN terms
//! ([`Yarn`]) the pair's angle mixes that interpolated angle with the unscaled one along
//! ggml's ramp, and cos and sin carry its magnitude factor.

use minfer_graph::{RoPEMeta, RopeStyle, Yarn};

use super::{as_i32, par_rows, PAR_MIN_ELEMS};
use crate::threadpool::ThreadPool;

/// Writes the `(cos, sin)` pairs of position `pos` into `cache` (`n_dims` values);
/// `factors` (at least `n_dims / 2` values) divide the pairs' angles; `yarn` adds the
/// YaRN terms.
pub fn rope_cache(
    pos: i32,
    n_dims: usize,
    freq_base: f32,
    freq_scale: f32,
    factors: Option<&[f32]>,
    yarn: Option<&Yarn>,
    cache: &mut [f32],
) {
    let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
    let mut theta = pos as f32;
    let corr = yarn.map(|y| y.corr_dims(n_dims, freq_base));
    let mscale = yarn.map_or(1.0, |y| y.mscale(freq_scale));
    for (i, pair) in cache[..n_dims].chunks_exact_mut(2).enumerate() {
        let ff = factors.map_or(1.0, |f| f[i]);
        (pair[0], pair[1]) = match (yarn, corr) {
            (Some(y), Some(corr)) => {
                let t = y.angle(theta / ff, freq_scale, corr, i);
                (t.cos() * mscale, t.sin() * mscale)
            }
            _ => {
                let t = freq_scale * (theta / ff);
                (t.cos(), t.sin())
            }
        };
        theta *= theta_scale;
    }
}

/// Rotates one head (`hd` values) with the `(cos, sin)` pairs of `cache`.
pub fn rotate_head(head: &mut [f32], cache: &[f32], n_dims: usize, style: RopeStyle) {
    let half = n_dims / 2;
    for i in 0..half {
        let (c, s) = (cache[2 * i], cache[2 * i + 1]);
        let (a, b) = match style {
            RopeStyle::NonInterleaved => (i, i + half),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * c - x1 * s;
        head[b] = x0 * s + x1 * c;
    }
}

/// Rotates `nt` token rows of `stride` values (heads at the start of each row) in place,
/// at the I32 positions `pos`, with the frequency factors `factors` when the node has them.
/// `cache` is scratch (grown to `nt * n_dims`, then reused).
#[allow(clippy::too_many_arguments)]
pub fn rope_inplace(
    pool: &ThreadPool,
    x: &mut [f32],
    stride: usize,
    nt: usize,
    pos: &[f32],
    m: &RoPEMeta,
    factors: Option<&[f32]>,
    cache: &mut Vec<f32>,
) -> Result<(), String> {
    let row = m.n_head * m.hd;
    if m.n_dims == 0 || !m.n_dims.is_multiple_of(2) || m.n_dims > m.hd {
        return Err(format!(
            "rope: n_dims {} must be even, positive and at most hd {}",
            m.n_dims, m.hd
        ));
    }
    if stride < row || x.len() < stride * nt || pos.len() < nt {
        return Err(format!(
            "rope: {} values for {nt} rows of {stride} (heads need {row}), {} positions",
            x.len(),
            pos.len()
        ));
    }
    if let Some(f) = factors {
        if f.len() < m.n_dims / 2 || f.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
            return Err(format!(
                "rope: {} frequency factors for {} pairs; each must be a positive number",
                f.len(),
                m.n_dims / 2
            ));
        }
    }
    if nt == 0 {
        return Ok(());
    }
    let nd = m.n_dims;
    if cache.len() < nt * nd {
        cache.resize(nt * nd, 0.0);
    }
    let cache = &mut cache[..nt * nd];
    par_rows(
        pool,
        cache,
        nd,
        nt * nd >= PAR_MIN_ELEMS / 8,
        &|t0, rows| {
            for (i, c) in rows.chunks_exact_mut(nd).enumerate() {
                rope_cache(
                    as_i32(pos[t0 + i]),
                    nd,
                    m.freq_base,
                    m.freq_scale,
                    factors,
                    m.yarn.as_ref(),
                    c,
                );
            }
        },
    );
    let cache: &[f32] = cache;
    par_rows(
        pool,
        &mut x[..nt * stride],
        stride,
        nt * row >= PAR_MIN_ELEMS,
        &|t0, rows| {
            for (i, r) in rows.chunks_exact_mut(stride).enumerate() {
                let c = &cache[(t0 + i) * nd..(t0 + i + 1) * nd];
                for head in r[..row].chunks_exact_mut(m.hd) {
                    rotate_head(head, c, nd, m.style);
                }
            }
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    fn meta(style: RopeStyle, n_dims: usize) -> RoPEMeta {
        RoPEMeta {
            n_dims,
            freq_base: 1_000_000.0,
            freq_scale: 1.0,
            n_head: 3,
            hd: 8,
            style,
            freq_factors: None,
            yarn: None,
        }
    }

    /// Closed-form f64 rotation: theta = pos * freq_scale * base^(-2i/n_dims).
    fn closed_form(x: &[f32], pos: i32, m: &RoPEMeta) -> Vec<f64> {
        let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let half = m.n_dims / 2;
        for h in 0..m.n_head {
            for i in 0..half {
                let th = pos as f64
                    * m.freq_scale as f64
                    * (m.freq_base as f64).powf(-2.0 * i as f64 / m.n_dims as f64);
                let (a, b) = match m.style {
                    RopeStyle::NonInterleaved => (h * m.hd + i, h * m.hd + i + half),
                    RopeStyle::Interleaved => (h * m.hd + 2 * i, h * m.hd + 2 * i + 1),
                };
                let (x0, x1) = (x[a] as f64, x[b] as f64);
                out[a] = x0 * th.cos() - x1 * th.sin();
                out[b] = x0 * th.sin() + x1 * th.cos();
            }
        }
        out
    }

    #[test]
    fn both_styles_match_the_closed_form_and_keep_tail_dims() {
        let mut r = Rng::new(11);
        let pool = ThreadPool::new(2);
        for style in [RopeStyle::Interleaved, RopeStyle::NonInterleaved] {
            let m = meta(style, 6);
            let positions = [0i32, 1, 5, 37];
            let nt = positions.len();
            let x = r.vec(nt * 24, 1.0);
            let pos: Vec<f32> = positions
                .iter()
                .map(|&p| f32::from_bits(p as u32))
                .collect();
            let mut y = x.clone();
            let mut cache = Vec::new();
            rope_inplace(&pool, &mut y, 24, nt, &pos, &m, None, &mut cache).unwrap();
            for t in 0..nt {
                let want = closed_form(&x[t * 24..(t + 1) * 24], positions[t], &m);
                for (i, (a, b)) in y[t * 24..(t + 1) * 24].iter().zip(&want).enumerate() {
                    assert!(
                        (*a as f64 - b).abs() < 1e-5,
                        "{style:?} t{t} i{i}: {a} vs {b}"
                    );
                    if i % 8 >= 6 {
                        assert_eq!(*a, x[t * 24 + i], "dims past n_dims are untouched");
                    }
                }
            }
        }
    }

    #[test]
    fn frequency_factors_divide_each_pairs_angle() {
        let pool = ThreadPool::new(1);
        let mut r = Rng::new(5);
        let m = RoPEMeta {
            freq_factors: Some("rope_freqs.weight".into()),
            ..meta(RopeStyle::Interleaved, 8)
        };
        let factors = [1.0f32, 2.0, 8.0, 31.5];
        let x = r.vec(24, 1.0);
        let mut y = x.clone();
        let mut cache = Vec::new();
        let pos = [f32::from_bits(7)];
        rope_inplace(&pool, &mut y, 24, 1, &pos, &m, Some(&factors), &mut cache).unwrap();
        for h in 0..3 {
            for (i, &ff) in factors.iter().enumerate() {
                let th = 7.0 * 1e6f64.powf(-2.0 * i as f64 / 8.0) / ff as f64;
                let (a, b) = (h * 8 + 2 * i, h * 8 + 2 * i + 1);
                let (x0, x1) = (x[a] as f64, x[b] as f64);
                let want = [x0 * th.cos() - x1 * th.sin(), x0 * th.sin() + x1 * th.cos()];
                for (got, want) in [y[a], y[b]].iter().zip(want) {
                    assert!(
                        (*got as f64 - want).abs() < 1e-5,
                        "h{h} i{i}: {got} vs {want}"
                    );
                }
            }
        }
        // Too few factors, or a zero one, is refused rather than read out of bounds.
        let mut y = x.clone();
        let short = rope_inplace(
            &pool,
            &mut y,
            24,
            1,
            &pos,
            &m,
            Some(&factors[..3]),
            &mut cache,
        );
        assert!(short.unwrap_err().contains("frequency factors"));
        let zero = rope_inplace(
            &pool,
            &mut y,
            24,
            1,
            &pos,
            &m,
            Some(&[1.0, 0.0, 1.0, 1.0]),
            &mut cache,
        );
        assert!(zero.is_err());
    }

    #[test]
    fn angles_are_the_running_product() {
        let mut c = [0.0f32; 8];
        rope_cache(3, 8, 10000.0, 0.5, None, None, &mut c);
        let ts = 10000f32.powf(-2.0 / 8.0);
        let mut th = 3.0f32;
        for i in 0..4 {
            assert_eq!(c[2 * i].to_bits(), (0.5 * th).cos().to_bits());
            assert_eq!(c[2 * i + 1].to_bits(), (0.5 * th).sin().to_bits());
            th *= ts;
        }
    }

    /// YaRN against an f64 closed form of ggml's `rope_yarn`: with factor 32 over a
    /// 4096-token original context, the fast pairs keep their unscaled angle, the slow
    /// ones the interpolated one, the middle a mix, all scaled by `1 + 0.1 ln 32`.
    #[test]
    fn yarn_mixes_the_angles_along_the_ramp() {
        let y = Yarn {
            ext_factor: 1.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
        };
        let (n_dims, base, fs) = (64usize, 150_000.0f32, 1.0f32 / 32.0);
        let corr = y.corr_dims(n_dims, base);
        assert!(
            corr[0] > 0.0 && corr[1] < 31.0 && corr[0] < corr[1],
            "{corr:?}"
        );
        let pos = 3001;
        let mut c = vec![0.0f32; n_dims];
        rope_cache(pos, n_dims, base, fs, None, Some(&y), &mut c);
        let ms = 1.0 + 0.1 * 32f64.ln();
        for i in 0..n_dims / 2 {
            let extrap = pos as f64 * (base as f64).powf(-2.0 * i as f64 / n_dims as f64);
            let r =
                1.0 - ((i as f64 - corr[0] as f64) / (corr[1] - corr[0]) as f64).clamp(0.0, 1.0);
            let th = extrap * fs as f64 * (1.0 - r) + extrap * r;
            let (gc, gs) = (c[2 * i] as f64, c[2 * i + 1] as f64);
            assert!(
                (gc - th.cos() * ms).abs() < 2e-3,
                "pair {i}: cos {gc} vs {}",
                th.cos() * ms
            );
            assert!(
                (gs - th.sin() * ms).abs() < 2e-3,
                "pair {i}: sin {gs} vs {}",
                th.sin() * ms
            );
        }
    }

    #[test]
    fn invalid_geometry_is_an_error() {
        let pool = ThreadPool::new(1);
        let mut x = vec![0.0; 24];
        let mut cache = Vec::new();
        let bad = meta(RopeStyle::Interleaved, 5);
        assert!(rope_inplace(&pool, &mut x, 24, 1, &[0.0], &bad, None, &mut cache).is_err());
        let m = meta(RopeStyle::Interleaved, 4);
        assert!(rope_inplace(&pool, &mut x, 20, 1, &[0.0], &m, None, &mut cache).is_err());
        assert!(rope_inplace(&pool, &mut x, 24, 1, &[], &m, None, &mut cache).is_err());
    }
}
