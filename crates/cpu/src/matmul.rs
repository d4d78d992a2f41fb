//! Matrix products `y[t][r] = Σ_c W[r][c] · x[t][c]` over the thread pool.
//!
//! Quantized weights: the activations are quantized once per call (Q8_0 or Q8_K, as the
//! weight type pairs) into reusable scratch, then the output is cut into tiles of whole
//! weight rows claimed dynamically by the threads. Inside a tile the tokens go in groups of
//! four through the multi-row kernels, so each weight block is decoded once per four tokens
//! and the tile's rows stay in cache across the token groups.
//!
//! [`RepackedMatrix`] + [`matmul_repacked`] are the fast path for Q5_0 and Q8_0 weights:
//! repacked once at load (same bytes), 3-5x faster per thread in decode and prefill.
//!
//! Determinism: every output element is one kernel call by one thread, the token grouping
//! does not depend on the thread count, and each kernel's per-token result does not depend
//! on the group size, so results are identical for every `-t`.

use crate::quant::{self, dot_float, dot_unchecked, FloatWeight, Isa, QuantDot};
use crate::threadpool::{chunk_range, ThreadPool};
use half::{bf16, f16};
use minfer_gguf::quant::{
    cast_blocks, Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S,
    BlockIq3Xxs, BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0,
    BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockTq1_0,
    BlockTq2_0,
};
use minfer_gguf::GgmlType;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

mod ids;
mod repacked;
pub use ids::{matmul_id, matmul_id_with, ExpertMatrix, IdScratch};
pub use repacked::{
    matmul_repacked, matmul_repacked_multi, matmul_repacked_multi_then, matmul_repacked_with,
    MultiEpilogue, RepackedMatrix, MULTI_MAX_PARTS,
};

/// Tokens per kernel call in prefill.
const TOKEN_GROUP: usize = 4;
/// Fewest tokens for which a type's 8-row prefill tiles ([`QuantDot::rows8_avx2`]) run:
/// decoding a tile costs about as much as a few tokens' dot products.
const ROWS8_MIN_TOKENS: usize = 8;

/// Whether `B`'s 8-row prefill tiles run for `nt` tokens on `isa`: `Some(vnni)`.
fn rows8_isa<B: QuantDot>(isa: Isa, nt: usize) -> Option<bool> {
    (nt >= ROWS8_MIN_TOKENS)
        .then(|| quant::rows8_kernel::<B>(isa))
        .flatten()
}
/// Rows per tile when decoding one token (small, for load balance).
const DECODE_TILE_ROWS: usize = 16;
/// Target bytes of weights per prefill tile (kept in L1/L2 across token groups).
const PREFILL_TILE_BYTES: usize = 24 * 1024;

/// A weight matrix in GGUF layout: `rows` output rows of `cols` inputs, row-major, each row
/// `cols / block_size` blocks of `ty`.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    /// The element type.
    pub ty: GgmlType,
    /// The raw tensor bytes.
    pub data: &'a [u8],
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

/// Shape, type and alignment errors of [`matmul`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatmulError {
    /// The weight type has no matmul kernel (Q8_K is an activation-only type).
    #[error("{0} weights are not supported by matmul")]
    UnsupportedType(GgmlType),
    /// The row length is not a whole number of blocks.
    #[error("{ty}: {cols} columns is not a multiple of the block size {block}")]
    NotBlockMultiple {
        /// Weight type.
        ty: GgmlType,
        /// Columns given.
        cols: usize,
        /// Block size of the type.
        block: usize,
    },
    /// The weight bytes do not match `rows x cols` of the type.
    #[error("{ty} weights of {rows}x{cols}: {got} bytes, expected {}", expected.map_or("more than fits in memory".to_string(), |e| e.to_string()))]
    WeightBytes {
        /// Weight type.
        ty: GgmlType,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Bytes given.
        got: usize,
        /// Bytes needed (`None` renders as overflow).
        expected: Option<usize>,
    },
    /// The system refused memory for a repacked copy of the weights.
    #[error("no memory for repacked weights: {0}")]
    Memory(String),
    /// The weight bytes are not aligned for the type's blocks.
    #[error("{ty} weight data is not aligned to {align} bytes")]
    Misaligned {
        /// Weight type.
        ty: GgmlType,
        /// Alignment needed.
        align: usize,
    },
    /// `x` is not `nt x cols`.
    #[error("activations: {got} values, expected {nt} tokens x {cols}")]
    Activations {
        /// Values given.
        got: usize,
        /// Tokens.
        nt: usize,
        /// Columns.
        cols: usize,
    },
    /// The matrices of one multi-matrix product do not fit together (type, width, count,
    /// or output rows outside or overlapping).
    #[error("multi-matrix product: {0}")]
    Multi(String),
    /// `y` is not `nt x rows`.
    #[error("output: {got} values, expected {nt} tokens x {rows}")]
    Output {
        /// Values given.
        got: usize,
        /// Tokens.
        nt: usize,
        /// Rows.
        rows: usize,
    },
}

