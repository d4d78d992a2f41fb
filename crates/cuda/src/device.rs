//! The device side: the probe, the NVRTC program (compiled once per process), device
//! and pinned memory, and the [`Launcher`] that runs, captures and replays commands.
//!
//! Everything goes through the driver API loaded at run time: on a machine without the
//! driver library or without a device the probe says which, and nothing else is called.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaModule, CudaStream};

use crate::kernels::{self, Kernel};
use crate::replay::{Arg, Cmd, Launcher};

/// What the probe found: the first device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    /// Device name as the driver reports it.
    pub name: String,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
    /// Device memory in bytes.
    pub memory: usize,
    /// Driver version (e.g. 12040 for 12.4).
    pub driver: i32,
}

impl DeviceSummary {
    /// The largest buffer the backend allocates, in bytes: the device's memory, and
    /// no more f32s than the kernels' 32-bit indices reach.
    pub fn max_buffer_bytes(&self) -> u64 {
        (self.memory as u64).min(u32::MAX as u64 * 4)
    }
}

/// F32s of pinned staging to allocate for `need`: the next power of two up to
/// [`STAGING_STEP`] (small transfers grow the area rarely), whole steps above it (a
/// large read-back does not pin up to twice its size). `Err` when `need` f32s do not
/// fit the address space.
pub fn staging_len(need: usize) -> Result<usize, String> {
    let too_large = || format!("a staging area of {need} f32s does not fit in memory");
    let n = if need <= STAGING_STEP {
        need.max(1).next_power_of_two()
    } else {
        need.div_ceil(STAGING_STEP)
            .checked_mul(STAGING_STEP)
            .ok_or_else(too_large)?
    };
    n.checked_mul(4).map(|_| n).ok_or_else(too_large)
}

/// Granule of large pinned staging areas, in f32s (64 MiB).
pub const STAGING_STEP: usize = 1 << 24;

/// Oldest compute capability the kernels run on (dp4a and warp shuffles with masks).
pub const MIN_CAPABILITY: (i32, i32) = (6, 1);

fn err(what: &str) -> impl Fn(result::DriverError) -> String + '_ {
    move |e| format!("{what}: {e:?}")
}

fn probe_uncached() -> Result<DeviceSummary, String> {
    // SAFETY: only tries to open the library by name; nothing from it is called.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "the CUDA driver library (libcuda) cannot be loaded: no NVIDIA driver is installed"
                .into(),
        );
    }
    result::init().map_err(err("the CUDA driver did not initialize"))?;
    let mut driver = 0;
    // SAFETY: writes one int through a valid pointer.
    unsafe { sys::cuDriverGetVersion(&mut driver) }
        .result()
        .map_err(err("the CUDA driver version"))?;
    // Older drivers lack entry points the backend calls (looked up by name at run time).
    if driver < MIN_DRIVER {
        return Err(format!(
            "the CUDA driver supports CUDA {}.{}; the backend needs {}.{} or newer",
            driver / 1000,
            driver % 1000 / 10,
            MIN_DRIVER / 1000,
            MIN_DRIVER % 1000 / 10
        ));
    }
    let n = result::device::get_count().map_err(err("the CUDA driver cannot count devices"))?;
    if n == 0 {
        return Err("the CUDA driver reports no device".into());
    }
    let dev = result::device::get(0).map_err(err("CUDA device 0"))?;
    let name = result::device::get_name(dev).map_err(err("CUDA device 0's name"))?;
    let attr = |a| {
        // SAFETY: `dev` is a device handle the driver just returned.
        unsafe { result::device::get_attribute(dev, a) }.map_err(err("CUDA device attribute"))
    };
    let capability = (
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    );
    if capability < MIN_CAPABILITY {
        return Err(format!(
            "{name} has compute capability {}.{}; the kernels need {}.{} or newer",
            capability.0, capability.1, MIN_CAPABILITY.0, MIN_CAPABILITY.1
        ));
    }
    // SAFETY: as above.
    let memory = unsafe { result::device::total_mem(dev) }.map_err(err("CUDA device memory"))?;
    // SAFETY: only tries to open the library by name.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(format!(
            "{name} found, but the NVRTC library (libnvrtc), which compiles the kernels at run time, cannot be loaded"
        ));
    }
    Ok(DeviceSummary {
        name,
        capability,
        memory,
        driver,
    })
}

