//! Request bodies read field by field, so that a wrong type or a value outside its
//! range is refused with a 400 that names the field and the range. Sampling defaults are
//! llama-server's: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, no penalties, a
//! random seed.
//!
//! Every field a request may carry is on an accept list ([`CHAT_FIELDS`],
//! [`COMPLETION_FIELDS`]); any other field that is not `null` is refused by name, so a
//! typo (`temprature`) or a feature this server does not have (`functions`, `echo`) is
//! an error instead of a silent no-op. A few fields
//! are accepted without effect by design ([`NO_EFFECT_FIELDS`]): they carry client
//! metadata that changes nothing in OpenAI's own answer either.

use minfer_runtime::{Grammar, SamplerError, SamplingParams, LOGIT_BIAS_MAX};
use minfer_tokenizer::{ChatMessage, ToolCall};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::tools::{self, ToolSpec};

/// A JSON object body.
pub type Object = Map<String, Value>;

/// Parses a request body that must be a JSON object.
pub fn parse_object(body: &[u8]) -> Result<Object, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request("request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("invalid JSON body: {e}"))),
    }
}

fn wrong(field: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` must be {what}"))
}

/// A value outside the field's stated range.
fn out_of_range(field: &str, value: impl std::fmt::Display, range: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` is {value}: must be {range}"))
}

/// A field this server does not implement.
fn unsupported(field: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("field `{field}` is not supported: {why}"))
}

/// An optional field, `null` counting as absent.
fn field<'a>(obj: &'a Object, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

/// An optional finite number (kept finite as an `f32`).
pub fn opt_f32(obj: &Object, name: &str) -> Result<Option<f32>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() && (x as f32).is_finite() => Ok(Some(x as f32)),
            // Beyond f32's range the value would become an infinity in the sampler.
            Some(x) if x.is_finite() => Err(out_of_range(name, x, "a 32-bit float")),
            _ => Err(wrong(name, "a number")),
        },
    }
}

/// An optional number inside `[lo, hi]`; `range` states the interval in the error.
fn opt_f32_in(
    obj: &Object,
    name: &str,
    lo: f32,
    hi: f32,
    range: &str,
) -> Result<Option<f32>, ApiError> {
    match opt_f32(obj, name)? {
        Some(v) if !(lo..=hi).contains(&v) => Err(out_of_range(name, v, range)),
        v => Ok(v),
    }
}

/// An optional non-negative integer.
pub fn opt_usize(obj: &Object, name: &str) -> Result<Option<usize>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|x| usize::try_from(x).ok())
            .map(Some)
            .ok_or_else(|| wrong(name, "a non-negative integer")),
    }
}

/// An optional integer (signed), refusing fractions and values past 64 bits.
fn opt_i64(obj: &Object, name: &str) -> Result<Option<i64>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| wrong(name, "an integer")),
    }
}

/// An optional boolean.
pub fn opt_bool(obj: &Object, name: &str) -> Result<Option<bool>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .ok_or_else(|| wrong(name, "a boolean")),
    }
}

/// An optional string.
pub fn opt_str<'a>(obj: &'a Object, name: &str) -> Result<Option<&'a str>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| wrong(name, "a string")),
    }
}

/// A list of token ids (each below 2^32).
pub fn token_list(v: &Value, name: &str) -> Result<Vec<u32>, ApiError> {
    let arr = v
        .as_array()
        .ok_or_else(|| wrong(name, "an array of token ids"))?;
    arr.iter()
        .map(|t| {
            t.as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| wrong(name, "an array of token ids"))
        })
        .collect()
}

/// Generation settings shared by chat and text completions.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Sampler chain parameters.
    pub sampling: SamplingParams,
    /// Most tokens to generate; `None` fills the slot's context.
    pub max_tokens: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream as server-sent events.
    pub stream: bool,
    /// Send a usage chunk before `[DONE]` when streaming.
    pub include_usage: bool,
    /// Report log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    /// Choices to generate from the prompt (`n`), 1 to [`MAX_CHOICES`]; the model's slot
    /// count bounds it further when the request is admitted.
    pub n: usize,
    /// The `model` the request names, if any (selects among several served models).
    pub model: Option<String>,
    /// Reuse the longest prompt prefix a slot holds (llama-server's `cache_prompt`).
    pub cache_prompt: bool,
    /// The slot to run in (llama-server's `id_slot`); `None` picks the best free one.
    pub slot: Option<usize>,
    /// The grammar the output must follow, and the request field that gave it (named
    /// when it does not compile).
    pub grammar: Option<(Grammar, &'static str)>,
    /// The tools the model may call.
    pub tools: Option<ToolSpec>,
}