/// Reusable activation buffers; they grow to the largest call and are then reused, so
/// steady-state calls do not allocate.
#[derive(Debug, Default)]
pub struct MatmulScratch {
    q8_0: Vec<BlockQ8_0>,
    q8k: Vec<BlockQ8K>,
    /// Q8_0 scales widened to f32 (repacked kernels).
    yd: Vec<f32>,
    /// Q8_0 level sums per block (repacked kernels).
    ys: Vec<i32>,
}

impl MatmulScratch {
    /// Empty scratch.
    pub fn new() -> Self {
        Self::default()
    }
}

/// An activation block type the driver can quantize into scratch.
trait Activation: Block + Send + Sync {
    fn buffer(s: &mut MatmulScratch) -> &mut Vec<Self>;
    fn quantize_row(isa: Isa, x: &[f32], out: &mut [Self]);
}

impl Activation for BlockQ8_0 {
    fn buffer(s: &mut MatmulScratch) -> &mut Vec<Self> {
        &mut s.q8_0
    }
    fn quantize_row(isa: Isa, x: &[f32], out: &mut [Self]) {
        quant::q8_0_into(isa, x, out);
    }
}

impl Activation for BlockQ8K {
    fn buffer(s: &mut MatmulScratch) -> &mut Vec<Self> {
        &mut s.q8k
    }
    fn quantize_row(isa: Isa, x: &[f32], out: &mut [Self]) {
        quant::q8_k_into(isa, x, out);
    }
}

