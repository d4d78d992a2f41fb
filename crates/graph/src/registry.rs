//! The backend registry (§3.6): names, the fixed id space, priorities, and the
//! `--backend` / `MINFER_BACKENDS` fence.
//!
//! Two orders are pinned: identity (id order: cpu 0, metal 1, cuda 2, wgpu 3 — the KV-session
//! tag, the exporters, `Ord`) and priority (metal 300 > cuda 200 > wgpu 150 > cpu 100 — the
//! assignment preference). Nothing here depends on hash-map iteration order.
//! The concrete backends live in other crates and plug in through a
//! [`BackendFactory`] each: the binary assembles the list of factories it was compiled
//! with, [`BackendRegistry::from_factories`] probes them, and
//! [`BackendRegistry::select`] turns the fence (or its absence) into the backends an
//! engine constructs. Nothing here names a concrete backend type.

use crate::backend::{BackendImpl, FaultInjector};
pub use crate::backend_id::{entry_for, priority_of, KnownBackend, KNOWN_BACKENDS};
use crate::ir::Backend;

/// One registry row: identity plus this build's and this machine's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendEntry {
    /// Name accepted by the fence.
    pub name: &'static str,
    /// Fixed id.
    pub id: Backend,
    /// Assignment priority.
    pub priority: u32,
    /// Whether this build contains the backend.
    pub compiled: bool,
    /// `Ok` when the backend can run here, else why not.
    pub usable: Result<(), String>,
    /// What the probe found (adapter or device name), when it ran and found one.
    pub device: Option<String>,
    /// The device is itself an emulation on the CPU (llvmpipe, WARP): usable only when
    /// named by the fence, never by default.
    pub emulated: bool,
    /// The probe's detailed device description, where the backend gives one.
    pub detail: Option<DeviceInfo>,
}

/// What a backend needs to be constructed, the same for every backend.
#[derive(Debug, Clone, Default)]
pub struct BackendConfig {
    /// Host worker threads (the CPU backend's pool; a device backend may ignore it).
    pub n_threads: usize,
    /// The unwind-safety fault hook the engine arms in tests.
    pub fault: FaultInjector,
    /// Storage formats of the K and V rows (per engine, ADR-0006).
    pub kv_types: [crate::KvType; 2],
    /// The backends' tuning knobs, as the caller resolved them; each backend reads its own.
    pub options: crate::BackendOptions,
}

/// What a successful probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeInfo {
    /// Adapter or device name, for `minfer info` and the server's props.
    pub device: String,
    /// Whether the device is a CPU emulation (software rasterizer adapters).
    pub emulated: bool,
    /// The device in detail (driver, API, class), where the backend reports one.
    pub detail: Option<DeviceInfo>,
}

/// A backend's device as reports show it (`minfer info`, the server's health).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Adapter or device name as the driver reports it.
    pub name: String,
    /// Driver name and version.
    pub driver: String,
    /// Graphics API behind the device (`Vulkan`, `Metal`, `Dx12`), empty for the host.
    pub api: String,
    /// Device class (`DiscreteGpu`, `IntegratedGpu`, `Cpu`, ...).
    pub device_type: String,
    /// Whether the device is a CPU emulation (llvmpipe/lavapipe, WARP).
    pub emulated: bool,
    /// The largest single buffer the device allocates, in bytes, where it has a limit.
    pub max_buffer_bytes: Option<u64>,
    /// The largest buffer one kernel may bind as storage, in bytes, where that is a
    /// separate (smaller) limit; what the backend's pool buffers are held to.
    pub max_binding_bytes: Option<u64>,
}

/// One backend crate's entry in the binary's constructor table: a pinned id (its row
/// in [`KNOWN_BACKENDS`]), a probe, and a constructor.
#[derive(Debug, Clone, Copy)]
pub struct BackendFactory {
    /// The id this backend occupies; must have a row in [`KNOWN_BACKENDS`].
    pub id: Backend,
    /// Whether the backend can run on this machine: `Err` says why not (no adapter,
    /// driver too old, a required feature missing).
    pub probe: fn(&BackendConfig) -> Result<ProbeInfo, String>,
    /// Constructs the backend; `Err` says why it cannot run after all.
    pub create: fn(&BackendConfig) -> Result<Box<dyn BackendImpl>, String>,
}

/// The backends an engine constructs, in identity order, and what to tell the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// Backends to construct.
    pub backends: Vec<Backend>,
    /// One line each for a compiled GPU backend left out by default (see
    /// [`cpu_fallback_notice`]); empty when a fence chose.
    pub notices: Vec<String>,
}

