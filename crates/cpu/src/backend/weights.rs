//! The CPU backend's weight registry: tensors by name, zero-copy over the mapped GGUF
//! files (an `Arc` of the file plus the tensor's index), or owned f32 data for tests and
//! derived weights. Registered weights never move and are never replaced.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use crate::hugemem::HugeVec;
use crate::matmul::{QMatrix, RepackedMatrix};
use crate::threadpool::ThreadPool;

use minfer_gguf::quant::dequantize_to_vec;
use minfer_gguf::{GgmlType, GgufFile};

/// Why a weight could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// The values do not fill the dimensions.
    #[error("weight '{name}': {values} values do not fill dims {dims:?}")]
    Length {
        /// Weight name.
        name: String,
        /// Values given.
        values: usize,
        /// Dimensions given.
        dims: Vec<usize>,
    },
    /// A dimension does not fit in memory sizes.
    #[error("weight '{name}': dims {dims:?} overflow")]
    Dims {
        /// Weight name.
        name: String,
        /// Dimensions given.
        dims: Vec<u64>,
    },
    /// A vector could not be converted to f32.
    #[error("weight '{name}': {message}")]
    Convert {
        /// Weight name.
        name: String,
        /// The converter's message.
        message: String,
    },
}

impl From<WeightError> for minfer_graph::BackendError {
    fn from(e: WeightError) -> Self {
        let (name, problem) = match e {
            WeightError::Length { name, values, dims } => {
                (name, format!("{values} values do not fill dims {dims:?}"))
            }
            WeightError::Dims { name, dims } => (name, format!("dims {dims:?} overflow")),
            WeightError::Convert { name, message } => (name, message),
        };
        minfer_graph::WeightError { name, problem }.into()
    }
}

enum Storage {
    Mapped { file: Arc<GgufFile>, index: usize },
    Owned(Vec<f32>),
}

/// One registered tensor: GGUF shape `[in_dim, out_dim]` (trailing dims folded into `out_dim`).
pub struct Weight {
    /// Element type.
    pub ty: GgmlType,
    /// Elements per row (GGUF `dims[0]`).
    pub in_dim: usize,
    /// Rows (product of the remaining dims; 1 for a vector).
    pub out_dim: usize,
    storage: Storage,
    /// An f32 copy of a vector whose stored form is not directly readable as f32.
    vec_f32: Option<Vec<f32>>,
    /// The matmul layout, built on first use as a matmul weight (`None`: not repackable).
    repacked: OnceLock<Option<RepackedMatrix>>,
    /// A mapped matrix without a repacked layout, copied as it is onto huge-page memory on
    /// first use as a matmul weight (`None`: kept in place).
    copied: OnceLock<Option<HugeVec<u8>>>,
}

impl std::fmt::Debug for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weight")
            .field("ty", &self.ty)
            .field("in_dim", &self.in_dim)
            .field("out_dim", &self.out_dim)
            .finish_non_exhaustive()
    }
}

