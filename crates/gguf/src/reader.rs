//! GGUF v2/v3 reader over a memory map.
//!
//! API CONTRACT (other crates are written against these signatures; keep them).

use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::MetaValue;
use std::path::Path;

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the row length (fastest axis).
    pub dims: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Exact number of data bytes (`n_elements / block_size * type_size`).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Product of the dimensions.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// An opened GGUF file: parsed header, metadata and tensor table over the mapped bytes.
pub struct GgufFile {
    _private: (),
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let _ = path;
        todo!()
    }

    /// Parses an in-memory image (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let _ = bytes;
        todo!()
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        todo!()
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        todo!()
    }

    /// A metadata value by full key.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let _ = key;
        todo!()
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        todo!()
    }

    /// Required string value; a typed error naming the key when missing or mistyped.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let _ = key;
        todo!()
    }

    /// Required unsigned integer value (any integer width that fits).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let _ = key;
        todo!()
    }

    /// Required u32 value (any integer width that fits).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let _ = key;
        todo!()
    }

    /// Required float value (f32, f64 or integer).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let _ = key;
        todo!()
    }

    /// Hyperparameter `{arch}.{name}`, e.g. `hparam_u32("block_count")` reads `qwen2.block_count`.
    pub fn hparam_u32(&self, name: &str) -> Result<u32, GgufError> {
        let _ = name;
        todo!()
    }

    /// Float hyperparameter `{arch}.{name}`.
    pub fn hparam_f32(&self, name: &str) -> Result<f32, GgufError> {
        let _ = name;
        todo!()
    }

    /// Optional hyperparameter `{arch}.{name}`: `Ok(None)` when absent, `Err` when mistyped.
    pub fn hparam_u32_opt(&self, name: &str) -> Result<Option<u32>, GgufError> {
        let _ = name;
        todo!()
    }

    /// Optional float hyperparameter `{arch}.{name}`.
    pub fn hparam_f32_opt(&self, name: &str) -> Result<Option<f32>, GgufError> {
        let _ = name;
        todo!()
    }

    /// Tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        todo!()
    }

    /// A tensor's header by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let _ = name;
        todo!()
    }

    /// Zero-copy view of a tensor's bytes (validated at open time to lie inside the file).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let _ = info;
        todo!()
    }

    /// `general.alignment` (default 32).
    pub fn alignment(&self) -> u64 {
        todo!()
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        todo!()
    }

    /// Total size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        todo!()
    }
}
