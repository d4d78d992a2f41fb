use super::fim::*;
use super::request::*;
use super::response::*;
use crate::api::fields::Object;
use crate::job::{Finish, Summary};
use minfer_gguf::GgufFile;
use minfer_runtime::LOGIT_BIAS_BAN;
use minfer_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

fn obj(v: Value) -> Object {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

const FIM: Fim = Fim {
    pre: 900,
    suf: 901,
    mid: 902,
    rep: Some(903),
    sep: Some(904),
};

/// One token per byte, offset so that ids never collide with the FIM tokens.
fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(|b| 1000 + b as u32).collect()
}

#[test]
fn infill_tokens_are_laid_out_as_llama_server_lays_them() {
    let extra = [
        ExtraChunk {
            filename: "a.py".into(),
            text: "x=1".into(),
        },
        ExtraChunk {
            filename: "b.py".into(),
            text: "y".into(),
        },
    ];
    let got = infill_layout(
        &FIM,
        bytes,
        None,
        bytes("def f():"),
        bytes("return"),
        &extra,
        &bytes("  "),
        2048,
        usize::MAX,
    );
    let mut want = vec![903];
    want.extend(bytes("myproject\n"));
    want.push(904);
    want.extend(bytes("a.py\n"));
    want.extend(bytes("x=1"));
    want.push(904);
    want.extend(bytes("b.py\n"));
    want.extend(bytes("y"));
    want.push(904);
    want.extend(bytes("filename\n"));
    want.push(900);
    want.extend(bytes("def f():"));
    // `prompt` follows the prefix, before the suffix token (llama-server's code).
    want.extend(bytes("  "));
    want.push(901);
    want.extend(bytes("return"));
    want.push(902);
    assert_eq!(got, want);
}

#[test]
fn infill_without_repo_tokens_joins_snippets_and_bos_precedes_the_prefix() {
    let fim = Fim {
        rep: None,
        sep: None,
        ..FIM
    };
    let extra = [ExtraChunk {
        filename: "ignored".into(),
        text: "ctx".into(),
    }];
    let got = infill_layout(
        &fim,
        bytes,
        Some(1),
        bytes("p"),
        bytes("s"),
        &extra,
        &[],
        2048,
        1000,
    );
    let mut want = bytes("\n\n--- snippet ---\n\n");
    want.extend(bytes("ctx"));
    want.extend([1, 900]);
    want.extend(bytes("p"));
    want.push(901);
    want.extend(bytes("s"));
    want.push(902);
    assert_eq!(got, want);
}

#[test]
fn infill_keeps_the_end_of_the_prefix_and_the_start_of_the_suffix() {
    let prefix: Vec<u32> = (0..100).collect();
    let suffix: Vec<u32> = (200..300).collect();
    // batch 40: prefix keeps 30, suffix 10 - (2 + 1 prompt token) = 7.
    let got = infill_layout(&FIM, bytes, None, prefix, suffix, &[], &[500], 40, 0);
    let mut want = vec![900];
    want.extend(70..100);
    want.push(500);
    want.push(901);
    want.extend(200..207);
    want.push(902);
    // With no room for extra context, even the repo header is dropped.
    assert_eq!(got, want);
}

#[test]
fn stop_types_follow_llama_server() {
    let mut s = Summary {
        choice: 0,
        finish: Finish::Stop,
        prompt_tokens: 5,
        cached_tokens: 2,
        completion_tokens: 3,
        prompt_time: std::time::Duration::from_millis(30),
        predicted_time: std::time::Duration::from_millis(60),
        stop_word: None,
    };
    let stops = vec!["a".to_string(), "END".to_string()];
    assert_eq!(stop_type(&s, &stops), ("eos", String::new()));
    s.stop_word = Some(1);
    assert_eq!(stop_type(&s, &stops), ("word", "END".to_string()));
    s.finish = Finish::Length;
    assert_eq!(stop_type(&s, &stops).0, "limit");
    let t = crate::api::timings::of_summary(&s);
    assert_eq!(t["cache_n"], 2);
    assert_eq!(t["prompt_n"], 3);
    assert_eq!(t["prompt_ms"], 30.0);
    assert_eq!(t["prompt_per_token_ms"], 10.0);
    // Three tokens: two decode steps after the first, in 60 ms.
    assert_eq!(t["predicted_per_second"], 2000.0 / 60.0);
    assert_eq!(t["predicted_per_token_ms"], 30.0);
    s.completion_tokens = 0;
    s.predicted_time = std::time::Duration::ZERO;
    assert_eq!(
        crate::api::timings::of_summary(&s)["predicted_per_second"],
        0.0
    );
}