/// `y[t][r] = Σ_c W[r][c] x[t][c]` for `x` of `nt x cols` and `y` of `nt x rows`
/// (token-major), with the detected ISA.
pub fn matmul(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    nt: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<(), MatmulError> {
    matmul_with(Isa::detect(), pool, w, x, nt, y, scratch)
}

/// [`matmul`] with an explicit ISA.
pub fn matmul_with(
    isa: Isa,
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    nt: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<(), MatmulError> {
    check_shapes(w, x.len(), nt, y.len())?;
    let p = Problem {
        isa,
        rows: w.rows,
        cols: w.cols,
        nt,
    };
    for_type(
        w.ty,
        DenseCall {
            p: &p,
            pool,
            w,
            x,
            y,
            scratch,
        },
    )
}

/// A computation generic over a weight's element type, run by [`for_type`] with the
/// type's block (quantized) or element (float) type.
trait TypeFn {
    type Out;
    /// The computation for a quantized type.
    fn quant<B>(self) -> Result<Self::Out, MatmulError>
    where
        B: QuantDot + Sync,
        B::Act: Activation;
    /// The computation for a float type.
    fn float<W: FloatWeight + bytemuck::Pod + Sync>(self) -> Result<Self::Out, MatmulError>;
}

/// Runs `f` with the Rust types of `ty`: the one table from GGUF types to kernels.
fn for_type<F: TypeFn>(ty: GgmlType, f: F) -> Result<F::Out, MatmulError> {
    match ty {
        GgmlType::F32 => f.float::<f32>(),
        GgmlType::F16 => f.float::<f16>(),
        GgmlType::BF16 => f.float::<bf16>(),
        GgmlType::Q4_0 => f.quant::<BlockQ4_0>(),
        GgmlType::Q4_1 => f.quant::<BlockQ4_1>(),
        GgmlType::Q5_0 => f.quant::<BlockQ5_0>(),
        GgmlType::Q5_1 => f.quant::<BlockQ5_1>(),
        GgmlType::Q8_0 => f.quant::<BlockQ8_0>(),
        GgmlType::Q2K => f.quant::<BlockQ2K>(),
        GgmlType::Q3K => f.quant::<BlockQ3K>(),
        GgmlType::Q4K => f.quant::<BlockQ4K>(),
        GgmlType::Q5K => f.quant::<BlockQ5K>(),
        GgmlType::Q6K => f.quant::<BlockQ6K>(),
        GgmlType::Iq4Nl => f.quant::<BlockIq4Nl>(),
        GgmlType::Mxfp4 => f.quant::<BlockMxfp4>(),
        GgmlType::Iq4Xs => f.quant::<BlockIq4Xs>(),
        GgmlType::Iq3Xxs => f.quant::<BlockIq3Xxs>(),
        GgmlType::Iq3S => f.quant::<BlockIq3S>(),
        GgmlType::Iq2Xxs => f.quant::<BlockIq2Xxs>(),
        GgmlType::Iq2Xs => f.quant::<BlockIq2Xs>(),
        GgmlType::Iq2S => f.quant::<BlockIq2S>(),
        GgmlType::Iq1S => f.quant::<BlockIq1S>(),
        GgmlType::Iq1M => f.quant::<BlockIq1M>(),
        GgmlType::Tq1_0 => f.quant::<BlockTq1_0>(),
        GgmlType::Tq2_0 => f.quant::<BlockTq2_0>(),
        GgmlType::Q8K => Err(MatmulError::UnsupportedType(GgmlType::Q8K)),
    }
}

/// One dense [`matmul_with`] call, dispatched by weight type.
struct DenseCall<'a, 'b> {
    p: &'a Problem,
    pool: &'a ThreadPool,
    w: &'a QMatrix<'b>,
    x: &'a [f32],
    y: &'a mut [f32],
    scratch: &'a mut MatmulScratch,
}

impl TypeFn for DenseCall<'_, '_> {
    type Out = ();
    fn quant<B>(self) -> Result<(), MatmulError>
    where
        B: QuantDot + Sync,
        B::Act: Activation,
    {
        self.p
            .quant::<B>(self.pool, self.w, self.x, self.y, self.scratch)
    }
    fn float<W: FloatWeight + bytemuck::Pod + Sync>(self) -> Result<(), MatmulError> {
        self.p.float::<W>(self.pool, self.w, self.x, self.y)
    }
}

fn check_shapes(w: &QMatrix, x_len: usize, nt: usize, y_len: usize) -> Result<(), MatmulError> {
    let (ty, rows, cols) = (w.ty, w.rows, w.cols);
    if ty == GgmlType::Q8K {
        return Err(MatmulError::UnsupportedType(ty));
    }
    let block = ty.block_size();
    if cols % block != 0 {
        return Err(MatmulError::NotBlockMultiple { ty, cols, block });
    }
    let expected = rows
        .checked_mul(cols / block)
        .and_then(|b| b.checked_mul(ty.type_size()));
    if expected != Some(w.data.len()) {
        return Err(MatmulError::WeightBytes {
            ty,
            rows,
            cols,
            got: w.data.len(),
            expected,
        });
    }
    if nt.checked_mul(cols) != Some(x_len) {
        return Err(MatmulError::Activations {
            got: x_len,
            nt,
            cols,
        });
    }
    if nt.checked_mul(rows) != Some(y_len) {
        return Err(MatmulError::Output {
            got: y_len,
            nt,
            rows,
        });
    }
    Ok(())
}

/// Disjoint mutable access to a slice from several threads.
struct Disjoint<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: threads only touch disjoint index sets (see each use), and `T: Send`.
unsafe impl<T: Send> Sync for Disjoint<T> {}

impl<T> Disjoint<T> {
    fn new(s: &mut [T]) -> Self {
        Disjoint {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }

    /// # Safety
    /// No other thread may access any index in `r` while the returned slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, r: Range<usize>) -> &mut [T] {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "disjoint range out of bounds"
        );
        std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len())
    }

    /// # Safety
    /// No other thread may access index `i` concurrently.
    unsafe fn write(&self, i: usize, v: T) {
        assert!(i < self.len, "disjoint index out of bounds");
        self.ptr.add(i).write(v);
    }
}

/// The sizes of one call.
struct Problem {
    isa: Isa,
    rows: usize,
    cols: usize,
    nt: usize,
}

impl Problem {
    /// Rows per tile for weight rows of `row_bytes`.
    fn tile_rows(&self, row_bytes: usize, nth: usize) -> usize {
        let rows = if self.nt == 1 {
            DECODE_TILE_ROWS
        } else {
            (PREFILL_TILE_BYTES / row_bytes.max(1)).clamp(4, 64)
        };
        // At least ~4 tiles per thread, so a late or slower thread cannot stall the rest.
        rows.min(self.rows.div_ceil(4 * nth)).max(1)
    }

