//! Qwen3-MoE: the Qwen3 attention (per-head q/k norm, decoupled head dimension, no
//! biases) with a routed-expert FFN in every layer ([`crate::moe`]): softmax gating over
//! `expert_count` experts, `expert_used_count` chosen per token, their gate values
//! renormalised to sum to one (llama.cpp builds this architecture with `norm_w`).
//!
//! Tensors per layer `il` beyond the attention's: `ffn_gate_inp [n_embd, n_expert]`,
//! `ffn_gate_exps`/`ffn_up_exps [n_embd, n_ff_exp, n_expert]`, `ffn_down_exps [n_ff_exp,
//! n_embd, n_expert]`, with `n_ff_exp` from `expert_feed_forward_length`.

use minfer_gguf::GgufFile;
use minfer_graph::RopeStyle;

use crate::common::qkv_norm_block;
use crate::error::ModelError;
use crate::hparams::{HParams, MoeParams};
use crate::model::Decoder;
use crate::moe::MoeFfn;
use crate::weights::{blk, vector, Ffn, LayerWeights, Weights};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen3moe";

/// Reads and validates a Qwen3-MoE model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let mut hp = HParams::read(file, ARCH, RopeStyle::NonInterleaved)?;
    let moe = MoeParams::read(file, ARCH, &hp)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let hd = hp.head_dim;
    let layers = (0..hp.n_layer)
        .map(|il| {
            let ffn = MoeFfn::read(file, il, &hp, &moe, true, false)?;
            let core = LayerWeights::with_ffn(file, il, &hp, Ffn::Moe(Box::new(ffn)))?;
            Ok(LayerWeights {
                qk_norm: Some([
                    vector(file, &blk(il, "attn_q_norm"), hd)?,
                    vector(file, &blk(il, "attn_k_norm"), hd)?,
                ]),
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
    Ok(Box::new(Decoder::new(ARCH, hp, weights, qkv_norm_block)))
}
