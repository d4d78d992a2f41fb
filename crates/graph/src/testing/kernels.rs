//! Scalar f32 reference kernels. Written for clarity and determinism, not speed:
//! each output element is computed in a fixed order, so two backends running these
//! kernels agree bit for bit. I32 inputs arrive as f32 bit patterns.

use crate::ir::*;
use crate::testing::WeightStore;

fn ints(v: &[f32]) -> impl Iterator<Item = i64> + '_ {
    v.iter().map(|x| i64::from(x.to_bits() as i32))
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// ggml's tanh GELU, in f64 so the reference carries no approximation of its own.
fn gelu(x: f32) -> f32 {
    let x = f64::from(x);
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    (0.5 * x * (1.0 + u.tanh())) as f32
}

/// `c * tanh(x / c)`, in f64.
fn softcap(x: f32, c: f32) -> f32 {
    let c = f64::from(c);
    (c * (f64::from(x) / c).tanh()) as f32
}

fn nt_of(node: &CNode) -> usize {
    node.out_shape[1].max(1)
}

fn weight<'a>(w: &'a WeightStore, name: &str) -> Result<&'a crate::testing::RefWeight, String> {
    w.get(name)
        .ok_or_else(|| format!("weight '{name}' is not registered"))
}

fn input(inputs: &[Vec<f32>], i: usize) -> Result<&[f32], String> {
    inputs
        .get(i)
        .map(Vec::as_slice)
        .ok_or_else(|| format!("missing source {i}"))
}

fn broadcast(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> Result<Vec<f32>, String> {
    if b.is_empty() || !a.len().is_multiple_of(b.len()) {
        return Err(format!(
            "cannot broadcast {} values over {}",
            b.len(),
            a.len()
        ));
    }
    Ok(a.iter()
        .enumerate()
        .map(|(i, &x)| f(x, b[i % b.len()]))
        .collect())
}

fn rms_rows(x: &[f32], d: usize, eps: f32, w: Option<&[f32]>) -> Result<Vec<f32>, String> {
    if d == 0 || !x.len().is_multiple_of(d) || w.is_some_and(|w| w.len() != d) {
        return Err(format!("rms norm of {} values in rows of {d}", x.len()));
    }
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let ss: f32 = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let s = 1.0 / (ss + eps).sqrt();
        for (i, v) in row.iter().enumerate() {
            out.push(v * s * w.map_or(1.0, |w| w[i]));
        }
    }
    Ok(out)
}

/// Layer norm of rows of `d` in f64: `(x - mean) / sqrt(var + eps) * w + b`.
fn layer_rows(
    x: &[f32],
    d: usize,
    eps: f32,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
) -> Result<Vec<f32>, String> {
    let bad = |v: Option<&[f32]>| v.is_some_and(|v| v.len() != d);
    if d == 0 || !x.len().is_multiple_of(d) || bad(w) || bad(b) {
        return Err(format!("layer norm of {} values in rows of {d}", x.len()));
    }
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(d) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
        let s = 1.0 / (var + eps as f64).sqrt();
        for (i, &v) in row.iter().enumerate() {
            let y = (v as f64 - mean) * s * w.map_or(1.0, |w| w[i] as f64);
            out.push((y + b.map_or(0.0, |b| b[i] as f64)) as f32);
        }
    }
    Ok(out)
}

/// `y[t][o] = sum_i w[o][i] * x[t][i]` with `x` rows of `stride >= in_dim`.
fn matmul(
    x: &[f32],
    nt: usize,
    w: &crate::testing::RefWeight,
    in_dim: usize,
) -> Result<Vec<f32>, String> {
    let stride = x.len() / nt;
    if w.in_dim != in_dim || stride < in_dim {
        return Err(format!(
            "matmul: weight in_dim {} vs meta {in_dim}, input row {stride}",
            w.in_dim
        ));
    }
    let mut y = vec![0.0; w.out_dim * nt];
    for t in 0..nt {
        let xr = &x[t * stride..t * stride + in_dim];
        for o in 0..w.out_dim {
            let wr = &w.data[o * in_dim..(o + 1) * in_dim];
            y[t * w.out_dim + o] = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
        }
    }
    Ok(y)
}

