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
//! Rows that read the same keys of a tile make the same calls, so they run together: the
//! tokens that read the whole tile (all but the causal diagonal's) pool their query rows,
//! four per score and weighted-sum call across tokens, which loads each key and value
//! once for four rows and leaves no odd head of a 7-head group to a one-row call.
//!
//! Packed K/V formats are decoded one tile of keys at a time, once per block, into
//! per-thread f32 tiles; the calls a row makes are the same as over an f32 region, so
//! packed attention equals f32 attention over the decoded values bit for bit.

use minfer_graph::{AttnMeta, KvType};

use super::super::kv;
#[cfg(target_arch = "x86_64")]
#[cfg(target_arch = "x86_64")]
use super::super::row_isa::RowIsa;
#[cfg(target_arch = "x86_64")]
use super::super::rows::{F16Rows, Q8Rows, Rows};
use super::super::vec::VecIsa;
use super::super::SharedMut;
use super::AttnArgs;

/// Keys per tile: one tile of K and one of V rows for one KV head (64 × 64 f32 for a
/// 64-dim head: 16 KB each) stay in L1 while every query row of the block reads them.
pub(super) const KEY_TILE: usize = 64;

/// Query rows per block (tokens × the group's query heads), at least one token. Each
/// tile of K and V comes from memory once per block, so larger blocks read less; at 128
/// rows (18 tokens of a 7-head group) a thread's scores are 32 KB, and a 4096-token
/// prefill's attention took about 6% less time than at 32 rows.
pub(super) const BLOCK_ROWS: usize = 128;

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
type Pieces = [Piece; 2];

/// One piece: `(virtual start, virtual end, physical start)`.
type Piece = (usize, usize, usize);

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

/// Where the rows of a tile's keys (or values) are read from: the region itself (f32),
/// a tile decoded from it, or (F16, Q8_0) the packed region itself, widened in registers
/// by the kernels as they load it.
struct Source<'a> {
    data: &'a [f32],
    stride: usize,
    decoded: bool,
    /// The first virtual key of the decoded tile.
    v0: usize,
    /// Offset of the KV head inside a region row (f32 region only).
    off: usize,
    /// The whole region's rows of this KV head, when read in place.
    packed: Option<Packed>,
}

/// The rows of one KV head of a packed region, read in place.
#[derive(Clone, Copy)]
enum Packed {
    #[cfg(target_arch = "x86_64")]
    F16(RowIsa, F16Rows),
    #[cfg(target_arch = "x86_64")]
    Q8(RowIsa, Q8Rows),
}

