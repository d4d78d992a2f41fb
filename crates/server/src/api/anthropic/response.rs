//! Anthropic's answers: the error shape, `stop_reason`, and a whole message with its
//! content blocks (`thinking`, `text`, `tool_use`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::answer::Out;
use crate::error::ApiError;
use crate::job::{Finish, Summary};
use crate::tools::Call;

/// An error in Anthropic's shape, with its status.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

/// Anthropic's status for an overloaded API, which its clients map to `OverloadedError`
/// and retry; this server's 503s (queue full, slot busy, loading, shutting down) are
/// answered with it on Anthropic's routes.
const OVERLOADED: u16 = 529;

/// Anthropic's error `type` for an HTTP status.
fn kind(status: u16) -> &'static str {
    match status {
        400 | 405 | 408 | 409 | 415 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | OVERLOADED => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}` for `e`.
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": kind(e.status.as_u16()), "message": e.message}})
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let status = match self.0.status {
            StatusCode::SERVICE_UNAVAILABLE => {
                StatusCode::from_u16(OVERLOADED).unwrap_or(self.0.status)
            }
            s => s,
        };
        let mut resp = (status, Json(error_body(&self.0))).into_response();
        if let Some(secs) = self.0.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// `stop_reason` and `stop_sequence` of an answer: what ended it, as Anthropic reports
/// it: `max_tokens` at the limit and `stop_sequence` (naming it) when one of the
/// request's sequences ended it, even after a whole tool call (a client must know the
/// turn was cut short); else `tool_use` when it called a tool (`called`), else
/// `end_turn`.
pub(super) fn stop_reason(s: &Summary, stop: &[String], called: bool) -> (&'static str, Value) {
    match (s.finish, s.stop_word.and_then(|i| stop.get(i))) {
        (Finish::Length, _) => ("max_tokens", Value::Null),
        (Finish::Stop, Some(seq)) => ("stop_sequence", json!(seq)),
        (Finish::Stop, None) if called => ("tool_use", Value::Null),
        (Finish::Stop, None) => ("end_turn", Value::Null),
    }
}

/// A `tool_use` block for `call`, its arguments as an object (a call whose arguments
/// do not parse, which constrained calls never produce, gets them as `{"arguments": text}`).
pub(super) fn tool_use(id: String, call: &Call) -> Value {
    json!({"type": "tool_use", "id": id, "name": call.name, "input": input(call)})
}

/// A call's arguments as a JSON object.
pub(super) fn input(call: &Call) -> Value {
    match serde_json::from_str::<Value>(&call.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"arguments": call.arguments}),
    }
}

/// The id of call `k` of message `msg_id`.
pub(super) fn tool_id(msg_id: &str, k: usize) -> String {
    format!("toolu_{}_{k}", msg_id.trim_start_matches("msg_"))
}

/// A whole `message` object whose content blocks are `outs`, the answer's pieces in the
/// order the model wrote them ([`crate::answer::split_ordered`]), one block each, as the
/// stream sends them: `create()` and a stream's final message agree.
pub(super) fn message(id: &str, model: &str, outs: &[Out], s: &Summary, stop: &[String]) -> Value {
    let mut content = Vec::with_capacity(outs.len());
    let mut calls = 0;
    for o in outs {
        content.push(match o {
            // No signature: the reasoning was not produced by Anthropic's models.
            Out::Reasoning(t) => json!({"type": "thinking", "thinking": t, "signature": ""}),
            Out::Text(t) => json!({"type": "text", "text": t}),
            Out::Call(c) => {
                let block = tool_use(tool_id(id, calls), c);
                calls += 1;
                block
            }
        });
    }
    let (reason, seq) = stop_reason(s, stop, calls > 0);
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": reason, "stop_sequence": seq,
        "usage": usage(s.prompt_tokens, s.completion_tokens),
    })
}

/// Anthropic's `usage`.
pub(super) fn usage(input: usize, output: usize) -> Value {
    json!({
        "input_tokens": input, "output_tokens": output,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
    })
}
