//! BERT (`general.architecture = bert`: all-MiniLM, bge, e5): an encoder for embeddings.
//!
//! The graph, as llama.cpp builds it: token embeddings plus the token-type row of each
//! token (the `token_types` input; llama.cpp fixes every token's type at 0) plus the
//! absolute position embedding of its position, then the embedding LayerNorm; per layer
//! Q/K/V with biases, bidirectional attention over the whole sequence of the step
//! (`AttnMeta::causal` off), the output projection, the residual and the post-attention
//! LayerNorm (`attn_output_norm`), then the FFN (up, GELU, down, each with its bias), the
//! residual and the post-FFN LayerNorm (`layer_output_norm`). No final norm, no lm head:
//! the graph's one output is the hidden state of each output row (the rows embeddings
//! pool), whatever `CParams::embeddings` says; the runtime refuses generation on an
//! encoder by name. A reranker's classifier head ([`head`]) ends the graph instead when
//! `CParams::rank` asks for it.
//!
//! K and V pass through the layer's KV region as for a decoder (invariant 1: the rows are
//! data), but nothing is kept between texts: a text runs whole in one step from
//! position 0, every token reading all of the step's rows of its sequence.

use minfer_gguf::GgufFile;
use minfer_graph::{
    AttnMeta, AttnMode, ComputeGraph, DType, GraphBuilder, GraphParams, NodeId, RopeStyle,
    WeightRef,
};

mod head;

use crate::common::{inputs, Inputs};
use crate::error::ModelError;
use crate::hparams::{HParams, DEFAULT_ROPE_FREQ_BASE};
use crate::model::ModelDef;
use crate::tensors::{blk, blk_bias, matrix, vector, TOKEN_EMBD};

/// The `general.architecture` value.
pub const ARCH: &str = "bert";

/// Name of the token-type input (`[nt]` I32) of an encoder graph: each token's segment
/// (0 for every token, as llama.cpp runs BERT).
pub const INPUT_TOKEN_TYPES: &str = "token_types";

/// GGUF name of the token-type (segment) embeddings, `[n_embd, n_types]`.
const TOKEN_TYPES: &str = "token_types.weight";

/// A weight and its bias.
type Affine = (WeightRef, Option<WeightRef>);

struct Layer {
    q: Affine,
    k: Affine,
    v: Affine,
    out: Affine,
    attn_norm: [WeightRef; 2],
    up: Affine,
    down: Affine,
    out_norm: [WeightRef; 2],
}

/// A loaded BERT encoder.
pub struct Bert {
    hp: HParams,
    tok_embd: WeightRef,
    types: Option<WeightRef>,
    pos_embd: WeightRef,
    embd_norm: [WeightRef; 2],
    layers: Vec<Layer>,
    rank: Option<head::RankHead>,
}

/// Reads the hyperparameters: the shared geometry keys, `attention.layer_norm_epsilon`
/// (kept in [`HParams::rms_eps`], the model's one norm epsilon), and a refusal of a file
/// that says its attention is causal.
fn read_hparams(file: &GgufFile) -> Result<HParams, ModelError> {
    let key = |name: &str| format!("{ARCH}.{name}");
    let req = |name: &str| -> Result<usize, ModelError> {
        let k = key(name);
        match file.get_u32(&k)? as usize {
            0 => Err(bad(&k, 0, "must be at least 1")),
            v => Ok(v),
        }
    };
    let n_embd = req("embedding_length")?;
    let n_head = req("attention.head_count")?;
    if !n_embd.is_multiple_of(n_head) {
        return Err(bad(
            &key("attention.head_count"),
            n_head,
            "must divide embedding_length",
        ));
    }
    let kv_key = key("attention.head_count_kv");
    if file.get(&kv_key).is_some() && file.get_u32(&kv_key)? as usize != n_head {
        return Err(bad(
            &kv_key,
            file.get_u32(&kv_key)?,
            "must equal head_count",
        ));
    }
    let causal_key = key("attention.causal");
    match file.get(&causal_key).map(|v| v.as_bool()) {
        None | Some(Some(false)) => {}
        Some(Some(true)) => return Err(bad(&causal_key, true, "a BERT encoder attends both ways")),
        Some(None) => return Err(bad(&causal_key, "not a boolean", "must be false")),
    }
    let eps_key = key("attention.layer_norm_epsilon");
    let eps = file.get_f32(&eps_key)?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(bad(&eps_key, eps, "must be a positive number"));
    }
    Ok(HParams {
        n_layer: req("block_count")?,
        n_embd,
        n_head,
        n_head_kv: n_head,
        head_dim: n_embd / n_head,
        n_ff: req("feed_forward_length")?,
        n_vocab: crate::tensors::vocab_rows(file, n_embd)?,
        n_ctx_train: req("context_length")?,
        rms_eps: eps,
        rope_freq_base: DEFAULT_ROPE_FREQ_BASE,
        rope_freq_scale: 1.0,
        rope_yarn: None,
        rope_style: RopeStyle::Interleaved,
        moe: None,
    })
}

