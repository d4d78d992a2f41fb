use super::facts::*;
use super::options::*;
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

#[test]
fn integer_options_take_whole_floats_and_refuse_fractions() {
    // ollama reads every JSON number as a float: `40.0` is a valid `top_k`.
    let g = parse_options(
        &obj(
            json!({"options": {"num_predict": 4.0, "top_k": 40.0, "seed": 42.0,
            "num_ctx": 512.0, "repeat_last_n": 8.0, "num_keep": 5.0}}),
        ),
        512,
    )
    .unwrap();
    assert_eq!(g.max_tokens, Some(4));
    assert_eq!(g.sampling.top_k, 40);
    assert_eq!(g.sampling.seed, 42);
    assert_eq!(g.sampling.penalty_last_n, 8);
    let g = parse_options(&obj(json!({"options": {"num_predict": -1.0}})), 512).unwrap();
    assert_eq!(g.max_tokens, None);
    for k in ["num_predict", "top_k", "seed", "num_ctx", "repeat_last_n"] {
        let e = parse_options(&obj(json!({"options": {k: 4.5}})), 512).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(
            e.message.contains(&format!("`options.{k}`")),
            "{k}: {}",
            e.message
        );
    }
    assert_eq!(whole_number(&json!(-3.0)), Some(-3));
    assert_eq!(whole_number(&json!(7)), Some(7));
    assert_eq!(whole_number(&json!(1e300)), None);
    assert_eq!(whole_number(&json!(0.5)), None);
    assert_eq!(whole_number(&json!("4")), None);
}

#[test]
fn stop_takes_many_strings_within_a_bound() {
    let many: Vec<String> = (0..MAX_STOP).map(|i| format!("s{i}")).collect();
    let g = parse_options(&obj(json!({"options": {"stop": many}})), 512).unwrap();
    assert_eq!(g.stop.len(), MAX_STOP);
    let too_many: Vec<String> = (0..=MAX_STOP).map(|i| format!("s{i}")).collect();
    for stop in [json!(too_many), json!([""]), json!(["x".repeat(257)])] {
        let e = parse_options(&obj(json!({"options": {"stop": stop}})), 512).unwrap_err();
        assert!(e.message.contains("`options.stop`"), "{}", e.message);
    }
}

#[test]
fn logprobs_and_keep_alive_read_as_ollama_reads_them() {
    let c = common_fields(&obj(json!({}))).unwrap();
    assert_eq!((c.logprobs, c.unload), (None, false));
    let c = common_fields(&obj(json!({"logprobs": true}))).unwrap();
    assert_eq!(c.logprobs, Some(0));
    let c = common_fields(&obj(json!({"logprobs": true, "top_logprobs": 20}))).unwrap();
    assert_eq!(c.logprobs, Some(20));
    // Checked even when `logprobs` is off, then ignored.
    let c = common_fields(&obj(json!({"top_logprobs": 3}))).unwrap();
    assert_eq!(c.logprobs, None);
    for bad in [json!(21), json!(-1), json!(1.5), json!("3")] {
        let e = common_fields(&obj(json!({"logprobs": true, "top_logprobs": bad}))).unwrap_err();
        assert!(e.message.contains("`top_logprobs`"), "{bad}: {}", e.message);
    }
    let e = common_fields(&obj(json!({"logprobs": 1}))).unwrap_err();
    assert!(e.message.contains("`logprobs`"), "{}", e.message);

    for zero in [
        json!(0),
        json!(0.0),
        json!("0"),
        json!("0s"),
        json!("0m0.0s"),
        json!("-0h"),
    ] {
        let c = common_fields(&obj(json!({ "keep_alive": zero }))).unwrap();
        assert!(c.unload, "{zero}");
    }
    for kept in [
        json!(-1),
        json!(300),
        json!("5m"),
        json!("1h30m"),
        json!("-1m"),
        json!(""),
    ] {
        let c = common_fields(&obj(json!({ "keep_alive": kept }))).unwrap();
        assert!(!c.unload, "{kept}");
    }
    for bad in [
        json!("5"),
        json!("soon"),
        json!("1x"),
        json!("."),
        json!("1..2s"),
        json!(true),
    ] {
        let e = common_fields(&obj(json!({ "keep_alive": bad }))).unwrap_err();
        assert!(e.message.contains("`keep_alive`"), "{bad}: {}", e.message);
    }
    assert_eq!(go_duration_is_zero("1.5µs"), Some(false));
    assert_eq!(go_duration_is_zero(".0ms"), Some(true));
}

#[test]
fn format_schemas_close_their_objects_as_ollama_does() {
    let c = common_fields(&obj(json!({"format": {"type": "object",
        "properties": {"a": {"type": "string"}}}})))
    .unwrap();
    let Some((Grammar::JsonSchema(s), "format")) = c.grammar else {
        panic!("a schema grammar: {:?}", c.grammar)
    };
    assert_eq!(s["additionalProperties"], false, "{s}");
    assert_eq!(s["properties"]["a"]["type"], "string", "{s}");
}

#[test]
fn tool_results_carry_the_name_and_id_of_the_call_they_answer() {
    let m = messages(&obj(json!({"messages": [
        {"role": "user", "content": "weather and time?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_time", "arguments": {}}},
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "18 C", "tool_name": "get_weather"},
        {"role": "tool", "content": "noon"},
        {"role": "tool", "content": "?", "tool_name": "unknown"}]})))
    .unwrap();
    // By name, whatever the order; then the first call left; an unknown name keeps
    // its name and pairs with nothing.
    assert_eq!(m[2].name.as_deref(), Some("get_weather"));
    assert_eq!(m[2].tool_call_id.as_deref(), Some("call_1_1"));
    assert_eq!(m[3].name.as_deref(), Some("get_time"));
    assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1_0"));
    assert_eq!(m[4].name.as_deref(), Some("unknown"));
    assert_eq!(m[4].tool_call_id, None);
    assert_eq!(m[1].tool_calls[0].id, "call_1_0");
    let e = messages(&obj(json!({"messages": [
        {"role": "tool", "content": "x", "tool_name": 3}]})))
    .unwrap_err();
    assert!(
        e.message.contains("`messages[0].tool_name`"),
        "{}",
        e.message
    );
}

#[test]
fn load_answers_say_load_or_unload() {
    let body = |r: axum::response::Response| async move {
        let b = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        serde_json::from_slice::<Value>(&b).unwrap()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let v = rt.block_on(body(load_answer(Shape::Chat, "m:latest", "unload")));
    assert_eq!(v["done_reason"], "unload");
    assert_eq!(v["message"]["role"], "assistant");
    let v = rt.block_on(body(load_answer(Shape::Generate, "m:latest", "load")));
    assert_eq!(
        (v["done_reason"].as_str(), v["done"].as_bool()),
        (Some("load"), Some(true))
    );
}

#[test]
fn logprobs_have_ollama_s_shape() {
    use crate::job::{Candidate, TokenLogprob};
    let c = |t: &str, lp: f32| Candidate {
        text: t.into(),
        bytes: t.as_bytes().to_vec(),
        logprob: lp,
        id: 1,
    };
    let v = token_logprobs(&[
        TokenLogprob {
            chosen: c("Hi", -0.5),
            top: vec![c("Hi", -0.5), c("Yo", -1.0)],
        },
        TokenLogprob {
            chosen: c("!", -0.25),
            top: vec![],
        },
    ]);
    assert_eq!(
        v,
        json!([
            {"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [
                {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                {"token": "Yo", "logprob": -1.0, "bytes": [89, 111]}]},
            {"token": "!", "logprob": -0.25, "bytes": [33]}
        ])
    );
}
