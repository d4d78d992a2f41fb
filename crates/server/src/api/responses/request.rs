//! The Responses API's request body read into chat messages and the shared generation
//! request: `input` as a string or items (messages with text parts, `function_call` and
//! `function_call_output` items; `reasoning` items are dropped), `instructions`,
//! `text.format` (JSON schema or JSON object, through the shared constraint), function
//! `tools` and `tool_choice`, sampling fields, `stream`, `store`, `metadata` and
//! `previous_response_id`; `background: false` and a `reasoning` that asks for nothing
//! are taken as OpenAI's defaults. Anything else is refused by name, the name in
//! `param` too.

use minfer_runtime::Grammar;
use minfer_tokenizer::{ChatMessage, ToolCall};
use serde_json::{json, Value};

use crate::api::fields::{
    field, only_known, opt_bool, opt_f32_in, opt_str, schema_grammar, top_p, unsupported, wrong,
    Object,
};
use crate::error::ApiError;
use crate::params::GenRequest;
use crate::tools;

/// Fields of a Responses request.
pub const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "text",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "stream",
    "stream_options",
    "store",
    "previous_response_id",
    "metadata",
    "user",
    "truncation",
    "include",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "chat_template_kwargs",
    "enable_thinking",
    "timings_per_token",
    "return_progress",
    "background",
    "reasoning",
];

/// Most `metadata` pairs, as OpenAI has it.
pub const METADATA_PAIRS: usize = 16;

/// Longest `metadata` key, in characters, as OpenAI has it.
pub const METADATA_KEY_CHARS: usize = 64;

/// Longest `metadata` value, in characters, as OpenAI has it.
pub const METADATA_VALUE_CHARS: usize = 512;

/// A read request.
#[derive(Debug)]
pub struct Parsed {
    /// `instructions`, the system prompt of this request only.
    pub instructions: Option<String>,
    /// The new input as chat messages (appended to the previous response's history).
    pub input: Vec<ChatMessage>,
    /// Generation settings.
    pub g: GenRequest,
    /// `previous_response_id`.
    pub previous: Option<String>,
    /// `store` (default true): keep the response for `previous_response_id` and GET.
    pub store: bool,
    /// `text.format` as given (echoed in the response), `{"type": "text"}` by default.
    pub format: Value,
    /// `metadata` as given (echoed).
    pub metadata: Value,
}

fn required(name: &str) -> ApiError {
    ApiError::bad_request(format!("field `{name}` is required")).with_param(name)
}

/// Reads a Responses request; a refusal is a 400 whose `param` names the field at fault.
pub fn parse(obj: &Object) -> Result<Parsed, ApiError> {
    read(obj).map_err(ApiError::naming_field)
}

