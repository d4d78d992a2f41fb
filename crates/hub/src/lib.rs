//! Model catalog, resolution of `-m PATH_OR_NAME_OR_URL`, and verified, atomic pulls.
//!
//! API CONTRACT (the CLI is written against these signatures; keep them).

use std::path::PathBuf;

/// Errors of resolution and pulling.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Placeholder until the pull lands.
    #[error("{0}")]
    Other(String),
}

/// Resolves `-m`: `None` means the catalog's default model; a catalog name or an
/// `http(s)://` URL is pulled if absent (with a progress bar on stderr when `progress`);
/// anything else is a file path that must exist. Returns the local GGUF path.
pub fn resolve_model(spec: Option<&str>, progress: bool) -> Result<PathBuf, HubError> {
    let _ = (spec, progress);
    todo!()
}

/// Where the default catalog model lives once pulled (`$MINFER_HOME/models/...`); does not
/// download. Tests use it to find the real model that the test script pulled.
pub fn default_model_path() -> PathBuf {
    todo!()
}
