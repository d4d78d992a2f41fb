//! `serve --lookup`: speculative slots decoding together in one batched step answer
//! exactly what a plain server answers (greedy, and sampled with a seed), and `/metrics`
//! counts the drafted and accepted tokens.

use crate::common;

use common::spec::{answers, counter};
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_slots_batched_together_answer_as_plain_slots() {
    let plain = tiny_server(4, |_| {});
    let spec = tiny_server(4, |c| c.lookup = Some(7));
    for temperature in [0.0, 0.9] {
        let want = answers(&plain.base, temperature).await;
        let got = answers(&spec.base, temperature).await;
        assert_eq!(got, want, "temperature {temperature}");
    }
    let (_, m) = get(&spec.base, "/metrics").await;
    let drafted = counter(&m, "minfer_draft_tokens_total");
    let accepted = counter(&m, "minfer_draft_accepted_tokens_total");
    assert!(
        drafted > 0 && accepted > 0,
        "{drafted} drafted, {accepted} accepted"
    );
    assert!(accepted <= drafted);
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