impl Default for GenRequest {
    /// llama-server's sampling defaults with a fresh random seed, one choice, no stop
    /// strings, no streaming, the slot's context as the limit, prefix reuse on, any
    /// slot, the default model: what a codec starts from.
    fn default() -> Self {
        GenRequest {
            sampling: SamplingParams {
                seed: random_seed(),
                ..SamplingParams::default()
            },
            max_tokens: None,
            stop: Vec::new(),
            stream: false,
            include_usage: false,
            logprobs: None,
            n: 1,
            model: None,
            cache_prompt: true,
            slot: None,
            grammar: None,
            tools: None,
        }
    }
}

/// Most alternatives per token that `top_logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Highest `temperature` accepted; far above it the distribution is already uniform.
pub const MAX_TEMPERATURE: f32 = 100.0;

/// Magnitude bound of `presence_penalty` and `frequency_penalty` (OpenAI's range).
pub const MAX_PENALTY: f32 = 2.0;

/// Range of `repeat_penalty`: it divides logits, so it must stay away from zero.
pub const REPEAT_PENALTY_RANGE: (f32, f32) = (0.01, 10.0);

/// Most stop strings per request (OpenAI's limit: "up to 4 sequences").
pub const MAX_STOP: usize = 4;

/// Most choices a request may ask for (OpenAI's bound on `n`); a model serves at most
/// as many as it has slots.
pub const MAX_CHOICES: usize = 128;

/// Longest stop string, in bytes (the scanner holds back up to this much text).
pub const MAX_STOP_BYTES: usize = 256;

/// Fields of a chat completion request.
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "model",
    "max_completion_tokens",
    "max_tokens",
    "n_predict",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "seed",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "n",
    "stop",
    "stream",
    "stream_options",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "grammar",
    "json_schema",
    "cache_prompt",
    "user",
    "metadata",
    "store",
];

/// Fields of a text completion request.
pub const COMPLETION_FIELDS: &[&str] = &[
    "prompt",
    "model",
    "max_tokens",
    "n_predict",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "seed",
    "logit_bias",
    "logprobs",
    "n",
    "best_of",
    "echo",
    "suffix",
    "stop",
    "stream",
    "stream_options",
    "response_format",
    "grammar",
    "json_schema",
    "cache_prompt",
    "user",
    "metadata",
    "store",
];

/// Fields accepted without effect on the answer: `user`, `metadata` and `store` (client
/// bookkeeping; nothing is stored). `model` selects the model when several are served,
/// and is otherwise only reported back.
pub const NO_EFFECT_FIELDS: &[&str] = &["user", "metadata", "store"];

/// Fields of a `/tokenize` request (llama-server's).
pub const TOKENIZE_FIELDS: &[&str] = &[
    "content",
    "add_special",
    "parse_special",
    "with_pieces",
    "model",
];

/// Fields of a `/detokenize` request.
pub const DETOKENIZE_FIELDS: &[&str] = &["tokens", "model"];

/// Refuses any non-null field of a request body missing from `known`, naming it.
pub fn check_fields(obj: &Object, known: &[&str]) -> Result<(), ApiError> {
    only_known(obj, known, "")
}

/// Fields of one chat message (`tool_call_id` only on `tool` messages, where it is
/// checked against the calls before it; `tool_calls` only on assistant messages).
const MESSAGE_FIELDS: &[&str] = &["role", "content", "tool_call_id", "tool_calls"];

/// Refuses every non-null field of `obj` missing from `known`, naming it (`prefix`
/// places it, e.g. `messages[2].`).
fn only_known(obj: &Object, known: &[&str], prefix: &str) -> Result<(), ApiError> {
    for (k, v) in obj {
        if !v.is_null() && !known.contains(&k.as_str()) {
            return Err(ApiError::bad_request(format!(
                "field `{prefix}{k}` is not supported by this server"
            )));
        }
    }
    Ok(())
}

/// Type checks of the fields accepted without effect.
fn check_no_effect(obj: &Object) -> Result<(), ApiError> {
    opt_str(obj, "model")?;
    opt_str(obj, "user")?;
    opt_bool(obj, "store")?;
    if let Some(m) = field(obj, "metadata") {
        if !m.is_object() {
            return Err(wrong("metadata", "an object"));
        }
    }
    Ok(())
}

