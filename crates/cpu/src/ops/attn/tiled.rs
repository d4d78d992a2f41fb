//! One work item of the tiled attention: a block of query tokens against one KV head,
//! key tile by key tile, with an online softmax.
//!
//! Key tiles sit at fixed absolute (virtual) positions, `[i * KEY_TILE, (i + 1) * KEY_TILE)`.
//! A query row (one token, one query head) meets the tiles of its key range in ascending
//! order and, inside each, the keys of its range in key order. Per tile it computes the
//! row's scores, folds them into its running maximum `m`, sum `l` and output `o`
//! (`o`, `l` rescaled by `exp(m_old - m_new)` when the maximum grows), and at the end
//! divides `o` by `l`. Every call a row makes — which keys, split where — is a function of
//! that row's key range alone (the tile grid and, for a ring, its wrap point), never of the
//! other rows in the block, so a row's bits do not depend on the block it shares, the
//! batch around it, or the thread count; a single decode token takes the same path.
//!
//! Packed K/V formats are decoded one tile of keys at a time, once per block, into
//! per-thread f32 tiles; the calls a row makes are the same as over an f32 region, so
//! packed attention equals f32 attention over the decoded values bit for bit.

use minfer_graph::{AttnMeta, KvType};

use super::super::kv;
use super::super::vec::VecIsa;
use super::super::SharedMut;
use super::AttnArgs;

/// Keys per tile: one tile of K and one of V rows for one KV head (64 × 64 f32 for a
/// 64-dim head: 16 KB each) stay in L1 while every query row of the block reads them.
pub(super) const KEY_TILE: usize = 64;

/// Query rows per block (tokens × the group's query heads), at least one token.
pub(super) const BLOCK_ROWS: usize = 32;

/// Tokens per query block for a group of `group` query heads per KV head.
#[inline]
pub(super) fn block_tokens(group: usize) -> usize {
    (BLOCK_ROWS / group).max(1)
}

/// One thread's buffers for one item.
pub(super) struct ItemScratch<'a> {
    /// `KEY_TILE` scores per query row of the block.
    pub scores: &'a mut [f32],
    /// The running maximum of each query row.
    pub m: &'a mut [f32],
    /// The running sum of each query row.
    pub l: &'a mut [f32],
    /// Decoded keys of the current tile (packed K only).
    pub ktile: &'a mut [f32],
    /// Decoded values of the current tile (packed V only).
    pub vtile: &'a mut [f32],
}

/// The physical pieces of a run of virtual keys: at most two (a ring wraps once inside a
/// range no longer than itself), each `(virtual start, virtual end, physical start)`.
type Pieces = [(usize, usize, usize); 2];

fn pieces(m: &AttnMeta, v0: usize, v1: usize) -> Pieces {
    match m.ring {
        Some(r) => {
            let [(a0, a1), (b0, _)] = r.segments(v0, v1);
            let mid = v0 + (a1 - a0);
            [(v0, mid, a0), (mid, v1, b0)]
        }
        None => [(v0, v1, v0), (v1, v1, v1)],
    }
}

/// Where the rows of a tile's keys (or values) are read from: the region itself (f32)
/// or a tile decoded from it, with the element offset of virtual key `v`.
struct Source<'a> {
    data: &'a [f32],
    stride: usize,
    decoded: bool,
    /// The first virtual key of the decoded tile.
    v0: usize,
    /// Offset of the KV head inside a region row (f32 region only).
    off: usize,
}

impl Source<'_> {
    /// The offset of virtual key `v` lying in piece `p`.
    #[inline]
    fn base(&self, p: (usize, usize, usize), v: usize) -> usize {
        if self.decoded {
            (v - self.v0) * self.stride
        } else {
            (p.2 + v - p.0) * self.stride + self.off
        }
    }
}

/// Prepares the rows of virtual keys `[v0, v1)` of KV head `g` for reading: the region
/// as it is for F32, else decoded into `tile` in virtual key order.
#[allow(clippy::too_many_arguments)]
fn source<'a>(
    t: KvType,
    region: &'a [f32],
    m: &AttnMeta,
    g: usize,
    v0: usize,
    ps: &Pieces,
    tile: &'a mut [f32],
) -> Source<'a> {
    let hd = m.hd;
    if t == KvType::F32 {
        return Source {
            data: region,
            stride: m.nkt(),
            decoded: false,
            v0,
            off: g * hd,
        };
    }
    // Validated: rows and heads are whole blocks of `t`.
    let row_words = t.row_words(m.nkt()).unwrap_or(0);
    let (boff, hbytes) = (kv::byte_offset(t, g * hd), kv::byte_offset(t, hd));
    for &(s, e, phys) in ps {
        for v in s..e {
            let j = phys + v - s;
            let bytes: &[u8] = bytemuck::cast_slice(&region[j * row_words..(j + 1) * row_words]);
            let dst = &mut tile[(v - v0) * hd..(v - v0 + 1) * hd];
            kv::decode_packed(t, &bytes[boff..boff + hbytes], dst);
        }
    }
    Source {
        data: tile,
        stride: hd,
        decoded: true,
        v0,
        off: 0,
    }
}

