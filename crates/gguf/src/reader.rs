//! GGUF v2/v3 reader over a memory map.
//!
//! API CONTRACT (other crates are written against these signatures; keep them).
//!
//! Parsing never trusts a count or length from the file: each is checked against the bytes
//! that remain before anything is allocated, so a hostile file costs at most a constant
//! factor of its own size in memory, and every refusal is a typed [`GgufError`].

use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::MetaValue;
use std::collections::HashMap;
use std::ops::Deref;
use std::path::Path;

mod parse;
use parse::{parse, Parsed};
pub use parse::{DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, MAX_NESTING};

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the row length (fastest axis).
    pub dims: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Exact number of data bytes (`n_elements / block_size * type_size`).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Product of the dimensions.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// The bytes a [`GgufFile`] was parsed from.
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An opened GGUF file: parsed header, metadata and tensor table over the mapped bytes.
pub struct GgufFile {
    bytes: Bytes,
    parsed: Parsed,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Memory-maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        // Opening a FIFO blocks until a writer appears, and a device or directory cannot be
        // mapped: only a regular file (after symlinks) is a model. `metadata` does not open.
        let not_regular = |m: &std::fs::Metadata| {
            (!m.is_file()).then(|| {
                io(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("not a regular file (it is {})", file_kind(m)),
                ))
            })
        };
        if let Some(e) = not_regular(&std::fs::metadata(path).map_err(io)?) {
            return Err(e);
        }
        let file = std::fs::File::open(path).map_err(io)?;
        // The path may have been swapped between the check and the open.
        if let Some(e) = not_regular(&file.metadata().map_err(io)?) {
            return Err(e);
        }
        // SAFETY: the map is read-only and private to this process; as with every mmap of a
        // regular file, another process truncating or rewriting the file while it is open is
        // outside what we can guard against, and model files are treated as immutable.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(Bytes::Mapped(map))
    }

    /// Parses an in-memory image (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_storage(Bytes::Owned(bytes))
    }

    fn from_storage(bytes: Bytes) -> Result<Self, GgufError> {
        let parsed = parse(&bytes)?;
        let key_index = parsed
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            bytes,
            parsed,
            key_index,
            tensor_index,
        })
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.parsed.version
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.parsed.metadata
    }

    /// A metadata value by full key.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.key_index.get(key).map(|&i| &self.parsed.metadata[i].1)
    }

    /// `general.architecture`, if present.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(MetaValue::as_str)
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    /// Required string value; a typed error naming the key when missing or mistyped.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong_type(key, "string", v))
    }

    /// Required unsigned integer value (any integer width that fits).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        match v.as_u64() {
            Some(x) => Ok(x),
            None if v.as_i64().is_some() => Err(out_of_range(key, v, "u64")),
            None => Err(wrong_type(key, "unsigned integer", v)),
        }
    }

    /// Required u32 value (any integer width that fits).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let x = self.get_u64(key)?;
        u32::try_from(x).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: x.to_string(),
            expected: "u32",
        })
    }

    /// Required float value (f32, f64 or integer).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| wrong_type(key, "float", v))
    }

    /// The `{arch}.{name}` key; the architecture prefix is resolved here once for all
    /// hyperparameter accessors.
    pub fn hparam_key(&self, name: &str) -> Result<String, GgufError> {
        let arch = self.get_str("general.architecture")?;
        Ok(format!("{arch}.{name}"))
    }

    /// Hyperparameter `{arch}.{name}`, e.g. `hparam_u32("block_count")` reads `qwen2.block_count`.
    pub fn hparam_u32(&self, name: &str) -> Result<u32, GgufError> {
        self.get_u32(&self.hparam_key(name)?)
    }

    /// Float hyperparameter `{arch}.{name}`.
    pub fn hparam_f32(&self, name: &str) -> Result<f32, GgufError> {
        self.get_f32(&self.hparam_key(name)?)
    }

    /// Optional hyperparameter `{arch}.{name}`: `Ok(None)` when absent, `Err` when mistyped.
    pub fn hparam_u32_opt(&self, name: &str) -> Result<Option<u32>, GgufError> {
        let key = self.hparam_key(name)?;
        match self.get(&key) {
            None => Ok(None),
            Some(_) => self.get_u32(&key).map(Some),
        }
    }

    /// Optional float hyperparameter `{arch}.{name}`.
    pub fn hparam_f32_opt(&self, name: &str) -> Result<Option<f32>, GgufError> {
        let key = self.hparam_key(name)?;
        match self.get(&key) {
            None => Ok(None),
            Some(_) => self.get_f32(&key).map(Some),
        }
    }

    /// Tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }

    /// A tensor's header by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.parsed.tensors[i])
    }

    /// Zero-copy view of a tensor's bytes (validated at open time to lie inside the file).
    ///
    /// Panics if `info` describes a range outside this file, which only happens when it
    /// was taken from a different file.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = self.parsed.data_offset as usize + info.offset as usize;
        &self.bytes[start..start + info.n_bytes as usize]
    }

    /// Tells the kernel that this process no longer needs the resident pages of a
    /// tensor's data (a backend that keeps a repacked copy calls it). Best effort: the
    /// bytes stay readable (the map is read-only and file-backed, so a later read faults
    /// them back in from the file); a no-op for in-memory images.
    pub fn release_pages(&self, info: &TensorInfo) {
        self.release_tensor_range(info, 0..info.n_bytes as usize);
    }

    /// [`Self::release_pages`] for the bytes `range` of a tensor's data only (clamped to
    /// the tensor).
    pub fn release_tensor_range(&self, info: &TensorInfo, range: std::ops::Range<usize>) {
        let Bytes::Mapped(map) = &self.bytes else {
            return;
        };
        const PAGE: usize = 4096;
        let base = self.parsed.data_offset as usize + info.offset as usize;
        let n = info.n_bytes as usize;
        let (start, end) = (base + range.start.min(n), base + range.end.min(n));
        // Only whole pages inside the tensor: neighbours keep theirs.
        let (lo, hi) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
        if hi > lo {
            // SAFETY: the range lies inside the map; MADV_DONTNEED on a private, read-only,
            // file-backed mapping only drops clean pages, which are re-read from the file
            // on the next access, so no reader can observe changed bytes.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
            };
        }
    }

    /// `general.alignment` (default 32).
    pub fn alignment(&self) -> u64 {
        self.parsed.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.parsed.data_offset
    }

    /// Total size of the file in bytes.
    pub fn file_size(&self) -> u64 {
        self.bytes.len() as u64
    }
}

