//! Matrix products over weights repacked at load time into row-interleaved tiles (see
//! `quant::repack`): eight output rows per SIMD accumulator, so one activation load serves
//! eight rows and decode streams weights instead of shuffling them.
//!
//! Q5_0/Q8_0 results differ from [`super::matmul`] by float rounding only (the per-block
//! integer dots are the same; the float accumulation order differs): within `1e-5 · Σ|w·x|`
//! relative to the magnitude of the terms. Q4_K results equal [`super::matmul`]'s bitwise. They are identical across thread counts and ISAs: every
//! output element is one kernel call by one thread, each token's result does not depend on
//! which tokens share the call, and the scalar kernel replays the AVX2 one exactly.
//! Where a type has a 512-bit kernel (`quant::wide`), prefill hands it two row groups per
//! call; its lanes repeat the one-group kernel's steps, so the bits stay those.

use super::{check_shapes, Disjoint, MatmulError, MatmulScratch, QMatrix};
use crate::hugemem::HugeVec;
use crate::quant::repack::{act_sidecar, gemv, Act, Tile, TileQ5, TileQ8};
use crate::quant::repack_k::{gemv_q4k, TileQ4K};
use crate::quant::repack_k6::{gemv_q6k, TileQ6K};
use crate::quant::repack_nl::TileIq4Nl;
use crate::quant::repack_xs::{gemv_iq4xs, TileIq4Xs};
use crate::quant::wide::{gemv_wide, gemv_wide_k, wide, Wide, Wide32};
use crate::quant::{q8_0_into, q8_k_into, Isa};
use crate::threadpool::{chunk_range, ThreadPool};
use minfer_gguf::quant::{cast_blocks, Block, BlockQ8K, BlockQ8_0};
use minfer_gguf::GgmlType;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

mod multi;
#[cfg(test)]
mod testutil;
pub use multi::{
    matmul_repacked_multi, matmul_repacked_multi_then, MultiEpilogue, MULTI_MAX_PARTS,
};

/// Rows per tile (one SIMD accumulator's lanes).
pub(crate) const ROWS: usize = 8;
/// Tokens per kernel call.
const TOKEN_GROUP: usize = 4;
/// Target bytes of quantized activations per token chunk (stays in L2 while every row
/// group of a tile streams past it).
const CHUNK_ACT_BYTES: usize = 96 * 1024;

#[derive(Debug, Clone)]
enum Tiles {
    Q8_0(HugeVec<TileQ8>),
    Q5_0(HugeVec<TileQ5>),
    Iq4Nl(HugeVec<TileIq4Nl>),
    Q4K(HugeVec<TileQ4K>),
    Q6K(HugeVec<TileQ6K>),
    Iq4Xs(HugeVec<TileIq4Xs>),
}

impl Tiles {
    /// Zeroed tiles for `groups` row groups of a `cols`-wide matrix of `ty` (one of
    /// [`RepackedMatrix::packable`]'s types).
    fn zeroed(ty: GgmlType, groups: usize, cols: usize) -> Result<Tiles, MatmulError> {
        let oom = |e: std::io::Error| MatmulError::Memory(e.to_string());
        Ok(match ty {
            GgmlType::Q8_0 => Tiles::Q8_0(HugeVec::zeroed(groups * cols / 32).map_err(oom)?),
            GgmlType::Iq4Nl => Tiles::Iq4Nl(HugeVec::zeroed(groups * cols / 32).map_err(oom)?),
            GgmlType::Q4K => Tiles::Q4K(HugeVec::zeroed(groups * cols / 256).map_err(oom)?),
            GgmlType::Q6K => Tiles::Q6K(HugeVec::zeroed(groups * cols / 256).map_err(oom)?),
            GgmlType::Iq4Xs => Tiles::Iq4Xs(HugeVec::zeroed(groups * cols / 256).map_err(oom)?),
            _ => Tiles::Q5_0(HugeVec::zeroed(groups * cols / 32).map_err(oom)?),
        })
    }

    /// Packs the rows of `w` into the row groups starting at group `g0` (`w.rows` is a
    /// multiple of [`ROWS`] unless `w` holds the matrix's last rows).
    fn pack_at(&mut self, pool: &ThreadPool, w: &QMatrix, g0: usize) -> Result<(), MatmulError> {
        match self {
            Tiles::Q8_0(t) => pack_blocks_into(pool, w, TileQ8::pack, t, g0),
            Tiles::Q5_0(t) => pack_blocks_into(pool, w, TileQ5::pack, t, g0),
            Tiles::Iq4Nl(t) => pack_blocks_into(pool, w, TileIq4Nl::pack, t, g0),
            Tiles::Q4K(t) => pack_blocks_into(pool, w, TileQ4K::pack, t, g0),
            Tiles::Q6K(t) => pack_blocks_into(pool, w, TileQ6K::pack, t, g0),
            Tiles::Iq4Xs(t) => pack_blocks_into(pool, w, TileIq4Xs::pack, t, g0),
        }
    }
}

/// Which activation quantisation a tile type reads: the parts of one multi product must
/// share it, since the activations are quantised once for all of them.
fn act_family(t: &Tiles) -> u8 {
    match t {
        Tiles::Q8_0(_) | Tiles::Q5_0(_) | Tiles::Iq4Nl(_) => 0,
        Tiles::Q4K(_) | Tiles::Q6K(_) | Tiles::Iq4Xs(_) => 1,
    }
}

/// A weight matrix repacked for [`matmul_repacked`]: same bytes per block as the GGUF
/// tensor (plus zero padding up to a multiple of eight rows), owned, built once at load.
#[derive(Debug, Clone)]
pub struct RepackedMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    tiles: Tiles,
}

