//! `DevicePool`: the id table of a device backend's buffer pool, generic over the
//! device memory `M` of one buffer. It owns what every device pool keeps beside the
//! memory: the length, the free list, and the host's knowledge of the contents.
//!
//! Index inputs (token ids, positions, KV cells, spans) are range checked on the host
//! before a kernel may read them. They arrive through `write_host` (the allocator fills
//! inputs and stages cross-backend values that way), so the pool keeps a host copy of
//! every small buffer the host wrote, dropped as soon as a kernel overwrites it.

use crate::backend_error::BackendError;
use crate::ir::{Backend, BufRef};

/// Largest host-written buffer whose values the pool remembers. Index inputs are a
/// few values per token; staged activations can be megabytes and are never indices.
pub const HOST_COPY_MAX: usize = 1 << 16;

/// What the host knows about a pool buffer's contents.
#[derive(Debug)]
pub enum HostCopy {
    /// Freshly allocated or cleared: all zeros.
    Zero,
    /// Last written by the host with these values.
    Known(Vec<f32>),
    /// Written by a kernel since.
    Unknown,
}

/// One pool buffer: its device memory, its length in f32s and the host's copy.
#[derive(Debug)]
pub struct DeviceBuf<M> {
    /// The device memory (whatever the backend keeps per buffer).
    pub mem: M,
    /// Length in f32s.
    pub len: usize,
    /// What the host knows of the contents.
    pub host: HostCopy,
}

/// Device buffers of f32 by id, with a free list; ids are never reused for another
/// length and a buffer never changes its id.
#[derive(Debug)]
pub struct DevicePool<M> {
    /// The buffers; an id indexes this vector.
    pub bufs: Vec<DeviceBuf<M>>,
    /// Ids free for reuse by a request of exactly their length.
    pub free: Vec<usize>,
    backend: Backend,
    label: &'static str,
}

impl<M> DevicePool<M> {
    /// An empty pool of backend `backend`, named `label` in its errors ("wgpu", "CUDA").
    pub fn new(backend: Backend, label: &'static str) -> Self {
        Self {
            bufs: Vec::new(),
            free: Vec::new(),
            backend,
            label,
        }
    }

    /// The backend name used in this pool's error messages.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// Buffers ever created.
    pub fn count(&self) -> usize {
        self.bufs.len()
    }

    /// Length of buffer `id` in f32s; 0 for an unknown id.
    pub fn len(&self, id: usize) -> usize {
        self.bufs.get(id).map_or(0, |b| b.len)
    }

    /// Adds a buffer of `len` f32s over `mem`, known to be zero; returns its id.
    pub fn push(&mut self, mem: M, len: usize) -> usize {
        self.bufs.push(DeviceBuf {
            mem,
            len,
            host: HostCopy::Zero,
        });
        self.bufs.len() - 1
    }

    /// The free-list position of a buffer of exactly `size` f32s whose memory passes
    /// `usable`.
    pub fn reusable(&self, size: usize, usable: impl Fn(&M) -> bool) -> Option<usize> {
        self.free
            .iter()
            .position(|&i| self.bufs[i].len == size && usable(&self.bufs[i].mem))
    }

    /// Takes free-list entry `pos` for a new use; the caller clears the device memory
    /// in order, so the host knows it as zero. Returns the id.
    pub fn take_free(&mut self, pos: usize) -> usize {
        let id = self.free.swap_remove(pos);
        self.bufs[id].host = HostCopy::Zero;
        id
    }

    /// Returns `id` to the free list; unknown or already free ids are ignored.
    pub fn free(&mut self, id: usize) {
        if id < self.bufs.len() && !self.free.contains(&id) {
            self.free.push(id);
        }
    }

    /// Records that a kernel wrote buffer `id`: the host copy is stale.
    pub fn written_by_device(&mut self, id: usize) {
        if let Some(b) = self.bufs.get_mut(id) {
            b.host = HostCopy::Unknown;
        }
    }

