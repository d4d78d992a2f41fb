//! A capability override for mixed-graph tests: wraps any backend and declines the ops
//! named, so those nodes are assigned elsewhere (the CPU) by capability and one graph
//! alternates between backends with staging in both directions.

use std::sync::Arc;

use minfer_gguf::GgufFile;

use crate::backend::{BackendImpl, CrossCopy, SplitSpan};
use crate::backend_error::BackendError;
use crate::ir::{Backend, BufRef, CNode, DType, FusedOp, Op};

/// `inner`, except that `supports_op` answers no for every op in `declined` (by
/// `Op::name`) and `supports_fused` answers no for fusions whose result it declines.
pub struct Declining {
    inner: Box<dyn BackendImpl>,
    declined: Vec<String>,
}

impl Declining {
    /// Wraps `inner`, declining the ops named in `declined`.
    pub fn new(inner: Box<dyn BackendImpl>, declined: &[&str]) -> Self {
        Declining {
            inner,
            declined: declined.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn declines(&self, name: &str) -> bool {
        self.declined.iter().any(|d| d == name)
    }
}

impl BackendImpl for Declining {
    fn id(&self) -> Backend {
        self.inner.id()
    }
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn supports_op(&self, op: &Op, dtype: DType) -> bool {
        !self.declines(op.name()) && self.inner.supports_op(op, dtype)
    }
    fn supports_node(&self, node: &CNode) -> bool {
        !self.declines(node.op.name()) && self.inner.supports_node(node)
    }
    fn supports_fused(&self, fused: FusedOp) -> bool {
        let result = match fused {
            FusedOp::SwiGLU => "swiglu",
            FusedOp::GeGLU => "geglu",
            FusedOp::DecodeFfn => "fused_ffn",
            FusedOp::DecodeQkv => "fused_qkv",
        };
        !self.declines(result) && self.inner.supports_fused(fused)
    }
    fn supports_attn_span(&self) -> bool {
        self.inner.supports_attn_span()
    }
    fn reads_packed_kv(&self) -> bool {
        self.inner.reads_packed_kv()
    }
    fn is_gpu(&self) -> bool {
        self.inner.is_gpu()
    }
    fn device_info(&self) -> Option<crate::DeviceInfo> {
        self.inner.device_info()
    }
    fn register_gguf(&mut self, file: &Arc<GgufFile>) -> Result<usize, BackendError> {
        self.inner.register_gguf(file)
    }
    fn alloc_buffer(&mut self, size: usize) -> usize {
        self.inner.alloc_buffer(size)
    }
    fn alloc_fresh(&mut self, size: usize) -> usize {
        self.inner.alloc_fresh(size)
    }
    fn free_buffer(&mut self, id: usize) {
        self.inner.free_buffer(id)
    }
    fn pool_len(&self) -> usize {
        self.inner.pool_len()
    }
    fn pool_elems(&self) -> usize {
        self.inner.pool_elems()
    }
    fn open_alloc_pass(&mut self) {
        self.inner.open_alloc_pass()
    }
    fn release_unused(&mut self, in_use: &[usize]) {
        self.inner.release_unused(in_use)
    }
    fn begin_split(&mut self, split: SplitSpan) -> Result<(), BackendError> {
        self.inner.begin_split(split)
    }
    fn end_split(&mut self) -> Result<(), BackendError> {
        self.inner.end_split()
    }
    fn execute_node(
        &mut self,
        node: &CNode,
        in_bufs: &[BufRef],
        out_buf: BufRef,
        kv_pair: Option<(usize, usize)>,
    ) -> Result<(), BackendError> {
        self.inner.execute_node(node, in_bufs, out_buf, kv_pair)
    }
    fn read_host(&self, id: usize) -> Option<&[f32]> {
        self.inner.read_host(id)
    }
    fn copy_to_host(&mut self, id: usize) -> Option<Vec<f32>> {
        self.inner.copy_to_host(id)
    }
    fn read_host_window(
        &mut self,
        id: usize,
        offset: usize,
        len: usize,
    ) -> Result<Vec<f32>, BackendError> {
        self.inner.read_host_window(id, offset, len)
    }
    fn write_host(&mut self, id: usize, data: &[f32]) -> Result<(), BackendError> {
        self.inner.write_host(id, data)
    }
    fn write_host_window(
        &mut self,
        id: usize,
        offset: usize,
        data: &[f32],
    ) -> Result<(), BackendError> {
        self.inner.write_host_window(id, offset, data)
    }
    fn synchronize(&mut self) {
        self.inner.synchronize()
    }
    fn copy_cross(&mut self, src_id: usize) -> Result<CrossCopy, BackendError> {
        self.inner.copy_cross(src_id)
    }
    fn await_cross(&mut self, copy: &mut CrossCopy) -> Result<Vec<f32>, BackendError> {
        self.inner.await_cross(copy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::RefBackend;

    #[test]
    fn declined_ops_and_their_fusions_are_refused_and_the_rest_delegated() {
        let d = Declining::new(
            Box::new(RefBackend::test_device().as_gpu(true)),
            &["rms_norm", "swiglu"],
        );
        assert!(!d.supports_op(&Op::RmsNorm { eps: 1e-6 }, DType::F32));
        assert!(d.supports_op(&Op::Add, DType::F32));
        assert!(!d.supports_fused(FusedOp::SwiGLU));
        assert!(d.supports_fused(FusedOp::DecodeFfn));
        assert!(d.is_gpu() && d.id() == Backend::METAL && d.name() == "test");
    }
}