impl RepackedMatrix {
    /// Whether weights of `ty` should be repacked on this CPU: Q5_0, Q8_0 and Q4_K always,
    /// Q6_K where the VNNI kernels run ([`Isa::detect`]). With VNNI the Q6_K tiles decode
    /// as fast as the GGUF layout and prefill nearly twice as fast (about 390 against 215
    /// GOP/s); with AVX2 alone they prefill no faster, so the GGUF layout stays. The
    /// results are the same bits either way.
    pub fn supports(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4K | GgmlType::Iq4Nl | GgmlType::Iq4Xs
        ) || (ty == GgmlType::Q6K && Isa::vnni().is_some_and(|v| Isa::detect() == v))
    }

    /// Whether [`Self::from_qmatrix`] accepts `ty` (every type [`Self::supports`] names on
    /// some CPU).
    fn packable(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q5_0
                | GgmlType::Q8_0
                | GgmlType::Q4K
                | GgmlType::Q6K
                | GgmlType::Iq4Nl
                | GgmlType::Iq4Xs
        )
    }

    /// Repacks `w` on the calling thread; errors on unsupported types, shapes that are not
    /// whole blocks, wrong byte counts and misaligned data (as [`super::matmul`] would).
    pub fn from_qmatrix(w: &QMatrix) -> Result<Self, MatmulError> {
        Self::from_qmatrix_in(&ThreadPool::new(1), w)
    }

    /// [`Self::from_qmatrix`] with the row groups split over `pool`'s threads.
    pub fn from_qmatrix_in(pool: &ThreadPool, w: &QMatrix) -> Result<Self, MatmulError> {
        if !Self::packable(w.ty) {
            return Err(MatmulError::UnsupportedType(w.ty));
        }
        check_shapes(w, 0, 0, 0)?;
        let mut tiles = Tiles::zeroed(w.ty, w.rows.div_ceil(ROWS), w.cols)?;
        tiles.pack_at(pool, w, 0)?;
        Ok(RepackedMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            tiles,
        })
    }

    /// [`Self::from_qmatrix_in`] in slices of about `chunk_bytes` of source, calling
    /// `done(byte_range)` after each slice so the caller can drop the source pages it no
    /// longer needs: the copy and the whole original are then never resident together.
    /// The result equals the whole-matrix repack (row groups are contiguous in both).
    pub fn from_qmatrix_chunked(
        pool: &ThreadPool,
        w: &QMatrix,
        chunk_bytes: usize,
        done: &mut dyn FnMut(std::ops::Range<usize>),
    ) -> Result<Self, MatmulError> {
        if !Self::packable(w.ty) {
            return Err(MatmulError::UnsupportedType(w.ty));
        }
        check_shapes(w, 0, 0, 0)?;
        let row_bytes = w.data.len() / w.rows.max(1);
        let chunk_rows = (chunk_bytes / row_bytes.max(1)).max(ROWS) / ROWS * ROWS;
        // One allocation for the whole matrix, filled slice by slice.
        let mut tiles = Tiles::zeroed(w.ty, w.rows.div_ceil(ROWS), w.cols)?;
        let mut r0 = 0;
        while r0 < w.rows {
            let r1 = (r0 + chunk_rows).min(w.rows);
            let bytes = r0 * row_bytes..r1 * row_bytes;
            let part = QMatrix {
                ty: w.ty,
                data: &w.data[bytes.clone()],
                rows: r1 - r0,
                cols: w.cols,
            };
            tiles.pack_at(pool, &part, r0 / ROWS)?;
            done(bytes);
            r0 = r1;
        }
        Ok(RepackedMatrix {
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            tiles,
        })
    }

    /// Whether `other` reads the same activation quantisation as this matrix (Q5_0 and
    /// Q8_0 read Q8_0, Q4_K and Q6_K read Q8_K) and has as many columns, so that both can
    /// be parts of one [`matmul_repacked_multi`] product.
    pub fn shares_activations(&self, other: &RepackedMatrix) -> bool {
        act_family(&self.tiles) == act_family(&other.tiles) && self.cols == other.cols
    }

    /// The source weight type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Heap bytes held (the source tensor's size, rounded up to whole row groups).
    pub fn bytes(&self) -> usize {
        match &self.tiles {
            Tiles::Q8_0(t) => std::mem::size_of_val(&t[..]),
            Tiles::Q5_0(t) => std::mem::size_of_val(&t[..]),
            Tiles::Iq4Nl(t) => std::mem::size_of_val(&t[..]),
            Tiles::Q4K(t) => std::mem::size_of_val(&t[..]),
            Tiles::Q6K(t) => std::mem::size_of_val(&t[..]),
            Tiles::Iq4Xs(t) => std::mem::size_of_val(&t[..]),
        }
    }
}

/// A borrowed view of k-quant tiles (Q4_K, Q6_K, IQ4_XS): they read Q8_K activations and
/// their kernels give the unpacked kernels' bits, so a routed product can read them in
/// place of the GGUF layout without changing a result.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KTiles<'a> {
    Q4K(&'a [TileQ4K]),
    Q6K(&'a [TileQ6K]),
    Iq4Xs(&'a [TileIq4Xs]),
}

impl KTiles<'_> {
    /// Row group `g`'s [`ROWS`] results (rows `8g..8g + 8`) for `NT` tokens' Q8_K
    /// activations of `nb` super-blocks each.
    #[inline]
    pub(crate) fn gemv<const NT: usize>(
        self,
        isa: Isa,
        g: usize,
        nb: usize,
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; ROWS]; NT] {
        let at = g * nb..(g + 1) * nb;
        match self {
            KTiles::Q4K(t) => gemv_q4k(isa, &t[at], y),
            KTiles::Q6K(t) => gemv_q6k(isa, &t[at], y),
            KTiles::Iq4Xs(t) => gemv_iq4xs(isa, &t[at], y),
        }
    }
}

