//! Saturation and cancellation: a full queue answers 503 with Retry-After, and a client
//! that disconnects mid-stream frees its slot for the next request.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

async fn metric(base: &str, name: &str) -> f64 {
    let (_, m) = get(base, "/metrics").await;
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in\n{m}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_503_and_disconnect_frees_the_slot() {
    let s = tiny_server(1, |c| {
        c.queue = 1;
        c.fault_injection = true;
    });
    let slow = format!("a {}", minfer_server::openai::SLOW_MARKER);
    // A: a slow stream that holds the only slot (greedy, so it cannot end early by chance).
    let a = client()
        .post(format!("{}/v1/completions", s.base))
        .json(&json!({"prompt": slow, "max_tokens": 200, "stream": true, "temperature": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(a.status().as_u16(), 200);
    let mut a_body = a.bytes_stream();
    let first = a_body.next().await.expect("a first frame").unwrap();
    assert!(String::from_utf8_lossy(&first).contains("data:"));

    // B waits in the queue (of one).
    let base = s.base.clone();
    let b = tokio::spawn(async move {
        post(
            &base,
            "/v1/completions",
            json!({"prompt": "b", "max_tokens": 8}),
        )
        .await
    });
    let t0 = Instant::now();
    while metric(&s.base, "minfer_queue_length").await < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "B never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(metric(&s.base, "minfer_busy_slots").await, 1.0);

    // C finds the queue full.
    let r = client()
        .post(format!("{}/v1/chat/completions", s.base))
        .json(&json!({"messages": [{"role": "user", "content": "c"}], "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "server_overloaded");

    // A disconnects: B gets the slot long before A's 200 tokens (2 s at 10 ms) are done.
    let gone = Instant::now();
    drop(a_body);
    let (st, v) = tokio::time::timeout(Duration::from_secs(30), b)
        .await
        .expect("B finished")
        .unwrap();
    assert_eq!(st, 200, "{v}");
    assert!(
        gone.elapsed() < Duration::from_millis(1500),
        "{:?}",
        gone.elapsed()
    );
    let generated = metric(&s.base, "minfer_generated_tokens_total").await;
    assert!(
        generated < 150.0,
        "A was cancelled early: {generated} tokens in all"
    );
    assert_eq!(metric(&s.base, "minfer_busy_slots").await, 0.0);
    assert_eq!(
        metric(&s.base, "minfer_requests_total{status=\"503\"}").await,
        1.0
    );
}

/// `name`'s value in one `/metrics` body.
fn sample(m: &str, name: &str) -> f64 {
    m.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in\n{m}"))
}

/// A router reading the gauges must see a request from its admission on, not only from
/// its first token: a long prefill is work in progress, not an idle worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_counts_as_running_during_its_prefill() {
    let s = tiny_server(1, |c| c.fault_injection = true);
    let prompt = format!("a {}", minfer_server::openai::SLOW_PREFILL_MARKER);
    let base = s.base.clone();
    let r = tokio::spawn(async move {
        post(
            &base,
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 1}),
        )
        .await
    });
    // One token: the slot is taken before its only step (1.5 s here) and released after.
    let t0 = Instant::now();
    loop {
        let (_, m) = get(&s.base, "/metrics").await;
        if sample(&m, "vllm:num_requests_running") == 1.0 {
            assert_eq!(sample(&m, "vllm:num_requests_waiting"), 0.0, "{m}");
            assert_eq!(sample(&m, "vllm:generation_tokens_total"), 0.0, "{m}");
            break;
        }
        assert!(
            !r.is_finished() && t0.elapsed() < Duration::from_secs(10),
            "the request never counted as running before its token"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (st, v) = r.await.unwrap();
    assert_eq!(st, 200, "{v}");
    assert_eq!(metric(&s.base, "vllm:num_requests_running").await, 0.0);
}
