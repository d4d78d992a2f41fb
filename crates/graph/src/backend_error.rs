//! `BackendError`: what a backend refused or failed, with the values involved. Every
//! `BackendImpl` method that can fail returns it; the scheduler and the allocator wrap
//! it once in `GraphError::Backend` with the node or operation it concerns, so no
//! backend repeats that context.
//!
//! The variants are the checks every backend shares (the pool, the device kit's size,
//! geometry and index checks, the weight table) and the device's own failures. Kernel
//! internals that have no better structure say what went wrong in words
//! ([`BackendError::Other`], which `?` makes from a `String`).

use crate::backend_id::Backend;

/// Which index input an out-of-range value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// A token id of an embedding (the bound is the table's rows).
    TokenId,
    /// A row id of `get_rows` over values (the bound is the input's rows).
    RowId,
    /// A KV cell of a store into `layer` (the bound is the region's rows).
    KvCell {
        /// The layer stored into.
        layer: usize,
    },
}

/// A weight registration refused, with the name and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("weight '{name}': {problem}")]
pub struct WeightError {
    /// Tensor name.
    pub name: String,
    /// What is wrong.
    pub problem: String,
}

/// A backend operation refused or failed (invariant 7: never a fallback).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// A buffer larger than the device's largest buffer.
    #[error(
        "a buffer of {} exceeds the {backend} device's largest buffer of {}",
        bytes_text(*.elems),
        bytes_text(*.max)
    )]
    BufferTooLarge {
        /// Backend name.
        backend: String,
        /// f32s requested.
        elems: usize,
        /// The largest buffer, in f32s.
        max: usize,
    },
    /// The device could not provide memory.
    #[error("{backend}: out of device memory for {bytes} bytes: {message}")]
    OutOfMemory {
        /// Backend name.
        backend: String,
        /// Bytes requested.
        bytes: usize,
        /// The driver's words.
        message: String,
    },
    /// No pool buffer has this id.
    #[error("buffer {id} does not exist")]
    NoSuchBuffer {
        /// The id.
        id: usize,
    },
    /// A buffer id whose storage was released or never made.
    #[error("buffer {id} has no storage")]
    NoStorage {
        /// The id.
        id: usize,
    },
    /// A buffer reference that is not in this backend's pool.
    #[error("{what} is buffer {id} on {owner}, not in the {pool} pool ({count} buffers)")]
    ForeignBuffer {
        /// Which of the node's buffers ("the output", "source 1").
        what: String,
        /// Its id.
        id: usize,
        /// The backend it names.
        owner: Backend,
        /// This pool's name.
        pool: String,
        /// Buffers in this pool.
        count: usize,
    },
    /// A whole-buffer write of the wrong length.
    #[error("buffer {id} holds {len} values, got {got}")]
    WriteLength {
        /// Buffer id.
        id: usize,
        /// Its length.
        len: usize,
        /// Values written.
        got: usize,
    },
    /// A window that does not lie inside its buffer.
    #[error("window {offset}+{len} exceeds buffer {id} ({buf_len})")]
    Window {
        /// Buffer id.
        id: usize,
        /// First value of the window.
        offset: usize,
        /// Values in the window.
        len: usize,
        /// The buffer's length.
        buf_len: usize,
    },
    /// A buffer the host cannot read in place.
    #[error("buffer {id} is not host-readable")]
    NotHostReadable {
        /// Buffer id.
        id: usize,
    },
    /// A split-boundary transfer handed over twice.
    #[error("transfer of buffer {id} already consumed")]
    TransferConsumed {
        /// Source buffer id.
        id: usize,
    },
    /// The per-node trace asked a backend that cannot stage outputs.
    #[error("the {backend} backend cannot stage node outputs for the per-node trace")]
    TraceUnsupported {
        /// Backend name.
        backend: String,
    },
    /// A node handed another number of input buffers than it has sources.
    #[error("{sources} sources but {bufs} input buffers")]
    SourceCount {
        /// The node's sources.
        sources: usize,
        /// Input buffers handed over.
        bufs: usize,
    },
    /// Source `index`, which the op reads, is absent.
    #[error("missing source {index}")]
    NoSource {
        /// Its position among the node's sources.
        index: usize,
    },
    /// A source the op needs is absent (the text names it).
    #[error("{0}")]
    MissingSource(&'static str),
    /// The output buffer is smaller than the node.
    #[error("output buffer holds {holds}, node needs {needs}")]
    OutputTooSmall {
        /// The buffer's length.
        holds: usize,
        /// The node's values.
        needs: usize,
    },
    /// An index buffer that does not exist.
    #[error("{what} buffer {id} does not exist")]
    NoIndexBuffer {
        /// Which indices ("row ids", "attention positions").
        what: String,
        /// Buffer id.
        id: usize,
    },
    /// An index buffer shorter than the tokens it serves.
    #[error("{what}: {len} values for {tokens} tokens")]
    TooFewIndices {
        /// Which indices.
        what: String,
        /// Values held.
        len: usize,
        /// Tokens served.
        tokens: usize,
    },
    /// Indices a kernel wrote, which the host cannot range check.
    #[error(
        "{what} (buffer {id}) were computed on the device; the {backend} backend reads \
         indices only from host-written inputs, which it range checks"
    )]
    IndicesOnDevice {
        /// Which indices.
        what: String,
        /// Buffer id.
        id: usize,
        /// Backend name.
        backend: String,
    },
    /// An index outside what it indexes.
    #[error("{}", index_text(*.kind, *.at, *.value, *.bound))]
    IndexOutOfRange {
        /// What the index selects.
        kind: IndexKind,
        /// Its position among the indices (the token or row).
        at: usize,
        /// Its value.
        value: i32,
        /// The exclusive bound.
        bound: usize,
    },
    /// Operand sizes that do not fit the op (`op` names it, `detail` the sizes).
    #[error("{op}: {detail}")]
    Sizes {
        /// The op ("silu", "rope", "rms norm", ...).
        op: &'static str,
        /// The sizes found, in words.
        detail: String,
    },
    /// A matrix product whose input or output does not fit its weight's dims.
    #[error("matmul with '{weight}': {detail}")]
    MatmulSizes {
        /// Weight name.
        weight: String,
        /// The sizes found, in words.
        detail: String,
    },
    /// A `Add`/`Mul` whose second operand does not broadcast over the first.
    #[error("{op}: cannot combine {a} values with {b} (broadcast) into {n}")]
    Broadcast {
        /// The op.
        op: &'static str,
        /// First operand's values.
        a: usize,
        /// Second operand's values.
        b: usize,
        /// Output values.
        n: usize,
    },
    /// The output's shape does not match what the op produces.
    #[error("output {shape:?} is not {expected}")]
    OutputShape {
        /// The node's output shape.
        shape: [usize; 4],
        /// What it should be, in words (`[2 x 64, 3]`).
        expected: String,
    },
    /// A matmul output of `rows` rows per token where the weight has `out_dim`.
    #[error("output [{rows}, {tokens}] does not match weight '{weight}' out_dim {out_dim}")]
    MatmulOutput {
        /// Output values per token.
        rows: usize,
        /// Tokens.
        tokens: usize,
        /// Weight name.
        weight: String,
        /// The weight's output features.
        out_dim: usize,
    },
    /// A weight whose shape is not the one the node expects.
    #[error(
        "weight '{name}' is [{}, {}], the node expects [{}, {}]",
        .got.0, .got.1, .expected.0, .expected.1
    )]
    WeightShape {
        /// Weight name.
        name: String,
        /// Its `[in, out]`.
        got: (usize, usize),
        /// The node's `[in, out]`.
        expected: (usize, usize),
    },
    /// A weight the node needs as `len` f32 values that is something else.
    #[error("weight '{name}' is {ty} [{in_dim}, {out_dim}], the node needs {len} f32 values")]
    WeightNotVector {
        /// Weight name.
        name: String,
        /// Its storage type.
        ty: String,
        /// Values per row.
        in_dim: usize,
        /// Rows.
        out_dim: usize,
        /// Values the node needs.
        len: usize,
    },
    /// A weight name nothing registered.
    #[error("weight '{name}' is not registered")]
    WeightMissing {
        /// Weight name.
        name: String,
    },
    /// A weight whose storage type the kernels do not decode.
    #[error("weight '{name}' is {ty}, which the {kernels} kernels do not decode")]
    WeightUndecoded {
        /// Weight name.
        name: String,
        /// Its storage type.
        ty: String,
        /// Whose kernels.
        kernels: String,
    },
    /// A weight registration refused.
    #[error(transparent)]
    Weight(#[from] WeightError),
    /// A node's metadata that does not belong to its op or contradicts it.
    #[error("{0}")]
    Metadata(String),
    /// A layer's KV pair absent or unusable.
    #[error("{}", kv_text(*.layer, *.pair, .problem))]
    KvPair {
        /// The layer.
        layer: usize,
        /// The pair handed over, if any.
        pair: Option<(usize, usize)>,
        /// Why it is unusable (empty when absent).
        problem: String,
    },
    /// KV regions too small for the rows the store addresses.
    #[error(
        "KV store layer {layer}: regions hold {}/{} values, {n_ctx} rows of {n_embd} need {}",
        .lens.0, .lens.1, .n_ctx * .n_embd
    )]
    KvRegions {
        /// The layer.
        layer: usize,
        /// Values in the K and V regions.
        lens: (usize, usize),
        /// Values per row.
        n_embd: usize,
        /// Rows.
        n_ctx: usize,
    },
    /// An op (with this metadata) the backend does not implement.
    #[error("{op} {detail}")]
    Unsupported {
        /// The op's name.
        op: String,
        /// What is missing, in words.
        detail: String,
    },
    /// The device or its driver failed.
    #[error("{message}")]
    Device {
        /// The driver's words.
        message: String,
    },
    /// A failure the site describes in words only (kernel internals).
    #[error("{0}")]
    Other(String),
}

