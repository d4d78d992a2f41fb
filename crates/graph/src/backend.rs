//! The backend trait (§3.5): capability matrix, buffer pool, node execution, host I/O
//! and the two-phase split-boundary copy.
//!
//! The trait is named `BackendImpl` because the handle `crate::Backend` (a `u16` id)
//! already owns the design's name; every concrete backend (CPU, Metal, CUDA, the
//! test backend) implements this trait and is handed to `GraphAllocator::new`.
//!
//! Buffer contract: buffers are f32 arrays inside the backend's own pool, addressed
//! by id. `execute_node` receives one `BufRef` per `node.src` entry, in order; each
//! lives in this backend's pool (the allocator staged cross-backend values into it),
//! except a source that is a `KvcacheLoad` view, which is a placeholder pointing at
//! the layer's K region — kernels reach K and V only through `kv_pair`.
//! Split contract: the scheduler opens each split with [`BackendImpl::begin_split`]
//! (naming the graph, the split and its node range), executes the split's live nodes
//! in order, and closes it with [`BackendImpl::end_split`]. Errors are
//! [`BackendError`]s saying what failed; the scheduler names the node.
//! Weights are resolved by name in the backend's own registry (invariant 3); the
//! engine hands the model's GGUF to every participating backend through
//! [`BackendImpl::register_gguf`], the same way for each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use minfer_gguf::GgufFile;

use crate::backend_error::BackendError;
use crate::ir::{Backend, CNode, DType, FusedOp, Op};

/// Fault injection for tests of unwind safety: arms a panic inside the kernel of a
/// later node. Inert unless a test arms it; the check costs one atomic load per node.
/// It lives here, beside the trait, so the engine can hand one to a backend it builds
/// through a factory without naming the backend's type.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct FaultInjector(Arc<AtomicUsize>);

impl FaultInjector {
    /// Makes the `nth` node executed from now on (1-based; 0 disarms) fail inside its
    /// kernel, in whatever way the backend injects.
    pub fn panic_at_node(&self, nth: usize) {
        self.0.store(nth, Ordering::SeqCst);
    }

    /// Counts one executed node; true when it is the armed one (which disarms it).
    /// Inlined into each backend's per-node path, as it was when the hook lived there.
    #[inline]
    pub fn fire(&self) -> bool {
        if self.0.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.0.fetch_sub(1, Ordering::SeqCst) == 1
    }
}

/// `Err` naming the backend, the size and the limit when a buffer of `elems` f32s
/// exceeds `max_elems` (a backend's [`BackendImpl::max_buffer_elems`]).
pub fn check_buffer_size(
    backend: &str,
    elems: usize,
    max_elems: usize,
) -> Result<(), BackendError> {
    if elems <= max_elems {
        return Ok(());
    }
    Err(BackendError::BufferTooLarge {
        backend: backend.to_string(),
        elems,
        max: max_elems,
    })
}

/// The split the scheduler is about to run on a backend (see
/// [`BackendImpl::begin_split`]): which graph, which of its splits, which nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SplitSpan {
    /// The graph's uid (0 for a graph no cache installed: not stable across steps).
    pub graph: u64,
    /// The split's position in the graph's split list.
    pub index: usize,
    /// `[start, end)` node ids of the split (dead nodes inside are skipped).
    pub nodes: (usize, usize),
}

/// The only path from an executor to the persistent KV regions.
pub trait KvProvider {
    /// `(k_buf_id, v_buf_id)` of `layer` in the owning backend's pool.
    fn kv_pair(&self, layer: usize) -> Option<(usize, usize)>;
}

/// A split-boundary transfer started by `copy_cross` and finished by `await_cross`.
///
/// A host backend fills `data` at once; a device backend may leave it empty and keep
/// an event in `token`, filling the data when the wait is issued.
#[derive(Debug, Default)]
pub struct CrossCopy {
    /// Source buffer id in the source backend's pool.
    pub src_id: usize,
    /// Host-visible contents once available.
    pub data: Option<Vec<f32>>,
    /// Backend-private handle of an in-flight transfer.
    pub token: u64,
}

/// One execution backend: capabilities, pool, kernels and transfers.
pub trait BackendImpl: Send {
    /// The handle this backend occupies in the fixed id space.
    fn id(&self) -> Backend;
    /// Diagnostic name.
    fn name(&self) -> &str;

