//! llama-server's native routes, with its field names and semantics: `POST /completion`,
//! `POST /infill` (fill-in-the-middle with the model's FIM tokens), `GET /props` and
//! `POST /apply-template`, and the `--no-slots` / `--no-metrics` switches of `/slots`
//! and `/metrics`.
//!
//! A request is parsed into the one internal [`GenRequest`] and runs through
//! [`generate::start`], the generation path every API shares; only the wire format is
//! here. A request's `model` selects among several served models (as llama-server's
//! router does); without one, the default model answers. As llama-server does on its own routes, fields it does not know are ignored;
//! llama-server features that would change the output and that minfer does not have
//! (grammars, Mirostat, DRY, XTC, ...) are refused by name when set to anything but
//! their neutral value, so a request never silently gets a different sampler.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures_util::stream::{self, StreamExt};
use minfer_gguf::GgufFile;
use minfer_runtime::{LOGIT_BIAS_BAN, LOGIT_BIAS_MAX};
use minfer_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::generate::{self, Generation};
use crate::job::{Event, Finish, Summary, TokenLogprob};
use crate::params::{self, opt_bool, opt_f32, opt_str, GenRequest, Object};
use crate::{AppState, Config, Model, RequestLog, StreamLogged};

/// Most alternatives per token `n_probs` may ask for.
pub const MAX_N_PROBS: usize = 100;

/// The batch llama-server sizes its FIM window by: the prefix gets up to three quarters
/// of it, the suffix the rest (bounded by the slot's context here).
pub const FIM_BATCH: usize = 2048;

/// llama-server's repo name in the repo-level FIM pattern.
const FIM_REPO_NAME: &str = "myproject\n";

/// llama-server's separator of extra chunks when the model has no file-separator token.
const FIM_CHUNK_SEPARATOR: &str = "\n\n--- snippet ---\n\n";

/// The model's fill-in-the-middle tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fim {
    /// Starts the code before the hole (`<|fim_prefix|>`).
    pub pre: u32,
    /// Starts the code after the hole (`<|fim_suffix|>`).
    pub suf: u32,
    /// Asks for the middle (`<|fim_middle|>`).
    pub mid: u32,
    /// Starts the repository name of the repo-level pattern (`<|repo_name|>`).
    pub rep: Option<u32>,
    /// Starts each file of the repo-level pattern (`<|file_sep|>`).
    pub sep: Option<u32>,
}

/// Texts llama.cpp recognises for each FIM token when the GGUF names none.
const FIM_TEXTS: [(&str, &[&str]); 5] = [
    (
        "pre",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
        ],
    ),
    (
        "suf",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
        ],
    ),
    (
        "mid",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
        ],
    ),
    (
        "rep",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
    ),
    ("sep", &["<|file_sep|>", "<file_sep>"]),
];

impl Fim {
    /// The FIM tokens from `tokenizer.ggml.fim_*_token_id`, else found by their texts
    /// as llama.cpp does; why not, when the model lacks one of prefix, suffix, middle.
    pub fn find(gguf: &GgufFile, tok: &Tokenizer) -> Result<Fim, String> {
        let n_vocab = tok.n_vocab();
        let id = |name: &str, texts: &[&str]| -> Option<u32> {
            let key = format!("tokenizer.ggml.fim_{name}_token_id");
            let meta = gguf
                .get(&key)
                .and_then(|v| v.as_u64())
                .and_then(|v| u32::try_from(v).ok())
                .filter(|&v| (v as usize) < n_vocab);
            meta.or_else(|| texts.iter().find_map(|t| tok.token_id(t)))
        };
        let [pre, suf, mid, rep, sep] = FIM_TEXTS.map(|(name, texts)| id(name, texts));
        match (pre, suf, mid) {
            (Some(pre), Some(suf), Some(mid)) => Ok(Fim {
                pre,
                suf,
                mid,
                rep,
                sep,
            }),
            _ => {
                let missing: Vec<&str> = [("prefix", pre), ("suffix", suf), ("middle", mid)]
                    .iter()
                    .filter(|(_, t)| t.is_none())
                    .map(|(n, _)| *n)
                    .collect();
                Err(format!(
                    "the model has no fill-in-the-middle {} token (neither \
                     tokenizer.ggml.fim_*_token_id nor a known FIM token text); /infill needs \
                     a code model with FIM tokens, such as Qwen2.5-Coder",
                    missing.join(", ")
                ))
            }
        }
    }
}

/// Which of llama-server's monitoring endpoints are on (`--no-slots`, `--no-metrics`).
#[derive(Debug, Clone, Copy)]
pub struct Native {
    slots_endpoint: bool,
    metrics_endpoint: bool,
}

impl Native {
    /// Reads the endpoint switches from the config.
    pub fn new(config: &Config) -> Self {
        Native {
            slots_endpoint: !config.no_slots,
            metrics_endpoint: !config.no_metrics,
        }
    }
}

/// The model a native request's `model` field selects (the default without one).
/// Every native handler reaches its model through this one function, which may load
/// the model: call it off the async threads.
fn served(st: &AppState, obj: &Object) -> Result<Arc<Model>, ApiError> {
    st.model(opt_str(obj, "model")?)
}

type St = State<Arc<AppState>>;

/// llama-server's native routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/completion", post(completion))
        .route("/infill", post(infill))
        .route("/props", get(props))
        .route("/apply-template", post(apply_template))
}

/// llama-server's answer for an endpoint switched off: 501 `not_supported_error`.
fn not_supported(message: &str) -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        Json(json!({"error": {
            "code": 501, "message": message, "type": "not_supported_error",
        }})),
    )
        .into_response()
}

/// An error in llama-server's shape: `{"error": {"code", "message", "type"}}` with the
/// HTTP status as a number in `code` (OpenAI's routes carry OpenAI's string codes).
#[derive(Debug)]
pub struct LlamaError(pub ApiError);

impl From<ApiError> for LlamaError {
    fn from(e: ApiError) -> Self {
        LlamaError(e)
    }
}