fn rope(
    x: &[f32],
    pos: &[f32],
    m: &RoPEMeta,
    factors: Option<&[f32]>,
    nt: usize,
) -> Result<Vec<f32>, String> {
    let row = m.n_head * m.hd;
    if x.len() < row * nt || pos.len() < nt || m.n_dims > m.hd || !m.n_dims.is_multiple_of(2) {
        return Err(format!(
            "rope: {} values, {} positions, meta {m:?}",
            x.len(),
            pos.len()
        ));
    }
    let mut out = x.to_vec();
    let half = m.n_dims / 2;
    if factors.is_some_and(|f| f.len() < half) {
        return Err(format!("rope: fewer than {half} frequency factors"));
    }
    let corr = m.yarn.map(|y| y.corr_dims(m.n_dims, m.freq_base));
    for (t, p) in ints(&pos[..nt]).enumerate() {
        for h in 0..m.n_head {
            let base = t * (x.len() / nt) + h * m.hd;
            for i in 0..half {
                let ff = factors.map_or(1.0, |f| f[i]);
                let inv_freq = m.freq_base.powf(-2.0 * i as f32 / m.n_dims as f32);
                let (theta, mscale) = match (m.yarn, corr) {
                    (Some(y), Some(corr)) => {
                        let extrap = p as f32 * inv_freq / ff;
                        (
                            y.angle(extrap, m.freq_scale, corr, i),
                            y.mscale(m.freq_scale),
                        )
                    }
                    _ => (p as f32 * m.freq_scale * inv_freq / ff, 1.0),
                };
                let (c, s) = (theta.cos() * mscale, theta.sin() * mscale);
                let (a, b) = match m.style {
                    RopeStyle::NonInterleaved => (base + i, base + i + half),
                    RopeStyle::Interleaved => (base + 2 * i, base + 2 * i + 1),
                };
                out[a] = x[a] * c - x[b] * s;
                out[b] = x[a] * s + x[b] * c;
            }
        }
    }
    Ok(out)
}

fn permute(x: &[f32], out_shape: [usize; 4], dims: [usize; 4]) -> Result<Vec<f32>, String> {
    let mut in_shape = [0; 4];
    for i in 0..4 {
        in_shape[i] = *out_shape.get(dims[i]).ok_or("permute: bad axis")?;
    }
    let mut out = vec![0.0; x.len()];
    let os = [
        1,
        out_shape[0],
        out_shape[0] * out_shape[1],
        out_shape[0] * out_shape[1] * out_shape[2],
    ];
    for (idx, &v) in x.iter().enumerate() {
        let mut r = idx;
        let mut o = 0;
        for i in 0..4 {
            let c = r % in_shape[i].max(1);
            r /= in_shape[i].max(1);
            o += c * os[dims[i]];
        }
        *out.get_mut(o).ok_or("permute: shape mismatch")? = v;
    }
    Ok(out)
}

