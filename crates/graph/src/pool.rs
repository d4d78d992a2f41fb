//! `HostPool`: the buffer pool of a host-memory backend (the CPU backend and the test
//! backend share it). Buffers are addressed by id and never move; a freed id is recycled
//! for a request of exactly its length (zero-filled), so a reused graph finds its buffers
//! again; `alloc_fresh` bypasses recycling for split-boundary staging (§3.5).
//!
//! Bounded memory: graphs of new shapes (a prompt of a new length) need buffers of new
//! lengths, so free buffers of old lengths would pile up. After each allocation pass the
//! allocator calls [`HostPool::release_unused`], which drops the storage of free buffers
//! the current graph does not use once they exceed what the pool has in use; such an id
//! becomes vacant and is handed out again by a later allocation.

use crate::backend_error::BackendError;

/// f32 buffers by id, with a free list.
#[derive(Debug, Default)]
pub struct HostPool {
    /// The buffers; an id indexes this vector. Backends borrow them directly in kernels.
    pub buffers: Vec<Vec<f32>>,
    /// Freed during the current allocation pass: shared only at their exact length,
    /// since nodes placed earlier in the pass may still name them at that length.
    free: Vec<usize>,
    /// Free since before the current pass: no node of the graph being placed names
    /// them, so their storage may take another length.
    idle: Vec<usize>,
    /// Ids whose storage was released; reused before the pool grows.
    vacant: Vec<usize>,
    /// Called on each new buffer's storage before anything writes to it (the CPU
    /// backend advises large ones onto huge pages there); `None` does nothing.
    on_fresh: Option<fn(&mut [f32])>,
}