/// The tiny model's tokenizer (byte-level vocabulary with three control tokens).
pub(crate) fn tiny_tokenizer() -> Tokenizer {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("tiny.gguf");
    let spec = minfer_models::testing::TinySpec::qwen2(minfer_gguf::GgmlType::Q8_0, 7);
    minfer_models::testing::write_tiny_model(&path, &spec).expect("tiny model");
    let file = GgufFile::open(&path).expect("opens");
    Tokenizer::from_gguf(&file).expect("tokenizer")
}

#[test]
fn options_take_llama_server_s_names_and_special_values() {
    let tok = tiny_tokenizer();
    let o = parse_options(
        &obj(
            json!({"temperature": -1, "top_k": -1, "seed": -1, "repeat_last_n": -1,
            "max_tokens": 9, "stream": true, "id_slot": -1, "cache_prompt": false}),
        ),
        &tok,
    )
    .unwrap();
    assert_eq!(o.g.sampling.temperature, 0.0);
    assert_eq!(o.g.sampling.top_k, 0);
    assert_eq!(o.g.sampling.penalty_last_n, 65536);
    assert_eq!(o.g.max_tokens, Some(9));
    assert_eq!(o.g.slot, None);
    assert!(!o.g.cache_prompt);
    // A stream reports token ids, which come with the log-probabilities.
    assert_eq!(o.g.logprobs, Some(0));
    let o = parse_options(
        &obj(json!({"n_predict": -1, "seed": 7, "id_slot": 2})),
        &tok,
    )
    .unwrap();
    assert_eq!(
        (o.g.max_tokens, o.g.sampling.seed, o.g.slot),
        (None, 7, Some(2))
    );
    assert_eq!(o.g.logprobs, None);
    // Defaults are llama-server's.
    let d = parse_options(&Map::new(), &tok).unwrap();
    assert_eq!(d.g.sampling.temperature, 0.8);
    assert_eq!(d.g.sampling.top_p, 0.95);
    assert!(d.g.cache_prompt);
}

#[test]
fn logit_bias_takes_arrays_objects_texts_and_false() {
    let tok = tiny_tokenizer();
    let ab = tok.encode("ab", false, false);
    assert!(!ab.is_empty());
    let o = parse_options(
        &obj(json!({"logit_bias": [[5, 1.5], [7, false], ["ab", -2], [5, 3]]})),
        &tok,
    )
    .unwrap();
    // Applied in order: the last bias of a token wins.
    let mut want = std::collections::BTreeMap::new();
    want.insert(5, 1.5);
    want.insert(7, LOGIT_BIAS_BAN);
    for &t in &ab {
        want.insert(t, -2.0);
    }
    want.insert(5, 3.0);
    let mut got = o.g.sampling.logit_bias.clone();
    got.sort_by_key(|b| b.0);
    assert_eq!(got, want.into_iter().collect::<Vec<_>>());
    let o = parse_options(&obj(json!({"logit_bias": {"5": 2, "ab": false}})), &tok).unwrap();
    assert!(o.g.sampling.logit_bias.contains(&(5, 2.0)));
    assert!(ab
        .iter()
        .all(|t| o.g.sampling.logit_bias.contains(&(*t, LOGIT_BIAS_BAN))));
    // ignore_eos bans every end-of-generation token.
    let o = parse_options(&obj(json!({"ignore_eos": true})), &tok).unwrap();
    for &id in tok.eog_ids() {
        assert!(o.g.sampling.logit_bias.contains(&(id, LOGIT_BIAS_BAN)));
    }
    for (bad, want) in [
        (json!({"logit_bias": [[5]]}), "[token, bias] pairs"),
        (json!({"logit_bias": [[5, 200]]}), "`logit_bias[0]`"),
        (json!({"logit_bias": [[999999, 1]]}), "below"),
        (json!({"logit_bias": 5}), "`logit_bias`"),
    ] {
        let e = parse_options(&obj(bad.clone()), &tok).unwrap_err();
        assert!(e.message.contains(want), "{bad}: {}", e.message);
    }
}