/// Every op without KV side effects.
pub(super) fn compute(
    node: &CNode,
    inputs: &[Vec<f32>],
    w: &WeightStore,
) -> Result<Vec<f32>, String> {
    let nt = nt_of(node);
    let x = input(inputs, 0);
    match (&node.op, &node.meta) {
        (Op::Add, _) => broadcast(x?, input(inputs, 1)?, |a, b| a + b),
        (Op::Mul, _) => broadcast(x?, input(inputs, 1)?, |a, b| a * b),
        (Op::Scale(s), _) => Ok(x?.iter().map(|v| v * s).collect()),
        (Op::Silu, _) => Ok(x?.iter().map(|&v| silu(v)).collect()),
        (Op::Gelu, _) => Ok(x?.iter().map(|&v| gelu(v)).collect()),
        (Op::SoftCap(c), _) => Ok(x?.iter().map(|&v| softcap(v, *c)).collect()),
        (Op::SwiGLU | Op::GeGLU, _) => {
            let (g, u) = (x?, input(inputs, 1)?);
            if g.len() != u.len() {
                return Err(format!(
                    "{}: {} vs {} values",
                    node.op.name(),
                    g.len(),
                    u.len()
                ));
            }
            let act = if node.op == Op::GeGLU { gelu } else { silu };
            Ok(g.iter().zip(u).map(|(&a, &b)| act(a) * b).collect())
        }
        (Op::Softmax { dim: 0 }, _) => {
            let (d, x) = (node.out_shape[0].max(1), x?);
            let mut out = Vec::with_capacity(x.len());
            for row in x.chunks(d) {
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let e: Vec<f32> = row.iter().map(|v| (v - m).exp()).collect();
                let sum: f32 = e.iter().sum();
                out.extend(e.iter().map(|v| v / sum));
            }
            Ok(out)
        }
        (Op::LayerNorm { eps }, meta) => {
            let (scale, bias) = match meta {
                NodeMeta::Norm(m) => (
                    m.weight_name.as_deref().map(|n| weight(w, n)).transpose()?,
                    m.bias_name.as_deref().map(|n| weight(w, n)).transpose()?,
                ),
                _ => (None, None),
            };
            layer_rows(
                x?,
                node.out_shape[0],
                *eps,
                scale.map(|s| s.data.as_slice()),
                bias.map(|b| b.data.as_slice()),
            )
        }
        (Op::RmsNorm { eps }, meta) | (Op::QkNorm { eps, .. }, meta) => {
            let d = match node.op {
                Op::QkNorm { hd, .. } => hd,
                _ => node.out_shape[0],
            };
            let scale = match meta {
                NodeMeta::Norm(NormMeta {
                    weight_name: Some(n),
                    ..
                }) => Some(weight(w, n)?.data.as_slice()),
                _ => None,
            };
            rms_rows(x?, d, *eps, scale)
        }
        (Op::MatMul { .. }, NodeMeta::MatMul(m)) => {
            let mut y = matmul(x?, nt, weight(w, &m.weight_name)?, m.in_dim)?;
            if let Some(b) = &m.bias_name {
                y = broadcast(&y, &weight(w, b)?.data, |a, b| a + b)?;
            }
            Ok(y)
        }
        (Op::GetRows, NodeMeta::Embed(m)) => {
            let table = weight(w, &m.weight_name)?;
            gather(&table.data, m.n_embd, x?)
        }
        (Op::GetRows, _) => gather(x?, node.out_shape[0], input(inputs, 1)?),
        (Op::RoPE { freq_factors, .. }, NodeMeta::Rope(m)) => {
            if *freq_factors != m.freq_factors.is_some() {
                return Err(format!(
                    "rope: op and metadata disagree on frequency factors ({m:?})"
                ));
            }
            let factors = match &m.freq_factors {
                Some(n) => Some(weight(w, n)?.data.as_slice()),
                None => None,
            };
            rope(x?, input(inputs, 1)?, m, factors, nt)
        }
        (Op::Reshape { .. }, _) => Ok(x?.to_vec()),
        (Op::View { offset, .. }, _) => {
            let n = node.n_elements();
            x?.get(*offset..offset + n)
                .map(<[f32]>::to_vec)
                .ok_or_else(|| format!("view {offset}+{n} out of range"))
        }
        (Op::Permute { dims }, _) => permute(x?, node.out_shape, *dims),
        (Op::FusedFFN, NodeMeta::FusedFfn(m)) => {
            let x = x?;
            let g = matmul(x, nt, weight(w, &m.gate_weight)?, m.n_embd)?;
            let u = matmul(x, nt, weight(w, &m.up_weight)?, m.n_embd)?;
            let mut out = Vec::with_capacity(2 * m.nf * nt);
            for t in 0..nt {
                let (gr, ur) = (&g[t * m.nf..(t + 1) * m.nf], &u[t * m.nf..(t + 1) * m.nf]);
                out.extend(gr.iter().zip(ur).map(|(&a, &b)| silu(a) * b));
                out.extend_from_slice(ur);
            }
            Ok(out)
        }
        (Op::TopK { k }, _) => top_k(x?, node.out_shape[1].max(1), *k),
        (Op::MulMatId | Op::MulMatIdSwiGLU, NodeMeta::MatMulId(m)) => {
            if (node.op == Op::MulMatIdSwiGLU) != m.gate_name.is_some() {
                return Err(format!("{}: gate weight {:?}", node.op.name(), m.gate_name));
            }
            mul_mat_id(node, x?, input(inputs, 1)?, m, w)
        }
        (Op::MoeSum { norm }, _) => moe_sum(
            x?,
            input(inputs, 1)?,
            input(inputs, 2)?,
            node.out_shape,
            *norm,
        ),
        (Op::MulSigmoid, _) => {
            let (x, g) = (x?, input(inputs, 1)?);
            let d = node.out_shape[0].max(1);
            if g.len() * d != x.len() {
                return Err(format!(
                    "mul_sigmoid: {} gates for {} values",
                    g.len(),
                    x.len()
                ));
            }
            Ok(x.iter()
                .enumerate()
                .map(|(i, &v)| v / (1.0 + (-g[i / d]).exp()))
                .collect())
        }
        (Op::SigmoidGate, _) => super::recurrent::sigmoid_gate(x?, input(inputs, 1)?),
        (Op::Slice { period, start, len }, _) => {
            let x = x?;
            super::recurrent::slice(x, x.len() / nt, *period, *start, *len)
        }
        (op, meta) => Err(format!(
            "{} with meta {meta:?} is not implemented by the reference backend",
            op.name()
        )),
    }
}

