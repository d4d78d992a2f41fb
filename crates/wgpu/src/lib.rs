//! The wgpu graph backend: one code base reaching Vulkan, Metal and DX12 through
//! `wgpu`, with WGSL kernels that dequantize GGUF blocks inside the shader.
//!
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