    /// Whether `op` producing `dtype` can run here.
    fn supports_op(&self, op: &Op, dtype: DType) -> bool;
    /// Whether `node` can run here: its op and dtype ([`Self::supports_op`]) and what
    /// else the node names, such as the storage type of its weights. The scheduler
    /// asks this of every node, so a backend declines by capability what it cannot
    /// execute instead of failing at execution; the default asks `supports_op` only.
    fn supports_node(&self, node: &CNode) -> bool {
        self.supports_op(&node.op, node.out_dtype)
    }
    /// Whether a fusion rule may target this backend (invariant 6).
    fn supports_fused(&self, fused: FusedOp) -> bool;
    /// Whether attention with an explicit span input can run here.
    fn supports_attn_span(&self) -> bool {
        false
    }
    /// Whether this backend stores KV rows in a packed (non-f32) format.
    fn reads_packed_kv(&self) -> bool {
        self.kv_types() != [crate::KvType::F32; 2]
    }
    /// The element formats of the K and V regions this backend holds (the allocator
    /// sizes regions from them; KV-session files record them).
    fn kv_types(&self) -> [crate::KvType; 2] {
        [crate::KvType::F32; 2]
    }
    /// Whether this backend executes on a GPU. With one participating, `CParams.gpu`
    /// is set and the decode fusions it claims through `supports_fused` are built.
    fn is_gpu(&self) -> bool {
        false
    }

    /// The device this backend runs on, for reports; `None` for the host.
    fn device_info(&self) -> Option<crate::DeviceInfo> {
        None
    }

    /// Makes every tensor of `file` resolvable by its name (invariant 3), without
    /// changing one already registered; returns how many were added. A device backend
    /// uploads here, once, at load. `Err` names the tensor and the problem.
    fn register_gguf(&mut self, file: &Arc<GgufFile>) -> Result<usize, BackendError>;

    /// A zero-filled buffer of `size` f32s, recycled from the free list when possible.
    fn alloc_buffer(&mut self, size: usize) -> usize;
    /// A zero-filled buffer that bypasses the free list (split-boundary staging).
    fn alloc_fresh(&mut self, size: usize) -> usize;
    /// The most f32s one buffer of this pool may hold: the device's allocation and
    /// binding limits, and the kernels' index width. The scheduler places no node here
    /// whose output or inputs are larger, and the allocator refuses a larger buffer
    /// when the graph is allocated, so no size the graph knows fails at execution or
    /// read-back. The default (host memory) is unbounded.
    fn max_buffer_elems(&self) -> usize {
        usize::MAX
    }
    /// [`Self::alloc_buffer`] that fails, naming the problem, where the buffer cannot
    /// exist: above [`Self::max_buffer_elems`], or (a backend that knows at once) out
    /// of device memory. The allocator allocates through this.
    fn try_alloc_buffer(&mut self, size: usize) -> Result<usize, BackendError> {
        check_buffer_size(self.name(), size, self.max_buffer_elems())?;
        Ok(self.alloc_buffer(size))
    }
    /// [`Self::alloc_fresh`] that fails as [`Self::try_alloc_buffer`] does.
    fn try_alloc_fresh(&mut self, size: usize) -> Result<usize, BackendError> {
        check_buffer_size(self.name(), size, self.max_buffer_elems())?;
        Ok(self.alloc_fresh(size))
    }
    /// Returns `id` to the free list; its memory stays owned by the pool.
    fn free_buffer(&mut self, id: usize);
    /// Buffer ids ever created (grows only when no free or vacant id fits).
    fn pool_len(&self) -> usize;
    /// Elements held by the pool's buffers (0 where the backend does not know).
    fn pool_elems(&self) -> usize {
        0
    }
    /// Called when the allocator starts placing a new graph, after the previous graph's
    /// buffers were freed: buffers free at this point are named by no node of the new
    /// graph, so a host pool may give their storage another length; buffers freed later
    /// in the pass are shared only at their own length. The default does nothing.
    fn open_alloc_pass(&mut self) {}
    /// Called after each allocation pass with every buffer id the new graph, the KV
    /// and the staging use: the backend may drop the storage of other free buffers, so
    /// graphs of ever new shapes do not grow the pool without bound. Never touches
    /// an id in `in_use`.
    fn release_unused(&mut self, in_use: &[usize]) {
        let _ = in_use;
    }

    /// Opens `split`: the nodes executed until [`Self::end_split`] are its live nodes,
    /// in order. A backend that records a split's work and runs it at once keys what it
    /// records on the split it is told (CUDA Graph replay). The default does nothing.
    fn begin_split(&mut self, split: SplitSpan) -> Result<(), BackendError> {
        let _ = split;
        Ok(())
    }
    /// Closes the split opened by [`Self::begin_split`]: its work is done when this
    /// returns. The default waits ([`Self::synchronize`]). A split traced through
    /// [`Self::trace_stage`] ends in [`Self::trace_collect`] instead, which waits too.
    fn end_split(&mut self) -> Result<(), BackendError> {
        self.synchronize();
        Ok(())
    }

