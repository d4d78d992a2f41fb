//! Throughput of the default model on the CUDA backend, printed as `RESULT` lines that
//! `scripts/gpu_check.sh` collects: decode tokens/s and its share of the device's memory
//! bandwidth limit, prefill tokens/s, and batched decode throughput at 1, 4 and 16
//! streams. Ignored by default (it measures, it does not check); the script runs it
//! with `--ignored`, and under `MINFER_CUDA_TESTS=require` it fails without a device.

use std::sync::Arc;
use std::time::Instant;

use minfer_gguf::GgufFile;
use minfer_hub::testing::default_model_file;
use minfer_runtime::engine::TokenRows;
use minfer_runtime::sampling::argmax;
use minfer_runtime::testing::fenced;
use minfer_runtime::Engine;

/// H200 HBM3e peak bandwidth, bytes/s (the figure the decode share is taken against).
const H200_BANDWIDTH: f64 = 4.8e12;
const DECODE_STEPS: usize = 128;
const PREFILL: usize = 512;
const STREAM_STEPS: usize = 64;

fn engine(f: &Arc<GgufFile>, n_ctx: usize) -> Engine {
    let factories = [minfer_cpu::FACTORY, minfer_cuda::FACTORY];
    Engine::with_factories(Arc::clone(f), &fenced("cuda", n_ctx, 4), &factories)
        .expect("cuda engine")
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 900 + 401 * salt + 13 * i).collect()
}

#[test]
#[ignore = "measures throughput; scripts/gpu_check.sh runs it"]
fn cuda_throughput_on_the_default_model() {
    if !minfer_cuda::testing::device_or_skip("cuda benchmark") {
        return;
    }
    let f = default_model_file();
    // Bytes a decode step reads: every weight once (the tied embedding as the lm head).
    let weight_bytes: usize = f.tensors().iter().map(|t| f.tensor_data(t).len()).sum();
    let mut e = engine(&f, 1024);
    println!(
        "RESULT device {}",
        e.backend_info()[0]
            .device
            .as_ref()
            .map_or("?".into(), |d| d.name.clone())
    );

    // Prefill: a warm-up pass, then the timed one from an empty cache.
    let prompt = tokens(PREFILL, 0);
    e.forward(&prompt, 0, 1).expect("warm-up prefill");
    e.reset();
    let t0 = Instant::now();
    let mut logits = e.forward(&prompt, 0, 1).expect("prefill");
    let pp = PREFILL as f64 / t0.elapsed().as_secs_f64();
    println!("RESULT prefill_tps {pp:.1} (pp{PREFILL})");

    // Decode: warm-up steps (capture happens there), then timed greedy steps.
    let mut pos = PREFILL;
    for _ in 0..4 {
        logits = e.forward(&[argmax(&logits)], pos, 1).expect("decode");
        pos += 1;
    }
    let t0 = Instant::now();
    for _ in 0..DECODE_STEPS {
        logits = e.forward(&[argmax(&logits)], pos, 1).expect("decode");
        pos += 1;
    }
    let tg = DECODE_STEPS as f64 / t0.elapsed().as_secs_f64();
    let share = tg * weight_bytes as f64 / H200_BANDWIDTH;
    println!(
        "RESULT decode_tps {tg:.1} (tg{DECODE_STEPS} after pp{PREFILL}); {:.0} MB of weights a step, {:.1}% of the H200's 4.8 TB/s",
        weight_bytes as f64 / 1e6,
        share * 100.0
    );
    println!("RESULT replay {:?}", minfer_cuda::process_replay_stats());

    // Batched decode at 1, 4 and 16 streams: every stream's token in one execution
    // per step over a shared KV arena (what the server's batching does; on by default).
    let slot_ctx = 256;
    let mut m = engine(&f, 16 * slot_ctx);
    m.set_explicit_span(true);
    for n in [1usize, 4, 16] {
        m.reset();
        let mut last: Vec<u32> = (0..n).map(|s| 900 + 401 * s as u32).collect();
        let mut t0 = Instant::now();
        for k in 0..4 + STREAM_STEPS {
            if k == 4 {
                t0 = Instant::now();
            }
            let positions: Vec<u32> = vec![k as u32; n];
            let cells: Vec<u32> = (0..n).map(|s| (s * slot_ctx + k) as u32).collect();
            let spans: Vec<[u32; 2]> = (0..n)
                .map(|s| [(s * slot_ctx) as u32, (s * slot_ctx + k + 1) as u32])
                .collect();
            let out_rows: Vec<u32> = (0..n as u32).collect();
            let rows = TokenRows {
                tokens: &last,
                positions: &positions,
                cells: &cells,
                spans: &spans,
                out_rows: &out_rows,
            };
            let logits = m.forward_rows(&rows).expect("batched step");
            last = logits.chunks(m.n_vocab()).map(argmax).collect();
        }
        let tps = (n * STREAM_STEPS) as f64 / t0.elapsed().as_secs_f64();
        println!("RESULT batched_tps streams={n} {tps:.1} aggregate tokens/s");
    }
}