/// The JSON body llama-server answers an error with, on its routes and in its streams.
fn error_body(e: &ApiError) -> Value {
    json!({"error": {
        "code": e.status.as_u16(), "message": e.message, "type": e.kind(),
    }})
}

impl IntoResponse for LlamaError {
    fn into_response(self) -> Response {
        let mut resp = (self.0.status, Json(error_body(&self.0))).into_response();
        if let Some(secs) = self.0.retry_after {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        resp
    }
}

/// `None` when `/slots` is on, else llama-server's refusal (`--no-slots`).
pub fn slots_refusal(st: &AppState) -> Option<Response> {
    (!st.native.slots_endpoint).then(|| {
        not_supported("This server does not support slots endpoint. Start it without `--no-slots`")
    })
}

/// `None` when `/metrics` is on, else llama-server's refusal (`--no-metrics`).
pub fn metrics_refusal(st: &AppState) -> Option<Response> {
    (!st.native.metrics_endpoint).then(|| {
        not_supported(
            "This server does not support metrics endpoint. Start it without `--no-metrics`",
        )
    })
}

fn wrong(field: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` must be {what}"))
}

fn out_of_range(field: &str, value: impl std::fmt::Display, range: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` is {value}: must be {range}"))
}

/// An optional field, `null` counting as absent.
fn field<'a>(obj: &'a Object, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

/// An optional integer, refusing fractions.
fn opt_int(obj: &Object, name: &str) -> Result<Option<i64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| wrong(name, "an integer")),
    }
}

/// llama-server features minfer does not have, each with its neutral value: any other
/// value is refused by name, since ignoring it would change the output.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("mirostat", "0"),
    ("dynatemp_range", "0"),
    ("typical_p", "1"),
    ("dry_multiplier", "0"),
    ("xtc_probability", "0"),
    ("n_cmpl", "1"),
    ("n_indent", "0"),
    ("t_max_predict_ms", "0"),
    ("post_sampling_probs", "false"),
    ("timings_per_token", "false"),
    ("return_progress", "false"),
    ("min_keep", "0"),
    ("lora", "[]"),
    ("samplers", "null"),
    ("response_fields", "[]"),
];

fn is_neutral(v: &Value, neutral: &str) -> bool {
    match neutral {
        "\"\"" => v.as_str() == Some(""),
        "null" => v.is_null(),
        "false" => v.as_bool() == Some(false),
        "[]" => v.as_array().is_some_and(Vec::is_empty),
        n => {
            let want: f64 = n.parse().unwrap_or(f64::NAN);
            v.as_f64() == Some(want)
        }
    }
}

fn check_unsupported(obj: &Object) -> Result<(), ApiError> {
    for &(name, neutral) in UNSUPPORTED {
        if let Some(v) = obj.get(name) {
            if !v.is_null() && !is_neutral(v, neutral) {
                return Err(ApiError::bad_request(format!(
                    "field `{name}` is not supported by this server (only {neutral} is accepted)"
                )));
            }
        }
    }
    Ok(())
}

/// A `/completion` request's options, read into the shared request plus what only the
/// native answer needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The shared generation request.
    pub g: GenRequest,
    /// Alternatives per token in `completion_probabilities` (0: none).
    pub n_probs: usize,
    /// Report the generated token ids in `tokens`.
    pub return_tokens: bool,
    /// End-of-generation tokens are banned.
    pub ignore_eos: bool,
}

/// Reads llama-server's sampling and generation options (its names and ranges).
pub fn parse_options(obj: &Object, tok: &Tokenizer) -> Result<Options, ApiError> {
    check_unsupported(obj)?;
    let mut g = GenRequest::default();
    let s = &mut g.sampling;
    if let Some(t) = opt_f32(obj, "temperature")? {
        // llama-server samples greedily at any temperature <= 0.
        if t > params::MAX_TEMPERATURE {
            return Err(out_of_range("temperature", t, "at most 100"));
        }
        s.temperature = t.max(0.0);
    }
    if let Some(k) = opt_int(obj, "top_k")? {
        s.top_k = usize::try_from(k).unwrap_or(0);
    }
    if let Some(p) = opt_f32(obj, "top_p")? {
        if p <= 0.0 || p > 1.0 {
            return Err(out_of_range("top_p", p, "in (0, 1]"));
        }
        s.top_p = p;
    }
    if let Some(p) = opt_f32(obj, "min_p")? {
        if !(0.0..=1.0).contains(&p) {
            return Err(out_of_range("min_p", p, "in [0, 1]"));
        }
        s.min_p = p;
    }
    if let Some(r) = opt_f32(obj, "repeat_penalty")? {
        let (lo, hi) = params::REPEAT_PENALTY_RANGE;
        if !(lo..=hi).contains(&r) {
            return Err(out_of_range("repeat_penalty", r, "in [0.01, 10]"));
        }
        s.repeat_penalty = r;
    }
    match opt_int(obj, "repeat_last_n")? {
        None => {}
        // -1 is "the whole context": the longest window the sampler keeps.
        Some(-1) => s.penalty_last_n = minfer_runtime::sampling::MAX_PENALTY_WINDOW,
        Some(n) if n >= 0 && n as u64 <= minfer_runtime::sampling::MAX_PENALTY_WINDOW as u64 => {
            s.penalty_last_n = n as usize
        }
        Some(n) => return Err(out_of_range("repeat_last_n", n, "-1 or in [0, 65536]")),
    }
    if let Some(p) = opt_f32(obj, "presence_penalty")? {
        s.presence_penalty = p;
    }
    if let Some(p) = opt_f32(obj, "frequency_penalty")? {
        s.frequency_penalty = p;
    }
    match field(obj, "seed") {
        None => {}
        // -1 (llama-server's default) keeps the random seed.
        Some(v) if v.as_i64() == Some(-1) => {}
        Some(v) => {
            s.seed = v
                .as_u64()
                .ok_or_else(|| wrong("seed", "-1 or a non-negative integer"))?
        }
    }
    s.logit_bias = logit_bias(obj, tok)?;
    let ignore_eos = opt_bool(obj, "ignore_eos")?.unwrap_or(false);
    if ignore_eos {
        for &id in tok.eog_ids() {
            s.logit_bias.retain(|&(t, _)| t != id);
            s.logit_bias.push((id, LOGIT_BIAS_BAN));
        }
    }
    s.validate()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    g.max_tokens = n_predict(obj)?;
    g.stop = stop(obj)?;
    g.stream = opt_bool(obj, "stream")?.unwrap_or(false);
    g.cache_prompt = opt_bool(obj, "cache_prompt")?.unwrap_or(true);
    // `grammar` (GBNF), `json_schema` and `response_format`, as on the OpenAI routes.
    g.grammar = params::output_grammar(obj)?;
    g.slot = match opt_int(obj, "id_slot")? {
        None | Some(-1) => None,
        Some(n) => Some(usize::try_from(n).map_err(|_| wrong("id_slot", "-1 or a slot id"))?),
    };
    let n_probs = match opt_int(obj, "n_probs")? {
        None => 0,
        Some(n) if (0..=MAX_N_PROBS as i64).contains(&n) => n as usize,
        Some(n) => return Err(out_of_range("n_probs", n, "in [0, 100]")),
    };
    let return_tokens = opt_bool(obj, "return_tokens")?.unwrap_or(false);
    // The token ids of a stream and of `return_tokens` come with the log-probabilities.
    if n_probs > 0 || return_tokens || g.stream {
        g.logprobs = Some(n_probs);
    }
    Ok(Options {
        g,
        n_probs,
        return_tokens,
        ignore_eos,
    })
}

