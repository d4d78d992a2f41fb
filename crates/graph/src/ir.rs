//! The IR (§3.1): nodes, ops and the graph; the value types they carry (dtypes, the
//! backend handle, buffer and weight references) live in `types` and `backend_id` and
//! are re-exported here.
//!
//! Shapes follow the llama.cpp convention: activations are `[d, nt, 1, 1]` (feature
//! fastest, tokens in dim 1); weights carry GGUF metadata `[in, out]` with memory
//! `[out][in]` row-major.

use std::collections::VecDeque;

pub use crate::backend_id::Backend;
use crate::error::GraphError;
pub use crate::meta::*;
pub use crate::types::{
    AttnMode, BufRef, DType, FusedOp, NodeId, PersistentBuf, RopeStyle, WeightRef, WeightType,
};

/// The op vocabulary (§3.1). Payloads include f32 values, so only `PartialEq`.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Leaf, host-filled every step.
    Input,
    /// Element-wise add (b may broadcast over tokens).
    Add,
    /// Element-wise multiply (b may broadcast over tokens).
    Mul,
    /// Multiply by a constant (vocabulary only).
    Scale(f32),
    /// x * sigmoid(x).
    Silu,
    /// GELU with the tanh approximation, as ggml's `gelu`:
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Gelu,
    /// Tanh soft-cap `c * tanh(x / c)` (Gemma 2's final logits); `c > 0`.
    SoftCap(f32),
    /// Softmax along `dim` (vocabulary only).
    Softmax {
        /// Reduced dimension.
        dim: usize,
    },
    /// RMS normalization over dim 0.
    RmsNorm {
        /// Epsilon inside the root.
        eps: f32,
    },
    /// Layer normalization over dim 0 (BERT): each row less its mean, divided by
    /// `sqrt(variance + eps)`, then times the optional weight and plus the optional bias
    /// of [`crate::NormMeta`] (ggml's `norm` followed by its `mul` and `add` nodes).
    LayerNorm {
        /// Epsilon inside the root.
        eps: f32,
    },
    /// Per-head RMS normalization (Qwen3 q/k norm).
    QkNorm {
        /// Head dimension.
        hd: usize,
        /// Heads.
        nh: usize,
        /// Epsilon.
        eps: f32,
    },
    /// Linear layer against a named weight.
    MatMul {
        /// Whether b is transposed (the GGUF layout always is).
        transpose_b: bool,
    },
    /// Row gather: embedding lookup or tail-row selection.
    GetRows,
    /// Rotary positional encoding.
    RoPE {
        /// Pairing of rotated dims.
        style: RopeStyle,
        /// Each pair's angle is divided by a per-pair factor read from the weight named in
        /// [`crate::RoPEMeta::freq_factors`] (Llama 3 scaling); in the op, not only in the
        /// metadata, so a backend without that term can decline the node in `supports_op`.
        freq_factors: bool,
    },
    /// Attention with the softmax fused inside the kernel.
    Attn {
        /// Kernel family.
        mode: AttnMode,
        /// `positions` cannot bound the node; only a backend reading the span input may take it.
        explicit_span: bool,
    },
    /// Persistent KV write; the row comes from the `cells` input (invariant 1).
    KvcacheStore {
        /// Layer index, the only payload.
        layer: usize,
    },
    /// View of the persistent KV region (no execution).
    KvcacheLoad {
        /// Layer index, the only payload.
        layer: usize,
    },
    /// Strided view (vocabulary only).
    View {
        /// Element offset.
        offset: usize,
        /// View shape.
        shape: [usize; 4],
    },
    /// Reshape (vocabulary only).
    Reshape {
        /// New shape.
        shape: [usize; 4],
    },
    /// Axis permutation (vocabulary only).
    Permute {
        /// Destination axis of each source axis.
        dims: [usize; 4],
    },
    /// silu(gate) * up, the FusionPass output.
    SwiGLU,
    /// gelu(gate) * up (tanh GELU, as [`Op::Gelu`]), the FusionPass output.
    GeGLU,
    /// Planned multi-output matmul (not emitted: the IR is single-output).
    BatchMatMul,
    /// Decode concat matmul + bias/rope/store.
    FusedQKV {
        /// Layer index.
        layer: usize,
    },
    /// Decode mixed-quant: one bias/rope/store epilogue after three matmuls.
    QkvBiasRopeStore {
        /// Layer index.
        layer: usize,
    },
    /// Decode gate|up concat matmul + in-place SwiGLU.
    FusedFFN,
    /// Decode Qwen3 concat matmul + qk-norm + rope/store.
    FusedQkvNorm {
        /// Layer index.
        layer: usize,
    },
    /// The `k` largest values of each row (dim 0) of an `[n, nt]` F32 source, as I32
    /// indices `[k, nt]` in descending order of value, equal values in ascending index
    /// order (what ggml's `argsort_top_k` gives for rows of up to 16; an MoE router's
    /// expert choice).
    TopK {
        /// Entries kept per row, `1..=n`.
        k: usize,
    },
    /// Expert-routed matmul (ggml's `MUL_MAT_ID`): sources `[x, ids]`, `ids` the I32
    /// `[k, nt]` expert choice; slot `(j, t)` of the `[out, k * nt]` output is expert
    /// `ids[j, t]` of the stacked weight in [`crate::MatMulIdMeta`] times `x`'s row `t`
    /// (`x` of `nt` rows: every slot of a token reads the token's row) or row `t * k + j`
    /// (`x` of `k * nt` rows), plus the expert's row of `MatMulIdMeta::bias_name` when
    /// set. The experts are data: the topology does not depend on them.
    MulMatId,
    /// `silu(gate_e x) * (up_e x)` for each slot, as [`Op::MulMatId`] computes each
    /// product (biases included), with the gate weight in `MatMulIdMeta::gate_name`: one
    /// node so a backend reads the activations (and quantizes them) once for both. The
    /// activation is `MatMulIdMeta::glu` ([`crate::Glu`]: SiLU, or gpt-oss's clamped form).
    MulMatIdSwiGLU,
    /// The experts' weighted sum: sources `[h, probs, ids]`, `h` `[d, k * nt]` (slot
    /// `(j, t)` at row `t * k + j`), `probs` the router's `[n_expert, nt]` gate values,
    /// `ids` the I32 `[k, nt]` choice. Token `t`'s output is `sum_j w_j h_(j,t)`, summed
    /// in `j` order, with `w_j = probs[ids[j, t], t]`, divided by `max(sum_j w_j,
    /// 2^-14)` when `norm` (llama.cpp's `build_moe_ffn` with `norm_w`).
    MoeSum {
        /// Renormalise the selected weights to sum to one.
        norm: bool,
    },
    /// `x * sigmoid(g)` with `x` `[d, nt]` and `g` `[1, nt]`: one gate value per token
    /// (Qwen2-MoE's shared-expert gate).
    MulSigmoid,
    /// `x * sigmoid(g)` element by element, `g` of `x`'s shape (the output gate of
    /// Qwen3.5's full-attention layers).
    SigmoidGate,
    /// From each row, the values `[start, start + len)` of every block of `period`
    /// values, blocks in order: `[(row / period) * len, nt]` (a strided split, e.g. the
    /// query and gate halves interleaved per head by one projection).
    Slice {
        /// Block length; divides the row.
        period: usize,
        /// First value kept in each block.
        start: usize,
        /// Values kept per block, `start + len <= period`.
        len: usize,
    },
    /// Causal depthwise convolution over the layer's per-slot window of earlier inputs
    /// (ggml's `ssm_conv` with its state update): sources `[x, positions, slots]`, `x`
    /// `[channels, nt]`; see [`crate::RecurrentMeta`]. Reads and rewrites the window in
    /// the layer's recurrent state region; the payload carries only the layer.
    SsmConv {
        /// Recurrent layer index, the only payload.
        layer: usize,
    },
    /// The gated delta-rule recurrence of a Gated DeltaNet layer, one token after the
    /// other, with its q/k L2 normalisation and softplus/sigmoid gates: sources
    /// `[qkv, alpha, beta, positions, slots]`; see [`crate::RecurrentMeta`]. Reads and
    /// rewrites the per-slot state matrices in the layer's region.
    DeltaNet {
        /// Recurrent layer index, the only payload.
        layer: usize,
    },
}

