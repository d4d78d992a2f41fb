//! `CpuBackend`: the graph backend that executes nodes on the host with the kernels of
//! [`crate::ops`] and [`crate::matmul`] over one persistent [`ThreadPool`].
//!
//! - Pool: `Vec<Vec<f32>>` plus a free list. `alloc_buffer` reuses a free id of exactly
//!   the requested length (zero-filled), `alloc_fresh` always appends, `free_buffer` only
//!   returns the id.
//! - Weights: resolved by name in a [`WeightRegistry`] (zero-copy over the mapped GGUF).
//! - Aliasing: Silu and RoPE run in place when the allocator gave them their input's
//!   buffer; any other node whose input is its own output buffer reads a snapshot.
//! - Scratch (activation quantization, packed rows, rope angles, attention scores) lives
//!   in the backend and only grows, so steady-state decode allocates nothing per node.
//! - Errors: every violated kernel invariant is an `Err` naming the node and the values.
//! - Unwinding: a node moves its output buffer (and a KV store its regions) out of the
//!   pool while it runs; a panic inside the kernel, on any pool thread, puts them back
//!   before it propagates, so the pool stays whole and the next execution is sound.

mod experts;
mod matmul_node;
mod qkv;
mod weights;

use experts::Experts;
use matmul_node::{matmul_group, matmul_named, Epilogue, MatIn};
use qkv::{fused_qkv_compute, qkv_part_names, qkv_plan, QkvCx, QkvIo};

use minfer_graph::device_kit::checks;
use minfer_graph::HostPool;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;

use minfer_gguf::GgufFile;
use minfer_graph::{
    Backend, BackendError, BackendImpl, BufRef, CNode, DType, FusedOp, KvType, NodeMeta, Op,
};

use crate::matmul::{IdScratch, MatmulScratch};
use crate::ops::attn::{self, AttnArgs, AttnScratch};
use crate::ops::elementwise::{self as ew, BinOp};
use crate::ops::get_rows::{self, Table};
use crate::ops::vec::VecIsa;
use crate::ops::{kv, layout, moe, norm, recurrent, rope};
use crate::threadpool::ThreadPool;

pub use weights::{Weight, WeightError, WeightRegistry};

/// Reusable per-node working memory.
#[derive(Debug, Default)]
struct Scratch {
    matmul: MatmulScratch,
    /// Copy of an output buffer that a non-in-place node also reads.
    snap: Vec<f32>,
    /// Matmul input rows repacked from a wider (fused) buffer.
    packed: Vec<f32>,
    rope: Vec<f32>,
    attn: AttnScratch,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// K and V rows of a fused QKV node gathered for the KV store (several tokens).
    k_rows: Vec<f32>,
    v_rows: Vec<f32>,
    /// Expert ids of an expert-routed matmul, and its activation and grouping buffers.
    expert_ids: Vec<u32>,
    experts: IdScratch,
}

/// The fault hook, shared with the engine through the backend seam.
#[doc(hidden)]
pub use minfer_graph::FaultInjector;

/// The injected fault: half an output written, then a panic on a pool thread.
fn injected_panic(pool: &ThreadPool, node: &CNode, out: &mut [f32]) {
    let half = out.len() / 2;
    out[..half].fill(f32::NAN);
    pool.run(&|ith, nth| {
        if ith + 1 == nth {
            panic!("injected kernel fault in node {} '{}'", node.id, node.name);
        }
    });
}

/// The CPU graph backend (id [`Backend::CPU`], name "cpu").
pub struct CpuBackend {
    pool: ThreadPool,
    isa: VecIsa,
    mem: HostPool,
    weights: WeightRegistry,
    scratch: Scratch,
    /// Use the repacked matmul layout where a weight type has one
    /// ([`minfer_graph::BackendOptions::repack`]).
    repack: bool,
    fault: FaultInjector,
    /// Storage formats of the K and V regions (per backend, so per engine: ADR-0006).
    kv_types: [KvType; 2],
    /// The decode fusions this backend claims
    /// ([`minfer_graph::BackendOptions::fusions`]): QKV, FFN.
    fuse: Fusions,
    /// The q, k and v weight names behind each q|k|v concatenation name a fused node
    /// references, resolved on first use so decode steps do not allocate.
    qkv_parts: std::collections::HashMap<String, [String; 3]>,
}

