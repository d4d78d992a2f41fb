//! Expert-routed products (ggml's `MUL_MAT_ID`): each token slot is multiplied by the
//! expert its router chose, reading only the chosen experts' rows of the stacked weight.
//!
//! The slots are grouped by expert (a counting sort, slots in ascending order inside a
//! group), so each chosen expert's weights stream once per call however many tokens chose
//! it: in decode each token reads its `k` experts once, in prefill an expert's rows stay in
//! cache across the tokens of its group, in groups of four through the multi-token
//! kernels as [`super::matmul`] does. The activations are quantized once per call and
//! shared by every matrix of the call (an expert's gate and up read the same rows).
//!
//! Stacked weights repacked into k-quant tiles ([`ExpertMatrix::packed`]: Q4_K, Q6_K,
//! IQ4_XS) are read through the tile kernels, eight rows per activation load, as the
//! dense [`super::matmul_repacked`] reads them; those kernels give the unpacked kernels'
//! bits, so the layout never changes a result.
//!
//! Determinism: every output element is one kernel call by one thread; the token
//! grouping depends on the routing only, and each kernel's per-token result does not
//! depend on the group, so results are identical for every thread count and batch mix.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use minfer_gguf::quant::{cast_blocks, Block, BlockQ8K};
use minfer_gguf::GgmlType;

use super::repacked::{KTiles, ROWS};
use super::{
    for_type, Activation, Disjoint, MatmulError, MatmulScratch, RepackedMatrix, TypeFn, TOKEN_GROUP,
};
use crate::quant::{dot_float, dot_unchecked, FloatWeight, Isa, QuantDot};
use crate::threadpool::{chunk_range, ThreadPool};

/// Matrices one call may share its activations between (an expert's gate and up).
pub const MAX_MATS: usize = 2;

/// A stacked expert weight in GGUF layout (`[cols, rows, n_expert]`): expert `e` is
/// rows `e * rows .. (e + 1) * rows` of `n_expert * rows` rows of `cols` values of `ty`.
#[derive(Debug, Clone, Copy)]
pub struct ExpertMatrix<'a> {
    /// The element type.
    pub ty: GgmlType,
    /// The raw bytes of all experts.
    pub data: &'a [u8],
    /// Output features of one expert.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Experts stacked.
    pub n_expert: usize,
    /// The same `n_expert * rows` rows repacked ([`RepackedMatrix`]), read instead of
    /// `data` when they are k-quant tiles and every matrix of the call has them.
    pub packed: Option<&'a RepackedMatrix>,
}

/// Reusable buffers of [`matmul_id`]: the quantized activations and the slot grouping.
/// They grow to the largest call, so steady-state calls do not allocate.
#[derive(Debug, Default)]
pub struct IdScratch {
    acts: MatmulScratch,
    /// Slots sorted by expert.
    order: Vec<u32>,
    /// Start of each expert's slots in `order` (`n_expert + 1` entries).
    starts: Vec<usize>,
    /// The experts chosen by at least one slot, ascending.
    active: Vec<u32>,
}

/// `ys[m][s * rows + r] = sum_c W^m_e[r][c] x[row(s)][c]` for every slot `s` with expert
/// `e = ids[s]`, where `x` holds `x_rows` rows of `cols`: one per slot (`row(s) = s`) or one
/// per token of `ids.len() / x_rows` slots (`row(s) = s / k`). The matrices of `mats` share
/// type and shape and read one quantization of `x`. With the detected ISA.
pub fn matmul_id(
    pool: &ThreadPool,
    mats: &[ExpertMatrix],
    x: &[f32],
    ids: &[u32],
    ys: &mut [&mut [f32]],
    scratch: &mut IdScratch,
) -> Result<(), MatmulError> {
    matmul_id_with(Isa::detect(), pool, mats, x, ids, ys, scratch)
}

