//! `minfer serve`: the OpenAI-compatible HTTP server over one or several models.

use std::time::Duration;

use anyhow::Context;

use super::common::HttpPolicyArgs;

/// Arguments of `minfer serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model: a GGUF path, a catalog name or an http(s) URL (default: the catalog default).
    /// Repeat it to serve several models; the first is the default, and a request's
    /// `model` field selects by alias, file stem or catalog name.
    #[arg(short = 'm', long = "model")]
    pub model: Vec<String>,
    /// Serve every .gguf file under this directory (after any --model), each named by
    /// its file stem.
    #[arg(long = "models-dir")]
    pub models_dir: Option<std::path::PathBuf>,
    /// The id `/v1/models` and answers report for a --model (default: its file stem);
    /// with several --model, give one --alias per --model, in the same order.
    #[arg(short = 'a', long = "alias")]
    pub alias: Vec<String>,
    /// Most models loaded at once; loading another drops the least recently used.
    #[arg(long = "max-models", default_value_t = 1)]
    pub max_models: usize,
    /// Address to listen on.
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long = "port", default_value_t = 8080)]
    pub port: u16,
    /// Concurrent sequences; each gets ctx-size / slots positions (llama-server's
    /// `--parallel`, `-np`).
    #[arg(long = "slots", visible_alias = "parallel", default_value_t = 4)]
    pub slots: usize,
    /// Total context in tokens, shared by the slots (default: the smaller of the model's and 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx: Option<usize>,
    /// Inference threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Restrict execution to these backends (comma-separated names, e.g. `cpu`).
    #[arg(long = "backend")]
    pub backend: Option<String>,
    /// Require this key on every request but /health, as `Authorization: Bearer KEY`,
    /// `Authorization: KEY` or `x-api-key: KEY`.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Most tokens one answer may generate, and the limit of requests that set none
    /// (llama-server's `-n`): a request asking for more gets this many; -1: no limit
    /// but the slot's context.
    #[arg(short = 'n', long = "n-predict", visible_alias = "predict", default_value_t = -1, allow_negative_numbers = true)]
    pub n_predict: i64,
    /// Requests that may wait for a free slot; beyond it clients get 503.
    #[arg(long = "queue", default_value_t = 64)]
    pub queue: usize,
    /// Seconds a request may take before it is abandoned with 504 (1 to 604800).
    #[arg(long = "timeout", default_value_t = 600)]
    pub timeout: u64,
    /// Parse special-token text such as `<|im_end|>` inside chat message content as
    /// control tokens (lets a user forge conversation turns; off by default).
    #[arg(long = "allow-special-in-content")]
    pub allow_special_in_content: bool,
    #[command(flatten)]
    pub http: HttpPolicyArgs,
    /// The chat template to render with instead of the model's: a Jinja template's text,
    /// or `chatml` (llama-server's `--chat-template`).
    #[arg(long = "chat-template", conflicts_with = "chat_template_file")]
    pub chat_template: Option<String>,
    /// Whether OpenAI chat answers carry a thinking model's reasoning apart
    /// (`reasoning_content`: auto, deepseek) or leave it in the text (none), for requests
    /// that give no `reasoning_format` (llama-server's flag).
    #[arg(long = "reasoning-format", default_value = "auto", value_parser = ["auto", "deepseek", "none"])]
    pub reasoning_format: String,
    /// Thinking of chats whose request does not switch it (llama-server's flag): -1 lets
    /// the model think, 0 renders the template with `enable_thinking` false (a budget of
    /// N > 0 tokens is not supported).
    #[arg(long = "reasoning-budget", default_value_t = -1, allow_negative_numbers = true)]
    pub reasoning_budget: i64,
    /// Read the chat template to render with instead of the model's from this file.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub sampling: super::sampling_flags::SamplingFlags,
    #[command(flatten)]
    pub llama: super::llama_flags::LlamaServerFlags,
    /// Most connections open at once; beyond it new ones get 503.
    #[arg(long = "max-connections", default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds in-flight requests get to finish on SIGTERM/SIGINT before they are cancelled.
    #[arg(long = "shutdown-timeout", default_value_t = 5.0)]
    pub shutdown_timeout: f64,
    /// Directory for `POST /slots/{id}?action=save|restore` files (off without it).
    #[arg(long = "slot-save-path")]
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Storage format of the KV cache's K rows: f32, f16 or q8_0.
    #[arg(long = "cache-type-k", default_value = "f32", value_parser = minfer_graph::KvType::parse)]
    pub cache_type_k: minfer_graph::KvType,
    /// Storage format of the KV cache's V rows: f32, f16 or q8_0.
    #[arg(long = "cache-type-v", default_value = "f32", value_parser = minfer_graph::KvType::parse)]
    pub cache_type_v: minfer_graph::KvType,
    /// Keep every KV row of sliding-window layers instead of a ring of the window's
    /// last rows (more memory; any earlier prefix stays reusable).
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// State checkpoints each slot of a recurrent model keeps (two per prompt: a few
    /// tokens before its end and at its end), so a later prompt sharing only part of what
    /// ran goes on from the last one inside the shared prefix; 0 turns them off.
    #[arg(long = "ctx-checkpoints", visible_alias = "swa-checkpoints", default_value_t = minfer_runtime::checkpoint::DEFAULT_CTX_CHECKPOINTS, value_parser = super::common::usize_in(0..=super::common::MAX_CTX_CHECKPOINTS))]
    pub ctx_checkpoints: usize,
    /// Run the delta rule of recurrent layers (Qwen3.5, Qwen3-Next) in prefill a chunk of
    /// this many tokens at a time (0: token by token). Equal to the token-by-token values
    /// up to rounding, not bit for bit.
    #[arg(long = "delta-chunk", default_value_t = 0, value_parser = super::common::usize_in(0..=super::common::MAX_DELTA_CHUNK))]
    pub delta_chunk: usize,
    /// MiB of host RAM for the prompt cache shared across slots: KV rows of prompts
    /// that ran, kept in blocks so that another slot starting with the same tokens copies
    /// them instead of prefilling (least recently used blocks go first; 0 turns it off).
    #[arg(long = "cache-ram", default_value_t = minfer_server::DEFAULT_CACHE_RAM_MIB)]
    pub cache_ram: usize,
    /// Turn off `GET /slots` (it answers llama-server's 501 "not supported").
    #[arg(long = "no-slots")]
    pub no_slots: bool,
    /// How the embedding routes pool a text's token rows: mean, cls, last, none (one
    /// vector per token), or rank (a cross-encoder's classifier scores; rerank then
    /// scores with the head). Default: the model's own (`pooling_type`), else mean.
    #[arg(long = "pooling", value_parser = minfer_runtime::embed::Pooling::parse)]
    pub pooling: Option<minfer_runtime::embed::Pooling>,
    /// Serve `POST /v1/rerank` and `/rerank` with the yes/no judgement of a
    /// Qwen3-Reranker-style model; off by default (a cross-encoder pooled with rank
    /// reranks without it).
    #[arg(long = "rerank", visible_alias = "reranking")]
    pub rerank: bool,
    /// Turn off `GET /metrics` (on by default; it answers llama-server's 501 then).
    #[arg(long = "no-metrics")]
    pub no_metrics: bool,
    /// Speculative decoding in every slot with n-gram lookup (drafts copied from the
    /// prompt and the output so far; requests under a grammar decode plainly).
    #[arg(long = "lookup")]
    pub lookup: bool,
    /// Speculative decoding in every slot with this draft model (a GGUF path, catalog
    /// name or URL), which must share the served models' vocabulary; it gets a slot per
    /// slot, and the slots' draft steps run together.
    #[arg(
        long = "draft",
        visible_alias = "model-draft",
        conflicts_with = "lookup"
    )]
    pub draft: Option<String>,
    /// Most tokens drafted per step with --lookup or --draft, 1..=16.
    #[arg(
        long = "draft-max",
        default_value_t = minfer_runtime::speculative::DEFAULT_DRAFT_MAX,
        value_parser = super::common::usize_in(1..=minfer_runtime::speculative::DRAFT_MAX_LIMIT as u64)
    )]
    pub draft_max: usize,
}