/// Which decode fusions the CPU backend executes (and so reports in `supports_fused`).
pub use minfer_graph::Fusions;

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("threads", &self.pool.n_threads())
            .field("isa", &self.isa)
            .field("buffers", &self.mem.buffers.len())
            .field("free", &self.mem.free_len())
            .field("weights", &self.weights)
            .finish_non_exhaustive()
    }
}

impl CpuBackend {
    /// A backend running its kernels on `n_threads` threads (at least 1), with the
    /// default options (repacking on, no fusions).
    pub fn new(n_threads: usize) -> Self {
        CpuBackend {
            pool: ThreadPool::new(n_threads),
            isa: VecIsa::detect(),
            mem: HostPool::with_on_fresh(crate::hugemem::advise_huge),
            weights: WeightRegistry::default(),
            scratch: Scratch::default(),
            repack: true,
            fault: FaultInjector::default(),
            kv_types: [KvType::F32; 2],
            fuse: Fusions::NONE,
            qkv_parts: std::collections::HashMap::new(),
        }
    }

    /// Sets the decode fusions this backend claims (none unless set). Set it before the
    /// engine derives its graph parameters from the backend.
    pub fn set_fusions(&mut self, f: Fusions) {
        self.fuse = f;
    }

    /// Stores K rows as `k` and V rows as `v` (F32 unless set). Set it before the first
    /// graph is allocated: the allocator sizes the regions from it once.
    pub fn set_kv_types(&mut self, k: KvType, v: KvType) {
        self.kv_types = [k, v];
    }

    /// The backend built through the registry: `cfg.n_threads` threads, armed by
    /// `cfg.fault`, with the fusions and repacking `cfg.options` asks for.
    pub fn from_config(cfg: &minfer_graph::BackendConfig) -> Self {
        let mut b = Self::new(cfg.n_threads);
        b.fault = cfg.fault.clone();
        b.set_kv_types(cfg.kv_types[0], cfg.kv_types[1]);
        b.set_fusions(cfg.options.fusions);
        b.set_repack(cfg.options.repack);
        b
    }

    /// A handle that arms a panic inside a later node's kernel (unwind-safety tests).
    #[doc(hidden)]
    pub fn fault_injector(&self) -> FaultInjector {
        self.fault.clone()
    }

    /// Turns the repacked matmul layout on or off (on unless set).
    pub fn set_repack(&mut self, on: bool) {
        self.repack = on;
    }

    /// Threads per parallel kernel.
    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Forces the attention vector primitives' implementation (tests compare them).
    pub fn set_vec_isa(&mut self, isa: VecIsa) {
        self.isa = isa;
    }

    /// Registers every tensor of `file` under `namespace + name` without copying its data;
    /// names already registered are skipped. Returns how many were added.
    pub fn register_gguf(
        &mut self,
        file: Arc<GgufFile>,
        namespace: &str,
    ) -> Result<usize, WeightError> {
        self.weights.register_gguf(&file, namespace)
    }

    /// Registers owned f32 values of GGUF dims `dims` (`[in, out]`, or `[n]` for a vector);
    /// returns `false` when the name was already registered (the first one stays).
    pub fn register_f32(
        &mut self,
        name: &str,
        dims: &[usize],
        data: Vec<f32>,
    ) -> Result<bool, WeightError> {
        self.weights.register_f32(name, dims, data)
    }

    /// The weight registry.
    pub fn weights(&self) -> &WeightRegistry {
        &self.weights
    }

