//! Typed errors of the GGUF reader and writer.

/// Every way a GGUF file can be refused. Each variant names the field and byte offset.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// I/O failure opening or mapping the file.
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A required metadata key is absent.
    #[error("missing metadata key `{key}`")]
    MissingKey { key: String },
    /// A metadata key holds a value of the wrong type.
    #[error("metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
}
