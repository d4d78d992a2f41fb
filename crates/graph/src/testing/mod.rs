//! A reference backend for tests, here and in other crates.
//!
//! `RefBackend` runs scalar f32 kernels on the host with its own pool, and claims a
//! configurable subset of ops, so CPU-only CI can exercise multi-backend splits,
//! staging copies, reuse and error paths with real numbers. Two instances built from
//! the same weights compute bit-identical results, which is what lets a split run be
//! compared exactly with an all-CPU run.
//!
//! Id choice: the id space is a file-format contract, so the test backend invents no
//! id. `RefBackend::cpu()` occupies `Backend::CPU`; `RefBackend::test_device()`
//! occupies the `Backend::METAL` slot (priority 300, so it wins assignment for the
//! ops it claims) under the name "test". A test allocator never also holds a real
//! Metal backend, so the slot is free there.

pub mod cases;
mod declining;
mod kernels;
mod recurrent;

pub use declining::Declining;

use crate::pool::HostPool;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use minfer_gguf::GgufFile;

use crate::backend::{BackendImpl, SplitSpan};
use crate::backend_error::BackendError;
use crate::ir::{Backend, BufRef, CNode, DType, FusedOp, NodeMeta, Op};

/// A weight in memory order `[out][in]`; a vector is stored with `in_dim == len`, `out_dim == 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct RefWeight {
    /// Row-major `[out_dim][in_dim]` values.
    pub data: Vec<f32>,
    /// Input features (GGUF `shape[0]`).
    pub in_dim: usize,
    /// Output features (GGUF `shape[1]`).
    pub out_dim: usize,
}

/// Named f32 weights shared by every reference backend of a test.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightStore {
    map: BTreeMap<String, RefWeight>,
}

impl WeightStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a matrix of GGUF shape `[in_dim, out_dim]`; `data.len()` must be their product.
    pub fn insert(&mut self, name: &str, in_dim: usize, out_dim: usize, data: Vec<f32>) {
        assert_eq!(data.len(), in_dim * out_dim, "weight '{name}' size");
        self.map.insert(
            name.to_string(),
            RefWeight {
                data,
                in_dim,
                out_dim,
            },
        );
    }

    /// Adds a vector (norm scale, bias).
    pub fn insert_vec(&mut self, name: &str, data: Vec<f32>) {
        let n = data.len();
        self.insert(name, n, 1, data);
    }

    /// The weight called `name`.
    pub fn get(&self, name: &str) -> Option<&RefWeight> {
        self.map.get(name)
    }

    /// Adds every tensor of `file` not yet present, dequantized to f32 (the reference
    /// keeps no quantized data); returns how many were added.
    pub fn insert_gguf(&mut self, file: &GgufFile) -> Result<usize, String> {
        let mut added = 0;
        for t in file.tensors() {
            if self.map.contains_key(&t.name) {
                continue;
            }
            let dims: Vec<usize> = t
                .dims
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<_, _>>()
                .map_err(|_| format!("tensor '{}': dims {:?} overflow", t.name, t.dims))?;
            let (in_dim, out_dim) = match dims[..] {
                [n] => (n, 1),
                [i, o] => (i, o),
                // Stacked experts: expert `e` is rows `e * o .. (e + 1) * o`.
                [i, o, e] => (i, o * e),
                _ => {
                    return Err(format!(
                        "tensor '{}': {} dims, not 1, 2 or 3",
                        t.name,
                        dims.len()
                    ))
                }
            };
            let data = minfer_gguf::quant::dequantize_to_vec(
                t.ggml_type,
                file.tensor_data(t),
                in_dim * out_dim,
            )
            .map_err(|e| format!("tensor '{}': {e}", t.name))?;
            self.insert(&t.name, in_dim, out_dim, data);
            added += 1;
        }
        Ok(added)
    }
}

/// Op names the reference kernels implement.
pub const IMPLEMENTED: &[&str] = &[
    "input",
    "add",
    "mul",
    "scale",
    "silu",
    "gelu",
    "softcap",
    "softmax",
    "rms_norm",
    "layer_norm",
    "qk_norm",
    "matmul",
    "get_rows",
    "rope",
    "attn",
    "kvcache_store",
    "kvcache_load",
    "view",
    "reshape",
    "permute",
    "swiglu",
    "geglu",
    "fused_ffn",
    "top_k",
    "mul_mat_id",
    "mul_mat_id_swiglu",
    "moe_sum",
    "mul_sigmoid",
    "sigmoid_gate",
    "slice",
    "ssm_conv",
    "delta_net",
];

