//! minfer's declarative compute graph: one forward pass as data, assigned to
//! backends by capability, allocated with build-order liveness, executed split by
//! split, and reused across decode steps while its parameters stay equal.
//!
//! # Map from the design of record to modules
//!
//! | Design section | Module |
//! |---|---|
//! | §1.4 invariants, §3.1 IR (`ComputeGraph`, `CNode`, `Op`) | [`ir`] |
//! | §3.1 value types (`NodeId`, `DType`, `BufRef`, `PersistentBuf`, `WeightRef`, ...) | [`types`] (re-exported by [`ir`]) |
//! | the `Backend` handle and the fixed id space (`KNOWN_BACKENDS`) | [`backend_id`] (re-exported by [`ir`], [`registry`]) |
//! | §3.1 node metadata (`NodeMeta` and the metas) | [`meta`] (re-exported by [`ir`]) |
//! | §3.2 builder | [`builder`] |
//! | §3.3 allocator, liveness, KV regions, staging | [`alloc`] |
//! | §3.4 scheduler, splits, two-phase boundary, trace | [`scheduler`] |
//! | §3.5 backend trait, `KvProvider` | [`backend`] |
//! | what a backend refuses or fails, with the values (`BackendError`) | [`backend_error`] |
//! | the shared parts of device backends (pool, weights, node checks) | [`device_kit`] |
//! | §3.6 registry and fence | [`registry`] |
//! | §3.7 / §6 params and reuse cache | [`params`], [`cache`] |
//! | §5 fusion | [`fusion`] |
//! | §8.1 DOT, §8.2 JSON (+ import) | [`export::dot`], [`export::json`] |
//! | §8.3 per-node capture, the `minfer-trace` file | [`trace`] |
//! | test backend for CPU-only CI, the op-case table every backend runs | [`testing`], [`testing::cases`] |
//!
//! # Naming
//!
//! The design names both the handle and the trait `Backend`. Here the handle keeps
//! the name ([`Backend`], a `u16` id: CPU 0, Metal 1, CUDA 2) and the trait is
//! [`BackendImpl`], so both can be imported side by side.
//!
//! # Model independence
//!
//! Nothing here reads model files. Builders take [`WeightRef`] (name, ggml type id,
//! GGUF shape `[in, out]`); nodes carry weight names only (invariant 3) and each
//! backend resolves them in its own registry.
//!
//! # Decisions this crate makes where the design leaves room
//!
//! * `attn` takes an optional span node: sources are `[q, kv, pos]`, plus `span`
//!   (I32 `[2, nt]`, per-token `[lo, hi)`) when present, which also sets
//!   `Op::Attn::explicit_span`.
//! * Fusion-orphaned nodes are recorded in `ComputeGraph::dead`.
//! * Staging copies are keyed by (node, destination backend), so one value feeding
//!   two other backends gets one staging buffer on each.
//! * The reference backend in [`testing`] occupies real ids (CPU, and the Metal slot
//!   as "test") rather than inventing ids outside the file-format id space.

#![warn(missing_docs)]

pub mod alloc;
pub mod backend;
pub mod backend_error;
pub mod backend_id;
pub mod backend_options;
pub mod builder;
pub mod cache;
pub mod device_kit;
pub mod error;
pub mod export;
pub mod fusion;
pub mod ir;
pub mod kv_placement;
pub mod kv_ring;
pub mod kvtype;
pub mod meta;
pub mod params;
pub mod pool;
pub mod registry;
pub mod scheduler;
pub mod testing;
pub mod trace;
pub mod types;

pub use alloc::{GraphAllocator, KvRegion};
pub use backend::{
    check_buffer_size, BackendImpl, CrossCopy, FaultInjector, KvProvider, SplitSpan,
};
pub use backend_error::{BackendError, IndexKind, WeightError};
pub use backend_options::{BackendOptions, Fusions, GpuApi};
pub use builder::GraphBuilder;
pub use cache::{CacheCounters, GraphCache};
pub use error::GraphError;
pub use export::json::{export_graph_json, import_json, import_json_str};
pub use fusion::{FusionPass, FusionRule, Rewrite, RULES};
pub use ir::{
    AttnMode, Backend, BufRef, CNode, ComputeGraph, DType, FusedOp, NodeId, Op, PersistentBuf,
    RopeStyle, WeightRef, WeightType,
};
pub use kv_ring::{KvRing, RingParams};
pub use kvtype::KvType;
pub use meta::*;
pub use params::{BackendCaps, CParams, GraphParams, GraphType};
pub use pool::HostPool;
pub use registry::{
    cpu_fallback_notice, emulation_reason, entry_for, BackendConfig, BackendEntry, BackendFactory,
    BackendRegistry, DeviceInfo, FenceError, KnownBackend, ProbeInfo, Selection, KNOWN_BACKENDS,
};
pub use scheduler::{BackendScheduler, Placement, PlacementReason, SchedulerOptions, Split};
