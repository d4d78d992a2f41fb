//! Llama (Llama 2 and 3.x, Mistral, SmolLM and their fine-tunes): the shared skeleton with
//! normal-layout rope (adjacent pairs), grouped-query attention and SwiGLU.
//!
//! Tensors per layer `il` (GGUF `[in, out]`, `nq = n_head * hd`, `nkv = n_head_kv * hd`):
//! `attn_norm [n_embd]`, `attn_q [n_embd, nq]`, `attn_k`/`attn_v [n_embd, nkv]`,
//! `attn_output [nq, n_embd]`, `ffn_norm [n_embd]`, `ffn_gate`/`ffn_up [n_embd, n_ff]`,
//! `ffn_down [n_ff, n_embd]`. Optional, as llama.cpp reads them: `output.weight` (absent:
//! the lm head is the token embedding), q/k/v biases (all three or none), and
//! `rope_freqs.weight [hd / 2]`, the Llama 3 frequency factors that divide each rope pair's
//! angle. Files with tensors this graph has no term for (an attention output or FFN bias,
//! a fused `attn_qkv`, experts) are refused by name rather than run without them.

use minfer_gguf::GgufFile;
use minfer_graph::RopeStyle;

use crate::common::qkv_block;
use crate::error::ModelError;
use crate::hparams::HParams;
use crate::model::Decoder;
use crate::weights::{blk, blk_bias, qkv_biases, vector, LayerWeights, Weights, ROPE_FREQS};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "llama";

/// Reads and validates a Llama model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let hp = HParams::read(file, ARCH, RopeStyle::Interleaved)?;
    refuse_unsupported(file, &hp)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let (nq, nkv) = (hp.n_q_embd(), hp.n_kv_embd());
    let rope_freqs = match file.tensor(ROPE_FREQS) {
        Some(_) => Some(vector(file, ROPE_FREQS, hp.head_dim / 2)?),
        None => None,
    };
    let layers = (0..hp.n_layer)
        .map(|il| {
            // The shared tensors first, so a shape error names the first tensor in file order.
            let core = LayerWeights::read(file, il, &hp)?;
            Ok(LayerWeights {
                bias: qkv_biases(file, il, nq, nkv)?,
                ..core
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let weights = Weights {
        tok_embd,
        output_norm,
        output,
        tied,
        rope_freqs,
        layers,
    };
    Ok(Box::new(Decoder::new(ARCH, hp, weights, qkv_block)))
}

/// Keys and tensors of the Llama family this graph has no term for, refused by name.
fn refuse_unsupported(file: &GgufFile, hp: &HParams) -> Result<(), ModelError> {
    let key = |name: &str| format!("{ARCH}.{name}");
    let experts = key("expert_count");
    let n_expert = match file.get(&experts) {
        Some(_) => file.get_u32(&experts)?,
        None => 0,
    };
    if n_expert > 0 {
        return Err(ModelError::BadHparam {
            key: experts,
            value: n_expert.to_string(),
            reason: "mixture-of-experts Llama files are not supported".into(),
        });
    }
    // llama.cpp requires the rotated dimensions to be the whole head for this family.
    let rot = key("rope.dimension_count");
    if file.get(&rot).is_some() {
        let n_rot = file.get_u32(&rot)? as usize;
        if n_rot != hp.head_dim {
            return Err(ModelError::BadHparam {
                key: rot,
                value: n_rot.to_string(),
                reason: format!("must equal the head dimension {}", hp.head_dim),
            });
        }
    }
    for il in 0..hp.n_layer {
        for (name, what) in [
            (blk(il, "attn_qkv"), "a fused q|k|v projection"),
            (blk_bias(il, "attn_output"), "an attention output bias"),
            (blk_bias(il, "ffn_gate"), "an FFN bias"),
            (blk_bias(il, "ffn_up"), "an FFN bias"),
            (blk_bias(il, "ffn_down"), "an FFN bias"),
            (blk(il, "ffn_gate_inp"), "an expert router"),
        ] {
            if file.tensor(&name).is_some() {
                return Err(ModelError::UnsupportedTensor {
                    name,
                    reason: format!("{what} is not supported for {ARCH}"),
                });
            }
        }
    }
    Ok(())
}
