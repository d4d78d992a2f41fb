//! Constrained output over real HTTP on a tiny random-weight model, whose unconstrained
//! output is noise: whatever it generates under a grammar follows the grammar. GBNF on
//! llama-server's `/completion`, JSON schemas on the OpenAI routes (streaming and not),
//! tool calls with `tool_choice` required and named, and the 400s that name a grammar
//! that does not compile.

use crate::common;

use common::*;
use serde_json::{json, Value};

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or_default()
}

fn streamed_text(frames: &[String], key: impl Fn(&Value) -> Option<String>) -> String {
    frames
        .iter()
        .filter(|f| f.as_str() != "[DONE]")
        .filter_map(|f| serde_json::from_str::<Value>(f).ok())
        .filter_map(|v| key(&v))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gbnf_constrains_the_native_completion_route_streaming_and_not() {
    let s = tiny_server(1, |_| {});
    let grammar = "root ::= \"id-\" [0-9]{3} (\",\" [a-c])?";
    let body = json!({"prompt": "hello", "n_predict": 12, "temperature": 0, "grammar": grammar});
    let (st, v) = post(&s.base, "/completion", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let text = v["content"].as_str().expect("content").to_string();
    let b = text.as_bytes();
    assert!(text.starts_with("id-") && b.len() >= 6, "{text:?}");
    assert!(b[3..6].iter().all(u8::is_ascii_digit), "{text:?}");
    assert!(b.len() == 6 || (b.len() == 8 && b[6] == b',' && (b'a'..=b'c').contains(&b[7])));
    assert_eq!(v["generation_settings"]["grammar"], grammar);
    let mut sbody = body;
    sbody["stream"] = json!(true);
    let (st, frames) = post_stream(&s.base, "/completion", sbody).await;
    assert_eq!(st, 200);
    let streamed = streamed_text(&frames, |v| v["content"].as_str().map(str::to_string));
    assert_eq!(streamed, text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_s_json_schema_closes_objects_as_llama_server_reads_them() {
    let s = tiny_server(1, |_| {});
    // No `additionalProperties`: llama-server's grammar allows the listed keys only,
    // where JSON Schema would let the (random) model add any.
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer",
        "minimum": 0, "maximum": 9}}, "required": ["a"]});
    for seed in 0..4 {
        let body = json!({"prompt": "x", "n_predict": 60, "temperature": 1.5, "seed": seed,
            "json_schema": schema});
        let (st, v) = post(&s.base, "/completion", body).await;
        assert_eq!(st, 200, "{v}");
        let text = v["content"].as_str().expect("content");
        let got: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let keys: Vec<&String> = got.as_object().expect("an object").keys().collect();
        assert_eq!(keys, ["a"], "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schemas_constrain_the_openai_routes() {
    let s = tiny_server(1, |_| {});
    let schema = json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "level": {"enum": ["low", "high"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9}
        },
        "required": ["ok", "level", "n"],
        "additionalProperties": false
    });
    let fmt = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v["ok"].is_boolean(), "{text}");
        assert!(v["level"] == "low" || v["level"] == "high", "{text}");
        assert!(v["n"].as_u64().is_some_and(|n| n <= 9), "{text}");
        assert_eq!(v.as_object().map(|o| o.len()), Some(3), "{text}");
    };
    let chat = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 120,
                      "temperature": 0, "response_format": fmt});
    let (st, v) = post(&s.base, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    check(text);
    let mut sc = chat;
    sc["stream"] = json!(true);
    let (_, frames) = post_stream(&s.base, "/v1/chat/completions", sc).await;
    let streamed = streamed_text(&frames, |v| {
        v["choices"][0]["delta"]["content"]
            .as_str()
            .map(str::to_string)
    });
    assert_eq!(streamed, text);
    // Sampled at a high temperature, every answer still follows the schema.
    let body = json!({"prompt": "x", "max_tokens": 120, "temperature": 1.5, "seed": 5,
                      "n": 1, "json_schema": schema});
    let (st, v) = post(&s.base, "/v1/completions", body).await;
    assert_eq!(st, 200, "{v}");
    check(v["choices"][0]["text"].as_str().expect("text"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_tool_calls_follow_the_tool_s_schema() {
    let s = tiny_server(1, |_| {});
    let tools = json!([
        {"type": "function", "function": {"name": "set_mode", "parameters": {
            "type": "object", "properties": {"mode": {"enum": ["on", "off"]}},
            "required": ["mode"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "ping", "parameters": {
            "type": "object", "properties": {}, "additionalProperties": false}}}
    ]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "set_mode"}}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
            "tool_choice": choice, "parallel_tool_calls": false, "max_tokens": 120,
            "temperature": 0});
        let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
        assert_eq!(st, 200, "{v}");
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1, "{v}");
        let f = &calls[0]["function"];
        let args: Value = serde_json::from_str(f["arguments"].as_str().expect("string"))
            .expect("arguments are JSON text");
        match f["name"].as_str() {
            Some("set_mode") => assert!(args["mode"] == "on" || args["mode"] == "off"),
            Some("ping") => assert_eq!(args, json!({})),
            other => panic!("{other:?}"),
        }
        if choice.is_object() {
            assert_eq!(f["name"], "set_mode");
        }
        assert_eq!(calls[0]["type"], "function");
        assert!(calls[0]["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("call_")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_schemas_that_reference_their_own_definitions_constrain_calls() {
    let s = tiny_server(1, |_| {});
    // Local references as pydantic and MCP servers write them: `$defs`, `definitions`,
    // and the root itself (a recursive tree, kept shallow by `maxItems: 0` below it).
    let params = json!({"type": "object", "properties": {
        "a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#/definitions/B"},
        "sub": {"type": "array", "maxItems": 1, "items": {"$ref": "#/$defs/Leaf"}}},
        "required": ["a", "b", "sub"], "additionalProperties": false,
        "$defs": {"A": {"type": "string", "enum": ["x", "y"]},
                  "Leaf": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
                           "required": ["a"], "additionalProperties": false}},
        "definitions": {"B": {"type": "integer", "minimum": 0, "maximum": 9}}});
    let tools = json!([{"type": "function", "function": {"name": "pick",
        "parameters": params}}]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
            "tools": tools, "tool_choice": "required", "max_tokens": 200, "temperature": 0,
            "parallel_tool_calls": false}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "pick", "input_schema": params}],
            "tool_choice": {"type": "any"}, "max_tokens": 200, "temperature": 0}),
        ),
    ] {
        let (st, v) = post(&s.base, path, body).await;
        assert_eq!(st, 200, "{path}: {v}");
        let args: Value = if path == "/v1/messages" {
            let block = v["content"]
                .as_array()
                .and_then(|c| c.iter().find(|b| b["type"] == "tool_use"))
                .unwrap_or_else(|| panic!("{v}"));
            block["input"].clone()
        } else {
            let f = &v["choices"][0]["message"]["tool_calls"][0]["function"];
            serde_json::from_str(f["arguments"].as_str().unwrap_or_else(|| panic!("{v}")))
                .expect("arguments are JSON")
        };
        assert!(args["a"] == "x" || args["a"] == "y", "{path}: {args}");
        assert!(args["b"].as_u64().is_some_and(|b| b <= 9), "{path}: {args}");
        for leaf in args["sub"].as_array().expect("sub") {
            assert!(leaf["a"] == "x" || leaf["a"] == "y", "{path}: {args}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_beside_a_json_schema_answer_in_a_call_or_in_the_schema() {
    let s = tiny_server(1, |_| {});
    let tools = json!([{"type": "function", "function": {"name": "set_mode", "parameters": {
        "type": "object", "properties": {"mode": {"enum": ["on", "off"]}},
        "required": ["mode"], "additionalProperties": false}}}]);
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer",
        "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": false});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "a", "schema": schema,
        "strict": true}});
    // Either a call of the tool or the schema's answer, whichever the model starts
    // (this random model starts calls; the schema's branch is taken below).
    for seed in 0..6 {
        let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
            "response_format": rf, "max_tokens": 120, "temperature": 1.5, "seed": seed});
        let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
        assert_eq!(st, 200, "{v}");
        let m = &v["choices"][0]["message"];
        match m["tool_calls"].as_array() {
            Some(calls) => {
                for c in calls {
                    let args: Value =
                        serde_json::from_str(c["function"]["arguments"].as_str().expect("text"))
                            .expect("JSON");
                    assert!(args["mode"] == "on" || args["mode"] == "off", "{v}");
                }
            }
            None => {
                let text = m["content"].as_str().expect("content");
                let a: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {v}"));
                assert!(a["n"].as_u64().is_some_and(|n| n <= 9), "{v}");
            }
        }
    }
    // With the first token of the call's opening tag banned (`<` in this vocabulary),
    // the greedy answer takes the schema's branch.
    let (st, v) = post(&s.base, "/tokenize", json!({"content": "<tool_call>"})).await;
    assert_eq!(st, 200, "{v}");
    let open = v["tokens"].as_array().expect("tokens");
    let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
        "response_format": rf, "max_tokens": 120, "temperature": 0,
        "logit_bias": {open[0].to_string(): -100}});
    let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    let a: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(a["n"].as_u64().is_some_and(|n| n <= 9), "{v}");
    // The same on Responses, where agents with an output type send both.
    let body = json!({"input": "x", "tools": [{"type": "function", "name": "set_mode",
        "parameters": tools[0]["function"]["parameters"]}], "max_output_tokens": 120,
        "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}});
    let (st, v) = post(&s.base, "/v1/responses", body).await;
    assert_eq!(st, 200, "{v}");
    // A grammar that is not JSON still cannot share an answer with calls.
    let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": tools,
        "grammar": "root ::= \"a\"", "max_tokens": 4});
    let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "tool_choice", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grammars_that_do_not_compile_are_400s_with_the_reason() {
    let s = tiny_server(1, |_| {});
    let msgs = json!([{"role": "user", "content": "x"}]);
    for (extra, want) in [
        (
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "strnig"}}}}),
            "strnig",
        ),
        (json!({"grammar": "root ::= (\"a\""}), "unclosed `(`"),
        (json!({"grammar": "root ::= missing"}), "g_missing"),
        (
            json!({"json_schema": {"type": "object"}, "grammar": "root ::= \"a\""}),
            "give one",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "`g`",
        ),
    ] {
        let mut body = json!({"messages": msgs, "max_tokens": 4});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
        assert_eq!(st, 400, "{extra}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(message(&v).contains(want), "{extra}: {}", message(&v));
    }
}

