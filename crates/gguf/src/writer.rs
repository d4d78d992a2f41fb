//! GGUF v3 writer: metadata plus tensors of any supported type.
//!
//! API CONTRACT (tests across the workspace synthesize models with it; keep it).
//!
//! Tensor data is laid out in insertion order, each tensor starting at a multiple of the
//! alignment and followed by zero padding up to the next multiple, so that everything the
//! writer emits is accepted by the reader and reads back identically.

use crate::error::GgufError;
use crate::reader::{DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NESTING};
use crate::types::GgmlType;
use crate::value::MetaValue;
use std::io::Write;
use std::path::Path;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Vec<u8>,
}

/// Accumulates metadata and tensors, then writes a complete GGUF file.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    /// An empty writer (alignment 32 unless `general.alignment` is set).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a metadata key.
    pub fn add_meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        self
    }

    /// Adds a tensor from already-encoded bytes of `ty` with ggml-order `dims`.
    pub fn add_tensor_bytes(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self, GgufError> {
        let invalid = |reason: String| GgufError::InvalidTensor {
            name: name.to_string(),
            reason,
        };
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(invalid("duplicate tensor name".into()));
        }
        let n_elements = checked_elements(dims).map_err(invalid)?;
        let row = dims.first().copied().unwrap_or(1);
        if row % ty.block_size() as u64 != 0 {
            return Err(invalid(format!(
                "row length {row} is not a multiple of the {ty} block size {}",
                ty.block_size()
            )));
        }
        let expected = ty
            .bytes_for(n_elements)
            .ok_or_else(|| invalid(format!("{n_elements} {ty} elements overflow the byte size")))?;
        if data.len() as u64 != expected {
            return Err(invalid(format!(
                "{} data bytes given, {dims:?} {ty} needs {expected}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(self)
    }

    /// Adds a tensor from f32 values, quantized to `ty` with the reference quantizer.
    pub fn add_tensor_f32(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        data: &[f32],
    ) -> Result<&mut Self, GgufError> {
        let invalid = |reason: String| GgufError::InvalidTensor {
            name: name.to_string(),
            reason,
        };
        let n_elements = checked_elements(dims).map_err(invalid)?;
        if data.len() as u64 != n_elements {
            return Err(invalid(format!(
                "{} values given, dims {dims:?} hold {n_elements}",
                data.len()
            )));
        }
        let bytes = crate::quant::quantize_to_vec(ty, data).map_err(|source| GgufError::Quant {
            name: name.to_string(),
            source,
        })?;
        self.add_tensor_bytes(name, dims, ty, bytes)
    }

    fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((key, v)) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => Ok(a),
                _ => Err(GgufError::InvalidMeta {
                    key: key.clone(),
                    reason: format!("{v} is not a nonzero power of two"),
                }),
            },
        }
    }

    /// Serializes the whole file into memory.
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        let alignment = self.alignment()?;
        for (key, value) in &self.metadata {
            check_value(value, 0).map_err(|reason| GgufError::InvalidMeta {
                key: key.clone(),
                reason,
            })?;
        }
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&(value.meta_type() as u32).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).next_multiple_of(alignment);
        }
        pad(&mut out, alignment);
        let data_start = out.len() as u64;
        for (t, off) in self.tensors.iter().zip(offsets) {
            debug_assert_eq!(out.len() as u64, data_start + off);
            out.extend_from_slice(&t.data);
            pad(&mut out, alignment);
        }
        Ok(out)
    }

    /// Writes the file to `path` (via a temporary file and a rename).
    pub fn write_to(&self, path: &Path) -> Result<(), GgufError> {
        let bytes = self.to_bytes()?;
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |source| GgufError::Io { path: p, source }
        };
        let file_name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!(".{file_name}.{}.tmp", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(&tmp)(e));
        }
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(path)(e)
        })
    }
}

/// Element count of `dims`, refusing what the reader would refuse.
fn checked_elements(dims: &[u64]) -> Result<u64, String> {
    if dims.len() > MAX_DIMS as usize {
        return Err(format!("{} dims, at most {MAX_DIMS} allowed", dims.len()));
    }
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64 && dims.iter().all(|&d| d <= i64::MAX as u64))
        .ok_or_else(|| format!("dims {dims:?} overflow the element count"))
}

