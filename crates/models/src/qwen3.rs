//! Qwen3: the Qwen2 skeleton without attention biases, with a per-head RMSNorm on q and
//! k (`attn_q_norm`, `attn_k_norm`, `[head_dim]` each), and a head dimension
//! (`attention.key_length`) decoupled from `n_embd / n_head` — it drives the Q/K/V/wo
//! widths, the rope dims, the attention scale and the KV row stride (design §4.4).

use minfer_gguf::GgufFile;
use minfer_graph::RopeStyle;

use crate::common::qkv_norm_block;
use crate::error::ModelError;
use crate::hparams::HParams;
use crate::model::Decoder;
use crate::weights::{blk, vector, LayerWeights, Weights};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen3";

/// Reads and validates a Qwen3 model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let hp = HParams::read(file, ARCH, RopeStyle::NonInterleaved)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let hd = hp.head_dim;
    let layers = (0..hp.n_layer)
        .map(|il| {
            // The shared tensors first, so a shape error names the first tensor in file order.
            let core = LayerWeights::read(file, il, &hp)?;
            Ok(LayerWeights {
                qk_norm: Some([
                    vector(file, &blk(il, "attn_q_norm"), hd)?,
                    vector(file, &blk(il, "attn_k_norm"), hd)?,
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
    Ok(Box::new(Decoder::new(ARCH, hp, weights, qkv_norm_block)))
}
