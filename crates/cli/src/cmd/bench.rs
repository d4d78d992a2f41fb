//! `minfer bench`: throughput measured as llama-bench measures it. `ppN` is one batched
//! prefill of N random tokens; `tgN` is N single-token decodes; both start from an empty
//! KV cache, or with `-d D` (llama-bench's `--n-depth`) after D random tokens already in
//! it (named `ppN @ dD`). Each test has one untimed warm-up run, and t/s is computed per
//! repetition and reported as mean ± sample standard deviation.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use super::common::{usize_in, ModelArgs, MAX_CTX};
use super::run::{print_spec_stats, SpecArgs};

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
    /// Tokens already in the context when pp and tg start, 0..=16777216 (llama-bench's
    /// --n-depth): random tokens prefilled untimed, kept across repetitions.
    #[arg(
        short = 'd',
        long = "n-depth",
        default_value_t = 0,
        value_parser = usize_in(0..=MAX_CTX)
    )]
    pub n_depth: usize,
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
    /// With --draft or --lookup: the prompt of the speculative test (default: a short
    /// code-editing request), greedy-decoded -n tokens plainly and speculatively (this
    /// test replaces tg).
    #[arg(short = 'f', long = "prompt-file")]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Render the speculative test's prompt through the chat template as a user message.
    #[arg(long = "chat")]
    pub chat: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// The speculative test's prompt without --prompt-file: an edit that copies its input.
const SPEC_PROMPT: &str = "Rename the variable `total` to `sum` in this function and \
return the whole function.\n\n```python\ndef mean(values):\n    total = 0\n    count = 0\n    \
for v in values:\n        total += v\n        count += 1\n    if count == 0:\n        \
return 0.0\n    return total / count\n```\n";

/// One test's samples.
struct TestResult {
    name: String,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    samples: Vec<f64>,
}

/// A test's name as llama-bench writes it: `pp512`, or `pp512 @ d4096` at a depth.
fn test_name(test: &str, n: usize, depth: usize) -> String {
    if depth == 0 {
        format!("{test}{n}")
    } else {
        format!("{test}{n} @ d{depth}")
    }
}

