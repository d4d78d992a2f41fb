//! The decode QKV fusions on wgpu: `FusedQKV` and `FusedQkvNorm` (q, k and v of a
//! token into one output row, biases or per-head norms, rope, and the store of k and
//! v) and `QkvBiasRopeStore` (the same epilogue over three matmul outputs). Each step
//! is the unfused chain's kernel, so the results equal the chain's bit for bit.

use minfer_graph::device_kit::{FusedOps, MatmulPlan, NodeCall, QkvPlan};
use minfer_graph::{BackendError, QkvBiasRopeStoreMeta, RoPEMeta};

use super::kv::KvRows;
use super::res::Res;
use super::WgpuBackend;
use crate::kernels::{ActFormat, Kernel};

impl WgpuBackend {
    /// The weights of a q|k|v concatenation: the tensor itself when the file has one
    /// under that name, else the three matrices it stands for (`..attn_qkv.weight`
    /// names `..attn_q.weight`, `..attn_k.weight` and `..attn_v.weight`), each with its
    /// first output column.
    fn qkv_weights(&self, p: &QkvPlan) -> Result<Vec<(String, usize, usize)>, BackendError> {
        let total = p.nqt + 2 * p.nkt;
        if self.weights.contains(p.weight) {
            return Ok(vec![(p.weight.to_string(), 0, total)]);
        }
        let stem = p.weight.strip_suffix("attn_qkv.weight").ok_or_else(|| {
            format!(
                "weight '{}' is neither registered nor a q|k|v concatenation name",
                p.weight
            )
        })?;
        Ok(vec![
            (format!("{stem}attn_q.weight"), 0, p.nqt),
            (format!("{stem}attn_k.weight"), p.nqt, p.nkt),
            (format!("{stem}attn_v.weight"), p.nqt + p.nkt, p.nkt),
        ])
    }
}

impl FusedOps for WgpuBackend {
    /// `FusedQKV` / `FusedQkvNorm`: q, k and v of every token into the columns of one
    /// output row (`[nqt | nkt | nkt]`), each plus its bias, the per-head norms when
    /// given, rope on the q and k columns, and k and v stored at the positions. Each
    /// step is the unfused chain's kernel over the same values, so the q columns and
    /// the stored rows equal the chain's bit for bit, with fewer nodes and buffers.
    fn fused_qkv(&mut self, c: &NodeCall, p: &QkvPlan) -> Result<(), BackendError> {
        let x = self.src(&c.io, 0)?;
        let (node, ids, out, kv_pair) = (c.node, &c.io.ids[..], c.io.out, c.kv_pair);
        let nt = node.out_shape[1].max(1);
        let width = p.nqt + 2 * p.nkt;
        let hd = p.rope.hd;
        if node.n_elements() != width * nt
            || hd == 0
            || p.rope.n_head * hd != p.nqt
            || !p.nkt.is_multiple_of(hd)
        {
            return Err(format!(
                "output {:?} with q {} / kv {} columns and {} heads of {hd}",
                node.out_shape, p.nqt, p.nkt, p.rope.n_head
            )
            .into());
        }
        let n_head_kv = p.nkt / hd;
        let pos_id = *ids
            .get(1)
            .ok_or("a fused QKV node needs a positions source")?;
        let x_len = ids.first().map_or(0, |&i| self.len(i));
        let parts = self.qkv_weights(p)?;
        // One rounding of the input serves the three matmuls when they share a format.
        let formats: Vec<Option<ActFormat>> = parts
            .iter()
            .map(|(name, ..)| self.weight(name).map(|w| ActFormat::of(w.ty)))
            .collect::<Result<_, _>>()?;
        let shared = formats.iter().all(|f| *f == formats[0]);
        let (x_in, x_in_len, rounded) = match formats[0] {
            Some(fmt) if shared => {
                let stride = x_len / nt;
                if stride < p.n_embd {
                    return Err(format!(
                        "fused QKV: input {x_len} values for {nt} rows of {}",
                        p.n_embd
                    )
                    .into());
                }
                let r = self.round_activations(fmt, x, p.n_embd, stride, nt)?;
                (r, nt * p.n_embd, true)
            }
            _ => (x, x_len, false),
        };
        let mut bias_at = p.biases.iter();
        for (name, y_off, out_dim) in &parts {
            // The concatenation's one bias would need one vector; only the split form has
            // the three.
            let bias = if parts.len() == 3 {
                bias_at.next().copied().flatten()
            } else if p.biases.iter().any(Option::is_some) {
                return Err(format!(
                    "weight '{}' is one q|k|v tensor; its biases are three vectors",
                    p.weight
                )
                .into());
            } else {
                None
            };
            let mm = MatmulPlan {
                name,
                in_dim: p.n_embd,
                out_dim: *out_dim,
                bias,
                y_stride: width,
                y_off: *y_off,
                rounded,
            };
            self.product(&mm, x_in, x_in_len, nt, out)?;
        }
        if let Some(([qn, kn], eps)) = p.norms {
            let (qw, kw) = (self.vector(qn, hd)?, self.vector(kn, hd)?);
            // The norms read the matmul results from a snapshot and write them back.
            let (sq, heads) = (self.snapshot(out)?, p.rope.n_head);
            self.norm_rows(sq, Some(qw), hd, nt * heads, eps, (heads, width, 0), out)?;
            let kl = (n_head_kv, width, p.nqt);
            self.norm_rows(sq, Some(kw), hd, nt * n_head_kv, eps, kl, out)?;
        }
        let pos = Res::Pool(pos_id);
        self.rope_rows(p.rope, pos, Res::Pool(out), nt, width, 0)?;
        let rope_k = RoPEMeta {
            n_head: n_head_kv,
            ..p.rope.clone()
        };
        self.rope_rows(&rope_k, pos, Res::Pool(out), nt, width, p.nqt)?;
        let len = self.len(out);
        let rows = KvRows {
            layer: p.layer,
            n_embd: p.nkt,
            n_ctx: p.n_ctx,
            nt,
            stride: width,
            k: (Res::Pool(out), len, p.nqt),
            v: (Res::Pool(out), len, p.nqt + p.nkt),
            cells: pos_id,
        };
        self.store_rows(&rows, kv_pair)
    }

