//! Kernels for the graph ops the CPU backend executes, one file per family.
//!
//! Every kernel validates its shapes and returns `Err(String)` naming the values on a
//! violated invariant; the backend prefixes the node. Parallel kernels cut their work so
//! that each output element is computed entirely by one thread in a fixed order, which
//! makes results independent of the thread count.

pub mod act;
pub mod attn;
mod delta_chunk;
mod delta_row;
pub mod elementwise;
pub mod exp;
#[cfg(target_arch = "x86_64")]
mod exp512;
mod exp_table;
pub mod get_rows;
pub mod kv;
mod kv_decode;
pub mod layout;
pub mod moe;
pub mod norm;
pub mod recurrent;
pub mod rope;
#[cfg(target_arch = "x86_64")]
mod row_isa;
#[cfg(target_arch = "x86_64")]
mod rows;
#[cfg(target_arch = "x86_64")]
mod rows_avx2;
pub mod vec;
#[cfg(target_arch = "x86_64")]
mod vec512;

use std::marker::PhantomData;
use std::ops::Range;

use crate::threadpool::{chunk_range, ThreadPool};

/// Below this many output elements an element-wise or row op runs on the calling thread:
/// a pool barrier costs more than the work.
pub const PAR_MIN_ELEMS: usize = 1 << 15;

/// An I32 graph value stored as an f32 bit pattern.
#[inline]
pub fn as_i32(v: f32) -> i32 {
    v.to_bits() as i32
}

/// A mutable slice shared with pool threads that touch disjoint ranges of it.
pub(crate) struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: threads only reach the data through `slice`, whose contract requires disjoint
// ranges, and `T: Send` lets each thread own its part.
unsafe impl<T: Send> Sync for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    /// Borrows `s` for the lifetime of the sharing.
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        SharedMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    /// The sub-slice `r`.
    ///
    /// # Safety
    /// No other live slice obtained from `self` may overlap `r`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, r: Range<usize>) -> &mut [T] {
        // Ranges are computed by the kernels, never taken from input: a violation is a bug.
        assert!(
            r.start <= r.end && r.end <= self.len,
            "shared range out of bounds"
        );
        // SAFETY: in bounds (checked above) and disjoint from other live slices (caller).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }
}

/// Cuts `out` into rows of `row_len` (the last may be short) and calls `f(first_row, rows)`
/// on one contiguous run of rows per thread, or once on the calling thread when `parallel`
/// is false. Rows never straddle threads, so per-row results do not depend on the count.
pub(crate) fn par_rows(
    pool: &ThreadPool,
    out: &mut [f32],
    row_len: usize,
    parallel: bool,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let row_len = row_len.max(1);
    let n = out.len();
    let n_rows = n.div_ceil(row_len);
    if !parallel || pool.n_threads() == 1 || n_rows < 2 {
        f(0, out);
        return;
    }
    let shared = SharedMut::new(out);
    pool.run(&|ith, nth| {
        let rows = chunk_range(n_rows, ith, nth);
        if rows.is_empty() {
            return;
        }
        let r = rows.start * row_len..(rows.end * row_len).min(n);
        // SAFETY: row ranges of different threads are disjoint.
        let part = unsafe { shared.slice(r) };
        f(rows.start, part);
    });
}

/// Element-wise ops process pseudo-rows of this many values.
pub(crate) const ELEM_ROW: usize = 1024;
