//! minfer's HTTP server: OpenAI-compatible, with llama-server's and ollama's APIs.
//!
//! Each loaded model has one inference thread owning a `MultiEngine` with `slots`
//! sequences (`models` keeps at most `max_models` loaded, loading on first use); HTTP handlers
//! (axum on tokio) queue jobs to it through a bounded queue and receive tokens through a
//! bounded channel per request. Endpoints: `POST /v1/chat/completions`,
//! `POST /v1/completions`, `GET /v1/models`, `POST /tokenize`, `POST /detokenize`,
//! `GET /health`, `GET /slots`, `GET /metrics`; llama-server's native routes
//! (`api::llama`: `/completion`, `/infill`, `/props`, `/apply-template`), ollama's
//! (`api::ollama`: `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/version`,
//! `/api/ps`), Anthropic's Messages (`api::anthropic`: `/v1/messages`,
//! `/v1/messages/count_tokens`) and OpenAI's Responses (`api::responses`:
//! `/v1/responses`, `GET /v1/responses/{id}`), each a codec (`api::openai` too) into the same `params::GenRequest` and
//! `generate::start`, reading fields through the shared `api::fields`.
//! Embeddings (`/v1/embeddings`, `/api/embed`, `/api/embeddings`, `/embedding`,
//! `/embeddings`) and rerank (`/v1/rerank`, `/rerank`) are `api::embed`'s, run by the
//! worker as whole-text `task`s in an idle slot.
//!
//! Under the router, the server's own accept loop (`http`) bounds every client in time
//! and number, and shuts down gracefully; `security` keeps web pages from driving it;
//! CPU-heavy request preparation runs off the async threads (`blocking`).
//!
//! Sampling defaults follow llama-server: temperature 0.8, top_k 40, top_p 0.95,
//! min_p 0.05, no penalties, a random seed, and `max_tokens` filling the slot's context.

pub mod answer;
pub mod api;
mod blocking;
mod body;
pub mod chat_prompt;
pub mod error;
pub mod generate;
pub mod harmony;
mod http;
pub mod job;
pub mod metrics;
pub mod models;
pub mod params;
pub mod part;
pub mod prompt_cache;
pub mod reasoning;
mod routes;
pub mod sampling_defaults;
pub mod security;
pub mod slots;
pub mod task;
pub mod tools;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use minfer_runtime::EngineOptions;

