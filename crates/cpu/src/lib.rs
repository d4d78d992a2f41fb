//! The CPU backend of minfer.
//!
//! - `threadpool`: persistent workers, one barrier per parallel region, no spawning per node.
//! - `quant`: activation quantizers (Q8_0, Q8_K) and per-type dot products, each with a
//!   scalar reference beside its AVX2 version.
//! - `matmul`: quantized and float matrix products over the thread pool.
//! - `ops`: norms, RoPE, attention and the element-wise ops.
//! - `backend`: `CpuBackend`, the graph backend that executes nodes with the above.
//! - `hugemem`: the huge-page memory the backend keeps its own weight layouts in.

pub mod backend;
pub mod hugemem;
pub mod matmul;
pub mod ops;
pub mod quant;
pub mod threadpool;

pub use backend::CpuBackend;

use minfer_graph::{Backend, BackendConfig, BackendFactory, BackendImpl, ProbeInfo};

/// The CPU backend's entry in a binary's backend table: always usable, never a GPU.
pub const FACTORY: BackendFactory = BackendFactory {
    id: Backend::CPU,
    probe,
    create,
};

/// The host always runs the CPU kernels; the device line names the matmul kernels' ISA
/// (`avx2`, `avx2+vnni` or `scalar`, under `quant::Isa::set_cap`), which benchmark reports quote.
fn probe(_cfg: &BackendConfig) -> Result<ProbeInfo, String> {
    Ok(ProbeInfo {
        device: format!("host CPU ({})", quant::Isa::detect().name()),
        emulated: false,
        detail: None,
    })
}

fn create(cfg: &BackendConfig) -> Result<Box<dyn BackendImpl>, String> {
    if cfg.n_threads == 0 {
        return Err("the CPU backend needs at least one thread".into());
    }
    Ok(Box::new(CpuBackend::from_config(cfg)))
}
