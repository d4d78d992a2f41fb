//! Element-wise and row-wise op families on CUDA: add, mul, the scale, SiLU, SwiGLU,
//! GELU, GeGLU, the soft-cap and the per-row sigmoid gate, row gathers, RMS norm, biases and rope.

use minfer_graph::device_kit::{checks, ElementwiseOps, NodeCall, Unary};
use minfer_graph::{BackendError, CNode, Op, RoPEMeta, RopeStyle};

use super::launch::{f32_arg, u32_of};
use super::CudaBackend;
use crate::dispatch;
use crate::kernels::Kernel;
use crate::replay::{Arg, Cmd};

/// `v` as a u32 kernel argument.
fn un(v: usize, what: &str) -> Result<Arg, BackendError> {
    u32_of(v, what).map(Arg::U32)
}

impl ElementwiseOps for CudaBackend {
    fn binary(&mut self, c: &NodeCall) -> Result<(), BackendError> {
        let (io, n, out) = (&c.io, c.io.n, c.io.out);
        let nb = io.len(1, &self.pool);
        let k = if c.node.op == Op::Add {
            Kernel::Add
        } else {
            Kernel::Mul
        };
        // Element i reads a[i] and b[i % nb] only: in place is safe for a; a
        // broadcast b that is the output is snapshotted.
        let a = Arg::Buf(io.id(0)?);
        let b = if nb < n {
            self.src_arg(io.id(1)?, out)?
        } else {
            Arg::Buf(io.id(1)?)
        };
        let geom = dispatch::elementwise_geom(n)?;
        self.launch(
            k,
            geom,
            vec![a, b, Arg::Buf(out), un(n, "elements")?, un(nb, "elements")?],
        );
        Ok(())
    }

    fn silu(&mut self, c: &NodeCall) -> Result<(), BackendError> {
        let n = c.io.n;
        let geom = dispatch::elementwise_geom(n)?;
        let args = vec![
            Arg::Buf(c.io.id(0)?),
            Arg::Buf(c.io.out),
            un(n, "elements")?,
        ];
        self.launch(Kernel::Silu, geom, args);
        Ok(())
    }

    fn swiglu(&mut self, c: &NodeCall) -> Result<(), BackendError> {
        let (geom, args) = gated_launch(c)?;
        self.launch(Kernel::SwiGlu, geom, args);
        Ok(())
    }

    fn unary(&mut self, c: &NodeCall, f: Unary) -> Result<(), BackendError> {
        let n = c.io.n;
        let geom = dispatch::elementwise_geom(n)?;
        // Element i reads only a[i]: in place is safe.
        let mut args = vec![
            Arg::Buf(c.io.id(0)?),
            Arg::Buf(c.io.out),
            un(n, "elements")?,
        ];
        let k = match f {
            Unary::Scale(s) => {
                args.push(f32_arg(s));
                Kernel::Scale
            }
            Unary::Gelu => Kernel::Gelu,
            Unary::SoftCap(cap) => {
                args.extend([f32_arg(cap), f32_arg(1.0 / cap)]);
                Kernel::SoftCap
            }
        };
        self.launch(k, geom, args);
        Ok(())
    }

    fn geglu(&mut self, c: &NodeCall) -> Result<(), BackendError> {
        let (geom, args) = gated_launch(c)?;
        self.launch(Kernel::GeGlu, geom, args);
        Ok(())
    }

    fn mul_sigmoid(&mut self, c: &NodeCall, d: usize) -> Result<(), BackendError> {
        let n = c.io.n;
        let geom = dispatch::elementwise_geom(n)?;
        // Element i reads x[i] and its row's gate: a gate buffer that is the output is
        // snapshotted (an earlier row's output would overwrite a later row's gate).
        let g = self.src_arg(c.io.id(1)?, c.io.out)?;
        let args = vec![
            Arg::Buf(c.io.id(0)?),
            g,
            Arg::Buf(c.io.out),
            un(n, "elements")?,
            un(d, "row length")?,
        ];
        self.launch(Kernel::MulSigmoid, geom, args);
        Ok(())
    }

    fn rms_norm(&mut self, c: &NodeCall, d: usize, eps: f32) -> Result<(), BackendError> {
        let (x, xl) = (Arg::Buf(c.io.id(0)?), c.io.len(0, &self.pool));
        self.norm(c.node, d, eps, x, xl, c.io.out)
    }

    fn get_rows(
        &mut self,
        c: &NodeCall,
        d: usize,
        _rows: usize,
        sel: usize,
    ) -> Result<(), BackendError> {
        let (n, nt) = (c.io.n, c.io.nt);
        let x = self.src_arg(c.io.id(0)?, c.io.out)?;
        let geom = dispatch::elementwise_geom(n)?;
        let args = vec![
            x,
            Arg::Buf(sel),
            Arg::Buf(c.io.out),
            un(d, "row length")?,
            un(nt, "rows")?,
        ];
        self.launch(Kernel::Gather, geom, args);
        Ok(())
    }