/// The codecs, also at the crate root (`minfer_server::openai`, ...).
pub use api::llama as llama_api;
pub use api::{ollama, openai};
pub use error::ApiError;
use metrics::Metrics;
pub use models::{Model, ModelSpec};
use worker::Summary;

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The models to serve, the default first (`--model`, repeatable, or every file of
    /// `--models-dir`); a request's `model` field selects among them.
    pub models: Vec<ModelSpec>,
    /// Most models loaded at once (`--max-models`); the least recently used one is
    /// dropped to load another.
    pub max_models: usize,
    /// Address to listen on.
    pub host: String,
    /// Port; 0 picks a free one (see `Running::addr`).
    pub port: u16,
    /// Concurrent sequences; each gets `ctx / slots` positions.
    pub slots: usize,
    /// Total context over all slots; `None` is the engine's default.
    pub ctx: Option<usize>,
    /// Inference threads; `None` is the number of physical cores.
    pub threads: Option<usize>,
    /// Backend fence (`--backend`, or `MINFER_BACKENDS` as the caller resolved it);
    /// `None`: every compiled backend.
    pub backend: Option<String>,
    /// Whether a step runs its slots' entries together in one graph execution
    /// (`MINFER_BATCH`, as the caller resolved it); on by default, same results either way.
    pub batching: bool,
    /// What each engine's scheduler reports besides executing (`MINFER_PROFILE`,
    /// `MINFER_GRAPH_TRACE`, as the caller resolved them); nothing by default.
    pub scheduler: minfer_runtime::SchedulerOptions,
    /// The backends' tuning knobs (`MINFER_FUSE`, `MINFER_REPACK`, `MINFER_WGPU_API`,
    /// `MINFER_CUDA_GRAPHS`, as the caller resolved them); the defaults otherwise.
    pub backend_options: minfer_runtime::BackendOptions,
    /// Bearer key every request but `/health` must present, when set.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot before new ones get 503.
    pub queue: usize,
    /// Most tokens one answer may generate, and the limit of requests that set none
    /// (llama-server's `-n`); `None`: the slot's context.
    pub n_predict: Option<usize>,
    /// A chat template's source to render every model's chats with instead of its own
    /// (`--chat-template`, `--chat-template-file`); `None`: each model's.
    pub chat_template: Option<String>,
    /// Sampling settings for requests that leave them out (`--temp`, `--top-k`, `--seed`,
    /// ...); the built-in defaults where `None`.
    pub sampling: sampling_defaults::SamplingDefaults,
    /// Whether OpenAI chat answers split the reasoning out when the request gives no
    /// `reasoning_format` (`--reasoning-format`, llama-server's; `none` turns it off).
    pub reasoning_split: bool,
    /// Whether chat templates think when the request does not say
    /// (`enable_thinking`; `--reasoning-budget 0`, llama-server's, makes it false).
    pub thinking: bool,
    /// Largest request body in bytes (larger ones get 413).
    pub body_limit: usize,
    /// Longest a request may take from arrival to its last token (then 504).
    pub request_timeout: Duration,
    /// Parse special-token text (`<|im_end|>`) inside chat message content as control
    /// tokens, as before content was isolated; off by default, since it lets a user
    /// forge turns of the conversation.
    pub allow_special_in_content: bool,
    /// Extra names the `Host` header may carry (`name`, `name:port`, or `*` for any);
    /// bound to loopback, only `localhost`, `127.0.0.1` and `[::1]` on the bound port are
    /// accepted otherwise, which defeats DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`, or `*`) whose web pages may call the server;
    /// cross-origin requests from any other origin are refused.
    pub cors_origins: Vec<String>,
    /// Longest wait for a request's headers, and for the next request on an idle
    /// keep-alive connection.
    pub header_timeout: Duration,
    /// Longest wait for a request's whole body once its headers are in (then 408).
    pub body_timeout: Duration,
    /// Longest a write to a client may make no progress before the connection is dropped
    /// (a client that stopped reading its stream gives up its slot).
    pub write_timeout: Duration,
    /// Most connections open at once; beyond it new ones get a 503 and are closed.
    pub max_connections: usize,
    /// On shutdown, how long in-flight requests may take to finish before they are
    /// cancelled (streams end with an error event and `[DONE]`).
    pub shutdown_timeout: Duration,
    /// Kernel send buffer of each connection (`SO_SNDBUF`); `None` is the system's
    /// default. A small one bounds what a stalled client pins and lets the write timeout
    /// see the stall sooner.
    pub send_buffer: Option<usize>,
    /// Makes a prompt containing `openai::PANIC_MARKER` panic inside inference (or
    /// `openai::SLOW_MARKER` decode slowly), to test that a panic becomes a 500 and the
    /// worker keeps serving, and to hold a slot busy. Never on in the CLI.
    pub fault_injection: bool,
    /// Time the default model's load is held back after the socket is bound, so tests can
    /// observe the loading state (`/health` 503). Zero in the CLI.
    #[doc(hidden)]
    pub load_delay: Duration,
    /// Directory of the slot save/restore files (`--slot-save-path`); `None` disables
    /// `POST /slots/{id}?action=save|restore`.
    pub slot_save_path: Option<PathBuf>,
    /// Storage format of the KV cache's K rows (`--cache-type-k`).
    pub cache_type_k: minfer_runtime::KvType,
    /// Storage format of the KV cache's V rows (`--cache-type-v`).
    pub cache_type_v: minfer_runtime::KvType,
    /// Keep every KV row of sliding-window layers instead of their rings (`--swa-full`).
    pub swa_full: bool,
    /// State checkpoints each slot of a recurrent model keeps (`--ctx-checkpoints`).
    pub ctx_checkpoints: usize,
    /// Tokens per chunk of the recurrent layers' chunked delta rule in prefill
    /// (`--delta-chunk`; 0: token by token).
    pub delta_chunk: usize,
    /// Answer `GET /slots` with llama-server's "not supported" error (`--no-slots`).
    pub no_slots: bool,
    /// How the embedding routes pool a text's rows (`--pooling`); `None`: each model's
    /// own (`pooling_type`), else mean.
    pub pooling: Option<minfer_runtime::embed::Pooling>,
    /// Serve `/v1/rerank` and `/rerank` with the yes/no judgement (`--rerank`); without
    /// it only a cross-encoder pooled with rank reranks, others answer a 501.
    pub rerank: bool,
    /// Answer `GET /metrics` with llama-server's "not supported" error (`--no-metrics`).
    pub no_metrics: bool,
    /// Speculative decoding with n-gram lookup in every slot (`--lookup`), drafting at
    /// most this many tokens per step (`--draft-max`); `None` decodes plainly.
    pub lookup: Option<usize>,
    /// Speculative decoding in every slot with this draft model (`--draft`), which must
    /// share each served model's vocabulary, drafting at most `draft_max` tokens a step.
    pub draft: Option<PathBuf>,
    /// Most tokens drafted per step with `draft` (`--draft-max`).
    pub draft_max: usize,
    /// With `lookup` or `draft`, draft this many tokens at every step the context allows
    /// instead of the adaptive depth: for tests and measurements, never set by the CLI.
    pub draft_depth: Option<usize>,
    /// Bytes of KV rows the prompt cache shared across slots may hold in host RAM
    /// (`--cache-ram`, given in MiB there); 0 turns it off.
    pub cache_ram: usize,
    /// Positions per block of the prompt cache: a prompt reuses whole blocks.
    pub cache_block: usize,
}

