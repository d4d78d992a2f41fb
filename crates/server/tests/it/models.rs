//! Several models behind one server: the request's `model` selects, `/v1/models` lists
//! them all, at most `max_models` are loaded (least recently used dropped), an unknown
//! name is OpenAI's `model_not_found`, and a model that fails to load fails only the
//! requests for it; llama-server's and ollama's routes select and list the same way.

use crate::common;

use common::*;
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};
use minfer_server::{start, ModelSpec};
use serde_json::{json, Value};

async fn complete(base: &str, model: &str) -> (u16, Value) {
    post(
        base,
        "/v1/completions",
        json!({"model": model, "prompt": "one two three", "temperature": 0, "max_tokens": 6}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_field_selects_and_loads_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("alpha.gguf");
    let b = dir.path().join("beta.gguf");
    let broken = dir.path().join("broken.gguf");
    write_tiny_model(&a, &TinySpec::qwen2(GgmlType::Q8_0, 7)).unwrap();
    write_tiny_model(&b, &TinySpec::qwen3(GgmlType::Q8_0, 11)).unwrap();
    std::fs::write(&broken, b"GGUF but not really").unwrap();
    let mut c = tiny_config(&a, 1);
    c.models[0].alias = Some("first".into());
    c.models.push(ModelSpec::new(&b));
    c.models.push(ModelSpec::new(&broken));
    c.max_models = 1;
    let running = start(c).expect("starting the server");
    let base = format!("http://{}", running.addr());

    let (st, body) = get(&base, "/v1/models").await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["first", "beta", "broken"]);
    // Only the default is loaded at start.
    assert!(v["data"][0]["meta"].is_object() && v["data"][1].get("meta").is_none());

    let (st, one) = complete(&base, "first").await;
    assert_eq!((st, &one["model"]), (200, &json!("first")), "{one}");
    // The file stem selects too; the answer names the model's id.
    let (st, alpha) = complete(&base, "alpha").await;
    assert_eq!((st, &alpha["model"]), (200, &json!("first")));
    assert_eq!(alpha["choices"][0]["text"], one["choices"][0]["text"]);
    let (st, beta) = complete(&base, "beta").await;
    assert_eq!((st, &beta["model"]), (200, &json!("beta")), "{beta}");
    assert_ne!(beta["system_fingerprint"], one["system_fingerprint"]);
    // max_models = 1: beta replaced first, which loads again, answering as before.
    let (_, body) = get(&base, "/v1/models").await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["data"][0].get("meta").is_none() && v["data"][1]["meta"].is_object());
    let (st, again) = complete(&base, "first").await;
    assert_eq!(st, 200);
    assert_eq!(again["choices"][0]["text"], one["choices"][0]["text"]);

    let (st, v) = complete(&base, "gpt-4o").await;
    assert_eq!(st, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["param"], "model");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("first, beta, broken"));
    let (st, v) = post(
        &base,
        "/v1/chat/completions",
        json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!((st, &v["error"]["code"]), (404, &json!("model_not_found")));

    // A model that cannot load is an error naming it, and the server keeps serving.
    let (st, v) = complete(&base, "broken").await;
    assert_eq!(st, 500, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("loading model `broken`"),
        "{v}"
    );
    let (st, _) = complete(&base, "beta").await;
    assert_eq!(st, 200);
    running.stop().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_and_ollama_routes_select_and_list_every_model() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("alpha.gguf");
    let b = dir.path().join("beta.gguf");
    write_tiny_model(&a, &TinySpec::qwen2(GgmlType::Q8_0, 7)).unwrap();
    write_tiny_model(&b, &TinySpec::qwen3(GgmlType::Q8_0, 11)).unwrap();
    let mut c = tiny_config(&a, 1);
    c.models.push(ModelSpec::new(&b));
    c.max_models = 2;
    let running = start(c).expect("starting the server");
    let base = format!("http://{}", running.addr());
    let names = |v: &Value| -> Vec<String> {
        v["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_string())
            .collect()
    };
    // Every served model is listed, loaded or not; only the loaded ones run.
    let (st, body) = get(&base, "/api/tags").await;
    assert_eq!(st, 200);
    let tags: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(names(&tags), ["alpha:latest", "beta:latest"]);
    let (_, body) = get(&base, "/api/ps").await;
    assert_eq!(
        names(&serde_json::from_str(&body).unwrap()),
        ["alpha:latest"]
    );

    let chat = json!({"model": "beta:latest", "stream": false,
        "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 3}});
    let (st, v) = post(&base, "/api/chat", chat).await;
    assert_eq!((st, &v["model"]), (200, &json!("beta:latest")), "{v}");
    let (_, body) = get(&base, "/api/ps").await;
    assert_eq!(
        names(&serde_json::from_str(&body).unwrap()),
        ["alpha:latest", "beta:latest"]
    );
    // ollama refuses a name it does not serve, even where OpenAI's routes would not.
    let (st, v) = post(&base, "/api/show", json!({"model": "gamma"})).await;
    assert_eq!(st, 404, "{v}");
    assert!(v["error"].as_str().unwrap().contains("alpha:latest"), "{v}");

    // llama-server's routes: `model` selects, `/props` describes the default.
    let (st, v) = post(
        &base,
        "/completion",
        json!({"model": "beta", "prompt": "one two", "n_predict": 2}),
    )
    .await;
    assert_eq!((st, &v["model"]), (200, &json!("beta")), "{v}");
    let (st, body) = get(&base, "/props").await;
    assert_eq!(st, 200);
    let props: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(props["model_alias"], "alpha");
    let (st, v) = post(
        &base,
        "/completion",
        json!({"model": "gamma", "prompt": "x"}),
    )
    .await;
    assert_eq!((st, &v["error"]["code"]), (404, &json!(404)), "{v}");
    running.stop().unwrap();
}

#[test]
fn two_models_with_one_name_do_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let a = dir.path().join("m.gguf");
    let b = sub.join("m.gguf");
    write_tiny_model(&a, &TinySpec::qwen2(GgmlType::Q8_0, 7)).unwrap();
    std::fs::copy(&a, &b).unwrap();
    let mut c = tiny_config(&a, 1);
    c.models.push(ModelSpec::new(&b));
    let e = start(c).err().expect("refused").to_string();
    assert!(e.contains("two models are named `m`"), "{e}");
    let files = minfer_server::models::gguf_files(dir.path()).unwrap();
    assert_eq!(files, [a, b]);
}