impl RepackedMatrix {
    /// Whether weights of `ty` repack into [`KTiles`] (so [`Self::k_tiles`] of their
    /// repacked matrix is `Some`) and [`Self::supports`] repacking them on this CPU.
    pub fn gives_k_tiles(ty: GgmlType) -> bool {
        matches!(ty, GgmlType::Q4K | GgmlType::Q6K | GgmlType::Iq4Xs) && Self::supports(ty)
    }

    /// The tiles as [`KTiles`], or `None` for the Q8_0-activation types.
    pub(crate) fn k_tiles(&self) -> Option<KTiles<'_>> {
        match &self.tiles {
            Tiles::Q4K(t) => Some(KTiles::Q4K(t)),
            Tiles::Q6K(t) => Some(KTiles::Q6K(t)),
            Tiles::Iq4Xs(t) => Some(KTiles::Iq4Xs(t)),
            Tiles::Q8_0(_) | Tiles::Q5_0(_) | Tiles::Iq4Nl(_) => None,
        }
    }
}

/// Fills the row groups `g0..` of `tiles` (group-major: `tiles[g * blocks_per_row + b]`,
/// `w.rows.div_ceil(ROWS)` groups) with the tiles `f(rows, b)` of `w`'s source blocks `S`.
fn pack_blocks_into<S: Block + Sync, T: bytemuck::Pod + Send>(
    pool: &ThreadPool,
    w: &QMatrix,
    f: fn([Option<&[S]>; ROWS], usize) -> T,
    tiles: &mut [T],
    g0: usize,
) -> Result<(), MatmulError> {
    let blocks: &[S] = cast_blocks(w.data).ok_or(MatmulError::Misaligned {
        ty: w.ty,
        align: std::mem::align_of::<S>(),
    })?;
    let nb = w.cols / S::ELEMS;
    let groups = w.rows.div_ceil(ROWS);
    let out = Disjoint::new(&mut tiles[g0 * nb..(g0 + groups) * nb]);
    pool.run(&|ith, nth| {
        for g in chunk_range(groups, ith, nth) {
            let rows: [Option<&[S]>; ROWS] = std::array::from_fn(|r| {
                let row = g * ROWS + r;
                (row < w.rows).then(|| &blocks[row * nb..(row + 1) * nb])
            });
            // SAFETY: group ranges of different threads are disjoint.
            let dst = unsafe { out.slice(g * nb..(g + 1) * nb) };
            for (b, t) in dst.iter_mut().enumerate() {
                *t = f(rows, b);
            }
        }
    });
    Ok(())
}

/// `y[t][r] = Σ_c W[r][c] x[t][c]` with repacked weights and the detected ISA; shapes as
/// in [`super::matmul`].
pub fn matmul_repacked(
    pool: &ThreadPool,
    w: &RepackedMatrix,
    x: &[f32],
    nt: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<(), MatmulError> {
    matmul_repacked_with(Isa::detect(), pool, w, x, nt, y, scratch)
}

/// [`matmul_repacked`] with an explicit ISA (identical bits on every ISA).
pub fn matmul_repacked_with(
    isa: Isa,
    pool: &ThreadPool,
    w: &RepackedMatrix,
    x: &[f32],
    nt: usize,
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<(), MatmulError> {
    let (rows, cols) = (w.rows, w.cols);
    if nt.checked_mul(cols) != Some(x.len()) {
        return Err(MatmulError::Activations {
            got: x.len(),
            nt,
            cols,
        });
    }
    if nt.checked_mul(rows) != Some(y.len()) {
        return Err(MatmulError::Output {
            got: y.len(),
            nt,
            rows,
        });
    }
    if rows == 0 || nt == 0 {
        return Ok(());
    }
    match &w.tiles {
        Tiles::Q8_0(t) => {
            let acts = quantize(isa, pool, x, nt, cols / 32, scratch);
            run_q8(isa, pool, t, rows, cols / 32, nt, acts, y)
        }
        Tiles::Q5_0(t) => {
            let acts = quantize(isa, pool, x, nt, cols / 32, scratch);
            run_q8(isa, pool, t, rows, cols / 32, nt, acts, y)
        }
        Tiles::Iq4Nl(t) => {
            let acts = quantize(isa, pool, x, nt, cols / 32, scratch);
            run_q8(isa, pool, t, rows, cols / 32, nt, acts, y)
        }
        Tiles::Q4K(t) => {
            let acts = quantize_k(isa, pool, x, nt, cols / 256, scratch);
            run_k(isa, pool, t, rows, cols / 256, nt, acts, y)
        }
        Tiles::Q6K(t) => {
            let acts = quantize_k(isa, pool, x, nt, cols / 256, scratch);
            run_k(isa, pool, t, rows, cols / 256, nt, acts, y)
        }
        Tiles::Iq4Xs(t) => {
            let acts = quantize_k(isa, pool, x, nt, cols / 256, scratch);
            run_k(isa, pool, t, rows, cols / 256, nt, acts, y)
        }
    }
    Ok(())
}

/// Quantizes the activations to Q8_0 with f32 scales and level sums, in scratch.
fn quantize<'s>(
    isa: Isa,
    pool: &ThreadPool,
    x: &[f32],
    nt: usize,
    nb: usize,
    s: &'s mut MatmulScratch,
) -> (&'s [BlockQ8_0], &'s [f32], &'s [i32]) {
    let n = nt * nb;
    if s.q8_0.len() < n {
        s.q8_0.resize(n, bytemuck::Zeroable::zeroed());
    }
    if s.yd.len() < n {
        s.yd.resize(n, 0.0);
        s.ys.resize(n, 0);
    }
    let (q, d, sums) = (&mut s.q8_0[..n], &mut s.yd[..n], &mut s.ys[..n]);
    let cols = nb * 32;
    let one = |t: std::ops::Range<usize>, q: &mut [BlockQ8_0], d: &mut [f32], s: &mut [i32]| {
        q8_0_into(isa, &x[t.start * cols..t.end * cols], q);
        act_sidecar(q, d, s);
    };
    if nt == 1 {
        one(0..1, q, d, sums);
    } else {
        let (sq, sd, ss) = (Disjoint::new(q), Disjoint::new(d), Disjoint::new(sums));
        pool.run(&|ith, nth| {
            let t = chunk_range(nt, ith, nth);
            let r = t.start * nb..t.end * nb;
            // SAFETY: token ranges of different threads are disjoint.
            let (q, d, s) = unsafe { (sq.slice(r.clone()), sd.slice(r.clone()), ss.slice(r)) };
            one(t, q, d, s);
        });
    }
    (&s.q8_0[..n], &s.yd[..n], &s.ys[..n])
}

/// Quantizes the activations to Q8_K in scratch (tokens split over the pool).
fn quantize_k<'s>(
    isa: Isa,
    pool: &ThreadPool,
    x: &[f32],
    nt: usize,
    nb: usize,
    s: &'s mut MatmulScratch,
) -> &'s [BlockQ8K] {
    let n = nt * nb;
    if s.q8k.len() < n {
        s.q8k.resize(n, bytemuck::Zeroable::zeroed());
    }
    let q = &mut s.q8k[..n];
    if nt == 1 {
        q8_k_into(isa, x, q);
    } else {
        let cols = nb * 256;
        let sq = Disjoint::new(q);
        pool.run(&|ith, nth| {
            let t = chunk_range(nt, ith, nth);
            // SAFETY: token ranges of different threads are disjoint.
            let q = unsafe { sq.slice(t.start * nb..t.end * nb) };
            q8_k_into(isa, &x[t.start * cols..t.end * cols], q);
        });
    }
    &s.q8k[..n]
}

