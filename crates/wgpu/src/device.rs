//! Adapter choice and device creation.

use minfer_graph::GpuApi;
use std::fmt;
use std::sync::OnceLock;

/// Why the wgpu backend cannot run on this machine; the message names the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotUsable {
    /// What is missing, in words.
    pub reason: String,
}

impl fmt::Display for NotUsable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for NotUsable {}

/// The adapter a backend runs on, for `minfer info` and health output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterSummary {
    /// Adapter name as the driver reports it (e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`).
    pub name: String,
    /// Driver name and version info.
    pub driver: String,
    /// Graphics API behind the adapter (`Vulkan`, `Metal`, `Dx12`).
    pub api: String,
    /// Device class (`DiscreteGpu`, `IntegratedGpu`, `Cpu`, ...).
    pub device_type: String,
    /// Whether the adapter is a software emulation on the CPU.
    pub is_cpu_emulation: bool,
    /// The adapter's largest buffer (`max_buffer_size`), in bytes.
    pub max_buffer_bytes: u64,
    /// The adapter's largest storage binding (`max_storage_buffer_binding_size`), in
    /// bytes: every pool buffer is bound whole, so this bounds them.
    pub max_binding_bytes: u64,
}

impl fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, {}", self.name, self.api, self.device_type)?;
        if !self.driver.is_empty() {
            write!(f, ", {}", self.driver)?;
        }
        f.write_str(")")
    }
}

impl AdapterSummary {
    /// The adapter as the engine's reports describe a device.
    pub fn device_info(&self) -> minfer_graph::DeviceInfo {
        minfer_graph::DeviceInfo {
            name: self.name.clone(),
            driver: self.driver.clone(),
            api: self.api.clone(),
            device_type: self.device_type.clone(),
            emulated: self.is_cpu_emulation,
            max_buffer_bytes: Some(self.max_buffer_bytes),
            max_binding_bytes: Some(self.max_binding_bytes),
        }
    }

    fn of(info: &wgpu::AdapterInfo, limits: &wgpu::Limits) -> Self {
        let driver = [info.driver.as_str(), info.driver_info.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        AdapterSummary {
            name: info.name.clone(),
            driver,
            api: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            is_cpu_emulation: info.device_type == wgpu::DeviceType::Cpu,
            max_buffer_bytes: limits.max_buffer_size,
            max_binding_bytes: limits.max_storage_buffer_binding_size,
        }
    }
}

/// An opened device with the adapter it came from.
pub(crate) struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub summary: AdapterSummary,
}

/// Preference among device classes: real GPUs first, emulation last.
fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// The graphics APIs the probe asks for adapters: all native ones, or the one `api`
/// names ([`minfer_graph::BackendOptions::gpu_api`]).
fn requested_apis(api: Option<GpuApi>) -> (wgpu::Backends, &'static str) {
    match api {
        Some(GpuApi::Vulkan) => (wgpu::Backends::VULKAN, "Vulkan"),
        Some(GpuApi::Metal) => (wgpu::Backends::METAL, "Metal"),
        Some(GpuApi::Dx12) => (wgpu::Backends::DX12, "DX12"),
        None => (wgpu::Backends::PRIMARY, "Vulkan, Metal or DX12"),
    }
}

/// One enumerated adapter and whether the kernels can run on it.
struct Candidate {
    adapter: wgpu::Adapter,
    summary: AdapterSummary,
    /// `Err` names what the adapter lacks.
    fit: Result<(), String>,
}

/// Every adapter of this process, best first; `Err` when none answered.
struct Candidates {
    /// Kept alive beside its adapters.
    _instance: wgpu::Instance,
    list: Vec<Candidate>,
}

/// Whether `adapter` has what the kernels need, or what it lacks.
fn fitness(adapter: &wgpu::Adapter, name: &str) -> Result<(), String> {
    let down = adapter.get_downlevel_capabilities();
    if !down.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
        return Err(format!("{name} lacks compute shaders"));
    }
    let limits = adapter.limits();
    if limits.max_compute_workgroup_size_x < 256
        || limits.max_compute_invocations_per_workgroup < 256
    {
        return Err(format!(
            "{name} allows {} invocations per workgroup, the kernels need 256",
            limits.max_compute_invocations_per_workgroup
        ));
    }
    Ok(())
}