/// [`parse`], before `param` is filled in.
fn read(obj: &Object) -> Result<Parsed, ApiError> {
    only_known(obj, FIELDS, "")?;
    let mut g = GenRequest {
        model: opt_str(obj, "model")?.map(str::to_string),
        ..GenRequest::default()
    };
    opt_str(obj, "user")?;
    if let Some(t) = opt_f32_in(obj, "temperature", 0.0, 2.0, "in [0, 2]")? {
        g.sampling.temperature = t;
    }
    if let Some(p) = opt_f32_in(obj, "top_p", 0.0, 1.0, "in (0, 1]")? {
        g.sampling.top_p = top_p("top_p", p)?;
    }
    g.max_tokens = match field(obj, "max_output_tokens") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
            _ => return Err(wrong("max_output_tokens", "an integer >= 1")),
        },
    };
    g.stream = opt_bool(obj, "stream")?.unwrap_or(false);
    g.telemetry = crate::api::timings::telemetry(obj)?;
    if field(obj, "stream_options").is_some() && !g.stream {
        return Err(ApiError::bad_request(
            "field `stream_options` is only allowed when `stream` is true",
        ));
    }
    let store = opt_bool(obj, "store")?.unwrap_or(true);
    match opt_str(obj, "truncation")? {
        None | Some("disabled") => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "field `truncation` is `{other}`: only `disabled` is supported (a prompt \
                 past the context is refused)"
            ))
            .with_param("truncation"))
        }
    }
    if field(obj, "include").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(ApiError::bad_request(
            "field `include` is not supported: no extra output data is available",
        )
        .with_param("include"));
    }
    if opt_bool(obj, "background")? == Some(true) {
        return Err(unsupported(
            "background",
            "this server has no background mode: the answer is generated while the \
             request waits (`stream` sends it as it comes)",
        ));
    }
    reasoning(obj)?;
    let metadata = metadata(obj)?;
    let instructions = opt_str(obj, "instructions")?
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let previous = opt_str(obj, "previous_response_id")?.map(str::to_string);
    let input = input(obj)?;
    let format = field(obj, "text")
        .map(|t| {
            let t = t.as_object().ok_or_else(|| wrong("text", "an object"))?;
            only_known(t, &["format", "verbosity"], "text.")?;
            // Taken and echoed, as OpenAI's models take it as a hint; the answer's length
            // is the model's own here.
            if let Some(v) = opt_str(t, "verbosity")? {
                if !["low", "medium", "high"].contains(&v) {
                    return Err(wrong("text.verbosity", "`low`, `medium` or `high`"));
                }
            }
            Ok::<_, ApiError>(field(t, "format").cloned())
        })
        .transpose()?
        .flatten()
        .unwrap_or_else(|| json!({"type": "text"}));
    g.grammar = grammar(&format)?;
    g.tools = tool_spec(obj)?;
    crate::tools::check_output(
        g.tools.as_ref(),
        g.grammar.as_ref().map(|(gr, _)| gr),
        "text.format",
    )?;
    g.reasoning.split = true;
    Ok(Parsed {
        instructions,
        input,
        g,
        previous,
        store,
        format,
        metadata,
    })
}

/// `reasoning`: its `effort` is taken (read into the template's variables with the
/// chat template's other switches); a summary is refused (deliberately, see the
/// README), since none is written.
fn reasoning(obj: &Object) -> Result<(), ApiError> {
    let Some(r) = field(obj, "reasoning") else {
        return Ok(());
    };
    let r = r
        .as_object()
        .ok_or_else(|| wrong("reasoning", "an object"))?;
    let keys = ["effort", "summary", "generate_summary"];
    only_known(r, &keys, "reasoning.")?;
    // `effort` reaches the template as chat's `reasoning_effort` does
    // (`api::thinking::template_kwargs`); no summary is written.
    match keys[1..].iter().find(|k| field(r, k).is_some()) {
        None => Ok(()),
        Some(k) => Err(unsupported(
            &format!("reasoning.{k}"),
            "no reasoning summary is written: a thinking model's reasoning comes whole, \
             as a `reasoning` item",
        )),
    }
}

/// `metadata`: an object of at most [`METADATA_PAIRS`] string pairs, keys of at most
/// [`METADATA_KEY_CHARS`] characters and values of at most [`METADATA_VALUE_CHARS`], as
/// OpenAI refuses others; `{}` when absent.
fn metadata(obj: &Object) -> Result<Value, ApiError> {
    let m = match field(obj, "metadata") {
        None => return Ok(json!({})),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(wrong("metadata", "an object of string values")),
    };
    let bad = |why: String| {
        ApiError::bad_request(format!("field `metadata` {why}")).with_param("metadata")
    };
    if m.len() > METADATA_PAIRS {
        return Err(bad(format!(
            "has {} pairs: at most {METADATA_PAIRS} are allowed",
            m.len()
        )));
    }
    for (k, v) in m {
        let n = k.chars().count();
        if n > METADATA_KEY_CHARS {
            return Err(bad(format!(
                "has a key of {n} characters: keys are at most {METADATA_KEY_CHARS}"
            )));
        }
        match v.as_str().map(|s| s.chars().count()) {
            None => return Err(bad(format!("key `{k}` must have a string value"))),
            Some(n) if n > METADATA_VALUE_CHARS => {
                return Err(bad(format!(
                    "key `{k}` has a value of {n} characters: values are at most \
                     {METADATA_VALUE_CHARS}"
                )))
            }
            Some(_) => {}
        }
    }
    Ok(Value::Object(m.clone()))
}