/// The kernel results of one row group for up to [`TOKEN_GROUP`] tokens from `t`.
type GroupKernel<'a> = dyn Fn(usize, usize, usize) -> [[f32; ROWS]; TOKEN_GROUP] + Sync + 'a;

/// The kernel results of row groups `g` and `g + 1` together (sixteen rows) for up to
/// [`PAIR_TOKENS`] tokens from `t`.
type PairKernel<'a> = dyn Fn(usize, usize, usize) -> [[f32; 2 * ROWS]; PAIR_TOKENS] + Sync + 'a;

/// Tokens per call of a two-group kernel: eight share each block's unpacked weights, where
/// [`TOKEN_GROUP`] tokens would unpack them twice as often.
const PAIR_TOKENS: usize = 8;

/// [`by_count`] for up to [`PAIR_TOKENS`] tokens: eight in one call of `f8`, fewer as one
/// call for the first four and one for the rest.
#[allow(clippy::too_many_arguments)]
#[inline]
fn by_count_pair<A: Copy, const W: usize>(
    n: usize,
    t: usize,
    act: impl Fn(usize) -> A + Copy,
    f1: impl Fn([A; 1]) -> [[f32; W]; 1] + Copy,
    f2: impl Fn([A; 2]) -> [[f32; W]; 2] + Copy,
    f3: impl Fn([A; 3]) -> [[f32; W]; 3] + Copy,
    f4: impl Fn([A; 4]) -> [[f32; W]; 4] + Copy,
    f8: impl Fn([A; 8]) -> [[f32; W]; 8],
) -> [[f32; W]; PAIR_TOKENS] {
    if n == PAIR_TOKENS {
        return f8(std::array::from_fn(|i| act(t + i)));
    }
    let mut res = [[0.0f32; W]; PAIR_TOKENS];
    let first = n.min(TOKEN_GROUP);
    res[..TOKEN_GROUP].copy_from_slice(&by_count(first, t, act, f1, f2, f3, f4));
    if n > TOKEN_GROUP {
        let rest = by_count(n - TOKEN_GROUP, t + TOKEN_GROUP, act, f1, f2, f3, f4);
        res[TOKEN_GROUP..].copy_from_slice(&rest);
    }
    res
}

/// Calls `f` with `n` (1 to [`TOKEN_GROUP`]) consecutive tokens from `t` as a const-size
/// array, padding the result to [`TOKEN_GROUP`].
#[inline]
fn by_count<A: Copy, const W: usize>(
    n: usize,
    t: usize,
    act: impl Fn(usize) -> A,
    f1: impl Fn([A; 1]) -> [[f32; W]; 1],
    f2: impl Fn([A; 2]) -> [[f32; W]; 2],
    f3: impl Fn([A; 3]) -> [[f32; W]; 3],
    f4: impl Fn([A; 4]) -> [[f32; W]; 4],
) -> [[f32; W]; TOKEN_GROUP] {
    let mut res = [[0.0f32; W]; TOKEN_GROUP];
    match n {
        4 => res = f4([act(t), act(t + 1), act(t + 2), act(t + 3)]),
        3 => res[..3].copy_from_slice(&f3([act(t), act(t + 1), act(t + 2)])),
        2 => res[..2].copy_from_slice(&f2([act(t), act(t + 1)])),
        _ => res[0] = f1([act(t)])[0],
    }
    res
}

