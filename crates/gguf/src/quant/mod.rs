//! Block layouts and scalar reference quantize/dequantize for every supported type.
//!
//! API CONTRACT (the writer and the CPU backend are written against these; keep them).
//!
//! Each quantized type has a `#[repr(C)]` block struct whose size equals
//! [`GgmlType::type_size`] and whose field order is ggml's on-disk layout, so tensor bytes
//! can be viewed as `&[Block]` ([`cast_blocks`]) when aligned, or read block by block
//! ([`Block::from_bytes`]) when not. Scale fields are [`half::f16`] (a transparent `u16`),
//! so most blocks have alignment 2; [`BlockQ8K`]'s `f32` scale makes it alignment 4, and
//! [`BlockMxfp4`] and [`BlockIq1M`] (byte fields only) have alignment 1. The float types
//! (F32, F16, BF16) have block size 1 and use `f32`, [`half::f16`] and [`half::bf16`]
//! directly.
//!
//! Every block type implements [`Block`] (decoding). Dequantization reproduces ggml's
//! `dequantize_row_*` bit for bit (same operation order, no fused multiply-add).
//! Types with an encoder also implement [`Quantize`] ([`has_quantizer`] says which):
//! the legacy types and k-quants follow ggml's `quantize_row_*_ref`, TQ1_0/TQ2_0/MXFP4 the
//! `gguf` Python package's, IQ4_NL/IQ4_XS use this crate's own scale search (see
//! `iq4`), and the lattice i-quants (IQ1/IQ2/IQ3) follow ggml's `quantize_row_iq*_impl`
//! byte for byte (`lattice` holds the grids' neighbour maps, `iq_search` the shared
//! sub-block search). Those take optional importance weights through their blocks'
//! `quantize_weighted`; [`Quantize::quantize`] passes none. With an importance matrix,
//! [`quantize_rows_weighted`] encodes whole rows as ggml's `quantize_<type>` does when
//! given `quant_weights`: the lattice types, IQ4_NL, IQ4_XS and Q6_K through their
//! `quantize_weighted`, the other k-quants and the 4/5-bit legacy types through
//! `weighted` (ggml's `quantize_row_*_impl`).

mod common;
mod float;
mod iq1;
mod iq2;
mod iq3;
mod iq4;
mod iq_grids;
mod iq_search;
mod lattice;
mod mxfp4;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod q8_k;
mod tq;
mod weighted;

pub use weighted::{quantize_rows_weighted, uses_importance};

pub use iq1::{BlockIq1M, BlockIq1S, IQ1S_DELTA};
pub use iq2::{BlockIq2S, BlockIq2Xs, BlockIq2Xxs, KSIGNS_IQ2XS};
pub use iq3::{BlockIq3S, BlockIq3Xxs};
pub use iq4::{BlockIq4Nl, BlockIq4Xs, KVALUES_IQ4NL};
pub use iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
pub use mxfp4::{e8m0_to_f32_half, BlockMxfp4, KVALUES_MXFP4};
pub use q2_k::BlockQ2K;
pub use q3_k::BlockQ3K;
pub use q4_0::BlockQ4_0;
pub use q4_1::BlockQ4_1;
pub use q4_k::{scale_min_k4, BlockQ4K};
pub use q5_0::BlockQ5_0;
pub use q5_1::BlockQ5_1;
pub use q5_k::BlockQ5K;
pub use q6_k::BlockQ6K;
pub use q8_0::BlockQ8_0;
pub use q8_k::BlockQ8K;
pub use tq::{BlockTq1_0, BlockTq2_0};

use crate::types::GgmlType;

// The block structs mirror little-endian on-disk bytes field by field.
#[cfg(not(target_endian = "little"))]
compile_error!(
    "minfer-gguf reinterprets little-endian GGUF tensor data and needs a little-endian target"
);

/// Errors of the reference (de)quantizers.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a multiple of the type's block size.
    #[error("{ty}: {n} elements is not a multiple of the block size {block}")]
    NotBlockMultiple {
        /// The tensor type.
        ty: GgmlType,
        /// The element count given.
        n: usize,
        /// The type's block size.
        block: usize,
    },
    /// Source and destination lengths disagree.
    #[error("{ty}: buffer of {got} bytes, expected {expected}")]
    Length {
        /// The tensor type.
        ty: GgmlType,
        /// The byte count given.
        got: usize,
        /// The byte count the element count needs.
        expected: usize,
    },
    /// Importance weights of the wrong length for the rows.
    #[error("{ty}: {got} importance weights for rows of {expected} values")]
    Weights {
        /// The tensor type.
        ty: GgmlType,
        /// The weight count given.
        got: usize,
        /// The row length.
        expected: usize,
    },
    /// The type decodes but has no encoder here.
    #[error("{0}: no quantizer for this type (it can be read but not written)")]
    NoQuantizer(GgmlType),
}