impl Op {
    /// Stable snake-case name (exporters, traces, capability tables).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Scale(_) => "scale",
            Op::Silu => "silu",
            Op::Gelu => "gelu",
            Op::SoftCap(_) => "softcap",
            Op::Softmax { .. } => "softmax",
            Op::RmsNorm { .. } => "rms_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::QkNorm { .. } => "qk_norm",
            Op::MatMul { .. } => "matmul",
            Op::GetRows => "get_rows",
            Op::RoPE { .. } => "rope",
            Op::Attn { .. } => "attn",
            Op::KvcacheStore { .. } => "kvcache_store",
            Op::KvcacheLoad { .. } => "kvcache_load",
            Op::View { .. } => "view",
            Op::Reshape { .. } => "reshape",
            Op::Permute { .. } => "permute",
            Op::SwiGLU => "swiglu",
            Op::GeGLU => "geglu",
            Op::BatchMatMul => "batch_matmul",
            Op::FusedQKV { .. } => "fused_qkv",
            Op::QkvBiasRopeStore { .. } => "qkv_bias_rope_store",
            Op::FusedFFN => "fused_ffn",
            Op::FusedQkvNorm { .. } => "fused_qkv_norm",
            Op::TopK { .. } => "top_k",
            Op::MulMatId => "mul_mat_id",
            Op::MulMatIdSwiGLU => "mul_mat_id_swiglu",
            Op::MoeSum { .. } => "moe_sum",
            Op::MulSigmoid => "mul_sigmoid",
            Op::SigmoidGate => "sigmoid_gate",
            Op::Slice { .. } => "slice",
            Op::SsmConv { .. } => "ssm_conv",
            Op::DeltaNet { .. } => "delta_net",
        }
    }

    /// The KV layer this op writes or views directly through its payload (for the
    /// recurrent ops, the layer whose state region they update: it reaches the kernel
    /// as the region pair, as KV does).
    pub fn kv_layer(&self) -> Option<usize> {
        match self {
            Op::SsmConv { layer } | Op::DeltaNet { layer } => Some(*layer),
            Op::KvcacheStore { layer }
            | Op::KvcacheLoad { layer }
            | Op::FusedQKV { layer }
            | Op::QkvBiasRopeStore { layer }
            | Op::FusedQkvNorm { layer } => Some(*layer),
            _ => None,
        }
    }
}