/// Runs `kern` over 2-D tiles (token chunk x row groups), claimed dynamically when the
/// tokens take several chunks and split contiguously by thread otherwise;
/// `act_bytes` is one token's quantized activation size (sets the chunk length).
fn run(
    pool: &ThreadPool,
    rows: usize,
    nt: usize,
    act_bytes: usize,
    y: &mut [f32],
    kern: &GroupKernel<'_>,
    pair: Option<&PairKernel<'_>>,
) {
    let groups = rows.div_ceil(ROWS);
    let nth = pool.n_threads();
    let chunk = if nt <= TOKEN_GROUP {
        nt
    } else {
        (CHUNK_ACT_BYTES / act_bytes.max(1) / PAIR_TOKENS * PAIR_TOKENS).clamp(PAIR_TOKENS, 64)
    };
    let n_chunks = nt.div_ceil(chunk);
    // At least ~4 tiles per thread so a slow thread cannot stall the rest.
    let per_tile = (groups * n_chunks / (4 * nth)).clamp(1, 16).min(groups);
    let n_gtiles = groups.div_ceil(per_tile);
    let n_tiles = n_chunks * n_gtiles;
    let out = Disjoint::new(y);
    // Decode (one token) keeps the one-group kernel: it streams each group's weights
    // once, and a second stream buys nothing at the memory bound.
    let pair = pair.filter(|_| nt > 1);
    let tile = |tokens: std::ops::Range<usize>, gs: std::ops::Range<usize>| {
        let mut g = gs.start;
        while g < gs.end {
            if let Some(p) = pair.filter(|_| g + 1 < gs.end) {
                pair_rows(&out, rows, g, tokens.clone(), p);
                g += 2;
                continue;
            }
            let mut t = tokens.start;
            while t < tokens.end {
                let n = (tokens.end - t).min(TOKEN_GROUP);
                write_rows(&out, rows, g * ROWS, t, &kern(g, t, n)[..n]);
                t += n;
            }
            g += 1;
        }
    };
    if n_chunks == 1 {
        // Decode streams the weights once: each thread takes one contiguous run of row
        // groups, so no core's prefetcher fetches lines another core reads (interleaved
        // tiles streamed slower with two threads than with one).
        pool.run(&|ith, nth| tile(0..nt, chunk_range(groups, ith, nth)));
        return;
    }
    let next = AtomicUsize::new(0);
    pool.run(&|_, _| loop {
        let i = next.fetch_add(1, Relaxed);
        if i >= n_tiles {
            break;
        }
        let (c, gt) = (i / n_gtiles, i % n_gtiles);
        let tokens = c * chunk..((c + 1) * chunk).min(nt);
        tile(tokens, gt * per_tile..((gt + 1) * per_tile).min(groups));
    });
}

/// Writes kernel results (one row of `W` per token from `t`) to the outputs of rows
/// `row0..` (those below `rows`).
fn write_rows<const W: usize>(
    out: &Disjoint<f32>,
    rows: usize,
    row0: usize,
    t: usize,
    res: &[[f32; W]],
) {
    let valid = (rows - row0).min(W);
    for (k, rw) in res.iter().enumerate() {
        for (r, &v) in rw[..valid].iter().enumerate() {
            // SAFETY: (token, row) pairs of a tile belong to it alone, and each tile is
            // claimed by one thread.
            unsafe { out.write((t + k) * rows + row0 + r, v) };
        }
    }
}

/// Row groups `g` and `g + 1` for `tokens` with the pair kernel `p`.
fn pair_rows(
    out: &Disjoint<f32>,
    rows: usize,
    g: usize,
    tokens: std::ops::Range<usize>,
    p: &PairKernel<'_>,
) {
    let mut t = tokens.start;
    while t < tokens.end {
        let n = (tokens.end - t).min(PAIR_TOKENS);
        write_rows(out, rows, g * ROWS, t, &p(g, t, n)[..n]);
        t += n;
    }
}

/// Runs a 32-element tile type against Q8_0 activations.
#[allow(clippy::too_many_arguments)]
fn run_q8<T: Tile + Wide32>(
    isa: Isa,
    pool: &ThreadPool,
    tiles: &[T],
    rows: usize,
    nb: usize,
    nt: usize,
    (q, d, s): (&[BlockQ8_0], &[f32], &[i32]),
    y: &mut [f32],
) {
    let act = |t: usize| Act {
        q: &q[t * nb..(t + 1) * nb],
        d: &d[t * nb..(t + 1) * nb],
        s: &s[t * nb..(t + 1) * nb],
    };
    let kern = |g: usize, t: usize, n: usize| {
        let w = &tiles[g * nb..(g + 1) * nb];
        by_count(
            n,
            t,
            act,
            |a| gemv(isa, w, a),
            |a| gemv(isa, w, a),
            |a| gemv(isa, w, a),
            |a| gemv(isa, w, a),
        )
    };
    let pair = wide(isa).map(|wd| {
        move |g: usize, t: usize, n: usize| {
            let (w0, w1) = (
                &tiles[g * nb..(g + 1) * nb],
                &tiles[(g + 1) * nb..(g + 2) * nb],
            );
            by_count_pair(
                n,
                t,
                act,
                |a| gemv_wide(wd, w0, w1, a),
                |a| gemv_wide(wd, w0, w1, a),
                |a| gemv_wide(wd, w0, w1, a),
                |a| gemv_wide(wd, w0, w1, a),
                |a| gemv_wide(wd, w0, w1, a),
            )
        }
    });
    let pair = pair.as_ref().map(|p| p as &PairKernel<'_>);
    run(pool, rows, nt, nb * 34, y, &kern, pair);
}

/// A k-quant tile type with its dispatching kernel against Q8_K activations.
trait KTile: Sized + Sync {
    /// [`gemv_q4k`], [`gemv_q6k`] or [`gemv_iq4xs`].
    fn gemv<const NT: usize>(isa: Isa, w: &[Self], y: [&[BlockQ8K]; NT]) -> [[f32; ROWS]; NT];

    /// The 512-bit kernel over two row groups (`quant::wide`), bitwise two
    /// [`Self::gemv`] calls.
    fn gemv_wide<const NT: usize>(
        wd: Wide,
        w0: &[Self],
        w1: &[Self],
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; 2 * ROWS]; NT];
}

