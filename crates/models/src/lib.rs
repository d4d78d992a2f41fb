//! Model definitions for minfer (Qwen2, Qwen3, their mixture-of-experts variants Qwen2-MoE
//! and Qwen3-MoE, the hybrid recurrent Qwen3.5, Qwen3.5-MoE and Qwen3-Next, Llama, Gemma 2 and 3,
//! gpt-oss, and the BERT-family encoders BERT and nomic-bert): hyperparameters,
//! load-time weight validation and compute-graph construction for the supported
//! architectures (design §4, §10).
//!
//! [`load_model`] reads `general.architecture` and dispatches through [`REGISTRY`], one
//! line per architecture. Loading checks every tensor the graph will reference, so a
//! model that loads builds graphs whose weight names all resolve.
//!
//! Graph contract (what a runtime fills and reads, design §4.5, §11.1):
//!
//! * inputs, all at the head: `token_ids` `[nt]` I32, `positions` `[nt]` I32 (each
//!   token's index in its sequence: rope angle, and — without explicit spans — causal
//!   bound and KV row), `tail_ids` `[n_out]` I32 only when `n_out < nt` (the batch rows
//!   whose logits are wanted, increasing; [`params::tail_ids`] for one sequence), then,
//!   only with `CParams::explicit_span`, `span` `[2, nt]` I32 (each token's `[lo, hi)` KV
//!   rows attended) and `cells` `[nt]` I32 (the KV row each token writes);
//! * several sequences share one step through explicit spans: each owns a range of the
//!   KV arena, its tokens write rows of that range and attend only inside it. The number
//!   of sequences is data, so batches of one shape share one graph whatever their mix;
//! * one output: logits `[n_vocab, n_out]`, token-major (row `i` is the `i`-th tail token),
//!   or the hidden rows `[n_embd, n_out]` with `CParams::embeddings` and always for an
//!   encoder ([`ModelDef::is_encoder`], whose graph may add a `token_types` input, 0 for
//!   every token: [`bert::INPUT_TOKEN_TYPES`]);
//! * weights referenced by GGUF name ([`ModelDef::weight_names`]), plus the concatenated
//!   weights of the GPU decode fusions ([`ModelDef::concat_weights`]).
//!
//! [`testing`] writes tiny random-weight models with the project's own GGUF writer; the
//! llama.cpp reference outputs for the committed set live in `tests/golden/` (format in
//! `tests/golden/README.md`).

#![warn(missing_docs)]

pub mod bert;
mod common;
pub mod error;
mod ffn;
pub mod gemma;
pub mod gpt_oss;
pub mod hparams;
pub mod llama;
mod model;
mod moe;
pub mod params;
pub mod qwen2;
pub mod qwen2moe;
pub mod qwen3;
pub mod qwen35;
pub mod qwen35moe;
pub mod qwen3moe;
pub mod qwen3next;
mod tensors;
pub mod testing;
pub mod weights;

pub use common::{
    gate_up_concat_name, qkv_concat_name, FUSED_FFN_MAX_NF, INPUT_CELLS, INPUT_POSITIONS,
    INPUT_SPAN, INPUT_STATE_SLOTS, INPUT_TAIL_IDS, INPUT_TOKEN_IDS,
};
pub use error::ModelError;
pub use hparams::{HParams, MoeParams};
pub use model::{ConcatWeight, ModelDef};

use minfer_gguf::GgufFile;

/// A loader: validates a file of its architecture and returns the model.
pub type LoadFn = fn(&GgufFile) -> Result<Box<dyn ModelDef>, ModelError>;

/// Supported architectures, one line each: `general.architecture` value and loader.
pub const REGISTRY: &[(&str, LoadFn)] = &[
    (qwen2::ARCH, qwen2::load),
    (qwen3::ARCH, qwen3::load),
    (qwen2moe::ARCH, qwen2moe::load),
    (qwen3moe::ARCH, qwen3moe::load),
    (qwen35::ARCH, qwen35::load),
    (qwen35moe::ARCH, qwen35moe::load),
    (qwen3next::ARCH, qwen3next::load),
    (llama::ARCH, llama::load),
    (gemma::ARCH_GEMMA2, gemma::load_gemma2),
    (gemma::ARCH_GEMMA3, gemma::load_gemma3),
    (gpt_oss::ARCH, gpt_oss::load),
    (bert::ARCH, bert::load),
    (bert::nomic::ARCH, bert::nomic::load),
];

/// Names of the supported architectures, in registry order.
pub fn supported_architectures() -> Vec<&'static str> {
    REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// Loads the model `file` describes, refusing unsupported architectures, missing or
/// malformed hyperparameters, and missing or mis-shaped tensors with errors naming them.
pub fn load_model(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    let arch = file.get_str("general.architecture")?;
    match REGISTRY.iter().find(|(name, _)| *name == arch) {
        Some((_, load)) => load(file),
        None => Err(ModelError::UnsupportedArch {
            arch: arch.to_string(),
            supported: supported_architectures(),
        }),
    }
}
