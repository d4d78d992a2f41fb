//! The BERT family of encoders for embeddings: `bert` (all-MiniLM, bge, e5) and
//! `nomic-bert` (nomic-embed-text v1/v1.5, [`nomic`]), one graph with a few switches
//! ([`Variant`]), as llama.cpp builds both with one graph.
//!
//! The graph: token embeddings plus the token-type row of each token (the `token_types`
//! input; llama.cpp fixes every token's type at 0), plus — BERT only — the absolute
//! position embedding of its position, then the embedding LayerNorm; per layer Q/K/V
//! (three projections, or one fused `attn_qkv` whose rows are q|k|v; biases where the
//! file has them), for nomic-bert NeoX-style RoPE on q and k (`rope.freq_base`; it has no
//! position table), bidirectional attention over the whole sequence of the step
//! (`AttnMeta::causal` off), the output projection, the residual and the post-attention
//! LayerNorm (`attn_output_norm`), then the FFN — BERT's up, GELU, down with biases;
//! nomic-bert's `down(silu(gate) * up)` without — the residual and the post-FFN
//! LayerNorm (`layer_output_norm`). No final norm, no lm head: the graph's one output is
//! the hidden state of each output row (the rows embeddings pool), whatever
//! `CParams::embeddings` says; the runtime refuses generation on an encoder by name. A
//! BERT reranker's classifier head ([`head`]) ends the graph instead when `CParams::rank`
//! asks for it.
//!
//! K and V pass through the layer's KV region as for a decoder (invariant 1: the rows are
//! data), but nothing is kept between texts: a text runs whole in one step from
//! position 0, every token reading all of the step's rows of its sequence.

use minfer_gguf::GgufFile;
use minfer_graph::{
    ComputeGraph, DType, GraphBuilder, GraphParams, RoPEMeta, RopeStyle, WeightRef,
};

mod head;
mod layer;
pub mod nomic;
#[cfg(test)]
mod tests;

use crate::common::inputs;
use crate::error::ModelError;
use crate::hparams::{read_rope, HParams, DEFAULT_ROPE_FREQ_BASE};
use crate::model::ModelDef;
use crate::tensors::{matrix, vector, TOKEN_EMBD};
use layer::Layer;

/// The `general.architecture` value of BERT.
pub const ARCH: &str = "bert";

/// Name of the token-type input (`[nt]` I32) of an encoder graph: each token's segment
/// (0 for every token, as llama.cpp runs BERT).
pub const INPUT_TOKEN_TYPES: &str = "token_types";

/// GGUF name of the token-type (segment) embeddings, `[n_embd, n_types]`.
const TOKEN_TYPES: &str = "token_types.weight";

/// GGUF name of BERT's absolute position table, `[n_embd, context_length]`.
const POSITION_EMBD: &str = "position_embd.weight";

/// A weight and its bias.
type Affine = (WeightRef, Option<WeightRef>);

/// The member of the family a file is: what its graph adds to or swaps in BERT's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// `bert`: a position table, a GELU FFN with biases, a classifier head if present.
    Bert,
    /// `nomic-bert`: RoPE instead of a position table, a SwiGLU FFN without biases.
    Nomic,
}

impl Variant {
    fn arch(self) -> &'static str {
        match self {
            Variant::Bert => ARCH,
            Variant::Nomic => nomic::ARCH,
        }
    }
}

/// How a token's position enters the graph.
enum Positions {
    /// BERT: the row of the position table is added to the input.
    Table(WeightRef),
    /// nomic-bert: q and k are rotated.
    Rope(RoPEMeta),
}

/// A loaded encoder of the BERT family.
pub struct Bert {
    variant: Variant,
    hp: HParams,
    tok_embd: WeightRef,
    types: Option<WeightRef>,
    positions: Positions,
    embd_norm: [WeightRef; 2],
    layers: Vec<Layer>,
    rank: Option<head::RankHead>,
}

