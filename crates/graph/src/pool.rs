//! `HostPool`: the buffer pool of a host-memory backend (the CPU backend and the test
//! backend share it). Buffers are addressed by id and never move; a freed id is recycled
//! for a request of exactly its length (zero-filled), so a reused graph finds its buffers
//! again; `alloc_fresh` bypasses recycling for split-boundary staging (§3.5).

/// f32 buffers by id, with a free list.
#[derive(Debug, Default)]
pub struct HostPool {
    /// The buffers; an id indexes this vector. Backends borrow them directly in kernels.
    pub buffers: Vec<Vec<f32>>,
    free: Vec<usize>,
}

impl HostPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    /// A zero-filled buffer of `size` values, recycled from the free list when one of
    /// exactly that length is free.
    pub fn alloc(&mut self, size: usize) -> usize {
        if let Some(pos) = self
            .free
            .iter()
            .position(|&i| self.buffers[i].len() == size)
        {
            let id = self.free.swap_remove(pos);
            self.buffers[id].fill(0.0);
            return id;
        }
        self.alloc_fresh(size)
    }

    /// A new zero-filled buffer that never comes from the free list.
    pub fn alloc_fresh(&mut self, size: usize) -> usize {
        self.buffers.push(vec![0.0; size]);
        self.buffers.len() - 1
    }

    /// Returns `id` to the free list (its memory stays in the pool); unknown or already
    /// free ids are ignored.
    pub fn free(&mut self, id: usize) {
        if id < self.buffers.len() && !self.free.contains(&id) {
            self.free.push(id);
        }
    }

    /// Buffers ever created.
    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    /// Whether no buffer was ever created.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    /// Buffers currently on the free list.
    pub fn free_len(&self) -> usize {
        self.free.len()
    }

    /// A borrowed view of buffer `id`.
    pub fn read(&self, id: usize) -> Option<&[f32]> {
        self.buffers.get(id).map(Vec::as_slice)
    }

    /// Overwrites buffer `id`; `data` must have exactly its length.
    pub fn write(&mut self, id: usize, data: &[f32]) -> Result<(), String> {
        let b = self
            .buffers
            .get_mut(id)
            .ok_or_else(|| format!("buffer {id} does not exist"))?;
        if b.len() != data.len() {
            return Err(format!(
                "buffer {id} holds {} values, got {}",
                b.len(),
                data.len()
            ));
        }
        b.copy_from_slice(data);
        Ok(())
    }

    /// Overwrites `data.len()` values of buffer `id` from `offset`.
    pub fn write_window(&mut self, id: usize, offset: usize, data: &[f32]) -> Result<(), String> {
        let b = self
            .buffers
            .get_mut(id)
            .ok_or_else(|| format!("buffer {id} does not exist"))?;
        let len = b.len();
        let dst = offset
            .checked_add(data.len())
            .and_then(|end| b.get_mut(offset..end))
            .ok_or_else(|| format!("window {offset}+{} exceeds buffer {id} ({len})", data.len()))?;
        dst.copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_recycled_by_exact_length_and_staging_is_fresh() {
        let mut p = HostPool::new();
        let a = p.alloc(4);
        p.write(a, &[1.0; 4]).unwrap();
        p.free(a);
        p.free(a);
        assert_eq!(p.free_len(), 1, "a double free is ignored");
        assert_eq!(p.alloc(3), 1, "another length gets a new buffer");
        assert_eq!(p.alloc(4), a, "the freed buffer of that length comes back");
        assert_eq!(p.read(a), Some(&[0.0; 4][..]), "zero-filled on reuse");
        p.free(a);
        assert_ne!(p.alloc_fresh(4), a, "staging never recycles");
        assert_eq!(p.len(), 3);
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
