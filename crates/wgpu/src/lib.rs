//! The wgpu graph backend: one code base reaching Vulkan, Metal and DX12 through
//! `wgpu`, with WGSL kernels that dequantize GGUF blocks inside the shader.
//!
//! - [`FACTORY`] plugs the backend into an engine: its probe enumerates the adapters
//!   once per process and reports the best one (and whether it is a CPU emulation,
//!   which the registry uses only when the fence names this backend).
//! - [`WgpuBackend::probe`] picks an adapter and says in words why none is usable.
//!   A CPU-emulation adapter (llvmpipe/lavapipe, WARP) is taken only when the caller
//!   asks for this backend by name: minfer's own CPU kernels are faster.
//! - The pool holds device storage buffers of f32 addressed by id, recycled by exact
//!   size like the CPU pool; host I/O goes through staging buffers.
//! - Work is recorded into one command encoder per split and submitted by
//!   `synchronize`, which the scheduler calls at every split boundary.
//! - Weights are uploaded once, by name, in their GGUF byte layout.

#![deny(missing_docs)]

mod backend;
mod device;
mod kernels;

pub use backend::{WeightError, WgpuBackend};
pub use device::{AdapterSummary, NotUsable};

use minfer_graph::{Backend, BackendConfig, BackendFactory, BackendImpl, ProbeInfo};

/// The wgpu backend's entry in a binary's constructor table (id [`Backend::WGPU`]).
pub const FACTORY: BackendFactory = BackendFactory {
    id: Backend::WGPU,
    probe: factory_probe,
    create: factory_create,
};

/// The best adapter the kernels can run on, an emulation included: the registry, not
/// the probe, decides that an emulation is used only when the fence names it.
fn factory_probe(cfg: &BackendConfig) -> Result<ProbeInfo, String> {
    let a = device::best(cfg.options.gpu_api, true).map_err(|e| e.reason)?;
    Ok(ProbeInfo {
        device: a.name.clone(),
        emulated: a.is_cpu_emulation,
        detail: Some(a.device_info()),
    })
}

fn factory_create(cfg: &BackendConfig) -> Result<Box<dyn BackendImpl>, String> {
    let mut b = WgpuBackend::probe_on(cfg.options.gpu_api, true).map_err(|e| e.reason)?;
    b.set_kv_types(cfg.kv_types);
    Ok(Box::new(b))
}

/// The adapter [`FACTORY`] would run on with every native graphics API allowed, for
/// reports: `Err` says why there is none.
pub fn adapter_summary() -> Result<AdapterSummary, NotUsable> {
    device::best(None, true)
}

/// Support for tests that need an adapter: they fail where none is found (CI installs
/// Mesa's lavapipe) unless `MINFER_WGPU_TESTS=skip` opts out, which they say.
#[doc(hidden)]
pub mod testing {
    use super::WgpuBackend;

    /// The backend on any adapter, CPU emulation included (tests name it explicitly);
    /// `None` only under the explicit opt-out. Panics, naming the fix, otherwise.
    pub fn gpu() -> Option<WgpuBackend> {
        match WgpuBackend::probe(true) {
            Ok(b) => Some(b),
            Err(e) if skip() => {
                eprintln!("wgpu test skipped because MINFER_WGPU_TESTS=skip: {e}");
                None
            }
            Err(e) => panic!(
                "no usable wgpu adapter: {e}. Install Mesa's lavapipe (Debian: \
                 mesa-vulkan-drivers) or set MINFER_WGPU_TESTS=skip to skip the wgpu tests \
                 explicitly"
            ),
        }
    }

    /// Whether a test that needs an adapter should run: true when one is usable, false
    /// under the opt-out (saying so), a panic otherwise.
    pub fn adapter_or_skip() -> bool {
        match super::adapter_summary() {
            Ok(_) => true,
            Err(e) if skip() => {
                eprintln!("wgpu test skipped because MINFER_WGPU_TESTS=skip: {e}");
                false
            }
            Err(e) => panic!(
                "no usable wgpu adapter: {e}. Install Mesa's lavapipe (Debian: \
                 mesa-vulkan-drivers) or set MINFER_WGPU_TESTS=skip to skip the wgpu tests \
                 explicitly"
            ),
        }
    }

    fn skip() -> bool {
        minfer_env::WGPU_TESTS.get().ok().flatten() == Some("skip")
    }
}
