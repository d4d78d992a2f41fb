//! Options shared by the commands that load a model for inference.

use std::sync::OnceLock;

use anyhow::Context;
use clap::builder::RangedU64ValueParser;
use minfer_cpu::quant::{Isa, IsaCap};
use minfer_graph::{BackendOptions, Fusions, GpuApi, KvType};
use minfer_hub::store::home_dir;
use minfer_hub::wheels::DEFAULT_PYTHON;
use minfer_hub::HubConfig;
use minfer_runtime::{Engine, EngineOptions, SchedulerOptions};

/// The `MINFER_*` settings the libraries take as options, read from the environment once,
/// by `main`, before any command runs: the libraries themselves never read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvOptions {
    /// The backend fence `MINFER_BACKENDS` names, used where no `--backend` is given.
    pub backends: Option<String>,
    /// `MINFER_BATCH`: whether several sequences' entries run in one graph execution
    /// (on when unset).
    pub batching: bool,
    /// `MINFER_PROFILE` and `MINFER_GRAPH_TRACE`: what the schedulers report.
    pub scheduler: SchedulerOptions,
    /// `MINFER_FUSE`, `MINFER_REPACK`, `MINFER_WGPU_API` and `MINFER_CUDA_GRAPHS`: the
    /// backends' tuning knobs.
    pub backend_options: BackendOptions,
    /// `MINFER_ISA`: the cap on the CPU kernels' instruction set, put in force by
    /// [`EnvOptions::init`] (a process-wide choice, made once).
    pub isa_cap: Option<IsaCap>,
    /// `MINFER_HOME` (else `HOME`) and `MINFER_PYTHON`: the model store and the
    /// interpreter that fetches catalog wheels.
    pub hub: HubConfig,
}

static ENV_OPTIONS: OnceLock<EnvOptions> = OnceLock::new();

impl Default for EnvOptions {
    /// What an empty environment means: no fence, batching on, no reports, the backends'
    /// defaults, no ISA cap, the store under `.minfer` run by `python3`.
    fn default() -> Self {
        EnvOptions {
            backends: None,
            batching: true,
            scheduler: SchedulerOptions::default(),
            backend_options: BackendOptions::default(),
            isa_cap: None,
            hub: HubConfig::new(&home_dir(None, None), DEFAULT_PYTHON),
        }
    }
}

impl EnvOptions {
    /// Reads the variables, refusing a malformed value.
    fn resolve() -> Result<Self, minfer_env::EnvError> {
        let home = home_dir(minfer_env::HOME.get(), std::env::var_os("HOME"));
        let python = minfer_env::PYTHON
            .get()
            .unwrap_or_else(|| DEFAULT_PYTHON.into());
        Ok(EnvOptions {
            backends: minfer_env::BACKENDS.get()?,
            batching: minfer_env::BATCH.get_or(true)?,
            scheduler: SchedulerOptions {
                profile: minfer_env::PROFILE.get_or(false)?,
                graph_trace: minfer_env::GRAPH_TRACE.get_or(false)?,
            },
            backend_options: BackendOptions {
                fusions: fusions_of(minfer_env::FUSE.get()?),
                repack: minfer_env::REPACK.get_or(true)?,
                gpu_api: gpu_api_of(minfer_env::WGPU_API.get()?),
                device_graphs: minfer_env::CUDA_GRAPHS.get_or(true)?,
            },
            isa_cap: isa_cap_of(minfer_env::ISA.get()?),
            hub: HubConfig::new(&home, python),
        })
    }

    /// Resolves the options for the rest of the process (`main`, first thing) and puts
    /// the ISA cap in force before any kernel runs.
    pub fn init() -> anyhow::Result<&'static Self> {
        let resolved = Self::resolve()?;
        let env = ENV_OPTIONS.get_or_init(|| resolved);
        if let Some(cap) = env.isa_cap {
            if let Err(chosen) = Isa::set_cap(cap) {
                anyhow::bail!(
                    "MINFER_ISA came too late: the CPU kernels already run {}",
                    chosen.name()
                );
            }
        }
        Ok(env)
    }

    /// The options `main` resolved (an empty environment's before it did).
    pub fn get() -> &'static Self {
        ENV_OPTIONS.get_or_init(Self::default)
    }
}

