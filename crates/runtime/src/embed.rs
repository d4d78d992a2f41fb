//! Embeddings: a text's final-normed hidden states pooled into one vector (or kept per
//! token), as llama.cpp's embedding mode computes them.
//!
//! The graph returns the hidden rows the output head would read (`CParams::embeddings`);
//! pooling and normalisation run here, over all of a text's rows, in f64 so the order of
//! the prefill chunks does not matter. A text runs as its own sequence from position 0,
//! causal as the model is; an encoder's text (BERT: every token attends to every other)
//! runs whole in one step ([`chunk_len`]).
//!
//! Rank pooling (llama.cpp's `pooling_type` 4) runs the rows through the model's
//! classifier head in the graph (`CParams::rank`, a BERT cross-encoder's `cls` layers)
//! and keeps the first token's (`[CLS]`) scores, never normalised: a reranker's relevance
//! logit is its first value.

use std::ops::Range;

use crate::engine::{Engine, EngineError};

/// How the rows of one text become its embedding (llama.cpp's `pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// One embedding per token.
    None,
    /// The mean of the rows.
    Mean,
    /// The first token's row.
    Cls,
    /// The last token's row (Qwen3-Embedding and other decoder embedders).
    Last,
    /// The first token's scores from the model's classifier head (a cross-encoder
    /// reranker): [`Engine::rank_width`] values, the relevance logit first.
    Rank,
}

impl Pooling {
    /// The name used by flags and APIs.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }

    /// Parses `none`, `mean`, `cls`, `last` or `rank`; an error names the accepted values.
    pub fn parse(s: &str) -> Result<Pooling, String> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            "rank" => Ok(Pooling::Rank),
            other => Err(format!(
                "pooling '{other}' is not one of none, mean, cls, last, rank"
            )),
        }
    }

    /// The pooling the model file states (`<arch>.pooling_type`: 1 mean, 2 cls, 3 last,
    /// 4 rank), or `None` when it states none or one minfer does not compute: rank on a
    /// model without a classifier head (a decoder reranker's file states rank, but its
    /// judgement is read from the logits, not from a head).
    pub fn of_model(engine: &Engine) -> Option<Pooling> {
        let key = format!("{}.pooling_type", engine.arch());
        match engine.file().get_u32(&key).ok()? {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            4 if engine.rank_width().is_some() => Some(Pooling::Rank),
            _ => None,
        }
    }

    /// What a request that names no pooling gets: the model's, else the mean (a decoder
    /// model states none; one vector per text is what embedding clients expect).
    pub fn default_for(engine: &Engine) -> Pooling {
        Pooling::of_model(engine).unwrap_or(Pooling::Mean)
    }
}

/// The embedding of `tokens` (one vector, or one per token with [`Pooling::None`]),
/// scaled to unit Euclidean length when `normalize` is set. The engine's current sequence
/// is replaced. An empty text or one longer than the context is refused by name.
pub fn embed(
    engine: &mut Engine,
    tokens: &[u32],
    pooling: Pooling,
    normalize: bool,
) -> Result<Vec<Vec<f32>>, EngineError> {
    if tokens.is_empty() {
        return Err(EngineError::Param {
            name: "input",
            message: "is empty: an embedding needs at least one token".into(),
        });
    }
    if tokens.len() > engine.n_ctx() {
        return Err(EngineError::ContextOverflow {
            what: "the input",
            needed: tokens.len(),
            n_ctx: engine.n_ctx(),
        });
    }
    let width = row_width(engine, pooling)?;
    let n_batch = chunk_len(engine, tokens.len(), engine.n_batch())?;
    engine.reset();
    pool(
        tokens,
        width,
        n_batch,
        pooling,
        normalize,
        |chunk, pos, rows| {
            if pooling == Pooling::Rank {
                engine.forward_scores(chunk, pos, rows)
            } else {
                engine.forward_hidden(chunk, pos, rows)
            }
        },
    )
}

/// Values per row the graph returns for `pooling`: the head's scores for rank (a model
/// without a classifier head is refused by name), else `n_embd`.
pub(crate) fn row_width(engine: &Engine, pooling: Pooling) -> Result<usize, EngineError> {
    if pooling != Pooling::Rank {
        return Ok(engine.hparams().n_embd);
    }
    engine.require_rank_head()
}