/// `n_predict` (or its alias `max_tokens`): -1 is "until the context is full".
fn n_predict(obj: &Object) -> Result<Option<usize>, ApiError> {
    let name = if field(obj, "n_predict").is_some() {
        "n_predict"
    } else {
        "max_tokens"
    };
    match opt_int(obj, name).map_err(|_| wrong(name, "-1 or an integer >= 1"))? {
        None | Some(-1) => Ok(None),
        Some(0) => Err(ApiError::bad_request(format!(
            "field `{name}` is 0: evaluating a prompt without generating is not supported; \
             use -1 or an integer >= 1"
        ))),
        Some(n) if n > 0 => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        Some(n) => Err(out_of_range(name, n, "-1 or an integer >= 1")),
    }
}

fn stop(obj: &Object) -> Result<Vec<String>, ApiError> {
    let stop: Vec<String> = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| wrong("stop", "an array of strings"))?,
        Some(_) => return Err(wrong("stop", "an array of strings")),
    };
    if stop.len() > params::MAX_STOP {
        return Err(out_of_range(
            "stop",
            format!("{} strings", stop.len()),
            &format!("at most {} strings", params::MAX_STOP),
        ));
    }
    for (i, s) in stop.iter().enumerate() {
        if s.is_empty() || s.len() > params::MAX_STOP_BYTES {
            return Err(out_of_range(
                &format!("stop[{i}]"),
                format!("{} bytes long", s.len()),
                &format!("1 to {} bytes long", params::MAX_STOP_BYTES),
            ));
        }
    }
    Ok(stop)
}

/// llama-server's `logit_bias`: `[[token, bias], ...]` or `{"token": bias}`, where a
/// token is an id or a text (every token of its encoding is biased) and a bias is a
/// number in [-100, 100] or `false` (never produce it). A token named twice keeps the
/// last bias.
fn logit_bias(obj: &Object, tok: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
    let entries: Vec<(Value, &Value)> = match field(obj, "logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|e| match e.as_array().map(Vec::as_slice) {
                Some([t, b]) => Ok((t.clone(), b)),
                _ => Err(wrong("logit_bias", "an array of [token, bias] pairs")),
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, b)| {
                let t = match k.parse::<u64>() {
                    Ok(id) if k.bytes().all(|c| c.is_ascii_digit()) => json!(id),
                    _ => json!(k),
                };
                (t, b)
            })
            .collect(),
        Some(_) => return Err(wrong("logit_bias", "an array of [token, bias] pairs")),
    };
    let n_vocab = tok.n_vocab();
    let mut out: Vec<(u32, f32)> = Vec::new();
    for (i, (t, b)) in entries.into_iter().enumerate() {
        let name = format!("logit_bias[{i}]");
        let bias = match b {
            Value::Bool(false) => LOGIT_BIAS_BAN,
            v => {
                let x = v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| wrong(&name, "[token, number or false]"))?
                    as f32;
                if !(-LOGIT_BIAS_MAX..=LOGIT_BIAS_MAX).contains(&x) {
                    return Err(out_of_range(&name, x, "a bias in [-100, 100] or false"));
                }
                x
            }
        };
        let ids = match &t {
            Value::String(s) => tok.encode(s, false, false),
            v => vec![v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .filter(|&x| (x as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "field `{name}` names token {v}: must be a text or a token id below {n_vocab}"
                    ))
                })?],
        };
        for id in ids {
            out.retain(|&(x, _)| x != id);
            out.push((id, bias));
        }
    }
    Ok(out)
}

/// One prompt in llama-server's shapes: a string, token ids, both mixed
/// (`[12, "text", 34]`), or one of those in a one-element array. Strings are encoded
/// with special-token parsing; BOS is added when the prompt starts with a string and
/// the model asks for it (llama-server's rule).
pub fn prompt_tokens(v: &Value, name: &str, tok: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    mixed(v, name, tok, true, true)
}

