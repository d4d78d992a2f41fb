//! Request bodies read field by field, so that a wrong type is refused with a 400 that
//! names the field. Sampling defaults are llama-server's: temperature 0.8, top_k 40,
//! top_p 0.95, min_p 0.05, no penalties, a random seed.

use minfer_runtime::SamplingParams;
use minfer_tokenizer::ChatMessage;
use serde_json::{Map, Value};

use crate::error::ApiError;

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

/// An optional field, `null` counting as absent.
fn field<'a>(obj: &'a Object, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

/// An optional finite number.
pub fn opt_f32(obj: &Object, name: &str) -> Result<Option<f32>, ApiError> {
    match field(obj, name) {
        None => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x as f32)),
            _ => Err(wrong(name, "a number")),
        },
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
}

/// Most alternatives per token that `top_logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

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

fn common(obj: &Object, max_names: &[&str]) -> Result<GenRequest, ApiError> {
    let mut s = SamplingParams {
        seed: random_seed(),
        ..SamplingParams::default()
    };
    if let Some(v) = opt_f32(obj, "temperature")? {
        s.temperature = v;
    }
    if let Some(v) = opt_f32(obj, "top_p")? {
        s.top_p = v;
    }
    if let Some(v) = opt_usize(obj, "top_k")? {
        s.top_k = v;
    }
    if let Some(v) = opt_f32(obj, "min_p")? {
        s.min_p = v;
    }
    if let Some(v) = opt_f32(obj, "presence_penalty")? {
        s.presence_penalty = v;
    }
    if let Some(v) = opt_f32(obj, "frequency_penalty")? {
        s.frequency_penalty = v;
    }
    if let Some(v) = opt_f32(obj, "repeat_penalty")? {
        s.repeat_penalty = v;
    }
    if let Some(v) = field(obj, "seed") {
        // OpenAI clients send signed seeds; the sampler's stream is keyed by the bits.
        s.seed = v
            .as_u64()
            .or_else(|| v.as_i64().map(|x| x as u64))
            .ok_or_else(|| wrong("seed", "an integer"))?;
    }
    s.validate().map_err(|e| match e {
        minfer_runtime::SamplerError::OutOfRange { name, value, range } => {
            ApiError::bad_request(format!(
                "field `{}` is {value}: must be {range}",
                name.replace('-', "_")
            ))
        }
    })?;
    let mut max_tokens = None;
    for name in max_names {
        if let Some(v) = opt_usize(obj, name)? {
            max_tokens = Some(v);
            break;
        }
    }
    if max_tokens == Some(0) {
        return Err(wrong(max_names[0], "at least 1"));
    }
    if let Some(n) = opt_usize(obj, "n")? {
        if n != 1 {
            return Err(ApiError::bad_request(format!(
                "field `n` is {n}: only one choice per request is supported"
            )));
        }
    }
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
    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")
            .map_err(|_| wrong("stream_options.include_usage", "a boolean"))?
            .unwrap_or(false),
        Some(_) => return Err(wrong("stream_options", "an object")),
    };
    Ok(GenRequest {
        sampling: s,
        max_tokens,
        stop,
        stream,
        include_usage,
        logprobs: None,
    })
}

fn check_top(name: &str, k: usize) -> Result<usize, ApiError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(wrong(name, "at most 20"));
    }
    Ok(k)
}

/// Reads a chat completion request: its messages and generation settings.
pub fn parse_chat(obj: &Object) -> Result<(Vec<ChatMessage>, GenRequest), ApiError> {
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
        let role = opt_str(m, "role")
            .map_err(|_| wrong(&format!("messages[{i}].role"), "a string"))?
            .ok_or_else(|| {
                ApiError::bad_request(format!("field `messages[{i}].role` is required"))
            })?;
        let role = match role {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            other => {
                return Err(ApiError::bad_request(format!(
                    "field `messages[{i}].role` is `{other}`: expected system, user or assistant"
                )))
            }
        };
        let content = message_content(m.get("content"), i)?;
        out.push(ChatMessage::new(role, content));
    }
    let mut g = common(obj, &["max_completion_tokens", "max_tokens"])?;
    if opt_bool(obj, "logprobs")?.unwrap_or(false) {
        g.logprobs = Some(check_top(
            "top_logprobs",
            opt_usize(obj, "top_logprobs")?.unwrap_or(0),
        )?);
    }
    Ok((out, g))
}

/// A message's content: a string, or an array of `{"type":"text","text":...}` parts.
fn message_content(v: Option<&Value>, i: usize) -> Result<String, ApiError> {
    let name = format!("messages[{i}].content");
    match v {
        None | Some(Value::Null) => Ok(String::new()),
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
    let mut g = common(obj, &["max_tokens"])?;
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
    fn several_choices_or_prompts_are_refused() {
        let e = parse_chat(&obj(
            json!({"messages": [{"role":"user","content":"x"}], "n": 2}),
        ))
        .unwrap_err();
        assert!(e.message.contains("`n`"));
        let e = parse_completion(&obj(json!({"prompt": ["a", "b"]}))).unwrap_err();
        assert!(e.message.contains("several prompts"));
        assert!(parse_object(b"{not json")
            .unwrap_err()
            .message
            .contains("invalid JSON"));
    }
}