impl HostPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty pool that calls `f` on every new buffer's storage, zero-filled but not
    /// yet written (the system has mapped no page of a large one yet).
    pub fn with_on_fresh(f: fn(&mut [f32])) -> Self {
        Self {
            on_fresh: Some(f),
            ..Self::default()
        }
    }

    /// A zero-filled buffer of `size` values, recycled when possible: a free buffer of
    /// exactly that length, else the idle buffer (free since before this pass) with the
    /// least storage that holds `size` values without wasting more than half of it.
    /// Consecutive graphs of nearly equal shapes (prefill chunks of 512 and then 464
    /// tokens) so share their storage instead of each holding its own.
    pub fn alloc(&mut self, size: usize) -> usize {
        let bufs = &self.buffers;
        if let Some(pos) = self.free.iter().position(|&i| bufs[i].len() == size) {
            let id = self.free.swap_remove(pos);
            self.buffers[id].fill(0.0);
            return id;
        }
        let fit = self
            .idle
            .iter()
            .enumerate()
            .map(|(pos, &i)| (pos, i, bufs[i].len(), bufs[i].capacity()))
            .filter(|&(_, _, _, cap)| cap >= size && cap / 2 <= size)
            .min_by_key(|&(_, i, len, cap)| (len != size, cap, i))
            .map(|(pos, ..)| pos);
        if let Some(pos) = fit {
            let id = self.idle.swap_remove(pos);
            let b = &mut self.buffers[id];
            b.clear();
            b.resize(size, 0.0);
            return id;
        }
        self.alloc_fresh(size)
    }

    /// Starts an allocation pass: every buffer free now becomes idle, its storage open
    /// to any length.
    pub fn open_pass(&mut self) {
        self.idle.append(&mut self.free);
    }

    /// A new zero-filled buffer that never comes from the free list (a vacant id, whose
    /// storage was released, may be reused).
    pub fn alloc_fresh(&mut self, size: usize) -> usize {
        let mut buf = vec![0.0; size];
        if let Some(f) = self.on_fresh {
            f(&mut buf);
        }
        if let Some(id) = self.vacant.pop() {
            self.buffers[id] = buf;
            return id;
        }
        self.buffers.push(buf);
        self.buffers.len() - 1
    }

    /// Returns `id` to the free list (its memory stays in the pool); unknown, vacant or
    /// already free ids are ignored.
    pub fn free(&mut self, id: usize) {
        if id < self.buffers.len()
            && !self.free.contains(&id)
            && !self.idle.contains(&id)
            && !self.vacant.contains(&id)
        {
            self.free.push(id);
        }
    }

    /// Drops the storage of free buffers that are not in `in_use`, largest first, until
    /// the pool's storage is at most twice the length of the buffers in use (as much
    /// idle as in use when no buffer holds more storage than its length, less when
    /// some took over a longer one's). Their ids become
    /// vacant. Free buffers in `in_use` (a graph's buffers whose values expired during
    /// its pass) are never touched.
    pub fn release_unused(&mut self, in_use: &[usize]) {
        let mut used: Vec<usize> = in_use.to_vec();
        used.sort_unstable();
        used.dedup();
        // The pool's storage stays within twice the lengths in use: what buffers in use
        // hold beyond their length comes out of the idle budget.
        let (len, cap) = used
            .iter()
            .filter_map(|&id| self.buffers.get(id))
            .fold((0usize, 0usize), |(l, c), b| {
                (l + b.len(), c + b.capacity())
            });
        let budget = (2 * len).saturating_sub(cap);
        let mut idle: Vec<usize> = self
            .free
            .iter()
            .chain(&self.idle)
            .copied()
            .filter(|id| used.binary_search(id).is_err())
            .collect();
        // Smaller buffers first: they are kept while the budget lasts, so a small graph
        // met again (the decode graph between prefills) finds its buffers.
        idle.sort_by_key(|&id| (self.buffers[id].capacity(), id));
        let mut kept = 0usize;
        let mut drop = Vec::new();
        for id in idle {
            let len = self.buffers[id].capacity();
            if kept + len <= budget {
                kept += len;
            } else {
                drop.push(id);
            }
        }
        for id in drop {
            self.buffers[id] = Vec::new();
            self.free.retain(|&f| f != id);
            self.idle.retain(|&f| f != id);
            self.vacant.push(id);
        }
    }

    /// Elements held by every buffer of the pool (its memory, in f32s: the storage of a
    /// recycled buffer may exceed its length).
    pub fn elems(&self) -> usize {
        self.buffers.iter().map(Vec::capacity).sum()
    }

    /// Buffers ever created.
    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    /// Whether no buffer was ever created.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    /// Buffers currently free (freed this pass or idle since an earlier one).
    pub fn free_len(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// A borrowed view of buffer `id`.
    pub fn read(&self, id: usize) -> Option<&[f32]> {
        self.buffers.get(id).map(Vec::as_slice)
    }

    /// Overwrites buffer `id`; `data` must have exactly its length.
    pub fn write(&mut self, id: usize, data: &[f32]) -> Result<(), BackendError> {
        let b = self
            .buffers
            .get_mut(id)
            .ok_or(BackendError::NoSuchBuffer { id })?;
        if b.len() != data.len() {
            return Err(BackendError::WriteLength {
                id,
                len: b.len(),
                got: data.len(),
            });
        }
        b.copy_from_slice(data);
        Ok(())
    }

    /// Overwrites `data.len()` values of buffer `id` from `offset`.
    pub fn write_window(
        &mut self,
        id: usize,
        offset: usize,
        data: &[f32],
    ) -> Result<(), BackendError> {
        let b = self
            .buffers
            .get_mut(id)
            .ok_or(BackendError::NoSuchBuffer { id })?;
        let buf_len = b.len();
        let dst = offset
            .checked_add(data.len())
            .and_then(|end| b.get_mut(offset..end))
            .ok_or(BackendError::Window {
                id,
                offset,
                len: data.len(),
                buf_len,
            })?;
        dst.copy_from_slice(data);
        Ok(())
    }
}

