//! The backend handle and the fixed id space it indexes: each known id's name and
//! assignment priority. The registry builds on this table; the handle's name comes from
//! it, so the IR needs nothing of the registry.

use std::fmt;

/// Backend handle over a fixed id space (cpu = 0, metal = 1, cuda = 2, wgpu = 3).
///
/// The ids are a file-format contract (KV sessions): appended, never renumbered.
/// Names and priorities are its row in [`KNOWN_BACKENDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Backend(pub u16);

impl Backend {
    /// The host CPU.
    pub const CPU: Backend = Backend(0);
    /// Apple Metal.
    pub const METAL: Backend = Backend(1);
    /// NVIDIA CUDA.
    pub const CUDA: Backend = Backend(2);
    /// wgpu (Vulkan, Metal, DX12 through one code base).
    pub const WGPU: Backend = Backend(3);

    /// The raw id.
    pub fn id(self) -> u16 {
        self.0
    }

    /// Registry name for known ids, `backend#<id>` otherwise.
    pub fn name(self) -> String {
        match entry_for(self) {
            Some(e) => e.name.to_string(),
            None => format!("backend#{}", self.0),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

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