/// Indices of the `k` largest values per row of `n = x.len() / nt`, descending, equal
/// values in ascending index order (a stable sort), as f32 bit patterns.
fn top_k(x: &[f32], nt: usize, k: usize) -> Result<Vec<f32>, String> {
    let n = x.len() / nt;
    if k == 0 || k > n || n * nt != x.len() {
        return Err(format!("top_k: {k} of {} values in {nt} rows", x.len()));
    }
    let mut out = Vec::with_capacity(k * nt);
    for row in x.chunks(n) {
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        out.extend(idx[..k].iter().map(|&i| f32::from_bits(i as u32)));
    }
    Ok(out)
}

/// The expert ids of a `[k, nt]` choice, each checked against `n_expert`.
fn expert_ids(ids: &[f32], n_expert: usize) -> Result<Vec<usize>, String> {
    ints(ids)
        .map(|e| {
            usize::try_from(e)
                .ok()
                .filter(|&e| e < n_expert)
                .ok_or_else(|| format!("expert id {e} outside 0..{n_expert}"))
        })
        .collect()
}

/// Each slot's product with its expert (and for the SwiGLU form, `silu(gate) * up`).
fn mul_mat_id(
    node: &CNode,
    x: &[f32],
    ids: &[f32],
    m: &MatMulIdMeta,
    w: &WeightStore,
) -> Result<Vec<f32>, String> {
    let ids = expert_ids(ids, m.n_expert)?;
    let slots = ids.len();
    let x_rows = x.len() / m.in_dim.max(1);
    // `x` holds one row per token (shared by its slots) or one per slot.
    if node.out_shape[1] != slots || x_rows == 0 || !slots.is_multiple_of(x_rows) {
        return Err(format!(
            "{}: {x_rows} input rows for {slots} slots",
            node.op.name()
        ));
    }
    let per_row = slots / x_rows;
    let expert = |name: &str, e: usize| -> Result<Vec<f32>, String> {
        let full = weight(w, name)?;
        if full.in_dim != m.in_dim || full.out_dim != m.out_dim * m.n_expert {
            return Err(format!(
                "{name}: [{}, {}] vs {m:?}",
                full.in_dim, full.out_dim
            ));
        }
        let rows = m.out_dim * m.in_dim;
        Ok(full.data[e * rows..(e + 1) * rows].to_vec())
    };
    let mut out = Vec::with_capacity(m.out_dim * slots);
    for (s, &e) in ids.iter().enumerate() {
        let row = s / per_row;
        let xr = &x[row * m.in_dim..(row + 1) * m.in_dim];
        let product = |name: &str| -> Result<Vec<f32>, String> {
            let we = expert(name, e)?;
            Ok(we
                .chunks(m.in_dim)
                .map(|wr| wr.iter().zip(xr).map(|(a, b)| a * b).sum())
                .collect())
        };
        let biased = |mut y: Vec<f32>, bias: &Option<String>| -> Result<Vec<f32>, String> {
            if let Some(name) = bias {
                let row = weight(w, name)?
                    .data
                    .get(e * m.out_dim..(e + 1) * m.out_dim)
                    .ok_or_else(|| format!("bias '{name}' holds no row for expert {e}"))?;
                y.iter_mut().zip(row).for_each(|(v, b)| *v += b);
            }
            Ok(y)
        };
        let up = biased(product(&m.weight_name)?, &m.bias_name)?;
        match &m.gate_name {
            Some(g) => {
                let gate = biased(product(g)?, &m.gate_bias_name)?;
                out.extend(gate.iter().zip(&up).map(|(&a, &b)| m.glu.apply(a, b)));
            }
            None => out.extend(up),
        }
    }
    Ok(out)
}