    fn run(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        minfer_graph::device_kit::node::check_sources(node, in_bufs)?;
        let foreign = |what: String, b: BufRef, count: usize| BackendError::ForeignBuffer {
            what,
            id: b.id,
            owner: b.backend,
            pool: "cpu".into(),
            count,
        };
        let is_attn = matches!(node.op, Op::Attn { .. });
        for (i, b) in in_bufs.iter().enumerate() {
            // Attention's second source is the KV view; the kernel reads `kv_pair` instead.
            if is_attn && i == 1 {
                continue;
            }
            if b.backend != Backend::CPU || b.id >= self.mem.buffers.len() {
                return Err(foreign(format!("source {i}"), *b, self.mem.buffers.len()));
            }
        }
        if out_buf.backend != Backend::CPU || out_buf.id >= self.mem.buffers.len() {
            return Err(foreign(
                "the output".into(),
                out_buf,
                self.mem.buffers.len(),
            ));
        }
        match node.op {
            Op::Input | Op::KvcacheLoad { .. } => return Ok(()),
            Op::KvcacheStore { layer } => return self.kv_store(node, layer, in_bufs, kv_pair),
            Op::FusedQKV { layer } | Op::FusedQkvNorm { layer } => {
                return Ok(self.fused_qkv(node, layer, in_bufs, out_buf.id, kv_pair)?);
            }
            Op::SsmConv { .. } | Op::DeltaNet { .. } => {
                return Ok(self.recurrent(node, in_bufs, out_buf.id, kv_pair)?);
            }
            _ => {}
        }
        let out_id = out_buf.id;
        let mut out = std::mem::take(&mut self.mem.buffers[out_id]);
        let r = catch_unwind(AssertUnwindSafe(|| {
            if self.fault.fire() {
                injected_panic(&self.pool, node, &mut out);
            }
            self.compute(node, in_bufs, out_id, &mut out, kv_pair)
        }));
        // Back into the pool before anything else, unwinding included.
        self.mem.buffers[out_id] = out;
        Ok(r.unwrap_or_else(|payload| resume_unwind(payload))?)
    }

    /// A recurrent op: reads its sources, advances the layer's state region in place
    /// and writes its output.
    fn recurrent(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_id: usize,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let NodeMeta::Recurrent(m) = &node.meta else {
            return Err(format!("{} without recurrent metadata", node.op.name()));
        };
        let (conv_id, ssm_id) =
            kv_pair.ok_or_else(|| format!("no recurrent state region for layer {}", m.layer))?;
        let is_conv = matches!(node.op, Op::SsmConv { .. });
        let state_id = if is_conv { conv_id } else { ssm_id };
        let n_bufs = self.mem.buffers.len();
        if state_id >= n_bufs
            || state_id == out_id
            || in_bufs.iter().any(|b| b.id == state_id || b.id == out_id)
        {
            return Err(format!(
                "layer {}: state buffer {state_id} / output {out_id} overlap a source or do not exist",
                m.layer
            ));
        }
        let nt = node.out_shape[1].max(1);
        let mut state = std::mem::take(&mut self.mem.buffers[state_id]);
        let mut out = std::mem::take(&mut self.mem.buffers[out_id]);
        let CpuBackend {
            pool,
            isa,
            mem,
            weights,
            ..
        } = &mut *self;
        let buffers = &mem.buffers;
        let src = |i: usize| -> Result<&[f32], String> {
            in_bufs
                .get(i)
                .and_then(|b| buffers.get(b.id))
                .map(Vec::as_slice)
                .ok_or_else(|| format!("missing source {i}"))
        };
        let r = (|| {
            let (pos, slots) = if is_conv {
                (src(1)?, src(2)?)
            } else {
                (src(3)?, src(4)?)
            };
            let mut toks = Vec::with_capacity(nt);
            recurrent::token_slots(m, pos, slots, nt, &mut toks)?;
            let x = src(0)?;
            if is_conv {
                let x = x.get(..m.channels * nt).ok_or("conv input too short")?;
                let w = vector(weights, &m.conv_weight)?;
                recurrent::ssm_conv(pool, m, x, &toks, &mut state, w, &mut out)
            } else {
                let chunks = recurrent::chunk_starts(m, pos, &toks);
                let args = recurrent::DeltaArgs {
                    meta: m,
                    qkv: x.get(..m.channels * nt).ok_or("qkv input too short")?,
                    alpha: src(1)?.get(..m.h_v * nt).ok_or("alpha input too short")?,
                    beta: src(2)?.get(..m.h_v * nt).ok_or("beta input too short")?,
                    a: vector(weights, &m.a_weight)?,
                    dt: m
                        .dt_bias
                        .as_deref()
                        .map(|n| vector(weights, n))
                        .transpose()?,
                    toks: &toks,
                    chunks: &chunks,
                };
                recurrent::delta_net(pool, *isa, &args, &mut state, &mut out)
            }
        })();
        self.mem.buffers[state_id] = state;
        self.mem.buffers[out_id] = out;
        r.map_err(|e| format!("layer {}: {e}", m.layer))
    }