impl Weight {
    /// The stored bytes (mapped file data, or the owned f32 values).
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped { file, index } => match file.tensors().get(*index) {
                Some(info) => file.tensor_data(info),
                None => &[],
            },
            Storage::Owned(v) => bytemuck::cast_slice(v),
        }
    }

    /// The values as f32 without copying where the storage allows (F32 data, aligned), or
    /// the converted copy kept for vectors; `None` for a quantized matrix.
    pub fn as_f32(&self) -> Option<&[f32]> {
        if let Some(v) = &self.vec_f32 {
            return Some(v);
        }
        match self.ty {
            GgmlType::F32 => bytemuck::try_cast_slice(self.bytes()).ok(),
            _ => None,
        }
    }

    /// Elements.
    pub fn n_elements(&self) -> usize {
        self.in_dim * self.out_dim
    }

    /// The repacked matmul layout of this weight, built on the first call (in parallel on
    /// `pool`) when `enabled` and the type has one. Once a mapped tensor is repacked, its
    /// original pages are released so the copy does not double the resident weights.
    pub fn repacked(&self, pool: &ThreadPool, enabled: bool) -> Option<&RepackedMatrix> {
        if !enabled || !RepackedMatrix::supports(self.ty) {
            return None;
        }
        self.repacked
            .get_or_init(|| {
                let q = QMatrix {
                    ty: self.ty,
                    data: self.bytes(),
                    rows: self.out_dim,
                    cols: self.in_dim,
                };
                // Slice by slice, releasing each mapped slice once copied, so the copy and
                // the original are never both resident (the lm head alone is ~145 MB).
                let r = match &self.storage {
                    Storage::Mapped { file, index } => {
                        let info = file.tensors().get(*index)?;
                        RepackedMatrix::from_qmatrix_chunked(pool, &q, 8 << 20, &mut |r| {
                            file.release_tensor_range(info, r)
                        })
                        .ok()?
                    }
                    Storage::Owned(_) => RepackedMatrix::from_qmatrix_in(pool, &q).ok()?,
                };
                Some(r)
            })
            .as_ref()
    }

    /// The bytes a matmul reads for a weight that has no repacked layout: with `enabled`,
    /// a mapped matrix is copied on the first call onto the backend's huge-page memory
    /// (`hugemem`), releasing the mapped pages slice by slice; otherwise, or where the
    /// copy cannot be made, the stored bytes. The bytes are the same either way.
    pub fn matmul_bytes(&self, enabled: bool) -> &[u8] {
        if !enabled || self.out_dim <= 1 {
            return self.bytes();
        }
        let Storage::Mapped { file, index } = &self.storage else {
            return self.bytes();
        };
        let copy = self.copied.get_or_init(|| {
            let info = file.tensors().get(*index)?;
            let src = self.bytes();
            let mut dst = HugeVec::<u8>::zeroed(src.len()).ok()?;
            const SLICE: usize = 8 << 20;
            for (i, (d, s)) in dst.chunks_mut(SLICE).zip(src.chunks(SLICE)).enumerate() {
                d.copy_from_slice(s);
                file.release_tensor_range(info, i * SLICE..i * SLICE + s.len());
            }
            Some(dst)
        });
        match copy {
            Some(c) => c,
            None => self.bytes(),
        }
    }
}

/// Tensors by name.
#[derive(Default)]
pub struct WeightRegistry {
    map: HashMap<String, Weight>,
}

impl std::fmt::Debug for WeightRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightRegistry")
            .field("len", &self.map.len())
            .finish()
    }
}

/// Folds GGUF dims into `[in_dim, out_dim]`, or `None` on overflow.
fn fold_dims(dims: &[u64]) -> Option<(usize, usize)> {
    let in_dim = usize::try_from(*dims.first().unwrap_or(&1)).ok()?;
    let mut out_dim = 1usize;
    for &d in dims.iter().skip(1) {
        out_dim = out_dim.checked_mul(usize::try_from(d).ok()?)?;
    }
    in_dim.checked_mul(out_dim)?;
    Some((in_dim, out_dim))
}

impl WeightRegistry {
    /// The weight called `name`.
    pub fn get(&self, name: &str) -> Option<&Weight> {
        self.map.get(name)
    }

    /// Number of registered weights.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Registers every tensor of `file` as `namespace + name`, skipping names already
    /// present; returns how many were added.
    pub fn register_gguf(
        &mut self,
        file: &Arc<GgufFile>,
        namespace: &str,
    ) -> Result<usize, WeightError> {
        let mut added = 0;
        for (index, info) in file.tensors().iter().enumerate() {
            let name = format!("{namespace}{}", info.name);
            if self.map.contains_key(&name) {
                continue;
            }
            let (in_dim, out_dim) = fold_dims(&info.dims).ok_or_else(|| WeightError::Dims {
                name: name.clone(),
                dims: info.dims.clone(),
            })?;
            let mut w = Weight {
                ty: info.ggml_type,
                in_dim,
                out_dim,
                storage: Storage::Mapped {
                    file: Arc::clone(file),
                    index,
                },
                vec_f32: None,
                repacked: OnceLock::new(),
                copied: OnceLock::new(),
            };
            // Vectors (norm scales, biases) are read as f32 by the kernels; keep a small
            // converted copy where the stored form cannot be viewed as f32 directly.
            if out_dim == 1 && w.as_f32().is_none() {
                let v = dequantize_to_vec(w.ty, w.bytes(), in_dim).map_err(|e| {
                    WeightError::Convert {
                        name: name.clone(),
                        message: e.to_string(),
                    }
                })?;
                w.vec_f32 = Some(v);
            }
            self.map.insert(name, w);
            added += 1;
        }
        Ok(added)
    }

