//! The kit of a device backend (wgpu, CUDA): what every backend whose buffers live in
//! device memory needs and would otherwise write again. A device backend keeps its
//! kernels, its device memory and the recording of its commands; the kit keeps the
//! rest, generic over the memory type:
//!
//! - [`pool`]: the buffer id table with the host's copy of small host-written buffers
//!   (index inputs are range checked from it), and `write_host`/`write_host_window`
//!   over the backend's one upload primitive ([`DeviceHost`]);
//! - [`weights`]: weights by name in their GGUF layout, the skipped tensors, and the
//!   registration checks, over the backend's upload;
//! - [`node`]: the capability answers (`supports_op`, `supports_node`), the node
//!   prologue (sources and output resolved to pool ids and checked);
//! - [`dispatch`]: the node dispatch over one trait per op family
//!   ([`ElementwiseOps`], [`MatmulOps`], [`FusedOps`], [`KvOps`]), which a backend
//!   implements beside that family's kernels, and the plans of the fused products;
//! - [`checks`]: the size, geometry and index checks of each op family.
//!
//! A backend implements [`DeviceHost`] and the four family traits, executes a node
//! with [`dispatch::run`], and, inside its `BackendImpl` impl, writes
//! `minfer_graph::device_backend_methods!(pool_field);` for the methods they all
//! answer alike, as host-memory backends use [`host_pool_methods!`](crate::host_pool_methods).

pub mod checks;
pub mod dispatch;
pub mod node;
pub mod pool;
pub mod weights;

pub use dispatch::{
    ElementwiseOps, FusedOps, KvOps, MatmulOps, MatmulPlan, NodeCall, QkvPlan, Unary,
};
pub use node::{supports_node, supports_op, NodeBufs};
pub use pool::{DeviceBuf, DeviceHost, DevicePool, HostCopy, HOST_COPY_MAX};
pub use weights::{DeviceWeight, WeightError, WeightLayout, WeightTable};

/// The `BackendImpl` methods every device backend answers the same way, written
/// once: `is_gpu` (true), `supports_op` (the kit's [`supports_op`]),
/// `supports_attn_span` (true), and over its [`DevicePool`] field `$pool` and its
/// [`DeviceHost`] impl: `free_buffer`, `pool_len`, `read_host` (none: the values are
/// on the device), `write_host`, `write_host_window`, `copy_to_host` and `copy_cross`
/// (a read-back). Used inside the impl:
/// `impl BackendImpl for B { minfer_graph::device_backend_methods!(pool); ... }`.
#[macro_export]
macro_rules! device_backend_methods {
    ($pool:ident) => {
        fn is_gpu(&self) -> bool {
            true
        }

        fn supports_op(&self, op: &$crate::Op, dtype: $crate::DType) -> bool {
            $crate::device_kit::supports_op(op, dtype)
        }

        fn supports_attn_span(&self) -> bool {
            true
        }

        fn free_buffer(&mut self, id: usize) {
            self.$pool.free(id)
        }

        fn pool_len(&self) -> usize {
            self.$pool.count()
        }

        fn read_host(&self, _id: usize) -> Option<&[f32]> {
            None
        }

        fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), $crate::BackendError> {
            $crate::device_kit::pool::write_host(self, id, data)
        }

        fn write_host_window(
            &mut self,
            id: usize,
            offset: usize,
            data: &[f32],
        ) -> Result<(), $crate::BackendError> {
            $crate::device_kit::pool::write_host_window(self, id, offset, data)
        }

        fn copy_to_host(&mut self, id: usize) -> Option<Vec<f32>> {
            $crate::device_kit::DeviceHost::read_back(self, id).ok()
        }

        fn copy_cross(&mut self, src_id: usize) -> Result<$crate::CrossCopy, $crate::BackendError> {
            let data = $crate::device_kit::DeviceHost::read_back(self, src_id)?;
            Ok($crate::CrossCopy {
                src_id,
                data: Some(data),
                token: 0,
            })
        }
    };
}