fn wrong_type(key: &str, expected: &'static str, v: &MetaValue) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: v.meta_type().name(),
    }
}

fn out_of_range(key: &str, v: &MetaValue, expected: &'static str) -> GgufError {
    GgufError::OutOfRange {
        key: key.to_string(),
        value: v.to_string(),
        expected,
    }
}

/// What kind of non-regular file `m` describes, in words.
fn file_kind(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_block_device() || t.is_char_device() {
            return "a device";
        }
    }
    if t.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::GgufWriter;

    fn sample() -> GgufFile {
        let mut w = GgufWriter::new();
        w.add_meta("general.architecture", MetaValue::String("llama".into()))
            .add_meta("llama.block_count", MetaValue::U32(2))
            .add_meta("llama.context_length", MetaValue::U64(1 << 40))
            .add_meta("llama.rope.freq_base", MetaValue::F32(10000.0))
            .add_meta("llama.int_as_float", MetaValue::I32(-3))
            .add_meta("llama.neg", MetaValue::I32(-1))
            .add_meta("llama.name", MetaValue::String("x".into()));
        w.add_tensor_bytes("t", &[2], GgmlType::F32, vec![0; 8])
            .unwrap();
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    #[test]
    fn hparams_resolve_the_architecture_prefix() {
        let f = sample();
        assert_eq!(f.architecture(), Some("llama"));
        assert_eq!(f.hparam_u32("block_count").unwrap(), 2);
        assert_eq!(f.hparam_f32("rope.freq_base").unwrap(), 10000.0);
        assert_eq!(f.hparam_f32("int_as_float").unwrap(), -3.0);
        assert_eq!(f.hparam_u32_opt("missing").unwrap(), None);
        assert_eq!(f.hparam_f32_opt("missing").unwrap(), None);
        assert_eq!(f.hparam_u32_opt("block_count").unwrap(), Some(2));
        assert_eq!(f.get_u64("llama.context_length").unwrap(), 1 << 40);
    }

    #[test]
    fn accessor_errors_name_the_key() {
        let f = sample();
        let e = f.hparam_u32("context_length").unwrap_err();
        assert!(matches!(e, GgufError::OutOfRange { .. }), "{e}");
        assert!(e.to_string().contains("llama.context_length"));
        let e = f.hparam_u32("neg").unwrap_err();
        assert!(matches!(e, GgufError::OutOfRange { .. }), "{e}");
        let e = f.hparam_u32("name").unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::WrongType {
                    found: "string",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("llama.name"));
        let e = f.hparam_u32_opt("name").unwrap_err();
        assert!(matches!(e, GgufError::WrongType { .. }), "{e}");
        let e = f.hparam_u32("absent").unwrap_err();
        assert!(e.to_string().contains("`llama.absent`"), "{e}");
        let e = f.get_str("llama.block_count").unwrap_err();
        assert!(matches!(
            e,
            GgufError::WrongType {
                expected: "string",
                ..
            }
        ));
    }

    #[test]
    fn hparams_without_architecture_report_the_missing_key() {
        let mut w = GgufWriter::new();
        w.add_meta("x.block_count", MetaValue::U32(1));
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let e = f.hparam_u32("block_count").unwrap_err();
        assert!(e.to_string().contains("general.architecture"), "{e}");
    }

    #[test]
    fn open_reports_missing_files_with_the_path() {
        let e = GgufFile::open(Path::new("no/such/model.gguf"))
            .err()
            .expect("missing file must fail");
        assert!(matches!(e, GgufError::Io { .. }));
        assert!(e.to_string().contains("no/such/model.gguf"), "{e}");
    }

    /// Opens `path` on another thread and waits at most 10 s, so a hang fails the test.
    fn open_within_10s(path: &Path) -> Result<GgufFile, GgufError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let owned = path.to_path_buf();
        std::thread::spawn(move || {
            // The receiver is gone only after a timeout, which already failed the test.
            let _ = tx.send(GgufFile::open(&owned));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("GgufFile::open hung")
    }

    #[cfg(unix)]
    #[test]
    fn open_refuses_fifos_and_directories_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.gguf");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
        let e = open_within_10s(&fifo)
            .err()
            .expect("a FIFO must be refused");
        assert!(
            e.to_string().contains("not a regular file (it is a FIFO)"),
            "{e}"
        );
        assert!(e.to_string().contains("model.gguf"), "{e}");
        let e = open_within_10s(dir.path())
            .err()
            .expect("a directory must be refused");
        assert!(e.to_string().contains("it is a directory"), "{e}");
    }
}
