//! The byte-level GGUF parser behind [`GgufFile`](super::GgufFile).
//!
//! Layout (all little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 metadata
//! count, the key/value pairs, the tensor infos, padding to `general.alignment`, then the
//! data section that tensor offsets are relative to.

use super::TensorInfo;
use crate::error::GgufError;
use crate::types::GgmlType;
use crate::value::{MetaType, MetaValue};
use std::collections::HashSet;

/// Deepest nesting of arrays of arrays the reader accepts; bounds the recursion.
pub const MAX_NESTING: usize = 16;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// Everything the header describes; tensor ranges are validated against the file.
pub struct Parsed {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Lazily built description of the field being read, so the happy path formats nothing.
type What<'w> = &'w dyn Fn() -> String;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn take(&mut self, n: u64, what: What) -> Result<&'a [u8], GgufError> {
        let remaining = self.remaining();
        if n > remaining as u64 {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                needed: n,
                remaining: remaining as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N], GgufError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: What) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: What) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A u64 length followed by that many UTF-8 bytes.
    fn string(&mut self, what: What) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("{} length", what()))?;
        let at = self.offset();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: at,
            }),
        }
    }
}

/// Fewest bytes one encoded value of `ty` can occupy; bounds array counts before allocating.
fn min_encoded_size(ty: MetaType) -> u64 {
    use MetaType::*;
    match ty {
        U8 | I8 | Bool => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 | String => 8,
        Array => 12,
    }
}

fn read_type(cur: &mut Cursor, what: What) -> Result<MetaType, GgufError> {
    let at = cur.offset();
    let id = cur.u32(what)?;
    MetaType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
        what: what(),
        offset: at,
        id,
    })
}

fn read_value(
    cur: &mut Cursor,
    ty: MetaType,
    depth: usize,
    what: What,
) -> Result<MetaValue, GgufError> {
    let scalar = || format!("{} {} value", what(), ty.name());
    Ok(match ty {
        MetaType::U8 => MetaValue::U8(cur.array::<1>(&scalar)?[0]),
        MetaType::I8 => MetaValue::I8(i8::from_le_bytes(cur.array(&scalar)?)),
        MetaType::U16 => MetaValue::U16(u16::from_le_bytes(cur.array(&scalar)?)),
        MetaType::I16 => MetaValue::I16(i16::from_le_bytes(cur.array(&scalar)?)),
        MetaType::U32 => MetaValue::U32(u32::from_le_bytes(cur.array(&scalar)?)),
        MetaType::I32 => MetaValue::I32(i32::from_le_bytes(cur.array(&scalar)?)),
        MetaType::F32 => MetaValue::F32(f32::from_le_bytes(cur.array(&scalar)?)),
        MetaType::U64 => MetaValue::U64(u64::from_le_bytes(cur.array(&scalar)?)),
        MetaType::I64 => MetaValue::I64(i64::from_le_bytes(cur.array(&scalar)?)),
        MetaType::F64 => MetaValue::F64(f64::from_le_bytes(cur.array(&scalar)?)),
        MetaType::Bool => MetaValue::Bool(cur.array::<1>(&scalar)?[0] != 0),
        MetaType::String => MetaValue::String(cur.string(&scalar)?),
        MetaType::Array => {
            if depth >= MAX_NESTING {
                return Err(GgufError::NestingTooDeep {
                    what: what(),
                    offset: cur.offset(),
                    max: MAX_NESTING,
                });
            }
            let elem = read_type(cur, &|| format!("{} array element type", what()))?;
            let count = cur.u64(&|| format!("{} array length", what()))?;
            let min = min_encoded_size(elem);
            let remaining = cur.remaining() as u64;
            if count.checked_mul(min).is_none_or(|b| b > remaining) {
                return Err(GgufError::Truncated {
                    what: format!("{} array of {count} {}", what(), elem.name()),
                    offset: cur.offset(),
                    needed: count.saturating_mul(min),
                    remaining,
                });
            }
            // Bounded by the check above: at most `remaining` elements.
            let mut items = Vec::with_capacity(count as usize);
            for j in 0..count {
                let item_what = || format!("{}[{j}]", what());
                items.push(read_value(cur, elem, depth + 1, &item_what)?);
            }
            MetaValue::Array(elem, items)
        }
    })
}

