//! The Llama family's tokenizers against golden vectors from independent implementations
//! (scripts/gen_llama_tokenizer_golden.py): byte-level BPE with the `llama-bpe` and `smollm`
//! pre-tokenizers (HF `tokenizers`) and a SentencePiece vocabulary (`sentencepiece`); and
//! BERT's WordPiece against llama.cpp's own WPM tokenizer on the tiny BERT's vocabulary
//! (scripts/gen_wpm_tokenizer_golden.py). Each
//! golden file carries its vocabulary; the test writes it into a GGUF file with minfer's
//! writer, reads it back and compares encodings, then checks byte-exact round trips.

use minfer_gguf::{GgufFile, GgufWriter, MetaType, MetaValue};
use minfer_tokenizer::{Tokenizer, TokenizerError};
use serde_json::Value;

struct Golden {
    meta: Vec<(String, MetaValue)>,
    cases: Vec<(String, bool, Vec<u32>)>,
}

fn meta_value(key: &str, v: &Value) -> MetaValue {
    match v {
        Value::String(s) => MetaValue::String(s.clone()),
        Value::Bool(b) => MetaValue::Bool(*b),
        Value::Number(n) => MetaValue::U32(n.as_u64().expect("id") as u32),
        Value::Array(a) if key == "tokenizer.ggml.scores" => MetaValue::Array(
            MetaType::F32,
            a.iter()
                .map(|x| MetaValue::F32(x.as_f64().expect("score") as f32))
                .collect(),
        ),
        Value::Array(a) if a.first().is_some_and(Value::is_string) => MetaValue::Array(
            MetaType::String,
            a.iter()
                .map(|x| MetaValue::String(x.as_str().expect("text").to_string()))
                .collect(),
        ),
        Value::Array(a) => MetaValue::Array(
            MetaType::I32,
            a.iter()
                .map(|x| MetaValue::I32(x.as_i64().expect("type") as i32))
                .collect(),
        ),
        other => panic!("{key}: unexpected {other}"),
    }
}

fn golden(src: &str) -> Golden {
    let v: Value = serde_json::from_str(src).expect("golden JSON");
    let meta = v["gguf"]
        .as_object()
        .expect("gguf")
        .iter()
        .map(|(k, x)| (k.clone(), meta_value(k, x)))
        .collect();
    let cases = v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let ids = c["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect();
            (
                c["text"].as_str().expect("text").to_string(),
                c["special"].as_bool().expect("special"),
                ids,
            )
        })
        .collect();
    Golden { meta, cases }
}

/// The vocabulary written into a GGUF file by minfer's writer and read back, with `edit`
/// applied to the metadata first (`None` drops a key).
fn gguf(g: &Golden, edit: &[(&str, Option<MetaValue>)]) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_meta("general.architecture", MetaValue::String("llama".into()));
    for (k, v) in &g.meta {
        if !edit.iter().any(|(e, _)| e == k) {
            w.add_meta(k, v.clone());
        }
    }
    for (k, v) in edit {
        if let Some(v) = v {
            w.add_meta(k, v.clone());
        }
    }
    GgufFile::from_bytes(w.to_bytes().expect("writer")).expect("reader")
}

fn tokenizer(g: &Golden) -> Tokenizer {
    Tokenizer::from_gguf(&gguf(g, &[])).expect("tokenizer loads")
}

