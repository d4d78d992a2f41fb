//! GGUF files for minfer: reading (over mmap), writing, metadata access, and the ggml
//! tensor-type block layouts with reference quantize/dequantize.

pub mod error;
pub mod quant;
pub mod reader;
pub mod types;
pub mod value;
pub mod writer;

pub use error::GgufError;
pub use reader::{GgufFile, TensorInfo};
pub use types::{GgmlType, ALL_TYPES, QK_K};
pub use value::{MetaType, MetaValue};
pub use writer::GgufWriter;
