//! minfer's graphs for the tiny golden models against llama.cpp's outputs committed in
//! tests/golden/tiny_reference.json (format: tests/golden/README.md).
//!
//! minfer's side runs on the graph crate's scalar reference backend over dequantized
//! weights, through the reuse cache and the FusionPass as a runtime would, so these
//! tests check graph construction — not kernels — against an independent engine.

mod common;

use common::{argmax, RefRunner};
use minfer_gguf::{GgmlType, GgufFile, GgufWriter};
use minfer_models::testing::{golden_models, tiny_model_bytes, TinySpec};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn golden() -> Value {
    serde_json::from_str(include_str!("golden/tiny_reference.json")).expect("golden JSON")
}

fn find<'a>(g: &'a Value, name: &str) -> Option<&'a Value> {
    g["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["name"] == name)
}

fn entry<'a>(g: &'a Value, name: &str) -> &'a Value {
    find(g, name)
        .unwrap_or_else(|| panic!("{name}: no golden entry (run scripts/gen_tiny_reference.py)"))
}

/// Every model of `golden_models()` with its golden entry; a model without one fails
/// the test by name (its outputs come from `scripts/gen_tiny_reference.py`).
fn with_entries(g: &Value) -> Vec<(&'static str, TinySpec, &Value)> {
    golden_models()
        .into_iter()
        .map(|(name, spec)| (name, spec, entry(g, name)))
        .collect()
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

fn runner(spec: &TinySpec) -> RefRunner {
    let file = GgufFile::from_bytes(tiny_model_bytes(spec).unwrap()).unwrap();
    RefRunner::new(&file, 64)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn golden_set_is_the_one_the_writer_produces() {
    let g = golden();
    // The golden entries are exactly the models of the list: none stale, none missing.
    let names: Vec<&str> = golden_models().iter().map(|(n, _)| *n).collect();
    for e in g["models"].as_array().expect("models") {
        let name = e["name"].as_str().expect("name");
        assert!(
            names.contains(&name),
            "golden entry {name} is not in testing::golden_models()"
        );
    }
    assert_eq!(
        g["models"].as_array().expect("models").len(),
        names.len(),
        "one golden entry per model"
    );
    for (name, spec) in golden_models() {
        let n = tiny_model_bytes(&spec).unwrap().len();
        assert!(n < 2 << 20, "{name}: {n} bytes");
    }
    for (name, spec, e) in with_entries(&g) {
        let bytes = tiny_model_bytes(&spec).unwrap();
        let sha = format!("{:x}", Sha256::digest(&bytes));
        assert_eq!(
            e["sha256"].as_str(),
            Some(sha.as_str()),
            "{name}: the writer no longer reproduces the file the golden outputs were made from; \
             rerun write_tiny_models and scripts/gen_tiny_reference.py"
        );
    }
}

#[test]
fn prefill_logits_match_llama_cpp() {
    let g = golden();
    let prompt = ids(&g["prompt_ids"]);
    for (name, spec, e) in with_entries(&g) {
        let expected = floats(&e["last_logits"]);
        let tol = e["logit_tolerance"].as_f64().unwrap() as f32;
        // The prompt with one output row exercises the G3 tail reduction.
        let got = runner(&spec).forward(&prompt, 0, 1);
        assert_eq!(got.len(), spec.n_vocab, "{name}");
        let d = max_abs_diff(&got, &expected);
        eprintln!("{name}: prefill max |dlogit| {d:.3e} (tolerance {tol:.3e})");
        assert!(d <= tol, "{name}: max |dlogit| {d} > {tol}");
        // The top-1 agrees wherever llama.cpp's margin is wider than twice the tolerance,
        // as in the decode tests (a near-tie may flip within the tolerance).
        if floats(&e["greedy_margins"])[0] > 2.0 * tol {
            assert_eq!(argmax(&got), argmax(&expected), "{name}: top-1");
        }
    }
}

#[test]
fn all_rows_without_tail_reduction_agree_with_the_reduced_graph() {
    let g = golden();
    let prompt = ids(&g["prompt_ids"]);
    let (_, spec) = &golden_models()[0];
    let reduced = runner(spec).forward(&prompt, 0, 2);
    let full = runner(spec).forward(&prompt, 0, prompt.len());
    let nv = spec.n_vocab;
    assert_eq!(reduced.len(), 2 * nv);
    assert_eq!(full.len(), prompt.len() * nv);
    let d = max_abs_diff(&reduced, &full[(prompt.len() - 2) * nv..]);
    assert!(d < 1e-4, "tail rows differ by {d}");
    let d = max_abs_diff(
        &full[(prompt.len() - 1) * nv..],
        &floats(&entry(&g, "qwen2-f32")["last_logits"]),
    );
    assert!(d < 1e-3, "{d}");
}

/// gpt-oss's attention sinks are felt: with each sink at -1e30 (no share of any softmax,
/// what a kernel ignoring them computes) the prefill logits leave llama.cpp's by many
/// times the tolerance, so the golden checks above fail for a graph or kernel that drops
/// them.
#[test]
fn gpt_oss_without_its_sinks_misses_llama_cpp() {
    let g = golden();
    let prompt = ids(&g["prompt_ids"]);
    let e = entry(&g, "gpt-oss-f32");
    let (_, spec) = golden_models()
        .into_iter()
        .find(|(n, _)| *n == "gpt-oss-f32")
        .expect("gpt-oss-f32 in the golden set");
    let src = GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.add_meta(k, v.clone());
    }
    let mut sinks = 0;
    for t in src.tensors() {
        if t.name.ends_with(".attn_sinks.weight") {
            sinks += 1;
            let n = spec.n_head;
            w.add_tensor_f32(&t.name, &t.dims, GgmlType::F32, &vec![-1e30; n])
                .unwrap();
        } else {
            w.add_tensor_bytes(&t.name, &t.dims, t.ggml_type, src.tensor_data(t).to_vec())
                .unwrap();
        }
    }
    assert_eq!(sinks, spec.n_layer);
    let file = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let got = RefRunner::new(&file, 64).forward(&prompt, 0, 1);
    let tol = e["logit_tolerance"].as_f64().unwrap() as f32;
    let d = max_abs_diff(&got, &floats(&e["last_logits"]));
    eprintln!("gpt-oss-f32 without sinks: max |dlogit| {d:.3e} (tolerance {tol:.3e})");
    assert!(d > 20.0 * tol, "{d} vs tolerance {tol}");
}

/// Decode steps fed llama.cpp's own greedy tokens: the top logits of every step agree,
/// and so does the top-1 wherever llama.cpp's margin is wider than twice the tolerance.
#[test]
fn teacher_forced_decode_matches_llama_cpp() {
    let g = golden();
    let prompt = ids(&g["prompt_ids"]);
    for (name, spec, e) in with_entries(&g) {
        let tol = e["logit_tolerance"].as_f64().unwrap() as f32;
        let greedy = ids(&e["greedy"]);
        let margins = floats(&e["greedy_margins"]);
        let mut r = runner(&spec);
        let mut logits = r.forward(&prompt, 0, 1);
        let mut worst = 0f32;
        for (step, &tok) in greedy.iter().enumerate() {
            let top_ids = ids(&e["greedy_top_ids"][step]);
            let top = floats(&e["greedy_top_logits"][step]);
            let got: Vec<f32> = top_ids.iter().map(|&i| logits[i as usize]).collect();
            let d = max_abs_diff(&got, &top);
            worst = worst.max(d);
            assert!(
                d <= tol,
                "{name} step {step}: top logits differ by {d} > {tol}"
            );
            if margins[step] > 2.0 * tol {
                assert_eq!(argmax(&logits) as u32, tok, "{name} step {step}");
            }
            logits = r.forward(&[tok], prompt.len() + step, 1);
        }
        eprintln!("{name}: decode max |dlogit| {worst:.3e} (tolerance {tol:.3e})");
    }
}

/// Free-running greedy decode with graph reuse: tokens agree up to the first step whose
/// llama.cpp margin is within twice the tolerance (there a flip would be noise); the F32
/// models' margins leave no such step, so they must agree on all 32 tokens.
#[test]
fn greedy_decode_matches_llama_cpp() {
    let g = golden();
    let prompt = ids(&g["prompt_ids"]);
    for (name, spec, e) in with_entries(&g) {
        let tol = e["logit_tolerance"].as_f64().unwrap() as f32;
        let expected = ids(&e["greedy"]);
        let margins = floats(&e["greedy_margins"]);
        let comparable = margins
            .iter()
            .position(|&m| m <= 2.0 * tol)
            .unwrap_or(expected.len());
        if spec.wtype == minfer_gguf::GgmlType::F32 {
            assert_eq!(comparable, 32, "{name}: golden greedy path has a near-tie");
        }
        let mut r = runner(&spec);
        let mut logits = r.forward(&prompt, 0, 1);
        let mut out = Vec::new();
        for step in 0..expected.len() {
            let t = argmax(&logits) as u32;
            out.push(t);
            logits = r.forward(&[t], prompt.len() + step, 1);
        }
        let counters = r.cache.counters();
        assert_eq!(
            (counters.builds, counters.reuses),
            (2, 31),
            "{name}: one prefill build, one decode build, decode reused"
        );
        let agree = out
            .iter()
            .zip(&expected)
            .take_while(|(a, b)| a == b)
            .count();
        eprintln!(
            "{name}: greedy agrees on the first {agree} of 32 tokens ({comparable} required)"
        );
        assert_eq!(
            out[..comparable],
            expected[..comparable],
            "{name} (first {comparable} tokens)"
        );
    }
}
