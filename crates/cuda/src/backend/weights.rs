//! The CUDA backend's weights: uploaded once in their GGUF byte layout (the kernels
//! dequantize), each layer's q|k|v concatenation for the decode QKV fusions, and the
//! check that a node names only weights the kernels decode, in rows they cover.

use minfer_gguf::{GgmlType, GgufFile};
use minfer_graph::device_kit::DeviceWeight;
use minfer_graph::{BackendError, CNode, NodeMeta};

use super::CudaBackend;
use crate::device::DevMem;
use crate::kernels::WEIGHT_TYPES;

/// The name the model builders give layer `il`'s q|k|v concatenation (a backend that
/// executes the decode QKV fusions registers it; checked against the builders' own
/// name in this crate's tests).
pub fn qkv_concat_name(il: usize) -> String {
    format!("blk.{il}.attn_qkv.weight")
}

/// Values the mat-vec, int8 and embedding kernels decode at a time along a row.
pub(super) const SUB_BLOCK: usize = 32;

impl CudaBackend {
    /// Uploads one tensor in its GGUF byte layout under `name`; `dims` are GGUF dims.
    /// Returns `false` when the name was already registered (the first one stays).
    pub fn register_weight(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[usize],
        bytes: &[u8],
    ) -> Result<bool, String> {
        let gpu = &self.gpu;
        let upload = |_: &_, mem: &mut Vec<DevMem>| {
            gpu.bind()?;
            mem.push(DevMem::upload(bytes)?);
            Ok(mem.len() - 1)
        };
        self.weights
            .register(name, ty, dims, bytes, upload)
            .map_err(|e| e.to_string())
    }

    /// Registers owned f32 values (norm scales, test weights) of GGUF dims `dims`.
    pub fn register_f32(
        &mut self,
        name: &str,
        dims: &[usize],
        data: &[f32],
    ) -> Result<bool, String> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.register_weight(name, GgmlType::F32, dims, &bytes)
    }

    /// Registers every tensor of `file` whose type the kernels decode (the rest are
    /// remembered, so a node using one is declined), then the q|k|v concatenations.
    pub(super) fn register_file(&mut self, file: &GgufFile) -> Result<usize, BackendError> {
        let gpu = &self.gpu;
        let mut added = self
            .weights
            .register_gguf(file, "", |_, bytes, _, mem| {
                gpu.bind()?;
                mem.push(DevMem::upload(bytes)?);
                Ok(mem.len() - 1)
            })
            .map_err(|e| e.to_string())?;
        added += self.register_qkv_concats(file)?;
        Ok(added)
    }

    /// Registers each layer's q|k|v concatenation (rows of q, then k, then v: GGUF
    /// rows are contiguous, so it is the three tensors' bytes in a row) under the name
    /// the model builders give it, where the three share type and input width; the
    /// decode QKV fusions multiply against it in one launch. Returns how many.
    pub(super) fn register_qkv_concats(&mut self, file: &GgufFile) -> Result<usize, BackendError> {
        let mut added = 0;
        let mut all = true;
        let mut layers = 0;
        for il in 0.. {
            let part = |w: &str| {
                file.tensors()
                    .iter()
                    .find(|t| t.name == format!("blk.{il}.attn_{w}.weight"))
            };
            let (Some(q), Some(k), Some(v)) = (part("q"), part("k"), part("v")) else {
                break;
            };
            layers += 1;
            let name = qkv_concat_name(il);
            all &= q.dims.first().is_some_and(|&d| d % SUB_BLOCK as u64 == 0);
            let same = q.ggml_type == k.ggml_type
                && k.ggml_type == v.ggml_type
                && q.dims.first() == k.dims.first()
                && k.dims.first() == v.dims.first()
                && [q, k, v].iter().all(|t| t.dims.len() == 2);
            if self.weights.contains(&name) {
                continue;
            }
            if !same || !WEIGHT_TYPES.contains(&q.ggml_type) {
                all = false;
                continue;
            }
            let rows: u64 = [q, k, v].iter().map(|t| t.dims[1]).sum();
            let dims = [q.dims[0], rows]
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| format!("weight '{name}': rows {rows} do not fit in memory"))?;
            let mut bytes = Vec::new();
            for t in [q, k, v] {
                bytes.extend_from_slice(file.tensor_data(t));
            }
            if self.register_weight(&name, q.ggml_type, &dims, &bytes)? {
                added += 1;
            }
        }
        self.qkv_fusable = layers > 0 && all;
        Ok(added)
    }

    /// The weight `name`, or why there is none.
    pub(super) fn weight(&self, name: &str) -> Result<&DeviceWeight<usize>, BackendError> {
        self.weights.get(name)
    }

    /// An f32 vector weight of exactly `len` values.
    pub(super) fn vector(&self, name: &str, len: usize) -> Result<usize, BackendError> {
        self.weights.vector(name, len, |&i| Some(i))
    }

    /// Whether every weight `node` names is one the kernels decode, in rows the kernels
    /// cover: they walk rows in sub-blocks of 32 values, so a row of another length (an
    /// f32 test matrix, say) declines the node instead of losing its tail.
    pub(super) fn weights_decoded(&self, node: &CNode) -> bool {
        let ok = |name: &str| self.weights.not_skipped(name);
        let rows_fit = |d: usize| d.is_multiple_of(SUB_BLOCK);
        match &node.meta {
            NodeMeta::MatMul(m) => {
                ok(&m.weight_name) && m.bias_name.as_deref().is_none_or(ok) && rows_fit(m.in_dim)
            }
            NodeMeta::Embed(m) => ok(&m.weight_name) && rows_fit(m.n_embd),
            NodeMeta::Norm(m) => m.weight_name.as_deref().is_none_or(ok),
            NodeMeta::FusedFfn(m) => ok(&m.gate_weight) && ok(&m.up_weight) && rows_fit(m.n_embd),
            // The concatenation exists only where this backend made it; one token only.
            NodeMeta::FusedQkv(m) => {
                self.weights.contains(&m.qkv_weight)
                    && m.q_bias
                        .iter()
                        .chain(&m.k_bias)
                        .chain(&m.v_bias)
                        .all(|b| ok(b))
                    && rows_fit(m.n_embd)
                    && node.out_shape[1] == 1
            }
            NodeMeta::FusedQkvNorm(m) => {
                self.weights.contains(&m.qkv_weight)
                    && ok(&m.q_norm)
                    && ok(&m.k_norm)
                    && rows_fit(m.n_embd)
                    && node.out_shape[1] == 1
            }
            _ => true,
        }
    }
}
