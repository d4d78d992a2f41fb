//! The KV cache on wgpu: stores of k and v token rows into a layer's regions (from a
//! store node or a fused QKV node), and attention over the regions. Cells, positions
//! and spans are range checked on the host before any kernel reads them.

use minfer_graph::device_kit::{checks, KvOps, NodeCall};
use minfer_graph::{AttnMeta, BackendError, KvcacheMeta};

use super::res::{grid, u32_of, Res};
use super::WgpuBackend;
use crate::kernels::Kernel;

/// The k and v token rows one KV store reads: the buffer, its length and the first
/// column of each, `stride` values between token rows, and the pool buffer of the
/// cells they land in (host-written, so range checked before the dispatch).
pub(super) struct KvRows {
    pub layer: usize,
    pub n_embd: usize,
    pub n_ctx: usize,
    pub nt: usize,
    pub stride: usize,
    pub k: (Res, usize, usize),
    pub v: (Res, usize, usize),
    pub cells: usize,
}

impl KvOps for WgpuBackend {
    fn kv_store(&mut self, c: &NodeCall, m: &KvcacheMeta) -> Result<(), BackendError> {
        let layer = c.layer;
        let [k_in, v_in, cells] = checks::kv_store_sources(&c.io.ids, |&i| i)?;
        let nt = self.len(cells);
        let rows = KvRows {
            layer,
            n_embd: m.n_embd,
            n_ctx: m.n_ctx,
            nt,
            stride: m.n_embd,
            k: (Res::Pool(k_in), self.len(k_in), 0),
            v: (Res::Pool(v_in), self.len(v_in), 0),
            cells,
        };
        self.store_rows(&rows, c.kv_pair)
    }

    fn attn(
        &mut self,
        c: &NodeCall,
        m: &AttnMeta,
        explicit_span: bool,
    ) -> Result<(), BackendError> {
        let (io, nt, out) = (&c.io, c.io.nt, c.io.out);
        let kv = checks::attn_kv(m, c.kv_pair, out, self.pool.count())?;
        if m.hd == 0
            || m.hd > 256
            || m.n_head == 0
            || m.n_head_kv == 0
            || !m.n_head.is_multiple_of(m.n_head_kv)
        {
            return Err(format!(
                "attention geometry: n_head {} n_head_kv {} hd {} (n_head must be a positive multiple of n_head_kv, hd at most 256)",
                m.n_head, m.n_head_kv, m.hd
            ).into());
        }
        let (q_stride, ..) = io.attn_checked(&self.pool, c.node, m, explicit_span, kv)?;
        let cap = checks::attn_softcap(m)?;
        let q = self.src(io, 0)?;
        let pos = self.src(io, 2)?;
        let span = if explicit_span { self.src(io, 3)? } else { pos };
        let p = [
            u32_of(m.n_head, "heads")?,
            u32_of(m.n_head_kv, "kv heads")?,
            u32_of(m.hd, "head dim")?,
            u32_of(m.n_ctx, "context")?,
            u32_of(q_stride, "q stride")?,
            u32_of(nt, "tokens")?,
            m.scale.to_bits(),
            u32::from(explicit_span),
            match m.window {
                Some(0) => return Err("attention: a sliding window of 0 rows".to_string().into()),
                Some(w) => u32_of(w, "window")?,
                None => 0,
            },
            cap.to_bits(),
            if cap > 0.0 { 1.0 / cap } else { 0.0 }.to_bits(),
            0,
        ];
        let res = [
            q,
            Res::Pool(kv.0),
            Res::Pool(kv.1),
            pos,
            span,
            Res::Pool(out),
        ];
        let groups = (u32_of(m.n_head, "heads")?, u32_of(nt, "tokens")?, 1);
        self.dispatch(Kernel::Attn, &res, &p, groups)
    }
}

impl WgpuBackend {
    /// Records the store of `r`'s k and v token rows at their cells into the layer's
    /// KV regions, after checking every index on the host.
    pub(super) fn store_rows(
        &mut self,
        r: &KvRows,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        let layer = r.layer;
        let (k_id, v_id) = checks::kv_pair(layer, kv_pair, self.pool.count())?;
        let ((k_in, k_len, k_off), (v_in, v_len, v_off), cells) = (r.k, r.v, r.cells);
        let region = |x: Res| matches!(x, Res::Pool(i) if i == k_id || i == v_id);
        if region(k_in) || region(v_in) || cells == k_id || cells == v_id {
            return Err(format!("layer {layer}: a store input aliases the KV region").into());
        }
        let (nt, n_embd, n_ctx) = (r.nt, r.n_embd, r.n_ctx);
        // The last token's row must end inside each source.
        let need_in = |off: usize| match nt {
            0 => 0,
            _ => (nt - 1) * r.stride + off + n_embd,
        };
        if n_embd == 0 || r.stride < n_embd || k_len < need_in(k_off) || v_len < need_in(v_off) {
            return Err(format!(
                "KV store layer {layer}: k {k_len} / v {v_len} values for {nt} rows of {n_embd}"
            )
            .into());
        }
        checks::kv_regions(layer, (self.len(k_id), self.len(v_id)), n_embd, n_ctx)?;
        checks::kv_cells(layer, &self.pool.host_ints(cells, nt, "KV cells")?, n_ctx)?;
        if nt == 0 {
            return Ok(());
        }
        let (gx, gy) = grid((nt * n_embd).div_ceil(256))?;
        let p = [
            u32_of(n_embd, "row width")?,
            u32_of(nt, "rows")?,
            u32_of(n_ctx, "context")?,
            u32_of(r.stride, "row stride")?,
            u32_of(k_off, "k offset")?,
            u32_of(v_off, "v offset")?,
        ];
        self.dispatch(
            Kernel::KvStore,
            &[
                k_in,
                v_in,
                Res::Pool(cells),
                Res::Pool(k_id),
                Res::Pool(v_id),
            ],
            &p,
            (gx, gy, 1),
        )?;
        self.pool.written_by_device(k_id);
        self.pool.written_by_device(v_id);
        Ok(())
    }
}