/// Arrays must hold elements of their declared type and nest no deeper than the reader reads.
fn check_value(v: &MetaValue, depth: usize) -> Result<(), String> {
    if let MetaValue::Array(ty, items) = v {
        if depth >= MAX_NESTING {
            return Err(format!("arrays nested deeper than {MAX_NESTING} levels"));
        }
        for item in items {
            if item.meta_type() != *ty {
                return Err(format!(
                    "array declared as {} holds a {}",
                    ty.name(),
                    item.meta_type().name()
                ));
            }
            check_value(item, depth + 1)?;
        }
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Array(ty, items) => {
            out.extend_from_slice(&(*ty as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

fn pad(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).next_multiple_of(alignment);
    out.resize(len as usize, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::GgufFile;
    use crate::value::MetaType;

    #[test]
    fn add_meta_replaces_in_place() {
        let mut w = GgufWriter::new();
        w.add_meta("a", MetaValue::U8(1))
            .add_meta("b", MetaValue::U8(2))
            .add_meta("a", MetaValue::U8(3));
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let keys: Vec<&str> = f.metadata().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(f.get("a"), Some(&MetaValue::U8(3)));
    }

    #[test]
    fn inconsistent_tensors_are_refused_with_the_name() {
        let mut w = GgufWriter::new();
        w.add_tensor_bytes("a", &[4], GgmlType::F32, vec![0; 16])
            .unwrap();
        let cases: [(&str, &[u64], GgmlType, usize, &str); 5] = [
            ("a", &[4], GgmlType::F32, 16, "duplicate"),
            ("b", &[4], GgmlType::F32, 15, "needs 16"),
            ("c", &[16], GgmlType::Q8_0, 34, "block size 32"),
            ("d", &[1, 1, 1, 1, 1], GgmlType::F32, 4, "at most 4"),
            ("e", &[u64::MAX, 2], GgmlType::F32, 0, "overflow"),
        ];
        for (name, dims, ty, len, needle) in cases {
            let e = w
                .add_tensor_bytes(name, dims, ty, vec![0; len])
                .err()
                .expect("must be refused");
            let msg = e.to_string();
            assert!(matches!(e, GgufError::InvalidTensor { .. }), "{msg}");
            assert!(
                msg.contains(&format!("`{name}`")) && msg.contains(needle),
                "{msg}"
            );
        }
        let e = w
            .add_tensor_f32("f", &[3], GgmlType::F32, &[1.0, 2.0])
            .err()
            .expect("length mismatch");
        assert!(e.to_string().contains("2 values given"), "{e}");
    }

    #[test]
    fn bad_metadata_is_refused_at_serialization() {
        let mut w = GgufWriter::new();
        w.add_meta("general.alignment", MetaValue::U32(24));
        let e = w.to_bytes().unwrap_err();
        assert!(e.to_string().contains("general.alignment"), "{e}");

        let mut w = GgufWriter::new();
        w.add_meta(
            "mixed",
            MetaValue::Array(MetaType::U32, vec![MetaValue::String("x".into())]),
        );
        let e = w.to_bytes().unwrap_err();
        assert!(e.to_string().contains("`mixed`"), "{e}");

        let mut deep = MetaValue::Array(MetaType::U8, vec![]);
        for _ in 0..MAX_NESTING {
            deep = MetaValue::Array(MetaType::Array, vec![deep]);
        }
        let mut w = GgufWriter::new();
        w.add_meta("deep", deep);
        let e = w.to_bytes().unwrap_err();
        assert!(e.to_string().contains("nested deeper"), "{e}");
    }

    #[test]
    fn custom_alignment_is_honoured() {
        let mut w = GgufWriter::new();
        w.add_meta("general.alignment", MetaValue::U32(64));
        w.add_tensor_bytes("a", &[3], GgmlType::F32, vec![1; 12])
            .unwrap();
        w.add_tensor_bytes("b", &[1], GgmlType::F16, vec![2; 2])
            .unwrap();
        let bytes = w.to_bytes().unwrap();
        assert_eq!(bytes.len() % 64, 0);
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.data_offset() % 64, 0);
        assert_eq!(f.tensor("b").unwrap().offset, 64);
        assert_eq!(f.tensor_data(f.tensor("b").unwrap()), &[2, 2]);
    }

    #[test]
    fn write_to_leaves_only_the_target_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut w = GgufWriter::new();
        w.add_meta("k", MetaValue::Bool(true));
        w.write_to(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.get("k"), Some(&MetaValue::Bool(true)));
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1);
    }
}
