//! `CudaBackend`: pool, weights, host I/O and node execution on a CUDA device.
//!
//! - Pool: device buffers of f32 addressed by id; `alloc_buffer` reuses a free id of
//!   exactly the requested length (cleared in stream order), `alloc_fresh` always makes
//!   one. An id keeps its address until its storage is released, so captured graphs
//!   stay valid; every change of an address bumps the pool generation.
//! - Recording: `execute_node` validates a node and records its launches as commands;
//!   host writes are recorded as uploads from the pinned staging area. `synchronize`
//!   (every split boundary) runs the split through the replay cache, which launches
//!   directly, captures, or replays, and waits for the stream.
//! - Index inputs (token ids, positions, KV cells, spans) are range checked on the host
//!   before a kernel may read them: they arrive through `write_host`, so the pool keeps
//!   a host copy of every small buffer the host wrote, dropped once a kernel writes it.
//! - Weights are uploaded once, by name, in their GGUF byte layout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::{
    Backend, BackendImpl, BufRef, CNode, DType, FusedOp, KvType, NodeMeta, Op,
    QkvBiasRopeStoreMeta, RoPEMeta, RopeStyle,
};

use crate::device::{DevLauncher, DevMem, Gpu, GraphExec, Pinned};
use crate::dispatch::{self, Geom};
use crate::kernels::{Kernel, Param, WEIGHT_TYPES};
use crate::replay::{Arg, Cmd, Mode, ReplayCache, SplitKey};

/// What the host knows about a pool buffer's contents.
#[derive(Debug)]
enum Host {
    /// Freshly allocated or cleared: all zeros.
    Zero,
    /// Last written by the host with these values.
    Known(Vec<f32>),
    /// Written by a kernel since.
    Unknown,
}

struct DevBuf {
    mem: Option<DevMem>,
    len: usize,
    host: Host,
}

struct DevWeight {
    ty: GgmlType,
    in_dim: usize,
    out_dim: usize,
    row_bytes: usize,
    index: usize,
}

/// One matmul: weight, dims and where its rows land in the output.
struct MatmulArgs<'a> {
    name: &'a str,
    in_dim: usize,
    out_dim: usize,
    bias: Option<&'a str>,
    y_stride: usize,
    y_off: usize,
}

/// The name the model builders give layer `il`'s q|k|v concatenation (a backend that
/// executes the decode QKV fusions registers it; checked against the builders' own
/// name in this crate's tests).
pub fn qkv_concat_name(il: usize) -> String {
    format!("blk.{il}.attn_qkv.weight")
}

/// What the two concat-matmul QKV fusions share (`FusedQkvMeta`, `FusedQkvNormMeta`).
struct FusedQkvParts<'a> {
    layer: usize,
    weight: &'a str,
    n_embd: usize,
    nqt: usize,
    nkt: usize,
    q_bias: Option<&'a str>,
    k_bias: Option<&'a str>,
    v_bias: Option<&'a str>,
    /// q norm, k norm, eps (Qwen3).
    norms: Option<(&'a str, &'a str, f32)>,
    rope: &'a RoPEMeta,
    n_ctx: usize,
}

/// Largest host-written buffer whose values the pool remembers (index inputs are a few
/// values per token; staged activations are never indices).
const HOST_COPY_MAX: usize = 1 << 16;

/// Values the mat-vec, int8 and embedding kernels decode at a time along a row.
const SUB_BLOCK: usize = 32;

/// How many splits ran in each mode since the backend was made (for tests and reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Splits launched kernel by kernel.
    pub direct: u64,
    /// Splits captured into a graph (and run).
    pub captured: u64,
    /// Splits replayed from a captured graph.
    pub replayed: u64,
}

/// [`ReplayStats`] summed over every backend of this process (engines own their
/// backends, so tests and reports read these).
static PROCESS_STATS: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// How the splits of every CUDA backend in this process ran so far.
pub fn process_replay_stats() -> ReplayStats {
    ReplayStats {
        direct: PROCESS_STATS[0].load(Ordering::Relaxed),
        captured: PROCESS_STATS[1].load(Ordering::Relaxed),
        replayed: PROCESS_STATS[2].load(Ordering::Relaxed),
    }
}

/// The CUDA graph backend (id [`Backend::CUDA`], name "cuda").
pub struct CudaBackend {
    bufs: Vec<DevBuf>,
    free: Vec<usize>,
    weights: HashMap<String, DevWeight>,
    weight_mem: Vec<DevMem>,
    /// Tensors of a registered file whose type no kernel decodes, kept to name it.
    skipped: HashMap<String, GgmlType>,
    scratch: Option<DevMem>,
    snaps: HashMap<(usize, usize), DevMem>,
    /// The split being recorded: commands, upload data, node id range.
    pending: Vec<Cmd>,
    staged: Vec<f32>,
    nodes: Option<(usize, usize)>,
    staging: Option<Pinned>,
    readback: Option<Pinned>,
    replay: ReplayCache<GraphExec>,
    /// Bumped whenever a device address the commands use may change.
    generation: u64,
    stats: ReplayStats,
    kv_here: bool,
    /// Whether every layer's q|k|v concatenation is registered in rows the kernels
    /// cover: only then are the QKV fusions claimed, since the host has no kernel for a
    /// fused node this backend would decline.
    qkv_fusable: bool,
    /// A recorded launch whose arguments do not fit its kernel.
    bad_launch: Option<String>,
    /// An error of a split that `synchronize` (which cannot fail) ran, reported by the
    /// next call that can.
    failed: Option<String>,
    /// Last: fields drop in order, so memory and graphs are freed while the context lives.
    gpu: Gpu,
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // The fields' destructors free device memory: the context must be current on the
        // dropping thread, which may not be the one that made the backend.
        let _ = self.gpu.bind();
    }
}

// SAFETY: the backend owns its device memory, pinned memory and graphs exclusively; the
// engine hands it between threads whole, and every entry point binds the context first.
unsafe impl Send for CudaBackend {}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.gpu.summary.name)
            .field("buffers", &self.bufs.len())
            .field("weights", &self.weights.len())
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// Whether `args` fit the kinds of `kernel`'s parameters, one for one.
fn args_match(kernel: Kernel, args: &[Arg]) -> bool {
    let params = kernel.params();
    params.len() == args.len()
        && params.iter().zip(args).all(|(p, a)| match (p, a) {
            (Param::U32, Arg::U32(_)) | (Param::F32, Arg::F32(_)) => true,
            (Param::Ptr, Arg::U32(_) | Arg::F32(_)) => false,
            (Param::Ptr, _) => true,
            _ => false,
        })
}

fn u32_of(v: usize, what: &str) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{what} {v} does not fit the kernels' 32-bit indices"))
}

fn f32_arg(v: f32) -> Arg {
    Arg::F32(v.to_bits())
}

/// Whether CUDA Graph replay is on for a new backend: `MINFER_CUDA_GRAPHS` (default on),
/// and off while per-node tracing or profiling is, which need each launch on its own.
pub fn graphs_enabled() -> Result<bool, String> {
    let on = minfer_env::CUDA_GRAPHS
        .get_or(true)
        .map_err(|e| e.to_string())?;
    let tracing = minfer_env::GRAPH_TRACE.get_or(false).unwrap_or(false)
        || minfer_env::PROFILE.get_or(false).unwrap_or(false);
    Ok(on && !tracing)
}

impl CudaBackend {
    /// The backend on device 0, or why it cannot run here.
    pub fn new() -> Result<CudaBackend, String> {
        let graphs = graphs_enabled()?;
        Self::with_graphs(graphs)
    }

