//! The CPU decode fusions (`FusedQKV`, `FusedQkvNorm`, `FusedFFN`) against the unfused
//! chain: the same logits bit for bit at every step and the same greedy tokens, on the tiny
//! Qwen2, Qwen3 and Llama models and on the default model, with fused decode graphs
//! actually built (so the comparison cannot pass vacuously).
//!
//! The fusions are an engine option (`EngineOptions::backend_options`, which the command
//! line fills from `MINFER_FUSE`), so each engine here is built with the value it needs.

use minfer_gguf::GgufFile;
use minfer_graph::Op;
use minfer_models::testing::{golden_models, tiny_model_bytes};
use minfer_runtime::{sampling::argmax, Engine, EngineOptions, Fusions};

/// The fusions a `MINFER_FUSE` value asks for.
fn fusions(fuse: &str) -> Fusions {
    match fuse {
        "1" => Fusions::ALL,
        "qkv" => Fusions {
            qkv: true,
            ffn: false,
        },
        "ffn" => Fusions {
            qkv: false,
            ffn: true,
        },
        _ => Fusions::NONE,
    }
}

fn opts(threads: usize, n_ctx: usize, fuse: &str) -> EngineOptions {
    let mut o = EngineOptions {
        n_threads: threads,
        n_ctx: Some(n_ctx),
        backend: Some("cpu".into()),
        n_batch: 512,
        ..EngineOptions::default()
    };
    o.backend_options.fusions = fusions(fuse);
    o
}

fn tiny(name: &str, threads: usize, fuse: &str) -> Engine {
    let spec = golden_models()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("no tiny model {name}"));
    let file = GgufFile::from_bytes(tiny_model_bytes(&spec).expect("writer")).expect("reader");
    Engine::from_gguf(file, &opts(threads, 64, fuse)).expect("engine")
}

/// How many nodes of the decode graph are each fused op: (qkv, qkv with norm, ffn).
fn fused_counts(e: &mut Engine) -> (usize, usize, usize) {
    let g = e.preview_graph(1, 1).expect("decode graph");
    let count = |f: &dyn Fn(&Op) -> bool| g.nodes.iter().filter(|n| f(&n.op)).count();
    (
        count(&|op| matches!(op, Op::FusedQKV { .. })),
        count(&|op| matches!(op, Op::FusedQkvNorm { .. })),
        count(&|op| matches!(op, Op::FusedFFN)),
    )
}

/// Prefill `prompt`, then `steps` greedy decode steps; every step's logits as bits, and
/// the tokens chosen.
fn greedy_bits(e: &mut Engine, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<u32>) {
    let mut logits = e.prefill(prompt, 0).expect("prefill");
    let mut bits: Vec<u32> = logits.iter().map(|x| x.to_bits()).collect();
    let mut tokens = Vec::new();
    for i in 0..steps {
        let t = argmax(&logits);
        tokens.push(t);
        logits = e.forward(&[t], prompt.len() + i, 1).expect("decode");
        bits.extend(logits.iter().map(|x| x.to_bits()));
    }
    (bits, tokens)
}

#[test]
fn tiny_models_decode_the_same_bits_fused_and_unfused() {
    let prompt = [1u32, 17, 42, 5, 99, 3];
    // (model, fused QKV kind expected: plain or with the q/k norm); the Llama 3 models
    // carry rope frequency factors, which the fused QKV kernels have no term for, so only
    // their FFN fuses.
    let cases = [
        ("qwen2-f32", Some(false)),
        ("qwen2-q8_0", Some(false)),
        ("qwen3-f32", Some(true)),
        ("qwen3-q8_0", Some(true)),
        ("qwen3-q4_k", Some(true)),
        ("qwen3-q6_k", Some(true)),
        ("llama-q8_0", Some(false)),
        ("llama3-q4_k", None),
    ];
    for (name, qkv) in cases {
        let mut plain = tiny(name, 2, "0");
        assert_eq!(fused_counts(&mut plain), (0, 0, 0), "{name}: MINFER_FUSE=0");
        let mut fused = tiny(name, 2, "1");
        let (q, qn, f) = fused_counts(&mut fused);
        assert!(f > 0, "{name}: no FusedFFN in the fused decode graph");
        match qkv {
            Some(false) => assert!(q > 0 && qn == 0, "{name}: {q} FusedQKV, {qn} FusedQkvNorm"),
            Some(true) => assert!(qn > 0 && q == 0, "{name}: {q} FusedQKV, {qn} FusedQkvNorm"),
            None => assert_eq!(q + qn, 0, "{name}: fused QKV with frequency factors"),
        }
        let (want, want_tokens) = greedy_bits(&mut plain, &prompt, 12);
        let (got, got_tokens) = greedy_bits(&mut fused, &prompt, 12);
        assert_eq!(got_tokens, want_tokens, "{name}: greedy tokens differ");
        assert!(got == want, "{name}: fused logits differ from unfused");
        // One thread fused against two unfused: the fusions keep thread independence.
        let (one, _) = greedy_bits(&mut tiny(name, 1, "1"), &prompt, 12);
        assert!(one == want, "{name}: fused -t 1 differs");
    }
}

#[test]
fn each_fusion_switches_alone() {
    let mut qkv = tiny("qwen2-q8_0", 2, "qkv");
    let (q, _, f) = fused_counts(&mut qkv);
    assert!(
        q > 0 && f == 0,
        "MINFER_FUSE=qkv: {q} FusedQKV, {f} FusedFFN"
    );
    let mut ffn = tiny("qwen2-q8_0", 2, "ffn");
    let (q, _, f) = fused_counts(&mut ffn);
    assert!(
        q == 0 && f > 0,
        "MINFER_FUSE=ffn: {q} FusedQKV, {f} FusedFFN"
    );
}

#[test]
fn default_model_decodes_the_same_bits_fused_and_unfused() {
    let path = minfer_hub::default_model_path();
    assert!(
        path.exists(),
        "the default model is missing at {}: run `minfer pull` (scripts/test.sh does)",
        path.display()
    );
    let load = |fuse: &str| Engine::load(&path, &opts(2, 256, fuse)).expect("load");
    let prompt = [750u32, 75698, 1445, 1648, 13, 4340];
    let mut plain = load("0");
    let mut fused = load("1");
    let (q, _, f) = fused_counts(&mut fused);
    // Half the default model's layers store V as Q8_0 beside Q5_0 q/k: those keep three
    // matmuls; every layer's gate and up fuse.
    assert!(q > 0 && f == 24, "{q} FusedQKV, {f} FusedFFN");
    let (want, want_tokens) = greedy_bits(&mut plain, &prompt, 16);
    let (got, got_tokens) = greedy_bits(&mut fused, &prompt, 16);
    assert_eq!(got_tokens, want_tokens, "greedy tokens differ");
    assert!(got == want, "fused logits differ from unfused");
}
