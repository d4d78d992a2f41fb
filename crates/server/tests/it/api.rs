//! Every endpoint and error of the server, over HTTP on a loopback port, against the
//! tiny model (no chat template, so ChatML applies).

use crate::common;

use common::*;
use serde_json::{json, Value};

fn chat_body(content: &str, extra: Value) -> Value {
    let mut b = json!({
        "model": "x",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 12,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_models_tokenize_detokenize_slots() {
    let s = tiny_server(2, |_| {});
    let (st, body) = get(&s.base, "/health").await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "ok", "{body}");
    // The backends the engine runs on, the host CPU among them.
    let backends = v["backends"].as_array().expect("backends");
    assert!(backends.iter().any(|b| b["name"] == "cpu"), "{body}");
    let (st, body) = get(&s.base, "/v1/models").await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "tiny-qwen2");
    // One model, as the SDK's `models.retrieve` asks for it; another name is a 404.
    let (st, body) = get(&s.base, "/v1/models/tiny-qwen2").await;
    assert_eq!(st, 200, "{body}");
    let one: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(one, v["data"][0], "{body}");
    let (st, body) = get(&s.base, "/v1/models/gpt-4o").await;
    assert_eq!(st, 404, "{body}");
    let e: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["error"]["code"], "model_not_found", "{body}");

    let (st, v) = post(&s.base, "/tokenize", json!({"content": "hello world"})).await;
    assert_eq!(st, 200);
    let ids = v["tokens"].as_array().unwrap().clone();
    assert!(!ids.is_empty());
    let (st, v) = post(&s.base, "/detokenize", json!({"tokens": ids})).await;
    assert_eq!((st, v["content"].as_str()), (200, Some("hello world")));
    let (_, v) = post(
        &s.base,
        "/tokenize",
        json!({"content": "he", "with_pieces": true}),
    )
    .await;
    assert_eq!(v["tokens"][0]["piece"], "he");
    let (st, v) = post(&s.base, "/detokenize", json!({"tokens": [999999]})).await;
    assert_eq!(st, 400, "{v}");

    let (st, body) = get(&s.base, "/slots").await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[0]["n_ctx"], 256);
    assert_eq!(v[0]["is_processing"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_and_non_stream_agree_with_usage_and_finish() {
    let s = tiny_server(2, |_| {});
    let (st, v) = post(
        &s.base,
        "/v1/chat/completions",
        chat_body("hi there", json!({})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let finish = v["choices"][0]["finish_reason"]
        .as_str()
        .unwrap()
        .to_string();
    let u = &v["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 10, "ChatML framing gives a longer prompt: {p}");
    assert!((1..=12).contains(&c));
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + c);
    assert_eq!(finish == "length", c == 12, "{finish} after {c} tokens");

    let body = chat_body(
        "hi there",
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let (st, frames) = post_stream(&s.base, "/v1/chat/completions", body).await;
    assert_eq!(st, 200);
    let first: Value = serde_json::from_str(&frames[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let (stext, sfinish, susage) = stream_summary(&frames);
    assert_eq!(stext, text);
    assert_eq!(sfinish.as_deref(), Some(finish.as_str()));
    let su = susage.expect("usage chunk");
    assert_eq!(su["completion_tokens"].as_u64(), Some(c));
    assert_eq!(su["prompt_tokens"].as_u64(), Some(p));

    // Without include_usage there is no usage chunk.
    let (_, frames) = post_stream(
        &s.base,
        "/v1/chat/completions",
        chat_body("hi there", json!({"stream": true})),
    )
    .await;
    assert!(stream_summary(&frames).2.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_by_text_and_by_tokens_stream_and_not() {
    let s = tiny_server(2, |_| {});
    let body = json!({"prompt": "the quick brown fox", "max_tokens": 10, "temperature": 0});
    let (st, v) = post(&s.base, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(10));
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    let (_, t) = post(
        &s.base,
        "/tokenize",
        json!({"content": "the quick brown fox"}),
    )
    .await;
    let by_ids = json!({"prompt": t["tokens"], "max_tokens": 10, "temperature": 0});
    let (st, v) = post(&s.base, "/v1/completions", by_ids).await;
    assert_eq!(st, 200);
    assert_eq!(v["choices"][0]["text"].as_str(), Some(text.as_str()));

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (st, frames) = post_stream(&s.base, "/v1/completions", sb).await;
    assert_eq!(st, 200);
    let (stext, finish, _) = stream_summary(&frames);
    assert_eq!(stext, text);
    assert_eq!(finish.as_deref(), Some("length"));

    // A stop string inside the greedy text cuts it before the stop, finish "stop".
    let cut = text
        .char_indices()
        .nth(4)
        .map(|(i, _)| i)
        .expect("at least 5 chars");
    let stop: String = text[cut..].chars().take(2).collect();
    let expect = &text[..text.find(&stop).unwrap()];
    let mut stopped = body.clone();
    stopped["stop"] = json!([stop, "\u{1}never"]);
    let (_, v) = post(&s.base, "/v1/completions", stopped.clone()).await;
    assert_eq!(v["choices"][0]["text"].as_str(), Some(expect));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    stopped["stream"] = json!(true);
    let (_, frames) = post_stream(&s.base, "/v1/completions", stopped).await;
    let (stext, finish, _) = stream_summary(&frames);
    assert_eq!((stext.as_str(), finish.as_deref()), (expect, Some("stop")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_report_the_greedy_choice_first() {
    let s = tiny_server(1, |_| {});
    let body = chat_body(
        "abc",
        json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 6}),
    );
    let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for t in content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], t["token"]);
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0 && lp >= top[1]["logprob"].as_f64().unwrap());
    }
    let (st, v) = post(
        &s.base,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 4, "temperature": 0, "logprobs": 2}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    assert_eq!(
        v["choices"][0]["logprobs"]["top_logprobs"][0]
            .as_object()
            .unwrap()
            .len(),
        2
    );
}

/// The log-probabilities of an answer cut by a stop string are those of the tokens
/// whose text is in the answer: the stop string's own tokens, whose text is dropped, are
/// dropped with it, streamed and not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_end_where_a_stop_string_cuts_the_text() {
    let s = tiny_server(1, |_| {});
    let greedy = |extra: Value| {
        let mut b = chat_body("abc", json!({"logprobs": true, "max_tokens": 24}));
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        b
    };
    let (st, v) = post(&s.base, "/v1/chat/completions", greedy(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let full = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    // A stop string from the middle of the greedy answer, on character boundaries.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 12, "{full:?}");
    let stop: String = chars[8..11].iter().collect();
    let bytes_of = |t: &Value| t["bytes"].as_array().map_or(0, Vec::len);
    for stream in [false, true] {
        let body = greedy(json!({"stop": stop, "stream": stream}));
        let (text, tokens): (String, Vec<Value>) = if stream {
            let (st, frames) = post_stream(&s.base, "/v1/chat/completions", body).await;
            assert_eq!(st, 200);
            let (mut text, mut tokens) = (String::new(), Vec::new());
            for f in frames.iter().filter(|f| *f != "[DONE]") {
                let v: Value = serde_json::from_str(f).expect("frame");
                let c = &v["choices"][0];
                text.push_str(c["delta"]["content"].as_str().unwrap_or(""));
                tokens.extend(
                    c["logprobs"]["content"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            (text, tokens)
        } else {
            let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
            assert_eq!(st, 200, "{v}");
            let c = &v["choices"][0];
            let text = c["message"]["content"].as_str().unwrap().to_string();
            (
                text,
                c["logprobs"]["content"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            )
        };
        assert!(
            full.starts_with(&text) && text.len() < full.len(),
            "{text:?}"
        );
        // Every token starts inside the text: all but the last end at or before its end,
        // and together they cover it.
        let total: usize = tokens.iter().map(bytes_of).sum();
        let last = tokens.last().map_or(0, bytes_of);
        assert!(
            total >= text.len(),
            "stream {stream}: {total} < {}",
            text.len()
        );
        assert!(
            total - last < text.len().max(1),
            "stream {stream}: {tokens:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_openai_shaped_errors() {
    let s = tiny_server(1, |c| c.body_limit = 4096);
    let c = client();
    let url = format!("{}/v1/chat/completions", s.base);
    let r = c
        .post(&url)
        .header("content-type", "application/json")
        .body("{\"messages\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["code"].is_null(), "{v}");
    assert!(v["error"].get("param").is_some(), "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("invalid JSON"));

    for (field, body) in [
        (
            "temperature",
            chat_body("x", json!({"temperature": "warm"})),
        ),
        ("max_tokens", chat_body("x", json!({"max_tokens": -3}))),
        ("messages", json!({"messages": "hello"})),
        ("stream", chat_body("x", json!({"stream": "yes"}))),
        ("`n`", chat_body("x", json!({"n": 0}))),
        ("[1, 1], the slots", chat_body("x", json!({"n": 2}))),
    ] {
        let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
        assert_eq!(st, 400, "{field}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(field), "{field} not named in {msg}");
    }
    let (st, v) = post(&s.base, "/v1/completions", json!({"prompt": [1, 99999]})).await;
    assert_eq!(st, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("99999"));

    // A prompt over the slot's context is refused naming it (a completion over the room
    // left only ends at the full context: openai_shape).
    let long = "a ".repeat(400);
    let (st, v) = post(&s.base, "/v1/completions", json!({"prompt": long})).await;
    assert_eq!(st, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("256"));

    let big = json!({"prompt": "x".repeat(5000)});
    let r = c
        .post(format!("{}/v1/completions", s.base))
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("4096"));

    let r = c
        .get(format!("{}/v2/nothing", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["code"].is_null(), "{v}");
    let r = c
        .get(format!("{}/v1/completions", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_everything_but_health() {
    let s = tiny_server(1, |c| c.api_key = Some("sekret".into()));
    let c = client();
    let r = c.get(format!("{}/v1/models", s.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    let r = c
        .get(format!("{}/v1/models", s.base))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .get(format!("{}/v1/models", s.base))
        .bearer_auth("sekret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // As llama-server: the scheme in any case, or none; a longer or shorter key fails.
    for (auth, want) in [
        ("bearer sekret", 200),
        ("sekret", 200),
        ("Basic sekret", 401),
        ("Bearer sekret2", 401),
        ("Bearer sekre", 401),
    ] {
        let r = c
            .get(format!("{}/v1/models", s.base))
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "{auth}");
    }
    let r = c.get(format!("{}/health", s.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_reuse_gives_identical_output() {
    let prefix = "you are a careful assistant who answers in short words. ";
    let req = |q: &str, seedy: bool| {
        let mut b = json!({"prompt": format!("{prefix}{q}"), "max_tokens": 24, "temperature": 0});
        if seedy {
            b["temperature"] = json!(0.9);
            b["seed"] = json!(1234);
        }
        b
    };
    let warm = tiny_server(1, |_| {});
    let (_, first) = post(
        &warm.base,
        "/v1/completions",
        req("tell me about cats", false),
    )
    .await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let mut reused = Vec::new();
    for seedy in [false, true] {
        let (st, v) = post(
            &warm.base,
            "/v1/completions",
            req("tell me about dogs", seedy),
        )
        .await;
        assert_eq!(st, 200);
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached >= 20, "the shared prefix is reused: {cached}");
        reused.push(v["choices"][0]["text"].as_str().unwrap().to_string());
    }
    let cold = tiny_server(1, |_| {});
    for (i, seedy) in [false, true].into_iter().enumerate() {
        let (_, v) = post(
            &cold.base,
            "/v1/completions",
            req("tell me about dogs", seedy),
        )
        .await;
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        if i == 0 {
            assert_eq!(cached, 0);
        }
        assert_eq!(v["choices"][0]["text"].as_str(), Some(reused[i].as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_is_a_500_and_the_worker_keeps_serving() {
    let s = tiny_server(1, |c| c.fault_injection = true);
    let body =
        json!({"prompt": format!("x {}", minfer_server::openai::PANIC_MARKER), "max_tokens": 4});
    let (st, v) = post(&s.base, "/v1/completions", body.clone()).await;
    assert_eq!(st, 500, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("panicked"));
    let mut sb = body;
    sb["stream"] = json!(true);
    let (st, _) = post(&s.base, "/v1/completions", sb).await;
    assert_eq!(st, 500);
    let (st, v) = post(
        &s.base,
        "/v1/completions",
        json!({"prompt": "fine", "max_tokens": 4}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().map(|n| n <= 4),
        Some(true)
    );
}

/// A panic inside a kernel, on a thread-pool thread, fails its request with a 500, and
/// the engine it unwound through answers the next requests exactly as a fresh server,
/// including a request of the same shape, which reuses the graph the panic ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_panic_is_a_500_and_later_answers_match_a_fresh_server() {
    let two_threads = |c: &mut minfer_server::Config| {
        c.fault_injection = true;
        c.threads = Some(2);
    };
    let s = tiny_server(1, two_threads);
    let fresh = tiny_server(1, two_threads);
    let ask = |prompt: Value, stream: bool| json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": stream});
    let text = |v: &Value| v["choices"][0]["text"].as_str().unwrap_or("?").to_string();
    let marker = format!("x {}", minfer_server::openai::KERNEL_PANIC_MARKER);
    // The marker prompt's own tokens, sent as ids, carry no fault but run the same step.
    let (st, t) = post(
        &s.base,
        "/tokenize",
        json!({"content": marker, "add_special": true}),
    )
    .await;
    assert_eq!(st, 200, "{t}");
    let same_shape = t["tokens"].clone();
    let prompts = [same_shape, json!("tell me about dogs")];
    for stream in [false, true] {
        let (st, v) = post(&s.base, "/v1/completions", ask(json!(marker), stream)).await;
        assert_eq!(st, 500, "{v}");
        if !stream {
            let msg = v["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains("injected kernel fault"), "{v}");
        }
        for prompt in &prompts {
            let (st, got) = post(&s.base, "/v1/completions", ask(prompt.clone(), false)).await;
            assert_eq!(st, 200, "after the panic, {prompt}: {got}");
            let (st, want) = post(&fresh.base, "/v1/completions", ask(prompt.clone(), false)).await;
            assert_eq!(st, 200, "{want}");
            assert_eq!(text(&got), text(&want), "after the panic, {prompt}");
            for n in ["prompt_tokens", "completion_tokens"] {
                assert_eq!(got["usage"][n], want["usage"][n], "{prompt} {n}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_requests_time_out_with_504() {
    let s = tiny_server(1, |c| c.request_timeout = std::time::Duration::ZERO);
    let (st, v) = post(
        &s.base,
        "/v1/completions",
        json!({"prompt": "a", "max_tokens": 4}),
    )
    .await;
    assert_eq!(st, 504, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_tokens_and_latencies() {
    let s = tiny_server(1, |_| {});
    for _ in 0..2 {
        let (st, _) = post(
            &s.base,
            "/v1/completions",
            json!({"prompt": "ab", "max_tokens": 5, "temperature": 0}),
        )
        .await;
        assert_eq!(st, 200);
    }
    let (st, m) = get(&s.base, "/metrics").await;
    assert_eq!(st, 200);
    let value = |name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{name} missing in\n{m}"))
            .parse()
            .unwrap()
    };
    assert_eq!(value("minfer_requests_total{status=\"200\"}"), 2.0);
    assert!(value("minfer_generated_tokens_total") >= 2.0);
    assert!(value("minfer_prompt_tokens_total") >= 2.0);
    assert!(value("minfer_tokens_per_second") > 0.0);
    assert_eq!(value("minfer_busy_slots"), 0.0);
    assert_eq!(value("minfer_queue_length"), 0.0);
    assert_eq!(value("minfer_time_to_first_token_seconds_count"), 2.0);
    assert!(value("minfer_inter_token_latency_seconds_count") >= 1.0);
}
