//! Element-wise and row-wise op families on wgpu: add, mul, the scale, SiLU, SwiGLU,
//! GELU, GeGLU, the soft-cap and the per-row sigmoid gate, row gathers, RMS norm and rope, with the kernels'
//! dispatch geometry.

use minfer_graph::device_kit::{checks, ElementwiseOps, NodeCall, Unary};
use minfer_graph::{BackendError, CNode, NodeMeta, RoPEMeta, RopeStyle};

use super::res::{grid, u32_of, Res};
use super::WgpuBackend;
use crate::kernels::Kernel;

impl ElementwiseOps for WgpuBackend {
    fn binary(&mut self, c: &NodeCall) -> Result<(), BackendError> {
        let (io, n) = (&c.io, c.io.n);
        let nb = self.src_len(io, 1);
        let k = if c.node.op == minfer_graph::Op::Add {
            Kernel::Add
        } else {
            Kernel::Mul
        };
        let (a, b) = (self.src(io, 0)?, self.src(io, 1)?);
        self.elementwise(k, &[a, b, Res::Pool(io.out)], n, nb)
    }

    fn silu(&mut self, c: &NodeCall) -> Result<(), BackendError> {
        let a = self.src(&c.io, 0)?;
        let n = c.io.n;
        self.elementwise(Kernel::Silu, &[a, a, Res::Pool(c.io.out)], n, n)
    }

    fn swiglu(&mut self, c: &NodeCall) -> Result<(), BackendError> {
        let (g, u) = (self.src(&c.io, 0)?, self.src(&c.io, 1)?);
        let n = c.io.n;
        self.elementwise(Kernel::SwiGlu, &[g, u, Res::Pool(c.io.out)], n, n)
    }

    fn unary(&mut self, c: &NodeCall, f: Unary) -> Result<(), BackendError> {
        let a = self.src(&c.io, 0)?;
        let (k, consts) = match f {
            Unary::Scale(s) => (Kernel::Scale, [s, 0.0]),
            Unary::Gelu => (Kernel::Gelu, [0.0; 2]),
            Unary::SoftCap(cap) => (Kernel::SoftCap, [cap, 1.0 / cap]),
        };
        let n = c.io.n;
        self.elementwise_with(k, &[a, a, Res::Pool(c.io.out)], n, n, consts)
    }

    fn geglu(&mut self, c: &NodeCall) -> Result<(), BackendError> {
        let (g, u) = (self.src(&c.io, 0)?, self.src(&c.io, 1)?);
        let n = c.io.n;
        self.elementwise(Kernel::GeGlu, &[g, u, Res::Pool(c.io.out)], n, n)
    }

    fn mul_sigmoid(&mut self, c: &NodeCall, d: usize) -> Result<(), BackendError> {
        let (x, g) = (self.src(&c.io, 0)?, self.src(&c.io, 1)?);
        self.elementwise(Kernel::MulSigmoid, &[x, g, Res::Pool(c.io.out)], c.io.n, d)
    }

    fn rms_norm(&mut self, c: &NodeCall, d: usize, eps: f32) -> Result<(), BackendError> {
        let (x, xl) = (self.src(&c.io, 0)?, self.src_len(&c.io, 0));
        self.norm(c.node, &c.node.meta, d, eps, x, xl, c.io.out)
    }

    fn get_rows(
        &mut self,
        c: &NodeCall,
        d: usize,
        rows: usize,
        _sel: usize,
    ) -> Result<(), BackendError> {
        let (n, nt) = (c.io.n, c.io.nt);
        let (x, r) = (self.src(&c.io, 0)?, self.src(&c.io, 1)?);
        let (gx, gy) = grid(n.div_ceil(256))?;
        let p = [
            u32_of(d, "row length")?,
            u32_of(nt, "rows")?,
            u32_of(rows, "rows")?,
            0,
            0,
            0,
            0,
            0,
        ];
        self.dispatch(
            Kernel::Gather,
            &[x, r, Res::Pool(c.io.out)],
            &p,
            (gx, gy, 1),
        )
    }

