//! Element-wise ops: add and multiply (with `b` broadcast by repetition), scale, SiLU,
//! SwiGLU, GeGLU, gpt-oss's clamped GLU, vectorised unary kernels (GELU, soft-cap) and row softmax. Large
//! inputs are cut into fixed rows across the pool; every element is computed
//! independently, so the thread count never changes a result.

use minfer_graph::Glu;

use super::{par_rows, ELEM_ROW, PAR_MIN_ELEMS};
use crate::threadpool::ThreadPool;

use super::exp::expf;
pub use super::exp::silu;
use super::vec::VecIsa;

/// A binary element-wise operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a * b`.
    Mul,
}

/// `out[i] = a[i] op b[i % b.len()]` for `i < out.len()`; `b.len()` must divide `out.len()`
/// (a single row broadcast over tokens, or a full tensor).
pub fn binary(
    pool: &ThreadPool,
    op: BinOp,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
) -> Result<(), String> {
    let n = out.len();
    if a.len() < n || b.is_empty() || !n.is_multiple_of(b.len()) {
        return Err(format!(
            "{op:?}: cannot combine {} values with {} (broadcast) into {n}",
            a.len(),
            b.len()
        ));
    }
    let nb = b.len();
    // Rows are whole repetitions of `b` when it is a row, so the inner loop is a plain zip.
    let row = if nb < n { nb } else { ELEM_ROW };
    par_rows(pool, out, row, n >= PAR_MIN_ELEMS, &|r0, ys| {
        let start = r0 * row;
        for (ci, yc) in ys.chunks_mut(row).enumerate() {
            let s = start + ci * row;
            let ac = &a[s..s + yc.len()];
            let bc = if nb < n {
                &b[..yc.len()]
            } else {
                &b[s..s + yc.len()]
            };
            match op {
                BinOp::Add => {
                    for ((y, &x), &z) in yc.iter_mut().zip(ac).zip(bc) {
                        *y = x + z;
                    }
                }
                BinOp::Mul => {
                    for ((y, &x), &z) in yc.iter_mut().zip(ac).zip(bc) {
                        *y = x * z;
                    }
                }
            }
        }
    });
    Ok(())
}

/// `y[i] += b[i % b.len()]` in place; `b.len()` must divide `y.len()` (bias rows).
pub fn add_inplace(pool: &ThreadPool, y: &mut [f32], b: &[f32]) -> Result<(), String> {
    let n = y.len();
    if b.is_empty() || !n.is_multiple_of(b.len()) {
        return Err(format!("cannot broadcast {} values over {n}", b.len()));
    }
    let row = b.len();
    par_rows(pool, y, row, n >= PAR_MIN_ELEMS, &|_, ys| {
        for yr in ys.chunks_mut(row) {
            for (v, &z) in yr.iter_mut().zip(b) {
                *v += z;
            }
        }
    });
    Ok(())
}

/// Applies `f` to every element of `y` in place, in parallel for large inputs.
pub fn map_inplace(pool: &ThreadPool, y: &mut [f32], f: &(dyn Fn(f32) -> f32 + Sync)) {
    let n = y.len();
    par_rows(pool, y, ELEM_ROW, n >= PAR_MIN_ELEMS, &|_, ys| {
        for v in ys {
            *v = f(*v);
        }
    });
}

/// `out[i] = f(x[i])`; `x` holds at least `out.len()` values.
pub fn map(
    pool: &ThreadPool,
    x: &[f32],
    out: &mut [f32],
    f: &(dyn Fn(f32) -> f32 + Sync),
) -> Result<(), String> {
    let n = out.len();
    if x.len() < n {
        return Err(format!("unary op: {} inputs for {n} outputs", x.len()));
    }
    par_rows(pool, out, ELEM_ROW, n >= PAR_MIN_ELEMS, &|r0, ys| {
        let s = r0 * ELEM_ROW;
        for (y, &v) in ys.iter_mut().zip(&x[s..]) {
            *y = f(v);
        }
    });
    Ok(())
}

