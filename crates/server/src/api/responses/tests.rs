//! The Responses codec against the documented request shapes.

use std::time::Duration;

use serde_json::{json, Value};

use super::items::{input_items, page, DEFAULT_LIMIT};
use super::output::Builder;
use super::request::{check_results, parse};
use super::response::{base, finished};
use crate::answer::{coalesce, AnswerSplitter};
use crate::api::fields::Object;
use crate::error::ApiError;
use crate::job::{Finish, Summary};
use crate::reasoning::Reasoning;

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
            json!({"input": "hi", "reasoning": {"summary": "auto"}}),
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

/// Refusals name their field in `param` too, not only in the message.
#[test]
fn refusals_name_the_field_in_param() {
    let cases = [
        (json!({"input": "hi", "background": true}), "background"),
        (json!({"input": "hi", "top_logprobs": 2}), "top_logprobs"),
        (
            json!({"input": "hi", "max_tool_calls": 2}),
            "max_tool_calls",
        ),
        (json!({"input": "hi", "conversation": "c"}), "conversation"),
        (json!({"input": "hi", "prompt": {"id": "p"}}), "prompt"),
        (
            json!({"input": "hi", "reasoning": {"summary": "auto"}}),
            "reasoning.summary",
        ),
        (
            json!({"input": "hi", "tools": [{"type": "function", "name": "f"}],
                   "tool_choice": {"type": "function", "name": "f", "mode": "x"}}),
            "tool_choice.mode",
        ),
        (json!({"input": "hi", "top_p": 1.5}), "top_p"),
        (json!({"input": "hi", "top_p": 0}), "top_p"),
        (
            json!({"input": "hi", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"input": "hi", "max_output_tokens": "x"}),
            "max_output_tokens",
        ),
        (json!({"input": "hi", "temperature": 3}), "temperature"),
        (
            json!({"input": "hi", "text": {"verbosity": "loud"}}),
            "text.verbosity",
        ),
    ];
    for (body, name) in cases {
        let e = parse(&obj(body)).unwrap_err();
        assert_eq!(e.status, 400, "{name}");
        assert_eq!(e.param.as_deref(), Some(name), "{}", e.message);
    }
}

