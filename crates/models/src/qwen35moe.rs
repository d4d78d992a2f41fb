//! Qwen3.5-MoE (`qwen35moe`): Qwen3.5's hybrid of Gated DeltaNet and gated attention
//! layers ([`crate::qwen35`]) with routed experts for the FFN of every layer: softmax
//! gating, the chosen gate values renormalised to sum to one, and, where the file has
//! one, a shared expert scaled by `sigmoid(ffn_gate_inp_shexp · x)` ([`crate::moe`]). A
//! file whose `expert_weights_scale` is other than 1 is refused (no scale term).

use minfer_gguf::GgufFile;

use crate::error::ModelError;
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen35moe";

/// Reads and validates a Qwen3.5-MoE model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    crate::qwen35::load_hybrid(file, ARCH, true, false)
}
