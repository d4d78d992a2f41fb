//! gpt-oss's harmony answers on the chat routes, against a tiny model whose chat template
//! leaves the prompt at `<|start|>assistant`, as gpt-oss's does. A grammar makes the tiny
//! model write a harmony turn (its vocabulary spells the markers byte by byte, where
//! gpt-oss's has them as tokens that render as text): the analysis message must come back
//! as reasoning and the final one as the answer, whole and streamed, and unsplit with
//! `reasoning_format: none` (the other chat codecs take the same split through
//! `answer::AnswerSplitter`; only the OpenAI route takes a GBNF grammar to force it).

use crate::common;

use common::*;
use serde_json::{json, Value};

const TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' }}\
{%- endfor %}{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}";

const GRAMMAR: &str = "root ::= \"<|channel|>analysis<|message|>\" [a-z]{4} \
\"<|end|><|start|>assistant<|channel|>final<|message|>\" [a-z]{3}";

fn harmony_server() -> TestServer {
    tiny_server_with_template("tiny-harmony", TEMPLATE)
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0,
                       "max_tokens": 96, "grammar": GRAMMAR});
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

fn lower(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_lowercase())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harmony_channels_become_reasoning_and_answer() {
    let s = harmony_server();
    let b = &s.base;
    let (st, raw) = post(
        b,
        "/v1/chat/completions",
        chat(json!({"reasoning_format": "none"})),
    )
    .await;
    assert_eq!(st, 200, "{raw}");
    let text = raw["choices"][0]["message"]["content"].as_str().unwrap();
    let (analysis, fin) = text
        .strip_prefix("<|channel|>analysis<|message|>")
        .and_then(|t| t.split_once("<|end|><|start|>assistant<|channel|>final<|message|>"))
        .unwrap_or_else(|| panic!("not a harmony turn: {raw}"));
    assert!(lower(analysis, 4) && lower(fin, 3), "{raw}");

    let (st, v) = post(b, "/v1/chat/completions", chat(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(
        (&m["reasoning_content"], &m["content"]),
        (&json!(analysis), &json!(fin)),
        "{v}"
    );

    let (st, frames) = post_stream(b, "/v1/chat/completions", chat(json!({"stream": true}))).await;
    assert_eq!(st, 200);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for f in frames.iter().filter(|f| *f != "[DONE]") {
        let v: Value = serde_json::from_str(f).unwrap();
        let d = &v["choices"][0]["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
    }
    assert_eq!((reasoning.as_str(), content.as_str()), (analysis, fin));
}