    /// The pool id of `b`, or why it is not a buffer of this pool (`what` names it).
    pub fn id_of(&self, b: BufRef, what: &str) -> Result<usize, BackendError> {
        if b.backend != self.backend || b.id >= self.bufs.len() {
            return Err(BackendError::ForeignBuffer {
                what: what.to_string(),
                id: b.id,
                owner: b.backend,
                pool: self.label.to_string(),
                count: self.bufs.len(),
            });
        }
        Ok(b.id)
    }

    /// The first `n` values of a host-written index buffer, as integers.
    pub fn host_ints(&self, id: usize, n: usize, what: &str) -> Result<Vec<i32>, BackendError> {
        let b = self
            .bufs
            .get(id)
            .ok_or_else(|| BackendError::NoIndexBuffer {
                what: what.to_string(),
                id,
            })?;
        if b.len < n {
            return Err(BackendError::TooFewIndices {
                what: what.to_string(),
                len: b.len,
                tokens: n,
            });
        }
        match &b.host {
            HostCopy::Zero => Ok(vec![0; n]),
            HostCopy::Known(v) => Ok(v[..n].iter().map(|&x| x.to_bits() as i32).collect()),
            HostCopy::Unknown => Err(BackendError::IndicesOnDevice {
                what: what.to_string(),
                id,
                backend: self.label.to_string(),
            }),
        }
    }

    /// The length of buffer `id` when `data` fills it exactly, else why not.
    pub fn check_whole(&self, id: usize, data: &[f32]) -> Result<usize, BackendError> {
        let len = self.existing_len(id)?;
        if len != data.len() {
            return Err(BackendError::WriteLength {
                id,
                len,
                got: data.len(),
            });
        }
        Ok(len)
    }

    /// The length of buffer `id` when `data` fits at `offset`, else why not.
    pub fn check_window(
        &self,
        id: usize,
        offset: usize,
        data: &[f32],
    ) -> Result<usize, BackendError> {
        let len = self.existing_len(id)?;
        offset
            .checked_add(data.len())
            .filter(|&e| e <= len)
            .ok_or(BackendError::Window {
                id,
                offset,
                len: data.len(),
                buf_len: len,
            })?;
        Ok(len)
    }

    fn existing_len(&self, id: usize) -> Result<usize, BackendError> {
        Ok(self
            .bufs
            .get(id)
            .ok_or(BackendError::NoSuchBuffer { id })?
            .len)
    }

    /// Updates the host copy of buffer `id` after the host wrote `data` at `offset`
    /// (a window checked by [`DevicePool::check_window`]).
    pub fn note_window(&mut self, id: usize, offset: usize, data: &[f32]) {
        let b = &mut self.bufs[id];
        let (len, end) = (b.len, offset + data.len());
        let host = std::mem::replace(&mut b.host, HostCopy::Unknown);
        b.host = match host {
            HostCopy::Zero if len <= HOST_COPY_MAX => {
                let mut v = vec![0.0; len];
                v[offset..end].copy_from_slice(data);
                HostCopy::Known(v)
            }
            HostCopy::Known(mut v) => {
                v[offset..end].copy_from_slice(data);
                HostCopy::Known(v)
            }
            HostCopy::Zero | HostCopy::Unknown => HostCopy::Unknown,
        };
    }

    /// Sets the host copy of buffer `id` after the host wrote all of it with `data`.
    pub fn note_whole(&mut self, id: usize, data: &[f32]) {
        let b = &mut self.bufs[id];
        b.host = if b.len <= HOST_COPY_MAX {
            HostCopy::Known(data.to_vec())
        } else {
            HostCopy::Unknown
        };
    }
}

/// What a device backend provides for the host-write protocol the kit implements:
/// its pool, and the recording of one upload in order with its kernels.
pub trait DeviceHost {
    /// The device memory of one pool buffer.
    type Mem;
    /// The backend's pool.
    fn device_pool(&self) -> &DevicePool<Self::Mem>;
    /// The backend's pool, mutably.
    fn device_pool_mut(&mut self) -> &mut DevicePool<Self::Mem>;
    /// Records the upload of non-empty `data` at `offset` of buffer `id` (a checked
    /// window), ordered after every command recorded before it.
    fn upload(&mut self, id: usize, offset: usize, data: &[f32]) -> Result<(), BackendError>;
    /// Waits for everything recorded and reads all of buffer `id` back.
    fn read_back(&mut self, id: usize) -> Result<Vec<f32>, BackendError>;
}