/// The prompt cache's default budget in MiB (`--cache-ram`).
pub const DEFAULT_CACHE_RAM_MIB: usize = 1024;

impl Config {
    /// Defaults for one `model`: 127.0.0.1:8080, 4 slots, one model loaded at once, a queue of 64, 1 MiB bodies,
    /// a 10-minute request timeout, no key, no extra hosts or origins, 10 s for headers,
    /// 30 s for a body and for a stalled write, 512 connections, 5 s to shut down, a
    /// prompt cache of [`DEFAULT_CACHE_RAM_MIB`] MiB in blocks of 64 positions.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Config {
            models: vec![ModelSpec::new(model)],
            max_models: 1,
            host: "127.0.0.1".into(),
            port: 8080,
            slots: 4,
            ctx: None,
            threads: None,
            backend: None,
            batching: true,
            scheduler: minfer_runtime::SchedulerOptions::default(),
            backend_options: minfer_runtime::BackendOptions::default(),
            api_key: None,
            queue: 64,
            n_predict: None,
            chat_template: None,
            sampling: Default::default(),
            reasoning_split: true,
            thinking: true,
            body_limit: 1 << 20,
            request_timeout: Duration::from_secs(600),
            allow_special_in_content: false,
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_connections: 512,
            shutdown_timeout: Duration::from_secs(5),
            send_buffer: None,
            fault_injection: false,
            load_delay: Duration::ZERO,
            slot_save_path: None,
            cache_type_k: minfer_runtime::KvType::F32,
            cache_type_v: minfer_runtime::KvType::F32,
            swa_full: false,
            ctx_checkpoints: minfer_runtime::checkpoint::DEFAULT_CTX_CHECKPOINTS,
            delta_chunk: 0,
            no_slots: false,
            no_metrics: false,
            pooling: None,
            rerank: false,
            lookup: None,
            draft: None,
            draft_max: minfer_runtime::speculative::DEFAULT_DRAFT_MAX,
            draft_depth: None,
            cache_ram: DEFAULT_CACHE_RAM_MIB << 20,
            cache_block: 64,
        }
    }

    /// Checks every numeric setting against its stated range (see the `MAX_*`
    /// constants), so that no user number reaches an allocation or a time computation
    /// unchecked.
    pub fn validate(&self) -> Result<(), ServerError> {
        let range = |name: &'static str, v: usize, lo: usize, hi: usize| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(ServerError::Param {
                    name,
                    message: format!("{v} is not in {lo}..={hi}"),
                })
            }
        };
        range("slots (--slots)", self.slots, 1, MAX_SLOTS)?;
        let top = minfer_runtime::speculative::DRAFT_MAX_LIMIT;
        if let Some(max) = self.lookup {
            range("draft length (--draft-max)", max, 1, top)?;
        }
        if let Some(d) = self.draft_depth {
            range("fixed draft depth", d, 0, top)?;
        }
        if self.draft.is_some() {
            range("draft length (--draft-max)", self.draft_max, 1, top)?;
            if self.lookup.is_some() {
                return Err(ServerError::Param {
                    name: "speculative decoding (--draft, --lookup)",
                    message: "give one draft source, a draft model or lookup, not both".into(),
                });
            }
        }
        range("max models (--max-models)", self.max_models, 1, MAX_MODELS)?;
        let top = minfer_runtime::engine::MAX_DELTA_CHUNK;
        range("delta chunk (--delta-chunk)", self.delta_chunk, 0, top)?;
        if self.models.is_empty() {
            return Err(ServerError::Param {
                name: "models (--model, --models-dir)",
                message: "no model to serve".into(),
            });
        }
        if let Some(c) = self.ctx {
            // Every slot needs at least one position.
            range("context size (-c)", c, self.slots, MAX_CTX)?;
        }
        if let Some(t) = self.threads {
            range("threads (-t)", t, 1, MAX_THREADS)?;
        }
        range("queue (--queue)", self.queue, 1, MAX_QUEUE)?;
        self.sampling
            .validate()
            .map_err(|message| ServerError::Param {
                name: "sampling defaults (--temp, --top-p, --min-p, ...)",
                message,
            })?;
        let (lo, hi) = BODY_LIMIT_RANGE;
        range("body limit", self.body_limit, lo, hi)?;
        if self.request_timeout > MAX_REQUEST_TIMEOUT {
            return Err(ServerError::Param {
                name: "request timeout (--timeout)",
                message: format!(
                    "{} s is not in 0..={} s",
                    self.request_timeout.as_secs(),
                    MAX_REQUEST_TIMEOUT.as_secs()
                ),
            });
        }
        range(
            "max connections (--max-connections)",
            self.max_connections,
            1,
            MAX_CONNECTIONS,
        )?;
        for (name, d) in [
            ("header timeout", self.header_timeout),
            ("body timeout", self.body_timeout),
            ("write timeout", self.write_timeout),
        ] {
            if d.is_zero() || d > MAX_IO_TIMEOUT {
                return Err(ServerError::Param {
                    name,
                    message: format!("{d:?} is not in 1 ms..={} s", MAX_IO_TIMEOUT.as_secs()),
                });
            }
        }
        if self.shutdown_timeout > MAX_IO_TIMEOUT {
            return Err(ServerError::Param {
                name: "shutdown timeout (--shutdown-timeout)",
                message: format!(
                    "{:?} is more than {} s",
                    self.shutdown_timeout,
                    MAX_IO_TIMEOUT.as_secs()
                ),
            });
        }
        if let Some(d) = &self.slot_save_path {
            if !d.is_dir() {
                return Err(ServerError::Param {
                    name: "slot save path (--slot-save-path)",
                    message: format!("{} is not a directory", d.display()),
                });
            }
        }
        Ok(())
    }
}