/// The denominators of rows `r0..r0 + l.len()` grow by their first `n` weights, each
/// row's sum taken in key order (the bits of one running sum per row). Up to eight rows
/// run side by side in registers: independent chains instead of one sum waiting on the
/// last.
#[inline]
fn add_weights(l: &mut [f32], scores: &[f32], r0: usize, n: usize) {
    let mut r = 0;
    while r < l.len() {
        let k = (l.len() - r).min(8);
        let (l, first) = (&mut l[r..r + k], r0 + r);
        match k {
            8 => add_weights_n::<8>(l, scores, first, n),
            7 => add_weights_n::<7>(l, scores, first, n),
            6 => add_weights_n::<6>(l, scores, first, n),
            5 => add_weights_n::<5>(l, scores, first, n),
            4 => add_weights_n::<4>(l, scores, first, n),
            3 => add_weights_n::<3>(l, scores, first, n),
            2 => add_weights_n::<2>(l, scores, first, n),
            _ => add_weights_n::<1>(l, scores, first, n),
        }
        r += k;
    }
}

/// [`add_weights`] for exactly `N` rows starting at score row `first`.
#[inline(always)]
fn add_weights_n<const N: usize>(l: &mut [f32], scores: &[f32], first: usize, n: usize) {
    let mut acc: [f32; N] = std::array::from_fn(|i| l[i]);
    let rows: [&[f32]; N] = std::array::from_fn(|i| &scores[(first + i) * KEY_TILE..][..n]);
    for j in 0..n {
        for (a, row) in acc.iter_mut().zip(&rows) {
            *a += row[j];
        }
    }
    l[..N].copy_from_slice(&acc);
}

