//! What a sequence's KV holds, as token ids by position, and the rule for reusing it:
//! a later prompt keeps the longest prefix it shares with the history and prefills the
//! rest. One copy, for conversations, plain completions, speculative drafts and the
//! server's slots.

/// Length of the longest common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The token ids whose KV rows sit at positions `0..len()` of one sequence: what a later
/// prompt may reuse instead of prefilling again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvHistory {
    tokens: Vec<u32>,
}

/// What [`KvHistory::reuse`] decided for a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reuse {
    /// Leading prompt tokens whose KV rows are kept; the rest must be prefilled.
    pub kept: usize,
    /// Whether the history held tokens the prompt does not continue (the rendering was
    /// not a prefix extension), so those rows are prefilled again.
    pub rewound: bool,
}

impl KvHistory {
    /// An empty history (nothing in the KV).
    pub fn new() -> Self {
        Self::default()
    }

    /// A history whose KV rows `0..tokens.len()` already hold `tokens`.
    pub fn from_tokens(tokens: Vec<u32>) -> Self {
        KvHistory { tokens }
    }

    /// The tokens held, in position order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Leading tokens of `prompt` the history already holds.
    pub fn matching(&self, prompt: &[u32]) -> usize {
        common_prefix(&self.tokens, prompt)
    }

    /// Keeps the longest prefix of the history that `prompt` starts with, less its last
    /// token when the whole prompt matches: the last prompt token always runs again,
    /// since its logits start the generation. The caller prefills `prompt[kept..]`.
    pub fn reuse(&mut self, prompt: &[u32]) -> Reuse {
        self.reuse_if(prompt, |_| true)
    }

    /// [`Self::reuse`] where the rows may only be kept up to a position `keeps` accepts
    /// (the engine's sliding-window rule, [`crate::swa`]): a refused prefix keeps nothing,
    /// and the whole prompt is prefilled again.
    pub fn reuse_if(&mut self, prompt: &[u32], keeps: impl Fn(usize) -> bool) -> Reuse {
        self.reuse_from(prompt, |k| if keeps(k) { k } else { 0 })
    }

    /// [`Self::reuse`] going on from `resume(kept)` instead of `kept`: the engine's
    /// largest position at most `kept` it can go on from (`Engine::resume_point`: the
    /// prefix itself, a recurrent model's state checkpoint inside it, or 0). A value past
    /// `kept` counts as `kept`.
    pub fn reuse_from(&mut self, prompt: &[u32], resume: impl Fn(usize) -> usize) -> Reuse {
        let common = self.matching(prompt);
        let rewound = common < self.tokens.len();
        let kept = common.min(prompt.len().saturating_sub(1));
        let kept = resume(kept).min(kept);
        self.tokens.truncate(kept);
        Reuse { kept, rewound }
    }

    /// Records one more token written at position `len()`.
    pub fn push(&mut self, token: u32) {
        self.tokens.push(token);
    }

    /// Records tokens written at positions `len()..`.
    pub fn extend(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    /// Forgets every position past `len` (their rows are no longer trusted).
    pub fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.tokens.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }

    #[test]
    fn reuse_keeps_the_common_prefix_and_reruns_the_last_prompt_token() {
        let mut h = KvHistory::from_tokens(vec![1, 2, 3]);
        let r = h.reuse(&[1, 2, 3, 4, 5]);
        assert_eq!(
            r,
            Reuse {
                kept: 3,
                rewound: false
            }
        );
        let mut h = KvHistory::from_tokens(vec![1, 2, 3]);
        // The whole prompt is held: its last token still runs, for its logits.
        assert_eq!(
            h.reuse(&[1, 2, 3]),
            Reuse {
                kept: 2,
                rewound: false
            }
        );
        assert_eq!(h.tokens(), &[1, 2]);
        let mut h = KvHistory::from_tokens(vec![1, 2, 3, 4]);
        // A rewrite of earlier tokens: re-prefill from the first differing one.
        assert_eq!(
            h.reuse(&[1, 9, 3, 4, 5]),
            Reuse {
                kept: 1,
                rewound: true
            }
        );
        assert_eq!(h.tokens(), &[1]);
        // Going on from an earlier point (a state checkpoint) keeps only that much.
        let mut h = KvHistory::from_tokens(vec![1, 2, 3, 4, 5]);
        let r = h.reuse_from(&[1, 2, 3, 4, 9, 9], |k| if k == 4 { 2 } else { 99 });
        assert_eq!(
            r,
            Reuse {
                kept: 2,
                rewound: true
            }
        );
        assert_eq!(h.tokens(), &[1, 2]);
        assert_eq!(h.clone().reuse_from(&[1, 2, 3], |_| 99).kept, 2);
        assert_eq!(
            KvHistory::new().reuse(&[]),
            Reuse {
                kept: 0,
                rewound: false
            }
        );
    }
}