/// Most models loaded at once.
pub const MAX_MODELS: usize = 64;

/// Most slots (the engine's limit).
pub const MAX_SLOTS: usize = 256;

/// Largest total context, in tokens (the engine's limit).
pub const MAX_CTX: usize = 1 << 24;

/// Most inference threads (the engine's limit).
pub const MAX_THREADS: usize = 1024;

/// Longest request queue; the queue grows with use and never reserves this up front.
pub const MAX_QUEUE: usize = 65_536;

/// Smallest and largest request body limit, in bytes.
pub const BODY_LIMIT_RANGE: (usize, usize) = (256, 1 << 30);

/// Longest request timeout: a week, far beyond any generation a slot can hold.
pub const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The model or its tokenizer could not be loaded.
    #[error("{0}")]
    Load(String),
    /// The chat template does not compile.
    #[error("chat template: {0}")]
    Template(#[from] minfer_tokenizer::TemplateError),
    /// Binding or serving the socket failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A setting outside its domain.
    #[error("invalid {name}: {message}")]
    Param {
        /// The setting.
        name: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

/// State shared by every handler.
pub struct AppState {
    models: models::Models,
    metrics: Arc<Metrics>,
    api_key: Option<String>,
    timeout: Duration,
    allow_special_in_content: bool,
    fault_injection: bool,
    body_limit: usize,
    body_timeout: Duration,
    policy: security::Policy,
    blocking: blocking::Blocking,
    /// Raised when a shutdown stops waiting for in-flight requests: they end at once.
    cancel: tokio::sync::watch::Receiver<bool>,
    created: u64,
    ids: AtomicU64,
    slot_save_path: Option<PathBuf>,
    /// The embedding routes' pooling (`Config::pooling`).
    pooling: Option<minfer_runtime::embed::Pooling>,
    /// Whether rerank by yes/no judgement is served (`Config::rerank`).
    rerank: bool,
    /// Which of llama-server's monitoring endpoints are on.
    native: api::llama::Native,
    /// Responses kept for `previous_response_id` (bounded; see `api::responses::store`).
    responses: api::responses::Store,
    /// Sampling settings for requests that leave them out (`Config::sampling`).
    sampling: sampling_defaults::SamplingDefaults,
    /// `Config::reasoning_split`.
    reasoning_split: bool,
    /// Set once the default model is loaded: until then `/health` answers 503 and every
    /// route but `/health`, `/version` and `/metrics` refuses with 503.
    ready: std::sync::atomic::AtomicBool,
}

impl AppState {
    /// The model a request's `model` field selects (the default for `None`), loaded on
    /// first use: the one way every handler reaches a model and its worker. It may block
    /// for a load, so handlers call it off the async threads; an unknown name is OpenAI's
    /// 404 `model_not_found`, and a failed load an error to that request only.
    pub fn model(&self, name: Option<&str>) -> Result<Arc<Model>, ApiError> {
        self.models.get(name)
    }

    /// Whether an OpenAI chat answer splits its reasoning out when the request gives no
    /// `reasoning_format` (`serve --reasoning-format`).
    pub fn reasoning_split(&self) -> bool {
        self.reasoning_split
    }

    /// The sampling settings of requests that leave them out (`serve --temp ...`).
    pub fn sampling_defaults(&self) -> &sampling_defaults::SamplingDefaults {
        &self.sampling
    }

    fn next_id(&self, kind: openai::Kind) -> String {
        let prefix = match kind {
            openai::Kind::Chat => "chatcmpl",
            openai::Kind::Text => "cmpl",
        };
        format!("{prefix}-{}", self.next_serial())
    }

    /// A hex string unique to this server run (its start time and a counter), the
    /// tail of every response id.
    fn next_serial(&self) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{:x}{n:06x}", self.created)
    }
}

/// Marks a response whose stream logs the request itself when it ends.
#[derive(Debug, Clone, Copy)]
pub struct StreamLogged;

/// One request's log line, printed to stderr: method, path, status, duration, tokens.
#[derive(Debug, Clone)]
pub struct RequestLog {
    method: String,
    path: String,
    /// When the request arrived.
    pub start: Instant,
    status: u16,
    summary: Option<Summary>,
    /// Set on the copy a stream owns: it logs when the stream ends or is dropped.
    emit_on_drop: bool,
}

impl RequestLog {
    fn new(method: &str, path: &str) -> Self {
        RequestLog {
            method: method.to_string(),
            path: path.to_string(),
            start: Instant::now(),
            status: 0,
            summary: None,
            emit_on_drop: false,
        }
    }

    fn emit(&self, note: &str) {
        let tokens = match &self.summary {
            Some(s) => format!(
                " prompt={} cached={} completion={}",
                s.prompt_tokens, s.cached_tokens, s.completion_tokens
            ),
            None => String::new(),
        };
        eprintln!(
            "{} {} {} {:.3}s{tokens}{note}",
            self.method,
            self.path,
            self.status,
            openai::secs(self.start)
        );
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        if self.emit_on_drop {
            let note = if self.summary.is_none() && self.status == 200 {
                " (stream ended early)"
            } else {
                " (stream)"
            };
            self.emit(note);
        }
    }
}

/// A server running on background threads; dropping it stops it.
pub struct Running {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    http: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
    /// Every model worker started so far; each ends once its model is dropped.
    workers: Arc<Mutex<Vec<std::thread::JoinHandle<()>>>>,
}

impl Running {
    /// The bound address (the real port when the config asked for 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (SIGTERM or SIGINT when started by `serve`).
    pub fn wait(mut self) -> Result<(), ServerError> {
        self.join(None)
    }

    /// Joins the HTTP thread, then the worker: fully, or for at most `worker_wait` (a
    /// step already running on the worker need not delay a process that is exiting).
    fn join(&mut self, worker_wait: Option<Duration>) -> Result<(), ServerError> {
        let mut result = Ok(());
        if let Some(h) = self.http.take() {
            result = h
                .join()
                .unwrap_or_else(|_| Err(ServerError::Load("the HTTP thread panicked".into())));
        }
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        let t0 = Instant::now();
        for w in workers {
            match worker_wait {
                None => {
                    let _ = w.join();
                }
                Some(limit) => {
                    while !w.is_finished() && t0.elapsed() < limit {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        }
        result
    }

    /// Stops accepting requests, lets open ones finish (cancelling those still running
    /// after the shutdown timeout), and waits for both threads.
    pub fn stop(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.join(None)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = self.join(None);
    }
}

/// Loads the model once, binds `host:port` and serves on background threads.
pub fn start(config: Config) -> Result<Running, ServerError> {
    start_inner(config, false)
}

/// Runs the server in the foreground, printing the address it listens on, until SIGTERM
/// or SIGINT: then it stops accepting, gives in-flight requests the shutdown timeout to
/// finish, cancels the rest, and returns; a second signal exits the process at once.
pub fn serve(config: Config) -> Result<(), ServerError> {
    let running = start_inner(config, true)?;
    // A compiled GPU backend left out is a start-up line: it says where the server runs.
    for n in minfer_runtime::backends::notices() {
        eprintln!("{n}");
    }
    eprintln!("minfer serve: listening on http://{}", running.addr());
    let mut running = running;
    let result = running.join(Some(Duration::from_secs(2)));
    eprintln!("minfer serve: stopped");
    result
}

/// Largest `max_connections`: each open connection costs a task and its buffers.
pub const MAX_CONNECTIONS: usize = 65_536;

/// Longest header, body, write or shutdown timeout (one day): beyond it a timeout is
/// no longer a bound.
pub const MAX_IO_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Resolves on the first SIGTERM or SIGINT, having announced the shutdown; a second one
/// exits the process at once (`128 + signal`, as a shell reports a killed process).
#[cfg(unix)]
fn shutdown_signals(grace: Duration) -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        eprintln!(
            "minfer serve: {name}: shutting down (in-flight requests get {:.1}s; \
             a second signal exits at once)",
            grace.as_secs_f64()
        );
        tokio::spawn(async move {
            let code = tokio::select! {
                _ = term.recv() => 128 + 15,
                _ = int.recv() => 128 + 2,
            };
            eprintln!("minfer serve: second signal: exiting now");
            std::process::exit(code);
        });
    })
}

/// Ctrl-C only where there are no Unix signals.
#[cfg(not(unix))]
fn shutdown_signals(_grace: Duration) -> std::io::Result<impl std::future::Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        tokio::spawn(async {
            let _ = tokio::signal::ctrl_c().await;
            std::process::exit(130);
        });
    })
}