/// OpenAI's defaults sent explicitly ask for nothing this server lacks.
#[test]
fn background_false_and_an_empty_reasoning_are_taken() {
    for extra in [
        json!({"background": false}),
        json!({"reasoning": {}}),
        json!({"reasoning": {"effort": null}}),
        json!({"reasoning": {"effort": null, "summary": null}}),
        // An effort reaches the template (`api::thinking`), as chat's does.
        json!({"reasoning": {"effort": "low"}}),
        json!({"reasoning": null, "background": null}),
        json!({"text": {"format": {"type": "text"}, "verbosity": "low"}}),
    ] {
        let mut body = json!({"input": "hi"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        assert!(parse(&obj(body)).is_ok(), "{extra}");
    }
}

#[test]
fn metadata_is_held_to_openai_s_limits() {
    let pairs = |n: usize| {
        Value::Object(
            (0..n)
                .map(|i| (format!("k{i}"), json!("v")))
                .collect::<Object>(),
        )
    };
    let ok = |m: Value| parse(&obj(json!({"input": "hi", "metadata": m})));
    let p = ok(pairs(16)).unwrap();
    assert_eq!(p.metadata.as_object().unwrap().len(), 16);
    assert!(ok(json!({"k".repeat(64): "v".repeat(512)})).is_ok());
    // Characters, not bytes.
    assert!(ok(json!({"é".repeat(64): "é".repeat(512)})).is_ok());
    for bad in [
        pairs(17),
        json!({"k".repeat(65): "v"}),
        json!({"k": "v".repeat(513)}),
        json!({"k": 1}),
        json!({"k": null}),
        json!(["k"]),
    ] {
        let e = ok(bad.clone()).unwrap_err();
        assert_eq!(e.status, 400, "{bad}");
        assert_eq!(e.param.as_deref(), Some("metadata"), "{bad}: {}", e.message);
        assert!(e.message.contains("metadata"), "{}", e.message);
    }
}

/// The response echoes what the request sent (numbers as written) and what was applied
/// (each tool's `strict`), and a completed one says when.
#[test]
fn the_response_echoes_the_request_as_sent_and_applied() {
    let body = obj(json!({"input": "hi", "temperature": 0.2, "top_p": 0.9,
        "parallel_tool_calls": false, "text": {"verbosity": "low"},
        "tools": [{"type": "function", "name": "f"},
                  {"type": "function", "name": "g", "strict": false}]}));
    let p = parse(&body).unwrap();
    let r = base("resp_x", 1, "m", &p, &body);
    assert_eq!(r["temperature"].to_string(), "0.2");
    assert_eq!(r["top_p"].to_string(), "0.9");
    assert_eq!(r["parallel_tool_calls"], false);
    assert_eq!(
        r["text"],
        json!({"format": {"type": "text"}, "verbosity": "low"})
    );
    assert_eq!(r["tools"][0]["strict"], true);
    assert_eq!(r["tools"][1]["strict"], false);
    assert_eq!(r["background"], false);
    // Without tools, `parallel_tool_calls: false` still echoes false; unsent numbers echo
    // the defaults applied, at their shortest.
    let body = obj(json!({"input": "hi", "parallel_tool_calls": false}));
    let p = parse(&body).unwrap();
    let r = base("resp_x", 1, "m", &p, &body);
    assert_eq!(r["parallel_tool_calls"], false);
    let t = p.g.sampling.temperature;
    assert_eq!(r["temperature"].to_string(), t.to_string());
    assert_eq!(r["top_p"].to_string(), p.g.sampling.top_p.to_string());
    assert!(r["text"].get("verbosity").is_none());
    assert!(r["completed_at"].is_null());
    let sum = |finish| Summary {
        choice: 0,
        finish,
        prompt_tokens: 1,
        cached_tokens: 0,
        completion_tokens: 1,
        prompt_time: Duration::ZERO,
        predicted_time: Duration::ZERO,
        stop_word: None,
    };
    let b = Builder::new("x");
    let done = finished(&r, &b, &sum(Finish::Stop));
    assert_eq!(done["status"], "completed");
    assert!(
        done["completed_at"].as_u64().unwrap() > 1_600_000_000,
        "{done}"
    );
    let cut = finished(&r, &b, &sum(Finish::Length));
    assert_eq!(cut["status"], "incomplete");
    assert!(cut["completed_at"].is_null());
}

#[test]
fn a_prompt_past_the_context_names_input() {
    let e = ApiError::context_length_exceeded(256, 300).naming_prompt("input");
    assert_eq!(e.param.as_deref(), Some("input"));
    assert!(!e.message.contains("messages"), "{}", e.message);
    assert!(
        e.message.contains("your input resulted in 300 tokens"),
        "{}",
        e.message
    );
    // Other errors pass unchanged.
    let other = ApiError::bad_request("field `messages` x");
    assert_eq!(other.clone().naming_prompt("input"), other);
}

/// The whole answer's items are the stream's: in the order written, with the same ids.
#[test]
fn the_whole_answer_keeps_the_order_and_ids_of_the_stream() {
    let out = "<think>Plan.</think>Let me check.<tool_call>\n{\"name\": \"f\", \"arguments\": \
               {\"x\": 1}}\n</tool_call>Done?<tool_call>\n{\"name\": \"f\", \"arguments\": \
               {}}\n</tool_call>";
    let on = Reasoning {
        split: true,
        open: false,
        harmony: false,
    };
    let spec = crate::tools::test_spec(&["f"]);
    let whole = Builder::whole("s", out, on, Some(&spec));
    let kinds: Vec<&str> = whole
        .items()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "reasoning",
            "message",
            "function_call",
            "message",
            "function_call"
        ]
    );
    assert_eq!(whole.items()[1]["content"][0]["text"], "Let me check.");
    assert_eq!(whole.items()[3]["content"][0]["text"], "Done?");
    // Streamed a character at a time, as the stream's builder sees it.
    let mut s = AnswerSplitter::new(on, Some(&spec));
    let mut streamed = Builder::new("s");
    for c in out.chars() {
        streamed.push(coalesce(s.push(&c.to_string())));
    }
    streamed.push(coalesce(s.finish()));
    streamed.finish();
    assert_eq!(whole.items(), streamed.items());
    let ids: Vec<&str> = whole
        .items()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["rs_s_0", "msg_s_1", "fc_s_0", "msg_s_3", "fc_s_1"]);
}