    /// Registers owned f32 `data` of GGUF dims `dims` (`[in, out]`, or `[n]` for a vector);
    /// returns `false` (and drops `data`) when the name already exists.
    pub fn register_f32(
        &mut self,
        name: &str,
        dims: &[usize],
        data: Vec<f32>,
    ) -> Result<bool, WeightError> {
        if self.map.contains_key(name) {
            return Ok(false);
        }
        let dims64: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        let (in_dim, out_dim) = fold_dims(&dims64).ok_or_else(|| WeightError::Dims {
            name: name.to_string(),
            dims: dims64.clone(),
        })?;
        if in_dim * out_dim != data.len() {
            return Err(WeightError::Length {
                name: name.to_string(),
                values: data.len(),
                dims: dims.to_vec(),
            });
        }
        self.map.insert(
            name.to_string(),
            Weight {
                ty: GgmlType::F32,
                in_dim,
                out_dim,
                storage: Storage::Owned(data),
                vec_f32: None,
                repacked: OnceLock::new(),
                copied: OnceLock::new(),
            },
        );
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::GgufWriter;

    #[test]
    fn gguf_tensors_are_views_and_re_registration_is_skipped() {
        let mut w = GgufWriter::new();
        let m: Vec<f32> = (0..64).map(|i| i as f32 / 8.0).collect();
        w.add_tensor_f32("m", &[32, 2], GgmlType::Q8_0, &m).unwrap();
        w.add_tensor_f32("b", &[4], GgmlType::F16, &[1.0, 2.0, 3.0, 4.0])
            .unwrap();
        let file = Arc::new(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap());
        let mut reg = WeightRegistry::default();
        assert_eq!(reg.register_gguf(&file, "").unwrap(), 2);
        assert_eq!(reg.register_gguf(&file, "").unwrap(), 0);
        assert_eq!(reg.register_gguf(&file, "draft.").unwrap(), 2);
        let q = reg.get("m").unwrap();
        assert_eq!((q.ty, q.in_dim, q.out_dim), (GgmlType::Q8_0, 32, 2));
        let info = file.tensor("m").unwrap();
        assert_eq!(
            q.bytes().as_ptr(),
            file.tensor_data(info).as_ptr(),
            "zero-copy"
        );
        assert!(q.as_f32().is_none());
        assert_eq!(
            reg.get("draft.b").unwrap().as_f32().unwrap(),
            &[1.0, 2.0, 3.0, 4.0]
        );
    }

    #[test]
    fn matmul_bytes_are_a_huge_page_copy_of_mapped_matrices_only() {
        let mut w = GgufWriter::new();
        let m: Vec<f32> = (0..96).map(|i| i as f32 / 8.0 - 5.0).collect();
        w.add_tensor_f32("m", &[32, 3], GgmlType::Q8_0, &m).unwrap();
        w.add_tensor_f32("v", &[32], GgmlType::Q8_0, &m[..32])
            .unwrap();
        let file = Arc::new(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap());
        let mut reg = WeightRegistry::default();
        reg.register_gguf(&file, "").unwrap();
        let q = reg.get("m").unwrap();
        assert_eq!(q.matmul_bytes(false).as_ptr(), q.bytes().as_ptr());
        let copy = q.matmul_bytes(true);
        assert_eq!(copy, q.bytes());
        assert_ne!(copy.as_ptr(), q.bytes().as_ptr(), "a copy");
        assert_eq!(q.matmul_bytes(true).as_ptr(), copy.as_ptr(), "made once");
        let v = reg.get("v").unwrap();
        assert_eq!(
            v.matmul_bytes(true).as_ptr(),
            v.bytes().as_ptr(),
            "vectors stay"
        );
    }

    #[test]
    fn owned_weights_check_their_length_and_keep_the_first_registration() {
        let mut reg = WeightRegistry::default();
        assert!(reg.register_f32("w", &[2, 3], vec![0.0; 6]).unwrap());
        let ptr = reg.get("w").unwrap().bytes().as_ptr();
        assert!(!reg.register_f32("w", &[2, 3], vec![1.0; 6]).unwrap());
        assert_eq!(reg.get("w").unwrap().bytes().as_ptr(), ptr);
        assert_eq!(reg.get("w").unwrap().as_f32().unwrap(), &[0.0; 6]);
        let e = reg.register_f32("x", &[2, 3], vec![0.0; 5]).unwrap_err();
        assert!(e.to_string().contains("'x'"));
    }
}