impl Source<'_> {
    /// The offset of virtual key `v` lying in piece `p` (f32 data and decoded tiles).
    #[inline]
    fn base(&self, p: (usize, usize, usize), v: usize) -> usize {
        if self.decoded {
            (v - self.v0) * self.stride
        } else {
            (p.2 + v - p.0) * self.stride + self.off
        }
    }

    /// Scores of four query rows against keys `[v, v + n)` of piece `p`.
    fn dot4(&self, isa: VecIsa, p: Piece, v: usize, q: [&[f32]; 4], out: [&mut [f32]; 4]) {
        let n = out[0].len();
        match self.packed {
            None => isa.dot_rows4(q, self.data, self.stride, self.base(p, v), out),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::F16(x, r)) => x.dot_rows4(q, r.sub(p.2 + v - p.0, n), out),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::Q8(x, r)) => x.dot_rows4(q, r.sub(p.2 + v - p.0, n), out),
        }
    }

    /// Scores of two query rows against keys `[v, v + n)` of piece `p`.
    #[allow(clippy::too_many_arguments)]
    fn dot2(
        &self,
        isa: VecIsa,
        p: Piece,
        v: usize,
        qa: &[f32],
        qb: &[f32],
        oa: &mut [f32],
        ob: &mut [f32],
    ) {
        let n = oa.len();
        match self.packed {
            None => isa.dot_rows2(qa, qb, self.data, self.stride, self.base(p, v), oa, ob),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::F16(x, r)) => x.dot_rows2(qa, qb, r.sub(p.2 + v - p.0, n), oa, ob),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::Q8(x, r)) => x.dot_rows2(qa, qb, r.sub(p.2 + v - p.0, n), oa, ob),
        }
    }

    /// Scores of one query row against keys `[v, v + n)` of piece `p`.
    fn dot1(&self, isa: VecIsa, p: Piece, v: usize, q: &[f32], out: &mut [f32]) {
        let n = out.len();
        match self.packed {
            None => isa.dot_rows(q, self.data, self.stride, self.base(p, v), out),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::F16(x, r)) => x.dot_rows(q, r.sub(p.2 + v - p.0, n), out),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::Q8(x, r)) => x.dot_rows(q, r.sub(p.2 + v - p.0, n), out),
        }
    }

    /// Four rows' weighted sums over values `[v, v + n)` of piece `p` (`n` weights each).
    fn wsum4(&self, isa: VecIsa, p: Piece, v: usize, w: [&[f32]; 4], o: [&mut [f32]; 4]) {
        let n = w[0].len();
        match self.packed {
            None => isa.weighted_rows_acc4(w, self.data, self.stride, self.base(p, v), o),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::F16(x, r)) => x.weighted_rows_acc4(w, r.sub(p.2 + v - p.0, n), o),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::Q8(x, r)) => x.weighted_rows_acc4(w, r.sub(p.2 + v - p.0, n), o),
        }
    }

    /// Two rows' weighted sums over values `[v, v + n)` of piece `p`.
    #[allow(clippy::too_many_arguments)]
    fn wsum2(
        &self,
        isa: VecIsa,
        p: Piece,
        v: usize,
        wa: &[f32],
        wb: &[f32],
        oa: &mut [f32],
        ob: &mut [f32],
    ) {
        let n = wa.len();
        match self.packed {
            None => isa.weighted_rows_acc2(wa, wb, self.data, self.stride, self.base(p, v), oa, ob),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::F16(x, r)) => {
                x.weighted_rows_acc2(wa, wb, r.sub(p.2 + v - p.0, n), oa, ob)
            }
            #[cfg(target_arch = "x86_64")]
            Some(Packed::Q8(x, r)) => x.weighted_rows_acc2(wa, wb, r.sub(p.2 + v - p.0, n), oa, ob),
        }
    }

    /// One row's weighted sum over values `[v, v + n)` of piece `p`.
    fn wsum1(&self, isa: VecIsa, p: Piece, v: usize, w: &[f32], o: &mut [f32]) {
        let n = w.len();
        match self.packed {
            None => isa.weighted_rows_acc(w, self.data, self.stride, self.base(p, v), o),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::F16(x, r)) => x.weighted_rows_acc(w, r.sub(p.2 + v - p.0, n), o),
            #[cfg(target_arch = "x86_64")]
            Some(Packed::Q8(x, r)) => x.weighted_rows_acc(w, r.sub(p.2 + v - p.0, n), o),
        }
    }
}

/// The most query rows an item may have for its packed K/V to be read in place rather
/// than decoded into a tile: a decode token's group. Larger blocks (prefill) read each
/// tile with many rows, where widening it once into the tile costs less than widening
/// it in every call.
const IN_PLACE_ROWS: usize = 8;

/// The rows of KV head `g` of a packed region, to read in place: `None` for F32, where
/// the kernels cannot widen packed rows (no AVX2, a head that is not whole registers),
/// or where the region's geometry does not hold (validated before, so never).
fn in_place(isa: VecIsa, t: KvType, region: &[f32], m: &AttnMeta, g: usize) -> Option<Packed> {
    #[cfg(target_arch = "x86_64")]
    {
        let x = RowIsa::new(isa == VecIsa::Avx2, m.hd)?;
        let row_bytes = 4 * t.row_words(m.nkt())?;
        let bytes: &[u8] = bytemuck::cast_slice(region);
        let rows = bytes.len().checked_div(row_bytes)?;
        let off = kv::byte_offset(t, g * m.hd);
        match t {
            KvType::F16 if row_bytes.is_multiple_of(2) => {
                let r = F16Rows::new(bytes, row_bytes / 2, off / 2, rows, m.hd)?;
                Some(Packed::F16(x, r))
            }
            KvType::Q8_0 => Some(Packed::Q8(
                x,
                Q8Rows::new(bytes, row_bytes, off, rows, m.hd)?,
            )),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, t, region, m, g);
        None
    }
}