/// The output grammar a request asks for: OpenAI's `response_format` (`text`,
/// `json_object`, `json_schema` with its `schema` and `strict`), or llama-server's
/// `json_schema` (a schema) and `grammar` (GBNF); at most one of them.
pub fn output_grammar(obj: &Object) -> Result<Option<(Grammar, &'static str)>, ApiError> {
    let mut found: Vec<(Grammar, &'static str)> = Vec::new();
    if let Some(rf) = field(obj, "response_format") {
        let o = rf
            .as_object()
            .ok_or_else(|| wrong("response_format", "an object with a string `type`"))?;
        only_known(o, &["type", "json_schema"], "response_format.")?;
        let ty = o
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| wrong("response_format", "an object with a string `type`"))?;
        match ty {
            "text" => {}
            "json_object" => found.push((Grammar::JsonObject, "response_format")),
            "json_schema" => {
                let js = o.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                    wrong(
                        "response_format.json_schema",
                        "an object with `name` and `schema`",
                    )
                })?;
                only_known(
                    js,
                    &["name", "description", "schema", "strict"],
                    "response_format.json_schema.",
                )?;
                opt_str(js, "name").map_err(|_| wrong("response_format.json_schema.name", "a string"))?;
                // `strict` asks for exactly the schema; the output is always constrained
                // to it here, strict or not.
                opt_bool(js, "strict")
                    .map_err(|_| wrong("response_format.json_schema.strict", "a boolean"))?;
                let schema = field(js, "schema").cloned().unwrap_or_else(|| {
                    // OpenAI's default: any JSON object.
                    serde_json::json!({"type": "object"})
                });
                found.push((Grammar::JsonSchema(schema), "response_format"));
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "field `response_format.type` is `{other}`: expected text, json_object or json_schema"
                ))
                .with_param("response_format"))
            }
        }
    }
    if let Some(s) = field(obj, "json_schema") {
        if !s.is_object() {
            return Err(wrong("json_schema", "a JSON schema object"));
        }
        found.push((Grammar::JsonSchema(s.clone()), "json_schema"));
    }
    if let Some(g) = opt_str(obj, "grammar")?.filter(|g| !g.trim().is_empty()) {
        found.push((Grammar::Gbnf(g.to_string()), "grammar"));
    }
    if found.len() > 1 {
        return Err(ApiError::bad_request(format!(
            "fields `{}` and `{}` both constrain the output: give one",
            found[0].1, found[1].1
        )));
    }
    Ok(found.pop())
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// The sampler's own verdict, with its parameter name turned into the field's.
fn sampler_error(e: SamplerError) -> ApiError {
    match e {
        SamplerError::OutOfRange { name, value, range } => {
            out_of_range(&name.replace('-', "_"), value, range)
        }
    }
}

/// `logit_bias`: an object from token ids (decimal strings) to biases in [-100, 100].
fn logit_bias(obj: &Object) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = field(obj, "logit_bias") else {
        return Ok(Vec::new());
    };
    let map = v
        .as_object()
        .ok_or_else(|| wrong("logit_bias", "an object from token ids to biases"))?;
    let mut out = Vec::with_capacity(map.len());
    for (k, b) in map {
        // Only plain decimal digits: "+5", " 5" or "5.0" are not token ids.
        let id = k
            .bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| k.parse::<u32>().ok())
            .flatten()
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "field `logit_bias` has key `{k}`: keys must be token ids"
                ))
            })?;
        let name = format!("logit_bias.{k}");
        let bias = b
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| wrong(&name, "a number"))? as f32;
        if !(-LOGIT_BIAS_MAX..=LOGIT_BIAS_MAX).contains(&bias) {
            return Err(out_of_range(&name, bias, "in [-100, 100]"));
        }
        if out.iter().any(|&(t, _)| t == id) {
            return Err(ApiError::bad_request(format!(
                "field `logit_bias` names token {id} twice"
            )));
        }
        out.push((id, bias));
    }
    Ok(out)
}

/// The most tokens to generate: the first of `names` present, or `n_predict`
/// (llama-server's name, where -1 means "until the context is full").
fn max_tokens(obj: &Object, names: &[&str]) -> Result<Option<usize>, ApiError> {
    for name in names {
        match field(obj, name) {
            None => continue,
            Some(v) => {
                return match v.as_u64() {
                    Some(0) => Err(out_of_range(name, 0, "an integer >= 1")),
                    // Past usize the value cannot fit any context; the slot check in
                    // `openai::generate` names it either way.
                    Some(m) => Ok(Some(usize::try_from(m).unwrap_or(usize::MAX))),
                    None => Err(wrong(name, "an integer >= 1")),
                };
            }
        }
    }
    match opt_i64(obj, "n_predict").map_err(|_| wrong("n_predict", "-1 or an integer >= 1"))? {
        None | Some(-1) => Ok(None),
        Some(m) if m >= 1 => Ok(Some(usize::try_from(m).unwrap_or(usize::MAX))),
        Some(m) => Err(out_of_range("n_predict", m, "-1 or an integer >= 1")),
    }
}

/// `n`: how many choices, 1 to [`MAX_CHOICES`].
fn choices(obj: &Object) -> Result<usize, ApiError> {
    let range = format!("an integer in [1, {MAX_CHOICES}]");
    match opt_usize(obj, "n").map_err(|_| wrong("n", &range))? {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES).contains(&n) => Ok(n),
        Some(n) => Err(out_of_range("n", n, &range)),
    }
}

