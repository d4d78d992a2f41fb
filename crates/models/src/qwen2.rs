//! Qwen2 (and Qwen2.5): biased Q/K/V projections, NEOX rope, SwiGLU FFN.
//!
//! Tensors per layer `il` (GGUF `[in, out]`, `nq = n_head * hd`, `nkv = n_head_kv * hd`):
//! `attn_norm [n_embd]`, `attn_q [n_embd, nq]` + bias `[nq]`, `attn_k`/`attn_v
//! [n_embd, nkv]` + biases `[nkv]`, `attn_output [nq, n_embd]`, `ffn_norm [n_embd]`,
//! `ffn_gate`/`ffn_up [n_embd, n_ff]`, `ffn_down [n_ff, n_embd]`. The biases are
//! required, as llama.cpp requires them for this architecture.

use minfer_gguf::GgufFile;
use minfer_graph::RopeStyle;

use crate::common::qkv_block;
use crate::error::ModelError;
use crate::hparams::HParams;
use crate::model::Decoder;
use crate::weights::{blk, blk_bias, matrix, vector, LayerWeights, Weights};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen2";

/// Reads and validates a Qwen2 model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let hp = HParams::read(file, ARCH, RopeStyle::NonInterleaved)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let (nq, nkv, ne) = (hp.n_q_embd(), hp.n_kv_embd(), hp.n_embd);
    let layers = (0..hp.n_layer)
        .map(|il| {
            Ok(LayerWeights {
                attn_norm: vector(file, &blk(il, "attn_norm"), ne)?,
                wq: matrix(file, &blk(il, "attn_q"), ne, nq)?,
                wk: matrix(file, &blk(il, "attn_k"), ne, nkv)?,
                wv: matrix(file, &blk(il, "attn_v"), ne, nkv)?,
                wo: matrix(file, &blk(il, "attn_output"), nq, ne)?,
                bias: Some([
                    vector(file, &blk_bias(il, "attn_q"), nq)?,
                    vector(file, &blk_bias(il, "attn_k"), nkv)?,
                    vector(file, &blk_bias(il, "attn_v"), nkv)?,
                ]),
                qk_norm: None,
                ffn_norm: vector(file, &blk(il, "ffn_norm"), ne)?,
                gate: matrix(file, &blk(il, "ffn_gate"), ne, hp.n_ff)?,
                up: matrix(file, &blk(il, "ffn_up"), ne, hp.n_ff)?,
                down: matrix(file, &blk(il, "ffn_down"), hp.n_ff, ne)?,
                post_norms: None,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let weights = Weights {
        tok_embd,
        output_norm,
        output,
        tied,
        rope_freqs: None,
        layers,
    };
    Ok(Box::new(Decoder::new(ARCH, hp, weights, qkv_block)))
}
