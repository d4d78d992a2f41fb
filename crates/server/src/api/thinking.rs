//! The request fields that switch reasoning: llama-server's `reasoning_format`, and
//! `chat_template_kwargs` / `enable_thinking` (or a plain boolean such as ollama's
//! `think`), which reach the chat template as variables. The splitting itself is
//! `crate::reasoning`.

use serde_json::Value;

use crate::api::fields::{field, opt_bool, opt_str, wrong, Object};
use crate::error::ApiError;

/// llama-server's `reasoning_format` of a chat request: `none` leaves the reasoning in
/// the answer; `deepseek` and `auto` (the default) split it out (the server's
/// `--reasoning-format` replaces that default where the request gives none). Other
/// formats (`deepseek-legacy`, which keeps the tags in the answer as well) are refused
/// by name.
pub fn split_requested(obj: &Object) -> Result<bool, ApiError> {
    match opt_str(obj, "reasoning_format")? {
        None | Some("auto") | Some("deepseek") => Ok(true),
        Some("none") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!(
            "field `reasoning_format` is `{other}`: expected none, deepseek or auto"
        ))
        .with_param("reasoning_format")),
    }
}

/// OpenAI's `reasoning_effort` values.
const REASONING_EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

/// The extra chat template variables a request gives: `chat_template_kwargs` (an
/// object, as llama-server and vLLM take it), `enable_thinking` at the top level (a
/// shorthand some clients send), which wins over the same key in the kwargs, and
/// OpenAI's `reasoning_effort` (see below).
pub fn template_kwargs(obj: &Object) -> Result<Object, ApiError> {
    let mut out = match field(obj, "chat_template_kwargs") {
        None => Object::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(wrong("chat_template_kwargs", "an object")),
    };
    // OpenAI's `reasoning_effort`: a template variable of that name (gpt-oss's
    // templates read it, as vLLM and llama-server pass it), and `none` turns thinking
    // off where the template has the switch, unless the request sets it itself.
    if let Some(effort) = opt_str(obj, "reasoning_effort")? {
        effort_kwargs(&mut out, effort, "reasoning_effort")?;
    }
    // The Responses API's spelling of the same.
    if let Some(r) = field(obj, "reasoning").and_then(Value::as_object) {
        if let Some(effort) = opt_str(r, "effort")? {
            effort_kwargs(&mut out, effort, "reasoning.effort")?;
        }
    }
    if let Some(on) = opt_bool(obj, "enable_thinking")? {
        out.insert("enable_thinking".into(), Value::Bool(on));
    }
    if out.get("enable_thinking").is_some_and(|v| !v.is_boolean()) {
        return Err(wrong("chat_template_kwargs.enable_thinking", "a boolean"));
    }
    Ok(out)
}

/// OpenAI's reasoning `effort` (named `name` in the request) into the template
/// variables: `reasoning_effort` itself, and for `none` `enable_thinking` false, each
/// unless the request set it already.
fn effort_kwargs(out: &mut Object, effort: &str, name: &str) -> Result<(), ApiError> {
    if !REASONING_EFFORTS.contains(&effort) {
        return Err(wrong(
            name,
            "`none`, `minimal`, `low`, `medium`, `high` or `xhigh`",
        ));
    }
    out.entry("reasoning_effort")
        .or_insert_with(|| Value::String(effort.to_string()));
    if effort == "none" {
        out.entry("enable_thinking").or_insert(Value::Bool(false));
    }
    Ok(())
}

/// The template variables for a thinking switch given as a plain boolean (ollama's
/// `think`, Anthropic's `thinking`): `enable_thinking` set to it, or nothing.
pub fn thinking_kwargs(on: Option<bool>) -> Object {
    let mut out = Object::new();
    if let Some(on) = on {
        out.insert("enable_thinking".into(), Value::Bool(on));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_are_read_and_bad_values_named() {
        let obj = |v: Value| v.as_object().cloned().unwrap();
        assert!(split_requested(&obj(serde_json::json!({}))).unwrap());
        assert!(!split_requested(&obj(serde_json::json!({"reasoning_format": "none"}))).unwrap());
        let e = split_requested(&obj(serde_json::json!({"reasoning_format": "x"}))).unwrap_err();
        assert!(e.message.contains("reasoning_format"), "{}", e.message);
        let k = template_kwargs(&obj(serde_json::json!({
            "chat_template_kwargs": {"enable_thinking": true, "custom": 1},
            "enable_thinking": false,
        })))
        .unwrap();
        assert_eq!(k["enable_thinking"], false);
        assert_eq!(k["custom"], 1);
        let e = template_kwargs(&obj(serde_json::json!({"chat_template_kwargs": 3}))).unwrap_err();
        assert!(e.message.contains("chat_template_kwargs"), "{}", e.message);
        // `reasoning_effort`: the template's variable; `none` switches thinking off
        // unless the request says otherwise.
        let k = template_kwargs(&obj(serde_json::json!({"reasoning_effort": "none"}))).unwrap();
        assert_eq!(
            (&k["reasoning_effort"], &k["enable_thinking"]),
            (&"none".into(), &false.into())
        );
        let k = template_kwargs(&obj(serde_json::json!({"reasoning_effort": "none",
            "enable_thinking": true})))
        .unwrap();
        assert_eq!(k["enable_thinking"], true);
        let k = template_kwargs(&obj(serde_json::json!({"reasoning_effort": "high"}))).unwrap();
        assert!(k.get("enable_thinking").is_none() && k["reasoning_effort"] == "high");
        let e = template_kwargs(&obj(serde_json::json!({"reasoning_effort": "max"}))).unwrap_err();
        assert!(e.message.contains("reasoning_effort"), "{}", e.message);
        // Responses' `reasoning.effort`, the same.
        let k =
            template_kwargs(&obj(serde_json::json!({"reasoning": {"effort": "none"}}))).unwrap();
        assert_eq!(k["enable_thinking"], false);
        let e =
            template_kwargs(&obj(serde_json::json!({"reasoning": {"effort": "x"}}))).unwrap_err();
        assert!(e.message.contains("reasoning.effort"), "{}", e.message);
    }
}
