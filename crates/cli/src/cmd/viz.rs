//! `minfer viz`: a page that draws the compute graph and shows every node's values,
//! live while a prompt runs (server-sent events) or from a recorded `MINFER_TRACE` file.
//!
//! It lives in the command line rather than in the server crate: it serves one local
//! user, one model and one run at a time, and shares none of the server's request
//! handling (slots, queues, API codecs); only the HTTP stack (axum on tokio) is the same.
//! The page's assets are compiled into the binary, so it needs no network.
//!
//! Routes: `GET /` (the page), `GET /viz/info` (mode and model), `GET /viz/graph` (the
//! decode graph's `minfer-graph` export; a trace's first graph in static mode),
//! `GET /viz/trace` (the recorded trace, or the last live run's), `GET /viz/events`
//! (events while a run is live: `phase`, one `node` per node per step, `step`, `done`),
//! and `POST /viz/run` (`{"prompt", "n"}`: starts a greedy run; a second concurrent run
//! is refused with 409).
//!
//! The page shows prompts and outputs and starts runs, so it is guarded as `minfer serve`
//! is (`minfer_server::security`): a foreign `Host` (DNS rebinding) and a foreign `Origin`
//! are refused with 403 unless listed with `--allowed-hosts`/`--cors-origins`, and a POST
//! body must be `application/json`.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use anyhow::Context;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use minfer_runtime::{Engine, TracedStep};
use minfer_server::security::{guard, Policy};
use minfer_tokenizer::Tokenizer;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::common::{HttpPolicyArgs, ModelArgs};
use super::trace::{self, Recorder};

/// Most tokens one run from the page may generate (bounds the run's trace in memory).
pub const MAX_RUN_TOKENS: usize = 128;

const PAGE_HTML: &str = include_str!("viz/index.html");
const PAGE_JS: &str = include_str!("viz/viz.js");
const PAGE_CSS: &str = include_str!("viz/viz.css");
const DAGRE_JS: &str = include_str!("viz/vendor/dagre.min.js");

/// Arguments of `minfer viz`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Open this recorded trace (a `MINFER_TRACE` file) instead of running a model.
    #[arg(long = "trace")]
    pub trace: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long = "host", default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long = "port", default_value_t = 8081)]
    pub port: u16,
    #[command(flatten)]
    pub http: HttpPolicyArgs,
}

/// A run asked for by the page.
struct RunRequest {
    prompt: String,
    n: usize,
}

/// What the handlers share.
struct AppState {
    /// `live` or `static`.
    mode: &'static str,
    model: String,
    /// The graph `/viz/graph` serves.
    graph: Value,
    /// The trace `/viz/trace` serves: the file, or the last finished live run.
    trace: Arc<Mutex<Option<Value>>>,
    /// Live mode: where runs go, and whether one is in progress.
    runs: Option<Mutex<mpsc::Sender<RunRequest>>>,
    busy: Arc<AtomicBool>,
    /// Every event of the live run, as (event name, JSON data).
    events: broadcast::Sender<(&'static str, String)>,
}

/// Runs `minfer viz`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (events, _) = broadcast::channel(8192);
    let busy = Arc::new(AtomicBool::new(false));
    let state = match &args.trace {
        Some(path) => {
            let doc = read_trace(path)?;
            AppState {
                mode: "static",
                model: doc["model"].as_str().unwrap_or_default().to_string(),
                graph: doc["phases"]
                    .get(0)
                    .map_or(Value::Null, |p| p["graph"].clone()),
                trace: Arc::new(Mutex::new(Some(doc))),
                runs: None,
                busy,
                events,
            }
        }
        None => {
            let mut engine = args.model.load()?;
            trace::check_backends(&engine)?;
            let tok = Tokenizer::from_gguf(engine.file())?;
            let model = engine.model_name().to_string();
            let graph =
                minfer_graph::export_graph_json(&engine.preview_graph(1, 1)?, &model, "decode");
            let (tx, rx) = mpsc::channel();
            let trace = Arc::new(Mutex::new(None));
            let worker = Worker {
                events: events.clone(),
                busy: busy.clone(),
                model: model.clone(),
                done: trace.clone(),
            };
            std::thread::Builder::new()
                .name("viz-engine".into())
                .spawn(move || worker.serve(&mut engine, &tok, rx))
                .context("starting the engine thread")?;
            AppState {
                mode: "live",
                model,
                graph,
                trace,
                runs: Some(Mutex::new(tx)),
                busy,
                events,
            }
        }
    };
    serve(state, &args)
}

