//! The backends compiled into this build: the binary's constructor table.
//!
//! A backend crate plugs in with one line here (its `FACTORY`, behind its cargo
//! feature) and one feature line in this crate's `Cargo.toml`; its id, name and
//! priority are its row in `minfer_graph::KNOWN_BACKENDS`. The engine builds its
//! backends from this table and the fence only, never by naming a backend type.

use std::sync::Mutex;

use minfer_graph::{
    Backend, BackendConfig, BackendFactory, BackendOptions, BackendRegistry, FenceError,
};

use crate::BackendInfo;

/// The factories of every backend compiled in, CPU first.
pub fn compiled() -> Vec<BackendFactory> {
    #[allow(unused_mut)]
    let mut v = vec![minfer_cpu::FACTORY];
    #[cfg(feature = "wgpu")]
    v.push(minfer_wgpu::FACTORY);
    #[cfg(feature = "cuda")]
    v.push(minfer_cuda::FACTORY);
    v
}

/// The registry of this build, each compiled backend probed with `cfg`.
pub fn registry(cfg: &BackendConfig) -> Result<BackendRegistry, FenceError> {
    BackendRegistry::from_factories(&compiled(), cfg)
}

/// The factories a fence `spec` can select: the CPU (the host backend, always present
/// when compiled) and those it names. Probing only these keeps `--backend cpu` from
/// loading any GPU driver; names that are unknown or not compiled are left for
/// [`BackendRegistry::parse_fence`] to refuse.
pub fn fenced(factories: &[BackendFactory], spec: &str) -> Vec<BackendFactory> {
    let named: Vec<&str> = spec.split(',').map(str::trim).collect();
    factories
        .iter()
        .filter(|f| {
            f.id == Backend::CPU
                || minfer_graph::entry_for(f.id)
                    .is_some_and(|e| named.iter().any(|n| n.eq_ignore_ascii_case(e.name)))
        })
        .copied()
        .collect()
}

/// Checks a `--backend` fence against this build and machine before anything is
/// loaded: unknown, not compiled in and not usable are distinct refusals, the last
/// with the probe's reason. Probes only the backends the fence names, with `options`
/// (the graphics API a GPU backend looks on).
pub fn check_fence(spec: &str, options: &BackendOptions) -> Result<Vec<Backend>, FenceError> {
    let cfg = BackendConfig {
        options: *options,
        ..BackendConfig::default()
    };
    BackendRegistry::from_factories(&fenced(&compiled(), spec), &cfg)?.parse_fence(spec)
}

/// The backends of the engine built last in this process, as
/// [`crate::Engine::backend_info`] describes them: what a server process (one engine)
/// reports on `/health` without reaching into the thread that owns its engine.
static IN_USE: Mutex<Vec<BackendInfo>> = Mutex::new(Vec::new());

/// The backends the engine built last in this process runs on (empty before any).
pub fn in_use() -> Vec<BackendInfo> {
    IN_USE.lock().map(|v| v.clone()).unwrap_or_default()
}

pub(crate) fn record_in_use(info: Vec<BackendInfo>) {
    if let Ok(mut v) = IN_USE.lock() {
        *v = info;
    }
}

static NOTICES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records the default selection's notices (a compiled GPU backend left out, and why).
/// Nothing is printed here: a CPU user would read the line on every run. The commands
/// say it where it informs ([`notices`]): `minfer info`, the server's start-up lines,
/// `-v`, and the refusal of a GPU backend asked for by name.
pub(crate) fn record_notices(notices: &[String]) {
    if let Ok(mut v) = NOTICES.lock() {
        *v = notices.to_vec();
    }
}

/// The notices of the default backend selection the engine made last in this process
/// (empty before any, or when a fence chose the backends).
pub fn notices() -> Vec<String> {
    NOTICES.lock().map(|v| v.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_probes_the_host_and_the_backends_it_names_only() {
        let all = compiled();
        assert_eq!(all[0].id, Backend::CPU, "the CPU comes first");
        let ids = |spec| fenced(&all, spec).iter().map(|f| f.id).collect::<Vec<_>>();
        assert_eq!(ids("cpu"), vec![Backend::CPU]);
        assert_eq!(ids("vulkan"), vec![Backend::CPU]);
        #[cfg(feature = "wgpu")]
        {
            assert_eq!(all.iter().filter(|f| f.id == Backend::WGPU).count(), 1);
            assert_eq!(ids(" WGPU "), vec![Backend::CPU, Backend::WGPU]);
            assert_eq!(ids("cpu,wgpu"), vec![Backend::CPU, Backend::WGPU]);
        }
        assert!(matches!(
            check_fence("vulkan", &BackendOptions::default()),
            Err(FenceError::Unknown { .. })
        ));
        #[cfg(not(feature = "cuda"))]
        assert!(matches!(
            check_fence("cuda", &BackendOptions::default()),
            Err(FenceError::NotCompiled { .. })
        ));
        // With the backend compiled in, a machine without the driver or a device refuses
        // it with the probe's reason; one with a device accepts it.
        #[cfg(feature = "cuda")]
        match check_fence("cuda", &BackendOptions::default()) {
            Ok(v) => assert_eq!(v, vec![Backend::CUDA]),
            Err(FenceError::NotUsable { name, reason }) => {
                assert_eq!(name, "cuda");
                assert!(!reason.is_empty());
            }
            Err(e) => panic!("unexpected refusal: {e}"),
        }
        assert_eq!(
            check_fence("cpu", &BackendOptions::default()).expect("cpu"),
            vec![Backend::CPU]
        );
    }
}
