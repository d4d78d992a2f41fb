//! ollama's API: `POST /api/chat` and `POST /api/generate` (NDJSON streams by default,
//! ollama's `options` names, durations in nanoseconds), `GET /api/tags`,
//! `POST /api/show`, `GET /api/version` and `GET /api/ps`. Errors are ollama's
//! `{"error": "..."}` with its status codes.
//!
//! Requests are parsed into the one internal [`GenRequest`] and run through
//! [`generate::start`], the generation path every API shares; only the wire format is
//! here. A request's `model` names one of the served models (`NAME` or `NAME:latest`);
//! `/api/tags` lists every served model and `/api/ps` the loaded ones. The routes that manage models (`pull`, `push`, `create`, `copy`, `delete`) and
//! embeddings answer 501 with the reason.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Extension, Json, Router};
use futures_util::stream::{self, StreamExt};
use minfer_gguf::{GgufFile, MetaValue};
use minfer_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::generate::{self, Generation};
use crate::job::{Event, Finish, Summary};
use crate::params::{self, opt_bool, opt_f32, opt_str, GenRequest, Object, Prompt};
use crate::{AppState, Model, RequestLog, StreamLogged};

/// The API version `/api/version` reports: minfer's own.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Metadata arrays longer than this (the vocabulary, the merges) are reported as
/// `null` in `/api/show`'s `model_info`, as ollama does without `verbose`.
pub const MAX_INFO_ARRAY: usize = 64;

/// A model as ollama's listing routes describe it, read once when it loads (or when
/// `/api/tags` lists a model that is not loaded).
#[derive(Debug, Clone)]
pub struct ModelFacts {
    path: String,
    size: u64,
    modified_at: String,
    digest: String,
    family: String,
    parameter_count: u64,
    quantization: String,
    model_info: Map<String, Value>,
}

impl ModelFacts {
    /// Reads the size, time, identity digest and metadata of the model at `path`.
    pub fn new(path: &Path, gguf: &GgufFile) -> Self {
        let meta = std::fs::metadata(path).ok();
        let modified = meta.as_ref().and_then(|m| m.modified().ok());
        let family = gguf.architecture().unwrap_or("unknown").to_string();
        let parameter_count: u64 = gguf.tensors().iter().map(|t| t.n_elements()).sum();
        let digest = minfer_runtime::digest::model_digest(gguf)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut model_info = Map::new();
        for (k, v) in gguf.metadata() {
            model_info.insert(k.clone(), meta_json(v));
        }
        model_info
            .entry("general.parameter_count")
            .or_insert(json!(parameter_count));
        let quantization = gguf
            .get("general.file_type")
            .and_then(MetaValue::as_u64)
            .map_or("unknown", file_type_name)
            .to_string();
        ModelFacts {
            path: path.display().to_string(),
            size: meta.map_or(0, |m| m.len()),
            modified_at: rfc3339(modified.unwrap_or(UNIX_EPOCH)),
            digest,
            family,
            parameter_count,
            quantization,
            model_info,
        }
    }

    fn details(&self) -> Value {
        json!({
            "parent_model": "",
            "format": "gguf",
            "family": self.family,
            "families": [self.family],
            "parameter_size": parameter_size(self.parameter_count),
            "quantization_level": self.quantization,
        })
    }
}

/// A metadata value as JSON; long arrays are `null` (see [`MAX_INFO_ARRAY`]).
fn meta_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::Array(_, items) if items.len() > MAX_INFO_ARRAY => Value::Null,
        MetaValue::Array(_, items) => items.iter().map(meta_json).collect(),
        MetaValue::String(s) => json!(s),
        MetaValue::Bool(b) => json!(b),
        MetaValue::F32(x) => json!(x),
        MetaValue::F64(x) => json!(x),
        other => other
            .as_i64()
            .map(|x| json!(x))
            .or_else(|| other.as_u64().map(|x| json!(x)))
            .unwrap_or(Value::Null),
    }
}

