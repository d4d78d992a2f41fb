//! `minfer embed`: the embedding of each input text (llama-embedding's job), printed as
//! JSON: one array per text (an array of per-token arrays with `--pooling none`).
//!
//! With rank pooling (a cross-encoder reranker's own, or `--pooling rank`) each text is
//! scored as llama-embedding scores it: a `query<TAB>document` text is joined as one pair
//! ([`PairEnd::Embedding`]: `[CLS] query [SEP] document [SEP]` for a WordPiece
//! vocabulary), any other text is encoded alone, and its array holds the classifier
//! head's raw scores (the relevance logit first; never normalised). A model without a
//! classifier head is refused by name.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use minfer_runtime::embed::{embed, Pooling};
use minfer_tokenizer::{PairEnd, Tokenizer};

use super::common::ModelArgs;

/// Arguments of `minfer embed`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// How a text's token rows become its embedding: mean, cls, last, none (one per
    /// token), or rank (a reranker's scores of `query<TAB>document`). Default: the
    /// model's own (`pooling_type`), else mean.
    #[arg(long = "pooling", value_parser = Pooling::parse)]
    pub pooling: Option<Pooling>,
    /// Print the vectors as computed instead of scaled to unit length.
    #[arg(long = "no-normalize")]
    pub no_normalize: bool,
    /// Read the texts from this file (UTF-8), one per line, instead of the command line.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        conflicts_with = "texts"
    )]
    pub file: Option<PathBuf>,
    /// The texts to embed, each on its own.
    #[arg(required_unless_present = "file")]
    pub texts: Vec<String>,
}

/// Runs `minfer embed`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let texts: Vec<String> = match &args.file {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let text = String::from_utf8(bytes)
                .map_err(|e| anyhow::anyhow!("{} is not UTF-8: {e}", path.display()))?;
            text.lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        }
        None => args.texts.clone(),
    };
    if texts.is_empty() {
        anyhow::bail!("no text to embed");
    }
    let mut engine = args.model.load()?;
    let tok = Tokenizer::from_gguf(engine.file())?;
    let pooling = args
        .pooling
        .unwrap_or_else(|| Pooling::default_for(&engine));
    if pooling == Pooling::Rank {
        engine.require_rank_head()?;
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    writeln!(out, "[")?;
    for (i, text) in texts.iter().enumerate() {
        let ids = match text.split_once('\t') {
            Some((query, doc)) if pooling == Pooling::Rank => {
                tok.encode_pair(query, doc, PairEnd::Embedding)
            }
            _ => tok.encode(text, true, false),
        };
        let rows = embed(&mut engine, &ids, pooling, !args.no_normalize)
            .with_context(|| format!("text {}", i + 1))?;
        let value = if pooling == Pooling::None {
            serde_json::to_string(&rows)?
        } else {
            serde_json::to_string(&rows[0])?
        };
        let sep = if i + 1 < texts.len() { "," } else { "" };
        writeln!(out, "  {value}{sep}")?;
    }
    writeln!(out, "]")?;
    out.flush()?;
    Ok(())
}
