//! Support for tests that compare backends on the real default model: the llama.cpp
//! reference outputs recorded for it (`tests/golden/llama_reference.json`, written by
//! the reference generator) and the engine options of a fenced backend. Shared by the
//! default-model tests of every backend crate, so each compares against the same data.

use serde_json::Value;

use crate::EngineOptions;

/// The llama.cpp reference outputs of the default model: `teacher_forced` cases (prompt
/// `ids` and per-position `top_ids`), greedy continuations, and the rest the reference
/// tests read.
pub fn reference() -> Value {
    match serde_json::from_str(include_str!("../tests/golden/llama_reference.json")) {
        Ok(v) => v,
        Err(e) => panic!("tests/golden/llama_reference.json does not parse: {e}"),
    }
}

/// A JSON array of token ids as `u32`s; panics naming the first entry that is not one.
pub fn ids(v: &Value) -> Vec<u32> {
    let Some(items) = v.as_array() else {
        panic!("not an array of token ids: {v}");
    };
    items
        .iter()
        .map(|x| match x.as_u64().map(u32::try_from) {
            Some(Ok(id)) => id,
            _ => panic!("not a token id: {x}"),
        })
        .collect()
}

/// Engine options that fence the engine to `backend` (the CPU host beside it), with a
/// context of `n_ctx` positions and `n_threads` CPU threads; the rest default.
pub fn fenced(backend: &str, n_ctx: usize, n_threads: usize) -> EngineOptions {
    EngineOptions {
        n_threads,
        n_ctx: Some(n_ctx),
        backend: Some(backend.to_string()),
        ..EngineOptions::default()
    }
}

/// The largest absolute difference of `got` from `want`, relative to `want`'s largest
/// magnitude (at least 1, so near-zero logits do not inflate it): how two backends'
/// logits are compared. Panics where the lengths differ.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "logits of different lengths");
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_holds_teacher_forced_cases_of_token_ids() {
        let r = reference();
        let cases = r["teacher_forced"]
            .as_array()
            .expect("teacher_forced cases");
        assert!(!cases.is_empty());
        assert!(cases.iter().all(|c| !ids(&c["ids"]).is_empty()));
    }

    #[test]
    fn the_reference_ids_are_tokens_of_the_pulled_default_model() {
        let f = minfer_hub::testing::default_model_file();
        let embd = f
            .tensors()
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .expect("the default model has an embedding");
        let n_vocab = embd.dims[1];
        for case in reference()["teacher_forced"].as_array().expect("cases") {
            assert!(ids(&case["ids"]).iter().all(|&t| u64::from(t) < n_vocab));
        }
    }

    #[test]
    fn rel_err_scales_by_the_reference_magnitude_but_never_below_one() {
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert_eq!(rel_err(&[0.0, 4.5], &[0.0, 4.0]), 0.125);
        assert_eq!(rel_err(&[0.25, 0.0], &[0.0, 0.001]), 0.25);
    }

    #[test]
    fn ids_reads_token_ids_and_refuses_anything_else_by_value() {
        assert_eq!(ids(&serde_json::json!([0, 7, 151643])), [0, 7, 151643]);
        for bad in [
            serde_json::json!({"a": 1}),
            serde_json::json!([1, -2]),
            serde_json::json!([5_000_000_000u64]),
        ] {
            let e = std::panic::catch_unwind(|| ids(&bad)).expect_err("refused");
            let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.starts_with("not a"), "{msg}");
        }
    }
}