    fn kv_store(
        &mut self,
        node: &CNode,
        layer: usize,
        in_bufs: &[BufRef],
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        let m = checks::kv_store_meta(layer, &node.meta)?;
        let (k_id, v_id) = checks::kv_pair(layer, kv_pair, self.mem.buffers.len())?;
        let [k_in, v_in, cells] = checks::kv_store_sources(in_bufs, |b| b.id)?;
        if [k_in, v_in, cells].iter().any(|&i| i == k_id || i == v_id) {
            return Err(format!("layer {layer}: a store input aliases the KV region").into());
        }
        let mut kr = std::mem::take(&mut self.mem.buffers[k_id]);
        let mut vr = std::mem::take(&mut self.mem.buffers[v_id]);
        let r = catch_unwind(AssertUnwindSafe(|| {
            if self.fault.fire() {
                // Rows of other sequences share the region: a store that fails leaves
                // them alone, so the injected fault writes nothing here.
                injected_panic(&self.pool, node, &mut []);
            }
            let b = &self.mem.buffers;
            kv::store(
                layer,
                m.n_embd,
                m.n_ctx,
                m.ring,
                self.kv_types,
                &b[k_in],
                &b[v_in],
                &b[cells],
                &mut kr,
                &mut vr,
            )
        }));
        // Back into the pool before anything else, unwinding included.
        self.mem.buffers[k_id] = kr;
        self.mem.buffers[v_id] = vr;
        Ok(r.unwrap_or_else(|payload| resume_unwind(payload))?)
    }

