//! Typed errors of the GGUF reader and writer.
//!
//! Every parse error names what was being read (`what`, e.g. ``tensor info #12
//! `blk.0.attn_q.weight` dims``) and the absolute byte offset where it sits, and renders as
//! a single line.

use crate::quant::QuantError;
use crate::types::GgmlType;

/// Every way a GGUF file can be refused. Each variant names the field and byte offset.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// I/O failure opening, mapping or writing the file.
    #[error("cannot access {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A required metadata key is absent.
    #[error("missing metadata key `{}`", .key.escape_debug())]
    MissingKey { key: String },
    /// A metadata key holds a value of the wrong type.
    #[error("metadata key `{}` has type {found}, expected {expected}", .key.escape_debug())]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    /// A metadata integer does not fit the requested width.
    #[error("metadata key `{}` value {value} does not fit in {expected}", .key.escape_debug())]
    OutOfRange {
        key: String,
        value: String,
        expected: &'static str,
    },
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file: magic at byte 0 is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: Vec<u8> },
    /// A version other than 2 or 3 (v1 used 32-bit counts; big-endian files look like
    /// huge versions).
    #[error("unsupported GGUF version {version} at byte 4 (supported: 2, 3; little-endian only)")]
    UnsupportedVersion { version: u32 },
    /// The file ends (or a length/count points) past the end of the bytes.
    #[error("truncated file: {what} at byte {offset} needs {needed} bytes, {remaining} remain")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        remaining: u64,
    },
    /// A metadata value type id outside the specification.
    #[error("unknown metadata value type {id} in {what} at byte {offset}")]
    UnknownValueType { what: String, offset: u64, id: u32 },
    /// Arrays of arrays nested deeper than the reader accepts.
    #[error("{what} at byte {offset}: arrays nested deeper than {max} levels")]
    NestingTooDeep {
        what: String,
        offset: u64,
        max: usize,
    },
    /// A key, string value or tensor name that is not UTF-8.
    #[error("invalid UTF-8 in {what} at byte {offset}")]
    InvalidUtf8 { what: String, offset: u64 },
    /// The same metadata key appears twice.
    #[error("duplicate metadata key `{}` at byte {offset}", .key.escape_debug())]
    DuplicateKey { key: String, offset: u64 },
    /// The same tensor name appears twice.
    #[error("duplicate tensor name `{}` in tensor info #{index} at byte {offset}", .name.escape_debug())]
    DuplicateTensor {
        name: String,
        index: u64,
        offset: u64,
    },
    /// `general.alignment` is not a nonzero power of two (or not an integer).
    #[error("invalid general.alignment {value} at byte {offset}: must be a nonzero power of two")]
    BadAlignment { value: String, offset: u64 },
    /// More dimensions than ggml supports.
    #[error("tensor info #{index} `{}` n_dims at byte {offset} is {n_dims}, at most 4 allowed", .name.escape_debug())]
    TooManyDims {
        name: String,
        index: u64,
        offset: u64,
        n_dims: u32,
    },
    /// A negative dimension, or elements / bytes overflowing.
    #[error("tensor info #{index} `{}` dims {dims:?} at byte {offset}: {reason}", .name.escape_debug())]
    BadDims {
        name: String,
        index: u64,
        offset: u64,
        dims: Vec<u64>,
        reason: &'static str,
    },
    /// A tensor type id minfer does not know.
    #[error("tensor info #{index} `{}` type at byte {offset}: unknown ggml type id {id}", .name.escape_debug())]
    UnknownTensorType {
        name: String,
        index: u64,
        offset: u64,
        id: u32,
    },
    /// `dims[0]` is not a multiple of the type's block size.
    #[error(
        "tensor info #{index} `{}` row length {row} at byte {offset} is not a multiple of \
         the {ty} block size {block}", .name.escape_debug())]
    RowNotBlockMultiple {
        name: String,
        index: u64,
        offset: u64,
        ty: GgmlType,
        row: u64,
        block: usize,
    },
    /// A tensor data offset that is not a multiple of the alignment.
    #[error(
        "tensor info #{index} `{}` data offset {data_offset} at byte {offset} is not a \
         multiple of the alignment {alignment}", .name.escape_debug())]
    MisalignedTensor {
        name: String,
        index: u64,
        offset: u64,
        data_offset: u64,
        alignment: u64,
    },
    /// Tensor data that lies (partly) past the end of the file.
    #[error(
        "tensor `{}` data at bytes {start}..{end} lies outside the file of {file_size} bytes", .name.escape_debug())]
    TensorOutOfBounds {
        name: String,
        start: u128,
        end: u128,
        file_size: u64,
    },
    /// Two tensors whose data ranges overlap.
    #[error(
        "tensor `{}` data at bytes {start}..{end} overlaps tensor `{}` data ending at \
         byte {other_end}", .name.escape_debug(), .other.escape_debug())]
    TensorOverlap {
        name: String,
        start: u64,
        end: u64,
        other: String,
        other_end: u64,
    },
    /// The writer was given an inconsistent tensor.
    #[error("cannot write tensor `{}`: {reason}", .name.escape_debug())]
    InvalidTensor { name: String, reason: String },
    /// The writer was given a metadata value it cannot encode.
    #[error("cannot write metadata key `{}`: {reason}", .key.escape_debug())]
    InvalidMeta { key: String, reason: String },
    /// Quantizing a tensor for the writer failed.
    #[error("cannot quantize tensor `{}`: {source}", .name.escape_debug())]
    Quant {
        name: String,
        #[source]
        source: QuantError,
    },
}