/// The largest `--n-predict`: the largest context a model may have.
const MAX_N_PREDICT: i64 = 1 << 24;

/// Runs `minfer serve` until Ctrl-C.
pub fn run(args: Args) -> anyhow::Result<()> {
    let env = super::common::EnvOptions::get();
    if let Some(spec) = &args.backend {
        // Refuse a bad fence before any download or mapping.
        minfer_runtime::backends::check_fence(spec, &env.backend_options)?;
    }
    // Every number is checked before any download or model load.
    let max_timeout = minfer_server::MAX_REQUEST_TIMEOUT.as_secs();
    if !(1..=max_timeout).contains(&args.timeout) {
        anyhow::bail!(
            "invalid --timeout: {} is not in 1..={max_timeout} seconds",
            args.timeout
        );
    }
    let shutdown = shutdown_timeout(args.shutdown_timeout)?;
    let n_predict = match args.n_predict {
        -1 => None,
        n @ 0..=MAX_N_PREDICT => Some(n as usize),
        n => {
            anyhow::bail!("invalid --n-predict: {n} is not -1 (no limit) or in 0..={MAX_N_PREDICT}")
        }
    };
    // Aliases name the --model values in order; without any, the one default model.
    // Models found under --models-dir are named by their file stems.
    let named = match (args.model.len(), &args.models_dir) {
        (0, None) => 1,
        (n, _) => n,
    };
    if !args.alias.is_empty() && args.alias.len() != named {
        anyhow::bail!(
            "--alias is given {} times for {} --model: give one --alias per --model, in \
             order (models under --models-dir are named by their file stems)",
            args.alias.len(),
            args.model.len()
        );
    }
    let mut config = minfer_server::Config::new(std::path::PathBuf::new());
    config.max_models = args.max_models;
    config.host = args.host;
    config.port = args.port;
    config.slots = args.slots;
    config.ctx = args.ctx;
    config.threads = args.threads;
    config.backend = args
        .backend
        .or_else(|| env.backends.clone())
        .or_else(|| args.llama.backend().map(String::from));
    for note in args.llama.notes() {
        eprintln!("{note}");
    }
    config.chat_template = chat_template(args.chat_template, args.chat_template_file)?;
    config.batching = env.batching;
    config.scheduler = env.scheduler;
    config.backend_options = env.backend_options;
    config.api_key = args.api_key;
    config.queue = args.queue;
    config.sampling = args.sampling.defaults()?;
    config.reasoning_split = args.reasoning_format != "none";
    config.thinking = match args.reasoning_budget {
        -1 => true,
        0 => false,
        n => anyhow::bail!(
            "invalid --reasoning-budget: {n}; minfer takes -1 (think freely) or 0 (no \
             thinking), not a budget of N tokens"
        ),
    };
    config.n_predict = n_predict;
    config.request_timeout = Duration::from_secs(args.timeout);
    config.allow_special_in_content = args.allow_special_in_content;
    config.cors_origins = args.http.cors_origins;
    config.allowed_hosts = args.http.allowed_hosts;
    config.max_connections = args.max_connections;
    config.shutdown_timeout = shutdown;
    config.slot_save_path = args.slot_save_path;
    config.cache_type_k = args.cache_type_k;
    config.cache_type_v = args.cache_type_v;
    config.swa_full = args.swa_full;
    config.ctx_checkpoints = args.ctx_checkpoints;
    config.delta_chunk = args.delta_chunk;
    config.cache_ram = args.cache_ram.saturating_mul(1 << 20);
    config.no_slots = args.no_slots;
    config.no_metrics = args.no_metrics;
    config.pooling = args.pooling;
    config.rerank = args.rerank;
    config.lookup = args.lookup.then_some(args.draft_max);
    config.draft_max = args.draft_max;
    if let Some(name) = &args.draft {
        config.draft = Some(minfer_hub::resolve_model(Some(name), &env.hub, true)?);
    }
    config.validate()?;
    let mut specs: Vec<Option<&str>> = args.model.iter().map(|m| Some(m.as_str())).collect();
    if specs.is_empty() && args.models_dir.is_none() {
        specs.push(None);
    }
    let mut models = Vec::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let path = minfer_hub::resolve_model(spec, &env.hub, true)?;
        let mut m = model_spec(path);
        m.alias = args.alias.get(i).cloned();
        models.push(m);
    }
    if let Some(dir) = &args.models_dir {
        let files = minfer_server::models::gguf_files(dir)
            .map_err(|e| anyhow::anyhow!("--models-dir: {e}"))?;
        models.extend(files.into_iter().map(model_spec));
    }
    let shown = models
        .iter()
        .map(|m| m.path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    config.models = models;
    config.validate()?;
    minfer_server::serve(config).with_context(|| format!("serving {shown}"))
}