/// llama.cpp's `general.file_type` names, as ollama's `quantization_level` shows them.
fn file_type_name(t: u64) -> &'static str {
    match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => "unknown",
    }
}

/// ollama's `parameter_size`: `494.03M`, `7.6B`.
fn parameter_size(n: u64) -> String {
    let x = n as f64;
    if x >= 1e9 {
        format!("{:.1}B", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.2}K", x / 1e3)
    } else {
        n.to_string()
    }
}

/// A time as RFC 3339 in UTC with nanoseconds, as ollama writes `created_at`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// An error in ollama's shape: `{"error": "..."}` with the status.
#[derive(Debug)]
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let mut resp = (self.0.status, Json(json!({"error": self.0.message}))).into_response();
        if let Some(secs) = self.0.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

type St = State<Arc<AppState>>;
type Res = Result<Response, OllamaError>;

/// ollama's routes.
pub fn routes() -> Router<Arc<AppState>> {
    let mut r = Router::new()
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
        "/api/embed",
        "/api/embeddings",
    ] {
        r = r.route(path, any(not_supported));
    }
    r
}

async fn not_supported(req: axum::extract::Request) -> OllamaError {
    let path = req.uri().path();
    let why = if path.contains("embed") {
        "embeddings are not implemented"
    } else {
        "minfer serves the models given on its command line; manage models with \
         `minfer pull` and the model files"
    };
    OllamaError(ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!("{path} is not supported: {why}"),
    ))
}

/// ollama's name for the served model: `id:latest` unless the id has a tag.
fn tag_name(id: &str) -> String {
    if id.contains(':') {
        id.to_string()
    } else {
        format!("{id}:latest")
    }
}

/// The served model that `model` names (ollama requires the field): an id, file stem
/// or catalog name, with or without `:latest`, loaded if it is not. Every handler here
/// reaches its model through this one function, which may load it: call it off the
/// async threads.
fn served(st: &AppState, model: Option<&str>) -> Result<Arc<Model>, ApiError> {
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

fn wrong(field: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` must be {what}"))
}

fn unsupported(field: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` is not supported: {why}"))
}

fn field<'a>(obj: &'a Object, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

/// Options that only tune ollama's runtime (threads, GPU layers, memory mapping): they
/// do not change the answer, and minfer sets those from its own command line.
const RUNTIME_OPTIONS: &[&str] = &[
    "num_keep",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "num_thread",
    "use_mmap",
    "use_mlock",
    "numa",
    "vocab_only",
    "f16_kv",
    "logits_all",
    "penalize_newline",
    "mirostat_tau",
    "mirostat_eta",
];

/// Sampling options minfer does not have, with their neutral values; any other value is
/// refused, since ignoring it would change the output.
const UNSUPPORTED_OPTIONS: &[(&str, f64)] =
    &[("mirostat", 0.0), ("typical_p", 1.0), ("tfs_z", 1.0)];

/// The request fields common to chat and generate: `stream` (default true), `format`
/// and `think` (refused), `keep_alive` (accepted: the model stays loaded).
fn common_fields(obj: &Object) -> Result<bool, ApiError> {
    match field(obj, "format") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(_) => {
            return Err(unsupported(
                "format",
                "structured output (\"json\" or a schema) needs constrained decoding, which \
                 this server does not have yet",
            ))
        }
    }
    if opt_bool(obj, "think").map_err(|_| wrong("think", "a boolean"))? == Some(true) {
        return Err(unsupported(
            "think",
            "thinking output is not separated by this server",
        ));
    }
    match field(obj, "keep_alive") {
        None | Some(Value::String(_)) | Some(Value::Number(_)) => {}
        Some(_) => return Err(wrong("keep_alive", "a duration string or a number")),
    }
    Ok(opt_bool(obj, "stream")?.unwrap_or(true))
}

