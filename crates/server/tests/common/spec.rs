//! What the speculative-server tests share: eight prompts for four slots, sent at once,
//! and the `/metrics` counters they read.

use serde_json::{json, Value};

use super::post;

/// Eight prompts for four slots: repetitive and not, so drafts are both right and wrong.
pub const PROMPTS: [&str; 8] = [
    "ab ab ab ab ab ab ab",
    "the quick brown fox, the quick brown fox, the quick",
    "fn f(x: u32) -> u32 { x }\nfn g(x: u32) -> u32 {",
    "1, 2, 3, 1, 2, 3, 1, 2,",
    "once upon a time",
    "hello hello hello",
    "xyz",
    "<div><p>a</p></div><div><p>",
];

/// Every prompt sent at once (so the slots decode, draft and verify in shared steps),
/// each with its own seed; the completions' texts in order.
pub async fn answers(base: &str, temperature: f64) -> Vec<String> {
    let mut tasks = Vec::new();
    for (i, p) in PROMPTS.iter().enumerate() {
        let base = base.to_string();
        let body = json!({
            "prompt": p, "max_tokens": 40, "temperature": temperature, "seed": 7 + i,
        });
        tasks.push(tokio::spawn(async move {
            post(&base, "/v1/completions", body).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        let (status, v): (u16, Value) = t.await.expect("task");
        assert_eq!(status, 200, "{v}");
        out.push(v["choices"][0]["text"].as_str().expect("text").to_string());
    }
    out
}

/// The value of the counter `name` in a `/metrics` text; panics naming it when absent.
pub fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}
