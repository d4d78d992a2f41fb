//! `minfer perplexity`: llama-perplexity's method — non-overlapping chunks of `-c`
//! tokens, each from an empty KV cache, scoring only the second half of each chunk.

use std::path::PathBuf;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use minfer_runtime::perplexity::perplexity;
use minfer_tokenizer::Tokenizer;

use super::common::{usize_in, ModelArgs};

/// Arguments of `minfer perplexity`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Score at most this many chunks (at least 1).
    #[arg(long = "chunks", value_parser = usize_in(1..=u64::MAX))]
    pub chunks: Option<usize>,
}

/// Runs `minfer perplexity`.
pub fn run(mut args: Args) -> anyhow::Result<()> {
    let n_ctx = *args.model.ctx.get_or_insert(512);
    if n_ctx < 4 {
        bail!("invalid context size (-c) {n_ctx}: perplexity needs at least 4 tokens per chunk");
    }
    let bytes =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{} is not UTF-8: {e}", args.file.display()))?;
    let mut engine = args.model.load()?;
    let tok = Tokenizer::from_gguf(engine.file())?;
    let tokens = tok.encode(&text, true, false);
    let mut n_chunk = tokens.len() / n_ctx;
    if let Some(c) = args.chunks {
        n_chunk = n_chunk.min(c);
    }
    if n_chunk == 0 {
        bail!(
            "{} holds {} tokens, fewer than one chunk of {n_ctx} (lower -c)",
            args.file.display(),
            tokens.len()
        );
    }
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx}",
        tokens.len()
    );
    let bar = ProgressBar::new(n_chunk as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} chunks  {msg}  [{elapsed_precise}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let acc = perplexity(&mut engine, &tokens, n_ctx, Some(n_chunk), |done, ppl| {
        bar.set_message(format!("PPL {ppl:.4}"));
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    let (ppl, err) = acc.estimate();
    println!("PPL = {ppl:.4} +/- {err:.5}");
    Ok(())
}
