//! The default model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M) on wgpu against the CPU:
//! teacher-forced top-1 over a reference prompt, then decode over the device KV.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::run_model;
use minfer_gguf::GgufFile;

/// The first tokens of the quicksort reference prompt (the runtime's golden set). Kept
/// short: lavapipe, the software driver CI uses, runs the model at a few seconds a token.
const PROMPT: [u32; 8] = [750, 3974, 6860, 10939, 982, 262, 4210, 10231];

/// Teacher-forced continuation of the prompt, decoded one token per step.
const DECODE: [u32; 2] = [264, 1140];

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0
}

#[test]
fn default_model_on_wgpu_agrees_with_the_cpu_top1() {
    let path = minfer_hub::default_model_path();
    assert!(
        path.exists(),
        "the default model is missing at {}: run `minfer pull` (scripts/test.sh does)",
        path.display()
    );
    let file = Arc::new(GgufFile::open(&path).expect("default model opens"));
    let model = minfer_models::load_model(&file).expect("model");
    let n = PROMPT.len();
    let t0 = Instant::now();
    let Some(gpu) = run_model(&*model, &file, true, false, &[], &PROMPT, n, &DECODE) else {
        return;
    };
    let t_gpu = t0.elapsed();
    let cpu = run_model(&*model, &file, false, false, &[], &PROMPT, n, &DECODE).expect("cpu");
    let n_vocab = cpu[1].logits.len();
    // Rows: the prompt's n rows from the prefill step, then one per decode step.
    let rows = |steps: &[common::Step]| -> Vec<Vec<f32>> {
        steps
            .iter()
            .flat_map(|s| {
                s.logits
                    .chunks(n_vocab)
                    .map(<[f32]>::to_vec)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let (g, c) = (rows(&gpu), rows(&cpu));
    assert_eq!(g.len(), n + DECODE.len());
    let agree = g
        .iter()
        .zip(&c)
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    let err = g
        .iter()
        .zip(&c)
        .map(|(a, b)| common::rel_err(a, b))
        .fold(0.0f32, f32::max);
    for (i, (a, b)) in gpu.iter().zip(&cpu).enumerate() {
        eprintln!("step {i}: wgpu {:.2?}, cpu {:.2?}", a.time, b.time);
    }
    eprintln!(
        "default model: top-1 agreement {agree}/{} with the CPU, max logits error {err:.2e}, wgpu run {t_gpu:.1?}",
        g.len()
    );
    // The CPU quantizes activations to Q8 before its quantized matmuls, the shaders
    // do not: rows whose top two logits are closer than that noise may flip.
    assert!(
        agree * 100 >= g.len() * 95,
        "top-1 agreement {agree}/{}",
        g.len()
    );
    assert!(err <= 5e-2, "max logits error {err:e}");
}

/// Decode step time on wgpu with the QKV fusions against the unfused chain (on demand:
/// `cargo test --release -p minfer-wgpu --test default_model -- --ignored --nocapture`).
/// The fusion is claimed only where it is not slower; the figures are in BENCHMARKS.md.
#[test]
#[ignore = "a measurement, about a minute on lavapipe"]
fn decode_qkv_fusion_speed() {
    let file = Arc::new(GgufFile::open(&minfer_hub::default_model_path()).expect("default model"));
    let model = minfer_models::load_model(&file).expect("model");
    let decode = [264u32, 1140, 311, 3378, 1140, 13];
    let prompt = &PROMPT[..2];
    let mut report = Vec::new();
    // Alternating, so drifting machine load hits both alike.
    for round in 0..2 {
        for fuse in [false, true] {
            let steps =
                common::run_model_fused(&*model, &file, true, false, &[], prompt, 1, &decode, fuse)
                    .expect("adapter");
            assert_eq!(steps[1].fused_qkv > 0, fuse);
            let mut t: Vec<f64> = steps[1..].iter().map(|s| s.time.as_secs_f64()).collect();
            t.sort_by(f64::total_cmp);
            report.push((round, fuse, t[t.len() / 2]));
        }
    }
    for (round, fuse, median) in &report {
        eprintln!("round {round}: fused {fuse}: median decode step {median:.3} s");
    }
}