/// Reads the hyperparameters: the shared geometry keys, `attention.layer_norm_epsilon`
/// (kept in [`HParams::rms_eps`], the model's one norm epsilon), a refusal of a file
/// that says its attention is causal and, for nomic-bert, the rope keys.
fn read_hparams(file: &GgufFile, variant: Variant) -> Result<HParams, ModelError> {
    let arch = variant.arch();
    let key = |name: &str| format!("{arch}.{name}");
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
        Some(Some(true)) => {
            return Err(bad(
                &causal_key,
                true,
                "a BERT-family encoder attends both ways",
            ))
        }
        Some(None) => return Err(bad(&causal_key, "not a boolean", "must be false")),
    }
    let eps_key = key("attention.layer_norm_epsilon");
    let eps = file.get_f32(&eps_key)?;
    if !(eps.is_finite() && eps > 0.0) {
        return Err(bad(&eps_key, eps, "must be a positive number"));
    }
    let head_dim = n_embd / n_head;
    let n_ctx_train = req("context_length")?;
    let (rope_freq_base, rope_freq_scale, rope_yarn, rope_style) = match variant {
        // Unused: BERT's positions are a table.
        Variant::Bert => (DEFAULT_ROPE_FREQ_BASE, 1.0, None, RopeStyle::Interleaved),
        Variant::Nomic => {
            let rot_key = key("rope.dimension_count");
            if file.get(&rot_key).is_some() && file.get_u32(&rot_key)? as usize != head_dim {
                return Err(bad(
                    &rot_key,
                    file.get_u32(&rot_key)?,
                    "must equal the head dimension (the whole head is rotated)",
                ));
            }
            if !head_dim.is_multiple_of(2) {
                return Err(bad(
                    &key("attention.head_count"),
                    n_head,
                    "rope needs an even head dimension",
                ));
            }
            let (base, scale, yarn) = read_rope(file, arch, n_ctx_train)?;
            (base, scale, yarn, RopeStyle::NonInterleaved)
        }
    };
    Ok(HParams {
        n_layer: req("block_count")?,
        n_embd,
        n_head,
        n_head_kv: n_head,
        head_dim,
        n_ff: req("feed_forward_length")?,
        n_vocab: crate::tensors::vocab_rows(file, n_embd)?,
        n_ctx_train,
        rms_eps: eps,
        rope_freq_base,
        rope_freq_scale,
        rope_yarn,
        rope_style,
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
    load_variant(file, Variant::Bert)
}

/// Loads a file of `variant`.
fn load_variant(file: &GgufFile, variant: Variant) -> Result<Box<dyn ModelDef>, ModelError> {
    let hp = read_hparams(file, variant)?;
    let (d, f) = (hp.n_embd, hp.n_ff);
    // Optional, as llama.cpp has it: a file without segments adds no type row.
    let types = match file.tensor(TOKEN_TYPES) {
        Some(t) => {
            let n_types = t.dims.get(1).copied().unwrap_or(1).max(1) as usize;
            Some(matrix(file, TOKEN_TYPES, d, n_types)?)
        }
        None => None,
    };
    let positions = match variant {
        Variant::Bert => Positions::Table(matrix(file, POSITION_EMBD, d, hp.n_ctx_train)?),
        Variant::Nomic => {
            if file.tensor(POSITION_EMBD).is_some() {
                return Err(ModelError::UnsupportedTensor {
                    name: POSITION_EMBD.into(),
                    reason: "nomic-bert places tokens by rope, not by a position table".into(),
                });
            }
            Positions::Rope(RoPEMeta {
                n_dims: hp.head_dim,
                freq_base: hp.rope_freq_base,
                freq_scale: hp.rope_freq_scale,
                n_head: hp.n_head,
                hd: hp.head_dim,
                style: hp.rope_style,
                freq_factors: None,
                yarn: hp.rope_yarn,
            })
        }
    };
    let layers = (0..hp.n_layer)
        .map(|il| Layer::load(file, variant, il, d, f))
        .collect::<Result<Vec<_>, _>>()?;
    // llama.cpp loads a classifier head for `bert` only.
    let rank = match variant {
        Variant::Bert => head::load(file, d)?,
        Variant::Nomic => None,
    };
    Ok(Box::new(Bert {
        variant,
        tok_embd: matrix(file, TOKEN_EMBD, d, hp.n_vocab)?,
        types,
        positions,
        embd_norm: norm(file, "token_embd_norm", d)?,
        layers,
        rank,
        hp,
    }))
}

impl ModelDef for Bert {
    fn arch(&self) -> &'static str {
        self.variant.arch()
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
        let rope = match &self.positions {
            Positions::Table(w) => {
                let pos = b.embedding(x.pos, w);
                b.set_name(pos, "inp_pos_embd");
                h = b.add(pos, h);
                None
            }
            Positions::Rope(meta) => Some(meta),
        };
        b.set_name(h, "inp_embd");
        let [w, bias] = &self.embd_norm;
        let mut h = b.layer_norm(h, Some(w), Some(bias), self.hp.rms_eps);
        b.set_name(h, "inp_norm");
        for (il, l) in self.layers.iter().enumerate() {
            h = l.build(&mut b, &self.hp, il, h, &x, p, rope);
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
        if let Positions::Table(w) = &self.positions {
            out.push(w.clone());
        }
        out.extend(self.embd_norm.iter().cloned());
        for l in &self.layers {
            out.extend(l.weights());
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
