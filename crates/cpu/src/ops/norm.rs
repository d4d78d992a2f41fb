//! RMS normalization (whole rows, and per head for the Qwen3 q/k norm) and layer
//! normalization (BERT).
//!
//! RMS arithmetic follows ggml's CPU kernel: each square is formed in f32 and summed in f64
//! in element order, the mean is rounded to f32, `scale = 1 / sqrt(mean + eps)` in f32,
//! `y = x * scale`, and the optional weight multiplies afterwards (`(x * scale) * w`, as
//! ggml's separate `mul` node does).

use super::{par_rows, PAR_MIN_ELEMS};
use crate::threadpool::ThreadPool;

/// Normalizes one row `x` into `y` (same length), then multiplies by `w` if given.
pub fn rms_norm_row(x: &[f32], y: &mut [f32], eps: f32, w: Option<&[f32]>) {
    let mut sum = 0.0f64;
    for &v in x {
        sum += f64::from(v * v);
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    match w {
        Some(w) => {
            for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                *y = (x * scale) * w;
            }
        }
        None => {
            for (y, &x) in y.iter_mut().zip(x) {
                *y = x * scale;
            }
        }
    }
}

/// The checks both norms make: `n` outputs in whole rows of `d` from at least `n` of
/// `inputs` values, each per-column vector (`what`, values) of `d` values, and a
/// non-negative `eps`; the error names the norm (`kind`) and what is wrong.
fn check_rows(
    kind: &str,
    inputs: usize,
    n: usize,
    d: usize,
    eps: f32,
    vectors: &[(&str, Option<&[f32]>)],
) -> Result<(), String> {
    if d == 0 || !n.is_multiple_of(d) || inputs < n {
        return Err(format!(
            "{kind}: {n} output values in rows of {d} from {inputs} inputs"
        ));
    }
    for &(what, v) in vectors {
        if let Some(v) = v.filter(|v| v.len() != d) {
            return Err(format!(
                "{kind}: {what} has {} values, rows have {d}",
                v.len()
            ));
        }
    }
    if eps.is_nan() || eps < 0.0 {
        return Err(format!("{kind}: eps {eps} is not a non-negative number"));
    }
    Ok(())
}

/// Normalizes every row of `d` values of `x` into `y` (`y.len()` values, a multiple of `d`,
/// at most `x.len()`). Rows run in parallel for large inputs.
pub fn rms_norm(
    pool: &ThreadPool,
    x: &[f32],
    y: &mut [f32],
    d: usize,
    eps: f32,
    w: Option<&[f32]>,
) -> Result<(), String> {
    let n = y.len();
    check_rows("rms norm", x.len(), n, d, eps, &[("weight", w)])?;
    par_rows(pool, y, d, n >= PAR_MIN_ELEMS, &|row0, ys| {
        for (i, yr) in ys.chunks_exact_mut(d).enumerate() {
            let r = row0 + i;
            rms_norm_row(&x[r * d..(r + 1) * d], yr, eps, w);
        }
    });
    Ok(())
}

/// Layer-normalizes one row `x` into `y` (same length), as ggml's `norm` does it: the
/// sum in f64, the mean rounded to f32, `y = x - mean`, the variance the f64 sum of
/// `y * y` over the row rounded to f32, `y *= 1 / sqrt(var + eps)`; then `* w` and `+ b`
/// where given (ggml's separate `mul` and `add` nodes).
pub fn layer_norm_row(x: &[f32], y: &mut [f32], eps: f32, w: Option<&[f32]>, b: Option<&[f32]>) {
    let n = x.len() as f64;
    let mean = (x.iter().map(|&v| f64::from(v)).sum::<f64>() / n) as f32;
    let mut sum = 0.0f64;
    for (y, &x) in y.iter_mut().zip(x) {
        *y = x - mean;
        sum += f64::from(*y * *y);
    }
    let scale = 1.0f32 / ((sum / n) as f32 + eps).sqrt();
    for (i, y) in y.iter_mut().enumerate() {
        *y *= scale;
        if let Some(w) = w {
            *y *= w[i];
        }
        if let Some(b) = b {
            *y += b[i];
        }
    }
}

