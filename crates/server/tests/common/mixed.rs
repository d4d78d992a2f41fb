//! The mixed load shared by the load tests: 8 clients, streaming, non-streaming and
//! dropped streams, every answer checked against the same request run alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::{json, Value};

use super::*;

pub const CLIENTS: usize = 8;
pub const REQUESTS: usize = 200;
pub const PROMPTS: usize = 10;
pub const WORDS: [&str; PROMPTS] = [
    "cat", "dog", "owl", "fox", "bee", "elk", "ant", "cow", "yak", "emu",
];

pub fn body(k: usize, stream: bool) -> Value {
    json!({
        "prompt": format!("request {} asks about the {}", k % PROMPTS, WORDS[k % PROMPTS]),
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
    })
}

/// Runs request `k` (prompt `k % PROMPTS`, mode `mode % 5`) and returns its status and
/// (text, finish_reason); a dropped stream returns its status only.
pub async fn one(
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

/// `n` requests from `CLIENTS` concurrent clients; every answer must match `reference`.
pub async fn run_load(
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