impl KTile for TileQ4K {
    fn gemv<const NT: usize>(isa: Isa, w: &[Self], y: [&[BlockQ8K]; NT]) -> [[f32; ROWS]; NT] {
        gemv_q4k(isa, w, y)
    }

    fn gemv_wide<const NT: usize>(
        wd: Wide,
        w0: &[Self],
        w1: &[Self],
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; 2 * ROWS]; NT] {
        gemv_wide_k(wd, w0, w1, y)
    }
}

impl KTile for TileIq4Xs {
    fn gemv<const NT: usize>(isa: Isa, w: &[Self], y: [&[BlockQ8K]; NT]) -> [[f32; ROWS]; NT] {
        gemv_iq4xs(isa, w, y)
    }

    fn gemv_wide<const NT: usize>(
        wd: Wide,
        w0: &[Self],
        w1: &[Self],
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; 2 * ROWS]; NT] {
        gemv_wide_k(wd, w0, w1, y)
    }
}

impl KTile for TileQ6K {
    fn gemv<const NT: usize>(isa: Isa, w: &[Self], y: [&[BlockQ8K]; NT]) -> [[f32; ROWS]; NT] {
        gemv_q6k(isa, w, y)
    }

    fn gemv_wide<const NT: usize>(
        wd: Wide,
        w0: &[Self],
        w1: &[Self],
        y: [&[BlockQ8K]; NT],
    ) -> [[f32; 2 * ROWS]; NT] {
        gemv_wide_k(wd, w0, w1, y)
    }
}

