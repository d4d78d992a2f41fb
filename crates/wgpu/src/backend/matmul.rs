//! Matrix products on wgpu: `MatMul`, the fused gate|up product (`FusedFFN`), the
//! embedding lookup, and the rounding of activations for quantized weights, which the
//! shaders multiply as the CPU does.

use minfer_graph::device_kit::{checks, MatmulOps, MatmulPlan, NodeCall};
use minfer_graph::{BackendError, EmbedMeta, FusedFfnMeta, MatMulMeta};

use super::res::{grid, u32_of, Res};
use super::WgpuBackend;
use crate::kernels::{ActFormat, Kernel, Tile};

impl MatmulOps for WgpuBackend {
    fn matmul(&mut self, c: &NodeCall, m: &MatMulMeta) -> Result<(), BackendError> {
        let (x, xl) = (self.src(&c.io, 0)?, self.src_len(&c.io, 0));
        self.product(&MatmulPlan::of(m), x, xl, c.io.nt, c.io.out)
    }

    /// Gate into columns 0..nf of each row, up into nf..2nf, then SwiGLU in place over
    /// the gate half: the kernels of the unfused chain, so both give the same bits, in
    /// one node and without the two extra buffers.
    fn fused_ffn(&mut self, c: &NodeCall, m: &FusedFfnMeta) -> Result<(), BackendError> {
        let (nf, nt) = (m.nf, c.io.nt);
        let (x, xl) = (self.src(&c.io, 0)?, self.src_len(&c.io, 0));
        for half in MatmulPlan::ffn(m) {
            self.product(&half, x, xl, nt, c.io.out)?;
        }
        let (gx, gy) = grid((nt * nf).div_ceil(256))?;
        let p = [u32_of(nt * nf, "elements")?, u32_of(nf, "FFN width")?];
        self.dispatch(Kernel::SwiGluRows, &[Res::Pool(c.io.out)], &p, (gx, gy, 1))
    }

    /// Rows of the (possibly quantized) table at the host-written token ids, decoded
    /// by the shader, part by part.
    fn embed(&mut self, c: &NodeCall, m: &EmbedMeta) -> Result<(), BackendError> {
        let (n, nt) = (c.io.n, c.io.nt);
        let w = self.weight(&m.weight_name)?;
        let (ty, row_bytes, rows, parts) = (w.ty, w.row_bytes, w.out_dim, w.place.clone());
        checks::embed(c.node, m, w.in_dim, nt, n)?;
        checks::token_ids(&self.pool.host_ints(c.io.ids[0], nt, "token ids")?, rows)?;
        let t = self.src(&c.io, 0)?;
        let (gx, gy) = grid(nt)?;
        for part in parts {
            let p = [
                u32_of(m.n_embd, "row length")?,
                u32_of(part.rows, "table rows")?,
                u32_of(nt, "tokens")?,
                u32_of(row_bytes, "row bytes")?,
                u32_of(part.row0, "row")?,
                0,
                0,
                0,
            ];
            self.dispatch(
                Kernel::Embed(ty),
                &[Res::Weight(part.index), t, Res::Pool(c.io.out)],
                &p,
                (gx, gy, 1),
            )?;
        }
        Ok(())
    }
}

impl WgpuBackend {
    /// Records `y[t, y_off + r] = W[r] . x[t] (+ bias[r])` over every row range of W.
    pub(super) fn product(
        &mut self,
        a: &MatmulPlan,
        x: Res,
        x_len: usize,
        nt: usize,
        out: usize,
    ) -> Result<(), BackendError> {
        let w = self.weight(a.name)?;
        let (ty, row_bytes, parts) = (w.ty, w.row_bytes, w.place.clone());
        let stride = a.check((w.in_dim, w.out_dim), x_len, nt, self.len(out))?;
        let bias = match a.bias {
            Some(b) => Some(self.vector(b, a.out_dim)?),
            None => None,
        };
        // Quantized weights multiply the activations rounded as the CPU rounds them.
        let (x, stride) = match ActFormat::of(ty) {
            Some(fmt) if !a.rounded => (
                self.round_activations(fmt, x, a.in_dim, stride, nt)?,
                a.in_dim,
            ),
            _ => (x, stride),
        };
        let tile = Tile::for_tokens(nt);
        let tiles = u32_of(nt.div_ceil(tile.tokens()), "token tiles")?;
        for part in parts {
            // 16 rows by a tile of tokens per workgroup (see matmul.wgsl).
            let (gx, gy) = grid(part.rows.div_ceil(16))?;
            let p = [
                u32_of(a.in_dim, "input features")?,
                u32_of(a.out_dim, "output features")?,
                u32_of(nt, "tokens")?,
                u32_of(row_bytes, "row bytes")?,
                u32_of(stride, "row stride")?,
                u32::from(bias.is_some()),
                u32_of(part.row0, "row")?,
                u32_of(part.rows, "rows")?,
                u32_of(a.y_stride, "output stride")?,
                u32_of(a.y_off, "output column")?,
            ];
            // Without a bias the kernel never reads binding 2; the weight stands in.
            let b = Res::Weight(bias.unwrap_or(part.index));
            self.dispatch(
                Kernel::Matmul(ty, tile),
                &[Res::Weight(part.index), x, b, Res::Pool(out)],
                &p,
                (gx, gy, tiles),
            )?;
        }
        Ok(())
    }

    /// Records the rounding of `nt` rows of `k` activations (at `stride`) to `fmt`'s
    /// levels into the scratch, which it returns packed as quant_act.wgsl describes
    /// (levels then scales, rows dense; a quarter of its `nt * k` words and a 32nd).
    pub(super) fn round_activations(
        &mut self,
        fmt: ActFormat,
        x: Res,
        k: usize,
        stride: usize,
        nt: usize,
    ) -> Result<Res, BackendError> {
        if !k.is_multiple_of(fmt.block()) {
            return Err(format!(
                "{k} input features are not a multiple of the {}-value activation block",
                fmt.block()
            )
            .into());
        }
        let len = nt * k;
        let scratch = Res::Act(len);
        let (gx, gy) = grid(len / fmt.block())?;
        let p = [
            u32_of(k, "input features")?,
            u32_of(nt, "tokens")?,
            u32_of(stride, "row stride")?,
            0,
        ];
        self.dispatch(Kernel::QuantAct(fmt), &[x, scratch], &p, (gx, gy, 1))?;
        Ok(scratch)
    }
}
