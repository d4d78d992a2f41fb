//! Anthropic's request body read into chat messages and the shared generation request:
//! `system` (a string or text blocks), `messages` whose content is a string or blocks
//! (`text`, `tool_use` on assistant turns, `tool_result` on user turns; an assistant
//! turn's `thinking` blocks are its reasoning for the template, `redacted_thinking`
//! dropped; consecutive messages of one role are one turn, as Anthropic combines them),
//! `tools` with `input_schema`, `tool_choice`, `stop_sequences`, `temperature`, `top_p`,
//! `top_k`, `stream`, `thinking` (the template's thinking switch), `output_config.format`
//! (a JSON schema the answer follows, through the shared constraint), and `metadata`,
//! `service_tier`, `cache_control` and `output_config.effort` (no effect).
//! Anything else is refused by name.

use minfer_runtime::Grammar;
use minfer_tokenizer::{ChatMessage, ToolCall};
use serde_json::{json, Value};

use crate::api::fields::{
    check_stop, field, only_known, opt_bool, opt_f32_in, opt_i64, opt_str, out_of_range,
    string_list, top_p, wrong, Object,
};
use crate::api::thinking::thinking_kwargs;
use crate::error::ApiError;
use crate::params::GenRequest;
use crate::tools;

/// Fields of a Messages request.
pub const FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "metadata",
    "thinking",
    "service_tier",
    "output_config",
    "cache_control",
];

/// A read request.
#[derive(Debug)]
pub struct Parsed {
    /// The conversation, system prompt first.
    pub msgs: Vec<ChatMessage>,
    /// Generation settings; `max_tokens` is the request's (capped to the slot later).
    pub g: GenRequest,
    /// Extra chat template variables (`enable_thinking` from `thinking`).
    pub kwargs: Object,
}

/// Reads a Messages request; `count_only` (count_tokens) needs no `max_tokens` and
/// takes no sampling fields.
pub fn parse(obj: &Object, count_only: bool) -> Result<Parsed, ApiError> {
    let known: &[&str] = if count_only {
        &[
            "model",
            "messages",
            "system",
            "tools",
            "tool_choice",
            "thinking",
            "output_config",
            "cache_control",
        ]
    } else {
        FIELDS
    };
    only_known(obj, known, "")?;
    let model = opt_str(obj, "model")?.ok_or_else(|| required("model"))?;
    let mut g = GenRequest {
        model: Some(model.to_string()),
        ..GenRequest::default()
    };
    if !count_only {
        g.max_tokens = match field(obj, "max_tokens") {
            None => return Err(required("max_tokens")),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                _ => return Err(wrong("max_tokens", "an integer >= 1")),
            },
        };
        sampling(obj, &mut g)?;
        g.stream = opt_bool(obj, "stream")?.unwrap_or(false);
        if field(obj, "metadata").is_some_and(|m| !m.is_object()) {
            return Err(wrong("metadata", "an object"));
        }
        opt_str(obj, "service_tier")?;
    }
    let mut msgs = Vec::new();
    if let Some(sys) = system(obj)? {
        msgs.push(ChatMessage::new("system", sys));
    }
    messages(obj, &mut msgs)?;
    g.tools = tool_spec(obj)?;
    g.grammar = output_format(obj)?;
    crate::tools::check_output(
        g.tools.as_ref(),
        g.grammar.as_ref().map(|(gr, _)| gr),
        "output_config.format",
    )?;
    g.reasoning.split = true;
    let kwargs = thinking_kwargs(thinking(obj)?);
    Ok(Parsed { msgs, g, kwargs })
}

fn required(name: &str) -> ApiError {
    ApiError::bad_request(format!("field `{name}` is required")).with_param(name)
}

