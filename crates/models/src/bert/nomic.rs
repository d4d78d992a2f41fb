//! nomic-bert (`general.architecture = nomic-bert`: nomic-embed-text v1 and v1.5), the
//! BERT graph with three switches, as llama.cpp runs it: RoPE (NeoX pairing, the whole
//! head, `nomic-bert.rope.freq_base`) on q and k instead of a position table, a SwiGLU FFN
//! (`ffn_gate`, `ffn_up`, `ffn_down`) without biases, and usually one fused `attn_qkv`.
//! Everything else — token-type row 0, the embedding LayerNorm, the post-attention and
//! post-FFN LayerNorms, bidirectional attention, mean pooling from `pooling_type` — is
//! BERT's ([`super`]).

use minfer_gguf::GgufFile;

use super::{load_variant, Variant};
use crate::error::ModelError;
use crate::model::ModelDef;

/// The `general.architecture` value.
pub const ARCH: &str = "nomic-bert";

/// Loads a `nomic-bert` file, refusing tensors its graph has no term for by name (a
/// position table, FFN biases, jina-bert's extra norms).
pub fn load(file: &GgufFile) -> Result<Box<dyn ModelDef>, ModelError> {
    load_variant(file, Variant::Nomic)
}