    /// Runs `body(tile_rows_range)` over all tiles, claimed dynamically.
    fn for_tiles(&self, pool: &ThreadPool, tile_rows: usize, body: &(dyn Fn(Range<usize>) + Sync)) {
        let n_tiles = self.rows.div_ceil(tile_rows);
        if self.nt == 1 {
            // Decode streams the weights once: each thread takes one contiguous run of
            // rows. Interleaved tiles made each core's prefetcher fetch lines the other
            // core reads, and two threads streamed slower than one (Q6_K 8960x1536:
            // 16 GB/s against 33 GB/s contiguous, `cargo bench --bench matmul`).
            pool.run(&|ith, nth| {
                let r = chunk_range(self.rows, ith, nth);
                let mut r0 = r.start;
                while r0 < r.end {
                    let r1 = (r0 + tile_rows).min(r.end);
                    body(r0..r1);
                    r0 = r1;
                }
            });
            return;
        }
        let next = AtomicUsize::new(0);
        pool.run(&|_, _| loop {
            let tile = next.fetch_add(1, Relaxed);
            if tile >= n_tiles {
                break;
            }
            let r0 = tile * tile_rows;
            body(r0..(r0 + tile_rows).min(self.rows));
        });
    }

    fn quant<B>(
        &self,
        pool: &ThreadPool,
        w: &QMatrix,
        x: &[f32],
        y: &mut [f32],
        scratch: &mut MatmulScratch,
    ) -> Result<(), MatmulError>
    where
        B: QuantDot + Sync,
        B::Act: Activation,
    {
        let blocks: &[B] = cast_blocks(w.data).ok_or(MatmulError::Misaligned {
            ty: w.ty,
            align: std::mem::align_of::<B>(),
        })?;
        if self.rows == 0 || self.nt == 0 {
            return Ok(());
        }
        let bpr = self.cols / B::ELEMS;
        let (isa, nt, rows, cols) = (self.isa, self.nt, self.rows, self.cols);

        let buf = B::Act::buffer(scratch);
        if buf.len() < nt * bpr {
            buf.resize(nt * bpr, bytemuck::Zeroable::zeroed());
        }
        let acts = &mut buf[..nt * bpr];
        if nt == 1 {
            B::Act::quantize_row(isa, x, acts);
        } else {
            let shared = Disjoint::new(acts);
            pool.run(&|ith, nth| {
                let r = chunk_range(nt, ith, nth);
                // SAFETY: token ranges of different threads are disjoint.
                let out = unsafe { shared.slice(r.start * bpr..r.end * bpr) };
                B::Act::quantize_row(isa, &x[r.start * cols..r.end * cols], out);
            });
        }
        let acts: &[B::Act] = acts;

        let out = Disjoint::new(y);
        let rows8 = rows8_isa::<B>(isa, nt);
        let mut tile_rows = self.tile_rows(bpr * std::mem::size_of::<B>(), pool.n_threads());
        if rows8.is_some() {
            tile_rows = tile_rows.next_multiple_of(8);
        }
        let act = |t: usize| &acts[t * bpr..(t + 1) * bpr];
        self.for_tiles(pool, tile_rows, &|rr: Range<usize>| {
            let mut rr = rr;
            #[cfg(target_arch = "x86_64")]
            if let Some(vnni) = rows8 {
                while rr.len() >= 8 {
                    let r0 = rr.start;
                    let w: [&[B]; 8] =
                        std::array::from_fn(|i| &blocks[(r0 + i) * bpr..(r0 + i + 1) * bpr]);
                    // SAFETY: `rows8_isa` only answers with the ISA detected at run time;
                    // `acts` holds `nt` rows of `bpr` blocks; rows r0..r0 + 8 belong to this
                    // tile only, claimed by one thread.
                    unsafe {
                        B::rows8_avx2(vnni, w, acts, nt, &mut |t, i, v| {
                            out.write(t * rows + r0 + i, v)
                        })
                    };
                    rr.start += 8;
                }
            }
            let mut t = 0;
            while t < nt {
                let g = (nt - t).min(TOKEN_GROUP);
                for r in rr.clone() {
                    let wr = &blocks[r * bpr..(r + 1) * bpr];
                    let mut res = [0.0f32; TOKEN_GROUP];
                    match g {
                        4 => {
                            res =
                                dot_unchecked(isa, wr, [act(t), act(t + 1), act(t + 2), act(t + 3)])
                        }
                        3 => res[..3].copy_from_slice(&dot_unchecked(
                            isa,
                            wr,
                            [act(t), act(t + 1), act(t + 2)],
                        )),
                        2 => {
                            res[..2].copy_from_slice(&dot_unchecked(isa, wr, [act(t), act(t + 1)]))
                        }
                        _ => res[0] = dot_unchecked(isa, wr, [act(t)])[0],
                    }
                    for (k, &v) in res[..g].iter().enumerate() {
                        // SAFETY: row r belongs to this tile only, claimed by one thread.
                        unsafe { out.write((t + k) * rows + r, v) };
                    }
                }
                t += g;
            }
        });
        Ok(())
    }

