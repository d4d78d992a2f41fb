//! BERT-family encoders through the command line: `minfer embed` gives llama.cpp's vector
//! of the tiny BERT and of the tiny nomic-bert, `minfer info` names the architecture and
//! its WordPiece tokenizer, and
//! `minfer run` is refused naming the encoder, without a panic; the tiny reranker's
//! `minfer embed` prints llama.cpp's rank scores, and a headless BERT refuses rank.

use std::path::PathBuf;

use minfer_gguf::GgmlType;
use minfer_models::testing::{bert_reranker, write_tiny_bert, TinyBert, BERT_SEED, NOMIC_SEED};

use crate::common::*;

fn tiny_bert(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("tiny-bert.gguf");
    write_tiny_bert(&p, &TinyBert::new(GgmlType::F32, BERT_SEED)).expect("write tiny BERT");
    p
}

#[test]
fn embed_info_and_a_refused_run_on_a_bert() {
    let dir = tempfile::tempdir().expect("temporary directory");
    embed_info_and_a_refused_run("bert", "bert-f32", &tiny_bert(dir.path()));
}

#[test]
fn embed_info_and_a_refused_run_on_a_nomic_bert() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let p = dir.path().join("tiny-nomic.gguf");
    write_tiny_bert(&p, &TinyBert::nomic(GgmlType::F32, NOMIC_SEED)).expect("write");
    embed_info_and_a_refused_run("nomic-bert", "nomic-f32", &p);
}

/// The encoder of architecture `arch` at `path`, whose mean-pooled golden is `stem`'s.
fn embed_info_and_a_refused_run(arch: &str, stem: &str, path: &std::path::Path) {
    let home = test_home(arch);
    std::fs::create_dir_all(&home).expect("home");
    let m = path.to_str().expect("UTF-8 path");

    let golden: serde_json::Value = serde_json::from_str(include_str!(
        "../../../runtime/tests/golden/embed_tiny_reference.json"
    ))
    .expect("golden JSON");
    let g = golden["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|g| g["model"] == stem && g["pooling"] == "mean")
        .unwrap_or_else(|| panic!("a {stem} mean entry"));
    let text = g["text"].as_str().expect("text");
    let out = minfer_command(&home)
        .args(["embed", "-m", m, "-t", "2", text])
        .output()
        .expect("minfer runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let dot: f64 = v[0]
        .as_array()
        .expect("one vector")
        .iter()
        .zip(g["embedding"].as_array().expect("golden vector"))
        .map(|(a, b)| a.as_f64().unwrap() * b.as_f64().unwrap())
        .sum();
    assert!(1.0 - dot < 1e-5, "{stem}: cosine {dot}");

    let out = minfer_command(&home)
        .args(["info", "-m", m, "--json"])
        .output()
        .expect("minfer runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(j["architecture"], arch);
    assert_eq!(j["tokenizer"]["model"], "bert");

    let out = minfer_command(&home)
        .args(["run", "-m", m, "-n", "4", "-t", "2", "hello"])
        .output()
        .expect("minfer runs");
    assert_refused(&out, &format!("`{arch}` is an encoder"));
}

/// `minfer embed` on the tiny reranker: each `query<TAB>document` line is joined as
/// llama-embedding joins it and printed as its raw score, within the runtime check's
/// bound (1e-3 relative) of llama.cpp's score for that layout; `--pooling rank` on a
/// BERT without a classifier head is refused naming what is missing.
#[test]
fn embed_prints_rank_scores_of_a_bert_reranker() {
    let home = test_home("bert-rank");
    std::fs::create_dir_all(&home).expect("home");
    let dir = tempfile::tempdir().expect("temporary directory");
    let (stem, spec) = bert_reranker();
    let path = dir.path().join(format!("{stem}.gguf"));
    write_tiny_bert(&path, &spec).expect("write the tiny reranker");
    let golden: serde_json::Value = serde_json::from_str(include_str!(
        "../../../runtime/tests/golden/rerank_tiny_reference.json"
    ))
    .expect("golden JSON");
    let entries: Vec<&serde_json::Value> = golden["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|g| g["layout"] == "embedding")
        .collect();
    assert!(entries.len() >= 2);
    let lines: Vec<String> = entries
        .iter()
        .map(|g| {
            format!(
                "{}\t{}",
                g["query"].as_str().unwrap(),
                g["document"].as_str().unwrap()
            )
        })
        .collect();
    let m = path.to_str().expect("UTF-8 path");
    let out = minfer_command(&home)
        .args(["embed", "-m", m, "-t", "2"])
        .args(&lines)
        .output()
        .expect("minfer runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for (i, g) in entries.iter().enumerate() {
        let got = v[i][0].as_f64().expect("a score");
        assert_eq!(v[i].as_array().map(Vec::len), Some(1), "one score per pair");
        let want = g["score"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-3 * want.abs(),
            "pair {i}: {got} vs {want}"
        );
    }
    let plain = tiny_bert(dir.path());
    let out = minfer_command(&home)
        .args([
            "embed",
            "-m",
            plain.to_str().unwrap(),
            "--pooling",
            "rank",
            "q\td",
        ])
        .output()
        .expect("minfer runs");
    assert_refused(&out, "classifier head");
}
