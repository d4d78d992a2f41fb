//! The tensors a graph references, validated at load time: present, of the shape the
//! hyperparameters imply (GGUF `[in, out]` order), and of a type their role can use.
//!
//! Matrices may be stored in any type the GGUF reader knows (the CPU backend runs all of
//! them). Vectors — norm scales and biases — must be F32: the kernels read them as plain
//! floats, and every converter stores one-dimensional tensors that way. One tensor is
//! read by [`crate::tensors`]; this file groups them into layers and the model.

use minfer_gguf::GgufFile;
use minfer_graph::{WeightRef, WeightType};

use crate::error::ModelError;
use crate::ffn::DenseFfn;
use crate::hparams::HParams;
pub use crate::tensors::{blk, blk_bias, OUTPUT, OUTPUT_NORM, ROPE_FREQS, TOKEN_EMBD};
pub(crate) use crate::tensors::{matrix, vector};

/// Per-layer tensors; an architecture declares the optional ones it has (`bias` for
/// Qwen2 and some Llama files, `qk_norm` for Qwen3 and Gemma 3, `post_norms` for
/// Gemma), and the skeleton emits nodes for exactly those.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LayerWeights {
    pub attn_norm: WeightRef,
    pub wq: WeightRef,
    pub wk: WeightRef,
    pub wv: WeightRef,
    pub wo: WeightRef,
    /// q, k, v biases.
    pub bias: Option<[WeightRef; 3]>,
    /// The attention output's bias (gpt-oss).
    pub wo_bias: Option<WeightRef>,
    /// Attention sinks, one logit per query head (gpt-oss).
    pub sinks: Option<WeightRef>,
    /// Per-head q and k norm scales.
    pub qk_norm: Option<[WeightRef; 2]>,
    pub ffn_norm: WeightRef,
    /// The feed-forward block: one gated FFN, or routed experts.
    pub ffn: Ffn,
    /// Norms of the attention and FFN outputs before their residual adds (Gemma's
    /// sandwich: `post_attention_norm`, `post_ffw_norm`).
    pub post_norms: Option<[WeightRef; 2]>,
}

/// A layer's feed-forward block.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ffn {
    /// One gated FFN for every token.
    Dense(DenseFfn),
    /// Experts chosen per token by a router ([`crate::moe`]).
    Moe(Box<crate::moe::MoeFfn>),
}

impl Ffn {
    /// The dense FFN, if the block is one.
    pub fn dense(&self) -> Option<&DenseFfn> {
        match self {
            Ffn::Dense(d) => Some(d),
            Ffn::Moe(_) => None,
        }
    }

    /// Every tensor of the block, in a fixed order.
    pub fn all(&self) -> Vec<&WeightRef> {
        match self {
            Ffn::Dense(d) => vec![&d.gate, &d.up, &d.down],
            Ffn::Moe(m) => m.all(),
        }
    }
}

impl LayerWeights {
    /// Reads layer `il`'s tensors every architecture has (norms, q/k/v/o, gated FFN),
    /// checking their shapes against `hp`; the optional parts start empty, for the
    /// architecture to fill.
    pub fn read(file: &GgufFile, il: usize, hp: &HParams) -> Result<Self, ModelError> {
        let core = Self::read_attn(file, il, hp)?;
        let ffn = Ffn::Dense(DenseFfn::read(file, il, "", hp.n_embd, hp.n_ff)?);
        Ok(LayerWeights { ffn, ..core })
    }

    /// Layer `il`'s norms and q/k/v/o with `ffn` as its feed-forward block (an
    /// architecture with routed experts reads its own).
    pub fn with_ffn(
        file: &GgufFile,
        il: usize,
        hp: &HParams,
        ffn: Ffn,
    ) -> Result<Self, ModelError> {
        Ok(LayerWeights {
            ffn,
            ..Self::read_attn(file, il, hp)?
        })
    }

