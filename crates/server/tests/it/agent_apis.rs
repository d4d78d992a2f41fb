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