/// [`matmul_id`] with an explicit ISA.
pub fn matmul_id_with(
    isa: Isa,
    pool: &ThreadPool,
    mats: &[ExpertMatrix],
    x: &[f32],
    ids: &[u32],
    ys: &mut [&mut [f32]],
    scratch: &mut IdScratch,
) -> Result<(), MatmulError> {
    let bad = |m: String| Err(MatmulError::Multi(m));
    let Some(first) = mats.first().copied() else {
        return bad("no expert matrix".into());
    };
    if mats.len() > MAX_MATS || ys.len() != mats.len() {
        return bad(format!(
            "{} matrices into {} outputs (at most {MAX_MATS})",
            mats.len(),
            ys.len()
        ));
    }
    let (ty, rows, cols, n_expert) = (first.ty, first.rows, first.cols, first.n_expert);
    if ty == GgmlType::Q8K {
        return Err(MatmulError::UnsupportedType(ty));
    }
    let block = ty.block_size();
    if cols % block != 0 {
        return Err(MatmulError::NotBlockMultiple { ty, cols, block });
    }
    for m in mats {
        if (m.ty, m.rows, m.cols, m.n_expert) != (ty, rows, cols, n_expert) {
            return bad(format!(
                "experts {} [{}x{}x{}] and {ty} [{rows}x{cols}x{n_expert}] differ",
                m.ty, m.rows, m.cols, m.n_expert
            ));
        }
        let expected = n_expert
            .checked_mul(rows)
            .and_then(|r| r.checked_mul(cols / block))
            .and_then(|b| b.checked_mul(ty.type_size()));
        if expected != Some(m.data.len()) {
            return Err(MatmulError::WeightBytes {
                ty,
                rows: n_expert * rows,
                cols,
                got: m.data.len(),
                expected,
            });
        }
    }
    let slots = ids.len();
    let x_rows = x.len() / cols.max(1);
    if cols == 0 || x_rows * cols != x.len() || x_rows == 0 || !slots.is_multiple_of(x_rows) {
        return Err(MatmulError::Activations {
            got: x.len(),
            nt: slots,
            cols,
        });
    }
    for y in ys.iter() {
        if y.len() != slots * rows {
            return Err(MatmulError::Output {
                got: y.len(),
                nt: slots,
                rows,
            });
        }
    }
    if let Some((s, &e)) = ids
        .iter()
        .enumerate()
        .find(|&(_, &e)| e as usize >= n_expert)
    {
        return bad(format!("slot {s} chose expert {e} of {n_expert}"));
    }
    group_by_expert(ids, n_expert, scratch);
    if rows == 0 || slots == 0 {
        return Ok(());
    }
    let mut outs: [Disjoint<f32>; MAX_MATS] = [Disjoint::new(&mut []), Disjoint::new(&mut [])];
    for (o, y) in outs.iter_mut().zip(ys.iter_mut()) {
        *o = Disjoint::new(y);
    }
    let IdScratch {
        acts,
        order,
        starts,
        active,
    } = scratch;
    let tiles = k_tiles(mats, rows, cols);
    let work = Work {
        isa,
        pool,
        mats,
        x,
        x_rows,
        per_row: slots / x_rows,
        rows,
        cols,
        order,
        starts,
        active,
        outs: &outs,
        align: if tiles.is_some() { ROWS } else { 1 },
    };
    match tiles {
        Some(t) => {
            run_tiles(work, t, acts);
            Ok(())
        }
        None => for_type(ty, IdCall { work, acts }),
    }
}

/// The k-quant tiles of every matrix of the call, when each has them for its whole
/// stacked shape and an expert is whole row groups; `None` reads the GGUF layout.
fn k_tiles<'a>(
    mats: &[ExpertMatrix<'a>],
    rows: usize,
    cols: usize,
) -> Option<[KTiles<'a>; MAX_MATS]> {
    if !rows.is_multiple_of(ROWS) {
        return None;
    }
    let mut out = [None; MAX_MATS];
    for (slot, m) in out.iter_mut().zip(mats) {
        let p = m.packed?;
        if p.ty() != m.ty || p.rows() != m.n_expert * rows || p.cols() != cols {
            return None;
        }
        *slot = Some(p.k_tiles()?);
    }
    let first = out[0]?;
    Some(out.map(|t| t.unwrap_or(first)))
}

