//! Support for tests that run the real default model: its path once pulled, or a failure
//! that says how to pull it. Tests across the workspace find the model through here, so
//! the message and the lookup are the same everywhere.

use std::path::PathBuf;
use std::sync::Arc;

use minfer_gguf::GgufFile;

/// The pulled default model's path; panics, naming `minfer pull`, where it is absent.
pub fn default_model() -> PathBuf {
    let p = crate::default_model_path();
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