/// [`BackendImpl::write_host`](crate::BackendImpl::write_host) of a device backend:
/// `data` must fill buffer `id` exactly; the host copy is kept when small.
pub fn write_host<B: DeviceHost + ?Sized>(
    b: &mut B,
    id: usize,
    data: &[f32],
) -> Result<(), BackendError> {
    b.device_pool().check_whole(id, data)?;
    write_host_window(b, id, 0, data)?;
    b.device_pool_mut().note_whole(id, data);
    Ok(())
}

/// [`BackendImpl::write_host_window`](crate::BackendImpl::write_host_window) of a
/// device backend: `data` at `offset` of buffer `id`, inside it.
pub fn write_host_window<B: DeviceHost + ?Sized>(
    b: &mut B,
    id: usize,
    offset: usize,
    data: &[f32],
) -> Result<(), BackendError> {
    b.device_pool().check_window(id, offset, data)?;
    if data.is_empty() {
        return Ok(());
    }
    b.upload(id, offset, data)?;
    b.device_pool_mut().note_window(id, offset, data);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        pool: DevicePool<()>,
        uploads: Vec<(usize, usize, usize)>,
    }

    impl DeviceHost for Fake {
        type Mem = ();
        fn device_pool(&self) -> &DevicePool<()> {
            &self.pool
        }
        fn device_pool_mut(&mut self) -> &mut DevicePool<()> {
            &mut self.pool
        }
        fn upload(&mut self, id: usize, offset: usize, data: &[f32]) -> Result<(), BackendError> {
            self.uploads.push((id, offset, data.len()));
            Ok(())
        }
        fn read_back(&mut self, _id: usize) -> Result<Vec<f32>, BackendError> {
            Err(BackendError::device("no device"))
        }
    }

    #[test]
    fn host_writes_are_checked_and_shadowed() {
        let mut f = Fake {
            pool: DevicePool::new(Backend::CUDA, "test"),
            uploads: Vec::new(),
        };
        let a = f.pool.push((), 4);
        assert!(write_host(&mut f, a, &[1.0; 3])
            .unwrap_err()
            .contains("holds 4"));
        assert!(write_host_window(&mut f, a, 3, &[1.0; 2])
            .unwrap_err()
            .contains("exceeds"));
        assert!(write_host(&mut f, 9, &[])
            .unwrap_err()
            .contains("does not exist"));
        write_host_window(&mut f, a, 1, &[f32::from_bits(2), f32::from_bits(3)]).unwrap();
        assert_eq!(f.pool.host_ints(a, 4, "ids").unwrap(), vec![0, 2, 3, 0]);
        write_host_window(&mut f, a, 0, &[]).unwrap();
        assert_eq!(
            f.uploads,
            vec![(a, 1, 2)],
            "an empty window uploads nothing"
        );
        f.pool.written_by_device(a);
        assert!(f
            .pool
            .host_ints(a, 1, "ids")
            .unwrap_err()
            .contains("test backend"));
    }

    #[test]
    fn free_ids_come_back_for_their_length_only() {
        let mut p = DevicePool::new(Backend::CUDA, "test");
        let a = p.push(true, 4);
        p.free(a);
        p.free(a);
        assert_eq!(p.free.len(), 1, "a double free is ignored");
        assert_eq!(p.reusable(3, |_| true), None);
        assert_eq!(p.reusable(4, |m| !m), None, "unusable memory is skipped");
        let pos = p.reusable(4, |&m| m).unwrap();
        assert_eq!(p.take_free(pos), a);
        let other = BufRef {
            backend: Backend::CPU,
            id: a,
        };
        assert!(p
            .id_of(other, "the output")
            .unwrap_err()
            .contains("not in the test pool"));
    }
}
