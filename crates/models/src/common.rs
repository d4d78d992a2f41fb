//! The decoder skeleton every architecture shares (design §4.1): inputs at the head,
//! embedding, per-layer attention and FFN with residuals, the G3 tail reduction on the
//! last layer, and the lm head. An architecture supplies only its Q/K/V block, the
//! weights it loaded (optional tensors it does not have are `None`) and the optional
//! terms it turns on ([`Terms`]: Gemma's embedding scale, GeGLU, soft-caps and
//! per-layer windows, rope and scores).
//!
//! Node names follow llama.cpp's callback names with a `-{layer}` suffix
//! (`attn_norm-0`, `Qcur-0`, `ffn_out-5`, ...) so exports and traces can address them;
//! names llama.cpp reuses for successive values of one variable get a distinguishing
//! suffix here (`Qcur_rope-0`), because a trace needs one node per name.

use minfer_graph::{
    AttnMeta, AttnMode, ComputeGraph, DType, FusedFfnMeta, FusedQkvMeta, FusedQkvNormMeta,
    GraphBuilder, GraphParams, NodeId, RoPEMeta,
};

use crate::ffn::DenseFfn;
use crate::hparams::HParams;
use crate::weights::{Ffn, LayerWeights, Weights};

/// Name of the token-id input (`[nt]` I32).
pub const INPUT_TOKEN_IDS: &str = "token_ids";
/// Name of the position input (`[nt]` I32): each token's index within its own sequence,
/// which drives RoPE; without `explicit_span` it is also the causal bound and the KV row.
pub const INPUT_POSITIONS: &str = "positions";
/// Name of the tail-row input (`[n_out]` I32), present only when `n_out < nt`.
pub const INPUT_TAIL_IDS: &str = "tail_ids";
/// Name of the per-token key-span input (`[2, nt]` I32), present only with `explicit_span`.
pub const INPUT_SPAN: &str = "span";
/// Name of the KV-row input (`[nt]` I32): the arena row each token's K and V are written
/// to, present only with `explicit_span` (invariant 1: KV rows are data).
pub const INPUT_CELLS: &str = "cells";

/// Name of the recurrent-state slot input (`[nt]` I32) of a model with recurrent
/// layers: the state slot each token reads and advances (its sequence's; data, as KV
/// cells are). A token at position 0 starts its slot from zero state.
pub const INPUT_STATE_SLOTS: &str = "state_slots";

/// Widest FFN for which the decode gate|up concat pays off (design §4.2, measured).
pub const FUSED_FFN_MAX_NF: usize = 16384;

/// The optional terms of the skeleton an architecture turns on; `Terms::default()` (all
/// off) is the Qwen/Llama graph.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Terms {
    /// The token embeddings are multiplied by this (Gemma: `sqrt(n_embd)`).
    pub embd_scale: Option<f32>,
    /// The FFN is GELU-gated (GeGLU) rather than SiLU-gated.
    pub gelu: bool,
    /// The logits become `c * tanh(logits / c)` (Gemma 2's final soft-cap).
    pub final_softcap: Option<f32>,
    /// Per-layer attention parameters; a layer without an entry gets
    /// [`LayerAttn::plain`].
    pub layers: Vec<LayerAttn>,
}

impl Terms {
    /// Layer `il`'s attention parameters.
    pub fn layer(&self, il: usize, hp: &HParams) -> LayerAttn {
        self.layers
            .get(il)
            .cloned()
            .unwrap_or_else(|| LayerAttn::plain(hp))
    }
}

/// One layer's attention parameters where an architecture varies them per layer
/// (Gemma's local and global layers).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LayerAttn {
    /// Sliding window in rows; `None`: the whole causal range.
    pub window: Option<usize>,
    /// Score soft-cap.
    pub softcap: Option<f32>,
    /// Score scale.
    pub scale: f32,
    /// Rope theta of the layer.
    pub rope_base: f32,
    /// Rope linear position scale of the layer.
    pub rope_scale: f32,
}

impl LayerAttn {
    /// A global layer with the model's rope and `1/sqrt(head_dim)` scores.
    pub fn plain(hp: &HParams) -> Self {
        LayerAttn {
            window: None,
            softcap: None,
            scale: 1.0 / (hp.head_dim as f32).sqrt(),
            rope_base: hp.rope_freq_base,
            rope_scale: hp.rope_freq_scale,
        }
    }
}

