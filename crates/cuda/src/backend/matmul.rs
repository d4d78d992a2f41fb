//! Matrix products on CUDA: `MatMul` (quantized mat-vec for decode, int8 dp4a matmul
//! for prefill, chosen by `dispatch`), the fused gate|up product (`FusedFFN`) and the
//! embedding lookup.

use minfer_graph::device_kit::{checks, MatmulOps, MatmulPlan, NodeCall};
use minfer_graph::{BackendError, EmbedMeta, FusedFfnMeta, MatMulMeta};

use super::launch::u32_of;
use super::weights::SUB_BLOCK;
use super::CudaBackend;
use crate::dispatch;
use crate::kernels::Kernel;
use crate::replay::Arg;

impl MatmulOps for CudaBackend {
    fn matmul(&mut self, c: &NodeCall, m: &MatMulMeta) -> Result<(), BackendError> {
        let xl = c.io.len(0, &self.pool);
        let x = self.src_arg(c.io.id(0)?, c.io.out)?;
        self.product(&MatmulPlan::of(m), x, xl, c.io.nt, c.io.out)
    }

    /// Gate into columns 0..nf of each row, up into nf..2nf, then SwiGLU in place over
    /// the gate half: the unfused chain's kernels in one node.
    fn fused_ffn(&mut self, c: &NodeCall, m: &FusedFfnMeta) -> Result<(), BackendError> {
        let (nf, nt, out) = (m.nf, c.io.nt, c.io.out);
        let xl = c.io.len(0, &self.pool);
        let x = self.src_arg(c.io.id(0)?, out)?;
        for half in MatmulPlan::ffn(m) {
            self.product(&half, x, xl, nt, out)?;
        }
        let geom = dispatch::elementwise_geom(nt * nf)?;
        let args = vec![
            Arg::Buf(out),
            Arg::U32(u32_of(nt * nf, "elements")?),
            Arg::U32(u32_of(nf, "FFN width")?),
        ];
        self.launch(Kernel::SwiGluRows, geom, args);
        Ok(())
    }

    /// Rows of the (possibly quantized) table at the host-written token ids, decoded by
    /// the kernel.
    fn embed(&mut self, c: &NodeCall, m: &EmbedMeta) -> Result<(), BackendError> {
        let (n, nt, tokens) = (c.io.n, c.io.nt, c.io.id(0)?);
        let w = self.weight(&m.weight_name)?;
        let (ty, row_bytes, rows, index) = (w.ty, w.row_bytes, w.out_dim, w.place);
        checks::embed(c.node, m, w.in_dim, nt, n)?;
        checks::token_ids(&self.pool.host_ints(tokens, nt, "token ids")?, rows)?;
        let geom = dispatch::embed_geom(nt)?;
        let args = vec![
            Arg::Weight(index),
            Arg::Buf(tokens),
            Arg::Buf(c.io.out),
            Arg::U32(u32_of(m.n_embd, "row length")?),
            Arg::U32(u32_of(row_bytes, "row bytes")?),
        ];
        self.launch(Kernel::Embed(ty), geom, args);
        Ok(())
    }
}

impl CudaBackend {
    /// Records `y[t, y_off + r] = W[r] . x[t] (+ bias[r])`.
    pub(super) fn product(
        &mut self,
        a: &MatmulPlan,
        x: Arg,
        x_len: usize,
        nt: usize,
        out: usize,
    ) -> Result<(), BackendError> {
        let w = self.weight(a.name)?;
        let (ty, row_bytes, index) = (w.ty, w.row_bytes, w.place);
        let w_dims = (w.in_dim, w.out_dim);
        // The weight's dims are named first, as `check` would, before the sub-blocks.
        checks::matmul_weight(a.name, w_dims, (a.in_dim, a.out_dim))?;
        if !a.in_dim.is_multiple_of(SUB_BLOCK) {
            return Err(format!(
                "matmul with '{}': rows of {} values are not whole sub-blocks of {SUB_BLOCK}",
                a.name, a.in_dim
            )
            .into());
        }
        let stride = a.check(w_dims, x_len, nt, self.len(out))?;
        let bias = match a.bias {
            Some(b) => Some(self.vector(b, a.out_dim)?),
            None => None,
        };
        // Without a bias the kernel never reads it; the weight stands in.
        let b_arg = Arg::Weight(bias.unwrap_or(index));
        let has_bias = Arg::U32(u32::from(bias.is_some()));
        let geom = dispatch::matmul_geom(a.out_dim, nt)?;
        let (kernel, quant) = dispatch::matmul_kernel(ty, nt)?;
        match quant {
            None => {
                let args = vec![
                    Arg::Weight(index),
                    x,
                    b_arg,
                    Arg::Buf(out),
                    Arg::U32(u32_of(a.in_dim, "input features")?),
                    Arg::U32(u32_of(a.out_dim, "output features")?),
                    Arg::U32(u32_of(nt, "tokens")?),
                    Arg::U32(u32_of(row_bytes, "row bytes")?),
                    Arg::U32(u32_of(stride, "row stride")?),
                    Arg::U32(u32_of(a.y_stride, "output stride")?),
                    Arg::U32(u32_of(a.y_off, "output column")?),
                    has_bias,
                ];
                self.launch(kernel, geom, args);
            }
            Some(q) => {
                let qbytes = nt * a.in_dim;
                self.ensure_scratch(dispatch::quant_scratch_bytes(a.in_dim, nt))?;
                let qg = dispatch::quant_geom(q, a.in_dim, nt)?;
                let (qx, dx) = (Arg::Scratch(0), Arg::Scratch(qbytes));
                self.launch(
                    Kernel::Quant(q),
                    qg,
                    vec![
                        x,
                        qx,
                        dx,
                        Arg::U32(u32_of(a.in_dim, "input features")?),
                        Arg::U32(u32_of(stride, "row stride")?),
                    ],
                );
                let args = vec![
                    Arg::Weight(index),
                    qx,
                    dx,
                    b_arg,
                    Arg::Buf(out),
                    Arg::U32(u32_of(a.in_dim, "input features")?),
                    Arg::U32(u32_of(a.out_dim, "output features")?),
                    Arg::U32(u32_of(nt, "tokens")?),
                    Arg::U32(u32_of(row_bytes, "row bytes")?),
                    Arg::U32(u32_of(a.y_stride, "output stride")?),
                    Arg::U32(u32_of(a.y_off, "output column")?),
                    has_bias,
                    Arg::U32(q.group() as u32),
                ];
                self.launch(kernel, geom, args);
            }
        }
        Ok(())
    }
}
