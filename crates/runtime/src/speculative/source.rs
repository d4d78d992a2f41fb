//! What a draft is and where one comes from: the [`DraftSource`] trait every source
//! implements, and the [`Draft`] block it fills.

use crate::engine::EngineError;
use crate::sampling::Sampler;

/// A block of drafted tokens, with the draft's distributions when it sampled them.
#[derive(Debug, Default, Clone)]
pub struct Draft {
    /// The proposed continuation.
    pub tokens: Vec<u32>,
    /// Per token, the distribution it was drawn from (empty when the draft has none:
    /// greedy drafting or n-gram lookup).
    pub probs: Vec<Vec<(u32, f64)>>,
    /// The acceptance class of this draft (the matched n-gram length for lookup, 0 for a
    /// draft model): each class has its own measured acceptance.
    pub class: usize,
}

impl Draft {
    /// Empties the block (no tokens, no distributions, class 0), keeping its buffers.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.probs.clear();
        self.class = 0;
    }
}

/// Where drafted tokens come from.
pub trait DraftSource: Send {
    /// A short name for reports.
    fn name(&self) -> &'static str;

    /// Proposes up to `max` tokens continuing `context` (every token so far, prompt and
    /// generated, the last one included) into `out` (cleared first). `target` is the
    /// target's sampler: its parameters and penalty window are the ones to draft with.
    fn propose(
        &mut self,
        context: &[u32],
        max: usize,
        target: &Sampler,
        out: &mut Draft,
    ) -> Result<(), EngineError>;

    /// Whether proposing runs a model (its cost is then measured and weighed).
    fn runs_model(&self) -> bool;

    /// The bytes of weights one draft step reads, where the source runs a model: what
    /// its cost is weighed by when timings must not steer the depth (see
    /// [`Speculator::step`](super::Speculator::step)).
    fn weight_bytes(&self) -> Option<u64> {
        None
    }
}

/// The bytes of weights in `file`: what one decode step streams, on a machine where
/// decode is bound by reading them.
pub(crate) fn file_weight_bytes(file: &minfer_gguf::GgufFile) -> u64 {
    file.tensors().iter().map(|t| t.n_bytes).sum()
}