/// `prompt_tokens` with llama-server's `tokenize_mixed` flags.
fn mixed(
    v: &Value,
    name: &str,
    tok: &Tokenizer,
    add_special: bool,
    parse_special: bool,
) -> Result<Vec<u32>, ApiError> {
    let several = || {
        ApiError::bad_request(format!(
            "field `{name}` holds several prompts: send one prompt per request"
        ))
    };
    let n_vocab = tok.n_vocab();
    let id = |x: &Value| -> Result<u32, ApiError> {
        x.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .filter(|&x| (x as usize) < n_vocab)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "field `{name}` holds token {x}: must be an id below {n_vocab}"
                ))
            })
    };
    match v {
        Value::String(s) => Ok(tok.encode(s, add_special, parse_special)),
        Value::Array(a) if a.len() == 1 && (a[0].is_array() || a[0].is_string()) => {
            mixed(&a[0], name, tok, add_special, parse_special)
        }
        Value::Array(a) if a.iter().any(Value::is_number) => {
            let mut out = Vec::new();
            for (i, x) in a.iter().enumerate() {
                match x {
                    Value::String(s) => {
                        out.extend(tok.encode(s, add_special && i == 0, parse_special))
                    }
                    x if x.is_number() => out.push(id(x)?),
                    _ => return Err(wrong(name, "a string, token ids, or both mixed")),
                }
            }
            Ok(out)
        }
        Value::Array(a) if a.is_empty() => Ok(Vec::new()),
        Value::Array(_) => Err(several()),
        Value::Object(o) => {
            if o.get("multimodal_data").is_some_and(|m| !m.is_null()) {
                return Err(ApiError::bad_request(format!(
                    "field `{name}.multimodal_data` is not supported: this server has no \
                     multimodal models"
                )));
            }
            match o.get("prompt_string") {
                Some(p) => mixed(p, name, tok, add_special, parse_special),
                None => Err(wrong(
                    name,
                    "a string, token ids, or {\"prompt_string\": ...}",
                )),
            }
        }
        _ => Err(wrong(name, "a string, token ids, or both mixed")),
    }
}

/// The `generation_settings` object of an answer (and `/props`' defaults).
fn settings_json(m: &Model, o: &Options) -> Value {
    let s = &o.g.sampling;
    let n_predict = o.g.max_tokens.map_or(-1, |m| m as i64);
    json!({
        "n_ctx": m.slot_ctx,
        "model": m.id,
        "n_predict": n_predict,
        "max_tokens": n_predict,
        "seed": s.seed,
        "temperature": s.temperature,
        "dynatemp_range": 0.0,
        "dynatemp_exponent": 1.0,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "xtc_probability": 0.0,
        "xtc_threshold": 0.1,
        "typical_p": 1.0,
        "repeat_last_n": s.penalty_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": 0.0,
        "mirostat": 0,
        "stop": o.g.stop,
        "n_keep": 0,
        "n_discard": 0,
        "ignore_eos": o.ignore_eos,
        "stream": o.g.stream,
        "logit_bias": s.logit_bias.iter().map(|&(t, b)| json!([t, b])).collect::<Vec<_>>(),
        "n_probs": o.n_probs,
        "min_keep": 0,
        "grammar": match &o.g.grammar {
            Some((minfer_runtime::Grammar::Gbnf(g), _)) => g.as_str(),
            _ => "",
        },
        "samplers": ["logit_bias", "penalties", "top_k", "top_p", "min_p", "temperature"],
        "timings_per_token": false,
        "cache_prompt": o.g.cache_prompt,
        "id_slot": o.g.slot.map_or(-1, |s| s as i64),
    })
}

/// llama-server's `timings` of a finished request.
pub fn timings(s: &Summary) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    // A rate over no time or no tokens is reported as 0, not as an infinity JSON lacks.
    let per = |num: f64, den: f64| if den > 0.0 { num / den } else { 0.0 };
    let prompt_n = s.prompt_tokens - s.cached_tokens.min(s.prompt_tokens);
    let (prompt_ms, predicted_ms) = (ms(s.prompt_time), ms(s.predicted_time));
    let predicted_n = s.completion_tokens;
    json!({
        "cache_n": s.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per(prompt_ms, prompt_n as f64),
        "prompt_per_second": per(1000.0 * prompt_n as f64, prompt_ms),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": per(predicted_ms, predicted_n as f64),
        "predicted_per_second": per(1000.0 * predicted_n as f64, predicted_ms),
    })
}

/// llama-server's `stop_type` and `stopping_word`.
fn stop_type(s: &Summary, stops: &[String]) -> (&'static str, String) {
    match (s.finish, s.stop_word) {
        (Finish::Length, _) => ("limit", String::new()),
        (Finish::Stop, Some(i)) => ("word", stops.get(i).cloned().unwrap_or_default()),
        (Finish::Stop, None) => ("eos", String::new()),
    }
}

/// `completion_probabilities`: each token with its log-probability and alternatives.
fn probabilities(lps: &[TokenLogprob]) -> Value {
    let one = |c: &crate::job::Candidate| json!({"id": c.id, "token": c.text, "bytes": c.bytes, "logprob": c.logprob});
    lps.iter()
        .map(|l| {
            let mut v = one(&l.chosen);
            v["top_logprobs"] = l.top.iter().map(one).collect();
            v
        })
        .collect()
}

/// What an answer echoes of its request.
struct Echo {
    opts: Options,
    settings: Value,
    prompt_text: String,
    model: String,
}

/// The final object of a generation (`stop: true`); a stream's has no content, tokens
/// or probabilities, which went out with its chunks.
fn final_object(e: &Echo, text: &str, lps: &[TokenLogprob], s: &Summary, streamed: bool) -> Value {
    let (ty, word) = stop_type(s, &e.opts.g.stop);
    let tokens: Vec<u32> = if e.opts.return_tokens && !streamed {
        lps.iter().map(|l| l.chosen.id).collect()
    } else {
        Vec::new()
    };
    let mut v = json!({
        "index": 0,
        "content": if streamed { "" } else { text },
        "tokens": tokens,
        "stop": true,
        "model": e.model,
        "tokens_predicted": s.completion_tokens,
        "tokens_evaluated": s.prompt_tokens,
        "generation_settings": e.settings,
        "prompt": e.prompt_text,
        "has_new_line": text.contains('\n'),
        "truncated": false,
        "stop_type": ty,
        "stopping_word": word,
        "tokens_cached": s.cached_tokens,
        "timings": timings(s),
    });
    if !streamed && e.opts.n_probs > 0 {
        v["completion_probabilities"] = probabilities(lps);
    }
    v
}