#[test]
fn input_items_list_the_request_s_input_with_ids() {
    let items = input_items(&json!("hi"), "s");
    assert_eq!(
        items,
        [
            json!({"type": "message", "id": "msg_s_in_0", "role": "user",
                "status": "completed", "content": [{"type": "input_text", "text": "hi"}]})
        ]
    );
    let input = json!([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "id": "msg_mine",
         "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "call_1", "name": "w", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
    ]);
    // The reader takes it (the items are built from what it accepted).
    assert!(parse(&obj(json!({"input": input.clone()}))).is_ok());
    let items = input_items(&input, "s");
    let ids: Vec<&str> = items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "msg_s_in_0",
            "msg_mine",
            "msg_s_in_3",
            "fc_s_in_4",
            "fco_s_in_5"
        ]
    );
    assert_eq!(items[0]["role"], "developer");
    assert_eq!(items[0]["content"][0]["type"], "input_text");
    assert_eq!(
        items[2]["content"][0],
        json!({"type": "output_text", "text": "Checking.", "annotations": []})
    );
    assert_eq!(items[3]["call_id"], "call_1");
    assert_eq!(items[3]["status"], "completed");
    assert_eq!(items[4]["output"], "18 C");
}

#[test]
fn input_items_pages_follow_limit_order_and_after() {
    let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("i{i}")})).collect();
    let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let ids = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_string())
            .collect()
    };
    // Newest first by default, all of them under the default limit.
    let p = page(&items, &[]).unwrap();
    assert_eq!(p["object"], "list");
    assert_eq!(ids(&p), ["i4", "i3", "i2", "i1", "i0"]);
    assert_eq!(
        (&p["first_id"], &p["last_id"]),
        (&json!("i4"), &json!("i0"))
    );
    assert_eq!(p["has_more"], false);
    let p = page(&items, &q(&[("order", "asc"), ("limit", "2")])).unwrap();
    assert_eq!(ids(&p), ["i0", "i1"]);
    assert_eq!(p["has_more"], true);
    let p = page(
        &items,
        &q(&[("order", "asc"), ("limit", "2"), ("after", "i1")]),
    )
    .unwrap();
    assert_eq!(ids(&p), ["i2", "i3"]);
    assert_eq!(p["has_more"], true);
    let p = page(&items, &q(&[("limit", "2"), ("after", "i1")])).unwrap();
    assert_eq!(ids(&p), ["i0"]);
    assert_eq!(p["has_more"], false);
    let p = page(&items, &q(&[("after", "i0")])).unwrap();
    assert!(ids(&p).is_empty());
    assert!(p["first_id"].is_null());
    let many: Vec<Value> = (0..30).map(|i| json!({"id": format!("i{i}")})).collect();
    assert_eq!(ids(&page(&many, &[]).unwrap()).len(), DEFAULT_LIMIT);
    assert_eq!(
        ids(&page(&many, &q(&[("limit", "100")])).unwrap()).len(),
        30
    );
    for (k, v) in [
        ("limit", "0"),
        ("limit", "101"),
        ("limit", "x"),
        ("order", "up"),
        ("after", "nope"),
        ("include[]", "message.input_image.image_url"),
    ] {
        let e = page(&items, &q(&[(k, v)])).unwrap_err();
        assert_eq!(e.status, 400, "{k}={v}");
        let name = k.trim_end_matches("[]");
        assert_eq!(e.param.as_deref(), Some(name), "{k}={v}: {}", e.message);
    }
}
