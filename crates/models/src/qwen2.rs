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
use crate::weights::{blk_bias, vector, LayerWeights, Weights};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen2";

/// Reads and validates a Qwen2 model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let hp = HParams::read(file, ARCH, RopeStyle::NonInterleaved)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let (nq, nkv) = (hp.n_q_embd(), hp.n_kv_embd());
    let layers = (0..hp.n_layer)
        .map(|il| {
            // The shared tensors first, so a shape error names the first tensor in file order.
            let core = LayerWeights::read(file, il, &hp)?;
            Ok(LayerWeights {
                bias: Some([
                    vector(file, &blk_bias(il, "attn_q"), nq)?,
                    vector(file, &blk_bias(il, "attn_k"), nkv)?,
                    vector(file, &blk_bias(il, "attn_v"), nkv)?,
                ]),
                ..core
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
