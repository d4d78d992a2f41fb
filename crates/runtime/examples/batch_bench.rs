//! Aggregate decode speed of 1, 2 and 4 concurrent greedy streams on the default model,
//! batched (one graph execution per step for all streams) against serial (one execution
//! per stream per step).
//!
//! `cargo run --release -p minfer-runtime --example batch_bench [threads] [steps] [rounds]`
//! (defaults: 2 threads, 24 timed steps, 5 rounds). The modes alternate round by round
//! and each reports its best round, so a busy machine skews both alike.

use std::time::Instant;

use minfer_runtime::sampling::argmax;
use minfer_runtime::{EngineError, EngineOptions, MultiEngine, SeqStep};

const MAX_STREAMS: usize = 4;
const PROMPT: usize = 16;
const WARMUP: usize = 4;

/// Prefills `n` streams, then times `steps` decode steps; returns tokens per second.
fn run(m: &mut MultiEngine, n: usize, steps: usize) -> Result<f64, EngineError> {
    let prompts: Vec<SeqStep> = (0..n)
        .map(|s| SeqStep {
            slot: s,
            tokens: (0..PROMPT as u32)
                .map(|i| 900 + 401 * s as u32 + 13 * i)
                .collect(),
            pos0: 0,
            n_out: 1,
        })
        .collect();
    for s in 0..n {
        m.reset_slot(s)?;
    }
    let mut last: Vec<u32> = m.step(&prompts)?.iter().map(|l| argmax(l)).collect();
    let mut t0 = Instant::now();
    for k in 0..WARMUP + steps {
        if k == WARMUP {
            t0 = Instant::now();
        }
        let batch: Vec<SeqStep> = (0..n)
            .map(|s| SeqStep {
                slot: s,
                tokens: vec![last[s]],
                pos0: PROMPT + k,
                n_out: 1,
            })
            .collect();
        last = m.step(&batch)?.iter().map(|l| argmax(l)).collect();
    }
    Ok((n * steps) as f64 / t0.elapsed().as_secs_f64())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map_or(Ok(2), |a| a.parse())?;
    let steps: usize = args.next().map_or(Ok(24), |a| a.parse())?;
    let rounds: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    let path = minfer_hub::default_model_path();
    if !path.exists() {
        return Err(format!("no model at {}: run `minfer pull`", path.display()).into());
    }
    let opts = EngineOptions {
        n_threads: threads,
        n_ctx: Some(MAX_STREAMS * 256),
        ..EngineOptions::default()
    };
    let mut m = MultiEngine::load(&path, &opts, MAX_STREAMS)?;
    println!(
        "{threads} threads, best of {rounds} rounds of {steps} decode steps \
         (after {WARMUP} warm-up, prompt {PROMPT}), aggregate tokens/s"
    );
    println!("streams  serial t/s  batched t/s  speedup");
    for n in [1, 2, 4] {
        let (mut serial, mut batched) = (0f64, 0f64);
        for _ in 0..rounds {
            m.set_batching(false);
            serial = serial.max(run(&mut m, n, steps)?);
            m.set_batching(true);
            batched = batched.max(run(&mut m, n, steps)?);
        }
        println!(
            "{n:>7}  {serial:>10.1}  {batched:>11.1}  {:>6.2}x",
            batched / serial
        );
    }
    Ok(())
}