/// Enumerates the adapters of `api` once per process: each enumeration loads the drivers
/// and their layers (tens of milliseconds, and some print to stderr), and the answer does
/// not change while the process runs. Devices are then requested from these adapters.
fn candidates(api: Option<GpuApi>) -> &'static Result<Candidates, NotUsable> {
    /// One enumeration per API choice: every native one, then each alone.
    static CANDIDATES: [OnceLock<Result<Candidates, NotUsable>>; 4] =
        [const { OnceLock::new() }; 4];
    let slot = match api {
        None => 0,
        Some(GpuApi::Vulkan) => 1,
        Some(GpuApi::Metal) => 2,
        Some(GpuApi::Dx12) => 3,
    };
    CANDIDATES[slot].get_or_init(|| {
        let (apis, named) = requested_apis(api);
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: apis,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = pollster::block_on(instance.enumerate_adapters(apis));
        if adapters.is_empty() {
            return Err(NotUsable {
                reason: format!("no GPU adapter found (no {named} driver answered)"),
            });
        }
        let mut list: Vec<Candidate> = adapters
            .into_iter()
            .map(|adapter| {
                let summary = AdapterSummary::of(&adapter.get_info(), &adapter.limits());
                let fit = fitness(&adapter, &summary.name);
                Candidate {
                    adapter,
                    summary,
                    fit,
                }
            })
            .collect();
        list.sort_by_key(|c| rank(c.adapter.get_info().device_type));
        Ok(Candidates {
            _instance: instance,
            list,
        })
    })
}

/// The adapter [`open`] would choose, without opening a device: the best one of `api`
/// the kernels can run on, a CPU emulation only when `allow_cpu_adapter` is set.
pub(crate) fn best(
    api: Option<GpuApi>,
    allow_cpu_adapter: bool,
) -> Result<AdapterSummary, NotUsable> {
    let c = candidates(api).as_ref().map_err(Clone::clone)?;
    let mut refusals = Vec::new();
    for cand in &c.list {
        match eligible(cand, allow_cpu_adapter) {
            Ok(()) => return Ok(cand.summary.clone()),
            Err(why) => refusals.push(why),
        }
    }
    Err(NotUsable {
        reason: format!("no usable GPU adapter: {}", refusals.join("; ")),
    })
}

fn eligible(c: &Candidate, allow_cpu_adapter: bool) -> Result<(), String> {
    if c.summary.is_cpu_emulation && !allow_cpu_adapter {
        return Err(format!(
            "{} is a CPU emulation, used only when the wgpu backend is named explicitly",
            c.summary.name
        ));
    }
    c.fit.clone()
}

/// Opens a device on the best adapter of `api`, or says why none is usable.
pub(crate) fn open(api: Option<GpuApi>, allow_cpu_adapter: bool) -> Result<Gpu, NotUsable> {
    let c = candidates(api).as_ref().map_err(Clone::clone)?;
    let mut refusals = Vec::new();
    for cand in &c.list {
        if let Err(why) = eligible(cand, allow_cpu_adapter) {
            refusals.push(why);
            continue;
        }
        // Everything the adapter offers, not wgpu's conservative defaults: the largest
        // weights (the embedding table) and many-row outputs need storage bindings far
        // above them. The backend then holds its buffers to these limits
        // (`max_buffer_elems`), which the summary reports to `minfer info`.
        let desc = wgpu::DeviceDescriptor {
            label: Some("minfer"),
            required_features: wgpu::Features::empty(),
            required_limits: cand.adapter.limits(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        match pollster::block_on(cand.adapter.request_device(&desc)) {
            Ok((device, queue)) => {
                // The limits granted, which a report then states.
                let granted = device.limits();
                let summary = AdapterSummary {
                    max_buffer_bytes: granted.max_buffer_size,
                    max_binding_bytes: granted.max_storage_buffer_binding_size,
                    ..cand.summary.clone()
                };
                return Ok(Gpu {
                    device,
                    queue,
                    summary,
                });
            }
            Err(e) => refusals.push(format!("{}: device request failed: {e}", cand.summary.name)),
        }
    }
    Err(NotUsable {
        reason: format!("no usable GPU adapter: {}", refusals.join("; ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_gpus_rank_before_emulation() {
        use wgpu::DeviceType::*;
        let mut v = [Cpu, Other, IntegratedGpu, VirtualGpu, DiscreteGpu];
        v.sort_by_key(|&t| rank(t));
        assert_eq!(v, [DiscreteGpu, IntegratedGpu, VirtualGpu, Other, Cpu]);
    }

    #[test]
    fn a_summary_names_the_adapter_api_and_driver() {
        let s = AdapterSummary {
            name: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
            driver: "llvmpipe Mesa 22.3.6".into(),
            api: "Vulkan".into(),
            device_type: "Cpu".into(),
            is_cpu_emulation: true,
            max_buffer_bytes: 1 << 32,
            max_binding_bytes: 1 << 27,
        };
        assert_eq!(
            s.to_string(),
            "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu, llvmpipe Mesa 22.3.6)"
        );
    }
}
