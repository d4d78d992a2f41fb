//! ollama's request bodies: the fields common to `/api/chat` and `/api/generate`, and
//! each one's prompt (`options` are read by `options`).

use minfer_runtime::Grammar;
use minfer_tokenizer::{ChatMessage, ToolCall};
use serde_json::Value;

use super::options::parse_options;
use crate::api::closed_schema::close_objects;
use crate::api::fields::{
    self, field, opt_bool, opt_i64, opt_str, out_of_range, schema_grammar, unsupported, wrong,
    Object,
};
use crate::api::thinking::thinking_kwargs;
use crate::error::ApiError;
use crate::generate;
use crate::params::{self, GenRequest, Prompt};
use crate::tools;
use crate::{AppState, Model};

/// The request fields common to chat and generate.
#[derive(Debug)]
pub(super) struct Common {
    /// `stream` (default true).
    pub(super) stream: bool,
    /// `format`: `"json"` (any JSON object) or a JSON schema the answer must follow.
    pub(super) grammar: Option<(Grammar, &'static str)>,
    /// `think`: the template's thinking switch; absent, the template's default.
    pub(super) think: Option<bool>,
    /// `logprobs` with `top_logprobs`: the alternatives to report per token, `None`
    /// when the answer carries no log-probabilities.
    pub(super) logprobs: Option<usize>,
    /// `keep_alive` is zero: a request without prompt or messages asks to unload.
    pub(super) unload: bool,
}

/// Reads `stream`, `format`, `think`, `logprobs`, `top_logprobs` and `keep_alive`
/// (a number of seconds or a Go duration such as `"5m"`; without effect beyond the
/// unload answer: the model stays loaded).
pub(super) fn common_fields(obj: &Object) -> Result<Common, ApiError> {
    let grammar = match field(obj, "format") {
        None => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some((Grammar::JsonObject, "format")),
        // ollama has no strict mode: what cannot be enforced is left out and reported.
        // Its objects are closed unless the schema opens them (see `close_objects`).
        Some(v @ Value::Object(_)) => {
            Some((schema_grammar(close_objects(v.clone()), false), "format"))
        }
        Some(_) => return Err(wrong("format", "\"json\" or a JSON schema object")),
    };
    let think = match field(obj, "think") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        // gpt-oss's effort levels: this server has no levels, only on and off.
        Some(_) => return Err(wrong("think", "a boolean")),
    };
    let unload = match field(obj, "keep_alive") {
        None => false,
        // ollama reads a number as seconds; a negative one keeps the model forever.
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        // An empty string is no duration to Go; read here as the default.
        Some(Value::String(s)) if s.is_empty() => false,
        Some(Value::String(s)) => go_duration_is_zero(s).ok_or_else(|| {
            wrong(
                "keep_alive",
                &format!("a number of seconds or a duration such as \"5m\", not {s:?}"),
            )
        })?,
        Some(_) => return Err(wrong("keep_alive", "a duration string or a number")),
    };
    // As ollama: `top_logprobs` is checked even when `logprobs` is off, and only then
    // ignored.
    let top = match opt_i64(obj, "top_logprobs")? {
        None => 0,
        Some(k) => usize::try_from(k)
            .ok()
            .filter(|&k| k <= params::MAX_TOP_LOGPROBS)
            .ok_or_else(|| out_of_range("top_logprobs", k, "an integer in [0, 20]"))?,
    };
    let logprobs = opt_bool(obj, "logprobs")?.unwrap_or(false).then_some(top);
    Ok(Common {
        stream: opt_bool(obj, "stream")?.unwrap_or(true),
        grammar,
        think,
        logprobs,
        unload,
    })
}

/// Whether `s`, a Go duration (`"0"`, `"1h30m"`, `"-1.5s"`: an optional sign, then
/// numbers each with a unit of `ns`, `us`, `µs`, `ms`, `s`, `m` or `h`), is zero;
/// `None` when it is no duration, as Go's `time.ParseDuration` would refuse it.
pub(super) fn go_duration_is_zero(s: &str) -> Option<bool> {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    if body == "0" {
        return Some(true);
    }
    let mut rest = body;
    let mut zero = true;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        // Go takes `1.`, `.5` but not `.` alone, and one point at most.
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return None;
        }
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, after) = tail.split_at(unit_len);
        if !["ns", "us", "µs", "μs", "ms", "s", "m", "h"].contains(&unit) {
            return None;
        }
        zero &= num.chars().all(|c| c == '0' || c == '.');
        rest = after;
    }
    Some(zero)
}