/// The chunk a text of `n` tokens is embedded in: `n_batch` for a causal model; the
/// whole text for an encoder, whose tokens attend both ways so a text cannot be split,
/// and which refuses a text past its position table (`{arch}.context_length`) by name.
pub(crate) fn chunk_len(engine: &Engine, n: usize, n_batch: usize) -> Result<usize, EngineError> {
    if !engine.is_encoder() {
        return Ok(n_batch);
    }
    let limit = engine.hparams().n_ctx_train;
    if n > limit {
        return Err(EngineError::Param {
            name: "input",
            message: format!(
                "{n} tokens exceed the {limit} positions of this encoder ({}.context_length); an encoder embeds a text in one pass",
                engine.arch()
            ),
        });
    }
    Ok(n.max(1))
}

/// The rows of a chunk (`len` tokens from position `pos`) that `pooling` reads, as a
/// range of the chunk's: every one for none and mean, the text's first for CLS and
/// rank, the chunk's last for last (the text's, in its last chunk). A chunk holding
/// none of those returns its last row, unread: a step returns at least one, and the
/// tail is the graph's usual selection.
fn wanted(pooling: Pooling, pos: usize, len: usize) -> Range<usize> {
    match pooling {
        Pooling::None | Pooling::Mean => 0..len,
        Pooling::Cls | Pooling::Rank if pos == 0 => 0..1,
        _ => len.saturating_sub(1)..len,
    }
}

/// Runs `tokens` through `hidden` (a chunk of at most `n_batch` tokens, its first
/// position and the rows of it wanted in; those rows, `n_embd` values each, out: hidden
/// rows, or scores for rank) and pools the rows: the one pooling of [`embed`] and of
/// [`crate::MultiEngine::embed`]. Only the rows the pooling reads are asked for, so CLS,
/// last-token and rank pooling take the output end of the graph (a reranker's head
/// included) for one row per text. Rank scores are never normalised.
pub(crate) fn pool(
    tokens: &[u32],
    n_embd: usize,
    n_batch: usize,
    pooling: Pooling,
    normalize: bool,
    mut hidden: impl FnMut(&[u32], usize, Range<usize>) -> Result<Vec<f32>, EngineError>,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let mut sum = vec![0f64; n_embd];
    let mut pos = 0;
    for chunk in tokens.chunks(n_batch.max(1)) {
        let want = wanted(pooling, pos, chunk.len());
        let out = hidden(chunk, pos, want.clone())?;
        for (i, row) in out.chunks_exact(n_embd).enumerate() {
            let p = pos + want.start + i;
            match pooling {
                Pooling::None => rows.push(row.to_vec()),
                Pooling::Mean => sum.iter_mut().zip(row).for_each(|(s, &x)| *s += x as f64),
                Pooling::Cls | Pooling::Rank if p == 0 => rows.push(row.to_vec()),
                Pooling::Last if p + 1 == tokens.len() => rows.push(row.to_vec()),
                _ => {}
            }
        }
        pos += chunk.len();
    }
    if pooling == Pooling::Mean {
        let n = tokens.len() as f64;
        rows.push(sum.iter().map(|s| (s / n) as f32).collect());
    }
    if normalize && pooling != Pooling::Rank {
        rows.iter_mut().for_each(|r| l2_normalize(r));
    }
    Ok(rows)
}

/// Scales `v` to unit Euclidean length (a zero vector stays zero), as llama.cpp's
/// `--embd-normalize 2`.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

/// Cosine similarity of two vectors of one length (0 when either is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let nb = b.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_names_round_trip_and_bad_ones_are_named() {
        for p in [
            Pooling::None,
            Pooling::Mean,
            Pooling::Cls,
            Pooling::Last,
            Pooling::Rank,
        ] {
            assert_eq!(Pooling::parse(p.name()), Ok(p));
        }
        let e = Pooling::parse("max").unwrap_err();
        assert!(e.contains("'max'") && e.contains("mean"), "{e}");
    }

    #[test]
    fn a_chunk_asks_for_the_rows_its_pooling_reads() {
        assert_eq!(wanted(Pooling::Mean, 8, 8), 0..8);
        assert_eq!(wanted(Pooling::None, 0, 5), 0..5);
        for p in [Pooling::Cls, Pooling::Rank] {
            assert_eq!(wanted(p, 0, 8), 0..1, "{p:?}, the first chunk");
            assert_eq!(wanted(p, 8, 8), 7..8, "{p:?}, a later chunk (unread)");
        }
        assert_eq!(wanted(Pooling::Last, 0, 8), 7..8);
        assert_eq!(wanted(Pooling::Last, 8, 3), 2..3);
    }

    #[test]
    fn normalised_vectors_have_unit_length() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut z = vec![0.0; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
        assert!((cosine(&[1.0, 0.0], &[1.0, 1.0]) - 0.5f64.sqrt()).abs() < 1e-12);
    }
}