/// `sum_j w_j h_(j,t)` with the router weights at the chosen experts, renormalised when
/// `norm`.
fn moe_sum(
    h: &[f32],
    probs: &[f32],
    ids: &[f32],
    out_shape: [usize; 4],
    norm: bool,
) -> Result<Vec<f32>, String> {
    let (d, nt) = (out_shape[0], out_shape[1].max(1));
    let k = ids.len() / nt;
    let n_expert = probs.len() / nt;
    let ids = expert_ids(ids, n_expert)?;
    if h.len() != d * k * nt || k * nt != ids.len() {
        return Err(format!(
            "moe_sum: {} values for {k} x {nt} slots of {d}",
            h.len()
        ));
    }
    let mut out = vec![0.0; d * nt];
    for t in 0..nt {
        let mut wts: Vec<f32> = (0..k)
            .map(|j| probs[t * n_expert + ids[t * k + j]])
            .collect();
        if norm {
            let sum = (wts.iter().map(|&v| f64::from(v)).sum::<f64>() as f32).max(6.103_515_6e-5);
            wts.iter_mut().for_each(|v| *v /= sum);
        }
        let o = &mut out[t * d..(t + 1) * d];
        for (j, wj) in wts.iter().enumerate() {
            let hr = &h[(t * k + j) * d..(t * k + j + 1) * d];
            for (y, v) in o.iter_mut().zip(hr) {
                *y += v * wj;
            }
        }
    }
    Ok(out)
}

fn gather(table: &[f32], d: usize, ids: &[f32]) -> Result<Vec<f32>, String> {
    let mut out = Vec::with_capacity(ids.len() * d);
    for id in ints(ids) {
        let start = usize::try_from(id).map_err(|_| format!("row id {id} is negative"))? * d;
        let row = table
            .get(start..start + d)
            .ok_or_else(|| format!("row id {id} out of range ({} rows)", table.len() / d.max(1)))?;
        out.extend_from_slice(row);
    }
    Ok(out)
}

fn kv_meta(node: &CNode) -> Result<&KvcacheMeta, String> {
    match &node.meta {
        NodeMeta::Kvcache(m) => Ok(m),
        other => Err(format!("expected KV meta, got {other:?}")),
    }
}

/// Writes `k`/`v` token rows into the K/V regions at rows `cells`.
pub(super) fn kv_store(
    node: &CNode,
    inputs: &[Vec<f32>],
    buffers: &mut [Vec<f32>],
    k_id: usize,
    v_id: usize,
) -> Result<(), String> {
    let m = kv_meta(node)?;
    let cells = input(inputs, 2)?;
    // A ringed layer's cells are virtual rows.
    let rows = m.ring.map_or(m.n_ctx, |r| r.virtual_rows(m.n_ctx));
    for (half, id) in [(input(inputs, 0)?, k_id), (input(inputs, 1)?, v_id)] {
        let region = buffers.get_mut(id).ok_or("KV region does not exist")?;
        for (t, cell) in ints(cells).enumerate() {
            let c = usize::try_from(cell)
                .ok()
                .filter(|&c| c < rows)
                .ok_or_else(|| format!("cell {cell} outside the {rows}-row region"))?;
            let c = m.ring.map_or(c, |r| r.row(c));
            let src = half
                .get(t * m.n_embd..(t + 1) * m.n_embd)
                .ok_or("KV store input shorter than its cells")?;
            region[c * m.n_embd..(c + 1) * m.n_embd].copy_from_slice(src);
        }
    }
    Ok(())
}

