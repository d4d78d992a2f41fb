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
        ("post_sampling_probs", json!(true)),
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
