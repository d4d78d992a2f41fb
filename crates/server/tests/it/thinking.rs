//! Reasoning split out on every chat route, against a tiny Qwen3 whose chat template
//! opens a `<think>` block in the prompt unless `enable_thinking` is false (as Qwen3.5's
//! and DeepSeek-R1's do). The tiny model never writes `</think>`, so with thinking on
//! its whole answer is reasoning, and with thinking off the same kind of text is the
//! answer: the fields must appear and disappear with the switch, and the reasoning
//! must equal, token for token, what the route returns unsplit.

use crate::common;

use common::*;
use serde_json::{json, Value};

const TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}\
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}\
{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}";

fn thinking_server() -> TestServer {
    tiny_server_with_template("tiny-think", TEMPLATE)
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

/// Joins the string at `key` of every JSON frame that `pick` accepts.
fn joined(frames: &[String], pick: impl Fn(&Value) -> Option<&str>) -> String {
    frames
        .iter()
        .filter_map(|f| serde_json::from_str::<Value>(f).ok())
        .filter_map(|v| pick(&v).map(str::to_string))
        .collect()
}

/// The `delta` of a Responses stream event of type `ty`.
fn delta_of<'a>(v: &'a Value, ty: &str) -> Option<&'a str> {
    (v["type"] == ty).then(|| v["delta"].as_str()).flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_reasoning_is_the_whole_answer_s_on_every_route() {
    let s = thinking_server();
    let b = &s.base;
    // The reference: the unsplit text of the OpenAI route (the prompt opened the block,
    // so all of it is reasoning).
    let (_, raw) = post(
        b,
        "/v1/chat/completions",
        chat(json!({"reasoning_format": "none"})),
    )
    .await;
    let want = raw["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!want.is_empty(), "{raw}");

    // ollama: NDJSON lines with `message.thinking`, no content.
    let body = json!({"model": "tiny-think", "stream": true,
        "messages": [{"role": "user", "content": "hi"}],
        "options": {"temperature": 0, "num_predict": 6}});
    let (st, _, text) = post_text(b, "/api/chat", body).await;
    assert_eq!(st, 200, "{text}");
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert_eq!(joined(&lines, |v| v["message"]["thinking"].as_str()), want);
    assert_eq!(joined(&lines, |v| v["message"]["content"].as_str()), "");

    // Anthropic: `thinking_delta`s only.
    let body = json!({"model": "m", "max_tokens": 6, "temperature": 0, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 16},
        "messages": [{"role": "user", "content": "hi"}]});
    let (st, frames) = post_stream(b, "/v1/messages", body).await;
    assert_eq!(st, 200);
    assert_eq!(joined(&frames, |v| v["delta"]["thinking"].as_str()), want);
    assert_eq!(joined(&frames, |v| v["delta"]["text"].as_str()), "");

    // Responses: `response.reasoning_text.delta` events only.
    let body = json!({"input": "hi", "temperature": 0, "max_output_tokens": 6, "stream": true});
    let (st, frames) = post_stream(b, "/v1/responses", body).await;
    assert_eq!(st, 200);
    assert_eq!(
        joined(&frames, |v| delta_of(v, "response.reasoning_text.delta")),
        want
    );
    let text = joined(&frames, |v| delta_of(v, "response.output_text.delta"));
    assert_eq!(text, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_after_the_close_tag_is_content_streamed_and_not() {
    // A grammar makes the model close the block the prompt opened, then answer.
    let s = thinking_server();
    let mut body = chat(
        json!({"grammar": "root ::= \"so: 4\" \"</think>\" \"\\n\\n\" \"Four.\"",
                           "max_tokens": 40}),
    );
    // The grammar ends with the end-of-generation token, which the bias would rule out.
    body.as_object_mut().expect("object").remove("logit_bias");
    let (st, v) = post(&s.base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(
        (&m["reasoning_content"], &m["content"]),
        (&json!("so: 4"), &json!("Four.")),
        "{v}"
    );
    let mut sb = body;
    sb["stream"] = json!(true);
    let (st, frames) = post_stream(&s.base, "/v1/chat/completions", sb).await;
    assert_eq!(st, 200);
    let delta = |k: &'static str| joined(&frames, move |v| v["choices"][0]["delta"][k].as_str());
    assert_eq!(
        (delta("reasoning_content"), delta("content")),
        ("so: 4".into(), "Four.".into())
    );
}

/// `serve --reasoning-format none`, llama-server's flag: OpenAI chat answers leave the
/// reasoning in the text unless the request asks for a split itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_s_reasoning_format_is_the_default_of_requests_without_one() {
    let s = tiny_server_with_template_and("tiny-think", TEMPLATE, |c| c.reasoning_split = false);
    let b = &s.base;
    let (st, v) = post(b, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert!(m.get("reasoning_content").is_none(), "{v}");
    let text = m["content"].as_str().unwrap().to_string();
    assert!(!text.trim().is_empty(), "{v}");
    let (_, v) = post(
        b,
        "/v1/chat/completions",
        chat(json!({"reasoning_format": "deepseek"})),
    )
    .await;
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], text, "{v}");
}

/// `serve --reasoning-budget 0`, llama-server's: a chat that does not switch thinking is
/// rendered with `enable_thinking` false (no reasoning); a request that switches it on
/// still thinks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_reasoning_budget_turns_thinking_off_unless_the_request_turns_it_on() {
    let s = tiny_server_with_template_and("tiny-think", TEMPLATE, |c| c.thinking = false);
    let b = &s.base;
    let (st, v) = post(b, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert!(m.get("reasoning_content").is_none(), "{v}");
    assert!(!m["content"].as_str().unwrap().trim().is_empty(), "{v}");
    let (_, v) = post(
        b,
        "/v1/chat/completions",
        chat(json!({"chat_template_kwargs": {"enable_thinking": true}})),
    )
    .await;
    let m = &v["choices"][0]["message"];
    assert!(
        !m["reasoning_content"].as_str().unwrap_or("").is_empty(),
        "{v}"
    );
}
