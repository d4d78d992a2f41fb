//! The checks a device backend makes before it records a node's kernels: sizes,
//! geometry and host-side index ranges, so a kernel never reads or writes outside a
//! buffer. Each returns the error the node fails with; the backends share them so
//! that the same node fails the same way on every device.

use crate::backend_error::{BackendError, IndexKind};
use crate::ir::{CNode, Op, RopeStyle};
use crate::meta::{AttnMeta, EmbedMeta, KvcacheMeta, MatMulMeta, NodeMeta, RoPEMeta};

/// `Add`/`Mul`: `na` values combined with `nb` (broadcast) into `n`.
pub fn binary(node: &CNode, na: usize, nb: usize, n: usize) -> Result<(), BackendError> {
    if na < n || nb == 0 || !n.is_multiple_of(nb) {
        return Err(BackendError::Broadcast {
            op: node.op.name(),
            a: na,
            b: nb,
            n,
        });
    }
    Ok(())
}

/// `Silu`: `x_len` inputs for `n` outputs.
pub fn silu(x_len: usize, n: usize) -> Result<(), BackendError> {
    unary("silu", x_len, n)
}

/// A one-value-in, one-value-out op `op` (`Silu`, `Scale`, `Gelu`, `SoftCap`): `x_len`
/// inputs for `n` outputs.
pub fn unary(op: &'static str, x_len: usize, n: usize) -> Result<(), BackendError> {
    if x_len < n {
        return Err(BackendError::sizes(
            op,
            format!("{x_len} inputs for {n} outputs"),
        ));
    }
    Ok(())
}

/// `SwiGLU`: gate and up of at least `n` values each.
pub fn swiglu(gate: usize, up: usize, n: usize) -> Result<(), BackendError> {
    gated("swiglu", gate, up, n)
}

/// A gated activation `op` (`SwiGLU`, `GeGLU`): gate and up of at least `n` values each.
pub fn gated(op: &'static str, gate: usize, up: usize, n: usize) -> Result<(), BackendError> {
    if gate < n || up < n {
        return Err(BackendError::sizes(
            op,
            format!("gate {gate} and up {up} values for {n} outputs"),
        ));
    }
    Ok(())
}

/// `MulSigmoid`: `n` outputs in rows of `d` from `x_len` values and `g_len` gates, one
/// per row.
pub fn mul_sigmoid(d: usize, x_len: usize, g_len: usize, n: usize) -> Result<(), BackendError> {
    if d == 0 || !n.is_multiple_of(d) || x_len < n || g_len < n / d {
        return Err(BackendError::sizes(
            "mul_sigmoid",
            format!("{x_len} values and {g_len} gates for {n} outputs in rows of {d}"),
        ));
    }
    Ok(())
}

/// A tanh soft-cap `c` (`SoftCap`, `AttnMeta::softcap`): a positive finite number, as
/// `c * tanh(x / c)` needs.
pub fn softcap(c: f32) -> Result<f32, BackendError> {
    if !(c.is_finite() && c > 0.0) {
        return Err(BackendError::sizes(
            "softcap",
            format!("cap {c} is not a positive number"),
        ));
    }
    Ok(c)
}

/// Attention's score cap as a kernel parameter: the checked cap, 0 for none.
pub fn attn_softcap(m: &AttnMeta) -> Result<f32, BackendError> {
    m.softcap.map_or(Ok(0.0), softcap)
}

/// `MatMul`: the output holds `nt` rows of the weight's `out_dim`.
pub fn matmul_node(node: &CNode, m: &MatMulMeta, nt: usize, n: usize) -> Result<(), BackendError> {
    if m.out_dim * nt != n {
        return Err(BackendError::MatmulOutput {
            rows: node.out_shape[0],
            tokens: nt,
            weight: m.weight_name.clone(),
            out_dim: m.out_dim,
        });
    }
    Ok(())
}

/// `FusedFFN`: the output holds `nt` rows of gate and up, `nf` each.
pub fn fused_ffn(node: &CNode, nf: usize, nt: usize, n: usize) -> Result<(), BackendError> {
    if n != 2 * nf * nt {
        return Err(BackendError::OutputShape {
            shape: node.out_shape,
            expected: format!("[2 x {nf}, {nt}]"),
        });
    }
    Ok(())
}

/// A weight of `[w_in, w_out]` where a matmul expects `[in_dim, out_dim]`.
pub fn matmul_weight(
    name: &str,
    (w_in, w_out): (usize, usize),
    (in_dim, out_dim): (usize, usize),
) -> Result<(), BackendError> {
    if w_in != in_dim || w_out != out_dim {
        return Err(BackendError::WeightShape {
            name: name.to_string(),
            got: (w_in, w_out),
            expected: (in_dim, out_dim),
        });
    }
    Ok(())
}

