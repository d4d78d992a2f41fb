//! The Responses codec against the documented request shapes.

use serde_json::{json, Value};

use super::request::{check_results, parse};
use crate::api::fields::Object;

fn obj(v: Value) -> Object {
    v.as_object().cloned().unwrap()
}

#[test]
fn input_items_with_a_call_and_its_output_read_into_chat_messages() {
    let p = parse(&obj(json!({
        "model": "m", "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}", "id": "fc_1", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
        ],
        "text": {"format": {"type": "json_schema", "name": "w", "strict": true,
                            "schema": {"type": "object"}}},
        "max_output_tokens": 32, "store": false, "temperature": 0,
    })))
    .unwrap();
    let roles: Vec<&str> = p.input.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "user"]);
    assert_eq!(p.input[1].tool_calls[0].id, "call_1");
    assert_eq!(p.input[2].tool_call_id.as_deref(), Some("call_1"));
    assert!(check_results(&p.input).is_ok());
    assert_eq!(p.instructions.as_deref(), Some("Be brief."));
    assert_eq!((p.store, p.g.max_tokens), (false, Some(32)));
    assert_eq!(p.g.grammar.as_ref().map(|g| g.1), Some("text.format"));
    let p = parse(&obj(json!({"input": "hi", "tools": [{"type": "function", "name": "f",
        "parameters": {"type": "object"}, "strict": true}], "tool_choice": {"type": "function", "name": "f"}})))
    .unwrap();
    assert_eq!(p.input.len(), 1);
    let t = p.g.tools.unwrap();
    assert_eq!(t.choice, crate::tools::ToolChoice::Named("f".into()));
    assert_eq!(t.defs[0]["function"]["name"], "f");
}

#[test]
fn unsupported_or_malformed_fields_are_named() {
    let cases = [
        (
            json!({"input": "hi", "reasoning": {"effort": "low"}}),
            "reasoning",
        ),
        (json!({"input": "hi", "background": true}), "background"),
        (json!({}), "input"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": [{"type": "web_search_call"}]}),
            "input[0].type",
        ),
        (
            json!({"input": "hi", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "hi", "tools": [{"type": "function", "name": "a b"}]}),
            "tools[0].name",
        ),
        (
            json!({"input": "hi", "text": {"format": {"type": "xml"}}}),
            "text.format.type",
        ),
        (
            json!({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}),
            "text.format.schema",
        ),
        (json!({"input": "hi", "truncation": "auto"}), "truncation"),
        (
            json!({"input": "hi", "include": ["message.output_text.logprobs"]}),
            "include",
        ),
        (
            json!({"input": "hi", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": "hi", "temperature": 3}), "temperature"),
    ];
    for (body, name) in cases {
        let e = parse(&obj(body)).unwrap_err();
        assert_eq!(e.status, 400, "{name}");
        assert!(e.message.contains(name), "{name}: {}", e.message);
    }
    let p = parse(&obj(json!({"input": [
        {"type": "function_call_output", "call_id": "nope", "output": "x"}]})))
    .unwrap();
    let e = check_results(&p.input).unwrap_err();
    assert!(e.message.contains("nope"), "{}", e.message);
}
