//! The response object: its fixed fields (the request's settings echoed, as OpenAI
//! answers them: numbers as sent, defaults and `tools[].strict` as applied), its final
//! state from the output items and counts, and the entry kept for
//! `previous_response_id` and `input_items`.

use minfer_tokenizer::{ChatMessage, ToolCall};
use serde_json::{json, Value};

use super::output::Builder;
use super::request::Parsed;
use super::store::Entry;
use crate::api::fields::{field, Object};
use crate::job::{Finish, Summary};

/// The response object while in progress: no output, no usage. `obj` is the request
/// `p` was read from (already checked by it).
pub(super) fn base(id: &str, created: u64, model: &str, p: &Parsed, obj: &Object) -> Value {
    let s = &p.g.sampling;
    let parallel = field(obj, "parallel_tool_calls").and_then(Value::as_bool);
    let mut text = json!({"format": p.format});
    if let Some(v) = field(obj, "text").and_then(|t| t.get("verbosity")) {
        text["verbosity"] = v.clone();
    }
    json!({
        "id": id, "object": "response", "created_at": created, "status": "in_progress",
        "background": false, "completed_at": null,
        "error": null, "incomplete_details": null, "instructions": p.instructions,
        "max_output_tokens": p.g.max_tokens, "model": model, "output": [],
        "parallel_tool_calls": p.g.tools.as_ref().map_or(parallel.unwrap_or(true), |t| t.parallel),
        "previous_response_id": p.previous, "reasoning": {"effort": null, "summary": null},
        "store": p.store, "temperature": number(obj, "temperature", s.temperature),
        "text": text,
        "tool_choice": field(obj, "tool_choice").cloned().unwrap_or_else(|| json!("auto")),
        "tools": tools(obj),
        "top_p": number(obj, "top_p", s.top_p), "truncation": "disabled", "usage": null,
        "metadata": p.metadata,
    })
}

/// The request's number `name` as sent, or, when it sent none, `effective` (the value
/// used) at its shortest decimal: an `f32` widened as it is would echo 0.2 as
/// 0.20000000298023224.
pub(super) fn number(obj: &Object, name: &str, effective: f32) -> Value {
    match field(obj, name) {
        Some(v @ Value::Number(_)) => v.clone(),
        _ => effective
            .to_string()
            .parse::<f64>()
            .map_or(Value::Null, Value::from),
    }
}

/// The request's `tools` with each `strict` as applied: function tools are strict
/// unless they say otherwise (see `request`).
fn tools(obj: &Object) -> Value {
    let Some(a) = field(obj, "tools").and_then(Value::as_array) else {
        return json!([]);
    };
    a.iter()
        .map(|t| {
            let mut t = t.clone();
            if let Some(o) = t.as_object_mut() {
                if o.get("strict").is_none_or(Value::is_null) {
                    o.insert("strict".into(), Value::Bool(true));
                }
            }
            t
        })
        .collect()
}

/// The response object once generation ended: its items, status (`incomplete` at the
/// token limit; `completed` with `completed_at`, now in Unix seconds) and usage.
pub(super) fn finished(base: &Value, b: &Builder, s: &Summary) -> Value {
    let mut r = base.clone();
    r["output"] = Value::Array(b.items().to_vec());
    if s.finish == Finish::Length {
        r["status"] = json!("incomplete");
        r["incomplete_details"] = json!({"reason": "max_output_tokens"});
    } else {
        r["status"] = json!("completed");
        r["completed_at"] = json!(crate::openai::now_secs());
    }
    r["usage"] = json!({
        "input_tokens": s.prompt_tokens,
        "input_tokens_details": {"cached_tokens": s.cached_tokens},
        "output_tokens": s.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": s.prompt_tokens + s.completion_tokens,
    });
    r
}

/// The entry kept for a continuation and for listing: the conversation so far and this
/// answer as an assistant turn with its calls, and the request's `input_items`.
pub(super) fn entry(response: Value, kept: Kept, b: &Builder, model: &str) -> Entry {
    let Kept {
        mut history,
        input_items,
    } = kept;
    let mut m = ChatMessage::new("assistant", b.text.clone());
    m.tool_calls = b
        .calls
        .iter()
        .map(|(id, c)| ToolCall {
            id: id.clone(),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        })
        .collect();
    history.push(m);
    Entry {
        response,
        history,
        model: model.to_string(),
        input_items,
    }
}

/// What a stored response keeps of its request.
#[derive(Debug)]
pub(super) struct Kept {
    /// The conversation up to this answer (see [`Entry::history`]).
    pub(super) history: Vec<ChatMessage>,
    /// The request's input as items (see [`Entry::input_items`]).
    pub(super) input_items: Vec<Value>,
}