/// The fusions a `MINFER_FUSE` value (already checked) asks for: `1` both, `qkv` or `ffn`
/// that one, `0` or unset none.
fn fusions_of(v: Option<&str>) -> Fusions {
    match v {
        Some("1") => Fusions::ALL,
        Some("qkv") => Fusions {
            qkv: true,
            ffn: false,
        },
        Some("ffn") => Fusions {
            qkv: false,
            ffn: true,
        },
        _ => Fusions::NONE,
    }
}

/// The graphics API a `MINFER_WGPU_API` value (already checked) names; unset, every one.
fn gpu_api_of(v: Option<&str>) -> Option<GpuApi> {
    match v {
        Some("vulkan") => Some(GpuApi::Vulkan),
        Some("metal") => Some(GpuApi::Metal),
        Some("dx12") => Some(GpuApi::Dx12),
        _ => None,
    }
}

/// The cap a `MINFER_ISA` value (already checked) names; unset, none.
fn isa_cap_of(v: Option<&str>) -> Option<IsaCap> {
    match v {
        Some("avx2") => Some(IsaCap::Avx2),
        Some("scalar") => Some(IsaCap::Scalar),
        _ => None,
    }
}

/// Most worker threads `-t` accepts (the engine's own limit).
pub const MAX_THREADS: u64 = 1024;

/// Largest context `-c` accepts, in tokens (the engine's own limit; the KV cache must also
/// fit the machine's memory, which the engine checks when it loads).
pub const MAX_CTX: u64 = 1 << 24;

/// Most state checkpoints per sequence `--ctx-checkpoints` accepts (each holds a whole
/// recurrent state, megabytes on real models).
pub const MAX_CTX_CHECKPOINTS: u64 = 1024;

/// The largest `--delta-chunk`.
pub const MAX_DELTA_CHUNK: u64 = minfer_runtime::engine::MAX_DELTA_CHUNK as u64;

/// A clap parser for a `usize` flag limited to `range`, so an out-of-range value is refused
/// with the flag's name before anything runs.
pub fn usize_in(range: std::ops::RangeInclusive<u64>) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(range)
}

/// Who may call an HTTP surface (`minfer serve`, `minfer viz`): one policy, the same
/// flags and defaults everywhere (see `minfer_server::security`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct HttpPolicyArgs {
    /// Origins whose web pages may call this server (comma-separated
    /// `scheme://host[:port]`, `localhost` for any loopback origin on any port, or `*`);
    /// default: none besides the server's own.
    #[arg(long = "cors-origins", value_delimiter = ',')]
    pub cors_origins: Vec<String>,
    /// Extra names the Host header may carry (comma-separated `name` or `name:port`, or
    /// `*`); bound to loopback, only localhost, 127.0.0.1 and [::1] are accepted otherwise.
    #[arg(long = "allowed-hosts", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
}

