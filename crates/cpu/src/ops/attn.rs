//! Grouped-query attention over the persistent f32 K/V regions, softmax inside.
//!
//! Query head `h` reads KV head `h / (n_head / n_head_kv)`. Token `t` attends to KV rows
//! `0..=pos[t]` (causal), or to its explicit `[lo, hi)` span. Work items are
//! (token, head) pairs claimed dynamically by the pool's threads; each item is computed
//! start to finish by one thread in a fixed order, so results do not depend on `-t`.
//!
//! Per item: `s_j = (q · k_j) * scale`, `p_j = exp(s_j - max s)` (vectorised, with the C
//! library's bits: see `exp`), `o = (Σ p_j v_j) / Σ p_j`, all accumulated in f32 (scores
//! eight keys per reduction, the V sum held in registers).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use minfer_graph::AttnMeta;

use super::vec::VecIsa;
use super::{as_i32, SharedMut};
use crate::threadpool::ThreadPool;

/// Below this many multiply-adds an attention node runs on the calling thread.
const PAR_MIN_FLOPS: usize = 1 << 16;

/// The inputs of one attention node.
#[derive(Debug, Clone, Copy)]
pub struct AttnArgs<'a> {
    /// Geometry and layer.
    pub meta: &'a AttnMeta,
    /// Query rows: `nt` rows of `q_stride` values, heads at the start of each row.
    pub q: &'a [f32],
    /// Values per query row (may exceed `n_head * hd` for a fused q|k|v buffer).
    pub q_stride: usize,
    /// Tokens.
    pub nt: usize,
    /// I32 positions (bit patterns), one per token.
    pub pos: &'a [f32],
    /// Optional I32 `[lo, hi)` pairs, one per token, replacing the causal bound.
    pub span: Option<&'a [f32]>,
    /// K region: `n_ctx` rows of `n_head_kv * hd`.
    pub k: &'a [f32],
    /// V region, same geometry.
    pub v: &'a [f32],
}

/// Reusable buffers: per-token key ranges and per-thread score rows.
#[derive(Debug, Default)]
pub struct AttnScratch {
    ranges: Vec<(usize, usize)>,
    scores: Vec<f32>,
}

/// The key range of every token, checked against the region.
fn key_ranges(a: &AttnArgs, ranges: &mut Vec<(usize, usize)>) -> Result<(), String> {
    let m = a.meta;
    ranges.clear();
    for t in 0..a.nt {
        let (lo, hi) = match a.span {
            Some(s) => {
                let pair = s.get(2 * t..2 * t + 2).ok_or_else(|| {
                    format!("span input has {} values, token {t} needs a pair", s.len())
                })?;
                (i64::from(as_i32(pair[0])), i64::from(as_i32(pair[1])))
            }
            None => {
                let p = i64::from(as_i32(a.pos[t]));
                if p < 0 || p >= m.n_ctx as i64 {
                    return Err(format!(
                        "token {t}: position {p} outside the {}-row KV region of layer {}",
                        m.n_ctx, m.layer
                    ));
                }
                (0, p + 1)
            }
        };
        if lo < 0 || lo >= hi || hi > m.n_ctx as i64 {
            return Err(format!(
                "token {t}: key range [{lo}, {hi}) invalid for the {}-row KV region of layer {}",
                m.n_ctx, m.layer
            ));
        }
        ranges.push((lo as usize, hi as usize));
    }
    Ok(())
}

/// Checks every length the kernel indexes.
fn validate(a: &AttnArgs, out_len: usize) -> Result<(), String> {
    let m = a.meta;
    if m.hd == 0 || m.n_head == 0 || m.n_head_kv == 0 || !m.n_head.is_multiple_of(m.n_head_kv) {
        return Err(format!(
            "attention geometry: n_head {} n_head_kv {} hd {} (n_head must be a positive multiple of n_head_kv)",
            m.n_head, m.n_head_kv, m.hd
        ));
    }
    let qrow = m.n_head * m.hd;
    if a.q_stride < qrow || a.q.len() < a.nt * a.q_stride {
        return Err(format!(
            "attention: q holds {} values, {} tokens of {qrow} needed (row stride {})",
            a.q.len(),
            a.nt,
            a.q_stride
        ));
    }
    let region = m.nkt() * m.n_ctx;
    if a.k.len() < region || a.v.len() < region {
        return Err(format!(
            "attention: layer {} K/V regions hold {}/{} values, {} rows of {} need {region}",
            m.layer,
            a.k.len(),
            a.v.len(),
            m.n_ctx,
            m.nkt()
        ));
    }
    if out_len < a.nt * qrow || a.pos.len() < a.nt {
        return Err(format!(
            "attention: output {out_len} values / {} positions for {} tokens of {qrow}",
            a.pos.len(),
            a.nt
        ));
    }
    Ok(())
}

