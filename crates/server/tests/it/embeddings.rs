//! The embedding and rerank routes over HTTP against the tiny model: each API's shape,
//! every input form giving the same vectors, base64, unit length, and the refusals (empty
//! input, too long, `dimensions`, bad JSON, rerank off). The official clients drive them
//! against the real model in the cli crate's tests (scripts/e2e_embed.py).

use crate::common;

use common::*;
use serde_json::{json, Value};

fn vector(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("a vector: {v}"))
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

fn decode_b64(s: &str) -> Vec<f32> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    } as u32;
    let mut bytes = Vec::new();
    for q in s.as_bytes().chunks(4) {
        let pad = q.iter().filter(|&&c| c == b'=').count();
        let n = q
            .iter()
            .fold(0u32, |n, &c| (n << 6) | if c == b'=' { 0 } else { val(c) });
        bytes.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_returns_the_same_unit_vectors_in_its_own_shape() {
    let s = tiny_server(2, |_| {});
    let b = &s.base;
    let (st, ids) = post(
        b,
        "/tokenize",
        json!({"content": "hello there", "add_special": true}),
    )
    .await;
    assert_eq!(st, 200, "{ids}");
    let ids = ids["tokens"].clone();
    let (st, v) = post(
        b,
        "/v1/embeddings",
        json!({"input": ["hello there", "bye"]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][1]["index"], 1);
    assert_eq!(v["data"][0]["object"], "embedding");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{v}");
    let hello = vector(&v["data"][0]["embedding"]);
    assert!((norm(&hello) - 1.0).abs() < 1e-5);
    assert_ne!(hello, vector(&v["data"][1]["embedding"]));
    // A string, token ids and a list of token-id lists are the same input.
    for input in [json!("hello there"), ids.clone(), json!([ids.clone()])] {
        let (st, v) = post(b, "/v1/embeddings", json!({ "input": input })).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(vector(&v["data"][0]["embedding"]), hello, "{input}");
    }
    let (_, v) = post(
        b,
        "/v1/embeddings",
        json!({"input": "hello there", "encoding_format": "base64"}),
    )
    .await;
    let s64 = v["data"][0]["embedding"].as_str().expect("base64 text");
    assert_eq!(decode_b64(s64), hello);
    // ollama's new route normalises; its old one does not, and points the same way.
    let (st, v) = post(
        b,
        "/api/embed",
        json!({"model": "tiny-qwen2", "input": ["hello there"]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(vector(&v["embeddings"][0]), hello);
    for k in ["total_duration", "load_duration", "prompt_eval_count"] {
        assert!(v[k].is_u64(), "{k}: {v}");
    }
    let (st, v) = post(
        b,
        "/api/embeddings",
        json!({"model": "tiny-qwen2", "prompt": "hello there"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let raw = vector(&v["embedding"]);
    let dot: f64 = raw
        .iter()
        .zip(&hello)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum();
    assert!(
        (dot / norm(&raw) - 1.0).abs() < 1e-5,
        "cosine {}",
        dot / norm(&raw)
    );
    assert!(
        (norm(&raw) - 1.0).abs() > 1e-3,
        "the old route is not normalised"
    );
    // llama-server's: a list of rows per input.
    let (st, v) = post(b, "/embedding", json!({"content": "hello there"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v[0]["index"], 0);
    assert_eq!(vector(&v[0]["embedding"][0]), hello);
    let (_, v) = post(
        b,
        "/embeddings",
        json!({"content": "hello there", "embd_normalize": -1}),
    )
    .await;
    assert_eq!(vector(&v[0]["embedding"][0]), raw);
    // A batch of 64 is one request.
    let many: Vec<String> = (0..64).map(|i| format!("text {i}")).collect();
    let (st, v) = post(b, "/v1/embeddings", json!({ "input": many })).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_problem() {
    let s = tiny_server(1, |_| {});
    let b = &s.base;
    let long = "word ".repeat(400);
    for (path, body, want) in [
        ("/v1/embeddings", json!({"input": ""}), "empty string"),
        ("/v1/embeddings", json!({"input": []}), "empty list"),
        ("/v1/embeddings", json!({"input": ["a", ""]}), "[1]"),
        (
            "/v1/embeddings",
            json!({"input": "a", "dimensions": 8}),
            "dimensions",
        ),
        (
            "/v1/embeddings",
            json!({"input": "a", "encoding_format": "hex"}),
            "encoding_format",
        ),
        ("/v1/embeddings", json!({"input": [1, 99999999]}), "below"),
        ("/v1/embeddings", json!({"input": long}), "tokens"),
        ("/v1/embeddings", json!({}), "input"),
        (
            "/api/embed",
            json!({"model": "tiny-qwen2", "input": long, "truncate": false}),
            "tokens",
        ),
        (
            "/embedding",
            json!({"content": "a", "embd_normalize": 1}),
            "embd_normalize",
        ),
        (
            "/v1/rerank",
            json!({"query": "a", "documents": ["b"]}),
            "--rerank",
        ),
    ] {
        let (st, v) = post(b, path, body.clone()).await;
        assert!(st == 400 || st == 501, "{path} {body}: {st} {v}");
        assert!(v.to_string().contains(want), "{path} {body}: {v}");
    }
    // ollama truncates by default.
    let (st, v) = post(
        b,
        "/api/embed",
        json!({"model": "tiny-qwen2", "input": long}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    // A body that is not UTF-8 is a 400.
    let r = client()
        .post(format!("{b}/v1/embeddings"))
        .header("content-type", "application/json")
        .body(b"{\"input\":\"\xff\xfe\"}".to_vec())
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_names_what_it_needs() {
    // The tiny vocabulary has no single "yes" and "no" tokens; the real model's
    // scores are checked in the cli crate's tests (scripts/e2e_embed.py).
    let s = tiny_server(1, |c| c.rerank = true);
    let b = &s.base;
    let (st, v) = post(b, "/v1/rerank", json!({"query": "q", "documents": ["d"]})).await;
    assert_eq!(st, 400, "{v}");
    assert!(v.to_string().contains("no single"), "{v}");
    for (body, want) in [
        (json!({"documents": ["d"]}), "query"),
        (json!({"query": "q"}), "documents"),
        (json!({"query": "q", "documents": []}), "documents"),
        (json!({"query": "q", "documents": [1]}), "documents"),
    ] {
        let (st, v) = post(b, "/rerank", body.clone()).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert!(v.to_string().contains(want), "{body}: {v}");
    }
}

/// A BERT-family encoder served: `/v1/embeddings` gives llama.cpp's mean-pooled vector of
/// the tiny model `stem` (the golden of the runtime's check), `/embedding` the same, and
/// a chat request is refused naming the encoder.
async fn an_encoder_serves_the_golden_embedding(stem: &str, s: TestServer) {
    let golden: Value = serde_json::from_str(include_str!(
        "../../../runtime/tests/golden/embed_tiny_reference.json"
    ))
    .expect("golden JSON");
    let g = golden["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|g| g["model"] == stem && g["pooling"] == "mean")
        .unwrap_or_else(|| panic!("a {stem} mean entry"));
    let want = vector(&g["embedding"]);
    let text = g["text"].as_str().expect("text");
    let b = &s.base;
    let (st, v) = post(b, "/v1/embeddings", json!({ "input": text })).await;
    assert_eq!(st, 200, "{v}");
    let got = vector(&v["data"][0]["embedding"]);
    assert_eq!(got.len(), want.len());
    let cos: f64 = got
        .iter()
        .zip(&want)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum();
    assert!(1.0 - cos < 1e-5, "{stem}: cosine {cos}");
    let (st, v) = post(b, "/embedding", json!({ "content": text })).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = post(
        b,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    )
    .await;
    assert!(st >= 400, "{st} {v}");
    assert!(v.to_string().contains("encoder"), "{v}");
    s.stop().expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bert_encoder_serves_embeddings_and_refuses_chat() {
    an_encoder_serves_the_golden_embedding("bert-f32", tiny_bert_server()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nomic_bert_encoder_serves_embeddings_and_refuses_chat() {
    let spec = minfer_models::testing::TinyBert::nomic(
        minfer_gguf::GgmlType::F32,
        minfer_models::testing::NOMIC_SEED,
    );
    an_encoder_serves_the_golden_embedding("nomic-f32", bert_server(&spec, |_| {})).await;
}
