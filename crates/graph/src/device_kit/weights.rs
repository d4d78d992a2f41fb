//! `WeightTable`: a device backend's weights by name, uploaded once in their GGUF
//! byte layout (invariant 3: nodes name weights, the executing backend resolves them).
//! Generic over how a backend places a weight (`P`: one buffer, or row ranges in
//! several) and over its device memory (`M`); the upload itself is the backend's.

use std::collections::HashMap;

use minfer_gguf::{GgmlType, GgufFile};

use crate::backend_error::BackendError;
pub use crate::backend_error::WeightError;

/// The row geometry of a weight checked against its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightLayout {
    /// Values per row (GGUF dim 0).
    pub in_dim: usize,
    /// Rows (the product of the other GGUF dims).
    pub out_dim: usize,
    /// Bytes of one row.
    pub row_bytes: usize,
}

impl WeightLayout {
    /// The layout of `len` bytes of type `ty` with GGUF dims `dims` (`[in, out...]`, or
    /// `[n]` for a vector), or what is wrong: rows must be whole blocks of the type.
    pub fn of(ty: GgmlType, dims: &[usize], len: usize) -> Result<Self, String> {
        let (&in_dim, rest) = dims
            .split_first()
            .ok_or_else(|| "no dimensions".to_string())?;
        let out_dim = rest
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("dims {dims:?} overflow"))?;
        let block = ty.block_size();
        if in_dim == 0 || !in_dim.is_multiple_of(block) {
            return Err(format!(
                "rows of {in_dim} values are not a positive multiple of the {ty} block of {block}"
            ));
        }
        let row_bytes = in_dim / block * ty.type_size();
        if row_bytes.checked_mul(out_dim) != Some(len) {
            return Err(format!(
                "{len} bytes, {ty} dims {dims:?} need {}",
                row_bytes.saturating_mul(out_dim)
            ));
        }
        Ok(Self {
            in_dim,
            out_dim,
            row_bytes,
        })
    }
}

/// One registered weight: its type, geometry and where the backend put it.
#[derive(Debug)]
pub struct DeviceWeight<P> {
    /// Storage type.
    pub ty: GgmlType,
    /// Values per row.
    pub in_dim: usize,
    /// Rows.
    pub out_dim: usize,
    /// Bytes of one row.
    pub row_bytes: usize,
    /// The backend's placement (buffer index, row ranges).
    pub place: P,
}

/// Weights by name, the device memory they live in, and the tensors of a registered
/// file whose type the kernels do not decode (kept to name it, and so the backend
/// declines the nodes that use them).
#[derive(Debug)]
pub struct WeightTable<P, M> {
    /// The weights by name.
    pub map: HashMap<String, DeviceWeight<P>>,
    /// Device memory the placements index.
    pub mem: Vec<M>,
    /// Tensors skipped for their type.
    pub skipped: HashMap<String, GgmlType>,
    types: &'static [GgmlType],
    label: &'static str,
}