/// A host backend with scalar kernels and a configurable claim set.
#[derive(Debug)]
pub struct RefBackend {
    id: Backend,
    name: String,
    claims: BTreeSet<&'static str>,
    fused: bool,
    attn_span: bool,
    gpu: bool,
    fail_on: Option<String>,
    mem: HostPool,
    weights: Arc<WeightStore>,
    trace: RefTrace,
    max_elems: usize,
    /// The split the scheduler opened, and where every opened split is logged.
    split: Option<SplitSpan>,
    split_log: Option<Arc<Mutex<Vec<SplitSpan>>>>,
}

/// How the per-node trace reads a [`RefBackend`]'s outputs.
#[derive(Debug, Clone)]
enum RefTrace {
    /// In place, as a host backend.
    Host,
    /// As a device backend: staged, then collected once per split (counted here).
    Staged(Arc<std::sync::atomic::AtomicUsize>),
    /// Not at all: neither host-visible to the trace nor staged.
    Hidden,
}

/// What a staging [`RefBackend`] keeps in a trace's staging: copies taken at stage time.
#[derive(Debug, Default)]
struct RefStaged(Vec<(crate::ir::NodeId, Vec<f32>)>);

impl RefBackend {
    /// A backend on `id` called `name`, claiming every implemented op, fusing SwiGLU.
    pub fn new(id: Backend, name: &str) -> Self {
        RefBackend {
            id,
            name: name.to_string(),
            claims: IMPLEMENTED.iter().copied().collect(),
            fused: true,
            attn_span: true,
            gpu: false,
            fail_on: None,
            mem: HostPool::new(),
            weights: Arc::new(WeightStore::new()),
            trace: RefTrace::Host,
            max_elems: usize::MAX,
            split: None,
            split_log: None,
        }
    }

    /// Logs every split the scheduler opens here into `log`, in order.
    pub fn logging_splits(mut self, log: Arc<Mutex<Vec<SplitSpan>>>) -> Self {
        self.split_log = Some(log);
        self
    }

    /// Shows the per-node trace no buffer, as a device backend: outputs are staged and
    /// handed over at the end of each split, each collection counted in `collects`.
    pub fn with_staged_trace(mut self, collects: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        self.trace = RefTrace::Staged(collects);
        self
    }

    /// Shows the per-node trace nothing and stages nothing (a backend without support).
    pub fn hidden_from_trace(mut self) -> Self {
        self.trace = RefTrace::Hidden;
        self
    }

    /// Holds no buffer above `elems` f32s ([`BackendImpl::max_buffer_elems`]), as a
    /// device with a small buffer limit.
    pub fn with_max_buffer_elems(mut self, elems: usize) -> Self {
        self.max_elems = elems;
        self
    }

    /// The stand-in CPU: `Backend::CPU`, every implemented op.
    pub fn cpu() -> Self {
        Self::new(Backend::CPU, "cpu-ref")
    }

    /// The stand-in device: the `Backend::METAL` slot, named "test".
    pub fn test_device() -> Self {
        Self::new(Backend::METAL, "test")
    }

    /// Claims only `ops` (by `Op::name`); unimplemented names are ignored.
    pub fn claiming(mut self, ops: &[&str]) -> Self {
        self.claims = IMPLEMENTED
            .iter()
            .copied()
            .filter(|n| ops.contains(n))
            .collect();
        self
    }

    /// Uses `weights` for matmuls, norms, embeddings and biases.
    pub fn with_weights(mut self, weights: Arc<WeightStore>) -> Self {
        self.weights = weights;
        self
    }

    /// Whether `supports_fused(SwiGLU)` answers yes.
    pub fn with_fusion(mut self, on: bool) -> Self {
        self.fused = on;
        self
    }

    /// Whether `is_gpu` answers yes (tests of the flags derived from a GPU backend).
    pub fn as_gpu(mut self, on: bool) -> Self {
        self.gpu = on;
        self
    }

