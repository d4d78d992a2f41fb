//! Block layouts and scalar reference quantize/dequantize for every supported type.
//!
//! API CONTRACT (the writer and the CPU backend are written against these; keep them).

use crate::types::GgmlType;

/// Errors of the reference (de)quantizers.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a multiple of the type's block size.
    #[error("{ty}: {n} elements is not a multiple of the block size {block}")]
    NotBlockMultiple { ty: GgmlType, n: usize, block: usize },
    /// Source and destination lengths disagree.
    #[error("{ty}: buffer of {got} bytes, expected {expected}")]
    Length {
        ty: GgmlType,
        got: usize,
        expected: usize,
    },
}

/// Dequantizes `src` (whole blocks of `ty`) into `dst` (`dst.len()` elements).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let _ = (ty, src, dst);
    todo!()
}

/// Quantizes `src` into `dst` (exactly `ty.bytes_for(src.len())` bytes), as ggml's reference
/// `quantize_row_*_ref` does.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let _ = (ty, src, dst);
    todo!()
}

/// Convenience: dequantize `n` elements into a new vector.
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8], n: usize) -> Result<Vec<f32>, QuantError> {
    let mut out = vec![0.0; n];
    dequantize(ty, src, &mut out)?;
    Ok(out)
}

/// Convenience: quantize into a new byte vector.
pub fn quantize_to_vec(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let n = src.len();
    let bytes = ty
        .bytes_for(n as u64)
        .ok_or(QuantError::NotBlockMultiple {
            ty,
            n,
            block: ty.block_size(),
        })? as usize;
    let mut out = vec![0u8; bytes];
    quantize(ty, src, &mut out)?;
    Ok(out)
}