/// The row stride of a matmul input of `x_len` values over `nt` rows of `in_dim`.
pub fn matmul_input(
    name: &str,
    x_len: usize,
    nt: usize,
    in_dim: usize,
) -> Result<usize, BackendError> {
    let stride = x_len / nt;
    if stride < in_dim {
        return Err(BackendError::MatmulSizes {
            weight: name.to_string(),
            detail: format!("input {x_len} values for {nt} rows of {in_dim}"),
        });
    }
    Ok(stride)
}

/// Output rows of `y_stride` (in a buffer of `out_len`) take columns
/// `y_off..y_off + out_dim` of `nt` tokens.
pub fn matmul_output(
    name: &str,
    (y_off, out_dim, y_stride): (usize, usize, usize),
    out_len: usize,
    nt: usize,
) -> Result<(), BackendError> {
    if y_off + out_dim > y_stride || out_len < nt * y_stride {
        return Err(BackendError::MatmulSizes {
            weight: name.to_string(),
            detail: format!(
                "output rows of {y_stride} cannot hold columns {y_off}..{}",
                y_off + out_dim
            ),
        });
    }
    Ok(())
}

/// Embedding: the table's rows hold `m.n_embd` (`w_in` here), the output `nt` of them.
pub fn embed(
    node: &CNode,
    m: &EmbedMeta,
    w_in: usize,
    nt: usize,
    n: usize,
) -> Result<(), BackendError> {
    if w_in != m.n_embd || node.out_shape[0] != m.n_embd || n != nt * m.n_embd {
        return Err(BackendError::sizes(
            "embedding",
            format!(
                "table '{}' rows hold {w_in}, node expects {} (output {:?})",
                m.weight_name, m.n_embd, node.out_shape
            ),
        ));
    }
    Ok(())
}

/// Token ids inside a table of `rows` rows.
pub fn token_ids(toks: &[i32], rows: usize) -> Result<(), BackendError> {
    match out_of_range(toks, rows) {
        Some((at, value)) => Err(BackendError::IndexOutOfRange {
            kind: IndexKind::TokenId,
            at,
            value,
            bound: rows,
        }),
        None => Ok(()),
    }
}

/// `GetRows` over values: `n` outputs for `nt` ids of rows of `d`.
pub fn get_rows(d: usize, n: usize, nt: usize) -> Result<(), BackendError> {
    if d == 0 || n != nt * d {
        return Err(BackendError::sizes(
            "get_rows",
            format!("{n} outputs for {nt} ids of {d}"),
        ));
    }
    Ok(())
}

/// Row ids inside an input of `rows` rows.
pub fn row_ids(sel: &[i32], rows: usize) -> Result<(), BackendError> {
    match out_of_range(sel, rows) {
        Some((at, value)) => Err(BackendError::IndexOutOfRange {
            kind: IndexKind::RowId,
            at,
            value,
            bound: rows,
        }),
        None => Ok(()),
    }
}

/// KV cells inside a region of `n_ctx` rows.
pub fn kv_cells(layer: usize, cells: &[i32], n_ctx: usize) -> Result<(), BackendError> {
    match out_of_range(cells, n_ctx) {
        Some((at, value)) => Err(BackendError::IndexOutOfRange {
            kind: IndexKind::KvCell { layer },
            at,
            value,
            bound: n_ctx,
        }),
        None => Ok(()),
    }
}

fn out_of_range(ids: &[i32], bound: usize) -> Option<(usize, i32)> {
    ids.iter()
        .enumerate()
        .find(|&(_, &id)| id < 0 || id as usize >= bound)
        .map(|(i, &id)| (i, id))
}

/// What the rope kernels implement: no frequency factors, an even positive count of
/// rotated dims within the head.
pub fn rope_meta(m: &RoPEMeta) -> Result<(), BackendError> {
    // No frequency-factor term in the kernels; `supports_op` declines such nodes.
    if m.freq_factors.is_some() || m.yarn.is_some() {
        return Err(BackendError::Unsupported {
            op: "rope".into(),
            detail: "with frequency factors or YaRN terms is not implemented here".into(),
        });
    }
    if m.n_dims == 0 || !m.n_dims.is_multiple_of(2) || m.n_dims > m.hd {
        return Err(BackendError::sizes(
            "rope",
            format!(
                "n_dims {} must be even, positive and at most hd {}",
                m.n_dims, m.hd
            ),
        ));
    }
    Ok(())
}

/// A `RoPE` node: its style, its metadata, and `x_len` values with `pos_len`
/// positions for `nt` rows of `n` outputs. Returns the row stride.
pub fn rope_node(
    style: RopeStyle,
    m: &RoPEMeta,
    (n, nt): (usize, usize),
    x_len: usize,
    pos_len: usize,
) -> Result<usize, BackendError> {
    if style != m.style {
        return Err(BackendError::Metadata(format!(
            "op style {style:?} but metadata style {:?}",
            m.style
        )));
    }
    rope_meta(m)?;
    let stride = n / nt;
    let row = m.n_head * m.hd;
    if stride < row || x_len < n || pos_len < nt {
        return Err(BackendError::sizes(
            "rope",
            format!(
                "{x_len} values for {nt} rows of {stride} (heads need {row}), {pos_len} positions"
            ),
        ));
    }
    Ok(stride)
}

