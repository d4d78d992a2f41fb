//! ollama's routes: `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`,
//! `/api/version`, `/api/ps`, `GET /` (ollama's health check), and a 501 for the routes
//! that manage models.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Extension, Json, Router};
use futures_util::stream::{self, StreamExt};
use minfer_gguf::GgufFile;
use serde_json::{json, Value};

use super::facts::{capabilities, tag_name, ModelFacts};
use super::request::{prepare_chat, prepare_generate, Shape};
use super::response::{done, listing, load_answer, token_logprobs, Ndjson, OllamaError};
use crate::api::fields::{self, opt_bool, opt_str, unsupported};
use crate::error::ApiError;
use crate::generate;
use crate::job::Event;
use crate::{AppState, Model, RequestLog, StreamLogged};

/// The API version `/api/version` reports: minfer's own.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub(super) type St = State<Arc<AppState>>;

pub(super) type Res = Result<Response, OllamaError>;

/// ollama's routes.
pub fn routes() -> Router<Arc<AppState>> {
    let mut r = Router::new()
        // Clients and scripts probe `GET /` (or `HEAD /`, which `get` answers too) to
        // tell that an ollama server is up.
        .route("/", get(running))
        .route("/api/chat", post(chat))
        .route("/api/generate", post(generate))
        .route("/api/tags", get(tags))
        .route("/api/show", post(show))
        .route("/api/version", get(version))
        .route("/api/ps", get(ps));
    for path in [
        "/api/pull",
        "/api/push",
        "/api/create",
        "/api/copy",
        "/api/delete",
        "/api/blobs/{digest}",
    ] {
        r = r.route(path, any(not_supported));
    }
    r
}

/// ollama's answer at `/`: 200 and `Ollama is running` as plain text.
pub(super) async fn running() -> &'static str {
    "Ollama is running"
}

pub(super) async fn not_supported(req: axum::extract::Request) -> OllamaError {
    let path = req.uri().path();
    let why = "minfer serves the models given on its command line; manage models with \
         `minfer pull` and the model files";
    OllamaError(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!("{path} is not supported: {why}"),
    ))
}

/// The served model that `model` names (ollama requires the field): an id, file stem
/// or catalog name, with or without `:latest`, loaded if it is not. Every handler here
/// reaches its model through this one function, which may load it: call it off the
/// async threads.
pub(crate) fn served(st: &AppState, model: Option<&str>) -> Result<Arc<Model>, ApiError> {
    let name = model
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad_request("model is required"))?;
    match st.models.find(name) {
        Some(id) => st.model(Some(id)),
        None => {
            let served: Vec<String> = st.models.ids().into_iter().map(tag_name).collect();
            Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "model \"{name}\" not found: this server serves \"{}\"",
                    served.join("\", \"")
                ),
            ))
        }
    }
}

pub(super) async fn chat(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: crate::body::Body,
) -> Res {
    answer(st, log, b, Shape::Chat).await
}

pub(super) async fn generate(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: crate::body::Body,
) -> Res {
    answer(st, log, b, Shape::Generate).await
}