    /// The attention half and the FFN norm, with a placeholder empty FFN.
    fn read_attn(file: &GgufFile, il: usize, hp: &HParams) -> Result<Self, ModelError> {
        let (nq, nkv, ne) = (hp.n_q_embd(), hp.n_kv_embd(), hp.n_embd);
        let none = WeightRef::new("", WeightType::F32, [0, 0]);
        Ok(LayerWeights {
            attn_norm: vector(file, &blk(il, "attn_norm"), ne)?,
            wq: matrix(file, &blk(il, "attn_q"), ne, nq)?,
            wk: matrix(file, &blk(il, "attn_k"), ne, nkv)?,
            wv: matrix(file, &blk(il, "attn_v"), ne, nkv)?,
            wo: matrix(file, &blk(il, "attn_output"), nq, ne)?,
            bias: None,
            wo_bias: None,
            sinks: None,
            qk_norm: None,
            ffn_norm: vector(file, &blk(il, "ffn_norm"), ne)?,
            ffn: Ffn::Dense(DenseFfn {
                gate: none.clone(),
                up: none.clone(),
                down: none,
            }),
            post_norms: None,
        })
    }

    /// Every tensor of the layer, in a fixed order.
    pub fn all(&self) -> Vec<&WeightRef> {
        let mut v = vec![&self.attn_norm, &self.wq, &self.wk, &self.wv];
        v.extend(self.bias.iter().flatten());
        v.extend(self.qk_norm.iter().flatten());
        v.push(&self.wo);
        v.extend(self.wo_bias.iter().chain(&self.sinks));
        v.push(&self.ffn_norm);
        v.extend(self.ffn.all());
        v.extend(self.post_norms.iter().flatten());
        v
    }

    /// Whether q, k and v share a type, so a backend can build their concatenation.
    pub fn qkv_concat_feasible(&self) -> bool {
        self.wq.wtype == self.wk.wtype && self.wk.wtype == self.wv.wtype
    }

    /// The dense FFN when its gate and up share type and shape, so a backend can
    /// concatenate them.
    pub fn gate_up_concat(&self) -> Option<&DenseFfn> {
        self.ffn.dense().filter(|d| d.gate_up_concat_feasible())
    }
}

/// Layer `il`'s optional q/k/v biases (some Llama fine-tunes, Qwen2-MoE): all three, or
/// none; a partial set names the missing one.
pub(crate) fn qkv_biases(
    file: &GgufFile,
    il: usize,
    nq: usize,
    nkv: usize,
) -> Result<Option<[WeightRef; 3]>, ModelError> {
    let names = ["attn_q", "attn_k", "attn_v"].map(|t| blk_bias(il, t));
    let present = names.iter().filter(|n| file.tensor(n).is_some()).count();
    match present {
        0 => Ok(None),
        3 => Ok(Some([
            vector(file, &names[0], nq)?,
            vector(file, &names[1], nkv)?,
            vector(file, &names[2], nkv)?,
        ])),
        _ => {
            let missing = names.iter().find(|n| file.tensor(n).is_none());
            Err(ModelError::MissingTensor {
                name: missing.cloned().unwrap_or_default(),
            })
        }
    }
}

/// All tensors of a model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Weights {
    pub tok_embd: WeightRef,
    pub output_norm: WeightRef,
    /// The lm head: `output.weight`, or the embedding table when tied.
    pub output: WeightRef,
    pub tied: bool,
    /// Per-pair rope frequency divisors shared by every layer, when the file has them.
    pub rope_freqs: Option<WeightRef>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// Every distinct tensor the graph references, embedding first.
    pub fn all(&self) -> Vec<WeightRef> {
        let mut v = vec![self.tok_embd.clone()];
        v.extend(self.rope_freqs.iter().cloned());
        for l in &self.layers {
            v.extend(l.all().into_iter().cloned());
        }
        v.push(self.output_norm.clone());
        if !self.tied {
            v.push(self.output.clone());
        }
        v
    }

    /// Embedding, output norm and lm head (tied when `output.weight` is absent).
    pub fn globals(
        file: &GgufFile,
        n_embd: usize,
        n_vocab: usize,
    ) -> Result<(WeightRef, WeightRef, WeightRef, bool), ModelError> {
        let tok_embd = matrix(file, TOKEN_EMBD, n_embd, n_vocab)?;
        let output_norm = vector(file, OUTPUT_NORM, n_embd)?;
        let tied = file.tensor(OUTPUT).is_none();
        let output = if tied {
            tok_embd.clone()
        } else {
            matrix(file, OUTPUT, n_embd, n_vocab)?
        };
        Ok((tok_embd, output_norm, output, tied))
    }
}