/// Model, threads, context and backend options.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: a GGUF path, a catalog name or an http(s) URL (default: the catalog default).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Worker threads, 1..=1024 (default: the number of physical cores).
    #[arg(short = 't', long = "threads", value_parser = usize_in(1..=MAX_THREADS))]
    pub threads: Option<usize>,
    /// Context size in tokens, 1..=16777216 (default: the smaller of the model's and 4096).
    #[arg(short = 'c', long = "ctx-size", value_parser = usize_in(1..=MAX_CTX))]
    pub ctx: Option<usize>,
    /// Restrict execution to these backends (comma-separated names, e.g. `cpu`).
    #[arg(long = "backend")]
    pub backend: Option<String>,
    /// Storage format of the KV cache's K rows: f32, f16 or q8_0.
    #[arg(long = "cache-type-k", default_value = "f32", value_parser = KvType::parse)]
    pub cache_type_k: KvType,
    /// Storage format of the KV cache's V rows: f32, f16 or q8_0.
    #[arg(long = "cache-type-v", default_value = "f32", value_parser = KvType::parse)]
    pub cache_type_v: KvType,
    /// Keep every KV row of sliding-window layers instead of a ring of the window's
    /// last rows (more memory; any earlier prefix stays reusable).
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// State checkpoints each sequence of a recurrent model keeps (two per prompt: a few
    /// tokens before its end and at its end), so a later prompt sharing only part of what
    /// ran goes on from the last one inside the shared prefix; 0 turns them off.
    #[arg(long = "ctx-checkpoints", visible_alias = "swa-checkpoints", default_value_t = minfer_runtime::checkpoint::DEFAULT_CTX_CHECKPOINTS, value_parser = usize_in(0..=MAX_CTX_CHECKPOINTS))]
    pub ctx_checkpoints: usize,
    /// Run the delta rule of recurrent layers (Qwen3.5, Qwen3-Next) in prefill a chunk of
    /// this many tokens at a time (0: token by token). Equal to the token-by-token values
    /// up to rounding, not bit for bit.
    #[arg(long = "delta-chunk", default_value_t = 0, value_parser = usize_in(0..=MAX_DELTA_CHUNK))]
    pub delta_chunk: usize,
    /// Say more on stderr: which compiled backends are left out, and why.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
}

impl ModelArgs {
    /// Resolves the model (pulling it on first use) and loads an engine.
    pub fn load(&self) -> anyhow::Result<Engine> {
        let opts = self.engine_options();
        if let Some(spec) = &opts.backend {
            // Refuse a bad fence before any download or mapping (`MINFER_BACKENDS` was
            // checked at startup).
            minfer_runtime::backends::check_fence(spec, &opts.backend_options)?;
        }
        let path = minfer_hub::resolve_model(self.model.as_deref(), &EnvOptions::get().hub, true)?;
        let engine =
            Engine::load(&path, &opts).with_context(|| format!("loading {}", path.display()))?;
        self.announce();
        Ok(engine)
    }

    /// With `-v`, the default backend selection's notices (a GPU backend left out, and
    /// why), once the engine is built; quiet otherwise, as `minfer info` says it.
    fn announce(&self) {
        if self.verbose {
            for n in minfer_runtime::backends::notices() {
                eprintln!("{n}");
            }
        }
    }

    /// The engine options these flags select.
    pub fn engine_options(&self) -> EngineOptions {
        let mut o = EngineOptions::default();
        if let Some(t) = self.threads {
            o.n_threads = t;
        }
        o.n_ctx = self.ctx;
        let env = EnvOptions::get();
        o.backend = self.backend.clone().or_else(|| env.backends.clone());
        o.batching = env.batching;
        o.scheduler = env.scheduler;
        o.backend_options = env.backend_options;
        o.cache_type_k = self.cache_type_k;
        o.cache_type_v = self.cache_type_v;
        o.swa_full = self.swa_full;
        o.ctx_checkpoints = self.ctx_checkpoints;
        o.delta_chunk = self.delta_chunk;
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_accepted_value_maps_to_its_option_and_unset_to_the_default() {
        assert_eq!(fusions_of(None), Fusions::NONE);
        assert_eq!(fusions_of(Some("0")), Fusions::NONE);
        assert_eq!(fusions_of(Some("1")), Fusions::ALL);
        assert_eq!(
            (fusions_of(Some("qkv")).qkv, fusions_of(Some("qkv")).ffn),
            (true, false)
        );
        assert_eq!(
            (fusions_of(Some("ffn")).qkv, fusions_of(Some("ffn")).ffn),
            (false, true)
        );
        for v in minfer_env::WGPU_API.values {
            assert!(gpu_api_of(Some(v)).is_some(), "MINFER_WGPU_API={v}");
        }
        assert_eq!(gpu_api_of(None), None);
        for v in minfer_env::ISA.values {
            assert!(isa_cap_of(Some(v)).is_some(), "MINFER_ISA={v}");
        }
        assert_eq!(isa_cap_of(None), None);
        let d = EnvOptions::default();
        assert_eq!(d.backend_options, BackendOptions::default());
        assert!(d.backend_options.repack && d.backend_options.device_graphs);
    }
}
