//! Grouped-query attention over the persistent K/V regions, softmax inside, tiled
//! (flash-style) for prefill and verify blocks.
//!
//! Query head `h` reads KV head `h / (n_head / n_head_kv)`. Token `t` attends to KV rows
//! `0..=pos[t]` (causal), or to its explicit `[lo, hi)` span, bounded by a sliding
//! window where the layer has one; a non-causal (encoder) node widens each range to the
//! end of its sequence's rows in the step (`AttnMeta::widen_non_causal`), before the
//! blocks are cut, so the tiling below serves both. Work items are (query block, KV head) pairs claimed
//! dynamically by the pool's threads: a block of consecutive tokens and the query heads
//! that share the KV head read each tile of keys together (see [`tiled`]), so a tile of
//! K and V is loaded, and for packed formats decoded, once per block rather than once per
//! token. No score row is longer than a tile, whatever the context.
//!
//! Per query row: `s_j = (q · k_j) * scale` (then `c * tanh(s_j / c)` with a soft-cap),
//! an online softmax over the key tiles (`p_j = exp(s_j - m)` against the running maximum
//! `m`, vectorised with the C library's bits: see `exp`), `o = (Σ p_j v_j) / Σ p_j`, all
//! in f32. With attention sinks (gpt-oss) head `h`'s sink logit `s_h` joins the
//! normaliser after the last tile, as ggml folds it: `o = Σ p_j v_j / (Σ p_j + e^(s_h -
//! m))` against `m = max(m, s_h)`, so it is part of each row's own arithmetic. A row's arithmetic depends on its own key range only, so results do not depend
//! on `-t`, on the block or batch a token is computed in, or on prefix reuse; a decode
//! token runs the same code as a prefill token at its position.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use minfer_graph::{AttnMeta, KvType};

use super::vec::VecIsa;
use super::SharedMut;
use crate::threadpool::ThreadPool;

mod check;
mod tiled;

#[cfg(test)]
use super::{as_i32, kv};

use tiled::{block_item, block_tokens, ItemScratch, BLOCK_ROWS, KEY_TILE};

/// Below this many multiply-adds an attention node runs on the calling thread.
const PAR_MIN_FLOPS: usize = 1 << 16;

/// Query heads per KV head accepted (validated).
const MAX_GROUP: usize = 64;

/// The inputs of one attention node.
#[derive(Debug, Clone, Copy)]
pub struct AttnArgs<'a> {
    /// Geometry and layer.
    pub meta: &'a AttnMeta,
    /// Query rows: `nt` rows of `q_stride` values, heads at the start of each row.
    pub q: &'a [f32],
    /// Values per query row (may exceed `n_head * hd` for a fused q|k|v buffer).
    pub q_stride: usize,
    /// Tokens.
    pub nt: usize,
    /// I32 positions (bit patterns), one per token.
    pub pos: &'a [f32],
    /// Optional I32 `[lo, hi)` pairs, one per token, replacing the causal bound.
    pub span: Option<&'a [f32]>,
    /// K region: `n_ctx` rows of `n_head_kv * hd`, stored as `types[0]`.
    pub k: &'a [f32],
    /// V region, same geometry, stored as `types[1]`.
    pub v: &'a [f32],
    /// The storage formats of K and V.
    pub types: [KvType; 2],
    /// One sink logit per query head when the node has them (`AttnMeta::sinks`).
    pub sinks: Option<&'a [f32]>,
}

/// Reusable buffers: per-token key ranges, the query blocks, and per-thread score rows,
/// softmax state and decoded tiles. Their sizes do not grow with the context.
#[derive(Debug, Default)]
pub struct AttnScratch {
    ranges: Vec<(usize, usize)>,
    blocks: Vec<(usize, usize)>,
    work: Vec<f32>,
}