/// Runs the item (tokens `toks`, KV head `g`): the outputs of the group's query heads
/// for those tokens into `out`. `ranges[t]` is token `t`'s virtual key range; a ringed
/// layer's block holds one sequence's tokens whose ranges together fit the ring.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_item(
    isa: VecIsa,
    a: &AttnArgs,
    toks: (usize, usize),
    g: usize,
    ranges: &[(usize, usize)],
    st: ItemScratch,
    out: &SharedMut<f32>,
) {
    let m = a.meta;
    let (hd, group) = (m.hd, m.n_head / m.n_head_kv);
    let qrow = m.n_head * hd;
    let (t0, t1) = toks;
    let rows = (t1 - t0) * group;
    let ItemScratch {
        scores,
        m: mx,
        l,
        ktile,
        vtile,
    } = st;
    mx[..rows].fill(f32::NEG_INFINITY);
    l[..rows].fill(0.0);
    // The item's outputs: per token, the group's heads side by side.
    let o_at = |t: usize| t * qrow + g * group * hd;
    for t in t0..t1 {
        // SAFETY: item (block, g) owns the outputs of the group's heads for its tokens;
        // items are claimed once.
        unsafe { out.slice(o_at(t)..o_at(t) + group * hd) }.fill(0.0);
    }
    let q = |t: usize, i: usize| &a.q[t * a.q_stride + (g * group + i) * hd..][..hd];
    let block = &ranges[t0..t1];
    let lo = block.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = block.iter().map(|r| r.1).max().unwrap_or(0);
    let mut tile = lo / KEY_TILE;
    while tile * KEY_TILE < hi {
        let (k0, k1) = (tile * KEY_TILE, (tile + 1) * KEY_TILE);
        tile += 1;
        // The keys of this tile that some token of the block reads.
        let (mut v0, mut v1) = (usize::MAX, 0);
        for &(rl, rh) in block {
            let (s, e) = (rl.max(k0), rh.min(k1));
            if s < e {
                v0 = v0.min(s);
                v1 = v1.max(e);
            }
        }
        if v0 >= v1 {
            continue;
        }
        let ps = pieces(m, v0, v1);
        let ks = source(a.types[0], a.k, m, g, v0, &ps, &mut *ktile);
        let vs = source(a.types[1], a.v, m, g, v0, &ps, &mut *vtile);
        for (bt, &(rl, rh)) in block.iter().enumerate() {
            let (s, e) = (rl.max(k0), rh.min(k1));
            if s >= e {
                continue;
            }
            let t = t0 + bt;
            // The scores of the token's query heads, two heads per call (they share the
            // key range, and each row's bits are those of a call of its own).
            let r0 = bt * group;
            for p in ps {
                let (ps0, ps1) = (p.0.max(s), p.1.min(e));
                if ps0 >= ps1 {
                    continue;
                }
                let (base, len) = (ks.base(p, ps0), ps1 - ps0);
                let at = |r: usize| r * KEY_TILE + ps0 - s;
                let mut i = 0;
                while i + 1 < group {
                    let (lo, hi) = scores.split_at_mut(at(r0 + i + 1));
                    let (da, db) = (&mut lo[at(r0 + i)..][..len], &mut hi[..len]);
                    isa.dot_rows2(q(t, i), q(t, i + 1), ks.data, ks.stride, base, da, db);
                    i += 2;
                }
                if i < group {
                    let dst = &mut scores[at(r0 + i)..][..len];
                    isa.dot_rows(q(t, i), ks.data, ks.stride, base, dst);
                }
            }
            // SAFETY: as above; this token's outputs belong to this item.
            let o = unsafe { out.slice(o_at(t)..o_at(t) + group * hd) };
            // Each head's online-softmax step (its output rescaled if its maximum grew)...
            for (i, oh) in o.chunks_exact_mut(hd).enumerate() {
                let r = r0 + i;
                let row = &mut scores[r * KEY_TILE..][..e - s];
                let mut tmax = isa.scale_max(row, m.scale);
                if let Some(c) = m.softcap {
                    // The cap bends the scaled scores before the softmax (Gemma 2).
                    isa.softcap(row, c);
                    tmax = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                }
                if tmax > mx[r] {
                    // Earlier tiles' weights were taken against a smaller maximum.
                    let c = (mx[r] - tmax).exp();
                    l[r] *= c;
                    isa.scale(oh, c);
                    mx[r] = tmax;
                }
                isa.exp_sub(row, mx[r]);
            }
            // Each head's denominator grows by its row's weights, summed in key order; the
            // heads' sums run side by side, independent chains instead of one at a time.
            add_weights(&mut l[r0..r0 + group], scores, r0, e - s);
            // ...then the weighted values, four heads per call, then two, then one (each
            // head's bits those of a call of its own).
            let w =
                |r: usize, ps0: usize, ps1: usize| &scores[r * KEY_TILE + ps0 - s..][..ps1 - ps0];
            for p in ps {
                let (ps0, ps1) = (p.0.max(s), p.1.min(e));
                if ps0 >= ps1 {
                    continue;
                }
                let base = vs.base(p, ps0);
                let (mut rest, mut i) = (&mut *o, 0);
                while rest.len() >= 4 * hd {
                    let (four, tail) = std::mem::take(&mut rest).split_at_mut(4 * hd);
                    let (o0, four) = four.split_at_mut(hd);
                    let (o1, four) = four.split_at_mut(hd);
                    let (o2, o3) = four.split_at_mut(hd);
                    let ws = std::array::from_fn(|j| w(r0 + i + j, ps0, ps1));
                    isa.weighted_rows_acc4(ws, vs.data, vs.stride, base, [o0, o1, o2, o3]);
                    (rest, i) = (tail, i + 4);
                }
                if rest.len() >= 2 * hd {
                    let (oa, ob) = rest.split_at_mut(hd);
                    let (wa, wb) = (w(r0 + i, ps0, ps1), w(r0 + i + 1, ps0, ps1));
                    isa.weighted_rows_acc2(wa, wb, vs.data, vs.stride, base, oa, &mut ob[..hd]);
                    (rest, i) = (&mut ob[hd..], i + 2);
                }
                if rest.len() >= hd {
                    let wa = w(r0 + i, ps0, ps1);
                    isa.weighted_rows_acc(wa, vs.data, vs.stride, base, &mut rest[..hd]);
                }
            }
        }
    }
    for t in t0..t1 {
        // SAFETY: as above.
        let o = unsafe { out.slice(o_at(t)..o_at(t) + group * hd) };
        for (i, oh) in o.chunks_exact_mut(hd).enumerate() {
            let r = (t - t0) * group + i;
            if let Some(s) = a.sinks.map(|s| s[g * group + i]) {
                // The sink's logit joins the normaliser with no value row (ggml's fold).
                if s > mx[r] {
                    let c = (mx[r] - s).exp();
                    l[r] = l[r] * c + 1.0;
                    isa.scale(oh, c);
                    mx[r] = s;
                } else {
                    l[r] += (s - mx[r]).exp();
                }
            }
            isa.scale(oh, 1.0 / l[r]);
        }
    }
}