/// Oldest driver API version the backend runs on (12.0).
pub const MIN_DRIVER: i32 = 12_000;

/// The first CUDA device, or why there is none; probed once per process. The bindings
/// panic on a driver entry point they cannot find: such a driver is reported as not
/// usable, never as a crash of the process probing it.
pub fn probe() -> Result<DeviceSummary, String> {
    static PROBE: OnceLock<Result<DeviceSummary, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            std::panic::catch_unwind(probe_uncached).unwrap_or_else(|p| {
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown failure".into());
                Err(format!("the CUDA driver library is unusable: {what}"))
            })
        })
        .clone()
}

/// The NVRTC architecture option for a compute capability.
pub fn arch_option(capability: (i32, i32)) -> String {
    format!("compute_{}{}", capability.0, capability.1)
}

/// Compiles the kernel program to PTX for `arch` (e.g. `compute_90`).
pub fn compile(arch: &str) -> Result<String, String> {
    let opts = cudarc::nvrtc::CompileOptions {
        // Exact IEEE division and square roots and no fused multiply-adds across the
        // source's operations: the kernels follow the CPU's arithmetic where they can.
        prec_div: Some(true),
        prec_sqrt: Some(true),
        fmad: Some(false),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++14".into()],
        name: Some("minfer.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(kernels::program(), opts)
        .map(|p| p.to_src())
        .map_err(|e| format!("the CUDA kernels do not compile for {arch}: {e:?}"))
}

/// The PTX of this process's device, compiled on first use.
fn ptx_for(capability: (i32, i32)) -> Result<String, String> {
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| compile(&arch_option(capability)))
        .clone()
}

/// Device memory owned by the backend, freed on drop.
#[derive(Debug)]
pub struct DevMem {
    /// Device address.
    pub ptr: sys::CUdeviceptr,
    /// Bytes allocated.
    pub bytes: usize,
}

impl DevMem {
    /// `bytes` (at least 4) of zeroed device memory.
    pub fn zeroed(bytes: usize) -> Result<DevMem, String> {
        let bytes = bytes.max(4);
        // SAFETY: the context is current (the backend binds it first); the allocation is
        // owned by the returned value and freed exactly once, in `drop`.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| format!("allocating {bytes} bytes of device memory failed: {e:?}"))?;
        let m = DevMem { ptr, bytes };
        // SAFETY: `ptr` addresses `bytes` bytes just allocated.
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }
            .map_err(|e| format!("clearing device memory failed: {e:?}"))?;
        // A memset of device memory returns before it completes, on the legacy stream,
        // which the backend's non-blocking stream does not wait for: finish it here.
        result::ctx::synchronize().map_err(|e| format!("clearing device memory failed: {e:?}"))?;
        Ok(m)
    }

    /// Device memory holding a copy of `data`.
    pub fn upload(data: &[u8]) -> Result<DevMem, String> {
        let m = DevMem::zeroed(data.len())?;
        if !data.is_empty() {
            // SAFETY: `m` holds at least `data.len()` bytes; the copy is synchronous.
            unsafe { result::memcpy_htod_sync(m.ptr, data) }
                .map_err(|e| format!("uploading {} bytes failed: {e:?}", data.len()))?;
            // From pageable memory the call may return before the data lands.
            result::ctx::synchronize()
                .map_err(|e| format!("uploading {} bytes failed: {e:?}", data.len()))?;
        }
        Ok(m)
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_sync` and is freed only here.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Page-locked host memory of f32s: the staging area uploads and readbacks go through,
/// so copies are asynchronous and can be captured into a graph.
#[derive(Debug)]
pub struct Pinned {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the allocation is owned by this value alone and only touched through `&mut`.
unsafe impl Send for Pinned {}

impl Pinned {
    /// `len` (at least 1) f32s of pinned memory.
    pub fn new(len: usize) -> Result<Pinned, String> {
        let len = len.max(1);
        let bytes = len
            .checked_mul(4)
            .ok_or_else(|| format!("{len} pinned f32s do not fit in memory"))?;
        // SAFETY: allocates page-locked memory owned by the returned value.
        let ptr = unsafe { result::malloc_host(bytes, 0) }
            .map_err(|e| format!("allocating {len} pinned f32s failed: {e:?}"))?;
        Ok(Pinned {
            ptr: ptr as *mut f32,
            len,
        })
    }

    /// Capacity in f32s.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The whole area.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: `ptr` addresses `len` f32s owned by self; `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn as_slice(&self) -> &[f32] {
        // SAFETY: as above, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_host` and is freed only here.
        let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
    }
}

/// A captured and instantiated CUDA Graph, destroyed on drop.
pub struct GraphExec {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graph handles may be used from any thread with the context current.
unsafe impl Send for GraphExec {}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: both handles were created by `capture` and are destroyed only here.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// The context, stream and loaded kernels of one backend.
pub struct Gpu {
    /// The primary context of device 0.
    pub ctx: Arc<CudaContext>,
    /// The one stream all work is ordered on.
    pub stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    funcs: HashMap<Kernel, CudaFunction>,
    /// What the probe found.
    pub summary: DeviceSummary,
}

impl Gpu {
    /// Opens device 0, compiles (once per process) and loads every kernel.
    pub fn open() -> Result<Gpu, String> {
        let summary = probe()?;
        let ctx = CudaContext::new(0).map_err(err("creating the CUDA context"))?;
        let stream = ctx.new_stream().map_err(err("creating a CUDA stream"))?;
        let ptx = ptx_for(summary.capability)?;
        let module = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(err("loading the CUDA kernels"))?;
        let mut funcs = HashMap::new();
        for k in Kernel::all() {
            let name = k.name()?;
            let f = module
                .load_function(&name)
                .map_err(|e| format!("kernel '{name}' missing from the program: {e:?}"))?;
            funcs.insert(k, f);
        }
        Ok(Gpu {
            ctx,
            stream,
            _module: module,
            funcs,
            summary,
        })
    }

    /// Makes the context current on the calling thread (the engine may move backends).
    pub fn bind(&self) -> Result<(), String> {
        self.ctx
            .bind_to_thread()
            .map_err(err("binding the CUDA context"))
    }

    /// Waits for all queued work.
    pub fn sync(&self) -> Result<(), String> {
        self.stream
            .synchronize()
            .map_err(err("the CUDA device reported an error"))
    }

    /// Copies `out.len()` f32s from `src` into `out` through `pinned` (grown as needed).
    pub fn readback(
        &self,
        src: sys::CUdeviceptr,
        out: &mut [f32],
        pinned: &mut Option<Pinned>,
    ) -> Result<(), String> {
        if out.is_empty() {
            return Ok(());
        }
        if pinned.as_ref().is_none_or(|p| p.len() < out.len()) {
            *pinned = Some(Pinned::new(staging_len(out.len())?)?);
        }
        let p = pinned.as_mut().ok_or("no readback staging")?;
        let dst = &mut p.as_mut_slice()[..out.len()];
        // SAFETY: `src` addresses at least `out.len()` f32s (the caller's buffer), `dst`
        // is pinned host memory of that length; the stream is waited on before reading.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }
            .map_err(err("reading a buffer back"))?;
        self.sync()?;
        out.copy_from_slice(&p.as_mut_slice()[..out.len()]);
        Ok(())
    }
}

/// Resolves the device addresses of one flush's commands and issues them on the stream.
pub struct DevLauncher<'a> {
    /// The device.
    pub gpu: &'a Gpu,
    /// Pool buffer addresses by id (`None`: storage released).
    pub bufs: Vec<Option<sys::CUdeviceptr>>,
    /// Weight storage addresses by index.
    pub weights: Vec<sys::CUdeviceptr>,
    /// The quantized-activation scratch area.
    pub scratch: Option<sys::CUdeviceptr>,
    /// Snapshot areas by (slot, length).
    pub snaps: HashMap<(usize, usize), sys::CUdeviceptr>,
    /// The upload staging area (already filled with this flush's data).
    pub staging: Option<&'a Pinned>,
}

impl DevLauncher<'_> {
    fn addr(&self, a: Arg) -> Result<sys::CUdeviceptr, String> {
        match a {
            Arg::Buf(id) => self
                .bufs
                .get(id)
                .copied()
                .flatten()
                .ok_or_else(|| format!("buffer {id} has no device storage")),
            Arg::Weight(i) => self
                .weights
                .get(i)
                .copied()
                .ok_or_else(|| format!("weight storage {i} does not exist")),
            Arg::Scratch(off) => self
                .scratch
                .map(|p| p + off as u64)
                .ok_or_else(|| "no scratch area".to_string()),
            Arg::BufAt(id, off) => Ok(self.addr(Arg::Buf(id))? + 4 * off as u64),
            Arg::Snap(slot, len) => self
                .snaps
                .get(&(slot, len))
                .copied()
                .ok_or_else(|| format!("no snapshot area {slot} of {len} values")),
            Arg::U32(_) | Arg::F32(_) => Err(format!("{a:?} is a value, not an address")),
        }
    }

    fn issue(&self, c: &Cmd) -> Result<(), String> {
        let stream = self.gpu.stream.cu_stream();
        match c {
            Cmd::Launch { kernel, geom, args } => {
                let f = self
                    .gpu
                    .funcs
                    .get(kernel)
                    .ok_or_else(|| format!("kernel {kernel:?} is not loaded"))?;
                // Each parameter's value lives in a u64; 32-bit ones in its low half
                // (little-endian), which is what the kernel reads through the pointer.
                let mut vals: Vec<u64> = Vec::with_capacity(args.len());
                for &a in args {
                    vals.push(match a {
                        Arg::U32(v) | Arg::F32(v) => u64::from(v),
                        other => self.addr(other)?,
                    });
                }
                let mut params: Vec<*mut c_void> = vals
                    .iter_mut()
                    .map(|v| v as *mut u64 as *mut c_void)
                    .collect();
                // SAFETY: `f` is a loaded kernel whose parameters are, in order, the
                // pointers and 32-bit values of `args` (kept by the dispatcher in the
                // kernel's signature order); every address was resolved from live device
                // memory that outlives the stream's work (the flush waits for it).
                unsafe {
                    result::launch_kernel(
                        f.cu_function(),
                        geom.grid,
                        (geom.block, 1, 1),
                        geom.smem,
                        stream,
                        &mut params,
                    )
                }
                .map_err(|e| format!("launching {kernel:?}: {e:?}"))
            }
            Cmd::Upload {
                dst,
                offset,
                len,
                staging,
            } => {
                let st = self.staging.ok_or("uploads without a staging area")?;
                let src = st
                    .as_slice()
                    .get(*staging..staging + len)
                    .ok_or("upload outside the staging area")?;
                let d = self.addr(Arg::Buf(*dst))? + (*offset as u64) * 4;
                // SAFETY: `src` is pinned memory that stays allocated and unchanged until
                // the flush has waited for the stream; `d` addresses `len` f32s inside
                // buffer `dst` (bounds checked when the upload was recorded).
                unsafe { result::memcpy_htod_async(d, src, stream) }
                    .map_err(|e| format!("upload into buffer {dst}: {e:?}"))
            }
            Cmd::Copy { src, dst, len } => {
                let (s, d) = (self.addr(*src)?, self.addr(*dst)?);
                // SAFETY: both address at least `len` f32s (checked when recorded).
                unsafe { result::memcpy_dtod_async(d, s, len * 4, stream) }
                    .map_err(|e| format!("device copy: {e:?}"))
            }
            Cmd::Zero { dst, len } => {
                let d = self.addr(Arg::Buf(*dst))?;
                let bytes = len.max(&1) * 4;
                // SAFETY: `d` addresses the whole buffer of `bytes` bytes.
                unsafe { result::memset_d8_async(d, 0, bytes, stream) }
                    .map_err(|e| format!("clearing buffer {dst}: {e:?}"))
            }
        }
    }
}

