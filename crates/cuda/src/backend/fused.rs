//! The decode QKV fusions on CUDA: `FusedQKV` and `FusedQkvNorm` (one matmul against
//! the registered q|k|v concatenation, then biases or per-head norms, rope, and the
//! store of k and v) and `QkvBiasRopeStore` (the same epilogue over three matmul
//! outputs).

use minfer_graph::device_kit::{FusedOps, MatmulPlan, NodeCall, QkvPlan};
use minfer_graph::{BackendError, QkvBiasRopeStoreMeta};

use super::CudaBackend;
use crate::replay::{Arg, Cmd};

impl FusedOps for CudaBackend {
    /// The decode QKV fusions (`fused_qkv`, `fused_qkv_norm`): one matmul against the
    /// registered q|k|v concatenation into `[q | k | v]`, then the q/k/v biases or the
    /// per-head q/k norms, rope on q and k, and the store of k and v at the positions
    /// (which are the KV rows: the builder emits these only without explicit spans).
    /// One token: the segments of a row are contiguous only then.
    fn fused_qkv(&mut self, c: &NodeCall, f: &QkvPlan) -> Result<(), BackendError> {
        let (node, ids, out, kv_pair) = (c.node, &c.io.ids[..], c.io.out, c.kv_pair);
        let nt = node.out_shape[1].max(1);
        let (nqt, nkt) = (f.nqt, f.nkt);
        let rows = nqt + 2 * nkt;
        if nt != 1 || node.n_elements() != rows {
            return Err(format!(
                "output {:?} is not one token of [{nqt} + 2 x {nkt}]",
                node.out_shape
            )
            .into());
        }
        let hd = f.rope.hd;
        if hd == 0 || !nqt.is_multiple_of(hd) || !nkt.is_multiple_of(hd) {
            return Err(
                format!("q rows {nqt} and k rows {nkt} are not whole heads of {hd}").into(),
            );
        }
        let [x_id, pos] = match ids {
            [a, b] => [*a, *b],
            _ => return Err(format!("takes 2 sources, got {}", ids.len()).into()),
        };
        let xl = self.len(x_id);
        let x = self.src_arg(x_id, out)?;
        let mm = MatmulPlan {
            name: f.weight,
            in_dim: f.n_embd,
            out_dim: rows,
            bias: None,
            y_stride: rows,
            y_off: 0,
            rounded: false,
        };
        self.product(&mm, x, xl, 1, out)?;
        let (q, k, v) = (
            Arg::BufAt(out, 0),
            Arg::BufAt(out, nqt),
            Arg::BufAt(out, nqt + nkt),
        );
        let [qb, kb, vb] = f.biases;
        for (b, at, len) in [(qb, q, nqt), (kb, k, nkt), (vb, v, nkt)] {
            if let Some(b) = b {
                self.add_bias(at, len, b, len)?;
            }
        }
        if let Some(([qn, kn], eps)) = f.norms {
            self.norm_rows(q, nqt / hd, hd, qn, eps)?;
            self.norm_rows(k, nkt / hd, hd, kn, eps)?;
        }
        self.rope_at(pos, q, 1, nqt / hd, f.rope, rows)?;
        self.rope_at(pos, k, 1, nkt / hd, f.rope, rows)?;
        let kv = store_pair(f.layer, kv_pair, out, pos)?;
        self.store_rows(f.layer, k, v, pos, 1, nkt, f.n_ctx, kv)
    }

    /// The mixed-quant epilogue (`qkv_bias_rope_store`): biases on the three matmul
    /// outputs, rope on q (the output) and k, and the store of k and v at the positions.
    /// k and v are worked on in snapshot areas, leaving their sources as they were.
    fn bias_rope_store(
        &mut self,
        c: &NodeCall,
        m: &QkvBiasRopeStoreMeta,
    ) -> Result<(), BackendError> {
        let (node, ids, out, kv_pair) = (c.node, &c.io.ids[..], c.io.out, c.kv_pair);
        let layer = c.layer;
        let nt = node.out_shape[1].max(1);
        let (nqt, nkt, hd) = (m.nqt, m.nkt, m.rope.hd);
        let [q_in, k_in, v_in, pos] = match ids {
            [a, b, c, d] => [*a, *b, *c, *d],
            _ => return Err(format!("takes 4 sources, got {}", ids.len()).into()),
        };
        if hd == 0
            || !nqt.is_multiple_of(hd)
            || !nkt.is_multiple_of(hd)
            || node.n_elements() != nqt * nt
        {
            return Err(format!(
                "output {:?} is not [{nqt}, {nt}] in heads of {hd} (k rows {nkt})",
                node.out_shape
            )
            .into());
        }
        if self.len(q_in) < nqt * nt || self.len(k_in) < nkt * nt || self.len(v_in) < nkt * nt {
            return Err(format!(
                "q {} / k {} / v {} values for {nt} tokens of {nqt} / {nkt}",
                self.len(q_in),
                self.len(k_in),
                self.len(v_in)
            )
            .into());
        }
        if q_in != out {
            self.pending.push(Cmd::Copy {
                src: Arg::Buf(q_in),
                dst: Arg::Buf(out),
                len: nqt * nt,
            });
        }
        let k = self.snapshot(1, Arg::Buf(k_in), nkt * nt)?;
        let v = self.snapshot(2, Arg::Buf(v_in), nkt * nt)?;
        self.add_bias(Arg::Buf(out), nqt * nt, &m.q_bias, nqt)?;
        self.add_bias(k, nkt * nt, &m.k_bias, nkt)?;
        self.add_bias(v, nkt * nt, &m.v_bias, nkt)?;
        self.rope_at(pos, Arg::Buf(out), nt, nqt / hd, &m.rope, nqt)?;
        self.rope_at(pos, k, nt, nkt / hd, &m.rope, nkt)?;
        let kv = store_pair(layer, kv_pair, out, pos)?;
        self.store_rows(layer, k, v, pos, nt, nkt, m.n_ctx, kv)
    }
}

/// The KV pair a fused epilogue stores into: present, two buffers, neither the output
/// `out` nor the positions `pos` it reads.
fn store_pair(
    layer: usize,
    kv_pair: Option<(usize, usize)>,
    out: usize,
    pos: usize,
) -> Result<(usize, usize), BackendError> {
    let (k, v) = kv_pair.ok_or(BackendError::KvPair {
        layer,
        pair: None,
        problem: String::new(),
    })?;
    if k == v || [k, v].contains(&out) || [k, v].contains(&pos) {
        return Err(BackendError::KvPair {
            layer,
            pair: kv_pair,
            problem: format!("unusable (output buffer {out}, positions {pos})"),
        });
    }
    Ok((k, v))
}