/// `text.format`: `text`, `json_object`, or `json_schema` with `schema` (and `name`,
/// `description`, `strict`), flat as the Responses API has it.
fn grammar(format: &Value) -> Result<Option<(Grammar, &'static str)>, ApiError> {
    let f = format
        .as_object()
        .ok_or_else(|| wrong("text.format", "an object with a `type`"))?;
    only_known(
        f,
        &["type", "name", "schema", "strict", "description"],
        "text.format.",
    )?;
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some((Grammar::JsonObject, "text.format"))),
        Some("json_schema") => {
            opt_str(f, "name")?;
            let strict = opt_bool(f, "strict")?.unwrap_or(false);
            let schema = field(f, "schema").ok_or_else(|| required("text.format.schema"))?;
            if !schema.is_object() {
                return Err(wrong("text.format.schema", "a JSON schema object"));
            }
            Ok(Some((
                schema_grammar(schema.clone(), strict),
                "text.format",
            )))
        }
        _ => Err(wrong(
            "text.format.type",
            "text, json_object or json_schema",
        )),
    }
}

/// `tools` (function tools, flat: `name`, `description`, `parameters`, `strict`) and
/// `tool_choice` in the shared tool machinery.
fn tool_spec(obj: &Object) -> Result<Option<tools::ToolSpec>, ApiError> {
    let defs = match field(obj, "tools") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(wrong("tools", "an array of tools")),
    };
    let mut nested = Vec::with_capacity(defs.len());
    for (i, t) in defs.iter().enumerate() {
        let at = format!("tools[{i}]");
        let o = t.as_object().ok_or_else(|| wrong(&at, "an object"))?;
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "field `{at}.type` is `{}`: only function tools are supported",
                    other.unwrap_or("(none)")
                ))
                .with_param(format!("{at}.type")))
            }
        }
        only_known(
            o,
            &["type", "name", "description", "parameters", "strict"],
            &format!("{at}."),
        )?;
        // The Responses API's function tools are strict unless they say otherwise.
        let strict = opt_bool(o, "strict")?.unwrap_or(true);
        let mut f = o.clone();
        f.remove("type");
        f.insert("strict".into(), strict.into());
        nested.push(json!({"type": "function", "function": f}));
    }
    let choice = match field(obj, "tool_choice") {
        None => None,
        Some(v @ Value::String(_)) => Some(v.clone()),
        Some(Value::Object(c)) => {
            only_known(c, &["type", "name"], "tool_choice.")?;
            if c.get("type").and_then(Value::as_str) != Some("function") {
                return Err(wrong("tool_choice.type", "`function`"));
            }
            let name = opt_str(c, "name")?.ok_or_else(|| required("tool_choice.name"))?;
            Some(json!({"type": "function", "function": {"name": name}}))
        }
        Some(_) => return Err(wrong("tool_choice", "auto, none, required or a function")),
    };
    let arr = Value::Array(nested);
    tools::parse(
        Some(&arr),
        choice.as_ref(),
        opt_bool(obj, "parallel_tool_calls")?,
    )
    .map_err(|mut e| {
        // The shared reader names Chat Completions' nesting; these tools are flat.
        e.message = e.message.replace(".function.", ".");
        e.param = e.param.map(|p| p.replace(".function.", "."));
        e
    })
}