impl From<String> for BackendError {
    fn from(message: String) -> Self {
        BackendError::Other(message)
    }
}

impl From<&str> for BackendError {
    fn from(message: &str) -> Self {
        BackendError::Other(message.to_string())
    }
}

impl BackendError {
    /// Operand sizes that do not fit `op`, described by `detail`.
    pub fn sizes(op: &'static str, detail: impl Into<String>) -> Self {
        BackendError::Sizes {
            op,
            detail: detail.into(),
        }
    }

    /// Whether the message (the display text) contains `text`: a caller that reacts to
    /// one wording, or a test naming what an error must mention.
    pub fn contains(&self, text: &str) -> bool {
        self.to_string().contains(text)
    }

    /// A device or driver failure described by `message`.
    pub fn device(message: impl std::fmt::Display) -> Self {
        BackendError::Device {
            message: message.to_string(),
        }
    }
}

/// An error equals the text it displays.
impl PartialEq<&str> for BackendError {
    fn eq(&self, text: &&str) -> bool {
        let shown = self.to_string();
        shown == *text
    }
}

/// The text of an [`BackendError::IndexOutOfRange`].
fn index_text(kind: IndexKind, at: usize, value: i32, bound: usize) -> String {
    match kind {
        IndexKind::TokenId => {
            format!("embedding: id {value} (token {at}) outside the table's {bound} rows")
        }
        IndexKind::RowId => {
            format!("get_rows: id {value} (row {at}) outside the {bound} input rows")
        }
        IndexKind::KvCell { layer } => format!(
            "KV store layer {layer}: token {at} targets row {value}, outside the {bound}-row region"
        ),
    }
}

