//! Support for tests that run the real default model: its path once pulled, or a failure
//! that says how to pull it. Tests across the workspace find the model through here, so
//! the message and the lookup are the same everywhere. Being test support, this module
//! reads the store's location from the environment itself; the library never does.

use std::path::PathBuf;
use std::sync::Arc;

use minfer_gguf::GgufFile;

/// Where the default catalog model lives once pulled, in the store the command line uses
/// (`$MINFER_HOME/models/...`, read here as test support); does not download. Tests use it
/// to find the real model that the test script pulled.
pub fn default_model_path() -> PathBuf {
    let home = crate::store::home_dir(minfer_env::HOME.get(), std::env::var_os("HOME"));
    crate::Store::in_home(&home).model_path(crate::catalog::default_entry().file_name)
}

/// The pulled default model's path; panics, naming `minfer pull`, where it is absent.
pub fn default_model() -> PathBuf {
    let p = default_model_path();
    assert!(
        p.exists(),
        "the default model is missing at {}: run `minfer pull` (scripts/test.sh does)",
        p.display()
    );
    p
}

/// The pulled default model, opened; panics as [`default_model`] does, or with the reason
/// the file does not open.
pub fn default_model_file() -> Arc<GgufFile> {
    let p = default_model();
    match GgufFile::open(&p) {
        Ok(f) => Arc::new(f),
        Err(e) => panic!("the default model at {} does not open: {e}", p.display()),
    }
}