    fn float<W: FloatWeight + bytemuck::Pod + Sync>(
        &self,
        pool: &ThreadPool,
        w: &QMatrix,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), MatmulError> {
        let data: &[W] = bytemuck::try_cast_slice(w.data).map_err(|_| MatmulError::Misaligned {
            ty: w.ty,
            align: std::mem::align_of::<W>(),
        })?;
        if self.rows == 0 || self.nt == 0 {
            return Ok(());
        }
        let (isa, nt, rows, cols) = (self.isa, self.nt, self.rows, self.cols);
        let out = Disjoint::new(y);
        let tile_rows = self.tile_rows(cols * std::mem::size_of::<W>(), pool.n_threads());
        self.for_tiles(pool, tile_rows, &|rr: Range<usize>| {
            for t in 0..nt {
                let xt = &x[t * cols..(t + 1) * cols];
                for r in rr.clone() {
                    let v = dot_float(isa, &data[r * cols..(r + 1) * cols], xt);
                    // SAFETY: row r belongs to this tile only, claimed by one thread.
                    unsafe { out.write(t * rows + r, v) };
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::testutil::{isas, rand_f32};
    use minfer_gguf::quant::{dequantize, quantize_to_vec};

    const TYPES: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
    ];

    /// Weight bytes in a u64-backed buffer so every block type is aligned.
    fn aligned(bytes: &[u8]) -> Vec<u64> {
        let mut v = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
        v
    }

    /// A weight matrix for the tests.
    struct Case<'a> {
        ty: GgmlType,
        w: &'a [u8],
        rows: usize,
        cols: usize,
    }

    fn run(isa: Isa, threads: usize, c: &Case, x: &[f32], nt: usize) -> Vec<f32> {
        let pool = ThreadPool::new(threads);
        let m = QMatrix {
            ty: c.ty,
            data: c.w,
            rows: c.rows,
            cols: c.cols,
        };
        let mut y = vec![f32::NAN; nt * c.rows];
        matmul_with(isa, &pool, &m, x, nt, &mut y, &mut MatmulScratch::new()).unwrap();
        y
    }

    /// Every type, several token counts: 1, 2 and 3 threads give identical bits, every ISA
    /// gives identical bits for the quantized types, and the result is within the
    /// activation-quantization error (plus 1e-5 relative rounding slack) of the f64 product
    /// of the dequantized weights with the f32 activations.
    #[test]
    fn all_types_are_deterministic_and_accurate() {
        let (rows, cols) = (37, 512);
        for ty in TYPES {
            let wf = rand_f32(rows * cols, ty.id() as u64 + 5, 1.0);
            let bytes = quantize_to_vec(ty, &wf).unwrap();
            let store = aligned(&bytes);
            let w = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
            let mut wd = vec![0.0; rows * cols];
            dequantize(ty, w, &mut wd).unwrap();
            let case = Case { ty, w, rows, cols };
            for nt in [1, 2, 5, 9] {
                let x = rand_f32(nt * cols, nt as u64 + 77, 2.0);
                let base = run(Isa::detect(), 1, &case, &x, nt);
                for threads in [2, 3] {
                    let y = run(Isa::detect(), threads, &case, &x, nt);
                    assert_eq!(
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        base.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{ty} nt={nt} t={threads}"
                    );
                }
                if ty.is_quantized() {
                    for isa in isas() {
                        let y = run(isa, 2, &case, &x, nt);
                        assert!(
                            y.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{ty} {isa:?}"
                        );
                    }
                }
                // Activation quantization: Q8_0/Q8_K steps are at most 2 * amax / 254 per
                // block; half a step per element bounds the error.
                let act_block = if ty.block_size() == 256 { 256 } else { 32 };
                for t in 0..nt {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        let wr = &wd[r * cols..(r + 1) * cols];
                        let exact: f64 =
                            wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let mag: f64 = wr
                            .iter()
                            .zip(xt)
                            .map(|(a, b)| (*a as f64 * *b as f64).abs())
                            .sum();
                        let mut bound = 1e-5 * mag;
                        if ty.is_quantized() {
                            for (wb, xb) in wr.chunks(act_block).zip(xt.chunks(act_block)) {
                                let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
                                let half_step = amax / 127.0 * 0.5 * 1.001;
                                bound += half_step * wb.iter().map(|v| v.abs() as f64).sum::<f64>();
                            }
                        }
                        let got = base[t * rows + r] as f64;
                        assert!(
                            (got - exact).abs() <= bound,
                            "{ty} t={t} r={r}: {got} vs {exact} (bound {bound})"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn shape_and_alignment_errors_are_typed() {
        let pool = ThreadPool::new(1);
        let mut s = MatmulScratch::new();
        let store = aligned(&[0u8; 22 * 4]);
        let data = &bytemuck::cast_slice::<u64, u8>(&store)[..22 * 4];
        let m = QMatrix {
            ty: GgmlType::Q5_0,
            data,
            rows: 2,
            cols: 64,
        };
        let mut y = vec![0.0; 2];
        assert_eq!(matmul(&pool, &m, &[0.0; 64], 1, &mut y, &mut s), Ok(()));
        assert_eq!(
            matmul(&pool, &m, &[0.0; 63], 1, &mut y, &mut s),
            Err(MatmulError::Activations {
                got: 63,
                nt: 1,
                cols: 64
            })
        );
        assert_eq!(
            matmul(&pool, &m, &[0.0; 64], 1, &mut [0.0; 3], &mut s),
            Err(MatmulError::Output {
                got: 3,
                nt: 1,
                rows: 2
            })
        );
        let bad = QMatrix { cols: 48, ..m };
        assert!(matches!(
            matmul(&pool, &bad, &[0.0; 48], 1, &mut y, &mut s),
            Err(MatmulError::NotBlockMultiple { cols: 48, .. })
        ));
        let short = QMatrix {
            data: &data[..80],
            ..m
        };
        assert!(matches!(
            matmul(&pool, &short, &[0.0; 64], 1, &mut y, &mut s),
            Err(MatmulError::WeightBytes {
                got: 80,
                expected: Some(88),
                ..
            })
        ));
        let store2 = aligned(&[0u8; 89]);
        let odd = QMatrix {
            data: &bytemuck::cast_slice::<u64, u8>(&store2)[1..89],
            ..m
        };
        assert_eq!(
            matmul(&pool, &odd, &[0.0; 64], 1, &mut y, &mut s),
            Err(MatmulError::Misaligned {
                ty: GgmlType::Q5_0,
                align: 2
            })
        );
        let q8k = QMatrix {
            ty: GgmlType::Q8K,
            ..m
        };
        assert_eq!(
            matmul(&pool, &q8k, &[0.0; 64], 1, &mut y, &mut s),
            Err(MatmulError::UnsupportedType(GgmlType::Q8K))
        );
        let huge = QMatrix {
            rows: usize::MAX,
            ..m
        };
        assert!(matches!(
            matmul(&pool, &huge, &[0.0; 64], 1, &mut y, &mut s),
            Err(MatmulError::WeightBytes { expected: None, .. })
        ));
    }

    #[test]
    fn scratch_is_reused_without_growing() {
        let pool = ThreadPool::new(2);
        let (rows, cols, nt) = (8, 256, 6);
        let bytes = quantize_to_vec(GgmlType::Q4K, &rand_f32(rows * cols, 3, 1.0)).unwrap();
        let store = aligned(&bytes);
        let m = QMatrix {
            ty: GgmlType::Q4K,
            data: &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()],
            rows,
            cols,
        };
        let x = rand_f32(nt * cols, 4, 1.0);
        let mut s = MatmulScratch::new();
        let mut y = vec![0.0; nt * rows];
        matmul(&pool, &m, &x, nt, &mut y, &mut s).unwrap();
        let cap = s.q8k.capacity();
        let first = y.clone();
        matmul(&pool, &m, &x[..cols], 1, &mut y[..rows], &mut s).unwrap();
        matmul(&pool, &m, &x, nt, &mut y, &mut s).unwrap();
        assert_eq!(s.q8k.capacity(), cap);
        assert_eq!(y, first);
    }
}