/// Reads and checks a trace file; every problem is an error naming the file.
fn read_trace(path: &std::path::Path) -> anyhow::Result<Value> {
    let text = std::fs::read(path).with_context(|| format!("reading trace {}", path.display()))?;
    let doc: Value = serde_json::from_slice(&text)
        .with_context(|| format!("trace {} is not valid JSON", path.display()))?;
    minfer_graph::trace::check_trace(&doc)
        .map_err(|e| anyhow::anyhow!("trace {} is not a minfer trace: {e}", path.display()))?;
    Ok(doc)
}

/// Serves the page until the process is stopped.
fn serve(state: AppState, args: &Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let state = Arc::new(state);
    let app = Router::new()
        .route("/", get(page))
        .route("/viz/viz.js", get(|| asset(PAGE_JS, "text/javascript")))
        .route("/viz/viz.css", get(|| asset(PAGE_CSS, "text/css")))
        .route(
            "/viz/dagre.min.js",
            get(|| asset(DAGRE_JS, "text/javascript")),
        )
        .route("/viz/info", get(info))
        .route("/viz/graph", get(graph))
        .route("/viz/trace", get(trace_doc))
        .route("/viz/events", get(events))
        .route("/viz/run", post(start_run))
        .with_state(state);
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        // The policy needs the bound address (its port is a name of this server).
        let policy = Policy::new(addr, &args.http.allowed_hosts, &args.http.cors_origins)
            .map_err(|e| anyhow::anyhow!("--allowed-hosts or --cors-origins: {e}"))?;
        let app = app.layer(middleware::from_fn_with_state(Arc::new(policy), guard));
        eprintln!("minfer viz: open http://{addr}/");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("serving")
    })
}

type Shared = Arc<AppState>;

async fn page() -> Response {
    asset(PAGE_HTML, "text/html; charset=utf-8").await
}

async fn asset(body: &'static str, kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

async fn info(State(s): State<Shared>) -> Json<Value> {
    Json(json!({
        "mode": s.mode,
        "model": s.model,
        "running": s.busy.load(Ordering::SeqCst),
        "max_tokens": MAX_RUN_TOKENS,
    }))
}

async fn graph(State(s): State<Shared>) -> Response {
    Json(s.graph.clone()).into_response()
}

async fn trace_doc(State(s): State<Shared>) -> Response {
    let doc = s.trace.lock().ok().and_then(|d| d.clone());
    match doc {
        Some(d) => Json(d).into_response(),
        None => error(StatusCode::NOT_FOUND, "no run has finished yet"),
    }
}

async fn events(State(s): State<Shared>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = s.events.subscribe();
    let body = stream::unfold(rx, |mut rx| async move {
        let ev = match rx.recv().await {
            Ok((name, data)) => Event::default().event(name).data(data),
            Err(broadcast::error::RecvError::Lagged(n)) => Event::default()
                .event("lagged")
                .data(json!({ "missed": n }).to_string()),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(ev), rx))
    });
    Sse::new(body).keep_alive(KeepAlive::default())
}

async fn start_run(State(s): State<Shared>, body: Option<Json<Value>>) -> Response {
    let Some(runs) = &s.runs else {
        return error(
            StatusCode::CONFLICT,
            "this page shows a recorded trace: start minfer viz without --trace to run prompts",
        );
    };
    let Some(Json(body)) = body else {
        return error(
            StatusCode::BAD_REQUEST,
            "the body must be JSON: {\"prompt\": TEXT, \"n\": TOKENS}",
        );
    };
    let Some(prompt) = body.get("prompt").and_then(Value::as_str) else {
        return error(StatusCode::BAD_REQUEST, "'prompt' must be a string");
    };
    if prompt.is_empty() {
        return error(StatusCode::BAD_REQUEST, "'prompt' is empty");
    }
    let n = match body.get("n") {
        None => 16,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_RUN_TOKENS as u64).contains(&n) => n as usize,
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("'n' must be an integer from 1 to {MAX_RUN_TOKENS}, not {v}"),
                )
            }
        },
    };
    if s.busy
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return error(
            StatusCode::CONFLICT,
            "a run is already in progress: wait for its 'done' event",
        );
    }
    let sent = runs.lock().ok().is_some_and(|tx| {
        tx.send(RunRequest {
            prompt: prompt.to_string(),
            n,
        })
        .is_ok()
    });
    if !sent {
        s.busy.store(false, Ordering::SeqCst);
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the engine thread has stopped",
        );
    }
    (
        StatusCode::ACCEPTED,
        Json(json!({ "started": true, "n": n })),
    )
        .into_response()
}