/// Quantizes the call's activation rows into scratch (rows split over the pool).
fn quantize_acts<'s, A: Activation>(work: &Work<'_, '_>, acts: &'s mut MatmulScratch) -> &'s [A] {
    let (isa, cols, x) = (work.isa, work.cols, work.x);
    let bpr = cols / A::ELEMS;
    let n = work.x_rows * bpr;
    let buf = A::buffer(acts);
    if buf.len() < n {
        buf.resize(n, bytemuck::Zeroable::zeroed());
    }
    let acts = &mut buf[..n];
    if work.x_rows == 1 {
        A::quantize_row(isa, x, acts);
    } else {
        let shared = Disjoint::new(acts);
        work.pool.run(&|ith, nth| {
            let r = chunk_range(n / bpr, ith, nth);
            // SAFETY: row ranges of different threads are disjoint.
            let out = unsafe { shared.slice(r.start * bpr..r.end * bpr) };
            A::quantize_row(isa, &x[r.start * cols..r.end * cols], out);
        });
    }
    acts
}

/// The call over k-quant tiles: per work item, each group of up to four slots against
/// each row group of the item's rows (the tile kernels give the unpacked kernels' bits).
fn run_tiles(work: Work<'_, '_>, tiles: [KTiles<'_>; MAX_MATS], acts: &mut MatmulScratch) {
    let acts: &[BlockQ8K] = quantize_acts(&work, acts);
    let (isa, rows, per_row) = (work.isa, work.rows, work.per_row);
    let nb = work.cols / BlockQ8K::ELEMS;
    let act = |s: u32| {
        let row = s as usize / per_row;
        &acts[row * nb..(row + 1) * nb]
    };
    let outs = work.outs;
    work.for_items(&|e, m, rr, slots| {
        let t = tiles[m];
        // Items start and end on row groups (`Work::align`), and an expert is whole groups.
        let (g0, g1) = ((e * rows + rr.start) / ROWS, (e * rows + rr.end) / ROWS);
        for group in slots.chunks(TOKEN_GROUP) {
            for g in g0..g1 {
                let mut res = [[0.0f32; ROWS]; TOKEN_GROUP];
                match *group {
                    [a, b, c, d] => res = t.gemv(isa, g, nb, [act(a), act(b), act(c), act(d)]),
                    [a, b, c] => {
                        res[..3].copy_from_slice(&t.gemv(isa, g, nb, [act(a), act(b), act(c)]))
                    }
                    [a, b] => res[..2].copy_from_slice(&t.gemv(isa, g, nb, [act(a), act(b)])),
                    [a] => res[0] = t.gemv(isa, g, nb, [act(a)])[0],
                    _ => {}
                }
                let r0 = g * ROWS - e * rows;
                for (&s, r8) in group.iter().zip(&res) {
                    for (r, &v) in r8.iter().enumerate() {
                        // SAFETY: slot s's rows of this item belong to this item only.
                        unsafe { outs[m].write(s as usize * rows + r0 + r, v) };
                    }
                }
            }
        }
    });
}

/// Sorts the slots by expert into `scratch.order` (stable), with each expert's start in
/// `scratch.starts` and the chosen experts in `scratch.active`.
fn group_by_expert(ids: &[u32], n_expert: usize, scratch: &mut IdScratch) {
    let starts = &mut scratch.starts;
    starts.clear();
    starts.resize(n_expert + 1, 0);
    for &e in ids {
        starts[e as usize + 1] += 1;
    }
    scratch.active.clear();
    for e in 0..n_expert {
        if starts[e + 1] > 0 {
            scratch.active.push(e as u32);
        }
        starts[e + 1] += starts[e];
    }
    scratch.order.clear();
    scratch.order.resize(ids.len(), 0);
    // `starts[e]` serves as expert e's fill cursor; filling in slot order keeps each
    // group ascending.
    for (s, &e) in ids.iter().enumerate() {
        let pos = starts[e as usize];
        scratch.order[pos] = s as u32;
        starts[e as usize] += 1;
    }
    // The fill advanced every start to the next expert's: shift them back.
    for e in (1..=n_expert).rev() {
        starts[e] = starts[e - 1];
    }
    starts[0] = 0;
}

/// The body of one work item: `(expert, matrix, weight rows, the expert's slots)`.
type ItemFn<'a> = dyn Fn(usize, usize, std::ops::Range<usize>, &[u32]) + Sync + 'a;

/// One call: its work and the activation buffers, run by [`for_type`].
struct IdCall<'a, 'b> {
    work: Work<'a, 'b>,
    acts: &'a mut MatmulScratch,
}

/// One call's sizes, grouping and outputs.
struct Work<'a, 'b> {
    isa: Isa,
    pool: &'a ThreadPool,
    mats: &'a [ExpertMatrix<'b>],
    x: &'a [f32],
    x_rows: usize,
    /// Slots per activation row (1, or `k` when the row is the token's).
    per_row: usize,
    rows: usize,
    cols: usize,
    order: &'a [u32],
    starts: &'a [usize],
    active: &'a [u32],
    outs: &'a [Disjoint<f32>; MAX_MATS],
    /// Items hold whole multiples of this many rows (the tile height, or 1).
    align: usize,
}