#[test]
fn prompts_are_strings_ids_or_both_mixed() {
    let tok = tiny_tokenizer();
    let hello = tok.encode("hello", true, true);
    assert_eq!(
        prompt_tokens(&json!("hello"), "prompt", &tok).unwrap(),
        hello
    );
    assert_eq!(
        prompt_tokens(&json!(["hello"]), "prompt", &tok).unwrap(),
        hello
    );
    assert_eq!(
        prompt_tokens(&json!([[1, 2]]), "prompt", &tok).unwrap(),
        vec![1, 2]
    );
    let mut want = vec![3];
    want.extend(tok.encode("hi", false, true));
    want.push(4);
    assert_eq!(
        prompt_tokens(&json!([3, "hi", 4]), "prompt", &tok).unwrap(),
        want
    );
    // A batch: each element one prompt of those shapes.
    let batch = prompt_list(&json!(["hello", [1, 2], [3, "hi", 4]]), "prompt", &tok).unwrap();
    assert_eq!(batch, vec![hello.clone(), vec![1, 2], want.clone()]);
    assert_eq!(
        prompt_list(&json!("hello"), "prompt", &tok).unwrap(),
        [hello]
    );
    let e = prompt_list(&json!(["a", true]), "prompt", &tok).unwrap_err();
    assert!(e.message.contains("prompt[1]"), "{}", e.message);
    for (bad, msg) in [
        (json!(["a", "b"]), "several prompts"),
        (json!([[1], [2]]), "several prompts"),
        (json!([1, 100000]), "token 100000"),
        (
            json!({"prompt_string": "a", "multimodal_data": ["x"]}),
            "multimodal",
        ),
        (json!(true), "`prompt`"),
    ] {
        let e = prompt_tokens(&bad, "prompt", &tok).unwrap_err();
        assert!(e.message.contains(msg), "{bad}: {}", e.message);
    }
}

#[test]
fn unsupported_features_are_refused_only_off_their_neutral_value() {
    for (name, bad) in [
        ("mirostat", json!(2)),
        ("typical_p", json!(0.5)),
        ("n_cmpl", json!(2)),
    ] {
        let mut o = Map::new();
        o.insert(name.into(), bad);
        let e = check_unsupported(&o).unwrap_err();
        assert!(e.message.contains(&format!("`{name}`")), "{}", e.message);
    }
    let ok = obj(
        json!({"mirostat": 0, "grammar": "root ::= \"a\"", "typical_p": 1.0,
        "post_sampling_probs": false, "lora": [], "no_such_field": 5}),
    );
    assert!(check_unsupported(&ok).is_ok());
}

#[test]
fn errors_take_llama_server_s_types_and_context_counts() {
    use crate::error::ApiError;
    for (status, want) in [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (415, "invalid_request_error"),
        (500, "server_error"),
        (501, "not_supported_error"),
        (503, "unavailable_error"),
    ] {
        assert_eq!(llama_type(status, false), want, "{status}");
    }
    let b = error_body(&ApiError::context_length_exceeded(256, 300));
    assert_eq!(
        b,
        json!({"error": {
            "code": 400,
            "message": "request (300 tokens) exceeds the available context size (256 tokens), \
                        try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 300,
            "n_ctx": 256,
        }})
    );
    let b = error_body(&ApiError::loading());
    assert_eq!(
        b,
        json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    );
}

