//! State checkpoints over HTTP: a tiny Qwen3.5 (a hybrid recurrent model) whose chat
//! template renders an earlier answer without its text, as templates that drop earlier
//! reasoning do. The second chat turn departs from what the slot ran right where the
//! first answer began, so the slot goes on from the checkpoint at the end of the first
//! prompt and reports those tokens as cached; with `--ctx-checkpoints 0` it prefills
//! everything again. Both answers are the same.

use crate::common;

use common::*;
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model_with_template, TinySpec};
use serde_json::{json, Value};

const TEMPLATE: &str = "{%- for message in messages %}\
{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n<|im_end|>\\n' }}\
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\
{%- endif %}{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

fn server(checkpoints: usize) -> TestServer {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("tiny-qwen35.gguf");
    write_tiny_model_with_template(&path, &TinySpec::qwen35(GgmlType::F32, 1), TEMPLATE)
        .expect("writing the tiny model");
    let mut c = tiny_config(&path, 1);
    c.ctx_checkpoints = checkpoints;
    let running = minfer_server::start(c).expect("starting the server");
    TestServer {
        base: format!("http://{}", running.addr()),
        running,
        _dir: Some(dir),
    }
}

/// Bytes of one copy of the tiny Qwen3.5's recurrent state: per Gated DeltaNet layer
/// its conv window and its delta-rule matrices, f32.
fn state_bytes() -> usize {
    let spec = TinySpec::qwen35(GgmlType::F32, 1);
    let ssm = spec.ssm.expect("a hybrid model");
    let layers = (0..spec.n_layer).filter(|&l| ssm.recurrent(l)).count();
    layers * 4 * ((ssm.d_conv - 1) * ssm.channels() + ssm.h_v * ssm.s * ssm.s)
}

fn chat(messages: Value) -> Value {
    json!({"messages": messages, "temperature": 0, "max_tokens": 5})
}

/// Two turns; returns (turn 1's prompt tokens, turn 2's cached tokens, both answers).
async fn two_turns(base: &str) -> (u64, u64, [String; 2]) {
    let first = json!([{"role": "user", "content": "hello there"}]);
    let (st, one) = post(base, "/v1/chat/completions", chat(first)).await;
    assert_eq!(st, 200, "{one}");
    assert_eq!(one["choices"][0]["finish_reason"], "length", "{one}");
    let answer = one["choices"][0]["message"]["content"]
        .as_str()
        .expect("answer")
        .to_string();
    let second = json!([
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "and again"},
    ]);
    let (st, two) = post(base, "/v1/chat/completions", chat(second)).await;
    assert_eq!(st, 200, "{two}");
    let n1 = one["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt tokens");
    let cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached tokens");
    let text = two["choices"][0]["message"]["content"]
        .as_str()
        .expect("answer")
        .to_string();
    (n1, cached, [answer, text])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_chat_turn_goes_on_from_the_first_prompts_checkpoint() {
    let on = server(8);
    let (n1, cached, with) = two_turns(&on.base).await;
    assert!(n1 > 0);
    assert_eq!(
        cached, n1,
        "the second turn goes on from the first prompt's end"
    );
    // The metrics say so, and what the checkpoints hold: turn 1's two marks and turn
    // 2's two, each one copy of the slot's state.
    let (st, m) = get(&on.base, "/metrics").await;
    assert_eq!(st, 200, "{m}");
    assert!(
        m.contains("\nminfer_ctx_checkpoint_restores_total 1\n"),
        "{m}"
    );
    let held = format!("\nminfer_ctx_checkpoint_bytes {}\n", 4 * state_bytes());
    assert!(m.contains(&held), "{m}");
    on.stop().expect("stop");
    let off = server(0);
    let (_, cached, without) = two_turns(&off.base).await;
    assert_eq!(cached, 0, "without checkpoints everything runs again");
    assert_eq!(
        with, without,
        "the answers do not depend on the checkpoints"
    );
    off.stop().expect("stop");
}