fn check(name: &str, src: &str) {
    let g = golden(src);
    let tok = tokenizer(&g);
    assert!(g.cases.len() >= 300, "{name}: only {} cases", g.cases.len());
    assert!(g.cases.iter().any(|c| c.1) && g.cases.iter().any(|c| !c.1));
    let mut failures = Vec::new();
    for (text, special, ids) in &g.cases {
        let got = tok.encode(text, false, *special);
        if &got != ids {
            failures.push(format!(
                "{text:?} (special={special}): expected {ids:?}, got {got:?}"
            ));
        } else if !special {
            let back = tok.decode_bytes(&got, false).expect("ids in range");
            if back != text.as_bytes() {
                failures.push(format!(
                    "{text:?}: decodes to {:?}",
                    String::from_utf8_lossy(&back)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} golden cases differ:\n{}",
        failures.len(),
        g.cases.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}

#[test]
fn llama3_bpe_matches_hf_tokenizers() {
    check("llama-bpe", include_str!("golden/llama_bpe.json"));
}

#[test]
fn smollm_bpe_matches_hf_tokenizers() {
    check("smollm", include_str!("golden/smollm.json"));
}

#[test]
fn sentencepiece_matches_the_sentencepiece_library() {
    check("llama spm", include_str!("golden/llama_spm.json"));
}

#[test]
fn sentencepiece_bos_space_prefix_and_byte_fallback() {
    let g = golden(include_str!("golden/llama_spm.json"));
    let tok = tokenizer(&g);
    assert_eq!(tok.model_name(), "llama");
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    // BOS is added by default for SentencePiece vocabularies, EOS is not.
    let ids = tok.encode("Hello", true, false);
    assert_eq!(ids[0], 1);
    assert_eq!(&ids[1..], tok.encode("Hello", false, false).as_slice());
    assert!(tok.is_eog(2));
    // A character outside the vocabulary is spelled with its UTF-8 byte tokens.
    let ids = tok.encode("𒀀", false, false);
    let pieces: Vec<&str> = ids.iter().filter_map(|&i| tok.token_text(i)).collect();
    assert!(
        pieces.ends_with(&["<0xF0>", "<0x92>", "<0x80>", "<0x80>"]),
        "{pieces:?}"
    );
    assert_eq!(tok.decode(&ids, false).unwrap(), "𒀀");
    // Streams keep the prefixed space; a whole decode drops it, as llama.cpp does.
    let ids = tok.encode("Hi there", false, false);
    assert_eq!(tok.token_bytes(ids[0], false).unwrap()[0], b' ');
    assert_eq!(tok.decode(&ids, false).unwrap(), "Hi there");
    // Without the space prefix the first word is not marked as one.
    let tok = Tokenizer::from_gguf(&gguf(
        &g,
        &[(
            "tokenizer.ggml.add_space_prefix",
            Some(MetaValue::Bool(false)),
        )],
    ))
    .unwrap();
    let ids = tok.encode("Hi", false, false);
    assert_ne!(tok.token_bytes(ids[0], false).unwrap()[0], b' ');
    assert_eq!(tok.decode(&ids, false).unwrap(), "Hi");
}

#[test]
fn llama_bpe_adds_bos_unless_the_file_says_otherwise() {
    let g = golden(include_str!("golden/llama_bpe.json"));
    let tok = Tokenizer::from_gguf(&gguf(&g, &[("tokenizer.ggml.add_bos_token", None)])).unwrap();
    assert!(tok.add_bos());
    let bos = tok.token_id("<|begin_of_text|>").unwrap();
    assert_eq!(tok.encode("x", true, false)[0], bos);
    assert!(!tokenizer(&g).add_bos());
}

#[test]
fn broken_sentencepiece_vocabularies_are_named_errors() {
    let g = golden(include_str!("golden/llama_spm.json"));
    let short = MetaValue::Array(MetaType::F32, vec![MetaValue::F32(0.0); 3]);
    let err = Tokenizer::from_gguf(&gguf(&g, &[("tokenizer.ggml.scores", Some(short))]))
        .err()
        .unwrap();
    assert!(
        matches!(err, TokenizerError::ScoreCount { scores: 3, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");
    let err = Tokenizer::from_gguf(&gguf(
        &g,
        &[
            (
                "tokenizer.ggml.pre",
                Some(MetaValue::String("whatever".into())),
            ),
            ("tokenizer.ggml.model", Some(MetaValue::String("t5".into()))),
        ],
    ))
    .err()
    .unwrap();
    assert!(err.to_string().contains("`t5`"), "{err}");
}

/// WordPiece against llama.cpp on the tiny BERT's vocabulary: accents, CJK, punctuation,
/// control characters, unknown words, `[CLS]`/`[SEP]` added (or not), special-token texts
/// parsed (or not).
#[test]
fn wordpiece_matches_llama_cpp() {
    let src = include_str!("golden/wpm.json");
    let v: Value = serde_json::from_str(src).expect("golden JSON");
    let tok = tokenizer(&golden(src));
    assert_eq!(tok.model_name(), "bert");
    let cases = v["cases"].as_array().expect("cases");
    assert!(cases.len() >= 600, "only {} cases", cases.len());
    let unk = tok.token_id("[UNK]").expect("[UNK]");
    let ids_of = |c: &Value| -> Vec<u32> {
        c["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    // The golden set must exercise what it claims to: unknown words and continuation pieces.
    assert!(cases.iter().any(|c| ids_of(c).contains(&unk)));
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().expect("text");
        let (special, add) = (c["special"].as_bool().unwrap(), c["add"].as_bool().unwrap());
        let got = tok.encode(text, add, special);
        let want = ids_of(c);
        if got != want {
            failures.push(format!(
                "{text:?} (special={special}, add={add}): expected {want:?}, got {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} WordPiece cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}