#[test]
fn openai_shaped_errors_are_reshaped_on_llama_server_s_paths_only() {
    use super::shape::{is_llama_path, reshaped};
    use crate::error::ApiError;
    for p in [
        "/tokenize",
        "/slots",
        "/slots/0",
        "/rerank",
        "/health",
        "/v1/health",
    ] {
        assert!(is_llama_path(p), "{p}");
    }
    for p in ["/v1/completions", "/v1/rerank", "/api/chat", "/slotsx"] {
        assert!(!is_llama_path(p), "{p}");
    }
    let e = ApiError::new(axum::http::StatusCode::NOT_IMPLEMENTED, "no save path");
    assert_eq!(
        reshaped(501, &e.body()),
        Some(json!({"error": {"code": 501, "message": "no save path",
            "type": "not_supported_error"}}))
    );
    let e = ApiError::context_length_exceeded(10, 12);
    let v = reshaped(400, &e.body()).expect("reshaped");
    assert_eq!(v["error"]["type"], "exceed_context_size_error");
    assert_eq!(
        (
            v["error"]["n_prompt_tokens"].clone(),
            v["error"]["n_ctx"].clone()
        ),
        (json!(12), json!(10))
    );
    // llama-server's own shape, and shapes of other APIs, are left alone.
    assert_eq!(
        reshaped(400, &error_body(&ApiError::bad_request("x"))),
        None
    );
    assert_eq!(reshaped(400, &json!({"error": "x"})), None);
}

fn sampling_of(v: Value) -> Result<minfer_runtime::SamplingParams, crate::error::ApiError> {
    parse_options(&obj(v), &tiny_tokenizer()).map(|o| o.g.sampling)
}

#[test]
fn samplers_switch_off_the_stages_they_leave_out() {
    // llama.vim's list without `infill`: penalties, min-p and temperature go neutral.
    let s = sampling_of(
        json!({"samplers": ["top_k", "top-p"], "top_k": 40, "top_p": 0.9,
        "min_p": 0.2, "temperature": 0.3, "repeat_penalty": 1.3}),
    )
    .expect("accepted");
    assert_eq!(
        (s.top_k, s.top_p, s.min_p, s.temperature),
        (40, 0.9, 0.0, 1.0)
    );
    assert_eq!(s.repeat_penalty, 1.0);
    // The whole chain, as letters, changes nothing.
    let s = sampling_of(json!({"samplers": "ekpmt", "top_k": 7, "temperature": 0.5}))
        .expect("accepted");
    assert_eq!((s.top_k, s.temperature, s.min_p), (7, 0.5, 0.05));
    // Stages this server lacks pass while neutral; unknown names are skipped.
    let s = sampling_of(
        json!({"samplers": ["dry", "typ_p", "xtc", "nonesuch", "temp"],
        "temperature": 0.0}),
    )
    .expect("accepted");
    assert_eq!((s.temperature, s.top_k, s.top_p), (0.0, 0, 1.0));
    // llama.vim's and llama.vscode's chain: `infill` is taken without effect.
    let s = sampling_of(json!({"samplers": ["top_k", "top_p", "infill"], "top_k": 40}))
        .expect("accepted");
    assert_eq!((s.top_k, s.min_p, s.temperature), (40, 0.0, 1.0));
    for (body, want) in [
        (
            json!({"samplers": ["dry"], "dry_multiplier": 0.8}),
            "`dry_multiplier`",
        ),
        (
            json!({"samplers": ["top_n_sigma"], "top_n_sigma": 2}),
            "`top_n_sigma`",
        ),
        (
            json!({"samplers": ["temperature", "top_k"]}),
            "in that order",
        ),
        (json!({"samplers": ["top_k", "top_k"]}), "in that order"),
        (json!({"samplers": [1]}), "`samplers`"),
    ] {
        let e = sampling_of(body.clone()).unwrap_err();
        assert!(e.message.contains(want), "{body}: {}", e.message);
    }
}