/// `options` in ollama's names and defaults (temperature 0.8, top_k 40, top_p 0.9,
/// min_p 0, repeat_penalty 1.1 over the last 64 tokens, a random seed).
pub fn parse_options(obj: &Object, slot_ctx: usize) -> Result<GenRequest, ApiError> {
    let mut g = GenRequest::default();
    {
        let s = &mut g.sampling;
        s.top_p = 0.9;
        s.min_p = 0.0;
        s.repeat_penalty = 1.1;
        s.penalty_last_n = 64;
    }
    let o = match field(obj, "options") {
        None => return Ok(g),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(wrong("options", "an object")),
    };
    let name = |k: &str| format!("options.{k}");
    let num = |k: &str| -> Result<Option<f32>, ApiError> {
        opt_f32(o, k).map_err(|e| {
            ApiError::bad_request(
                e.message
                    .replace(&format!("`{k}`"), &format!("`options.{k}`")),
            )
        })
    };
    let int = |k: &str| -> Result<Option<i64>, ApiError> {
        match o.get(k).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| wrong(&name(k), "an integer")),
        }
    };
    let range = |k: &str, v: f32, what: &str| {
        ApiError::bad_request(format!("field `options.{k}` is {v}: must be {what}"))
    };
    for (k, v) in o {
        let known = RUNTIME_OPTIONS.contains(&k.as_str())
            || UNSUPPORTED_OPTIONS.iter().any(|(n, _)| n == k)
            || [
                "num_predict",
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "repeat_penalty",
                "repeat_last_n",
                "presence_penalty",
                "frequency_penalty",
                "seed",
                "stop",
                "num_ctx",
            ]
            .contains(&k.as_str());
        if !known && !v.is_null() {
            // ollama logs unknown options and goes on; so does this server.
            eprintln!("minfer serve: ignoring unknown ollama option `{k}`");
        }
    }
    for &(k, neutral) in UNSUPPORTED_OPTIONS {
        if let Some(v) = num(k)? {
            if f64::from(v) != neutral {
                return Err(unsupported(
                    &name(k),
                    &format!("only {neutral} is accepted"),
                ));
            }
        }
    }
    let s = &mut g.sampling;
    if let Some(t) = num("temperature")? {
        if !(0.0..=params::MAX_TEMPERATURE).contains(&t) {
            return Err(range("temperature", t, "in [0, 100]"));
        }
        s.temperature = t;
    }
    if let Some(k) = int("top_k")? {
        s.top_k = usize::try_from(k).unwrap_or(0);
    }
    if let Some(p) = num("top_p")? {
        if p <= 0.0 || p > 1.0 {
            return Err(range("top_p", p, "in (0, 1]"));
        }
        s.top_p = p;
    }
    if let Some(p) = num("min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(range("min_p", p, "in [0, 1]"));
        }
        s.min_p = p;
    }
    if let Some(r) = num("repeat_penalty")? {
        let (lo, hi) = params::REPEAT_PENALTY_RANGE;
        if !(lo..=hi).contains(&r) {
            return Err(range("repeat_penalty", r, "in [0.01, 10]"));
        }
        s.repeat_penalty = r;
    }
    match int("repeat_last_n")? {
        None => {}
        // -1 is "the whole context": the longest window the sampler keeps.
        Some(-1) => s.penalty_last_n = minfer_runtime::sampling::MAX_PENALTY_WINDOW.min(slot_ctx),
        Some(n) if (0..=minfer_runtime::sampling::MAX_PENALTY_WINDOW as i64).contains(&n) => {
            s.penalty_last_n = n as usize
        }
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "field `options.repeat_last_n` is {n}: must be -1 or in [0, 65536]"
            )))
        }
    }
    if let Some(p) = num("presence_penalty")? {
        s.presence_penalty = p;
    }
    if let Some(p) = num("frequency_penalty")? {
        s.frequency_penalty = p;
    }
    match int("seed")? {
        // ollama's -1 (and no seed) is a random one.
        None | Some(-1) => {}
        Some(x) => s.seed = x as u64,
    }
    s.validate()
        .map_err(|e| ApiError::bad_request(format!("options: {e}")))?;
    g.max_tokens = match int("num_predict")? {
        // -1 is unlimited and -2 fills the context: both end at the slot's context.
        None | Some(-1) | Some(-2) => None,
        Some(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => {
            return Err(ApiError::bad_request(format!(
                "field `options.num_predict` is {n}: must be -1, -2 or an integer >= 1"
            )))
        }
    };
    if let Some(n) = int("num_ctx")? {
        if n < 1 || n as u64 > slot_ctx as u64 {
            return Err(ApiError::bad_request(format!(
                "field `options.num_ctx` is {n}: a slot of this server holds {slot_ctx} \
                 tokens (start `minfer serve` with a larger --ctx-size, or fewer --slots)"
            )));
        }
    }
    g.stop = match o.get("stop").filter(|v| !v.is_null()) {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| wrong("options.stop", "an array of strings"))?,
        Some(_) => return Err(wrong("options.stop", "an array of strings")),
    };
    if g.stop.len() > params::MAX_STOP
        || g.stop
            .iter()
            .any(|s| s.is_empty() || s.len() > params::MAX_STOP_BYTES)
    {
        return Err(ApiError::bad_request(format!(
            "field `options.stop` must hold at most {} strings of 1 to {} bytes",
            params::MAX_STOP,
            params::MAX_STOP_BYTES
        )));
    }
    Ok(g)
}