/// Layer-normalizes every row of `d` values of `x` into `y` (`y.len()` values, a
/// multiple of `d`, at most `x.len()`), with the optional weight and bias of `d` values.
pub fn layer_norm(
    pool: &ThreadPool,
    x: &[f32],
    y: &mut [f32],
    d: usize,
    eps: f32,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
) -> Result<(), String> {
    let n = y.len();
    check_rows(
        "layer norm",
        x.len(),
        n,
        d,
        eps,
        &[("weight", w), ("bias", b)],
    )?;
    par_rows(pool, y, d, n >= PAR_MIN_ELEMS, &|row0, ys| {
        for (i, yr) in ys.chunks_exact_mut(d).enumerate() {
            let r = row0 + i;
            layer_norm_row(&x[r * d..(r + 1) * d], yr, eps, w, b);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    fn reference(x: &[f32], d: usize, eps: f32, w: Option<&[f32]>) -> Vec<f64> {
        x.chunks(d)
            .flat_map(|row| {
                let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
                let s = 1.0 / (ms + eps as f64).sqrt();
                row.iter()
                    .enumerate()
                    .map(move |(i, &v)| v as f64 * s * w.map_or(1.0, |w| w[i] as f64))
            })
            .collect()
    }

    #[test]
    fn matches_f64_reference_and_is_thread_count_independent() {
        let mut r = Rng::new(7);
        let (d, rows) = (896, 40);
        let x = r.vec(d * rows, 1.0);
        let w = r.vec(d, 1.0);
        let want = reference(&x, d, 1e-6, Some(&w));
        let mut outs = Vec::new();
        for nth in [1, 3] {
            let pool = ThreadPool::new(nth);
            let mut y = vec![0.0; d * rows];
            rms_norm(&pool, &x, &mut y, d, 1e-6, Some(&w)).unwrap();
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{a} vs {b}"
                );
            }
            outs.push(y);
        }
        assert_eq!(outs[0], outs[1]);
    }

    #[test]
    fn scale_is_applied_before_the_weight() {
        // With x = 3 and d = 1, scale = 1/sqrt(9) rounds; (x*scale)*w is the ggml order.
        let x = [3.0f32];
        let mut y = [0.0f32];
        rms_norm_row(&x, &mut y, 0.0, Some(&[0.7]));
        let scale = 1.0f32 / 9.0f32.sqrt();
        assert_eq!(y[0].to_bits(), ((3.0 * scale) * 0.7f32).to_bits());
    }

    #[test]
    fn layer_norm_matches_f64_reference_and_is_thread_count_independent() {
        let mut r = Rng::new(9);
        let (d, rows) = (384, 40);
        // Offset rows: a kernel that forgot the mean would be far off.
        let x: Vec<f32> = r.vec(d * rows, 1.0).iter().map(|v| v + 3.0).collect();
        let (w, b) = (r.vec(d, 1.0), r.vec(d, 1.0));
        let want: Vec<f64> = x
            .chunks(d)
            .flat_map(|row| {
                let m = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
                let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / d as f64;
                let s = 1.0 / (var + 1e-12).sqrt();
                let (w, b) = (&w, &b);
                row.iter()
                    .enumerate()
                    .map(move |(i, &v)| (v as f64 - m) * s * w[i] as f64 + b[i] as f64)
            })
            .collect();
        let mut outs = Vec::new();
        for nth in [1, 3] {
            let pool = ThreadPool::new(nth);
            let mut y = vec![0.0; d * rows];
            layer_norm(&pool, &x, &mut y, d, 1e-12, Some(&w), Some(&b)).unwrap();
            for (a, e) in y.iter().zip(&want) {
                assert!(
                    (*a as f64 - e).abs() <= 1e-4 * e.abs().max(1.0),
                    "{a} vs {e}"
                );
            }
            outs.push(y);
        }
        assert_eq!(outs[0], outs[1]);
        // Bare: every row has mean 0 and variance 1.
        let mut y = vec![0.0; d];
        layer_norm_row(&x[..d], &mut y, 0.0, None, None);
        let m = y.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = y.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / d as f64;
        assert!(m.abs() < 1e-5 && (var - 1.0).abs() < 1e-4, "{m} {var}");
        let pool = ThreadPool::new(1);
        let mut y = vec![0.0; 6];
        assert!(layer_norm(&pool, &[0.0; 6], &mut y, 3, 1e-5, None, Some(&[0.0; 2])).is_err());
        assert!(layer_norm(&pool, &[0.0; 6], &mut y, 4, 1e-5, None, None).is_err());
    }

    #[test]
    fn bad_shapes_are_errors() {
        let pool = ThreadPool::new(1);
        let mut y = vec![0.0; 6];
        assert!(rms_norm(&pool, &[0.0; 6], &mut y, 4, 1e-5, None).is_err());
        assert!(rms_norm(&pool, &[0.0; 6], &mut y, 3, 1e-5, Some(&[1.0; 2])).is_err());
        assert!(rms_norm(&pool, &[0.0; 3], &mut y, 3, 1e-5, None).is_err());
        assert!(rms_norm(&pool, &[0.0; 6], &mut y, 3, f32::NAN, None).is_err());
    }
}
