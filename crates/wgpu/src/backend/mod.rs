//! `WgpuBackend`: pool, weights, host I/O and node execution on a wgpu device.
//!
//! - Pool: device storage buffers of f32 addressed by id; `alloc_buffer` reuses a free
//!   id of exactly the requested length (cleared on the device), `alloc_fresh` always
//!   creates one. An id never changes its buffer, so cached bind groups stay valid.
//! - Ordering: host writes, clears, copies and dispatches are all recorded into the
//!   one open command encoder in call order; `synchronize` submits it and waits.
//! - Index inputs (token ids, positions, KV cells, spans) are range checked before a
//!   kernel may read them, from the host copies the kit's pool keeps.
//!
//! The files: this one holds the backend and its `BackendImpl`; `encode` the device
//! plumbing (buffers, pipelines, dispatch, readback), `weights` the weight upload,
//! and one file per op family (`elementwise`, `matmul`, `fused`, `kv`) with its arm
//! of the kit's node dispatch (`minfer_graph::device_kit`); `trace` the per-node
//! trace's staging.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::device_kit::{self, dispatch, DeviceHost, DevicePool, WeightTable};
use minfer_graph::{Backend, BackendError, BackendImpl, BufRef, CNode, FusedOp};

use crate::device::{self, AdapterSummary, Gpu, NotUsable};
use crate::kernels::{Kernel, WEIGHT_TYPES};
use res::{BindKey, Parts};

pub use minfer_graph::device_kit::WeightError;

mod elementwise;
mod encode;
mod fused;
mod kv;
mod matmul;
mod res;
// The per-node trace's staging; a child module, so it reaches the pool and the encoder.
mod trace;
mod weights;

/// The wgpu graph backend (id [`Backend::WGPU`], name "wgpu").
pub struct WgpuBackend {
    gpu: Gpu,
    pool: DevicePool<wgpu::Buffer>,
    weights: WeightTable<Parts, wgpu::Buffer>,
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
            .field("buffers", &self.pool.count())
            .field("free", &self.pool.free.len())
            .field("weights", &self.weights.map.len())
            .finish_non_exhaustive()
    }
}

impl WgpuBackend {
    /// The best usable adapter's backend on any native graphics API, or why there is
    /// none. CPU-emulation adapters (llvmpipe/lavapipe, WARP) are taken only when
    /// `allow_cpu_adapter` is set, which callers do when the user named this backend
    /// explicitly.
    pub fn probe(allow_cpu_adapter: bool) -> Result<WgpuBackend, NotUsable> {
        Self::probe_on(None, allow_cpu_adapter)
    }

    /// Like [`WgpuBackend::probe`], looking for adapters on `api` only (`None`: every
    /// native one).
    pub fn probe_on(
        api: Option<minfer_graph::GpuApi>,
        allow_cpu_adapter: bool,
    ) -> Result<WgpuBackend, NotUsable> {
        let gpu = device::open(api, allow_cpu_adapter)?;
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
            pool: DevicePool::new(Backend::WGPU, "wgpu"),
            weights: WeightTable::new(&WEIGHT_TYPES, "wgpu"),
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

    /// The most f32s one pool buffer may hold: every pool buffer is bound whole as
    /// storage and copied through a staging buffer, so the device's binding and
    /// buffer limits both bound it, and the kernels index in 32 bits.
    fn buffer_limit(&self) -> usize {
        let elems = usize::try_from(self.binding_bytes() / 4).unwrap_or(usize::MAX);
        self.buffer_cap.map_or(elems, |c| c.min(elems))
    }

    /// The largest buffer one binding may hold, in bytes.
    fn binding_bytes(&self) -> u64 {
        let l = self.gpu.device.limits();
        l.max_storage_buffer_binding_size
            .min(l.max_buffer_size)
            .min(u32::MAX as u64)
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
}

impl DeviceHost for WgpuBackend {
    type Mem = wgpu::Buffer;

    fn device_pool(&self) -> &DevicePool<wgpu::Buffer> {
        &self.pool
    }

    fn device_pool_mut(&mut self) -> &mut DevicePool<wgpu::Buffer> {
        &mut self.pool
    }

    fn read_back(&mut self, id: usize) -> Result<Vec<f32>, BackendError> {
        self.readback(id)
    }

    fn upload(&mut self, id: usize, offset: usize, data: &[f32]) -> Result<(), BackendError> {
        // Through a staging copy recorded in the encoder, so the write lands after
        // every dispatch recorded before it and before every one recorded after.
        self.upload_staged(id, offset, data);
        Ok(())
    }
}

impl BackendImpl for WgpuBackend {
    fn id(&self) -> Backend {
        Backend::WGPU
    }

    fn register_gguf(&mut self, file: &std::sync::Arc<GgufFile>) -> Result<usize, BackendError> {
        Ok(WgpuBackend::register_gguf(self, file, "")?)
    }

    fn device_info(&self) -> Option<minfer_graph::DeviceInfo> {
        Some(self.gpu.summary.device_info())
    }

    fn name(&self) -> &str {
        "wgpu"
    }

    fn supports_node(&self, node: &CNode) -> bool {
        device_kit::supports_node(node, self.kv_here, true, |n| self.weights_decoded(n))
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        match fused {
            FusedOp::SwiGLU | FusedOp::GeGLU => true,
            // A claim turns the fusion on for the whole model, and a fused node this
            // backend then declined would land on a backend that may not have it: claim
            // it only when every one will run here, i.e. the KV lives here and no
            // attention q/k/v tensor is of a type the shaders do not decode.
            FusedOp::DecodeQkv => {
                self.kv_here
                    && !self.weights.skipped.keys().any(|n| {
                        [".attn_q", ".attn_k", ".attn_v"]
                            .iter()
                            .any(|a| n.contains(a))
                    })
            }
            FusedOp::DecodeFfn => false,
        }
    }

    fn max_buffer_elems(&self) -> usize {
        self.buffer_limit()
    }

    fn alloc_buffer(&mut self, size: usize) -> usize {
        if let Some(pos) = self.pool.reusable(size, |_| true) {
            let id = self.pool.take_free(pos);
            let b = self.pool.bufs[id].mem.clone();
            self.encoder().clear_buffer(&b, 0, None);
            return id;
        }
        self.alloc_fresh(size)
    }

    fn alloc_fresh(&mut self, size: usize) -> usize {
        // wgpu zero-initializes every new buffer.
        let buf = self.new_buffer(size);
        self.pool.push(buf, size)
    }

    minfer_graph::device_backend_methods!(pool);

    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        // A device error reported since the last node fails this one first.
        self.take_errors()?;
        dispatch::run(self, node, in_bufs, out_buf, kv_pair)
    }

    fn read_host_window(
        &mut self,
        id: usize,
        offset: usize,
        len: usize,
    ) -> Result<Vec<f32>, BackendError> {
        self.readback_window(id, offset, len)
    }

    fn synchronize(&mut self) {
        self.submit();
        // A failed wait leaves the error in the device log, reported by the next node.
        if let Err(e) = self.wait() {
            if let Ok(mut v) = self.errors.lock() {
                v.push(e.to_string());
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
    ) -> Result<(), BackendError> {
        self.stage_trace(staging, node, id, len, read)
    }

    fn trace_collect(
        &mut self,
        staging: &mut minfer_graph::trace::TraceStaging,
        read: &mut dyn FnMut(minfer_graph::NodeId, &[f32]),
    ) -> Result<(), BackendError> {
        self.collect_trace(staging, read)
    }
}
