//! Tiny random-weight Qwen2 and Qwen3 models, written by the project's own GGUF writer,
//! run on the CPU backend against llama.cpp's outputs in
//! crates/models/tests/golden/tiny_reference.json (rules: that folder's README.md).

use minfer_gguf::GgufFile;
use minfer_models::testing::{golden_models, tiny_model_bytes};
use minfer_runtime::{greedy_tokens, sampling::argmax, Engine, EngineOptions};
use serde_json::Value;

fn golden() -> Value {
    serde_json::from_str(include_str!(
        "../../../models/tests/golden/tiny_reference.json"
    ))
    .expect("golden JSON")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn engine(name: &str, threads: usize) -> Engine {
    let spec = golden_models()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no tiny model {name}"));
    let file = GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader");
    let opts = EngineOptions {
        n_threads: threads,
        n_ctx: Some(64),
        backend: None,
        n_batch: 512,
        ..EngineOptions::default()
    };
    Engine::from_gguf(file, &opts).expect("engine")
}

#[test]
fn every_tiny_model_matches_llama_cpp_within_its_tolerance() {
    let g = golden();
    let prompt = ids(&g["prompt_ids"]);
    for m in g["models"].as_array().expect("models") {
        let name = m["name"].as_str().expect("name");
        let tol = m["logit_tolerance"].as_f64().expect("tolerance") as f32;
        let mut e = engine(name, 2);
        // Prefill: every logit within tolerance, same argmax.
        let last = e.prefill(&prompt, 0).expect("prefill");
        let want = floats(&m["last_logits"]);
        let diff = last
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("{name}: prefill max |Δlogit| {diff:.5} (tolerance {tol:.5})");
        assert!(
            diff <= tol,
            "{name}: prefill logits differ by {diff} > {tol}"
        );
        assert_eq!(argmax(&last), argmax(&want), "{name}: prefill argmax");
        // Teacher-forced decode over llama.cpp's greedy tokens.
        let greedy = ids(&m["greedy"]);
        let margins = floats(&m["greedy_margins"]);
        let mut logits = last;
        for (i, &t) in greedy.iter().enumerate() {
            let top_ids = ids(&m["greedy_top_ids"][i]);
            let top_logits = floats(&m["greedy_top_logits"][i]);
            for (&id, &l) in top_ids.iter().zip(&top_logits) {
                let d = (logits[id as usize] - l).abs();
                assert!(
                    d <= tol,
                    "{name}: step {i} token {id} differs by {d} > {tol}"
                );
            }
            if margins[i] > 2.0 * tol {
                assert_eq!(argmax(&logits), t, "{name}: step {i} argmax");
            }
            logits = e.forward(&[t], prompt.len() + i, 1).expect("decode");
        }
    }
}

#[test]
fn tiny_qwen2_greedy_decode_matches_the_committed_32_tokens() {
    let g = golden();
    let prompt = ids(&g["prompt_ids"]);
    for m in g["models"].as_array().expect("models") {
        let name = m["name"].as_str().expect("name");
        let want = ids(&m["greedy"]);
        let tol = m["logit_tolerance"].as_f64().expect("tolerance") as f32;
        let margins = floats(&m["greedy_margins"]);
        // Free-running greedy agrees up to the first step whose margin is within noise.
        let exact = margins
            .iter()
            .position(|&mg| mg <= 2.0 * tol)
            .unwrap_or(want.len());
        let mut e = engine(name, 1);
        let got = greedy_tokens(&mut e, &prompt, want.len()).expect("greedy");
        assert_eq!(got[..exact], want[..exact], "{name}: greedy tokens");
        if name.starts_with("qwen2") && name.contains("f32") {
            assert_eq!(exact, want.len(), "{name}: all 32 tokens are decisive");
        }
    }
}

#[test]
fn perplexity_does_not_depend_on_the_prefill_batch() {
    let tokens: Vec<u32> = (0..200).map(|i| (i * 37 % 500) as u32).collect();
    let run = |n_batch: usize| {
        let spec = golden_models()
            .into_iter()
            .find(|(n, _)| *n == "qwen2-q8_0")
            .map(|(_, s)| s)
            .expect("qwen2-q8_0");
        let file = GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader");
        let opts = EngineOptions {
            n_threads: 2,
            n_ctx: Some(64),
            backend: None,
            n_batch,
            ..EngineOptions::default()
        };
        let mut e = Engine::from_gguf(file, &opts).expect("engine");
        let mut seen = Vec::new();
        let acc =
            minfer_runtime::perplexity::perplexity(&mut e, &tokens, 48, None, |c, _| seen.push(c))
                .expect("perplexity");
        assert_eq!(seen, [1, 2, 3, 4], "progress after every chunk of 48");
        acc.estimate().0
    };
    // One piece per chunk against pieces of 7 that straddle the scored half.
    assert_eq!(run(512).to_bits(), run(7).to_bits());
}

#[test]
fn a_huge_max_tokens_is_refused_before_generating_not_wrapped() {
    use minfer_runtime::{generate, EngineError, GenerateOptions, SamplingParams};
    let mut e = engine("qwen2-q8_0", 1);
    let tok = minfer_tokenizer::Tokenizer::from_gguf(e.file()).expect("tokenizer");
    for max_tokens in [usize::MAX, usize::MAX - 2, 62] {
        let opts = GenerateOptions {
            max_tokens,
            stop: Vec::new(),
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            constraint: None,
        };
        let mut pieces = 0;
        let err = generate(&mut e, &tok, &[72, 101, 108], &opts, |_| {
            pieces += 1;
            true
        })
        .unwrap_err();
        assert!(
            matches!(err, EngineError::ContextOverflow { n_ctx: 64, .. }),
            "max_tokens {max_tokens}: {err}"
        );
        assert_eq!(
            pieces, 0,
            "max_tokens {max_tokens}: text before the refusal"
        );
    }
    // Positions near the top of usize are an overflow error too, not a wrapped sum.
    let err = e.forward(&[72], usize::MAX, 1).unwrap_err();
    assert!(matches!(err, EngineError::ContextOverflow { .. }), "{err}");
    let err = e.prefill(&[72, 101], usize::MAX).unwrap_err();
    assert!(matches!(err, EngineError::ContextOverflow { .. }), "{err}");
}
