//! Perplexity in the manner of llama-perplexity: non-overlapping chunks of `n_ctx`
//! tokens, each evaluated from an empty KV cache, with only the second half scored.

use crate::engine::{Engine, EngineError};

/// Scores `tokens` in non-overlapping chunks of `n_ctx`, each from an empty KV cache, over
/// at most `max_chunks` chunks, calling `on_chunk(chunks_done, ppl_so_far)` after each.
/// Only the scored half of each chunk asks for logits (G3 tail rows).
pub fn perplexity(
    engine: &mut Engine,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<PplAccumulator, EngineError> {
    if n_ctx < 4 {
        return Err(EngineError::Param {
            name: "context size (-c)",
            message: format!("{n_ctx}: perplexity needs at least 4 tokens per chunk"),
        });
    }
    let n_chunk = (tokens.len() / n_ctx).min(max_chunks.unwrap_or(usize::MAX));
    if n_chunk == 0 {
        return Err(EngineError::Param {
            name: "text",
            message: format!(
                "{} tokens are fewer than one chunk of {n_ctx} (lower -c)",
                tokens.len()
            ),
        });
    }
    let first = first_scored(n_ctx);
    let n_vocab = engine.n_vocab();
    let batch = engine.n_batch();
    let mut acc = PplAccumulator::new();
    let mut logits = Vec::new();
    let mut piece_logits = Vec::new();
    for c in 0..n_chunk {
        let chunk = &tokens[c * n_ctx..(c + 1) * n_ctx];
        engine.reset();
        logits.clear();
        let mut pos = 0;
        for piece in chunk.chunks(batch) {
            let end = pos + piece.len();
            // Rows of this piece at or past `first`; one row when none is scored.
            let tail = end.saturating_sub(first).min(piece.len()).max(1);
            engine.forward_into(piece, pos, tail, &mut piece_logits)?;
            if end > first {
                logits.extend_from_slice(&piece_logits);
            }
            pos = end;
        }
        for j in first..n_ctx - 1 {
            let row = &logits[(j - first) * n_vocab..(j - first + 1) * n_vocab];
            acc.add(row, chunk[j + 1]);
        }
        on_chunk(c + 1, acc.ppl());
    }
    Ok(acc)
}

/// Running negative log-likelihood over scored tokens.
#[derive(Debug, Clone, Default)]
pub struct PplAccumulator {
    nll: f64,
    nll2: f64,
    count: usize,
}

/// Index of the first scored logit row in a chunk of `n_ctx` tokens.
pub fn first_scored(n_ctx: usize) -> usize {
    n_ctx / 2
}

impl PplAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `-log softmax(logits)[target]`, computed in f64 as llama.cpp does.
    pub fn add(&mut self, logits: &[f32], target: u32) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let logit = logits
            .get(target as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY);
        let nll = sum.ln() - (logit - max) as f64;
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }

    /// Tokens scored so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Perplexity so far.
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count.max(1) as f64).exp()
    }

    /// Perplexity and its standard error, as llama-perplexity prints them.
    pub fn estimate(&self) -> (f64, f64) {
        let n = self.count.max(1) as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        let ppl = mean.exp();
        let err = if var > 0.0 && self.count > 1 {
            (var / (n - 1.0)).sqrt() * ppl
        } else {
            0.0
        };
        (ppl, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_logits_give_the_vocab_size() {
        let mut acc = PplAccumulator::new();
        for t in 0..10 {
            acc.add(&[0.0; 8], t % 8);
        }
        let (ppl, err) = acc.estimate();
        assert!((ppl - 8.0).abs() < 1e-9, "{ppl}");
        assert!(err < 1e-6, "{err}");
    }

    #[test]
    fn confident_correct_predictions_approach_one() {
        let mut acc = PplAccumulator::new();
        acc.add(&[20.0, 0.0, 0.0], 0);
        acc.add(&[0.0, 0.0, 20.0], 2);
        assert!(acc.ppl() < 1.0001);
        assert_eq!(first_scored(512), 256);
    }
}