/// Runs a parsed native request: one JSON object, or server-sent events ending with the
/// final object (llama-server sends no `[DONE]` on its own routes).
async fn run(
    st: Arc<AppState>,
    m: Arc<Model>,
    prompt: Vec<u32>,
    opts: Options,
    fault: Option<crate::job::Fault>,
    mut log: RequestLog,
) -> Result<Response, ApiError> {
    let prompt_text = m.tok.decode(&prompt, true).unwrap_or_default();
    let n_prompt = prompt.len();
    let echo = Echo {
        settings: settings_json(&m, &opts),
        opts,
        prompt_text,
        model: m.id.clone(),
    };
    let mut gen = generate::start(&st, m, prompt, &echo.opts.g, fault, log.start).await?;
    if !echo.opts.g.stream {
        let (mut text, mut lps) = (String::new(), Vec::new());
        let summary = loop {
            match gen.next().await {
                // A native request has one choice (`n` is OpenAI's only).
                Event::Chunk {
                    text: t, logprobs, ..
                } => {
                    text.push_str(&t);
                    lps.extend(logprobs);
                }
                Event::Done(s) => break s,
                Event::Error(e) => return Err(e),
            }
        };
        let mut resp = Json(final_object(&echo, &text, &lps, &summary, false)).into_response();
        resp.extensions_mut().insert(summary);
        return Ok(resp);
    }
    // A failure before the first event is a plain JSON error, not a 200 stream.
    let first = gen.next().await;
    if let Event::Error(e) = first {
        return Err(e);
    }
    log.status = 200;
    log.emit_on_drop = true;
    let state = Streaming {
        gen,
        first: Some(first),
        echo,
        n_prompt,
        predicted: 0,
        has_new_line: false,
        done: false,
        log,
    };
    let body = stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let ev = match s.first.take() {
            Some(ev) => ev,
            None => s.gen.next().await,
        };
        let frame = s.frame(ev);
        Some((frame, s))
    });
    let mut resp = SseBody::new(body.map(Ok::<_, Infallible>)).into_response();
    resp.extensions_mut().insert(StreamLogged);
    Ok(resp)
}

/// A native stream in progress.
struct Streaming {
    gen: Generation,
    first: Option<Event>,
    echo: Echo,
    n_prompt: usize,
    predicted: usize,
    has_new_line: bool,
    done: bool,
    log: RequestLog,
}

impl Streaming {
    fn frame(&mut self, ev: Event) -> Sse {
        let data = |v: Value| Sse::default().data(v.to_string());
        match ev {
            Event::Chunk { text, logprobs, .. } => {
                self.predicted += logprobs.len();
                self.has_new_line |= text.contains('\n');
                let mut v = json!({
                    "index": 0,
                    "content": text,
                    "tokens": logprobs.iter().map(|l| l.chosen.id).collect::<Vec<_>>(),
                    "stop": false,
                    "tokens_predicted": self.predicted,
                    "tokens_evaluated": self.n_prompt,
                });
                if self.echo.opts.n_probs > 0 {
                    v["completion_probabilities"] = probabilities(&logprobs);
                }
                data(v)
            }
            Event::Done(s) => {
                self.done = true;
                self.log.summary = Some(s);
                let mut v = final_object(&self.echo, "", &[], &s, true);
                v["has_new_line"] = json!(self.has_new_line);
                data(v)
            }
            Event::Error(e) => {
                self.done = true;
                self.log.status = e.status.as_u16();
                data(error_body(&e))
            }
        }
    }
}

async fn completion(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: crate::body::Body,
) -> Result<Response, LlamaError> {
    let bytes = crate::body::body(b, st.body_limit)?;
    let s = Arc::clone(&st);
    let (m, prompt, opts, fault) = st
        .blocking
        .run(move || -> Result<_, ApiError> {
            let obj = params::parse_object(&bytes)?;
            let p = field(&obj, "prompt")
                .ok_or_else(|| ApiError::bad_request("field `prompt` is required"))?;
            let m = served(&s, &obj)?;
            let prompt = prompt_tokens(p, "prompt", &m.tok)?;
            let fault = p.as_str().and_then(|t| generate::fault_of(&s, t));
            let opts = parse_options(&obj, &m.tok)?;
            Ok((m, prompt, opts, fault))
        })
        .await??;
    Ok(run(st, m, prompt, opts, fault, log).await?)
}

/// One `input_extra` chunk: a file name and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraChunk {
    /// The file's name (llama-server's default is `tmp`).
    pub filename: String,
    /// The file's text.
    pub text: String,
}