/// `y = silu(y)` over the pool, vectorised with the bits of [`silu`].
pub fn silu_inplace(pool: &ThreadPool, y: &mut [f32]) {
    let n = y.len();
    let isa = VecIsa::detect();
    par_rows(pool, y, ELEM_ROW, n >= PAR_MIN_ELEMS, &|_, ys| {
        isa.silu_in_place(ys)
    });
}

/// `out = silu(x)` over the pool, vectorised with the bits of [`silu`]; `x` holds at
/// least `out.len()` values.
pub fn silu_into(pool: &ThreadPool, x: &[f32], out: &mut [f32]) -> Result<(), String> {
    let n = out.len();
    if x.len() < n {
        return Err(format!("silu: {} inputs for {n} outputs", x.len()));
    }
    let isa = VecIsa::detect();
    par_rows(pool, out, ELEM_ROW, n >= PAR_MIN_ELEMS, &|r0, ys| {
        let s = r0 * ELEM_ROW;
        isa.silu(&x[s..s + ys.len()], ys);
    });
    Ok(())
}

/// `out = silu(gate) * up` in one pass, bit-identical to `silu` followed by `mul`.
pub fn swiglu(pool: &ThreadPool, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), String> {
    gated(pool, "swiglu", gate, up, out, &swiglu_slice)
}

/// `out = gelu(gate) * up` in one pass, bit-identical to `gelu` followed by `mul`.
pub fn geglu(pool: &ThreadPool, gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), String> {
    let isa = VecIsa::detect();
    gated(pool, "geglu", gate, up, out, &|g, u, y| isa.geglu(g, u, y))
}

/// `out = glu(gate, up)` for any [`Glu`] (gpt-oss's clamped form among them), each value
/// as [`Glu::apply`] computes it.
pub fn glu(
    pool: &ThreadPool,
    glu: Glu,
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
) -> Result<(), String> {
    if glu.is_silu() {
        return swiglu(pool, gate, up, out);
    }
    gated(pool, "glu", gate, up, out, &|g, u, y| {
        for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
            *y = glu.apply(g, u);
        }
    })
}

/// A serial gated kernel over equal-length `(gate, up, out)` pieces.
type GatedSlice<'a> = dyn Fn(&[f32], &[f32], &mut [f32]) + Sync + 'a;

/// `out = act(gate) * up` through `slice`, the serial kernel over equal-length pieces.
fn gated(
    pool: &ThreadPool,
    name: &str,
    gate: &[f32],
    up: &[f32],
    out: &mut [f32],
    slice: &GatedSlice<'_>,
) -> Result<(), String> {
    let n = out.len();
    if gate.len() < n || up.len() < n {
        return Err(format!(
            "{name}: gate {} and up {} values for {n} outputs",
            gate.len(),
            up.len()
        ));
    }
    par_rows(pool, out, ELEM_ROW, n >= PAR_MIN_ELEMS, &|r0, ys| {
        let s = r0 * ELEM_ROW;
        slice(&gate[s..s + ys.len()], &up[s..s + ys.len()], ys);
    });
    Ok(())
}

/// `out = f(x)` for a vectorised in-place kernel `f` (GELU, the soft-cap): `x` is
/// copied into `out` piece by piece, then transformed; with `x` `None` the op runs in
/// place over `out` (the allocator gave the node its input's buffer).
pub fn unary_vec(
    pool: &ThreadPool,
    x: Option<&[f32]>,
    out: &mut [f32],
    f: &(dyn Fn(&mut [f32]) + Sync),
) -> Result<(), String> {
    let n = out.len();
    if let Some(x) = x.filter(|x| x.len() < n) {
        return Err(format!("unary op: {} inputs for {n} outputs", x.len()));
    }
    par_rows(pool, out, ELEM_ROW, n >= PAR_MIN_ELEMS, &|r0, ys| {
        if let Some(x) = x {
            let s = r0 * ELEM_ROW;
            ys.copy_from_slice(&x[s..s + ys.len()]);
        }
        f(ys);
    });
    Ok(())
}

