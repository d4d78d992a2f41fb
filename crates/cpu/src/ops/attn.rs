//! Grouped-query attention over the persistent f32 K/V regions, softmax inside.
//!
//! Query head `h` reads KV head `h / (n_head / n_head_kv)`. Token `t` attends to KV rows
//! `0..=pos[t]` (causal), or to its explicit `[lo, hi)` span. Work items are
//! (token, KV head) pairs claimed dynamically by the pool's threads: the query heads that
//! share a KV head read its K and V rows together, a block of keys at a time, so each
//! block is loaded once per group. Each item is computed start to finish by one thread in
//! a fixed order, so results do not depend on `-t`.
//!
//! Per item: `s_j = (q · k_j) * scale` (then `c * tanh(s_j / c)` with a soft-cap),
//! `p_j = exp(s_j - max s)` (vectorised, with the C library's bits: see `exp`),
//! `o = (Σ p_j v_j) / Σ p_j`, all accumulated in f32 (scores eight keys per reduction,
//! the V sum held in registers).
//!
//! Packed K/V formats (F16, Q8_0: [`KvType`]) are decoded one block of keys of one KV
//! head at a time into a per-thread f32 tile, which the same vector primitives then read;
//! the F32 format reads the region directly, so its bits do not depend on the others.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use minfer_graph::{AttnMeta, KvType};

use super::kv;
use super::vec::VecIsa;
use super::{as_i32, SharedMut};
use crate::threadpool::ThreadPool;

/// Below this many multiply-adds an attention node runs on the calling thread.
const PAR_MIN_FLOPS: usize = 1 << 16;

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
}

/// Reusable buffers: per-token key ranges, per-thread score rows and per-thread tiles of
/// decoded keys (packed formats only).
#[derive(Debug, Default)]
pub struct AttnScratch {
    ranges: Vec<(usize, usize)>,
    scores: Vec<f32>,
    tiles: Vec<f32>,
}

/// The key range of every token, checked against the region.
fn key_ranges(a: &AttnArgs, ranges: &mut Vec<(usize, usize)>) -> Result<(), String> {
    let m = a.meta;
    // Spans and positions name virtual rows; a ring maps them (see `KvRing`).
    let rows = m.virtual_rows();
    ranges.clear();
    for t in 0..a.nt {
        let (lo, hi) = match a.span {
            Some(s) => {
                let pair = s.get(2 * t..2 * t + 2).ok_or_else(|| {
                    format!("span input has {} values, token {t} needs a pair", s.len())
                })?;
                (i64::from(as_i32(pair[0])), i64::from(as_i32(pair[1])))
            }
            None => {
                let p = i64::from(as_i32(a.pos[t]));
                if p < 0 || p >= rows as i64 {
                    return Err(format!(
                        "token {t}: position {p} outside the {rows}-row KV region of layer {}",
                        m.layer
                    ));
                }
                (0, p + 1)
            }
        };
        if lo < 0 || lo >= hi || hi > rows as i64 {
            return Err(format!(
                "token {t}: key range [{lo}, {hi}) invalid for the {rows}-row KV region of layer {}",
                m.layer
            ));
        }
        // A sliding-window layer reads only the last `window` rows: evicted rows are
        // never scanned, so the cost of a token is bounded by the window.
        let lo = match m.window {
            Some(w) => lo.max(hi - w as i64),
            None => lo,
        };
        if let Some(r) = m.ring {
            // One sequence's keys, no more than the ring holds.
            if hi - lo > r.rows as i64 || lo as usize / r.seq_rows != (hi as usize - 1) / r.seq_rows
            {
                return Err(format!(
                    "token {t}: key range [{lo}, {hi}) does not fit layer {}'s ring of {} rows per {}-row sequence",
                    m.layer, r.rows, r.seq_rows
                ));
            }
        }
        ranges.push((lo as usize, hi as usize));
    }
    Ok(())
}