    /// Whether explicit-span attention is claimed.
    pub fn with_attn_span(mut self, on: bool) -> Self {
        self.attn_span = on;
        self
    }

    /// Makes every node of op `name` fail at execution (error-path tests).
    pub fn failing_on(mut self, name: &str) -> Self {
        self.fail_on = Some(name.to_string());
        self
    }

    fn buf(&self, id: usize) -> Result<&Vec<f32>, BackendError> {
        self.mem
            .buffers
            .get(id)
            .ok_or(BackendError::NoSuchBuffer { id })
    }
}

impl BackendImpl for RefBackend {
    fn id(&self) -> Backend {
        self.id
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        self.claims.contains(op.name())
            && (matches!(op, Op::Input | Op::TopK { .. }) || dtype == DType::F32)
    }

    fn max_buffer_elems(&self) -> usize {
        self.max_elems
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        match fused {
            FusedOp::SwiGLU => self.fused && self.claims.contains("swiglu"),
            FusedOp::GeGLU => self.fused && self.claims.contains("geglu"),
            FusedOp::DecodeFfn => self.fused && self.claims.contains("fused_ffn"),
            // The reference kernels implement no fused QKV op.
            FusedOp::DecodeQkv => false,
        }
    }

    fn supports_attn_span(&self) -> bool {
        self.attn_span
    }

    fn is_gpu(&self) -> bool {
        self.gpu
    }

    fn register_gguf(&mut self, file: &Arc<GgufFile>) -> Result<usize, BackendError> {
        Ok(Arc::make_mut(&mut self.weights).insert_gguf(file)?)
    }

    crate::host_pool_methods!(mem);

    fn begin_split(&mut self, split: SplitSpan) -> Result<(), BackendError> {
        // A split that failed was never closed: opening the next one replaces it.
        self.split = Some(split);
        if let Some(log) = &self.split_log {
            log.lock().map_err(|_| "split log poisoned")?.push(split);
        }
        Ok(())
    }

