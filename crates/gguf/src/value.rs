//! GGUF metadata values.

use std::fmt;

/// The on-disk `gguf_metadata_value_type` ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MetaType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl MetaType {
    /// Maps an on-disk value-type id; `None` for ids outside the GGUF specification.
    pub fn from_id(id: u32) -> Option<Self> {
        use MetaType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Lower-case type name used in messages and `info --json`.
    pub fn name(self) -> &'static str {
        use MetaType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value. Arrays keep their declared element type so that an empty array
/// still writes back identically, and may nest (arrays of arrays).
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaType, Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The value's on-disk type.
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(..) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// Any integer value that fits in a u64 (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v as u64),
            MetaValue::U16(v) => Some(v as u64),
            MetaValue::U32(v) => Some(v as u64),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value as i64 (u64 values above i64::MAX give `None`).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v as i64),
            MetaValue::U16(v) => Some(v as i64),
            MetaValue::U32(v) => Some(v as i64),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v as i64),
            MetaValue::I16(v) => Some(v as i64),
            MetaValue::I32(v) => Some(v as i64),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any float or integer value as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The string payload, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool payload, if this is a bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

impl fmt::Display for MetaValue {
    /// Short human form: long arrays are summarised by element type and length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaValue::U8(v) => write!(f, "{v}"),
            MetaValue::I8(v) => write!(f, "{v}"),
            MetaValue::U16(v) => write!(f, "{v}"),
            MetaValue::I16(v) => write!(f, "{v}"),
            MetaValue::U32(v) => write!(f, "{v}"),
            MetaValue::I32(v) => write!(f, "{v}"),
            MetaValue::F32(v) => write!(f, "{v}"),
            MetaValue::Bool(v) => write!(f, "{v}"),
            MetaValue::String(s) => write!(f, "{s:?}"),
            MetaValue::U64(v) => write!(f, "{v}"),
            MetaValue::I64(v) => write!(f, "{v}"),
            MetaValue::F64(v) => write!(f, "{v}"),
            MetaValue::Array(t, v) if v.len() > 8 => {
                write!(f, "[{}; {}]", t.name(), v.len())
            }
            MetaValue::Array(_, v) => {
                f.write_str("[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str("]")
            }
        }
    }
}