/// Causal (or explicit-span, or an encoder's bidirectional) GQA attention over the
/// layer's K/V regions.
pub(super) fn attn(
    node: &CNode,
    inputs: &[Vec<f32>],
    k: &[f32],
    v: &[f32],
    w: &WeightStore,
) -> Result<Vec<f32>, String> {
    let NodeMeta::Attn(m) = &node.meta else {
        return Err("attention without AttnMeta".into());
    };
    let sinks = match &m.sinks {
        Some(name) => {
            let s = &weight(w, name)?.data;
            if s.len() != m.n_head {
                return Err(format!(
                    "sinks '{name}': {} values for {} heads",
                    s.len(),
                    m.n_head
                ));
            }
            Some(s.as_slice())
        }
        None => None,
    };
    let nt = nt_of(node);
    let (q, pos) = (input(inputs, 0)?, input(inputs, 2)?);
    let span = inputs.get(3);
    let nkt = m.nkt();
    let group = m.n_head / m.n_head_kv.max(1);
    let q_stride = q.len() / nt;
    if group == 0 || q_stride < m.n_head * m.hd || k.len() < nkt * m.n_ctx {
        return Err(format!("attention geometry {m:?} vs q row {q_stride}"));
    }
    let pos: Vec<i64> = ints(pos).collect();
    if !m.causal && (m.window.is_some() || m.ring.is_some()) {
        return Err("non-causal attention with a window or ring".into());
    }
    let mut ranges = Vec::with_capacity(nt);
    for t in 0..nt {
        let (lo, hi) = match span {
            Some(s) => {
                let r: Vec<i64> = ints(s.get(2 * t..2 * t + 2).ok_or("short span")?).collect();
                (r[0], r[1])
            }
            None => (0, pos.get(t).ok_or("short positions")? + 1),
        };
        ranges.push((lo.max(0) as usize, hi.max(0) as usize));
    }
    m.widen_non_causal(&mut ranges);
    let mut out = vec![0.0; m.n_head * m.hd * nt];
    for (t, &(lo, hi)) in ranges.iter().enumerate() {
        let bad_cap = m.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0));
        if hi > m.virtual_rows() || lo >= hi || m.window == Some(0) || bad_cap {
            return Err(format!(
                "token {t}: key range [{lo}, {hi}) vs {} rows (window {:?}, softcap {:?})",
                m.virtual_rows(),
                m.window,
                m.softcap
            ));
        }
        // Sliding window: the last `window` rows of the range, the token's own included.
        let lo = m.window.map_or(lo, |w| lo.max(hi.saturating_sub(w)));
        // A ring holds a window's rows of each sequence at mapped rows.
        let row = |j: usize| m.ring.map_or(j, |r| r.row(j));
        for h in 0..m.n_head {
            let qh = &q[t * q_stride + h * m.hd..t * q_stride + (h + 1) * m.hd];
            let off = (h / group) * m.hd;
            let scores: Vec<f32> = (lo..hi)
                .map(|j| {
                    let j = row(j);
                    let kr = &k[j * nkt + off..j * nkt + off + m.hd];
                    let s = qh.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * m.scale;
                    m.softcap.map_or(s, |c| softcap(s, c))
                })
                .collect();
            let mut mx = scores.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            // A sink joins the normaliser (and the maximum) with no value row.
            let sink = sinks.map(|s| s[h]);
            if let Some(s) = sink {
                mx = mx.max(s);
            }
            let e: Vec<f32> = scores.iter().map(|s| (s - mx).exp()).collect();
            let sum: f32 = e.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - mx).exp());
            let o = &mut out[t * m.n_head * m.hd + h * m.hd..][..m.hd];
            for (j, p) in (lo..hi).zip(&e) {
                let j = row(j);
                let vr = &v[j * nkt + off..j * nkt + off + m.hd];
                for (d, val) in vr.iter().enumerate() {
                    o[d] += p / sum * val;
                }
            }
        }
    }
    Ok(out)
}
