//! Reading one tensor's reference from a GGUF file: its name, presence, shape (GGUF
//! `[in, out]` order, stacked experts `[in, out, n_expert]`) and a type its role can use.
//! The leaf every loader builds on; it imports nothing of the crate but its error type.

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::{WeightRef, WeightType};

use crate::error::ModelError;

/// GGUF name of the token embedding table.
pub const TOKEN_EMBD: &str = "token_embd.weight";
/// GGUF name of the final norm scale.
pub const OUTPUT_NORM: &str = "output_norm.weight";
/// GGUF name of the lm head; absent when tied to [`TOKEN_EMBD`].
pub const OUTPUT: &str = "output.weight";
/// GGUF name of the rope frequency factors (Llama 3 scaling), `[head_dim / 2]` F32.
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// `blk.{il}.{name}.weight`.
pub fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}.weight")
}

/// `blk.{il}.{name}.bias`.
pub fn blk_bias(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}.bias")
}

/// A matrix `name` of GGUF shape `[in_dim, out_dim]`, any known type.
pub(crate) fn matrix(
    file: &GgufFile,
    name: &str,
    in_dim: usize,
    out_dim: usize,
) -> Result<WeightRef, ModelError> {
    let ty = checked(file, name, &[in_dim as u64, out_dim as u64])?;
    Ok(WeightRef::new(name, WeightType(ty.id()), [in_dim, out_dim]))
}

/// A vector `name` of length `len`, stored as F32.
pub(crate) fn vector(file: &GgufFile, name: &str, len: usize) -> Result<WeightRef, ModelError> {
    let ty = checked(file, name, &[len as u64])?;
    if ty != GgmlType::F32 {
        return Err(ModelError::TensorType {
            name: name.to_string(),
            ty,
            reason: "norm scales and biases must be F32",
        });
    }
    Ok(WeightRef::new(name, WeightType::F32, [len, 1]))
}

/// Presence and shape; ggml pads shapes with trailing 1s, so `[n]` equals `[n, 1]`.
fn checked(file: &GgufFile, name: &str, expected: &[u64]) -> Result<GgmlType, ModelError> {
    let info = file.tensor(name).ok_or_else(|| ModelError::MissingTensor {
        name: name.to_string(),
    })?;
    let pad = |d: &[u64]| {
        let mut p = [1u64; 4];
        for (slot, &v) in p.iter_mut().zip(d) {
            *slot = v;
        }
        p
    };
    if info.dims.len() > 4 || pad(&info.dims) != pad(expected) {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            expected: format!("{expected:?}"),
            actual: info.dims.clone(),
        });
    }
    Ok(info.ggml_type)
}

/// A stacked expert tensor `name` of GGUF shape `[in_dim, out_dim, n_expert]`, any known
/// type; its reference carries the folded shape `[in_dim, out_dim * n_expert]` (expert
/// `e` is output rows `e * out_dim ..`), as the backends register it.
pub(crate) fn experts(
    file: &GgufFile,
    name: &str,
    in_dim: usize,
    out_dim: usize,
    n_expert: usize,
) -> Result<WeightRef, ModelError> {
    let ty = checked(
        file,
        name,
        &[in_dim as u64, out_dim as u64, n_expert as u64],
    )?;
    Ok(WeightRef::new(
        name,
        WeightType(ty.id()),
        [in_dim, out_dim * n_expert],
    ))
}

/// Rows of the embedding table (`dims[1]`), which fixes `n_vocab`.
pub(crate) fn vocab_rows(file: &GgufFile, n_embd: usize) -> Result<usize, ModelError> {
    let info = file
        .tensor(TOKEN_EMBD)
        .ok_or_else(|| ModelError::MissingTensor {
            name: TOKEN_EMBD.to_string(),
        })?;
    match info.dims.as_slice() {
        [_, rows] if *rows > 0 => Ok(*rows as usize),
        _ => Err(ModelError::TensorShape {
            name: TOKEN_EMBD.to_string(),
            expected: format!("[{n_embd}, n_vocab]"),
            actual: info.dims.clone(),
        }),
    }
}
