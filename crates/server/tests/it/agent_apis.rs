//! Anthropic's Messages and OpenAI's Responses routes over HTTP against the tiny model:
//! the API key (`x-api-key` or bearer), the body limit, the Host check and refusals in
//! each API's error shape; token counting; responses kept for `previous_response_id`
//! and GET. The official clients drive them against the real model elsewhere
//! (scripts/e2e_anthropic.py, scripts/e2e_responses.py).

use crate::common;

use common::*;
use serde_json::{json, Value};

fn post_raw(addr: std::net::SocketAddr, path: &str, headers: &str, body: &str) -> String {
    raw(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\ncontent-type: application/json\r\n\
             {headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn body_of(answer: &str) -> Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|_| panic!("JSON body in {answer}"))
}

const MESSAGE: &str =
    r#"{"model":"m","max_tokens":2,"temperature":0,"messages":[{"role":"user","content":"hi"}]}"#;
const RESPONSE: &str = r#"{"input":"hi","max_output_tokens":2,"temperature":0}"#;

#[test]
fn new_routes_are_behind_the_key_the_body_limit_and_the_host_check() {
    let s = tiny_server(1, |c| {
        c.api_key = Some("sekret".into());
        c.body_limit = 1024;
        c.rerank = true;
    });
    let addr = s.running.addr();
    for (path, body) in [
        ("/v1/messages", MESSAGE),
        ("/v1/responses", RESPONSE),
        ("/v1/embeddings", r#"{"input":"hi"}"#),
        ("/embedding", r#"{"content":"hi"}"#),
        ("/embeddings", r#"{"content":"hi"}"#),
        ("/api/embed", r#"{"model":"tiny-qwen2","input":"hi"}"#),
        ("/api/embeddings", r#"{"model":"tiny-qwen2","prompt":"hi"}"#),
        ("/v1/rerank", r#"{"query":"hi","documents":["yes"]}"#),
        ("/rerank", r#"{"query":"hi","documents":["yes"]}"#),
    ] {
        let a = post_raw(addr, path, "", body);
        assert!(a.starts_with("HTTP/1.1 401"), "{path}: {a}");
        for key in ["x-api-key: sekret\r\n", "authorization: Bearer sekret\r\n"] {
            let a = post_raw(addr, path, key, body);
            // Past the key, rerank reaches its handler, which finds no yes/no tokens in
            // the tiny vocabulary.
            let handled = a.starts_with("HTTP/1.1 200")
                || (path.contains("rerank") && a.contains("no single \\\"yes\\\""));
            assert!(handled, "{path} {key:?}: {a}");
        }
        let big = format!(r#"{{"input":"{}","model":"{}"}}"#, "x".repeat(2000), "m");
        let a = post_raw(addr, path, "x-api-key: sekret\r\n", &big);
        assert!(a.starts_with("HTTP/1.1 413"), "{path}: {a}");
        let a = raw(
            addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: evil.example:{}\r\ncontent-type: application/json\r\n\
                 x-api-key: sekret\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                addr.port(),
                body.len()
            ),
        );
        assert!(a.starts_with("HTTP/1.1 4"), "{path}: {a}");
        assert!(!a.starts_with("HTTP/1.1 401"), "{path}: {a}");
    }
    // Refusals before the handler speak Anthropic's shape on its routes.
    let v = body_of(&post_raw(addr, "/v1/messages", "", MESSAGE));
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_count_tokens_and_refusals_in_anthropics_shape() {
    let s = tiny_server(1, |_| {});
    let b = &s.base;
    let req: Value = serde_json::from_str(MESSAGE).unwrap();
    let (st, v) = post(b, "/v1/messages", req.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert!(
        ["end_turn", "max_tokens"].contains(&v["stop_reason"].as_str().unwrap()),
        "{v}"
    );
    let input = v["usage"]["input_tokens"].as_u64().unwrap();
    let (st, c) = post(
        b,
        "/v1/messages/count_tokens",
        json!({"model": "m", "messages": req["messages"]}),
    )
    .await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["input_tokens"].as_u64(), Some(input));
    for (body, field) in [
        (
            json!({"model": "m", "max_tokens": 2, "messages": req["messages"], "container": "c"}),
            "container",
        ),
        (
            json!({"model": "m", "messages": req["messages"]}),
            "max_tokens",
        ),
        (
            json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user",
            "content": [{"type": "document", "source": {}}]}]}),
            "messages[0].content[0].type",
        ),
    ] {
        let (st, v) = post(b, "/v1/messages", body).await;
        assert_eq!(st, 400, "{v}");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{field}: {v}"
        );
    }
    // The stream: Anthropic's event names, in order, and the data's own `type`.
    let r = client()
        .post(format!("{b}/v1/messages"))
        .json(
            &json!({"model": "m", "max_tokens": 3, "temperature": 0, "stream": true,
                      "messages": req["messages"]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"), "{text}");
    assert_eq!(
        &names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{text}"
    );
    let data = sse_data(&text);
    assert_eq!(data.len(), names.len());
    for (n, d) in names.iter().zip(&data) {
        let v: Value = serde_json::from_str(d).unwrap();
        assert_eq!(v["type"], *n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_kept_for_continuations_and_retrieval() {
    let s = tiny_server(1, |_| {});
    let b = &s.base;
    let (st, r1) = post(
        b,
        "/v1/responses",
        json!({"input": "hi", "max_output_tokens": 3,
        "temperature": 0, "instructions": "Be brief."}),
    )
    .await;
    assert_eq!(st, 200, "{r1}");
    let id = r1["id"].as_str().unwrap();
    assert!(id.starts_with("resp_"));
    assert_eq!(r1["object"], "response");
    assert!(["completed", "incomplete"].contains(&r1["status"].as_str().unwrap()));
    let (st, got) = get(b, &format!("/v1/responses/{id}")).await;
    assert_eq!(st, 200);
    assert_eq!(serde_json::from_str::<Value>(&got).unwrap(), r1);
    let (st, r2) = post(
        b,
        "/v1/responses",
        json!({"input": "more", "max_output_tokens": 3,
        "temperature": 0, "previous_response_id": id, "store": false}),
    )
    .await;
    assert_eq!(st, 200, "{r2}");
    assert_eq!(r2["previous_response_id"], id);
    // The continuation's prompt holds the first turn and its answer.
    let n = |r: &Value, k: &str| r["usage"][k].as_u64().unwrap();
    assert!(n(&r2, "input_tokens") > n(&r1, "input_tokens"), "{r1} {r2}");
    let (st, _) = get(b, &format!("/v1/responses/{}", r2["id"].as_str().unwrap())).await;
    assert_eq!(st, 404, "store: false keeps nothing");
    let (st, v) = post(
        b,
        "/v1/responses",
        json!({"input": "x", "previous_response_id": "resp_nope"}),
    )
    .await;
    assert_eq!(st, 404, "{v}");
    assert_eq!(v["error"]["param"], "previous_response_id");
    let (st, v) = post(
        b,
        "/v1/responses",
        json!({"input": "x", "background": true}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("background"),
        "{v}"
    );
    // The stream: typed events, numbered, ending with the whole response.
    let (st, frames) = post_stream(
        b,
        "/v1/responses",
        json!({"input": "hi", "stream": true,
        "max_output_tokens": 3, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200);
    let events: Vec<Value> = frames
        .iter()
        .map(|f| serde_json::from_str(f).unwrap())
        .collect();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        &types[..2],
        ["response.created", "response.in_progress"],
        "{types:?}"
    );
    let last = events.last().unwrap();
    assert!(["response.completed", "response.incomplete"].contains(&types[types.len() - 1]));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"].as_u64(), Some(i as u64));
    }
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    let whole = last["response"]["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "message")
        .filter_map(|o| o["content"][0]["text"].as_str())
        .collect::<String>();
    assert_eq!(text, whole);
}

/// The router's own refusals (no route, a wrong method, a body that is not JSON or too
/// large) on Anthropic's paths are Anthropic's errors; elsewhere they stay OpenAI's.
#[test]
fn router_refusals_on_anthropics_paths_have_its_shape() {
    let s = tiny_server(1, |c| c.body_limit = 1024);
    let addr = s.running.addr();
    let json = "content-type: application/json\r\n";
    let big = format!(r#"{{"model":"m","pad":"{}"}}"#, "x".repeat(2000));
    for (head, headers, body, status, kind) in [
        ("GET /v1/messages", "", "", 405, "invalid_request_error"),
        (
            "GET /v1/messages/count_tokens",
            "",
            "",
            405,
            "invalid_request_error",
        ),
        ("POST /v1/messages/foo", json, "{}", 404, "not_found_error"),
        (
            "POST /v1/messages/count_tokens/",
            json,
            "{}",
            404,
            "not_found_error",
        ),
        (
            "POST /v1/messages",
            "",
            MESSAGE,
            415,
            "invalid_request_error",
        ),
        (
            "POST /v1/messages/count_tokens",
            "content-type: text/plain\r\n",
            MESSAGE,
            415,
            "invalid_request_error",
        ),
        ("POST /v1/messages", json, &big, 413, "request_too_large"),
    ] {
        let (st, v) = raw_json(addr, head, headers, body);
        assert_eq!(st, status, "{head}: {v}");
        assert_eq!(v["type"], "error", "{head}: {v}");
        assert_eq!(v["error"]["type"], kind, "{head}: {v}");
        assert!(v["error"]["message"].is_string(), "{head}: {v}");
    }
    for (head, status) in [("GET /v1/chat/completions", 405), ("POST /v1/nope", 404)] {
        let (st, v) = raw_json(addr, head, json, "{}");
        assert_eq!(st, status, "{head}: {v}");
        assert!(v["error"]["message"].is_string(), "{head}: {v}");
        assert!(v.get("type").is_none(), "{head}: {v}");
    }
}

/// A full queue is Anthropic's 529 `overloaded_error` (its clients retry it) on its
/// route, and stays a 503 on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_529_overloaded_on_anthropics_route() {
    let s = tiny_server(1, |c| {
        c.fault_injection = true;
        c.queue = 1;
    });
    let b = s.base.clone();
    // Two slow requests: one holds the slot (10 ms a token), one fills the queue.
    let slow = json!({"prompt": format!("hold {}", minfer_server::openai::SLOW_MARKER),
        "n_predict": 120, "ignore_eos": true, "temperature": 0});
    let mut held = Vec::new();
    for _ in 0..2 {
        let (base, slow) = (b.clone(), slow.clone());
        held.push(tokio::spawn(async move {
            post(&base, "/completion", slow).await
        }));
        let t0 = std::time::Instant::now();
        let want = format!("minfer_queue_length {}", held.len() - 1);
        loop {
            let (_, slots) = get(&b, "/slots").await;
            let (_, metrics) = get(&b, "/metrics").await;
            if slots.contains("\"is_processing\":true") && metrics.contains(&want) {
                break;
            }
            assert!(t0.elapsed().as_secs() < 10, "{slots} {metrics}");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    let (st, h, text) = post_text(&b, "/v1/messages", serde_json::from_str(MESSAGE).unwrap()).await;
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(st, 529, "{v}");
    assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
    assert!(h.get("retry-after").is_some(), "{h:?}");
    let (st, v) = post(
        &b,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    )
    .await;
    assert_eq!(st, 503, "{v}");
    for h in held {
        let (st, v) = h.await.unwrap();
        assert_eq!(st, 200, "{v}");
    }
}

/// The content blocks a client builds from a Messages stream (`get_final_message()`).
fn final_content(frames: &[String]) -> Vec<Value> {
    let mut content: Vec<Value> = Vec::new();
    let mut json_in = String::new();
    for f in frames {
        let d: Value = serde_json::from_str(f).unwrap();
        let i = d["index"].as_u64().unwrap_or(0) as usize;
        match d["type"].as_str().unwrap() {
            "content_block_start" => {
                content.push(d["content_block"].clone());
                json_in.clear();
            }
            "content_block_delta" => {
                let delta = &d["delta"];
                let key = match delta["type"].as_str().unwrap() {
                    "text_delta" => "text",
                    "thinking_delta" => "thinking",
                    _ => {
                        json_in.push_str(delta["partial_json"].as_str().unwrap());
                        continue;
                    }
                };
                let t = format!(
                    "{}{}",
                    content[i][key].as_str().unwrap(),
                    delta[key].as_str().unwrap()
                );
                content[i][key] = json!(t);
            }
            "content_block_stop" if content[i]["type"] == "tool_use" => {
                content[i]["input"] = serde_json::from_str(&json_in).unwrap();
            }
            _ => {}
        }
    }
    content
}

/// `create()` and a stream's final message agree: same blocks, same order, same stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_message_and_its_stream_hold_the_same_blocks() {
    let s = tiny_server(1, |_| {});
    let b = &s.base;
    let req = json!({"model": "m", "max_tokens": 12, "temperature": 0,
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]},
            {"role": "user", "content": "and?"}]});
    let (st, whole) = post(b, "/v1/messages", req.clone()).await;
    assert_eq!(st, 200, "{whole}");
    let mut sreq = req;
    sreq["stream"] = json!(true);
    let (st, frames) = post_stream(b, "/v1/messages", sreq).await;
    assert_eq!(st, 200);
    assert_eq!(
        &final_content(&frames),
        whole["content"].as_array().unwrap()
    );
    let delta: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
}

/// A request's (status, JSON body) for `method` on `path`.
async fn send(method: reqwest::Method, base: &str, path: &str) -> (u16, Value) {
    let r = client()
        .request(method, format!("{base}{path}"))
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// A kept response's input items listed page by page, cancelling refused (no background
/// mode), deleting it (once), each with and without `/v1`; unknown ids are 404s naming
/// `response_id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_list_input_items_refuse_cancel_and_delete() {
    use reqwest::Method;
    let s = tiny_server(1, |_| {});
    let b = &s.base;
    let (st, r) = post(
        b,
        "/v1/responses",
        json!({"input": [{"role": "developer", "content": "Be brief."},
                         {"type": "message", "role": "user", "id": "msg_mine",
                          "content": [{"type": "input_text", "text": "hi"}]}],
               "max_output_tokens": 2, "temperature": 0.2, "parallel_tool_calls": false,
               "background": false, "reasoning": {"effort": null},
               "metadata": {"k": "v"}}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["temperature"].to_string(), "0.2", "{r}");
    assert_eq!(r["parallel_tool_calls"], false, "{r}");
    assert_eq!(r["metadata"], json!({"k": "v"}));
    if r["status"] == "completed" {
        assert!(r["completed_at"].is_u64(), "{r}");
    }
    let id = r["id"].as_str().unwrap();
    for prefix in ["/v1", ""] {
        let (st, v) = send(
            Method::GET,
            b,
            &format!("{prefix}/responses/{id}/input_items"),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["object"], "list");
        assert_eq!(v["has_more"], false);
        // Newest first by default.
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), 2, "{v}");
        assert_eq!(data[0]["id"], "msg_mine");
        assert_eq!(data[0]["content"][0]["text"], "hi");
        assert_eq!(data[1]["role"], "developer");
        assert_eq!(
            (&v["first_id"], &v["last_id"]),
            (&data[0]["id"], &data[1]["id"])
        );
    }
    let path = format!("/v1/responses/{id}/input_items?order=asc&limit=1");
    let (st, v) = send(Method::GET, b, &path).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"][0]["role"], "developer", "{v}");
    assert_eq!(v["has_more"], true);
    let after = v["last_id"].as_str().unwrap();
    let (st, v) = send(Method::GET, b, &format!("{path}&after={after}")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"][0]["id"], "msg_mine", "{v}");
    assert_eq!(v["has_more"], false);
    let (st, v) = send(
        Method::GET,
        b,
        &format!("/v1/responses/{id}/input_items?limit=0"),
    )
    .await;
    assert_eq!((st, &v["error"]["param"]), (400, &json!("limit")), "{v}");

    // Retrieve: as answered; streamed again only a background response, which there is not.
    let (st, v) = send(Method::GET, b, &format!("/v1/responses/{id}?stream=false")).await;
    assert_eq!((st, &v["id"]), (200, &json!(id)), "{v}");
    let (st, v) = send(Method::GET, b, &format!("/v1/responses/{id}?stream=true")).await;
    assert_eq!((st, &v["error"]["param"]), (400, &json!("stream")), "{v}");

    // Cancel: a 400 naming the missing background mode; an unknown id a 404.
    for prefix in ["/v1", ""] {
        let (st, v) = send(Method::POST, b, &format!("{prefix}/responses/{id}/cancel")).await;
        assert_eq!(st, 400, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("background"),
            "{v}"
        );
    }
    let (st, v) = send(Method::POST, b, "/v1/responses/resp_nope/cancel").await;
    assert_eq!(
        (st, &v["error"]["param"]),
        (404, &json!("response_id")),
        "{v}"
    );

    // Delete: OpenAI's deleted object, then the id is gone everywhere.
    let (st, v) = send(Method::DELETE, b, &format!("/v1/responses/{id}")).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v,
        json!({"id": id, "object": "response.deleted", "deleted": true})
    );
    for (method, path) in [
        (Method::DELETE, format!("/v1/responses/{id}")),
        (Method::GET, format!("/v1/responses/{id}")),
        (Method::GET, format!("/v1/responses/{id}/input_items")),
        (Method::POST, format!("/v1/responses/{id}/cancel")),
    ] {
        let (st, v) = send(method.clone(), b, &path).await;
        assert_eq!(st, 404, "{method} {path}: {v}");
        assert_eq!(v["error"]["param"], "response_id", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(id), "{v}");
    }
    let (st, r) = post(
        b,
        "/responses",
        json!({"input": "hi", "max_output_tokens": 1}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    let id = r["id"].as_str().unwrap();
    let (st, v) = send(Method::DELETE, b, &format!("/responses/{id}")).await;
    assert_eq!((st, &v["deleted"]), (200, &json!(true)), "{v}");

    // A prompt past the context names `input`, not chat's `messages`.
    let (st, v) = post(b, "/v1/responses", json!({"input": "hi ".repeat(600)})).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["param"], "input", "{v}");
    assert!(
        !v["error"]["message"].as_str().unwrap().contains("messages"),
        "{v}"
    );
}

/// The unstreamed answer's output is the stream's, item for item and id for id (the
/// serial of each response aside), and so is what GET returns after a stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_output_is_the_same_streamed_or_not() {
    let s = tiny_server(1, |_| {});
    let b = &s.base;
    let params = json!({"type": "object", "additionalProperties": false,
        "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["x"]});
    let body = json!({"input": "hi", "temperature": 0, "max_output_tokens": 200,
        "tools": [{"type": "function", "name": "f", "parameters": params}],
        "tool_choice": "required"});
    // The output with the response's serial (in every item id) made neutral.
    let output = |r: &Value| {
        let serial = r["id"].as_str().unwrap().trim_start_matches("resp_");
        r["output"].to_string().replace(serial, "S")
    };
    let (st, whole) = post(b, "/v1/responses", body.clone()).await;
    assert_eq!(st, 200, "{whole}");
    assert!(
        whole["output"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["type"] == "function_call"),
        "{whole}"
    );
    assert_eq!(whole["tools"][0]["strict"], true, "{whole}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (st, frames) = post_stream(b, "/v1/responses", streamed).await;
    assert_eq!(st, 200);
    let last: Value = serde_json::from_str(frames.last().unwrap()).unwrap();
    let done = &last["response"];
    assert_eq!(output(done), output(&whole));
    let (st, got) = get(
        b,
        &format!("/v1/responses/{}", done["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(output(&serde_json::from_str(&got).unwrap()), output(&whole));
}