impl<P, M> WeightTable<P, M> {
    /// An empty table for kernels decoding `types`, named `label` in errors.
    pub fn new(types: &'static [GgmlType], label: &'static str) -> Self {
        Self {
            map: HashMap::new(),
            mem: Vec::new(),
            skipped: HashMap::new(),
            types,
            label,
        }
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// Whether the kernels decode `ty`.
    pub fn decodes(&self, ty: GgmlType) -> bool {
        self.types.contains(&ty)
    }

    /// Whether `name` is not a tensor skipped for its type.
    pub fn not_skipped(&self, name: &str) -> bool {
        !self.skipped.contains_key(name)
    }

    /// The weight `name`, or why there is none (its undecoded type, or no such name).
    pub fn get(&self, name: &str) -> Result<&DeviceWeight<P>, BackendError> {
        self.map
            .get(name)
            .ok_or_else(|| match self.skipped.get(name) {
                Some(ty) => BackendError::WeightUndecoded {
                    name: name.to_string(),
                    ty: ty.to_string(),
                    kernels: self.label.to_string(),
                },
                None => BackendError::WeightMissing {
                    name: name.to_string(),
                },
            })
    }

    /// The memory index of an f32 vector weight of exactly `len` values; `whole` gives
    /// the index of a placement held in one piece.
    pub fn vector(
        &self,
        name: &str,
        len: usize,
        whole: impl Fn(&P) -> Option<usize>,
    ) -> Result<usize, BackendError> {
        let w = self.get(name)?;
        match whole(&w.place) {
            Some(i) if w.ty == GgmlType::F32 && w.in_dim * w.out_dim == len => Ok(i),
            _ => Err(BackendError::WeightNotVector {
                name: name.to_string(),
                ty: w.ty.to_string(),
                in_dim: w.in_dim,
                out_dim: w.out_dim,
                len,
            }),
        }
    }

    /// Registers `bytes` (GGUF layout, type `ty`, GGUF dims `dims`) under `name`;
    /// `upload` puts them on the device, adding to the memory it is handed, and returns
    /// the placement. Returns `false` when the name was already registered (the first
    /// one stays).
    pub fn register(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[usize],
        bytes: &[u8],
        upload: impl FnOnce(&WeightLayout, &mut Vec<M>) -> Result<P, String>,
    ) -> Result<bool, WeightError> {
        let err = |problem: String| WeightError {
            name: name.to_string(),
            problem,
        };
        if self.map.contains_key(name) {
            return Ok(false);
        }
        if !self.types.contains(&ty) {
            return Err(err(format!(
                "type {ty} is not decoded by the {} kernels",
                self.label
            )));
        }
        let layout = WeightLayout::of(ty, dims, bytes.len()).map_err(err)?;
        let place = upload(&layout, &mut self.mem).map_err(err)?;
        self.map.insert(
            name.to_string(),
            DeviceWeight {
                ty,
                in_dim: layout.in_dim,
                out_dim: layout.out_dim,
                row_bytes: layout.row_bytes,
                place,
            },
        );
        Ok(true)
    }

    /// Registers every tensor of `file` under `namespace + name` whose type the kernels
    /// decode, through `upload` (see [`WeightTable::register`]); the rest are remembered
    /// as skipped. Returns how many were added.
    pub fn register_gguf(
        &mut self,
        file: &GgufFile,
        namespace: &str,
        mut upload: impl FnMut(&str, &[u8], &WeightLayout, &mut Vec<M>) -> Result<P, String>,
    ) -> Result<usize, WeightError> {
        let mut added = 0;
        for info in file.tensors() {
            let name = format!("{namespace}{}", info.name);
            if !self.types.contains(&info.ggml_type) {
                self.skipped.insert(name, info.ggml_type);
                continue;
            }
            let dims = info
                .dims
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| WeightError {
                    name: name.clone(),
                    problem: format!("dims {:?} do not fit in memory", info.dims),
                })?;
            let bytes = file.tensor_data(info);
            let up = |l: &WeightLayout, m: &mut Vec<M>| upload(&name, bytes, l, m);
            if self.register(&name, info.ggml_type, &dims, bytes, up)? {
                added += 1;
            }
        }
        Ok(added)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TYPES: [GgmlType; 2] = [GgmlType::F32, GgmlType::Q8_0];

    #[test]
    fn layouts_are_whole_blocks_matching_the_bytes() {
        let l = WeightLayout::of(GgmlType::Q8_0, &[64, 3], 3 * 68).unwrap();
        assert_eq!((l.in_dim, l.out_dim, l.row_bytes), (64, 3, 68));
        assert!(WeightLayout::of(GgmlType::Q8_0, &[48, 3], 0)
            .unwrap_err()
            .contains("block of 32"));
        assert!(WeightLayout::of(GgmlType::F32, &[4, 2], 8)
            .unwrap_err()
            .contains("need 32"));
        assert!(WeightLayout::of(GgmlType::F32, &[], 0)
            .unwrap_err()
            .contains("no dimensions"));
    }

    #[test]
    fn registration_keeps_the_first_and_names_what_is_missing() {
        let mut t: WeightTable<usize, Vec<u8>> = WeightTable::new(&TYPES, "test");
        let up = |_: &WeightLayout, m: &mut Vec<Vec<u8>>| {
            m.push(vec![0; 16]);
            Ok(m.len() - 1)
        };
        assert_eq!(t.register("v", GgmlType::F32, &[4], &[0; 16], up), Ok(true));
        assert_eq!(
            t.register("v", GgmlType::F32, &[4], &[0; 16], up),
            Ok(false)
        );
        let e = t.register("q", GgmlType::Q4K, &[256], &[], up).unwrap_err();
        assert!(
            e.to_string().contains("not decoded by the test kernels"),
            "{e}"
        );
        assert_eq!(t.vector("v", 4, |&i| Some(i)), Ok(0));
        assert!(t
            .vector("v", 5, |&i| Some(i))
            .unwrap_err()
            .contains("needs 5"));
        t.skipped.insert("s".into(), GgmlType::Q4K);
        assert!(t.get("s").unwrap_err().contains("which the test kernels"));
        assert!(t.get("x").unwrap_err().contains("not registered"));
    }
}
