//! Tool calls in Qwen3-Coder's and Qwen3.5's XML format, end to end on a tiny Qwen3 whose
//! chat template teaches that format and opens a `<think>` block in the generation
//! prompt (as Qwen3.5's does). With `tool_choice` asking for a call, the grammar holds the
//! random model to an XML call of the tool's parameters, and every route returns it in
//! its own shape with each argument of the JSON type the schema declares, streamed and
//! not; the call also ends the reasoning the prompt opened.

use crate::common;

use common::*;
use serde_json::{json, Value};

/// ChatML with the XML call format shown when tools are given, and an open reasoning
/// block in the generation prompt.
const TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
{%- endfor %}\
{%- if tools %}{{- '<tool_call>\\n<function=name>\\n<parameter=name>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>\\n' }}{%- endif %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}";

fn xml_server() -> TestServer {
    tiny_server_with_template("tiny-xml", TEMPLATE)
}

/// The tool: a string enum, a bounded integer and a boolean, all required.
fn parameters() -> Value {
    json!({"type": "object", "properties": {
        "mode": {"type": "string", "enum": ["on", "off"]},
        "level": {"type": "integer", "minimum": 0, "maximum": 9},
        "force": {"type": "boolean"}},
        "required": ["mode", "level", "force"]})
}

/// The arguments hold each parameter in its declared JSON type.
fn check_args(args: &Value) {
    assert!(args["mode"] == "on" || args["mode"] == "off", "{args}");
    assert!(args["level"].as_u64().is_some_and(|n| n <= 9), "{args}");
    assert!(args["force"].is_boolean(), "{args}");
    assert_eq!(args.as_object().map(|o| o.len()), Some(3), "{args}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xml_calls_reach_every_route_with_typed_arguments() {
    let s = xml_server();
    let b = &s.base;
    let tools = json!([{"type": "function", "function": {"name": "set_mode",
        "parameters": parameters()}}]);
    let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
        "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 300,
        "temperature": 0});

    // OpenAI: one call, arguments as JSON text; no reasoning (the call ended it at once).
    let (st, v) = post(b, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert!(c["message"].get("reasoning_content").is_none(), "{v}");
    let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "set_mode");
    let text = calls[0]["function"]["arguments"]
        .as_str()
        .expect("JSON text");
    let args: Value = serde_json::from_str(text).expect("arguments are JSON");
    check_args(&args);

    // Streamed: the same call in `tool_calls` deltas.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (st, frames) = post_stream(b, "/v1/chat/completions", sb).await;
    assert_eq!(st, 200);
    let mut streamed = String::new();
    let mut names = Vec::new();
    for f in frames.iter().filter(|f| *f != "[DONE]") {
        let v: Value = serde_json::from_str(f).expect("frame");
        for tc in v["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(n) = tc["function"]["name"].as_str() {
                names.push(n.to_string());
            }
            streamed.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(names, ["set_mode"]);
    assert_eq!(streamed, text);

    // ollama: `message.tool_calls[].function.arguments` as an object.
    let ob = json!({"model": "tiny-xml", "stream": false, "tools": tools,
        "tool_choice": "required", "messages": [{"role": "user", "content": "x"}],
        "options": {"temperature": 0, "num_predict": 300}});
    let (st, v) = post(b, "/api/chat", ob).await;
    assert_eq!(st, 200, "{v}");
    let call = &v["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "set_mode", "{v}");
    assert_eq!(call["arguments"], args, "{v}");

    // Anthropic: a `tool_use` block whose `input` is the arguments.
    let ab = json!({"model": "m", "max_tokens": 300, "temperature": 0,
        "tools": [{"name": "set_mode", "input_schema": parameters()}],
        "tool_choice": {"type": "any"},
        "messages": [{"role": "user", "content": "x"}]});
    let (st, v) = post(b, "/v1/messages", ab).await;
    assert_eq!(st, 200, "{v}");
    let block = v["content"]
        .as_array()
        .expect("content")
        .iter()
        .find(|c| c["type"] == "tool_use")
        .unwrap_or_else(|| panic!("no tool_use block: {v}"));
    assert_eq!(block["name"], "set_mode");
    assert_eq!(block["input"], args, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xml_parameters_given_by_reference_are_typed_and_constrained() {
    let s = xml_server();
    // The same parameters as `parameters()`, reached through `$defs` and `definitions`
    // (as pydantic and MCP servers write them).
    let params = json!({"type": "object", "properties": {
        "mode": {"$ref": "#/$defs/Mode"},
        "level": {"$ref": "#/definitions/Level"},
        "force": {"type": "boolean"}},
        "required": ["mode", "level", "force"],
        "$defs": {"Mode": {"type": "string", "enum": ["on", "off"]}},
        "definitions": {"Level": {"type": "integer", "minimum": 0, "maximum": 9}}});
    let tools = json!([{"type": "function", "function": {"name": "set_mode",
        "parameters": params}}]);
    let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
        "tool_choice": "required", "parallel_tool_calls": false, "max_tokens": 300,
        "temperature": 0});
    let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(calls.len(), 1, "{v}");
    let text = calls[0]["function"]["arguments"].as_str().expect("text");
    check_args(&serde_json::from_str(text).expect("arguments are JSON"));
}
