//! `minfer tokenize` on the default model, and on a vocabulary-only GGUF copied from it.

use minfer_gguf::{GgufFile, GgufWriter};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn model() -> PathBuf {
    let path = minfer_hub::default_model_path();
    assert!(
        path.exists(),
        "default model not found at {}; run `minfer pull` first",
        path.display()
    );
    path
}

fn minfer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(args)
        .output()
        .expect("minfer runs")
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "minfer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

/// Ids the independent reference tokenizer gave for `text` (tokenizer golden vectors).
fn golden_ids(text: &str, special: bool) -> String {
    let src = include_str!("../../../tokenizer/tests/golden/qwen2_encode.jsonl");
    for line in src.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("golden JSON");
        if v["text"] == text && v["special"] == special {
            let ids: Vec<String> = v["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|x| x.to_string())
                .collect();
            return ids.join(" ");
        }
    }
    panic!("no golden case for {text:?}");
}

/// A scratch directory, removed with everything in it when the test ends.
fn scratch_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("minfer-tokenize-{name}-"))
        .tempdir()
        .expect("scratch dir")
}

#[test]
fn ids_match_the_golden_vectors() {
    let m = model();
    let m = m.to_str().unwrap();
    for text in [
        "The quick brown fox jumps over the lazy dog.",
        "Привет, мир! Как дела? Всё хорошо.",
    ] {
        let out = stdout_ok(&minfer(&["tokenize", "-m", m, text]));
        assert_eq!(out, format!("{}\n", golden_ids(text, false)), "{text:?}");
    }
}

#[test]
fn special_flag_and_pieces() {
    let m = model();
    let m = m.to_str().unwrap();
    let text = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n";
    let with = stdout_ok(&minfer(&["tokenize", "-m", m, "--special", text]));
    assert_eq!(with.trim_end(), golden_ids(text, true));
    assert!(with.starts_with("151644 "), "{with}");
    let without = stdout_ok(&minfer(&["tokenize", "-m", m, text]));
    assert_eq!(without.trim_end(), golden_ids(text, false));
    assert!(!without.contains("151644"), "{without}");

    let pieces = stdout_ok(&minfer(&[
        "tokenize",
        "-m",
        m,
        "--special",
        "--pieces",
        "<|im_start|>user\n",
    ]));
    let lines: Vec<&str> = pieces.lines().collect();
    assert_eq!(
        lines,
        vec!["151644 '<|im_start|>'", "872 'user'", "198 '\\n'"]
    );
}

#[test]
fn file_input_and_invalid_utf8() {
    let m = model();
    let m = m.to_str().unwrap();
    let scratch = scratch_dir("file");
    let dir = scratch.path();
    let text = "The quick brown fox jumps over the lazy dog.";
    let good = dir.join("good.txt");
    std::fs::write(&good, text).unwrap();
    let out = stdout_ok(&minfer(&[
        "tokenize",
        "-m",
        m,
        "--file",
        good.to_str().unwrap(),
    ]));
    assert_eq!(out.trim_end(), golden_ids(text, false));

    let bad = dir.join("bad.txt");
    std::fs::write(&bad, b"ok \xff\xfe not utf8").unwrap();
    let out = minfer(&["tokenize", "-m", m, "--file", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not valid UTF-8") && err.contains("offset 3"),
        "{err}"
    );
}

/// Copies the tokenizer metadata of `src` into a GGUF without tensors.
fn write_vocab_only(src: &Path, dst: &Path) {
    let file = GgufFile::open(src).expect("model opens");
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        if key.starts_with("tokenizer.") || key == "general.architecture" {
            w.add_meta(key, value.clone());
        }
    }
    w.write_to(dst).expect("vocab-only GGUF written");
}

#[test]
fn vocab_only_gguf_is_a_valid_model() {
    let scratch = scratch_dir("vocab");
    let dir = scratch.path();
    let vocab = dir.join("vocab-only.gguf");
    write_vocab_only(&model(), &vocab);
    assert!(GgufFile::open(&vocab).unwrap().tensors().is_empty());
    let text = "Привет, мир! Как дела? Всё хорошо.";
    let out = stdout_ok(&minfer(&["tokenize", "-m", vocab.to_str().unwrap(), text]));
    assert_eq!(out.trim_end(), golden_ids(text, false));
}
