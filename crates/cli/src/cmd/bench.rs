//! `minfer bench`: throughput measured as llama-bench measures it. `ppN` is one batched
//! prefill of N random tokens from an empty KV cache; `tgN` is N single-token decodes
//! from an empty KV cache; each test has one untimed warm-up run, and t/s is computed
//! per repetition and reported as mean ± sample standard deviation.

use std::time::Instant;

use anyhow::bail;
use serde_json::json;

use super::common::{usize_in, ModelArgs, MAX_CTX};

/// Arguments of `minfer bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the pp test, 0..=16777216 (0 skips it).
    #[arg(
        short = 'p',
        long = "n-prompt",
        default_value_t = 512,
        value_parser = usize_in(0..=MAX_CTX)
    )]
    pub n_prompt: usize,
    /// Generated tokens of the tg test, 0..=16777216 (0 skips it).
    #[arg(
        short = 'n',
        long = "n-gen",
        default_value_t = 128,
        value_parser = usize_in(0..=MAX_CTX)
    )]
    pub n_gen: usize,
    /// Repetitions of each test, 1..=1000000.
    #[arg(
        short = 'r',
        long = "repetitions",
        default_value_t = 5,
        value_parser = usize_in(1..=1_000_000)
    )]
    pub reps: usize,
    /// Output format.
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    pub output: String,
}

/// One test's samples.
struct TestResult {
    name: String,
    n_prompt: usize,
    n_gen: usize,
    samples: Vec<f64>,
}

impl TestResult {
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len().max(1) as f64
    }

    fn stddev(&self) -> f64 {
        let n = self.samples.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.samples.iter().map(|s| (s - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

/// A tiny xorshift stream: the tokens only need to be valid and not repetitive.
fn random_tokens(n: usize, n_vocab: usize, seed: &mut u64) -> Vec<u32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed % n_vocab as u64) as u32
        })
        .collect()
}

/// With `MINFER_PROFILE=1`, prints where the last test's time went, per op, to stderr.
fn print_profile(engine: &minfer_runtime::Engine, test: &str) {
    let p = engine.take_profile();
    let total: f64 = p.iter().map(|x| x.1.as_secs_f64()).sum();
    if total == 0.0 {
        return;
    }
    eprintln!("{test}: time per op (all repetitions, warm-up included)");
    for (op, d, n) in p {
        let s = d.as_secs_f64();
        eprintln!(
            "  {op:<16} {:>9.1} ms {:>5.1}%  {n} runs",
            s * 1e3,
            100.0 * s / total
        );
    }
}

/// Runs `minfer bench`.
pub fn run(mut args: Args) -> anyhow::Result<()> {
    if args.n_prompt == 0 && args.n_gen == 0 {
        bail!("nothing to measure: both -p and -n are 0");
    }
    if args.model.ctx.is_none() {
        args.model.ctx = Some(args.n_prompt.max(args.n_gen).max(1));
    }
    let mut engine = args.model.load()?;
    let n_vocab = engine.n_vocab();
    let threads = args.model.engine_options().n_threads;
    // As llama-bench's column: the backends that ran, highest priority first.
    let backend = engine
        .backend_info()
        .iter()
        .map(|b| b.name.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut results = Vec::new();

    if args.n_prompt > 0 {
        let mut samples = Vec::new();
        for rep in 0..=args.reps {
            let tokens = random_tokens(args.n_prompt, n_vocab, &mut seed);
            engine.reset();
            let t0 = Instant::now();
            engine.prefill(&tokens, 0)?;
            let dt = t0.elapsed().as_secs_f64();
            if rep > 0 {
                samples.push(args.n_prompt as f64 / dt);
            }
        }
        results.push(TestResult {
            name: format!("pp{}", args.n_prompt),
            n_prompt: args.n_prompt,
            n_gen: 0,
            samples,
        });
    }
    print_profile(&engine, "pp");
    if args.n_gen > 0 {
        let mut samples = Vec::new();
        for rep in 0..=args.reps {
            let tokens = random_tokens(args.n_gen, n_vocab, &mut seed);
            engine.reset();
            let t0 = Instant::now();
            for (pos, &t) in tokens.iter().enumerate() {
                engine.forward(&[t], pos, 1)?;
            }
            let dt = t0.elapsed().as_secs_f64();
            if rep > 0 {
                samples.push(args.n_gen as f64 / dt);
            }
        }
        results.push(TestResult {
            name: format!("tg{}", args.n_gen),
            n_prompt: 0,
            n_gen: args.n_gen,
            samples,
        });
    }

    print_profile(&engine, "tg");
    let file = engine.file();
    let model_name = file
        .get_str("general.name")
        .unwrap_or(engine.arch())
        .to_string();
    if args.output == "json" {
        let arr: Vec<_> = results
            .iter()
            .map(|r| {
                json!({
                    "model": model_name,
                    "model_size": file.file_size(),
                    "test": r.name,
                    "backend": backend,
                    "n_prompt": r.n_prompt,
                    "n_gen": r.n_gen,
                    "n_threads": threads,
                    "avg_ts": r.mean(),
                    "stddev_ts": r.stddev(),
                    "samples_ts": r.samples,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&arr)?);
    } else {
        let size_mib = file.file_size() as f64 / (1024.0 * 1024.0);
        println!("| model | size | backend | threads | test | t/s |");
        println!("| --- | ---: | --- | ---: | ---: | ---: |");
        for r in &results {
            println!(
                "| {model_name} | {size_mib:.2} MiB | {backend} | {threads} | {} | {:.2} ± {:.2} |",
                r.name,
                r.mean(),
                r.stddev()
            );
        }
    }
    Ok(())
}