/// A served model, selectable by its catalog name and aliases when it is a catalog file.
fn model_spec(path: std::path::PathBuf) -> minfer_server::ModelSpec {
    let mut m = minfer_server::ModelSpec::new(path);
    let file = m.path.file_name().map(|f| f.to_string_lossy().into_owned());
    if let Some(e) = minfer_hub::catalog()
        .iter()
        .find(|e| file.as_deref() == Some(e.file_name))
    {
        m.names.push(e.name.to_string());
        m.names.extend(e.aliases.iter().map(|a| a.to_string()));
    }
    m
}

/// The template source `--chat-template` or `--chat-template-file` gives, if either.
fn chat_template(
    text: Option<String>,
    file: Option<std::path::PathBuf>,
) -> anyhow::Result<Option<String>> {
    if let Some(path) = file {
        let src = std::fs::read_to_string(&path)
            .with_context(|| format!("--chat-template-file {}", path.display()))?;
        return Ok(Some(src));
    }
    let Some(t) = text else {
        return Ok(None);
    };
    if t == "chatml" {
        return Ok(Some(minfer_tokenizer::CHATML_TEMPLATE.to_string()));
    }
    if !t.contains("{%") && !t.contains("{{") {
        anyhow::bail!(
            "--chat-template {t:?} is neither a Jinja template nor a template minfer knows \
             by name (chatml); give the template's text, or --chat-template-file"
        );
    }
    Ok(Some(t))
}

/// `--shutdown-timeout` as a duration: a finite number of seconds in 0..=86400.
fn shutdown_timeout(secs: f64) -> anyhow::Result<Duration> {
    let max = minfer_server::MAX_IO_TIMEOUT.as_secs_f64();
    if !(0.0..=max).contains(&secs) {
        anyhow::bail!("--shutdown-timeout {secs} is outside 0..={max} seconds");
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_timeout_is_bounded_seconds() {
        assert_eq!(
            shutdown_timeout(1.5).ok(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(shutdown_timeout(0.0).ok(), Some(Duration::ZERO));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e30] {
            assert!(shutdown_timeout(bad).is_err(), "{bad}");
        }
    }
}