/// One ggml quantization block: plain bytes (`Pod`) laid out exactly as on disk.
pub trait Block: bytemuck::Pod {
    /// The tensor type whose blocks these are.
    const TYPE: GgmlType;
    /// Elements one block encodes (`TYPE.block_size()`).
    const ELEMS: usize;

    /// Decodes the block into `out[..Self::ELEMS]`, exactly as ggml's `dequantize_row_*`.
    ///
    /// # Panics
    /// If `out` is shorter than `Self::ELEMS`.
    fn dequantize(&self, out: &mut [f32]);

    /// Reads one block by value from `bytes` of any alignment; `None` unless
    /// `bytes.len()` is exactly the block size.
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        (bytes.len() == std::mem::size_of::<Self>()).then(|| bytemuck::pod_read_unaligned(bytes))
    }

    /// The block's on-disk bytes.
    fn as_bytes(&self) -> &[u8] {
        bytemuck::bytes_of(self)
    }
}

/// A block type with an encoder.
pub trait Quantize: Block {
    /// Encodes `x[..Self::ELEMS]` (as ggml's `quantize_row_*_ref` does where ggml's
    /// reference encoder is the contract; see the module docs for the others).
    ///
    /// # Panics
    /// If `x` is shorter than `Self::ELEMS`.
    fn quantize(x: &[f32]) -> Self;
}

/// Whether [`quantize`] can write `ty`: every supported type has an encoder (kept for
/// callers that must refuse decode-only types, should one be added).
pub fn has_quantizer(_ty: GgmlType) -> bool {
    true
}

/// Views `bytes` as whole blocks without copying; `None` when the length is not a multiple
/// of the block size or the start is not aligned for `B` (`align_of::<B>()`).
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Option<&[B]> {
    bytemuck::try_cast_slice(bytes).ok()
}

/// Mutable counterpart of [`cast_blocks`].
pub fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> Option<&mut [B]> {
    bytemuck::try_cast_slice_mut(bytes).ok()
}

/// Checks that `n` elements of `ty` occupy exactly `bytes` bytes.
fn check_lengths(ty: GgmlType, n: usize, bytes: usize) -> Result<(), QuantError> {
    let block = ty.block_size();
    let blocks = n / block;
    if blocks * block != n {
        return Err(QuantError::NotBlockMultiple { ty, n, block });
    }
    let expected = blocks
        .checked_mul(ty.type_size())
        .ok_or(QuantError::NotBlockMultiple { ty, n, block })?;
    if bytes != expected {
        return Err(QuantError::Length {
            ty,
            got: bytes,
            expected,
        });
    }
    Ok(())
}

/// Dequantizes whole blocks; lengths were checked by the caller.
fn dequantize_blocks<B: Block>(src: &[u8], dst: &mut [f32]) {
    let size = std::mem::size_of::<B>();
    for (bytes, out) in src.chunks_exact(size).zip(dst.chunks_exact_mut(B::ELEMS)) {
        // Reading by value keeps unaligned test slices and mmap'd data on one path.
        let block: B = bytemuck::pod_read_unaligned(bytes);
        block.dequantize(out);
    }
}

/// Quantizes whole blocks; lengths were checked by the caller.
fn quantize_blocks<B: Quantize>(src: &[f32], dst: &mut [u8]) {
    let size = std::mem::size_of::<B>();
    for (x, bytes) in src.chunks_exact(B::ELEMS).zip(dst.chunks_exact_mut(size)) {
        bytes.copy_from_slice(B::quantize(x).as_bytes());
    }
}

