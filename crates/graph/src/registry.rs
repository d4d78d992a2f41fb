//! The backend registry (§3.6): names, the fixed id space, priorities, and the
//! `--backend` / `MINFER_BACKENDS` fence.
//!
//! Two orders are pinned: identity (id order: cpu 0, metal 1, cuda 2, wgpu 3 — the KV-session
//! tag, the exporters, `Ord`) and priority (metal 300 > cuda 200 > wgpu 150 > cpu 100 — the
//! assignment preference). Nothing here depends on hash-map iteration order.
//! The concrete backends live in other crates, so whether one is compiled in and
//! usable is recorded by whoever builds the registry (`set_compiled` / `set_usable`).

use crate::ir::Backend;

/// The pinned identity of one known backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownBackend {
    /// Name accepted by the fence.
    pub name: &'static str,
    /// Fixed id.
    pub id: Backend,
    /// Assignment priority (higher is preferred).
    pub priority: u32,
}

/// The fixed id space, in identity order. Append only; never renumber.
pub const KNOWN_BACKENDS: [KnownBackend; 4] = [
    KnownBackend {
        name: "cpu",
        id: Backend::CPU,
        priority: 100,
    },
    KnownBackend {
        name: "metal",
        id: Backend::METAL,
        priority: 300,
    },
    KnownBackend {
        name: "cuda",
        id: Backend::CUDA,
        priority: 200,
    },
    // Below the native GPU backends, above the CPU.
    KnownBackend {
        name: "wgpu",
        id: Backend::WGPU,
        priority: 150,
    },
];

/// The pinned entry of `b`, if its id is known.
pub fn entry_for(b: Backend) -> Option<&'static KnownBackend> {
    KNOWN_BACKENDS.iter().find(|e| e.id == b)
}

/// Assignment priority of `b`; ids outside the known space rank lowest (0).
pub fn priority_of(b: Backend) -> u32 {
    entry_for(b).map_or(0, |e| e.priority)
}

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
            })
            .collect();
        BackendRegistry { entries }
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

    /// The fence from `MINFER_BACKENDS`, `None` when the variable is unset.
    pub fn fence_from_env(&self) -> Result<Option<Vec<Backend>>, FenceError> {
        match minfer_env::BACKENDS.get() {
            Ok(Some(v)) => self.parse_fence(&v).map(Some),
            Ok(None) => Ok(None),
            Err(e) => Err(e.into()),
        }
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
}
