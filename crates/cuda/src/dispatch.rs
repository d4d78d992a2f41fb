//! Kernel choice and launch geometry, as pure functions of shapes and weight types (no
//! device needed, so they are tested on every machine).
//!
//! Matmul: up to [`MATVEC_MAX_TOKENS`] tokens (decode, and small batches of concurrent
//! sequences) run the mat-vec kernel, which dequantizes each weight sub-block from the
//! GGUF layout once for all of them; wider inputs against a quantized weight quantize the
//! activation as the CPU does and run the int8 (dp4a) kernel; f32 and f16 weights keep
//! the mat-vec kernel at every width, tiled over tokens.

use minfer_gguf::GgmlType;

use crate::kernels::{ActQuant, Kernel, MMQ_TYPES, WEIGHT_TYPES};

/// Widest input the mat-vec kernel takes for a quantized weight before the int8 path.
pub const MATVEC_MAX_TOKENS: usize = 8;
/// Tokens one mat-vec or int8 block handles per pass (`MV_TOKENS` / `MQ_TOKENS`).
pub const TOKENS_PER_PASS: usize = 8;
/// Weight rows per block of the matmul kernels (one warp each).
pub const ROWS_PER_BLOCK: usize = 4;
/// Threads of the attention block (`ATTN_THREADS`), also keys per chunk.
pub const ATTN_THREADS: usize = 128;
/// Largest head dimension the attention kernel holds (two dims per thread).
pub const ATTN_MAX_HD: usize = 2 * ATTN_THREADS;
/// Threads of the element-wise kernels' blocks.
pub const ELEMENTWISE_THREADS: usize = 256;
/// Largest grid extent along y and z.
pub const MAX_GRID_YZ: usize = 65_535;
/// Largest grid extent along x.
pub const MAX_GRID_X: usize = (1 << 31) - 1;

/// A kernel launch's grid, block and dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geom {
    /// Blocks along x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block (1-D).
    pub block: u32,
    /// Dynamic shared memory in bytes.
    pub smem: u32,
}

fn geom(gx: usize, gy: usize, block: usize, smem: usize) -> Result<Geom, String> {
    if gx > MAX_GRID_X || gy > MAX_GRID_YZ {
        return Err(format!(
            "a grid of {gx} x {gy} blocks exceeds the device's launch limits"
        ));
    }
    Ok(Geom {
        grid: (gx.max(1) as u32, gy.max(1) as u32, 1),
        block: block as u32,
        smem: smem as u32,
    })
}

/// The matmul kernel for a weight of type `ty` over `nt` tokens, with the activation
/// quantizer it needs first (if any); `Err` for a type no kernel decodes.
pub fn matmul_kernel(ty: GgmlType, nt: usize) -> Result<(Kernel, Option<ActQuant>), String> {
    if !WEIGHT_TYPES.contains(&ty) {
        return Err(format!("no CUDA matmul kernel decodes {ty}"));
    }
    if nt > MATVEC_MAX_TOKENS && MMQ_TYPES.contains(&ty) {
        let q = ActQuant::for_weight(ty).ok_or_else(|| format!("no activation format for {ty}"))?;
        return Ok((Kernel::Mmq(ty), Some(q)));
    }
    Ok((Kernel::MatVec(ty), None))
}

/// Geometry of the mat-vec and int8 matmul kernels: blocks of four row-warps, one block
/// row per pass of [`TOKENS_PER_PASS`] tokens.
pub fn matmul_geom(rows: usize, nt: usize) -> Result<Geom, String> {
    geom(
        rows.div_ceil(ROWS_PER_BLOCK),
        nt.div_ceil(TOKENS_PER_PASS),
        32 * ROWS_PER_BLOCK,
        0,
    )
}

/// Geometry of an activation quantizer: one warp per (group, token).
pub fn quant_geom(q: ActQuant, in_dim: usize, nt: usize) -> Result<Geom, String> {
    if !in_dim.is_multiple_of(q.group()) {
        return Err(format!(
            "rows of {in_dim} values are not whole groups of {}",
            q.group()
        ));
    }
    geom(in_dim / q.group(), nt, 32, 0)
}

/// Bytes of scratch an int8 matmul's quantized activation needs: `nt x in_dim` i8 values
/// and one f32 scale per 32 values (the Q8_K scales use the same stride).
pub fn quant_scratch_bytes(in_dim: usize, nt: usize) -> usize {
    nt * in_dim + 4 * nt * in_dim.div_ceil(32)
}

/// One thread per value in blocks of [`ELEMENTWISE_THREADS`].
pub fn elementwise_geom(n: usize) -> Result<Geom, String> {
    geom(n.div_ceil(ELEMENTWISE_THREADS), 1, ELEMENTWISE_THREADS, 0)
}

/// One block of 256 threads per row.
pub fn norm_geom(rows: usize) -> Result<Geom, String> {
    geom(rows, 1, 256, 0)
}

/// One block per token.
pub fn embed_geom(nt: usize) -> Result<Geom, String> {
    geom(nt, 1, 128, 0)
}

