//! The routing pieces of a mixture-of-experts FFN around the expert products
//! ([`crate::matmul::matmul_id`]): the router's top-k choice, the weighted sum of the
//! chosen experts' outputs, and the per-token sigmoid gate of a shared expert.

use super::as_i32;

/// Smallest divisor of a renormalised weight sum (F16's smallest normal, as llama.cpp
/// clamps it), so a row of zero weights cannot divide by zero.
pub const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// Writes, per row of `n` values of `x`, the indices of the `k` largest into `out` (`k`
/// per row, f32 bit patterns of I32): descending by value, equal values by ascending
/// index (ggml's argsort for rows of up to 16). NaN ranks below every number.
pub fn top_k(x: &[f32], n: usize, k: usize, out: &mut [f32]) -> Result<(), String> {
    if n == 0 || k == 0 || k > n || !x.len().is_multiple_of(n) || out.len() != x.len() / n * k {
        return Err(format!(
            "top_k: {k} of rows of {n} from {} values into {}",
            x.len(),
            out.len()
        ));
    }
    let rank = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(k)) {
        // Selection by insertion into the k best so far: strictly greater moves ahead, so
        // among equals the earlier index stays first. O(n k) for router-sized rows.
        let mut len = 0usize;
        for (i, &v) in row.iter().enumerate() {
            let v = rank(v);
            let mut p = len;
            while p > 0 && v > rank(row[o_idx(o[p - 1])]) {
                p -= 1;
            }
            if p >= k {
                continue;
            }
            let end = len.min(k - 1);
            for q in (p..end).rev() {
                o[q + 1] = o[q];
            }
            o[p] = f32::from_bits(i as u32);
            len = (len + 1).min(k);
        }
    }
    Ok(())
}

fn o_idx(v: f32) -> usize {
    as_i32(v) as usize
}

/// `out[t] = sum_j w_j h[t * k + j]` over rows of `d`, `w_j = probs[t][ids[t * k + j]]`,
/// divided by `max(sum_j w_j, MIN_WEIGHT_SUM)` (the sum in f64) when `norm`; the products are added in `j`
/// order onto the first (as ggml adds the weighted expert views).
pub fn weighted_sum(
    h: &[f32],
    probs: &[f32],
    ids: &[f32],
    d: usize,
    norm: bool,
    out: &mut [f32],
) -> Result<(), String> {
    let nt = out.len() / d.max(1);
    let k = ids.len() / nt.max(1);
    let n_expert = probs.len() / nt.max(1);
    if d == 0 || nt * d != out.len() || k == 0 || k * nt != ids.len() || h.len() != d * k * nt {
        return Err(format!(
            "moe_sum: {} values, {} choices and {} gate values for {nt} rows of {d}",
            h.len(),
            ids.len(),
            probs.len()
        ));
    }
    for t in 0..nt {
        let choice = &ids[t * k..(t + 1) * k];
        let gates = &probs[t * n_expert..(t + 1) * n_expert];
        let weight = |j: usize| -> Result<f32, String> {
            let e = as_i32(choice[j]);
            usize::try_from(e)
                .ok()
                .and_then(|e| gates.get(e).copied())
                .ok_or_else(|| format!("moe_sum: token {t} chose expert {e} of {n_expert}"))
        };
        let mut div = 1.0f32;
        if norm {
            // Summed in f64, as ggml's sum_rows does.
            let mut sum = 0.0f64;
            for j in 0..k {
                sum += f64::from(weight(j)?);
            }
            div = (sum as f32).max(MIN_WEIGHT_SUM);
        }
        let o = &mut out[t * d..(t + 1) * d];
        for j in 0..k {
            let w = if norm { weight(j)? / div } else { weight(j)? };
            let hr = &h[(t * k + j) * d..(t * k + j + 1) * d];
            if j == 0 {
                for (y, &v) in o.iter_mut().zip(hr) {
                    *y = v * w;
                }
            } else {
                for (y, &v) in o.iter_mut().zip(hr) {
                    *y += v * w;
                }
            }
        }
    }
    Ok(())
}

/// `out = x * sigmoid(g[t])` over rows of `d`, one gate value per row.
pub fn mul_sigmoid(x: &[f32], g: &[f32], d: usize, out: &mut [f32]) -> Result<(), String> {
    if d == 0 || x.len() != out.len() || g.len() * d != out.len() {
        return Err(format!(
            "mul_sigmoid: {} values, {} gates in rows of {d}",
            x.len(),
            g.len()
        ));
    }
    for ((o, xr), &gt) in out.chunks_exact_mut(d).zip(x.chunks_exact(d)).zip(g) {
        let s = 1.0 / (1.0 + (-gt).exp());
        for (y, &v) in o.iter_mut().zip(xr) {
            *y = v * s;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    fn ids(v: &[f32]) -> Vec<i32> {
        v.iter().map(|&x| as_i32(x)).collect()
    }

    /// Against a stable sort of every row, ties and NaN included.
    #[test]
    fn top_k_is_a_stable_descending_sort_prefix() {
        let mut r = Rng::new(3);
        let n = 11;
        let mut x = r.vec(n * 6, 1.0);
        x[3] = x[7];
        x[n + 2] = f32::NAN;
        x[2 * n..3 * n].fill(0.25);
        for k in [1, 2, 5, n] {
            let mut out = vec![0.0; 6 * k];
            top_k(&x, n, k, &mut out).unwrap();
            for (t, row) in x.chunks(n).enumerate() {
                let mut idx: Vec<usize> = (0..n).collect();
                let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
                idx.sort_by(|&a, &b| key(row[b]).total_cmp(&key(row[a])));
                let want: Vec<i32> = idx[..k].iter().map(|&i| i as i32).collect();
                assert_eq!(ids(&out[t * k..(t + 1) * k]), want, "row {t} k {k}");
            }
        }
        assert!(top_k(&x, n, n + 1, &mut vec![0.0; 6 * (n + 1)]).is_err());
    }

    #[test]
    fn weighted_sum_renormalises_only_when_asked() {
        let d = 3;
        let h = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0];
        let probs = [0.1, 0.2, 0.3, 0.4];
        let choice = [f32::from_bits(3), f32::from_bits(1)];
        let mut out = [0.0; 3];
        weighted_sum(&h, &probs, &choice, d, false, &mut out).unwrap();
        assert_eq!(
            out,
            [
                0.4 * 1.0 + 0.2 * 10.0,
                0.4 * 2.0 + 0.2 * 20.0,
                0.4 * 3.0 + 0.2 * 30.0
            ]
        );
        weighted_sum(&h, &probs, &choice, d, true, &mut out).unwrap();
        let sum = (f64::from(0.4f32) + f64::from(0.2f32)) as f32;
        let (a, b) = (0.4f32 / sum, 0.2f32 / sum);
        assert_eq!(
            out,
            [a * 1.0 + b * 10.0, a * 2.0 + b * 20.0, a * 3.0 + b * 30.0]
        );
        let bad = [f32::from_bits(4), f32::from_bits(1)];
        let e = weighted_sum(&h, &probs, &bad, d, true, &mut out).unwrap_err();
        assert!(e.contains("expert 4 of 4"), "{e}");
    }

    #[test]
    fn sigmoid_gate_scales_each_row() {
        let mut out = [0.0; 4];
        mul_sigmoid(&[1.0, 2.0, 3.0, 4.0], &[0.0, 100.0], 2, &mut out).unwrap();
        assert_eq!(out, [0.5, 1.0, 3.0, 4.0]);
    }
}