    /// `FusedQKV` / `FusedQkvNorm`: q, k and v in one product ([`matmul_group`]), then
    /// the biases, the per-head q/k norm, RoPE on q and k and the KV store, each with the
    /// kernel the unfused chain uses, so the bits are the unfused chain's. Output rows hold
    /// q, k, v (`nqt + 2 * nkt` per token).
    fn fused_qkv(
        &mut self,
        node: &CNode,
        layer: usize,
        in_bufs: &[BufRef],
        out_id: usize,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let spec = qkv_plan(node)?;
        let (k_id, v_id) = kv_pair.ok_or_else(|| format!("no KV region for layer {layer}"))?;
        let n = self.mem.buffers.len();
        if k_id == v_id || k_id >= n || v_id >= n || out_id == k_id || out_id == v_id {
            return Err(format!(
                "layer {layer}: bad KV pair ({k_id}, {v_id}) in a pool of {n} (output {out_id})"
            ));
        }
        let [x_id, pos_id] = match in_bufs {
            [a, b] => [a.id, b.id],
            _ => return Err(format!("takes 2 sources, got {}", in_bufs.len())),
        };
        if [x_id, pos_id]
            .iter()
            .any(|&i| i == k_id || i == v_id || i == out_id)
        {
            return Err(format!(
                "layer {layer}: an input aliases the output or the KV region"
            ));
        }
        if !self.qkv_parts.contains_key(spec.weight) {
            let parts = qkv_part_names(spec.weight).ok_or_else(|| {
                format!(
                    "'{}' does not name a q|k|v concatenation (blk.N.attn_qkv.weight)",
                    spec.weight
                )
            })?;
            self.qkv_parts.insert(spec.weight.to_string(), parts);
        }
        let mut out = std::mem::take(&mut self.mem.buffers[out_id]);
        let mut kr = std::mem::take(&mut self.mem.buffers[k_id]);
        let mut vr = std::mem::take(&mut self.mem.buffers[v_id]);
        let r = catch_unwind(AssertUnwindSafe(|| {
            if self.fault.fire() {
                injected_panic(&self.pool, node, &mut out);
            }
            let names = &self.qkv_parts[spec.weight];
            let b = &self.mem.buffers;
            let io = QkvIo {
                x: &b[x_id],
                pos: &b[pos_id],
                out: &mut out,
                k_region: &mut kr,
                v_region: &mut vr,
            };
            let nt = node.out_shape[1].max(1);
            let cx = QkvCx {
                pool: &self.pool,
                weights: &self.weights,
                repack: self.repack,
                kv_types: self.kv_types,
            };
            fused_qkv_compute(&cx, layer, &spec, names, nt, io, &mut self.scratch)
        }));
        // Back into the pool before anything else, unwinding included.
        self.mem.buffers[out_id] = out;
        self.mem.buffers[k_id] = kr;
        self.mem.buffers[v_id] = vr;
        r.unwrap_or_else(|payload| resume_unwind(payload))
    }

