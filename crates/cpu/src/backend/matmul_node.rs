//! A matmul node's call into [`crate::matmul`]: the weight found by name and checked
//! against the node's dims, groups of matmuls sharing one input, and inputs whose rows
//! are wider than the weight's (a fused producer).

use super::WeightRegistry;
use crate::matmul::{self, MatmulScratch, QMatrix};
use crate::ops::elementwise as ew;
use crate::threadpool::ThreadPool;

/// The activations of a matmul: `nt` rows spread evenly over `x` (a row may be wider than
/// the weight's input when the producer is a fused node).
pub(super) struct MatIn<'a> {
    pub(super) x: &'a [f32],
    pub(super) nt: usize,
    pub(super) packed: &'a mut Vec<f32>,
}

/// `y = x · W^T` for the weight called `name`, checked against the node's dims.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_named(
    pool: &ThreadPool,
    weights: &WeightRegistry,
    name: &str,
    in_dim: usize,
    out_dim: usize,
    a: MatIn,
    mm: &mut MatmulScratch,
    y: &mut [f32],
    repack: bool,
) -> Result<(), String> {
    let w = weights
        .get(name)
        .ok_or_else(|| format!("weight '{name}' is not registered"))?;
    if w.in_dim != in_dim || w.out_dim != out_dim {
        return Err(format!(
            "weight '{name}' is [{}, {}], the node expects [{in_dim}, {out_dim}]",
            w.in_dim, w.out_dim
        ));
    }
    let nt = a.nt;
    let stride = a.x.len() / nt.max(1);
    if stride < in_dim || y.len() != nt * out_dim {
        return Err(format!(
            "matmul with '{name}': input {} values for {nt} rows of {in_dim}, output {}",
            a.x.len(),
            y.len()
        ));
    }
    let x = contiguous(a.x, nt, in_dim, a.packed)?;
    if let Some(r) = w.repacked(pool, repack) {
        return matmul::matmul_repacked(pool, r, x, nt, y, mm)
            .map_err(|e| format!("matmul with '{name}': {e}"));
    }
    let q = QMatrix {
        ty: w.ty,
        data: w.matmul_bytes(repack),
        rows: out_dim,
        cols: in_dim,
    };
    matmul::matmul(pool, &q, x, nt, y, mm).map_err(|e| format!("matmul with '{name}': {e}"))
}

/// What [`matmul_group`] applies to its outputs after the products.
pub(super) enum Epilogue<'a> {
    /// Nothing.
    None,
    /// Gate (the first `nf` rows) and up (the next `nf`): each gate row becomes
    /// `silu(gate) * up`, as the unfused SwiGLU node computes it; `gate` is scratch.
    SwiGlu { nf: usize, gate: &'a mut Vec<f32> },
}

/// The product of several weights that read the same activations, written into `y`
/// (`nt` rows of `ld`): `group` lists `(name, first output row, rows)`, then `epi`. Where
/// every weight is repacked and they fit one [`matmul::matmul_repacked_multi_then`] call,
/// the activations are quantized once and all rows and the epilogue run in one pool
/// region; otherwise each weight runs on its own through `tmp` and the epilogue follows on
/// the caller. Either way each output is the bits of the weight's own matmul and of the
/// unfused epilogue node.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_group(
    pool: &ThreadPool,
    weights: &WeightRegistry,
    group: &[(&str, usize, usize)],
    in_dim: usize,
    a: MatIn,
    mm: &mut MatmulScratch,
    y: &mut [f32],
    repack: bool,
    tmp: &mut Vec<f32>,
    epi: Epilogue<'_>,
) -> Result<(), String> {
    const MAX: usize = matmul::MULTI_MAX_PARTS;
    let nt = a.nt;
    let ld = y.len() / nt.max(1);
    if group.is_empty() || group.len() > MAX || ld * nt != y.len() {
        return Err(format!(
            "{} weights into {} outputs for {nt} rows",
            group.len(),
            y.len()
        ));
    }
    let mut packed: [Option<&matmul::RepackedMatrix>; MAX] = [None; MAX];
    for (slot, &(name, off, rows)) in packed.iter_mut().zip(group) {
        let w = weights
            .get(name)
            .ok_or_else(|| format!("weight '{name}' is not registered"))?;
        if w.in_dim != in_dim || w.out_dim != rows || off + rows > ld {
            return Err(format!(
                "weight '{name}' is [{}, {}], the node expects [{in_dim}, {rows}] at row {off} of {ld}",
                w.in_dim, w.out_dim
            ));
        }
        *slot = w.repacked(pool, repack);
    }
    let n = group.len();
    let swiglu = match &epi {
        Epilogue::None => None,
        Epilogue::SwiGlu { nf, .. } => {
            let nf = *nf;
            if n != 2 || group[0].1 != 0 || group[1].1 != nf || group[0].2 != nf || group[1].2 != nf
            {
                return Err(format!(
                    "a SwiGLU epilogue takes gate and up of {nf} rows at 0 and {nf}, got {group:?}"
                ));
            }
            Some(nf)
        }
    };
    if let Some(first) = packed[0] {
        let fits = packed[..n]
            .iter()
            .all(|p| p.is_some_and(|w| w.shares_activations(first)));
        if fits {
            let parts: [(&matmul::RepackedMatrix, usize); MAX] = std::array::from_fn(|i| {
                (packed[i].unwrap_or(first), group.get(i).map_or(0, |g| g.1))
            });
            let x = contiguous(a.x, nt, in_dim, a.packed)
                .map_err(|e| format!("matmul with '{}': {e}", group[0].0))?;
            let epi = match swiglu {
                Some(_) => matmul::MultiEpilogue::SwiGlu,
                None => matmul::MultiEpilogue::None,
            };
            return matmul::matmul_repacked_multi_then(
                crate::quant::Isa::detect(),
                pool,
                &parts[..n],
                x,
                nt,
                y,
                ld,
                mm,
                epi,
            )
            .map_err(|e| format!("matmul with '{}': {e}", group[0].0));
        }
    }
    for &(name, off, rows) in group {
        tmp.resize(nt * rows, 0.0);
        let mmx = MatIn {
            x: a.x,
            nt,
            packed: &mut *a.packed,
        };
        matmul_named(pool, weights, name, in_dim, rows, mmx, mm, tmp, repack)?;
        for (yr, tr) in y.chunks_exact_mut(ld).zip(tmp.chunks_exact(rows)) {
            yr[off..off + rows].copy_from_slice(tr);
        }
    }
    if let (Some(nf), Epilogue::SwiGlu { gate, .. }) = (swiglu, epi) {
        gate.resize(nf, 0.0);
        for row in y.chunks_exact_mut(ld) {
            let (s, u) = row.split_at_mut(nf);
            gate.copy_from_slice(s);
            ew::swiglu_slice(gate, &u[..nf], s);
        }
    }
    Ok(())
}

/// `nt` rows of `in_dim` from `x`, whose rows may be wider (a fused producer): `x` itself
/// when they are not, else the rows copied into `packed`.
pub(super) fn contiguous<'a>(
    x: &'a [f32],
    nt: usize,
    in_dim: usize,
    packed: &'a mut Vec<f32>,
) -> Result<&'a [f32], String> {
    let stride = x.len() / nt.max(1);
    if stride < in_dim {
        return Err(format!(
            "input {} values for {nt} rows of {in_dim}",
            x.len()
        ));
    }
    if stride == in_dim {
        return Ok(&x[..nt * in_dim]);
    }
    packed.clear();
    for t in 0..nt {
        packed.extend_from_slice(&x[t * stride..t * stride + in_dim]);
    }
    Ok(packed)
}