fn stop_strings(obj: &Object) -> Result<Vec<String>, ApiError> {
    let stop = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| wrong("stop", "a string or an array of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(wrong("stop", "a string or an array of strings")),
    };
    if stop.len() > MAX_STOP {
        return Err(out_of_range(
            "stop",
            format!("{} strings", stop.len()),
            &format!("at most {MAX_STOP} strings"),
        ));
    }
    for (i, s) in stop.iter().enumerate() {
        if s.is_empty() || s.len() > MAX_STOP_BYTES {
            return Err(out_of_range(
                &format!("stop[{i}]"),
                format!("{} bytes long", s.len()),
                &format!("1 to {MAX_STOP_BYTES} bytes long"),
            ));
        }
    }
    Ok(stop)
}

fn common(obj: &Object, max_names: &[&str]) -> Result<GenRequest, ApiError> {
    check_no_effect(obj)?;
    let mut s = GenRequest::default().sampling;
    if let Some(v) = opt_f32_in(obj, "temperature", 0.0, MAX_TEMPERATURE, "in [0, 100]")? {
        s.temperature = v;
    }
    if let Some(v) = opt_f32(obj, "top_p")? {
        if v <= 0.0 || v > 1.0 {
            return Err(out_of_range("top_p", v, "in (0, 1]"));
        }
        s.top_p = v;
    }
    match opt_i64(obj, "top_k").map_err(|_| wrong("top_k", "an integer >= -1"))? {
        None => {}
        // -1 (vLLM's spelling) and 0 (llama.cpp's) both switch top-k off.
        Some(-1) | Some(0) => s.top_k = 0,
        Some(k) if k > 0 => s.top_k = usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(out_of_range(
                "top_k",
                k,
                "-1, 0 (off) or a positive integer",
            ))
        }
    }
    if let Some(v) = opt_f32_in(obj, "min_p", 0.0, 1.0, "in [0, 1]")? {
        s.min_p = v;
    }
    let pen = "in [-2, 2]";
    if let Some(v) = opt_f32_in(obj, "presence_penalty", -MAX_PENALTY, MAX_PENALTY, pen)? {
        s.presence_penalty = v;
    }
    if let Some(v) = opt_f32_in(obj, "frequency_penalty", -MAX_PENALTY, MAX_PENALTY, pen)? {
        s.frequency_penalty = v;
    }
    let (lo, hi) = REPEAT_PENALTY_RANGE;
    if let Some(v) = opt_f32_in(obj, "repeat_penalty", lo, hi, "in [0.01, 10]")? {
        s.repeat_penalty = v;
    }
    if let Some(v) = field(obj, "seed") {
        // OpenAI clients send signed seeds; the sampler's stream is keyed by the bits.
        s.seed = v
            .as_u64()
            .or_else(|| v.as_i64().map(|x| x as u64))
            .ok_or_else(|| wrong("seed", "an integer in [-2^63, 2^64)"))?;
    }
    s.logit_bias = logit_bias(obj)?;
    s.validate().map_err(sampler_error)?;
    let max_tokens = max_tokens(obj, max_names)?;
    let n = choices(obj)?;
    let stop = stop_strings(obj)?;
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::bad_request(
                "field `stream_options` is only allowed when `stream` is true",
            ))
        }
        Some(Value::Object(o)) => {
            only_known(o, &["include_usage"], "stream_options.")?;
            opt_bool(o, "include_usage")
                .map_err(|_| wrong("stream_options.include_usage", "a boolean"))?
                .unwrap_or(false)
        }
        Some(_) => return Err(wrong("stream_options", "an object")),
    };
    Ok(GenRequest {
        sampling: s,
        max_tokens,
        stop,
        stream,
        include_usage,
        logprobs: None,
        n,
        model: opt_str(obj, "model")?.map(str::to_string),
        // llama-server's extension on OpenAI's routes too: `false` prefills the whole
        // prompt instead of reusing what the slot holds.
        cache_prompt: opt_bool(obj, "cache_prompt")?.unwrap_or(true),
        slot: None,
        grammar: output_grammar(obj)?,
        tools: None,
    })
}

fn check_top(name: &str, k: usize) -> Result<usize, ApiError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(out_of_range(name, k, "an integer in [0, 20]"));
    }
    Ok(k)
}

