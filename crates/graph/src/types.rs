//! The value types the IR is made of: node ids, dtypes, buffer and weight references,
//! and the small enums nodes carry. Re-exported by `ir`, where they are used.

use serde::{Deserialize, Serialize};

use crate::backend_id::Backend;

/// Index of a node in `ComputeGraph::nodes`; equal to its position (build order).
pub type NodeId = usize;

/// Element type of a node's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit float; every activation.
    F32,
    /// 16-bit float (inputs only).
    F16,
    /// 32-bit integer, stored in f32 buffers as bit patterns.
    I32,
    /// ggml Q8_0 blocks (32 values + one f16 scale).
    Q8_0,
}

impl DType {
    /// Bytes of one storage unit: an element, or a whole 32-element block for Q8_0.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::Q8_0 => 34,
        }
    }

    /// Elements per storage unit (32 for Q8_0, 1 otherwise).
    pub fn block_elems(self) -> usize {
        match self {
            DType::Q8_0 => 32,
            _ => 1,
        }
    }

    /// Lower-case name used by the exporters.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::Q8_0 => "q8_0",
        }
    }

    /// Inverse of [`DType::name`].
    pub fn from_name(s: &str) -> Option<DType> {
        [DType::F32, DType::F16, DType::I32, DType::Q8_0]
            .into_iter()
            .find(|d| d.name() == s)
    }
}

/// A buffer inside one backend's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufRef {
    /// Owning backend.
    pub backend: Backend,
    /// Id inside that backend's pool.
    pub id: usize,
}

/// A named buffer that survives graph rebuilds (KV regions and the like).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistentBuf {
    /// Diagnostic name, e.g. `kv.3.k`.
    pub name: String,
    /// Owning backend.
    pub backend: Backend,
    /// Id inside that backend's pool.
    pub id: usize,
    /// Elements the buffer holds.
    pub elems: usize,
}

/// How rope pairs the rotated dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (ggml "normal", Llama).
    Interleaved,
    /// Split halves `(i, i + n_dims/2)` (ggml NEOX, Qwen2).
    NonInterleaved,
}

/// Attention kernel family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttnMode {
    /// Grouped-query attention.
    Gqa,
    /// Flash attention (same math, tiled kernel).
    Flash,
    /// Plain multi-head attention (vocabulary only).
    Mha,
}

/// Fusion capability tags probed through `supports_fused` (§5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FusedOp {
    /// `Mul(Silu(x), y) -> SwiGLU(x, y)`.
    SwiGLU,
    /// `Mul(Gelu(x), y) -> GeGLU(x, y)`.
    GeGLU,
    /// The decode QKV fusions the builder emits (`FusedQKV`, `QkvBiasRopeStore`,
    /// `FusedQkvNorm`): a backend answering yes executes all three (sets `CParams.fuse_qkv`).
    DecodeQkv,
    /// The decode gate|up fusion (`FusedFFN`): a backend answering yes executes it (sets
    /// `CParams.fuse_ffn`).
    DecodeFfn,
}

/// A ggml tensor type id (GGUF `ggml_type`), kept open so new quant types need no edit here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WeightType(pub u32);

impl WeightType {
    /// f32.
    pub const F32: WeightType = WeightType(0);
    /// f16.
    pub const F16: WeightType = WeightType(1);
    /// Q4_0.
    pub const Q4_0: WeightType = WeightType(2);
    /// Q4_1.
    pub const Q4_1: WeightType = WeightType(3);
    /// Q5_0.
    pub const Q5_0: WeightType = WeightType(6);
    /// Q5_1.
    pub const Q5_1: WeightType = WeightType(7);
    /// Q8_0.
    pub const Q8_0: WeightType = WeightType(8);
    /// Q4_K.
    pub const Q4_K: WeightType = WeightType(12);
    /// Q5_K.
    pub const Q5_K: WeightType = WeightType(13);
    /// Q6_K.
    pub const Q6_K: WeightType = WeightType(14);
    /// bf16.
    pub const BF16: WeightType = WeightType(30);
}

/// What the builder needs to know about a weight: its name, type and GGUF shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightRef {
    /// Tensor name in the model file.
    pub name: String,
    /// Storage type.
    pub wtype: WeightType,
    /// GGUF shape `[in, out]` (a vector has `out == 1`).
    pub shape: [usize; 2],
}

impl WeightRef {
    /// Convenience constructor.
    pub fn new(name: impl Into<String>, wtype: WeightType, shape: [usize; 2]) -> Self {
        WeightRef {
            name: name.into(),
            wtype,
            shape,
        }
    }
}
