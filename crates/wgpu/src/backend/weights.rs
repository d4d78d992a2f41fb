//! The wgpu backend's weights: uploaded once in their GGUF byte layout (the shaders
//! dequantize), split by whole rows where one is above the adapter's largest storage
//! binding, and the check that a node names only weights the shaders decode.

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::device_kit::{DeviceWeight, WeightError, WeightLayout};
use minfer_graph::{BackendError, CNode, NodeMeta};
use wgpu::util::DeviceExt;

use super::res::{self, Part, Parts};
use super::WgpuBackend;

/// The names a q|k|v concatenation weight stands for: itself, and for the
/// `..attn_qkv.weight` form the three matrices `..attn_{q,k,v}.weight`.
pub(super) fn qkv_names(concat: &str) -> Vec<String> {
    let mut v = vec![concat.to_string()];
    if let Some(stem) = concat.strip_suffix("attn_qkv.weight") {
        v.extend(["q", "k", "v"].map(|x| format!("{stem}attn_{x}.weight")));
    }
    v
}

/// Uploads `bytes` of `layout` into `mem`, in parts of at most `max` bytes of whole rows.
fn upload(
    device: &wgpu::Device,
    max: usize,
    name: &str,
    bytes: &[u8],
    layout: &WeightLayout,
    mem: &mut Vec<wgpu::Buffer>,
) -> Result<Parts, String> {
    let (row_bytes, out_dim) = (layout.row_bytes, layout.out_dim);
    let rows_per_part = (max / row_bytes.max(1)).min(out_dim.max(1));
    if rows_per_part == 0 {
        return Err(format!(
            "one row of {row_bytes} bytes exceeds the adapter's largest storage binding ({max} bytes)"
        ));
    }
    let mut parts = Vec::new();
    let mut row0 = 0;
    while row0 < out_dim.max(1) {
        let rows = rows_per_part.min(out_dim.max(1) - row0);
        let chunk = &bytes
            [(row0 * row_bytes).min(bytes.len())..((row0 + rows) * row_bytes).min(bytes.len())];
        let mut data = chunk.to_vec();
        // Shaders read whole words; a binding may not be empty.
        data.resize(chunk.len().next_multiple_of(4).max(4), 0);
        let buf = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(name),
            contents: &data,
            usage: wgpu::BufferUsages::STORAGE,
        });
        mem.push(buf);
        parts.push(Part {
            index: mem.len() - 1,
            row0,
            rows,
        });
        row0 += rows;
    }
    Ok(parts)
}

impl WgpuBackend {
    /// Uploads one tensor in its GGUF byte layout under `name`; `dims` are GGUF dims
    /// (`[in, out...]`, or `[n]` for a vector). Returns `false` when the name was
    /// already registered (the first one stays).
    pub fn register_weight(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<bool, WeightError> {
        // A weight above the adapter's largest storage binding (the embedding table
        // and lm head of real models on some drivers) is split by whole rows.
        let max = self.binding_bytes() as usize;
        let device = &self.gpu.device;
        self.weights.register(name, ty, dims, bytes, |l, mem| {
            upload(device, max, name, bytes, l, mem)
        })
    }

    /// Uploads every tensor of `file` under `namespace + name` whose type the kernels
    /// decode; the rest are remembered so a node using one fails naming its type.
    /// Returns how many were uploaded.
    pub fn register_gguf(
        &mut self,
        file: &GgufFile,
        namespace: &str,
    ) -> Result<usize, WeightError> {
        let max = self.binding_bytes() as usize;
        let device = &self.gpu.device;
        self.weights
            .register_gguf(file, namespace, |name, bytes, l, mem| {
                upload(device, max, name, bytes, l, mem)
            })
    }

    /// Registers owned f32 values (norm scales, test weights) of GGUF dims `dims`.
    pub fn register_f32(
        &mut self,
        name: &str,
        dims: &[usize],
        data: &[f32],
    ) -> Result<bool, WeightError> {
        self.register_weight(name, GgmlType::F32, dims, bytemuck::cast_slice(data))
    }

    pub(super) fn weight(&self, name: &str) -> Result<&DeviceWeight<Parts>, BackendError> {
        self.weights.get(name)
    }

    /// An f32 vector weight of exactly `len` values, held in one buffer.
    pub(super) fn vector(&self, name: &str, len: usize) -> Result<usize, BackendError> {
        self.weights.vector(name, len, res::whole)
    }

    /// Whether every weight `node` names is one the kernels decode. A weight of a type
    /// no shader reads (remembered at registration) declines the node, so it runs
    /// where its type is implemented instead of failing at execution.
    pub(super) fn weights_decoded(&self, node: &CNode) -> bool {
        let decoded = |name: &str| self.weights.not_skipped(name);
        match &node.meta {
            NodeMeta::MatMul(m) => {
                decoded(&m.weight_name) && m.bias_name.as_deref().is_none_or(decoded)
            }
            NodeMeta::Embed(m) => decoded(&m.weight_name),
            NodeMeta::Norm(m) => m.weight_name.as_deref().is_none_or(decoded),
            NodeMeta::FusedFfn(m) => decoded(&m.gate_weight) && decoded(&m.up_weight),
            NodeMeta::FusedQkv(m) => {
                qkv_names(&m.qkv_weight).iter().all(|n| decoded(n))
                    && [&m.q_bias, &m.k_bias, &m.v_bias]
                        .iter()
                        .all(|b| b.as_deref().is_none_or(decoded))
                    && m.rope.freq_factors.is_none()
            }
            NodeMeta::FusedQkvNorm(m) => {
                qkv_names(&m.qkv_weight).iter().all(|n| decoded(n))
                    && decoded(&m.q_norm)
                    && decoded(&m.k_norm)
                    && m.rope.freq_factors.is_none()
            }
            NodeMeta::QkvBiasRopeStore(m) => {
                decoded(&m.q_bias)
                    && decoded(&m.k_bias)
                    && decoded(&m.v_bias)
                    && m.rope.freq_factors.is_none()
            }
            _ => true,
        }
    }
}
