//! Weight memory on transparent huge pages, and the advice that puts the backend's large
//! pool buffers there too ([`advise_huge`]).
//!
//! Decode streams every weight byte once per token, so its speed is the memory read
//! bandwidth one core can draw. With 4 KiB pages that bandwidth is lower than it need be:
//! the hardware prefetchers stop at every 4 KiB boundary and each page costs a TLB walk.
//! Weights the CPU backend keeps in its own layout are therefore carved out of 2 MiB-aligned
//! anonymous slabs advised `MADV_HUGEPAGE`, which the kernel backs with 2 MiB pages where
//! transparent huge pages are enabled (`always` or `madvise`, the common default). Small
//! matrices share a slab, so they sit on huge pages too, and nothing is rounded up to a
//! page of its own. Where the kernel gives no huge pages the memory behaves as any heap
//! allocation. Only the placement changes: the bytes, and so every result, are the same.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, Weak};

/// The huge page size the slabs are aligned to.
const HUGE: usize = 2 << 20;
/// Bytes of a shared slab; a request of half this or more gets a slab of its own.
const SLAB: usize = 64 << 20;
/// Alignment of every allocation (a cache line, above every block and tile alignment).
const ALIGN: usize = 64;

/// One anonymous mapping whose `cap` usable bytes start at a 2 MiB boundary.
struct Slab {
    /// Keeps the mapping alive; never read through directly.
    _map: memmap2::MmapMut,
    base: *mut u8,
    cap: usize,
}

// SAFETY: the slab only hands out disjoint ranges (see `Arena::alloc`), each owned by one
// `HugeVec`, which is the only code that dereferences `base`.
unsafe impl Send for Slab {}
// SAFETY: as above; `Slab` itself never reads or writes the memory.
unsafe impl Sync for Slab {}

impl Slab {
    fn new(cap: usize) -> std::io::Result<Slab> {
        let cap = cap.div_ceil(HUGE) * HUGE;
        let mut map = memmap2::MmapMut::map_anon(cap + HUGE)?;
        let start = map.as_mut_ptr();
        let offset = (start as usize).next_multiple_of(HUGE) - start as usize;
        // Advice only: without transparent huge pages the call fails or does nothing and
        // the slab is ordinary memory.
        #[cfg(target_os = "linux")]
        let _ = map.advise_range(memmap2::Advice::HugePage, offset, cap);
        // SAFETY: `offset < HUGE` and the map holds `cap + HUGE` bytes.
        let base = unsafe { start.add(offset) };
        Ok(Slab {
            _map: map,
            base,
            cap,
        })
    }
}

/// The slab small allocations are carved from, held weakly: when every allocation in it
/// has been dropped, its memory goes back to the system.
struct Arena {
    slab: Weak<Slab>,
    used: usize,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena {
    slab: Weak::new(),
    used: 0,
});

impl Arena {
    /// `bytes` (a multiple of [`ALIGN`]) of zeroed memory: the slab and the offset into it.
    fn alloc(bytes: usize) -> std::io::Result<(Arc<Slab>, usize)> {
        if bytes >= SLAB / 2 {
            return Ok((Arc::new(Slab::new(bytes)?), 0));
        }
        let mut arena = ARENA.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slab) = arena.slab.upgrade() {
            if arena.used + bytes <= slab.cap {
                let off = arena.used;
                arena.used += bytes;
                return Ok((slab, off));
            }
        }
        let slab = Arc::new(Slab::new(SLAB)?);
        arena.slab = Arc::downgrade(&slab);
        arena.used = bytes;
        Ok((slab, 0))
    }
}