/// Dequantizes `src` (whole blocks of `ty`) into `dst` (`dst.len()` elements).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_lengths(ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => float::f32_from_bytes(src, dst),
        GgmlType::F16 => float::f16_from_bytes(src, dst),
        GgmlType::BF16 => float::bf16_from_bytes(src, dst),
        GgmlType::Q4_0 => dequantize_blocks::<BlockQ4_0>(src, dst),
        GgmlType::Q4_1 => dequantize_blocks::<BlockQ4_1>(src, dst),
        GgmlType::Q5_0 => dequantize_blocks::<BlockQ5_0>(src, dst),
        GgmlType::Q5_1 => dequantize_blocks::<BlockQ5_1>(src, dst),
        GgmlType::Q8_0 => dequantize_blocks::<BlockQ8_0>(src, dst),
        GgmlType::Q2K => dequantize_blocks::<BlockQ2K>(src, dst),
        GgmlType::Q3K => dequantize_blocks::<BlockQ3K>(src, dst),
        GgmlType::Q4K => dequantize_blocks::<BlockQ4K>(src, dst),
        GgmlType::Q5K => dequantize_blocks::<BlockQ5K>(src, dst),
        GgmlType::Q6K => dequantize_blocks::<BlockQ6K>(src, dst),
        GgmlType::Q8K => dequantize_blocks::<BlockQ8K>(src, dst),
        GgmlType::Iq2Xxs => dequantize_blocks::<BlockIq2Xxs>(src, dst),
        GgmlType::Iq2Xs => dequantize_blocks::<BlockIq2Xs>(src, dst),
        GgmlType::Iq2S => dequantize_blocks::<BlockIq2S>(src, dst),
        GgmlType::Iq3Xxs => dequantize_blocks::<BlockIq3Xxs>(src, dst),
        GgmlType::Iq3S => dequantize_blocks::<BlockIq3S>(src, dst),
        GgmlType::Iq1S => dequantize_blocks::<BlockIq1S>(src, dst),
        GgmlType::Iq1M => dequantize_blocks::<BlockIq1M>(src, dst),
        GgmlType::Iq4Nl => dequantize_blocks::<BlockIq4Nl>(src, dst),
        GgmlType::Iq4Xs => dequantize_blocks::<BlockIq4Xs>(src, dst),
        GgmlType::Tq1_0 => dequantize_blocks::<BlockTq1_0>(src, dst),
        GgmlType::Tq2_0 => dequantize_blocks::<BlockTq2_0>(src, dst),
        GgmlType::Mxfp4 => dequantize_blocks::<BlockMxfp4>(src, dst),
    }
    Ok(())
}

/// Quantizes `src` into `dst` (exactly `ty.bytes_for(src.len())` bytes) with the type's
/// [`Quantize`] encoder; [`QuantError::NoQuantizer`] for types without one.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_lengths(ty, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => float::f32_to_bytes(src, dst),
        GgmlType::F16 => float::f16_to_bytes(src, dst),
        GgmlType::BF16 => float::bf16_to_bytes(src, dst),
        GgmlType::Q4_0 => quantize_blocks::<BlockQ4_0>(src, dst),
        GgmlType::Q4_1 => quantize_blocks::<BlockQ4_1>(src, dst),
        GgmlType::Q5_0 => quantize_blocks::<BlockQ5_0>(src, dst),
        GgmlType::Q5_1 => quantize_blocks::<BlockQ5_1>(src, dst),
        GgmlType::Q8_0 => quantize_blocks::<BlockQ8_0>(src, dst),
        GgmlType::Q2K => quantize_blocks::<BlockQ2K>(src, dst),
        GgmlType::Q3K => quantize_blocks::<BlockQ3K>(src, dst),
        GgmlType::Q4K => quantize_blocks::<BlockQ4K>(src, dst),
        GgmlType::Q5K => quantize_blocks::<BlockQ5K>(src, dst),
        GgmlType::Q6K => quantize_blocks::<BlockQ6K>(src, dst),
        GgmlType::Q8K => quantize_blocks::<BlockQ8K>(src, dst),
        GgmlType::Iq4Nl => quantize_blocks::<BlockIq4Nl>(src, dst),
        GgmlType::Iq4Xs => quantize_blocks::<BlockIq4Xs>(src, dst),
        GgmlType::Tq1_0 => quantize_blocks::<BlockTq1_0>(src, dst),
        GgmlType::Tq2_0 => quantize_blocks::<BlockTq2_0>(src, dst),
        GgmlType::Mxfp4 => quantize_blocks::<BlockMxfp4>(src, dst),
        GgmlType::Iq2Xxs => quantize_blocks::<BlockIq2Xxs>(src, dst),
        GgmlType::Iq2Xs => quantize_blocks::<BlockIq2Xs>(src, dst),
        GgmlType::Iq2S => quantize_blocks::<BlockIq2S>(src, dst),
        GgmlType::Iq3Xxs => quantize_blocks::<BlockIq3Xxs>(src, dst),
        GgmlType::Iq3S => quantize_blocks::<BlockIq3S>(src, dst),
        GgmlType::Iq1S => quantize_blocks::<BlockIq1S>(src, dst),
        GgmlType::Iq1M => quantize_blocks::<BlockIq1M>(src, dst),
    }
    Ok(())
}

