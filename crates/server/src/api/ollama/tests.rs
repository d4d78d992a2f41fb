use super::facts::*;
use super::request::*;
use super::response::*;
use crate::error::ApiError;
use axum::http::StatusCode;
use minfer_runtime::Grammar;
use minfer_tokenizer::ChatMessage;

use crate::api::fields::Object;
use axum::response::IntoResponse;
use serde_json::{json, Value};
use std::time::{Duration, UNIX_EPOCH};

fn obj(v: Value) -> Object {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

#[test]
fn times_are_rfc3339_utc_with_nanoseconds() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
    let t = UNIX_EPOCH + Duration::new(1_709_251_199, 5);
    assert_eq!(rfc3339(t), "2024-02-29T23:59:59.000000005Z");
    let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
    assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000000000Z");
}

#[test]
fn sizes_and_quantizations_read_as_ollama_shows_them() {
    assert_eq!(parameter_size(494_032_768), "494.03M");
    assert_eq!(parameter_size(7_615_616_512), "7.6B");
    assert_eq!(file_type_name(15), "Q4_K_M");
    assert_eq!(file_type_name(7), "Q8_0");
    assert_eq!(file_type_name(999), "unknown");
    assert_eq!(tag_name("qwen"), "qwen:latest");
    assert_eq!(tag_name("qwen:0.5b"), "qwen:0.5b");
}

#[test]
fn options_use_ollama_names_and_defaults() {
    let g = parse_options(&obj(json!({})), 512).unwrap();
    assert_eq!(g.sampling.top_p, 0.9);
    assert_eq!(g.sampling.repeat_penalty, 1.1);
    assert_eq!(g.max_tokens, None);
    let g = parse_options(
        &obj(
            json!({"options": {"num_predict": 7, "temperature": 0, "top_k": 5,
            "seed": 42, "stop": ["\n"], "num_ctx": 512, "num_thread": 4,
            "repeat_last_n": 0}}),
        ),
        512,
    )
    .unwrap();
    assert_eq!(g.max_tokens, Some(7));
    assert_eq!(g.sampling.temperature, 0.0);
    assert_eq!(g.sampling.top_k, 5);
    assert_eq!(g.sampling.seed, 42);
    assert_eq!(g.sampling.penalty_last_n, 0);
    assert_eq!(g.stop, vec!["\n"]);
    let g = parse_options(&obj(json!({"options": {"num_predict": -2}})), 512).unwrap();
    assert_eq!(g.max_tokens, None);
}

#[test]
fn bad_options_are_refused_by_name() {
    for (opts, want) in [
        (json!({"num_ctx": 4096}), "`options.num_ctx` is 4096"),
        (json!({"num_predict": 0}), "`options.num_predict`"),
        (json!({"temperature": "hot"}), "`options.temperature`"),
        (json!({"top_p": 0}), "`options.top_p`"),
        (json!({"mirostat": 2}), "`options.mirostat`"),
        (json!({"stop": [1]}), "`options.stop`"),
    ] {
        let e = parse_options(&obj(json!({ "options": opts })), 512).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains(want), "{opts}: {}", e.message);
    }
    let c = common_fields(&obj(json!({"format": "json"}))).unwrap();
    assert!(matches!(c.grammar, Some((Grammar::JsonObject, "format"))));
    let c = common_fields(&obj(json!({"format": {"type": "object"}, "think": false}))).unwrap();
    assert!(matches!(
        c.grammar,
        Some((Grammar::JsonSchema(_), "format"))
    ));
    assert_eq!(c.think, Some(false));
    for bad in [json!({"format": "xml"}), json!({"format": 3})] {
        let e = common_fields(&obj(bad)).unwrap_err();
        assert!(e.message.contains("`format`"), "{}", e.message);
    }
    let e = common_fields(&obj(json!({"think": "high"}))).unwrap_err();
    assert!(e.message.contains("`think`"), "{}", e.message);
    assert!(
        common_fields(&obj(json!({"keep_alive": "5m"})))
            .unwrap()
            .stream
    );
    assert!(
        !common_fields(&obj(json!({"stream": false})))
            .unwrap()
            .stream
    );
}

#[test]
fn chat_messages_refuse_images_and_read_tool_calls_and_results() {
    let e = messages(&obj(json!({"messages": [
        {"role": "user", "content": "x", "images": ["aGk="]}]})))
    .unwrap_err();
    assert!(e.message.contains("`messages[0].images`"), "{}", e.message);
    let m = messages(&obj(json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "thinking": "call it",
         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "18 C", "tool_name": "get_weather"}]})))
    .unwrap();
    assert_eq!(m[1].tool_calls[0].name, "get_weather");
    assert_eq!(m[1].reasoning_content.as_deref(), Some("call it"));
    assert_eq!(m[1].tool_calls[0].arguments, r#"{"city":"Oslo"}"#);
    assert_eq!(
        (m[2].role.as_str(), m[2].content.as_str()),
        ("tool", "18 C")
    );
    let e = messages(&obj(json!({"messages": [
        {"role": "user", "content": "x", "tool_calls": []}]})))
    .unwrap_err();
    assert!(
        e.message.contains("`messages[0].tool_calls`"),
        "{}",
        e.message
    );
    let m = messages(&obj(json!({"messages": [
        {"role": "system", "content": "s"}, {"role": "user", "content": "u", "images": []}]})))
    .unwrap();
    assert_eq!(m[1], ChatMessage::new("user", "u"));
}

#[test]
fn errors_have_ollama_s_shape() {
    let r = OllamaError(ApiError::new(
        StatusCode::NOT_FOUND,
        "model \"x\" not found",
    ))
    .into_response();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}