/// Name under which a backend registers layer `il`'s q|k|v concatenation.
pub fn qkv_concat_name(il: usize) -> String {
    format!("blk.{il}.attn_qkv.weight")
}

/// Name under which a backend registers layer `il`'s gate|up concatenation.
pub fn gate_up_concat_name(il: usize) -> String {
    format!("blk.{il}.ffn_gate_up.weight")
}

/// What an architecture's Q/K/V block sees of the layer being built.
pub(crate) struct LayerCx<'a> {
    pub il: usize,
    pub hp: &'a HParams,
    pub lw: &'a LayerWeights,
    /// The layer's attention parameters (its rope base and scale among them).
    pub attn: LayerAttn,
    /// Rope frequency factors of the model, when it has them.
    pub rope_freqs: Option<&'a minfer_graph::WeightRef>,
    pub pos: NodeId,
    /// KV rows the layer's store writes: `cells` with explicit spans, else `pos`.
    pub cells: NodeId,
    /// Physical KV rows of the layer: the context, or its ring's rows.
    pub n_ctx: usize,
    /// The layer's KV ring (a sliding-window layer under [`minfer_graph::CParams::ring`]).
    pub ring: Option<minfer_graph::KvRing>,
    /// Decode QKV fusion is allowed by the params (GPU, nt == 1, flag on); the
    /// architecture still checks that its weights can be concatenated.
    pub fuse_qkv: bool,
    /// The params allow the decode FFN fusion (`CParams::fuse_ffn`).
    pub fuse_ffn: bool,
}

impl LayerCx<'_> {
    /// `{name}-{il}`.
    pub fn name(&self, name: &str) -> String {
        format!("{name}-{}", self.il)
    }

    /// Rope parameters for a tensor of `n_head` heads.
    pub fn rope_meta(&self, n_head: usize) -> RoPEMeta {
        RoPEMeta {
            n_dims: self.hp.head_dim,
            freq_base: self.attn.rope_base,
            freq_scale: self.attn.rope_scale,
            n_head,
            hd: self.hp.head_dim,
            style: self.hp.rope_style,
            freq_factors: self.rope_freqs.map(|w| w.name.clone()),
            yarn: self.hp.rope_yarn,
        }
    }

    /// Elements of one KV region: `n_kv_embd * n_ctx`.
    pub fn kv_elems(&self) -> usize {
        self.hp.n_kv_embd() * self.n_ctx
    }
}