/// The token layout of a fill-in-the-middle request, as llama-server's
/// `format_prompt_infill` builds it: with repo and file-separator tokens,
///
/// ```text
/// <REPO>myproject\n<SEP>{file 0}\n{text 0}...<SEP>filename\n
/// <PRE>{prefix}{prompt}<SUF>{suffix}<MID>
/// ```
///
/// (without them the extra chunks are joined by a snippet separator). The prefix keeps
/// its last `3/4 * batch` tokens, the suffix its first `batch/4 - (2 + prompt)`, and
/// the extra context keeps its last `extra_room` tokens; BOS, when the model asks for
/// it, goes between the extra context and `<PRE>`, where llama-server puts it.
#[allow(clippy::too_many_arguments)]
pub fn infill_layout(
    fim: &Fim,
    encode: impl Fn(&str) -> Vec<u32>,
    bos: Option<u32>,
    mut prefix: Vec<u32>,
    mut suffix: Vec<u32>,
    extra: &[ExtraChunk],
    prompt: &[u32],
    batch: usize,
    extra_room: usize,
) -> Vec<u32> {
    let mut extra_tokens = Vec::new();
    if let Some(rep) = fim.rep {
        extra_tokens.push(rep);
        extra_tokens.extend(encode(FIM_REPO_NAME));
    }
    for chunk in extra {
        match fim.sep {
            Some(sep) => {
                extra_tokens.push(sep);
                extra_tokens.extend(encode(&format!("{}\n", chunk.filename)));
            }
            None => extra_tokens.extend(encode(FIM_CHUNK_SEPARATOR)),
        }
        extra_tokens.extend(encode(&chunk.text));
    }
    if let Some(sep) = fim.sep {
        extra_tokens.push(sep);
        extra_tokens.extend(encode("filename\n"));
    }
    let prefix_take = prefix.len().min(3 * (batch / 4));
    let suffix_take = suffix
        .len()
        .min((batch / 4).saturating_sub(2 + prompt.len()));
    prefix.drain(..prefix.len() - prefix_take);
    suffix.truncate(suffix_take);
    let extra_take = extra_tokens.len().min(extra_room);
    let mut out = Vec::with_capacity(extra_take + prefix.len() + suffix.len() + prompt.len() + 4);
    out.extend_from_slice(&extra_tokens[extra_tokens.len() - extra_take..]);
    out.extend(bos);
    out.push(fim.pre);
    out.extend(prefix);
    out.extend_from_slice(prompt);
    out.push(fim.suf);
    out.extend(suffix);
    out.push(fim.mid);
    out
}

fn input_extra(obj: &Object) -> Result<Vec<ExtraChunk>, ApiError> {
    let Some(v) = field(obj, "input_extra") else {
        return Ok(Vec::new());
    };
    let what = "an array of {\"filename\", \"text\"} objects";
    let arr = v.as_array().ok_or_else(|| wrong("input_extra", what))?;
    arr.iter()
        .enumerate()
        .map(|(i, c)| {
            let o = c
                .as_object()
                .ok_or_else(|| wrong(&format!("input_extra[{i}]"), "an object"))?;
            let get = |k: &str, default: &str| -> Result<String, ApiError> {
                opt_str(o, k)
                    .map_err(|_| wrong(&format!("input_extra[{i}].{k}"), "a string"))
                    .map(|s| s.unwrap_or(default).to_string())
            };
            Ok(ExtraChunk {
                filename: get("filename", "tmp")?,
                text: get("text", "")?,
            })
        })
        .collect()
}

/// The prompt tokens of an `/infill` request.
fn infill_prompt(m: &Model, obj: &Object, n_predict: Option<usize>) -> Result<Vec<u32>, ApiError> {
    let fim = m
        .fim
        .as_ref()
        .map_err(|why| ApiError::bad_request(why.clone()))?;
    let part = |name: &str| -> Result<Vec<u32>, ApiError> {
        match field(obj, name) {
            None => Ok(Vec::new()),
            Some(v) => mixed(v, name, &m.tok, false, false),
        }
    };
    let (prefix, suffix) = (part("input_prefix")?, part("input_suffix")?);
    let prompt = match field(obj, "prompt") {
        None => Vec::new(),
        Some(v) => mixed(v, "prompt", &m.tok, false, false)?,
    };
    let extra = input_extra(obj)?;
    let ctx = m.slot_ctx;
    let batch = FIM_BATCH.min(ctx);
    // The extra context fills what the slot has left once the rest and the answer fit
    // (llama-server reserves a whole batch, which on a small slot leaves nothing).
    let prefix_n = prefix.len().min(3 * (batch / 4));
    let suffix_n = suffix
        .len()
        .min((batch / 4).saturating_sub(2 + prompt.len()));
    let answer = n_predict.unwrap_or(ctx / 4);
    let used = prefix_n + suffix_n + prompt.len() + 4 + answer;
    let bos = m.tok.add_bos().then(|| m.tok.bos()).flatten();
    let encode = |s: &str| m.tok.encode(s, false, false);
    Ok(infill_layout(
        fim,
        encode,
        bos,
        prefix,
        suffix,
        &extra,
        &prompt,
        batch,
        ctx.saturating_sub(used),
    ))
}

/// Whether the model has the FIM tokens `/infill` needs.
pub fn has_fim(m: &Model) -> bool {
    m.fim.is_ok()
}

/// The fill-in-the-middle prompt for `prefix` and `suffix` text (ollama's `suffix`), laid
/// out as `/infill` lays it.
pub fn fim_prompt(
    m: &Model,
    prefix: &str,
    suffix: &str,
    n_predict: Option<usize>,
) -> Result<Vec<u32>, ApiError> {
    let mut obj = Map::new();
    obj.insert("input_prefix".into(), json!(prefix));
    obj.insert("input_suffix".into(), json!(suffix));
    infill_prompt(m, &obj, n_predict)
}

async fn infill(
    State(st): St,
    Extension(log): Extension<RequestLog>,
    b: crate::body::Body,
) -> Result<Response, LlamaError> {
    let bytes = crate::body::body(b, st.body_limit)?;
    let s = Arc::clone(&st);
    let (m, prompt, opts) = st
        .blocking
        .run(move || -> Result<_, ApiError> {
            let obj = params::parse_object(&bytes)?;
            let m = served(&s, &obj)?;
            let opts = parse_options(&obj, &m.tok)?;
            let prompt = infill_prompt(&m, &obj, opts.g.max_tokens)?;
            Ok((m, prompt, opts))
        })
        .await??;
    Ok(run(st, m, prompt, opts, None, log).await?)
}