/// Serial SwiGLU over equal-length slices (vectorised; the same bits as [`silu`] then
/// multiply).
pub fn swiglu_slice(gate: &[f32], up: &[f32], out: &mut [f32]) {
    VecIsa::detect().swiglu(gate, up, out);
}

/// Softmax over rows of `d` values: `exp(x - max)` in f32 ([`expf`]), summed in f64 in order, then
/// each value times `1 / sum` (as ggml's soft_max does).
pub fn softmax_rows(pool: &ThreadPool, x: &[f32], out: &mut [f32], d: usize) -> Result<(), String> {
    let n = out.len();
    if d == 0 || !n.is_multiple_of(d) || x.len() < n {
        return Err(format!(
            "softmax: {n} outputs in rows of {d} from {} inputs",
            x.len()
        ));
    }
    par_rows(pool, out, d, n >= PAR_MIN_ELEMS, &|r0, ys| {
        for (i, yr) in ys.chunks_exact_mut(d).enumerate() {
            let xr = &x[(r0 + i) * d..(r0 + i + 1) * d];
            let mx = xr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0.0f64;
            for (y, &v) in yr.iter_mut().zip(xr) {
                *y = expf(v - mx);
                sum += f64::from(*y);
            }
            let inv = (1.0 / sum) as f32;
            for y in yr.iter_mut() {
                *y *= inv;
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_testkit::Rng;

    #[test]
    fn broadcast_add_and_mul() {
        let pool = ThreadPool::new(2);
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut y = [0.0; 6];
        binary(&pool, BinOp::Add, &a, &[10.0, 20.0, 30.0], &mut y).unwrap();
        assert_eq!(y, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
        binary(&pool, BinOp::Mul, &a, &a, &mut y).unwrap();
        assert_eq!(y, [1.0, 4.0, 9.0, 16.0, 25.0, 36.0]);
        assert!(binary(&pool, BinOp::Add, &a, &[1.0; 4], &mut y).is_err());
        assert!(binary(&pool, BinOp::Add, &a, &[], &mut y).is_err());
        let mut z = a;
        add_inplace(&pool, &mut z, &[1.0, 2.0]).unwrap();
        assert_eq!(z, [2.0, 4.0, 4.0, 6.0, 6.0, 8.0]);
        assert!(add_inplace(&pool, &mut z, &[1.0; 4]).is_err());
    }

    #[test]
    fn large_inputs_are_identical_across_thread_counts() {
        let mut r = Rng::new(9);
        let n = 3 * PAR_MIN_ELEMS + 17;
        let (a, b) = (r.vec(n, 1.0), r.vec(n, 1.0));
        let row = r.vec(n / (3 * PAR_MIN_ELEMS + 17), 1.0);
        let mut results = Vec::new();
        for nth in [1, 2, 4] {
            let pool = ThreadPool::new(nth);
            let mut s = vec![0.0; n];
            swiglu(&pool, &a, &b, &mut s).unwrap();
            let mut m = vec![0.0; n];
            binary(&pool, BinOp::Mul, &a, &b, &mut m).unwrap();
            let mut br = vec![0.0; n];
            binary(&pool, BinOp::Add, &a, &row, &mut br).unwrap();
            results.push((s, m, br));
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]));
        // SwiGLU is exactly silu then mul.
        for i in (0..n).step_by(997) {
            assert_eq!(results[0].0[i].to_bits(), (silu(a[i]) * b[i]).to_bits());
        }
    }

    #[test]
    fn silu_and_softmax_values() {
        let pool = ThreadPool::new(1);
        assert_eq!(silu(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        let mut y = [0.0; 4];
        softmax_rows(&pool, &[0.0, 0.0, 1.0, 3.0], &mut y, 2).unwrap();
        assert_eq!(&y[..2], &[0.5, 0.5]);
        assert!((y[2] - 0.119_202_92).abs() < 1e-6 && (y[2] + y[3] - 1.0).abs() < 1e-6);
        assert!(softmax_rows(&pool, &[0.0; 4], &mut y, 3).is_err());
        let mut z = [1.0, -2.0];
        map_inplace(&pool, &mut z, &|v| v * 2.0);
        assert_eq!(z, [2.0, -4.0]);
    }
}