/// The one line printed when a compiled backend is not used by default, so every
/// backend crate and the engine word it the same way.
pub fn cpu_fallback_notice(name: &str, reason: &str) -> String {
    format!("minfer: backend '{name}' not used ({reason}); running on the CPU")
}

/// The reason [`cpu_fallback_notice`] gives for a CPU-emulation device.
pub fn emulation_reason(name: &str, device: &str) -> String {
    format!(
        "'{device}' is a CPU emulation, slower than minfer's CPU kernels; --backend {name} uses it anyway"
    )
}

/// A fence refusal; each names which of the three reasons applies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    /// The name is not a backend at all.
    #[error("unknown backend '{name}' (known backends: {known})")]
    Unknown {
        /// The name given.
        name: String,
        /// Comma-separated known names.
        known: String,
    },
    /// The backend exists but this build does not contain it.
    #[error("backend '{name}' is not compiled into this build")]
    NotCompiled {
        /// The name given.
        name: String,
    },
    /// The backend is compiled in but cannot run on this machine.
    #[error("backend '{name}' is not usable on this machine: {reason}")]
    NotUsable {
        /// The name given.
        name: String,
        /// Why not.
        reason: String,
    },
    /// The fence names no backend.
    #[error("the backend fence is empty")]
    Empty,
    /// A backend factory claims an id with no row in `KNOWN_BACKENDS`.
    #[error("a backend factory claims id {id}, which has no row in the backend registry")]
    Unpinned {
        /// The id claimed.
        id: u16,
    },
    /// `MINFER_BACKENDS` is not readable text.
    #[error(transparent)]
    Env(#[from] minfer_env::EnvError),
}

/// The registry of this process: the pinned table plus status flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendRegistry {
    entries: Vec<BackendEntry>,
}

impl Default for BackendRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl BackendRegistry {
    /// CPU compiled and usable; Metal and CUDA absent until their crates say otherwise.
    pub fn new() -> Self {
        let entries = KNOWN_BACKENDS
            .iter()
            .map(|k| BackendEntry {
                name: k.name,
                id: k.id,
                priority: k.priority,
                compiled: k.id == Backend::CPU,
                usable: if k.id == Backend::CPU {
                    Ok(())
                } else {
                    Err("not probed".to_string())
                },
                device: None,
                emulated: false,
                detail: None,
            })
            .collect();
        BackendRegistry { entries }
    }

    /// The registry of a build that contains exactly `factories`: each is marked
    /// compiled and probed with `cfg`; every other known backend is not compiled (the
    /// CPU included, when no factory provides it). A factory whose id has no row in
    /// [`KNOWN_BACKENDS`] is refused, naming the id.
    pub fn from_factories(
        factories: &[BackendFactory],
        cfg: &BackendConfig,
    ) -> Result<Self, FenceError> {
        let mut r = Self::new();
        for e in &mut r.entries {
            e.compiled = false;
            e.usable = Err("not compiled into this build".into());
        }
        for f in factories {
            let e = r
                .entries
                .iter_mut()
                .find(|e| e.id == f.id)
                .ok_or(FenceError::Unpinned { id: f.id.id() })?;
            e.compiled = true;
            match (f.probe)(cfg) {
                Ok(info) => {
                    e.usable = Ok(());
                    e.device = Some(info.device);
                    e.emulated = info.emulated;
                    e.detail = info.detail;
                }
                Err(reason) => e.usable = Err(reason),
            }
        }
        Ok(r)
    }

    /// The backends to construct. A fence (already checked by [`Self::parse_fence`])
    /// chooses its backends, emulated devices included, plus the CPU when it is
    /// compiled and usable: the CPU is the host backend (inputs, the logits readback,
    /// and every op the fenced backends do not claim, as splits by capability), so
    /// `--backend wgpu` means wgpu for what it claims and the CPU for the rest, while
    /// `--backend cpu` excludes every other backend. Without a fence: every compiled,
    /// usable backend that is not an emulation, plus one line of notice for each
    /// compiled one left out.
    pub fn select(&self, fence: Option<&[Backend]>) -> Selection {
        if let Some(f) = fence {
            let mut backends = f.to_vec();
            let host = self
                .by_name("cpu")
                .is_some_and(|e| e.compiled && e.usable.is_ok());
            if host {
                backends.push(Backend::CPU);
            }
            backends.sort();
            backends.dedup();
            return Selection {
                backends,
                notices: Vec::new(),
            };
        }
        let mut backends = Vec::new();
        let mut notices = Vec::new();
        for e in self.identity_order().into_iter().filter(|e| e.compiled) {
            match (&e.usable, e.emulated) {
                (Ok(()), false) => backends.push(e.id),
                (Ok(()), true) => {
                    let device = e.device.as_deref().unwrap_or("the device");
                    notices.push(cpu_fallback_notice(
                        e.name,
                        &emulation_reason(e.name, device),
                    ));
                }
                (Err(reason), _) => notices.push(cpu_fallback_notice(e.name, reason)),
            }
        }
        Selection { backends, notices }
    }

