use super::*;
use crate::api::fields::parse_object;
use serde_json::json;

fn obj(v: Value) -> Object {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

#[test]
fn wrong_types_name_the_field() {
    let e = parse_chat(&obj(json!({"messages": [{"role":"user","content":"x"}],
        "temperature": "hot"})))
    .unwrap_err();
    assert!(e.message.contains("`temperature`"), "{}", e.message);
    let e = parse_completion(&obj(json!({"prompt": 3}))).unwrap_err();
    assert!(e.message.contains("`prompt`"), "{}", e.message);
    let e = parse_chat(&obj(json!({"messages": [{"role":"robot","content":"x"}]}))).unwrap_err();
    assert!(e.message.contains("messages[0].role"), "{}", e.message);
    let e = parse_completion(&obj(json!({"prompt": "a", "stop": 5}))).unwrap_err();
    assert!(e.message.contains("`stop`"), "{}", e.message);
    let e = parse_completion(&obj(json!({"prompt": "a", "top_p": 7.0}))).unwrap_err();
    assert!(e.message.contains("`top_p`"), "{}", e.message);
}

#[test]
fn defaults_are_llama_server_s_and_fields_apply() {
    let (p, g) = parse_completion(&obj(json!({"prompt": [1, 2, 3]}))).unwrap();
    assert_eq!(p, [Prompt::Tokens(vec![1, 2, 3])]);
    assert_eq!(g.sampling.temperature, 0.8);
    assert_eq!(g.sampling.top_k, 40);
    assert_eq!(g.max_tokens, None);
    assert!(!g.stream);
    assert!(g.cache_prompt);
    let (_, g) = parse_completion(&obj(json!({"prompt": "x", "cache_prompt": false}))).unwrap();
    assert!(!g.cache_prompt);
    let (m, g) = parse_chat(&obj(json!({
        "messages": [{"role":"system","content":"s"},
                     {"role":"user","content":[{"type":"text","text":"hi"}]}],
        "max_tokens": 5, "max_completion_tokens": 7, "stop": ["a","b"], "seed": -1,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
        "logprobs": true, "top_logprobs": 3})))
    .unwrap();
    assert_eq!(m[1], ChatMessage::new("user", "hi"));
    assert_eq!(g.max_tokens, Some(7));
    assert_eq!(g.stop, vec!["a", "b"]);
    assert_eq!(g.sampling.seed, u64::MAX);
    assert!(g.stream && g.include_usage);
    assert_eq!(g.logprobs, Some(3));
    // Text parts are joined with a newline, as llama-server renders them.
    let (m, _) = parse_chat(&obj(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]})))
    .unwrap();
    assert_eq!(m[0], ChatMessage::new("user", "first\nsecond"));
}

#[test]
fn several_choices_and_several_prompts_are_read() {
    let (_, g) = parse_chat(&obj(
        json!({"messages": [{"role":"user","content":"x"}], "n": 2}),
    ))
    .unwrap();
    assert_eq!(g.n, 2);
    let (_, g) = parse_completion(&obj(json!({"prompt": "a", "n": 3, "best_of": 3}))).unwrap();
    assert_eq!(g.n, 3);
    // OpenAI's batch: strings, token arrays, or both.
    let (p, _) = parse_completion(&obj(json!({"prompt": ["a", [5, 6], "b"]}))).unwrap();
    assert_eq!(
        p,
        [
            Prompt::Text("a".into()),
            Prompt::Tokens(vec![5, 6]),
            Prompt::Text("b".into())
        ]
    );
    let (p, _) = parse_completion(&obj(json!({"prompt": [[7]]}))).unwrap();
    assert_eq!(p, [Prompt::Tokens(vec![7])]);
    for (bad, at) in [
        (json!(["a", 3]), "prompt[1]"),
        (json!([["x"]]), "prompt[0]"),
        (json!(vec!["a"; 65]), "prompt"),
        (json!({"a": 1}), "prompt"),
    ] {
        let e = parse_completion(&obj(json!({ "prompt": bad }))).unwrap_err();
        assert!(e.message.contains(at), "{at}: {}", e.message);
    }
    assert!(parse_object(b"{not json")
        .unwrap_err()
        .message
        .contains("invalid JSON"));
}