/// The text of a [`BackendError::KvPair`].
fn kv_text(layer: usize, pair: Option<(usize, usize)>, problem: &str) -> String {
    match pair {
        None => format!("no KV region for layer {layer}"),
        Some((k, v)) => format!("layer {layer}: KV pair ({k}, {v}) {problem}"),
    }
}

/// `elems` f32s as bytes, in words (`311.2 MB (77.8M f32)`).
pub(crate) fn bytes_text(elems: usize) -> String {
    let bytes = elems as f64 * 4.0;
    let (v, unit) = if bytes >= 1e9 {
        (bytes / 1e9, "GB")
    } else if bytes >= 1e6 {
        (bytes / 1e6, "MB")
    } else if bytes >= 1e3 {
        (bytes / 1e3, "kB")
    } else {
        (bytes, "bytes")
    };
    if unit == "bytes" {
        format!("{elems} f32s ({bytes} bytes)")
    } else {
        format!("{elems} f32s ({v:.1} {unit})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_values() {
        let e = BackendError::BufferTooLarge {
            backend: "wgpu".into(),
            elems: 1 << 28,
            max: 1 << 26,
        };
        assert_eq!(
            e.to_string(),
            "a buffer of 268435456 f32s (1.1 GB) exceeds the wgpu device's largest buffer \
             of 67108864 f32s (268.4 MB)"
        );
        let e = BackendError::IndexOutOfRange {
            kind: IndexKind::KvCell { layer: 3 },
            at: 1,
            value: 4,
            bound: 4,
        };
        assert_eq!(
            e.to_string(),
            "KV store layer 3: token 1 targets row 4, outside the 4-row region"
        );
        let e = BackendError::KvPair {
            layer: 2,
            pair: None,
            problem: String::new(),
        };
        assert_eq!(e.to_string(), "no KV region for layer 2");
        let e: BackendError = "plain words".into();
        assert_eq!(e, BackendError::Other("plain words".into()));
    }
}
