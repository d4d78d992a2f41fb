//! The node dispatch of a device backend: the prologue (buffers resolved and checked,
//! see [`NodeBufs`]), the checks every device makes the same way, then the op
//! family's method, which the backend implements beside that family's kernels (one
//! trait per family), and the epilogue (the output is no longer what the host wrote).

use super::checks;
use super::node::NodeBufs;
use super::pool::DeviceHost;
use crate::backend_error::BackendError;
use crate::ir::{BufRef, CNode, Op};
use crate::meta::{
    AttnMeta, EmbedMeta, FusedFfnMeta, FusedQkvMeta, FusedQkvNormMeta, KvcacheMeta, MatMulMeta,
    NodeMeta, QkvBiasRopeStoreMeta, RoPEMeta,
};

/// One node being executed: the node, its checked buffers and its layer's KV pair.
#[derive(Debug)]
pub struct NodeCall<'a> {
    /// The node.
    pub node: &'a CNode,
    /// Its buffers as pool ids.
    pub io: NodeBufs,
    /// The layer's KV regions (k, v), for ops that touch them.
    pub kv_pair: Option<(usize, usize)>,
    /// The KV layer the op names (stores and the QKV fusions; 0 for other ops).
    pub layer: usize,
}

/// One matrix product: the weight, its dims, and where its rows land in the output.
#[derive(Debug, Clone, Copy)]
pub struct MatmulPlan<'a> {
    /// Weight name.
    pub name: &'a str,
    /// Input features.
    pub in_dim: usize,
    /// Output features.
    pub out_dim: usize,
    /// Bias vector name.
    pub bias: Option<&'a str>,
    /// Values between token rows of the output.
    pub y_stride: usize,
    /// First output column written.
    pub y_off: usize,
    /// The input already holds the activations rounded for this weight's type (a
    /// backend that rounds once for several products of one input says so).
    pub rounded: bool,
}

impl<'a> MatmulPlan<'a> {
    /// The product of a `MatMul` node: dense output rows.
    pub fn of(m: &'a MatMulMeta) -> Self {
        Self {
            name: &m.weight_name,
            in_dim: m.in_dim,
            out_dim: m.out_dim,
            bias: m.bias_name.as_deref(),
            y_stride: m.out_dim,
            y_off: 0,
            rounded: false,
        }
    }

    /// The two products of a `FusedFFN` node: gate into columns `0..nf` of each row,
    /// up into `nf..2nf`.
    pub fn ffn(m: &'a FusedFfnMeta) -> [Self; 2] {
        let half = |name: &'a str, y_off| Self {
            name,
            in_dim: m.n_embd,
            out_dim: m.nf,
            bias: None,
            y_stride: 2 * m.nf,
            y_off,
            rounded: false,
        };
        [half(&m.gate_weight, 0), half(&m.up_weight, m.nf)]
    }

    /// Checks a weight of `[w_in, w_out]`, an input of `x_len` values and an output
    /// buffer of `out_len` for `nt` tokens; returns the input's row stride.
    pub fn check(
        &self,
        w: (usize, usize),
        x_len: usize,
        nt: usize,
        out_len: usize,
    ) -> Result<usize, BackendError> {
        checks::matmul_weight(self.name, w, (self.in_dim, self.out_dim))?;
        let stride = checks::matmul_input(self.name, x_len, nt, self.in_dim)?;
        let cols = (self.y_off, self.out_dim, self.y_stride);
        checks::matmul_output(self.name, cols, out_len, nt)?;
        Ok(stride)
    }
}