/// Checks every length the kernel indexes.
fn validate(a: &AttnArgs, out_len: usize) -> Result<(), String> {
    let m = a.meta;
    if m.hd == 0
        || m.n_head == 0
        || m.n_head_kv == 0
        || !m.n_head.is_multiple_of(m.n_head_kv)
        || m.n_head / m.n_head_kv > MAX_GROUP
    {
        return Err(format!(
            "attention geometry: n_head {} n_head_kv {} hd {} (n_head must be a positive multiple of n_head_kv, at most {MAX_GROUP} times it)",
            m.n_head, m.n_head_kv, m.hd
        ));
    }
    if m.window == Some(0) || m.window.is_some_and(|w| w > i64::MAX as usize) {
        return Err(format!(
            "attention: a sliding window of {:?} rows (it must hold at least the token's own row)",
            m.window
        ));
    }
    if m.softcap.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
        return Err(format!(
            "attention: a score soft-cap of {:?} (it must be a positive number)",
            m.softcap
        ));
    }
    let qrow = m.n_head * m.hd;
    if a.q_stride < qrow || a.q.len() < a.nt * a.q_stride {
        return Err(format!(
            "attention: q holds {} values, {} tokens of {qrow} needed (row stride {})",
            a.q.len(),
            a.nt,
            a.q_stride
        ));
    }
    for t in a.types {
        if !m.hd.is_multiple_of(t.block()) {
            return Err(format!(
                "attention: heads of {} cannot be read as {t} (blocks of {})",
                m.hd,
                t.block()
            ));
        }
    }
    let (_, k_need) = kv::region_words(a.types[0], m.nkt(), m.n_ctx)?;
    let (_, v_need) = kv::region_words(a.types[1], m.nkt(), m.n_ctx)?;
    if a.k.len() < k_need || a.v.len() < v_need {
        return Err(format!(
            "attention: layer {} K/V regions hold {}/{} words, {} rows of {} as {}/{} need {k_need}/{v_need}",
            m.layer,
            a.k.len(),
            a.v.len(),
            m.n_ctx,
            m.nkt(),
            a.types[0],
            a.types[1]
        ));
    }
    if out_len < a.nt * qrow || a.pos.len() < a.nt {
        return Err(format!(
            "attention: output {out_len} values / {} positions for {} tokens of {qrow}",
            a.pos.len(),
            a.nt
        ));
    }
    Ok(())
}

/// Query heads per KV head accepted (validated), so per-head sums live on the stack.
const MAX_GROUP: usize = 64;

/// `s[i] *= scale` and the largest result (eight lanes; the maximum is exact in any
/// order, and NaN scores give NaN outputs either way).
#[inline]
fn scale_max(s: &mut [f32], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        for (x, l) in c.iter_mut().zip(&mut lanes) {
            *x *= scale;
            *l = l.max(*x);
        }
    }
    let mut mx = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for x in chunks.into_remainder() {
        *x *= scale;
        mx = mx.max(*x);
    }
    mx
}

/// Keys per block: one block of K (or V) rows for one KV head stays in L1 while every
/// query head of the group reads it.
const KEY_BLOCK: usize = 64;

/// Decodes keys `j0..j1` of KV head `g` from a packed region into `tile` (`hd` values
/// per key, packed in key order).
#[inline]
fn decode_tile(
    t: KvType,
    region: &[f32],
    m: &AttnMeta,
    g: usize,
    j0: usize,
    j1: usize,
    tile: &mut [f32],
) {
    let hd = m.hd;
    // Validated: rows and heads are whole blocks of `t`.
    let row_words = t.row_words(m.nkt()).unwrap_or(0);
    let (boff, hbytes) = (kv::byte_offset(t, g * hd), kv::byte_offset(t, hd));
    for (j, dst) in (j0..j1).zip(tile.chunks_exact_mut(hd)) {
        let bytes: &[u8] = bytemuck::cast_slice(&region[j * row_words..(j + 1) * row_words]);
        kv::decode_packed(t, &bytes[boff..boff + hbytes], dst);
    }
}

