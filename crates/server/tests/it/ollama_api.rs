//! ollama's API over raw HTTP against the tiny model: NDJSON streams and single
//! objects of `/api/chat` and `/api/generate`, the listing routes, and errors in
//! ollama's `{"error": ...}` shape. (The `ollama` Python package drives the real binary
//! in the cli crate's tests.)

use crate::common;

use common::*;
use serde_json::{json, Value};

const MODEL: &str = "tiny-qwen2:latest";

/// POSTs and returns (status, content type, the NDJSON lines parsed).
async fn post_ndjson(base: &str, path: &str, body: Value) -> (u16, String, Vec<Value>) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = r.text().await.expect("body");
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    (status, ct, lines)
}

fn assert_final(v: &Value, eval_count: u64) {
    assert_eq!(v["done"], true, "{v}");
    assert_eq!(v["done_reason"], "length", "{v}");
    assert_eq!(v["eval_count"], eval_count, "{v}");
    for k in [
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_duration",
    ] {
        assert!(v[k].is_u64(), "{k}: {v}");
    }
    let total = v["total_duration"].as_u64().unwrap();
    assert!(total >= v["eval_duration"].as_u64().unwrap(), "{v}");
    assert!(v["created_at"].as_str().unwrap().ends_with('Z'), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_generate_stream_ndjson_and_answer_single_objects() {
    let s = tiny_server(1, |_| {});
    let opts = json!({"num_predict": 4, "temperature": 0, "repeat_penalty": 1.0});
    // ollama has no `ignore_eos`: the tiny model may end early, so the count is exact
    // only when the answer ran to the limit.
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "options": opts});
    let (st, ct, lines) = post_ndjson(&s.base, "/api/chat", chat.clone()).await;
    assert_eq!(st, 200, "{lines:?}");
    assert_eq!(ct, "application/x-ndjson");
    let (last, pieces) = lines.split_last().expect("lines");
    let mut streamed = String::new();
    for p in pieces {
        assert_eq!(p["done"], false, "{p}");
        assert_eq!(p["model"], MODEL);
        assert_eq!(p["message"]["role"], "assistant");
        streamed.push_str(p["message"]["content"].as_str().expect("content"));
    }
    let n = last["eval_count"].as_u64().expect("eval_count");
    if last["done_reason"] == "length" {
        assert_final(last, 4);
    }
    assert!(n <= 4, "{last}");

    let mut once = chat.clone();
    once["stream"] = json!(false);
    let (st, v) = post(&s.base, "/api/chat", once).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["done"], true);
    assert_eq!(v["message"]["content"], streamed.as_str(), "{v}");
    assert_eq!(v["eval_count"], n);

    let generate = json!({"model": MODEL, "prompt": "why is the sky blue", "stream": false,
        "options": opts});
    let (st, v) = post(&s.base, "/api/generate", generate.clone()).await;
    assert_eq!(st, 200, "{v}");
    let text = v["response"].as_str().expect("response").to_string();
    let context = v["context"].as_array().expect("context").clone();
    let gen_n = v["eval_count"].as_u64().unwrap() as usize;
    assert_eq!(
        context.len(),
        v["prompt_eval_count"].as_u64().unwrap() as usize + gen_n,
        "{v}"
    );
    let mut streaming = generate.clone();
    streaming["stream"] = json!(true);
    let (st, _, lines) = post_ndjson(&s.base, "/api/generate", streaming).await;
    assert_eq!(st, 200);
    let (last, pieces) = lines.split_last().unwrap();
    let joined: String = pieces
        .iter()
        .map(|p| p["response"].as_str().unwrap())
        .collect();
    assert_eq!(joined, text);
    assert_eq!(last["done"], true);
    assert_eq!(last["context"], json!(context));

    // `raw` sends the prompt as it is; `context` continues a previous answer.
    let raw = json!({"model": MODEL, "prompt": "abc", "raw": true, "stream": false,
        "options": opts});
    let (st, v) = post(&s.base, "/api/generate", raw).await;
    assert_eq!(st, 200, "{v}");
    let (_, ids) = post(
        &s.base,
        "/tokenize",
        json!({"content": "abc", "add_special": true}),
    )
    .await;
    assert_eq!(
        v["prompt_eval_count"],
        ids["tokens"].as_array().unwrap().len()
    );
    let cont = json!({"model": MODEL, "prompt": "and then", "context": context, "stream": false,
        "options": opts});
    let (st, v) = post(&s.base, "/api/generate", cont).await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["prompt_eval_count"].as_u64().unwrap() as usize > context.len(),
        "{v}"
    );

    // No prompt: ollama's way to load a model.
    let (st, v) = post(&s.base, "/api/generate", json!({"model": MODEL})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["done_reason"], "load");
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_routes_describe_the_served_model() {
    let s = tiny_server(1, |_| {});
    let (st, body) = get(&s.base, "/api/tags").await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let m = &v["models"][0];
    assert_eq!(m["name"], MODEL);
    assert_eq!(m["model"], MODEL);
    assert!(m["size"].as_u64().unwrap() > 0);
    assert_eq!(m["digest"].as_str().unwrap().len(), 64);
    assert_eq!(m["details"]["format"], "gguf");
    assert_eq!(m["details"]["family"], "qwen2");
    assert!(m["details"]["parameter_size"].is_string());
    assert!(m["details"]["quantization_level"].is_string());
    assert!(m["modified_at"].as_str().unwrap().ends_with('Z'));

    let (st, v) = post(&s.base, "/api/show", json!({"model": "tiny-qwen2"})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["model_info"]["general.architecture"], "qwen2");
    assert!(v["model_info"]["qwen2.context_length"].is_u64(), "{v}");
    assert!(v["model_info"]["general.parameter_count"].is_u64(), "{v}");
    assert!(v["modelfile"].as_str().unwrap().contains("FROM "), "{v}");
    assert_eq!(v["details"], m["details"]);
    assert_eq!(v["capabilities"], json!(["completion"]));

    let (st, body) = get(&s.base, "/api/ps").await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["models"][0]["name"], MODEL);
    assert_eq!(v["models"][0]["context_length"], 256);
    let (st, body) = get(&s.base, "/api/version").await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["version"].is_string());
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_have_ollama_s_shape_and_status() {
    let s = tiny_server(1, |_| {});
    let chat = |extra: Value| {
        let mut b = json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
            "stream": false, "options": {"num_predict": 2}});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    for (path, body, status, want) in [
        (
            "/api/chat",
            chat(json!({"model": "llama3"})),
            404,
            "\"llama3\" not found",
        ),
        (
            "/api/chat",
            chat(json!({"model": null})),
            400,
            "model is required",
        ),
        ("/api/chat", chat(json!({"format": 3})), 400, "`format`"),
        (
            "/api/chat",
            chat(json!({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})),
            400,
            "`messages[0].images`",
        ),
        (
            "/api/chat",
            chat(json!({"tools": [{"type": "function"}]})),
            400,
            "`tools[0].function`",
        ),
        (
            "/api/chat",
            chat(json!({"options": {"num_ctx": 100000}})),
            400,
            "`options.num_ctx` is 100000",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "template": "{{ .Prompt }}"}),
            400,
            "`template`",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "suffix": "y"}),
            400,
            "fill-in-the-middle",
        ),
        ("/api/show", json!({"model": "nope"}), 404, "not found"),
        (
            "/api/pull",
            json!({"model": "llama3"}),
            501,
            "not supported",
        ),
        (
            "/api/embed",
            json!({"model": MODEL, "input": ""}),
            400,
            "empty string",
        ),
    ] {
        let (st, v) = post(&s.base, path, body.clone()).await;
        assert_eq!(st, status, "{path} {body}: {v}");
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("ollama shape: {v}"));
        assert!(msg.contains(want), "{path} {body}: {msg}");
    }
    // A prompt past the slot's context fails before the stream starts.
    let long = "word ".repeat(400);
    let (st, v) = post(
        &s.base,
        "/api/generate",
        json!({"model": MODEL, "prompt": long, "raw": true}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("context"), "{v}");
    s.stop().expect("stops");
}