/// RMS norm: `n` outputs in rows of `d` from `x_len` inputs, with a valid epsilon.
pub fn norm(n: usize, d: usize, x_len: usize, eps: f32) -> Result<(), BackendError> {
    if d == 0 || !n.is_multiple_of(d) || x_len < n {
        return Err(BackendError::sizes(
            "rms norm",
            format!("{n} output values in rows of {d} from {x_len} inputs"),
        ));
    }
    eps_ok(eps)
}

/// An RMS norm epsilon: a non-negative number.
pub fn eps_ok(eps: f32) -> Result<(), BackendError> {
    if eps.is_nan() || eps < 0.0 {
        return Err(BackendError::sizes(
            "rms norm",
            format!("eps {eps} is not a non-negative number"),
        ));
    }
    Ok(())
}

/// The scale weight a norm node names, if any.
pub fn norm_weight(meta: &NodeMeta) -> Result<Option<&str>, BackendError> {
    match meta {
        NodeMeta::Norm(m) => Ok(m.weight_name.as_deref()),
        NodeMeta::None => Ok(None),
        other => Err(BackendError::Metadata(format!(
            "norm with foreign metadata {other:?}"
        ))),
    }
}

/// Attention's KV pair: present, two distinct buffers of a pool of `nb`, neither the
/// output.
pub fn attn_kv(
    m: &AttnMeta,
    kv_pair: Option<(usize, usize)>,
    out: usize,
    nb: usize,
) -> Result<(usize, usize), BackendError> {
    let (k_id, v_id) = kv_pair.ok_or(BackendError::KvPair {
        layer: m.layer,
        pair: None,
        problem: String::new(),
    })?;
    if k_id == v_id || k_id == out || v_id == out || k_id >= nb || v_id >= nb {
        return Err(BackendError::KvPair {
            layer: m.layer,
            pair: kv_pair,
            problem: format!("unusable (output buffer {out})"),
        });
    }
    Ok((k_id, v_id))
}

/// Attention's output: `nt` rows of `n_head * hd`.
pub fn attn_out(node: &CNode, m: &AttnMeta, nt: usize, n: usize) -> Result<(), BackendError> {
    if n != nt * m.n_head * m.hd {
        return Err(BackendError::OutputShape {
            shape: node.out_shape,
            expected: format!("[{} x {}, {nt}]", m.n_head, m.hd),
        });
    }
    Ok(())
}

/// A KV store's metadata, for op layer `layer`.
pub fn kv_store_meta(layer: usize, meta: &NodeMeta) -> Result<&KvcacheMeta, BackendError> {
    let NodeMeta::Kvcache(m) = meta else {
        return Err(BackendError::Metadata(format!(
            "KV store without KV metadata: {meta:?}"
        )));
    };
    if m.layer != layer {
        return Err(BackendError::Metadata(format!(
            "op layer {layer} but metadata layer {}",
            m.layer
        )));
    }
    Ok(m)
}

/// A KV store's sources: k rows, v rows, cells. Takes any buffer-id view (ids, or
/// `BufRef`s through `id`) so a host backend checks without collecting: a decode step
/// allocates nothing.
pub fn kv_store_sources<T>(
    bufs: &[T],
    id: impl Fn(&T) -> usize,
) -> Result<[usize; 3], BackendError> {
    match bufs {
        [a, b, c] => Ok([id(a), id(b), id(c)]),
        _ => Err(BackendError::SourceCount {
            sources: 3,
            bufs: bufs.len(),
        }),
    }
}

/// A store's KV pair: present and two distinct buffers of a pool of `nb`.
pub fn kv_pair(
    layer: usize,
    kv_pair: Option<(usize, usize)>,
    nb: usize,
) -> Result<(usize, usize), BackendError> {
    let (k_id, v_id) = kv_pair.ok_or(BackendError::KvPair {
        layer,
        pair: None,
        problem: String::new(),
    })?;
    if k_id == v_id || k_id >= nb || v_id >= nb {
        return Err(BackendError::KvPair {
            layer,
            pair: kv_pair,
            problem: format!("unusable in a pool of {nb}"),
        });
    }
    Ok((k_id, v_id))
}

/// The KV regions of `k_len`/`v_len` values hold `n_ctx` rows of `n_embd`.
pub fn kv_regions(
    layer: usize,
    (k_len, v_len): (usize, usize),
    n_embd: usize,
    n_ctx: usize,
) -> Result<(), BackendError> {
    let need = n_embd * n_ctx;
    if k_len < need || v_len < need {
        return Err(BackendError::KvRegions {
            layer,
            lens: (k_len, v_len),
            n_embd,
            n_ctx,
        });
    }
    Ok(())
}

/// Whether `op` is one that writes no output values of its own (inputs and KV views
/// are filled elsewhere; a KV store writes the regions).
pub fn writes_no_output(op: &Op) -> bool {
    matches!(
        op,
        Op::KvcacheStore { .. } | Op::Input | Op::KvcacheLoad { .. }
    )
}