/// `temperature` (Anthropic's range, [0, 1]), `top_p`, `top_k` and `stop_sequences`.
fn sampling(obj: &Object, g: &mut GenRequest) -> Result<(), ApiError> {
    let s = &mut g.sampling;
    if let Some(t) = opt_f32_in(obj, "temperature", 0.0, 1.0, "in [0, 1]")? {
        s.temperature = t;
    }
    if let Some(p) = opt_f32_in(obj, "top_p", 0.0, 1.0, "in (0, 1]")? {
        s.top_p = top_p("top_p", p)?;
    }
    match opt_i64(obj, "top_k").map_err(|_| wrong("top_k", "a positive integer"))? {
        None => {}
        Some(k) if k >= 1 => s.top_k = usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => return Err(out_of_range("top_k", k, "a positive integer")),
    }
    g.stop = string_list(
        field(obj, "stop_sequences"),
        "stop_sequences",
        "an array of strings",
    )?;
    check_stop(&g.stop).map_err(|e| {
        ApiError::bad_request(e.message.replace("`stop", "`stop_sequences"))
            .with_param("stop_sequences")
    })?;
    Ok(())
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` turns the template's thinking
/// on (the budget is not enforced), `{"type": "disabled"}` off, `{"type": "adaptive"}`
/// leaves it to the template's default, as does no `thinking` at all; `display` is
/// accepted (the reasoning is always shown).
fn thinking(obj: &Object) -> Result<Option<bool>, ApiError> {
    let Some(t) = field(obj, "thinking") else {
        return Ok(None);
    };
    let o = t
        .as_object()
        .ok_or_else(|| wrong("thinking", "an object with a `type`"))?;
    only_known(o, &["type", "budget_tokens", "display"], "thinking.")?;
    opt_str(o, "display")?;
    match o.get("type").and_then(Value::as_str) {
        Some("enabled") => {
            if field(o, "budget_tokens").is_some_and(|b| b.as_u64().is_none()) {
                return Err(wrong("thinking.budget_tokens", "a non-negative integer"));
            }
            Ok(Some(true))
        }
        Some("disabled") => Ok(Some(false)),
        Some("adaptive") => Ok(None),
        _ => Err(wrong(
            "thinking.type",
            "`enabled`, `adaptive` or `disabled`",
        )),
    }
}

/// `output_config`: `format` `{"type": "json_schema", "schema"}` constrains the answer
/// to the schema; `effort` is accepted without effect.
fn output_format(obj: &Object) -> Result<Option<(Grammar, &'static str)>, ApiError> {
    let Some(c) = field(obj, "output_config") else {
        return Ok(None);
    };
    let c = c
        .as_object()
        .ok_or_else(|| wrong("output_config", "an object"))?;
    only_known(c, &["format", "effort"], "output_config.")?;
    opt_str(c, "effort")?;
    let Some(f) = field(c, "format") else {
        return Ok(None);
    };
    let f = f
        .as_object()
        .ok_or_else(|| wrong("output_config.format", "an object"))?;
    only_known(f, &["type", "schema"], "output_config.format.")?;
    if f.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err(wrong("output_config.format.type", "`json_schema`"));
    }
    match field(f, "schema") {
        Some(s @ Value::Object(_)) => Ok(Some((
            Grammar::JsonSchema(s.clone()),
            "output_config.format",
        ))),
        _ => Err(wrong("output_config.format.schema", "a JSON schema object")),
    }
}

/// The text of a `system` field or of a tool result: a string or text blocks, joined
/// with a newline.
fn text_blocks(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                let here = format!("{at}[{j}]");
                let o = b.as_object().ok_or_else(|| wrong(&here, "a text block"))?;
                parts.push(text_block(o, &here)?);
            }
            Ok(parts.join("\n"))
        }
        _ => Err(wrong(at, "a string or an array of text blocks")),
    }
}

/// One `text` block's text (`cache_control` and `citations` ignored); another block
/// type is refused, naming it.
fn text_block(o: &Object, at: &str) -> Result<String, ApiError> {
    if o.get("type").and_then(Value::as_str) != Some("text") {
        return Err(unsupported_block(at, o));
    }
    only_known(
        o,
        &["type", "text", "cache_control", "citations"],
        &format!("{at}."),
    )?;
    Ok(opt_str(o, "text")?
        .ok_or_else(|| wrong(&format!("{at}.text"), "a string"))?
        .to_string())
}

fn unsupported_block(at: &str, o: &Object) -> ApiError {
    let ty = o.get("type").and_then(Value::as_str).unwrap_or("(none)");
    let why = match ty {
        "image" | "document" => {
            format!("{ty} input is not supported: the served models read text only")
        }
        _ => "this server takes text, tool_use, tool_result and thinking blocks only".to_string(),
    };
    ApiError::bad_request(format!("field `{at}.type` is `{ty}`: {why}"))
        .with_param(format!("{at}.type"))
}

fn system(obj: &Object) -> Result<Option<String>, ApiError> {
    field(obj, "system")
        .map(|v| text_blocks(v, "system"))
        .transpose()
        .map(|s| s.filter(|s| !s.is_empty()))
}

/// `messages`, appended to `out`. Consecutive messages of one role are one turn, their
/// blocks in order, as Anthropic combines them (see [`turns`]). A user turn's
/// `tool_result` blocks become `tool` messages (each must answer a `tool_use` of the
/// assistant turn before it), its text a user message; an assistant turn's `tool_use`
/// blocks become its tool calls. Errors name the block's place in the request as sent.
fn messages(obj: &Object, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    // The previous assistant turn's `tool_use` blocks: their places and ids.
    let mut asked: Vec<(String, String)> = Vec::new();
    for (role, blocks) in turns(obj)? {
        let mut text = Vec::new();
        let mut thinking = Vec::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for (here, b) in blocks {
            let o = match b {
                Content::Text(t) => {
                    text.push(t.to_string());
                    continue;
                }
                Content::Block(b) => b
                    .as_object()
                    .ok_or_else(|| wrong(&here, "a content block"))?,
            };
            let ty = o.get("type").and_then(Value::as_str).unwrap_or("");
            match (ty, role) {
                ("text", _) => text.push(text_block(o, &here)?),
                ("thinking", "assistant") => {
                    only_known(
                        o,
                        &["type", "thinking", "signature", "cache_control"],
                        &format!("{here}."),
                    )?;
                    // The reasoning goes back to the template as the turn's
                    // `reasoning_content`, which thinking models' templates render.
                    let t = o
                        .get("thinking")
                        .and_then(Value::as_str)
                        .ok_or_else(|| wrong(&format!("{here}.thinking"), "a string"))?;
                    thinking.push(t.to_string());
                }
                // Encrypted reasoning of another provider: nothing a local model can read.
                ("redacted_thinking", "assistant") => {}
                ("tool_use", "assistant") => {
                    only_known(
                        o,
                        &["type", "id", "name", "input", "cache_control"],
                        &format!("{here}."),
                    )?;
                    let id = opt_str(o, "id")?.ok_or_else(|| required(&format!("{here}.id")))?;
                    let name =
                        opt_str(o, "name")?.ok_or_else(|| required(&format!("{here}.name")))?;
                    let input = match field(o, "input") {
                        None => json!({}),
                        Some(v @ Value::Object(_)) => v.clone(),
                        Some(_) => return Err(wrong(&format!("{here}.input"), "an object")),
                    };
                    asked.push((here.clone(), id.to_string()));
                    calls.push(ToolCall {
                        id: id.to_string(),
                        name: name.to_string(),
                        arguments: input.to_string(),
                    });
                }
                ("tool_result", "user") => {
                    only_known(
                        o,
                        &[
                            "type",
                            "tool_use_id",
                            "content",
                            "is_error",
                            "cache_control",
                        ],
                        &format!("{here}."),
                    )?;
                    let id = opt_str(o, "tool_use_id")?
                        .ok_or_else(|| required(&format!("{here}.tool_use_id")))?;
                    opt_bool(o, "is_error")?;
                    let answered = out
                        .last()
                        .filter(|p| p.role == "assistant")
                        .is_some_and(|p| p.tool_calls.iter().any(|c| c.id == id));
                    if !answered {
                        return Err(ApiError::bad_request(format!(
                            "{here} is a tool_result for tool_use_id `{id}`, but the assistant \
                             turn before it has no tool_use with that id"
                        ))
                        .with_param(format!("{here}.tool_use_id")));
                    }
                    let body = match field(o, "content") {
                        None => String::new(),
                        Some(v) => text_blocks(v, &format!("{here}.content"))?,
                    };
                    let mut msg = ChatMessage::new("tool", body);
                    msg.tool_call_id = Some(id.to_string());
                    results.push(msg);
                }
                _ => return Err(unsupported_block(&here, o)),
            }
        }
        if role == "user" {
            unanswered(&asked, &results)?;
            asked.clear();
        }
        // Results answer the previous turn, so they come before this turn's own text.
        out.extend(results);
        if role == "assistant" || !text.is_empty() {
            let mut msg = ChatMessage::new(role, text.join("\n"));
            msg.tool_calls = calls;
            if !thinking.is_empty() {
                msg.reasoning_content = Some(thinking.join("\n"));
            }
            out.push(msg);
        }
    }
    Ok(())
}

/// Refuses a user turn that leaves a `tool_use` of the assistant turn before it
/// (`asked`: places and ids) without its `tool_result`, as Anthropic's API does: the
/// model would otherwise go on as if the call had answered.
fn unanswered(asked: &[(String, String)], results: &[ChatMessage]) -> Result<(), ApiError> {
    let missing = asked
        .iter()
        .find(|(_, id)| !results.iter().any(|r| r.tool_call_id.as_ref() == Some(id)));
    match missing {
        None => Ok(()),
        Some((here, id)) => Err(ApiError::bad_request(format!(
            "{here} is a tool_use (id `{id}`) with no tool_result in the next message: each \
             tool_use block must have a corresponding tool_result block in the next message"
        ))
        .with_param(format!("{here}.id"))),
    }
}

/// A piece of a message's content.
enum Content<'a> {
    /// String content: one text block.
    Text(&'a str),
    /// An element of array content, not yet checked.
    Block(&'a Value),
}

/// A turn: its role and its content, each piece with its place in the request
/// (`messages[i].content[j]`, or `messages[i].content` for string content).
type Turn<'a> = (&'a str, Vec<(String, Content<'a>)>);

/// `messages` checked message by message and grouped into turns: consecutive messages of
/// one role are one turn, their blocks concatenated in order, as Anthropic's API
/// combines them ("consecutive user or assistant turns in your request will be combined
/// into a single turn"); clients send a turn's tool results as one message each.
fn turns(obj: &Object) -> Result<Vec<Turn<'_>>, ApiError> {
    let arr = field(obj, "messages")
        .ok_or_else(|| required("messages"))?
        .as_array()
        .ok_or_else(|| wrong("messages", "an array of messages"))?;
    if arr.is_empty() {
        return Err(wrong("messages", "a non-empty array"));
    }
    let mut turns: Vec<Turn<'_>> = Vec::new();
    for (i, m) in arr.iter().enumerate() {
        let at = format!("messages[{i}]");
        let m = m.as_object().ok_or_else(|| wrong(&at, "an object"))?;
        only_known(m, &["role", "content"], &format!("{at}."))?;
        let role = opt_str(m, "role")?.ok_or_else(|| required(&format!("{at}.role")))?;
        if role != "user" && role != "assistant" {
            return Err(ApiError::bad_request(format!(
                "field `{at}.role` is `{role}`: expected user or assistant (the system \
                 prompt goes in `system`)"
            ))
            .with_param(format!("{at}.role")));
        }
        let content = field(m, "content").ok_or_else(|| required(&format!("{at}.content")))?;
        let blocks: Vec<(String, Content<'_>)> = match content {
            Value::String(t) => vec![(format!("{at}.content"), Content::Text(t))],
            Value::Array(b) => b
                .iter()
                .enumerate()
                .map(|(j, b)| (format!("{at}.content[{j}]"), Content::Block(b)))
                .collect(),
            _ => {
                return Err(wrong(
                    &format!("{at}.content"),
                    "a string or an array of blocks",
                ))
            }
        };
        match turns.last_mut() {
            Some((r, prev)) if *r == role => prev.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    Ok(turns)
}

/// `tools` and `tool_choice` in the shared tool machinery: each tool's `input_schema`
/// is its parameters; `tool_choice` `auto`, `any` (some call), `tool` (that one) or
/// `none`, with `disable_parallel_tool_use`.
fn tool_spec(obj: &Object) -> Result<Option<tools::ToolSpec>, ApiError> {
    let defs = match field(obj, "tools") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(wrong("tools", "an array of tools")),
    };
    let mut openai = Vec::with_capacity(defs.len());
    for (i, t) in defs.iter().enumerate() {
        let at = format!("tools[{i}]");
        let o = t.as_object().ok_or_else(|| wrong(&at, "an object"))?;
        if let Some(ty) = opt_str(o, "type")?.filter(|t| *t != "custom") {
            return Err(ApiError::bad_request(format!(
                "field `{at}.type` is `{ty}`: only client tools (with `input_schema`) are supported"
            ))
            .with_param(format!("{at}.type")));
        }
        only_known(
            o,
            &[
                "type",
                "name",
                "description",
                "input_schema",
                "cache_control",
                "strict",
            ],
            &format!("{at}."),
        )?;
        let schema =
            field(o, "input_schema").ok_or_else(|| required(&format!("{at}.input_schema")))?;
        // `strict: true` refuses a schema keyword the grammar cannot enforce; without it
        // the keyword is left out and reported.
        let strict = opt_bool(o, "strict")?.unwrap_or(false);
        openai.push(json!({"type": "function", "function": {
            "name": o.get("name").cloned().unwrap_or(Value::Null),
            "description": o.get("description").cloned().unwrap_or(Value::Null),
            "parameters": schema,
            "strict": strict,
        }}));
    }
    let (choice, parallel) = match field(obj, "tool_choice") {
        None => (None, None),
        Some(Value::Object(c)) => {
            only_known(
                c,
                &["type", "name", "disable_parallel_tool_use"],
                "tool_choice.",
            )?;
            let parallel = opt_bool(c, "disable_parallel_tool_use")?.map(|d| !d);
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => json!("auto"),
                Some("any") => json!("required"),
                Some("none") => json!("none"),
                Some("tool") => {
                    let name = opt_str(c, "name")?.ok_or_else(|| required("tool_choice.name"))?;
                    json!({"type": "function", "function": {"name": name}})
                }
                _ => return Err(wrong("tool_choice.type", "auto, any, tool or none")),
            };
            (Some(choice), parallel)
        }
        Some(_) => return Err(wrong("tool_choice", "an object with a `type`")),
    };
    let arr = Value::Array(openai);
    let mut spec = tools::parse(Some(&arr), choice.as_ref(), parallel).map_err(|mut e| {
        // The shared reader names OpenAI's nesting; Anthropic's tools are flat.
        e.message = e.message.replace(".function.", ".");
        e.param = e.param.map(|p| p.replace(".function.", "."));
        e
    })?;
    if let Some(s) = &mut spec {
        // The template shows the tools in OpenAI's shape, which it knows.
        s.defs = arr;
    }
    Ok(spec)
}
