//! Options shared by the commands that load a model for inference.

use anyhow::Context;
use minfer_runtime::{Engine, EngineOptions};

/// Model, threads, context and backend options.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: a GGUF path, a catalog name or an http(s) URL (default: the catalog default).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Worker threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the smaller of the model's and 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<usize>,
    /// Restrict execution to these backends (comma-separated names, e.g. `cpu`).
    #[arg(long = "backend")]
    pub backend: Option<String>,
}

impl ModelArgs {
    /// Resolves the model (pulling it on first use) and loads an engine.
    pub fn load(&self) -> anyhow::Result<Engine> {
        let opts = self.engine_options();
        if let Some(spec) = &opts.backend {
            // Refuse a bad fence before any download or mapping.
            minfer_graph::BackendRegistry::new().parse_fence(spec)?;
        }
        let path = minfer_hub::resolve_model(self.model.as_deref(), true)?;
        Engine::load(&path, &opts).with_context(|| format!("loading {}", path.display()))
    }

    /// The engine options these flags select.
    pub fn engine_options(&self) -> EngineOptions {
        let mut o = EngineOptions::default();
        if let Some(t) = self.threads {
            o.n_threads = t;
        }
        o.n_ctx = self.ctx;
        o.backend = self.backend.clone();
        o
    }
}
