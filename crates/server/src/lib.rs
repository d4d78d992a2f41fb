//! minfer's OpenAI-compatible HTTP server.
//!
//! One inference thread owns a `MultiEngine` with `slots` sequences; HTTP handlers
//! (axum on tokio) queue jobs to it through a bounded queue and receive tokens through a
//! bounded channel per request. Endpoints: `POST /v1/chat/completions`,
//! `POST /v1/completions`, `GET /v1/models`, `POST /tokenize`, `POST /detokenize`,
//! `GET /health`, `GET /slots`, `GET /metrics`.
//!
//! Sampling defaults follow llama-server: temperature 0.8, top_k 40, top_p 0.95,
//! min_p 0.05, no penalties, a random seed, and `max_tokens` filling the slot's context.

pub mod error;
pub mod job;
pub mod metrics;
pub mod openai;
pub mod params;
mod routes;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use minfer_runtime::{EngineOptions, MultiEngine};
use minfer_tokenizer::{ChatTemplate, Tokenizer};

pub use error::ApiError;
use worker::{Summary, WorkerHandle};

/// Everything `serve` needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The GGUF model file.
    pub model: PathBuf,
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
    /// Backend fence (`--backend`).
    pub backend: Option<String>,
    /// Bearer key every request but `/health` must present, when set.
    pub api_key: Option<String>,
    /// Requests that may wait for a slot before new ones get 503.
    pub queue: usize,
    /// Largest request body in bytes (larger ones get 413).
    pub body_limit: usize,
    /// Longest a request may take from arrival to its last token (then 504).
    pub request_timeout: Duration,
    /// Parse special-token text (`<|im_end|>`) inside chat message content as control
    /// tokens, as before content was isolated; off by default, since it lets a user
    /// forge turns of the conversation.
    pub allow_special_in_content: bool,
    /// Makes a prompt containing `openai::PANIC_MARKER` panic inside inference (or
    /// `openai::SLOW_MARKER` decode slowly), to test that a panic becomes a 500 and the
    /// worker keeps serving, and to hold a slot busy. Never on in the CLI.
    pub fault_injection: bool,
}

impl Config {
    /// Defaults for `model`: 127.0.0.1:8080, 4 slots, a queue of 64, 1 MiB bodies,
    /// a 10-minute request timeout, no key.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        Config {
            model: model.into(),
            host: "127.0.0.1".into(),
            port: 8080,
            slots: 4,
            ctx: None,
            threads: None,
            backend: None,
            api_key: None,
            queue: 64,
            body_limit: 1 << 20,
            request_timeout: Duration::from_secs(600),
            allow_special_in_content: false,
            fault_injection: false,
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
        if let Some(c) = self.ctx {
            // Every slot needs at least one position.
            range("context size (-c)", c, self.slots, MAX_CTX)?;
        }
        if let Some(t) = self.threads {
            range("threads (-t)", t, 1, MAX_THREADS)?;
        }
        range("queue (--queue)", self.queue, 1, MAX_QUEUE)?;
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
        Ok(())
    }
}

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
    worker: WorkerHandle,
    tok: Arc<Tokenizer>,
    template: ChatTemplate,
    slot_ctx: usize,
    n_slots: usize,
    model_id: String,
    api_key: Option<String>,
    timeout: Duration,
    allow_special_in_content: bool,
    fault_injection: bool,
    body_limit: usize,
    created: u64,
    ids: AtomicU64,
}

impl AppState {
    fn next_id(&self, kind: openai::Kind) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let prefix = match kind {
            openai::Kind::Chat => "chatcmpl",
            openai::Kind::Text => "cmpl",
        };
        format!("{prefix}-{:x}{n:06x}", self.created)
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
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// The bound address (the real port when the config asked for 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (Ctrl-C when started by `serve`).
    pub fn wait(mut self) -> Result<(), ServerError> {
        self.join()
    }

    fn join(&mut self) -> Result<(), ServerError> {
        let mut result = Ok(());
        if let Some(h) = self.http.take() {
            result = h
                .join()
                .unwrap_or_else(|_| Err(ServerError::Load("the HTTP thread panicked".into())));
        }
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        result
    }

    /// Stops accepting requests, lets open ones finish, and waits for both threads.
    pub fn stop(mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.join()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = self.join();
    }
}

/// Loads the model once, binds `host:port` and serves on background threads.
pub fn start(config: Config) -> Result<Running, ServerError> {
    start_inner(config, false)
}

/// Runs the server in the foreground until Ctrl-C, printing the address it listens on.
pub fn serve(config: Config) -> Result<(), ServerError> {
    let running = start_inner(config, true)?;
    eprintln!("minfer serve: listening on http://{}", running.addr());
    running.wait()
}

fn start_inner(config: Config, until_ctrl_c: bool) -> Result<Running, ServerError> {
    config.validate()?;
    let mut opts = EngineOptions::default();
    if let Some(t) = config.threads {
        opts.n_threads = t;
    }
    opts.n_ctx = config.ctx;
    opts.backend = config.backend.clone();
    let (path, n_slots) = (config.model.clone(), config.slots);
    let load = move || MultiEngine::load(&path, &opts, n_slots);
    let (worker, loaded, worker_thread) =
        worker::spawn(load, config.queue).map_err(ServerError::Load)?;
    let template = ChatTemplate::from_tokenizer(&loaded.tokenizer)?;
    let model_id = config
        .model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .or(loaded.name)
        .unwrap_or_else(|| "minfer".into());
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
    let state = Arc::new(AppState {
        worker,
        tok: loaded.tokenizer,
        template,
        slot_ctx: loaded.slot_ctx,
        n_slots: config.slots,
        model_id,
        api_key: config.api_key.clone(),
        timeout: config.request_timeout,
        allow_special_in_content: config.allow_special_in_content,
        fault_injection: config.fault_injection,
        body_limit: config.body_limit,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        ids: AtomicU64::new(0),
    });
    let app = routes::router(state);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let http = std::thread::Builder::new()
        .name("minfer-http".into())
        .spawn(move || -> Result<(), ServerError> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(io("starting the async runtime"))?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)
                    .map_err(io("registering the socket"))?;
                let stop = async move {
                    if until_ctrl_c {
                        tokio::select! {
                            _ = rx => {}
                            _ = tokio::signal::ctrl_c() => {}
                        }
                    } else {
                        let _ = rx.await;
                    }
                };
                axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await
                    .map_err(io("serving"))
            })
        })
        .map_err(io("starting the HTTP thread"))?;
    Ok(Running {
        addr,
        shutdown: Some(tx),
        http: Some(http),
        worker: Some(worker_thread),
    })
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
