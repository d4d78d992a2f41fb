//! Server speculation. Slots speculating with a draft model (`serve --draft`: a draft
//! slot per slot, the draft steps of every slot in shared forwards, the verify blocks in
//! the shared target step) answer exactly what a plain server answers, greedy and sampled
//! with a seed, through slot reuse and prompt caching; `/metrics` counts the draft
//! model's drafts; a draft of another vocabulary is refused at start-up by name. Requests
//! for log-probabilities speculate too (with `--lookup` and `--draft`) and report exactly
//! plain decode's tokens and log-probabilities.

use crate::common;

use std::path::{Path, PathBuf};

use common::spec::{answers, counter, PROMPTS};
use common::*;
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};
use serde_json::{json, Value};

/// A tiny model of `spec` written under `dir`.
fn write(dir: &Path, name: &str, spec: &TinySpec) -> PathBuf {
    let path = dir.join(name);
    write_tiny_model(&path, spec).expect("writing a tiny model");
    path
}

/// A started server and its address.
struct Server {
    _running: minfer_server::Running,
    base: String,
}

/// A started server over `target` on 4 slots with `edit` applied.
fn server(target: &Path, edit: impl FnOnce(&mut minfer_server::Config)) -> Server {
    let mut c = tiny_config(target, 4);
    edit(&mut c);
    let running = minfer_server::start(c).expect("starting the server");
    let base = format!("http://{}", running.addr());
    Server {
        _running: running,
        base,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draft_model_slots_batched_together_answer_as_plain_slots() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let target = write(
        dir.path(),
        "target.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 7),
    );
    let other = write(
        dir.path(),
        "draft.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 8),
    );
    let plain = server(&target, |_| {});
    let mut want = Vec::new();
    for temperature in [0.0, 0.9] {
        want.push(answers(&plain.base, temperature).await);
    }
    // The target as its own draft (drafts mostly right), another model of the same
    // vocabulary (mostly wrong), at a fixed depth and at the adaptive one.
    for (draft, depth) in [(&target, Some(3)), (&other, Some(3)), (&other, None)] {
        let spec = server(&target, |c| {
            c.draft = Some(draft.clone());
            c.draft_depth = depth;
        });
        for (temperature, want) in [0.0, 0.9].into_iter().zip(&want) {
            // Twice: the second round finds the prompts cached in the slots.
            for round in 0..2 {
                let got = answers(&spec.base, temperature).await;
                assert_eq!(
                    &got,
                    want,
                    "draft {}, depth {depth:?}, temperature {temperature}, round {round}",
                    draft.display()
                );
            }
        }
        let (_, m) = get(&spec.base, "/metrics").await;
        let drafted = counter(&m, "minfer_draft_tokens_total");
        let accepted = counter(&m, "minfer_draft_accepted_tokens_total");
        assert!(
            accepted <= drafted,
            "{drafted} drafted, {accepted} accepted"
        );
        if depth.is_some() {
            assert!(drafted > 0, "{}: nothing drafted", draft.display());
        }
        if draft == &target && depth.is_some() {
            // Greedy drafts of the target itself are its own picks.
            assert!(
                accepted > 0,
                "the target drafting for itself: none accepted"
            );
        }
    }
}

#[test]
fn a_draft_of_another_vocabulary_is_refused_at_start_up() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let target = write(
        dir.path(),
        "target.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 7),
    );
    let spec = TinySpec {
        n_vocab: 600,
        ..TinySpec::qwen2(GgmlType::Q8_0, 8)
    };
    let other = write(dir.path(), "other.gguf", &spec);
    let mut c = tiny_config(&target, 2);
    c.draft = Some(other);
    let e = minfer_server::start(c)
        .err()
        .expect("a draft of another vocabulary must be refused")
        .to_string();
    assert!(
        e.contains("--draft") && e.contains("vocabulary") && e.contains("600"),
        "{e}"
    );
}

#[test]
fn a_draft_beside_lookup_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let target = write(
        dir.path(),
        "target.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 7),
    );
    let mut c = tiny_config(&target, 1);
    c.draft = Some(target.clone());
    c.lookup = Some(7);
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("--draft") && e.contains("--lookup"), "{e}");
}

/// Every prompt at once asking for 3 top log-probabilities; each choice's text and
/// `logprobs` object in order.
async fn logprob_answers(base: &str, temperature: f64) -> Vec<(String, Value)> {
    let mut tasks = Vec::new();
    for (i, p) in PROMPTS.iter().enumerate() {
        let base = base.to_string();
        let body = json!({
            "prompt": p, "max_tokens": 24, "temperature": temperature, "seed": 3 + i,
            "logprobs": 3,
        });
        tasks.push(tokio::spawn(async move {
            post(&base, "/v1/completions", body).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        let (status, v): (u16, Value) = t.await.expect("task");
        assert_eq!(status, 200, "{v}");
        let c = &v["choices"][0];
        let text = c["text"].as_str().expect("text").to_string();
        assert!(c["logprobs"]["tokens"].is_array(), "{v}");
        out.push((text, c["logprobs"].clone()));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_requests_speculate_and_report_plain_decodes_logprobs() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let target = write(
        dir.path(),
        "target.gguf",
        &TinySpec::qwen2(GgmlType::Q8_0, 7),
    );
    let plain = server(&target, |_| {});
    let mut want = Vec::new();
    for temperature in [0.0, 0.9] {
        want.push(logprob_answers(&plain.base, temperature).await);
    }
    let lookup = server(&target, |c| {
        c.lookup = Some(7);
        c.draft_depth = Some(3);
    });
    let draft = server(&target, |c| {
        c.draft = Some(target.clone());
        c.draft_depth = Some(3);
    });
    for (what, spec) in [("lookup", &lookup), ("draft", &draft)] {
        for (temperature, want) in [0.0, 0.9].into_iter().zip(&want) {
            let got = logprob_answers(&spec.base, temperature).await;
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                assert_eq!(g, w, "{what}, temperature {temperature}, prompt {i}");
            }
        }
        let (_, m) = get(&spec.base, "/metrics").await;
        let accepted = counter(&m, "minfer_draft_accepted_tokens_total");
        assert!(
            accepted > 0,
            "{what}: the logprobs requests did not speculate"
        );
    }
}
