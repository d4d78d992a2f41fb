//! `CudaBackend`: pool, weights, host I/O and node execution on a CUDA device.
//!
//! - Pool: device buffers of f32 addressed by id; `alloc_buffer` reuses a free id of
//!   exactly the requested length (cleared in stream order), `alloc_fresh` always makes
//!   one. An id keeps its address until its storage is released, so captured graphs
//!   stay valid; every change of an address bumps the pool generation.
//! - Recording: `begin_split` opens the split the scheduler names; `execute_node`
//!   validates a node and records its launches as commands; host writes are recorded as
//!   uploads from the pinned staging area. `end_split` (or `synchronize`) runs the split
//!   through the replay cache, keyed on that split's node range and its commands, which
//!   launches directly, captures, or replays, and waits for the stream.
//! - Index inputs (token ids, positions, KV cells, spans) are range checked on the host
//!   before a kernel may read them: they arrive through `write_host`, so the pool keeps
//!   a host copy of every small buffer the host wrote, dropped once a kernel writes it.
//! - Weights are uploaded once, by name, in their GGUF byte layout.
//!
//! The files: this one holds the backend and its `BackendImpl`; `pool` the device
//! memory, `weights` the weight upload, `launch` recording and running a split, and
//! one file per op family (`elementwise`, `matmul`, `fused`, `kv`) with its arm of the
//! node dispatch. What every device backend shares is `minfer_graph::device_kit`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::device_kit::{self, dispatch, DeviceHost, DevicePool, WeightTable};
use minfer_graph::{Backend, BackendError, BackendImpl, BufRef, CNode, FusedOp, KvType, SplitSpan};

use crate::device::{DevMem, GraphExec, Pinned};
use crate::kernels::WEIGHT_TYPES;
use crate::replay::{Cmd, ReplayCache};

mod elementwise;
mod fused;
mod kv;
mod launch;
mod matmul;
mod pool;
pub(crate) mod weights;

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
pub(super) static PROCESS_STATS: [AtomicU64; 3] =
    [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

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
    /// Pool buffers; a released buffer keeps its id without storage.
    pool: DevicePool<Option<DevMem>>,
    /// Weights by name, with the tensors skipped for their type.
    weights: WeightTable<usize, DevMem>,
    scratch: Option<DevMem>,
    snaps: std::collections::HashMap<(usize, usize), DevMem>,
    /// The split being recorded: commands, upload data, and the `[start, end)` node
    /// range the scheduler opened it with (`begin_split`), which keys its replay.
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
    failed: Option<BackendError>,
    /// Last: fields drop in order, so memory and graphs are freed while the context lives.
    gpu: crate::device::Gpu,
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
            .field("buffers", &self.pool.count())
            .field("weights", &self.weights.map.len())
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// The backend on device 0 with CUDA Graph replay on, or why it cannot run here.
    pub fn new() -> Result<CudaBackend, String> {
        Self::with_graphs(true)
    }

    /// Like [`CudaBackend::new`] with CUDA Graph replay forced on or off (parity tests).
    pub fn with_graphs(graphs: bool) -> Result<CudaBackend, String> {
        let gpu = crate::device::Gpu::open()?;
        Ok(CudaBackend {
            pool: DevicePool::new(Backend::CUDA, "CUDA"),
            weights: WeightTable::new(&WEIGHT_TYPES, "CUDA"),
            scratch: None,
            snaps: std::collections::HashMap::new(),
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
}

impl DeviceHost for CudaBackend {
    type Mem = Option<DevMem>;

    fn device_pool(&self) -> &DevicePool<Option<DevMem>> {
        &self.pool
    }

    fn device_pool_mut(&mut self) -> &mut DevicePool<Option<DevMem>> {
        &mut self.pool
    }

    fn read_back(&mut self, id: usize) -> Result<Vec<f32>, BackendError> {
        self.readback(id)
    }

    fn upload(&mut self, id: usize, offset: usize, data: &[f32]) -> Result<(), BackendError> {
        self.ensure_storage(id)?;
        // Recorded in order with the launches, from the pinned staging area.
        self.pending.push(Cmd::Upload {
            dst: id,
            offset,
            len: data.len(),
            staging: self.staged.len(),
        });
        self.staged.extend_from_slice(data);
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

    fn register_gguf(&mut self, file: &Arc<GgufFile>) -> Result<usize, BackendError> {
        self.register_file(file)
    }

    fn device_info(&self) -> Option<minfer_graph::DeviceInfo> {
        Some(self.gpu.summary.device_info())
    }

    fn supports_node(&self, node: &CNode) -> bool {
        // Every op that touches the KV regions (the QKV fusions store into them). The
        // attention kernel has no sliding-window term yet: such layers run on the CPU.
        device_kit::supports_node(node, self.kv_here, false, |n| self.weights_decoded(n))
    }

    fn supports_fused(&self, fused: FusedOp) -> bool {
        match fused {
            FusedOp::SwiGLU | FusedOp::GeGLU | FusedOp::DecodeFfn => true,
            // Claimed only where every fused node would run here: the host has no kernel
            // for them, and with a packed KV format the stores stay on the host.
            FusedOp::DecodeQkv => self.kv_here && self.qkv_fusable,
        }
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

    fn try_alloc_buffer(&mut self, size: usize) -> Result<usize, BackendError> {
        minfer_graph::check_buffer_size("cuda", size, self.max_buffer_elems())?;
        if let Some(pos) = self.reusable(size) {
            return Ok(self.reuse(pos, size));
        }
        self.try_alloc_fresh(size)
    }

    fn try_alloc_fresh(&mut self, size: usize) -> Result<usize, BackendError> {
        minfer_graph::check_buffer_size("cuda", size, self.max_buffer_elems())?;
        let mem = self.device_mem(size)?;
        Ok(self.push_buf(Some(mem), size))
    }

    minfer_graph::device_backend_methods!(pool);

    fn pool_elems(&self) -> usize {
        self.pool
            .bufs
            .iter()
            .filter(|b| b.mem.is_some())
            .map(|b| b.len)
            .sum()
    }

    fn release_unused(&mut self, in_use: &[usize]) {
        let mut dropped = false;
        for &id in &self.pool.free {
            if !in_use.contains(&id) {
                if let Some(b) = self.pool.bufs.get_mut(id) {
                    dropped |= b.mem.take().is_some();
                }
            }
        }
        // Recycling needs storage, so released ids leave the free list.
        let bufs = &self.pool.bufs;
        self.pool.free.retain(|&id| bufs[id].mem.is_some());
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
    ) -> Result<(), BackendError> {
        self.take_failure()?;
        dispatch::run(self, node, in_bufs, out_buf, kv_pair)
    }

    fn begin_split(&mut self, split: SplitSpan) -> Result<(), BackendError> {
        self.take_failure()?;
        self.nodes = Some(split.nodes);
        Ok(())
    }

    fn end_split(&mut self) -> Result<(), BackendError> {
        self.flush_or_discard()
    }

    fn synchronize(&mut self) {
        // The trait's wait cannot fail; an error is kept and reported by the next
        // call that can fail, so it is never lost.
        if let Err(e) = self.flush_or_discard() {
            self.failed = Some(e);
        }
    }
}
