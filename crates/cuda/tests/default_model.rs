//! The default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M) through `Engine` with the
//! CUDA backend selected by the fence, against the CPU backend: teacher-forced top-1
//! agreement over the reference prompts (>= 99%), perplexity on the reference text
//! (within 0.5%), and CUDA Graph replay bit parity against direct launches. Skips
//! (saying so) without a device, fails there under `MINFER_CUDA_TESTS=require`
//! (`scripts/gpu_check.sh` sets it).

use std::sync::Arc;
use std::time::Instant;

use minfer_gguf::GgufFile;
use minfer_hub::testing::default_model_file;
use minfer_runtime::perplexity::perplexity;
use minfer_runtime::sampling::argmax;
use minfer_runtime::testing::{fenced, ids, reference};
use minfer_runtime::Engine;
use minfer_tokenizer::Tokenizer;

/// Perplexity: chunks of this many tokens of the reference text (second halves scored).
const PPL_CTX: usize = 256;
/// Chunks scored.
const PPL_CHUNKS: usize = 2;
/// Decode steps of the replay parity check (past warm-up and capture).
const PARITY_STEPS: usize = 24;

/// CPU threads of each engine.
const THREADS: usize = 4;

/// The build's backend table as a binary with the `cuda` feature has it.
const FACTORIES: [minfer_graph::BackendFactory; 2] = [minfer_cpu::FACTORY, minfer_cuda::FACTORY];

fn engine(f: &Arc<GgufFile>, backend: &str, n_ctx: usize) -> Engine {
    Engine::with_factories(Arc::clone(f), &fenced(backend, n_ctx, THREADS), &FACTORIES)
        .expect("engine")
}

#[test]
fn teacher_forced_top1_agrees_with_the_cpu_backend() {
    if !minfer_cuda::testing::device_or_skip("cuda teacher-forced top-1") {
        return;
    }
    let f = default_model_file();
    let mut g = engine(&f, "cuda", 512);
    let mut c = engine(&f, "cpu", 512);
    assert_eq!(g.backend_info()[0].name, "cuda");
    let n_vocab = g.n_vocab();
    let (mut agree, mut total) = (0usize, 0usize);
    let t0 = Instant::now();
    for case in reference()["teacher_forced"].as_array().expect("cases") {
        let prompt = ids(&case["ids"]);
        g.reset();
        c.reset();
        let lg = g.forward(&prompt, 0, prompt.len()).expect("cuda forward");
        let lc = c.forward(&prompt, 0, prompt.len()).expect("cpu forward");
        for (p, (rg, rc)) in lg.chunks(n_vocab).zip(lc.chunks(n_vocab)).enumerate() {
            let (tg, tc) = (argmax(rg), argmax(rc));
            if tg != tc {
                eprintln!(
                    "position {p}: cuda {tg} ({:.3} over cpu's pick), cpu {tc} ({:.3} over cuda's)",
                    rg[tg as usize] - rg[tc as usize],
                    rc[tc as usize] - rc[tg as usize]
                );
            }
            agree += usize::from(tg == tc);
            total += 1;
        }
    }
    let pct = 100.0 * agree as f64 / total as f64;
    println!(
        "RESULT top1_agreement {agree}/{total} = {pct:.2}% (teacher-forced, every reference prompt, {:.1?})",
        t0.elapsed()
    );
    assert!(total >= 64, "{total} positions");
    assert!(pct >= 99.0, "top-1 agreement {pct:.2}% is below 99%");
}

fn ppl(f: &Arc<GgufFile>, backend: &str) -> f64 {
    let tok = Tokenizer::from_gguf(f).expect("tokenizer");
    let tokens = tok.encode(
        include_str!("../../runtime/tests/golden/ppl_text.txt"),
        true,
        false,
    );
    let mut e = engine(f, backend, PPL_CTX);
    let acc = perplexity(&mut e, &tokens, PPL_CTX, Some(PPL_CHUNKS), |_, _| {}).expect("ppl");
    acc.estimate().0
}

#[test]
fn perplexity_is_within_half_a_percent_of_the_cpu_backend() {
    if !minfer_cuda::testing::device_or_skip("cuda perplexity") {
        return;
    }
    let f = default_model_file();
    let (pg, pc) = (ppl(&f, "cuda"), ppl(&f, "cpu"));
    let rel = (pg - pc).abs() / pc;
    println!(
        "RESULT perplexity cuda {pg:.4} cpu {pc:.4} relative difference {:.3}% ({PPL_CHUNKS} chunks of {PPL_CTX})",
        rel * 100.0
    );
    assert!(
        pg.is_finite() && rel < 0.005,
        "relative difference {:.3}%",
        rel * 100.0
    );
}

/// Greedy decode logits, step by step, of an engine built from `factory`.
fn greedy(f: &Arc<GgufFile>, factory: minfer_graph::BackendFactory) -> Vec<Vec<u32>> {
    let mut factories = vec![minfer_cpu::FACTORY, factory];
    factories.dedup_by_key(|f| f.id);
    let mut e = Engine::with_factories(Arc::clone(f), &fenced("cuda", 256, THREADS), &factories)
        .expect("cuda engine");
    let prompt = [750u32, 3974, 6860, 10939, 982, 262, 4210, 10231];
    let mut out = Vec::new();
    let mut logits = e.forward(&prompt, 0, 1).expect("prefill");
    for k in 0..PARITY_STEPS {
        out.push(logits.iter().map(|v| v.to_bits()).collect());
        let next = argmax(&logits);
        logits = e.forward(&[next], prompt.len() + k, 1).expect("decode");
    }
    out
}

#[test]
fn graph_replay_gives_the_bits_of_direct_launches() {
    if !minfer_cuda::testing::device_or_skip("cuda replay parity") {
        return;
    }
    // The engines' options are the defaults (replay on, no trace or profile), whatever
    // the environment holds: libraries never read it.
    let f = default_model_file();
    let before = minfer_cuda::process_replay_stats();
    let replayed = greedy(&f, minfer_cuda::FACTORY);
    let mid = minfer_cuda::process_replay_stats();
    let direct = greedy(&f, minfer_cuda::FACTORY_DIRECT);
    let after = minfer_cuda::process_replay_stats();
    assert!(
        mid.captured > before.captured,
        "no split was captured: {mid:?}"
    );
    assert!(
        mid.replayed > before.replayed,
        "no split was replayed: {mid:?}"
    );
    assert_eq!(after.replayed, mid.replayed, "the direct engine replayed");
    for (k, (a, b)) in replayed.iter().zip(&direct).enumerate() {
        assert!(
            a == b,
            "decode step {k}: replayed logits differ from direct launches"
        );
    }
    println!(
        "RESULT replay_parity bit-identical over {PARITY_STEPS} decode steps ({} splits captured, {} replayed)",
        mid.captured - before.captured,
        mid.replayed - before.replayed
    );
}
