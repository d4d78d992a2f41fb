//! Adapter choice and device creation.

use std::fmt;

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
    fn of(info: &wgpu::AdapterInfo) -> Self {
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

/// Opens the best adapter, or says why none is usable.
pub(crate) fn open(allow_cpu_adapter: bool) -> Result<Gpu, NotUsable> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::PRIMARY,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
    if adapters.is_empty() {
        return Err(NotUsable {
            reason: "no GPU adapter found (no Vulkan, Metal or DX12 driver answered)".into(),
        });
    }
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    let mut refusals = Vec::new();
    for adapter in adapters {
        let info = adapter.get_info();
        let summary = AdapterSummary::of(&info);
        if summary.is_cpu_emulation && !allow_cpu_adapter {
            refusals.push(format!(
                "{} is a CPU emulation, used only when the wgpu backend is named explicitly",
                summary.name
            ));
            continue;
        }
        let down = adapter.get_downlevel_capabilities();
        if !down.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
            refusals.push(format!("{} lacks compute shaders", summary.name));
            continue;
        }
        let limits = adapter.limits();
        if limits.max_compute_workgroup_size_x < 256
            || limits.max_compute_invocations_per_workgroup < 256
        {
            refusals.push(format!(
                "{} allows {} invocations per workgroup, the kernels need 256",
                summary.name, limits.max_compute_invocations_per_workgroup
            ));
            continue;
        }
        // Everything the adapter offers: the largest weights (the embedding table)
        // need storage bindings far above the WebGPU defaults.
        let desc = wgpu::DeviceDescriptor {
            label: Some("minfer"),
            required_features: wgpu::Features::empty(),
            required_limits: limits,
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        match pollster::block_on(adapter.request_device(&desc)) {
            Ok((device, queue)) => {
                return Ok(Gpu {
                    device,
                    queue,
                    summary,
                })
            }
            Err(e) => refusals.push(format!("{}: device request failed: {e}", summary.name)),
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
        };
        assert_eq!(
            s.to_string(),
            "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, Cpu, llvmpipe Mesa 22.3.6)"
        );
    }
}
