//! The CPU backend of minfer.
//!
//! - `threadpool`: persistent workers, one barrier per parallel region, no spawning per node.
//! - `quant`: activation quantizers (Q8_0, Q8_K) and per-type dot products, each with a
//!   scalar reference beside its AVX2 version.
//! - `matmul`: quantized and float matrix products over the thread pool.
//! - `ops`: norms, RoPE, attention and the element-wise ops.
//! - `backend`: `CpuBackend`, the graph backend that executes nodes with the above.

pub mod backend;
pub mod matmul;
pub mod ops;
pub mod quant;
pub mod threadpool;

pub use backend::CpuBackend;
