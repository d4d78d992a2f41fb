//! Prompt lookup: drafts continued from an earlier occurrence of the text's tail.

use super::source::{Draft, DraftSource};
use crate::engine::EngineError;
use crate::sampling::Sampler;

/// Longest n-gram the lookup matches.
pub const NGRAM_MAX: usize = 4;

/// Shortest n-gram the lookup matches.
pub const NGRAM_MIN: usize = 1;

/// Drafts from the tokens so far: the longest recent n-gram that occurred before is
/// continued as it went on then (prompt lookup, as llama.cpp's lookup decoding). Costs no
/// forward pass.
#[derive(Debug, Default, Clone)]
pub struct NgramLookup;

impl NgramLookup {
    /// A lookup drafting from n-grams of [`NGRAM_MIN`]..=[`NGRAM_MAX`] tokens.
    pub fn new() -> Self {
        NgramLookup
    }

    /// The continuation of the longest suffix n-gram of `ctx` found earlier in `ctx`
    /// (its most recent occurrence), at most `max` tokens, with the n-gram's length.
    pub fn lookup(ctx: &[u32], max: usize) -> Option<(usize, &[u32])> {
        for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
            if ctx.len() <= n {
                continue;
            }
            let key = &ctx[ctx.len() - n..];
            // Most recent earlier occurrence first: recent text predicts best.
            for start in (0..ctx.len() - n).rev() {
                if &ctx[start..start + n] == key {
                    let from = start + n;
                    let to = (from + max).min(ctx.len());
                    if to > from {
                        return Some((n, &ctx[from..to]));
                    }
                }
            }
        }
        None
    }
}

impl DraftSource for NgramLookup {
    fn name(&self) -> &'static str {
        "lookup"
    }

    fn runs_model(&self) -> bool {
        false
    }

    fn propose(
        &mut self,
        context: &[u32],
        max: usize,
        _target: &Sampler,
        out: &mut Draft,
    ) -> Result<(), EngineError> {
        out.clear();
        if let Some((n, cont)) = Self::lookup(context, max) {
            out.tokens.extend_from_slice(cont);
            out.class = n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_most_recent_longest_match() {
        let ctx = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3];
        let (n, cont) = NgramLookup::lookup(&ctx, 3).expect("a match");
        assert_eq!(n, 3);
        assert_eq!(cont, &[7, 8, 5]);
        assert_eq!(NgramLookup::lookup(&[4, 5, 6], 3), None);
        // The continuation stops where the text does.
        let (_, cont) = NgramLookup::lookup(&[1, 2, 1], 5).expect("a match");
        assert_eq!(cont, &[2, 1]);
    }
}