    fn compute(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_id: usize,
        out: &mut [f32],
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let n = node.n_elements();
        if out.len() < n {
            return Err(format!("output buffer holds {}, node needs {n}", out.len()));
        }
        let CpuBackend {
            pool,
            isa,
            mem,
            weights,
            scratch,
            repack,
            kv_types,
            ..
        } = self;
        let repack = *repack;
        let buffers = &mem.buffers;
        let Scratch {
            matmul: mm,
            snap,
            packed,
            rope: rope_cache,
            attn: attn_scratch,
            gate,
            up,
            expert_ids,
            experts,
            ..
        } = scratch;
        let is_attn = matches!(node.op, Op::Attn { .. });
        let in_place = matches!(
            node.op,
            Op::Silu | Op::Gelu | Op::SoftCap(_) | Op::RoPE { .. }
        ) && in_bufs.first().is_some_and(|b| b.id == out_id);
        let aliased = in_bufs
            .iter()
            .enumerate()
            .any(|(i, b)| b.id == out_id && !(is_attn && i == 1));
        if aliased && !in_place {
            snap.clear();
            snap.extend_from_slice(out);
        }
        let snap: &[f32] = snap;
        let buffers: &[Vec<f32>] = buffers;
        let src = |i: usize| -> Result<&[f32], String> {
            let b = in_bufs
                .get(i)
                .ok_or_else(|| format!("missing source {i}"))?;
            Ok(if b.id == out_id { snap } else { &buffers[b.id] })
        };
        let nt = node.out_shape[1].max(1);
        let out = &mut out[..n];
        let pool: &ThreadPool = pool;
        match (&node.op, &node.meta) {
            (Op::Add, _) => ew::binary(pool, BinOp::Add, src(0)?, src(1)?, out),
            (Op::Mul, _) => ew::binary(pool, BinOp::Mul, src(0)?, src(1)?, out),
            (Op::Scale(s), _) => {
                let s = *s;
                ew::map(pool, src(0)?, out, &|v| v * s)
            }
            (Op::Silu, _) if in_place => {
                ew::silu_inplace(pool, out);
                Ok(())
            }
            (Op::Silu, _) => ew::silu_into(pool, src(0)?, out),
            (Op::SwiGLU, _) => ew::swiglu(pool, src(0)?, src(1)?, out),
            (Op::GeGLU, _) => ew::geglu(pool, src(0)?, src(1)?, out),
            (Op::Gelu, _) => {
                let x = if in_place { None } else { Some(src(0)?) };
                ew::unary_vec(pool, x, out, &|ys| isa.gelu(ys))
            }
            (Op::SoftCap(c), _) => {
                let c = *c;
                if !(c.is_finite() && c > 0.0) {
                    return Err(format!("soft-cap {c}: the cap must be a positive number"));
                }
                let x = if in_place { None } else { Some(src(0)?) };
                ew::unary_vec(pool, x, out, &|ys| isa.softcap(ys, c))
            }
            (Op::Softmax { dim: 0 }, _) => ew::softmax_rows(pool, src(0)?, out, node.out_shape[0]),
            (Op::RmsNorm { eps }, meta) => {
                let w = norm_weight(weights, meta)?;
                norm::rms_norm(pool, src(0)?, out, node.out_shape[0], *eps, w)
            }
            (Op::LayerNorm { eps }, meta) => {
                let w = norm_weight(weights, meta)?;
                let b = match meta {
                    NodeMeta::Norm(m) => m.bias_name.as_deref().map(|n| vector(weights, n)),
                    _ => None,
                }
                .transpose()?;
                norm::layer_norm(pool, src(0)?, out, node.out_shape[0], *eps, w, b)
            }
            (Op::QkNorm { hd, eps, .. }, meta) => {
                let w = norm_weight(weights, meta)?;
                norm::rms_norm(pool, src(0)?, out, *hd, *eps, w)
            }
            (Op::MatMul { .. }, NodeMeta::MatMul(m)) => {
                let x = src(0)?;
                if m.out_dim * nt != n {
                    return Err(format!(
                        "output [{}, {nt}] does not match weight '{}' out_dim {}",
                        node.out_shape[0], m.weight_name, m.out_dim
                    ));
                }
                let y = out;
                let mmx = MatIn { x, nt, packed };
                matmul_named(
                    pool,
                    weights,
                    &m.weight_name,
                    m.in_dim,
                    m.out_dim,
                    mmx,
                    mm,
                    y,
                    repack,
                )?;
                if let Some(b) = &m.bias_name {
                    let bias = vector(weights, b)?;
                    ew::add_inplace(pool, y, bias)?;
                }
                Ok(())
            }
            (Op::GetRows, NodeMeta::Embed(m)) => {
                let w = weights
                    .get(&m.weight_name)
                    .ok_or_else(|| format!("weight '{}' is not registered", m.weight_name))?;
                if w.in_dim != m.n_embd || node.out_shape[0] != m.n_embd {
                    return Err(format!(
                        "table '{}' rows hold {}, node expects {} (output rows {})",
                        m.weight_name, w.in_dim, m.n_embd, node.out_shape[0]
                    ));
                }
                let ids = src(0)?;
                let ids = ids
                    .get(..nt)
                    .ok_or_else(|| format!("{} token ids for {nt} rows", ids.len()))?;
                let table = Table {
                    ty: w.ty,
                    data: w.bytes(),
                    row_len: w.in_dim,
                    rows: w.out_dim,
                };
                get_rows::embed(pool, &table, ids, out)
            }
            (Op::GetRows, _) => {
                let ids = src(1)?;
                let ids = ids
                    .get(..nt)
                    .ok_or_else(|| format!("{} row ids for {nt} rows", ids.len()))?;
                get_rows::gather(src(0)?, node.out_shape[0], ids, out)
            }
            (
                Op::RoPE {
                    style,
                    freq_factors,
                },
                NodeMeta::Rope(m),
            ) => {
                if *style != m.style || *freq_factors != m.freq_factors.is_some() {
                    return Err(format!(
                        "op (style {style:?}, frequency factors {freq_factors}) disagrees with its metadata {m:?}"
                    ));
                }
                let factors = m
                    .freq_factors
                    .as_deref()
                    .map(|name| vector(weights, name))
                    .transpose()?;
                if !in_place {
                    let x = src(0)?;
                    let x = x
                        .get(..n)
                        .ok_or_else(|| format!("rope input holds {}, node needs {n}", x.len()))?;
                    out.copy_from_slice(x);
                }
                rope::rope_inplace(pool, out, n / nt, nt, src(1)?, m, factors, rope_cache)
            }
            (Op::Attn { explicit_span, .. }, NodeMeta::Attn(m)) => {
                let (k_id, v_id) =
                    kv_pair.ok_or_else(|| format!("no KV region for layer {}", m.layer))?;
                let (k, v) = match (buffers.get(k_id), buffers.get(v_id)) {
                    (Some(k), Some(v)) if k_id != out_id && v_id != out_id => (k, v),
                    _ => {
                        return Err(format!(
                            "layer {}: KV pair ({k_id}, {v_id}) unusable (output buffer {out_id})",
                            m.layer
                        ))
                    }
                };
                if n != nt * m.n_head * m.hd {
                    return Err(format!(
                        "output {:?} is not [{} x {}, {nt}]",
                        node.out_shape, m.n_head, m.hd
                    ));
                }
                let q = src(0)?;
                let sinks = m.sinks.as_deref().map(|n| vector(weights, n)).transpose()?;
                let args = AttnArgs {
                    meta: m,
                    sinks,
                    q,
                    q_stride: q.len() / nt,
                    nt,
                    pos: src(2)?,
                    span: if *explicit_span { Some(src(3)?) } else { None },
                    k,
                    v,
                    types: *kv_types,
                };
                attn::attention(pool, *isa, &args, out, attn_scratch)
            }
            (Op::Reshape { .. }, _) => layout::view(src(0)?, 0, out),
            (Op::View { offset, .. }, _) => layout::view(src(0)?, *offset, out),
            (Op::Permute { dims }, _) => layout::permute(src(0)?, node.out_shape, *dims, out),
            (Op::FusedFFN, NodeMeta::FusedFfn(m)) => {
                let nf = m.nf;
                if n != 2 * nf * nt {
                    return Err(format!(
                        "output {:?} is not [2 x {nf}, {nt}]",
                        node.out_shape
                    ));
                }
                let x = src(0)?;
                let group = [
                    (m.gate_weight.as_str(), 0, nf),
                    (m.up_weight.as_str(), nf, nf),
                ];
                let mmx = MatIn { x, nt, packed };
                // SwiGLU over the gate rows, in place; the up rows stay (the output's
                // second half, as the node's contract says).
                let epi = Epilogue::SwiGlu { nf, gate };
                matmul_group(
                    pool, weights, &group, m.n_embd, mmx, mm, out, repack, up, epi,
                )
            }
            (Op::TopK { k }, _) => {
                let x = src(0)?;
                moe::top_k(x, x.len() / nt, *k, out)
            }
            (Op::MulMatId | Op::MulMatIdSwiGLU, NodeMeta::MatMulId(m)) => {
                if (node.op == Op::MulMatIdSwiGLU) != m.gate_name.is_some() {
                    return Err(format!(
                        "op and metadata disagree on the gate weight ({:?})",
                        m.gate_name
                    ));
                }
                let ex = Experts {
                    pool,
                    weights,
                    ids: expert_ids,
                    scratch: experts,
                    gate,
                    up,
                    repack,
                };
                ex.run(m, src(0)?, src(1)?, out)
            }
            (Op::MoeSum { norm }, _) => {
                moe::weighted_sum(src(0)?, src(1)?, src(2)?, node.out_shape[0], *norm, out)
            }
            (Op::MulSigmoid, _) => moe::mul_sigmoid(src(0)?, src(1)?, node.out_shape[0], out),
            (Op::SigmoidGate, _) => {
                let x = src(0)?.get(..n).ok_or("gate input too short")?;
                let g = src(1)?.get(..n).ok_or("gate too short")?;
                recurrent::sigmoid_gate(x, g, out)
            }
            (Op::Slice { period, start, len }, _) => {
                let x = src(0)?;
                let d = n / nt / len.max(&1) * period;
                let x = x.get(..d * nt).ok_or("slice input too short")?;
                recurrent::slice(x, *period, *start, *len, out)
            }
            (op, meta) => Err(format!(
                "{} with metadata {meta:?} is not implemented by the cpu backend",
                op.name()
            )),
        }
    }
}