/// One decode QKV fusion (`FusedQKV`, or `FusedQkvNorm` with `norms`): the q|k|v
/// weight, the geometry, the optional biases and per-head norms, and the rope.
#[derive(Debug, Clone, Copy)]
pub struct QkvPlan<'a> {
    /// The layer (its KV regions).
    pub layer: usize,
    /// The q|k|v concatenation's name.
    pub weight: &'a str,
    /// Input features.
    pub n_embd: usize,
    /// q columns.
    pub nqt: usize,
    /// k (and v) columns.
    pub nkt: usize,
    /// q, k and v bias names.
    pub biases: [Option<&'a str>; 3],
    /// q and k norm weights and their epsilon (Qwen3).
    pub norms: Option<([&'a str; 2], f32)>,
    /// The rope of q (k's has `nkt / hd` heads).
    pub rope: &'a RoPEMeta,
    /// KV rows.
    pub n_ctx: usize,
}

impl<'a> QkvPlan<'a> {
    /// The plan of a `FusedQKV` node.
    pub fn qkv(layer: usize, m: &'a FusedQkvMeta) -> Self {
        Self {
            layer,
            weight: &m.qkv_weight,
            n_embd: m.n_embd,
            nqt: m.nqt,
            nkt: m.nkt,
            biases: [
                m.q_bias.as_deref(),
                m.k_bias.as_deref(),
                m.v_bias.as_deref(),
            ],
            norms: None,
            rope: &m.rope,
            n_ctx: m.n_ctx,
        }
    }

    /// The plan of a `FusedQkvNorm` node.
    pub fn qkv_norm(layer: usize, m: &'a FusedQkvNormMeta) -> Self {
        Self {
            layer,
            weight: &m.qkv_weight,
            n_embd: m.n_embd,
            nqt: m.nqt,
            nkt: m.nkt,
            biases: [None; 3],
            norms: Some(([&m.q_norm, &m.k_norm], m.eps)),
            rope: &m.rope,
            n_ctx: m.n_ctx,
        }
    }
}

/// A one-value-in, one-value-out op with its constant, checked (a soft-cap is positive).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    /// `x * s` (`Op::Scale`).
    Scale(f32),
    /// Tanh-approximated GELU (`Op::Gelu`).
    Gelu,
    /// `c * tanh(x / c)` (`Op::SoftCap`).
    SoftCap(f32),
}

/// Element-wise and row-wise ops; each is called after the kit's checks of its sizes.
pub trait ElementwiseOps {
    /// `Add` / `Mul` (sizes checked: the second source broadcasts over the first).
    fn binary(&mut self, c: &NodeCall) -> Result<(), BackendError>;
    /// `Silu` (sizes checked).
    fn silu(&mut self, c: &NodeCall) -> Result<(), BackendError>;
    /// `SwiGLU` (sizes checked).
    fn swiglu(&mut self, c: &NodeCall) -> Result<(), BackendError>;
    /// `Scale`, `Gelu` and `SoftCap` (sizes and the constant checked).
    fn unary(&mut self, c: &NodeCall, f: Unary) -> Result<(), BackendError>;
    /// `GeGLU`: `gelu(gate) * up` (sizes checked).
    fn geglu(&mut self, c: &NodeCall) -> Result<(), BackendError>;
    /// `MulSigmoid`: rows of `d` values times the sigmoid of their row's gate (sizes
    /// checked).
    fn mul_sigmoid(&mut self, c: &NodeCall, d: usize) -> Result<(), BackendError>;
    /// `RmsNorm` (rows of `d`, the output's width) and `QkNorm` (rows of a head).
    fn rms_norm(&mut self, c: &NodeCall, d: usize, eps: f32) -> Result<(), BackendError>;
    /// `GetRows` over values: rows of `d` of the first source (`rows` of them) at the
    /// row ids of buffer `sel`, checked on the host.
    fn get_rows(
        &mut self,
        c: &NodeCall,
        d: usize,
        rows: usize,
        sel: usize,
    ) -> Result<(), BackendError>;
    /// `RoPE` in token rows of `stride` (metadata and sizes checked).
    fn rope(&mut self, c: &NodeCall, m: &RoPEMeta, stride: usize) -> Result<(), BackendError>;
}

/// Matrix products and weight lookups.
pub trait MatmulOps {
    /// `MatMul` (the output's size checked against the weight's rows).
    fn matmul(&mut self, c: &NodeCall, m: &MatMulMeta) -> Result<(), BackendError>;
    /// `FusedFFN` (the output's size checked).
    fn fused_ffn(&mut self, c: &NodeCall, m: &FusedFfnMeta) -> Result<(), BackendError>;
    /// `GetRows` over a weight table (the embedding).
    fn embed(&mut self, c: &NodeCall, m: &EmbedMeta) -> Result<(), BackendError>;
}

/// The decode QKV fusions.
pub trait FusedOps {
    /// `FusedQKV` and `FusedQkvNorm`.
    fn fused_qkv(&mut self, c: &NodeCall, p: &QkvPlan) -> Result<(), BackendError>;
    /// `QkvBiasRopeStore` of `c.layer`.
    fn bias_rope_store(
        &mut self,
        c: &NodeCall,
        m: &QkvBiasRopeStoreMeta,
    ) -> Result<(), BackendError>;
}

/// The KV cache: stores and attention.
pub trait KvOps {
    /// `KvcacheStore` of `c.layer` (its metadata checked against it).
    fn kv_store(&mut self, c: &NodeCall, m: &KvcacheMeta) -> Result<(), BackendError>;
    /// `Attn` over the layer's regions.
    fn attn(&mut self, c: &NodeCall, m: &AttnMeta, explicit_span: bool)
        -> Result<(), BackendError>;
}

/// Executes `node` on backend `b`: the prologue, the shared checks, the op family's
/// method, and the epilogue (the output, and nothing else, was written by a kernel).
pub fn run<B>(
    b: &mut B,
    node: &CNode,
    in_bufs: &[BufRef],
    out_buf: BufRef,
    kv_pair: Option<(usize, usize)>,
) -> Result<(), BackendError>
where
    B: DeviceHost + ElementwiseOps + MatmulOps + FusedOps + KvOps + ?Sized,
{
    let io = NodeBufs::resolve(b.device_pool(), node, in_bufs, out_buf)?;
    let pool = b.device_pool();
    let (n, nt, out) = (io.n, io.nt, io.out);
    let (len0, len1) = (io.len(0, pool), io.len(1, pool));
    let layer = node.op.kv_layer().unwrap_or(0);
    let c = NodeCall {
        node,
        io,
        kv_pair,
        layer,
    };
    match (&node.op, &node.meta) {
        (Op::Input | Op::KvcacheLoad { .. }, _) => return Ok(()),
        (Op::Add | Op::Mul, _) => {
            checks::binary(node, len0, len1, n)?;
            b.binary(&c)?;
        }
        (Op::Silu, _) => {
            checks::silu(len0, n)?;
            b.silu(&c)?;
        }
        (Op::SwiGLU, _) => {
            checks::swiglu(len0, len1, n)?;
            b.swiglu(&c)?;
        }
        (Op::GeGLU, _) => {
            checks::gated("geglu", len0, len1, n)?;
            b.geglu(&c)?;
        }
        (Op::MulSigmoid, _) => {
            let d = node.out_shape[0];
            checks::mul_sigmoid(d, len0, len1, n)?;
            b.mul_sigmoid(&c, d)?;
        }
        (Op::Scale(s), _) => {
            checks::unary("scale", len0, n)?;
            b.unary(&c, Unary::Scale(*s))?;
        }
        (Op::Gelu, _) => {
            checks::unary("gelu", len0, n)?;
            b.unary(&c, Unary::Gelu)?;
        }
        (Op::SoftCap(cap), _) => {
            checks::unary("softcap", len0, n)?;
            b.unary(&c, Unary::SoftCap(checks::softcap(*cap)?))?;
        }
        (Op::RmsNorm { eps }, _) => b.rms_norm(&c, node.out_shape[0], *eps)?,
        (Op::QkNorm { hd, eps, .. }, _) => b.rms_norm(&c, *hd, *eps)?,
        (Op::MatMul { .. }, NodeMeta::MatMul(m)) => {
            checks::matmul_node(node, m, nt, n)?;
            b.matmul(&c, m)?;
        }
        (Op::FusedFFN, NodeMeta::FusedFfn(m)) => {
            checks::fused_ffn(node, m.nf, nt, n)?;
            b.fused_ffn(&c, m)?;
        }
        (Op::FusedQKV { layer }, NodeMeta::FusedQkv(m)) => {
            b.fused_qkv(&c, &QkvPlan::qkv(*layer, m))?;
        }
        (Op::FusedQkvNorm { layer }, NodeMeta::FusedQkvNorm(m)) => {
            b.fused_qkv(&c, &QkvPlan::qkv_norm(*layer, m))?;
        }
        (Op::QkvBiasRopeStore { .. }, NodeMeta::QkvBiasRopeStore(m)) => {
            b.bias_rope_store(&c, m)?;
        }
        (Op::GetRows, NodeMeta::Embed(m)) => b.embed(&c, m)?,
        (Op::GetRows, _) => {
            let d = node.out_shape[0];
            let rows = len0.checked_div(d).unwrap_or(0);
            checks::get_rows(d, n, nt)?;
            let sel = *c
                .io
                .ids
                .get(1)
                .ok_or(BackendError::MissingSource("get_rows needs 2 sources"))?;
            checks::row_ids(&pool.host_ints(sel, nt, "row ids")?, rows)?;
            b.get_rows(&c, d, rows, sel)?;
        }
        (Op::RoPE { style, .. }, NodeMeta::Rope(m)) => {
            let stride = checks::rope_node(*style, m, (n, nt), len0, len1)?;
            b.rope(&c, m, stride)?;
        }
        (Op::KvcacheStore { layer }, meta) => {
            let m = checks::kv_store_meta(*layer, meta)?;
            return b.kv_store(&c, m);
        }
        (Op::Attn { explicit_span, .. }, NodeMeta::Attn(m)) => {
            b.attn(&c, m, *explicit_span)?;
        }
        (op, meta) => {
            return Err(BackendError::Unsupported {
                op: op.name().to_string(),
                detail: format!(
                    "with metadata {meta:?} is not implemented by the {} backend",
                    pool.label()
                ),
            })
        }
    }
    b.device_pool_mut().written_by_device(out);
    Ok(())
}