    fn end_split(&mut self) -> Result<(), BackendError> {
        self.split = None;
        Ok(())
    }

    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        // The split contract: inside an open split, only its nodes execute.
        if let Some(s) = self
            .split
            .filter(|s| !(s.nodes.0..s.nodes.1).contains(&node.id))
        {
            return Err(format!(
                "node {} executed inside split {} of nodes {}..{}",
                node.id, s.index, s.nodes.0, s.nodes.1
            )
            .into());
        }
        if self.fail_on.as_deref() == Some(node.op.name()) {
            return Err(BackendError::Unsupported {
                op: node.op.name().to_string(),
                detail: format!("is refused by the {} backend by configuration", self.name),
            });
        }
        if in_bufs.len() != node.src.len() {
            return Err(BackendError::SourceCount {
                sources: node.src.len(),
                bufs: in_bufs.len(),
            });
        }
        // Snapshot inputs: an aliased in-place op reads and writes the same buffer.
        let mut inputs = Vec::with_capacity(in_bufs.len());
        for (b, &s) in in_bufs.iter().zip(&node.src) {
            let is_view = matches!(node.op, Op::Attn { .. }) && inputs.len() == 1;
            if is_view {
                inputs.push(Vec::new()); // the KV view; attention reads kv_pair
                continue;
            }
            if b.backend != self.id {
                return Err(format!("input node {s} lives on {}, not here", b.backend).into());
            }
            inputs.push(self.buf(b.id)?.clone());
        }
        let weights = Arc::clone(&self.weights);
        match &node.op {
            Op::Input | Op::KvcacheLoad { .. } => Ok(()),
            Op::KvcacheStore { .. } => {
                let (k, v) = kv_pair.ok_or("no KV pair for the store")?;
                Ok(kernels::kv_store(
                    node,
                    &inputs,
                    &mut self.mem.buffers,
                    k,
                    v,
                )?)
            }
            Op::Attn { .. } => {
                let (k, v) = kv_pair.ok_or("no KV pair for attention")?;
                let out = kernels::attn(node, &inputs, self.buf(k)?, self.buf(v)?, &self.weights)?;
                self.write_out(out_buf.id, out)
            }
            Op::SsmConv { .. } | Op::DeltaNet { .. } => {
                let (conv, ssm) = kv_pair.ok_or("no recurrent state region")?;
                let NodeMeta::Recurrent(m) = &node.meta else {
                    return Err(format!("{} without recurrent metadata", node.op.name()).into());
                };
                let nt = node.out_shape[1].max(1);
                let src = |i: usize| inputs.get(i).ok_or_else(|| format!("missing source {i}"));
                let weight = |name: &str| {
                    weights
                        .get(name)
                        .map(|w| w.data.clone())
                        .ok_or_else(|| format!("weight '{name}' is not registered"))
                };
                let is_conv = matches!(node.op, Op::SsmConv { .. });
                let (pos, slots) = if is_conv {
                    (src(1)?, src(2)?)
                } else {
                    (src(3)?, src(4)?)
                };
                let toks = recurrent::token_slots(m, pos, slots, nt)?;
                let id = if is_conv { conv } else { ssm };
                let mut state = std::mem::take(
                    self.mem
                        .buffers
                        .get_mut(id)
                        .ok_or(BackendError::NoSuchBuffer { id })?,
                );
                let out = if is_conv {
                    let w = weight(&m.conv_weight)?;
                    recurrent::ssm_conv(m, src(0)?, &toks, &mut state, &w)
                } else {
                    let a = weight(&m.a_weight)?;
                    let dt = m.dt_bias.as_deref().map(weight).transpose()?;
                    let (q, al, be) = (src(0)?, src(1)?, src(2)?);
                    let weights = [Some(a.as_slice()), dt.as_deref()];
                    recurrent::delta_net(m, [q, al, be], &toks, &mut state, weights)
                };
                self.mem.buffers[id] = state;
                self.write_out(out_buf.id, out?)
            }
            _ => {
                let out = kernels::compute(node, &inputs, &weights)?;
                self.write_out(out_buf.id, out)
            }
        }
    }

    fn read_host(&self, id: usize) -> Option<&[f32]> {
        self.mem.read(id)
    }

    fn supports_trace(&self) -> bool {
        !matches!(self.trace, RefTrace::Hidden)
    }

    fn trace_view(&self, id: usize) -> Option<&[f32]> {
        match self.trace {
            RefTrace::Host => self.read_host(id),
            RefTrace::Staged(_) | RefTrace::Hidden => None,
        }
    }

    fn trace_stage(
        &mut self,
        staging: &mut crate::trace::TraceStaging,
        node: crate::ir::NodeId,
        id: usize,
        len: usize,
        _read: &mut dyn FnMut(crate::ir::NodeId, &[f32]),
    ) -> Result<(), BackendError> {
        if !matches!(self.trace, RefTrace::Staged(_)) {
            return Err(format!("the {} backend stages no trace copies", self.name).into());
        }
        let b = self.buf(id)?;
        let v = b[..len.min(b.len())].to_vec();
        staging.state_mut::<RefStaged>().0.push((node, v));
        Ok(())
    }

    fn trace_collect(
        &mut self,
        staging: &mut crate::trace::TraceStaging,
        read: &mut dyn FnMut(crate::ir::NodeId, &[f32]),
    ) -> Result<(), BackendError> {
        // A traced split ends here instead of in `end_split`.
        self.split = None;
        if let RefTrace::Staged(n) = &self.trace {
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        for (node, v) in std::mem::take(&mut staging.state_mut::<RefStaged>().0) {
            read(node, &v);
        }
        Ok(())
    }

    fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), BackendError> {
        self.mem.write(id, data)
    }

    fn write_host_window(
        &mut self,
        id: usize,
        offset: usize,
        data: &[f32],
    ) -> Result<(), BackendError> {
        self.mem.write_window(id, offset, data)
    }

    fn synchronize(&mut self) {}
}

impl RefBackend {
    fn write_out(&mut self, id: usize, out: Vec<f32>) -> Result<(), BackendError> {
        let b = self
            .mem
            .buffers
            .get_mut(id)
            .ok_or(BackendError::NoSuchBuffer { id })?;
        if b.len() < out.len() {
            return Err(BackendError::OutputTooSmall {
                holds: b.len(),
                needs: out.len(),
            });
        }
        b[..out.len()].copy_from_slice(&out);
        Ok(())
    }
}
