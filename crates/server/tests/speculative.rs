//! `serve --lookup`: speculative slots decoding together in one batched step answer
//! exactly what a plain server answers (greedy, and sampled with a seed), and `/metrics`
//! counts the drafted and accepted tokens.

mod common;

use common::*;
use serde_json::{json, Value};

const PROMPTS: [&str; 8] = [
    "ab ab ab ab ab ab ab",
    "the quick brown fox, the quick brown fox, the quick",
    "fn f(x: u32) -> u32 { x }\nfn g(x: u32) -> u32 {",
    "1, 2, 3, 1, 2, 3, 1, 2,",
    "once upon a time",
    "hello hello hello",
    "xyz",
    "<div><p>a</p></div><div><p>",
];

/// Every prompt sent at once (so the slots decode in shared steps); the texts in order.
async fn answers(base: &str, temperature: f64) -> Vec<String> {
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

fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_slots_batched_together_answer_as_plain_slots() {
    let plain = tiny_server(4, |_| {});
    let spec = tiny_server(4, |c| c.lookup = Some(7));
    for temperature in [0.0, 0.9] {
        let want = answers(&plain.base, temperature).await;
        let got = answers(&spec.base, temperature).await;
        assert_eq!(got, want, "temperature {temperature}");
    }
    let (_, m) = get(&spec.base, "/metrics").await;
    let drafted = counter(&m, "minfer_draft_tokens_total");
    let accepted = counter(&m, "minfer_draft_accepted_tokens_total");
    assert!(
        drafted > 0 && accepted > 0,
        "{drafted} drafted, {accepted} accepted"
    );
    assert!(accepted <= drafted);
    let (_, m) = get(&plain.base, "/metrics").await;
    assert_eq!(counter(&m, "minfer_draft_tokens_total"), 0);
}

#[test]
fn a_draft_length_out_of_range_is_refused_by_name() {
    let (_dir, path) = tiny_model();
    for bad in [0, 17] {
        let mut c = tiny_config(&path, 1);
        c.lookup = Some(bad);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--draft-max"), "{e}");
    }
}