    /// Like [`CudaBackend::new`] with CUDA Graph replay forced on or off (parity tests).
    pub fn with_graphs(graphs: bool) -> Result<CudaBackend, String> {
        let gpu = Gpu::open()?;
        Ok(CudaBackend {
            bufs: Vec::new(),
            free: Vec::new(),
            weights: HashMap::new(),
            weight_mem: Vec::new(),
            skipped: HashMap::new(),
            scratch: None,
            snaps: HashMap::new(),
            pending: Vec::new(),
            staged: Vec::new(),
            nodes: None,
            staging: None,
            readback: None,
            replay: ReplayCache::new(graphs),
            generation: 0,
            stats: ReplayStats::default(),
            kv_here: true,
            qkv_fusable: false,
            bad_launch: None,
            failed: None,
            gpu,
        })
    }

    /// Takes the engine's KV storage formats: the kernels hold f32 rows only, so any
    /// other format leaves KV stores and attention to a backend that has it.
    pub fn set_kv_types(&mut self, types: [KvType; 2]) {
        self.kv_here = types == [KvType::F32; 2];
    }

    /// The device in use.
    pub fn device(&self) -> &crate::DeviceSummary {
        &self.gpu.summary
    }

    /// How splits ran so far.
    pub fn replay_stats(&self) -> ReplayStats {
        self.stats
    }