/// Advises the whole 2 MiB pages inside `buf` onto transparent huge pages, for the
/// backend's large buffers (the K/V and recurrent-state regions above all, which decode
/// reads whole at every token, in runs too short for the prefetchers to follow across
/// 4 KiB pages). Called before anything is written to a fresh buffer, whose pages are
/// not mapped yet: their first touch then maps 2 MiB pages. A buffer holding no whole
/// huge page is left alone, and so is everything where the advice is not supported;
/// only the placement changes, never the bytes.
pub fn advise_huge(buf: &mut [f32]) {
    #[cfg(target_os = "linux")]
    {
        let start = buf.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(buf);
        let (first, last) = (start.next_multiple_of(HUGE), end - end % HUGE);
        if first < last {
            // SAFETY: `[first, last)` lies inside `buf`, memory this process owns and
            // mapped; the advice changes how its pages are backed, not their contents,
            // and a refusal (no transparent huge pages) is ignored.
            unsafe {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

/// A fixed-length, zero-initialised array of `T` on huge-page weight memory: a `Vec`
/// that cannot grow.
pub struct HugeVec<T> {
    slab: Arc<Slab>,
    ptr: *mut T,
    len: usize,
    _owns: PhantomData<T>,
}

// SAFETY: a `HugeVec` owns its range exclusively (the arena never hands it out twice), so
// moving it to another thread is as sound as moving a `Vec<T>`.
unsafe impl<T: Send> Send for HugeVec<T> {}
// SAFETY: shared access only reads, as for `&[T]`.
unsafe impl<T: Sync> Sync for HugeVec<T> {}

impl<T: bytemuck::Pod> HugeVec<T> {
    /// `len` zeroed elements; errors only where the system refuses the mapping.
    pub fn zeroed(len: usize) -> std::io::Result<Self> {
        const { assert!(std::mem::align_of::<T>() <= ALIGN) };
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .and_then(|b| b.checked_next_multiple_of(ALIGN))
            .ok_or_else(|| std::io::Error::other("weight buffer size overflows"))?;
        let (slab, off) = Arena::alloc(bytes.max(ALIGN))?;
        // SAFETY: `off + bytes <= slab.cap`, and `off` is a multiple of `ALIGN`, so the
        // pointer is inside the slab and aligned for `T`.
        let ptr = unsafe { slab.base.add(off) }.cast::<T>();
        Ok(HugeVec {
            slab,
            ptr,
            len,
            _owns: PhantomData,
        })
    }

    /// A copy of `src`.
    pub fn from_slice(src: &[T]) -> std::io::Result<Self> {
        let mut v = Self::zeroed(src.len())?;
        v.copy_from_slice(src);
        Ok(v)
    }
}

impl<T> std::ops::Deref for HugeVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr..ptr + len` lies in the live slab this value keeps alive, is
        // aligned, initialised (zeroed anonymous memory of a `Pod` type, or written since)
        // and owned by this value alone.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T> std::ops::DerefMut for HugeVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: bytemuck::Pod> Clone for HugeVec<T> {
    fn clone(&self) -> Self {
        match Self::from_slice(self) {
            Ok(v) => v,
            // As `Vec::clone` does when memory runs out.
            Err(e) => panic!("out of memory copying {} weight bytes: {e}", self.len),
        }
    }
}

impl<T> std::fmt::Debug for HugeVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HugeVec")
            .field("len", &self.len)
            .field("slab_bytes", &self.slab.cap)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_keeps_the_bytes_of_small_unaligned_and_large_buffers() {
        for len in [0, 3, 1000, 3 << 20] {
            let mut b = vec![0.0f32; len];
            advise_huge(&mut b);
            assert!(b.iter().all(|&v| v == 0.0));
            b.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
            if let Some(tail) = b.get_mut(1..) {
                advise_huge(tail);
            }
            assert!(b.iter().enumerate().all(|(i, &v)| v == i as f32));
        }
    }

    #[test]
    fn allocations_are_zeroed_aligned_disjoint_and_copy_exactly() {
        let mut a = HugeVec::<u32>::zeroed(1000).unwrap();
        let mut b = HugeVec::<u8>::zeroed(3).unwrap();
        assert!(a.iter().all(|&v| v == 0) && b.iter().all(|&v| v == 0));
        assert_eq!(a.as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        a.iter_mut().enumerate().for_each(|(i, v)| *v = i as u32);
        b.fill(7);
        assert!(
            a.iter().enumerate().all(|(i, &v)| v == i as u32),
            "b overlaps a"
        );
        let c = a.clone();
        assert_eq!(&c[..], &a[..]);
        assert_ne!(c.as_ptr(), a.as_ptr());
        // A large request has a slab of its own and starts on a huge page boundary.
        let big = HugeVec::<u8>::from_slice(&vec![1u8; SLAB]).unwrap();
        assert_eq!(big.as_ptr() as usize % HUGE, 0);
        assert!(big.iter().all(|&v| v == 1));
        let empty = HugeVec::<u64>::zeroed(0).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn a_slab_is_released_once_its_last_allocation_drops() {
        // A slab of its own, so no other test's allocation can share it.
        let a = HugeVec::<u8>::zeroed(SLAB / 2).unwrap();
        let weak = Arc::downgrade(&a.slab);
        assert!(weak.upgrade().is_some());
        drop(a);
        assert!(weak.upgrade().is_none());
    }
}