    fn rope(&mut self, c: &NodeCall, m: &RoPEMeta, stride: usize) -> Result<(), BackendError> {
        let (n, nt, out, x) = (c.io.n, c.io.nt, c.io.out, c.io.ids[0]);
        // The kernel rotates in place: start from a copy unless the allocator
        // already gave rope its input's buffer.
        if x != out {
            let a = self.pool.bufs[x].mem.clone();
            let b = self.pool.bufs[out].mem.clone();
            self.encoder()
                .copy_buffer_to_buffer(&a, 0, &b, 0, (n * 4) as u64);
        }
        let pos = self.src(&c.io, 1)?;
        self.rope_rows(m, pos, Res::Pool(out), nt, stride, 0)
    }
}

impl WgpuBackend {
    /// Records rope of `m.n_head` heads of every token row (`stride` apart, heads from
    /// `off`) of `out`, in place, at the positions `pos`.
    pub(super) fn rope_rows(
        &mut self,
        m: &RoPEMeta,
        pos: Res,
        out: Res,
        nt: usize,
        stride: usize,
        off: usize,
    ) -> Result<(), BackendError> {
        checks::rope_meta(m)?;
        let theta_scale = m.freq_base.powf(-2.0 / m.n_dims as f32);
        let pairs = nt * m.n_head * (m.n_dims / 2);
        let (gx, gy) = grid(pairs.div_ceil(256))?;
        let p = [
            u32_of(nt, "tokens")?,
            u32_of(m.n_head, "heads")?,
            u32_of(m.hd, "head dim")?,
            u32_of(m.n_dims, "rotated dims")?,
            u32_of(stride, "row stride")?,
            u32::from(m.style == RopeStyle::Interleaved),
            m.freq_scale.to_bits(),
            theta_scale.to_bits(),
            u32_of(off, "head offset")?,
        ];
        self.dispatch(Kernel::Rope, &[pos, out], &p, (gx, gy, 1))
    }

    /// Records the RMS norm of `rows` rows of `d` values from `x` into pool buffer
    /// `out`, scaled by weight buffer `w` when given; rows are `per_tok` to a token row
    /// of `stride` values from `off` (dense rows: `per_tok == rows`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_rows(
        &mut self,
        x: Res,
        w: Option<usize>,
        d: usize,
        rows: usize,
        eps: f32,
        (per_tok, stride, off): (usize, usize, usize),
        out: usize,
    ) -> Result<(), BackendError> {
        checks::eps_ok(eps)?;
        let (gx, gy) = grid(rows)?;
        let p = [
            u32_of(d, "row length")?,
            u32_of(rows, "rows")?,
            eps.to_bits(),
            u32::from(w.is_some()),
            u32_of(per_tok.max(1), "rows per token")?,
            u32_of(stride, "row stride")?,
            u32_of(off, "row offset")?,
        ];
        // Without a scale vector the kernel never reads binding 1; the input stands in.
        let wres = w.map_or(x, Res::Weight);
        self.dispatch(Kernel::RmsNorm, &[x, wres, Res::Pool(out)], &p, (gx, gy, 1))
    }

    /// `RmsNorm` (rows of `d`, the output's width) and `QkNorm` (rows of a head).
    #[allow(clippy::too_many_arguments)]
    fn norm(
        &mut self,
        node: &CNode,
        meta: &NodeMeta,
        d: usize,
        eps: f32,
        x: Res,
        x_len: usize,
        out: usize,
    ) -> Result<(), BackendError> {
        let n = node.n_elements();
        checks::norm(n, d, x_len, eps)?;
        let w = match checks::norm_weight(meta)? {
            Some(name) => Some(self.vector(name, d)?),
            None => None,
        };
        let rows = n / d;
        self.norm_rows(x, w, d, rows, eps, (rows, 0, 0), out)
    }
}