/// The pool bookkeeping of a [`BackendImpl`](crate::BackendImpl) whose buffers live in a
/// [`HostPool`] field named `$pool`: `alloc_buffer`, `alloc_fresh`, `free_buffer`,
/// `pool_len`, `pool_elems` and `release_unused`, each the pool's own method, written once
/// so that every host-memory backend keeps the same bookkeeping. Used inside the impl:
/// `impl BackendImpl for B { minfer_graph::host_pool_methods!(mem); ... }`.
#[macro_export]
macro_rules! host_pool_methods {
    ($pool:ident) => {
        fn alloc_buffer(&mut self, size: usize) -> usize {
            self.$pool.alloc(size)
        }

        fn alloc_fresh(&mut self, size: usize) -> usize {
            self.$pool.alloc_fresh(size)
        }

        fn free_buffer(&mut self, id: usize) {
            self.$pool.free(id)
        }

        fn pool_len(&self) -> usize {
            self.$pool.len()
        }

        fn pool_elems(&self) -> usize {
            self.$pool.elems()
        }

        fn open_alloc_pass(&mut self) {
            self.$pool.open_pass()
        }

        fn release_unused(&mut self, in_use: &[usize]) {
            self.$pool.release_unused(in_use)
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fresh_hook_sees_every_new_buffer_and_no_recycled_one() {
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        static SEEN: AtomicUsize = AtomicUsize::new(0);
        fn count(b: &mut [f32]) {
            assert!(b.iter().all(|&v| v == 0.0), "handed over zero-filled");
            SEEN.fetch_add(b.len(), Relaxed);
        }
        let mut p = HostPool::with_on_fresh(count);
        let a = p.alloc(4);
        p.alloc_fresh(3);
        assert_eq!(SEEN.load(Relaxed), 7);
        p.write(a, &[1.0; 4]).unwrap();
        p.free(a);
        assert_eq!(p.alloc(4), a, "recycled by exact length");
        assert_eq!(SEEN.load(Relaxed), 7, "a recycled buffer is not new");
    }

    #[test]
    fn ids_are_recycled_by_exact_length_and_staging_is_fresh() {
        let mut p = HostPool::new();
        let a = p.alloc(4);
        p.write(a, &[1.0; 4]).unwrap();
        p.free(a);
        p.free(a);
        assert_eq!(p.free_len(), 1, "a double free is ignored");
        assert_eq!(p.alloc(5), 1, "a longer buffer is new");
        assert_eq!(p.alloc(4), a, "the freed buffer of that length comes back");
        assert_eq!(p.read(a), Some(&[0.0; 4][..]), "zero-filled on reuse");
        p.free(a);
        assert_ne!(p.alloc_fresh(4), a, "staging never recycles");
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn a_new_pass_reuses_the_tightest_idle_storage_that_is_not_mostly_waste() {
        let mut p = HostPool::new();
        let (big, mid, exact) = (p.alloc(100), p.alloc(60), p.alloc(50));
        p.write(mid, &[3.0; 60]).unwrap();
        for id in [big, mid, exact] {
            p.free(id);
        }
        assert_eq!(
            p.alloc(55),
            3,
            "within a pass only exact lengths are shared"
        );
        p.free(3);
        p.open_pass();
        assert_eq!(p.alloc(50), exact, "an exact length comes first");
        assert_eq!(p.alloc(55), 3, "then the same length among the idle");
        assert_eq!(p.alloc(55), mid, "then the least storage that holds it");
        assert_eq!(
            p.read(mid),
            Some(&[0.0; 55][..]),
            "zero-filled at its new length"
        );
        assert_eq!(p.alloc(20), 4, "100 values for 20 would waste most of them");
        assert_eq!(p.alloc(50), big);
        assert_eq!(p.elems(), 100 + 60 + 50 + 55 + 20, "memory counts storage");
    }

    #[test]
    fn unused_free_buffers_beyond_the_budget_are_released_and_their_ids_reused() {
        let mut p = HostPool::new();
        let live = p.alloc(10);
        let expired = p.alloc(100); // used by the current graph, value expired
        let old_small = p.alloc(4);
        let old_big = p.alloc(1000);
        for id in [expired, old_small, old_big] {
            p.free(id);
        }
        p.release_unused(&[live, expired]);
        // Budget 110: the small old buffer stays, the big one goes; `expired` is in use.
        assert_eq!(p.read(old_big), Some(&[][..]));
        assert_eq!(p.read(expired).map(<[f32]>::len), Some(100));
        assert_eq!(p.elems(), 10 + 100 + 4);
        assert_eq!(p.alloc(4), old_small, "kept buffers are still recycled");
        assert_eq!(
            p.alloc(7),
            old_big,
            "a vacant id is reused before the pool grows"
        );
        assert_eq!(p.read(old_big), Some(&[0.0; 7][..]));
        assert_eq!(p.len(), 4);
        p.free(old_big);
        p.release_unused(&[]);
        assert_eq!(p.elems(), 10 + 4, "nothing in use: every free buffer goes");
        p.free(old_big);
        assert_eq!(p.free_len(), 0, "a vacant id is never free");
    }

    #[test]
    fn writes_are_checked() {
        let mut p = HostPool::new();
        let a = p.alloc(4);
        assert!(p.write(a, &[1.0; 3]).unwrap_err().contains("holds 4"));
        assert!(p
            .write_window(a, 3, &[1.0; 2])
            .unwrap_err()
            .contains("exceeds"));
        assert!(p.write(9, &[]).unwrap_err().contains("does not exist"));
        p.write_window(a, 1, &[2.0, 3.0]).unwrap();
        assert_eq!(p.read(a), Some(&[0.0, 2.0, 3.0, 0.0][..]));
    }
}
