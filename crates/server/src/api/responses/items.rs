//! A response's input items: the request's `input` written as the Responses API lists
//! it (`GET /v1/responses/{id}/input_items`), each item with an `id`, and the list page
//! that endpoint answers (`limit`, `order`, `after`).

use serde_json::{json, Value};

use crate::error::ApiError;

/// Most items one page holds (`limit`'s top), as OpenAI has it.
pub const MAX_LIMIT: usize = 100;

/// Items per page when `limit` is absent, as OpenAI has it.
pub const DEFAULT_LIMIT: usize = 20;

/// The items of `input` (a request's `input`, already read by `request::parse`), in the
/// order sent, for the response whose id ends in `serial`: messages with their text
/// parts (`input_text`, or `output_text` for the assistant's), `function_call` and
/// `function_call_output` items. An item keeps the `id` it was sent with; one without
/// gets `msg_`/`fc_`/`fco_` + `serial` + `_in_` + its index. `reasoning` items are left
/// out, as the conversation drops them.
pub fn input_items(input: &Value, serial: &str) -> Vec<Value> {
    let id = |o: &Value, prefix: &str, i: usize| {
        o.get("id")
            .and_then(Value::as_str)
            .map_or_else(|| format!("{prefix}_{serial}_in_{i}"), str::to_string)
    };
    let status = |o: &Value| o.get("status").cloned().filter(Value::is_string);
    let items = match input {
        Value::String(s) => {
            return vec![json!({"type": "message", "id": id(&Value::Null, "msg", 0),
                "role": "user", "status": "completed",
                "content": [{"type": "input_text", "text": s}]})]
        }
        Value::Array(a) => a,
        _ => return Vec::new(),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, o) in items.iter().enumerate() {
        match o.get("type").and_then(Value::as_str).unwrap_or("message") {
            "message" => {
                let role = o.get("role").and_then(Value::as_str).unwrap_or("user");
                out.push(
                    json!({"type": "message", "id": id(o, "msg", i), "role": role,
                    "status": status(o).unwrap_or_else(|| json!("completed")),
                    "content": content(o.get("content"), role == "assistant")}),
                );
            }
            "function_call" => out.push(json!({"type": "function_call",
                "id": id(o, "fc", i), "call_id": o.get("call_id"), "name": o.get("name"),
                "arguments": o.get("arguments").filter(|a| a.is_string())
                    .cloned().unwrap_or_else(|| json!("{}")),
                "status": status(o).unwrap_or_else(|| json!("completed"))})),
            "function_call_output" => out.push(json!({"type": "function_call_output",
                "id": id(o, "fco", i), "call_id": o.get("call_id"), "output": o.get("output"),
                "status": status(o).unwrap_or_else(|| json!("completed"))})),
            _ => {}
        }
    }
    out
}

/// A message's content as text parts: the assistant's are `output_text` (with the
/// `annotations` an output message carries), everyone else's `input_text`, whatever
/// the request called them, since that is how the model read them.
fn content(c: Option<&Value>, assistant: bool) -> Value {
    let part = |text: &Value| {
        if assistant {
            json!({"type": "output_text", "text": text, "annotations": []})
        } else {
            json!({"type": "input_text", "text": text})
        }
    };
    match c {
        Some(s @ Value::String(_)) => json!([part(s)]),
        Some(Value::Array(ps)) => ps
            .iter()
            .map(|p| part(p.get("text").unwrap_or(&Value::Null)))
            .collect(),
        _ => json!([]),
    }
}

/// One page of `items` as OpenAI's list object (`object: "list"`, `data`, `first_id`,
/// `last_id`, `has_more`), read from the query pairs: `limit` (1 to [`MAX_LIMIT`],
/// default [`DEFAULT_LIMIT`]), `order` (`asc` or `desc`, default `desc`: newest
/// first) and `after` (the id of the item the page starts after, in that order).
/// `include` asks for data this server does not have and is refused; other pairs are
/// ignored. A bad value is a 400 naming its parameter.
pub fn page(items: &[Value], query: &[(String, String)]) -> Result<Value, ApiError> {
    let (mut limit, mut desc, mut after) = (DEFAULT_LIMIT, true, None);
    for (k, v) in query {
        match k.as_str() {
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "parameter `limit` is `{v}`: must be an integer in [1, {MAX_LIMIT}]"
                        ))
                        .with_param("limit")
                    })?
            }
            "order" => {
                desc = match v.as_str() {
                    "asc" => false,
                    "desc" => true,
                    _ => {
                        return Err(ApiError::bad_request(format!(
                            "parameter `order` is `{v}`: must be `asc` or `desc`"
                        ))
                        .with_param("order"))
                    }
                }
            }
            "after" => after = Some(v.as_str()),
            "include" | "include[]" if !v.is_empty() => {
                return Err(ApiError::bad_request(
                    "parameter `include` is not supported: no extra item data is available",
                )
                .with_param("include"))
            }
            _ => {}
        }
    }
    let mut ordered: Vec<&Value> = items.iter().collect();
    if desc {
        ordered.reverse();
    }
    let start = match after {
        None => 0,
        Some(a) => {
            ordered.iter().position(|i| i["id"] == a).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "parameter `after` is `{a}`: no input item of this response has that id"
                ))
                .with_param("after")
            })? + 1
        }
    };
    let rest = &ordered[start..];
    let data: Vec<Value> = rest.iter().take(limit).map(|v| (*v).clone()).collect();
    Ok(json!({
        "object": "list",
        "first_id": data.first().map(|i| i["id"].clone()),
        "last_id": data.last().map(|i| i["id"].clone()),
        "has_more": rest.len() > limit,
        "data": data,
    }))
}
