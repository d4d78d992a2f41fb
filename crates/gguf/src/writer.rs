//! GGUF v3 writer: metadata plus tensors of any supported type.
//!
//! API CONTRACT (tests across the workspace synthesize models with it; keep it).

use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::MetaValue;
use std::path::Path;

/// Accumulates metadata and tensors, then writes a complete GGUF file.
#[derive(Default)]
pub struct GgufWriter {
    _private: (),
}

impl GgufWriter {
    /// An empty writer (alignment 32 unless `general.alignment` is set).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a metadata key.
    pub fn add_meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        let _ = (key, value);
        todo!()
    }

    /// Adds a tensor from already-encoded bytes of `ty` with ggml-order `dims`.
    pub fn add_tensor_bytes(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self, GgufError> {
        let _ = (name, dims, ty, data);
        todo!()
    }

    /// Adds a tensor from f32 values, quantized to `ty` with the reference quantizer.
    pub fn add_tensor_f32(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: &[f32],
    ) -> Result<&mut Self, GgufError> {
        let _ = (name, dims, ty, data);
        todo!()
    }

    /// Serializes the whole file into memory.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        todo!()
    }

    /// Writes the file to `path` (via a temporary file and a rename).
    pub fn write_to(&self, path: &Path) -> Result<(), GgufError> {
        let _ = path;
        todo!()
    }
}
