//! Shared helpers of the GGUF integration tests: a raw byte builder for hand-crafted
//! (usually broken) files, a small valid file from the writer, and the real model's path.

#![allow(dead_code)] // each test binary uses a different subset

use minfer_gguf::{GgmlType, GgufWriter, MetaType, MetaValue};
use std::path::PathBuf;

/// Little-endian byte builder with no validation at all, for crafting bad files.
#[derive(Default, Clone)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    /// Magic, `version`, tensor count and metadata count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// A GGUF string: u64 length then the bytes.
    pub fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    /// A key and the id of its value type; the caller appends the value.
    pub fn key(&mut self, key: &str, ty: MetaType) -> &mut Self {
        self.str(key.as_bytes()).u32(ty as u32)
    }
    /// A whole tensor info entry.
    pub fn tensor(&mut self, name: &[u8], dims: &[u64], ty_id: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty_id).u64(offset)
    }
    /// Zero bytes up to the next multiple of `align`.
    pub fn pad(&mut self, align: usize) -> &mut Self {
        let n = self.0.len().next_multiple_of(align);
        self.0.resize(n, 0);
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    pub fn build(&self) -> Vec<u8> {
        self.0.clone()
    }
}

/// A small valid file with every metadata value type, nested arrays and three tensors.
pub fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", MetaValue::String("test".into()))
        .add_meta("test.block_count", MetaValue::U32(2))
        .add_meta("test.u8", MetaValue::U8(7))
        .add_meta("test.i8", MetaValue::I8(-7))
        .add_meta("test.u16", MetaValue::U16(65535))
        .add_meta("test.i16", MetaValue::I16(-300))
        .add_meta("test.i32", MetaValue::I32(i32::MIN))
        .add_meta("test.f32", MetaValue::F32(1.5e-3))
        .add_meta("test.bool", MetaValue::Bool(true))
        .add_meta("test.u64", MetaValue::U64(u64::MAX))
        .add_meta("test.i64", MetaValue::I64(-5))
        .add_meta("test.f64", MetaValue::F64(std::f64::consts::PI))
        .add_meta("test.unicode", MetaValue::String("héllo ✓".into()))
        .add_meta(
            "test.tokens",
            MetaValue::Array(
                MetaType::String,
                ["a", "", "ccc"]
                    .map(|s| MetaValue::String(s.into()))
                    .to_vec(),
            ),
        )
        .add_meta("test.empty", MetaValue::Array(MetaType::F32, vec![]))
        .add_meta(
            "test.nested",
            MetaValue::Array(
                MetaType::Array,
                vec![
                    MetaValue::Array(MetaType::I16, vec![MetaValue::I16(1), MetaValue::I16(-2)]),
                    MetaValue::Array(MetaType::I16, vec![]),
                ],
            ),
        );
    w.add_tensor_bytes("a", &[8], GgmlType::F32, pattern(32, 1))
        .unwrap()
        .add_tensor_bytes("b", &[64, 2], GgmlType::Q8_0, pattern(4 * 34, 2))
        .unwrap()
        .add_tensor_bytes("c", &[3, 1, 1], GgmlType::F16, pattern(6, 3))
        .unwrap();
    w
}

/// Deterministic non-trivial bytes.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The real model the test script pulls; fails loudly when it is absent.
pub fn model_path() -> PathBuf {
    let p = minfer_hub::default_model_path();
    assert!(
        p.is_file(),
        "real model missing at {}: run `minfer pull` first",
        p.display()
    );
    p
}