impl Launcher for DevLauncher<'_> {
    type Graph = GraphExec;

    fn direct(&mut self, cmds: &[Cmd]) -> Result<(), String> {
        cmds.iter().try_for_each(|c| self.issue(c))
    }

    fn capture(&mut self, cmds: &[Cmd]) -> Result<GraphExec, String> {
        let stream = self.gpu.stream.cu_stream();
        // SAFETY: the stream is valid and idle (every flush ends waiting for it).
        unsafe {
            result::stream::begin_capture(
                stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| format!("starting a CUDA Graph capture: {e:?}"))?;
        let issued = self.direct(cmds);
        // The capture is always ended, so a failed launch leaves the stream usable.
        // SAFETY: the stream is capturing (begun above).
        let graph = unsafe { result::stream::end_capture(stream) }
            .map_err(|e| format!("ending the CUDA Graph capture: {e:?}"));
        issued?;
        let graph = graph?;
        // SAFETY: `graph` was just captured.
        match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
            Ok(exec) => Ok(GraphExec { graph, exec }),
            Err(e) => {
                // SAFETY: destroys the graph captured above, used nowhere else.
                let _ = unsafe { result::graph::destroy(graph) };
                Err(format!("instantiating the CUDA Graph: {e:?}"))
            }
        }
    }

    fn replay(&mut self, g: &GraphExec) -> Result<(), String> {
        // SAFETY: `g.exec` is a live instantiated graph; the addresses it holds are of
        // this pool generation (the cache drops graphs when it changes).
        unsafe { result::graph::launch(g.exec, self.gpu.stream.cu_stream()) }
            .map_err(|e| format!("replaying a CUDA Graph: {e:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_grows_by_powers_of_two_then_by_whole_steps() {
        assert_eq!(staging_len(0), Ok(1));
        assert_eq!(staging_len(1000), Ok(1024));
        assert_eq!(staging_len(STAGING_STEP), Ok(STAGING_STEP));
        // A 311 MB logits read-back pins 320 MiB, not the next power of two (512 MiB).
        let logits = 512 * 151_936;
        assert_eq!(staging_len(logits), Ok(5 * STAGING_STEP));
        assert!(staging_len(usize::MAX / 2).is_err());
    }

    #[test]
    fn the_largest_buffer_is_bounded_by_memory_and_32_bit_indices() {
        let d = |memory| DeviceSummary {
            name: "test".into(),
            capability: (8, 0),
            memory,
            driver: 12040,
        };
        assert_eq!(d(32 << 30).max_buffer_bytes(), u32::MAX as u64 * 4);
        assert_eq!(d(2 << 30).max_buffer_bytes(), 2 << 30);
    }

    /// The whole program through the real NVRTC where its library is installed (no
    /// device or driver needed): it compiles, and PTX defines every kernel the
    /// dispatcher launches. `scripts/test.sh` installs NVRTC so CI runs this.
    #[test]
    fn nvrtc_compiles_every_kernel_the_dispatcher_launches() {
        // SAFETY: only tries to open the library by name.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("NVRTC check skipped: libnvrtc cannot be loaded on this machine");
            return;
        }
        let t0 = std::time::Instant::now();
        for arch in ["compute_61", "compute_90"] {
            let ptx = compile(arch).unwrap_or_else(|e| panic!("{e}"));
            for k in Kernel::all() {
                let name = k.name().unwrap();
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "{arch}: PTX has no entry '{name}'"
                );
            }
        }
        println!(
            "{} kernels compiled by NVRTC for compute_61 and compute_90 in {:.1?}",
            Kernel::all().len(),
            t0.elapsed()
        );
    }

    #[test]
    fn a_kernel_that_does_not_compile_is_a_named_error() {
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("NVRTC check skipped: libnvrtc cannot be loaded on this machine");
            return;
        }
        let e = compile("compute_1").unwrap_err();
        assert!(
            e.contains("compute_1") && e.contains("do not compile"),
            "{e}"
        );
    }
}
