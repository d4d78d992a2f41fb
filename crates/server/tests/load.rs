//! Load: 8 concurrent clients send 200 greedy requests (streaming, non-streaming, and
//! streams dropped after their first frame). No 5xx, every answer equals the same request
//! run alone, and memory does not grow.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

const CLIENTS: usize = 8;
const REQUESTS: usize = 200;
const PROMPTS: usize = 10;
const WORDS: [&str; PROMPTS] = [
    "cat", "dog", "owl", "fox", "bee", "elk", "ant", "cow", "yak", "emu",
];

fn body(k: usize, stream: bool) -> Value {
    json!({
        "prompt": format!("request {} asks about the {}", k % PROMPTS, WORDS[k % PROMPTS]),
        "max_tokens": 16,
        "temperature": 0,
        "stream": stream,
    })
}

/// Runs request `k` (prompt `k % PROMPTS`, mode `mode % 5`) and returns its status and
/// (text, finish_reason); a dropped stream returns its status only.
async fn one(
    c: &reqwest::Client,
    base: &str,
    k: usize,
    mode: usize,
) -> (u16, Option<(String, String)>) {
    let url = format!("{base}/v1/completions");
    match mode % 5 {
        // Streams that disconnect after their first frame.
        4 => {
            let r = c
                .post(&url)
                .json(&body(k, true))
                .send()
                .await
                .expect("send");
            let st = r.status().as_u16();
            let mut s = r.bytes_stream();
            let first = s.next().await.expect("a frame").expect("bytes");
            assert!(String::from_utf8_lossy(&first).starts_with("data:"));
            (st, None)
        }
        1 | 3 => {
            let r = c
                .post(&url)
                .json(&body(k, true))
                .send()
                .await
                .expect("send");
            let st = r.status().as_u16();
            let frames = sse_data(&r.text().await.expect("body"));
            let (text, finish, _) = stream_summary(&frames);
            (st, Some((text, finish.unwrap_or_default())))
        }
        _ => {
            let r = c
                .post(&url)
                .json(&body(k, false))
                .send()
                .await
                .expect("send");
            let st = r.status().as_u16();
            let v: Value = r.json().await.expect("json");
            let text = v["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let finish = v["choices"][0]["finish_reason"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (st, Some((text, finish)))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_two_hundred_requests() {
    let s = tiny_server(4, |c| c.queue = 256);
    let base = s.base.clone();
    let c = client();

    // Each prompt alone, one at a time: the reference answers.
    let mut reference = Vec::new();
    for k in 0..PROMPTS {
        let (st, r) = one(&c, &base, k, 0).await;
        assert_eq!(st, 200);
        reference.push(r.expect("an answer"));
    }
    let distinct: std::collections::HashSet<_> = reference.iter().map(|r| &r.0).collect();
    assert!(
        distinct.len() >= PROMPTS / 2,
        "answers should tell prompts apart: {reference:?}"
    );

    // Warm-up: the same mixed load once, so that one-time allocations (every slot's
    // buffers and graphs for each batch shape, per-thread arenas, pooled connections)
    // precede the baseline; growth after it would be a leak.
    let reference = Arc::new(reference);
    run_load(&c, &base, &reference, REQUESTS).await;
    let rss0 = rss_kb();
    let t0 = Instant::now();
    run_load(&c, &base, &reference, REQUESTS).await;
    let elapsed = t0.elapsed();
    assert!(elapsed < Duration::from_secs(60), "{elapsed:?}");

    // Dropped streams free their slots within a step or so.
    let t1 = Instant::now();
    loop {
        let (_, m) = get(&base, "/metrics").await;
        if m.contains("\nminfer_busy_slots 0\n") && m.contains("\nminfer_queue_length 0\n") {
            assert!(!m.contains("status=\"5"), "no 5xx: {m}");
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(5),
            "slots stay busy:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rss1 = rss_kb();
    eprintln!("{REQUESTS} requests in {elapsed:?}; RSS {rss0} kB -> {rss1} kB");
    assert!(
        rss1 as f64 <= rss0 as f64 * 1.10,
        "RSS grew from {rss0} kB to {rss1} kB"
    );
}

/// `n` requests from `CLIENTS` concurrent clients; every answer must match `reference`.
async fn run_load(
    c: &reqwest::Client,
    base: &str,
    reference: &Arc<Vec<(String, String)>>,
    n: usize,
) {
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (c, base, next, reference) =
                (c.clone(), base.to_string(), next.clone(), reference.clone());
            tokio::spawn(async move {
                let mut done = 0;
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= n {
                        return done;
                    }
                    // Modes rotate per round so every prompt meets every mode.
                    let (st, got) = one(&c, &base, k, k + k / PROMPTS).await;
                    assert_eq!(st, 200, "request {k}");
                    if let Some(got) = got {
                        assert_eq!(
                            got,
                            reference[k % PROMPTS],
                            "request {k} differs from its solo run"
                        );
                    }
                    done += 1;
                }
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("client task");
    }
    assert_eq!(total, n);
}
