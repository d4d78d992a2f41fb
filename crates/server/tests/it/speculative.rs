//! `serve --lookup`: speculative slots decoding together in one batched step answer
//! exactly what a plain server answers (greedy, and sampled with a seed), and `/metrics`
//! counts the drafted and accepted tokens; on a hybrid recurrent model as well, whose
//! slots' state is put back after a rejected draft.

use crate::common;

use common::spec::{answers, counter};
use common::*;
use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinySpec};

/// Asserts that `spec` answers the golden prompts as `plain` does, greedy and sampled
/// with a seed, and that it drafted and had drafts accepted; returns its `/metrics`.
async fn answers_as_plain(plain: &TestServer, spec: &TestServer) -> String {
    for temperature in [0.0, 0.9] {
        let want = answers(&plain.base, temperature).await;
        let got = answers(&spec.base, temperature).await;
        assert_eq!(got, want, "temperature {temperature}");
    }
    let (_, m) = get(&spec.base, "/metrics").await;
    let drafted = counter(&m, "minfer_draft_tokens_total");
    let accepted = counter(&m, "minfer_draft_accepted_tokens_total");
    assert!(
        drafted > 0 && accepted > 0 && accepted <= drafted,
        "{drafted} drafted, {accepted} accepted"
    );
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_slots_batched_together_answer_as_plain_slots() {
    let plain = tiny_server(4, |_| {});
    let spec = tiny_server(4, |c| c.lookup = Some(7));
    answers_as_plain(&plain, &spec).await;
    let (_, m) = get(&plain.base, "/metrics").await;
    assert_eq!(counter(&m, "minfer_draft_tokens_total"), 0);
}

#[test]
fn a_draft_length_out_of_range_is_refused_by_name() {
    let (_dir, path) = tiny_model();
    for bad in [0, 17] {
        let mut c = tiny_config(&path, 1);
        c.lookup = Some(bad);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--draft-max"), "{e}");
    }
}

/// A server of `slots` slots on a tiny Qwen3.5 (Gated DeltaNet layers beside attention),
/// seed 4: its greedy texts repeat enough for lookup drafts to be accepted as well as
/// rejected.
fn qwen35_server(slots: usize, edit: impl FnOnce(&mut minfer_server::Config)) -> TestServer {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("tiny-qwen35.gguf");
    write_tiny_model(&path, &TinySpec::qwen35(GgmlType::F32, 4)).expect("writing the model");
    let mut c = tiny_config(&path, slots);
    edit(&mut c);
    let running = minfer_server::start(c).expect("starting the server");
    TestServer {
        base: format!("http://{}", running.addr()),
        running,
        _dir: Some(dir),
    }
}

/// On a hybrid recurrent model, speculative slots batched together answer what plain
/// slots answer: a block with rejected drafts leaves the state past the kept tokens, so
/// the slot's state from before the block is put back and the kept tokens run again
/// (`minfer_draft_rewinds_total` counts them; without the rollback the answers part).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_slots_of_a_recurrent_model_answer_as_plain_slots() {
    let plain = qwen35_server(4, |_| {});
    let spec = qwen35_server(4, |c| c.lookup = Some(5));
    let m = answers_as_plain(&plain, &spec).await;
    let rewinds = counter(&m, "minfer_draft_rewinds_total");
    assert!(rewinds > 0, "no block was rewound");
}