    /// Runs `node`, reading `in_bufs` (one per source) and writing `out_buf`.
    /// Returns `Err` saying what failed on any violated kernel invariant (invariant 7);
    /// the scheduler adds which node it was, so the error does not repeat it.
    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[crate::ir::BufRef],
        out_buf: crate::ir::BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError>;

    /// A borrowed host view of buffer `id`; `None` where memory is not host-visible.
    fn read_host(&self, id: usize) -> Option<&[f32]>;
    /// The host view the per-node trace reads right after a node executed (`None`: the
    /// backend cannot show a node's output without a synchronisation per node, so the
    /// trace stages it through [`Self::trace_stage`]). The default is [`Self::read_host`].
    fn trace_view(&self, id: usize) -> Option<&[f32]> {
        self.read_host(id)
    }
    /// Whether the per-node trace can read this backend's node outputs: a host backend
    /// through [`Self::trace_view`], a device backend by implementing
    /// [`Self::trace_stage`] and [`Self::trace_collect`]. The default: host backends only.
    fn supports_trace(&self) -> bool {
        !self.is_gpu()
    }
    /// Records, in order after the work already queued and without waiting, a copy of
    /// the first `len` values of buffer `id` (node `node`'s output, which a later node
    /// may overwrite) into `staging`. Staged values reach `read` by the next
    /// [`Self::trace_collect`] at the latest; a backend whose staging is full may hand
    /// over what it holds first (one more wait). The default refuses, naming why.
    fn trace_stage(
        &mut self,
        staging: &mut crate::trace::TraceStaging,
        node: crate::ir::NodeId,
        id: usize,
        len: usize,
        read: &mut dyn FnMut(crate::ir::NodeId, &[f32]),
    ) -> Result<(), BackendError> {
        let _ = (staging, node, id, len, read);
        Err(BackendError::TraceUnsupported {
            backend: self.name().to_string(),
        })
    }
    /// Ends a split traced through [`Self::trace_stage`]: waits for all queued work (as
    /// [`Self::synchronize`], and in its place: one wait per split) and hands every
    /// staged output to `read`, in staging order, leaving the staging empty.
    fn trace_collect(
        &mut self,
        staging: &mut crate::trace::TraceStaging,
        read: &mut dyn FnMut(crate::ir::NodeId, &[f32]),
    ) -> Result<(), BackendError> {
        let _ = (staging, read);
        self.synchronize();
        Ok(())
    }
    /// A host copy of buffer `id` (device backends override with a real readback).
    fn copy_to_host(&mut self, id: usize) -> Option<Vec<f32>> {
        self.synchronize();
        self.read_host(id).map(<[f32]>::to_vec)
    }
    /// A host copy of elements `offset..offset + len` of buffer `id`, or why not; device
    /// backends override it to read back only that window (KV rows of a session).
    fn read_host_window(
        &mut self,
        id: usize,
        offset: usize,
        len: usize,
    ) -> Result<Vec<f32>, BackendError> {
        self.synchronize();
        let buf = self
            .read_host(id)
            .ok_or(BackendError::NotHostReadable { id })?;
        offset
            .checked_add(len)
            .and_then(|end| buf.get(offset..end))
            .map(<[f32]>::to_vec)
            .ok_or(BackendError::Window {
                id,
                offset,
                len,
                buf_len: buf.len(),
            })
    }
    /// Overwrites buffer `id`; `data.len()` must equal the buffer length.
    fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), BackendError>;
    /// Overwrites `data.len()` elements of buffer `id` starting at `offset`.
    fn write_host_window(
        &mut self,
        id: usize,
        offset: usize,
        data: &[f32],
    ) -> Result<(), BackendError>;
    /// Waits for all queued work.
    fn synchronize(&mut self);

    /// Phase one of a split boundary: enqueue the transfer of `src_id` out of this pool.
    fn copy_cross(&mut self, src_id: usize) -> Result<CrossCopy, BackendError> {
        let data = self
            .read_host(src_id)
            .ok_or(BackendError::NotHostReadable { id: src_id })?
            .to_vec();
        Ok(CrossCopy {
            src_id,
            data: Some(data),
            token: 0,
        })
    }
    /// Phase two: wait for `copy` and hand its contents over (once).
    fn await_cross(&mut self, copy: &mut CrossCopy) -> Result<Vec<f32>, BackendError> {
        copy.data
            .take()
            .ok_or(BackendError::TransferConsumed { id: copy.src_id })
    }
}
