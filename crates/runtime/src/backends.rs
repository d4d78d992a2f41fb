//! The backends compiled into this build: the binary's constructor table.
//!
//! A backend crate plugs in with one line here (its `FACTORY`, behind its cargo
//! feature) and one feature line in this crate's `Cargo.toml`; its id, name and
//! priority are its row in `minfer_graph::KNOWN_BACKENDS`. The engine builds its
//! backends from this table and the fence only, never by naming a backend type.

use std::sync::atomic::{AtomicBool, Ordering};

use minfer_graph::{BackendConfig, BackendFactory, BackendRegistry, FenceError};

/// The factories of every backend compiled in, CPU first.
pub fn compiled() -> Vec<BackendFactory> {
    // One line per backend crate, each behind its feature, e.g.
    // `#[cfg(feature = "wgpu")] v.push(minfer_wgpu::FACTORY);`
    #[allow(unused_mut)]
    let mut v = vec![minfer_cpu::FACTORY];
    v
}

/// The registry of this build, each compiled backend probed with `cfg`.
pub fn registry(cfg: &BackendConfig) -> Result<BackendRegistry, FenceError> {
    BackendRegistry::from_factories(&compiled(), cfg)
}

static NOTICED: AtomicBool = AtomicBool::new(false);

/// Prints the default selection's notices on stderr, once per process: a server or a
/// test builds many engines, and the user needs to read the line once.
pub(crate) fn print_notices_once(notices: &[String]) {
    if notices.is_empty() || NOTICED.swap(true, Ordering::Relaxed) {
        return;
    }
    for n in notices {
        eprintln!("{n}");
    }
}