/// One (token, head) item: scores into `scores`, the result into `o` (`hd` values).
#[allow(clippy::too_many_arguments)]
#[inline]
fn head(
    isa: VecIsa,
    qh: &[f32],
    k: &[f32],
    v: &[f32],
    nkt: usize,
    off: usize,
    (lo, hi): (usize, usize),
    scale: f32,
    scores: &mut [f32],
    o: &mut [f32],
) {
    let scores = &mut scores[..hi - lo];
    isa.dot_rows(qh, k, nkt, lo * nkt + off, scores);
    let mut mx = f32::NEG_INFINITY;
    for s in scores.iter_mut() {
        *s *= scale;
        mx = mx.max(*s);
    }
    let sum = isa.exp_sum(scores, mx);
    isa.weighted_rows(scores, v, nkt, lo * nkt + off, o);
    isa.scale(o, 1.0 / sum);
}

/// Runs attention for every token and head into `out` (`nt` rows of `n_head * hd`).
pub fn attention(
    pool: &ThreadPool,
    isa: VecIsa,
    a: &AttnArgs,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) -> Result<(), String> {
    validate(a, out.len())?;
    key_ranges(a, &mut scratch.ranges)?;
    let m = a.meta;
    let (hd, nkt, group) = (m.hd, m.nkt(), m.n_head / m.n_head_kv);
    let ranges = &scratch.ranges;
    let max_len = ranges.iter().map(|r| r.1 - r.0).max().unwrap_or(0);
    let work: usize = ranges.iter().map(|r| r.1 - r.0).sum::<usize>() * m.n_head * hd;
    let nth = if work < PAR_MIN_FLOPS {
        1
    } else {
        pool.n_threads()
    };
    if scratch.scores.len() < nth * max_len {
        // Size for the whole region at once: growing with the sequence would reallocate
        // during decode.
        scratch.scores.resize(nth * max_len.max(m.n_ctx), 0.0);
    }
    let items = a.nt * m.n_head;
    let qrow = m.n_head * hd;
    let run_item = |item: usize, scores: &mut [f32], out: &SharedMut<f32>| {
        let (t, h) = (item / m.n_head, item % m.n_head);
        let qb = t * a.q_stride + h * hd;
        let ob = t * qrow + h * hd;
        // SAFETY: item (t, h) owns output values [ob, ob + hd); items are claimed once.
        let o = unsafe { out.slice(ob..ob + hd) };
        let off = (h / group) * hd;
        head(
            isa,
            &a.q[qb..qb + hd],
            a.k,
            a.v,
            nkt,
            off,
            ranges[t],
            m.scale,
            scores,
            o,
        );
    };
    let shared_out = SharedMut::new(&mut out[..items * hd]);
    if nth == 1 {
        let scores = &mut scratch.scores[..max_len];
        for item in 0..items {
            run_item(item, scores, &shared_out);
        }
        return Ok(());
    }
    let shared_scores = SharedMut::new(&mut scratch.scores[..nth * max_len]);
    let next = AtomicUsize::new(0);
    pool.run(&|ith, _| {
        // SAFETY: thread `ith` alone uses score row `ith`.
        let scores = unsafe { shared_scores.slice(ith * max_len..(ith + 1) * max_len) };
        loop {
            let item = next.fetch_add(1, Relaxed);
            if item >= items {
                break;
            }
            run_item(item, scores, &shared_out);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testutil::Rng;

    fn meta() -> AttnMeta {
        AttnMeta {
            layer: 3,
            n_head: 4,
            n_head_kv: 2,
            hd: 16,
            scale: 0.25,
            n_ctx: 40,
        }
    }

    /// f64 reference straight from the definition.
    fn reference(a: &AttnArgs) -> Vec<f64> {
        let m = a.meta;
        let (hd, nkt, group) = (m.hd, m.nkt(), m.n_head / m.n_head_kv);
        let mut out = vec![0.0; a.nt * m.n_head * hd];
        for t in 0..a.nt {
            let hi = as_i32(a.pos[t]) as usize + 1;
            for h in 0..m.n_head {
                let q = &a.q[t * a.q_stride + h * hd..][..hd];
                let off = (h / group) * hd;
                let s: Vec<f64> = (0..hi)
                    .map(|j| {
                        let k = &a.k[j * nkt + off..][..hd];
                        q.iter()
                            .zip(k)
                            .map(|(x, y)| *x as f64 * *y as f64)
                            .sum::<f64>()
                            * m.scale as f64
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for d in 0..hd {
                        out[t * m.n_head * hd + h * hd + d] +=
                            p / sum * a.v[j * nkt + off + d] as f64;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_reference_for_every_isa_and_thread_count() {
        let m = meta();
        let mut r = Rng::new(5);
        let nt = 6;
        let q_stride = m.n_head * m.hd + 32; // a wider fused q|k|v row
        let q = r.vec(nt * q_stride);
        let k = r.vec(m.nkt() * m.n_ctx);
        let v = r.vec(m.nkt() * m.n_ctx);
        let positions = [0, 1, 2, 17, 30, 39];
        let pos: Vec<f32> = positions
            .iter()
            .map(|&p: &i32| f32::from_bits(p as u32))
            .collect();
        let a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride,
            nt,
            pos: &pos,
            span: None,
            k: &k,
            v: &v,
        };
        let want = reference(&a);
        let mut results = Vec::new();
        for isa in [VecIsa::Scalar, VecIsa::detect()] {
            for nth in [1, 2, 3] {
                let pool = ThreadPool::new(nth);
                let mut out = vec![f32::NAN; nt * m.n_head * m.hd];
                let mut s = AttnScratch::default();
                attention(&pool, isa, &a, &mut out, &mut s).unwrap();
                for (x, y) in out.iter().zip(&want) {
                    assert!((*x as f64 - y).abs() < 1e-5, "{isa:?} t{nth}: {x} vs {y}");
                }
                results.push((isa, out));
            }
        }
        for w in results.windows(2) {
            if w[0].0 == w[1].0 {
                assert_eq!(w[0].1, w[1].1, "thread count changed the result");
            }
        }
    }

    #[test]
    fn explicit_span_limits_the_keys() {
        let m = meta();
        let mut r = Rng::new(6);
        let q = r.vec(m.n_head * m.hd);
        let k = r.vec(m.nkt() * m.n_ctx);
        let v = r.vec(m.nkt() * m.n_ctx);
        let pos = [f32::from_bits(9)];
        let span = [f32::from_bits(0), f32::from_bits(10)];
        let pool = ThreadPool::new(1);
        let mut a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride: m.n_head * m.hd,
            nt: 1,
            pos: &pos,
            span: None,
            k: &k,
            v: &v,
        };
        let mut causal = vec![0.0; m.n_head * m.hd];
        let mut s = AttnScratch::default();
        attention(&pool, VecIsa::Scalar, &a, &mut causal, &mut s).unwrap();
        a.span = Some(&span);
        let mut spanned = vec![0.0; m.n_head * m.hd];
        attention(&pool, VecIsa::Scalar, &a, &mut spanned, &mut s).unwrap();
        assert_eq!(causal, spanned, "[0, pos+1) is the causal range");
        let narrow = [f32::from_bits(5), f32::from_bits(6)];
        a.span = Some(&narrow);
        attention(&pool, VecIsa::Scalar, &a, &mut spanned, &mut s).unwrap();
        // A single key: the output is that key's V row.
        assert_eq!(&spanned[..m.hd], &v[5 * m.nkt()..5 * m.nkt() + m.hd]);
    }

    #[test]
    fn out_of_range_positions_and_bad_geometry_are_errors() {
        let m = meta();
        let q = vec![0.0; m.n_head * m.hd];
        let kv = vec![0.0; m.nkt() * m.n_ctx];
        let pool = ThreadPool::new(1);
        let mut out = vec![0.0; m.n_head * m.hd];
        let mut s = AttnScratch::default();
        let beyond = [f32::from_bits(40)];
        let a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride: m.n_head * m.hd,
            nt: 1,
            pos: &beyond,
            span: None,
            k: &kv,
            v: &kv,
        };
        let e = attention(&pool, VecIsa::Scalar, &a, &mut out, &mut s).unwrap_err();
        assert!(e.contains("position 40") && e.contains("layer 3"), "{e}");
        let short = &kv[..10];
        let pos0 = [0.0];
        let b = AttnArgs {
            k: short,
            pos: &pos0,
            ..a
        };
        assert!(attention(&pool, VecIsa::Scalar, &b, &mut out, &mut s).is_err());
        let bad = AttnMeta {
            n_head_kv: 3,
            ..m.clone()
        };
        let c = AttnArgs {
            meta: &bad,
            pos: &pos0,
            ..a
        };
        assert!(attention(&pool, VecIsa::Scalar, &c, &mut out, &mut s).is_err());
    }
}
