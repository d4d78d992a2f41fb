//! OpenAI's exact shapes over HTTP against the tiny model: several choices from one
//! prefill, stream chunks, `system_fingerprint`, error codes and the limits OpenAI sets.

use crate::common;

use common::*;
use serde_json::{json, Value};

/// The value of an un-labelled counter in a Prometheus text body.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from {metrics}"))
}

async fn prefilled(base: &str) -> u64 {
    let (_, m) = get(base, "/metrics").await;
    counter(&m, "minfer_prefill_tokens_total")
}

fn texts(v: &Value, field: &str) -> Vec<String> {
    v["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| {
            let t = if field == "message" {
                &c["message"]["content"]
            } else {
                &c["text"]
            };
            t.as_str().expect("text").to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_differ_repeat_under_a_seed_and_cost_one_prefill() {
    let s = tiny_server(3, |_| {});
    let body = json!({
        "prompt": "the quick brown fox jumps over",
        "n": 3, "seed": 7, "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
        "max_tokens": 12,
    });
    let before = prefilled(&s.base).await;
    let (st, v) = post(&s.base, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let after = prefilled(&s.base).await;
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
    // One prefill for three choices: the prompt ran through the model once.
    assert_eq!(after - before, prompt, "{v}");
    let got = texts(&v, "text");
    assert_eq!(got.len(), 3, "{v}");
    let idx: Vec<u64> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [0, 1, 2]);
    assert!(
        got[0] != got[1] && got[1] != got[2] && got[0] != got[2],
        "{got:?}"
    );
    let completion: u64 = 3 * 12;
    assert_eq!(v["usage"]["completion_tokens"], completion, "{v}");
    // The same seed gives the same choices; choice 0 is what n = 1 gives.
    let (_, again) = post(&s.base, "/v1/completions", body.clone()).await;
    assert_eq!(texts(&again, "text"), got);
    let mut one = body.clone();
    one["n"] = json!(1);
    let (_, single) = post(&s.base, "/v1/completions", one).await;
    assert_eq!(texts(&single, "text"), vec![got[0].clone()]);

    // Chat, streamed: every choice has its role first and its finish last.
    let (st, frames) = post_stream(
        &s.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "n": 2, "seed": 3,
               "temperature": 1.5, "top_k": 0, "max_tokens": 6, "stream": true}),
    )
    .await;
    assert_eq!(st, 200);
    let mut per: Vec<Vec<Value>> = vec![Vec::new(); 2];
    for f in &frames[..frames.len() - 1] {
        let v: Value = serde_json::from_str(f).unwrap();
        let c = &v["choices"][0];
        per[c["index"].as_u64().unwrap() as usize].push(c.clone());
    }
    for (i, cs) in per.iter().enumerate() {
        assert_eq!(cs[0]["delta"]["role"], "assistant", "choice {i}: {cs:?}");
        assert!(cs[1..].iter().all(|c| c["delta"].get("role").is_none()));
        assert_eq!(cs.last().unwrap()["finish_reason"], "length");
        assert!(cs[..cs.len() - 1]
            .iter()
            .all(|c| c["finish_reason"].is_null()));
    }
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    // More choices than slots is refused with the limit named.
    let (st, v) = post(
        &s.base,
        "/v1/completions",
        json!({"prompt": "a", "n": 4, "max_tokens": 1}),
    )
    .await;
    assert_eq!(st, 400);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("`n`") && msg.contains("[1, 3]"), "{msg}");
    assert_eq!(v["error"]["param"], "n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_chunks_have_openai_s_shape() {
    let s = tiny_server(1, |_| {});
    let (st, frames) = post_stream(
        &s.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hello"}], "temperature": 0,
               "max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let objs: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(f).unwrap())
        .collect();
    let id = objs[0]["id"].clone();
    let fp = objs[0]["system_fingerprint"].clone();
    assert!(fp.as_str().is_some_and(|f| f.starts_with("fp_")), "{fp}");
    for o in &objs {
        assert_eq!(o["object"], "chat.completion.chunk", "{o}");
        assert_eq!((&o["id"], &o["system_fingerprint"]), (&id, &fp), "{o}");
        assert!(o["created"].is_u64() && o["model"].is_string(), "{o}");
        // `usage` is on every chunk: null but on the last.
        assert!(o.get("usage").is_some(), "{o}");
    }
    let (usage, choices) = objs.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5, "{usage}");
    assert!(choices.iter().all(|o| o["usage"].is_null()));
    assert_eq!(
        choices[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": null})
    );
    let last = &choices[choices.len() - 1]["choices"][0];
    assert_eq!(
        (&last["delta"], &last["finish_reason"]),
        (&json!({}), &json!("length"))
    );
    for c in &choices[1..choices.len() - 1] {
        let c = &c["choices"][0];
        assert!(c["delta"]["content"].is_string() && c["delta"].get("role").is_none());
        assert!(c["finish_reason"].is_null());
    }
    // Without include_usage there is no `usage` key at all.
    let (_, frames) = post_stream(
        &s.base,
        "/v1/completions",
        json!({"prompt": "a b", "max_tokens": 3, "stream": true}),
    )
    .await;
    for f in &frames[..frames.len() - 1] {
        let v: Value = serde_json::from_str(f).unwrap();
        assert!(v.get("usage").is_none(), "{v}");
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["system_fingerprint"], fp);
    }
    // Non-streamed answers carry the same fingerprint.
    let (_, v) = post(
        &s.base,
        "/v1/completions",
        json!({"prompt": "a b", "max_tokens": 2}),
    )
    .await;
    assert_eq!(v["system_fingerprint"], fp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_openai_s_codes_and_limits() {
    let s = tiny_server(1, |c| c.api_key = Some("k".into()));
    let c = client();
    let send = |path: &'static str, body: Value| {
        let c = c.clone();
        let url = format!("{}{path}", s.base);
        async move {
            let r = c
                .post(url)
                .bearer_auth("k")
                .json(&body)
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let long = "a ".repeat(400);
    let (st, v) = send(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "This model's maximum context length is 256 tokens. However, your messages resulted in"
        ),
        "{msg}"
    );
    assert_eq!(v["error"]["param"], "messages", "{v}");
    // On the completions route the prompt is `prompt`.
    let (st, v) = send("/v1/completions", json!({"prompt": long})).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "prompt", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("your prompt resulted in"), "{msg}");
    // A completion longer than the room left runs to the full context and ends as
    // `length`, as llama-server's does with context shift off.
    let (st, v) = send(
        "/v1/completions",
        json!({"prompt": "abcd", "max_tokens": 300, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let used = v["usage"]["prompt_tokens"].as_u64().unwrap()
        + v["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(used, 256, "{v}");
    // OpenAI's limit of four stop sequences.
    let (st, v) = send(
        "/v1/completions",
        json!({"prompt": "a", "stop": ["1", "2", "3", "4", "5"]}),
    )
    .await;
    assert_eq!(st, 400);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("at most 4"));
    let (st, v) = send(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}],
               "stop": ["1", "2", "3", "4"], "max_tokens": 1, "user": "u-7", "seed": 1}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = send(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"},
                            {"role": "tool", "tool_call_id": "call_9", "content": "1"}]}),
    )
    .await;
    assert_eq!(st, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`call_9`"),
        "{v}"
    );
    // A wrong key: OpenAI's 401 code.
    let r = c
        .get(format!("{}/v1/models", s.base))
        .bearer_auth("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(v["error"]["type"], "authentication_error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_choices_wait_for_enough_free_slots() {
    let s = tiny_server(2, |c| c.fault_injection = true);
    let slow = format!("a {}", minfer_server::openai::SLOW_MARKER);
    // A holds one of the two slots for about 30 slow decode steps.
    let base = s.base.clone();
    let a = tokio::spawn(async move {
        post(
            &base,
            "/v1/completions",
            json!({"prompt": slow, "max_tokens": 30, "temperature": 0}),
        )
        .await
    });
    let t0 = std::time::Instant::now();
    loop {
        let (_, m) = get(&s.base, "/metrics").await;
        if counter(&m, "minfer_busy_slots") == 1 {
            break;
        }
        assert!(t0.elapsed().as_secs() < 10, "A never started: {m}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Two choices need both slots: the request waits for A, then gets both choices.
    let (st, v) = post(
        &s.base,
        "/v1/completions",
        json!({"prompt": "b c", "n": 2, "seed": 5, "temperature": 1.0, "max_tokens": 4}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(texts(&v, "text").len(), 2);
    let (st, a) = a.await.unwrap();
    assert_eq!(
        (st, &a["choices"][0]["finish_reason"]),
        (200, &json!("length"))
    );
}