fn chat(extra: Value) -> Object {
    let mut o = obj(json!({"messages": [{"role": "user", "content": "x"}]}));
    o.extend(obj(extra));
    o
}

#[test]
fn numbers_outside_their_range_name_the_field_and_the_range() {
    for (field, range, extra) in [
        ("temperature", "[0, 100]", json!({"temperature": 300})),
        (
            "temperature",
            "a 32-bit float",
            json!({"temperature": 1e300}),
        ),
        ("temperature", "a number", json!({"temperature": "hot"})),
        (
            "presence_penalty",
            "[-2, 2]",
            json!({"presence_penalty": 1e30}),
        ),
        (
            "frequency_penalty",
            "[-2, 2]",
            json!({"frequency_penalty": -5}),
        ),
        (
            "repeat_penalty",
            "[0.01, 10]",
            json!({"repeat_penalty": 1e-30}),
        ),
        ("min_p", "[0, 1]", json!({"min_p": 2})),
        ("top_p", "(0, 1]", json!({"top_p": 0})),
        ("top_k", "positive integer", json!({"top_k": -5})),
        ("top_k", "integer", json!({"top_k": 1.5})),
        (
            "top_logprobs",
            "[0, 20]",
            json!({"logprobs": true, "top_logprobs": 21}),
        ),
        (
            "max_completion_tokens",
            ">= 1",
            json!({"max_completion_tokens": 0}),
        ),
        ("max_tokens", ">= 1", json!({"max_tokens": -3})),
        (
            "n_predict",
            "-1 or an integer >= 1",
            json!({"n_predict": -2}),
        ),
        ("seed", "integer", json!({"seed": 1.5})),
        ("seed", "integer", json!({"seed": 1e20})),
        ("stop", "at most 4", json!({"stop": vec!["s"; 5]})),
        ("stop[1]", "1 to 256 bytes", json!({"stop": ["a", ""]})),
        (
            "stop[0]",
            "1 to 256 bytes",
            json!({"stop": "x".repeat(300)}),
        ),
        (
            "logit_bias.5",
            "[-100, 100]",
            json!({"logit_bias": {"5": 200}}),
        ),
        (
            "logit_bias.5",
            "a number",
            json!({"logit_bias": {"5": "ban"}}),
        ),
        ("logit_bias", "token ids", json!({"logit_bias": {"-5": 1}})),
        (
            "logit_bias",
            "token ids",
            json!({"logit_bias": {"99999999999": 1}}),
        ),
        ("logit_bias", "an object", json!({"logit_bias": [[5, 1]]})),
        ("n", "[1, 128]", json!({"n": 0})),
        ("n", "[1, 128]", json!({"n": 129})),
        ("n", "[1, 128]", json!({"n": 1.5})),
    ] {
        let e = parse_chat(&chat(extra.clone())).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(
            e.message.contains(&format!("`{field}`")) && e.message.contains(range),
            "{extra}: {}",
            e.message
        );
    }
    let e = parse_completion(&obj(json!({"prompt": "a", "logprobs": 21}))).unwrap_err();
    assert!(e.message.contains("`logprobs`") && e.message.contains("[0, 20]"));
    let e = parse_completion(&obj(json!({"prompt": "a", "best_of": 2}))).unwrap_err();
    assert!(e.message.contains("`best_of`"), "{}", e.message);
}