    /// The input copied into the output unless they are one buffer, then rotated there.
    fn rope(&mut self, c: &NodeCall, m: &RoPEMeta, stride: usize) -> Result<(), BackendError> {
        let (n, nt, out) = (c.io.n, c.io.nt, c.io.out);
        let x = c.io.id(0)?;
        if x != out {
            self.pending.push(Cmd::Copy {
                src: Arg::Buf(x),
                dst: Arg::Buf(out),
                len: n,
            });
        }
        self.rope_at(c.io.id(1)?, Arg::Buf(out), nt, m.n_head, m, stride)
    }
}

impl CudaBackend {
    /// `RmsNorm` (rows of `d`, the output's width) and `QkNorm` (rows of a head).
    fn norm(
        &mut self,
        node: &CNode,
        d: usize,
        eps: f32,
        x: Arg,
        x_len: usize,
        out: usize,
    ) -> Result<(), BackendError> {
        let n = node.n_elements();
        checks::norm(n, d, x_len, eps)?;
        let w = match checks::norm_weight(&node.meta)? {
            Some(name) => Some(self.vector(name, d)?),
            None => None,
        };
        let geom = dispatch::norm_geom(n / d)?;
        let w_arg = w.map_or(x, Arg::Weight);
        self.launch(
            Kernel::RmsNorm,
            geom,
            vec![
                x,
                w_arg,
                Arg::Buf(out),
                Arg::U32(u32_of(d, "row length")?),
                f32_arg(eps),
                Arg::U32(u32::from(w.is_some())),
            ],
        );
        Ok(())
    }

    /// Records rope in place over `n_head` heads at `target`, in token rows of `stride`
    /// values, at the positions in buffer `pos`.
    pub(super) fn rope_at(
        &mut self,
        pos: usize,
        target: Arg,
        nt: usize,
        n_head: usize,
        m: &RoPEMeta,
        stride: usize,
    ) -> Result<(), BackendError> {
        checks::rope_meta(m)?;
        if self.len(pos) < nt {
            return Err(format!("rope: {} positions for {nt} tokens", self.len(pos)).into());
        }
        let theta_scale = m.freq_base.powf(-2.0 / m.n_dims as f32);
        let geom = dispatch::elementwise_geom(nt * n_head * (m.n_dims / 2))?;
        self.launch(
            Kernel::Rope,
            geom,
            vec![
                Arg::Buf(pos),
                target,
                Arg::U32(u32_of(nt, "tokens")?),
                Arg::U32(u32_of(n_head, "heads")?),
                Arg::U32(u32_of(m.hd, "head dim")?),
                Arg::U32(u32_of(m.n_dims, "rotated dims")?),
                Arg::U32(u32_of(stride, "row stride")?),
                Arg::U32(u32::from(m.style == RopeStyle::Interleaved)),
                f32_arg(m.freq_scale),
                f32_arg(theta_scale),
            ],
        );
        Ok(())
    }

    /// Records `x[i] += b[i % len]` over `n` values at `x` with the f32 vector weight `b`.
    pub(super) fn add_bias(
        &mut self,
        x: Arg,
        n: usize,
        bias: &str,
        len: usize,
    ) -> Result<(), BackendError> {
        let b = self.vector(bias, len)?;
        let geom = dispatch::elementwise_geom(n)?;
        self.launch(
            Kernel::Add,
            geom,
            vec![
                x,
                Arg::Weight(b),
                x,
                Arg::U32(u32_of(n, "elements")?),
                Arg::U32(u32_of(len, "elements")?),
            ],
        );
        Ok(())
    }

    /// Records the per-head RMS norm in place over `rows` rows of `hd` at `x`.
    pub(super) fn norm_rows(
        &mut self,
        x: Arg,
        rows: usize,
        hd: usize,
        w: &str,
        eps: f32,
    ) -> Result<(), BackendError> {
        checks::eps_ok(eps)?;
        let w = self.vector(w, hd)?;
        let geom = dispatch::norm_geom(rows)?;
        self.launch(
            Kernel::RmsNorm,
            geom,
            vec![
                x,
                Arg::Weight(w),
                x,
                Arg::U32(u32_of(hd, "row length")?),
                f32_arg(eps),
                Arg::U32(1),
            ],
        );
        Ok(())
    }
}

/// The geometry and arguments of a gated product (`act(gate) * up`, element by
/// element): gate, up, output and the element count.
fn gated_launch(c: &NodeCall) -> Result<(dispatch::Geom, Vec<Arg>), BackendError> {
    let n = c.io.n;
    let geom = dispatch::elementwise_geom(n)?;
    let args = vec![
        Arg::Buf(c.io.id(0)?),
        Arg::Buf(c.io.id(1)?),
        Arg::Buf(c.io.out),
        un(n, "elements")?,
    ];
    Ok((geom, args))
}
