//! `WgpuBackend`: pool, weights, host I/O and node execution on a wgpu device.
//!
//! - Pool: device storage buffers of f32 addressed by id; `alloc_buffer` reuses a free
//!   id of exactly the requested length (cleared on the device), `alloc_fresh` always
//!   creates one. An id never changes its buffer, so cached bind groups stay valid.
//! - Ordering: host writes, clears, copies and dispatches are all recorded into the
//!   one open command encoder in call order; `synchronize` submits it and waits.
//! - Index inputs (token ids, positions, KV cells, spans) are range checked before a
//!   kernel may read them. They arrive through `write_host` (the allocator fills
//!   inputs and stages cross-backend values that way), so the pool keeps a host copy
//!   of every small buffer the host wrote, dropped as soon as a kernel overwrites it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::{
    Backend, BackendImpl, BufRef, CNode, DType, FusedOp, NodeMeta, Op, RoPEMeta, RopeStyle,
};
use wgpu::util::DeviceExt;

use crate::device::{self, AdapterSummary, Gpu, NotUsable};
use crate::kernels::{ActFormat, Bind, Kernel, Tile, WEIGHT_TYPES};

// The per-node trace's staging; a child module, so it reaches the pool and the encoder.
#[path = "trace.rs"]
mod trace;

/// A weight registration refused, with the name and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("weight '{name}': {problem}")]
pub struct WeightError {
    /// Tensor name.
    pub name: String,
    /// What is wrong.
    pub problem: String,
}

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
    buf: wgpu::Buffer,
    len: usize,
    host: Host,
}

struct DevWeight {
    ty: GgmlType,
    in_dim: usize,
    out_dim: usize,
    /// Bytes of one row (`out_dim` rows of `in_dim` values).
    row_bytes: usize,
    /// Row ranges of the weight, each in its own buffer (most weights have one).
    parts: Vec<Part>,
}

/// Rows `row0..row0 + rows` of a weight, held by weight buffer `index`.
#[derive(Debug, Clone, Copy)]
struct Part {
    index: usize,
    row0: usize,
    rows: usize,
}

/// One matmul dispatch: weight, dims and where its rows land in the output.
struct MatmulArgs<'a> {
    name: &'a str,
    in_dim: usize,
    out_dim: usize,
    bias: Option<&'a str>,
    /// Values between token rows of the output.
    y_stride: usize,
    /// First output column written.
    y_off: usize,
    /// `x` already holds the activations rounded for this weight's type (a fused node
    /// rounds its input once for several matmuls).
    rounded: bool,
}

/// The k and v token rows one KV store reads: the buffer, its length and the first
/// column of each, `stride` values between token rows, and the pool buffer of the
/// cells they land in (host-written, so range checked before the dispatch).
struct KvRows {
    layer: usize,
    n_embd: usize,
    n_ctx: usize,
    nt: usize,
    stride: usize,
    k: (Res, usize, usize),
    v: (Res, usize, usize),
    cells: usize,
}

/// One decode QKV fusion (`FusedQKV`, or `FusedQkvNorm` with `norms`): the q|k|v
/// weight, the geometry, the optional biases and per-head norms, and the rope.
struct QkvPlan<'a> {
    layer: usize,
    weight: &'a str,
    n_embd: usize,
    nqt: usize,
    nkt: usize,
    biases: [Option<&'a str>; 3],
    /// q and k norm weights and their epsilon.
    norms: Option<([&'a str; 2], f32)>,
    rope: &'a RoPEMeta,
    n_ctx: usize,
}

/// A resource bound into a kernel's bind group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Res {
    Pool(usize),
    Weight(usize),
    /// The snapshot buffer of this many f32s (an input that aliases the output).
    Snap(usize),
    /// The rounded-activation scratch of this many f32s (a quantized matmul's input).
    Act(usize),
    /// Scratch `slot` of this many f32s, for values a fused node keeps to itself.
    Tmp(u8, usize),
}

/// u32 slots of a kernel's uniform parameter block (a multiple of four: 16-byte rows).
const PARAMS: usize = 12;

type BindKey = (Kernel, Vec<Res>, [u32; PARAMS]);

/// The wgpu graph backend (id [`Backend::WGPU`], name "wgpu").
pub struct WgpuBackend {
    gpu: Gpu,
    bufs: Vec<DevBuf>,
    free: Vec<usize>,
    weights: HashMap<String, DevWeight>,
    weight_bufs: Vec<wgpu::Buffer>,
    /// Tensors of a registered file whose type no shader decodes, kept to name it.
    skipped: HashMap<String, GgmlType>,
    pipelines: HashMap<Kernel, (wgpu::ComputePipeline, wgpu::BindGroupLayout)>,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    snapshots: HashMap<usize, wgpu::Buffer>,
    /// Rounded-activation scratch by length: each quantized matmul rounds its input
    /// here first, as the CPU quantizes into its matmul scratch.
    act_scratch: HashMap<usize, wgpu::Buffer>,
    /// A fused node's own intermediate values, by slot and length.
    tmp_scratch: HashMap<(u8, usize), wgpu::Buffer>,
    encoder: Option<wgpu::CommandEncoder>,
    /// Validation errors the device reported asynchronously.
    errors: Arc<Mutex<Vec<String>>>,
    /// Whether the KV regions may live here: the kernels store f32 rows only, so with
    /// a packed KV format the stores and attention stay on the host by capability.
    kv_here: bool,
    /// Device waits so far (see `waits`).
    waits: Arc<std::sync::atomic::AtomicUsize>,
    /// A lower buffer limit than the device's, in f32s (tests of placement by size).
    buffer_cap: Option<usize>,
}

impl std::fmt::Debug for WgpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuBackend")
            .field("adapter", &self.gpu.summary.name)
            .field("buffers", &self.bufs.len())
            .field("free", &self.free.len())
            .field("weights", &self.weights.len())
            .finish_non_exhaustive()
    }
}

/// Largest host-written buffer whose values the pool remembers. Index inputs are a
/// few values per token; staged activations can be megabytes and are never indices.
const HOST_COPY_MAX: usize = 1 << 16;

/// Bind groups kept before the cache is dropped wholesale (graphs are few and reused).
const BIND_GROUP_CACHE: usize = 1 << 14;

/// Workgroups along x before a grid wraps into y (the WebGPU per-dimension minimum).
const MAX_GROUPS_X: u32 = 65_535;

/// A 2-D grid holding `groups` workgroups.
fn grid(groups: usize) -> Result<(u32, u32), String> {
    let g = u32::try_from(groups).map_err(|_| format!("{groups} workgroups overflow u32"))?;
    let gx = g.clamp(1, MAX_GROUPS_X);
    let gy = g.div_ceil(gx).max(1);
    if gy > MAX_GROUPS_X {
        return Err(format!("{groups} workgroups exceed the dispatch grid"));
    }
    Ok((gx, gy))
}

