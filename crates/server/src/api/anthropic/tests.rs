//! The Messages codec against Anthropic's documented request and event shapes.

use serde_json::{json, Value};

use axum::response::IntoResponse;

use super::request::parse;
use super::response::{error_body, message, AnthropicError};
use super::stream::{Blocks, Frame};
use crate::answer::{split_ordered, AnswerSplitter};
use crate::error::ApiError;
use crate::job::{Finish, Summary};
use crate::reasoning::Reasoning;

fn obj(v: Value) -> crate::api::fields::Object {
    v.as_object().cloned().unwrap()
}

fn summary(finish: Finish, stop_word: Option<usize>) -> Summary {
    Summary {
        choice: 0,
        finish,
        prompt_tokens: 12,
        cached_tokens: 0,
        completion_tokens: 5,
        prompt_time: Default::default(),
        predicted_time: Default::default(),
        stop_word,
    }
}

fn tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather of a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}])
}

#[test]
fn a_conversation_with_a_tool_call_and_its_result_reads_into_chat_messages() {
    let p = parse(
        &obj(json!({
            "model": "m", "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools.",
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                    {"type": "text", "text": "Thanks"}]},
            ],
            "tools": tools(), "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 3,
            "metadata": {"user_id": "u"}, "thinking": {"type": "disabled"},
        })),
        false,
    )
    .unwrap();
    let roles: Vec<&str> = p.msgs.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(p.msgs[0].content, "Be brief.\nUse tools.");
    assert_eq!(p.msgs[2].content, "Checking.");
    // The thinking block goes back to the template as the turn's reasoning.
    assert_eq!(p.msgs[2].reasoning_content.as_deref(), Some("call it"));
    assert_eq!(p.msgs[4].reasoning_content, None);
    assert_eq!(p.msgs[2].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    assert_eq!(p.msgs[3].tool_call_id.as_deref(), Some("toolu_1"));
    assert_eq!(p.msgs[3].content, "18 C");
    let t = p.g.tools.unwrap();
    assert_eq!(t.choice, crate::tools::ToolChoice::Required);
    assert!(!t.parallel);
    assert_eq!(t.defs[0]["function"]["parameters"]["required"][0], "city");
    assert_eq!(
        (p.g.max_tokens, p.g.stop.clone()),
        (Some(64), vec!["END".to_string()])
    );
    assert_eq!(p.g.sampling.top_k, 3);
    assert_eq!(p.kwargs["enable_thinking"], false);
    let p = parse(
        &obj(
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                    "thinking": {"type": "adaptive"}, "cache_control": {"type": "ephemeral"},
                    "output_config": {"effort": "low", "format": {"type": "json_schema",
                                      "schema": {"type": "object"}}}}),
        ),
        false,
    )
    .unwrap();
    assert!(p.kwargs.is_empty());
    assert_eq!(p.g.grammar.map(|g| g.1), Some("output_config.format"));
    // Tools beside the format: the answer is a call or the format's JSON.
    let p = parse(
        &obj(
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                    "tools": tools(), "output_config": {"format": {"type": "json_schema",
                                      "schema": {"type": "object"}}}}),
        ),
        false,
    )
    .unwrap();
    assert!(p.g.grammar.is_some() && p.g.tools.is_some());
}

