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
    // What a request that sets no option runs with.
    assert_eq!(
        v["parameters"],
        "temperature 0.8\ntop_k 40\ntop_p 0.9\nrepeat_penalty 1.1\nrepeat_last_n 64"
    );
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
            json!({"model": MODEL, "input": ["a", ""]}),
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

/// The router's own refusals on ollama's `/api/*` paths (no route, a wrong method, a body
/// that is not JSON or too large) are ollama's `{"error": "..."}` too.
#[test]
fn router_refusals_on_ollama_paths_have_its_shape() {
    let s = tiny_server(1, |c| c.body_limit = 1024);
    let addr = s.running.addr();
    let json = "content-type: application/json\r\n";
    let big = format!(r#"{{"model":"{MODEL}","prompt":"{}"}}"#, "x".repeat(2000));
    let chat = format!(r#"{{"model":"{MODEL}","messages":[]}}"#);
    for (head, headers, body, status) in [
        ("GET /api/chat", "", "", 405),
        ("POST /api/tags", json, "{}", 405),
        ("POST /api/nope", json, "{}", 404),
        ("GET /api/chat/more", "", "", 404),
        ("POST /api/chat", "", chat.as_str(), 415),
        ("POST /api/embed", "content-type: text/plain\r\n", "{}", 415),
        ("POST /api/generate", json, big.as_str(), 413),
    ] {
        let (st, v) = raw_json(addr, head, headers, body);
        assert_eq!(st, status, "{head}: {v}");
        let msg = v["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{head}: ollama shape: {v}"));
        assert!(!msg.is_empty(), "{head}: {v}");
    }
    s.stop().expect("stops");
}

/// Norm of a JSON vector.
fn norm(v: &Value) -> f64 {
    let xs = v.as_array().expect("vector");
    xs.iter()
        .map(|x| x.as_f64().expect("number").powi(2))
        .sum::<f64>()
        .sqrt()
}

/// Checks one `logprobs` entry: ollama's `{token, logprob, bytes, top_logprobs}` with
/// `top` alternatives (none: the field left out).
fn assert_logprob(l: &Value, top: usize) {
    assert!(l["token"].is_string(), "{l}");
    assert!(l["logprob"].as_f64().is_some_and(|x| x <= 0.0), "{l}");
    assert!(l["bytes"].is_array(), "{l}");
    match top {
        0 => assert!(l.get("top_logprobs").is_none(), "{l}"),
        k => {
            let alts = l["top_logprobs"].as_array().expect("top_logprobs");
            assert_eq!(alts.len(), k, "{l}");
            assert!(alts
                .iter()
                .all(|a| a["token"].is_string() && a["logprob"].is_number()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_per_token_streamed_and_not() {
    let s = tiny_server(1, |_| {});
    let opts = json!({"num_predict": 4, "temperature": 0, "repeat_penalty": 1.0});
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
        "options": opts, "logprobs": true, "top_logprobs": 3, "stream": false});
    let (st, v) = post(&s.base, "/api/chat", chat.clone()).await;
    assert_eq!(st, 200, "{v}");
    let lps = v["logprobs"].as_array().expect("logprobs");
    assert_eq!(lps.len() as u64, v["eval_count"].as_u64().unwrap(), "{v}");
    for l in lps {
        assert_logprob(l, 3);
    }
    let once: String = lps.iter().map(|l| l["token"].as_str().unwrap()).collect();

    // Streamed: each line carries its own tokens; together they are the answer's.
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let (st, _, lines) = post_ndjson(&s.base, "/api/chat", streamed).await;
    assert_eq!(st, 200, "{lines:?}");
    let per_line: Vec<Value> = lines
        .iter()
        .flat_map(|l| l["logprobs"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(per_line, *lps);
    let last = lines.last().unwrap();
    assert_eq!(per_line.len() as u64, last["eval_count"].as_u64().unwrap());
    assert!(!once.is_empty());

    // Generate: the chosen tokens only with `top_logprobs` 0; none without `logprobs`.
    let gen = json!({"model": MODEL, "prompt": "why", "options": opts, "stream": false,
        "logprobs": true});
    let (st, v) = post(&s.base, "/api/generate", gen.clone()).await;
    assert_eq!(st, 200, "{v}");
    let lps = v["logprobs"].as_array().expect("logprobs");
    assert_eq!(lps.len() as u64, v["eval_count"].as_u64().unwrap(), "{v}");
    for l in lps {
        assert_logprob(l, 0);
    }
    let mut plain = gen.clone();
    plain["logprobs"] = json!(false);
    plain["top_logprobs"] = json!(5);
    let (st, v) = post(&s.base, "/api/generate", plain).await;
    assert_eq!(st, 200, "{v}");
    assert!(v.get("logprobs").is_none(), "{v}");
    let mut streamed = gen;
    streamed["stream"] = json!(true);
    streamed["top_logprobs"] = json!(2);
    let (st, _, lines) = post_ndjson(&s.base, "/api/generate", streamed).await;
    assert_eq!(st, 200, "{lines:?}");
    let n: usize = lines
        .iter()
        .filter_map(|l| l["logprobs"].as_array())
        .inspect(|a| a.iter().for_each(|l| assert_logprob(l, 2)))
        .map(Vec::len)
        .sum();
    assert_eq!(
        n as u64,
        lines.last().unwrap()["eval_count"].as_u64().unwrap()
    );

    // ollama's range: 0 to 20.
    for (path, top) in [("/api/chat", 21), ("/api/generate", -1)] {
        let mut body = chat.clone();
        body["prompt"] = json!("x");
        body["top_logprobs"] = json!(top);
        let (st, v) = post(&s.base, path, body).await;
        assert_eq!(st, 400, "{path}: {v}");
        assert!(
            v["error"].as_str().unwrap().contains("`top_logprobs`"),
            "{v}"
        );
    }
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_zero_without_a_prompt_answers_unload() {
    let s = tiny_server(1, |_| {});
    for (path, body, reason) in [
        (
            "/api/generate",
            json!({"model": MODEL, "keep_alive": 0}),
            "unload",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "keep_alive": "0s"}),
            "unload",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "keep_alive": "5m"}),
            "load",
        ),
        ("/api/generate", json!({"model": MODEL}), "load"),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": [], "keep_alive": 0}),
            "unload",
        ),
        ("/api/chat", json!({"model": MODEL, "messages": []}), "load"),
    ] {
        let (st, v) = post(&s.base, path, body.clone()).await;
        assert_eq!(st, 200, "{body}: {v}");
        assert_eq!(v["done"], true, "{body}: {v}");
        assert_eq!(v["done_reason"], reason, "{body}: {v}");
    }
    // With a prompt `keep_alive` 0 still answers (the model stays loaded regardless).
    let body = json!({"model": MODEL, "prompt": "hi", "keep_alive": 0, "stream": false,
        "options": {"num_predict": 2}});
    let (st, v) = post(&s.base, "/api/generate", body).await;
    assert_eq!(st, 200, "{v}");
    assert_ne!(v["done_reason"], "unload", "{v}");
    let (st, v) = post(
        &s.base,
        "/api/generate",
        json!({"model": MODEL, "keep_alive": "soon"}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("`keep_alive`"), "{v}");
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn think_true_is_refused_on_a_model_that_cannot_think() {
    let s = tiny_server(1, |_| {});
    let chat = json!({"model": "tiny-qwen2", "messages": [{"role": "user", "content": "x"}],
        "stream": false, "options": {"num_predict": 2}});
    let gen = json!({"model": MODEL, "prompt": "x", "stream": false,
        "options": {"num_predict": 2}});
    for (path, base, name) in [
        ("/api/chat", &chat, "tiny-qwen2"),
        ("/api/generate", &gen, MODEL),
    ] {
        let mut body = base.clone();
        body["think"] = json!(true);
        let (st, v) = post(&s.base, path, body.clone()).await;
        assert_eq!(st, 400, "{path}: {v}");
        assert_eq!(
            v["error"],
            format!("\"{name}\" does not support thinking"),
            "{path}"
        );
        body["think"] = json!(false);
        let (st, v) = post(&s.base, path, body).await;
        assert_eq!(st, 200, "{path}: {v}");
    }
    s.stop().expect("stops");

    // A template that writes a reasoning block thinks: `think: true` is taken.
    let s = tiny_server_with_template(
        "thinker",
        "{% for m in messages %}{{ m.content }}{% endfor %}\
         {% if add_generation_prompt %}<think>{% endif %}",
    );
    let (st, v) = post(
        &s.base,
        "/api/chat",
        json!({"model": "thinker", "messages": [{"role": "user", "content": "x"}],
            "think": true, "stream": false, "options": {"num_predict": 2}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_results_reach_the_template_with_their_name_and_call_id() {
    // The template writes each tool result's name and id where the prompt can be
    // measured: the prompt's token count tells whether they were given.
    let s = tiny_server_with_template(
        "tooly",
        "{% for m in messages %}{% if m.role == 'tool' %}[{{ m.name }}|{{ m.tool_call_id }}]\
         {% endif %}{{ m.content }}\n{% endfor %}",
    );
    let msgs = json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "18 C", "tool_name": "get_weather"}
    ]);
    let (st, v) = post(
        &s.base,
        "/api/chat",
        json!({"model": "tooly", "messages": msgs, "stream": false,
            "options": {"num_predict": 1}}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let want = "weather?\n\n[get_weather|call_1_0]18 C\n";
    let (_, ids) = post(
        &s.base,
        "/tokenize",
        json!({"content": want, "add_special": true}),
    )
    .await;
    assert_eq!(
        v["prompt_eval_count"],
        ids["tokens"].as_array().expect("tokens").len(),
        "{v}"
    );
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embed_dimensions_keep_a_unit_prefix_and_empty_input_answers_no_vectors() {
    let s = tiny_server(1, |_| {});
    let embed = |extra: Value| {
        let mut b = json!({"model": MODEL, "input": ["hello there", "bye"]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let (st, whole) = post(&s.base, "/api/embed", embed(json!({}))).await;
    assert_eq!(st, 200, "{whole}");
    let full = whole["embeddings"][0].as_array().expect("vector").clone();
    assert!(full.len() > 4);
    let (st, v) = post(&s.base, "/api/embed", embed(json!({"dimensions": 4}))).await;
    assert_eq!(st, 200, "{v}");
    for (i, e) in v["embeddings"].as_array().unwrap().iter().enumerate() {
        let e4 = e.as_array().unwrap();
        assert_eq!(e4.len(), 4, "{v}");
        assert!((norm(e) - 1.0).abs() < 1e-5, "{e}");
        // The same direction as the whole vector's first four values.
        let head = &whole["embeddings"][i].as_array().unwrap()[..4];
        let scale = norm(&json!(head));
        for (a, b) in e4.iter().zip(head) {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b / scale).abs() < 1e-5, "{a} vs {b}");
        }
    }
    // 0, or a size at or past the model's, keeps the vector whole.
    for d in [0, full.len(), full.len() + 10] {
        let (st, v) = post(&s.base, "/api/embed", embed(json!({ "dimensions": d }))).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["embeddings"], whole["embeddings"], "{d}");
    }
    for bad in [json!(-1), json!(2.5), json!("4")] {
        let (st, v) = post(&s.base, "/api/embed", embed(json!({ "dimensions": bad }))).await;
        assert_eq!(st, 400, "{bad}: {v}");
        assert!(v["error"].as_str().unwrap().contains("`dimensions`"), "{v}");
    }
    // No input: no vectors, as ollama answers (a client's way to load the model).
    for input in [json!(""), json!([]), Value::Null] {
        let (st, v) = post(&s.base, "/api/embed", embed(json!({ "input": input }))).await;
        assert_eq!(st, 200, "{input}: {v}");
        assert_eq!(v["embeddings"], json!([]), "{v}");
        assert_eq!(v["model"], MODEL, "{v}");
    }
    let (st, v) = post(&s.base, "/api/embed", json!({"model": "nope", "input": ""})).await;
    assert_eq!(st, 404, "{v}");
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_says_ollama_is_running() {
    let s = tiny_server(1, |_| {});
    let r = client()
        .get(format!("{}/", s.base))
        .send()
        .await
        .expect("GET /");
    assert_eq!(r.status().as_u16(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/plain"), "{ct}");
    assert_eq!(r.text().await.unwrap(), "Ollama is running");
    let r = client()
        .head(format!("{}/", s.base))
        .send()
        .await
        .expect("HEAD /");
    assert_eq!(r.status().as_u16(), 200);
    s.stop().expect("stops");
}
