//! The default model against llama.cpp's committed reference outputs
//! (scripts/gen_llama_reference.py): teacher-forced top-1 agreement, greedy
//! continuations, perplexity, plus graph-reuse and thread-count identity.

use std::path::PathBuf;

use minfer_runtime::perplexity::perplexity;
use minfer_runtime::{greedy_tokens, sampling::argmax, Engine, EngineOptions};
use minfer_tokenizer::Tokenizer;
use serde_json::Value;

fn model_path() -> PathBuf {
    let p = minfer_hub::default_model_path();
    assert!(
        p.exists(),
        "the default model is missing at {}: run `minfer pull` (scripts/test.sh does)",
        p.display()
    );
    p
}

fn reference() -> Value {
    let text = include_str!("../golden/llama_reference.json");
    serde_json::from_str(text).expect("golden/llama_reference.json parses")
}

fn engine(threads: usize, n_ctx: usize) -> Engine {
    let opts = EngineOptions {
        n_threads: threads,
        n_ctx: Some(n_ctx),
        backend: None,
        n_batch: 512,
        ..EngineOptions::default()
    };
    Engine::load(&model_path(), &opts).expect("default model loads")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array of ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Top-1 agreement and the largest logit difference (over the reference's top-32 ids)
/// of minfer's rows against one reference path (`prefix` "" or "batch_").
fn agreement(rows: &[Vec<f32>], case: &Value, prefix: &str) -> (usize, f32) {
    let top_ids = case[format!("{prefix}top_ids")]
        .as_array()
        .expect("top ids");
    let top_logits = case[format!("{prefix}top_logits")]
        .as_array()
        .expect("top logits");
    let mut agree = 0;
    let mut max_diff = 0f32;
    for (p, row) in rows.iter().enumerate() {
        let ref_ids = ids(&top_ids[p]);
        if argmax(row) == ref_ids[0] {
            agree += 1;
        }
        for (k, &id) in ref_ids.iter().enumerate() {
            let l = top_logits[p][k].as_f64().expect("logit") as f32;
            max_diff = max_diff.max((row[id as usize] - l).abs());
        }
    }
    (agree, max_diff)
}

#[test]
fn teacher_forced_top1_agrees_with_llama_cpp() {
    let r = reference();
    let mut e = engine(2, 1024);
    let tok = Tokenizer::from_gguf(e.file()).expect("tokenizer");
    let n_vocab = e.n_vocab();
    let (mut agree, mut agree_batch, mut llama_self, mut total) = (0, 0, 0, 0);
    let (mut max_diff, mut max_diff_batch) = (0f32, 0f32);
    for case in r["teacher_forced"].as_array().expect("cases") {
        let prompt_ids = ids(&case["ids"]);
        let text = case["prompt"].as_str().expect("prompt");
        assert_eq!(
            tok.encode(text, true, true),
            prompt_ids,
            "tokenization of {text:?}"
        );
        e.reset();
        let logits = e
            .forward(&prompt_ids, 0, prompt_ids.len())
            .expect("forward");
        let rows: Vec<Vec<f32>> = logits.chunks(n_vocab).map(<[f32]>::to_vec).collect();
        let (a, d) = agreement(&rows, case, "");
        let (ab, db) = agreement(&rows, case, "batch_");
        agree += a;
        agree_batch += ab;
        max_diff = max_diff.max(d);
        max_diff_batch = max_diff_batch.max(db);
        total += rows.len();
        let single = case["top_ids"].as_array().expect("ids");
        let batch = case["batch_top_ids"].as_array().expect("ids");
        llama_self += single
            .iter()
            .zip(batch)
            .filter(|(x, y)| x[0] == y[0])
            .count();
    }
    let pct = |n: usize| 100.0 * n as f64 / total as f64;
    eprintln!(
        "teacher-forced over {total} positions: top-1 agreement with llama.cpp token by token \
         {:.2}% (largest logit difference {max_diff:.4}), with llama.cpp's batched prefill \
         {:.2}% ({max_diff_batch:.4}); llama.cpp's two paths agree with each other at {:.2}%",
        pct(agree),
        pct(agree_batch),
        pct(llama_self)
    );
    assert!(total >= 3 * 64);
    assert!(pct(agree) >= 99.0, "top-1 agreement {:.2}%", pct(agree));
    assert!(max_diff < 1.0, "largest logit difference {max_diff}");
    // The batched path is its own noise source: minfer must agree with it about as well as
    // llama.cpp's two paths agree with each other.
    assert!(
        pct(agree_batch) + 1.0 >= pct(llama_self),
        "batched agreement {:.2}%",
        pct(agree_batch)
    );
}

#[test]
fn greedy_continuations_match_llama_cpp_on_most_prompts() {
    let r = reference();
    let mut e = engine(2, 1024);
    let cases = r["greedy"].as_array().expect("cases");
    let mut identical = 0;
    let mut common_prefix = Vec::new();
    for case in cases {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["continuation"]);
        let got = greedy_tokens(&mut e, &prompt, want.len()).expect("greedy");
        let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        common_prefix.push(same);
        if got == want {
            identical += 1;
        }
    }
    eprintln!(
        "greedy: {identical}/{} continuations of 64 tokens identical; common prefixes {common_prefix:?}",
        cases.len()
    );
    assert!(cases.len() >= 5);
    assert!(identical * 2 > cases.len(), "only {identical} identical");
}

#[test]
fn perplexity_is_within_half_a_percent_of_llama_cpp() {
    let r = reference();
    let want = r["perplexity"]["ppl"].as_f64().expect("ppl");
    let want_chunks = r["perplexity"]["chunks"].as_u64().expect("chunks") as usize;
    let n_ctx = 512;
    let mut e = engine(2, n_ctx);
    let tok = Tokenizer::from_gguf(e.file()).expect("tokenizer");
    let text = include_str!("../golden/ppl_text.txt");
    let tokens = tok.encode(text, true, false);
    let n_chunk = tokens.len() / n_ctx;
    assert_eq!(n_chunk, want_chunks, "chunk count (tokenization) differs");
    let acc = perplexity(&mut e, &tokens, n_ctx, None, |_, _| {}).expect("perplexity");
    let (ppl, _) = acc.estimate();
    let rel = (ppl - want).abs() / want;
    eprintln!(
        "perplexity: minfer {ppl:.4}, llama.cpp {want:.4}, relative difference {:.3}%",
        rel * 100.0
    );
    assert!(rel < 0.005, "perplexity {ppl} vs {want}");
}

#[test]
fn graph_reuse_is_bitwise_identical_to_rebuilding_every_step() {
    let prompt = [750u32, 75698, 1445, 1648];
    let run = |rebuild: bool| {
        let mut e = engine(2, 256);
        e.set_rebuild_every_step(rebuild);
        let mut logits = e.prefill(&prompt, 0).expect("prefill");
        let mut all = logits.clone();
        for i in 0..24 {
            let t = argmax(&logits);
            logits = e.forward(&[t], prompt.len() + i, 1).expect("decode");
            all.extend_from_slice(&logits);
        }
        (all, e.counters())
    };
    let (reused, c_reused) = run(false);
    let (fresh, c_fresh) = run(true);
    assert_eq!(
        reused.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        fresh.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        "logits differ between reuse and rebuild"
    );
    // One build for the prefill, one at the prefill→decode transition, none after.
    assert_eq!(c_reused.builds, 2, "{c_reused:?}");
    assert_eq!(c_reused.reuses, 23, "{c_reused:?}");
    assert_eq!(c_fresh.builds, 25, "{c_fresh:?}");
}

#[test]
fn thread_count_does_not_change_logits() {
    let prompt: Vec<u32> = (0..40).map(|i| 1000 + i * 37).collect();
    let run = |t: usize| {
        let mut e = engine(t, 128);
        let mut out = e.forward(&prompt, 0, 4).expect("prefill");
        out.extend(e.forward(&[42], prompt.len(), 1).expect("decode"));
        out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(2), "-t 1 and -t 2 logits differ");
}