/// An architecture's Q/K/V block: from the normed input to the q node attention reads,
/// with K and V stored into the layer's KV regions along the way.
pub(crate) type QkvBlock = fn(&mut GraphBuilder, &LayerCx<'_>, NodeId) -> NodeId;

/// The inputs every decoder graph opens with, in this order: token ids, positions, the
/// tail rows (only when `n_out < nt`), and with `explicit_span` the key spans and the
/// KV cells.
pub(crate) struct Inputs {
    pub ids: NodeId,
    pub pos: NodeId,
    pub tail: Option<NodeId>,
    pub span: Option<NodeId>,
    pub cells: Option<NodeId>,
}

/// Appends [`Inputs`] for `nt` tokens and `n_out` output rows.
pub(crate) fn inputs(b: &mut GraphBuilder, nt: usize, n_out: usize, explicit_span: bool) -> Inputs {
    let ids = b.input(INPUT_TOKEN_IDS, [nt, 1, 1, 1], DType::I32);
    let pos = b.input(INPUT_POSITIONS, [nt, 1, 1, 1], DType::I32);
    let tail = (n_out < nt).then(|| b.input(INPUT_TAIL_IDS, [n_out, 1, 1, 1], DType::I32));
    let span = explicit_span.then(|| b.input(INPUT_SPAN, [2, nt, 1, 1], DType::I32));
    let cells = explicit_span.then(|| b.input(INPUT_CELLS, [nt, 1, 1, 1], DType::I32));
    Inputs {
        ids,
        pos,
        tail,
        span,
        cells,
    }
}

/// The unfused tail of every Q/K/V block: rope q and k at `positions`, then store k and v
/// at the layer's KV rows (`cx.cells`).
pub(crate) fn rope_and_store(
    b: &mut GraphBuilder,
    cx: &LayerCx<'_>,
    q: NodeId,
    k: NodeId,
    v: NodeId,
) -> NodeId {
    let style = cx.hp.rope_style;
    let q = b.rope(q, cx.pos, style, cx.rope_meta(cx.hp.n_head));
    b.set_name(q, &cx.name("Qcur_rope"));
    let k = b.rope(k, cx.pos, style, cx.rope_meta(cx.hp.n_head_kv));
    b.set_name(k, &cx.name("Kcur_rope"));
    let st = b.kvcache_store(cx.il, k, v, cx.cells, cx.n_ctx, cx.ring);
    b.set_name(st, &cx.name("kv_store"));
    q
}

/// A matmul named `{name}-{il}`.
pub(crate) fn named_matmul(
    b: &mut GraphBuilder,
    cx: &LayerCx<'_>,
    name: &str,
    x: NodeId,
    w: &minfer_graph::WeightRef,
    bias: Option<&minfer_graph::WeightRef>,
) -> NodeId {
    let id = b.matmul(x, w, bias);
    b.set_name(id, &cx.name(name));
    id
}

/// Builds the whole graph for `p` (design §4.1). Callers validate params with
/// [`crate::params::check`]; here `n_tokens` is taken as at least 1 and `n_out` is
/// clamped into `1..=n_tokens` so a bad value cannot produce an inconsistent graph.
pub(crate) fn build(
    hp: &HParams,
    w: &Weights,
    terms: &Terms,
    p: &GraphParams,
    qkv: QkvBlock,
) -> ComputeGraph {
    debug_assert!(
        crate::params::check(p).is_ok(),
        "invalid graph params {p:?}"
    );
    let nt = p.n_tokens.max(1);
    let n_out = p.n_out.clamp(1, nt);
    let cp = &p.cparams;
    // The decode fusions are one-token shapes; `fuse_qkv` / `fuse_ffn` say whether the
    // participating backends execute them (GPU or host, see `BackendCaps`).
    let decode_fusion = nt == 1;
    let mode = if cp.flash_attn {
        AttnMode::Flash
    } else {
        AttnMode::Gqa
    };

    let mut b = GraphBuilder::new();
    // Every input sits at the head: an input in mid-graph would cut a device run in two.
    let Inputs {
        ids,
        pos,
        tail,
        span,
        cells,
    } = inputs(&mut b, nt, n_out, cp.explicit_span);

    let mut h = b.embedding(ids, &w.tok_embd);
    b.set_name(h, "inp_embd");
    if let Some(s) = terms.embd_scale {
        h = b.scale(h, s);
        b.set_name(h, "inp_scaled");
    }

    for (il, lw) in w.layers.iter().enumerate() {
        let attn = terms.layer(il, hp);
        // A sliding-window layer keeps only the rows its window can read.
        let ring = attn.window.zip(cp.ring).and_then(|(w, r)| r.ring(w));
        let cx = LayerCx {
            il,
            hp,
            lw,
            attn,
            rope_freqs: w.rope_freqs.as_ref(),
            pos,
            cells: cells.unwrap_or(pos),
            n_ctx: ring.map_or(cp.n_ctx, |r| r.physical_rows(cp.n_ctx)),
            ring,
            // The fused QKV kernels store K/V at `positions` of unringed regions, so
            // explicit KV rows and rings keep them off; they have no frequency-factor
            // term, so Llama 3 scaling keeps them off too.
            fuse_qkv: decode_fusion
                && cp.fuse_qkv
                && !cp.explicit_span
                && ring.is_none()
                && w.rope_freqs.is_none(),
            fuse_ffn: cp.fuse_ffn,
        };
        let normed = b.rms_norm(h, Some(&lw.attn_norm), hp.rms_eps);
        b.set_name(normed, &cx.name("attn_norm"));
        let q = qkv(&mut b, &cx, normed);
        let kv = b.kvcache_load(il, hp.n_kv_embd(), cx.n_ctx, hp.n_head_kv, cx.ring);
        b.set_name(kv, &cx.name("kv_load"));
        let meta = AttnMeta {
            layer: il,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            hd: hp.head_dim,
            scale: cx.attn.scale,
            n_ctx: cx.n_ctx,
            window: cx.attn.window,
            softcap: cx.attn.softcap,
            ring: cx.ring,
            sinks: lw.sinks.as_ref().map(|w| w.name.clone()),
            causal: true,
        };
        let attn = b.attn(q, kv, pos, span, mode, meta);
        b.set_name(attn, &cx.name("kqv_out"));
        let wo = named_matmul(&mut b, &cx, "attn_out", attn, &lw.wo, lw.wo_bias.as_ref());

        // G3: from the last layer's residual on, only the n_out tail rows are computed.
        let last = il + 1 == w.layers.len();
        let (res, cur) = match tail.filter(|_| last) {
            Some(t) => {
                let shape = [hp.n_embd, n_out, 1, 1];
                let cur = b.get_rows(wo, t, shape);
                b.set_name(cur, &cx.name("attn_out_rows"));
                let res = b.get_rows(h, t, shape);
                b.set_name(res, &cx.name("inp_sa_rows"));
                (res, cur)
            }
            None => (h, wo),
        };
        let post = lw.post_norms.as_ref();
        let cur = match post {
            Some([attn_post, _]) => {
                let n = b.rms_norm(cur, Some(attn_post), hp.rms_eps);
                b.set_name(n, &cx.name("attn_post_norm"));
                n
            }
            None => cur,
        };
        h = b.add(res, cur);
        b.set_name(h, &cx.name("ffn_inp"));

        let normed = b.rms_norm(h, Some(&lw.ffn_norm), hp.rms_eps);
        b.set_name(normed, &cx.name("ffn_norm"));
        let mut down = match &lw.ffn {
            Ffn::Dense(d) => dense_ffn(&mut b, &cx, terms, normed, d, decode_fusion),
            Ffn::Moe(m) => crate::moe::build_ffn(&mut b, il, normed, m),
        };
        if let Some([_, ffn_post]) = post {
            down = b.rms_norm(down, Some(ffn_post), hp.rms_eps);
            b.set_name(down, &cx.name("ffn_post_norm"));
        }
        h = b.add(h, down);
        b.set_name(h, &cx.name("l_out"));
    }

    let normed = b.rms_norm(h, Some(&w.output_norm), hp.rms_eps);
    b.set_name(normed, "result_norm");
    if cp.embeddings {
        // The rows embeddings pool: the hidden state the output head would read.
        b.output(normed);
        return b.build();
    }
    let mut logits = b.matmul(normed, &w.output, None);
    if let Some(c) = terms.final_softcap {
        b.set_name(logits, "result_logits");
        logits = b.softcap(logits, c);
    }
    b.set_name(logits, "result_output");
    b.output(logits);
    b.build()
}

/// A dense gated FFN from the normed input to its down projection: decode with the FFN
/// fusion allowed and a concatenable gate|up becomes one `fused_ffn`.
fn dense_ffn(
    b: &mut GraphBuilder,
    cx: &LayerCx<'_>,
    terms: &Terms,
    normed: NodeId,
    d: &DenseFfn,
    decode_fusion: bool,
) -> NodeId {
    let (hp, cp_fuse) = (cx.hp, cx.fuse_ffn);
    // The fused FFN's epilogue is SwiGLU: a GELU-gated FFN stays unfused.
    let fuse_ffn = decode_fusion
        && !terms.gelu
        && cp_fuse
        && d.gate_up_concat_feasible()
        && hp.n_ff <= FUSED_FFN_MAX_NF;
    let ffn = if fuse_ffn {
        let meta = FusedFfnMeta {
            gate_weight: d.gate.name.clone(),
            up_weight: d.up.name.clone(),
            concat_weight: gate_up_concat_name(cx.il),
            wtype: d.gate.wtype,
            n_embd: hp.n_embd,
            nf: hp.n_ff,
        };
        let f = b.fused_ffn(normed, meta);
        b.set_name(f, &cx.name("ffn_fused"));
        f
    } else {
        let g = named_matmul(b, cx, "ffn_gate", normed, &d.gate, None);
        let u = named_matmul(b, cx, "ffn_up", normed, &d.up, None);
        let s = if terms.gelu {
            let s = b.gelu(g);
            b.set_name(s, &cx.name("ffn_gelu"));
            s
        } else {
            let s = b.silu(g);
            b.set_name(s, &cx.name("ffn_silu"));
            s
        };
        // Mul(act(gate), up): the FusionPass folds it into SwiGLU or GeGLU.
        let m = b.mul(s, u);
        b.set_name(m, &cx.name("ffn_gate_par"));
        m
    };
    // The fused buffer is [2*nf, nt]; the down matmul reads its first nf rows.
    named_matmul(b, cx, "ffn_out", ffn, &d.down, None)
}

/// Q/K/V for one layer of the architectures without a per-head norm (design §4.2). Decode with QKV fusion allowed and a concatenable q|k|v becomes
/// one `fused_qkv` (with the biases when the file has them); otherwise three matmuls,
/// rope on q and k, and the KV store.
pub(crate) fn qkv_block(b: &mut GraphBuilder, cx: &LayerCx<'_>, normed: NodeId) -> NodeId {
    let lw = cx.lw;
    let hp = cx.hp;
    let bias = lw.bias.as_ref();
    if cx.fuse_qkv && lw.qkv_concat_feasible() {
        let meta = FusedQkvMeta {
            qkv_weight: qkv_concat_name(cx.il),
            wtype: lw.wq.wtype,
            n_embd: hp.n_embd,
            nqt: hp.n_q_embd(),
            nkt: hp.n_kv_embd(),
            q_bias: bias.map(|[q, _, _]| q.name.clone()),
            k_bias: bias.map(|[_, k, _]| k.name.clone()),
            v_bias: bias.map(|[_, _, v]| v.name.clone()),
            rope: cx.rope_meta(hp.n_head),
            n_ctx: cx.n_ctx,
            kv_elems: cx.kv_elems(),
        };
        let f = b.fused_qkv(normed, cx.pos, cx.il, meta);
        b.set_name(f, &cx.name("qkv_fused"));
        return f;
    }
    let [bq, bk, bv] = match bias {
        Some([q, k, v]) => [Some(q), Some(k), Some(v)],
        None => [None; 3],
    };
    let q = named_matmul(b, cx, "Qcur", normed, &lw.wq, bq);
    let k = named_matmul(b, cx, "Kcur", normed, &lw.wk, bk);
    let v = named_matmul(b, cx, "Vcur", normed, &lw.wv, bv);
    rope_and_store(b, cx, q, k, v)
}

/// Q/K/V for one layer of the architectures with a per-head q/k norm (Qwen3, Gemma 3).
/// Decode with QKV fusion allowed and a concatenable q|k|v becomes
/// one `fused_qkv_norm` (concat matmul, per-head q/k norm, rope, KV store); otherwise
/// three bias-less matmuls, `qk_norm` on q and k, rope, and the KV store.
pub(crate) fn qkv_norm_block(b: &mut GraphBuilder, cx: &LayerCx<'_>, normed: NodeId) -> NodeId {
    let lw = cx.lw;
    let hp = cx.hp;
    let norms = lw.qk_norm.as_ref();
    if let Some([qn, kn]) = norms.filter(|_| cx.fuse_qkv && lw.qkv_concat_feasible()) {
        let meta = FusedQkvNormMeta {
            qkv_weight: qkv_concat_name(cx.il),
            wtype: lw.wq.wtype,
            n_embd: hp.n_embd,
            nqt: hp.n_q_embd(),
            nkt: hp.n_kv_embd(),
            q_norm: qn.name.clone(),
            k_norm: kn.name.clone(),
            eps: hp.rms_eps,
            rope: cx.rope_meta(hp.n_head),
            n_ctx: cx.n_ctx,
            kv_elems: cx.kv_elems(),
        };
        let f = b.fused_qkv_norm(normed, cx.pos, cx.il, meta);
        b.set_name(f, &cx.name("qkv_fused"));
        return f;
    }
    let mut q = named_matmul(b, cx, "Qcur", normed, &lw.wq, None);
    let mut k = named_matmul(b, cx, "Kcur", normed, &lw.wk, None);
    let v = named_matmul(b, cx, "Vcur", normed, &lw.wv, None);
    // The loader always sets the norms; the graph follows the weights it was given.
    if let Some([qn, kn]) = norms {
        q = b.qk_norm(q, Some(qn), hp.head_dim, hp.n_head, hp.rms_eps);
        b.set_name(q, &cx.name("Qcur_normed"));
        k = b.qk_norm(k, Some(kn), hp.head_dim, hp.n_head_kv, hp.rms_eps);
        b.set_name(k, &cx.name("Kcur_normed"));
    }
    rope_and_store(b, cx, q, k, v)
}
