//! `minfer info` end to end: the real model's report, and clean one-line errors on bad files.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn model_path() -> PathBuf {
    let p = minfer_hub::default_model_path();
    assert!(
        p.is_file(),
        "real model missing at {}: run `minfer pull` first",
        p.display()
    );
    p
}

fn info(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg("info")
        .args(args)
        .output()
        .expect("minfer runs")
}

#[test]
fn json_report_of_the_real_model() {
    let path = model_path();
    let out = info(&["-m", path.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(j["version"], 3);
    assert_eq!(j["file_size"], 491_400_064u64);
    assert_eq!(j["architecture"], "qwen2");
    assert_eq!(j["tensor_count"], 291);
    assert_eq!(j["tensors"].as_array().unwrap().len(), 291);
    let counts: Vec<(&str, u64)> = ["Q5_0", "F32", "Q8_0", "Q6_K", "Q4_K"]
        .into_iter()
        .map(|t| (t, j["type_totals"][t]["count"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(
        counts,
        [
            ("Q5_0", 133),
            ("F32", 121),
            ("Q8_0", 13),
            ("Q6_K", 12),
            ("Q4_K", 12)
        ]
    );
    let hp = &j["hparams"];
    assert_eq!(hp["block_count"], 24);
    assert_eq!(hp["embedding_length"], 896);
    assert_eq!(hp["attention.head_count"], 14);
    assert_eq!(hp["attention.head_count_kv"], 2);
    assert_eq!(hp["rope.freq_base"], 1e6);
    let tok = &j["tokenizer"];
    assert_eq!(tok["model"], "gpt2");
    assert_eq!(tok["vocab_size"], 151_936);
    assert_eq!(tok["chat_template"], true);
    assert!(tok["merges"].as_u64().unwrap() > 100_000);
    assert_eq!(j["metadata"]["tokenizer.ggml.tokens"]["len"], 151_936);
    assert_eq!(j["metadata"]["tokenizer.ggml.tokens"]["type"], "string");
}

#[test]
fn text_report_of_the_real_model() {
    let path = model_path();
    let out = info(&["-m", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("GGUF version:  3"), "{s}");
    assert!(s.contains("architecture:  qwen2"), "{s}");
    assert!(s.contains("tensors (291):"), "{s}");
    assert!(s.contains("token_embd.weight"), "{s}");
    assert!(s.contains("vocab size     151936"), "{s}");
}

/// Runs `info` on `bytes` written to a temporary file; returns the stderr after checking
/// the failure is clean.
fn failing_info(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    std::fs::write(&path, bytes).unwrap();
    failing_info_at(&path)
}

fn failing_info_at(path: &Path) -> String {
    let out = info(&["-m", path.to_str().unwrap(), "--json"]);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    stderr
}

#[test]
fn bad_files_fail_with_one_line_errors() {
    let mut head = Vec::new();
    std::fs::File::open(model_path())
        .unwrap()
        .take(1000)
        .read_to_end(&mut head)
        .unwrap();
    let e = failing_info(&head);
    assert!(e.contains("truncated file: metadata"), "{e}");

    let mut bad_magic = head.clone();
    bad_magic[..4].copy_from_slice(b"GGML");
    let e = failing_info(&bad_magic);
    assert!(e.contains("not a GGUF file"), "{e}");

    let mut v1 = head.clone();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    let e = failing_info(&v1);
    assert!(e.contains("unsupported GGUF version 1"), "{e}");

    let mut w = minfer_gguf::GgufWriter::new();
    w.add_tensor_bytes("w", &[64], minfer_gguf::GgmlType::F32, vec![0; 256])
        .unwrap();
    let mut cut = w.to_bytes().unwrap();
    cut.truncate(cut.len() - 100);
    let e = failing_info(&cut);
    assert!(
        e.contains("tensor `w` data") && e.contains("outside the file"),
        "{e}"
    );
    assert!(e.contains("bad.gguf"), "the path is named: {e}");

    let dir = tempfile::tempdir().unwrap();
    failing_info_at(&dir.path().join("absent.gguf"));
}

#[cfg(unix)]
#[test]
fn a_fifo_or_directory_as_the_model_is_refused_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo failed");
    for path in [fifo.as_path(), dir.path()] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_minfer"))
            .args(["info", "-m", path.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("minfer runs");
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if t0.elapsed() > std::time::Duration::from_secs(20) {
                child.kill().ok();
                panic!("`minfer info -m {}` hung", path.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!status.success(), "{err}");
        assert!(err.contains("not a regular file"), "{err}");
        assert!(err.contains(path.to_str().unwrap()), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
}
