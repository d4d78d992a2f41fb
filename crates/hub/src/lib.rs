//! Model catalog, resolution of `-m PATH_OR_NAME_OR_URL`, and verified, atomic pulls.
//!
//! API CONTRACT (the CLI is written against these signatures; keep them).
//!
//! Layout: [`catalog`] (named models), [`store`] (where files live and how they are known to
//! be good), [`wheels`] (catalog models published as chunked wheels), [`http`] (GGUF URLs).

pub mod catalog;
mod error;
pub mod http;
mod lock;
mod progress;
mod resolve;
pub mod store;
#[doc(hidden)]
pub mod testing;
pub mod wheels;

#[cfg(test)]
mod testutil;

pub use catalog::{catalog, lookup, CatalogEntry, DEFAULT_MODEL};
pub use error::HubError;
pub use resolve::{presence, pull, pull_catalog, Presence};
pub use store::Store;

use std::path::PathBuf;

/// Resolves `-m`: `None` means the catalog's default model; a catalog name or an
/// `http(s)://` URL is pulled if absent (with a progress bar on stderr when `progress`);
/// anything else is a file path that must exist. Returns the local GGUF path.
pub fn resolve_model(spec: Option<&str>, progress: bool) -> Result<PathBuf, HubError> {
    resolve::resolve_model(spec, progress)
}

/// Where the default catalog model lives once pulled (`$MINFER_HOME/models/...`); does not
/// download. Tests use it to find the real model that the test script pulled.
pub fn default_model_path() -> PathBuf {
    Store::from_env().model_path(catalog::default_entry().file_name)
}
