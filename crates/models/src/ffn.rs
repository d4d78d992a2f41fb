//! A dense gated feed-forward block's tensors, as every dense layer and Qwen2-MoE's
//! shared expert hold them.

use minfer_gguf::GgufFile;
use minfer_graph::WeightRef;

use crate::error::ModelError;
use crate::tensors::{blk, matrix};

/// A gated FFN's matrices: `down(act(gate x) * up x)`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DenseFfn {
    /// `ffn_gate{suffix}`: `[n_embd, n_ff]`.
    pub gate: WeightRef,
    /// `ffn_up{suffix}`: `[n_embd, n_ff]`.
    pub up: WeightRef,
    /// `ffn_down{suffix}`: `[n_ff, n_embd]`.
    pub down: WeightRef,
}

impl DenseFfn {
    /// Layer `il`'s `ffn_{gate,up,down}{suffix}` of width `n_ff` (`suffix` "" for the
    /// layer's FFN, "_shexp" for a shared expert).
    pub fn read(
        file: &GgufFile,
        il: usize,
        suffix: &str,
        n_embd: usize,
        n_ff: usize,
    ) -> Result<Self, ModelError> {
        let name = |part: &str| blk(il, &format!("ffn_{part}{suffix}"));
        Ok(DenseFfn {
            gate: matrix(file, &name("gate"), n_embd, n_ff)?,
            up: matrix(file, &name("up"), n_embd, n_ff)?,
            down: matrix(file, &name("down"), n_ff, n_embd)?,
        })
    }

    /// Whether gate and up share type and shape, so a backend can concatenate them.
    pub fn gate_up_concat_feasible(&self) -> bool {
        self.gate.wtype == self.up.wtype && self.gate.shape == self.up.shape
    }
}