    /// `QkvBiasRopeStore`: over three matmul outputs, q + q_bias into the output (q's
    /// own buffer), k + k_bias and v + v_bias into scratch, rope on q and k, then k and
    /// v stored at the positions. The output is the roped q.
    fn bias_rope_store(
        &mut self,
        c: &NodeCall,
        m: &QkvBiasRopeStoreMeta,
    ) -> Result<(), BackendError> {
        let (node, ids, out, kv_pair) = (c.node, &c.io.ids[..], c.io.out, c.kv_pair);
        let layer = c.layer;
        let nt = node.out_shape[1].max(1);
        let hd = m.rope.hd;
        let (nqt, nkt) = (m.nqt, m.nkt);
        let [q_id, k_id, v_id, pos_id] = match ids {
            [a, b, c, d] => [*a, *b, *c, *d],
            _ => {
                return Err(
                    format!("takes q, k, v and positions, got {} sources", ids.len()).into(),
                )
            }
        };
        if node.n_elements() != nqt * nt
            || hd == 0
            || m.rope.n_head * hd != nqt
            || !nkt.is_multiple_of(hd)
            || self.len(q_id) < nqt * nt
            || self.len(k_id) < nkt * nt
            || self.len(v_id) < nkt * nt
        {
            return Err(format!(
                "q {} / k {} / v {} values for {nt} tokens of q {nqt}, kv {nkt} ({} heads of {hd})",
                self.len(q_id),
                self.len(k_id),
                self.len(v_id),
                m.rope.n_head
            )
            .into());
        }
        let (bq, bk, bv) = (
            self.vector(&m.q_bias, nqt)?,
            self.vector(&m.k_bias, nkt)?,
            self.vector(&m.v_bias, nkt)?,
        );
        // q is the output's own buffer: the add reads it from a snapshot.
        let q = if q_id == out {
            self.snapshot(out)?
        } else {
            Res::Pool(q_id)
        };
        let (kt, vt) = (Res::Tmp(0, nkt * nt), Res::Tmp(1, nkt * nt));
        self.elementwise(
            Kernel::Add,
            &[q, Res::Weight(bq), Res::Pool(out)],
            nqt * nt,
            nqt,
        )?;
        self.elementwise(
            Kernel::Add,
            &[Res::Pool(k_id), Res::Weight(bk), kt],
            nkt * nt,
            nkt,
        )?;
        self.elementwise(
            Kernel::Add,
            &[Res::Pool(v_id), Res::Weight(bv), vt],
            nkt * nt,
            nkt,
        )?;
        let pos = Res::Pool(pos_id);
        self.rope_rows(&m.rope, pos, Res::Pool(out), nt, nqt, 0)?;
        let rope_k = RoPEMeta {
            n_head: nkt / hd,
            ..m.rope.clone()
        };
        self.rope_rows(&rope_k, pos, kt, nt, nkt, 0)?;
        let rows = KvRows {
            layer,
            n_embd: nkt,
            n_ctx: m.n_ctx,
            nt,
            stride: nkt,
            k: (kt, nkt * nt, 0),
            v: (vt, nkt * nt, 0),
            cells: pos_id,
        };
        self.store_rows(&rows, kv_pair)
    }
}
