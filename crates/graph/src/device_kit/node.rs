//! What a device backend does with a node before its op's own work: the sources
//! matched to their pool ids, the output checked to hold the node, and the
//! capability answers every device backend gives the same way.

use super::pool::DevicePool;
use crate::backend_error::BackendError;
use crate::ir::{BufRef, CNode, DType, Op};
use crate::meta::{AttnMeta, NodeMeta};

/// The ops the device backends implement (f32 values; rope without frequency factors).
pub fn supports_op(op: &Op, dtype: DType) -> bool {
    dtype == DType::F32
        && matches!(
            op,
            Op::Add
                | Op::Mul
                | Op::Scale(_)
                | Op::Silu
                | Op::Gelu
                | Op::SoftCap(_)
                | Op::SwiGLU
                | Op::GeGLU
                | Op::MulSigmoid
                | Op::RmsNorm { .. }
                | Op::QkNorm { .. }
                | Op::MatMul { .. }
                | Op::GetRows
                | Op::RoPE {
                    freq_factors: false,
                    ..
                }
                | Op::Attn { .. }
                | Op::KvcacheStore { .. }
                | Op::KvcacheLoad { .. }
                | Op::FusedFFN
                | Op::FusedQKV { .. }
                | Op::FusedQkvNorm { .. }
                | Op::QkvBiasRopeStore { .. }
        )
}

/// Whether a device backend takes `node`: an op of [`supports_op`], a node touching
/// the KV regions only when they live here (`kv_here`; the QKV fusions store into
/// them), sliding-window attention only where its kernel honours the window
/// (`windows`), no attention with sinks or that is not causal (a score soft-cap the
/// kernels apply), and no rope with YaRN terms
/// (no device kernel has those terms), no node of a ringed KV layer, and every weight it
/// names decoded (`weights_decoded`, the backend's own).
pub fn supports_node(
    node: &CNode,
    kv_here: bool,
    windows: bool,
    weights_decoded: impl Fn(&CNode) -> bool,
) -> bool {
    let kv = node.kv_layer().is_some();
    let windowed = matches!(&node.meta, NodeMeta::Attn(m) if m.window.is_some());
    // Nor a bidirectional (encoder) key range: the device kernels bound keys causally.
    let foreign_attn = matches!(&node.meta, NodeMeta::Attn(m) if m.sinks.is_some() || !m.causal);
    let yarn = match &node.meta {
        NodeMeta::Rope(m) => m.yarn.is_some(),
        NodeMeta::FusedQkv(m) => m.rope.yarn.is_some(),
        NodeMeta::FusedQkvNorm(m) => m.rope.yarn.is_some(),
        NodeMeta::QkvBiasRopeStore(m) => m.rope.yarn.is_some(),
        _ => false,
    };
    // No device kernel maps virtual rows onto a KV ring: ringed layers stay on the host.
    let ringed = match &node.meta {
        NodeMeta::Attn(m) => m.ring.is_some(),
        NodeMeta::Kvcache(m) => m.ring.is_some(),
        _ => false,
    };
    supports_op(&node.op, node.out_dtype)
        && (kv_here || !kv)
        && (windows || !windowed)
        && !foreign_attn
        && !yarn
        && !ringed
        && weights_decoded(node)
}

/// A node's inputs match its sources one for one.
pub fn check_sources(node: &CNode, in_bufs: &[BufRef]) -> Result<(), BackendError> {
    if in_bufs.len() != node.src.len() {
        return Err(BackendError::SourceCount {
            sources: node.src.len(),
            bufs: in_bufs.len(),
        });
    }
    Ok(())
}

/// A node's buffers as pool ids, checked: every source in the pool (attention's KV
/// view excepted, `usize::MAX` in `ids`: its kernel reads the KV pair instead), the
/// output in the pool and, for an op that writes it, holding the node's values.
#[derive(Debug)]
pub struct NodeBufs {
    /// The output's id.
    pub out: usize,
    /// The sources' ids, in source order.
    pub ids: Vec<usize>,
    /// Output values.
    pub n: usize,
    /// Token rows of the output (at least one).
    pub nt: usize,
}

impl NodeBufs {
    /// Resolves and checks `node`'s buffers in `pool`.
    pub fn resolve<M>(
        pool: &DevicePool<M>,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
    ) -> Result<Self, BackendError> {
        check_sources(node, in_bufs)?;
        let is_attn = matches!(node.op, Op::Attn { .. });
        let out = pool.id_of(out_buf, "the output")?;
        let mut ids = Vec::with_capacity(in_bufs.len());
        for (i, b) in in_bufs.iter().enumerate() {
            // Attention's second source is the KV view; the kernel reads `kv_pair` instead.
            if is_attn && i == 1 {
                ids.push(usize::MAX);
                continue;
            }
            ids.push(pool.id_of(*b, &format!("source {i}"))?);
        }
        let n = node.n_elements();
        if !super::checks::writes_no_output(&node.op) && pool.len(out) < n {
            return Err(BackendError::OutputTooSmall {
                holds: pool.len(out),
                needs: n,
            });
        }
        let nt = node.out_shape[1].max(1);
        Ok(Self { out, ids, n, nt })
    }

    /// Source `i`'s id.
    pub fn id(&self, i: usize) -> Result<usize, BackendError> {
        self.ids
            .get(i)
            .copied()
            .ok_or(BackendError::NoSource { index: i })
    }

    /// Source `i`'s length in `pool` (0 when missing).
    pub fn len<M>(&self, i: usize, pool: &DevicePool<M>) -> usize {
        self.ids.get(i).map_or(0, |&id| pool.len(id))
    }

    /// Attention's checks after its geometry: the output's size, q and the KV regions
    /// `kv` (see `AttnMeta::check_q_and_kv`), and the positions or spans. Returns the
    /// q row stride, the positions source and the span source.
    pub fn attn_checked<M>(
        &self,
        pool: &DevicePool<M>,
        node: &CNode,
        m: &AttnMeta,
        explicit_span: bool,
        (k_id, v_id): (usize, usize),
    ) -> Result<(usize, usize, usize), BackendError> {
        super::checks::attn_out(node, m, self.nt, self.n)?;
        let x_len = self.len(0, pool);
        let q_stride = m.check_q_and_kv(self.nt, x_len, pool.len(k_id), pool.len(v_id))?;
        let (pos, span) = self.attn_rows(pool, m, explicit_span)?;
        Ok((q_stride, pos, span))
    }

    /// Attention's positions and span sources, their host-written values checked
    /// against the metadata: `(positions, span)`, the span being the positions
    /// without `explicit_span`.
    pub fn attn_rows<M>(
        &self,
        pool: &DevicePool<M>,
        m: &AttnMeta,
        explicit_span: bool,
    ) -> Result<(usize, usize), BackendError> {
        let nt = self.nt;
        let pos_id = *self.ids.get(2).ok_or(BackendError::MissingSource(
            "attention needs a positions source",
        ))?;
        let span_id = if explicit_span {
            let s = *self.ids.get(3).ok_or(BackendError::MissingSource(
                "span attention needs a span source",
            ))?;
            m.check_spans(&pool.host_ints(s, 2 * nt, "attention spans")?)?;
            s
        } else {
            m.check_positions(&pool.host_ints(pos_id, nt, "attention positions")?)?;
            pos_id
        };
        Ok((pos_id, span_id))
    }
}