/// A vector weight read as f32.
fn vector<'a>(weights: &'a WeightRegistry, name: &str) -> Result<&'a [f32], String> {
    let w = weights
        .get(name)
        .ok_or_else(|| format!("weight '{name}' is not registered"))?;
    w.as_f32()
        .ok_or_else(|| format!("weight '{name}' ({}) cannot be read as f32", w.ty))
}

/// The optional scale vector of a norm node.
fn norm_weight<'a>(
    weights: &'a WeightRegistry,
    meta: &NodeMeta,
) -> Result<Option<&'a [f32]>, String> {
    match meta {
        NodeMeta::Norm(m) => m
            .weight_name
            .as_deref()
            .map(|n| vector(weights, n))
            .transpose(),
        NodeMeta::None => Ok(None),
        other => Err(format!("norm with foreign metadata {other:?}")),
    }
}

impl BackendImpl for CpuBackend {
    fn id(&self) -> Backend {
        Backend::CPU
    }

    fn name(&self) -> &str {
        "cpu"
    }

    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        if let Op::TopK { .. } = op {
            return dtype == DType::I32;
        }
        dtype == DType::F32
            && matches!(
                op,
                Op::Input
                    | Op::Add
                    | Op::Mul
                    | Op::Scale(_)
                    | Op::Silu
                    | Op::Gelu
                    | Op::SoftCap(_)
                    | Op::Softmax { dim: 0 }
                    | Op::RmsNorm { .. }
                    | Op::LayerNorm { .. }
                    | Op::QkNorm { .. }
                    | Op::MatMul { .. }
                    | Op::GetRows
                    | Op::RoPE { .. }
                    | Op::Attn { .. }
                    | Op::KvcacheStore { .. }
                    | Op::KvcacheLoad { .. }
                    | Op::View { .. }
                    | Op::Reshape { .. }
                    | Op::Permute { .. }
                    | Op::SwiGLU
                    | Op::GeGLU
                    | Op::FusedFFN
                    | Op::FusedQKV { .. }
                    | Op::FusedQkvNorm { .. }
                    | Op::MulMatId
                    | Op::MulMatIdSwiGLU
                    | Op::MoeSum { .. }
                    | Op::MulSigmoid
                    | Op::SigmoidGate
                    | Op::Slice { .. }
                    | Op::SsmConv { .. }
                    | Op::DeltaNet { .. }
            )
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        match fused {
            FusedOp::SwiGLU | FusedOp::GeGLU => true,
            FusedOp::DecodeQkv => self.fuse.qkv,
            FusedOp::DecodeFfn => self.fuse.ffn,
        }
    }

    fn supports_attn_span(&self) -> bool {
        true
    }

    fn kv_types(&self) -> [KvType; 2] {
        self.kv_types
    }

    fn register_gguf(&mut self, file: &Arc<GgufFile>) -> Result<usize, BackendError> {
        Ok(self.weights.register_gguf(file, "")?)
    }

    minfer_graph::host_pool_methods!(mem);

    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        self.run(node, in_bufs, out_buf, kv_pair)
    }

    fn read_host(&self, id: usize) -> Option<&[f32]> {
        self.mem.read(id)
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
