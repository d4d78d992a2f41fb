//! llama-server's native routes over real HTTP: `/completion` streaming and not (with
//! `n_probs`, `timings`, token and mixed prompts, its `logit_bias`, stop words and
//! `cache_prompt`), `/infill` on a code sample with the default model, `/props`,
//! `/apply-template`, `--no-slots`, `--no-metrics` and the `llamacpp:*` metrics.

use crate::common;

use common::*;
use minfer_server::{start, Config};
use serde_json::{json, Value};

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or_default()
}

/// A greedy request that always runs `n` tokens (no end-of-generation).
fn greedy(prompt: Value, n: usize) -> Value {
    json!({"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": true})
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_answers_in_llama_server_s_shape() {
    let s = tiny_server(1, |_| {});
    let body = with(
        greedy(json!("hello world"), 4),
        json!({"n_probs": 2, "return_tokens": true, "no_such_field": 1}),
    );
    let (st, v) = post(&s.base, "/completion", body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stop"], true);
    assert_eq!(v["stop_type"], "limit");
    assert_eq!(v["stopping_word"], "");
    assert_eq!(v["truncated"], false);
    assert_eq!(v["model"], "tiny-qwen2");
    assert_eq!(v["tokens_predicted"], 4);
    let tokens = v["tokens"].as_array().expect("tokens");
    assert_eq!(tokens.len(), 4, "{v}");
    let probs = v["completion_probabilities"].as_array().expect("probs");
    assert_eq!(probs.len(), 4, "{v}");
    for (p, t) in probs.iter().zip(tokens) {
        assert_eq!(&p["id"], t, "{p}");
        assert!(p["logprob"].as_f64().is_some_and(|x| x <= 0.0), "{p}");
        assert!(p["bytes"].is_array() && p["token"].is_string(), "{p}");
        let top = p["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(top.len(), 2, "{p}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["id"], p["id"], "{p}");
    }
    let t = &v["timings"];
    for k in [
        "prompt_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
        "cache_n",
    ] {
        assert!(t[k].is_number(), "timings.{k}: {t}");
    }
    assert_eq!(t["predicted_n"], 4);
    let n_prompt = v["tokens_evaluated"].as_u64().expect("tokens_evaluated");
    assert_eq!(
        t["prompt_n"].as_u64().unwrap() + t["cache_n"].as_u64().unwrap(),
        n_prompt
    );
    assert_eq!(v["generation_settings"]["n_predict"], 4);
    // `ignore_eos` bans the end tokens: llama-server's entries, the ban its -inf (null).
    let bias = v["generation_settings"]["logit_bias"]
        .as_array()
        .expect("logit_bias");
    assert!(!bias.is_empty(), "{v}");
    for b in bias {
        assert!(b["token"].is_u64() && b["bias"].is_null(), "{b}");
    }
    assert_eq!(v["generation_settings"]["n_probs"], 2);
    assert_eq!(v["generation_settings"]["n_ctx"], 256);
    let content = v["content"].as_str().expect("content").to_string();

    // The same prompt as token ids, and mixed with text, gives the same greedy answer.
    let tokenize = |text: &str| {
        let base = s.base.clone();
        let body = json!({"content": text, "add_special": true});
        async move {
            let (_, v) = post(&base, "/tokenize", body).await;
            v["tokens"].as_array().expect("ids").clone()
        }
    };
    let ids = tokenize("hello world").await;
    let (st, v) = post(&s.base, "/completion", greedy(json!(ids), 4)).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"], content.as_str());
    // Mixed: the ids of "hello", then the text " world" (no BOS inside a prompt).
    let head = tokenize("hello").await;
    if ids.starts_with(&head) {
        let mut mixed = head.clone();
        mixed.push(json!(" world"));
        let (st, v) = post(&s.base, "/completion", greedy(json!(mixed), 4)).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["tokens_evaluated"], ids.len(), "{v}");
        assert_eq!(v["content"], content.as_str());
    }

    // Streaming: the pieces, then the final object; no `[DONE]` on llama-server's route.
    let (st, frames) = post_stream(
        &s.base,
        "/completion",
        with(greedy(json!("hello world"), 4), json!({"stream": true})),
    )
    .await;
    assert_eq!(st, 200);
    assert!(!frames.iter().any(|f| f == "[DONE]"), "{frames:?}");
    let objs: Vec<Value> = frames
        .iter()
        .map(|f| serde_json::from_str(f).expect("JSON frame"))
        .collect();
    let (last, pieces) = objs.split_last().expect("frames");
    assert_eq!(last["stop"], true, "{last}");
    assert_eq!(last["content"], "");
    assert_eq!(last["timings"]["predicted_n"], 4, "{last}");
    let mut streamed = String::new();
    let mut n = 0;
    for p in pieces {
        assert_eq!(p["stop"], false, "{p}");
        streamed.push_str(p["content"].as_str().expect("content"));
        n += p["tokens"].as_array().expect("tokens").len();
        assert_eq!(p["tokens_predicted"], n, "{p}");
    }
    assert_eq!(n, 4);
    assert_eq!(streamed, content);
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logit_bias_stop_words_and_cache_prompt_take_effect() {
    let s = tiny_server(1, |_| {});
    let base = greedy(json!("the quick brown fox"), 6);
    let (_, v) = post(
        &s.base,
        "/completion",
        with(base.clone(), json!({"return_tokens": true})),
    )
    .await;
    let first = v["tokens"][0].as_u64().expect("a first token");
    let content = v["content"].as_str().expect("content").to_string();

    // `false` bans the greedy choice; +100 forces another token.
    let (st, v) = post(
        &s.base,
        "/completion",
        with(
            base.clone(),
            json!({"return_tokens": true, "logit_bias": [[first, false]]}),
        ),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_ne!(v["tokens"][0].as_u64(), Some(first), "{v}");
    let forced = (first + 1) % 200;
    let (_, v) = post(
        &s.base,
        "/completion",
        with(
            base.clone(),
            json!({"return_tokens": true, "logit_bias": [[forced, 100]]}),
        ),
    )
    .await;
    assert!(
        v["tokens"].as_array().unwrap().iter().all(|t| t == forced),
        "{v}"
    );

    // A stop word ends the text before it and is reported.
    let stop: String = content.chars().skip(1).take(1).collect();
    if let Some(at) = content.find(&stop).filter(|_| !stop.is_empty()) {
        let (_, v) = post(
            &s.base,
            "/completion",
            with(base.clone(), json!({"stop": [stop]})),
        )
        .await;
        let before = &content[..at];
        assert_eq!(v["stop_type"], "word", "{v}");
        assert_eq!(v["stopping_word"], stop.as_str(), "{v}");
        assert_eq!(v["content"], before, "{v}");
    }

    // The kept prefix is reused by default and not with `cache_prompt: false`.
    let (_, a) = post(&s.base, "/completion", base.clone()).await;
    let n_prompt = a["tokens_evaluated"].as_u64().unwrap();
    assert_eq!(a["timings"]["cache_n"], n_prompt - 1, "{a}");
    let (_, b) = post(
        &s.base,
        "/completion",
        with(base.clone(), json!({"cache_prompt": false})),
    )
    .await;
    assert_eq!(b["timings"]["cache_n"], 0, "{b}");
    assert_eq!(b["timings"]["prompt_n"], n_prompt, "{b}");
    assert_eq!(b["content"], a["content"]);
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_native_requests_are_400s_naming_the_problem() {
    let s = tiny_server(1, |_| {});
    for (body, want) in [
        (
            with(greedy(json!("a"), 2), json!({"id_slot": 3})),
            "`id_slot`",
        ),
        (
            with(greedy(json!("a"), 2), json!({"mirostat": 2})),
            "`mirostat`",
        ),
        (
            with(greedy(json!("a"), 2), json!({"grammar": "root ::= (\"x\""})),
            "`grammar`: the GBNF grammar cannot be compiled: GBNF line 1: unclosed `(`",
        ),
        (json!({"prompt": "a", "n_predict": 0}), "`n_predict` is 0"),
        (json!({"prompt": [1, 99999999]}), "token 99999999"),
        (
            json!({"prompt": ["one", "two"], "stream": true}),
            "several prompts",
        ),
        (json!({"prompt": ["one", true]}), "`prompt[1]`"),
        (
            with(greedy(json!("a"), 2), json!({"n_probs": 101})),
            "`n_probs`",
        ),
        (
            with(greedy(json!("a"), 2), json!({"logit_bias": [[1, 500]]})),
            "`logit_bias[0]`",
        ),
        (json!({"n_predict": 2}), "`prompt` is required"),
    ] {
        let (st, v) = post(&s.base, "/completion", body.clone()).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert!(message(&v).contains(want), "{body}: {v}");
        // llama-server's error shape: the status as a number in `code`.
        assert_eq!(v["error"]["code"], 400, "{body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}: {v}");
    }
    // The tiny model has no FIM tokens: /infill names what is missing.
    let (st, v) = post(
        &s.base,
        "/infill",
        json!({"input_prefix": "def f(", "input_suffix": ")"}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("fill-in-the-middle"), "{v}");
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn props_apply_template_and_metrics() {
    let (dir, path) = tiny_model();
    let mut c = tiny_config(&path, 2);
    c.port = 0;
    let running = start(c).expect("server");
    let base = format!("http://{}", running.addr());
    let (st, v) = get(&base, "/props").await;
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&v).expect("JSON");
    assert_eq!(v["total_slots"], 2);
    assert_eq!(v["model_path"], path.display().to_string());
    assert_eq!(v["n_ctx"], 256);
    assert_eq!(v["default_generation_settings"]["n_ctx"], 256);
    let params = &v["default_generation_settings"]["params"];
    assert_eq!(params["top_k"], 40);
    assert_eq!(params["n_predict"], -1);
    assert!(
        v["build_info"].as_str().unwrap().starts_with("minfer "),
        "{v}"
    );
    assert!(v["chat_template"].is_string());
    // The engine's backends are named, the CPU among them.
    let backends = v["backends"].as_array().expect("backends");
    assert!(
        backends.iter().any(|b| b["name"] == "cpu"),
        "{}",
        v["backends"]
    );

    let (st, v) = post(
        &base,
        "/apply-template",
        json!({"messages": [{"role": "user", "content": "hi there"}]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let prompt = v["prompt"].as_str().expect("prompt");
    assert!(
        prompt.contains("hi there") && prompt.contains("assistant"),
        "{prompt}"
    );
    let (st, v) = post(&base, "/apply-template", json!({"messages": []})).await;
    assert_eq!(st, 400, "{v}");

    let (_, v) = post(&base, "/completion", greedy(json!("count me"), 3)).await;
    let n_prompt = v["tokens_evaluated"].as_u64().unwrap();
    let (st, m) = get(&base, "/metrics").await;
    assert_eq!(st, 200);
    // llama-server's header: when its counters started.
    let r = client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap();
    let started: u64 = r.headers()["process-start-time-unix"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(started > 1_700_000_000, "{started}");
    for line in [
        format!("llamacpp:prompt_tokens_total {n_prompt}\n"),
        "llamacpp:prompt_tokens_cached_total 0\n".to_string(),
        "llamacpp:tokens_predicted_total 3\n".to_string(),
        "llamacpp:requests_processing 0\n".to_string(),
        "llamacpp:requests_deferred 0\n".to_string(),
    ] {
        assert!(m.contains(&line), "missing {line:?} in\n{m}");
    }
    for name in [
        "llamacpp:prompt_seconds_total",
        "llamacpp:tokens_predicted_seconds_total",
        "llamacpp:n_decode_total",
        "llamacpp:n_busy_slots_per_decode",
        "llamacpp:prompt_tokens_seconds",
        "llamacpp:predicted_tokens_seconds",
        "llamacpp:kv_cache_usage_ratio",
        "llamacpp:kv_cache_tokens",
    ] {
        assert!(m.contains(&format!("\n{name} ")), "missing {name} in\n{m}");
    }
    let decodes: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("llamacpp:n_decode_total "))
        .and_then(|x| x.parse().ok())
        .expect("n_decode_total");
    // One step prefills the prompt and yields the first token; each further token is one.
    assert_eq!(decodes, 3, "{m}");
    drop(running);
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_slots_and_no_metrics_answer_llama_server_s_501() {
    let s = tiny_server(1, |c: &mut Config| {
        c.no_slots = true;
        c.no_metrics = true;
    });
    for (path, flag) in [("/slots", "--no-slots"), ("/metrics", "--no-metrics")] {
        let (st, body) = get(&s.base, path).await;
        assert_eq!(st, 501, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).expect("JSON error");
        assert_eq!(v["error"]["type"], "not_supported_error", "{v}");
        assert_eq!(v["error"]["code"], 501, "{v}");
        assert!(message(&v).contains(flag), "{v}");
    }
    // Everything else still works.
    let (st, _) = post(&s.base, "/completion", greedy(json!("a"), 1)).await;
    assert_eq!(st, 200);
    s.stop().expect("stops");
    // And both are on by default.
    let s = tiny_server(1, |_| {});
    assert_eq!(get(&s.base, "/slots").await.0, 200);
    assert_eq!(get(&s.base, "/metrics").await.0, 200);
    s.stop().expect("stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infill_fills_a_function_body_with_the_default_model() {
    let mut c = Config::new(real_model());
    c.port = 0;
    c.slots = 1;
    c.ctx = Some(1024);
    let running = start(c).expect("server");
    let base = format!("http://{}", running.addr());
    let body = json!({
        "input_extra": [{"filename": "util.py", "text": "ZERO = 0\n"}],
        "input_prefix": "def add(a, b):\n    ",
        "input_suffix": "\n\nprint(add(1, 2))\n",
        "n_predict": 8,
        "temperature": 0,
    });
    let (st, v) = post(&base, "/infill", body).await;
    assert_eq!(st, 200, "{v}");
    let content = v["content"].as_str().expect("content");
    assert!(!content.trim().is_empty(), "{v}");
    // llama-server's repo-level layout, with `prompt` reporting the tokens as text.
    assert_eq!(
        v["prompt"],
        "<|repo_name|>myproject\n<|file_sep|>util.py\nZERO = 0\n<|file_sep|>filename\n\
         <|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>",
        "{v}"
    );
    // Qwen2.5-Coder fills the body with the sum.
    assert!(
        content.contains("a + b") || content.contains("a+b"),
        "{content:?}"
    );
    let (_, props) = get(&base, "/props").await;
    assert!(props.contains("\"infill\":true"), "{props}");
    // Each extra chunk needs its text; a filename, when given, is a string.
    for (chunk, want) in [
        (json!({}), "input_extra[0].text"),
        (json!({"filename": "ok"}), "input_extra[0].text"),
        (
            json!({"filename": 123, "text": "abc"}),
            "input_extra[0].filename",
        ),
        (json!({"filename": "a", "text": 456}), "input_extra[0].text"),
    ] {
        let body = json!({"input_extra": [chunk], "input_prefix": "x", "input_suffix": "y"});
        let (st, v) = post(&base, "/infill", body).await;
        assert_eq!(st, 400, "{chunk}: {v}");
        assert!(v.to_string().contains(want), "{chunk}: {v}");
    }
    drop(running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_slot_runs_in_that_slot_and_a_busy_one_is_a_503() {
    let s = tiny_server(2, |c: &mut Config| c.fault_injection = true);
    // A slow request holds slot 0 (10 ms per token) while the others arrive.
    let slow = with(
        greedy(
            json!(format!("hold {}", minfer_server::openai::SLOW_MARKER)),
            150,
        ),
        json!({"id_slot": 0}),
    );
    let base = s.base.clone();
    let holder = tokio::spawn(async move { post(&base, "/completion", slow).await });
    let t0 = std::time::Instant::now();
    let busy = loop {
        let (_, body) = get(&s.base, "/slots").await;
        let v: Value = serde_json::from_str(&body).expect("slots");
        if v[0]["is_processing"] == true {
            break v;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the request for slot 0 never ran in slot 0: {v}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert_eq!(busy[1]["is_processing"], false, "{busy}");
    let (st, v) = post(
        &s.base,
        "/completion",
        with(greedy(json!("a"), 2), json!({"id_slot": 0})),
    )
    .await;
    assert_eq!(st, 503, "{v}");
    assert!(message(&v).contains("slot 0 is busy"), "{v}");
    // The OpenAI routes take llama-server's `id_slot` too.
    let (st, v) = post(
        &s.base,
        "/v1/completions",
        json!({"prompt": "a", "max_tokens": 2, "temperature": 0, "id_slot": 0}),
    )
    .await;
    assert_eq!(st, 503, "{v}");
    assert!(v.to_string().contains("slot 0 is busy"), "{v}");
    let (st, v) = post(
        &s.base,
        "/completion",
        with(greedy(json!("a"), 2), json!({"id_slot": 1})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = holder.await.expect("holder");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["tokens_predicted"], 150);
    // Both idle: a fresh prompt would go to the least recently used slot, 0; id_slot
    // sends it to 1.
    let prompt = "a fresh prompt of some length";
    let (st, v) = post(
        &s.base,
        "/completion",
        with(greedy(json!(prompt), 2), json!({"id_slot": 1})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (_, body) = get(&s.base, "/slots").await;
    let slots: Value = serde_json::from_str(&body).expect("slots");
    assert_eq!(slots[1]["prompt_tokens"], v["tokens_evaluated"], "{slots}");
    assert_ne!(slots[0]["prompt_tokens"], v["tokens_evaluated"], "{slots}");
    // Several choices with a named slot: the first runs there, the others in free slots
    // (as llama-server schedules them).
    let (st, v) = post(
        &s.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2,
               "id_slot": 1}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(2), "{v}");
    s.stop().expect("stops");
}

/// llama-server's stream telemetry on every route that has it: `return_progress` gives a
/// prompt-progress frame before the first token and one when the prompt has run;
/// `timings_per_token` puts `timings` on every token's frame; a finished answer carries
/// `timings` either way. Without the fields nothing extra is streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timings_per_token_and_return_progress_stream_llama_server_s_telemetry() {
    let s = tiny_server(1, |_| {});
    let ask = json!({"stream": true, "timings_per_token": true, "return_progress": true});
    let prompt = "the quick brown fox jumps";
    let routes = [
        ("/completion", with(greedy(json!(prompt), 4), ask.clone())),
        (
            "/v1/completions",
            with(
                json!({"prompt": prompt, "max_tokens": 4, "temperature": 0}),
                ask.clone(),
            ),
        ),
        (
            "/v1/chat/completions",
            with(
                json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 4,
                       "temperature": 0}),
                ask.clone(),
            ),
        ),
    ];
    for (route, body) in routes {
        let (st, frames) = post_stream(&s.base, route, body).await;
        assert_eq!(st, 200, "{route}: {frames:?}");
        let objs: Vec<Value> = frames
            .iter()
            .filter(|f| *f != "[DONE]")
            .map(|f| serde_json::from_str(f).expect("JSON frame"))
            .collect();
        let progress: Vec<&Value> = objs
            .iter()
            .filter_map(|o| o.get("prompt_progress"))
            .collect();
        assert_eq!(progress.len(), 2, "{route}: {objs:?}");
        let total = progress[0]["total"].as_u64().expect("total");
        assert!(total > 0, "{route}: {progress:?}");
        assert_eq!(progress[0]["processed"], progress[0]["cache"], "{route}");
        assert_eq!(progress[1]["processed"], total, "{route}");
        assert!(progress[1]["time_ms"].as_f64().is_some(), "{route}");
        // Progress comes before any token, with the timings so far (nothing predicted;
        // at the start, nothing run either).
        let first_progress = objs.iter().position(|o| o.get("prompt_progress").is_some());
        let first_token = objs
            .iter()
            .position(|o| o["timings"]["predicted_n"].as_u64().is_some_and(|n| n > 0));
        assert!(first_progress < first_token, "{route}: {objs:?}");
        let at_start = &objs[first_progress.expect("progress")]["timings"];
        assert_eq!(at_start["prompt_n"], 0, "{route}: {at_start}");
        assert_eq!(at_start["predicted_n"], 0, "{route}: {at_start}");
        // Every frame with a token's text carries the timings so far; the last has all.
        let timed: Vec<&Value> = objs
            .iter()
            .filter(|o| o.get("prompt_progress").is_none())
            .filter_map(|o| o.get("timings"))
            .collect();
        assert!(timed.len() >= 4, "{route}: {objs:?}");
        for t in &timed {
            let ran = t["prompt_n"].as_u64().unwrap_or(0) + t["cache_n"].as_u64().unwrap_or(0);
            assert_eq!(ran, total, "{route}: {t}");
            assert!(t["prompt_per_second"].as_f64().is_some(), "{route}: {t}");
        }
        let last = timed.last().expect("timings");
        assert_eq!(last["predicted_n"], 4, "{route}: {last}");
        let counts: Vec<u64> = timed
            .iter()
            .map(|t| t["predicted_n"].as_u64().expect("predicted_n"))
            .collect();
        assert!(
            counts.windows(2).all(|w| w[0] <= w[1]),
            "{route}: {counts:?}"
        );
    }

    // Without the fields: no progress frame, timings only on the finished answer.
    let (_, frames) = post_stream(
        &s.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 3,
               "stream": true}),
    )
    .await;
    let objs: Vec<Value> = frames
        .iter()
        .filter(|f| *f != "[DONE]")
        .map(|f| serde_json::from_str(f).expect("JSON frame"))
        .collect();
    assert!(objs.iter().all(|o| o.get("prompt_progress").is_none()));
    let timed: Vec<usize> = (0..objs.len())
        .filter(|&i| objs[i].get("timings").is_some())
        .collect();
    assert_eq!(timed, [objs.len() - 1], "{objs:?}");
    let (st, v) = post(
        &s.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 3}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        v["timings"]["predicted_n"], v["usage"]["completion_tokens"],
        "{v}"
    );
    assert_eq!(
        v["timings"]["prompt_n"].as_u64().unwrap_or(0)
            + v["timings"]["cache_n"].as_u64().unwrap_or(0),
        v["usage"]["prompt_tokens"].as_u64().unwrap_or(u64::MAX),
        "{v}"
    );
    // A value that is not a boolean is refused by name.
    let (st, v) = post(
        &s.base,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "return_progress": 1}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("return_progress"), "{v}");
    s.stop().expect("stops");
}

/// A lone assistant message to continue, under a template that reads `messages[0]` (as
/// Qwen's do) and so renders no conversation from nothing: a 400 that says so, not the
/// template's line; a template that renders an empty conversation continues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_assistant_message_is_continued_where_the_template_allows_it() {
    let tpl = "{% if messages[0]['role'] == 'system' %}{% endif %}{% for m in messages %}\
               <|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
               {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let strict = tiny_server_with_template("tiny-first", tpl);
    let lone = json!({"messages": [{"role": "assistant", "content": "Whill"}], "max_tokens": 2});
    let (st, v) = post(&strict.base, "/v1/chat/completions", lone.clone()).await;
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("only the assistant message"), "{v}");
    assert_eq!(v["error"]["param"], "messages", "{v}");
    let s = tiny_server(1, |_| {});
    let (st, v) = post(&s.base, "/v1/chat/completions", lone).await;
    assert_eq!(st, 200, "{v}");
}

/// A chat ending with an assistant message is a prefill, as llama-server, ollama and
/// Anthropic take it: the template opens the assistant's turn and the message follows
/// unclosed, for the model to continue. vLLM's `continue_final_message` and
/// `add_generation_prompt` ask for it or turn it off; contradictions are refused by
/// name. `/v1/chat/completions/input_tokens` counts the same prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_assistant_message_is_continued() {
    let s = tiny_server(1, |_| {});
    let base = &s.base;
    let user = json!({"role": "user", "content": "What is the best book"});
    let prefill = json!({"role": "assistant", "content": "Whill"});
    let template = |extra: Value| {
        let body = with(json!({"messages": [user.clone(), prefill.clone()]}), extra);
        async move { post(base, "/apply-template", body).await }
    };
    let (st, v) = template(json!({})).await;
    assert_eq!(st, 200, "{v}");
    let continued = v["prompt"].as_str().expect("prompt").to_string();
    assert!(
        continued.ends_with("<|im_start|>assistant\nWhill"),
        "{continued}"
    );
    let (_, v) =
        template(json!({"continue_final_message": true, "add_generation_prompt": false})).await;
    assert_eq!(v["prompt"], continued.as_str(), "{v}");
    // Turned off: the message is closed and a new turn opened.
    let (st, v) = template(json!({"continue_final_message": false})).await;
    assert_eq!(st, 200, "{v}");
    let closed = v["prompt"].as_str().expect("prompt");
    assert!(
        closed.ends_with("Whill<|im_end|>\n<|im_start|>assistant\n"),
        "{closed}"
    );
    for (extra, field) in [
        (
            json!({"continue_final_message": true, "add_generation_prompt": true}),
            "add_generation_prompt",
        ),
        (json!({"add_generation_prompt": true}), ""),
    ] {
        let (st, v) = template(extra.clone()).await;
        if field.is_empty() {
            // Asking for the turn's opening alone closes the message.
            assert_eq!(st, 200, "{v}");
            assert_eq!(v["prompt"], closed, "{v}");
        } else {
            assert_eq!(st, 400, "{extra}: {v}");
            assert!(message(&v).contains(field), "{v}");
        }
    }
    let (st, v) = post(
        base,
        "/apply-template",
        json!({"messages": [user.clone()], "continue_final_message": true}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("continue_final_message"), "{v}");
    let (st, v) = post(
        base,
        "/v1/chat/completions",
        json!({"messages": [user.clone(), prefill.clone(), prefill.clone()]}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("two assistant messages"), "{v}");

    // The completion runs the continued prompt: its tokens are the rendered text's.
    let (_, t) = post(
        base,
        "/tokenize",
        json!({"content": continued, "parse_special": true}),
    )
    .await;
    let n = t["tokens"].as_array().map(Vec::len).expect("tokens");
    let chat = json!({"messages": [user.clone(), prefill.clone()], "max_tokens": 2,
                      "temperature": 0});
    let (st, v) = post(base, "/v1/chat/completions", chat.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], n, "{v}");
    assert!(v.get("__verbose").is_none(), "{v}");
    // llama-server's `verbose` echoes the prompt the model read.
    let (st, v) = post(
        base,
        "/v1/chat/completions",
        with(chat.clone(), json!({"verbose": true})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["__verbose"]["prompt"], continued.as_str(), "{v}");
    assert_eq!(
        v["__verbose"]["content"], v["choices"][0]["message"]["content"],
        "{v}"
    );
    for route in [
        "/v1/chat/completions/input_tokens",
        "/chat/completions/input_tokens",
    ] {
        let (st, v) = post(base, route, chat.clone()).await;
        assert_eq!(st, 200, "{route}: {v}");
        assert_eq!(v["input_tokens"], n, "{route}: {v}");
        assert_eq!(v["object"], "response.input_tokens", "{route}: {v}");
    }
    let (st, v) = post(
        base,
        "/v1/responses/input_tokens",
        json!({"input": "What is the best book"}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert!(v["input_tokens"].as_u64().is_some_and(|k| k > 3), "{v}");
    s.stop().expect("stops");
}

/// OpenAI's batch of prompts on `/v1/completions` (as evaluation harnesses send them):
/// one choice per prompt and `n`, prompt `p`'s choices at `p * n ..`, each equal to the
/// prompt's own completion; the usage counts every prompt once; streamed the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_prompts_completes_each_prompt() {
    let s = tiny_server(2, |_| {});
    let prompts = ["the quick brown fox", "hello world", "a b c d e f"];
    let one = |p: &str| json!({"prompt": p, "max_tokens": 4, "temperature": 0});
    let mut alone = Vec::new();
    let mut prompt_tokens = 0;
    for p in prompts {
        let (st, v) = post(&s.base, "/v1/completions", one(p)).await;
        assert_eq!(st, 200, "{v}");
        alone.push(v["choices"][0]["text"].as_str().expect("text").to_string());
        prompt_tokens += v["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");
    }
    let batch = json!({"prompt": prompts, "max_tokens": 4, "temperature": 0, "n": 2});
    let (st, v) = post(&s.base, "/v1/completions", batch.clone()).await;
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 6, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
        assert_eq!(c["text"], alone[i / 2].as_str(), "choice {i}: {v}");
    }
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens, "{v}");
    // Streamed: every choice's pieces add up to its text.
    let (st, frames) = post_stream(
        &s.base,
        "/v1/completions",
        with(batch, json!({"stream": true})),
    )
    .await;
    assert_eq!(st, 200, "{frames:?}");
    let mut texts = vec![String::new(); 6];
    let mut finished = 0;
    for f in frames.iter().filter(|f| *f != "[DONE]") {
        let o: Value = serde_json::from_str(f).expect("JSON frame");
        for c in o["choices"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().expect("index") as usize;
            texts[i].push_str(c["text"].as_str().unwrap_or_default());
            finished += usize::from(!c["finish_reason"].is_null());
        }
    }
    assert_eq!(finished, 6, "{frames:?}");
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(t, &alone[i / 2], "choice {i}");
    }
    // llama-server's batch on `/completion`: an array of each prompt's final object.
    let (st, v) = post(
        &s.base,
        "/completion",
        json!({"prompt": prompts, "n_predict": 4, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let all = v.as_array().expect("an array");
    assert_eq!(all.len(), 3, "{v}");
    for (i, o) in all.iter().enumerate() {
        assert_eq!(o["index"], i, "{v}");
        assert_eq!(o["content"], alone[i].as_str(), "{v}");
        assert_eq!(o["stop"], true, "{v}");
    }
    let (st, v) = post(
        &s.base,
        "/completion",
        json!({"prompt": prompts, "n_predict": 4, "stream": true}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("stream"), "{v}");
    // A prompt over the context is named.
    let long = "word ".repeat(400);
    let (st, v) = post(
        &s.base,
        "/v1/completions",
        json!({"prompt": ["ok", long], "max_tokens": 2}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(message(&v).contains("prompt 1"), "{v}");
    s.stop().expect("stops");
}

/// `v` is an error in llama-server's shape with `status` and `kind`: the status as a
/// number in `code`, and no OpenAI `param`.
fn llama_error(v: &Value, status: u16, kind: &str) {
    assert_eq!(v["error"]["code"], status, "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"].get("param").is_none(), "{v}");
}

/// A prompt over the context on the native routes is llama-server's
/// `exceed_context_size_error`, with the two counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_the_context_is_exceed_context_size_error() {
    let s = tiny_server(1, |_| {});
    let long: Vec<u32> = vec![10; 300];
    for path in ["/completion", "/completions"] {
        let (st, v) = post(&s.base, path, json!({"prompt": long, "n_predict": 2})).await;
        assert_eq!(st, 400, "{path}: {v}");
        llama_error(&v, 400, "exceed_context_size_error");
        assert_eq!(v["error"]["n_prompt_tokens"], 300, "{v}");
        assert_eq!(v["error"]["n_ctx"], 256, "{v}");
        assert!(
            message(&v).contains("exceeds the available context size"),
            "{v}"
        );
    }
    // OpenAI's route keeps OpenAI's code, with the counts beside it.
    let (st, v) = post(&s.base, "/v1/completions", json!({"prompt": long})).await;
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["n_prompt_tokens"], 300, "{v}");
    s.stop().expect("stops");
}

/// Every refusal on llama-server's own paths is in its shape: the handlers' (tokenize,
/// slots, rerank, props), the router's (415, 405, 401) and `fail_on_no_slot`'s 503; new
/// routes answer as llama-server's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_paths_answer_llama_server_s_error_shape_and_routes() {
    let s = tiny_server(1, |c: &mut Config| c.fault_injection = true);
    let b = &s.base;
    let (st, v) = post(b, "/tokenize", json!({"content": 5})).await;
    assert_eq!(st, 400, "{v}");
    llama_error(&v, 400, "invalid_request_error");
    for (path, want, kind) in [
        ("/slots/7?action=save", 400, "invalid_request_error"),
        ("/slots/0?action=fly", 400, "invalid_request_error"),
        // Without --slot-save-path: llama-server's `not_supported_error`.
        ("/slots/0?action=save", 501, "not_supported_error"),
    ] {
        let (st, v) = post(b, path, json!({"filename": "a.kv"})).await;
        assert_eq!(st, want, "{path}: {v}");
        llama_error(&v, want, kind);
    }
    // A decoder without --rerank does not rerank.
    let (st, v) = post(b, "/rerank", json!({"query": "q", "documents": ["d"]})).await;
    assert_eq!(st, 501, "{v}");
    llama_error(&v, 501, "not_supported_error");
    // The router's refusals on these paths.
    let r = client()
        .post(format!("{b}/tokenize"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 415);
    llama_error(&r.json().await.expect("JSON"), 415, "invalid_request_error");
    let (st, body) = get(b, "/completion").await;
    assert_eq!(st, 405, "{body}");
    llama_error(
        &serde_json::from_str(&body).expect("JSON"),
        405,
        "invalid_request_error",
    );
    // New routes: /v1/health, /lora-adapters, POST /props.
    let (st, body) = get(b, "/v1/health").await;
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("\"status\":\"ok\""), "{body}");
    assert_eq!(get(b, "/lora-adapters").await, (200, "[]".to_string()));
    let (st, v) = post(b, "/props", json!({"n_ctx": 5})).await;
    assert_eq!(st, 501, "{v}");
    llama_error(&v, 501, "not_supported_error");
    assert!(message(&v).contains("--props"), "{v}");
    // `fail_on_no_slot`: an idle slot answers the slots; a busy one is a 503.
    assert_eq!(get(b, "/slots?fail_on_no_slot=1").await.0, 200);
    let slow = greedy(
        json!(format!("hold {}", minfer_server::openai::SLOW_MARKER)),
        150,
    );
    let base = b.clone();
    let holder = tokio::spawn(async move { post(&base, "/completion", slow).await });
    let t0 = std::time::Instant::now();
    loop {
        let (_, body) = get(b, "/slots").await;
        if body.contains("\"is_processing\":true") {
            break;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (st, body) = get(b, "/slots?fail_on_no_slot=1").await;
    assert_eq!(st, 503, "{body}");
    let v: Value = serde_json::from_str(&body).expect("JSON");
    llama_error(&v, 503, "unavailable_error");
    assert_eq!(message(&v), "no slot available");
    let (st, v) = holder.await.expect("holder");
    assert_eq!((st, v["id_slot"].clone()), (200, json!(0)), "{v}");
    s.stop().expect("stops");

    // Under --api-key: a refused key on a native path is llama-server's 401; both
    // health routes stay public; OpenAI's routes keep OpenAI's shape.
    let s = tiny_server(1, |c: &mut Config| c.api_key = Some("sekret".into()));
    let (st, v) = post(&s.base, "/completion", greedy(json!("a"), 1)).await;
    assert_eq!(st, 401, "{v}");
    llama_error(&v, 401, "authentication_error");
    for path in ["/health", "/v1/health"] {
        assert_eq!(get(&s.base, path).await.0, 200, "{path}");
    }
    let (st, v) = post(&s.base, "/v1/completions", json!({"prompt": "a"})).await;
    assert_eq!(
        (st, v["error"]["code"].clone()),
        (401, json!("invalid_api_key"))
    );
    s.stop().expect("stops");
}

/// `/tokenize` and `/detokenize` read bodies as llama-server does: unknown fields
/// ignored, a missing `content` or `tokens` is empty, special tokens detokenize to
/// their text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_read_bodies_as_llama_server_does() {
    let s = tiny_server(1, |_| {});
    let b = &s.base;
    let (st, v) = post(b, "/tokenize", json!({})).await;
    assert_eq!((st, v), (200, json!({"tokens": []})));
    let (st, v) = post(b, "/detokenize", json!({})).await;
    assert_eq!((st, v), (200, json!({"content": ""})));
    let (st, v) = post(
        b,
        "/tokenize",
        json!({"content": "<|im_end|>hi", "add_bos": 1}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let ids = v["tokens"].clone();
    let (st, v) = post(b, "/detokenize", json!({"tokens": ids, "special": false})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"], "<|im_end|>hi", "{v}");
    s.stop().expect("stops");
}

/// The final object's `truncated` and `id_slot`, the stream's `id_slot`,
/// `response_fields`, llama-server's 64 stop strings, `multimodal_data: []`, and the
/// fields code-completion clients send on every `/infill`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_objects_carry_truncated_id_slot_and_the_fields_asked_for() {
    let s = tiny_server(1, |_| {});
    let b = &s.base;
    // n_predict -1 fills the slot: the context ran out.
    let (st, v) = post(
        b,
        "/completion",
        with(greedy(json!("a"), 1), json!({"n_predict": -1})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["truncated"], true, "{v}");
    assert_eq!(v["stop_type"], "limit", "{v}");
    assert_eq!(v["id_slot"], 0, "{v}");
    let (st, v) = post(b, "/completion", greedy(json!("a"), 3)).await;
    assert_eq!((st, v["truncated"].clone()), (200, json!(false)), "{v}");
    let (st, frames) = post_stream(
        b,
        "/completion",
        with(greedy(json!("a"), 3), json!({"stream": true})),
    )
    .await;
    assert_eq!(st, 200);
    for f in &frames {
        let v: Value = serde_json::from_str(f).expect("frame");
        assert_eq!(v["id_slot"], 0, "{f}");
    }
    // `response_fields`: those paths only, a nested one under its path.
    let body = with(
        greedy(json!("a"), 2),
        json!({"response_fields": ["content", "generation_settings/n_predict", "nope"]}),
    );
    let (st, v) = post(b, "/completion", body).await;
    assert_eq!(st, 200, "{v}");
    let keys: Vec<&String> = v.as_object().expect("object").keys().collect();
    assert_eq!(keys.len(), 2, "{v}");
    assert_eq!(v["generation_settings/n_predict"], 2, "{v}");
    // More than OpenAI's 4 stop strings.
    let stops: Vec<String> = (0..10).map(|i| format!("zz{i}")).collect();
    let (st, v) = post(
        b,
        "/completion",
        with(greedy(json!("a"), 2), json!({"stop": stops})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let stops: Vec<String> = (0..65).map(|i| format!("zz{i}")).collect();
    let (st, v) = post(
        b,
        "/completion",
        with(greedy(json!("a"), 2), json!({"stop": stops})),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    let p = json!({"prompt_string": "a", "multimodal_data": []});
    let (st, v) = post(b, "/completion", greedy(p, 2)).await;
    assert_eq!(st, 200, "{v}");
    // llama.vim's fields: accepted. `n_indent` cuts the first line indented less than
    // it asks (never the first line), so the answer is a prefix of the uncut one.
    let (_, full) = post(b, "/completion", greedy(json!("a"), 120)).await;
    let full = full["content"].as_str().expect("content").to_string();
    let vim = json!({"n_indent": 1000, "t_max_predict_ms": 5000, "top_k": 40, "top_p": 0.99,
        "samplers": ["top_k", "top_p", "temperature"], "response_fields": ["content", "stop_type"]});
    let (st, v) = post(b, "/completion", with(greedy(json!("a"), 120), vim)).await;
    assert_eq!(st, 200, "{v}");
    let cut = v["content"].as_str().expect("content");
    assert!(full.starts_with(cut), "{cut:?} / {full:?}");
    let lines: Vec<&str> = full.split('\n').collect();
    if lines.len() > 2 && lines[2..].iter().any(|l| !l.trim().is_empty()) {
        assert!(cut.len() < full.len(), "{cut:?} / {full:?}");
        assert!(
            cut.rsplit('\n').next().is_some_and(|l| l.trim().is_empty()),
            "{cut:?}"
        );
        assert_eq!(v["stop_type"], "limit", "{v}");
    }
    // llama.vim's and llama.vscode's chain, `infill` included, is taken.
    let body = with(
        greedy(json!("a"), 2),
        json!({"samplers": ["top_k", "top_p", "infill"]}),
    );
    let (st, v) = post(b, "/completion", body).await;
    assert_eq!(st, 200, "{v}");
    s.stop().expect("stops");
}

/// While the model loads, llama-server's paths answer its 503 `unavailable_error`
/// (`Loading model`, with `Retry-After`), OpenAI's keep OpenAI's shape.
#[test]
fn loading_is_llama_server_s_unavailable_error_on_its_paths() {
    let (_dir, path) = tiny_model();
    let mut c = tiny_config(&path, 1);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    c.port = port;
    c.load_delay = std::time::Duration::from_millis(1500);
    let server = std::thread::spawn(move || start(c).expect("start"));
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "no socket"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let ask = |head: &str| {
        let a = raw(
            addr,
            &format!(
                "{head} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n\
                 content-length: 2\r\nConnection: close\r\n\r\n{{}}"
            ),
        );
        let body = a.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        (
            a,
            serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
        )
    };
    for head in [
        "GET /health",
        "GET /v1/health",
        "POST /completion",
        "POST /tokenize",
    ] {
        let (a, v) = ask(head);
        assert!(a.starts_with("HTTP/1.1 503"), "{head}: {a}");
        assert_eq!(raw_header(&a, "retry-after").as_deref(), Some("1"), "{a}");
        assert_eq!(
            v,
            json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}),
            "{head}"
        );
    }
    let (a, v) = ask("POST /v1/completions");
    assert!(a.starts_with("HTTP/1.1 503"), "{a}");
    assert!(v["error"].get("param").is_some(), "{v}");
    let running = server.join().expect("the start thread");
    running.stop().expect("stop");
}

/// `--n-predict` as llama-server's `-n`: the limit of a request that sets none, and the
/// most any request gets, on every route; `/props` reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_predict_caps_every_answer_and_is_the_default() {
    let s = tiny_server(1, |c| c.n_predict = Some(3));
    for n in [None, Some(2), Some(50)] {
        let mut body = json!({"prompt": "hello world", "temperature": 0, "ignore_eos": true});
        if let Some(n) = n {
            body["n_predict"] = json!(n);
        }
        let (st, v) = post(&s.base, "/completion", body).await;
        assert_eq!(st, 200, "{v}");
        let want = n.unwrap_or(3).min(3);
        assert_eq!(v["tokens_predicted"], want, "{n:?}: {v}");
        assert_eq!(v["generation_settings"]["n_predict"], want, "{n:?}");
    }
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
        "temperature": 0, "logit_bias": {}});
    let (st, v) = post(&s.base, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() <= 3,
        "{v}"
    );
    let (_, props) = get(&s.base, "/props").await;
    let props: Value = serde_json::from_str(&props).unwrap();
    assert_eq!(
        props["default_generation_settings"]["params"]["n_predict"],
        3
    );
}

/// `post_sampling_probs`, as llama-server gives it: each token's probability under the
/// distribution the sampler drew it from (after top-k here), and that distribution's
/// most likely tokens, as `prob` and `top_probs`; streamed and not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_sampling_probs_are_of_the_distribution_drawn_from() {
    let s = tiny_server(1, |_| {});
    for stream in [false, true] {
        let body = json!({"prompt": "hello world", "n_predict": 4, "ignore_eos": true,
            "temperature": 1.0, "top_k": 3, "seed": 5, "n_probs": 10,
            "post_sampling_probs": true, "stream": stream});
        let probs: Vec<Value> = if stream {
            let (st, frames) = post_stream(&s.base, "/completion", body).await;
            assert_eq!(st, 200, "{frames:?}");
            let objs: Vec<Value> = frames
                .iter()
                .map(|f| serde_json::from_str(f).expect("JSON frame"))
                .collect();
            objs.iter()
                .filter_map(|e| e["completion_probabilities"].as_array())
                .flatten()
                .cloned()
                .collect()
        } else {
            let (st, v) = post(&s.base, "/completion", body).await;
            assert_eq!(st, 200, "{v}");
            assert_eq!(v["generation_settings"]["post_sampling_probs"], true);
            v["completion_probabilities"].as_array().unwrap().clone()
        };
        assert_eq!(probs.len(), 4, "{stream}: {probs:?}");
        for p in &probs {
            assert!(p.get("logprob").is_none(), "{p}");
            let chosen = p["prob"].as_f64().unwrap();
            let top = p["top_probs"].as_array().unwrap();
            // top-k 3 leaves at most three tokens, whose mass is the whole.
            assert!((1..=3).contains(&top.len()), "{p}");
            let sum: f64 = top.iter().map(|t| t["prob"].as_f64().unwrap()).sum();
            assert!((sum - 1.0).abs() < 1e-6, "{p}");
            assert!(top
                .iter()
                .any(|t| t["id"] == p["id"] && t["prob"] == chosen));
            assert!(chosen > 0.0 && chosen <= 1.0);
        }
    }
}

/// `serve --temp/--top-k/--seed`: llama-server's sampling flags are the settings of every
/// request that leaves them out, on every route; a request's own wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sampling_defaults_fill_what_requests_leave_out() {
    let s = tiny_server(1, |c| {
        c.sampling = minfer_server::sampling_defaults::SamplingDefaults {
            temperature: Some(1.0),
            top_k: Some(7),
            seed: Some(11),
            ..Default::default()
        }
    });
    let (st, v) = post(
        &s.base,
        "/completion",
        json!({"prompt": "hi", "n_predict": 2}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let gs = &v["generation_settings"];
    assert_eq!(
        (&gs["temperature"], &gs["top_k"], &gs["seed"]),
        (&json!(1.0), &json!(7), &json!(11))
    );
    let (_, v) = post(
        &s.base,
        "/completion",
        json!({"prompt": "hi", "n_predict": 2, "temperature": 0.5, "seed": 3}),
    )
    .await;
    let gs = &v["generation_settings"];
    assert_eq!((&gs["temperature"], &gs["seed"]), (&json!(0.5), &json!(3)));
    let (_, props) = get(&s.base, "/props").await;
    let props: Value = serde_json::from_str(&props).unwrap();
    let p = &props["default_generation_settings"]["params"];
    assert_eq!((&p["top_k"], &p["seed"]), (&json!(7), &json!(11)), "{p}");
    // ollama's `/api/show` lists them as the Modelfile's parameters.
    let (_, show) = post(&s.base, "/api/show", json!({"model": props["model_alias"]})).await;
    let params = show["parameters"].as_str().unwrap_or_default();
    for line in ["temperature 1", "top_k 7", "seed 11"] {
        assert!(params.lines().any(|l| l == line), "{line}: {show}");
    }
    // The server's seed makes unseeded sampled answers repeat, on OpenAI's route too.
    let ask = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12});
    let (_, a) = post(&s.base, "/v1/chat/completions", ask.clone()).await;
    let (_, b) = post(&s.base, "/v1/chat/completions", ask).await;
    let text = |v: &Value| v["choices"][0]["message"]["content"].clone();
    assert_eq!(text(&a), text(&b));
}
