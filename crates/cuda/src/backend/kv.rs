//! The KV cache on CUDA: stores of k and v token rows into a layer's regions (from a
//! store node or a fused QKV node), and attention over the regions. Cells, positions
//! and spans are range checked on the host before any kernel reads them.

use minfer_graph::device_kit::{checks, KvOps, NodeCall};
use minfer_graph::{AttnMeta, BackendError, KvcacheMeta};

use super::launch::{f32_arg, u32_of};
use super::CudaBackend;
use crate::dispatch;
use crate::kernels::Kernel;
use crate::replay::Arg;

impl KvOps for CudaBackend {
    fn kv_store(&mut self, c: &NodeCall, m: &KvcacheMeta) -> Result<(), BackendError> {
        let layer = c.layer;
        let (k_id, v_id) = checks::kv_pair(layer, c.kv_pair, self.pool.count())?;
        let [k_in, v_in, cells] = checks::kv_store_sources(&c.io.ids, |&i| i)?;
        if [k_in, v_in, cells].iter().any(|&i| i == k_id || i == v_id) {
            return Err(format!("layer {layer}: a store input aliases the KV region").into());
        }
        let nt = self.len(cells);
        let (n_embd, n_ctx) = (m.n_embd, m.n_ctx);
        if n_embd == 0 || self.len(k_in) < nt * n_embd || self.len(v_in) < nt * n_embd {
            return Err(format!(
                "KV store layer {layer}: k {} / v {} values for {nt} rows of {n_embd}",
                self.len(k_in),
                self.len(v_in)
            )
            .into());
        }
        let kv = (k_id, v_id);
        self.store_rows(
            layer,
            Arg::Buf(k_in),
            Arg::Buf(v_in),
            cells,
            nt,
            n_embd,
            n_ctx,
            kv,
        )
    }

    fn attn(
        &mut self,
        c: &NodeCall,
        m: &AttnMeta,
        explicit_span: bool,
    ) -> Result<(), BackendError> {
        let (io, nt, out) = (&c.io, c.io.nt, c.io.out);
        let (k_id, v_id) = checks::attn_kv(m, c.kv_pair, out, self.pool.count())?;
        if m.n_head == 0 || m.n_head_kv == 0 || !m.n_head.is_multiple_of(m.n_head_kv) {
            return Err(format!(
                "attention geometry: n_head {} must be a positive multiple of n_head_kv {}",
                m.n_head, m.n_head_kv
            )
            .into());
        }
        let geom = dispatch::attn_geom(m.n_head, nt, m.hd)?;
        let (q_stride, pos_id, span_id) =
            io.attn_checked(&self.pool, c.node, m, explicit_span, (k_id, v_id))?;
        let cap = checks::attn_softcap(m)?;
        let q = self.src_arg(io.id(0)?, out)?;
        let un = |v: usize, what: &str| u32_of(v, what).map(Arg::U32);
        let args = vec![
            q,
            Arg::Buf(k_id),
            Arg::Buf(v_id),
            Arg::Buf(pos_id),
            Arg::Buf(span_id),
            Arg::Buf(out),
            un(m.n_head, "heads")?,
            un(m.n_head_kv, "kv heads")?,
            un(m.hd, "head dim")?,
            un(m.n_ctx, "context")?,
            un(q_stride, "q stride")?,
            f32_arg(m.scale),
            Arg::U32(u32::from(explicit_span)),
            f32_arg(cap),
            f32_arg(if cap > 0.0 { 1.0 / cap } else { 0.0 }),
        ];
        self.launch(Kernel::Attn, geom, args);
        Ok(())
    }
}

impl CudaBackend {
    /// Records the store of `nt` rows of `n_embd` values at `k` and `v` into rows
    /// `cells[t]` of the layer's regions `kv`, after checking the regions and the cells.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn store_rows(
        &mut self,
        layer: usize,
        k: Arg,
        v: Arg,
        cells: usize,
        nt: usize,
        n_embd: usize,
        n_ctx: usize,
        (k_id, v_id): (usize, usize),
    ) -> Result<(), BackendError> {
        checks::kv_regions(layer, (self.len(k_id), self.len(v_id)), n_embd, n_ctx)?;
        checks::kv_cells(layer, &self.pool.host_ints(cells, nt, "KV cells")?, n_ctx)?;
        if nt == 0 {
            return Ok(());
        }
        let geom = dispatch::elementwise_geom(nt * n_embd)?;
        self.launch(
            Kernel::KvStore,
            geom,
            vec![
                k,
                v,
                Arg::Buf(cells),
                Arg::Buf(k_id),
                Arg::Buf(v_id),
                Arg::U32(u32_of(n_embd, "row width")?),
                Arg::U32(u32_of(nt, "rows")?),
            ],
        );
        self.pool.written_by_device(k_id);
        self.pool.written_by_device(v_id);
        Ok(())
    }
}