/// `input`: a string (one user message) or items.
fn input(obj: &Object) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match field(obj, "input") {
        None => return Err(required("input")),
        Some(Value::String(s)) => return Ok(vec![ChatMessage::new("user", s.clone())]),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong("input", "a string or an array of items")),
    };
    let mut out: Vec<ChatMessage> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let o = item.as_object().ok_or_else(|| wrong(&at, "an object"))?;
        let ty = opt_str(o, "type")?.unwrap_or("message");
        match ty {
            "message" => {
                only_known(
                    o,
                    &["type", "role", "content", "id", "status"],
                    &format!("{at}."),
                )?;
                let role = match opt_str(o, "role")?.ok_or_else(|| required(&format!("{at}.role")))? {
                    "system" | "developer" => "system",
                    "user" => "user",
                    "assistant" => "assistant",
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "field `{at}.role` is `{other}`: expected user, assistant, system or developer"
                        ))
                        .with_param(format!("{at}.role")))
                    }
                };
                let content =
                    field(o, "content").ok_or_else(|| required(&format!("{at}.content")))?;
                out.push(ChatMessage::new(
                    role,
                    parts(content, &format!("{at}.content"))?,
                ));
            }
            "function_call" => {
                only_known(
                    o,
                    &["type", "call_id", "name", "arguments", "id", "status"],
                    &format!("{at}."),
                )?;
                let call = ToolCall {
                    id: opt_str(o, "call_id")?
                        .ok_or_else(|| required(&format!("{at}.call_id")))?
                        .to_string(),
                    name: opt_str(o, "name")?
                        .ok_or_else(|| required(&format!("{at}.name")))?
                        .to_string(),
                    arguments: opt_str(o, "arguments")?.unwrap_or("{}").to_string(),
                };
                // Calls join the assistant turn they follow, or make one.
                match out.last_mut().filter(|m| m.role == "assistant") {
                    Some(m) => m.tool_calls.push(call),
                    None => {
                        let mut m = ChatMessage::new("assistant", "");
                        m.tool_calls.push(call);
                        out.push(m);
                    }
                }
            }
            "function_call_output" => {
                only_known(
                    o,
                    &["type", "call_id", "output", "id", "status"],
                    &format!("{at}."),
                )?;
                let id =
                    opt_str(o, "call_id")?.ok_or_else(|| required(&format!("{at}.call_id")))?;
                let output = field(o, "output").ok_or_else(|| required(&format!("{at}.output")))?;
                let mut m = ChatMessage::new("tool", parts(output, &format!("{at}.output"))?);
                m.tool_call_id = Some(id.to_string());
                out.push(m);
            }
            "reasoning" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "field `{at}.type` is `{other}`: expected message, function_call, \
                     function_call_output or reasoning"
                ))
                .with_param(format!("{at}.type")))
            }
        }
    }
    if out.is_empty() {
        return Err(wrong("input", "a string or a non-empty array of items"));
    }
    Ok(out)
}

/// A message's content: a string or text parts (`input_text`, `output_text`), joined.
fn parts(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(ps) => {
            let mut s = String::new();
            for (j, p) in ps.iter().enumerate() {
                let here = format!("{at}[{j}]");
                let ty = p.get("type").and_then(Value::as_str).unwrap_or("");
                if ty != "input_text" && ty != "output_text" {
                    return Err(ApiError::bad_request(format!(
                        "field `{here}.type` is `{ty}`: only input_text and output_text parts \
                         are supported"
                    ))
                    .with_param(format!("{here}.type")));
                }
                s.push_str(
                    p.get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| wrong(&format!("{here}.text"), "a string"))?,
                );
            }
            Ok(s)
        }
        _ => Err(wrong(at, "a string or an array of text parts")),
    }
}

/// Checks that every `tool` message of `msgs` answers a call of an assistant message
/// before it (in this request or the history it continues).
pub fn check_results(msgs: &[ChatMessage]) -> Result<(), ApiError> {
    for (i, m) in msgs.iter().enumerate() {
        let Some(id) = m.tool_call_id.as_deref() else {
            continue;
        };
        if !msgs[..i]
            .iter()
            .any(|p| p.tool_calls.iter().any(|c| c.id == id))
        {
            return Err(ApiError::bad_request(format!(
                "a function_call_output answers call_id `{id}`, but no function_call with \
                 that call_id precedes it"
            ))
            .with_param("input"));
        }
    }
    Ok(())
}
