//! The default model's chat template against transformers' Jinja2 rendering.

mod common;

use common::tokenizer;
use minfer_tokenizer::{ChatMessage, ChatTemplate};

#[test]
fn default_model_template_matches_reference_rendering() {
    let tok = tokenizer();
    let tmpl = ChatTemplate::from_tokenizer(tok).expect("template compiles");
    assert!(!tmpl.is_fallback());
    let messages: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("golden/qwen2_chat.json")).expect("messages JSON");
    let messages: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(messages.len(), 4);
    let got = tmpl.render(&messages, true).expect("renders");
    assert_eq!(got, include_str!("golden/qwen2_chat.txt"));
    let as_json = serde_json::to_value(&messages).unwrap();
    assert_eq!(tmpl.render_json(&as_json, None, true).unwrap(), got);
}

#[test]
fn default_model_template_renders_tools() {
    let tok = tokenizer();
    let tmpl = ChatTemplate::from_tokenizer(tok).unwrap();
    let tools = serde_json::json!([{"type": "function", "function": {"name": "now"}}]);
    let msgs = serde_json::json!([{"role": "user", "content": "time?"}]);
    let out = tmpl.render_json(&msgs, Some(&tools), true).unwrap();
    assert!(out.contains("# Tools"), "{out}");
    assert!(
        out.contains(r#"{"function": {"name": "now"}, "type": "function"}"#),
        "{out}"
    );
    assert!(out.ends_with("<|im_start|>assistant\n"));
}