/// One node of the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct CNode {
    /// Position in `ComputeGraph::nodes`.
    pub id: NodeId,
    /// Diagnostic name; input names are how hosts fill them.
    pub name: String,
    /// What the node computes.
    pub op: Op,
    /// Sources, all with smaller ids (invariant 5).
    pub src: Vec<NodeId>,
    /// Output shape `[d, nt, 1, 1]`-style.
    pub out_shape: [usize; 4],
    /// Output element type.
    pub out_dtype: DType,
    /// Decided by the scheduler; `None` until then.
    pub backend: Option<Backend>,
    /// Op-specific metadata.
    pub meta: NodeMeta,
}

impl CNode {
    /// Number of output elements.
    pub fn n_elements(&self) -> usize {
        self.out_shape.iter().product()
    }

    /// The KV layer this node touches, including attention through `AttnMeta.layer`.
    pub fn kv_layer(&self) -> Option<usize> {
        match (&self.op, &self.meta) {
            (Op::Attn { .. }, NodeMeta::Attn(m)) => Some(m.layer),
            _ => self.op.kv_layer(),
        }
    }
}

/// A whole forward pass as data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ComputeGraph {
    /// Nodes in build order (a valid topological order).
    pub nodes: Vec<CNode>,
    /// Input node ids (all `Op::Input`).
    pub inputs: Vec<NodeId>,
    /// Output node ids, never freed by liveness.
    pub outputs: Vec<NodeId>,
    /// Reuse-cache key, assigned by `GraphCache::replace_graph` (0 = never cached).
    pub uid: u64,
    /// Nodes orphaned by fusion: no buffer, never executed. Missing entries mean live.
    pub dead: Vec<bool>,
}

impl ComputeGraph {
    /// Whether fusion orphaned `id`.
    pub fn is_dead(&self, id: NodeId) -> bool {
        self.dead.get(id).copied().unwrap_or(false)
    }

    /// Marks `id` dead (grows the dead set as needed).
    pub fn mark_dead(&mut self, id: NodeId) {
        if self.dead.len() < self.nodes.len() {
            self.dead.resize(self.nodes.len(), false);
        }
        if let Some(d) = self.dead.get_mut(id) {
            *d = true;
        }
    }

    /// Number of live nodes.
    pub fn live_count(&self) -> usize {
        (0..self.nodes.len()).filter(|&i| !self.is_dead(i)).count()
    }

    /// The input node called `name`.
    pub fn input_by_name(&self, name: &str) -> Option<NodeId> {
        self.inputs
            .iter()
            .copied()
            .find(|&i| self.nodes.get(i).is_some_and(|n| n.name == name))
    }

    /// Number of live consumers of every node.
    pub fn consumer_counts(&self) -> Vec<usize> {
        let mut c = vec![0usize; self.nodes.len()];
        for n in self.nodes.iter().filter(|n| !self.is_dead(n.id)) {
            for &s in &n.src {
                if let Some(x) = c.get_mut(s) {
                    *x += 1;
                }
            }
        }
        c
    }

