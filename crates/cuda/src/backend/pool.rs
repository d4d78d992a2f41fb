//! The CUDA backend's device memory: pool buffers (created, recycled, released),
//! snapshot areas, the scratch area, and the pool generation every change of a device
//! address bumps (captured graphs hold addresses, so they are dropped then).

use minfer_graph::device_kit::HostCopy;
use minfer_graph::BackendError;

use super::CudaBackend;
use crate::device::DevMem;
use crate::replay::{Arg, Cmd};

impl CudaBackend {
    /// Drops the captured graphs: a device address they use may change.
    pub(super) fn bump(&mut self) {
        self.generation += 1;
        self.replay.invalidate();
    }

    /// Zeroed device memory for `size` f32s, or why there is none (the byte count
    /// overflowing included, never a wrapped size).
    pub(super) fn device_mem(&self, size: usize) -> Result<DevMem, BackendError> {
        let bytes = size
            .checked_mul(4)
            .ok_or_else(|| format!("a buffer of {size} f32s does not fit in memory"))?;
        self.gpu.bind()?;
        DevMem::zeroed(bytes).map_err(|message| BackendError::OutOfMemory {
            backend: "cuda".into(),
            bytes,
            message,
        })
    }

    /// A new pool buffer of `size` f32s over `mem` (`None`: no storage, see
    /// `alloc_fresh`).
    pub(super) fn push_buf(&mut self, mem: Option<DevMem>, size: usize) -> usize {
        let id = self.pool.push(mem, size);
        self.bump();
        id
    }

    /// The free-list position of a buffer of exactly `size` f32s that has storage.
    pub(super) fn reusable(&self, size: usize) -> Option<usize> {
        self.pool.reusable(size, Option::is_some)
    }

    /// Takes free-list entry `pos` (of `size` f32s) for a new use, cleared in order.
    pub(super) fn reuse(&mut self, pos: usize, size: usize) -> usize {
        let id = self.pool.take_free(pos);
        self.pending.push(Cmd::Zero { dst: id, len: size });
        id
    }

    /// Length of pool buffer `id` (0 when there is none).
    pub(super) fn len(&self, id: usize) -> usize {
        self.pool.len(id)
    }

    /// The source `id`, or a snapshot of it when it is also the output (kernels that
    /// read whole rows must not see their own writes).
    pub(super) fn src_arg(&mut self, id: usize, out: usize) -> Result<Arg, BackendError> {
        if id != out {
            return Ok(Arg::Buf(id));
        }
        self.snapshot(0, Arg::Buf(id), self.len(id))
    }

    /// A copy of `len` values at `src` in snapshot area `slot` (made on first use).
    pub(super) fn snapshot(
        &mut self,
        slot: usize,
        src: Arg,
        len: usize,
    ) -> Result<Arg, BackendError> {
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
    pub(super) fn ensure_scratch(&mut self, bytes: usize) -> Result<(), BackendError> {
        if self.scratch.as_ref().is_none_or(|s| s.bytes < bytes) {
            // Every earlier use of the old area is in `pending` or finished; the
            // commands resolve addresses at flush time, so they all see the new one.
            self.gpu.bind()?;
            self.scratch = Some(DevMem::zeroed(bytes.next_power_of_two())?);
            self.bump();
        }
        Ok(())
    }

    /// Gives buffer `id` storage again when it was released (a host write to it).
    pub(super) fn ensure_storage(&mut self, id: usize) -> Result<(), BackendError> {
        if self.pool.bufs[id].mem.is_none() {
            self.gpu.bind()?;
            self.pool.bufs[id].mem = Some(DevMem::zeroed(self.pool.bufs[id].len * 4)?);
            self.pool.bufs[id].host = HostCopy::Zero;
            self.bump();
        }
        Ok(())
    }
}
