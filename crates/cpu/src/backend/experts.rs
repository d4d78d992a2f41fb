//! The CPU kernel call of an expert-routed matmul node (`MulMatId`, `MulMatIdSwiGLU`):
//! the router's ids checked and the chosen experts' products formed.

use minfer_graph::MatMulIdMeta;

use super::{vector, WeightRegistry};
use crate::matmul::{self, ExpertMatrix, IdScratch};
use crate::ops::as_i32;
use crate::ops::elementwise as ew;
use crate::threadpool::ThreadPool;

/// What an expert-routed matmul node works with.
pub(super) struct Experts<'a> {
    pub(super) pool: &'a ThreadPool,
    pub(super) weights: &'a WeightRegistry,
    pub(super) ids: &'a mut Vec<u32>,
    pub(super) scratch: &'a mut IdScratch,
    pub(super) gate: &'a mut Vec<f32>,
    pub(super) up: &'a mut Vec<f32>,
    /// Read k-quant experts through their repacked tiles and other mapped experts from a
    /// huge-page copy ([`CpuBackend::set_repack`]); the bits are the same either way.
    pub(super) repack: bool,
}

impl Experts<'_> {
    /// `MulMatId` (`m.gate_name` unset) or `MulMatIdSwiGLU` into `out`: the chosen
    /// experts' products, and for the SwiGLU form `silu(gate) * up` with the unfused
    /// kernel, gate and up sharing one quantization of `x` where they share a type.
    pub(super) fn run(
        self,
        m: &MatMulIdMeta,
        x: &[f32],
        ids: &[f32],
        out: &mut [f32],
    ) -> Result<(), String> {
        self.ids.clear();
        // A negative id becomes one past every expert, which the kernel refuses.
        self.ids.extend(
            ids.iter()
                .map(|&v| u32::try_from(as_i32(v)).unwrap_or(u32::MAX)),
        );
        let mat = |name: &str| -> Result<ExpertMatrix<'_>, String> {
            let w = self
                .weights
                .get(name)
                .ok_or_else(|| format!("weight '{name}' is not registered"))?;
            if w.in_dim != m.in_dim || w.out_dim != m.out_dim * m.n_expert {
                return Err(format!(
                    "weight '{name}' is [{}, {}], the node expects {} experts of [{}, {}]",
                    w.in_dim, w.out_dim, m.n_expert, m.in_dim, m.out_dim
                ));
            }
            // Only the tile types whose kernels give the GGUF layout's bits are repacked
            // (a Q8_0-family repack would round differently, and would go unread).
            let packed = if matmul::RepackedMatrix::gives_k_tiles(w.ty) {
                w.repacked(self.pool, self.repack)
            } else {
                None
            };
            Ok(ExpertMatrix {
                ty: w.ty,
                data: match packed {
                    Some(_) => w.bytes(),
                    None => w.matmul_bytes(self.repack),
                },
                rows: m.out_dim,
                cols: m.in_dim,
                n_expert: m.n_expert,
                packed,
            })
        };
        let err = |e: matmul::MatmulError| format!("experts of '{}': {e}", m.weight_name);
        // Each slot adds its expert's row of a stacked bias (ggml's `add_id`); the ids
        // were checked by the product.
        let weights = self.weights;
        let bias = |y: &mut [f32], name: &Option<String>, ids: &[u32]| -> Result<(), String> {
            let Some(name) = name else {
                return Ok(());
            };
            let b = vector(weights, name)?;
            let d = m.out_dim;
            if b.len() != d * m.n_expert {
                return Err(format!(
                    "bias '{name}' holds {} values, {} experts of {d} expected",
                    b.len(),
                    m.n_expert
                ));
            }
            for (row, &e) in y.chunks_exact_mut(d).zip(ids) {
                let br = b
                    .get(e as usize * d..(e as usize + 1) * d)
                    .ok_or_else(|| format!("expert id {e} outside bias '{name}'"))?;
                row.iter_mut().zip(br).for_each(|(v, b)| *v += b);
            }
            Ok(())
        };
        let up = mat(&m.weight_name)?;
        let Some(gate_name) = &m.gate_name else {
            matmul::matmul_id(
                self.pool,
                &[up],
                x,
                self.ids,
                &mut [&mut *out],
                self.scratch,
            )
            .map_err(err)?;
            return bias(out, &m.bias_name, self.ids);
        };
        let gate = mat(gate_name)?;
        let n = out.len();
        self.gate.resize(n, 0.0);
        self.up.resize(n, 0.0);
        let (g, u) = (&mut self.gate[..n], &mut self.up[..n]);
        if gate.ty == up.ty {
            matmul::matmul_id(
                self.pool,
                &[gate, up],
                x,
                self.ids,
                &mut [&mut *g, &mut *u],
                self.scratch,
            )
            .map_err(err)?;
        } else {
            matmul::matmul_id(
                self.pool,
                &[gate],
                x,
                self.ids,
                &mut [&mut *g],
                self.scratch,
            )
            .map_err(err)?;
            matmul::matmul_id(self.pool, &[up], x, self.ids, &mut [&mut *u], self.scratch)
                .map_err(err)?;
        }
        bias(g, &m.gate_bias_name, self.ids)?;
        bias(u, &m.bias_name, self.ids)?;
        ew::glu(self.pool, m.glu, g, u, out)
    }
}