/// Puts the engine at `depth` tokens of context for the next test repetition. The depth
/// is prefilled (untimed) once and kept: a repetition writes rows from `depth` on and
/// reads none past its own, so the next one can start at `depth` again, unless
/// sliding-window rings have dropped rows it needs; then the depth is prefilled anew.
fn go_to_depth(
    engine: &mut minfer_runtime::Engine,
    depth: usize,
    n_vocab: usize,
    seed: &mut u64,
) -> anyhow::Result<()> {
    if depth == 0 {
        engine.reset();
    } else if engine.seq_len() < depth || !engine.keeps(depth) {
        engine.reset();
        engine.prefill(&random_tokens(depth, n_vocab, seed), 0)?;
    }
    Ok(())
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

/// Per-op times of the timed repetitions alone: op name, total time, runs.
type Profile = Vec<(&'static str, Duration, usize)>;

/// Forgets the per-op times gathered since the last call: called just before a timed
/// repetition, so the profile leaves out the warm-up (which also builds the repacked
/// weights) and the untimed prefill of the depth.
fn skip_untimed(engine: &minfer_runtime::Engine) {
    let _ = engine.take_profile();
}

/// Adds the per-op times of the repetition just timed to `acc`.
fn add_timed(engine: &minfer_runtime::Engine, acc: &mut Profile) {
    for (op, d, n) in engine.take_profile() {
        match acc.iter_mut().find(|x| x.0 == op) {
            Some(x) => {
                x.1 += d;
                x.2 += n;
            }
            None => acc.push((op, d, n)),
        }
    }
}

/// With `MINFER_PROFILE=1`, prints where a test's timed repetitions spent their time, per
/// op, to stderr, longest first.
fn print_profile(mut p: Profile, test: &str) {
    let total: f64 = p.iter().map(|x| x.1.as_secs_f64()).sum();
    if total == 0.0 {
        return;
    }
    p.sort_by_key(|x| std::cmp::Reverse(x.1));
    eprintln!("{test}: time per op (timed repetitions only)");
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
    let speculative = args.spec.draft.is_some() || args.spec.lookup;
    if speculative && args.n_depth > 0 {
        bail!("-d sets the depth of the pp and tg tests; the speculative test (--draft, --lookup) starts from its prompt");
    }
    if !speculative && (args.prompt_file.is_some() || args.chat) {
        bail!("--prompt-file and --chat set the speculative test's prompt: add --draft MODEL or --lookup");
    }
    if args.model.ctx.is_none() {
        // The speculative test's prompt is not known yet: room for a long one.
        let spec_room = if speculative { 4096 } else { 1 };
        args.model.ctx = Some(args.n_depth + args.n_prompt.max(args.n_gen).max(spec_room));
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
    let depth = args.n_depth;
    let mut results = Vec::new();

    if args.n_prompt > 0 {
        let mut samples = Vec::new();
        let mut profile = Profile::new();
        for rep in 0..=args.reps {
            let tokens = random_tokens(args.n_prompt, n_vocab, &mut seed);
            go_to_depth(&mut engine, depth, n_vocab, &mut seed)?;
            skip_untimed(&engine);
            let t0 = Instant::now();
            engine.prefill(&tokens, depth)?;
            let dt = t0.elapsed().as_secs_f64();
            if rep > 0 {
                samples.push(args.n_prompt as f64 / dt);
                add_timed(&engine, &mut profile);
            }
        }
        print_profile(profile, "pp");
        results.push(TestResult {
            name: test_name("pp", args.n_prompt, depth),
            n_prompt: args.n_prompt,
            n_gen: 0,
            n_depth: depth,
            samples,
        });
    }
    // With a draft source the speculative test replaces tg: random tokens say nothing
    // about drafts.
    if args.n_gen > 0 && !speculative {
        let mut samples = Vec::new();
        let mut profile = Profile::new();
        for rep in 0..=args.reps {
            let tokens = random_tokens(args.n_gen, n_vocab, &mut seed);
            go_to_depth(&mut engine, depth, n_vocab, &mut seed)?;
            skip_untimed(&engine);
            let t0 = Instant::now();
            for (i, &t) in tokens.iter().enumerate() {
                engine.forward(&[t], depth + i, 1)?;
            }
            let dt = t0.elapsed().as_secs_f64();
            if rep > 0 {
                samples.push(args.n_gen as f64 / dt);
                add_timed(&engine, &mut profile);
            }
        }
        print_profile(profile, "tg");
        results.push(TestResult {
            name: test_name("tg", args.n_gen, depth),
            n_prompt: 0,
            n_gen: args.n_gen,
            n_depth: depth,
            samples,
        });
    }

    let mut spec_summary = None;
    if speculative && args.n_gen > 0 {
        let (plain, specd, spec) = spec_test(&args, &mut engine)?;
        let source = spec.source_name();
        results.push(plain);
        results.push(specd);
        print_spec_stats(&spec);
        spec_summary = Some((source, spec.stats()));
    }
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
                    "n_depth": r.n_depth,
                    "n_threads": threads,
                    "avg_ts": r.mean(),
                    "stddev_ts": r.stddev(),
                    "samples_ts": r.samples,
                })
            })
            .collect();
        let arr: Vec<_> = arr
            .into_iter()
            .map(|mut v| {
                if let (Some((source, st)), Some(name)) =
                    (spec_summary, v["test"].as_str().map(str::to_string))
                {
                    if name.ends_with(source) {
                        v["drafted"] = json!(st.drafted);
                        v["accepted"] = json!(st.accepted);
                        v["acceptance"] = json!(st.acceptance());
                    }
                }
                v
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
    if let (Some((source, st)), false) = (spec_summary, args.output == "json") {
        println!(
            "\nspeculative ({source}): acceptance {:.1}% ({} of {} drafted tokens)",
            100.0 * st.acceptance(),
            st.accepted,
            st.drafted
        );
    }
    Ok(())
}

/// The speculative test: greedy decoding of -n tokens from the prompt, plainly and
/// speculatively in alternating repetitions (ABBA: plain first in odd pairs, last in
/// even ones, so drift on a busy machine falls on both alike). Both produce the same
/// tokens; t/s counts generated tokens over the decode time.
fn spec_test(
    args: &Args,
    engine: &mut minfer_runtime::Engine,
) -> anyhow::Result<(TestResult, TestResult, minfer_runtime::Speculator)> {
    use minfer_runtime::{generate_speculative, GenerateOptions, SamplingParams};
    use minfer_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
    let tok = Tokenizer::from_gguf(engine.file())?;
    let text = match &args.prompt_file {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| anyhow::anyhow!("reading --prompt-file {}: {e}", p.display()))?,
        None => SPEC_PROMPT.to_string(),
    };
    let prompt = if args.chat {
        let tpl = ChatTemplate::from_tokenizer(&tok)?;
        let msgs = [ChatMessage::new("user", text.as_str())];
        tpl.render_spans(&msgs, true)?.encode(&tok, &msgs, true)?
    } else {
        tok.encode(&text, true, true)
    };
    if prompt.len() + args.n_gen > engine.n_ctx() {
        bail!(
            "the speculative test's prompt is {} tokens and -n {}: more than the context of {} (raise -c)",
            prompt.len(),
            args.n_gen,
            engine.n_ctx()
        );
    }
    let mut spec = args
        .spec
        .speculator(&args.model, engine, &tok)?
        .ok_or_else(|| anyhow::anyhow!("no draft source"))?;
    let opts = GenerateOptions {
        max_tokens: args.n_gen,
        stop: Vec::new(),
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        constraint: None,
    };
    let mut plain = Vec::new();
    let mut specd = Vec::new();
    let mut n_gen = 0;
    let mut reference: Option<Vec<u32>> = None;
    for rep in 0..=args.reps {
        let order = if rep % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for use_spec in order {
            let s = if use_spec { Some(&mut spec) } else { None };
            let st = generate_speculative(engine, &tok, &prompt, 0, &opts, s, |_| true)?;
            let tps = st.gen_tokens as f64 / st.gen_time.as_secs_f64().max(1e-9);
            n_gen = st.gen_tokens;
            // Greedy speculation must give plain decode's tokens: a run that does not
            // measures something else, and is a bug to report, not a figure.
            match &reference {
                None => reference = Some(st.tokens),
                Some(r) if *r != st.tokens => bail!(
                    "speculative and plain decoding produced different tokens ({} run of repetition {rep})",
                    if use_spec { "speculative" } else { "plain" }
                ),
                Some(_) => {}
            }
            // The first pair warms both paths up, untimed.
            if rep > 0 {
                if use_spec { &mut specd } else { &mut plain }.push(tps);
            }
        }
    }
    let name = |what: &str| format!("tg{n_gen} {what}");
    Ok((
        TestResult {
            name: name("plain"),
            n_prompt: prompt.len(),
            n_gen,
            n_depth: 0,
            samples: plain,
        },
        TestResult {
            name: name(spec.source_name()),
            n_prompt: prompt.len(),
            n_gen,
            n_depth: 0,
            samples: specd,
        },
        spec,
    ))
}