impl Work<'_, '_> {
    /// Rows per work item: about four items per thread over every (expert, matrix).
    fn tile_rows(&self) -> usize {
        let groups = self.active.len() * self.mats.len();
        let want = 4 * self.pool.n_threads();
        let tiles_per_group = want.div_ceil(groups.max(1));
        let a = self.align;
        (self.rows.div_ceil(tiles_per_group).clamp(1, 64)).div_ceil(a) * a
    }

    /// Runs `body(expert, matrix, rows, slots)` over every work item: a contiguous run of
    /// items per thread when every group is one slot (decode streams the weights once), else
    /// claimed dynamically.
    fn for_items(&self, body: &ItemFn<'_>) {
        let tile = self.tile_rows();
        let n_tiles = self.rows.div_ceil(tile);
        let n_mats = self.mats.len();
        let n_items = self.active.len() * n_mats * n_tiles;
        let item = |i: usize| {
            let (g, rest) = (i / (n_mats * n_tiles), i % (n_mats * n_tiles));
            let (m, t) = (rest / n_tiles, rest % n_tiles);
            let e = self.active[g] as usize;
            let r0 = t * tile;
            let slots = &self.order[self.starts[e]..self.starts[e + 1]];
            body(e, m, r0..(r0 + tile).min(self.rows), slots);
        };
        if self.order.len() == self.active.len() {
            self.pool.run(&|ith, nth| {
                for i in chunk_range(n_items, ith, nth) {
                    item(i);
                }
            });
            return;
        }
        let next = AtomicUsize::new(0);
        self.pool.run(&|_, _| loop {
            let i = next.fetch_add(1, Relaxed);
            if i >= n_items {
                break;
            }
            item(i);
        });
    }
}

impl TypeFn for IdCall<'_, '_> {
    type Out = ();

    fn quant<B>(self) -> Result<(), MatmulError>
    where
        B: QuantDot + Sync,
        B::Act: Activation,
    {
        let IdCall { work, acts } = self;
        let mut blocks: [&[B]; MAX_MATS] = [&[], &[]];
        for (slot, m) in blocks.iter_mut().zip(work.mats) {
            *slot = cast_blocks(m.data).ok_or(MatmulError::Misaligned {
                ty: m.ty,
                align: std::mem::align_of::<B>(),
            })?;
        }
        let (isa, cols, rows) = (work.isa, work.cols, work.rows);
        let bpr = cols / B::ELEMS;
        let acts: &[B::Act] = quantize_acts(&work, acts);
        let per_row = work.per_row;
        let act = |s: u32| {
            let row = s as usize / per_row;
            &acts[row * bpr..(row + 1) * bpr]
        };
        let outs = work.outs;
        work.for_items(&|e, m, rr, slots| {
            let w = blocks[m];
            for group in slots.chunks(TOKEN_GROUP) {
                for r in rr.clone() {
                    let wr = &w[(e * rows + r) * bpr..(e * rows + r + 1) * bpr];
                    let mut res = [0.0f32; TOKEN_GROUP];
                    match *group {
                        [a, b, c, d] => {
                            res = dot_unchecked(isa, wr, [act(a), act(b), act(c), act(d)])
                        }
                        [a, b, c] => res[..3].copy_from_slice(&dot_unchecked(
                            isa,
                            wr,
                            [act(a), act(b), act(c)],
                        )),
                        [a, b] => {
                            res[..2].copy_from_slice(&dot_unchecked(isa, wr, [act(a), act(b)]))
                        }
                        [a] => res[0] = dot_unchecked(isa, wr, [act(a)])[0],
                        _ => {}
                    }
                    for (&s, &v) in group.iter().zip(&res) {
                        // SAFETY: slot s's row r of matrix m belongs to this item only.
                        unsafe { outs[m].write(s as usize * rows + r, v) };
                    }
                }
            }
        });
        Ok(())
    }

