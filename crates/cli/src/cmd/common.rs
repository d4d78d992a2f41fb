//! Options shared by the commands that load a model for inference.

use std::sync::OnceLock;

use anyhow::Context;
use clap::builder::RangedU64ValueParser;
use minfer_graph::KvType;
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
}

static ENV_OPTIONS: OnceLock<EnvOptions> = OnceLock::new();

impl Default for EnvOptions {
    /// What an empty environment means: no fence, batching on, no reports.
    fn default() -> Self {
        EnvOptions {
            backends: None,
            batching: true,
            scheduler: SchedulerOptions::default(),
        }
    }
}

impl EnvOptions {
    /// Reads the variables, refusing a malformed value.
    fn resolve() -> Result<Self, minfer_env::EnvError> {
        Ok(EnvOptions {
            backends: minfer_env::BACKENDS.get()?,
            batching: minfer_env::BATCH.get_or(true)?,
            scheduler: SchedulerOptions {
                profile: minfer_env::PROFILE.get_or(false)?,
                graph_trace: minfer_env::GRAPH_TRACE.get_or(false)?,
            },
        })
    }

    /// Resolves the options for the rest of the process (`main`, first thing).
    pub fn init() -> Result<&'static Self, minfer_env::EnvError> {
        let resolved = Self::resolve()?;
        Ok(ENV_OPTIONS.get_or_init(|| resolved))
    }

    /// The options `main` resolved (an empty environment's before it did).
    pub fn get() -> &'static Self {
        ENV_OPTIONS.get_or_init(Self::default)
    }
}

/// Most worker threads `-t` accepts (the engine's own limit).
pub const MAX_THREADS: u64 = 1024;

/// Largest context `-c` accepts, in tokens (the engine's own limit; the KV cache must also
/// fit the machine's memory, which the engine checks when it loads).
pub const MAX_CTX: u64 = 1 << 24;

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
    /// `scheme://host[:port]`, or `*`); default: none besides the server's own.
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
            minfer_runtime::backends::check_fence(spec)?;
        }
        let path = minfer_hub::resolve_model(self.model.as_deref(), true)?;
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
        o.cache_type_k = self.cache_type_k;
        o.cache_type_v = self.cache_type_v;
        o
    }
}
