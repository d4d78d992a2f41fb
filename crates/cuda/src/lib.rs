//! The CUDA graph backend: kernels written in CUDA C (`src/kernels/*.cu`), compiled by
//! NVRTC at backend creation (once per process, for the device's compute capability),
//! launched through the driver API that `cudarc` loads at run time, so this crate builds
//! and links on machines with no CUDA toolkit and no driver.
//!
//! - [`FACTORY`] plugs the backend into an engine: its probe loads the driver, counts
//!   devices and checks NVRTC, saying in words what is missing.
//! - The pool holds device buffers of f32 addressed by id; weights are uploaded once in
//!   their GGUF layout and dequantized inside the kernels.
//! - Each split's work is recorded and, at the split's end, launched directly, captured
//!   into a CUDA Graph, or replayed from one ([`replay`], design §9.4).
//! - [`dispatch`] chooses kernels by shape and weight type: quantized mat-vec for decode,
//!   the int8 (dp4a) matmul with activations quantized as the CPU does for prefill.

#![deny(missing_docs)]

mod backend;
mod device;
pub mod dispatch;
pub mod kernels;
pub mod replay;

pub use backend::weights::qkv_concat_name;
pub use backend::{process_replay_stats, CudaBackend, ReplayStats};
pub use device::{arch_option, compile, probe, DeviceSummary};

use minfer_graph::{Backend, BackendConfig, BackendFactory, BackendImpl, ProbeInfo};

impl DeviceSummary {
    /// The device as reports show it.
    pub fn device_info(&self) -> minfer_graph::DeviceInfo {
        minfer_graph::DeviceInfo {
            name: self.name.clone(),
            driver: format!(
                "CUDA {}.{} (compute {}.{})",
                self.driver / 1000,
                self.driver % 1000 / 10,
                self.capability.0,
                self.capability.1
            ),
            api: "Cuda".into(),
            device_type: "DiscreteGpu".into(),
            emulated: false,
            max_buffer_bytes: Some(self.max_buffer_bytes()),
            max_binding_bytes: None,
        }
    }
}

/// The CUDA backend's entry in a binary's constructor table (id [`Backend::CUDA`]).
pub const FACTORY: BackendFactory = BackendFactory {
    id: Backend::CUDA,
    probe: factory_probe,
    create: factory_create,
};

fn factory_probe(_cfg: &BackendConfig) -> Result<ProbeInfo, String> {
    let d = probe()?;
    Ok(ProbeInfo {
        device: d.name.clone(),
        emulated: false,
        detail: Some(d.device_info()),
    })
}

fn factory_create(cfg: &BackendConfig) -> Result<Box<dyn BackendImpl>, String> {
    let mut b = CudaBackend::with_graphs(cfg.options.device_graphs)?;
    b.set_kv_types(cfg.kv_types);
    Ok(Box::new(b))
}

fn create_direct(cfg: &BackendConfig) -> Result<Box<dyn BackendImpl>, String> {
    let mut b = CudaBackend::with_graphs(false)?;
    b.set_kv_types(cfg.kv_types);
    Ok(Box::new(b))
}

/// [`FACTORY`] with CUDA Graph replay off whatever the options say: the reference side
/// of the replay bit-parity check.
pub const FACTORY_DIRECT: BackendFactory = BackendFactory {
    id: Backend::CUDA,
    probe: factory_probe,
    create: create_direct,
};

/// Support for tests that need a device: they skip, saying so, where none is usable,
/// and fail there instead under `MINFER_CUDA_TESTS=require` (the GPU check script).
#[doc(hidden)]
pub mod testing {
    /// Whether a device test should run: true when a device is usable; false (with a
    /// printed line) when not; a panic naming the reason under `MINFER_CUDA_TESTS=require`.
    pub fn device_or_skip(test: &str) -> bool {
        match super::probe() {
            Ok(_) => true,
            Err(e) if require() => {
                panic!("MINFER_CUDA_TESTS=require, but no CUDA device is usable: {e}")
            }
            Err(e) => {
                eprintln!("{test}: skipped, no CUDA device is usable ({e}); MINFER_CUDA_TESTS=require makes this a failure");
                false
            }
        }
    }

    fn require() -> bool {
        minfer_env::CUDA_TESTS.get().ok().flatten() == Some("require")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factory_has_the_pinned_cuda_row() {
        let e = minfer_graph::entry_for(FACTORY.id).expect("a registry row");
        assert_eq!((e.name, e.id), ("cuda", Backend::CUDA));
    }

    #[test]
    fn the_probe_names_what_is_missing_or_finds_a_device() {
        match probe() {
            Ok(d) => assert!(!d.name.is_empty() && d.capability >= device::MIN_CAPABILITY),
            Err(e) => assert!(
                e.contains("libcuda")
                    || e.contains("no device")
                    || e.contains("libnvrtc")
                    || e.contains("compute capability")
                    || e.contains("driver"),
                "{e}"
            ),
        }
        // Cached: a second probe answers the same without touching the driver again.
        assert_eq!(probe(), probe());
    }

    #[test]
    fn nvrtc_architecture_follows_the_capability() {
        assert_eq!(arch_option((9, 0)), "compute_90");
        assert_eq!(arch_option((8, 6)), "compute_86");
    }
}
