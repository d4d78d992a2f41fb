//! The tiny mixture-of-experts models (Qwen3-MoE, Qwen2-MoE; F32, Q8_0, Q4_K; gpt-oss) on the CPU
//! engine: greedy decode is bitwise the same whether the decode graph is reused or rebuilt
//! every step and whatever the thread count, as for the dense models (batch composition:
//! `batch.rs` runs the golden set, these models included); speculative decoding gives
//! the plain greedy tokens, and a restored session goes on bit for bit.

use minfer_gguf::GgufFile;
use minfer_models::testing::{golden_models, tiny_model_bytes, TinySpec};
use minfer_runtime::{sampling::argmax, Engine, EngineOptions};

const PROMPT: [u32; 8] = [72, 101, 108, 108, 111, 44, 32, 300];

fn moe_models() -> Vec<(&'static str, TinySpec)> {
    let v: Vec<_> = golden_models()
        .into_iter()
        .filter(|(_, s)| s.moe.is_some())
        .collect();
    // Qwen3-MoE and Qwen2-MoE in three types each, Qwen3.5-MoE, Qwen3-Next, and gpt-oss
    // in two types.
    assert_eq!(v.len(), 10, "the golden set's MoE models");
    v
}

fn engine(spec: &TinySpec, threads: usize) -> Engine {
    let file = GgufFile::from_bytes(tiny_model_bytes(spec).expect("writer")).expect("reader");
    let opts = EngineOptions {
        n_threads: threads,
        n_ctx: Some(64),
        backend: None,
        n_batch: 512,
        ..EngineOptions::default()
    };
    Engine::from_gguf(file, &opts).expect("engine")
}

/// The prompt's last four rows and 16 greedy decode steps, as bits.
fn greedy_bits(e: &mut Engine) -> Vec<u32> {
    let mut out = e.forward(&PROMPT, 0, 4).expect("prefill");
    let mut logits = out[out.len() - e.n_vocab()..].to_vec();
    for i in 0..16 {
        let t = argmax(&logits);
        logits = e.forward(&[t], PROMPT.len() + i, 1).expect("decode");
        out.extend_from_slice(&logits);
    }
    out.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn moe_graph_reuse_is_bitwise_identical_to_rebuilding_every_step() {
    for (name, spec) in moe_models() {
        let run = |rebuild: bool| {
            let mut e = engine(&spec, 2);
            e.set_rebuild_every_step(rebuild);
            (greedy_bits(&mut e), e.counters())
        };
        let (reused, c) = run(false);
        let (fresh, _) = run(true);
        assert!(
            reused == fresh,
            "{name}: logits differ between reuse and rebuild"
        );
        assert_eq!((c.builds, c.reuses), (2, 15), "{name}: {c:?}");
    }
}

#[test]
fn moe_thread_count_does_not_change_logits() {
    for (name, spec) in moe_models() {
        let one = greedy_bits(&mut engine(&spec, 1));
        for t in [2, 3] {
            assert!(
                greedy_bits(&mut engine(&spec, t)) == one,
                "{name}: -t 1 and -t {t} logits differ"
            );
        }
    }
}

/// Speculative decoding on the Qwen3-MoE and Qwen2-MoE models (n-gram lookup drafts,
/// some rejected): the tokens of plain greedy decode.
#[test]
fn moe_speculation_gives_the_plain_greedy_tokens() {
    use minfer_runtime::{
        generate, generate_speculative, GenerateOptions, NgramLookup, SamplingParams, Speculator,
    };
    use minfer_tokenizer::Tokenizer;
    let gen = GenerateOptions {
        max_tokens: 24,
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        constraint: None,
    };
    for (name, spec) in moe_models()
        .into_iter()
        .filter(|(_, s)| matches!(s.arch, "qwen3moe" | "qwen2moe"))
    {
        let mut e = engine(&spec, 2);
        let tok = Tokenizer::from_gguf(e.file()).expect("tokenizer");
        let mut rejected = 0;
        for text in ["a b c a b c a b c a b", "1, 2, 1, 2, 1, 2, 1, 2,"] {
            let prompt = tok.encode(text, true, true);
            let plain = generate(&mut e, &tok, &prompt, &gen, |_| true)
                .expect("plain")
                .tokens;
            let mut sp = Speculator::new(Box::new(NgramLookup::new()), 4).expect("speculator");
            sp.set_fixed_depth(Some(3));
            let got = generate_speculative(&mut e, &tok, &prompt, 0, &gen, Some(&mut sp), |_| true)
                .expect("speculative")
                .tokens;
            assert_eq!(got, plain, "{name}: {text:?}");
            let s = sp.stats();
            rejected += s.drafted - s.accepted;
        }
        assert!(rejected > 0, "{name}: no draft was rejected");
    }
}

/// A session saved after the prompt of a Qwen3-MoE model and restored into a new engine
/// goes on bit for bit as the engine that never stopped.
#[test]
fn a_restored_moe_session_goes_on_bit_for_bit() {
    use minfer_runtime::session;
    let (name, spec) = moe_models()
        .into_iter()
        .find(|(_, s)| s.arch == "qwen3moe")
        .expect("a qwen3moe model");
    let d = std::env::temp_dir().join(format!("minfer-moe-session-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    let path = d.join("s.kv");
    let want = greedy_bits(&mut engine(&spec, 1));
    let mut first = engine(&spec, 1);
    let out = first.forward(&PROMPT, 0, 4).expect("prefill");
    session::save(&mut first, &PROMPT, &path).expect("save");
    drop(first);
    let mut second = engine(&spec, 2);
    assert_eq!(session::load(&mut second, &path).expect("load"), PROMPT);
    let mut got = out.clone();
    let mut logits = out[out.len() - second.n_vocab()..].to_vec();
    for i in 0..16 {
        let t = argmax(&logits);
        logits = second.forward(&[t], PROMPT.len() + i, 1).expect("decode");
        got.extend_from_slice(&logits);
    }
    let got: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
    assert!(
        got == want,
        "{name}: the restored session goes on otherwise"
    );
    let _ = std::fs::remove_dir_all(&d);
}