fn start_inner(config: Config, on_signals: bool) -> Result<Running, ServerError> {
    config.validate()?;
    let mut opts = EngineOptions::default();
    if let Some(t) = config.threads {
        opts.n_threads = t;
    }
    opts.n_ctx = config.ctx;
    opts.backend = config.backend.clone();
    opts.batching = config.batching;
    opts.scheduler = config.scheduler;
    opts.backend_options = config.backend_options;
    opts.cache_type_k = config.cache_type_k;
    opts.cache_type_v = config.cache_type_v;
    opts.swa_full = config.swa_full;
    opts.ctx_checkpoints = config.ctx_checkpoints;
    opts.delta_chunk = config.delta_chunk;
    let metrics = Arc::new(Metrics::default());
    if config.cache_ram > 0 {
        metrics.set_cache_block(config.cache_block);
    }
    let load = models::LoadOptions {
        engine: opts.clone(),
        slots: config.slots,
        queue: config.queue,
        n_predict: config.n_predict,
        chat_template: config.chat_template.clone(),
        thinking: config.thinking,
        metrics: Arc::clone(&metrics),
        busy: Arc::default(),
        speculation: match (&config.draft, config.lookup) {
            (Some(path), _) => worker::Speculation::Draft {
                path: path.clone(),
                max: config.draft_max,
                fixed: config.draft_depth,
                // The draft runs with the target's threads, backends, context and KV
                // formats.
                opts: opts.clone(),
            },
            (None, Some(max)) => worker::Speculation::Lookup {
                max,
                fixed: config.draft_depth,
            },
            (None, None) => worker::Speculation::Off,
        },
        prompt_cache: (config.cache_ram > 0 && config.cache_block > 0).then(|| {
            Arc::new(Mutex::new(prompt_cache::PromptCache::new(
                config.cache_ram,
                config.cache_block,
            )))
        }),
    };
    let workers = Arc::new(Mutex::new(Vec::new()));
    let models = models::Models::new(
        &config.models,
        config.max_models,
        load,
        Arc::clone(&workers),
    )
    .map_err(ServerError::Load)?;
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ServerError::Io { what, source }
    };
    let listener = std::net::TcpListener::bind((config.host.as_str(), config.port))
        .map_err(io(&format!("binding {}:{}", config.host, config.port)))?;
    listener
        .set_nonblocking(true)
        .map_err(io("configuring the socket"))?;
    let addr = listener
        .local_addr()
        .map_err(io("reading the bound address"))?;
    let policy = security::Policy::new(addr, &config.allowed_hosts, &config.cors_origins).map_err(
        |message| ServerError::Param {
            name: "allowed hosts or CORS origins (--allowed-hosts, --cors-origins)",
            message,
        },
    )?;
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    let state = Arc::new(AppState {
        models,
        metrics,
        api_key: config.api_key.clone(),
        timeout: config.request_timeout,
        allow_special_in_content: config.allow_special_in_content,
        fault_injection: config.fault_injection,
        body_limit: config.body_limit,
        body_timeout: config.body_timeout,
        policy,
        blocking: blocking::Blocking::new(),
        cancel: cancel_rx,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        ids: AtomicU64::new(0),
        slot_save_path: config.slot_save_path.clone(),
        pooling: config.pooling,
        rerank: config.rerank,
        native: api::llama::Native::new(&config),
        responses: Default::default(),
        sampling: config.sampling.clone(),
        reasoning_split: config.reasoning_split,
        ready: std::sync::atomic::AtomicBool::new(false),
    });
    let loading = Arc::clone(&state);
    let app = routes::router(state);
    let limits = http::Limits {
        header_timeout: config.header_timeout,
        write_timeout: config.write_timeout,
        max_connections: config.max_connections,
        shutdown_timeout: config.shutdown_timeout,
        send_buffer: config.send_buffer,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("minfer-http")
        .enable_all()
        .build()
        .map_err(io("starting the async runtime"))?;
    // Registered before the address is announced, so that a signal sent as soon as the
    // server is up already shuts it down gracefully.
    let signals = if on_signals {
        let _enter = rt.enter();
        Some(shutdown_signals(config.shutdown_timeout).map_err(io("installing signal handlers"))?)
    } else {
        None
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let http = std::thread::Builder::new()
        .name("minfer-http".into())
        .spawn(move || -> Result<(), ServerError> {
            let served = rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)
                    .map_err(io("registering the socket"))?;
                let stop = async move {
                    match signals {
                        Some(signals) => tokio::select! {
                            _ = rx => {}
                            _ = signals => {}
                        },
                        None => {
                            let _ = rx.await;
                        }
                    }
                };
                http::serve(listener, app, limits, stop, cancel_tx).await;
                Ok(())
            });
            // Whatever is still running (a client that never reads its cancelled answer,
            // a tokenisation in progress) is dropped or left behind, not waited for.
            rt.shutdown_timeout(Duration::from_millis(500));
            served
        })
        .map_err(io("starting the HTTP thread"))?;
    let running = Running {
        addr,
        shutdown: Some(tx),
        http: Some(http),
        workers,
    };
    // The default model loads while the socket already answers `/health` with 503, so
    // a gateway's or an orchestrator's probe sees the server come up; a server that
    // cannot serve the model stops (dropping `running`) and says why.
    std::thread::sleep(config.load_delay);
    loading
        .model(None)
        .map_err(|e| ServerError::Load(e.message))?;
    loading
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    Ok(running)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Edit = fn(&mut Config);

    #[test]
    fn numeric_settings_outside_their_range_are_named() {
        let bad: [(&str, Edit); 10] = [
            ("queue", |c| c.queue = 1_000_000_000),
            ("queue", |c| c.queue = usize::MAX),
            ("queue", |c| c.queue = 0),
            ("slots", |c| c.slots = 0),
            ("slots", |c| c.slots = 257),
            ("context size", |c| c.ctx = Some(2)),
            ("context size", |c| c.ctx = Some(usize::MAX)),
            ("threads", |c| c.threads = Some(0)),
            ("body limit", |c| c.body_limit = 10),
            ("request timeout", |c| {
                c.request_timeout = Duration::from_secs(u64::MAX)
            }),
        ];
        for (name, edit) in bad {
            let mut c = Config::new("m.gguf");
            edit(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(name), "{name}: {e}");
        }
        let mut c = Config::new("m.gguf");
        assert!(c.validate().is_ok());
        c.queue = MAX_QUEUE;
        c.request_timeout = MAX_REQUEST_TIMEOUT;
        c.ctx = Some(4);
        assert!(c.validate().is_ok());
    }
}
