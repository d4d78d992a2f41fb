//! Helpers shared by the repacked-product tests.

use super::{matmul_repacked_with, RepackedMatrix};
use crate::matmul::MatmulScratch;
use crate::quant::Isa;
use crate::threadpool::ThreadPool;

/// `bytes` copied into 8-byte-aligned storage (block casts need the alignment).
pub(super) fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
    v
}

/// One repacked product on a fresh pool of `threads` threads; NaN-filled output so
/// unwritten elements show.
pub(super) fn run_repacked(
    isa: Isa,
    threads: usize,
    w: &RepackedMatrix,
    x: &[f32],
    nt: usize,
) -> Vec<f32> {
    let pool = ThreadPool::new(threads);
    let mut y = vec![f32::NAN; nt * w.rows()];
    matmul_repacked_with(isa, &pool, w, x, nt, &mut y, &mut MatmulScratch::new()).unwrap();
    y
}
