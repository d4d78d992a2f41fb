//! Reasoning split out on every chat route, against a tiny Qwen3 whose chat template
//! opens a `<think>` block in the prompt unless `enable_thinking` is false (as Qwen3.5's
//! and DeepSeek-R1's do). The tiny model never writes `</think>`, so with thinking on
//! its whole answer is reasoning, and with thinking off the same kind of text is the
//! answer: the fields must appear and disappear with the switch, and the reasoning
//! must equal, token for token, what the route returns unsplit.

use crate::common;

use common::*;
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model_with_template, TinySpec};
use serde_json::{json, Value};

const TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}\
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}\
{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}";

fn thinking_server() -> TestServer {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("tiny-think.gguf");
    write_tiny_model_with_template(&path, &TinySpec::qwen3(GgmlType::Q8_0, 11), TEMPLATE)
        .expect("writing the tiny model");
    let running = minfer_server::start(tiny_config(&path, 1)).expect("starting the server");
    TestServer {
        base: format!("http://{}", running.addr()),
        running,
        _dir: Some(dir),
    }
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0,
                       "max_tokens": 6, "logit_bias": {"509": -100, "510": -100, "511": -100}});
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_split_on_every_route_and_the_switch_removes_it() {
    let s = thinking_server();
    let b = &s.base;
    // OpenAI chat: unsplit (`reasoning_format: none`) is the reference text.
    let (st, raw) = post(
        b,
        "/v1/chat/completions",
        chat(json!({"reasoning_format": "none"})),
    )
    .await;
    assert_eq!(st, 200, "{raw}");
    let raw_text = raw["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!raw_text.trim().is_empty(), "{raw}");
    assert!(raw["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
    let (st, v) = post(b, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], raw_text, "{v}");
    assert_eq!(m["content"], "", "{v}");
    for off in [
        json!({"chat_template_kwargs": {"enable_thinking": false}}),
        json!({"enable_thinking": false}),
    ] {
        let (st, v) = post(b, "/v1/chat/completions", chat(off.clone())).await;
        assert_eq!(st, 200, "{v}");
        let m = &v["choices"][0]["message"];
        assert!(m.get("reasoning_content").is_none(), "{off}: {v}");
        assert!(!m["content"].as_str().unwrap().is_empty(), "{off}: {v}");
    }
    // Streamed: the same reasoning, in `reasoning_content` deltas only.
    let (st, frames) = post_stream(b, "/v1/chat/completions", chat(json!({"stream": true}))).await;
    assert_eq!(st, 200);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for f in frames.iter().filter(|f| *f != "[DONE]") {
        let v: Value = serde_json::from_str(f).unwrap();
        let d = &v["choices"][0]["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
    }
    assert_eq!(
        (reasoning.as_str(), content.as_str()),
        (raw_text.as_str(), "")
    );

    // ollama: `message.thinking`, gone with `think: false`.
    let body = |think: Value| {
        json!({"model": "tiny-think", "stream": false, "think": think,
        "messages": [{"role": "user", "content": "hi"}],
        "options": {"temperature": 0, "num_predict": 6}})
    };
    let (st, v) = post(b, "/api/chat", body(Value::Null)).await;
    assert_eq!(st, 200, "{v}");
    assert!(
        !v["message"]["thinking"].as_str().unwrap_or("").is_empty(),
        "{v}"
    );
    let (st, v) = post(b, "/api/chat", body(json!(false))).await;
    assert_eq!(st, 200, "{v}");
    assert!(v["message"].get("thinking").is_none(), "{v}");

    // Anthropic: a `thinking` block, a text block with thinking disabled.
    let msg = |thinking: Value| {
        json!({"model": "m", "max_tokens": 6, "temperature": 0,
        "thinking": thinking, "messages": [{"role": "user", "content": "hi"}]})
    };
    let (st, v) = post(
        b,
        "/v1/messages",
        msg(json!({"type": "enabled", "budget_tokens": 16})),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"][0]["type"], "thinking", "{v}");
    let (st, v) = post(b, "/v1/messages", msg(json!({"type": "disabled"}))).await;
    assert_eq!(st, 200, "{v}");
    let kinds: Vec<&str> = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    assert!(!kinds.is_empty() && !kinds.contains(&"thinking"), "{v}");

    // Responses: a `reasoning` output item, none with thinking off.
    let resp = |extra: Value| {
        let mut r = json!({"input": "hi", "temperature": 0, "max_output_tokens": 6});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        r
    };
    let (st, v) = post(b, "/v1/responses", resp(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["output"][0]["type"], "reasoning", "{v}");
    let (st, v) = post(b, "/v1/responses", resp(json!({"enable_thinking": false}))).await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["output"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["type"] != "reasoning"),
        "{v}"
    );
}
