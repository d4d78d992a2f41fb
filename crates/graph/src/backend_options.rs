//! The backends' tuning knobs, resolved once by the caller and handed to every backend
//! factory inside its [`crate::BackendConfig`].
//!
//! One flat struct, each field documented with the backend that reads it: a factory
//! reads the fields that concern it and ignores the others, so adding a knob touches this
//! file and the one backend, never the others or the engine. Only plain values live here
//! (no backend type), which keeps this crate free of any backend's internals. The command
//! line fills it from `MINFER_*` at start-up; libraries never read the environment.

/// Which decode fusions a backend executes (and so reports in `supports_fused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fusions {
    /// `FusedQKV` / `FusedQkvNorm`: one activation quantisation and one pool region for
    /// q, k and v, then bias, q/k norm, RoPE and the KV store.
    pub qkv: bool,
    /// `FusedFFN`: gate and up in one pool region, then SwiGLU.
    pub ffn: bool,
}

impl Fusions {
    /// Neither fusion (the default: not measured faster yet, BENCHMARKS.md).
    pub const NONE: Fusions = Fusions {
        qkv: false,
        ffn: false,
    };

    /// Both fusions.
    pub const ALL: Fusions = Fusions {
        qkv: true,
        ffn: true,
    };
}

/// A graphics API a GPU backend may be restricted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuApi {
    /// Vulkan.
    Vulkan,
    /// Metal.
    Metal,
    /// Direct3D 12.
    Dx12,
}

/// Tuning knobs of the backends: none changes results, only speed or which device runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendOptions {
    /// CPU: the decode fusions it executes (`MINFER_FUSE`); none by default.
    pub fusions: Fusions,
    /// CPU: the repacked matmul layout where a weight type has one (`MINFER_REPACK`); on
    /// by default.
    pub repack: bool,
    /// wgpu: the one graphics API adapters are looked for on (`MINFER_WGPU_API`); `None`,
    /// the default, is every native one.
    pub gpu_api: Option<GpuApi>,
    /// CUDA: capture splits as CUDA Graphs and replay them (`MINFER_CUDA_GRAPHS`); on by
    /// default. The engine turns it off while per-node tracing or profiling is on, which
    /// needs each launch on its own.
    pub device_graphs: bool,
}

impl Default for BackendOptions {
    /// No fusions, repacking on, every graphics API, device graphs on.
    fn default() -> Self {
        BackendOptions {
            fusions: Fusions::NONE,
            repack: true,
            gpu_api: None,
            device_graphs: true,
        }
    }
}
