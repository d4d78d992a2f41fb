//! The fused q/k/v projection node (`FusedQKV`, `FusedQkvNorm`): the plan checked for the
//! CPU kernel, then the three projections, the optional per-head norms and rope, and the
//! KV store in one pass.

use minfer_graph::device_kit::QkvPlan;
use minfer_graph::{CNode, KvType, NodeMeta, Op};

use super::matmul_node::{matmul_group, Epilogue, MatIn};
use super::{vector, Scratch, WeightRegistry};
use crate::ops::{kv, norm, rope};
use crate::threadpool::ThreadPool;

/// The kit's plan of a `FusedQKV` / `FusedQkvNorm` node, checked for the CPU kernel: an
/// unscaled rope whose heads tile q and k, and an output of q | k | v rows.
pub(super) fn qkv_plan(node: &CNode) -> Result<QkvPlan<'_>, String> {
    let plan = match (&node.op, &node.meta) {
        (Op::FusedQKV { layer }, NodeMeta::FusedQkv(m)) => QkvPlan::qkv(*layer, m),
        (Op::FusedQkvNorm { layer }, NodeMeta::FusedQkvNorm(m)) => QkvPlan::qkv_norm(*layer, m),
        (op, meta) => return Err(format!("{} with metadata {meta:?}", op.name())),
    };
    let r = plan.rope;
    let hd = r.hd;
    if r.freq_factors.is_some()
        || hd == 0
        || plan.nqt != r.n_head * hd
        || plan.nkt == 0
        || !plan.nkt.is_multiple_of(hd)
        || node.out_shape[0] != plan.nqt + 2 * plan.nkt
    {
        return Err(format!(
            "layer {}: q {} / kv {} rows, rope {r:?}, output {:?} do not fit",
            plan.layer, plan.nqt, plan.nkt, node.out_shape
        ));
    }
    Ok(plan)
}

/// The q, k and v weight names behind a q|k|v concatenation name (`blk.N.attn_qkv.weight`,
/// as the model builders name it): the layer's own `attn_q`, `attn_k` and `attn_v`.
pub(super) fn qkv_part_names(concat: &str) -> Option<[String; 3]> {
    let prefix = concat.strip_suffix("attn_qkv.weight")?;
    Some(["q", "k", "v"].map(|p| format!("{prefix}attn_{p}.weight")))
}

/// What the fused QKV kernel reads and writes.
pub(super) struct QkvIo<'a> {
    pub(super) x: &'a [f32],
    pub(super) pos: &'a [f32],
    pub(super) out: &'a mut [f32],
    pub(super) k_region: &'a mut [f32],
    pub(super) v_region: &'a mut [f32],
}

/// The backend state the fused QKV kernel uses.
pub(super) struct QkvCx<'a> {
    pub(super) pool: &'a ThreadPool,
    pub(super) weights: &'a WeightRegistry,
    pub(super) repack: bool,
    pub(super) kv_types: [KvType; 2],
}

/// The body of [`CpuBackend::fused_qkv`], step for step the unfused chain's kernels.
pub(super) fn fused_qkv_compute(
    cx: &QkvCx<'_>,
    layer: usize,
    spec: &QkvPlan<'_>,
    names: &[String; 3],
    nt: usize,
    io: QkvIo<'_>,
    scratch: &mut Scratch,
) -> Result<(), String> {
    let (nqt, nkt) = (spec.nqt, spec.nkt);
    let w = nqt + 2 * nkt;
    let n = w * nt;
    if io.out.len() < n || io.pos.len() < nt {
        return Err(format!(
            "output holds {}, node needs {n}; {} positions for {nt} tokens",
            io.out.len(),
            io.pos.len()
        ));
    }
    let out = &mut io.out[..n];
    let pos = &io.pos[..nt];
    let group = [
        (names[0].as_str(), 0, nqt),
        (names[1].as_str(), nqt, nkt),
        (names[2].as_str(), nqt + nkt, nkt),
    ];
    let mmx = MatIn {
        x: io.x,
        nt,
        packed: &mut scratch.packed,
    };
    matmul_group(
        cx.pool,
        cx.weights,
        &group,
        spec.n_embd,
        mmx,
        &mut scratch.matmul,
        out,
        cx.repack,
        &mut scratch.up,
        Epilogue::None,
    )?;
    // Biases, as the unfused matmul adds them (`y += b` element by element).
    for (&(_, off, rows), bias) in group.iter().zip(spec.biases) {
        let Some(name) = bias else { continue };
        let b = vector(cx.weights, name)?;
        if b.len() != rows {
            return Err(format!("bias '{name}' holds {}, expected {rows}", b.len()));
        }
        for row in out.chunks_exact_mut(w) {
            for (v, &z) in row[off..off + rows].iter_mut().zip(b) {
                *v += z;
            }
        }
    }
    let hd = spec.rope.hd;
    // Qwen3's per-head norms of q and k, each head as `qk_norm` normalizes it.
    if let Some(([qn, kn], eps)) = spec.norms {
        let tmp = &mut scratch.gate;
        tmp.resize(hd, 0.0);
        for (name, off, rows) in [(qn, 0, nqt), (kn, nqt, nkt)] {
            let wn = vector(cx.weights, name)?;
            if wn.len() != hd {
                return Err(format!("norm '{name}' holds {}, expected {hd}", wn.len()));
            }
            for row in out.chunks_exact_mut(w) {
                for head in row[off..off + rows].chunks_exact_mut(hd) {
                    tmp.copy_from_slice(head);
                    norm::rms_norm_row(tmp, head, eps, Some(wn));
                }
            }
        }
    }
    let cache = &mut scratch.rope;
    rope::rope_inplace(cx.pool, out, w, nt, pos, spec.rope, None, cache)?;
    let k_meta = minfer_graph::RoPEMeta {
        n_head: nkt / hd,
        ..spec.rope.clone()
    };
    for (t, row) in out.chunks_exact_mut(w).enumerate() {
        let k = &mut row[nqt..nqt + nkt];
        rope::rope_inplace(cx.pool, k, nkt, 1, &pos[t..t + 1], &k_meta, None, cache)?;
    }
    let (k, v): (&[f32], &[f32]) = if nt == 1 {
        (&out[nqt..nqt + nkt], &out[nqt + nkt..w])
    } else {
        let (kr, vr) = (&mut scratch.k_rows, &mut scratch.v_rows);
        kr.clear();
        vr.clear();
        for row in out.chunks_exact(w) {
            kr.extend_from_slice(&row[nqt..nqt + nkt]);
            vr.extend_from_slice(&row[nqt + nkt..]);
        }
        (kr, vr)
    };
    kv::store(
        layer,
        nkt,
        spec.n_ctx,
        None,
        cx.kv_types,
        k,
        v,
        pos,
        io.k_region,
        io.v_region,
    )
}