/// Prepares the rows of virtual keys `[v0, v1)` of KV head `g` for reading: the region
/// as it is for F32 or a packed region read in place (`packed`), else decoded into
/// `tile` in virtual key order.
#[allow(clippy::too_many_arguments)]
fn source<'a>(
    t: KvType,
    region: &'a [f32],
    m: &AttnMeta,
    g: usize,
    v0: usize,
    ps: &Pieces,
    packed: Option<Packed>,
    tile: &'a mut [f32],
) -> Source<'a> {
    let hd = m.hd;
    if t == KvType::F32 || packed.is_some() {
        return Source {
            data: region,
            stride: m.nkt(),
            decoded: false,
            v0,
            off: g * hd,
            packed,
        };
    }
    // Validated: rows and heads are whole blocks of `t`.
    let h = kv::HeadBytes {
        row_bytes: 4 * t.row_words(m.nkt()).unwrap_or(0),
        off: kv::byte_offset(t, g * hd),
        len: kv::byte_offset(t, hd),
    };
    let bytes: &[u8] = bytemuck::cast_slice(region);
    for &(s, e, phys) in ps {
        let dst = &mut tile[(s - v0) * hd..(e - v0) * hd];
        kv::decode_rows(t, bytes, h, phys, e - s, dst);
    }
    Source {
        data: tile,
        stride: hd,
        decoded: true,
        v0,
        off: 0,
        packed: None,
    }
}

/// The denominators of `rows` grow by their first `n` weights, each row's sum taken in
/// key order (the bits of one running sum per row). Up to eight rows run side by side in
/// registers: independent chains instead of one sum waiting on the last.
#[inline]
fn add_weights(l: &mut [f32], scores: &[f32], rows: &[usize], n: usize) {
    for chunk in rows.chunks(8) {
        match chunk.len() {
            8 => add_weights_n::<8>(l, scores, chunk, n),
            7 => add_weights_n::<7>(l, scores, chunk, n),
            6 => add_weights_n::<6>(l, scores, chunk, n),
            5 => add_weights_n::<5>(l, scores, chunk, n),
            4 => add_weights_n::<4>(l, scores, chunk, n),
            3 => add_weights_n::<3>(l, scores, chunk, n),
            2 => add_weights_n::<2>(l, scores, chunk, n),
            _ => add_weights_n::<1>(l, scores, chunk, n),
        }
    }
}

/// [`add_weights`] for exactly `N` rows.
#[inline(always)]
fn add_weights_n<const N: usize>(l: &mut [f32], scores: &[f32], rows: &[usize], n: usize) {
    let mut acc: [f32; N] = std::array::from_fn(|i| l[rows[i]]);
    let w: [&[f32]; N] = std::array::from_fn(|i| &scores[rows[i] * KEY_TILE..][..n]);
    for j in 0..n {
        for (a, row) in acc.iter_mut().zip(&w) {
            *a += row[j];
        }
    }
    for (&r, a) in rows.iter().zip(acc) {
        l[r] = a;
    }
}

/// `N` disjoint pieces `[r * width + off, .. + len)` of `buf`, one per row of `rows`
/// (strictly increasing, `off + len <= width`).
fn rows_mut<'b, const N: usize>(
    buf: &'b mut [f32],
    rows: &[usize],
    width: usize,
    off: usize,
    len: usize,
) -> [&'b mut [f32]; N] {
    let (mut rest, mut at) = (buf, 0);
    std::array::from_fn(|j| {
        let start = rows[j] * width + off;
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
        let (mine, tail) = tail.split_at_mut(len);
        (rest, at) = (tail, start + len);
        mine
    })
}

/// The most query rows an item has: a block's, or one token's group.
const MAX_ROWS: usize = if BLOCK_ROWS > super::MAX_GROUP {
    BLOCK_ROWS
} else {
    super::MAX_GROUP
};

/// What every row set of one tile of one item reads: the query rows, the tile's keys
/// and values, and where the outputs go.
struct Tile<'t> {
    isa: VecIsa,
    a: &'t AttnArgs<'t>,
    /// The item's KV head and first token.
    g: usize,
    t0: usize,
    ps: Pieces,
    ks: Source<'t>,
    vs: Source<'t>,
    out: &'t SharedMut<'t, f32>,
}