#[test]
fn stop_takes_up_to_64_strings_and_skips_empty_ones() {
    let many: Vec<String> = (0..64).map(|i| format!("s{i}")).collect();
    assert_eq!(stop(&obj(json!({"stop": many}))).expect("64").len(), 64);
    let too_many: Vec<String> = (0..65).map(|i| format!("s{i}")).collect();
    assert!(stop(&obj(json!({"stop": too_many})))
        .unwrap_err()
        .message
        .contains("at most 64"));
    assert_eq!(
        stop(&obj(json!({"stop": ["", "x"]}))).expect("ok"),
        vec!["x".to_string()]
    );
    let long = "a".repeat(257);
    assert!(stop(&obj(json!({"stop": ["x", long]})))
        .unwrap_err()
        .message
        .contains("`stop[1]`"));
}

#[test]
fn infill_client_fields_are_read() {
    let tok = tiny_tokenizer();
    let o = parse_options(
        &obj(json!({"n_indent": 4, "t_max_predict_ms": 250,
            "response_fields": ["content", "generation_settings/n_predict"]})),
        &tok,
    )
    .expect("accepted");
    assert_eq!(o.n_indent, 4);
    assert_eq!(o.t_max_predict, Some(std::time::Duration::from_millis(250)));
    assert_eq!(o.response_fields.len(), 2);
    let o = parse_options(&obj(json!({"t_max_predict_ms": -1})), &tok).expect("off");
    assert_eq!(o.t_max_predict, None);
    for bad in [json!({"n_indent": -1}), json!({"t_max_predict_ms": -2})] {
        assert!(parse_options(&obj(bad.clone()), &tok).is_err(), "{bad}");
    }
    // An empty `multimodal_data` carries nothing and is accepted.
    let p = json!({"prompt_string": "hi", "multimodal_data": []});
    assert!(prompt_tokens(&p, "prompt", &tok).is_ok());
    let p = json!({"prompt_string": "hi", "multimodal_data": ["aGk="]});
    assert!(prompt_tokens(&p, "prompt", &tok).is_err());
}

#[test]
fn n_indent_cuts_the_first_shallower_line_as_llama_server_does() {
    let t0 = std::time::Instant::now();
    let mut l = Limits::new(4, None);
    // The first line is never checked; the second is indented enough.
    for c in ["x = 1", "\n", "    y", " = 2\n"] {
        assert_eq!(l.push(c, t0), None, "{c:?}");
    }
    // The third starts with two spaces: cut before its first non-blank character.
    assert_eq!(l.push("  z", t0), Some("x = 1\n    y = 2\n  ".len()));
    let mut l = Limits::new(0, Some(std::time::Duration::from_millis(5)));
    assert_eq!(l.push("a\n", t0), None);
    let later = t0 + std::time::Duration::from_millis(10);
    assert_eq!(l.push("b", later), None, "no newline");
    assert_eq!(l.push("c\n", later), Some("a\nbc\n".len()));
}

#[test]
fn response_fields_pick_nested_values_by_slash_paths() {
    let v = json!({"content": "x", "generation_settings": {"n_predict": 4}, "stop": true});
    let paths = [
        "content",
        "generation_settings/n_predict",
        "missing",
        "content/deeper",
    ]
    .map(String::from);
    assert_eq!(
        select_fields(&v, &paths),
        json!({"content": "x", "generation_settings/n_predict": 4})
    );
}

#[test]
fn truncated_means_the_slot_s_context_ran_out() {
    let s = Summary {
        choice: 0,
        finish: Finish::Length,
        prompt_tokens: 200,
        cached_tokens: 0,
        completion_tokens: 56,
        prompt_time: std::time::Duration::ZERO,
        predicted_time: std::time::Duration::ZERO,
        stop_word: None,
    };
    assert!(truncated(&s, 256));
    assert!(!truncated(&s, 512), "n_predict ended it");
    assert!(!truncated(
        &Summary {
            finish: Finish::Stop,
            ..s
        },
        256
    ));
}