/// Refuses `images` when it holds any.
fn no_images(v: Option<&Value>, name: &str) -> Result<(), ApiError> {
    match v.filter(|v| !v.is_null()) {
        None => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => Err(unsupported(name, "this server has no multimodal models")),
    }
}

/// The messages of an `/api/chat` request.
fn messages(obj: &Object) -> Result<Vec<ChatMessage>, ApiError> {
    let arr = match field(obj, "messages") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong("messages", "an array of messages")),
    };
    arr.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |k: &str| format!("messages[{i}].{k}");
            let m = m
                .as_object()
                .ok_or_else(|| wrong(&format!("messages[{i}]"), "an object"))?;
            let role = opt_str(m, "role")
                .map_err(|_| wrong(&at("role"), "a string"))?
                .ok_or_else(|| {
                    ApiError::bad_request(format!("field `{}` is required", at("role")))
                })?;
            match role {
                "system" | "user" | "assistant" => {}
                "tool" => return Err(unsupported(&at("role"), "tool calls are not implemented")),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "field `{}` is `{other}`: expected system, user or assistant",
                        at("role")
                    )))
                }
            }
            no_images(m.get("images"), &at("images"))?;
            if m.get("tool_calls")
                .is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty()) && !t.is_null())
            {
                return Err(unsupported(
                    &at("tool_calls"),
                    "tool calls are not implemented",
                ));
            }
            let content = opt_str(m, "content")
                .map_err(|_| wrong(&at("content"), "a string"))?
                .unwrap_or("");
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// Which of the two shapes an answer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Chat,
    Generate,
}

/// A parsed request, ready to run.
struct Prepared {
    prompt: Vec<u32>,
    g: GenRequest,
    /// ollama answers a request without prompt or messages by loading the model.
    load_only: bool,
}

fn prepare_chat(st: &AppState, m: &Model, obj: &Object) -> Result<Prepared, ApiError> {
    match field(obj, "tools") {
        None => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(_) => return Err(unsupported("tools", "tool calls are not implemented")),
    }
    let mut g = parse_options(obj, m.slot_ctx)?;
    g.stream = common_fields(obj)?;
    let msgs = messages(obj)?;
    if msgs.is_empty() {
        return Ok(Prepared {
            prompt: Vec::new(),
            g,
            load_only: true,
        });
    }
    let (prompt, _) = generate::chat_prompt(st, m, &msgs)?;
    Ok(Prepared {
        prompt,
        g,
        load_only: false,
    })
}