/// Reads a chat completion request: its messages and generation settings.
pub fn parse_chat(obj: &Object) -> Result<(Vec<ChatMessage>, GenRequest), ApiError> {
    only_known(obj, CHAT_FIELDS, "")?;
    let msgs = field(obj, "messages")
        .ok_or_else(|| ApiError::bad_request("field `messages` is required"))?
        .as_array()
        .ok_or_else(|| wrong("messages", "an array of messages"))?;
    if msgs.is_empty() {
        return Err(wrong("messages", "a non-empty array"));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let m = m
            .as_object()
            .ok_or_else(|| wrong(&format!("messages[{i}]"), "an object"))?;
        only_known(m, MESSAGE_FIELDS, &format!("messages[{i}]."))?;
        let role = opt_str(m, "role")
            .map_err(|_| wrong(&format!("messages[{i}].role"), "a string"))?
            .ok_or_else(|| {
                ApiError::bad_request(format!("field `messages[{i}].role` is required"))
            })?;
        let role = match role {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::bad_request(format!(
                    "field `messages[{i}].role` is `{other}`: expected system, developer, \
                     user, assistant or tool"
                ))
                .with_param(format!("messages[{i}].role")))
            }
        };
        let tool_call_id = opt_str(m, "tool_call_id")
            .map_err(|_| wrong(&format!("messages[{i}].tool_call_id"), "a string"))?;
        if role != "tool" && tool_call_id.is_some() {
            return Err(ApiError::bad_request(format!(
                "field `messages[{i}].tool_call_id` belongs only on `tool` messages"
            )));
        }
        let calls = match field(m, "tool_calls") {
            None => Vec::new(),
            Some(_) if role != "assistant" => {
                return Err(ApiError::bad_request(format!(
                    "field `messages[{i}].tool_calls` belongs only on assistant messages"
                )))
            }
            Some(v) => history_calls(v, i)?,
        };
        if role == "tool" {
            let id = tool_call_id.ok_or_else(|| {
                ApiError::bad_request(format!(
                    "field `messages[{i}].tool_call_id` is required: a `tool` message \
                     answers a tool call of a preceding assistant message"
                ))
                .with_param(format!("messages[{i}]"))
            })?;
            let known = out
                .iter()
                .rev()
                .take_while(|p: &&ChatMessage| p.role != "user")
                .any(|p| p.tool_calls.iter().any(|c| c.id == id));
            if !known {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}] is a `tool` message for tool_call_id `{id}`, but no \
                     preceding assistant message has a tool call with that id"
                ))
                .with_param(format!("messages[{i}]")));
            }
        }
        // An assistant message that only calls tools has no content (OpenAI sends null).
        let content = if role == "assistant" && !calls.is_empty() && field(m, "content").is_none() {
            String::new()
        } else {
            message_content(m.get("content"), i)?
        };
        let mut msg = ChatMessage::new(role, content);
        msg.tool_calls = calls;
        msg.tool_call_id = tool_call_id.map(str::to_string);
        out.push(msg);
    }
    let mut g = common(obj, &["max_completion_tokens", "max_tokens"])?;
    g.tools = tools::parse(
        field(obj, "tools"),
        field(obj, "tool_choice"),
        opt_bool(obj, "parallel_tool_calls")?,
    )?;
    if g.tools.as_ref().is_some_and(|t| t.grammar().is_some()) && g.grammar.is_some() {
        return Err(ApiError::bad_request(
            "a tool call and an output grammar (`response_format`, `json_schema` or \
             `grammar`) cannot both constrain one answer: use `tool_choice: none`",
        )
        .with_param("tool_choice"));
    }
    let top = opt_usize(obj, "top_logprobs")?;
    if opt_bool(obj, "logprobs")?.unwrap_or(false) {
        g.logprobs = Some(check_top("top_logprobs", top.unwrap_or(0))?);
    } else if top.is_some() {
        return Err(ApiError::bad_request(
            "field `top_logprobs` needs `logprobs` set to true",
        ));
    }
    Ok((out, g))
}