/// Runs k-quant tiles against Q8_K activations (`nb` super-blocks per row).
#[allow(clippy::too_many_arguments)]
fn run_k<T: KTile>(
    isa: Isa,
    pool: &ThreadPool,
    tiles: &[T],
    rows: usize,
    nb: usize,
    nt: usize,
    q: &[BlockQ8K],
    y: &mut [f32],
) {
    let act = |t: usize| &q[t * nb..(t + 1) * nb];
    let kern = |g: usize, t: usize, n: usize| {
        let w = &tiles[g * nb..(g + 1) * nb];
        by_count(
            n,
            t,
            act,
            |a| T::gemv(isa, w, a),
            |a| T::gemv(isa, w, a),
            |a| T::gemv(isa, w, a),
            |a| T::gemv(isa, w, a),
        )
    };
    let pair = wide(isa).map(|wd| {
        move |g: usize, t: usize, n: usize| {
            let (w0, w1) = (
                &tiles[g * nb..(g + 1) * nb],
                &tiles[(g + 1) * nb..(g + 2) * nb],
            );
            by_count_pair(
                n,
                t,
                act,
                |a| T::gemv_wide(wd, w0, w1, a),
                |a| T::gemv_wide(wd, w0, w1, a),
                |a| T::gemv_wide(wd, w0, w1, a),
                |a| T::gemv_wide(wd, w0, w1, a),
                |a| T::gemv_wide(wd, w0, w1, a),
            )
        }
    });
    let pair = pair.as_ref().map(|p| p as &PairKernel<'_>);
    run(
        pool,
        rows,
        nt,
        nb * std::mem::size_of::<BlockQ8K>(),
        y,
        &kern,
        pair,
    );
}

#[cfg(test)]
mod tests {
    use super::testutil::{aligned, run_repacked};
    use super::*;
    use crate::matmul::matmul_with;
    use crate::quant::testutil::{isas, rand_f32};
    use minfer_gguf::quant::{dequantize, quantize_to_vec};

    /// `blocks` (rows of `cols` elements of `ty`) repacked.
    fn repack_blocks<B: bytemuck::Pod>(
        ty: GgmlType,
        blocks: &[B],
        rows: usize,
        cols: usize,
    ) -> RepackedMatrix {
        let bytes = bytemuck::cast_slice::<B, u8>(blocks);
        let store = aligned(bytes);
        let data = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
        RepackedMatrix::from_qmatrix(&QMatrix {
            ty,
            data,
            rows,
            cols,
        })
        .unwrap()
    }

    /// The activations as the kernels see them: quantized to Q8_K for k-quant weights, to
    /// Q8_0 otherwise, and widened back to f32.
    fn act_roundtrip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
        fn rt<B: minfer_gguf::quant::Quantize>(x: &[f32]) -> Vec<f32> {
            let mut out = vec![0.0; x.len()];
            for (c, o) in x.chunks_exact(B::ELEMS).zip(out.chunks_exact_mut(B::ELEMS)) {
                B::quantize(c).dequantize(o);
            }
            out
        }
        if matches!(ty, GgmlType::Q4K | GgmlType::Q6K | GgmlType::Iq4Xs) {
            rt::<BlockQ8K>(x)
        } else {
            rt::<BlockQ8_0>(x)
        }
    }

    /// Bitwise identical across ISAs and thread counts; within float rounding
    /// (`1e-5 · Σ|w·x̂|`, x̂ the quantized activations) of both the exact product of the
    /// dequantized operands and the unpacked [`matmul_with`].
    #[test]
    fn repacked_matches_unpacked_and_is_deterministic() {
        for ty in [
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::Iq4Nl,
            GgmlType::Iq4Xs,
        ] {
            let kquant = matches!(ty, GgmlType::Q4K | GgmlType::Q6K | GgmlType::Iq4Xs);
            let shapes = if kquant {
                [(37, 512), (64, 256), (8, 768)]
            } else {
                [(37, 512), (64, 96), (8, 32)]
            };
            for (rows, cols) in shapes {
                let wf = rand_f32(rows * cols, rows as u64 + ty.id() as u64, 1.0);
                let bytes = quantize_to_vec(ty, &wf).unwrap();
                let store = aligned(&bytes);
                let data = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
                let q = QMatrix {
                    ty,
                    data,
                    rows,
                    cols,
                };
                let rp = RepackedMatrix::from_qmatrix(&q).unwrap();
                // Q4_K tiles add 32 bytes per eight super-blocks (unpacked scales and mins).
                // IQ4_XS tiles add 16 (the sub-block scales unpacked to bytes).
                let extra = match ty {
                    GgmlType::Q4K => 32 * cols / 256,
                    GgmlType::Iq4Xs => 16 * cols / 256,
                    _ => 0,
                };
                assert_eq!(
                    rp.bytes(),
                    rows.div_ceil(8) * (8 * bytes.len() / rows + extra)
                );
                let mut wd = vec![0.0; rows * cols];
                dequantize(ty, data, &mut wd).unwrap();
                for nt in [1, 2, 3, 5, 9] {
                    let x = rand_f32(nt * cols, nt as u64 + 11, 2.0);
                    let base = run_repacked(Isa::detect(), 1, &rp, &x, nt);
                    for isa in isas() {
                        for threads in [1, 2, 3] {
                            let y = run_repacked(isa, threads, &rp, &x, nt);
                            assert!(
                                y.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{ty} {rows}x{cols} nt={nt} {isa:?} t={threads}"
                            );
                        }
                    }
                    let pool = ThreadPool::new(2);
                    let mut unpacked = vec![0.0; nt * rows];
                    matmul_with(
                        Isa::detect(),
                        &pool,
                        &q,
                        &x,
                        nt,
                        &mut unpacked,
                        &mut MatmulScratch::new(),
                    )
                    .unwrap();
                    if kquant {
                        // Same integer dots and float steps as the unpacked kernel.
                        assert!(
                            unpacked
                                .iter()
                                .zip(&base)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{ty} {rows}x{cols} nt={nt}: differs from unpacked"
                        );
                    }
                    for t in 0..nt {
                        let xd = act_roundtrip(ty, &x[t * cols..(t + 1) * cols]);
                        for r in 0..rows {
                            let wr = &wd[r * cols..(r + 1) * cols];
                            let exact: f64 =
                                wr.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
                            let mag: f64 = wr
                                .iter()
                                .zip(&xd)
                                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                                .sum();
                            let got = base[t * rows + r] as f64;
                            let other = unpacked[t * rows + r] as f64;
                            assert!(
                                (got - exact).abs() <= 1e-5 * mag,
                                "{ty} t={t} r={r}: {got} vs {exact}"
                            );
                            assert!(
                                (got - other).abs() <= 1e-5 * mag,
                                "{ty} t={t} r={r}: {got} vs {other}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Long rows cut prefill into several token chunks; the split must not change a bit.
    #[test]
    fn token_chunks_do_not_change_results() {
        for ty in [
            GgmlType::Q5_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::Iq4Nl,
            GgmlType::Iq4Xs,
        ] {
            let (rows, cols, nt) = (16, 32 * 200, 30);
            let bytes = quantize_to_vec(ty, &rand_f32(rows * cols, 5, 1.0)).unwrap();
            let store = aligned(&bytes);
            let data = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
            let q = QMatrix {
                ty,
                data,
                rows,
                cols,
            };
            let rp = RepackedMatrix::from_qmatrix_in(&ThreadPool::new(3), &q).unwrap();
            let x = rand_f32(nt * cols, 6, 1.0);
            let all = run_repacked(Isa::detect(), 2, &rp, &x, nt);
            for isa in isas() {
                for t in [0, 13, 29] {
                    let one = run_repacked(isa, 1, &rp, &x[t * cols..(t + 1) * cols], 1);
                    assert_eq!(
                        one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        all[t * rows..(t + 1) * rows]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect::<Vec<_>>(),
                        "{ty} {isa:?} token {t}"
                    );
                }
            }
        }
    }

    #[test]
    fn q6k_extreme_levels_are_exact() {
        // Levels 63 (weight 31) with scale -128 against activations quantized to -127
        // (d = 1): two maddubs pair sums reach -32004, the i16 floor of the kernel.
        let blk = minfer_gguf::quant::BlockQ6K {
            ql: [0xff; 128],
            qh: [0xff; 64],
            scales: [-128; 16],
            d: half::f16::ONE,
        };
        // Two row groups, so prefill's two-group kernel runs too.
        let blocks = vec![blk; 16];
        let rp = repack_blocks(GgmlType::Q6K, &blocks, 16, 256);
        let x = vec![-127.0f32; 256 * 8];
        // Each element is -128 * 31 against -127; the integer total is exact in f32.
        let want = (256 * 128 * 31 * 127) as f32;
        for isa in isas() {
            for nt in [1, 2, 8] {
                let y = run_repacked(isa, 1, &rp, &x[..256 * nt], nt);
                assert!(
                    y.iter().all(|&v| v == want),
                    "{isa:?} nt={nt}: {y:?} vs {want}"
                );
            }
        }
    }

    #[test]
    fn q4k_extreme_levels_are_exact() {
        // All levels 15, scales and mins 63 (0xff packing), activations quantized to -127
        // with d = -1: eight maddubs pair sums reach 30480, the i16 ceiling of the kernel.
        let blk = minfer_gguf::quant::BlockQ4K {
            d: half::f16::ONE,
            dmin: half::f16::ONE,
            scales: [0xff; 12],
            qs: [0xff; 128],
        };
        // Two row groups, so prefill's two-group kernel runs too.
        let blocks = vec![blk; 16 * 2];
        let rp = repack_blocks(GgmlType::Q4K, &blocks, 16, 512);
        let x = vec![127.0f32; 512 * 8];
        // Each element is 63 * 15 - 63 = 882 against 127; every partial sum is exact in f32.
        let want = (512 * 882 * 127) as f32;
        for isa in isas() {
            for nt in [1, 2, 8] {
                let y = run_repacked(isa, 1, &rp, &x[..512 * nt], nt);
                assert!(
                    y.iter().all(|&v| v == want),
                    "{isa:?} nt={nt}: {y:?} vs {want}"
                );
            }
        }
    }

    #[test]
    fn extreme_levels_are_exact() {
        // Q8_0 weights of -128 go through the sign trick as |w| = 128 (and through the
        // 512-bit kernel's flipped sign bit as 0, two groups and two or eight tokens); Q5_0 levels
        // span -16..=15 against activations of ±127.
        let rows = 16;
        let mut blocks = vec![
            BlockQ8_0 {
                d: half::f16::ONE,
                qs: [-128; 32]
            };
            rows
        ];
        blocks[3].qs[7] = 127;
        blocks[11].qs[7] = 127;
        let rp = repack_blocks(GgmlType::Q8_0, &blocks, rows, 32);
        for nt in [1, 2, 8] {
            let x = vec![-127.0f32; 32 * nt];
            for isa in isas() {
                let y = run_repacked(isa, 1, &rp, &x, nt);
                for (i, &v) in y.iter().enumerate() {
                    let want = if i % rows % 8 == 3 {
                        31 * 128 * 127 - 127 * 127
                    } else {
                        32 * 128 * 127
                    };
                    assert_eq!(v, want as f32, "{isa:?} nt={nt} output {i}");
                }
            }
        }
        // Q5_0: even rows at level -16, odd rows at 15.
        let q5: Vec<minfer_gguf::quant::BlockQ5_0> = (0..rows)
            .map(|r| minfer_gguf::quant::BlockQ5_0 {
                d: half::f16::ONE,
                qh: if r % 2 == 0 { [0; 4] } else { [0xff; 4] },
                qs: if r % 2 == 0 { [0; 16] } else { [0xff; 16] },
            })
            .collect();
        let rp = repack_blocks(GgmlType::Q5_0, &q5, rows, 32);
        for nt in [1, 2, 8] {
            let x = vec![-127.0f32; 32 * nt];
            for isa in isas() {
                let y = run_repacked(isa, 1, &rp, &x, nt);
                for (i, &v) in y.iter().enumerate() {
                    let want = if i % rows % 2 == 0 {
                        32 * 16 * 127
                    } else {
                        -32 * 15 * 127
                    };
                    assert_eq!(v, want as f32, "Q5_0 {isa:?} nt={nt} output {i}");
                }
            }
        }
    }

    /// Repacking slice by slice gives the whole-matrix result and reports every source
    /// byte exactly once, in order.
    #[test]
    fn chunked_repack_equals_whole_repack() {
        for ty in [
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::Iq4Nl,
            GgmlType::Iq4Xs,
        ] {
            let (rows, cols) = (61, 512);
            let wf = rand_f32(rows * cols, 99 + ty.id() as u64, 1.0);
            let bytes = quantize_to_vec(ty, &wf).unwrap();
            let store = aligned(&bytes);
            let data = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
            let q = QMatrix {
                ty,
                data,
                rows,
                cols,
            };
            let whole = RepackedMatrix::from_qmatrix(&q).unwrap();
            let pool = ThreadPool::new(2);
            let mut seen = Vec::new();
            let row_bytes = bytes.len() / rows;
            let chunked =
                RepackedMatrix::from_qmatrix_chunked(&pool, &q, 17 * row_bytes, &mut |r| {
                    seen.push(r)
                })
                .unwrap();
            assert_eq!(seen.first().map(|r| r.start), Some(0));
            assert_eq!(seen.last().map(|r| r.end), Some(bytes.len()));
            assert!(seen.windows(2).all(|w| w[0].end == w[1].start));
            assert!(seen.len() > 1, "{ty}: the test needs several slices");
            assert_eq!(chunked.rows(), rows);
            assert_eq!(chunked.bytes(), whole.bytes());
            let x = rand_f32(3 * cols, 5, 1.0);
            let isa = Isa::detect();
            assert_eq!(
                run_repacked(isa, 1, &chunked, &x, 3),
                run_repacked(isa, 1, &whole, &x, 3),
                "{ty}"
            );
        }
    }

    #[test]
    fn errors_are_typed() {
        let store = aligned(&[0u8; 22 * 4]);
        let data = &bytemuck::cast_slice::<u64, u8>(&store)[..22 * 4];
        let m = QMatrix {
            ty: GgmlType::Q5_0,
            data,
            rows: 2,
            cols: 64,
        };
        let rp = RepackedMatrix::from_qmatrix(&m).unwrap();
        assert_eq!((rp.ty(), rp.rows(), rp.cols()), (GgmlType::Q5_0, 2, 64));
        let pool = ThreadPool::new(1);
        let mut s = MatmulScratch::new();
        assert_eq!(
            matmul_repacked(&pool, &rp, &[0.0; 63], 1, &mut [0.0; 2], &mut s),
            Err(MatmulError::Activations {
                got: 63,
                nt: 1,
                cols: 64
            })
        );
        assert_eq!(
            matmul_repacked(&pool, &rp, &[0.0; 64], 1, &mut [0.0; 3], &mut s),
            Err(MatmulError::Output {
                got: 3,
                nt: 1,
                rows: 2
            })
        );
        let k = QMatrix {
            ty: GgmlType::Q2K,
            ..m
        };
        assert_eq!(
            RepackedMatrix::from_qmatrix(&k).unwrap_err(),
            MatmulError::UnsupportedType(GgmlType::Q2K)
        );
        let short = QMatrix {
            data: &data[..80],
            ..m
        };
        assert!(matches!(
            RepackedMatrix::from_qmatrix(&short),
            Err(MatmulError::WeightBytes { got: 80, .. })
        ));
    }
}
