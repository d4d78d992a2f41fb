//! ollama's request bodies: `options` in its names and defaults, the fields common to
//! `/api/chat` and `/api/generate`, and each one's prompt.

use minfer_runtime::Grammar;
use minfer_tokenizer::{ChatMessage, ToolCall};
use serde_json::Value;

use crate::api::fields::{
    self, field, opt_bool, opt_f32, opt_str, schema_grammar, unsupported, wrong, Object,
};
use crate::api::thinking::thinking_kwargs;
use crate::error::ApiError;
use crate::generate;
use crate::params::{self, GenRequest, Prompt};
use crate::tools;
use crate::{AppState, Model};

/// Options that only tune ollama's runtime (threads, GPU layers, memory mapping): they
/// do not change the answer, and minfer sets those from its own command line.
pub(super) const RUNTIME_OPTIONS: &[&str] = &[
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
pub(super) const UNSUPPORTED_OPTIONS: &[(&str, f64)] =
    &[("mirostat", 0.0), ("typical_p", 1.0), ("tfs_z", 1.0)];

/// The request fields common to chat and generate.
#[derive(Debug)]
pub(super) struct Common {
    /// `stream` (default true).
    pub(super) stream: bool,
    /// `format`: `"json"` (any JSON object) or a JSON schema the answer must follow.
    pub(super) grammar: Option<(Grammar, &'static str)>,
    /// `think`: the template's thinking switch; absent, the template's default.
    pub(super) think: Option<bool>,
}

/// Reads `stream`, `format`, `think` and `keep_alive` (accepted: the model stays loaded).
pub(super) fn common_fields(obj: &Object) -> Result<Common, ApiError> {
    let grammar = match field(obj, "format") {
        None => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some((Grammar::JsonObject, "format")),
        // ollama has no strict mode: what cannot be enforced is left out and reported.
        Some(v @ Value::Object(_)) => Some((schema_grammar(v.clone(), false), "format")),
        Some(_) => return Err(wrong("format", "\"json\" or a JSON schema object")),
    };
    let think = match field(obj, "think") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        // gpt-oss's effort levels: this server has no levels, only on and off.
        Some(_) => return Err(wrong("think", "a boolean")),
    };
    match field(obj, "keep_alive") {
        None | Some(Value::String(_)) | Some(Value::Number(_)) => {}
        Some(_) => return Err(wrong("keep_alive", "a duration string or a number")),
    }
    Ok(Common {
        stream: opt_bool(obj, "stream")?.unwrap_or(true),
        grammar,
        think,
    })
}

/// Applies the common fields to `g`; `chat`: the prompt is a rendered chat, whose
/// reasoning is split out (ollama's `thinking`). Returns the template variables.
fn apply_common(obj: &Object, g: &mut GenRequest, chat: bool) -> Result<Object, ApiError> {
    let c = common_fields(obj)?;
    g.stream = c.stream;
    g.grammar = c.grammar;
    g.reasoning.split = chat;
    Ok(thinking_kwargs(c.think))
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
        s.top_p = fields::top_p(&name("top_p"), p)?;
    }
    if let Some(p) = num("min_p")? {
        s.min_p = fields::min_p(&name("min_p"), p)?;
    }
    if let Some(r) = num("repeat_penalty")? {
        s.repeat_penalty = fields::repeat_penalty(&name("repeat_penalty"), r)?;
    }
    if let Some(n) = int("repeat_last_n")? {
        // -1 is "the whole context": the longest window the sampler keeps.
        let whole = minfer_runtime::sampling::MAX_PENALTY_WINDOW.min(slot_ctx);
        s.penalty_last_n = fields::repeat_last_n(&name("repeat_last_n"), n, whole)?;
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
    g.stop = fields::string_list(o.get("stop"), "options.stop", "an array of strings")?;
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
pub(super) fn no_images(v: Option<&Value>, name: &str) -> Result<(), ApiError> {
    match v.filter(|v| !v.is_null()) {
        None => Ok(()),
        Some(Value::Array(a)) if a.is_empty() => Ok(()),
        Some(_) => Err(unsupported(name, "this server has no multimodal models")),
    }
}

/// The messages of an `/api/chat` request.
pub(super) fn messages(obj: &Object) -> Result<Vec<ChatMessage>, ApiError> {
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
            opt_str(m, "thinking").map_err(|_| wrong(&at("thinking"), "a string"))?;
            opt_str(m, "tool_name").map_err(|_| wrong(&at("tool_name"), "a string"))?;
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
    /// ollama answers a request without prompt or messages by loading the model.
    pub(super) load_only: bool,
}

pub(super) fn prepare_chat(st: &AppState, m: &Model, obj: &Object) -> Result<Prepared, ApiError> {
    let mut g = parse_options(obj, m.slot_ctx)?;
    let kwargs = apply_common(obj, &mut g, true)?;
    // ollama's tools have OpenAI's shape; the model may call them or answer in text.
    // `tool_choice` (OpenAI's values) is this server's extension: ollama has none, and a
    // small model may never open a call by itself.
    g.tools = tools::parse(field(obj, "tools"), field(obj, "tool_choice"), None)?;
    if g.tools.is_some() && g.grammar.is_some() {
        return Err(ApiError::bad_request(
            "fields `tools` and `format` cannot both constrain one answer: give one",
        ));
    }
    let msgs = messages(obj)?;
    if msgs.is_empty() {
        return Ok(Prepared {
            prompt: Vec::new(),
            g,
            load_only: true,
        });
    }
    let tools = g.tools.as_ref().map(|t| &t.defs);
    let p = generate::render_chat(st, m, &msgs, tools, &kwargs)?;
    g.reasoning.open = p.think_open;
    g.reasoning.harmony = p.harmony;
    Ok(Prepared {
        prompt: p.ids,
        g,
        load_only: false,
    })
}

pub(super) fn prepare_generate(
    st: &AppState,
    m: &Model,
    obj: &Object,
) -> Result<Prepared, ApiError> {
    let mut g = parse_options(obj, m.slot_ctx)?;
    let raw = opt_bool(obj, "raw")?.unwrap_or(false);
    let suffix = opt_str(obj, "suffix")?.unwrap_or("");
    // Only a chat-rendered prompt has a reasoning block to split.
    let kwargs = apply_common(obj, &mut g, !raw && suffix.is_empty())?;
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
    g.logprobs = Some(0);
    if prompt.is_empty() && suffix.is_empty() && context.is_empty() {
        return Ok(Prepared {
            prompt: Vec::new(),
            g,
            load_only: true,
        });
    }
    let tokens = if !suffix.is_empty() {
        crate::api::llama::fim_prompt(m, prompt, suffix, g.max_tokens)
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
        g.reasoning.open = p.think_open;
        g.reasoning.harmony = p.harmony;
        p.ids
    };
    let mut all = context;
    all.extend(tokens);
    Ok(Prepared {
        prompt: all,
        g,
        load_only: false,
    })
}