/// Parses and validates a whole GGUF image.
pub fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut cur = Cursor { buf, pos: 0 };
    let magic = cur.array::<4>(&|| "header magic".into())?;
    if &magic != MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = cur.u32(&|| "header version".into())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let n_tensors = cur.u64(&|| "header tensor count".into())?;
    let n_kv = cur.u64(&|| "header metadata count".into())?;

    // Counts are not trusted for allocation: vectors grow as entries are actually read,
    // and each entry consumes bytes, so a lying count ends in a truncation error.
    let mut metadata = Vec::new();
    let mut keys = HashSet::new();
    let mut alignment_at = None;
    for i in 0..n_kv {
        let key_at = cur.offset();
        let key = cur.string(&|| format!("metadata #{i} key"))?;
        if !keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_at,
            });
        }
        let what = || format!("metadata #{i} `{}`", key.escape_debug());
        let ty = read_type(&mut cur, &|| format!("{} value type", what()))?;
        if key == "general.alignment" {
            alignment_at = Some(cur.offset());
        }
        let value = read_value(&mut cur, ty, 0, &what)?;
        metadata.push((key, value));
    }

    let alignment = match alignment_at {
        None => DEFAULT_ALIGNMENT,
        Some(at) => {
            let v = metadata
                .iter()
                .find(|(k, _)| k == "general.alignment")
                .map(|(_, v)| v);
            match v.and_then(MetaValue::as_u64) {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(GgufError::BadAlignment {
                        value: v.map(|v| v.to_string()).unwrap_or_default(),
                        offset: at,
                    })
                }
            }
        }
    };

    let mut tensors = Vec::new();
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        tensors.push(read_tensor_info(&mut cur, i, alignment, &mut names)?);
    }

    let data_offset = cur
        .offset()
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::BadAlignment {
            value: alignment.to_string(),
            offset: alignment_at.unwrap_or(0),
        })?;
    check_ranges(&tensors, data_offset, buf.len() as u64)?;
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn read_tensor_info(
    cur: &mut Cursor,
    index: u64,
    alignment: u64,
    names: &mut HashSet<String>,
) -> Result<TensorInfo, GgufError> {
    let info_at = cur.offset();
    let name = cur.string(&|| format!("tensor info #{index} name"))?;
    if names.contains(&name) {
        return Err(GgufError::DuplicateTensor {
            name,
            index,
            offset: info_at,
        });
    }
    let field = |f: &str| format!("tensor info #{index} `{}` {f}", name.escape_debug());
    let n_dims_at = cur.offset();
    let n_dims = cur.u32(&|| field("n_dims"))?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            name,
            index,
            offset: n_dims_at,
            n_dims,
        });
    }
    let dims_at = cur.offset();
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(cur.u64(&|| field("dims"))?);
    }
    let type_at = cur.offset();
    let type_id = cur.u32(&|| field("type"))?;
    let offset_at = cur.offset();
    let offset = cur.u64(&|| field("data offset"))?;

    let bad_dims = |dims: Vec<u64>, reason| GgufError::BadDims {
        name: name.clone(),
        index,
        offset: dims_at,
        dims,
        reason,
    };
    // ggml stores dims as int64: values above i64::MAX are negative there.
    if dims.iter().any(|&d| d > i64::MAX as u64) {
        return Err(bad_dims(dims, "negative dimension"));
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64);
    let Some(n_elements) = n_elements else {
        return Err(bad_dims(dims, "element count overflows"));
    };
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            name,
            index,
            offset: type_at,
            id: type_id,
        });
    };
    let row = dims.first().copied().unwrap_or(1);
    let block = ggml_type.block_size();
    if row % block as u64 != 0 {
        return Err(GgufError::RowNotBlockMultiple {
            name,
            index,
            offset: dims_at,
            ty: ggml_type,
            row,
            block,
        });
    }
    let Some(n_bytes) = ggml_type.bytes_for(n_elements) else {
        return Err(bad_dims(dims, "byte size overflows"));
    };
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor {
            name,
            index,
            offset: offset_at,
            data_offset: offset,
            alignment,
        });
    }
    names.insert(name.clone());
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_bytes,
    })
}

/// Every tensor's data must lie inside the file and no two may share bytes.
fn check_ranges(tensors: &[TensorInfo], data_offset: u64, file_size: u64) -> Result<(), GgufError> {
    for t in tensors {
        let start = data_offset as u128 + t.offset as u128;
        let end = start + t.n_bytes as u128;
        if end > file_size as u128 {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                start,
                end,
                file_size,
            });
        }
    }
    // In bounds, so absolute offsets now fit in u64.
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (prev, next) = (pair[0], pair[1]);
        let prev_end = prev.offset + prev.n_bytes;
        if next.offset < prev_end {
            return Err(GgufError::TensorOverlap {
                name: next.name.clone(),
                start: data_offset + next.offset,
                end: data_offset + next.offset + next.n_bytes,
                other: prev.name.clone(),
                other_end: data_offset + prev_end,
            });
        }
    }
    Ok(())
}