impl Tile<'_> {
    /// Query row `r` of the item (token `t0 + r / group`, the group's head `r % group`).
    fn q(&self, r: usize) -> &[f32] {
        let m = self.a.meta;
        let group = m.n_head / m.n_head_kv;
        let (t, i) = (self.t0 + r / group, r % group);
        &self.a.q[t * self.a.q_stride + (self.g * group + i) * m.hd..][..m.hd]
    }

    /// The output range of query row `r` (its token's row, its head's place).
    fn o_range(&self, r: usize) -> std::ops::Range<usize> {
        let m = self.a.meta;
        let group = m.n_head / m.n_head_kv;
        let (t, i) = (self.t0 + r / group, r % group);
        let at = t * m.n_head * m.hd + (self.g * group + i) * m.hd;
        at..at + m.hd
    }

    /// The output of query row `r`.
    ///
    /// # Safety
    /// The item owns the outputs of its rows (items are claimed once), and no other
    /// reference to row `r`'s output is alive.
    #[allow(clippy::mut_from_ref)]
    unsafe fn o(&self, r: usize) -> &mut [f32] {
        // SAFETY: as the caller guarantees.
        unsafe { self.out.slice(self.o_range(r)) }
    }

    /// One online-softmax step for `rows` (strictly increasing), which all read the keys
    /// `[s, e)` of this tile: every call a row makes is a function of its own range, so
    /// running rows together (four per call where they can) leaves each row's bits those
    /// of a call of its own.
    fn step(&self, rows: &[usize], s: usize, e: usize, sm: &mut Softmax) {
        let (isa, m) = (self.isa, self.a.meta);
        let scores = &mut *sm.scores;
        for p in self.ps {
            let (ps0, ps1) = (p.0.max(s), p.1.min(e));
            if ps0 >= ps1 {
                continue;
            }
            let (ks, len, off) = (&self.ks, ps1 - ps0, ps0 - s);
            let mut fours = rows.chunks_exact(4);
            for r4 in &mut fours {
                let dst = rows_mut::<4>(scores, r4, KEY_TILE, off, len);
                let q = std::array::from_fn(|j| self.q(r4[j]));
                ks.dot4(isa, p, ps0, q, dst);
            }
            let rest = fours.remainder();
            let mut twos = rest.chunks_exact(2);
            for r2 in &mut twos {
                let [da, db] = rows_mut::<2>(scores, r2, KEY_TILE, off, len);
                ks.dot2(isa, p, ps0, self.q(r2[0]), self.q(r2[1]), da, db);
            }
            for &r in twos.remainder() {
                let dst = &mut scores[r * KEY_TILE + off..][..len];
                ks.dot1(isa, p, ps0, self.q(r), dst);
            }
        }
        // Each row's online-softmax step (its output rescaled if its maximum grew)...
        for &r in rows {
            let row = &mut scores[r * KEY_TILE..][..e - s];
            let mut tmax = isa.scale_max(row, m.scale);
            if let Some(c) = m.softcap {
                // The cap bends the scaled scores before the softmax (Gemma 2).
                isa.softcap(row, c);
                tmax = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            }
            if tmax > sm.m[r] {
                // Earlier tiles' weights were taken against a smaller maximum.
                let c = (sm.m[r] - tmax).exp();
                sm.l[r] *= c;
                // SAFETY: row r's output, no other reference alive.
                isa.scale(unsafe { self.o(r) }, c);
                sm.m[r] = tmax;
            }
            isa.exp_sub(row, sm.m[r]);
        }
        // ...each denominator grows by its row's weights, summed in key order...
        add_weights(sm.l, scores, rows, e - s);
        // ...then the weighted values, four rows per call, then two, then one.
        let scores = &*scores;
        let w = |r: usize, ps0: usize, ps1: usize| &scores[r * KEY_TILE + ps0 - s..][..ps1 - ps0];
        for p in self.ps {
            let (ps0, ps1) = (p.0.max(s), p.1.min(e));
            if ps0 >= ps1 {
                continue;
            }
            let vs = &self.vs;
            let mut fours = rows.chunks_exact(4);
            for r4 in &mut fours {
                let ws = std::array::from_fn(|j| w(r4[j], ps0, ps1));
                // SAFETY: four distinct rows' outputs, no other reference alive.
                let os = std::array::from_fn(|j| unsafe { self.o(r4[j]) });
                vs.wsum4(isa, p, ps0, ws, os);
            }
            let rest = fours.remainder();
            let mut twos = rest.chunks_exact(2);
            for r2 in &mut twos {
                let (wa, wb) = (w(r2[0], ps0, ps1), w(r2[1], ps0, ps1));
                // SAFETY: two distinct rows' outputs, no other reference alive.
                let (oa, ob) = unsafe { (self.o(r2[0]), self.o(r2[1])) };
                vs.wsum2(isa, p, ps0, wa, wb, oa, ob);
            }
            for &r in twos.remainder() {
                // SAFETY: row r's output, no other reference alive.
                let o = unsafe { self.o(r) };
                vs.wsum1(isa, p, ps0, w(r, ps0, ps1), o);
            }
        }
    }
}