fn prepare_generate(st: &AppState, m: &Model, obj: &Object) -> Result<Prepared, ApiError> {
    let mut g = parse_options(obj, m.slot_ctx)?;
    g.stream = common_fields(obj)?;
    no_images(obj.get("images"), "images")?;
    if opt_str(obj, "template")?.is_some_and(|t| !t.is_empty()) {
        return Err(unsupported(
            "template",
            "ollama's Go templates are not rendered; the model's own chat template is used \
             (or send `raw: true` with a prompt formatted by the client)",
        ));
    }
    let prompt = opt_str(obj, "prompt")?.unwrap_or("");
    let suffix = opt_str(obj, "suffix")?.unwrap_or("");
    let system = opt_str(obj, "system")?;
    let raw = opt_bool(obj, "raw")?.unwrap_or(false);
    let context = match field(obj, "context") {
        None => Vec::new(),
        Some(v) => {
            let ids = params::token_list(v, "context")?;
            let n = m.tok.n_vocab();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= n) {
                return Err(ApiError::bad_request(format!(
                    "field `context` holds token {bad}, outside the vocabulary of {n}"
                )));
            }
            ids
        }
    };
    // The `context` of the final answer needs the generated ids, which come with the
    // log-probabilities.
    g.logprobs = Some(0);
    if prompt.is_empty() && suffix.is_empty() && context.is_empty() {
        return Ok(Prepared {
            prompt: Vec::new(),
            g,
            load_only: true,
        });
    }
    let tokens = if !suffix.is_empty() {
        crate::llama_api::fim_prompt(m, prompt, suffix, g.max_tokens)
            .map_err(|e| ApiError::bad_request(format!("field `suffix`: {}", e.message)))?
    } else if raw {
        generate::completion_prompt(st, m, Prompt::Text(prompt.to_string()))?.0
    } else {
        let mut msgs = Vec::new();
        if let Some(sys) = system.filter(|s| !s.is_empty()) {
            msgs.push(ChatMessage::new("system", sys));
        }
        msgs.push(ChatMessage::new("user", prompt));
        generate::chat_prompt(st, m, &msgs)?.0
    };
    let mut all = context;
    all.extend(tokens);
    Ok(Prepared {
        prompt: all,
        g,
        load_only: false,
    })
}

/// The fields every answer object starts with.
fn head(model: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("model".into(), json!(model));
    m.insert("created_at".into(), json!(rfc3339(SystemTime::now())));
    m
}

fn piece(shape: Shape, model: &str, text: &str) -> Value {
    let mut m = head(model);
    match shape {
        Shape::Chat => m.insert(
            "message".into(),
            json!({"role": "assistant", "content": text}),
        ),
        Shape::Generate => m.insert("response".into(), json!(text)),
    };
    m.insert("done".into(), json!(false));
    Value::Object(m)
}

/// The last object: `done`, `done_reason` and the counts and durations (nanoseconds).
fn done(
    shape: Shape,
    model: &str,
    text: &str,
    s: &Summary,
    total: Duration,
    context: Option<Vec<u32>>,
) -> Value {
    let Value::Object(mut m) = piece(shape, model, text) else {
        unreachable!("piece builds an object")
    };
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    m.insert("done".into(), json!(true));
    let reason = match s.finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
    };
    m.insert("done_reason".into(), json!(reason));
    if let Some(c) = context {
        m.insert("context".into(), json!(c));
    }
    m.insert("total_duration".into(), json!(ns(total)));
    m.insert("load_duration".into(), json!(0));
    m.insert("prompt_eval_count".into(), json!(s.prompt_tokens));
    m.insert("prompt_eval_duration".into(), json!(ns(s.prompt_time)));
    m.insert("eval_count".into(), json!(s.completion_tokens));
    m.insert("eval_duration".into(), json!(ns(s.predicted_time)));
    Value::Object(m)
}

/// The answer to a request with no prompt: the model is loaded (it always is).
fn load_answer(shape: Shape, model: &str) -> Response {
    let mut m = head(model);
    match shape {
        Shape::Chat => m.insert(
            "message".into(),
            json!({"role": "assistant", "content": ""}),
        ),
        Shape::Generate => m.insert("response".into(), json!("")),
    };
    m.insert("done".into(), json!(true));
    m.insert("done_reason".into(), json!("load"));
    Json(Value::Object(m)).into_response()
}