#[test]
fn unsupported_or_malformed_fields_are_named() {
    let base =
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
    let cases = [
        (json!({"mcp_servers": []}), "mcp_servers"),
        (json!({"max_tokens": null}), "max_tokens"),
        (json!({"temperature": 1.5}), "temperature"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "messages[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "read it"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                    "content": [{"type": "image", "source": {}}]}]}]}),
            "messages[2].content[0].content[0].type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant",
                "content": [{"type": "thinking", "thinking": 3}]}]}),
            "messages[1].content[0].thinking",
        ),
        (
            json!({"messages": [{"role": "system", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]}),
            "tool_use_id",
        ),
        (
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"tools": [{"name": "bad name", "input_schema": {}}]}),
            "tools[0].name",
        ),
        (
            json!({"tool_choice": {"type": "maybe"}}),
            "tool_choice.type",
        ),
        (json!({"thinking": {"type": "sometimes"}}), "thinking.type"),
        (
            json!({"output_config": {"format": {"type": "xml"}}}),
            "output_config.format.type",
        ),
        (
            json!({"stop_sequences": ["a", "b", "c", "d", "e"]}),
            "stop_sequences",
        ),
    ];
    for (edit, name) in cases {
        let mut body = base.clone();
        for (k, v) in edit.as_object().unwrap() {
            body[k] = v.clone();
        }
        let e = parse(&obj(body), false).unwrap_err();
        assert_eq!(e.status, 400, "{name}");
        assert!(e.message.contains(name), "{name}: {}", e.message);
    }
    // An image says what is missing, wherever it sits.
    let img = json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}},
        {"type": "text", "text": "What is this?"}]}]});
    let e = parse(&obj(img), false).unwrap_err();
    assert!(
        e.message.contains("image input is not supported"),
        "{}",
        e.message
    );
    // count_tokens needs no max_tokens but refuses sampling fields.
    assert!(parse(
        &obj(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})),
        true
    )
    .is_ok());
    let e = parse(
        &obj(json!({"model": "m", "messages": [], "stream": true})),
        true,
    )
    .unwrap_err();
    assert!(e.message.contains("stream"), "{}", e.message);
}

#[test]
fn errors_and_answers_have_anthropics_shape() {
    let b = error_body(&ApiError::bad_request("field `x` is bad"));
    assert_eq!(
        b,
        json!({"type": "error", "error": {"type": "invalid_request_error",
                                                      "message": "field `x` is bad"}})
    );
    assert_eq!(
        error_body(&ApiError::invalid_api_key())["error"]["type"],
        "authentication_error"
    );
    let on = Reasoning {
        split: true,
        open: false,
        harmony: false,
    };
    let a = split_ordered("<think>hmm</think>\n\nHi<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>", on, Some(&crate::tools::test_spec(&["get_weather"])));
    let m = message("msg_1", "tiny", &a, &summary(Finish::Stop, None), &[]);
    assert_eq!(m["type"], "message");
    assert_eq!(m["stop_reason"], "tool_use");
    let types: Vec<&str> = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["thinking", "text", "tool_use"]);
    assert_eq!(m["content"][2]["input"], json!({"city": "Oslo"}));
    assert_eq!(m["usage"]["input_tokens"], 12);
    let plain = split_ordered("Hi", on, None);
    let stop = ["END".to_string()];
    let m = message(
        "msg_2",
        "tiny",
        &plain,
        &summary(Finish::Stop, Some(0)),
        &stop,
    );
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some("END"))
    );
    let m = message(
        "msg_3",
        "tiny",
        &plain,
        &summary(Finish::Length, None),
        &stop,
    );
    assert_eq!(m["stop_reason"], "max_tokens");
}