/// The default model's properties (`?model=NAME` for another's).
async fn props(
    State(st): St,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Json<Value>, LlamaError> {
    let s = Arc::clone(&st);
    let m = st
        .blocking
        .run(move || s.model(q.get("model").map(String::as_str)))
        .await??;
    let defaults = Options {
        g: GenRequest::default(),
        n_probs: 0,
        return_tokens: false,
        ignore_eos: false,
    };
    // The backends the engine runs on and the adapter in use, as `/health` reports them.
    let backends = minfer_runtime::backends::in_use();
    let adapter = backends.iter().find_map(|b| b.device.clone());
    let mut params = settings_json(&m, &defaults);
    // The default seed is drawn per request: llama-server reports it as -1 (u32::MAX).
    params["seed"] = json!(u32::MAX);
    if let Some(p) = params.as_object_mut() {
        p.remove("n_ctx");
        p.remove("model");
    }
    Ok(Json(json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": m.slot_ctx,
            "speculative": false,
            "is_processing": false,
            "params": params,
            "prompt": "",
        },
        "total_slots": m.n_slots,
        "model_path": m.path.display().to_string(),
        "model_alias": m.id,
        "n_ctx": m.slot_ctx,
        "chat_template": m.tok.chat_template().unwrap_or_default(),
        "chat_template_caps": {},
        "modalities": {"vision": false, "audio": false},
        "infill": m.fim.is_ok(),
        "build_info": format!("minfer {}", env!("CARGO_PKG_VERSION")),
        "is_sleeping": false,
        "backends": backends,
        "adapter": adapter,
    })))
}