async fn chat(State(st): St, Extension(log): Extension<RequestLog>, b: crate::body::Body) -> Res {
    answer(st, log, b, Shape::Chat).await
}

async fn generate(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: crate::body::Body,
) -> Res {
    answer(st, log, b, Shape::Generate).await
}

async fn answer(st: Arc<AppState>, mut log: RequestLog, b: crate::body::Body, shape: Shape) -> Res {
    let bytes = crate::body::body(b, st.body_limit)?;
    let obj = params::parse_object(&bytes)?;
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
    if p.load_only {
        return Ok(load_answer(shape, &model));
    }
    let prompt_ids = (shape == Shape::Generate).then(|| p.prompt.clone());
    let mut gen = generate::start(&st, m, p.prompt, &p.g, None, log.start).await?;
    if !p.g.stream {
        let (mut text, mut ids) = (String::new(), Vec::new());
        let summary = loop {
            match gen.next().await {
                // An ollama request has one choice.
                Event::Chunk {
                    text: t, logprobs, ..
                } => {
                    text.push_str(&t);
                    ids.extend(logprobs.iter().map(|l| l.chosen.id));
                }
                Event::Done(s) => break s,
                Event::Error(e) => return Err(e.into()),
            }
        };
        let context = prompt_ids.map(|mut c| {
            c.extend(ids);
            c
        });
        let v = done(shape, &model, &text, &summary, log.start.elapsed(), context);
        let mut resp = Json(v).into_response();
        resp.extensions_mut().insert(summary);
        return Ok(resp);
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
    Ok(resp)
}

/// An NDJSON stream in progress.
struct Ndjson {
    gen: Generation,
    first: Option<Event>,
    shape: Shape,
    model: String,
    /// The prompt ids, then the generated ones (generate's final `context`).
    context: Option<Vec<u32>>,
    finished: bool,
    log: RequestLog,
}

impl Ndjson {
    /// The line an event becomes; `None` for a chunk without text.
    fn line(&mut self, ev: Event) -> Option<Bytes> {
        let v = match ev {
            Event::Chunk { text, logprobs, .. } => {
                if let Some(c) = self.context.as_mut() {
                    c.extend(logprobs.iter().map(|l| l.chosen.id));
                }
                if text.is_empty() {
                    return None;
                }
                piece(self.shape, &self.model, &text)
            }
            Event::Done(s) => {
                self.finished = true;
                self.log.summary = Some(s);
                let total = self.log.start.elapsed();
                done(self.shape, &self.model, "", &s, total, self.context.take())
            }
            Event::Error(e) => {
                self.finished = true;
                self.log.status = e.status.as_u16();
                json!({"error": e.message})
            }
        };
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        Some(Bytes::from(line))
    }
}

fn listing(id: &str, f: &ModelFacts) -> Value {
    let name = tag_name(id);
    json!({
        "name": name,
        "model": name,
        "modified_at": f.modified_at,
        "size": f.size,
        "digest": f.digest,
        "details": f.details(),
    })
}

/// Every served model: a loaded one as it was read at its load, the others read from
/// their files now (off the async threads: each is a file to open). A file that cannot
/// be read is left out of the list, and its next request reports why.
async fn tags(State(st): St) -> Res {
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
async fn ps(State(st): St) -> Json<Value> {
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

async fn version() -> Json<Value> {
    Json(json!({ "version": VERSION }))
}

async fn show(State(st): St, b: crate::body::Body) -> Res {
    let bytes = crate::body::body(b, st.body_limit)?;
    let obj = params::parse_object(&bytes)?;
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
    let template = m.tok.chat_template().unwrap_or_default();
    let parameters = "temperature 0.8\ntop_k 40\ntop_p 0.9\nrepeat_penalty 1.1\nrepeat_last_n 64";
    let modelfile = format!(
        "# Modelfile of the model minfer serves\nFROM {}\nTEMPLATE \"\"\"{template}\"\"\"\n{}\n",
        f.path,
        parameters
            .lines()
            .map(|l| format!("PARAMETER {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mut capabilities = vec!["completion"];
    if crate::llama_api::has_fim(&m) {
        capabilities.push("insert");
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Object {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn times_are_rfc3339_utc_with_nanoseconds() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let t = UNIX_EPOCH + Duration::new(1_709_251_199, 5);
        assert_eq!(rfc3339(t), "2024-02-29T23:59:59.000000005Z");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000000000Z");
    }

    #[test]
    fn sizes_and_quantizations_read_as_ollama_shows_them() {
        assert_eq!(parameter_size(494_032_768), "494.03M");
        assert_eq!(parameter_size(7_615_616_512), "7.6B");
        assert_eq!(file_type_name(15), "Q4_K_M");
        assert_eq!(file_type_name(7), "Q8_0");
        assert_eq!(file_type_name(999), "unknown");
        assert_eq!(tag_name("qwen"), "qwen:latest");
        assert_eq!(tag_name("qwen:0.5b"), "qwen:0.5b");
    }

    #[test]
    fn options_use_ollama_names_and_defaults() {
        let g = parse_options(&obj(json!({})), 512).unwrap();
        assert_eq!(g.sampling.top_p, 0.9);
        assert_eq!(g.sampling.repeat_penalty, 1.1);
        assert_eq!(g.max_tokens, None);
        let g = parse_options(
            &obj(
                json!({"options": {"num_predict": 7, "temperature": 0, "top_k": 5,
                "seed": 42, "stop": ["\n"], "num_ctx": 512, "num_thread": 4,
                "repeat_last_n": 0}}),
            ),
            512,
        )
        .unwrap();
        assert_eq!(g.max_tokens, Some(7));
        assert_eq!(g.sampling.temperature, 0.0);
        assert_eq!(g.sampling.top_k, 5);
        assert_eq!(g.sampling.seed, 42);
        assert_eq!(g.sampling.penalty_last_n, 0);
        assert_eq!(g.stop, vec!["\n"]);
        let g = parse_options(&obj(json!({"options": {"num_predict": -2}})), 512).unwrap();
        assert_eq!(g.max_tokens, None);
    }

    #[test]
    fn bad_options_are_refused_by_name() {
        for (opts, want) in [
            (json!({"num_ctx": 4096}), "`options.num_ctx` is 4096"),
            (json!({"num_predict": 0}), "`options.num_predict`"),
            (json!({"temperature": "hot"}), "`options.temperature`"),
            (json!({"top_p": 0}), "`options.top_p`"),
            (json!({"mirostat": 2}), "`options.mirostat`"),
            (json!({"stop": [1]}), "`options.stop`"),
        ] {
            let e = parse_options(&obj(json!({ "options": opts })), 512).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(want), "{opts}: {}", e.message);
        }
        let e = common_fields(&obj(json!({"format": "json"}))).unwrap_err();
        assert!(e.message.contains("`format`"), "{}", e.message);
        let e = common_fields(&obj(json!({"format": {"type": "object"}}))).unwrap_err();
        assert!(e.message.contains("`format`"), "{}", e.message);
        assert!(common_fields(&obj(json!({"keep_alive": "5m"}))).unwrap());
        assert!(!common_fields(&obj(json!({"stream": false}))).unwrap());
    }

    #[test]
    fn chat_messages_refuse_images_and_tools() {
        let e = messages(&obj(json!({"messages": [
            {"role": "user", "content": "x", "images": ["aGk="]}]})))
        .unwrap_err();
        assert!(e.message.contains("`messages[0].images`"), "{}", e.message);
        let e = messages(&obj(
            json!({"messages": [{"role": "tool", "content": "x"}]}),
        ))
        .unwrap_err();
        assert!(e.message.contains("tool"), "{}", e.message);
        let m = messages(&obj(json!({"messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": "u", "images": []}]})))
        .unwrap();
        assert_eq!(m[1], ChatMessage::new("user", "u"));
    }

    #[test]
    fn errors_have_ollama_s_shape() {
        let r = OllamaError(ApiError::new(
            StatusCode::NOT_FOUND,
            "model \"x\" not found",
        ))
        .into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
    }
}
