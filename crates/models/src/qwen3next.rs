//! Qwen3-Next (`qwen3next`): the hybrid of Gated DeltaNet and gated attention layers
//! that Qwen3.5 took over ([`crate::qwen35`]), with routed experts and a shared expert
//! in every layer, and one joint projection `ssm_ba` for the recurrent layers'
//! write strengths and decays (per key head its value heads' betas, then their
//! alphas; `ssm_dt.bias` is added inside the recurrence). Its rope is the plain
//! normal-layout one over `rope.dimension_count` dims. Files with the older fused
//! `ssm_in` projection (q|k|v|z grouped by key head) are refused by name.

use minfer_gguf::GgufFile;

use crate::error::ModelError;
use crate::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "qwen3next";

/// Reads and validates a Qwen3-Next model's hyperparameters and tensors.
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    crate::qwen35::load_hybrid(file, ARCH, true, true)
}