async fn apply_template(State(st): St, b: crate::body::Body) -> Result<Response, LlamaError> {
    let bytes = crate::body::body(b, st.body_limit)?;
    let s = Arc::clone(&st);
    let out = st
        .blocking
        .run(move || -> Result<_, ApiError> {
            let obj = params::parse_object(&bytes)?;
            let m = served(&s, &obj)?;
            // Only the messages matter here; the chat route's checks apply to them.
            let mut only = Map::new();
            if let Some(m) = obj.get("messages") {
                only.insert("messages".into(), m.clone());
            }
            let (msgs, _) = params::parse_chat(&only)?;
            let rendered = m
                .template
                .render_spans(&msgs, true)
                .map_err(|e| ApiError::bad_request(format!("rendering `messages`: {e}")))?;
            Ok(json!({ "prompt": rendered.text }))
        })
        .await??;
    Ok(Json(out).into_response())
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

    const FIM: Fim = Fim {
        pre: 900,
        suf: 901,
        mid: 902,
        rep: Some(903),
        sep: Some(904),
    };

    /// One token per byte, offset so that ids never collide with the FIM tokens.
    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(|b| 1000 + b as u32).collect()
    }

    #[test]
    fn infill_tokens_are_laid_out_as_llama_server_lays_them() {
        let extra = [
            ExtraChunk {
                filename: "a.py".into(),
                text: "x=1".into(),
            },
            ExtraChunk {
                filename: "b.py".into(),
                text: "y".into(),
            },
        ];
        let got = infill_layout(
            &FIM,
            bytes,
            None,
            bytes("def f():"),
            bytes("return"),
            &extra,
            &bytes("  "),
            2048,
            usize::MAX,
        );
        let mut want = vec![903];
        want.extend(bytes("myproject\n"));
        want.push(904);
        want.extend(bytes("a.py\n"));
        want.extend(bytes("x=1"));
        want.push(904);
        want.extend(bytes("b.py\n"));
        want.extend(bytes("y"));
        want.push(904);
        want.extend(bytes("filename\n"));
        want.push(900);
        want.extend(bytes("def f():"));
        // `prompt` follows the prefix, before the suffix token (llama-server's code).
        want.extend(bytes("  "));
        want.push(901);
        want.extend(bytes("return"));
        want.push(902);
        assert_eq!(got, want);
    }

    #[test]
    fn infill_without_repo_tokens_joins_snippets_and_bos_precedes_the_prefix() {
        let fim = Fim {
            rep: None,
            sep: None,
            ..FIM
        };
        let extra = [ExtraChunk {
            filename: "ignored".into(),
            text: "ctx".into(),
        }];
        let got = infill_layout(
            &fim,
            bytes,
            Some(1),
            bytes("p"),
            bytes("s"),
            &extra,
            &[],
            2048,
            1000,
        );
        let mut want = bytes("\n\n--- snippet ---\n\n");
        want.extend(bytes("ctx"));
        want.extend([1, 900]);
        want.extend(bytes("p"));
        want.push(901);
        want.extend(bytes("s"));
        want.push(902);
        assert_eq!(got, want);
    }

    #[test]
    fn infill_keeps_the_end_of_the_prefix_and_the_start_of_the_suffix() {
        let prefix: Vec<u32> = (0..100).collect();
        let suffix: Vec<u32> = (200..300).collect();
        // batch 40: prefix keeps 30, suffix 10 - (2 + 1 prompt token) = 7.
        let got = infill_layout(&FIM, bytes, None, prefix, suffix, &[], &[500], 40, 0);
        let mut want = vec![900];
        want.extend(70..100);
        want.push(500);
        want.push(901);
        want.extend(200..207);
        want.push(902);
        // With no room for extra context, even the repo header is dropped.
        assert_eq!(got, want);
    }

    #[test]
    fn stop_types_follow_llama_server() {
        let mut s = Summary {
            choice: 0,
            finish: Finish::Stop,
            prompt_tokens: 5,
            cached_tokens: 2,
            completion_tokens: 3,
            prompt_time: std::time::Duration::from_millis(30),
            predicted_time: std::time::Duration::from_millis(60),
            stop_word: None,
        };
        let stops = vec!["a".to_string(), "END".to_string()];
        assert_eq!(stop_type(&s, &stops), ("eos", String::new()));
        s.stop_word = Some(1);
        assert_eq!(stop_type(&s, &stops), ("word", "END".to_string()));
        s.finish = Finish::Length;
        assert_eq!(stop_type(&s, &stops).0, "limit");
        let t = timings(&s);
        assert_eq!(t["cache_n"], 2);
        assert_eq!(t["prompt_n"], 3);
        assert_eq!(t["prompt_ms"], 30.0);
        assert_eq!(t["prompt_per_token_ms"], 10.0);
        assert_eq!(t["predicted_per_second"], 50.0);
        assert_eq!(t["predicted_per_token_ms"], 20.0);
        s.completion_tokens = 0;
        s.predicted_time = std::time::Duration::ZERO;
        assert_eq!(timings(&s)["predicted_per_second"], 0.0);
    }

    /// The tiny model's tokenizer (byte-level vocabulary with three control tokens).
    fn tiny_tokenizer() -> Tokenizer {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("tiny.gguf");
        let spec = minfer_models::testing::TinySpec::qwen2(minfer_gguf::GgmlType::Q8_0, 7);
        minfer_models::testing::write_tiny_model(&path, &spec).expect("tiny model");
        let file = GgufFile::open(&path).expect("opens");
        Tokenizer::from_gguf(&file).expect("tokenizer")
    }

    #[test]
    fn options_take_llama_server_s_names_and_special_values() {
        let tok = tiny_tokenizer();
        let o = parse_options(
            &obj(
                json!({"temperature": -1, "top_k": -1, "seed": -1, "repeat_last_n": -1,
                "max_tokens": 9, "stream": true, "id_slot": -1, "cache_prompt": false}),
            ),
            &tok,
        )
        .unwrap();
        assert_eq!(o.g.sampling.temperature, 0.0);
        assert_eq!(o.g.sampling.top_k, 0);
        assert_eq!(o.g.sampling.penalty_last_n, 65536);
        assert_eq!(o.g.max_tokens, Some(9));
        assert_eq!(o.g.slot, None);
        assert!(!o.g.cache_prompt);
        // A stream reports token ids, which come with the log-probabilities.
        assert_eq!(o.g.logprobs, Some(0));
        let o = parse_options(
            &obj(json!({"n_predict": -1, "seed": 7, "id_slot": 2})),
            &tok,
        )
        .unwrap();
        assert_eq!(
            (o.g.max_tokens, o.g.sampling.seed, o.g.slot),
            (None, 7, Some(2))
        );
        assert_eq!(o.g.logprobs, None);
        // Defaults are llama-server's.
        let d = parse_options(&Map::new(), &tok).unwrap();
        assert_eq!(d.g.sampling.temperature, 0.8);
        assert_eq!(d.g.sampling.top_p, 0.95);
        assert!(d.g.cache_prompt);
    }

    #[test]
    fn logit_bias_takes_arrays_objects_texts_and_false() {
        let tok = tiny_tokenizer();
        let ab = tok.encode("ab", false, false);
        assert!(!ab.is_empty());
        let o = parse_options(
            &obj(json!({"logit_bias": [[5, 1.5], [7, false], ["ab", -2], [5, 3]]})),
            &tok,
        )
        .unwrap();
        // Applied in order: the last bias of a token wins.
        let mut want = std::collections::BTreeMap::new();
        want.insert(5, 1.5);
        want.insert(7, LOGIT_BIAS_BAN);
        for &t in &ab {
            want.insert(t, -2.0);
        }
        want.insert(5, 3.0);
        let mut got = o.g.sampling.logit_bias.clone();
        got.sort_by_key(|b| b.0);
        assert_eq!(got, want.into_iter().collect::<Vec<_>>());
        let o = parse_options(&obj(json!({"logit_bias": {"5": 2, "ab": false}})), &tok).unwrap();
        assert!(o.g.sampling.logit_bias.contains(&(5, 2.0)));
        assert!(ab
            .iter()
            .all(|t| o.g.sampling.logit_bias.contains(&(*t, LOGIT_BIAS_BAN))));
        // ignore_eos bans every end-of-generation token.
        let o = parse_options(&obj(json!({"ignore_eos": true})), &tok).unwrap();
        for &id in tok.eog_ids() {
            assert!(o.g.sampling.logit_bias.contains(&(id, LOGIT_BIAS_BAN)));
        }
        for (bad, want) in [
            (json!({"logit_bias": [[5]]}), "[token, bias] pairs"),
            (json!({"logit_bias": [[5, 200]]}), "`logit_bias[0]`"),
            (json!({"logit_bias": [[999999, 1]]}), "below"),
            (json!({"logit_bias": 5}), "`logit_bias`"),
        ] {
            let e = parse_options(&obj(bad.clone()), &tok).unwrap_err();
            assert!(e.message.contains(want), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn prompts_are_strings_ids_or_both_mixed() {
        let tok = tiny_tokenizer();
        let hello = tok.encode("hello", true, true);
        assert_eq!(
            prompt_tokens(&json!("hello"), "prompt", &tok).unwrap(),
            hello
        );
        assert_eq!(
            prompt_tokens(&json!(["hello"]), "prompt", &tok).unwrap(),
            hello
        );
        assert_eq!(
            prompt_tokens(&json!([[1, 2]]), "prompt", &tok).unwrap(),
            vec![1, 2]
        );
        let mut want = vec![3];
        want.extend(tok.encode("hi", false, true));
        want.push(4);
        assert_eq!(
            prompt_tokens(&json!([3, "hi", 4]), "prompt", &tok).unwrap(),
            want
        );
        for (bad, msg) in [
            (json!(["a", "b"]), "several prompts"),
            (json!([[1], [2]]), "several prompts"),
            (json!([1, 100000]), "token 100000"),
            (
                json!({"prompt_string": "a", "multimodal_data": ["x"]}),
                "multimodal",
            ),
            (json!(true), "`prompt`"),
        ] {
            let e = prompt_tokens(&bad, "prompt", &tok).unwrap_err();
            assert!(e.message.contains(msg), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn unsupported_features_are_refused_only_off_their_neutral_value() {
        for (name, bad) in [
            ("mirostat", json!(2)),
            ("typical_p", json!(0.5)),
            ("post_sampling_probs", json!(true)),
            ("n_cmpl", json!(2)),
        ] {
            let mut o = Map::new();
            o.insert(name.into(), bad);
            let e = check_unsupported(&o).unwrap_err();
            assert!(e.message.contains(&format!("`{name}`")), "{}", e.message);
        }
        let ok = obj(
            json!({"mirostat": 0, "grammar": "root ::= \"a\"", "typical_p": 1.0,
            "post_sampling_probs": false, "lora": [], "no_such_field": 5}),
        );
        assert!(check_unsupported(&ok).is_ok());
    }
}