/// The online-softmax state of an item's rows: each row's scores for the current tile,
/// its running maximum and its running sum.
struct Softmax<'s> {
    scores: &'s mut [f32],
    m: &'s mut [f32],
    l: &'s mut [f32],
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
    let (t0, t1) = toks;
    let n_rows = (t1 - t0) * group;
    debug_assert!(n_rows <= MAX_ROWS);
    let ItemScratch {
        scores,
        m: mx,
        l,
        ktile,
        vtile,
    } = st;
    let place = |t: KvType, region: &[f32]| {
        (n_rows <= IN_PLACE_ROWS)
            .then(|| in_place(isa, t, region, m, g))
            .flatten()
    };
    let (kp, vp) = (place(a.types[0], a.k), place(a.types[1], a.v));
    mx[..n_rows].fill(f32::NEG_INFINITY);
    l[..n_rows].fill(0.0);
    let mut sm = Softmax { scores, m: mx, l };
    // The item's outputs: per token, the group's heads side by side.
    let o_at = |t: usize| t * m.n_head * hd + g * group * hd;
    for t in t0..t1 {
        // SAFETY: item (block, g) owns the outputs of the group's heads for its tokens;
        // items are claimed once.
        unsafe { out.slice(o_at(t)..o_at(t) + group * hd) }.fill(0.0);
    }
    let block = &ranges[t0..t1];
    let lo = block.iter().map(|r| r.0).min().unwrap_or(0);
    let hi = block.iter().map(|r| r.1).max().unwrap_or(0);
    let (mut full, mut own) = ([0usize; MAX_ROWS], [0usize; MAX_ROWS]);
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
        let tl = Tile {
            isa,
            a,
            g,
            t0,
            ps,
            ks: source(a.types[0], a.k, m, g, v0, &ps, kp, &mut *ktile),
            vs: source(a.types[1], a.v, m, g, v0, &ps, vp, &mut *vtile),
            out,
        };
        // Tokens that read all of the tile's keys make the same calls, so their rows run
        // together; a token that reads part of them (the causal diagonal, a window's
        // edge) runs its group's rows on their own.
        let mut n_full = 0;
        for (bt, &(rl, rh)) in block.iter().enumerate() {
            let (s, e) = (rl.max(k0), rh.min(k1));
            if s >= e {
                continue;
            }
            let rows = bt * group..(bt + 1) * group;
            if (s, e) == (v0, v1) {
                for (dst, r) in full[n_full..].iter_mut().zip(rows) {
                    *dst = r;
                }
                n_full += group;
            } else {
                for (dst, r) in own.iter_mut().zip(rows) {
                    *dst = r;
                }
                tl.step(&own[..group], s, e, &mut sm);
            }
        }
        if n_full > 0 {
            tl.step(&full[..n_full], v0, v1, &mut sm);
        }
    }
    for t in t0..t1 {
        // SAFETY: as above.
        let o = unsafe { out.slice(o_at(t)..o_at(t) + group * hd) };
        for (i, oh) in o.chunks_exact_mut(hd).enumerate() {
            let r = (t - t0) * group + i;
            if let Some(s) = a.sinks.map(|s| s[g * group + i]) {
                // The sink's logit joins the normaliser with no value row (ggml's fold).
                if s > sm.m[r] {
                    let c = (sm.m[r] - s).exp();
                    sm.l[r] = sm.l[r] * c + 1.0;
                    isa.scale(oh, c);
                    sm.m[r] = s;
                } else {
                    sm.l[r] += (s - sm.m[r]).exp();
                }
            }
            isa.scale(oh, 1.0 / sm.l[r]);
        }
    }
}