    /// Output rows of the first matmul, a token-count hint for device capture.
    pub fn capture_nt_hint(&self) -> Option<usize> {
        self.nodes
            .iter()
            .find(|n| matches!(n.op, Op::MatMul { .. }))
            .map(|n| n.out_shape[1])
    }

    /// Kahn topological order, for validation only: execution and liveness use build
    /// order, because Kahn may hoist source-less nodes (deviation 22).
    pub fn topo_order(&self) -> Result<Vec<NodeId>, GraphError> {
        let n = self.nodes.len();
        let mut indeg = vec![0usize; n];
        let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); n];
        for node in &self.nodes {
            for &s in &node.src {
                if s >= n {
                    return Err(GraphError::BadSource {
                        node: node.id,
                        src: s,
                    });
                }
                indeg[node.id] += 1;
                users[s].push(node.id);
            }
        }
        let mut q: VecDeque<NodeId> = (0..n).filter(|&i| indeg[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = q.pop_front() {
            order.push(i);
            for &u in &users[i] {
                indeg[u] -= 1;
                if indeg[u] == 0 {
                    q.push_back(u);
                }
            }
        }
        if order.len() != n {
            return Err(GraphError::Cycle);
        }
        Ok(order)
    }

    /// Checks the structural contract: ids equal positions, sources precede consumers
    /// (invariant 5), inputs are `Op::Input`, outputs exist, and the graph is acyclic.
    pub fn validate(&self) -> Result<(), GraphError> {
        for (i, node) in self.nodes.iter().enumerate() {
            if node.id != i {
                return Err(GraphError::BadId {
                    position: i,
                    id: node.id,
                });
            }
            if let Some(&s) = node.src.iter().find(|&&s| s >= i) {
                return Err(GraphError::BadSource { node: i, src: s });
            }
        }
        for &i in &self.inputs {
            match self.nodes.get(i) {
                Some(n) if n.op == Op::Input => {}
                _ => return Err(GraphError::BadInput(i)),
            }
        }
        if let Some(&o) = self.outputs.iter().find(|&&o| o >= self.nodes.len()) {
            return Err(GraphError::BadOutput(o));
        }
        self.topo_order().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: NodeId, op: Op, src: Vec<NodeId>) -> CNode {
        CNode {
            id,
            name: format!("n{id}"),
            op,
            src,
            out_shape: [4, 1, 1, 1],
            out_dtype: DType::F32,
            backend: None,
            meta: NodeMeta::None,
        }
    }

    #[test]
    fn dtype_sizes() {
        assert_eq!(DType::F32.size(), 4);
        assert_eq!(DType::F16.size(), 2);
        assert_eq!(DType::I32.size(), 4);
        assert_eq!(DType::Q8_0.size(), 34);
        assert_eq!(DType::Q8_0.block_elems(), 32);
        assert_eq!(DType::from_name("q8_0"), Some(DType::Q8_0));
    }

    #[test]
    fn kahn_hoists_sourceless_nodes_but_build_order_stays_valid() {
        let g = ComputeGraph {
            nodes: vec![
                node(0, Op::Input, vec![]),
                node(1, Op::Silu, vec![0]),
                node(2, Op::KvcacheLoad { layer: 0 }, vec![]),
                node(3, Op::Add, vec![1, 2]),
            ],
            inputs: vec![0],
            outputs: vec![3],
            ..Default::default()
        };
        g.validate().unwrap();
        // Kahn puts the source-less load before the silu built ahead of it.
        assert_eq!(g.topo_order().unwrap(), vec![0, 2, 1, 3]);
    }

    #[test]
    fn validate_rejects_forward_sources_and_cycles() {
        let mut g = ComputeGraph {
            nodes: vec![node(0, Op::Input, vec![]), node(1, Op::Silu, vec![1])],
            inputs: vec![0],
            ..Default::default()
        };
        assert!(matches!(
            g.validate(),
            Err(GraphError::BadSource { node: 1, src: 1 })
        ));
        assert!(matches!(g.topo_order(), Err(GraphError::Cycle)));
        g.nodes[1].src = vec![0];
        g.outputs = vec![7];
        assert!(matches!(g.validate(), Err(GraphError::BadOutput(7))));
    }

    #[test]
    fn backend_handles_are_ordered_by_id_and_named_by_registry() {
        assert!(Backend::CPU < Backend::METAL && Backend::METAL < Backend::CUDA);
        assert_eq!(Backend::CUDA.to_string(), "cuda");
        assert_eq!(Backend(9).to_string(), "backend#9");
    }
}
