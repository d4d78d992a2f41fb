//! The append-only graph factory (§3.2).
//!
//! The builder assigns ids, records shapes, dtypes and metadata, and wires sources.
//! It never computes and never allocates. Because a node can only name nodes that
//! already exist, node-id order is a valid topological order (invariant 5).
//!
//! Contract: passing a source id that was not returned by this builder is a
//! programmer error in model code. Debug builds assert it at the call; release
//! builds record the node anyway and `ComputeGraph::validate` (run by
//! `GraphAllocator::alloc_graph`) rejects the graph with a typed error.

use crate::ir::*;
use crate::kv_ring::KvRing;

/// Builds one `ComputeGraph` in execution order.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    nodes: Vec<CNode>,
    inputs: Vec<NodeId>,
    outputs: Vec<NodeId>,
}

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of nodes so far.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node was added yet.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Output shape of an existing node.
    pub fn shape(&self, id: NodeId) -> [usize; 4] {
        debug_assert!(id < self.nodes.len(), "node {id} does not exist");
        self.nodes.get(id).map_or([0; 4], |n| n.out_shape)
    }

    fn nt(&self, id: NodeId) -> usize {
        self.shape(id)[1]
    }

    /// Renames a node (models name the nodes they want to find in exports and traces).
    pub fn set_name(&mut self, id: NodeId, name: &str) {
        if let Some(n) = self.nodes.get_mut(id) {
            n.name = name.to_string();
        }
    }

    /// Pins a node to a backend; the scheduler keeps explicit assignments.
    pub fn set_backend(&mut self, id: NodeId, backend: Backend) {
        if let Some(n) = self.nodes.get_mut(id) {
            n.backend = Some(backend);
        }
    }

    /// Appends a raw node; every other constructor goes through here.
    pub fn node(
        &mut self,
        name: &str,
        op: Op,
        src: &[NodeId],
        out_shape: [usize; 4],
        out_dtype: DType,
        meta: NodeMeta,
    ) -> NodeId {
        let id = self.nodes.len();
        debug_assert!(
            src.iter().all(|&s| s < id),
            "node '{name}' reads a node that is not built yet: {src:?} (next id {id})"
        );
        let name = if name.is_empty() {
            format!("{}_{id}", op.name())
        } else {
            name.to_string()
        };
        self.nodes.push(CNode {
            id,
            name,
            op,
            src: src.to_vec(),
            out_shape,
            out_dtype,
            backend: None,
            meta,
        });
        id
    }

    /// A host-filled leaf.
    pub fn input(&mut self, name: &str, shape: [usize; 4], dtype: DType) -> NodeId {
        let id = self.node(name, Op::Input, &[], shape, dtype, NodeMeta::None);
        self.inputs.push(id);
        id
    }

    /// Token lookup into the table `weight` (GGUF `[n_embd, n_vocab]`): `[n_embd, nt]`.
    pub fn embedding(&mut self, ids: NodeId, weight: &WeightRef) -> NodeId {
        let n_embd = weight.shape[0];
        let nt = self.shape(ids)[0];
        let meta = NodeMeta::Embed(EmbedMeta {
            weight_name: weight.name.clone(),
            wtype: weight.wtype,
            n_embd,
        });
        self.node(
            "",
            Op::GetRows,
            &[ids],
            [n_embd, nt, 1, 1],
            DType::F32,
            meta,
        )
    }

    /// RMS norm over dim 0, optionally scaled by `weight`.
    pub fn rms_norm(&mut self, x: NodeId, weight: Option<&WeightRef>, eps: f32) -> NodeId {
        let meta = NodeMeta::Norm(NormMeta {
            weight_name: weight.map(|w| w.name.clone()),
            bias_name: None,
        });
        let shape = self.shape(x);
        self.node("", Op::RmsNorm { eps }, &[x], shape, DType::F32, meta)
    }

    /// Layer norm over dim 0 (mean removed, unit variance), then `* weight + bias`
    /// where given (BERT's norms).
    pub fn layer_norm(
        &mut self,
        x: NodeId,
        weight: Option<&WeightRef>,
        bias: Option<&WeightRef>,
        eps: f32,
    ) -> NodeId {
        let meta = NodeMeta::Norm(NormMeta {
            weight_name: weight.map(|w| w.name.clone()),
            bias_name: bias.map(|w| w.name.clone()),
        });
        let shape = self.shape(x);
        self.node("", Op::LayerNorm { eps }, &[x], shape, DType::F32, meta)
    }

    /// Per-head RMS norm: `x` is treated as `[hd, nt*nh]`, `weight` has `hd` values.
    pub fn qk_norm(
        &mut self,
        x: NodeId,
        weight: Option<&WeightRef>,
        hd: usize,
        nh: usize,
        eps: f32,
    ) -> NodeId {
        let meta = NodeMeta::Norm(NormMeta {
            weight_name: weight.map(|w| w.name.clone()),
            bias_name: None,
        });
        let shape = self.shape(x);
        self.node(
            "",
            Op::QkNorm { hd, nh, eps },
            &[x],
            shape,
            DType::F32,
            meta,
        )
    }

    /// `x @ w` (+ bias): `w` is GGUF `[in, out]`, the result `[out, nt]`.
    pub fn matmul(&mut self, x: NodeId, w: &WeightRef, bias: Option<&WeightRef>) -> NodeId {
        let meta = MatMulMeta {
            weight_name: w.name.clone(),
            in_dim: w.shape[0],
            out_dim: w.shape[1],
            wtype: w.wtype,
            bias_name: bias.map(|b| b.name.clone()),
        };
        self.matmul_meta(x, meta)
    }

    /// `matmul` for a weight known only by name (e.g. a concat registered by a backend).
    pub fn matmul_by_name(
        &mut self,
        x: NodeId,
        weight_name: &str,
        wtype: WeightType,
        out_dim: usize,
        in_dim: usize,
    ) -> NodeId {
        let meta = MatMulMeta {
            weight_name: weight_name.to_string(),
            in_dim,
            out_dim,
            wtype,
            bias_name: None,
        };
        self.matmul_meta(x, meta)
    }

    fn matmul_meta(&mut self, x: NodeId, meta: MatMulMeta) -> NodeId {
        // A fused producer may hand over a wider buffer; the matmul reads rows 0..in_dim.
        debug_assert!(
            self.shape(x)[0] >= meta.in_dim,
            "matmul '{}' needs {} input rows, node {x} has {}",
            meta.weight_name,
            meta.in_dim,
            self.shape(x)[0]
        );
        let shape = [meta.out_dim, self.nt(x), 1, 1];
        self.node(
            "",
            Op::MatMul { transpose_b: true },
            &[x],
            shape,
            DType::F32,
            NodeMeta::MatMul(meta),
        )
    }

    /// The `k` largest entries of each row of `x` (`[n, nt]`) as I32 indices `[k, nt]`
    /// (an MoE router's expert choice, [`Op::TopK`]).
    pub fn top_k(&mut self, x: NodeId, k: usize) -> NodeId {
        debug_assert!(
            k >= 1 && k <= self.shape(x)[0],
            "top_k of {k} over rows of {}",
            self.shape(x)[0]
        );
        let shape = [k, self.nt(x), 1, 1];
        self.node("", Op::TopK { k }, &[x], shape, DType::I32, NodeMeta::None)
    }

    /// Expert-routed matmul ([`Op::MulMatId`]) of `x` by the experts `ids` (I32 `[k, nt]`)
    /// select from `w`, a stacked weight of GGUF shape `[in, out, n_expert]` whose
    /// reference carries the folded shape `[in, out * n_expert]`: `[out, k * nt]`.
    pub fn mul_mat_id(&mut self, x: NodeId, ids: NodeId, w: &WeightRef, n_expert: usize) -> NodeId {
        let meta = Self::mat_id_meta(w, None, n_expert);
        let shape = self.mat_id_shape(x, ids, &meta);
        self.node(
            "",
            Op::MulMatId,
            &[x, ids],
            shape,
            DType::F32,
            NodeMeta::MatMulId(meta),
        )
    }

    /// `silu(gate_e x) * (up_e x)` per selected expert ([`Op::MulMatIdSwiGLU`]); `gate` and
    /// `up` are stacked weights as in [`Self::mul_mat_id`]: `[out, k * nt]`.
    pub fn mul_mat_id_swiglu(
        &mut self,
        x: NodeId,
        ids: NodeId,
        gate: &WeightRef,
        up: &WeightRef,
        n_expert: usize,
    ) -> NodeId {
        debug_assert_eq!(gate.shape, up.shape, "gate and up experts differ in shape");
        let meta = Self::mat_id_meta(up, Some(gate), n_expert);
        let shape = self.mat_id_shape(x, ids, &meta);
        self.node(
            "",
            Op::MulMatIdSwiGLU,
            &[x, ids],
            shape,
            DType::F32,
            NodeMeta::MatMulId(meta),
        )
    }

    fn mat_id_meta(w: &WeightRef, gate: Option<&WeightRef>, n_expert: usize) -> MatMulIdMeta {
        MatMulIdMeta {
            weight_name: w.name.clone(),
            gate_name: gate.map(|g| g.name.clone()),
            in_dim: w.shape[0],
            out_dim: w.shape[1] / n_expert.max(1),
            n_expert,
            wtype: w.wtype,
            bias_name: None,
            gate_bias_name: None,
            glu: Glu::Silu,
        }
    }

    /// Gives an expert-routed node made by [`Self::mul_mat_id`] or
    /// [`Self::mul_mat_id_swiglu`] its stacked biases (F32, GGUF `[out, n_expert]`; the
    /// gate's only on a gated node) and its gate activation (gpt-oss's experts).
    pub fn set_expert_terms(
        &mut self,
        id: NodeId,
        bias: Option<&WeightRef>,
        gate_bias: Option<&WeightRef>,
        glu: Glu,
    ) {
        if let Some(CNode {
            meta: NodeMeta::MatMulId(m),
            ..
        }) = self.nodes.get_mut(id)
        {
            debug_assert!(
                m.gate_name.is_some() || (gate_bias.is_none() && glu.is_silu()),
                "gate terms on a plain expert matmul"
            );
            m.bias_name = bias.map(|w| w.name.clone());
            m.gate_bias_name = gate_bias.map(|w| w.name.clone());
            m.glu = glu;
        }
    }

    fn mat_id_shape(&self, x: NodeId, ids: NodeId, meta: &MatMulIdMeta) -> [usize; 4] {
        let [k, nt, ..] = self.shape(ids);
        debug_assert!(
            self.shape(x)[0] == meta.in_dim && (self.nt(x) == nt || self.nt(x) == k * nt),
            "expert matmul '{}' of [{}, ..] over input {:?} and ids {:?}",
            meta.weight_name,
            meta.in_dim,
            self.shape(x),
            self.shape(ids)
        );
        [meta.out_dim, k * nt, 1, 1]
    }

    /// The experts' weighted sum ([`Op::MoeSum`]) of `h` (`[d, k * nt]`) by the router's
    /// gate values `probs` (`[n_expert, nt]`) at the choice `ids` (`[k, nt]`): `[d, nt]`.
    pub fn moe_sum(&mut self, h: NodeId, probs: NodeId, ids: NodeId, norm: bool) -> NodeId {
        let shape = [self.shape(h)[0], self.nt(ids), 1, 1];
        self.node(
            "",
            Op::MoeSum { norm },
            &[h, probs, ids],
            shape,
            DType::F32,
            NodeMeta::None,
        )
    }

    /// `x * sigmoid(g)`, `g` one value per token ([`Op::MulSigmoid`]); shape of `x`.
    pub fn mul_sigmoid(&mut self, x: NodeId, g: NodeId) -> NodeId {
        self.binary(Op::MulSigmoid, x, g)
    }

    /// `x * sigmoid(g)` element by element ([`Op::SigmoidGate`]); shape of `x`.
    pub fn sigmoid_gate(&mut self, x: NodeId, g: NodeId) -> NodeId {
        self.binary(Op::SigmoidGate, x, g)
    }

    /// The values `[start, start + len)` of every block of `period` values of each row
    /// of `x` ([`Op::Slice`]): `[(d / period) * len, nt]`.
    pub fn slice(&mut self, x: NodeId, period: usize, start: usize, len: usize) -> NodeId {
        let [d, nt, ..] = self.shape(x);
        let out = [d / period.max(1) * len, nt, 1, 1];
        let op = Op::Slice { period, start, len };
        self.node("", op, &[x], out, DType::F32, NodeMeta::None)
    }

    /// The causal convolution of `x` (`[channels, nt]`) over the layer's conv windows
    /// ([`Op::SsmConv`]), each token in the slot the I32 `slots` input names, starting
    /// from zero at position 0 (`pos`); shape of `x`.
    pub fn ssm_conv(
        &mut self,
        x: NodeId,
        pos: NodeId,
        slots: NodeId,
        meta: RecurrentMeta,
    ) -> NodeId {
        let shape = self.shape(x);
        let op = Op::SsmConv { layer: meta.layer };
        self.node(
            "",
            op,
            &[x, pos, slots],
            shape,
            DType::F32,
            NodeMeta::Recurrent(meta),
        )
    }

    /// The gated delta rule over the convolved `qkv` (`[channels, nt]`), with the
    /// per-value-head `alpha` (bias added) and `beta` projections (`[h_v, nt]`), in the
    /// slots `slots` names ([`Op::DeltaNet`]): `[h_v * s_v, nt]`.
    pub fn delta_net(
        &mut self,
        qkv: NodeId,
        alpha: NodeId,
        beta: NodeId,
        pos: NodeId,
        slots: NodeId,
        meta: RecurrentMeta,
    ) -> NodeId {
        let nt = self.nt(qkv);
        let out = [meta.h_v * meta.s_v, nt, 1, 1];
        let op = Op::DeltaNet { layer: meta.layer };
        let src = [qkv, alpha, beta, pos, slots];
        self.node("", op, &src, out, DType::F32, NodeMeta::Recurrent(meta))
    }

    /// Gathers rows (token columns) of `x` selected by the I32 node `ids`.
    pub fn get_rows(&mut self, x: NodeId, ids: NodeId, out_shape: [usize; 4]) -> NodeId {
        self.node(
            "",
            Op::GetRows,
            &[x, ids],
            out_shape,
            DType::F32,
            NodeMeta::None,
        )
    }

    /// Rotary embedding of `x` at the I32 positions `pos` (with the frequency factors
    /// `meta.freq_factors` names, when set).
    pub fn rope(&mut self, x: NodeId, pos: NodeId, style: RopeStyle, meta: RoPEMeta) -> NodeId {
        let shape = self.shape(x);
        let freq_factors = meta.freq_factors.is_some();
        self.node(
            "",
            Op::RoPE {
                style,
                freq_factors,
            },
            &[x, pos],
            shape,
            DType::F32,
            NodeMeta::Rope(meta),
        )
    }

    fn unary(&mut self, op: Op, x: NodeId) -> NodeId {
        let shape = self.shape(x);
        self.node("", op, &[x], shape, DType::F32, NodeMeta::None)
    }

    fn binary(&mut self, op: Op, a: NodeId, b: NodeId) -> NodeId {
        let shape = self.shape(a);
        self.node("", op, &[a, b], shape, DType::F32, NodeMeta::None)
    }

    /// `x * sigmoid(x)`.
    pub fn silu(&mut self, x: NodeId) -> NodeId {
        self.unary(Op::Silu, x)
    }

    /// Tanh-approximated GELU (ggml's `gelu`).
    pub fn gelu(&mut self, x: NodeId) -> NodeId {
        self.unary(Op::Gelu, x)
    }

    /// `c * tanh(x / c)`.
    pub fn softcap(&mut self, x: NodeId, c: f32) -> NodeId {
        self.unary(Op::SoftCap(c), x)
    }

    /// `tanh(x)`: the soft-cap with `c = 1` (exact: `x / 1` and `1 * t` round to
    /// themselves), so every backend that runs [`Op::SoftCap`] runs it.
    pub fn tanh(&mut self, x: NodeId) -> NodeId {
        self.softcap(x, 1.0)
    }

    /// `a + b` (b may be a single row broadcast over tokens); shape of `a`.
    pub fn add(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.binary(Op::Add, a, b)
    }

    /// `a * b` (b may be a single row broadcast over tokens); shape of `a`.
    pub fn mul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.binary(Op::Mul, a, b)
    }

    /// `x * s`.
    pub fn scale(&mut self, x: NodeId, s: f32) -> NodeId {
        self.unary(Op::Scale(s), x)
    }

    /// Softmax along `dim`.
    pub fn softmax(&mut self, x: NodeId, dim: usize) -> NodeId {
        self.unary(Op::Softmax { dim }, x)
    }

    /// `silu(gate) * up`.
    pub fn swiglu(&mut self, gate: NodeId, up: NodeId) -> NodeId {
        self.binary(Op::SwiGLU, gate, up)
    }

    /// `gelu(gate) * up`.
    pub fn geglu(&mut self, gate: NodeId, up: NodeId) -> NodeId {
        self.binary(Op::GeGLU, gate, up)
    }

    /// Attention of `q` over the KV of `meta.layer`, causal-bounded by `pos`.
    ///
    /// Sources are `[q, kv, pos]`, plus `span` when given: an I32 `[2, nt]` input of
    /// per-token `[lo, hi)` key ranges for batches `pos` cannot bound. `span`'s
    /// presence sets `explicit_span`. The output is `[n_head * hd, nt]`, taken from
    /// `meta` because a fused q handle may point at a wider q|k|v buffer.
    pub fn attn(
        &mut self,
        q: NodeId,
        kv: NodeId,
        pos: NodeId,
        span: Option<NodeId>,
        mode: AttnMode,
        meta: AttnMeta,
    ) -> NodeId {
        let mut src = vec![q, kv, pos];
        src.extend(span);
        let shape = [meta.n_head * meta.hd, self.nt(q), 1, 1];
        let op = Op::Attn {
            mode,
            explicit_span: span.is_some(),
        };
        self.node("", op, &src, shape, DType::F32, NodeMeta::Attn(meta))
    }

    /// Writes `k` and `v` (`[n_kv_embd, nt]`) into rows `cells` of the layer's regions
    /// (`n_ctx` physical rows; with a `ring`, `cells` are virtual rows it maps). The op
    /// carries only the layer (invariant 1); the output is the K region view.
    pub fn kvcache_store(
        &mut self,
        layer: usize,
        k: NodeId,
        v: NodeId,
        cells: NodeId,
        n_ctx: usize,
        ring: Option<KvRing>,
    ) -> NodeId {
        let n_embd = self.shape(k)[0];
        let meta = NodeMeta::Kvcache(KvcacheMeta {
            layer,
            n_embd,
            n_ctx,
            n_head_kv: None,
            ring,
        });
        self.node(
            "",
            Op::KvcacheStore { layer },
            &[k, v, cells],
            [n_embd, n_ctx, 1, 1],
            DType::F32,
            meta,
        )
    }

    /// A source-less view of the layer's K region (`[n_embd, n_ctx]`, physical rows, laid
    /// out by `ring` when the layer has one).
    pub fn kvcache_load(
        &mut self,
        layer: usize,
        n_embd: usize,
        n_ctx: usize,
        n_head_kv: usize,
        ring: Option<KvRing>,
    ) -> NodeId {
        let meta = NodeMeta::Kvcache(KvcacheMeta {
            layer,
            n_embd,
            n_ctx,
            n_head_kv: Some(n_head_kv),
            ring,
        });
        self.node(
            "",
            Op::KvcacheLoad { layer },
            &[],
            [n_embd, n_ctx, 1, 1],
            DType::F32,
            meta,
        )
    }

    /// Marks `node` as a graph output (never freed by liveness).
    pub fn output(&mut self, node: NodeId) {
        debug_assert!(node < self.nodes.len(), "output {node} does not exist");
        if !self.outputs.contains(&node) {
            self.outputs.push(node);
        }
    }

    /// Decode QKV fusion: `[nqt + 2*nkt, nt]` (q rows first, then k, then v).
    pub fn fused_qkv(
        &mut self,
        x: NodeId,
        pos: NodeId,
        layer: usize,
        meta: FusedQkvMeta,
    ) -> NodeId {
        let shape = [meta.nqt + 2 * meta.nkt, self.nt(x), 1, 1];
        self.node(
            "",
            Op::FusedQKV { layer },
            &[x, pos],
            shape,
            DType::F32,
            NodeMeta::FusedQkv(meta),
        )
    }

    /// Mixed-quant epilogue over three matmul outputs; in place on `q` (shape of `q`).
    pub fn qkv_bias_rope_store(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        pos: NodeId,
        layer: usize,
        meta: QkvBiasRopeStoreMeta,
    ) -> NodeId {
        let shape = self.shape(q);
        self.node(
            "",
            Op::QkvBiasRopeStore { layer },
            &[q, k, v, pos],
            shape,
            DType::F32,
            NodeMeta::QkvBiasRopeStore(meta),
        )
    }

    /// Decode FFN fusion: `[2*nf, nt]`; rows `0..nf` hold the SwiGLU result.
    pub fn fused_ffn(&mut self, x: NodeId, meta: FusedFfnMeta) -> NodeId {
        let shape = [2 * meta.nf, self.nt(x), 1, 1];
        self.node(
            "",
            Op::FusedFFN,
            &[x],
            shape,
            DType::F32,
            NodeMeta::FusedFfn(meta),
        )
    }

    /// Decode Qwen3 fusion: `[nqt + 2*nkt, nt]`.
    pub fn fused_qkv_norm(
        &mut self,
        x: NodeId,
        pos: NodeId,
        layer: usize,
        meta: FusedQkvNormMeta,
    ) -> NodeId {
        let shape = [meta.nqt + 2 * meta.nkt, self.nt(x), 1, 1];
        self.node(
            "",
            Op::FusedQkvNorm { layer },
            &[x, pos],
            shape,
            DType::F32,
            NodeMeta::FusedQkvNorm(meta),
        )
    }

    /// Finishes the graph (uid 0 until a `GraphCache` assigns one).
    pub fn build(self) -> ComputeGraph {
        let n = self.nodes.len();
        ComputeGraph {
            nodes: self.nodes,
            inputs: self.inputs,
            outputs: self.outputs,
            uid: 0,
            dead: vec![false; n],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope_meta() -> RoPEMeta {
        RoPEMeta {
            n_dims: 4,
            freq_base: 10000.0,
            freq_scale: 1.0,
            n_head: 2,
            hd: 4,
            style: RopeStyle::NonInterleaved,
            freq_factors: None,
            yarn: None,
        }
    }

    #[test]
    fn shapes_follow_the_design_rules() {
        let mut b = GraphBuilder::new();
        let ids = b.input("token_ids", [3, 1, 1, 1], DType::I32);
        let pos = b.input("positions", [3, 1, 1, 1], DType::I32);
        let x = b.embedding(ids, &WeightRef::new("tok", WeightType::F32, [8, 100]));
        assert_eq!(b.shape(x), [8, 3, 1, 1]);
        let q = b.matmul(x, &WeightRef::new("wq", WeightType::Q4_K, [8, 16]), None);
        assert_eq!(b.shape(q), [16, 3, 1, 1]);
        let kv = b.kvcache_load(0, 8, 32, 2, None);
        assert_eq!(b.shape(kv), [8, 32, 1, 1]);
        let fq = b.fused_qkv(
            x,
            pos,
            0,
            FusedQkvMeta {
                qkv_weight: "wqkv".into(),
                wtype: WeightType::Q8_0,
                n_embd: 8,
                nqt: 8,
                nkt: 4,
                q_bias: None,
                k_bias: None,
                v_bias: None,
                rope: rope_meta(),
                n_ctx: 32,
                kv_elems: 128,
            },
        );
        assert_eq!(b.shape(fq), [16, 3, 1, 1]);
        let meta = AttnMeta {
            layer: 0,
            n_head: 2,
            n_head_kv: 1,
            hd: 4,
            scale: 0.5,
            n_ctx: 32,
            window: None,
            softcap: None,
            ring: None,
            sinks: None,
            causal: true,
        };
        // Output width comes from the meta, not from the wider fused q buffer.
        let a = b.attn(fq, kv, pos, None, AttnMode::Gqa, meta.clone());
        assert_eq!(b.shape(a), [8, 3, 1, 1]);
        let span = b.input("span", [2, 3, 1, 1], DType::I32);
        let a2 = b.attn(fq, kv, pos, Some(span), AttnMode::Gqa, meta);
        let ffn = b.fused_ffn(
            x,
            FusedFfnMeta {
                gate_weight: "g".into(),
                up_weight: "u".into(),
                concat_weight: "gu".into(),
                wtype: WeightType::F32,
                n_embd: 8,
                nf: 24,
            },
        );
        assert_eq!(b.shape(ffn), [48, 3, 1, 1]);
        b.output(a2);
        let g = b.build();
        assert_eq!(g.nodes[a].src, vec![fq, kv, pos]);
        assert_eq!(
            g.nodes[a2].op,
            Op::Attn {
                mode: AttnMode::Gqa,
                explicit_span: true
            }
        );
        assert_eq!(g.nodes[a2].src, vec![fq, kv, pos, span]);
        assert_eq!(g.inputs, vec![ids, pos, span]);
        assert_eq!(g.dead.len(), g.nodes.len());
        g.validate().unwrap();
    }

    #[test]
    fn kv_ops_carry_only_the_layer() {
        let mut b = GraphBuilder::new();
        let k = b.input("k", [4, 2, 1, 1], DType::F32);
        let v = b.input("v", [4, 2, 1, 1], DType::F32);
        let c = b.input("cells", [2, 1, 1, 1], DType::I32);
        let s = b.kvcache_store(5, k, v, c, 64, None);
        let g = b.build();
        assert_eq!(g.nodes[s].op, Op::KvcacheStore { layer: 5 });
        assert_eq!(g.nodes[s].out_shape, [4, 64, 1, 1]);
        assert_eq!(g.nodes[s].kv_layer(), Some(5));
    }
}