/// The `tool_calls` of an assistant message in the history.
fn history_calls(v: &Value, i: usize) -> Result<Vec<ToolCall>, ApiError> {
    let at = format!("messages[{i}].tool_calls");
    let arr = v
        .as_array()
        .ok_or_else(|| wrong(&at, "an array of tool calls"))?;
    arr.iter()
        .enumerate()
        .map(|(k, c)| {
            let bad = || {
                wrong(
                    &format!("{at}[{k}]"),
                    "{\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
                )
            };
            let id = c.get("id").and_then(Value::as_str).ok_or_else(bad)?;
            let f = c.get("function").ok_or_else(bad)?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => "{}".into(),
                Some(o @ Value::Object(_)) => o.to_string(),
                Some(_) => return Err(bad()),
            };
            Ok(ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}

/// A message's content: a string, or an array of `{"type":"text","text":...}` parts.
fn message_content(v: Option<&Value>, i: usize) -> Result<String, ApiError> {
    let name = format!("messages[{i}].content");
    match v {
        None | Some(Value::Null) => Err(ApiError::bad_request(format!(
            "field `{name}` is required (a string or text parts)"
        ))
        .with_param(name)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for p in parts {
                let text = p
                    .get("text")
                    .and_then(Value::as_str)
                    .filter(|_| p.get("type").and_then(Value::as_str) == Some("text"));
                s.push_str(text.ok_or_else(|| wrong(&name, "a string or text parts"))?);
            }
            Ok(s)
        }
        Some(_) => Err(wrong(&name, "a string or text parts")),
    }
}

/// A completion prompt: text to tokenize, or token ids as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text, tokenized with special-token parsing.
    Text(String),
    /// Token ids used verbatim.
    Tokens(Vec<u32>),
}

/// Reads a text completion request: its prompt and generation settings.
pub fn parse_completion(obj: &Object) -> Result<(Prompt, GenRequest), ApiError> {
    only_known(obj, COMPLETION_FIELDS, "")?;
    let bad = || {
        wrong(
            "prompt",
            "a string, an array of token ids, or one such in an array",
        )
    };
    let prompt = match field(obj, "prompt") {
        None => return Err(ApiError::bad_request("field `prompt` is required")),
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && !a[0].is_number() => match &a[0] {
            Value::String(s) => Prompt::Text(s.clone()),
            v @ Value::Array(_) => Prompt::Tokens(token_list(v, "prompt").map_err(|_| bad())?),
            _ => return Err(bad()),
        },
        Some(v @ Value::Array(a)) if a.iter().all(Value::is_number) => {
            Prompt::Tokens(token_list(v, "prompt")?)
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::bad_request(
                "field `prompt` holds several prompts: send one prompt per request",
            ))
        }
        Some(_) => return Err(bad()),
    };
    let g = common(obj, &["max_tokens"])?;
    // Candidates are not ranked: best_of may only equal n (each candidate is returned).
    match opt_usize(obj, "best_of").map_err(|_| wrong("best_of", "an integer"))? {
        None => {}
        Some(b) if b == g.n => {}
        Some(b) => {
            return Err(out_of_range(
                "best_of",
                b,
                &format!("equal to n ({}): candidates are not ranked", g.n),
            ))
        }
    }
    let mut g = g;
    if opt_bool(obj, "echo")? == Some(true) {
        return Err(unsupported("echo", "the prompt is not echoed back"));
    }
    if opt_str(obj, "suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(unsupported(
            "suffix",
            "insertion after a suffix is not implemented",
        ));
    }
    if let Some(k) = opt_usize(obj, "logprobs")? {
        g.logprobs = Some(check_top("logprobs", k)?);
    }
    Ok((prompt, g))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn wrong_types_name_the_field() {
        let e = parse_chat(&obj(json!({"messages": [{"role":"user","content":"x"}],
            "temperature": "hot"})))
        .unwrap_err();
        assert!(e.message.contains("`temperature`"), "{}", e.message);
        let e = parse_completion(&obj(json!({"prompt": 3}))).unwrap_err();
        assert!(e.message.contains("`prompt`"), "{}", e.message);
        let e =
            parse_chat(&obj(json!({"messages": [{"role":"robot","content":"x"}]}))).unwrap_err();
        assert!(e.message.contains("messages[0].role"), "{}", e.message);
        let e = parse_completion(&obj(json!({"prompt": "a", "stop": 5}))).unwrap_err();
        assert!(e.message.contains("`stop`"), "{}", e.message);
        let e = parse_completion(&obj(json!({"prompt": "a", "top_p": 7.0}))).unwrap_err();
        assert!(e.message.contains("`top_p`"), "{}", e.message);
    }

    #[test]
    fn defaults_are_llama_server_s_and_fields_apply() {
        let (p, g) = parse_completion(&obj(json!({"prompt": [1, 2, 3]}))).unwrap();
        assert_eq!(p, Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(g.sampling.temperature, 0.8);
        assert_eq!(g.sampling.top_k, 40);
        assert_eq!(g.max_tokens, None);
        assert!(!g.stream);
        assert!(g.cache_prompt);
        let (_, g) = parse_completion(&obj(json!({"prompt": "x", "cache_prompt": false}))).unwrap();
        assert!(!g.cache_prompt);
        let (m, g) = parse_chat(&obj(json!({
            "messages": [{"role":"system","content":"s"},
                         {"role":"user","content":[{"type":"text","text":"hi"}]}],
            "max_tokens": 5, "max_completion_tokens": 7, "stop": ["a","b"], "seed": -1,
            "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
            "logprobs": true, "top_logprobs": 3})))
        .unwrap();
        assert_eq!(m[1], ChatMessage::new("user", "hi"));
        assert_eq!(g.max_tokens, Some(7));
        assert_eq!(g.stop, vec!["a", "b"]);
        assert_eq!(g.sampling.seed, u64::MAX);
        assert!(g.stream && g.include_usage);
        assert_eq!(g.logprobs, Some(3));
    }

    #[test]
    fn several_choices_are_read_and_several_prompts_refused() {
        let (_, g) = parse_chat(&obj(
            json!({"messages": [{"role":"user","content":"x"}], "n": 2}),
        ))
        .unwrap();
        assert_eq!(g.n, 2);
        let (_, g) = parse_completion(&obj(json!({"prompt": "a", "n": 3, "best_of": 3}))).unwrap();
        assert_eq!(g.n, 3);
        let e = parse_completion(&obj(json!({"prompt": ["a", "b"]}))).unwrap_err();
        assert!(e.message.contains("several prompts"));
        assert!(parse_object(b"{not json")
            .unwrap_err()
            .message
            .contains("invalid JSON"));
    }

    fn chat(extra: Value) -> Object {
        let mut o = obj(json!({"messages": [{"role": "user", "content": "x"}]}));
        o.extend(obj(extra));
        o
    }

    #[test]
    fn numbers_outside_their_range_name_the_field_and_the_range() {
        for (field, range, extra) in [
            ("temperature", "[0, 100]", json!({"temperature": 300})),
            (
                "temperature",
                "a 32-bit float",
                json!({"temperature": 1e300}),
            ),
            ("temperature", "a number", json!({"temperature": "hot"})),
            (
                "presence_penalty",
                "[-2, 2]",
                json!({"presence_penalty": 1e30}),
            ),
            (
                "frequency_penalty",
                "[-2, 2]",
                json!({"frequency_penalty": -5}),
            ),
            (
                "repeat_penalty",
                "[0.01, 10]",
                json!({"repeat_penalty": 1e-30}),
            ),
            ("min_p", "[0, 1]", json!({"min_p": 2})),
            ("top_p", "(0, 1]", json!({"top_p": 0})),
            ("top_k", "positive integer", json!({"top_k": -5})),
            ("top_k", "integer", json!({"top_k": 1.5})),
            (
                "top_logprobs",
                "[0, 20]",
                json!({"logprobs": true, "top_logprobs": 21}),
            ),
            (
                "max_completion_tokens",
                ">= 1",
                json!({"max_completion_tokens": 0}),
            ),
            ("max_tokens", ">= 1", json!({"max_tokens": -3})),
            (
                "n_predict",
                "-1 or an integer >= 1",
                json!({"n_predict": -2}),
            ),
            ("seed", "integer", json!({"seed": 1.5})),
            ("seed", "integer", json!({"seed": 1e20})),
            ("stop", "at most 4", json!({"stop": vec!["s"; 5]})),
            ("stop[1]", "1 to 256 bytes", json!({"stop": ["a", ""]})),
            (
                "stop[0]",
                "1 to 256 bytes",
                json!({"stop": "x".repeat(300)}),
            ),
            (
                "logit_bias.5",
                "[-100, 100]",
                json!({"logit_bias": {"5": 200}}),
            ),
            (
                "logit_bias.5",
                "a number",
                json!({"logit_bias": {"5": "ban"}}),
            ),
            ("logit_bias", "token ids", json!({"logit_bias": {"-5": 1}})),
            (
                "logit_bias",
                "token ids",
                json!({"logit_bias": {"99999999999": 1}}),
            ),
            ("logit_bias", "an object", json!({"logit_bias": [[5, 1]]})),
            ("n", "[1, 128]", json!({"n": 0})),
            ("n", "[1, 128]", json!({"n": 129})),
            ("n", "[1, 128]", json!({"n": 1.5})),
        ] {
            let e = parse_chat(&chat(extra.clone())).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(
                e.message.contains(&format!("`{field}`")) && e.message.contains(range),
                "{extra}: {}",
                e.message
            );
        }
        let e = parse_completion(&obj(json!({"prompt": "a", "logprobs": 21}))).unwrap_err();
        assert!(e.message.contains("`logprobs`") && e.message.contains("[0, 20]"));
        let e = parse_completion(&obj(json!({"prompt": "a", "best_of": 2}))).unwrap_err();
        assert!(e.message.contains("`best_of`"), "{}", e.message);
    }

    #[test]
    fn message_roles_and_order_are_checked_by_name() {
        let msgs = |m: Value| obj(json!({ "messages": m }));
        for (want, m) in [
            (
                "expected system, developer, user, assistant or tool",
                json!([{"role": "function", "content": "x"}]),
            ),
            (
                "no preceding assistant message has a tool call with that id",
                json!([{"role": "user", "content": "x"},
                    {"role": "tool", "tool_call_id": "call_1", "content": "42"}]),
            ),
            (
                "`messages[1].tool_call_id` is required",
                json!([{"role": "user", "content": "x"}, {"role": "tool", "content": "42"}]),
            ),
            (
                "belongs only on `tool` messages",
                json!([{"role": "user", "content": "x", "tool_call_id": "c"}]),
            ),
            (
                "`messages[0].content` is required",
                json!([{"role": "user"}]),
            ),
            (
                "`messages[0].content` must be a string or text parts",
                json!([{"role": "user", "content": 5}]),
            ),
            ("`messages` must be a non-empty array", json!([])),
        ] {
            let e = parse_chat(&msgs(m.clone())).unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(want), "{m}: {}", e.message);
        }
        // OpenAI accepts consecutive turns of one role; the templates render them.
        let (m, _) = parse_chat(&msgs(json!([{"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"}, {"role": "assistant", "content": "c"}])))
        .unwrap();
        assert_eq!(m.len(), 3);
    }

    #[test]
    fn limits_inside_the_ranges_are_accepted() {
        let (_, g) = parse_chat(&chat(json!({
            "temperature": 100, "presence_penalty": -2, "frequency_penalty": 2,
            "repeat_penalty": 0.01, "min_p": 1, "top_p": 1, "top_k": -1,
            "seed": u64::MAX, "stop": vec!["x".repeat(256); 4], "n": 128,
            "max_tokens": u64::MAX,
            "logit_bias": {"5": -100, "7": 100, "0": 0.5},
        })))
        .unwrap();
        assert_eq!(g.sampling.top_k, 0);
        assert_eq!(g.sampling.seed, u64::MAX);
        // Past any context, but refused only against the slot (openai::generate).
        assert_eq!(g.max_tokens, Some(usize::MAX));
        let mut bias = g.sampling.logit_bias.clone();
        bias.sort_by_key(|b| b.0);
        assert_eq!(bias, vec![(0, 0.5), (5, -100.0), (7, 100.0)]);
        // n_predict is llama-server's max_tokens; -1 fills the context.
        let (_, g) = parse_completion(&obj(json!({"prompt": "a", "n_predict": 9}))).unwrap();
        assert_eq!(g.max_tokens, Some(9));
        let (_, g) = parse_completion(&obj(json!({"prompt": "a", "n_predict": -1}))).unwrap();
        assert_eq!(g.max_tokens, None);
        let (_, g) = parse_completion(&obj(json!({"prompt": "a", "max_tokens": 3,
            "n_predict": 9})))
        .unwrap();
        assert_eq!(g.max_tokens, Some(3));
    }

    #[test]
    fn fields_without_an_effect_here_are_refused_by_name() {
        for (field, extra) in [
            ("temprature", json!({"temprature": 0.5})),
            ("tools", json!({"tools": "f"})),
            ("tool_choice", json!({"tool_choice": "required"})),
            (
                "response_format.type",
                json!({"response_format": {"type": "xml"}}),
            ),
            (
                "response_format.json_schema.strictly",
                json!({"response_format": {"type": "json_schema",
                    "json_schema": {"name": "a", "strictly": true}}}),
            ),
            ("functions", json!({"functions": [{"name": "f"}]})),
            (
                "stream_options",
                json!({"stream_options": {"include_usage": true}}),
            ),
            (
                "stream_options.include_obfuscation",
                json!({"stream": true, "stream_options": {"include_obfuscation": true}}),
            ),
            ("top_logprobs", json!({"top_logprobs": 2})),
            ("cache_prompt", json!({"cache_prompt": "no"})),
            ("mirostat", json!({"mirostat": 2})),
            ("echo", json!({"echo": true})),
        ] {
            let e = parse_chat(&chat(extra.clone())).unwrap_err();
            assert!(
                e.message.contains(&format!("`{field}`")),
                "{extra}: {}",
                e.message
            );
        }
        let e = parse_chat(&obj(json!({"messages": [
            {"role": "user", "content": "x", "name": "bob"}]})))
        .unwrap_err();
        assert!(e.message.contains("`messages[0].name`"), "{}", e.message);
        for (field, extra) in [
            ("echo", json!({"echo": true})),
            ("suffix", json!({"suffix": "}"})),
            ("messages", json!({"messages": []})),
        ] {
            let mut o = obj(json!({"prompt": "a"}));
            o.extend(obj(extra.clone()));
            let e = parse_completion(&o).unwrap_err();
            assert!(
                e.message.contains(&format!("`{field}`")),
                "{extra}: {}",
                e.message
            );
        }
    }

    #[test]
    fn metadata_fields_and_neutral_values_are_accepted() {
        let (_, g) = parse_chat(&chat(json!({
            "model": "gpt-4o", "user": "u-1", "metadata": {"k": "v"}, "store": false,
            "tools": [], "tool_choice": "none", "parallel_tool_calls": false,
            "response_format": {"type": "text"}, "cache_prompt": true,
            "no_such_field": null,
        })))
        .unwrap();
        assert_eq!(g.sampling.temperature, 0.8);
        assert_eq!(g.model.as_deref(), Some("gpt-4o"));
        assert!(
            parse_completion(&obj(json!({"prompt": "a", "echo": false, "suffix": "",
            "best_of": 1, "n": 1})))
            .is_ok()
        );
        for (field, extra) in [
            ("model", json!({"model": 5})),
            ("metadata", json!({"metadata": "x"})),
            ("store", json!({"store": "yes"})),
        ] {
            let e = parse_chat(&chat(extra)).unwrap_err();
            assert!(e.message.contains(&format!("`{field}`")), "{}", e.message);
        }
    }
}