/// `root ::= "w0" | "w1" | ...` with `n` alternatives, in GBNF.
fn alternatives(n: usize) -> String {
    let alts: Vec<String> = (0..n).map(|i| format!("\"w{i}\"")).collect();
    format!("root ::= {}", alts.join(" | "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grammars_past_the_engine_limits_are_400s_naming_the_field_on_every_route() {
    let s = tiny_server(1, |c| c.body_limit = 4 << 20);
    let gbnf = alternatives(50_000);
    let values: Vec<String> = (0..100_000).map(|i| format!("v{i}")).collect();
    let schema =
        json!({"type": "object", "properties": {"a": {"enum": values}}, "required": ["a"]});
    let tools: Vec<Value> = (0..2_000)
        .map(|i| {
            json!({"type": "function", "function": {"name": format!("f{i}"),
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}})
        })
        .collect();
    let fmt = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    let chat = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4});
    let text = json!({"prompt": "x", "max_tokens": 4});
    let native = json!({"prompt": "x", "n_predict": 4});
    let mut cases: Vec<(&str, Value, &str, Value)> = Vec::new();
    for path in ["/v1/chat/completions", "/chat/completions"] {
        cases.push((path, chat.clone(), "grammar", json!(gbnf)));
        cases.push((path, chat.clone(), "response_format", fmt.clone()));
        cases.push((path, chat.clone(), "tools", json!(tools)));
    }
    cases.push(("/v1/completions", text.clone(), "grammar", json!(gbnf)));
    cases.push((
        "/v1/completions",
        text.clone(),
        "response_format",
        fmt.clone(),
    ));
    for path in ["/completion", "/completions"] {
        cases.push((path, native.clone(), "grammar", json!(gbnf)));
        cases.push((path, native.clone(), "json_schema", schema.clone()));
    }
    for (path, base, field, value) in cases {
        for stream in [false, true] {
            let mut body = base.clone();
            body[field] = value.clone();
            body["stream"] = json!(stream);
            let (st, v) = post(&s.base, path, body).await;
            assert_eq!(st, 400, "{path} {field} stream={stream}: {v}");
            let m = message(&v);
            assert!(
                m.contains(&format!("field `{field}`")) && m.contains("limit"),
                "{path} {field}: {m}"
            );
            assert!(!m.contains("backtrace"), "{path} {field}: {m}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_met_only_mid_generation_is_the_callers_error_naming_the_field() {
    let s = tiny_server(1, |c| c.body_limit = 4 << 20);
    // Forty letters (past the compile's probe) before two groups of 1,500 alternatives
    // that open together (each alone is under the translation's per-group check).
    let half = |p: &str| {
        (0..1_500)
            .map(|i| format!("\"{p}{i}\""))
            .collect::<Vec<_>>()
    };
    let grammar = format!(
        "root ::= [a-z]{{40}} (a | b)\na ::= {}\nb ::= {}",
        half("a").join(" | "),
        half("b").join(" | ")
    );
    let body = json!({"prompt": "x", "n_predict": 60, "grammar": grammar});
    let (st, v) = post(&s.base, "/completion", body).await;
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("field `grammar`"), "{v}");
    assert!(message(&v).contains("alternatives are open"), "{v}");
    // Met while generating (the compile would name the GBNF grammar).
    assert!(message(&v).contains("the grammar exceeds"), "{v}");
}

/// A schema keyword the engine cannot enforce (`uniqueItems`, an unknown `format`): a
/// strict schema is a 400 naming it; a non-strict one (OpenAI's default, ollama's and
/// llama-server's only kind, a chat tool's default) constrains the output by the rest and
/// lists what it left out in the `x-minfer-schema-unenforced` header, on every route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lenient_schemas_constrain_by_the_rest_and_say_what_they_left_out() {
    let s = tiny_server(1, |_| {});
    let schema = json!({
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2,
                     "uniqueItems": true},
            "n": {"type": "integer", "minimum": 0, "maximum": 9}
        },
        "required": ["tags", "n"],
        "additionalProperties": false
    });
    let msgs = json!([{"role": "user", "content": "x"}]);
    let fmt = |strict: Option<bool>| {
        let mut js = json!({"name": "x", "schema": schema});
        if let Some(b) = strict {
            js["strict"] = json!(b);
        }
        json!({"type": "json_schema", "json_schema": js})
    };
    let send = |path: &'static str, body: Value| {
        let base = s.base.clone();
        async move {
            let (st, headers, text) = post_text(&base, path, body).await;
            let h = headers
                .get("x-minfer-schema-unenforced")
                .map(|v| v.to_str().unwrap_or("").to_string());
            (st, h, text)
        }
    };
    // Strict: refused by name.
    let body = json!({"messages": msgs, "max_tokens": 40, "temperature": 0,
                      "response_format": fmt(Some(true))});
    let (st, h, text) = send("/v1/chat/completions", body).await;
    assert_eq!(st, 400, "{text}");
    assert!(text.contains("uniqueItems"), "{text}");
    assert!(h.is_none());
    // Not strict, streamed and not: the rest holds and the header names the keyword.
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v["tags"].as_array().is_some_and(|t| t.len() <= 2), "{text}");
        assert!(v["n"].as_u64().is_some_and(|n| n <= 9), "{text}");
    };
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": 240, "temperature": 0,
                                         "response_format": fmt(None)}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": 240, "temperature": 0,
                                         "stream": true, "response_format": fmt(Some(false))}),
        ),
        (
            "/completion",
            json!({"prompt": "x", "n_predict": 240, "temperature": 0,
                               "json_schema": schema}),
        ),
        (
            "/api/chat",
            json!({"model": "tiny-qwen2", "messages": msgs, "stream": false,
                             "format": schema, "options": {"num_predict": 240, "temperature": 0}}),
        ),
        (
            "/v1/responses",
            json!({"input": "x", "max_output_tokens": 240, "temperature": 0,
                                 "text": {"format": {"type": "json_schema", "name": "x",
                                                     "schema": schema}}}),
        ),
    ] {
        let stream = body["stream"] == json!(true);
        let (st, h, text) = send(path, body).await;
        assert_eq!(st, 200, "{path}: {text}");
        let h = h.unwrap_or_else(|| panic!("{path}: no header"));
        assert!(h.contains("uniqueItems"), "{path}: {h}");
        let out = if stream {
            let frames = sse_data(&text);
            streamed_text(&frames, |v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_string)
            })
        } else {
            let v: Value = serde_json::from_str(&text).expect("json");
            v["choices"][0]["message"]["content"]
                .as_str()
                .or(v["content"].as_str())
                .or(v["message"]["content"].as_str())
                .or(v["output"][0]["content"][0]["text"].as_str())
                .unwrap_or_else(|| panic!("{path}: no text in {v}"))
                .to_string()
        };
        check(&out);
    }
    // A tool's parameters: lenient unless the tool says `strict`.
    let tool = |strict: bool| {
        json!([{"type": "function", "function": {"name": "f", "strict": strict,
            "parameters": {"type": "object", "properties": {"x": {"type": "string",
                "format": "x-made-up"}}, "required": ["x"]}}}])
    };
    let body = json!({"messages": msgs, "max_tokens": 40, "temperature": 0,
                      "tools": tool(false), "tool_choice": "required"});
    let (st, h, text) = send("/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{text}");
    assert!(h.is_some_and(|h| h.contains("x-made-up")), "{text}");
    let body = json!({"messages": msgs, "max_tokens": 40, "temperature": 0,
                      "tools": tool(true), "tool_choice": "required"});
    let (st, _, text) = send("/v1/chat/completions", body).await;
    assert_eq!(st, 400, "{text}");
    assert!(text.contains("x-made-up"), "{text}");
}
