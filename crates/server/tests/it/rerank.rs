//! Rerank with a BERT cross-encoder over HTTP: the tiny reranker served as is (its file
//! states rank pooling, no `--rerank` needed) answers `/v1/rerank` and `/rerank` in
//! llama-server's shape with llama.cpp's scores of the pairs as llama-server joins them,
//! sorted, cut to `top_n`, with the documents when asked (and in text-embeddings-
//! inference's shape for `texts`); a BERT without a classifier head is refused naming why.

use crate::common;

use common::*;
use minfer_gguf::GgmlType;
use minfer_models::testing::{bert_reranker, TinyBert, BERT_SEED};
use serde_json::{json, Value};

/// llama.cpp's server-layout entries of the golden for `query`.
fn golden(query: &str) -> Vec<Value> {
    let g: Value = serde_json::from_str(include_str!(
        "../../../runtime/tests/golden/rerank_tiny_reference.json"
    ))
    .expect("golden JSON");
    g["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["layout"] == "server" && e["query"] == query)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bert_reranker_scores_documents_as_llama_cpp() {
    let query = "what is a quick fox?";
    let entries = golden(query);
    assert!(entries.len() >= 2, "{} entries", entries.len());
    let docs: Vec<&str> = entries
        .iter()
        .map(|e| e["document"].as_str().unwrap())
        .collect();
    let n_tokens: usize = entries
        .iter()
        .map(|e| e["ids"].as_array().unwrap().len())
        .sum();
    let (_, spec) = bert_reranker();
    let s = bert_server(&spec, |_| {});
    let b = &s.base;
    for path in ["/v1/rerank", "/rerank", "/reranking", "/v1/reranking"] {
        let body = json!({"query": query, "documents": docs, "return_documents": true});
        let (st, v) = post(b, path, body).await;
        assert_eq!(st, 200, "{path}: {v}");
        assert_eq!(v["object"], "list");
        assert_eq!(v["usage"]["prompt_tokens"], n_tokens, "{v}");
        let results = v["results"].as_array().expect("results");
        assert_eq!(results.len(), docs.len());
        let mut last = f64::INFINITY;
        for r in results {
            let i = r["index"].as_u64().expect("index") as usize;
            let got = r["relevance_score"].as_f64().expect("score");
            let want = entries[i]["score"].as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-3 * want.abs(),
                "{path} doc {i}: {got} vs {want}"
            );
            assert!(got <= last, "not sorted: {v}");
            last = got;
            assert_eq!(r["document"]["text"], docs[i]);
        }
    }
    let (st, v) = post(
        b,
        "/v1/rerank",
        json!({"query": query, "documents": docs, "top_n": 1}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let results = v["results"].as_array().expect("results");
    assert_eq!(results.len(), 1);
    assert!(results[0].get("document").is_none());
    // text-embeddings-inference's shape, as llama-server answers `texts`: a bare array of
    // `{index, score}` (with `text` under `return_text`), sorted, cut to `top_n`.
    let body = json!({"query": query, "texts": docs, "return_text": true, "top_n": 2});
    let (st, v) = post(b, "/rerank", body).await;
    assert_eq!(st, 200, "{v}");
    let tei = v.as_array().expect("a bare array");
    assert_eq!(tei.len(), 2.min(docs.len()));
    let best = &tei[0];
    assert_eq!(best["index"], results[0]["index"], "{v}");
    assert_eq!(best["score"], results[0]["relevance_score"], "{v}");
    assert_eq!(best["text"], docs[best["index"].as_u64().unwrap() as usize]);
    let both = json!({"query": query, "texts": docs, "documents": docs});
    let (st, v) = post(b, "/rerank", both).await;
    assert_eq!(st, 400, "{v}");
    s.stop().expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bert_without_a_classifier_head_cannot_rerank() {
    let plain = TinyBert::new(GgmlType::F32, BERT_SEED);
    let body = json!({"query": "q", "documents": ["d"]});
    type Edit = fn(&mut minfer_server::Config);
    let cases: [(Edit, u16, &str); 3] = [
        (|_| {}, 501, "--rerank"),
        (|c| c.rerank = true, 400, "encoder"),
        (
            |c| c.pooling = Some(minfer_runtime::embed::Pooling::Rank),
            400,
            "classifier head",
        ),
    ];
    for (edit, status, want) in cases {
        let s = bert_server(&plain, edit);
        let (st, v) = post(&s.base, "/v1/rerank", body.clone()).await;
        assert_eq!(st, status, "{v}");
        assert!(v.to_string().contains(want), "{v}");
        s.stop().expect("clean stop");
    }
}