/// Attention: one block per (head, token); dynamic shared memory holds q, the chunk's
/// probabilities and the reduction slots.
pub fn attn_geom(n_head: usize, nt: usize, hd: usize) -> Result<Geom, String> {
    if hd == 0 || hd > ATTN_MAX_HD {
        return Err(format!(
            "head dim {hd} is outside the attention kernel's 1..={ATTN_MAX_HD}"
        ));
    }
    geom(n_head, nt, ATTN_THREADS, attn_smem_bytes(hd))
}

/// Dynamic shared memory of the attention kernel for head dim `hd`.
pub fn attn_smem_bytes(hd: usize) -> usize {
    4 * (hd + ATTN_THREADS + 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_takes_the_matvec_kernel_and_prefill_the_int8_one() {
        for ty in MMQ_TYPES {
            assert_eq!(matmul_kernel(ty, 1).unwrap(), (Kernel::MatVec(ty), None));
            assert_eq!(
                matmul_kernel(ty, MATVEC_MAX_TOKENS).unwrap().0,
                Kernel::MatVec(ty)
            );
            let (k, q) = matmul_kernel(ty, MATVEC_MAX_TOKENS + 1).unwrap();
            assert_eq!(k, Kernel::Mmq(ty));
            assert_eq!(q, ActQuant::for_weight(ty));
        }
        assert_eq!(
            matmul_kernel(GgmlType::Q4K, 512).unwrap().1,
            Some(ActQuant::Q8K)
        );
        assert_eq!(
            matmul_kernel(GgmlType::Q8_0, 512).unwrap().1,
            Some(ActQuant::Q8_0)
        );
        assert_eq!(
            matmul_kernel(GgmlType::Iq4Xs, 9).unwrap(),
            (Kernel::Mmq(GgmlType::Iq4Xs), Some(ActQuant::Q8K))
        );
        assert_eq!(
            matmul_kernel(GgmlType::Iq4Nl, 9).unwrap().1,
            Some(ActQuant::Q8_0)
        );
        // Float weights stay on the mat-vec kernel, tiled over tokens.
        for ty in [GgmlType::F32, GgmlType::F16] {
            assert_eq!(matmul_kernel(ty, 512).unwrap(), (Kernel::MatVec(ty), None));
        }
        let e = matmul_kernel(GgmlType::Q4_1, 1).unwrap_err();
        assert!(e.contains("Q4_1"), "{e}");
    }

    #[test]
    fn matmul_geometry_covers_every_row_and_token() {
        // The default model's lm head: 151936 rows, decode and a 512-token prefill.
        let g = matmul_geom(151_936, 1).unwrap();
        assert_eq!(g.grid, (37_984, 1, 1));
        assert_eq!(g.block, 128);
        let g = matmul_geom(896, 512).unwrap();
        assert_eq!(g.grid, (224, 64, 1));
        let g = matmul_geom(5, 9).unwrap();
        assert_eq!(g.grid, (2, 2, 1), "partial row and token tiles round up");
        assert!(matmul_geom(4, TOKENS_PER_PASS * (MAX_GRID_YZ + 1)).is_err());
    }

    #[test]
    fn quantizer_geometry_and_scratch() {
        assert_eq!(quant_geom(ActQuant::Q8_0, 896, 7).unwrap().grid, (28, 7, 1));
        assert_eq!(quant_geom(ActQuant::Q8K, 4864, 3).unwrap().grid, (19, 3, 1));
        let e = quant_geom(ActQuant::Q8K, 896, 1).unwrap_err();
        assert!(e.contains("896") && e.contains("256"), "{e}");
        assert_eq!(quant_scratch_bytes(64, 2), 128 + 4 * 4);
    }

    #[test]
    fn attention_shared_memory_and_limits() {
        let g = attn_geom(14, 1, 64).unwrap();
        assert_eq!(g.grid, (14, 1, 1));
        assert_eq!(g.block, ATTN_THREADS as u32);
        assert_eq!(g.smem, 4 * (64 + 128 + 8));
        assert_eq!(attn_geom(32, 4, 128).unwrap().smem, 4 * (128 + 128 + 8));
        // Within the 48 KiB every device grants without opting in.
        assert!(attn_smem_bytes(ATTN_MAX_HD) <= 48 * 1024);
        assert!(attn_geom(8, 1, ATTN_MAX_HD + 1).is_err());
        assert!(attn_geom(8, 1, 0).is_err());
        assert!(attn_geom(8, MAX_GRID_YZ + 1, 64).is_err());
    }

    #[test]
    fn elementwise_and_row_geometry() {
        assert_eq!(elementwise_geom(0).unwrap().grid, (1, 1, 1));
        assert_eq!(elementwise_geom(257).unwrap().grid, (2, 1, 1));
        assert_eq!(norm_geom(14).unwrap().grid, (14, 1, 1));
        assert_eq!(embed_geom(3).unwrap().grid, (3, 1, 1));
    }
}