/// The engine thread: runs one request at a time, publishing its trace as events.
struct Worker {
    events: broadcast::Sender<(&'static str, String)>,
    busy: Arc<AtomicBool>,
    model: String,
    /// Where each finished run's trace document goes.
    done: Arc<Mutex<Option<Value>>>,
}

impl Worker {
    fn serve(&self, engine: &mut Engine, tok: &Tokenizer, rx: mpsc::Receiver<RunRequest>) {
        let rec = Recorder::default();
        for req in rx {
            // Attached afresh per run, so each run's trace starts with its graphs.
            rec.attach(engine);
            let r = self.run_one(engine, tok, &rec, &req);
            let (doc, end) = match r {
                Ok((doc, text, n)) => (Some(doc), json!({ "tokens": n, "text": text })),
                Err(e) => (None, json!({ "error": format!("{e:#}") })),
            };
            if let (Some(doc), Ok(mut d)) = (doc, self.done.lock()) {
                *d = Some(doc);
            }
            self.busy.store(false, Ordering::SeqCst);
            self.emit("done", &end);
        }
    }

    fn emit(&self, name: &'static str, data: &Value) {
        // No subscriber is not an error: the run's trace is still kept for /viz/trace.
        let _ = self.events.send((name, data.to_string()));
    }

    /// One greedy run of `req`: events as it goes, and its trace document at the end.
    fn run_one(
        &self,
        engine: &mut Engine,
        tok: &Tokenizer,
        rec: &Recorder,
        req: &RunRequest,
    ) -> anyhow::Result<(Value, String, usize)> {
        let prompt = tok.encode(&req.prompt, true, true);
        let n = req.n.min(engine.n_ctx().saturating_sub(prompt.len()));
        if prompt.is_empty() || n == 0 {
            anyhow::bail!(
                "the prompt is {} tokens and the context holds {}: no room to generate",
                prompt.len(),
                engine.n_ctx()
            );
        }
        self.emit(
            "run",
            &json!({ "prompt": req.prompt, "model": self.model, "n": n }),
        );
        engine.reset();
        rec.take();
        let mut logits = engine.prefill(&prompt, 0)?;
        let (mut all, mut step_tokens, mut out) = (Vec::new(), Vec::new(), Vec::new());
        let (mut phase, mut step) = (None::<usize>, 0usize);
        loop {
            let token = minfer_runtime::sampling::argmax(&logits);
            let fresh = rec.take();
            let last = fresh.len().saturating_sub(1);
            for (i, s) in fresh.into_iter().enumerate() {
                let t = (i == last).then_some(token);
                self.publish(&s, t, tok, &mut phase, &mut step);
                all.push(s);
                step_tokens.push(t);
            }
            if tok.is_eog(token) {
                break;
            }
            out.push(token);
            if out.len() == n {
                break;
            }
            engine.forward_into(&[token], prompt.len() + out.len() - 1, 1, &mut logits)?;
        }
        let text = tok.decode(&out, false).unwrap_or_default();
        let doc = trace::document(&self.model, &req.prompt, &all, &step_tokens, tok);
        Ok((doc, text, out.len()))
    }

    /// The events of one traced step: `phase` when its graph is new, one `node` per
    /// captured node, then `step` with the token taken from its logits.
    fn publish(
        &self,
        s: &TracedStep,
        token: Option<u32>,
        tok: &Tokenizer,
        phase: &mut Option<usize>,
        step: &mut usize,
    ) {
        if let Some(g) = &s.graph {
            let p = phase.map_or(0, |p| p + 1);
            *phase = Some(p);
            *step = 0;
            self.emit("phase", &json!({ "phase": p, "kind": s.kind, "graph": g }));
        }
        let p = phase.unwrap_or(0);
        for node in &s.nodes {
            let mut v = node.to_json();
            v["phase"] = json!(p);
            v["step"] = json!(*step);
            self.emit("node", &v);
        }
        let mut v = trace::step_json(s, token, tok);
        if let Some(o) = v.as_object_mut() {
            o.remove("nodes");
            o.insert("phase".into(), json!(p));
            o.insert("step".into(), json!(*step));
        }
        self.emit("step", &v);
        *step += 1;
    }
}
