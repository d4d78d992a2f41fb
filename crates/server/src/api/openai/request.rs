//! OpenAI's request bodies: chat and text completions read into the shared
//! [`GenRequest`].
//!
//! Every field a request may carry is on an accept list ([`CHAT_FIELDS`],
//! [`COMPLETION_FIELDS`]); any other field that is not `null` is refused by name, so a
//! typo (`temprature`) or a feature this server does not have (`functions`, `echo`) is
//! an error instead of a silent no-op. A few fields
//! are accepted without effect by design ([`NO_EFFECT_FIELDS`]): they carry client
//! metadata that changes nothing in OpenAI's own answer either.

use minfer_runtime::{SamplerError, LOGIT_BIAS_MAX};
use minfer_tokenizer::{ChatMessage, ToolCall};
use serde_json::Value;

use crate::api::fields::{
    check_stop, field, only_known, opt_bool, opt_f32, opt_f32_in, opt_i64, opt_str, opt_usize,
    out_of_range, output_grammar, string_list, token_list, top_p, unsupported, wrong, Object,
};
use crate::error::ApiError;
use crate::params::{
    GenRequest, Prompt, MAX_CHOICES, MAX_PENALTY, MAX_TEMPERATURE, MAX_TOP_LOGPROBS,
    REPEAT_PENALTY_RANGE,
};
use crate::tools;

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
    "id_slot",
    "timings_per_token",
    "return_progress",
    "verbose",
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
    "reasoning_format",
    "reasoning_effort",
    "chat_template_kwargs",
    "enable_thinking",
    "continue_final_message",
    "add_generation_prompt",
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
    "id_slot",
    "timings_per_token",
    "return_progress",
    "verbose",
    "user",
    "metadata",
    "store",
];

/// Fields accepted without effect on the answer: `user`, `metadata` and `store` (client
/// bookkeeping; nothing is stored), and on chat OpenAI's hints to its own service that
/// current SDKs and frameworks send (`service_tier`, `prompt_cache_key`,
/// `safety_identifier`, `verbosity`): a 400 on them would fail every request of such a
/// client. `model` selects the model when several are served, and is otherwise only
/// reported back.
pub const NO_EFFECT_FIELDS: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
];

/// Fields of one chat message (`name`, the participant's, reaches the template as the
/// message's `name`, as LangChain's named messages send it; `tool_call_id` only on
/// `tool` messages, where it is
/// checked against the calls before it; `tool_calls` and `reasoning_content`, the
/// reasoning this server returned beside the content, only on assistant messages).
const MESSAGE_FIELDS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_call_id",
    "tool_calls",
    "reasoning_content",
];

/// Type checks of the fields accepted without effect.
fn check_no_effect(obj: &Object) -> Result<(), ApiError> {
    opt_str(obj, "model")?;
    opt_str(obj, "user")?;
    opt_bool(obj, "store")?;
    for k in ["service_tier", "prompt_cache_key", "safety_identifier"] {
        opt_str(obj, k)?;
    }
    if let Some(v) = opt_str(obj, "verbosity")? {
        if !["low", "medium", "high"].contains(&v) {
            return Err(wrong("verbosity", "`low`, `medium` or `high`"));
        }
    }
    if let Some(m) = field(obj, "metadata") {
        if !m.is_object() {
            return Err(wrong("metadata", "an object"));
        }
    }
    Ok(())
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

/// `stop`: a string or up to [`crate::params::MAX_STOP`] of them.
fn stop_strings(obj: &Object) -> Result<Vec<String>, ApiError> {
    let stop = string_list(
        field(obj, "stop"),
        "stop",
        "a string or an array of strings",
    )?;
    check_stop(&stop)?;
    Ok(stop)
}

fn common(obj: &Object, max_names: &[&str]) -> Result<GenRequest, ApiError> {
    check_no_effect(obj)?;
    let mut s = GenRequest::default().sampling;
    if let Some(v) = opt_f32_in(obj, "temperature", 0.0, MAX_TEMPERATURE, "in [0, 100]")? {
        s.temperature = v;
    }
    if let Some(v) = opt_f32(obj, "top_p")? {
        s.top_p = top_p("top_p", v)?;
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
            // `include_obfuscation` asks OpenAI to pad its chunks against side channels;
            // this server adds no padding either way.
            only_known(
                o,
                &["include_usage", "include_obfuscation"],
                "stream_options.",
            )?;
            opt_bool(o, "include_obfuscation")
                .map_err(|_| wrong("stream_options.include_obfuscation", "a boolean"))?;
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
        post_sampling: false,
        n,
        model: opt_str(obj, "model")?.map(str::to_string),
        // llama-server's extension on OpenAI's routes too: `false` prefills the whole
        // prompt instead of reusing what the slot holds.
        cache_prompt: opt_bool(obj, "cache_prompt")?.unwrap_or(true),
        // llama-server's slot choice, which its OpenAI routes take too.
        slot: crate::api::fields::id_slot(obj)?,
        grammar: output_grammar(obj)?,
        tools: None,
        reasoning: Default::default(),
        telemetry: crate::api::timings::telemetry(obj)?,
        verbose: opt_bool(obj, "verbose")?.unwrap_or(false),
    })
}