pub(super) async fn answer(
    st: Arc<AppState>,
    mut log: RequestLog,
    b: crate::body::Body,
    shape: Shape,
) -> Res {
    let bytes = crate::body::body(b, st.body_limit)?;
    let obj = fields::parse_object(&bytes)?;
    let s = Arc::clone(&st);
    let (m, p) = st
        .blocking
        .run(move || -> Result<_, ApiError> {
            let m = served(&s, opt_str(&obj, "model")?)?;
            let p = match shape {
                Shape::Chat => prepare_chat(&s, &m, &obj),
                Shape::Generate => prepare_generate(&s, &m, &obj),
            }?;
            Ok((m, p))
        })
        .await??;
    let model = tag_name(&m.id);
    if let Some(reason) = p.load_only {
        return Ok(load_answer(shape, &model, reason));
    }
    let prompt_ids = (shape == Shape::Generate).then(|| p.prompt.clone());
    let tools = p.g.shown_tools();
    let mut gen = generate::start(&st, m, p.prompt, &p.g, None, log.start).await?;
    let unenforced = std::mem::take(&mut gen.unenforced);
    if !p.g.stream {
        // An ollama request has one choice.
        let (text, lps, summary) = gen.collect_one().await?;
        let ids = lps.iter().map(|l| l.chosen.id);
        let context = prompt_ids.map(|mut c| {
            c.extend(ids);
            c
        });
        let a = crate::answer::split(&text, p.g.reasoning, tools);
        let mut v = done(shape, &model, &a, &summary, log.start.elapsed(), context);
        // As ollama: every token's log-probabilities gathered on the one object, the
        // field left out when there are none.
        if p.logprobs.is_some() && !lps.is_empty() {
            v["logprobs"] = token_logprobs(&lps);
        }
        let mut resp = Json(v).into_response();
        resp.extensions_mut().insert(summary);
        return Ok(generate::mark_unenforced(resp, &unenforced));
    }
    let first = gen.next().await;
    if let Event::Error(e) = first {
        return Err(e.into());
    }
    log.status = 200;
    log.emit_on_drop = true;
    let state = Ndjson {
        gen,
        first: Some(first),
        shape,
        model,
        context: prompt_ids,
        finished: false,
        log,
        splitter: crate::answer::AnswerSplitter::new(p.g.reasoning, tools),
        logprobs: p.logprobs.is_some(),
    };
    let lines = stream::unfold(state, |mut s| async move {
        loop {
            if s.finished {
                return None;
            }
            let ev = match s.first.take() {
                Some(ev) => ev,
                None => s.gen.next().await,
            };
            if let Some(line) = s.line(ev) {
                return Some((line, s));
            }
        }
    });
    let mut resp = Response::new(Body::from_stream(lines.map(Ok::<_, Infallible>)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    resp.extensions_mut().insert(StreamLogged);
    Ok(generate::mark_unenforced(resp, &unenforced))
}

/// Every served model: a loaded one as it was read at its load, the others read from
/// their files now (off the async threads: each is a file to open). A file that cannot
/// be read is left out of the list, and its next request reports why.
pub(super) async fn tags(State(st): St) -> Res {
    let s = Arc::clone(&st);
    let models = st
        .blocking
        .run(move || {
            let ids: Vec<String> = s.models.ids().into_iter().map(str::to_string).collect();
            let list: Vec<Value> = ids
                .iter()
                .filter_map(|id| match s.models.loaded(id) {
                    Some(m) => Some(listing(id, &m.facts)),
                    None => {
                        let path = s.models.path(id)?;
                        let gguf = GgufFile::open(path).ok()?;
                        Some(listing(id, &ModelFacts::new(path, &gguf)))
                    }
                })
                .collect();
            list
        })
        .await?;
    Ok(Json(json!({ "models": models })).into_response())
}

/// The loaded models: one stays loaded until another takes its place (`--max-models`),
/// whatever `keep_alive` asks.
pub(super) async fn ps(State(st): St) -> Json<Value> {
    let models: Vec<Value> = st
        .models
        .ids()
        .into_iter()
        .filter_map(|id| {
            let m = st.models.loaded(id)?;
            let mut v = listing(id, &m.facts);
            v["expires_at"] = json!("9999-12-31T23:59:59.999999999Z");
            v["size_vram"] = json!(0);
            v["context_length"] = json!(m.slot_ctx);
            Some(v)
        })
        .collect();
    Json(json!({ "models": models }))
}

pub(super) async fn version() -> Json<Value> {
    Json(json!({ "version": VERSION }))
}

pub(super) async fn show(State(st): St, b: crate::body::Body) -> Res {
    let bytes = crate::body::body(b, st.body_limit)?;
    let obj = fields::parse_object(&bytes)?;
    // Older clients send `name`.
    let name = opt_str(&obj, "model")?
        .or(opt_str(&obj, "name")?)
        .map(str::to_string);
    let s = Arc::clone(&st);
    let m = st
        .blocking
        .run(move || served(&s, name.as_deref()))
        .await??;
    if opt_bool(&obj, "verbose")? == Some(true) {
        return Err(unsupported(
            "verbose",
            "the vocabulary and merges are not listed; `model_info` shows them as null",
        )
        .into());
    }
    let f = &m.facts;
    let template = m.template.source();
    let parameters = default_parameters(&st, &m)?;
    let modelfile = format!(
        "# Modelfile of the model minfer serves\nFROM {}\nTEMPLATE \"\"\"{template}\"\"\"\n{}\n",
        f.path,
        parameters
            .lines()
            .map(|l| format!("PARAMETER {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let capabilities = capabilities(&m, template);
    Ok(Json(json!({
        "license": "",
        "modelfile": modelfile,
        "parameters": parameters,
        "template": template,
        "details": f.details(),
        "model_info": f.model_info,
        "capabilities": capabilities,
        "modified_at": f.modified_at,
    }))
    .into_response())
}

/// The sampling a `/api/chat` or `/api/generate` request that sets no option runs with,
/// as a Modelfile's `PARAMETER` lines: ollama's defaults as this server takes them, with
/// the server's own (`serve --temp ...`) over them.
fn default_parameters(st: &AppState, m: &Model) -> Result<String, ApiError> {
    let none = crate::api::fields::Object::new();
    let mut d = super::options::parse_options(&none, m.slot_ctx)?.sampling;
    st.sampling_defaults().apply(&mut d, |_| false);
    let mut lines = vec![
        format!("temperature {}", d.temperature),
        format!("top_k {}", d.top_k),
        format!("top_p {}", d.top_p),
        format!("repeat_penalty {}", d.repeat_penalty),
        format!("repeat_last_n {}", d.penalty_last_n),
    ];
    if d.min_p > 0.0 {
        lines.push(format!("min_p {}", d.min_p));
    }
    if let Some(seed) = st.sampling_defaults().seed {
        lines.push(format!("seed {seed}"));
    }
    Ok(lines.join("\n"))
}