/// One (token, KV head) item: the scores of the group's query heads into `scores`
/// (`group` rows of the key range's length), the results into `out`.
///
/// Each head's arithmetic is that of one head on its own (scores eight keys per
/// reduction from the start of the range, the V sums continued block to block in key
/// order), so grouping the heads and blocking the keys change no bits.
#[allow(clippy::too_many_arguments)]
#[inline]
fn group_item(
    isa: VecIsa,
    a: &AttnArgs,
    t: usize,
    g: usize,
    (lo, hi): (usize, usize),
    scores: &mut [f32],
    tile: &mut [f32],
    out: &SharedMut<f32>,
) {
    let m = a.meta;
    let (hd, nkt, group) = (m.hd, m.nkt(), m.n_head / m.n_head_kv);
    let len = hi - lo;
    let off = g * hd;
    let heads = g * group..(g + 1) * group;
    let q = |h: usize| &a.q[t * a.q_stride + h * hd..][..hd];
    // The range's physical rows in key order: itself, or its (at most two) ring pieces.
    let segments = match m.ring {
        Some(r) => r.segments(lo, hi),
        None => [(lo, hi), (hi, hi)],
    };
    let mut at = 0;
    for (s0, s1) in segments {
        let mut j0 = s0;
        while j0 < s1 {
            let j1 = (j0 + KEY_BLOCK).min(s1);
            let (keys, stride, base) = match a.types[0] {
                KvType::F32 => (a.k, nkt, j0 * nkt + off),
                t => {
                    decode_tile(t, a.k, m, g, j0, j1, tile);
                    (&*tile, hd, 0)
                }
            };
            let (c0, c1) = (at + j0 - s0, at + j1 - s0);
            for (i, h) in heads.clone().enumerate() {
                let row = &mut scores[i * len + c0..i * len + c1];
                isa.dot_rows(q(h), keys, stride, base, row);
            }
            j0 = j1;
        }
        at += s1 - s0;
    }
    for i in 0..group {
        let row = &mut scores[i * len..(i + 1) * len];
        let mut mx = scale_max(row, m.scale);
        if let Some(c) = m.softcap {
            // The cap bends the scaled scores before the softmax (Gemma 2).
            isa.softcap(row, c);
            mx = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        }
        isa.exp_sub(row, mx);
    }
    // Each head's sum in key order (as one head alone sums), the heads interleaved so
    // their addition chains overlap.
    let mut sums = [0.0f32; MAX_GROUP];
    let sums = &mut sums[..group];
    for j in 0..len {
        for (i, s) in sums.iter_mut().enumerate() {
            *s += scores[i * len + j];
        }
    }
    let qrow = m.n_head * hd;
    let ob = t * qrow + heads.start * hd;
    // SAFETY: item (t, g) owns the outputs of its heads, [ob, ob + group * hd); items are
    // claimed once.
    let o = unsafe { out.slice(ob..ob + group * hd) };
    o.fill(0.0);
    let mut at = 0;
    for (s0, s1) in segments {
        let mut j0 = s0;
        while j0 < s1 {
            let j1 = (j0 + KEY_BLOCK).min(s1);
            let (vals, stride, base) = match a.types[1] {
                KvType::F32 => (a.v, nkt, j0 * nkt + off),
                t => {
                    decode_tile(t, a.v, m, g, j0, j1, tile);
                    (&*tile, hd, 0)
                }
            };
            let (c0, c1) = (at + j0 - s0, at + j1 - s0);
            for (i, oh) in o.chunks_exact_mut(hd).enumerate() {
                let p = &scores[i * len + c0..i * len + c1];
                isa.weighted_rows_acc(p, vals, stride, base, oh);
            }
            j0 = j1;
        }
        at += s1 - s0;
    }
    for (oh, &sum) in o.chunks_exact_mut(hd).zip(sums.iter()) {
        isa.scale(oh, 1.0 / sum);
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
    validate(a, out.len())?;
    key_ranges(a, &mut scratch.ranges)?;
    let m = a.meta;
    let (hd, group) = (m.hd, m.n_head / m.n_head_kv);
    let ranges = &scratch.ranges;
    let max_len = ranges.iter().map(|r| r.1 - r.0).max().unwrap_or(0);
    let work: usize = ranges.iter().map(|r| r.1 - r.0).sum::<usize>() * m.n_head * hd;
    let nth = if work < PAR_MIN_FLOPS {
        1
    } else {
        pool.n_threads()
    };
    // One score row per head of a group, per thread.
    let per_thread = group * max_len;
    if scratch.scores.len() < nth * per_thread {
        // Size for the whole region at once: growing with the sequence would reallocate
        // during decode.
        scratch
            .scores
            .resize(nth * group * max_len.max(m.n_ctx), 0.0);
    }
    // One tile of decoded keys per thread, for the packed formats only.
    let per_tile = if a.types == [KvType::F32; 2] {
        0
    } else {
        KEY_BLOCK * hd
    };
    if scratch.tiles.len() < nth * per_tile {
        scratch.tiles.resize(nth * per_tile, 0.0);
    }
    let items = a.nt * m.n_head_kv;
    let run_item = |item: usize, scores: &mut [f32], tile: &mut [f32], out: &SharedMut<f32>| {
        let (t, g) = (item / m.n_head_kv, item % m.n_head_kv);
        group_item(isa, a, t, g, ranges[t], scores, tile, out);
    };
    let shared_out = SharedMut::new(&mut out[..a.nt * m.n_head * hd]);
    if nth == 1 {
        let scores = &mut scratch.scores[..per_thread];
        let tile = &mut scratch.tiles[..per_tile];
        for item in 0..items {
            run_item(item, scores, tile, &shared_out);
        }
        return Ok(());
    }
    let shared_scores = SharedMut::new(&mut scratch.scores[..nth * per_thread]);
    let shared_tiles = SharedMut::new(&mut scratch.tiles[..nth * per_tile]);
    let next = AtomicUsize::new(0);
    pool.run(&|ith, _| {
        // SAFETY: thread `ith` alone uses score block `ith`.
        let scores = unsafe { shared_scores.slice(ith * per_thread..(ith + 1) * per_thread) };
        // SAFETY: thread `ith` alone uses tile `ith`.
        let tile = unsafe { shared_tiles.slice(ith * per_tile..(ith + 1) * per_tile) };
        loop {
            let item = next.fetch_add(1, Relaxed);
            if item >= items {
                break;
            }
            run_item(item, scores, tile, &shared_out);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    fn meta() -> AttnMeta {
        AttnMeta {
            layer: 3,
            n_head: 4,
            n_head_kv: 2,
            hd: 16,
            scale: 0.25,
            n_ctx: 40,
            window: None,
            softcap: None,
            ring: None,
        }
    }

    /// f64 reference straight from the definition.
    fn reference(a: &AttnArgs) -> Vec<f64> {
        let m = a.meta;
        let (hd, nkt, group) = (m.hd, m.nkt(), m.n_head / m.n_head_kv);
        let mut out = vec![0.0; a.nt * m.n_head * hd];
        for t in 0..a.nt {
            let hi = as_i32(a.pos[t]) as usize + 1;
            for h in 0..m.n_head {
                let q = &a.q[t * a.q_stride + h * hd..][..hd];
                let off = (h / group) * hd;
                let s: Vec<f64> = (0..hi)
                    .map(|j| {
                        let k = &a.k[j * nkt + off..][..hd];
                        q.iter()
                            .zip(k)
                            .map(|(x, y)| *x as f64 * *y as f64)
                            .sum::<f64>()
                            * m.scale as f64
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, p) in e.iter().enumerate() {
                    for d in 0..hd {
                        out[t * m.n_head * hd + h * hd + d] +=
                            p / sum * a.v[j * nkt + off + d] as f64;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_reference_for_every_isa_and_thread_count() {
        let m = meta();
        let mut r = Rng::new(5);
        let nt = 6;
        let q_stride = m.n_head * m.hd + 32; // a wider fused q|k|v row
        let q = r.vec(nt * q_stride, 1.0);
        let k = r.vec(m.nkt() * m.n_ctx, 1.0);
        let v = r.vec(m.nkt() * m.n_ctx, 1.0);
        let positions = [0, 1, 2, 17, 30, 39];
        let pos: Vec<f32> = positions
            .iter()
            .map(|&p: &i32| f32::from_bits(p as u32))
            .collect();
        let a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride,
            nt,
            pos: &pos,
            span: None,
            k: &k,
            v: &v,
            types: [KvType::F32; 2],
        };
        let want = reference(&a);
        let mut results = Vec::new();
        for isa in [VecIsa::Scalar, VecIsa::detect()] {
            for nth in [1, 2, 3] {
                let pool = ThreadPool::new(nth);
                let mut out = vec![f32::NAN; nt * m.n_head * m.hd];
                let mut s = AttnScratch::default();
                attention(&pool, isa, &a, &mut out, &mut s).unwrap();
                for (x, y) in out.iter().zip(&want) {
                    assert!((*x as f64 - y).abs() < 1e-5, "{isa:?} t{nth}: {x} vs {y}");
                }
                results.push((isa, out));
            }
        }
        for w in results.windows(2) {
            if w[0].0 == w[1].0 {
                assert_eq!(w[0].1, w[1].1, "thread count changed the result");
            }
        }
    }

    /// Grouping heads and blocking keys give the bits of one head at a time over the
    /// whole key range (ranges longer than a block and not a multiple of eight).
    #[test]
    fn grouped_blocks_equal_one_head_at_a_time() {
        let m = AttnMeta {
            layer: 0,
            n_head: 6,
            n_head_kv: 2,
            hd: 32,
            scale: 0.18,
            n_ctx: 300,
            window: None,
            softcap: None,
            ring: None,
        };
        let mut r = Rng::new(9);
        let positions = [0i32, 7, 64, 130, 299];
        let nt = positions.len();
        let q = r.vec(nt * m.n_head * m.hd, 1.0);
        let k = r.vec(m.nkt() * m.n_ctx, 1.0);
        let v = r.vec(m.nkt() * m.n_ctx, 1.0);
        let pos: Vec<f32> = positions
            .iter()
            .map(|&p| f32::from_bits(p as u32))
            .collect();
        let a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride: m.n_head * m.hd,
            nt,
            pos: &pos,
            span: None,
            k: &k,
            v: &v,
            types: [KvType::F32; 2],
        };
        for isa in [VecIsa::Scalar, VecIsa::detect()] {
            let mut out = vec![f32::NAN; nt * m.n_head * m.hd];
            attention(
                &ThreadPool::new(2),
                isa,
                &a,
                &mut out,
                &mut AttnScratch::default(),
            )
            .unwrap();
            for (t, &p) in positions.iter().enumerate() {
                let len = p as usize + 1;
                for h in 0..m.n_head {
                    let qh = &q[(t * m.n_head + h) * m.hd..][..m.hd];
                    let off = (h / 3) * m.hd;
                    let mut s = vec![0.0; len];
                    isa.dot_rows(qh, &k, m.nkt(), off, &mut s);
                    let mut mx = f32::NEG_INFINITY;
                    for x in s.iter_mut() {
                        *x *= m.scale;
                        mx = mx.max(*x);
                    }
                    isa.exp_sub(&mut s, mx);
                    let sum = s.iter().fold(0.0f32, |a, &b| a + b);
                    let mut o = vec![0.0; m.hd];
                    isa.weighted_rows(&s, &v, m.nkt(), off, &mut o);
                    isa.scale(&mut o, 1.0 / sum);
                    let got = &out[(t * m.n_head + h) * m.hd..][..m.hd];
                    assert_eq!(
                        got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "{isa:?} token {t} head {h}"
                    );
                }
            }
        }
    }

    /// Attention over packed K/V is, bit for bit, attention over the f32 values they
    /// decode to: the tiles change where keys are read from, never the arithmetic.
    #[test]
    fn packed_regions_equal_f32_regions_of_their_decoded_values() {
        let m = AttnMeta {
            layer: 1,
            n_head: 4,
            n_head_kv: 2,
            hd: 64,
            scale: 0.125,
            n_ctx: 150,
            window: None,
            softcap: None,
            ring: None,
        };
        let mut r = Rng::new(11);
        let positions = [0i32, 5, 63, 64, 149];
        let nt = positions.len();
        let q = r.vec(nt * m.n_head * m.hd, 1.0);
        let k = r.vec(m.nkt() * m.n_ctx, 1.0);
        let v = r.vec(m.nkt() * m.n_ctx, 1.0);
        let pos: Vec<f32> = positions
            .iter()
            .map(|&p| f32::from_bits(p as u32))
            .collect();
        let cells: Vec<f32> = (0..m.n_ctx as u32).map(f32::from_bits).collect();
        let pool = ThreadPool::new(2);
        for types in [
            [KvType::F16, KvType::F16],
            [KvType::Q8_0, KvType::Q8_0],
            [KvType::Q8_0, KvType::F16],
            [KvType::F32, KvType::Q8_0],
        ] {
            let words = |t: KvType| kv::region_words(t, m.nkt(), m.n_ctx).unwrap().1;
            let (mut kp, mut vp) = (vec![0.0; words(types[0])], vec![0.0; words(types[1])]);
            kv::store(
                m.layer,
                m.nkt(),
                m.n_ctx,
                None,
                types,
                &k,
                &v,
                &cells,
                &mut kp,
                &mut vp,
            )
            .unwrap();
            // The f32 regions of the decoded rows.
            let unpack = |t: KvType, region: &[f32]| -> Vec<f32> {
                let rw = t.row_words(m.nkt()).unwrap();
                let mut out = vec![0.0; m.nkt() * m.n_ctx];
                for (j, o) in out.chunks_exact_mut(m.nkt()).enumerate() {
                    let bytes: &[u8] = bytemuck::cast_slice(&region[j * rw..(j + 1) * rw]);
                    kv::decode(t, &bytes[..t.bytes_for(m.nkt()).unwrap()], o).unwrap();
                }
                out
            };
            let (kd, vd) = (unpack(types[0], &kp), unpack(types[1], &vp));
            for isa in [VecIsa::Scalar, VecIsa::detect()] {
                let run = |k: &[f32], v: &[f32], types| {
                    let a = AttnArgs {
                        meta: &m,
                        q: &q,
                        q_stride: m.n_head * m.hd,
                        nt,
                        pos: &pos,
                        span: None,
                        k,
                        v,
                        types,
                    };
                    let mut out = vec![f32::NAN; nt * m.n_head * m.hd];
                    attention(&pool, isa, &a, &mut out, &mut AttnScratch::default()).unwrap();
                    out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                let packed = run(&kp, &vp, types);
                let plain = run(&kd, &vd, [KvType::F32; 2]);
                assert_eq!(packed, plain, "{types:?} {isa:?}");
            }
        }
        // A head that is not whole Q8_0 blocks is refused, naming the format.
        let bad = AttnMeta {
            hd: 16,
            ..m.clone()
        };
        let a = AttnArgs {
            meta: &bad,
            q: &q,
            q_stride: bad.n_head * bad.hd,
            nt: 1,
            pos: &pos,
            span: None,
            k: &k,
            v: &v,
            types: [KvType::Q8_0, KvType::F32],
        };
        let mut out = vec![0.0; bad.n_head * bad.hd];
        let e = attention(
            &pool,
            VecIsa::Scalar,
            &a,
            &mut out,
            &mut AttnScratch::default(),
        )
        .unwrap_err();
        assert!(e.contains("q8_0") && e.contains("16"), "{e}");
    }

    #[test]
    fn explicit_span_limits_the_keys() {
        let m = meta();
        let mut r = Rng::new(6);
        let q = r.vec(m.n_head * m.hd, 1.0);
        let k = r.vec(m.nkt() * m.n_ctx, 1.0);
        let v = r.vec(m.nkt() * m.n_ctx, 1.0);
        let pos = [f32::from_bits(9)];
        let span = [f32::from_bits(0), f32::from_bits(10)];
        let pool = ThreadPool::new(1);
        let mut a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride: m.n_head * m.hd,
            nt: 1,
            pos: &pos,
            span: None,
            k: &k,
            v: &v,
            types: [KvType::F32; 2],
        };
        let mut causal = vec![0.0; m.n_head * m.hd];
        let mut s = AttnScratch::default();
        attention(&pool, VecIsa::Scalar, &a, &mut causal, &mut s).unwrap();
        a.span = Some(&span);
        let mut spanned = vec![0.0; m.n_head * m.hd];
        attention(&pool, VecIsa::Scalar, &a, &mut spanned, &mut s).unwrap();
        assert_eq!(causal, spanned, "[0, pos+1) is the causal range");
        let narrow = [f32::from_bits(5), f32::from_bits(6)];
        a.span = Some(&narrow);
        attention(&pool, VecIsa::Scalar, &a, &mut spanned, &mut s).unwrap();
        // A single key: the output is that key's V row.
        assert_eq!(&spanned[..m.hd], &v[5 * m.nkt()..5 * m.nkt() + m.hd]);
    }

    #[test]
    fn out_of_range_positions_and_bad_geometry_are_errors() {
        let m = meta();
        let q = vec![0.0; m.n_head * m.hd];
        let kv = vec![0.0; m.nkt() * m.n_ctx];
        let pool = ThreadPool::new(1);
        let mut out = vec![0.0; m.n_head * m.hd];
        let mut s = AttnScratch::default();
        let beyond = [f32::from_bits(40)];
        let a = AttnArgs {
            meta: &m,
            q: &q,
            q_stride: m.n_head * m.hd,
            nt: 1,
            pos: &beyond,
            span: None,
            k: &kv,
            v: &kv,
            types: [KvType::F32; 2],
        };
        let e = attention(&pool, VecIsa::Scalar, &a, &mut out, &mut s).unwrap_err();
        assert!(e.contains("position 40") && e.contains("layer 3"), "{e}");
        let short = &kv[..10];
        let pos0 = [0.0];
        let b = AttnArgs {
            k: short,
            pos: &pos0,
            ..a
        };
        assert!(attention(&pool, VecIsa::Scalar, &b, &mut out, &mut s).is_err());
        let bad = AttnMeta {
            n_head_kv: 3,
            ..m.clone()
        };
        let c = AttnArgs {
            meta: &bad,
            pos: &pos0,
            ..a
        };
        assert!(attention(&pool, VecIsa::Scalar, &c, &mut out, &mut s).is_err());
    }
}
