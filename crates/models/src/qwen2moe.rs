//! Qwen2-MoE (Qwen1.5-MoE): the Qwen2 attention (NEOX rope, q/k/v biases where the file
//! has them, as llama.cpp loads them optionally) with a routed-expert FFN in every layer
//! ([`crate::moe`]): softmax gating, `expert_used_count` experts per token weighted by
//! their gate values as they are (llama.cpp builds this architecture without
//! renormalisation), plus a shared expert every token runs, scaled by
//! `sigmoid(ffn_gate_inp_shexp · x)`.
//!
//! Tensors per layer `il` beyond the attention's: `ffn_gate_inp [n_embd, n_expert]`,
//! `ffn_{gate,up}_exps [n_embd, n_ff_exp, n_expert]`, `ffn_down_exps [n_ff_exp, n_embd,
//! n_expert]`, `ffn_gate_inp_shexp [n_embd]`, `ffn_{gate,up}_shexp [n_embd, n_ff_shexp]`,
//! `ffn_down_shexp [n_ff_shexp, n_embd]`; the lm head `output.weight` is required.

use minfer_gguf::GgufFile;
use minfer_graph::RopeStyle;

use crate::common::qkv_block;
use crate::error::ModelError;
use crate::hparams::{HParams, MoeParams};
use crate::model::Decoder;
use crate::moe::MoeFfn;
use crate::weights::{qkv_biases, Ffn, LayerWeights, Weights, OUTPUT};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen2moe";

/// Reads and validates a Qwen2-MoE model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let mut hp = HParams::read(file, ARCH, RopeStyle::NonInterleaved)?;
    let moe = MoeParams::read(file, ARCH, &hp)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    if tied {
        // llama.cpp requires the head for this architecture.
        return Err(ModelError::MissingTensor {
            name: OUTPUT.to_string(),
        });
    }
    let (nq, nkv) = (hp.n_q_embd(), hp.n_kv_embd());
    let layers = (0..hp.n_layer)
        .map(|il| {
            let ffn = MoeFfn::read(file, il, &hp, &moe, false, true)?;
            let core = LayerWeights::with_ffn(file, il, &hp, Ffn::Moe(Box::new(ffn)))?;
            Ok(LayerWeights {
                bias: qkv_biases(file, il, nq, nkv)?,
                ..core
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    hp.moe = Some(moe);
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