/// Applies the common fields to `g` (its `logprobs` the ones the answer shows); `chat`:
/// the prompt is a rendered chat, whose reasoning is split out (ollama's `thinking`).
/// Returns the template variables and whether `keep_alive` asks to unload. `think:
/// true` on a model that cannot think is refused as ollama refuses it.
fn apply_common(
    obj: &Object,
    m: &Model,
    g: &mut GenRequest,
    chat: bool,
) -> Result<(Object, bool), ApiError> {
    let c = common_fields(obj)?;
    if c.think == Some(true) && !super::facts::thinks(m) {
        let name = opt_str(obj, "model")?.unwrap_or_default();
        return Err(ApiError::bad_request(format!(
            "\"{name}\" does not support thinking"
        )));
    }
    g.stream = c.stream;
    g.grammar = c.grammar;
    g.logprobs = c.logprobs;
    g.reasoning.split = chat;
    Ok((thinking_kwargs(c.think), c.unload))
}

/// Refuses `images` when it holds any.
pub(super) fn no_images(v: Option<&Value>, name: &str) -> Result<(), ApiError> {
    match v.filter(|v| !v.is_null()) {
        None => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => Err(unsupported(name, "this server has no multimodal models")),
    }
}

/// The messages of an `/api/chat` request. A `tool` message answers a call of the
/// latest assistant message: the first unanswered one its `tool_name` names, else (no
/// `tool_name`) the first unanswered one, as ollama's results answer by order. It
/// carries that call's id and the function's name to the template.
pub(super) fn messages(obj: &Object) -> Result<Vec<ChatMessage>, ApiError> {
    let arr = match field(obj, "messages") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong("messages", "an array of messages")),
    };
    // The calls of the latest assistant message that no result has answered yet.
    let mut pending: Vec<ToolCall> = Vec::new();
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
                "system" | "user" | "assistant" | "tool" => {}
                other => {
                    return Err(ApiError::bad_request(format!(
                        "field `{}` is `{other}`: expected system, user, assistant or tool",
                        at("role")
                    )))
                }
            }
            no_images(m.get("images"), &at("images"))?;
            let content = opt_str(m, "content")
                .map_err(|_| wrong(&at("content"), "a string"))?
                .unwrap_or("");
            let mut msg = ChatMessage::new(role, content);
            match field(m, "tool_calls") {
                None => {}
                Some(_) if role != "assistant" => {
                    return Err(ApiError::bad_request(format!(
                        "field `{}` belongs only on assistant messages",
                        at("tool_calls")
                    )))
                }
                Some(v) => msg.tool_calls = history_calls(v, i)?,
            }
            // An assistant turn's reasoning, for templates that show it (Qwen3.5's
            // `reasoning_content`).
            let thinking =
                opt_str(m, "thinking").map_err(|_| wrong(&at("thinking"), "a string"))?;
            if role == "assistant" {
                msg.reasoning_content = thinking.map(str::to_string);
                pending = msg.tool_calls.clone();
            }
            let tool_name = opt_str(m, "tool_name")
                .map_err(|_| wrong(&at("tool_name"), "a string"))?
                .filter(|n| !n.is_empty());
            if role == "tool" {
                let answered = match tool_name {
                    Some(n) => pending.iter().position(|c| c.name == n),
                    None => (!pending.is_empty()).then_some(0),
                };
                let call = answered.map(|k| pending.remove(k));
                msg.name = tool_name
                    .map(str::to_string)
                    .or_else(|| call.as_ref().map(|c| c.name.clone()));
                msg.tool_call_id = call.map(|c| c.id);
            }
            Ok(msg)
        })
        .collect()
}

/// The `tool_calls` of an assistant message in ollama's shape (`function.name`, and
/// `function.arguments` as an object), with ids made up from their place, since
/// ollama's calls carry none and its tool results answer by order.
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
                    "{\"function\": {\"name\", \"arguments\": {...}}}",
                )
            };
            let f = c.get("function").ok_or_else(bad)?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(o @ Value::Object(_)) => o.to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(_) => return Err(bad()),
            };
            Ok(ToolCall {
                id: format!("call_{i}_{k}"),
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}

/// Which of the two shapes an answer takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Chat,
    Generate,
}