#[test]
fn message_roles_and_order_are_checked_by_name() {
    let msgs = |m: Value| obj(json!({ "messages": m }));
    for (want, m) in [
        (
            "expected system, developer, user, assistant or tool",
            json!([{"role": "function", "content": "x"}]),
        ),
        (
            "no preceding assistant message has a tool call with that id",
            json!([{"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]),
        ),
        (
            "`messages[1].tool_call_id` is required",
            json!([{"role": "user", "content": "x"}, {"role": "tool", "content": "42"}]),
        ),
        (
            "belongs only on `tool` messages",
            json!([{"role": "user", "content": "x", "tool_call_id": "c"}]),
        ),
        (
            "`messages[0].content` is required",
            json!([{"role": "user"}]),
        ),
        (
            "`messages[0].content` must be a string or text parts",
            json!([{"role": "user", "content": 5}]),
        ),
        ("`messages` must be a non-empty array", json!([])),
        (
            "`messages[0].reasoning_content` belongs only on assistant messages",
            json!([{"role": "user", "content": "x", "reasoning_content": "r"}]),
        ),
    ] {
        let e = parse_chat(&msgs(m.clone())).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains(want), "{m}: {}", e.message);
    }
    // OpenAI accepts consecutive turns of one role; the templates render them.
    let (m, _) = parse_chat(&msgs(json!([{"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"}, {"role": "assistant", "content": "c"}])))
    .unwrap();
    assert_eq!(m.len(), 3);
    // An assistant turn's reasoning, as this server returned it, reaches the template.
    let (m, _) = parse_chat(&msgs(json!([{"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "because"}])))
    .unwrap();
    assert_eq!(m[1].reasoning_content.as_deref(), Some("because"));
}

#[test]
fn limits_inside_the_ranges_are_accepted() {
    let (_, g) = parse_chat(&chat(json!({
        "temperature": 100, "presence_penalty": -2, "frequency_penalty": 2,
        "repeat_penalty": 0.01, "min_p": 1, "top_p": 1, "top_k": -1,
        "seed": u64::MAX, "stop": vec!["x".repeat(256); 4], "n": 128,
        "max_tokens": u64::MAX,
        "logit_bias": {"5": -100, "7": 100, "0": 0.5},
    })))
    .unwrap();
    assert_eq!(g.sampling.top_k, 0);
    assert_eq!(g.sampling.seed, u64::MAX);
    // Past any context, but refused only against the slot (openai::generate).
    assert_eq!(g.max_tokens, Some(usize::MAX));
    let mut bias = g.sampling.logit_bias.clone();
    bias.sort_by_key(|b| b.0);
    assert_eq!(bias, vec![(0, 0.5), (5, -100.0), (7, 100.0)]);
    // n_predict is llama-server's max_tokens; -1 fills the context.
    let (_, g) = parse_completion(&obj(json!({"prompt": "a", "n_predict": 9}))).unwrap();
    assert_eq!(g.max_tokens, Some(9));
    let (_, g) = parse_completion(&obj(json!({"prompt": "a", "n_predict": -1}))).unwrap();
    assert_eq!(g.max_tokens, None);
    let (_, g) = parse_completion(&obj(json!({"prompt": "a", "max_tokens": 3,
        "n_predict": 9})))
    .unwrap();
    assert_eq!(g.max_tokens, Some(3));
}

#[test]
fn fields_without_an_effect_here_are_refused_by_name() {
    for (field, extra) in [
        ("temprature", json!({"temprature": 0.5})),
        ("tools", json!({"tools": "f"})),
        ("tool_choice", json!({"tool_choice": "required"})),
        (
            "response_format.type",
            json!({"response_format": {"type": "xml"}}),
        ),
        (
            "response_format.schema",
            json!({"response_format": {"type": "json_object", "schema": 1}}),
        ),
        (
            "response_format.schema",
            json!({"response_format": {"type": "json_schema", "schema": {},
                "json_schema": {"name": "a"}}}),
        ),
        (
            "response_format.json_schema.strictly",
            json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "a", "strictly": true}}}),
        ),
        ("functions", json!({"functions": [{"name": "f"}]})),
        (
            "stream_options",
            json!({"stream_options": {"include_usage": true}}),
        ),
        (
            "stream_options.include_obfuscation",
            json!({"stream": true, "stream_options": {"include_obfuscation": 1}}),
        ),
        ("verbosity", json!({"verbosity": "loud"})),
        ("service_tier", json!({"service_tier": 3})),
        ("top_logprobs", json!({"top_logprobs": 2})),
        ("cache_prompt", json!({"cache_prompt": "no"})),
        ("mirostat", json!({"mirostat": 2})),
        ("echo", json!({"echo": true})),
    ] {
        let e = parse_chat(&chat(extra.clone())).unwrap_err();
        assert!(
            e.message.contains(&format!("`{field}`")),
            "{extra}: {}",
            e.message
        );
    }
    // A message's `name` (LangChain's named messages) reaches the template.
    let (msgs, _) = parse_chat(&obj(json!({"messages": [
        {"role": "user", "content": "x", "name": "bob"}]})))
    .unwrap();
    assert_eq!(msgs[0].name.as_deref(), Some("bob"));
    let e = parse_chat(&obj(json!({"messages": [
        {"role": "user", "content": "x", "name": 7}]})))
    .unwrap_err();
    assert!(e.message.contains("`messages[0].name`"), "{}", e.message);
    // OpenAI's service hints that current clients send are taken without effect.
    parse_chat(&chat(
        json!({"service_tier": "auto", "prompt_cache_key": "k",
        "safety_identifier": "u", "verbosity": "low", "stream": true,
        "stream_options": {"include_usage": true, "include_obfuscation": false}}),
    ))
    .unwrap();
    for (field, extra) in [
        ("echo", json!({"echo": true})),
        ("suffix", json!({"suffix": "}"})),
        ("messages", json!({"messages": []})),
    ] {
        let mut o = obj(json!({"prompt": "a"}));
        o.extend(obj(extra.clone()));
        let e = parse_completion(&o).unwrap_err();
        assert!(
            e.message.contains(&format!("`{field}`")),
            "{extra}: {}",
            e.message
        );
    }
}

#[test]
fn metadata_fields_and_neutral_values_are_accepted() {
    let (_, g) = parse_chat(&chat(json!({
        "model": "gpt-4o", "user": "u-1", "metadata": {"k": "v"}, "store": false,
        "tools": [], "tool_choice": "none", "parallel_tool_calls": false,
        "response_format": {"type": "text"}, "cache_prompt": true,
        "no_such_field": null,
    })))
    .unwrap();
    assert_eq!(g.sampling.temperature, 0.8);
    assert_eq!(g.model.as_deref(), Some("gpt-4o"));
    assert!(
        parse_completion(&obj(json!({"prompt": "a", "echo": false, "suffix": "",
        "best_of": 1, "n": 1})))
        .is_ok()
    );
    for (field, extra) in [
        ("model", json!({"model": 5})),
        ("metadata", json!({"metadata": "x"})),
        ("store", json!({"store": "yes"})),
    ] {
        let e = parse_chat(&chat(extra)).unwrap_err();
        assert!(e.message.contains(&format!("`{field}`")), "{}", e.message);
    }
}

/// llama-server's `schema` beside `json_object` constrains to that schema, objects
/// closed as llama-server's grammar reads them.
#[test]
fn a_json_object_format_with_a_schema_is_that_schema() {
    let (_, g) = parse_chat(&chat(json!({"response_format": {"type": "json_object",
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}})))
    .unwrap();
    let Some((minfer_runtime::Grammar::JsonSchema(s), "response_format")) = &g.grammar else {
        panic!("{:?}", g.grammar);
    };
    assert_eq!(s["properties"]["a"]["type"], "integer");
    assert_eq!(s["additionalProperties"], false);
    let (_, g) = parse_chat(&chat(json!({"response_format": {"type": "json_object"}}))).unwrap();
    assert!(matches!(
        g.grammar,
        Some((minfer_runtime::Grammar::JsonObject, _))
    ));
}