fn bad(key: &str, value: impl std::fmt::Display, reason: &str) -> ModelError {
    ModelError::BadHparam {
        key: key.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

/// A matrix `[in_dim, out_dim]` and its optional F32 bias of `out_dim`.
fn affine(
    file: &GgufFile,
    w: &str,
    b: &str,
    in_dim: usize,
    out_dim: usize,
) -> Result<Affine, ModelError> {
    let bias = match file.tensor(b) {
        Some(_) => Some(vector(file, b, out_dim)?),
        None => None,
    };
    Ok((matrix(file, w, in_dim, out_dim)?, bias))
}

/// A LayerNorm's weight and bias `{name}.weight` / `{name}.bias`, both required.
fn norm(file: &GgufFile, name: &str, n: usize) -> Result<[WeightRef; 2], ModelError> {
    Ok([
        vector(file, &format!("{name}.weight"), n)?,
        vector(file, &format!("{name}.bias"), n)?,
    ])
}

/// Loads a `bert` file, refusing the tensors of BERT variants its graph has no term for.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let hp = read_hparams(file)?;
    let (d, f) = (hp.n_embd, hp.n_ff);
    // Optional, as llama.cpp has it: a file without segments adds no type row.
    let types = match file.tensor(TOKEN_TYPES) {
        Some(t) => {
            let n_types = t.dims.get(1).copied().unwrap_or(1).max(1) as usize;
            Some(matrix(file, TOKEN_TYPES, d, n_types)?)
        }
        None => None,
    };
    let mut layers = Vec::with_capacity(hp.n_layer);
    for il in 0..hp.n_layer {
        for name in [
            "attn_qkv",
            "attn_q_norm",
            "attn_k_norm",
            "attn_norm_2",
            "ffn_gate",
        ] {
            if file.tensor(&blk(il, name)).is_some() {
                return Err(ModelError::UnsupportedTensor {
                    name: blk(il, name),
                    reason: "a BERT variant's tensor; the bert graph has no term for it".into(),
                });
            }
        }
        let a = |name: &str, i, o| affine(file, &blk(il, name), &blk_bias(il, name), i, o);
        layers.push(Layer {
            q: a("attn_q", d, d)?,
            k: a("attn_k", d, d)?,
            v: a("attn_v", d, d)?,
            out: a("attn_output", d, d)?,
            attn_norm: norm(file, &format!("blk.{il}.attn_output_norm"), d)?,
            up: a("ffn_up", d, f)?,
            down: a("ffn_down", f, d)?,
            out_norm: norm(file, &format!("blk.{il}.layer_output_norm"), d)?,
        });
    }
    Ok(Box::new(Bert {
        tok_embd: matrix(file, TOKEN_EMBD, d, hp.n_vocab)?,
        types,
        pos_embd: matrix(file, "position_embd.weight", d, hp.n_ctx_train)?,
        embd_norm: norm(file, "token_embd_norm", d)?,
        layers,
        rank: head::load(file, d)?,
        hp,
    }))
}

impl Bert {
    /// One layer from its input `h` to its output.
    fn layer(
        &self,
        b: &mut GraphBuilder,
        il: usize,
        h: NodeId,
        x: &Inputs,
        p: &GraphParams,
    ) -> NodeId {
        let (hp, l) = (&self.hp, &self.layers[il]);
        let n = |b: &mut GraphBuilder, id: NodeId, name: &str| {
            b.set_name(id, &format!("{name}-{il}"));
            id
        };
        let mm = |b: &mut GraphBuilder, x: NodeId, (w, bias): &Affine, name: &str| {
            let id = b.matmul(x, w, bias.as_ref());
            b.set_name(id, &format!("{name}-{il}"));
            id
        };
        let q = mm(b, h, &l.q, "Qcur");
        let k = mm(b, h, &l.k, "Kcur");
        let v = mm(b, h, &l.v, "Vcur");
        let n_ctx = p.cparams.n_ctx;
        let st = b.kvcache_store(il, k, v, x.cells.unwrap_or(x.pos), n_ctx, None);
        n(b, st, "kv_store");
        let kv = b.kvcache_load(il, hp.n_kv_embd(), n_ctx, hp.n_head_kv, None);
        n(b, kv, "kv_load");
        let meta = AttnMeta {
            layer: il,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            hd: hp.head_dim,
            scale: 1.0 / (hp.head_dim as f32).sqrt(),
            n_ctx,
            window: None,
            softcap: None,
            ring: None,
            sinks: None,
            causal: false,
        };
        let attn = b.attn(q, kv, x.pos, x.span, AttnMode::Gqa, meta);
        let attn = n(b, attn, "kqv_out");
        let attn = mm(b, attn, &l.out, "attn_out");
        let cur = b.add(attn, h);
        let cur = n(b, cur, "attn_res");
        let [w, bias] = &l.attn_norm;
        let cur = b.layer_norm(cur, Some(w), Some(bias), hp.rms_eps);
        let ffn_inp = n(b, cur, "ffn_inp");
        let up = mm(b, ffn_inp, &l.up, "ffn_up");
        let act = b.gelu(up);
        let act = n(b, act, "ffn_gelu");
        let down = mm(b, act, &l.down, "ffn_out");
        let cur = b.add(down, ffn_inp);
        let cur = n(b, cur, "ffn_res");
        let [w, bias] = &l.out_norm;
        let out = b.layer_norm(cur, Some(w), Some(bias), hp.rms_eps);
        n(b, out, "l_out")
    }
}

impl ModelDef for Bert {
    fn arch(&self) -> &'static str {
        ARCH
    }

    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build_graph(&self, p: &GraphParams) -> ComputeGraph {
        debug_assert!(
            crate::params::check(p).is_ok(),
            "invalid graph params {p:?}"
        );
        let nt = p.n_tokens.max(1);
        let n_out = p.n_out.clamp(1, nt);
        let mut b = GraphBuilder::new();
        let x = inputs(&mut b, nt, n_out, p.cparams.explicit_span);
        // Inputs sit at the head (a mid-graph input would cut a device run in two).
        let types = self
            .types
            .as_ref()
            .map(|w| (w, b.input(INPUT_TOKEN_TYPES, [nt, 1, 1, 1], DType::I32)));
        let mut h = b.embedding(x.ids, &self.tok_embd);
        b.set_name(h, "inp_tok");
        if let Some((w, ids)) = types {
            let ty = b.embedding(ids, w);
            b.set_name(ty, "inp_type");
            h = b.add(h, ty);
        }
        let pos = b.embedding(x.pos, &self.pos_embd);
        b.set_name(pos, "inp_pos_embd");
        let h = b.add(pos, h);
        b.set_name(h, "inp_embd");
        let [w, bias] = &self.embd_norm;
        let mut h = b.layer_norm(h, Some(w), Some(bias), self.hp.rms_eps);
        b.set_name(h, "inp_norm");
        for il in 0..self.layers.len() {
            h = self.layer(&mut b, il, h, &x, p);
        }
        if let Some(t) = x.tail {
            h = b.get_rows(h, t, [self.hp.n_embd, n_out, 1, 1]);
            b.set_name(h, "result_rows");
        }
        b.set_name(h, "result_embd");
        if let (true, Some(head)) = (p.cparams.rank, &self.rank) {
            h = head.build(&mut b, h);
        }
        b.output(h);
        b.build()
    }

    fn weights(&self) -> Vec<WeightRef> {
        let mut out = vec![self.tok_embd.clone()];
        out.extend(self.types.iter().cloned());
        out.push(self.pos_embd.clone());
        out.extend(self.embd_norm.iter().cloned());
        for l in &self.layers {
            for (w, bias) in [&l.q, &l.k, &l.v, &l.out, &l.up, &l.down] {
                out.push(w.clone());
                out.extend(bias.iter().cloned());
            }
            out.extend(l.attn_norm.iter().chain(&l.out_norm).cloned());
        }
        out.extend(self.rank.iter().flat_map(|r| r.weights()).cloned());
        out
    }

    /// No head: nothing is tied.
    fn tied_output(&self) -> bool {
        false
    }

    fn is_encoder(&self) -> bool {
        true
    }

    fn rank_width(&self) -> Option<usize> {
        self.rank.as_ref().map(|r| r.width())
    }
}