/// The names a q|k|v concatenation weight stands for: itself, and for the
/// `..attn_qkv.weight` form the three matrices `..attn_{q,k,v}.weight`.
fn qkv_names(concat: &str) -> Vec<String> {
    let mut v = vec![concat.to_string()];
    if let Some(stem) = concat.strip_suffix("attn_qkv.weight") {
        v.extend(["q", "k", "v"].map(|x| format!("{stem}attn_{x}.weight")));
    }
    v
}

fn u32_of(v: usize, what: &str) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{what} {v} does not fit the kernels' 32-bit indices"))
}

fn as_i32(v: f32) -> i32 {
    v.to_bits() as i32
}

impl WgpuBackend {
    /// The best usable adapter's backend, or why there is none. CPU-emulation adapters
    /// (llvmpipe/lavapipe, WARP) are taken only when `allow_cpu_adapter` is set, which
    /// callers do when the user named this backend explicitly.
    pub fn probe(allow_cpu_adapter: bool) -> Result<WgpuBackend, NotUsable> {
        let gpu = device::open(allow_cpu_adapter)?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&errors);
        gpu.device
            .on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                if let Ok(mut v) = sink.lock() {
                    v.push(e.to_string());
                }
            }));
        Ok(WgpuBackend {
            gpu,
            bufs: Vec::new(),
            free: Vec::new(),
            weights: HashMap::new(),
            weight_bufs: Vec::new(),
            skipped: HashMap::new(),
            pipelines: HashMap::new(),
            bind_groups: HashMap::new(),
            snapshots: HashMap::new(),
            act_scratch: HashMap::new(),
            tmp_scratch: HashMap::new(),
            encoder: None,
            errors,
            kv_here: true,
            waits: Arc::default(),
            buffer_cap: None,
        })
    }

    /// Takes the engine's KV storage formats: the kernels hold f32 rows only, so any
    /// other format leaves KV stores, loads and attention to a backend that has it.
    pub fn set_kv_types(&mut self, types: [minfer_graph::KvType; 2]) {
        self.kv_here = types == [minfer_graph::KvType::F32; 2];
    }

    /// Whether every weight `node` names is one the kernels decode. A weight of a type
    /// no shader reads (remembered at registration) declines the node, so it runs
    /// where its type is implemented instead of failing at execution.
    fn weights_decoded(&self, node: &CNode) -> bool {
        let decoded = |name: &str| !self.skipped.contains_key(name);
        match &node.meta {
            NodeMeta::MatMul(m) => {
                decoded(&m.weight_name) && m.bias_name.as_deref().is_none_or(decoded)
            }
            NodeMeta::Embed(m) => decoded(&m.weight_name),
            NodeMeta::Norm(m) => m.weight_name.as_deref().is_none_or(decoded),
            NodeMeta::FusedFfn(m) => decoded(&m.gate_weight) && decoded(&m.up_weight),
            NodeMeta::FusedQkv(m) => {
                qkv_names(&m.qkv_weight).iter().all(|n| decoded(n))
                    && [&m.q_bias, &m.k_bias, &m.v_bias]
                        .iter()
                        .all(|b| b.as_deref().is_none_or(decoded))
                    && m.rope.freq_factors.is_none()
            }
            NodeMeta::FusedQkvNorm(m) => {
                qkv_names(&m.qkv_weight).iter().all(|n| decoded(n))
                    && decoded(&m.q_norm)
                    && decoded(&m.k_norm)
                    && m.rope.freq_factors.is_none()
            }
            NodeMeta::QkvBiasRopeStore(m) => {
                decoded(&m.q_bias)
                    && decoded(&m.k_bias)
                    && decoded(&m.v_bias)
                    && m.rope.freq_factors.is_none()
            }
            _ => true,
        }
    }

    /// The most f32s one pool buffer may hold: every pool buffer is bound whole as
    /// storage and copied through a staging buffer, so the device's binding and
    /// buffer limits both bound it, and the kernels index in 32 bits.
    fn buffer_limit(&self) -> usize {
        let l = self.gpu.device.limits();
        let bytes = l
            .max_storage_buffer_binding_size
            .min(l.max_buffer_size)
            .min(u32::MAX as u64);
        let elems = usize::try_from(bytes / 4).unwrap_or(usize::MAX);
        self.buffer_cap.map_or(elems, |c| c.min(elems))
    }

    /// Holds pool buffers to at most `elems` f32s, below the device's own limit, so a
    /// test can reach the limit without buffers of hundreds of megabytes.
    #[doc(hidden)]
    pub fn cap_buffer_elems(&mut self, elems: usize) {
        self.buffer_cap = Some(elems);
    }

    /// The adapter in use, for `minfer info` and health output.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.gpu.summary
    }

    /// Compiled pipelines and cached bind groups: a reused graph adds neither.
    pub fn cached_kernels(&self) -> (usize, usize) {
        (self.pipelines.len(), self.bind_groups.len())
    }

    /// The weight types the kernels decode.
    pub fn weight_types() -> &'static [GgmlType] {
        &WEIGHT_TYPES
    }

    /// Uploads one tensor in its GGUF byte layout under `name`; `dims` are GGUF dims
    /// (`[in, out...]`, or `[n]` for a vector). Returns `false` when the name was
    /// already registered (the first one stays).
    pub fn register_weight(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<bool, WeightError> {
        let err = |problem: String| WeightError {
            name: name.to_string(),
            problem,
        };
        if self.weights.contains_key(name) {
            return Ok(false);
        }
        if !WEIGHT_TYPES.contains(&ty) {
            return Err(err(format!("type {ty} is not decoded by the wgpu kernels")));
        }
        let (in_dim, rest) = dims
            .split_first()
            .ok_or_else(|| err("no dimensions".into()))?;
        let in_dim = *in_dim;
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
        let want = row_bytes.checked_mul(out_dim);
        if want != Some(bytes.len()) {
            return Err(err(format!(
                "{} bytes, {ty} dims {dims:?} need {want:?}",
                bytes.len()
            )));
        }
        // A weight above the adapter's largest storage binding (the embedding table
        // and lm head of real models on some drivers) is split by whole rows.
        let limits = self.gpu.device.limits();
        let max = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size)
            .min(u32::MAX as u64) as usize;
        let rows_per_part = (max / row_bytes.max(1)).min(out_dim.max(1));
        if rows_per_part == 0 {
            return Err(err(format!(
                "one row of {row_bytes} bytes exceeds the adapter's largest storage binding ({max} bytes)"
            )));
        }
        let mut parts = Vec::new();
        let mut row0 = 0;
        while row0 < out_dim.max(1) {
            let rows = rows_per_part.min(out_dim.max(1) - row0);
            let chunk = &bytes
                [(row0 * row_bytes).min(bytes.len())..((row0 + rows) * row_bytes).min(bytes.len())];
            let mut data = chunk.to_vec();
            // Shaders read whole words; a binding may not be empty.
            data.resize(chunk.len().next_multiple_of(4).max(4), 0);
            let buf = self
                .gpu
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(name),
                    contents: &data,
                    usage: wgpu::BufferUsages::STORAGE,
                });
            self.weight_bufs.push(buf);
            parts.push(Part {
                index: self.weight_bufs.len() - 1,
                row0,
                rows,
            });
            row0 += rows;
        }
        self.weights.insert(
            name.to_string(),
            DevWeight {
                ty,
                in_dim,
                out_dim,
                row_bytes,
                parts,
            },
        );
        Ok(true)
    }

    /// Uploads every tensor of `file` under `namespace + name` whose type the kernels
    /// decode; the rest are remembered so a node using one fails naming its type.
    /// Returns how many were uploaded.
    pub fn register_gguf(
        &mut self,
        file: &GgufFile,
        namespace: &str,
    ) -> Result<usize, WeightError> {
        let mut added = 0;
        for info in file.tensors() {
            let name = format!("{namespace}{}", info.name);
            if !WEIGHT_TYPES.contains(&info.ggml_type) {
                self.skipped.insert(name, info.ggml_type);
                continue;
            }
            let dims = info
                .dims
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| WeightError {
                    name: name.clone(),
                    problem: format!("dims {:?} do not fit in memory", info.dims),
                })?;
            if self.register_weight(&name, info.ggml_type, &dims, file.tensor_data(info))? {
                added += 1;
            }
        }
        Ok(added)
    }

    /// Registers owned f32 values (norm scales, test weights) of GGUF dims `dims`.
    pub fn register_f32(
        &mut self,
        name: &str,
        dims: &[usize],
        data: &[f32],
    ) -> Result<bool, WeightError> {
        self.register_weight(name, GgmlType::F32, dims, bytemuck::cast_slice(data))
    }

    fn weight(&self, name: &str) -> Result<&DevWeight, String> {
        match self.weights.get(name) {
            Some(w) => Ok(w),
            None => Err(match self.skipped.get(name) {
                Some(ty) => {
                    format!("weight '{name}' is {ty}, which the wgpu kernels do not decode")
                }
                None => format!("weight '{name}' is not registered"),
            }),
        }
    }

    /// An f32 vector weight of exactly `len` values.
    fn vector(&self, name: &str, len: usize) -> Result<usize, String> {
        let w = self.weight(name)?;
        match w.parts.as_slice() {
            [p] if w.ty == GgmlType::F32 && w.in_dim * w.out_dim == len => Ok(p.index),
            _ => Err(format!(
                "weight '{name}' is {} [{}, {}], the node needs {len} f32 values",
                w.ty, w.in_dim, w.out_dim
            )),
        }
    }

    fn new_buffer(&self, len: usize) -> wgpu::Buffer {
        self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            // A binding may not be empty: a zero-length buffer still gets one word.
            size: (len.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        let device = &self.gpu.device;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        })
    }

    fn take_errors(&self) -> Result<(), String> {
        let mut e = self
            .errors
            .lock()
            .map_err(|_| "device error log poisoned".to_string())?;
        if e.is_empty() {
            return Ok(());
        }
        let msg = e.join("; ");
        e.clear();
        Err(format!("the wgpu device reported: {msg}"))
    }

    fn submit(&mut self) {
        if let Some(enc) = self.encoder.take() {
            self.gpu.queue.submit([enc.finish()]);
        }
    }

    fn wait(&self) -> Result<(), String> {
        self.count_wait();
        self.gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| format!("waiting for the device failed: {e}"))
    }

    /// Reads a whole pool buffer back to the host.
    fn readback(&mut self, id: usize) -> Result<Vec<f32>, String> {
        let len = self
            .bufs
            .get(id)
            .ok_or_else(|| format!("buffer {id} does not exist"))?
            .len;
        self.readback_window(id, 0, len)
    }

    /// Reads values `offset..offset + len` of a pool buffer back to the host.
    fn readback_window(
        &mut self,
        id: usize,
        offset: usize,
        len: usize,
    ) -> Result<Vec<f32>, String> {
        let have = self
            .bufs
            .get(id)
            .ok_or_else(|| format!("buffer {id} does not exist"))?
            .len;
        if offset.checked_add(len).is_none_or(|end| end > have) {
            return Err(format!(
                "window {offset}+{len} exceeds buffer {id} ({have})"
            ));
        }
        // A copy may not be empty: an empty window still moves one word.
        let bytes = (len.max(1) * 4) as u64;
        let src_off = (offset.min(have.saturating_sub(1)) * 4) as u64;
        let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let src = self.bufs[id].buf.clone();
        self.encoder()
            .copy_buffer_to_buffer(&src, src_off, &staging, 0, bytes);
        self.submit();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| "readback callback never ran".to_string())?
            .map_err(|e| format!("mapping the readback failed: {e}"))?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| format!("reading the readback failed: {e}"))?;
            let mut out = vec![0f32; len];
            bytemuck::cast_slice_mut::<f32, u8>(&mut out).copy_from_slice(&view[..len * 4]);
            out
        };
        staging.unmap();
        self.take_errors()?;
        Ok(out)
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
            Host::Known(v) => Ok(v[..n].iter().map(|&x| as_i32(x)).collect()),
            Host::Unknown => Err(format!(
                "{what} (buffer {id}) were computed on the device; the wgpu backend reads \
                 indices only from host-written inputs, which it range checks"
            )),
        }
    }

    fn pool(&self, b: BufRef, what: &str) -> Result<usize, String> {
        if b.backend != Backend::WGPU || b.id >= self.bufs.len() {
            return Err(format!(
                "{what} is buffer {} on {}, not in the wgpu pool ({} buffers)",
                b.id,
                b.backend,
                self.bufs.len()
            ));
        }
        Ok(b.id)
    }

    fn len(&self, id: usize) -> usize {
        self.bufs.get(id).map_or(0, |b| b.len)
    }

    fn resource(&mut self, r: Res) -> Result<wgpu::Buffer, String> {
        Ok(match r {
            Res::Pool(id) => self
                .bufs
                .get(id)
                .ok_or_else(|| format!("buffer {id} does not exist"))?
                .buf
                .clone(),
            Res::Weight(i) => self
                .weight_bufs
                .get(i)
                .ok_or_else(|| format!("weight buffer {i} does not exist"))?
                .clone(),
            Res::Snap(len) => {
                if !self.snapshots.contains_key(&len) {
                    let b = self.new_buffer(len);
                    self.snapshots.insert(len, b);
                }
                self.snapshots[&len].clone()
            }
            Res::Act(len) => {
                if !self.act_scratch.contains_key(&len) {
                    let b = self.new_buffer(len);
                    self.act_scratch.insert(len, b);
                }
                self.act_scratch[&len].clone()
            }
            Res::Tmp(slot, len) => {
                if !self.tmp_scratch.contains_key(&(slot, len)) {
                    let b = self.new_buffer(len);
                    self.tmp_scratch.insert((slot, len), b);
                }
                self.tmp_scratch[&(slot, len)].clone()
            }
        })
    }

    fn pipeline(&mut self, k: Kernel) -> Result<(), String> {
        if self.pipelines.contains_key(&k) {
            return Ok(());
        }
        let (src, entry, binds) = k.spec()?;
        let device = &self.gpu.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(entry),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let entries: Vec<wgpu::BindGroupLayoutEntry> = binds
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: match b {
                    Bind::Uniform => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    Bind::Ro | Bind::Rw => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: *b == Bind::Ro,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                },
                count: None,
            })
            .collect();
        let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(entry),
            entries: &entries,
        });
        let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(entry),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(format!("kernel {k:?} does not compile: {e}"));
        }
        self.pipelines.insert(k, (pipeline, bgl));
        Ok(())
    }

    /// Records one dispatch of `k` over `res` (in binding order, the uniform block last).
    fn dispatch(
        &mut self,
        k: Kernel,
        res: &[Res],
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<(), String> {
        if params.len() > PARAMS {
            return Err(format!(
                "{} kernel parameters, the block holds {PARAMS}",
                params.len()
            ));
        }
        let mut block = [0u32; PARAMS];
        block[..params.len()].copy_from_slice(params);
        let params = block;
        self.pipeline(k)?;
        let key: BindKey = (k, res.to_vec(), params);
        if !self.bind_groups.contains_key(&key) {
            if self.bind_groups.len() >= BIND_GROUP_CACHE {
                self.bind_groups.clear();
            }
            let mut bufs = Vec::with_capacity(res.len() + 1);
            for &r in res {
                bufs.push(self.resource(r)?);
            }
            let uniform = self
                .gpu
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("params"),
                    contents: bytemuck::cast_slice(&params),
                    usage: wgpu::BufferUsages::UNIFORM,
                });
            bufs.push(uniform);
            let entries: Vec<wgpu::BindGroupEntry> = bufs
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect();
            let (_, bgl) = &self.pipelines[&k];
            let bg = self
                .gpu
                .device
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: bgl,
                    entries: &entries,
                });
            self.bind_groups.insert(key.clone(), bg);
        }
        let pipeline = self.pipelines[&k].0.clone();
        let bg = self.bind_groups[&key].clone();
        let enc = self.encoder();
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        Ok(())
    }

    /// Element-wise dispatch over `n` outputs in workgroups of 256.
    fn elementwise(&mut self, k: Kernel, res: &[Res], n: usize, nb: usize) -> Result<(), String> {
        let (gx, gy) = grid(n.div_ceil(256))?;
        let p = [
            u32_of(n, "elements")?,
            u32_of(nb.max(1), "elements")?,
            0,
            0,
            0,
            0,
            0,
            0,
        ];
        self.dispatch(k, res, &p, (gx, gy, 1))
    }

    fn run(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        self.take_errors()?;
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
        // An input that is also the output is read from a snapshot taken just before.
        let src = |i: usize, me: &mut Self| -> Result<Res, String> {
            let id = *ids.get(i).ok_or_else(|| format!("missing source {i}"))?;
            if id != out {
                return Ok(Res::Pool(id));
            }
            let len = me.len(id);
            let snap = me.resource(Res::Snap(len))?;
            let b = me.bufs[id].buf.clone();
            me.encoder()
                .copy_buffer_to_buffer(&b, 0, &snap, 0, (len.max(1) * 4) as u64);
            Ok(Res::Snap(len))
        };
        let src_len = |i: usize, me: &Self| ids.get(i).map_or(0, |&id| me.len(id));
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
                let (a, b) = (src(0, self)?, src(1, self)?);
                self.elementwise(k, &[a, b, Res::Pool(out)], n, nb)?;
            }
            (Op::Silu, _) => {
                if src_len(0, self) < n {
                    return Err(format!("silu: {} inputs for {n} outputs", src_len(0, self)));
                }
                let a = src(0, self)?;
                self.elementwise(Kernel::Silu, &[a, a, Res::Pool(out)], n, n)?;
            }
            (Op::SwiGLU, _) => {
                if src_len(0, self) < n || src_len(1, self) < n {
                    return Err(format!(
                        "swiglu: gate {} and up {} values for {n} outputs",
                        src_len(0, self),
                        src_len(1, self)
                    ));
                }
                let (g, u) = (src(0, self)?, src(1, self)?);
                self.elementwise(Kernel::SwiGlu, &[g, u, Res::Pool(out)], n, n)?;
            }
            (Op::RmsNorm { eps }, meta) => {
                let (d, x, xl) = (node.out_shape[0], src(0, self)?, src_len(0, self));
                self.norm(node, meta, d, *eps, x, xl, out)?;
            }
            (Op::QkNorm { hd, eps, .. }, meta) => {
                let (x, xl) = (src(0, self)?, src_len(0, self));
                self.norm(node, meta, *hd, *eps, x, xl, out)?;
            }
            (Op::MatMul { .. }, NodeMeta::MatMul(m)) => {
                if m.out_dim * nt != n {
                    return Err(format!(
                        "output [{}, {nt}] does not match weight '{}' out_dim {}",
                        node.out_shape[0], m.weight_name, m.out_dim
                    ));
                }
                let (x, xl) = (src(0, self)?, src_len(0, self));
                let mm = MatmulArgs {
                    name: &m.weight_name,
                    in_dim: m.in_dim,
                    out_dim: m.out_dim,
                    bias: m.bias_name.as_deref(),
                    y_stride: m.out_dim,
                    y_off: 0,
                    rounded: false,
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
                let (x, xl) = (src(0, self)?, src_len(0, self));
                // gate into columns 0..nf of each row, up into nf..2nf, then SwiGLU in
                // place over the gate half: the kernels of the unfused chain, so both
                // give the same bits, in one node and without the two extra buffers.
                for (name, y_off) in [(&m.gate_weight, 0), (&m.up_weight, nf)] {
                    let mm = MatmulArgs {
                        name,
                        in_dim: m.n_embd,
                        out_dim: nf,
                        bias: None,
                        y_stride: 2 * nf,
                        y_off,
                        rounded: false,
                    };
                    self.matmul(&mm, x, xl, nt, out)?;
                }
                let (gx, gy) = grid((nt * nf).div_ceil(256))?;
                let p = [u32_of(nt * nf, "elements")?, u32_of(nf, "FFN width")?];
                self.dispatch(Kernel::SwiGluRows, &[Res::Pool(out)], &p, (gx, gy, 1))?;
            }
            (Op::FusedQKV { layer }, NodeMeta::FusedQkv(m)) => {
                let plan = QkvPlan {
                    layer: *layer,
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
                };
                let x = src(0, self)?;
                self.fused_qkv(&plan, node, x, &ids, out, kv_pair)?;
            }
            (Op::FusedQkvNorm { layer }, NodeMeta::FusedQkvNorm(m)) => {
                let plan = QkvPlan {
                    layer: *layer,
                    weight: &m.qkv_weight,
                    n_embd: m.n_embd,
                    nqt: m.nqt,
                    nkt: m.nkt,
                    biases: [None; 3],
                    norms: Some(([&m.q_norm, &m.k_norm], m.eps)),
                    rope: &m.rope,
                    n_ctx: m.n_ctx,
                };
                let x = src(0, self)?;
                self.fused_qkv(&plan, node, x, &ids, out, kv_pair)?;
            }
            (Op::QkvBiasRopeStore { layer }, NodeMeta::QkvBiasRopeStore(m)) => {
                self.qkv_bias_rope_store(*layer, m, node, &ids, out, kv_pair)?;
            }
            (Op::GetRows, NodeMeta::Embed(m)) => {
                let w = self.weight(&m.weight_name)?;
                let (ty, row_bytes, rows, parts) = (w.ty, w.row_bytes, w.out_dim, w.parts.clone());
                if w.in_dim != m.n_embd || node.out_shape[0] != m.n_embd || n != nt * m.n_embd {
                    return Err(format!(
                        "table '{}' rows hold {}, node expects {} (output {:?})",
                        m.weight_name, w.in_dim, m.n_embd, node.out_shape
                    ));
                }
                let toks = self.host_ints(ids[0], nt, "token ids")?;
                if let Some((i, id)) = toks
                    .iter()
                    .enumerate()
                    .find(|&(_, &id)| id < 0 || id as usize >= rows)
                {
                    return Err(format!(
                        "embedding: id {id} (token {i}) outside the table's {rows} rows"
                    ));
                }
                let t = src(0, self)?;
                let (gx, gy) = grid(nt)?;
                for part in parts {
                    let p = [
                        u32_of(m.n_embd, "row length")?,
                        u32_of(part.rows, "table rows")?,
                        u32_of(nt, "tokens")?,
                        u32_of(row_bytes, "row bytes")?,
                        u32_of(part.row0, "row")?,
                        0,
                        0,
                        0,
                    ];
                    self.dispatch(
                        Kernel::Embed(ty),
                        &[Res::Weight(part.index), t, Res::Pool(out)],
                        &p,
                        (gx, gy, 1),
                    )?;
                }
            }
            (Op::GetRows, _) => {
                let d = node.out_shape[0];
                let rows = src_len(0, self).checked_div(d).unwrap_or(0);
                if d == 0 || n != nt * d {
                    return Err(format!("get_rows: {n} outputs for {nt} ids of {d}"));
                }
                let sel = self.host_ints(
                    *ids.get(1).ok_or("get_rows needs 2 sources")?,
                    nt,
                    "row ids",
                )?;
                if let Some((i, id)) = sel
                    .iter()
                    .enumerate()
                    .find(|&(_, &id)| id < 0 || id as usize >= rows)
                {
                    return Err(format!(
                        "get_rows: id {id} (row {i}) outside the {rows} input rows"
                    ));
                }
                let (x, r) = (src(0, self)?, src(1, self)?);
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
                self.dispatch(Kernel::Gather, &[x, r, Res::Pool(out)], &p, (gx, gy, 1))?;
            }
            (Op::RoPE { style, .. }, NodeMeta::Rope(m)) => {
                if *style != m.style {
                    return Err(format!(
                        "op style {style:?} but metadata style {:?}",
                        m.style
                    ));
                }
                // The shader has no frequency-factor term; `supports_op` declines such nodes.
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
                // The kernel rotates in place: start from a copy unless the allocator
                // already gave rope its input's buffer.
                if ids[0] != out {
                    let (a, b) = (self.bufs[ids[0]].buf.clone(), self.bufs[out].buf.clone());
                    self.encoder()
                        .copy_buffer_to_buffer(&a, 0, &b, 0, (n * 4) as u64);
                }
                let pos = src(1, self)?;
                self.rope_rows(m, pos, Res::Pool(out), nt, stride, 0)?;
            }
            (Op::KvcacheStore { layer }, meta) => {
                self.kv_store(*layer, meta, &ids, kv_pair)?;
                return Ok(());
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
                if m.hd == 0
                    || m.hd > 256
                    || m.n_head == 0
                    || m.n_head_kv == 0
                    || !m.n_head.is_multiple_of(m.n_head_kv)
                {
                    return Err(format!(
                        "attention geometry: n_head {} n_head_kv {} hd {} (n_head must be a positive multiple of n_head_kv, hd at most 256)",
                        m.n_head, m.n_head_kv, m.hd
                    ));
                }
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
                let q = src(0, self)?;
                let pos = src(2, self)?;
                let span = if *explicit_span { src(3, self)? } else { pos };
                let _ = span_id;
                let p = [
                    u32_of(m.n_head, "heads")?,
                    u32_of(m.n_head_kv, "kv heads")?,
                    u32_of(m.hd, "head dim")?,
                    u32_of(m.n_ctx, "context")?,
                    u32_of(q_stride, "q stride")?,
                    u32_of(nt, "tokens")?,
                    m.scale.to_bits(),
                    u32::from(*explicit_span),
                ];
                self.dispatch(
                    Kernel::Attn,
                    &[
                        q,
                        Res::Pool(k_id),
                        Res::Pool(v_id),
                        pos,
                        span,
                        Res::Pool(out),
                    ],
                    &p,
                    (u32_of(m.n_head, "heads")?, u32_of(nt, "tokens")?, 1),
                )?;
            }
            (op, meta) => {
                return Err(format!(
                    "{} with metadata {meta:?} is not implemented by the wgpu backend",
                    op.name()
                ))
            }
        }
        self.bufs[out].host = Host::Unknown;
        Ok(())
    }

    /// Records `y[t, y_off + r] = W[r] . x[t] (+ bias[r])` over every row range of W.
    fn matmul(
        &mut self,
        a: &MatmulArgs,
        x: Res,
        x_len: usize,
        nt: usize,
        out: usize,
    ) -> Result<(), String> {
        let w = self.weight(a.name)?;
        let (ty, row_bytes, parts) = (w.ty, w.row_bytes, w.parts.clone());
        if w.in_dim != a.in_dim || w.out_dim != a.out_dim {
            return Err(format!(
                "weight '{}' is [{}, {}], the node expects [{}, {}]",
                a.name, w.in_dim, w.out_dim, a.in_dim, a.out_dim
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
        // Quantized weights multiply the activations rounded as the CPU rounds them.
        let (x, stride) = match ActFormat::of(ty) {
            Some(fmt) if !a.rounded => (
                self.round_activations(fmt, x, a.in_dim, stride, nt)?,
                a.in_dim,
            ),
            _ => (x, stride),
        };
        let tile = Tile::for_tokens(nt);
        let tiles = u32_of(nt.div_ceil(tile.tokens()), "token tiles")?;
        for part in parts {
            // 16 rows by a tile of tokens per workgroup (see matmul.wgsl).
            let (gx, gy) = grid(part.rows.div_ceil(16))?;
            let p = [
                u32_of(a.in_dim, "input features")?,
                u32_of(a.out_dim, "output features")?,
                u32_of(nt, "tokens")?,
                u32_of(row_bytes, "row bytes")?,
                u32_of(stride, "row stride")?,
                u32::from(bias.is_some()),
                u32_of(part.row0, "row")?,
                u32_of(part.rows, "rows")?,
                u32_of(a.y_stride, "output stride")?,
                u32_of(a.y_off, "output column")?,
            ];
            // Without a bias the kernel never reads binding 2; the weight stands in.
            let b = Res::Weight(bias.unwrap_or(part.index));
            self.dispatch(
                Kernel::Matmul(ty, tile),
                &[Res::Weight(part.index), x, b, Res::Pool(out)],
                &p,
                (gx, gy, tiles),
            )?;
        }
        Ok(())
    }

    /// The weights of a q|k|v concatenation: the tensor itself when the file has one
    /// under that name, else the three matrices it stands for (`..attn_qkv.weight`
    /// names `..attn_q.weight`, `..attn_k.weight` and `..attn_v.weight`), each with its
    /// first output column.
    fn qkv_weights(&self, p: &QkvPlan) -> Result<Vec<(String, usize, usize)>, String> {
        let total = p.nqt + 2 * p.nkt;
        if self.weights.contains_key(p.weight) {
            return Ok(vec![(p.weight.to_string(), 0, total)]);
        }
        let stem = p.weight.strip_suffix("attn_qkv.weight").ok_or_else(|| {
            format!(
                "weight '{}' is neither registered nor a q|k|v concatenation name",
                p.weight
            )
        })?;
        Ok(vec![
            (format!("{stem}attn_q.weight"), 0, p.nqt),
            (format!("{stem}attn_k.weight"), p.nqt, p.nkt),
            (format!("{stem}attn_v.weight"), p.nqt + p.nkt, p.nkt),
        ])
    }

    /// `FusedQKV` / `FusedQkvNorm`: q, k and v of every token into the columns of one
    /// output row (`[nqt | nkt | nkt]`), each plus its bias, the per-head norms when
    /// given, rope on the q and k columns, and k and v stored at the positions. Each
    /// step is the unfused chain's kernel over the same values, so the q columns and
    /// the stored rows equal the chain's bit for bit, with fewer nodes and buffers.
    fn fused_qkv(
        &mut self,
        p: &QkvPlan,
        node: &CNode,
        x: Res,
        ids: &[usize],
        out: usize,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let nt = node.out_shape[1].max(1);
        let width = p.nqt + 2 * p.nkt;
        let hd = p.rope.hd;
        if node.n_elements() != width * nt
            || hd == 0
            || p.rope.n_head * hd != p.nqt
            || !p.nkt.is_multiple_of(hd)
        {
            return Err(format!(
                "output {:?} with q {} / kv {} columns and {} heads of {hd}",
                node.out_shape, p.nqt, p.nkt, p.rope.n_head
            ));
        }
        let n_head_kv = p.nkt / hd;
        let pos_id = *ids
            .get(1)
            .ok_or("a fused QKV node needs a positions source")?;
        let x_len = ids.first().map_or(0, |&i| self.len(i));
        let parts = self.qkv_weights(p)?;
        // One rounding of the input serves the three matmuls when they share a format.
        let formats: Vec<Option<ActFormat>> = parts
            .iter()
            .map(|(name, ..)| self.weight(name).map(|w| ActFormat::of(w.ty)))
            .collect::<Result<_, _>>()?;
        let shared = formats.iter().all(|f| *f == formats[0]);
        let (x_in, x_in_len, rounded) = match formats[0] {
            Some(fmt) if shared => {
                let stride = x_len / nt;
                if stride < p.n_embd {
                    return Err(format!(
                        "fused QKV: input {x_len} values for {nt} rows of {}",
                        p.n_embd
                    ));
                }
                let r = self.round_activations(fmt, x, p.n_embd, stride, nt)?;
                (r, nt * p.n_embd, true)
            }
            _ => (x, x_len, false),
        };
        let mut bias_at = p.biases.iter();
        for (name, y_off, out_dim) in &parts {
            // The concatenation's one bias would need one vector; only the split form has
            // the three.
            let bias = if parts.len() == 3 {
                bias_at.next().copied().flatten()
            } else if p.biases.iter().any(Option::is_some) {
                return Err(format!(
                    "weight '{}' is one q|k|v tensor; its biases are three vectors",
                    p.weight
                ));
            } else {
                None
            };
            let mm = MatmulArgs {
                name,
                in_dim: p.n_embd,
                out_dim: *out_dim,
                bias,
                y_stride: width,
                y_off: *y_off,
                rounded,
            };
            self.matmul(&mm, x_in, x_in_len, nt, out)?;
        }
        if let Some(([qn, kn], eps)) = p.norms {
            let (qw, kw) = (self.vector(qn, hd)?, self.vector(kn, hd)?);
            // The norms read the matmul results from a snapshot and write them back.
            let len = self.len(out);
            let snap = self.resource(Res::Snap(len))?;
            let b = self.bufs[out].buf.clone();
            self.encoder()
                .copy_buffer_to_buffer(&b, 0, &snap, 0, (len.max(1) * 4) as u64);
            let (sq, heads) = (Res::Snap(len), p.rope.n_head);
            self.norm_rows(sq, Some(qw), hd, nt * heads, eps, (heads, width, 0), out)?;
            let kl = (n_head_kv, width, p.nqt);
            self.norm_rows(sq, Some(kw), hd, nt * n_head_kv, eps, kl, out)?;
        }
        let pos = Res::Pool(pos_id);
        self.rope_rows(p.rope, pos, Res::Pool(out), nt, width, 0)?;
        let rope_k = RoPEMeta {
            n_head: n_head_kv,
            ..p.rope.clone()
        };
        self.rope_rows(&rope_k, pos, Res::Pool(out), nt, width, p.nqt)?;
        let len = self.len(out);
        let rows = KvRows {
            layer: p.layer,
            n_embd: p.nkt,
            n_ctx: p.n_ctx,
            nt,
            stride: width,
            k: (Res::Pool(out), len, p.nqt),
            v: (Res::Pool(out), len, p.nqt + p.nkt),
            cells: pos_id,
        };
        self.store_rows(&rows, kv_pair)
    }

    /// `QkvBiasRopeStore`: over three matmul outputs, q + q_bias into the output (q's
    /// own buffer), k + k_bias and v + v_bias into scratch, rope on q and k, then k and
    /// v stored at the positions. The output is the roped q.
    fn qkv_bias_rope_store(
        &mut self,
        layer: usize,
        m: &minfer_graph::QkvBiasRopeStoreMeta,
        node: &CNode,
        ids: &[usize],
        out: usize,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        let nt = node.out_shape[1].max(1);
        let hd = m.rope.hd;
        let (nqt, nkt) = (m.nqt, m.nkt);
        let [q_id, k_id, v_id, pos_id] = match ids {
            [a, b, c, d] => [*a, *b, *c, *d],
            _ => {
                return Err(format!(
                    "takes q, k, v and positions, got {} sources",
                    ids.len()
                ))
            }
        };
        if node.n_elements() != nqt * nt
            || hd == 0
            || m.rope.n_head * hd != nqt
            || !nkt.is_multiple_of(hd)
            || self.len(q_id) < nqt * nt
            || self.len(k_id) < nkt * nt
            || self.len(v_id) < nkt * nt
        {
            return Err(format!(
                "q {} / k {} / v {} values for {nt} tokens of q {nqt}, kv {nkt} ({} heads of {hd})",
                self.len(q_id),
                self.len(k_id),
                self.len(v_id),
                m.rope.n_head
            ));
        }
        let (bq, bk, bv) = (
            self.vector(&m.q_bias, nqt)?,
            self.vector(&m.k_bias, nkt)?,
            self.vector(&m.v_bias, nkt)?,
        );
        // q is the output's own buffer: the add reads it from a snapshot.
        let q = if q_id == out {
            let len = self.len(out);
            let snap = self.resource(Res::Snap(len))?;
            let b = self.bufs[out].buf.clone();
            self.encoder()
                .copy_buffer_to_buffer(&b, 0, &snap, 0, (len.max(1) * 4) as u64);
            Res::Snap(len)
        } else {
            Res::Pool(q_id)
        };
        let (kt, vt) = (Res::Tmp(0, nkt * nt), Res::Tmp(1, nkt * nt));
        self.elementwise(
            Kernel::Add,
            &[q, Res::Weight(bq), Res::Pool(out)],
            nqt * nt,
            nqt,
        )?;
        self.elementwise(
            Kernel::Add,
            &[Res::Pool(k_id), Res::Weight(bk), kt],
            nkt * nt,
            nkt,
        )?;
        self.elementwise(
            Kernel::Add,
            &[Res::Pool(v_id), Res::Weight(bv), vt],
            nkt * nt,
            nkt,
        )?;
        let pos = Res::Pool(pos_id);
        self.rope_rows(&m.rope, pos, Res::Pool(out), nt, nqt, 0)?;
        let rope_k = RoPEMeta {
            n_head: nkt / hd,
            ..m.rope.clone()
        };
        self.rope_rows(&rope_k, pos, kt, nt, nkt, 0)?;
        let rows = KvRows {
            layer,
            n_embd: nkt,
            n_ctx: m.n_ctx,
            nt,
            stride: nkt,
            k: (kt, nkt * nt, 0),
            v: (vt, nkt * nt, 0),
            cells: pos_id,
        };
        self.store_rows(&rows, kv_pair)
    }

    /// Records the rounding of `nt` rows of `k` activations (at `stride`) to `fmt`'s
    /// levels into the scratch, which it returns packed as quant_act.wgsl describes
    /// (levels then scales, rows dense; a quarter of its `nt * k` words and a 32nd).
    fn round_activations(
        &mut self,
        fmt: ActFormat,
        x: Res,
        k: usize,
        stride: usize,
        nt: usize,
    ) -> Result<Res, String> {
        if !k.is_multiple_of(fmt.block()) {
            return Err(format!(
                "{k} input features are not a multiple of the {}-value activation block",
                fmt.block()
            ));
        }
        let len = nt * k;
        let scratch = Res::Act(len);
        let (gx, gy) = grid(len / fmt.block())?;
        let p = [
            u32_of(k, "input features")?,
            u32_of(nt, "tokens")?,
            u32_of(stride, "row stride")?,
            0,
        ];
        self.dispatch(Kernel::QuantAct(fmt), &[x, scratch], &p, (gx, gy, 1))?;
        Ok(scratch)
    }

    /// Records rope of `m.n_head` heads of every token row (`stride` apart, heads from
    /// `off`) of `out`, in place, at the positions `pos`.
    fn rope_rows(
        &mut self,
        m: &RoPEMeta,
        pos: Res,
        out: Res,
        nt: usize,
        stride: usize,
        off: usize,
    ) -> Result<(), String> {
        if m.freq_factors.is_some() {
            return Err("rope with frequency factors is not implemented here".into());
        }
        if m.n_dims == 0 || !m.n_dims.is_multiple_of(2) || m.n_dims > m.hd {
            return Err(format!(
                "rope: n_dims {} must be even, positive and at most hd {}",
                m.n_dims, m.hd
            ));
        }
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
    fn norm_rows(
        &mut self,
        x: Res,
        w: Option<usize>,
        d: usize,
        rows: usize,
        eps: f32,
        (per_tok, stride, off): (usize, usize, usize),
        out: usize,
    ) -> Result<(), String> {
        if eps.is_nan() || eps < 0.0 {
            return Err(format!("rms norm: eps {eps} is not a non-negative number"));
        }
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
        let w = match meta {
            NodeMeta::Norm(m) => match &m.weight_name {
                Some(name) => Some(self.vector(name, d)?),
                None => None,
            },
            NodeMeta::None => None,
            other => return Err(format!("norm with foreign metadata {other:?}")),
        };
        let rows = n / d;
        self.norm_rows(x, w, d, rows, eps, (rows, 0, 0), out)
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
        let [k_in, v_in, cells] = match ids {
            [a, b, c] => [*a, *b, *c],
            _ => return Err(format!("KV store takes 3 sources, got {}", ids.len())),
        };
        let nt = self.len(cells);
        let rows = KvRows {
            layer,
            n_embd: m.n_embd,
            n_ctx: m.n_ctx,
            nt,
            stride: m.n_embd,
            k: (Res::Pool(k_in), self.len(k_in), 0),
            v: (Res::Pool(v_in), self.len(v_in), 0),
            cells,
        };
        self.store_rows(&rows, kv_pair)
    }

    /// Records the store of `r`'s k and v token rows at their cells into the layer's
    /// KV regions, after checking every index on the host.
    fn store_rows(&mut self, r: &KvRows, kv_pair: Option<(usize, usize)>) -> Result<(), String> {
        let layer = r.layer;
        let (k_id, v_id) = kv_pair.ok_or_else(|| format!("no KV region for layer {layer}"))?;
        let nb = self.bufs.len();
        if k_id == v_id || k_id >= nb || v_id >= nb {
            return Err(format!(
                "layer {layer}: bad KV pair ({k_id}, {v_id}) in a pool of {nb}"
            ));
        }
        let ((k_in, k_len, k_off), (v_in, v_len, v_off), cells) = (r.k, r.v, r.cells);
        let region = |x: Res| matches!(x, Res::Pool(i) if i == k_id || i == v_id);
        if region(k_in) || region(v_in) || cells == k_id || cells == v_id {
            return Err(format!(
                "layer {layer}: a store input aliases the KV region"
            ));
        }
        let (nt, n_embd, n_ctx) = (r.nt, r.n_embd, r.n_ctx);
        // The last token's row must end inside each source.
        let need_in = |off: usize| match nt {
            0 => 0,
            _ => (nt - 1) * r.stride + off + n_embd,
        };
        if n_embd == 0 || r.stride < n_embd || k_len < need_in(k_off) || v_len < need_in(v_off) {
            return Err(format!(
                "KV store layer {layer}: k {k_len} / v {v_len} values for {nt} rows of {n_embd}"
            ));
        }
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
        let (gx, gy) = grid((nt * n_embd).div_ceil(256))?;
        let p = [
            u32_of(n_embd, "row width")?,
            u32_of(nt, "rows")?,
            u32_of(n_ctx, "context")?,
            u32_of(r.stride, "row stride")?,
            u32_of(k_off, "k offset")?,
            u32_of(v_off, "v offset")?,
        ];
        self.dispatch(
            Kernel::KvStore,
            &[
                k_in,
                v_in,
                Res::Pool(cells),
                Res::Pool(k_id),
                Res::Pool(v_id),
            ],
            &p,
            (gx, gy, 1),
        )?;
        self.bufs[k_id].host = Host::Unknown;
        self.bufs[v_id].host = Host::Unknown;
        Ok(())
    }
}

impl BackendImpl for WgpuBackend {
    fn id(&self) -> Backend {
        Backend::WGPU
    }

    fn register_gguf(&mut self, file: &std::sync::Arc<GgufFile>) -> Result<usize, String> {
        WgpuBackend::register_gguf(self, file, "").map_err(|e| e.to_string())
    }

    fn is_gpu(&self) -> bool {
        true
    }

    fn device_info(&self) -> Option<minfer_graph::DeviceInfo> {
        Some(self.gpu.summary.device_info())
    }

    fn name(&self) -> &str {
        "wgpu"
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
                    | Op::QkvBiasRopeStore { .. }
                    | Op::FusedQkvNorm { .. }
            )
    }

    fn supports_node(&self, node: &CNode) -> bool {
        let kv = node.kv_layer().is_some();
        self.supports_op(&node.op, node.out_dtype)
            && (self.kv_here || !kv)
            && self.weights_decoded(node)
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        match fused {
            FusedOp::SwiGLU => true,
            // A claim turns the fusion on for the whole model, and a fused node this
            // backend then declined would land on a backend that may not have it: claim
            // it only when every one will run here, i.e. the KV lives here and no
            // attention q/k/v tensor is of a type the shaders do not decode.
            FusedOp::DecodeQkv => {
                self.kv_here
                    && !self.skipped.keys().any(|n| {
                        [".attn_q", ".attn_k", ".attn_v"]
                            .iter()
                            .any(|a| n.contains(a))
                    })
            }
            FusedOp::DecodeFfn => false,
        }
    }

    fn supports_attn_span(&self) -> bool {
        true
    }

    fn max_buffer_elems(&self) -> usize {
        self.buffer_limit()
    }

    fn alloc_buffer(&mut self, size: usize) -> usize {
        if let Some(pos) = self.free.iter().position(|&i| self.bufs[i].len == size) {
            let id = self.free.swap_remove(pos);
            let b = self.bufs[id].buf.clone();
            self.encoder().clear_buffer(&b, 0, None);
            self.bufs[id].host = Host::Zero;
            return id;
        }
        self.alloc_fresh(size)
    }

    fn alloc_fresh(&mut self, size: usize) -> usize {
        // wgpu zero-initializes every new buffer.
        let buf = self.new_buffer(size);
        self.bufs.push(DevBuf {
            buf,
            len: size,
            host: Host::Zero,
        });
        self.bufs.len() - 1
    }

    fn free_buffer(&mut self, id: usize) {
        if id < self.bufs.len() && !self.free.contains(&id) {
            self.free.push(id);
        }
    }

    fn pool_len(&self) -> usize {
        self.bufs.len()
    }

    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), String> {
        self.run(node, in_bufs, out_buf, kv_pair)
            .map_err(|e| format!("node {} '{}' ({}): {e}", node.id, node.name, node.op.name()))
    }

    fn read_host(&self, _id: usize) -> Option<&[f32]> {
        None
    }

    fn copy_to_host(&mut self, id: usize) -> Option<Vec<f32>> {
        self.readback(id).ok()
    }

    fn read_host_window(
        &mut self,
        id: usize,
        offset: usize,
        len: usize,
    ) -> Result<Vec<f32>, String> {
        self.readback_window(id, offset, len)
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
        // Through a staging copy recorded in the encoder, so the write lands after
        // every dispatch recorded before it and before every one recorded after.
        let staging = self
            .gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("upload"),
                contents: bytemuck::cast_slice(data),
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        let dst = self.bufs[id].buf.clone();
        self.encoder().copy_buffer_to_buffer(
            &staging,
            0,
            &dst,
            (offset * 4) as u64,
            (data.len() * 4) as u64,
        );
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
        self.submit();
        // A failed wait leaves the error in the device log, reported by the next node.
        if let Err(e) = self.wait() {
            if let Ok(mut v) = self.errors.lock() {
                v.push(e);
            }
        }
    }

    fn supports_trace(&self) -> bool {
        true
    }

    fn trace_stage(
        &mut self,
        staging: &mut minfer_graph::trace::TraceStaging,
        node: minfer_graph::NodeId,
        id: usize,
        len: usize,
        read: &mut dyn FnMut(minfer_graph::NodeId, &[f32]),
    ) -> Result<(), String> {
        self.stage_trace(staging, node, id, len, read)
    }

    fn trace_collect(
        &mut self,
        staging: &mut minfer_graph::trace::TraceStaging,
        read: &mut dyn FnMut(minfer_graph::NodeId, &[f32]),
    ) -> Result<(), String> {
        self.collect_trace(staging, read)
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
    fn grids_wrap_into_y_and_refuse_what_cannot_be_dispatched() {
        assert_eq!(grid(0).unwrap(), (1, 1));
        assert_eq!(grid(7).unwrap(), (7, 1));
        assert_eq!(grid(65_535).unwrap(), (65_535, 1));
        assert_eq!(grid(65_536).unwrap(), (65_535, 2));
        // 151936 rows of the default model's lm head, four per workgroup.
        let (gx, gy) = grid(151_936usize.div_ceil(4)).unwrap();
        assert!(gx as usize * gy as usize >= 37_984);
        assert!(grid(65_535 * 65_535 + 1).unwrap_err().contains("exceed"));
    }

    #[test]
    fn sizes_past_32_bits_are_named_errors() {
        assert_eq!(u32_of(5, "rows").unwrap(), 5);
        let e = u32_of(1 << 33, "rows").unwrap_err();
        assert!(e.contains("rows") && e.contains("32-bit"), "{e}");
    }
}