    /// Records whether `id` is compiled into this build.
    pub fn set_compiled(&mut self, id: Backend, compiled: bool) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.id == id) {
            e.compiled = compiled;
        }
    }

    /// Records whether `id` can run on this machine (`Err` carries the reason).
    pub fn set_usable(&mut self, id: Backend, usable: Result<(), String>) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.id == id) {
            e.usable = usable;
        }
    }

    /// Entries in identity (id) order.
    pub fn identity_order(&self) -> Vec<&BackendEntry> {
        let mut v: Vec<&BackendEntry> = self.entries.iter().collect();
        v.sort_by_key(|e| e.id);
        v
    }

    /// Entries in priority order, highest first (ties broken by id).
    pub fn priority_order(&self) -> Vec<&BackendEntry> {
        let mut v: Vec<&BackendEntry> = self.entries.iter().collect();
        v.sort_by_key(|e| (std::cmp::Reverse(e.priority), e.id));
        v
    }

    /// The entry called `name` (case-insensitive).
    pub fn by_name(&self, name: &str) -> Option<&BackendEntry> {
        self.entries
            .iter()
            .find(|e| e.name.eq_ignore_ascii_case(name))
    }

    /// Parses a comma-separated fence such as `metal,cpu` into backends in identity
    /// order, refusing loudly on the first name that cannot participate.
    pub fn parse_fence(&self, spec: &str) -> Result<Vec<Backend>, FenceError> {
        let mut out = Vec::new();
        for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let e = self.by_name(name).ok_or_else(|| FenceError::Unknown {
                name: name.to_string(),
                known: KNOWN_BACKENDS
                    .iter()
                    .map(|k| k.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
            if !e.compiled {
                return Err(FenceError::NotCompiled {
                    name: name.to_string(),
                });
            }
            if let Err(reason) = &e.usable {
                return Err(FenceError::NotUsable {
                    name: name.to_string(),
                    reason: reason.clone(),
                });
            }
            if !out.contains(&e.id) {
                out.push(e.id);
            }
        }
        if out.is_empty() {
            return Err(FenceError::Empty);
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_and_priority_orders_are_pinned() {
        let r = BackendRegistry::new();
        let ident: Vec<(&str, u16, u32)> = r
            .identity_order()
            .iter()
            .map(|e| (e.name, e.id.id(), e.priority))
            .collect();
        assert_eq!(
            ident,
            vec![
                ("cpu", 0, 100),
                ("metal", 1, 300),
                ("cuda", 2, 200),
                ("wgpu", 3, 150)
            ]
        );
        let prio: Vec<&str> = r.priority_order().iter().map(|e| e.name).collect();
        assert_eq!(prio, vec!["metal", "cuda", "wgpu", "cpu"]);
        assert_eq!(priority_of(Backend(42)), 0);
    }

    #[test]
    fn each_fence_refusal_names_its_reason() {
        let mut r = BackendRegistry::new();
        r.set_compiled(Backend::METAL, true);
        r.set_usable(Backend::METAL, Err("no Metal device found".into()));

        let unknown = r.parse_fence("cpu,vulkan").unwrap_err();
        assert!(matches!(unknown, FenceError::Unknown { ref name, .. } if name == "vulkan"));
        assert!(unknown.to_string().contains("unknown backend 'vulkan'"));
        assert!(unknown.to_string().contains("cpu, metal, cuda"));

        let not_compiled = r.parse_fence("cuda").unwrap_err();
        assert_eq!(
            not_compiled.to_string(),
            "backend 'cuda' is not compiled into this build"
        );

        let not_usable = r.parse_fence("metal").unwrap_err();
        assert_eq!(
            not_usable.to_string(),
            "backend 'metal' is not usable on this machine: no Metal device found"
        );

        assert_eq!(r.parse_fence(" , ").unwrap_err(), FenceError::Empty);
        r.set_usable(Backend::METAL, Ok(()));
        assert_eq!(
            r.parse_fence("METAL, cpu, metal").unwrap(),
            vec![Backend::CPU, Backend::METAL]
        );
    }

    fn cpu_probe(_: &BackendConfig) -> Result<ProbeInfo, String> {
        Ok(ProbeInfo {
            device: "host".into(),
            emulated: false,
            detail: None,
        })
    }
    fn no_adapter(_: &BackendConfig) -> Result<ProbeInfo, String> {
        Err("no adapter found".into())
    }
    fn software_adapter(_: &BackendConfig) -> Result<ProbeInfo, String> {
        Ok(ProbeInfo {
            device: "llvmpipe".into(),
            emulated: true,
            detail: None,
        })
    }
    fn real_adapter(_: &BackendConfig) -> Result<ProbeInfo, String> {
        Ok(ProbeInfo {
            device: "a real GPU".into(),
            emulated: false,
            detail: None,
        })
    }
    fn make_ref(_: &BackendConfig) -> Result<Box<dyn BackendImpl>, String> {
        Ok(Box::new(crate::testing::RefBackend::cpu()))
    }
    fn factory(
        id: Backend,
        probe: fn(&BackendConfig) -> Result<ProbeInfo, String>,
    ) -> BackendFactory {
        BackendFactory {
            id,
            probe,
            create: make_ref,
        }
    }

    #[test]
    fn factories_decide_compiled_and_a_failed_probe_is_a_named_refusal() {
        let cfg = BackendConfig::default();
        let fs = [
            factory(Backend::CPU, cpu_probe),
            factory(Backend::METAL, no_adapter),
        ];
        let r = BackendRegistry::from_factories(&fs, &cfg).unwrap();
        assert_eq!(r.parse_fence("cpu").unwrap(), vec![Backend::CPU]);
        assert_eq!(
            r.parse_fence("metal").unwrap_err().to_string(),
            "backend 'metal' is not usable on this machine: no adapter found"
        );
        assert_eq!(
            r.parse_fence("cuda").unwrap_err().to_string(),
            "backend 'cuda' is not compiled into this build"
        );
        assert!(matches!(
            r.parse_fence("vulkan").unwrap_err(),
            FenceError::Unknown { .. }
        ));
        // A build without the CPU factory does not pretend to have it.
        let r = BackendRegistry::from_factories(&fs[1..], &cfg).unwrap();
        assert!(matches!(
            r.parse_fence("cpu").unwrap_err(),
            FenceError::NotCompiled { .. }
        ));
        let unpinned =
            BackendRegistry::from_factories(&[factory(Backend(77), cpu_probe)], &cfg).unwrap_err();
        assert_eq!(unpinned, FenceError::Unpinned { id: 77 });
        assert!(unpinned.to_string().contains("id 77"));
    }

    #[test]
    fn the_default_selection_skips_unusable_and_emulated_devices_with_one_line_each() {
        let cfg = BackendConfig::default();
        let probe_all = |metal, cuda| {
            BackendRegistry::from_factories(
                &[
                    factory(Backend::CPU, cpu_probe),
                    factory(Backend::METAL, metal),
                    factory(Backend::CUDA, cuda),
                ],
                &cfg,
            )
            .unwrap()
        };
        let r = probe_all(no_adapter, software_adapter);
        let sel = r.select(None);
        assert_eq!(sel.backends, vec![Backend::CPU]);
        assert_eq!(
            sel.notices,
            vec![
                cpu_fallback_notice("metal", "no adapter found"),
                cpu_fallback_notice("cuda", &emulation_reason("cuda", "llvmpipe")),
            ]
        );
        assert_eq!(
            sel.notices[0],
            "minfer: backend 'metal' not used (no adapter found); running on the CPU"
        );
        // Named explicitly, the emulated device is used, and nothing is printed.
        let fence = r.parse_fence("cuda,cpu").unwrap();
        let sel = r.select(Some(&fence));
        assert_eq!(sel.backends, vec![Backend::CPU, Backend::CUDA]);
        assert!(sel.notices.is_empty());
        // A fence naming only a device backend keeps the CPU as its host, and a CPU
        // fence leaves every device backend out.
        let fence = r.parse_fence("cuda").unwrap();
        assert_eq!(
            r.select(Some(&fence)).backends,
            vec![Backend::CPU, Backend::CUDA]
        );
        let fence = r.parse_fence("cpu").unwrap();
        assert_eq!(r.select(Some(&fence)).backends, vec![Backend::CPU]);
        // A real device is used by default, silently.
        let r = probe_all(real_adapter, no_adapter);
        let sel = r.select(None);
        assert_eq!(sel.backends, vec![Backend::CPU, Backend::METAL]);
        assert_eq!(sel.notices.len(), 1);
        assert_eq!(
            r.by_name("metal").unwrap().device.as_deref(),
            Some("a real GPU")
        );
    }
}
