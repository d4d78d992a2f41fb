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
use crate::weights::{blk, matrix, vector, LayerWeights, Weights};
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen3";

/// Reads and validates a Qwen3 model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let hp = HParams::read(file, ARCH, RopeStyle::NonInterleaved)?;
    let (tok_embd, output_norm, output, tied) = Weights::globals(file, hp.n_embd, hp.n_vocab)?;
    let (nq, nkv, ne, hd) = (hp.n_q_embd(), hp.n_kv_embd(), hp.n_embd, hp.head_dim);
    let layers = (0..hp.n_layer)
        .map(|il| {
            Ok(LayerWeights {
                attn_norm: vector(file, &blk(il, "attn_norm"), ne)?,
                wq: matrix(file, &blk(il, "attn_q"), ne, nq)?,
                wk: matrix(file, &blk(il, "attn_k"), ne, nkv)?,
                wv: matrix(file, &blk(il, "attn_v"), ne, nkv)?,
                wo: matrix(file, &blk(il, "attn_output"), nq, ne)?,
                bias: None,
                qk_norm: Some([
                    vector(file, &blk(il, "attn_q_norm"), hd)?,
                    vector(file, &blk(il, "attn_k_norm"), hd)?,
                ]),
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
    Ok(Box::new(Decoder::new(ARCH, hp, weights, qkv_norm_block)))
}
