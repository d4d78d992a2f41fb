//! The default model's tokenizer against golden vectors from an independent implementation
//! (scripts/gen_tokenizer_golden.py), plus byte-exact round trips.

mod common;

use common::tokenizer;

struct Case {
    text: String,
    special: bool,
    ids: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let src = include_str!("golden/qwen2_encode.jsonl");
    src.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).expect("golden line is JSON");
            Case {
                text: v["text"].as_str().expect("text").to_string(),
                special: v["special"].as_bool().expect("special"),
                ids: v["ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|x| x.as_u64().expect("id") as u32)
                    .collect(),
            }
        })
        .collect()
}

#[test]
fn golden_vectors_match_exactly() {
    let tok = tokenizer();
    let cases = cases();
    assert!(cases.len() >= 300, "only {} golden cases", cases.len());
    assert!(cases.iter().any(|c| c.special) && cases.iter().any(|c| !c.special));
    let mut failures = Vec::new();
    for c in &cases {
        let got = tok.encode(&c.text, false, c.special);
        if got != c.ids {
            failures.push(format!(
                "{:?} (special={}): expected {:?}, got {:?}",
                c.text, c.special, c.ids, got
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} golden cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

#[test]
fn golden_strings_round_trip() {
    let tok = tokenizer();
    for c in cases() {
        let ids = tok.encode(&c.text, false, c.special);
        // With parse_special the control tokens must be rendered to get the text back.
        let back = tok.decode_bytes(&ids, c.special).expect("ids in range");
        assert_eq!(back, c.text.as_bytes(), "round trip of {:?}", c.text);
    }
}

#[test]
fn special_flag_changes_control_tokens_only() {
    let tok = tokenizer();
    let im_start = tok.token_id("<|im_start|>").expect("<|im_start|>");
    let with = tok.encode("<|im_start|>user", false, true);
    assert_eq!(with[0], im_start);
    let without = tok.encode("<|im_start|>user", false, false);
    assert!(!without.contains(&im_start), "{without:?}");
    // USER_DEFINED tokens are matched even without parse_special.
    let call = tok.token_id("<tool_call>").expect("<tool_call>");
    assert_eq!(tok.encode("<tool_call>", false, false), vec![call]);
    // Hidden unless asked for; user-defined text is always shown.
    assert_eq!(tok.decode(&with, false).unwrap(), "user");
    assert_eq!(tok.decode(&with, true).unwrap(), "<|im_start|>user");
    assert_eq!(tok.decode(&[call], false).unwrap(), "<tool_call>");
}

#[test]
fn special_ids_and_end_of_generation() {
    let tok = tokenizer();
    assert_eq!(tok.n_vocab(), 151_936);
    assert_eq!(tok.pre_tokenizer(), "qwen2");
    assert_eq!(tok.eos(), Some(151_645));
    assert_eq!(tok.bos(), Some(151_643));
    assert!(!tok.add_bos(), "Qwen2.5 sets add_bos_token = false");
    assert_eq!(
        tok.encode("hi", true, false),
        tok.encode("hi", false, false)
    );
    assert_eq!(tok.eot(), Some(151_645), "<|im_end|> found by text");
    // <|endoftext|>, <|im_end|>, <|fim_pad|>, <|repo_name|>, <|file_sep|>
    assert_eq!(
        tok.eog_ids(),
        &[151_643, 151_645, 151_662, 151_663, 151_664]
    );
    assert!(tok.is_eog(151_645) && tok.is_eog(151_643));
    assert!(!tok.is_eog(151_644), "<|im_start|> does not end generation");
    assert!(tok.decode_bytes(&[151_936], false).is_err());
}