/// Cuts the tokens into query blocks of at most `per` consecutive tokens. A block also
/// ends where the next token's keys do not overlap the block's (another sequence), and,
/// on a ringed layer, where they belong to another sequence or the block's keys would
/// outgrow the ring (its rows are then not all present at once).
fn cut_blocks(
    m: &AttnMeta,
    ranges: &[(usize, usize)],
    per: usize,
    blocks: &mut Vec<(usize, usize)>,
) {
    blocks.clear();
    let mut start = 0;
    let (mut lo, mut hi) = (0, 0);
    for (t, &(rl, rh)) in ranges.iter().enumerate() {
        let joins = t > start && t - start < per && rl < hi && lo < rh && {
            let (nlo, nhi) = (lo.min(rl), hi.max(rh));
            m.ring
                .is_none_or(|r| rl / r.seq_rows == lo / r.seq_rows && nhi - nlo <= r.rows)
        };
        if joins {
            (lo, hi) = (lo.min(rl), hi.max(rh));
        } else {
            if t > start {
                blocks.push((start, t));
            }
            start = t;
            (lo, hi) = (rl, rh);
        }
    }
    if ranges.len() > start {
        blocks.push((start, ranges.len()));
    }
}

/// Runs attention for every token and head into `out` (`nt` rows of `n_head * hd`).
pub fn attention(
    pool: &ThreadPool,
    isa: VecIsa,
    a: &AttnArgs,
    out: &mut [f32],
    scratch: &mut AttnScratch,
) -> Result<(), String> {
    check::validate(a, out.len())?;
    check::key_ranges(a, &mut scratch.ranges)?;
    let m = a.meta;
    let (hd, group) = (m.hd, m.n_head / m.n_head_kv);
    let ranges = &scratch.ranges;
    let per = block_tokens(group);
    cut_blocks(m, ranges, per, &mut scratch.blocks);
    let blocks = &scratch.blocks;
    let work: usize = ranges.iter().map(|r| r.1 - r.0).sum::<usize>() * m.n_head * hd;
    let nth = if work < PAR_MIN_FLOPS {
        1
    } else {
        pool.n_threads()
    };
    // Per thread: scores, maxima and sums of a block's rows, and the decoded tiles.
    let rows = per * group;
    let tile_of = |t: KvType| if t == KvType::F32 { 0 } else { KEY_TILE * hd };
    let (kt, vt) = (tile_of(a.types[0]), tile_of(a.types[1]));
    let per_thread = rows * (KEY_TILE + 2) + kt + vt;
    if scratch.work.len() < nth * per_thread {
        scratch.work.resize(nth * per_thread, 0.0);
    }
    debug_assert!(rows <= BLOCK_ROWS.max(group));
    let items = blocks.len() * m.n_head_kv;
    let run_item = |item: usize, buf: &mut [f32], out: &SharedMut<f32>| {
        let (b, g) = (item / m.n_head_kv, item % m.n_head_kv);
        let (scores, rest) = buf.split_at_mut(rows * KEY_TILE);
        let (mx, rest) = rest.split_at_mut(rows);
        let (l, rest) = rest.split_at_mut(rows);
        let (ktile, vtile) = rest.split_at_mut(kt);
        let st = ItemScratch {
            scores,
            m: mx,
            l,
            ktile,
            vtile: &mut vtile[..vt],
        };
        block_item(isa, a, blocks[b], g, ranges, st, out);
    };
    let shared_out = SharedMut::new(&mut out[..a.nt * m.n_head * hd]);
    if nth == 1 {
        let buf = &mut scratch.work[..per_thread];
        for item in 0..items {
            run_item(item, buf, &shared_out);
        }
        return Ok(());
    }
    let shared_work = SharedMut::new(&mut scratch.work[..nth * per_thread]);
    let next = AtomicUsize::new(0);
    pool.run(&|ith, _| {
        // SAFETY: thread `ith` alone uses work block `ith`.
        let buf = unsafe { shared_work.slice(ith * per_thread..(ith + 1) * per_thread) };
        loop {
            let claimed = next.fetch_add(1, Relaxed);
            if claimed >= items {
                break;
            }
            // The last blocks first: causal blocks grow with their position, and the
            // largest ones started early leave the small ones to even the threads out.
            run_item(items - 1 - claimed, buf, &shared_out);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests;