    fn float<W: FloatWeight + bytemuck::Pod + Sync>(self) -> Result<(), MatmulError> {
        let work = self.work;
        let mut data: [&[W]; MAX_MATS] = [&[], &[]];
        for (slot, m) in data.iter_mut().zip(work.mats) {
            *slot = bytemuck::try_cast_slice(m.data).map_err(|_| MatmulError::Misaligned {
                ty: m.ty,
                align: std::mem::align_of::<W>(),
            })?;
        }
        let (isa, cols, rows, per_row, x) = (work.isa, work.cols, work.rows, work.per_row, work.x);
        let outs = work.outs;
        work.for_items(&|e, m, rr, slots| {
            for &s in slots {
                let row = s as usize / per_row;
                let xr = &x[row * cols..(row + 1) * cols];
                for r in rr.clone() {
                    let wr = &data[m][(e * rows + r) * cols..(e * rows + r + 1) * cols];
                    // SAFETY: slot s's row r of matrix m belongs to this item only.
                    unsafe { outs[m].write(s as usize * rows + r, dot_float(isa, wr, xr)) };
                }
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::{matmul_with, QMatrix};
    use crate::quant::testutil::{isas, rand_f32};
    use minfer_gguf::quant::{dequantize, quantize_to_vec};

    /// Weight bytes in a u64-backed buffer so every block type is aligned.
    fn aligned(bytes: &[u8]) -> Vec<u64> {
        let mut v = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
        v
    }

    /// Slot `s`'s expert: several tokens share some experts, others go unused.
    fn routing(slots: usize, n_expert: usize) -> Vec<u32> {
        (0..slots)
            .map(|s| ((s * 5 + s / 3) % (n_expert - 1)) as u32)
            .collect()
    }

    #[test]
    fn grouping_is_a_stable_sort_by_expert() {
        let mut sc = IdScratch::default();
        group_by_expert(&[2, 0, 2, 1, 0, 2], 4, &mut sc);
        assert_eq!(sc.order, vec![1, 4, 3, 0, 2, 5]);
        assert_eq!(sc.starts, vec![0, 2, 3, 6, 6]);
        assert_eq!(sc.active, vec![0, 1, 2]);
    }

    /// Every type, shared and per-slot rows, decode and prefill: the routed product is the
    /// bits of the dense matmul of each slot's expert (the same kernels), for every ISA and
    /// thread count, and within the quantization error of the f64 product of the
    /// dequantized weights (so the scalar reference and the fast path agree with f32).
    #[test]
    fn routed_product_is_the_dense_product_of_the_chosen_expert() {
        let (rows, n_expert, k) = (19, 5, 2);
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
        ] {
            let cols = if ty.block_size() == 256 { 256 } else { 64 };
            let wf = rand_f32(n_expert * rows * cols, ty.id() as u64 + 11, 1.0);
            let bytes = quantize_to_vec(ty, &wf).unwrap();
            let store = aligned(&bytes);
            let w = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
            let mut wd = vec![0.0; wf.len()];
            dequantize(ty, w, &mut wd).unwrap();
            let expert_bytes = w.len() / n_expert;
            for nt in [1usize, 3, 9] {
                let ids = routing(nt * k, n_expert);
                for per_slot in [false, true] {
                    let x_rows = if per_slot { nt * k } else { nt };
                    let x = rand_f32(x_rows * cols, nt as u64 + 3, 1.0);
                    let mat = ExpertMatrix {
                        ty,
                        data: w,
                        rows,
                        cols,
                        n_expert,
                        packed: None,
                    };
                    let mut first: Option<Vec<f32>> = None;
                    for isa in isas() {
                        let mut first_here: Option<Vec<f32>> = None;
                        for threads in [1, 3] {
                            let pool = ThreadPool::new(threads);
                            let mut y = vec![f32::NAN; nt * k * rows];
                            let mut sc = IdScratch::default();
                            matmul_id_with(isa, &pool, &[mat], &x, &ids, &mut [&mut y], &mut sc)
                                .unwrap();
                            // The dense product of each slot's expert, one slot at a time.
                            for (s, &e) in ids.iter().enumerate() {
                                let row = if per_slot { s } else { s / k };
                                let q = QMatrix {
                                    ty,
                                    data: &w[e as usize * expert_bytes..][..expert_bytes],
                                    rows,
                                    cols,
                                };
                                let mut want = vec![0.0; rows];
                                let xr = &x[row * cols..(row + 1) * cols];
                                let mut ms = MatmulScratch::new();
                                matmul_with(isa, &pool, &q, xr, 1, &mut want, &mut ms).unwrap();
                                let got = &y[s * rows..(s + 1) * rows];
                                assert_eq!(got, &want[..], "{ty} nt={nt} slot {s}");
                                for r in 0..rows {
                                    let wr = &wd[(e as usize * rows + r) * cols..][..cols];
                                    let exact: f64 = wr
                                        .iter()
                                        .zip(xr)
                                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                                        .sum();
                                    let wsum: f64 = wr.iter().map(|v| f64::from(v.abs())).sum();
                                    let xmax =
                                        xr.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
                                    let err = (f64::from(got[r]) - exact).abs();
                                    assert!(
                                        err <= 1e-2 * wsum * xmax + 1e-4,
                                        "{ty} slot {s} row {r}: error {err}"
                                    );
                                }
                            }
                            // Threads never change bits.
                            match &first_here {
                                None => first_here = Some(y.clone()),
                                Some(f) => assert_eq!(f, &y, "{ty} {isa:?} threads {threads}"),
                            }
                            // The quantized kernels of every ISA give the scalar bits.
                            if ty.block_size() > 1 {
                                match &first {
                                    None => first = Some(y),
                                    Some(f) => assert_eq!(f, &y, "{ty} {isa:?}"),
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Gate and up in one call give the bits of two single-matrix calls.
    #[test]
    fn shared_activations_match_separate_calls() {
        let (rows, cols, n_expert) = (7, 256, 4);
        let ty = GgmlType::Q4K;
        let mk = |seed| {
            let b = quantize_to_vec(ty, &rand_f32(n_expert * rows * cols, seed, 1.0)).unwrap();
            (aligned(&b), b.len())
        };
        let ((ga, gl), (ua, ul)) = (mk(1), mk(2));
        let g = &bytemuck::cast_slice::<u64, u8>(&ga)[..gl];
        let u = &bytemuck::cast_slice::<u64, u8>(&ua)[..ul];
        let m = |data| ExpertMatrix {
            ty,
            data,
            rows,
            cols,
            n_expert,
            packed: None,
        };
        let (nt, k) = (5, 2);
        let ids = routing(nt * k, n_expert);
        let x = rand_f32(nt * cols, 9, 1.0);
        let pool = ThreadPool::new(2);
        let mut sc = IdScratch::default();
        let (mut yg, mut yu) = (vec![0.0; nt * k * rows], vec![0.0; nt * k * rows]);
        matmul_id(
            &pool,
            &[m(g), m(u)],
            &x,
            &ids,
            &mut [&mut yg, &mut yu],
            &mut sc,
        )
        .unwrap();
        let (mut sg, mut su) = (vec![0.0; nt * k * rows], vec![0.0; nt * k * rows]);
        matmul_id(&pool, &[m(g)], &x, &ids, &mut [&mut sg], &mut sc).unwrap();
        matmul_id(&pool, &[m(u)], &x, &ids, &mut [&mut su], &mut sc).unwrap();
        assert_eq!((yg, yu), (sg, su));
    }

    /// Experts repacked into k-quant tiles give the bits of the GGUF layout, for every
    /// ISA and thread count, decode and prefill, one matrix or gate and up together; a
    /// matrix without tiles, or an expert that is not whole row groups, falls back.
    #[test]
    fn k_quant_tiles_give_the_bits_of_the_gguf_layout() {
        let (n_expert, k, cols) = (5, 2, 512);
        for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Iq4Xs] {
            for rows in [16, 12] {
                let mk = |seed: u64| {
                    let wf = rand_f32(n_expert * rows * cols, seed + ty.id() as u64, 1.0);
                    let b = quantize_to_vec(ty, &wf).unwrap();
                    (aligned(&b), b.len())
                };
                let ((ga, gl), (ua, ul)) = (mk(21), mk(22));
                let g = &bytemuck::cast_slice::<u64, u8>(&ga)[..gl];
                let u = &bytemuck::cast_slice::<u64, u8>(&ua)[..ul];
                let pack = |data| {
                    let q = QMatrix {
                        ty,
                        data,
                        rows: n_expert * rows,
                        cols,
                    };
                    RepackedMatrix::from_qmatrix(&q).unwrap()
                };
                let (gp, up) = (pack(g), pack(u));
                assert!(gp.k_tiles().is_some());
                let m = |data, packed| ExpertMatrix {
                    ty,
                    data,
                    rows,
                    cols,
                    n_expert,
                    packed,
                };
                for nt in [1usize, 3, 9] {
                    let ids = routing(nt * k, n_expert);
                    for x_rows in [nt, nt * k] {
                        let x = rand_f32(x_rows * cols, nt as u64 + 5, 1.0);
                        let call = |isa, threads, mats: &[ExpertMatrix]| {
                            let pool = ThreadPool::new(threads);
                            let mut ys = vec![vec![f32::NAN; nt * k * rows]; mats.len()];
                            let mut outs: Vec<&mut [f32]> =
                                ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                            let mut sc = IdScratch::default();
                            matmul_id_with(isa, &pool, mats, &x, &ids, &mut outs, &mut sc).unwrap();
                            ys
                        };
                        let want = call(Isa::SCALAR, 1, &[m(g, None), m(u, None)]);
                        for isa in isas() {
                            for threads in [1, 2, 3] {
                                let both = [m(g, Some(&gp)), m(u, Some(&up))];
                                assert_eq!(call(isa, threads, &both), want, "{ty} {rows} {nt}");
                                let one = call(isa, threads, &[m(u, Some(&up))]);
                                assert_eq!(one[0], want[1], "{ty} {rows} {nt} up alone");
                                // One matrix without tiles: both read the GGUF layout.
                                let mixed = [m(g, Some(&gp)), m(u, None)];
                                assert_eq!(call(isa, threads, &mixed), want, "{ty} mixed");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_expert_ids_and_shapes_are_errors() {
        let pool = ThreadPool::new(1);
        let w = vec![0u8; 2 * 3 * 32 * 4];
        let m = ExpertMatrix {
            ty: GgmlType::F32,
            data: &w,
            rows: 3,
            cols: 32,
            n_expert: 2,
            packed: None,
        };
        let x = vec![0.0; 32];
        let mut y = vec![0.0; 3];
        let mut sc = IdScratch::default();
        let e = matmul_id(&pool, &[m], &x, &[2], &mut [&mut y], &mut sc).unwrap_err();
        assert!(e.to_string().contains("expert 2 of 2"), "{e}");
        let e = matmul_id(&pool, &[m], &x[..16], &[0], &mut [&mut y], &mut sc).unwrap_err();
        assert!(matches!(e, MatmulError::Activations { .. }), "{e}");
    }
}
