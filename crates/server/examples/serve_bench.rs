//! Aggregate generation throughput of `minfer serve` at 1, 2 and 4 concurrent streams,
//! with p50/p99 time to first token, measured by streaming clients over loopback.
//!
//! `cargo run --release -p minfer-server --example serve_bench -- [MODEL] [ROUNDS] [MAX_TOKENS]`
//! (default: the catalog's default model, 3 rounds, 64 tokens).

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};

const PROMPTS: [&str; 4] = [
    "Write a Python function that sorts a list with quicksort, with comments.",
    "Explain in detail how a hash map handles collisions.",
    "Write a Rust program that reads a file and counts the words in it.",
    "Describe the steps of the TCP three-way handshake and why each exists.",
];

/// One streamed chat completion: (time to first token, completion tokens).
async fn one(c: &reqwest::Client, url: &str, i: usize, max_tokens: usize) -> (Duration, u64) {
    let body = json!({
        "messages": [{"role": "user", "content": PROMPTS[i % PROMPTS.len()]}],
        "max_tokens": max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let t0 = Instant::now();
    let r = c.post(url).json(&body).send().await.expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let mut s = r.bytes_stream();
    let (mut ttft, mut tokens, mut buf) = (None, 0, String::new());
    while let Some(b) = s.next().await {
        buf.push_str(&String::from_utf8_lossy(&b.expect("bytes")));
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let Some(data) = frame.trim().strip_prefix("data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if ttft.is_none()
                && v["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            {
                ttft = Some(t0.elapsed());
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                tokens = n;
            }
        }
    }
    (ttft.unwrap_or_else(|| t0.elapsed()), tokens)
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args
        .first()
        .filter(|a| !a.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(minfer_hub::default_model_path);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let max_tokens: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(64);
    let mut cfg = minfer_server::Config::new(&model);
    cfg.port = 0;
    cfg.slots = 4;
    cfg.ctx = Some(4096);
    let server = minfer_server::start(cfg).expect("starting the server");
    let url = format!("http://{}/v1/chat/completions", server.addr());
    let c = reqwest::Client::new();
    // Warm-up: page in the weights and build the graphs.
    one(&c, &url, 0, 8).await;
    println!(
        "| streams | requests | tokens | wall s | aggregate tok/s | TTFT p50 ms | TTFT p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for streams in [1usize, 2, 4] {
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..streams)
            .map(|s| {
                let (c, url) = (c.clone(), url.clone());
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    for r in 0..rounds {
                        out.push(one(&c, &url, s + r * streams, max_tokens).await);
                    }
                    out
                })
            })
            .collect();
        let mut ttfts = Vec::new();
        let mut tokens = 0;
        for t in tasks {
            for (ttft, n) in t.await.expect("client") {
                ttfts.push(ttft);
                tokens += n;
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        println!(
            "| {streams} | {} | {tokens} | {wall:.2} | {:.1} | {:.0} | {:.0} |",
            ttfts.len(),
            tokens as f64 / wall,
            pct(&mut ttfts, 0.5),
            pct(&mut ttfts, 0.99),
        );
    }
}