#[test]
fn streamed_blocks_follow_anthropics_event_sequence() {
    let on = Reasoning {
        split: true,
        open: false,
        harmony: false,
    };
    let mut b = Blocks::new(
        "msg_9".into(),
        Vec::new(),
        AnswerSplitter::new(on, Some(&crate::tools::test_spec(&["f"]))),
    );
    let out = "<think>plan</think>\n\nSure.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
    let mut frames = Vec::new();
    for c in out.chars() {
        frames.extend(b.push(&c.to_string()));
    }
    frames.extend(b.finish(&summary(Finish::Stop, None)));
    let names: Vec<&str> = frames.iter().map(|f| f.0).collect();
    let mut dedup = names.clone();
    dedup.dedup();
    assert_eq!(
        dedup,
        [
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    for (name, data) in &frames {
        assert_eq!(data["type"], *name);
    }
    let starts: Vec<&Value> = frames
        .iter()
        .filter(|f| f.0 == "content_block_start")
        .map(|f| &f.1)
        .collect();
    assert_eq!(
        starts
            .iter()
            .map(|s| s["index"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert_eq!(starts[2]["content_block"]["type"], "tool_use");
    assert_eq!(starts[2]["content_block"]["id"], "toolu_9_0");
    let thinking: String = frames
        .iter()
        .filter_map(|f| f.1["delta"]["thinking"].as_str())
        .collect();
    let text: String = frames
        .iter()
        .filter_map(|f| f.1["delta"]["text"].as_str())
        .collect();
    let json: String = frames
        .iter()
        .filter_map(|f| f.1["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        (thinking.as_str(), text.as_str(), json.as_str()),
        ("plan", "Sure.", r#"{"x":1}"#)
    );
    let last = &frames[frames.len() - 2].1;
    assert_eq!(last["delta"]["stop_reason"], "tool_use");
    assert_eq!(last["usage"]["output_tokens"], 5);
}

fn tool_use(id: &str) -> Value {
    json!({"type": "tool_use", "id": id, "name": "get_weather", "input": {"city": "Oslo"}})
}

fn tool_result(id: &str) -> Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": "18 C"})
}

fn read_messages(messages: Value) -> Result<Vec<minfer_tokenizer::ChatMessage>, ApiError> {
    parse(
        &obj(json!({"model": "m", "max_tokens": 8, "messages": messages, "tools": tools()})),
        false,
    )
    .map(|p| p.msgs)
}

/// Anthropic combines consecutive messages of one role into one turn: clients send each
/// tool result, or each call, as a message of its own.
#[test]
fn consecutive_messages_of_one_role_are_one_turn() {
    let user = json!({"role": "user", "content": "Weather?"});
    let roles = |m: &[minfer_tokenizer::ChatMessage]| -> Vec<String> {
        m.iter().map(|m| m.role.clone()).collect()
    };
    // Results split over two user messages.
    let m = read_messages(json!([user,
        {"role": "assistant", "content": [tool_use("t1"), tool_use("t2")]},
        {"role": "user", "content": [tool_result("t1")]},
        {"role": "user", "content": [tool_result("t2")]}]))
    .unwrap();
    assert_eq!(roles(&m), ["user", "assistant", "tool", "tool"]);
    assert_eq!(m[3].tool_call_id.as_deref(), Some("t2"));
    // Calls split over two assistant messages.
    let m = read_messages(json!([user,
        {"role": "assistant", "content": [tool_use("t1")]},
        {"role": "assistant", "content": [tool_use("t2")]},
        {"role": "user", "content": [tool_result("t1"), tool_result("t2")]}]))
    .unwrap();
    assert_eq!(roles(&m), ["user", "assistant", "tool", "tool"]);
    let ids: Vec<&str> = m[1].tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["t1", "t2"]);
    // A call, then the assistant's text as a message of its own; then two user texts.
    let m = read_messages(json!([user,
        {"role": "assistant", "content": [tool_use("t1")]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [tool_result("t1")]},
        {"role": "user", "content": "thanks"}]))
    .unwrap();
    assert_eq!(roles(&m), ["user", "assistant", "tool", "user"]);
    assert_eq!((m[1].content.as_str(), m[1].tool_calls.len()), ("ok", 1));
    assert_eq!(m[3].content, "thanks");
    let m = read_messages(json!([user, {"role": "user", "content": [
        {"type": "text", "text": "In Oslo."}]}]))
    .unwrap();
    assert_eq!(roles(&m), ["user"]);
    assert_eq!(m[0].content, "Weather?\nIn Oslo.");
    // A call in the history needs no `tools` in the request.
    let p = parse(
        &obj(json!({"model": "m", "max_tokens": 8, "messages": [user,
            {"role": "assistant", "content": [tool_use("t1")]},
            {"role": "user", "content": [tool_result("t1")]}]})),
        false,
    )
    .unwrap();
    assert_eq!(p.msgs[1].tool_calls.len(), 1);
}

#[test]
fn errors_in_a_merged_turn_name_the_message_as_sent() {
    let user = json!({"role": "user", "content": "Weather?"});
    let cases = [
        (
            json!([user, {"role": "assistant", "content": [tool_use("t1")]},
                {"role": "user", "content": [tool_result("t1")]},
                {"role": "user", "content": [tool_result("t9")]}]),
            "messages[3].content[0].tool_use_id",
        ),
        // The call is two turns back: the result answers nothing.
        (
            json!([user, {"role": "assistant", "content": [tool_use("t1")]},
                {"role": "user", "content": [tool_result("t1")]},
                {"role": "assistant", "content": "y"},
                {"role": "user", "content": [tool_result("t1")]}]),
            "messages[4].content[0].tool_use_id",
        ),
        // A call the next turn does not answer, as Anthropic refuses it; the second of
        // two calls split over assistant messages.
        (
            json!([user, {"role": "assistant", "content": [tool_use("t1")]},
                {"role": "user", "content": "x"}]),
            "messages[1].content[0].id",
        ),
        (
            json!([user, {"role": "assistant", "content": [tool_use("t1")]},
                {"role": "assistant", "content": [tool_use("t2")]},
                {"role": "user", "content": [tool_result("t1")]},
                {"role": "user", "content": "and?"}]),
            "messages[2].content[0].id",
        ),
        (
            json!([user, {"role": "user", "content": [{"type": "text", "text": "a"},
                {"type": "image", "source": {}}]}]),
            "messages[1].content[1].type",
        ),
        // A string is content, not a block.
        (
            json!([user, {"role": "user", "content": ["a"]}]),
            "messages[1].content[0]",
        ),
    ];
    for (messages, at) in cases {
        let e = read_messages(messages).unwrap_err();
        assert_eq!(e.status, 400, "{at}");
        let named = e.param.as_deref() == Some(at) || e.message.contains(at);
        assert!(named, "{at}: {} ({:?})", e.message, e.param);
    }
}

fn on() -> Reasoning {
    Reasoning {
        split: true,
        open: false,
        harmony: false,
    }
}

/// The content blocks a client builds from a stream's events, as the SDK's
/// `stream().get_final_message()` does.
fn final_content(frames: &[Frame]) -> Vec<Value> {
    let mut content: Vec<Value> = Vec::new();
    let mut json_in = String::new();
    let append = |b: &mut Value, k: &str, more: &Value| {
        let t = format!("{}{}", b[k].as_str().unwrap(), more[k].as_str().unwrap());
        b[k] = json!(t);
    };
    for (name, d) in frames {
        let i = d["index"].as_u64().unwrap_or(0) as usize;
        match *name {
            "content_block_start" => {
                assert_eq!(i, content.len());
                content.push(d["content_block"].clone());
                json_in.clear();
            }
            "content_block_delta" => {
                let delta = &d["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => append(&mut content[i], "text", delta),
                    "thinking_delta" => append(&mut content[i], "thinking", delta),
                    "input_json_delta" => json_in.push_str(delta["partial_json"].as_str().unwrap()),
                    other => panic!("delta {other}"),
                }
            }
            "content_block_stop" if content[i]["type"] == "tool_use" => {
                content[i]["input"] = serde_json::from_str(&json_in).unwrap();
            }
            _ => {}
        }
    }
    content
}

/// The streamed events of `out`, a character at a time, ended by `sum`.
fn streamed(out: &str, sum: &Summary, stop: &[String]) -> Vec<Frame> {
    let spec = crate::tools::test_spec(&["f"]);
    let mut b = Blocks::new(
        "msg_7".into(),
        stop.to_vec(),
        AnswerSplitter::new(on(), Some(&spec)),
    );
    let mut frames = Vec::new();
    for c in out.chars() {
        frames.extend(b.push(&c.to_string()));
    }
    frames.extend(b.finish(sum));
    frames
}

fn whole(out: &str, sum: &Summary, stop: &[String]) -> Value {
    let spec = crate::tools::test_spec(&["f"]);
    message(
        "msg_7",
        "tiny",
        &split_ordered(out, on(), Some(&spec)),
        sum,
        stop,
    )
}

/// `create()` and a stream's final message hold the same blocks, in the order the model
/// wrote them: text after a call stays after it.
#[test]
fn the_whole_answer_keeps_the_order_the_stream_has() {
    let call = |x: u32| {
        format!("<tool_call>\n{{\"name\": \"f\", \"arguments\": {{\"x\": {x}}}}}\n</tool_call>")
    };
    let cases = [
        (
            format!("<think>plan</think>\n\nSure.{}Done.", call(1)),
            vec!["thinking", "text", "tool_use", "text"],
        ),
        (
            format!("First.{}Then.{}", call(1), call(2)),
            vec!["text", "tool_use", "text", "tool_use"],
        ),
        (call(3), vec!["tool_use"]),
    ];
    let sum = summary(Finish::Stop, None);
    for (out, types) in cases {
        let m = whole(&out, &sum, &[]);
        let content = m["content"].as_array().unwrap();
        let got: Vec<&str> = content
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(got, types, "{out}");
        let frames = streamed(&out, &sum, &[]);
        assert_eq!(&final_content(&frames), content, "{out}");
        let delta = &frames[frames.len() - 2].1["delta"];
        assert_eq!(delta["stop_reason"], m["stop_reason"], "{out}");
        assert_eq!(m["stop_reason"], "tool_use", "{out}");
    }
    let m = whole(&format!("A{}B", call(1)), &sum, &[]);
    assert_eq!(
        (
            m["content"][0]["text"].as_str(),
            m["content"][2]["text"].as_str()
        ),
        (Some("A"), Some("B"))
    );
    assert_eq!(m["content"][1]["id"], "toolu_7_0");
    assert_eq!(m["content"][1]["input"], json!({"x": 1}));
}

/// What ended the answer is its stop reason, even after a whole call: a client must
/// know the turn was cut short.
#[test]
fn the_limit_or_a_stop_sequence_ends_an_answer_even_after_a_call() {
    let out = "Sure.<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\nAnd";
    let stop = ["END".to_string()];
    for (sum, reason, seq) in [
        (summary(Finish::Length, None), "max_tokens", Value::Null),
        (
            summary(Finish::Stop, Some(0)),
            "stop_sequence",
            json!("END"),
        ),
        (summary(Finish::Stop, None), "tool_use", Value::Null),
    ] {
        let m = whole(out, &sum, &stop);
        assert!(m["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["type"] == "tool_use"));
        assert_eq!(
            (&m["stop_reason"], &m["stop_sequence"]),
            (&json!(reason), &seq)
        );
        let frames = streamed(out, &sum, &stop);
        let delta = &frames[frames.len() - 2].1["delta"];
        assert_eq!(
            (&delta["stop_reason"], &delta["stop_sequence"]),
            (&json!(reason), &seq)
        );
    }
    // No call: the limit, a sequence, or the end of the turn.
    let m = whole("Hi", &summary(Finish::Stop, None), &stop);
    assert_eq!(m["stop_reason"], "end_turn");
}

/// A full queue is Anthropic's 529 `overloaded_error`, which its clients retry.
#[test]
fn overload_is_529_on_anthropics_routes() {
    let e = ApiError::unavailable("all slots are busy and the request queue is full", 1);
    assert_eq!(error_body(&e)["error"]["type"], "overloaded_error");
    let r = AnthropicError(e).into_response();
    assert_eq!(r.status().as_u16(), 529);
    assert_eq!(r.headers()["retry-after"], "1");
    let r = AnthropicError(ApiError::bad_request("x")).into_response();
    assert_eq!(r.status().as_u16(), 400);
    let e = ApiError::new(
        axum::http::StatusCode::GATEWAY_TIMEOUT,
        "the request timed out",
    );
    assert_eq!(error_body(&e)["error"]["type"], "timeout_error");
}