/// Convenience: dequantize `n` elements into a new vector.
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8], n: usize) -> Result<Vec<f32>, QuantError> {
    // Validate before allocating so a bogus `n` cannot request a huge buffer.
    check_lengths(ty, n, src.len())?;
    let mut out = vec![0.0; n];
    dequantize(ty, src, &mut out)?;
    Ok(out)
}

/// Convenience: quantize into a new byte vector.
pub fn quantize_to_vec(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let n = src.len();
    let bytes = ty.bytes_for(n as u64).ok_or(QuantError::NotBlockMultiple {
        ty,
        n,
        block: ty.block_size(),
    })? as usize;
    let mut out = vec![0u8; bytes];
    quantize(ty, src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ALL_TYPES;

    fn block_size_of(ty: GgmlType) -> usize {
        match ty {
            GgmlType::F32 => std::mem::size_of::<f32>(),
            GgmlType::F16 => std::mem::size_of::<half::f16>(),
            GgmlType::BF16 => std::mem::size_of::<half::bf16>(),
            GgmlType::Q4_0 => std::mem::size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => std::mem::size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => std::mem::size_of::<BlockQ5_0>(),
            GgmlType::Q5_1 => std::mem::size_of::<BlockQ5_1>(),
            GgmlType::Q8_0 => std::mem::size_of::<BlockQ8_0>(),
            GgmlType::Q2K => std::mem::size_of::<BlockQ2K>(),
            GgmlType::Q3K => std::mem::size_of::<BlockQ3K>(),
            GgmlType::Q4K => std::mem::size_of::<BlockQ4K>(),
            GgmlType::Q5K => std::mem::size_of::<BlockQ5K>(),
            GgmlType::Q6K => std::mem::size_of::<BlockQ6K>(),
            GgmlType::Q8K => std::mem::size_of::<BlockQ8K>(),
            GgmlType::Iq2Xxs => std::mem::size_of::<BlockIq2Xxs>(),
            GgmlType::Iq2Xs => std::mem::size_of::<BlockIq2Xs>(),
            GgmlType::Iq2S => std::mem::size_of::<BlockIq2S>(),
            GgmlType::Iq3Xxs => std::mem::size_of::<BlockIq3Xxs>(),
            GgmlType::Iq3S => std::mem::size_of::<BlockIq3S>(),
            GgmlType::Iq1S => std::mem::size_of::<BlockIq1S>(),
            GgmlType::Iq1M => std::mem::size_of::<BlockIq1M>(),
            GgmlType::Iq4Nl => std::mem::size_of::<BlockIq4Nl>(),
            GgmlType::Iq4Xs => std::mem::size_of::<BlockIq4Xs>(),
            GgmlType::Tq1_0 => std::mem::size_of::<BlockTq1_0>(),
            GgmlType::Tq2_0 => std::mem::size_of::<BlockTq2_0>(),
            GgmlType::Mxfp4 => std::mem::size_of::<BlockMxfp4>(),
        }
    }

    #[test]
    fn struct_sizes_match_the_type_table() {
        for ty in ALL_TYPES {
            assert_eq!(block_size_of(ty), ty.type_size(), "{ty}");
        }
        assert_eq!(std::mem::align_of::<BlockQ4K>(), 2);
        assert_eq!(std::mem::align_of::<BlockQ6K>(), 2);
        assert_eq!(std::mem::align_of::<BlockQ8K>(), 4);
    }

    #[test]
    fn dequantize_rejects_partial_blocks() {
        let mut dst = vec![0.0; 33];
        let err = dequantize(GgmlType::Q4_0, &[0; 36], &mut dst).unwrap_err();
        assert!(matches!(
            err,
            QuantError::NotBlockMultiple {
                ty: GgmlType::Q4_0,
                n: 33,
                block: 32
            }
        ));
        assert!(err
            .to_string()
            .contains("not a multiple of the block size 32"));
    }

    #[test]
    fn dequantize_rejects_wrong_byte_counts() {
        let mut dst = vec![0.0; 256];
        let err = dequantize(GgmlType::Q4K, &[0; 143], &mut dst).unwrap_err();
        assert!(matches!(
            err,
            QuantError::Length {
                ty: GgmlType::Q4K,
                got: 143,
                expected: 144
            }
        ));
        let mut dst = vec![0.0; 3];
        let err = dequantize(GgmlType::F16, &[0; 8], &mut dst).unwrap_err();
        assert!(matches!(
            err,
            QuantError::Length {
                got: 8,
                expected: 6,
                ..
            }
        ));
    }

    #[test]
    fn quantize_rejects_wrong_lengths() {
        let src = vec![0.5; 64];
        let mut dst = vec![0u8; 35];
        let err = quantize(GgmlType::Q8_0, &src, &mut dst).unwrap_err();
        assert!(matches!(
            err,
            QuantError::Length {
                got: 35,
                expected: 68,
                ..
            }
        ));
        let err = quantize(GgmlType::Q6K, &src, &mut dst).unwrap_err();
        assert!(matches!(
            err,
            QuantError::NotBlockMultiple {
                n: 64,
                block: 256,
                ..
            }
        ));
        assert!(matches!(
            quantize_to_vec(GgmlType::Q5_1, &src[..40]),
            Err(QuantError::NotBlockMultiple { n: 40, .. })
        ));
        assert!(matches!(
            dequantize_to_vec(GgmlType::Q8K, &[0; 10], 256),
            Err(QuantError::Length {
                got: 10,
                expected: 292,
                ..
            })
        ));
    }

    #[test]
    fn every_type_has_an_encoder_and_the_refusal_names_the_type() {
        assert!(ALL_TYPES.into_iter().all(has_quantizer));
        // The lattice i-quants encode an all-zero block to zeros.
        for ty in [GgmlType::Iq2Xxs, GgmlType::Iq3S, GgmlType::Iq1M] {
            let q = quantize_to_vec(ty, &[0.0; 256]).unwrap();
            assert!(dequantize_to_vec(ty, &q, 256)
                .unwrap()
                .iter()
                .all(|&v| v == 0.0));
        }
        // The error a future decode-only type would raise still names it.
        let err = QuantError::NoQuantizer(GgmlType::Iq2Xxs);
        assert!(err.to_string().contains("IQ2_XXS"), "{err}");
    }

    #[test]
    fn empty_input_is_fine_for_every_type() {
        for ty in ALL_TYPES.into_iter().filter(|&t| has_quantizer(t)) {
            assert_eq!(quantize_to_vec(ty, &[]).unwrap(), Vec::<u8>::new());
        }
        for ty in ALL_TYPES {
            assert_eq!(dequantize_to_vec(ty, &[], 0).unwrap(), Vec::<f32>::new());
        }
    }

    #[test]
    fn cast_blocks_checks_length_and_alignment() {
        let storage = vec![0u32; 2 * 292 / 4 + 1];
        let bytes: &[u8] = bytemuck::cast_slice(&storage);
        assert_eq!(
            cast_blocks::<BlockQ8K>(&bytes[..584]).map(<[_]>::len),
            Some(2)
        );
        assert!(cast_blocks::<BlockQ8K>(&bytes[..583]).is_none());
        assert!(cast_blocks::<BlockQ8K>(&bytes[2..294]).is_none());
        assert_eq!(
            cast_blocks::<BlockQ4_0>(&bytes[2..38]).map(<[_]>::len),
            Some(2)
        );
        assert!(cast_blocks::<BlockQ4_0>(&bytes[1..37]).is_none());
    }

    #[test]
    fn unaligned_input_dequantizes_like_aligned_input() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        for ty in [GgmlType::Q4K, GgmlType::Q8K, GgmlType::Q5_0, GgmlType::F32] {
            let q = quantize_to_vec(ty, &x).unwrap();
            let mut shifted = vec![0u8; q.len() + 1];
            shifted[1..].copy_from_slice(&q);
            let a = dequantize_to_vec(ty, &q, x.len()).unwrap();
            let b = dequantize_to_vec(ty, &shifted[1..], x.len()).unwrap();
            assert_eq!(a, b, "{ty}");
        }
    }

    #[test]
    fn non_finite_input_does_not_panic() {
        let mut x = vec![1.0f32; 256];
        x[3] = f32::NAN;
        x[7] = f32::INFINITY;
        x[100] = f32::NEG_INFINITY;
        x[200] = f32::MAX;
        for ty in ALL_TYPES.into_iter().filter(|&t| has_quantizer(t)) {
            let q = quantize_to_vec(ty, &x).unwrap();
            assert_eq!(dequantize_to_vec(ty, &q, 256).unwrap().len(), 256);
        }
    }
}
