//! Speculative decoding: a cheap draft proposes a block of tokens, the target verifies
//! the block with one forward of `d + 1` tokens, and the output is what plain decode
//! would have produced.
//!
//! Why it pays: a decode step reads every weight once for a single token; a verify step
//! reads them once for all `d + 1` tokens, and costs far less than `d + 1` steps. Why it
//! never changes the answer: row `i` of the verify step is bitwise the logits plain
//! decode computes at that position (the kernels compute each token's row independently
//! of the batch, and KV positions are data), and each row is sampled by the very sampler
//! chain plain decode uses, in order, with the penalty window holding the tokens before.
//!
//! - Greedy: a drafted token is accepted while it equals the target's pick; the first
//!   pick that differs is emitted in its place. Output tokens equal plain decode's.
//! - Sampling with a draft model: the standard rule, which leaves the target's
//!   distribution unchanged: accept a drafted `x` with probability `min(1, p(x)/q(x))`
//!   (`p` the target's distribution after the whole chain, `q` the draft's, from which
//!   `x` was drawn); on a rejection draw from `norm(max(0, p - q))`.
//! - Sampling with n-gram lookup (no draft distribution): each row is sampled from the
//!   target as plain decode does, and a drafted token is accepted when it equals the
//!   sample, so for a fixed seed the output equals plain sampling's.
//!
//! Adaptive depth: [`Speculator`] measures the acceptance rate and the cost of a draft
//! token and of each verify width (moving averages), and picks the depth that maximises
//! the expected tokens per second from a small fixed set ([`depth_set`]), 0 (plain
//! decode) included, so a draft that does not pay is not run. Graphs are keyed by the
//! number of tokens, so a few widths keep them reused.
//!
//! The parts: `source` (what a draft is and where one comes from), `lookup` (drafts from
//! the text so far), `draft` (a draft model, for one sequence or a server's slots),
//! `control` (the adaptive depth) and `speculator` (planning a block and verifying it
//! against the target).

mod control;
mod draft;
mod lookup;
mod source;
mod speculator;

pub use self::control::{check_draft_max, depth_set, DEFAULT_DRAFT_MAX, DRAFT_MAX_LIMIT};
pub use self::draft::{
    check_same_vocab, DraftAsk, DraftModel, MultiDraft, DRAFT_CATCHUP_MAX, DRAFT_WINDOW,
};
pub use self::lookup::{NgramLookup, NGRAM_MAX, NGRAM_MIN};
pub use self::source::{Draft, DraftSource};
pub use self::speculator::{SpecStats, Speculator};