/// A parsed request, ready to run.
pub(super) struct Prepared {
    pub(super) prompt: Vec<u32>,
    pub(super) g: GenRequest,
    /// ollama answers a request without prompt or messages at once, with this
    /// `done_reason`: `load`, or `unload` when `keep_alive` is zero.
    pub(super) load_only: Option<&'static str>,
    /// The alternatives per token the answer's `logprobs` show, `None` for no
    /// `logprobs` (generate computes them anyway, for its `context`).
    pub(super) logprobs: Option<usize>,
}

/// The `done_reason` of a request without prompt or messages.
fn load_reason(unload: bool) -> &'static str {
    if unload {
        "unload"
    } else {
        "load"
    }
}

pub(super) fn prepare_chat(st: &AppState, m: &Model, obj: &Object) -> Result<Prepared, ApiError> {
    let mut g = parse_options(obj, m.slot_ctx)?;
    st.sampling_defaults().apply_to_ollama(&mut g.sampling, obj);
    let (kwargs, unload) = apply_common(obj, m, &mut g, true)?;
    let logprobs = g.logprobs;
    // ollama's tools have OpenAI's shape; the model may call them or answer in text.
    // `tool_choice` (OpenAI's values) is this server's extension: ollama has none, and a
    // small model may never open a call by itself.
    g.tools = tools::parse(field(obj, "tools"), field(obj, "tool_choice"), None)?;
    tools::check_output(
        g.tools.as_ref(),
        g.grammar.as_ref().map(|(gr, _)| gr),
        "format",
    )?;
    let msgs = messages(obj)?;
    if msgs.is_empty() {
        return Ok(Prepared {
            prompt: Vec::new(),
            g,
            load_only: Some(load_reason(unload)),
            logprobs,
        });
    }
    let tools = g.tools.as_ref().map(|t| &t.defs);
    let p = generate::render_chat(st, m, &msgs, tools, &kwargs)?;
    p.shape(&mut g);
    Ok(Prepared {
        prompt: p.ids,
        g,
        load_only: None,
        logprobs,
    })
}

pub(super) fn prepare_generate(
    st: &AppState,
    m: &Model,
    obj: &Object,
) -> Result<Prepared, ApiError> {
    let mut g = parse_options(obj, m.slot_ctx)?;
    st.sampling_defaults().apply_to_ollama(&mut g.sampling, obj);
    let raw = opt_bool(obj, "raw")?.unwrap_or(false);
    let suffix = opt_str(obj, "suffix")?.unwrap_or("");
    // Only a chat-rendered prompt has a reasoning block to split.
    let (kwargs, unload) = apply_common(obj, m, &mut g, !raw && suffix.is_empty())?;
    no_images(obj.get("images"), "images")?;
    if opt_str(obj, "template")?.is_some_and(|t| !t.is_empty()) {
        return Err(unsupported(
            "template",
            "ollama's Go templates are not rendered; the model's own chat template is used \
             (or send `raw: true` with a prompt formatted by the client)",
        ));
    }
    let prompt = opt_str(obj, "prompt")?.unwrap_or("");
    let system = opt_str(obj, "system")?;
    let context = match field(obj, "context") {
        None => Vec::new(),
        Some(v) => {
            let ids = fields::token_list(v, "context")?;
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
    let logprobs = g.logprobs;
    g.logprobs = Some(logprobs.unwrap_or(0));
    if prompt.is_empty() && suffix.is_empty() && context.is_empty() {
        return Ok(Prepared {
            prompt: Vec::new(),
            g,
            load_only: Some(load_reason(unload)),
            logprobs,
        });
    }
    let tokens = if !suffix.is_empty() {
        crate::api::llama::fim_prompt(m, prompt, suffix, m.answer_limit(g.max_tokens))
            .map_err(|e| ApiError::bad_request(format!("field `suffix`: {}", e.message)))?
    } else if raw {
        generate::completion_prompt(st, m, Prompt::Text(prompt.to_string()))?.0
    } else {
        let mut msgs = Vec::new();
        if let Some(sys) = system.filter(|s| !s.is_empty()) {
            msgs.push(ChatMessage::new("system", sys));
        }
        msgs.push(ChatMessage::new("user", prompt));
        let p = generate::render_chat(st, m, &msgs, None, &kwargs)?;
        p.shape(&mut g);
        p.ids
    };
    let mut all = context;
    all.extend(tokens);
    Ok(Prepared {
        prompt: all,
        g,
        load_only: None,
        logprobs,
    })
}
