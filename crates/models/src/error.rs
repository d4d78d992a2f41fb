//! Typed errors of model loading. Every variant names what it refuses (the key, the
//! tensor, the architecture) so a bad file can be diagnosed from the message alone.

use minfer_gguf::{GgmlType, GgufError};

/// Every way loading a model (or asking for graph parameters) can fail.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// `general.architecture` names an architecture without a registry entry.
    #[error("unsupported architecture `{}`; supported: {}", .arch.escape_debug(), .supported.join(", "))]
    UnsupportedArch {
        /// The architecture the file declares.
        arch: String,
        /// Architectures this build can run.
        supported: Vec<&'static str>,
    },
    /// A metadata key is missing, mistyped or out of range (the source names the key).
    #[error("model metadata: {0}")]
    Metadata(#[from] GgufError),
    /// A hyperparameter is present but unusable.
    #[error("hyperparameter `{key}` = {value}: {reason}")]
    BadHparam {
        /// Full metadata key, e.g. `qwen2.attention.head_count_kv`.
        key: String,
        /// The value read.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// A tensor the graph references is absent.
    #[error("missing tensor `{}`", .name.escape_debug())]
    MissingTensor {
        /// Tensor name.
        name: String,
    },
    /// A tensor the architecture's graph has no term for is present; running without it
    /// would compute another model.
    #[error("tensor `{}`: {reason}", .name.escape_debug())]
    UnsupportedTensor {
        /// Tensor name.
        name: String,
        /// What the tensor is and why it is refused.
        reason: String,
    },
    /// A tensor has another shape than the hyperparameters imply.
    #[error("tensor `{}` has shape {actual:?}, expected {expected} (GGUF [in, out] order)", .name.escape_debug())]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Shape implied by the hyperparameters, e.g. `[896, 128]`.
        expected: String,
        /// Shape in the file.
        actual: Vec<u64>,
    },
    /// A tensor is stored in a type its role cannot use.
    #[error("tensor `{}` is stored as {ty}; {reason}", .name.escape_debug())]
    TensorType {
        /// Tensor name.
        name: String,
        /// Type in the file.
        ty: GgmlType,
        /// What the role requires.
        reason: &'static str,
    },
    /// Graph parameters that no graph can be built for.
    #[error("invalid graph parameters: {0}")]
    BadParams(String),
}