fn check_top(name: &str, k: usize) -> Result<usize, ApiError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(out_of_range(name, k, "an integer in [0, 20]"));
    }
    Ok(k)
}

/// How the end of a chat request's messages is rendered: `continue_final_message` and
/// `add_generation_prompt` (booleans; absent, a last assistant message is continued).
pub fn continuation(obj: &Object) -> Result<crate::generate::Continuation, ApiError> {
    Ok(crate::generate::Continuation {
        continue_final: opt_bool(obj, "continue_final_message")?,
        add_generation_prompt: opt_bool(obj, "add_generation_prompt")?,
    })
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
        let reasoning = opt_str(m, "reasoning_content")
            .map_err(|_| wrong(&format!("messages[{i}].reasoning_content"), "a string"))?;
        if role != "assistant" && reasoning.is_some() {
            return Err(ApiError::bad_request(format!(
                "field `messages[{i}].reasoning_content` belongs only on assistant messages"
            )));
        }
        let name =
            opt_str(m, "name").map_err(|_| wrong(&format!("messages[{i}].name"), "a string"))?;
        let mut msg = ChatMessage::new(role, content);
        msg.name = name.filter(|n| !n.is_empty()).map(str::to_string);
        msg.tool_calls = calls;
        msg.tool_call_id = tool_call_id.map(str::to_string);
        msg.reasoning_content = reasoning.map(str::to_string);
        out.push(msg);
    }
    let mut g = common(obj, &["max_completion_tokens", "max_tokens"])?;
    g.reasoning.split = crate::api::thinking::split_requested(obj)?;
    g.tools = tools::parse(
        field(obj, "tools"),
        field(obj, "tool_choice"),
        opt_bool(obj, "parallel_tool_calls")?,
    )?;
    if let Some((gr, field)) = &g.grammar {
        tools::check_output(g.tools.as_ref(), Some(gr), field)?;
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

/// A message's content: a string, or an array of `{"type":"text","text":...}` parts,
/// joined with a newline between parts as llama-server renders them.
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
                let text = text.ok_or_else(|| wrong(&name, "a string or text parts"))?;
                if !s.is_empty() {
                    s.push('\n');
                }
                s.push_str(text);
            }
            Ok(s)
        }
        Some(_) => Err(wrong(&name, "a string or text parts")),
    }
}

/// Reads a text completion request: its prompts (one, or OpenAI's batch: an array of
/// strings or of token-id arrays) and generation settings.
pub fn parse_completion(obj: &Object) -> Result<(Vec<Prompt>, GenRequest), ApiError> {
    only_known(obj, COMPLETION_FIELDS, "")?;
    let bad = || {
        wrong(
            "prompt",
            "a string, an array of token ids, or an array of such prompts",
        )
    };
    let one = |v: &Value, at: &str| match v {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(_) => Ok(Prompt::Tokens(token_list(v, at)?)),
        _ => Err(wrong(at, "a string or an array of token ids")),
    };
    let prompts = match field(obj, "prompt") {
        None => return Err(ApiError::bad_request("field `prompt` is required")),
        Some(Value::String(s)) => vec![Prompt::Text(s.clone())],
        Some(v @ Value::Array(a)) if a.iter().all(Value::is_number) => {
            vec![Prompt::Tokens(token_list(v, "prompt")?)]
        }
        Some(Value::Array(a)) => {
            if a.len() > crate::generate::MAX_PROMPTS {
                return Err(out_of_range(
                    "prompt",
                    format!("{} prompts", a.len()),
                    &format!("at most {} prompts", crate::generate::MAX_PROMPTS),
                ));
            }
            a.iter()
                .enumerate()
                .map(|(i, v)| one(v, &format!("prompt[{i}]")))
                .collect::<Result<_, _>>()?
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
    if prompts.len() > 1 && g.stream && (g.telemetry.per_token || g.telemetry.progress) {
        return Err(ApiError::bad_request(
            "fields `timings_per_token` and `return_progress` report one prompt's \
             processing: send a batch of prompts without them",
        ));
    }
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
    Ok((prompts, g))
}

#[cfg(test)]
mod tests;