    /// The pool generation (changes whenever captured graphs must be dropped).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The weight types the kernels decode.
    pub fn weight_types() -> &'static [GgmlType] {
        &WEIGHT_TYPES
    }

    fn bump(&mut self) {
        self.generation += 1;
        self.replay.invalidate();
    }

    /// Zeroed device memory for `size` f32s, or why there is none (the byte count
    /// overflowing included, never a wrapped size).
    fn device_mem(&self, size: usize) -> Result<DevMem, String> {
        let bytes = size
            .checked_mul(4)
            .ok_or_else(|| format!("a buffer of {size} f32s does not fit in memory"))?;
        self.gpu.bind()?;
        DevMem::zeroed(bytes)
    }

    /// A new pool buffer of `size` f32s over `mem` (`None`: no storage, see
    /// `alloc_fresh`).
    fn push_buf(&mut self, mem: Option<DevMem>, size: usize) -> usize {
        self.bufs.push(DevBuf {
            mem,
            len: size,
            host: Host::Zero,
        });
        self.bump();
        self.bufs.len() - 1
    }

    /// The free-list position of a buffer of exactly `size` f32s that has storage.
    fn reusable(&self, size: usize) -> Option<usize> {
        self.free
            .iter()
            .position(|&i| self.bufs[i].len == size && self.bufs[i].mem.is_some())
    }

    /// Takes free-list entry `pos` (of `size` f32s) for a new use, cleared in order.
    fn reuse(&mut self, pos: usize, size: usize) -> usize {
        let id = self.free.swap_remove(pos);
        self.pending.push(Cmd::Zero { dst: id, len: size });
        self.bufs[id].host = Host::Zero;
        id
    }

    /// Uploads one tensor in its GGUF byte layout under `name`; `dims` are GGUF dims.
    /// Returns `false` when the name was already registered (the first one stays).
    pub fn register_weight(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<bool, String> {
        let err = |p: String| format!("weight '{name}': {p}");
        if self.weights.contains_key(name) {
            return Ok(false);
        }
        if !WEIGHT_TYPES.contains(&ty) {
            return Err(err(format!("type {ty} is not decoded by the CUDA kernels")));
        }
        let (&in_dim, rest) = dims
            .split_first()
            .ok_or_else(|| err("no dimensions".into()))?;
        let out_dim = rest
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| err(format!("dims {dims:?} overflow")))?;
        let block = ty.block_size();
        if in_dim == 0 || !in_dim.is_multiple_of(block) {
            return Err(err(format!(
                "rows of {in_dim} values are not a positive multiple of the {ty} block of {block}"
            )));
        }
        let row_bytes = in_dim / block * ty.type_size();
        if row_bytes.checked_mul(out_dim) != Some(bytes.len()) {
            return Err(err(format!(
                "{} bytes, {ty} dims {dims:?} need {}",
                bytes.len(),
                row_bytes.saturating_mul(out_dim)
            )));
        }
        self.gpu.bind()?;
        self.weight_mem.push(DevMem::upload(bytes).map_err(err)?);
        self.weights.insert(
            name.to_string(),
            DevWeight {
                ty,
                in_dim,
                out_dim,
                row_bytes,
                index: self.weight_mem.len() - 1,
            },
        );
        Ok(true)
    }

    /// Registers owned f32 values (norm scales, test weights) of GGUF dims `dims`.
    pub fn register_f32(
        &mut self,
        name: &str,
        dims: &[usize],
        data: &[f32],
    ) -> Result<bool, String> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.register_weight(name, GgmlType::F32, dims, &bytes)
    }

    /// Registers each layer's q|k|v concatenation (rows of q, then k, then v: GGUF
    /// rows are contiguous, so it is the three tensors' bytes in a row) under the name
    /// the model builders give it, where the three share type and input width; the
    /// decode QKV fusions multiply against it in one launch. Returns how many.
    fn register_qkv_concats(&mut self, file: &GgufFile) -> Result<usize, String> {
        let mut added = 0;
        let mut all = true;
        let mut layers = 0;
        for il in 0.. {
            let part = |w: &str| {
                file.tensors()
                    .iter()
                    .find(|t| t.name == format!("blk.{il}.attn_{w}.weight"))
            };
            let (Some(q), Some(k), Some(v)) = (part("q"), part("k"), part("v")) else {
                break;
            };
            layers += 1;
            let name = qkv_concat_name(il);
            all &= q.dims.first().is_some_and(|&d| d % SUB_BLOCK as u64 == 0);
            let same = q.ggml_type == k.ggml_type
                && k.ggml_type == v.ggml_type
                && q.dims.first() == k.dims.first()
                && k.dims.first() == v.dims.first()
                && [q, k, v].iter().all(|t| t.dims.len() == 2);
            if self.weights.contains_key(&name) {
                continue;
            }
            if !same || !WEIGHT_TYPES.contains(&q.ggml_type) {
                all = false;
                continue;
            }
            let rows: u64 = [q, k, v].iter().map(|t| t.dims[1]).sum();
            let dims = [q.dims[0], rows]
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| format!("weight '{name}': rows {rows} do not fit in memory"))?;
            let mut bytes = Vec::new();
            for t in [q, k, v] {
                bytes.extend_from_slice(file.tensor_data(t));
            }
            if self.register_weight(&name, q.ggml_type, &dims, &bytes)? {
                added += 1;
            }
        }
        self.qkv_fusable = layers > 0 && all;
        Ok(added)
    }

    fn weight(&self, name: &str) -> Result<&DevWeight, String> {
        self.weights
            .get(name)
            .ok_or_else(|| match self.skipped.get(name) {
                Some(ty) => {
                    format!("weight '{name}' is {ty}, which the CUDA kernels do not decode")
                }
                None => format!("weight '{name}' is not registered"),
            })
    }

    /// An f32 vector weight of exactly `len` values.
    fn vector(&self, name: &str, len: usize) -> Result<usize, String> {
        let w = self.weight(name)?;
        if w.ty == GgmlType::F32 && w.in_dim * w.out_dim == len {
            Ok(w.index)
        } else {
            Err(format!(
                "weight '{name}' is {} [{}, {}], the node needs {len} f32 values",
                w.ty, w.in_dim, w.out_dim
            ))
        }
    }

    /// Whether every weight `node` names is one the kernels decode, in rows the kernels
    /// cover: they walk rows in sub-blocks of 32 values, so a row of another length (an
    /// f32 test matrix, say) declines the node instead of losing its tail.
    fn weights_decoded(&self, node: &CNode) -> bool {
        let ok = |name: &str| !self.skipped.contains_key(name);
        let rows_fit = |d: usize| d.is_multiple_of(SUB_BLOCK);
        match &node.meta {
            NodeMeta::MatMul(m) => {
                ok(&m.weight_name) && m.bias_name.as_deref().is_none_or(ok) && rows_fit(m.in_dim)
            }
            NodeMeta::Embed(m) => ok(&m.weight_name) && rows_fit(m.n_embd),
            NodeMeta::Norm(m) => m.weight_name.as_deref().is_none_or(ok),
            NodeMeta::FusedFfn(m) => ok(&m.gate_weight) && ok(&m.up_weight) && rows_fit(m.n_embd),
            // The concatenation exists only where this backend made it; one token only.
            NodeMeta::FusedQkv(m) => {
                self.weights.contains_key(&m.qkv_weight)
                    && m.q_bias
                        .iter()
                        .chain(&m.k_bias)
                        .chain(&m.v_bias)
                        .all(|b| ok(b))
                    && rows_fit(m.n_embd)
                    && node.out_shape[1] == 1
            }
            NodeMeta::FusedQkvNorm(m) => {
                self.weights.contains_key(&m.qkv_weight)
                    && ok(&m.q_norm)
                    && ok(&m.k_norm)
                    && rows_fit(m.n_embd)
                    && node.out_shape[1] == 1
            }
            _ => true,
        }
    }

    fn len(&self, id: usize) -> usize {
        self.bufs.get(id).map_or(0, |b| b.len)
    }

    fn pool(&self, b: BufRef, what: &str) -> Result<usize, String> {
        if b.backend != Backend::CUDA || b.id >= self.bufs.len() {
            return Err(format!(
                "{what} is buffer {} on {}, not in the CUDA pool ({} buffers)",
                b.id,
                b.backend,
                self.bufs.len()
            ));
        }
        Ok(b.id)
    }

    /// The first `n` values of a host-written index buffer, as integers.
    fn host_ints(&self, id: usize, n: usize, what: &str) -> Result<Vec<i32>, String> {
        let b = self
            .bufs
            .get(id)
            .ok_or_else(|| format!("{what} buffer {id} does not exist"))?;
        if b.len < n {
            return Err(format!("{what}: {} values for {n} tokens", b.len));
        }
        match &b.host {
            Host::Zero => Ok(vec![0; n]),
            Host::Known(v) => Ok(v[..n].iter().map(|&x| x.to_bits() as i32).collect()),
            Host::Unknown => Err(format!(
                "{what} (buffer {id}) were computed on the device; the CUDA backend reads \
                 indices only from host-written inputs, which it range checks"
            )),
        }
    }

    /// Records a launch. Arguments that do not match the kernel's declared parameters
    /// (a dispatcher bug) fail the split at its flush, naming the kernel, instead of
    /// handing the device a wrong parameter block.
    fn launch(&mut self, kernel: Kernel, geom: Geom, args: Vec<Arg>) {
        if self.bad_launch.is_none() && !args_match(kernel, &args) {
            self.bad_launch = Some(format!(
                "internal: {kernel:?} launched with {args:?}, its signature is {:?}",
                kernel.params()
            ));
        }
        self.pending.push(Cmd::Launch { kernel, geom, args });
    }

    /// The source `id`, or a snapshot of it when it is also the output (kernels that
    /// read whole rows must not see their own writes).
    fn src_arg(&mut self, id: usize, out: usize) -> Result<Arg, String> {
        if id != out {
            return Ok(Arg::Buf(id));
        }
        self.snapshot(0, Arg::Buf(id), self.len(id))
    }

    /// A copy of `len` values at `src` in snapshot area `slot` (made on first use).
    fn snapshot(&mut self, slot: usize, src: Arg, len: usize) -> Result<Arg, String> {
        if !self.snaps.contains_key(&(slot, len)) {
            self.gpu.bind()?;
            self.snaps.insert((slot, len), DevMem::zeroed(len * 4)?);
            self.bump();
        }
        let dst = Arg::Snap(slot, len);
        self.pending.push(Cmd::Copy { src, dst, len });
        Ok(dst)
    }

    /// Makes the scratch area hold at least `bytes`.
    fn ensure_scratch(&mut self, bytes: usize) -> Result<(), String> {
        if self.scratch.as_ref().is_none_or(|s| s.bytes < bytes) {
            // Every earlier use of the old area is in `pending` or finished; the
            // commands resolve addresses at flush time, so they all see the new one.
            self.gpu.bind()?;
            self.scratch = Some(DevMem::zeroed(bytes.next_power_of_two())?);
            self.bump();
        }
        Ok(())
    }

    /// Records `y[t, y_off + r] = W[r] . x[t] (+ bias[r])`.
    fn matmul(
        &mut self,
        a: &MatmulArgs,
        x: Arg,
        x_len: usize,
        nt: usize,
        out: usize,
    ) -> Result<(), String> {
        let w = self.weight(a.name)?;
        let (ty, row_bytes, index) = (w.ty, w.row_bytes, w.index);
        if w.in_dim != a.in_dim || w.out_dim != a.out_dim {
            return Err(format!(
                "weight '{}' is [{}, {}], the node expects [{}, {}]",
                a.name, w.in_dim, w.out_dim, a.in_dim, a.out_dim
            ));
        }
        if !a.in_dim.is_multiple_of(SUB_BLOCK) {
            return Err(format!(
                "matmul with '{}': rows of {} values are not whole sub-blocks of {SUB_BLOCK}",
                a.name, a.in_dim
            ));
        }
        let stride = x_len / nt;
        if stride < a.in_dim {
            return Err(format!(
                "matmul with '{}': input {x_len} values for {nt} rows of {}",
                a.name, a.in_dim
            ));
        }
        if a.y_off + a.out_dim > a.y_stride || self.len(out) < nt * a.y_stride {
            return Err(format!(
                "matmul with '{}': output rows of {} cannot hold columns {}..{}",
                a.name,
                a.y_stride,
                a.y_off,
                a.y_off + a.out_dim
            ));
        }
        let bias = match a.bias {
            Some(b) => Some(self.vector(b, a.out_dim)?),
            None => None,
        };
        // Without a bias the kernel never reads it; the weight stands in.
        let b_arg = Arg::Weight(bias.unwrap_or(index));
        let has_bias = Arg::U32(u32::from(bias.is_some()));
        let geom = dispatch::matmul_geom(a.out_dim, nt)?;
        let (kernel, quant) = dispatch::matmul_kernel(ty, nt)?;
        match quant {
            None => {
                let args = vec![
                    Arg::Weight(index),
                    x,
                    b_arg,
                    Arg::Buf(out),
                    Arg::U32(u32_of(a.in_dim, "input features")?),
                    Arg::U32(u32_of(a.out_dim, "output features")?),
                    Arg::U32(u32_of(nt, "tokens")?),
                    Arg::U32(u32_of(row_bytes, "row bytes")?),
                    Arg::U32(u32_of(stride, "row stride")?),
                    Arg::U32(u32_of(a.y_stride, "output stride")?),
                    Arg::U32(u32_of(a.y_off, "output column")?),
                    has_bias,
                ];
                self.launch(kernel, geom, args);
            }
            Some(q) => {
                let qbytes = nt * a.in_dim;
                self.ensure_scratch(dispatch::quant_scratch_bytes(a.in_dim, nt))?;
                let qg = dispatch::quant_geom(q, a.in_dim, nt)?;
                let (qx, dx) = (Arg::Scratch(0), Arg::Scratch(qbytes));
                self.launch(
                    Kernel::Quant(q),
                    qg,
                    vec![
                        x,
                        qx,
                        dx,
                        Arg::U32(u32_of(a.in_dim, "input features")?),
                        Arg::U32(u32_of(stride, "row stride")?),
                    ],
                );
                let args = vec![
                    Arg::Weight(index),
                    qx,
                    dx,
                    b_arg,
                    Arg::Buf(out),
                    Arg::U32(u32_of(a.in_dim, "input features")?),
                    Arg::U32(u32_of(a.out_dim, "output features")?),
                    Arg::U32(u32_of(nt, "tokens")?),
                    Arg::U32(u32_of(row_bytes, "row bytes")?),
                    Arg::U32(u32_of(a.y_stride, "output stride")?),
                    Arg::U32(u32_of(a.y_off, "output column")?),
                    has_bias,
                    Arg::U32(q.group() as u32),
                ];
                self.launch(kernel, geom, args);
            }
        }
        Ok(())
    }

    fn norm(
        &mut self,
        node: &CNode,
        d: usize,
        eps: f32,
        x: Arg,
        x_len: usize,
        out: usize,
    ) -> Result<(), String> {
        let n = node.n_elements();
        if d == 0 || !n.is_multiple_of(d) || x_len < n {
            return Err(format!(
                "rms norm: {n} output values in rows of {d} from {x_len} inputs"
            ));
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(format!("rms norm: eps {eps} is not a non-negative number"));
        }
        let w = match &node.meta {
            NodeMeta::Norm(m) => match &m.weight_name {
                Some(name) => Some(self.vector(name, d)?),
                None => None,
            },
            NodeMeta::None => None,
            other => return Err(format!("norm with foreign metadata {other:?}")),
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

    fn kv_store(
        &mut self,
        layer: usize,
        meta: &NodeMeta,
        ids: &[usize],
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let NodeMeta::Kvcache(m) = meta else {
            return Err(format!("KV store without KV metadata: {meta:?}"));
        };
        if m.layer != layer {
            return Err(format!("op layer {layer} but metadata layer {}", m.layer));
        }
        let (k_id, v_id) = kv_pair.ok_or_else(|| format!("no KV region for layer {layer}"))?;
        let nb = self.bufs.len();
        if k_id == v_id || k_id >= nb || v_id >= nb {
            return Err(format!(
                "layer {layer}: bad KV pair ({k_id}, {v_id}) in a pool of {nb}"
            ));
        }
        let [k_in, v_in, cells] = match ids {
            [a, b, c] => [*a, *b, *c],
            _ => return Err(format!("KV store takes 3 sources, got {}", ids.len())),
        };
        if [k_in, v_in, cells].iter().any(|&i| i == k_id || i == v_id) {
            return Err(format!(
                "layer {layer}: a store input aliases the KV region"
            ));
        }
        let nt = self.len(cells);
        let (n_embd, n_ctx) = (m.n_embd, m.n_ctx);
        if n_embd == 0 || self.len(k_in) < nt * n_embd || self.len(v_in) < nt * n_embd {
            return Err(format!(
                "KV store layer {layer}: k {} / v {} values for {nt} rows of {n_embd}",
                self.len(k_in),
                self.len(v_in)
            ));
        }
        let kv = (k_id, v_id);
        self.store_rows(
            layer,
            Arg::Buf(k_in),
            Arg::Buf(v_in),
            cells,
            nt,
            n_embd,
            n_ctx,
            kv,
        )
    }

    /// Records the store of `nt` rows of `n_embd` values at `k` and `v` into rows
    /// `cells[t]` of the layer's regions `kv`, after checking the regions and the cells.
    #[allow(clippy::too_many_arguments)]
    fn store_rows(
        &mut self,
        layer: usize,
        k: Arg,
        v: Arg,
        cells: usize,
        nt: usize,
        n_embd: usize,
        n_ctx: usize,
        (k_id, v_id): (usize, usize),
    ) -> Result<(), String> {
        let need = n_embd * n_ctx;
        if self.len(k_id) < need || self.len(v_id) < need {
            return Err(format!(
                "KV store layer {layer}: regions hold {}/{} values, {n_ctx} rows of {n_embd} need {need}",
                self.len(k_id),
                self.len(v_id)
            ));
        }
        let rows = self.host_ints(cells, nt, "KV cells")?;
        if let Some((t, c)) = rows
            .iter()
            .enumerate()
            .find(|&(_, &c)| c < 0 || c as usize >= n_ctx)
        {
            return Err(format!(
                "KV store layer {layer}: token {t} targets row {c}, outside the {n_ctx}-row region"
            ));
        }
        if nt == 0 {
            return Ok(());
        }
        let geom = dispatch::elementwise_geom(nt * n_embd)?;
        self.launch(
            Kernel::KvStore,
            geom,
            vec![
                k,
                v,
                Arg::Buf(cells),
                Arg::Buf(k_id),
                Arg::Buf(v_id),
                Arg::U32(u32_of(n_embd, "row width")?),
                Arg::U32(u32_of(nt, "rows")?),
            ],
        );
        self.bufs[k_id].host = Host::Unknown;
        self.bufs[v_id].host = Host::Unknown;
        Ok(())
    }

    /// Records rope in place over `n_head` heads at `target`, in token rows of `stride`
    /// values, at the positions in buffer `pos`.
    fn rope_at(
        &mut self,
        pos: usize,
        target: Arg,
        nt: usize,
        n_head: usize,
        m: &RoPEMeta,
        stride: usize,
    ) -> Result<(), String> {
        // No frequency-factor term in the kernel; `supports_op` declines such nodes.
        if m.freq_factors.is_some() {
            return Err("rope with frequency factors is not implemented here".into());
        }
        if m.n_dims == 0 || !m.n_dims.is_multiple_of(2) || m.n_dims > m.hd {
            return Err(format!(
                "rope: n_dims {} must be even, positive and at most hd {}",
                m.n_dims, m.hd
            ));
        }
        if self.len(pos) < nt {
            return Err(format!("rope: {} positions for {nt} tokens", self.len(pos)));
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
    fn add_bias(&mut self, x: Arg, n: usize, bias: &str, len: usize) -> Result<(), String> {
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
    fn norm_rows(
        &mut self,
        x: Arg,
        rows: usize,
        hd: usize,
        w: &str,
        eps: f32,
    ) -> Result<(), String> {
        if eps.is_nan() || eps < 0.0 {
            return Err(format!("rms norm: eps {eps} is not a non-negative number"));
        }
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

    /// The decode QKV fusions (`fused_qkv`, `fused_qkv_norm`): one matmul against the
    /// registered q|k|v concatenation into `[q | k | v]`, then the q/k/v biases or the
    /// per-head q/k norms, rope on q and k, and the store of k and v at the positions
    /// (which are the KV rows: the builder emits these only without explicit spans).
    /// One token: the segments of a row are contiguous only then.
    fn fused_qkv(
        &mut self,
        node: &CNode,
        f: &FusedQkvParts<'_>,
        ids: &[usize],
        out: usize,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let nt = node.out_shape[1].max(1);
        let (nqt, nkt) = (f.nqt, f.nkt);
        let rows = nqt + 2 * nkt;
        if nt != 1 || node.n_elements() != rows {
            return Err(format!(
                "output {:?} is not one token of [{nqt} + 2 x {nkt}]",
                node.out_shape
            ));
        }
        let hd = f.rope.hd;
        if hd == 0 || !nqt.is_multiple_of(hd) || !nkt.is_multiple_of(hd) {
            return Err(format!(
                "q rows {nqt} and k rows {nkt} are not whole heads of {hd}"
            ));
        }
        let [x_id, pos] = match ids {
            [a, b] => [*a, *b],
            _ => return Err(format!("takes 2 sources, got {}", ids.len())),
        };
        let xl = self.len(x_id);
        let x = self.src_arg(x_id, out)?;
        let mm = MatmulArgs {
            name: f.weight,
            in_dim: f.n_embd,
            out_dim: rows,
            bias: None,
            y_stride: rows,
            y_off: 0,
        };
        self.matmul(&mm, x, xl, 1, out)?;
        let (q, k, v) = (
            Arg::BufAt(out, 0),
            Arg::BufAt(out, nqt),
            Arg::BufAt(out, nqt + nkt),
        );
        for (b, at, len) in [(f.q_bias, q, nqt), (f.k_bias, k, nkt), (f.v_bias, v, nkt)] {
            if let Some(b) = b {
                self.add_bias(at, len, b, len)?;
            }
        }
        if let Some((qn, kn, eps)) = f.norms {
            self.norm_rows(q, nqt / hd, hd, qn, eps)?;
            self.norm_rows(k, nkt / hd, hd, kn, eps)?;
        }
        self.rope_at(pos, q, 1, nqt / hd, f.rope, rows)?;
        self.rope_at(pos, k, 1, nkt / hd, f.rope, rows)?;
        let kv = kv_pair.ok_or_else(|| format!("no KV region for layer {}", f.layer))?;
        if kv.0 == kv.1 || [kv.0, kv.1].contains(&out) || [kv.0, kv.1].contains(&pos) {
            return Err(format!("layer {}: bad KV pair {kv:?}", f.layer));
        }
        self.store_rows(f.layer, k, v, pos, 1, nkt, f.n_ctx, kv)
    }

    /// The mixed-quant epilogue (`qkv_bias_rope_store`): biases on the three matmul
    /// outputs, rope on q (the output) and k, and the store of k and v at the positions.
    /// k and v are worked on in snapshot areas, leaving their sources as they were.
    fn qkv_bias_rope_store(
        &mut self,
        node: &CNode,
        m: &QkvBiasRopeStoreMeta,
        layer: usize,
        ids: &[usize],
        out: usize,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let nt = node.out_shape[1].max(1);
        let (nqt, nkt, hd) = (m.nqt, m.nkt, m.rope.hd);
        let [q_in, k_in, v_in, pos] = match ids {
            [a, b, c, d] => [*a, *b, *c, *d],
            _ => return Err(format!("takes 4 sources, got {}", ids.len())),
        };
        if hd == 0
            || !nqt.is_multiple_of(hd)
            || !nkt.is_multiple_of(hd)
            || node.n_elements() != nqt * nt
        {
            return Err(format!(
                "output {:?} is not [{nqt}, {nt}] in heads of {hd} (k rows {nkt})",
                node.out_shape
            ));
        }
        if self.len(q_in) < nqt * nt || self.len(k_in) < nkt * nt || self.len(v_in) < nkt * nt {
            return Err(format!(
                "q {} / k {} / v {} values for {nt} tokens of {nqt} / {nkt}",
                self.len(q_in),
                self.len(k_in),
                self.len(v_in)
            ));
        }
        if q_in != out {
            self.pending.push(Cmd::Copy {
                src: Arg::Buf(q_in),
                dst: Arg::Buf(out),
                len: nqt * nt,
            });
        }
        let k = self.snapshot(1, Arg::Buf(k_in), nkt * nt)?;
        let v = self.snapshot(2, Arg::Buf(v_in), nkt * nt)?;
        self.add_bias(Arg::Buf(out), nqt * nt, &m.q_bias, nqt)?;
        self.add_bias(k, nkt * nt, &m.k_bias, nkt)?;
        self.add_bias(v, nkt * nt, &m.v_bias, nkt)?;
        self.rope_at(pos, Arg::Buf(out), nt, nqt / hd, &m.rope, nqt)?;
        self.rope_at(pos, k, nt, nkt / hd, &m.rope, nkt)?;
        let kv = kv_pair.ok_or_else(|| format!("no KV region for layer {layer}"))?;
        if kv.0 == kv.1 || [kv.0, kv.1].contains(&out) || [kv.0, kv.1].contains(&pos) {
            return Err(format!("layer {layer}: bad KV pair {kv:?}"));
        }
        self.store_rows(layer, k, v, pos, nt, nkt, m.n_ctx, kv)
    }

    fn run(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        if in_bufs.len() != node.src.len() {
            return Err(format!(
                "{} sources but {} input buffers",
                node.src.len(),
                in_bufs.len()
            ));
        }
        let is_attn = matches!(node.op, Op::Attn { .. });
        let out = self.pool(out_buf, "the output")?;
        let mut ids = Vec::with_capacity(in_bufs.len());
        for (i, b) in in_bufs.iter().enumerate() {
            // Attention's second source is the KV view; the kernel reads `kv_pair` instead.
            if is_attn && i == 1 {
                ids.push(usize::MAX);
                continue;
            }
            ids.push(self.pool(*b, &format!("source {i}"))?);
        }
        let n = node.n_elements();
        if !matches!(
            node.op,
            Op::KvcacheStore { .. } | Op::Input | Op::KvcacheLoad { .. }
        ) && self.len(out) < n
        {
            return Err(format!(
                "output buffer holds {}, node needs {n}",
                self.len(out)
            ));
        }
        let nt = node.out_shape[1].max(1);
        let src_id = |i: usize| {
            ids.get(i)
                .copied()
                .ok_or_else(|| format!("missing source {i}"))
        };
        let src_len = |i: usize, me: &Self| ids.get(i).map_or(0, |&id| me.len(id));
        let un = |v: usize, what: &str| u32_of(v, what).map(Arg::U32);
        match (&node.op, &node.meta) {
            (Op::Input | Op::KvcacheLoad { .. }, _) => return Ok(()),
            (Op::Add | Op::Mul, _) => {
                let (na, nb) = (src_len(0, self), src_len(1, self));
                if na < n || nb == 0 || !n.is_multiple_of(nb) {
                    return Err(format!(
                        "{}: cannot combine {na} values with {nb} (broadcast) into {n}",
                        node.op.name()
                    ));
                }
                let k = if node.op == Op::Add {
                    Kernel::Add
                } else {
                    Kernel::Mul
                };
                // Element i reads a[i] and b[i % nb] only: in place is safe for a; a
                // broadcast b that is the output is snapshotted.
                let a = Arg::Buf(src_id(0)?);
                let b = if nb < n {
                    self.src_arg(src_id(1)?, out)?
                } else {
                    Arg::Buf(src_id(1)?)
                };
                let geom = dispatch::elementwise_geom(n)?;
                self.launch(
                    k,
                    geom,
                    vec![a, b, Arg::Buf(out), un(n, "elements")?, un(nb, "elements")?],
                );
            }
            (Op::Silu, _) => {
                if src_len(0, self) < n {
                    return Err(format!("silu: {} inputs for {n} outputs", src_len(0, self)));
                }
                let geom = dispatch::elementwise_geom(n)?;
                self.launch(
                    Kernel::Silu,
                    geom,
                    vec![Arg::Buf(src_id(0)?), Arg::Buf(out), un(n, "elements")?],
                );
            }
            (Op::SwiGLU, _) => {
                if src_len(0, self) < n || src_len(1, self) < n {
                    return Err(format!(
                        "swiglu: gate {} and up {} values for {n} outputs",
                        src_len(0, self),
                        src_len(1, self)
                    ));
                }
                let geom = dispatch::elementwise_geom(n)?;
                self.launch(
                    Kernel::SwiGlu,
                    geom,
                    vec![
                        Arg::Buf(src_id(0)?),
                        Arg::Buf(src_id(1)?),
                        Arg::Buf(out),
                        un(n, "elements")?,
                    ],
                );
            }
            (Op::RmsNorm { eps }, _) => {
                let (x, xl) = (Arg::Buf(src_id(0)?), src_len(0, self));
                self.norm(node, node.out_shape[0], *eps, x, xl, out)?;
            }
            (Op::QkNorm { hd, eps, .. }, _) => {
                let (x, xl) = (Arg::Buf(src_id(0)?), src_len(0, self));
                self.norm(node, *hd, *eps, x, xl, out)?;
            }
            (Op::MatMul { .. }, NodeMeta::MatMul(m)) => {
                if m.out_dim * nt != n {
                    return Err(format!(
                        "output [{}, {nt}] does not match weight '{}' out_dim {}",
                        node.out_shape[0], m.weight_name, m.out_dim
                    ));
                }
                let xl = src_len(0, self);
                let x = self.src_arg(src_id(0)?, out)?;
                let mm = MatmulArgs {
                    name: &m.weight_name,
                    in_dim: m.in_dim,
                    out_dim: m.out_dim,
                    bias: m.bias_name.as_deref(),
                    y_stride: m.out_dim,
                    y_off: 0,
                };
                self.matmul(&mm, x, xl, nt, out)?;
            }
            (Op::FusedFFN, NodeMeta::FusedFfn(m)) => {
                let nf = m.nf;
                if n != 2 * nf * nt {
                    return Err(format!(
                        "output {:?} is not [2 x {nf}, {nt}]",
                        node.out_shape
                    ));
                }
                let xl = src_len(0, self);
                let x = self.src_arg(src_id(0)?, out)?;
                // gate into columns 0..nf of each row, up into nf..2nf, then SwiGLU in
                // place over the gate half: the unfused chain's kernels in one node.
                for (name, y_off) in [(&m.gate_weight, 0), (&m.up_weight, nf)] {
                    let mm = MatmulArgs {
                        name,
                        in_dim: m.n_embd,
                        out_dim: nf,
                        bias: None,
                        y_stride: 2 * nf,
                        y_off,
                    };
                    self.matmul(&mm, x, xl, nt, out)?;
                }
                let geom = dispatch::elementwise_geom(nt * nf)?;
                self.launch(
                    Kernel::SwiGluRows,
                    geom,
                    vec![
                        Arg::Buf(out),
                        un(nt * nf, "elements")?,
                        un(nf, "FFN width")?,
                    ],
                );
            }
            (Op::GetRows, NodeMeta::Embed(m)) => {
                let w = self.weight(&m.weight_name)?;
                let (ty, row_bytes, rows, index) = (w.ty, w.row_bytes, w.out_dim, w.index);
                if w.in_dim != m.n_embd || node.out_shape[0] != m.n_embd || n != nt * m.n_embd {
                    return Err(format!(
                        "table '{}' rows hold {}, node expects {} (output {:?})",
                        m.weight_name, w.in_dim, m.n_embd, node.out_shape
                    ));
                }
                let toks = self.host_ints(src_id(0)?, nt, "token ids")?;
                if let Some((i, id)) = toks
                    .iter()
                    .enumerate()
                    .find(|&(_, &id)| id < 0 || id as usize >= rows)
                {
                    return Err(format!(
                        "embedding: id {id} (token {i}) outside the table's {rows} rows"
                    ));
                }
                let geom = dispatch::embed_geom(nt)?;
                self.launch(
                    Kernel::Embed(ty),
                    geom,
                    vec![
                        Arg::Weight(index),
                        Arg::Buf(src_id(0)?),
                        Arg::Buf(out),
                        un(m.n_embd, "row length")?,
                        un(row_bytes, "row bytes")?,
                    ],
                );
            }
            (Op::GetRows, _) => {
                let d = node.out_shape[0];
                let rows = src_len(0, self).checked_div(d).unwrap_or(0);
                if d == 0 || n != nt * d {
                    return Err(format!("get_rows: {n} outputs for {nt} ids of {d}"));
                }
                let sel_id = *ids.get(1).ok_or("get_rows needs 2 sources")?;
                let sel = self.host_ints(sel_id, nt, "row ids")?;
                if let Some((i, id)) = sel
                    .iter()
                    .enumerate()
                    .find(|&(_, &id)| id < 0 || id as usize >= rows)
                {
                    return Err(format!(
                        "get_rows: id {id} (row {i}) outside the {rows} input rows"
                    ));
                }
                let x = self.src_arg(src_id(0)?, out)?;
                let geom = dispatch::elementwise_geom(n)?;
                self.launch(
                    Kernel::Gather,
                    geom,
                    vec![
                        x,
                        Arg::Buf(sel_id),
                        Arg::Buf(out),
                        un(d, "row length")?,
                        un(nt, "rows")?,
                    ],
                );
            }
            (Op::RoPE { style, .. }, NodeMeta::Rope(m)) => {
                if *style != m.style {
                    return Err(format!(
                        "op style {style:?} but metadata style {:?}",
                        m.style
                    ));
                }
                // No frequency-factor term in the kernel; `supports_op` declines such nodes.
                if m.freq_factors.is_some() {
                    return Err("rope with frequency factors is not implemented here".into());
                }
                if m.n_dims == 0 || !m.n_dims.is_multiple_of(2) || m.n_dims > m.hd {
                    return Err(format!(
                        "rope: n_dims {} must be even, positive and at most hd {}",
                        m.n_dims, m.hd
                    ));
                }
                let stride = n / nt;
                let row = m.n_head * m.hd;
                if stride < row || src_len(0, self) < n || src_len(1, self) < nt {
                    return Err(format!(
                        "rope: {} values for {nt} rows of {stride} (heads need {row}), {} positions",
                        src_len(0, self),
                        src_len(1, self)
                    ));
                }
                let x = src_id(0)?;
                if x != out {
                    self.pending.push(Cmd::Copy {
                        src: Arg::Buf(x),
                        dst: Arg::Buf(out),
                        len: n,
                    });
                }
                self.rope_at(src_id(1)?, Arg::Buf(out), nt, m.n_head, m, stride)?;
            }
            (Op::KvcacheStore { layer }, meta) => {
                return self.kv_store(*layer, meta, &ids, kv_pair);
            }
            (Op::FusedQKV { layer }, NodeMeta::FusedQkv(m)) => {
                let parts = FusedQkvParts {
                    layer: *layer,
                    weight: &m.qkv_weight,
                    n_embd: m.n_embd,
                    nqt: m.nqt,
                    nkt: m.nkt,
                    q_bias: m.q_bias.as_deref(),
                    k_bias: m.k_bias.as_deref(),
                    v_bias: m.v_bias.as_deref(),
                    norms: None,
                    rope: &m.rope,
                    n_ctx: m.n_ctx,
                };
                self.fused_qkv(node, &parts, &ids, out, kv_pair)?;
            }
            (Op::FusedQkvNorm { layer }, NodeMeta::FusedQkvNorm(m)) => {
                let parts = FusedQkvParts {
                    layer: *layer,
                    weight: &m.qkv_weight,
                    n_embd: m.n_embd,
                    nqt: m.nqt,
                    nkt: m.nkt,
                    q_bias: None,
                    k_bias: None,
                    v_bias: None,
                    norms: Some((&m.q_norm, &m.k_norm, m.eps)),
                    rope: &m.rope,
                    n_ctx: m.n_ctx,
                };
                self.fused_qkv(node, &parts, &ids, out, kv_pair)?;
            }
            (Op::QkvBiasRopeStore { layer }, NodeMeta::QkvBiasRopeStore(m)) => {
                self.qkv_bias_rope_store(node, m, *layer, &ids, out, kv_pair)?;
            }
            (Op::Attn { explicit_span, .. }, NodeMeta::Attn(m)) => {
                let (k_id, v_id) =
                    kv_pair.ok_or_else(|| format!("no KV region for layer {}", m.layer))?;
                if k_id == v_id
                    || k_id == out
                    || v_id == out
                    || k_id >= self.bufs.len()
                    || v_id >= self.bufs.len()
                {
                    return Err(format!(
                        "layer {}: KV pair ({k_id}, {v_id}) unusable (output buffer {out})",
                        m.layer
                    ));
                }
                if m.n_head == 0 || m.n_head_kv == 0 || !m.n_head.is_multiple_of(m.n_head_kv) {
                    return Err(format!(
                        "attention geometry: n_head {} must be a positive multiple of n_head_kv {}",
                        m.n_head, m.n_head_kv
                    ));
                }
                let geom = dispatch::attn_geom(m.n_head, nt, m.hd)?;
                let qrow = m.n_head * m.hd;
                if n != nt * qrow {
                    return Err(format!(
                        "output {:?} is not [{} x {}, {nt}]",
                        node.out_shape, m.n_head, m.hd
                    ));
                }
                let q_stride =
                    m.check_q_and_kv(nt, src_len(0, self), self.len(k_id), self.len(v_id))?;
                let pos_id = *ids.get(2).ok_or("attention needs a positions source")?;
                let span_id = if *explicit_span {
                    let s = *ids.get(3).ok_or("span attention needs a span source")?;
                    m.check_spans(&self.host_ints(s, 2 * nt, "attention spans")?)?;
                    s
                } else {
                    m.check_positions(&self.host_ints(pos_id, nt, "attention positions")?)?;
                    pos_id
                };
                let q = self.src_arg(src_id(0)?, out)?;
                self.launch(
                    Kernel::Attn,
                    geom,
                    vec![
                        q,
                        Arg::Buf(k_id),
                        Arg::Buf(v_id),
                        Arg::Buf(pos_id),
                        Arg::Buf(span_id),
                        Arg::Buf(out),
                        un(m.n_head, "heads")?,
                        un(m.n_head_kv, "kv heads")?,
                        un(m.hd, "head dim")?,
                        un(m.n_ctx, "context")?,
                        un(q_stride, "q stride")?,
                        f32_arg(m.scale),
                        Arg::U32(u32::from(*explicit_span)),
                    ],
                );
            }
            (op, meta) => {
                return Err(format!(
                    "{} with metadata {meta:?} is not implemented by the CUDA backend",
                    op.name()
                ))
            }
        }
        self.bufs[out].host = Host::Unknown;
        Ok(())
    }

    /// Runs the recorded split through the replay cache and waits for the stream.
    fn flush(&mut self) -> Result<(), String> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if let Some(e) = self.bad_launch.take() {
            self.pending.clear();
            self.staged.clear();
            self.nodes = None;
            return Err(e);
        }
        self.gpu.bind()?;
        let cmds = std::mem::take(&mut self.pending);
        let staged = std::mem::take(&mut self.staged);
        let nodes = self.nodes.take().map_or((0, 0), |(a, b)| (a, b + 1));
        if !staged.is_empty() {
            if self.staging.as_ref().is_none_or(|p| p.len() < staged.len()) {
                self.staging = Some(Pinned::new(crate::device::staging_len(staged.len())?)?);
                self.bump();
            }
            if let Some(p) = self.staging.as_mut() {
                p.as_mut_slice()[..staged.len()].copy_from_slice(&staged);
            }
        }
        let mut launcher = DevLauncher {
            gpu: &self.gpu,
            bufs: self
                .bufs
                .iter()
                .map(|b| b.mem.as_ref().map(|m| m.ptr))
                .collect(),
            weights: self.weight_mem.iter().map(|m| m.ptr).collect(),
            scratch: self.scratch.as_ref().map(|m| m.ptr),
            snaps: self.snaps.iter().map(|(&k, m)| (k, m.ptr)).collect(),
            staging: self.staging.as_ref(),
        };
        let key = SplitKey { nodes, cmds };
        let mode = self.replay.run(&mut launcher, self.generation, key)?;
        let slot = match mode {
            Mode::Direct => {
                self.stats.direct += 1;
                0
            }
            Mode::Capture => {
                self.stats.captured += 1;
                1
            }
            Mode::Replay => {
                self.stats.replayed += 1;
                2
            }
        };
        PROCESS_STATS[slot].fetch_add(1, Ordering::Relaxed);
        self.gpu.sync()
    }

    fn readback(&mut self, id: usize) -> Result<Vec<f32>, String> {
        self.take_failure()?;
        self.gpu.bind()?;
        self.flush()?;
        let b = self
            .bufs
            .get(id)
            .ok_or_else(|| format!("buffer {id} does not exist"))?;
        let ptr = b
            .mem
            .as_ref()
            .map(|m| m.ptr)
            .ok_or_else(|| format!("buffer {id} has no storage"))?;
        let mut out = vec![0f32; b.len];
        self.gpu.readback(ptr, &mut out, &mut self.readback)?;
        Ok(out)
    }

    fn take_failure(&mut self) -> Result<(), String> {
        match self.failed.take() {
            Some(e) => Err(format!("an earlier split failed: {e}")),
            None => Ok(()),
        }
    }

    fn ensure_storage(&mut self, id: usize) -> Result<(), String> {
        if self.bufs[id].mem.is_none() {
            self.gpu.bind()?;
            self.bufs[id].mem = Some(DevMem::zeroed(self.bufs[id].len * 4)?);
            self.bufs[id].host = Host::Zero;
            self.bump();
        }
        Ok(())
    }
}

impl BackendImpl for CudaBackend {
    fn id(&self) -> Backend {
        Backend::CUDA
    }

    fn name(&self) -> &str {
        "cuda"
    }

    fn register_gguf(&mut self, file: &Arc<GgufFile>) -> Result<usize, String> {
        let mut added = 0;
        for info in file.tensors() {
            let name = info.name.clone();
            if !WEIGHT_TYPES.contains(&info.ggml_type) {
                self.skipped.insert(name, info.ggml_type);
                continue;
            }
            let dims = info
                .dims
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| {
                    format!("weight '{name}': dims {:?} do not fit in memory", info.dims)
                })?;
            if self.register_weight(&name, info.ggml_type, &dims, file.tensor_data(info))? {
                added += 1;
            }
        }
        added += self.register_qkv_concats(file)?;
        Ok(added)
    }

    fn is_gpu(&self) -> bool {
        true
    }

    fn device_info(&self) -> Option<minfer_graph::DeviceInfo> {
        Some(self.gpu.summary.device_info())
    }

    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        dtype == DType::F32
            && matches!(
                op,
                Op::Add
                    | Op::Mul
                    | Op::Silu
                    | Op::SwiGLU
                    | Op::RmsNorm { .. }
                    | Op::QkNorm { .. }
                    | Op::MatMul { .. }
                    | Op::GetRows
                    | Op::RoPE {
                        freq_factors: false,
                        ..
                    }
                    | Op::Attn { .. }
                    | Op::KvcacheStore { .. }
                    | Op::KvcacheLoad { .. }
                    | Op::FusedFFN
                    | Op::FusedQKV { .. }
                    | Op::FusedQkvNorm { .. }
                    | Op::QkvBiasRopeStore { .. }
            )
    }

    fn supports_node(&self, node: &CNode) -> bool {
        // Every op that touches the KV regions (the QKV fusions store into them).
        let kv = node.kv_layer().is_some();
        self.supports_op(&node.op, node.out_dtype)
            && (self.kv_here || !kv)
            && self.weights_decoded(node)
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        match fused {
            FusedOp::SwiGLU | FusedOp::DecodeFfn => true,
            // Claimed only where every fused node would run here: the host has no kernel
            // for them, and with a packed KV format the stores stay on the host.
            FusedOp::DecodeQkv => self.kv_here && self.qkv_fusable,
        }
    }

    fn supports_attn_span(&self) -> bool {
        true
    }

    fn alloc_buffer(&mut self, size: usize) -> usize {
        if let Some(pos) = self.reusable(size) {
            return self.reuse(pos, size);
        }
        self.alloc_fresh(size)
    }

    fn alloc_fresh(&mut self, size: usize) -> usize {
        // This form cannot fail: a failed allocation leaves the buffer without storage,
        // and the first command that uses it fails naming it. The allocator uses
        // `try_alloc_fresh`, which reports the failure at allocation instead.
        let mem = self.device_mem(size).ok();
        self.push_buf(mem, size)
    }

    fn max_buffer_elems(&self) -> usize {
        usize::try_from(self.gpu.summary.max_buffer_bytes() / 4).unwrap_or(usize::MAX)
    }

    fn try_alloc_buffer(&mut self, size: usize) -> Result<usize, String> {
        minfer_graph::check_buffer_size("cuda", size, self.max_buffer_elems())?;
        if let Some(pos) = self.reusable(size) {
            return Ok(self.reuse(pos, size));
        }
        self.try_alloc_fresh(size)
    }

    fn try_alloc_fresh(&mut self, size: usize) -> Result<usize, String> {
        minfer_graph::check_buffer_size("cuda", size, self.max_buffer_elems())?;
        let mem = self.device_mem(size)?;
        Ok(self.push_buf(Some(mem), size))
    }

    fn free_buffer(&mut self, id: usize) {
        if id < self.bufs.len() && !self.free.contains(&id) {
            self.free.push(id);
        }
    }

    fn pool_len(&self) -> usize {
        self.bufs.len()
    }

    fn pool_elems(&self) -> usize {
        self.bufs
            .iter()
            .filter(|b| b.mem.is_some())
            .map(|b| b.len)
            .sum()
    }

    fn release_unused(&mut self, in_use: &[usize]) {
        let mut dropped = false;
        for &id in &self.free {
            if !in_use.contains(&id) {
                if let Some(b) = self.bufs.get_mut(id) {
                    dropped |= b.mem.take().is_some();
                }
            }
        }
        // Recycling needs storage, so released ids leave the free list.
        let bufs = &self.bufs;
        self.free.retain(|&id| bufs[id].mem.is_some());
        if dropped {
            self.bump();
        }
    }

    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        self.take_failure()?;
        self.nodes = Some(match self.nodes {
            None => (node.id, node.id),
            Some((a, b)) => (a.min(node.id), b.max(node.id)),
        });
        self.run(node, in_bufs, out_buf, kv_pair)
            .map_err(|e| format!("node {} '{}' ({}): {e}", node.id, node.name, node.op.name()))
    }

    fn read_host(&self, _id: usize) -> Option<&[f32]> {
        None
    }

    fn copy_to_host(&mut self, id: usize) -> Option<Vec<f32>> {
        self.readback(id).ok()
    }

    fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), String> {
        let len = self
            .bufs
            .get(id)
            .ok_or_else(|| format!("buffer {id} does not exist"))?
            .len;
        if len != data.len() {
            return Err(format!(
                "buffer {id} holds {len} values, got {}",
                data.len()
            ));
        }
        self.write_host_window(id, 0, data)?;
        self.bufs[id].host = if len <= HOST_COPY_MAX {
            Host::Known(data.to_vec())
        } else {
            Host::Unknown
        };
        Ok(())
    }

    fn write_host_window(&mut self, id: usize, offset: usize, data: &[f32]) -> Result<(), String> {
        let len = self
            .bufs
            .get(id)
            .ok_or_else(|| format!("buffer {id} does not exist"))?
            .len;
        let end = offset
            .checked_add(data.len())
            .filter(|&e| e <= len)
            .ok_or_else(|| format!("window {offset}+{} exceeds buffer {id} ({len})", data.len()))?;
        if data.is_empty() {
            return Ok(());
        }
        self.ensure_storage(id)?;
        // Recorded in order with the launches, from the pinned staging area.
        self.pending.push(Cmd::Upload {
            dst: id,
            offset,
            len: data.len(),
            staging: self.staged.len(),
        });
        self.staged.extend_from_slice(data);
        let host = std::mem::replace(&mut self.bufs[id].host, Host::Unknown);
        self.bufs[id].host = match host {
            Host::Zero if len <= HOST_COPY_MAX => {
                let mut v = vec![0.0; len];
                v[offset..end].copy_from_slice(data);
                Host::Known(v)
            }
            Host::Known(mut v) => {
                v[offset..end].copy_from_slice(data);
                Host::Known(v)
            }
            Host::Zero | Host::Unknown => Host::Unknown,
        };
        Ok(())
    }

    fn synchronize(&mut self) {
        // The trait's wait cannot fail; an error is kept and reported by the next
        // readback (which fails), so it is never lost.
        if let Err(e) = self.flush() {
            self.pending.clear();
            self.staged.clear();
            self.nodes = None;
            self.failed = Some(e);
        }
    }

    fn copy_cross(&mut self, src_id: usize) -> Result<minfer_graph::CrossCopy, String> {
        let data = self.readback(src_id)?;
        Ok(minfer_graph::CrossCopy {
            src_id,
            data: Some(data),
            token: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_arguments_are_checked_against_the_kernel_signature() {
        let ok = [
            Arg::Buf(0),
            Arg::Weight(1),
            Arg::BufAt(2, 5),
            Arg::U32(3),
            Arg::U32(4),
        ];
        assert!(args_match(Kernel::Add, &ok));
        // A value where an address goes, a missing argument, a float for an integer.
        assert!(!args_match(
            Kernel::Add,
            &[Arg::U32(0), ok[1], ok[2], ok[3], ok[4]]
        ));
        assert!(!args_match(Kernel::Add, &ok[..4]));
        assert!(!args_match(
            Kernel::Add,
            &[ok[0], ok[1], ok[2], Arg::F32(0), ok[4]]
        ));
        let norm = [
            Arg::Buf(0),
            Arg::Buf(0),
            Arg::Snap(0, 8),
            Arg::U32(8),
            Arg::F32(0),
            Arg::U32(1),
        ];
        assert!(args_match(Kernel::RmsNorm, &norm));
    }
}
