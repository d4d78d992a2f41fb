//! The response object: its fixed fields (the request's settings echoed, as OpenAI
//! answers them), its final state from the output items and counts, and the entry kept
//! for `previous_response_id`.

use minfer_tokenizer::{ChatMessage, ToolCall};
use serde_json::{json, Value};

use super::output::Builder;
use super::request::Parsed;
use super::store::Entry;
use crate::api::fields::{field, Object};
use crate::job::{Finish, Summary};

/// The response object while in progress: no output, no usage.
pub(super) fn base(id: &str, created: u64, model: &str, p: &Parsed, obj: &Object) -> Value {
    let s = &p.g.sampling;
    json!({
        "id": id, "object": "response", "created_at": created, "status": "in_progress",
        "error": null, "incomplete_details": null, "instructions": p.instructions,
        "max_output_tokens": p.g.max_tokens, "model": model, "output": [],
        "parallel_tool_calls": p.g.tools.as_ref().is_none_or(|t| t.parallel),
        "previous_response_id": p.previous, "reasoning": {"effort": null, "summary": null},
        "store": p.store, "temperature": s.temperature, "text": {"format": p.format},
        "tool_choice": field(obj, "tool_choice").cloned().unwrap_or_else(|| json!("auto")),
        "tools": field(obj, "tools").cloned().unwrap_or_else(|| json!([])),
        "top_p": s.top_p, "truncation": "disabled", "usage": null,
        "metadata": p.metadata,
    })
}

/// The response object once generation ended: its items, status (`incomplete` at the
/// token limit) and usage.
pub(super) fn finished(base: &Value, b: &Builder, s: &Summary) -> Value {
    let mut r = base.clone();
    r["output"] = Value::Array(b.items().to_vec());
    if s.finish == Finish::Length {
        r["status"] = json!("incomplete");
        r["incomplete_details"] = json!({"reason": "max_output_tokens"});
    } else {
        r["status"] = json!("completed");
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

/// The entry kept for a continuation: the conversation so far and this answer as an
/// assistant turn with its calls.
pub(super) fn entry(
    response: Value,
    mut history: Vec<ChatMessage>,
    b: &Builder,
    model: &str,
) -> Entry {
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
    }
}
